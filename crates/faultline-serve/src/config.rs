//! What a [`Server`](crate::Server) serves and how: a plain struct, no
//! command line in it (`faultline-serve`'s flags map onto it in
//! [`cli`](crate::cli)).
//!
//! ```
//! use faultline_serve::{ServeConfig, Source};
//!
//! let mut config = ServeConfig::new("/tmp/fc-uffd.sock", Source::Mem("snapshot.mem".into()));
//! config.peers = Some(1);
//! config.check().unwrap();
//! config.threads = 0;
//! assert!(config.check().is_err());
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use faultline::{HandlerWait, ReadaheadConfig};

pub use faultline::Verify;

/// The most handler threads (and prefetch helpers) a server starts: each
/// is a thread with its own stack and poll set; past a few per CPU they
/// only contend.
pub const MAX_THREADS: usize = 1024;

/// The largest fault-around window, pages (4 MiB of 4 KiB pages: one
/// fault installing more stalls the vCPU longer than it saves).
pub const MAX_FAULT_AROUND: usize = 1024;
pub use crate::metrics::MetricsAddr;

pub use crate::log::LogFormat;

/// The default cap of a fault's window: 512 pages, 2 MiB of 4 KiB pages.
pub const FAULT_AROUND: usize = 512;

/// The window an isolated fault installs: the aligned 16 pages around it,
/// the kernel's fault-around (`fault_around_bytes`, 64 KiB).
pub const FAULT_AROUND_INITIAL: usize = 16;

/// The window an isolated fault installs in shared mode: `UFFDIO_CONTINUE`
/// maps the page cache's pages without a copy, so a page more costs a
/// third of a copied one (see RESULTS.md, "Isolated windows that pay for
/// themselves") and the window that pays for itself is larger.
pub const FAULT_AROUND_INITIAL_SHARED: usize = 128;

/// Where the snapshot's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The snapshot's memory file (the regions' bytes, back to back).
    Mem(PathBuf),
    /// A remote page store: `redis://HOST:PORT#NAME`,
    /// `redis+unix:///PATH#NAME` or `redis-cluster://HOST:PORT,...#NAME`
    /// (needs the `redis` cargo feature).
    Store(String),
}

/// How the server runs. [`ServeConfig::new`] gives the defaults of
/// `faultline-serve`'s flags; see its `--help` for each field.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The UNIX socket to bind (a stale socket file there is replaced).
    pub socket: PathBuf,
    /// The snapshot's bytes.
    pub source: Source,
    /// Stop with [`ServeError::Timeout`](crate::ServeError::Timeout) when no
    /// peer is connected for this long (at start, and whenever every peer
    /// has gone); `None`: never. Default 30 s.
    pub timeout: Option<Duration>,
    /// Stop once this many peers have connected and all have gone (`None`:
    /// serve until the timeout).
    pub peers: Option<usize>,
    /// Handler threads. Default 1.
    pub threads: usize,
    /// How the handler threads wait for faults. Default adaptive.
    pub engine: HandlerWait,
    /// The largest window a fault installs, in pages (0 or 1: one page
    /// per fault); see [`ServeConfig::readahead`]. Default
    /// [`FAULT_AROUND`].
    pub fault_around: usize,
    /// Record the first peer's touch order to this file when it hangs up.
    pub record: Option<PathBuf>,
    /// Install the pages of this record eagerly on every restore.
    pub prefetch: Option<PathBuf>,
    /// Prefetch helper threads (`None`: one per CPU).
    pub prefetch_helpers: Option<usize>,
    /// Bytes of prefetch a handler thread installs between two looks for
    /// faults (`None`: the engine's default, 2 MiB).
    pub prefetch_chunk: Option<usize>,
    /// Leave running a peer whose hand-off is refused or whose serving
    /// fails (or that is still served when a stop's grace period ends);
    /// by default it is killed (SIGKILL): its vCPUs would hang at their
    /// next missing page.
    pub leave_peer_on_error: bool,
    /// After SIGTERM/SIGINT ([`StopHandle`](crate::StopHandle)), how long
    /// the peers still served have to hang up before they are killed (or
    /// left, with `leave_peer_on_error`). Default 30 s.
    pub grace: Duration,
    /// Prefetch helpers run under `SCHED_IDLE`.
    pub prefetch_idle: bool,
    /// How long a connected peer has to send its handshake. Default 5 s.
    pub handshake_timeout: Duration,
    /// Shared (zero-copy) mode: the snapshot's copy on tmpfs or hugetlbfs.
    pub shared: Option<PathBuf>,
    /// How an existing `shared` file is checked before it is reused.
    pub verify: Verify,
    /// Write every peer's summary here (JSON) on exit.
    pub json: Option<PathBuf>,
    /// Keep every peer's summary for [`Server::run`](crate::Server::run)
    /// to give (with `json` they are kept anyway). Off, a serve that runs
    /// for months keeps nothing of each VM it served once it is gone
    /// (`faultline-serve` keeps them only with `--json`). Default on.
    pub summaries: bool,
    /// Takeover: deposit every peer with a keeper process (started by the
    /// first serve: this program run again as a keeper, see
    /// [`keeper`](crate::keeper); a program that sets this calls
    /// [`cli::main_if_keeper`](crate::cli::main_if_keeper) first in
    /// its `main`), and take the peers a dead serve left there over at
    /// start.
    pub takeover: bool,
    /// Takeover: how long the keeper waits for a serve once none is
    /// attached, before it kills its peers (or leaves them, with
    /// `leave_peer_on_error`). Default 30 s.
    pub keeper_wait: Duration,
    /// Takeover with systemd's file-descriptor store as the keeper
    /// (`$NOTIFY_SOCKET`, see [`keeper::fdstore`](crate::keeper::fdstore)):
    /// what the keeper process would hold is stored there, and taken back
    /// from `$LISTEN_FDS` when the service manager starts serve again.
    pub fd_store: bool,
    /// Serve live metrics (OpenMetrics text) here.
    pub metrics: Option<MetricsAddr>,
    /// How the lines on stderr are written.
    pub log_format: LogFormat,
    /// TSC stamps of each peer's last this many faults, in its summary
    /// ([`PeerSummary::phases`](crate::PeerSummary::phases)). Default 0:
    /// off.
    pub phase_samples: usize,
    /// Workers: every handler thread reads every peer's userfaultfd (one
    /// peer's faults served on all of them at once); else each peer is
    /// served by one thread. Default false.
    pub workers: bool,
    /// Pin handler thread `i` to the `i`-th CPU serve may run on
    /// (`ForeignEngineConfig::pin`), each reading one message per
    /// `read(2)` (`--engine per-cpu`). Default false.
    pub pin: bool,
    /// Install a fault's window faulting page first and wake its thread
    /// before copying the rest (copy mode). Default false.
    pub wake_first: bool,
    /// Shared mode: hand each peer that maps the shared copy back to the
    /// kernel once set up (`ForeignPeer::hand_back`).
    pub hand_back: bool,
    /// The window of an isolated fault, in pages (at most
    /// `fault_around`). Default [`FAULT_AROUND_INITIAL`].
    pub fault_around_initial: usize,
    /// Adaptive isolated windows (`--adaptive-window`): sized per peer
    /// region from where its faults land, weighed by the install mode's
    /// cost ([`WindowTuning::COPY`](faultline::policy::WindowTuning::COPY),
    /// [`WindowTuning::SHARED`](faultline::policy::WindowTuning::SHARED)). Default
    /// false.
    pub adaptive_window: bool,
    /// The window of an isolated fault in shared mode, in pages (at most
    /// `fault_around`). Default [`FAULT_AROUND_INITIAL_SHARED`].
    pub fault_around_initial_shared: usize,
    /// Shared mode over 2 MiB pages: the huge pages one fault maps
    /// ([`faultline::ForeignOptions::huge_window`]). Default
    /// [`faultline::HUGE_WINDOW`].
    pub fault_around_huge: usize,
    /// Bytes a run-ahead populator installs ahead of each sequential or
    /// strided stream of a peer's faults (seed 004: the next window is
    /// there before the vCPU reaches it); 0, the default, runs none. Off
    /// while recording (the record is the order of the peer's own faults).
    pub run_ahead: usize,
    /// Dirty tracking: write each tracked peer's dirty set (the pages it
    /// wrote or dropped since it was served) here, at its hang-up and on
    /// request; `{peer}` is replaced by its connection number (without
    /// it, the first peer only is tracked).
    pub track_dirty: Option<PathBuf>,
}

/// Why a [`ServeConfig`] cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `--metrics` names the socket VMMs connect to.
    #[error("--metrics {}: the path of --socket (the VMMs' socket): give the metrics another", .0.display())]
    MetricsAtSocket(PathBuf),
    /// No handler thread.
    #[error("the number of handler threads must be at least 1")]
    Threads,
    /// A peer count of 0 (the server would stop before serving).
    #[error("the number of peers to serve must be at least 1")]
    Peers,
    /// A wait that must be longer than zero is not.
    #[error("{what} must be more than 0 seconds")]
    ZeroTime {
        /// The wait (its flag).
        what: &'static str,
    },
    /// More of something than serve runs.
    #[error("{what}: {asked} is more than the {max} serve allows")]
    TooMany {
        /// What (its flag).
        what: &'static str,
        /// The number asked for.
        asked: usize,
        /// The largest allowed.
        max: usize,
    },
    /// A remote store in a build without the `redis` feature.
    #[error(
        "the store {url} needs Redis support: this build of faultline-serve lacks its \
         `redis` cargo feature (build with `--features redis`, or use the `faultline` \
         command, which has it)"
    )]
    StoreNeedsFeature {
        /// The store asked for.
        url: String,
    },
}

impl ServeConfig {
    /// Serve `source` on `socket`, every other field at its default.
    pub fn new(socket: impl Into<PathBuf>, source: Source) -> ServeConfig {
        ServeConfig {
            socket: socket.into(),
            source,
            timeout: Some(Duration::from_secs(30)),
            peers: None,
            threads: 1,
            engine: HandlerWait::ADAPTIVE,
            fault_around: FAULT_AROUND,
            record: None,
            prefetch: None,
            prefetch_helpers: None,
            prefetch_chunk: None,
            leave_peer_on_error: false,
            grace: Duration::from_secs(30),
            prefetch_idle: false,
            handshake_timeout: Duration::from_secs(5),
            shared: None,
            verify: Verify::Sample,
            json: None,
            summaries: true,
            takeover: false,
            keeper_wait: Duration::from_secs(30),
            fd_store: false,
            metrics: None,
            log_format: LogFormat::Text,
            phase_samples: 0,
            workers: false,
            pin: false,
            wake_first: false,
            hand_back: false,
            fault_around_initial: FAULT_AROUND_INITIAL,
            adaptive_window: false,
            fault_around_initial_shared: FAULT_AROUND_INITIAL_SHARED,
            fault_around_huge: faultline::HUGE_WINDOW,
            run_ahead: 0,
            track_dirty: None,
        }
    }

    /// The read-ahead of a peer's regions: the kernel's fault-around
    /// ([`FAULT_AROUND_INITIAL`] aligned pages) on an isolated fault, a
    /// window doubling up to `fault_around` on a sequential stream; one
    /// page per fault with `fault_around` 0 or 1.
    pub fn readahead(&self) -> ReadaheadConfig {
        self.readahead_for(false)
    }

    /// [`ServeConfig::readahead`] of a peer served in shared mode
    /// (`shared`: its isolated window is `fault_around_initial_shared`)
    /// or copy mode.
    pub fn readahead_for(&self, shared: bool) -> ReadaheadConfig {
        if self.fault_around <= 1 {
            ReadaheadConfig::off()
        } else {
            let cap = self.fault_around;
            let initial = if shared {
                self.fault_around_initial_shared
            } else {
                self.fault_around_initial
            };
            ReadaheadConfig::adaptive(initial.clamp(1, cap), cap)
        }
    }

    /// Checks what can be checked before anything is opened: counts of at
    /// least one and at most [`MAX_THREADS`] (threads) or
    /// [`MAX_FAULT_AROUND`] (pages), waits longer than zero (a
    /// [`Duration`] is finite: `inf` and `NaN` never become one).
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.threads == 0 {
            return Err(ConfigError::Threads);
        }
        if self.peers == Some(0) {
            return Err(ConfigError::Peers);
        }
        let too_many = |what, asked: usize, max| {
            if asked > max {
                Err(ConfigError::TooMany { what, asked, max })
            } else {
                Ok(())
            }
        };
        too_many("--threads (handler threads)", self.threads, MAX_THREADS)?;
        if let Some(h) = self.prefetch_helpers {
            too_many("--prefetch-helpers", h, MAX_THREADS)?;
        }
        too_many(
            "--fault-around (pages)",
            self.fault_around,
            MAX_FAULT_AROUND,
        )?;
        for (what, d) in [
            ("--timeout", self.timeout.unwrap_or(Duration::MAX)),
            ("--handshake-timeout", self.handshake_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroTime { what });
            }
        }
        if let Some(MetricsAddr::Unix(p)) = &self.metrics {
            let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
            if abs(p) == abs(&self.socket) {
                return Err(ConfigError::MetricsAtSocket(p.clone()));
            }
        }
        if let Source::Store(url) = &self.source {
            if !cfg!(feature = "redis") {
                return Err(ConfigError::StoreNeedsFeature { url: url.clone() });
            }
        }
        Ok(())
    }
}
