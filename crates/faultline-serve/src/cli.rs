//! The command line of `faultline-serve` (and of `faultline serve`, which
//! forwards to it): flags mapped onto a [`ServeConfig`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::config::{LogFormat, MetricsAddr, ServeConfig, Source, Verify};
use crate::server::{RequestHandle, Server};
use faultline::HandlerWait;
use faultline_sys::signal;

/// `faultline serve` arguments.
#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["mem", "store"])))]
pub struct ServeArgs {
    /// UNIX socket to bind (give its path to Firecracker as `backend_path`).
    /// A stale socket file (no server answers on it) is replaced; a live
    /// one (another serve's) and anything that is not a socket are
    /// refused. On exit serve removes the socket it created, and only it.
    #[arg(long)]
    pub socket: PathBuf,
    /// The snapshot's memory file (the regions' bytes, back to back).
    #[arg(long)]
    pub mem: Option<PathBuf>,
    /// Read the snapshot's bytes from a remote store instead of --mem:
    /// `redis://HOST:PORT#NAME`, `redis+unix:///PATH#NAME` or
    /// `redis-cluster://HOST:PORT,...#NAME`, uploaded with `faultline
    /// store put MEMFILE URL`. The handler threads read it in batches;
    /// a page the store fails to give is never zeros (the peer's fault is
    /// not resolved and the peer is killed, see --leave-peer-on-error).
    #[arg(long)]
    pub store: Option<String>,
    /// Exit with an error when no peer is connected for this many seconds
    /// (at start, and whenever every peer has gone), or `none`: serve
    /// until stopped (a daemon under systemd). Default 30.
    #[arg(long, default_value = "30", value_parser = seconds_or_none)]
    pub timeout: IdleTimeout,
    /// Exit once this many peers have connected and all of them have gone.
    /// Default: serve until killed (or the timeout).
    #[arg(long, value_parser = faultline_cli_support::at_least_one)]
    pub peers: Option<usize>,
    /// Handler threads (each peer is served by one of them). Default 1
    /// (workers: one per CPU, at least 2; per-cpu: one per CPU, not
    /// settable).
    #[arg(long, value_parser = faultline_cli_support::at_least_one)]
    pub threads: Option<usize>,
    /// How a handler thread waits for its peers' faults: `adaptive` spins
    /// (polls without sleeping) while a peer faults and sleeps in poll(2)
    /// 1 ms after its last message; `spin` never sleeps (a whole CPU per
    /// handler thread); `poll` always sleeps (every fault pays the
    /// handler's wake-up); `workers` waits as `adaptive` and has every
    /// handler thread read every peer's userfaultfd, so one peer's faults
    /// are copied on several CPUs at once (--threads of them; by default
    /// one per CPU, at least 2); `per-cpu` pins one handler thread on
    /// each CPU, each asleep in poll(2) and reading every peer's
    /// userfaultfd: the one on the faulting vCPU's CPU runs as soon as
    /// the vCPU sleeps, with no inter-processor wake-up. Default
    /// adaptive.
    #[arg(long, value_enum, default_value_t = EngineArg::Adaptive)]
    pub engine: EngineArg,
    /// The cap of a fault's window, in pages (0 or 1: one page per
    /// fault). As the kernel's fault-around and read-ahead: an isolated
    /// fault installs the aligned 16 pages around it (128 in shared mode,
    /// fewer with a smaller cap; see --fault-around-initial); a fault where an earlier window ended (or up to 3 pages past it) continues that stream
    /// and doubles its window, up to this cap. Default 512 (2 MiB of 4 KiB
    /// pages).
    #[arg(long, default_value_t = crate::config::FAULT_AROUND)]
    pub fault_around: usize,
    /// Write the pages the first peer's restore touched, in the order it
    /// first did and when, to FILE when it hangs up (one page per fault:
    /// fault-around is off for a peer that records). With `{peer}` in FILE's
    /// name (not its directory) every peer records, each to FILE with `{peer}` replaced by its
    /// connection number (merge them: `faultline record merge`, or `faultline-serve record merge`).
    /// The record names the memory file it was made for. SIGUSR2 (or
    /// `POST /record` on --metrics) cuts every recording peer's record:
    /// written then, not at its hang-up (the last cycle: what the VM
    /// touched from its restore to, say, the pause before its snapshot).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Install the pages listed in FILE (written by --record, or merged)
    /// eagerly on every restore; faults are served first, and pages
    /// outside the set on demand. A record made for another memory file
    /// is refused.
    #[arg(long)]
    pub prefetch: Option<PathBuf>,
    /// Prefetch helper threads beside the handler threads (each installs
    /// pieces of a fault's long window beside the handler thread copying
    /// it, and queued prefetch runs of any peer, under that peer's copy
    /// gate; 0: the handler threads alone). Default: the number of CPUs (more
    /// copiers than CPUs still helped: `bench restore` 10% warm, 2 CPUs,
    /// 1/2/3 helpers: ~52/~40/~36 ms).
    #[arg(long)]
    pub prefetch_helpers: Option<usize>,
    /// Bytes of prefetch a handler thread installs between two looks for
    /// faults (a demand fault waits at most that long behind prefetch
    /// there; the helpers install 256 KiB pieces). 4K to 64M, a multiple
    /// of 4 KiB. Default 2M.
    #[arg(long, value_parser = faultline_cli_support::flags::byte_size(4096, 64 << 20, 4096))]
    pub prefetch_chunk: Option<usize>,
    /// Run the prefetch helpers under SCHED_IDLE: they copy only on CPUs
    /// the VMs' vCPUs leave idle (faults are still served first, by the
    /// handler threads at normal priority).
    #[arg(long)]
    pub prefetch_idle: bool,
    /// Leave running a peer whose hand-off is refused, whose serving
    /// fails, or that is still served when a stop's --grace ends. By
    /// default such a peer is killed (SIGKILL, pid from SO_PEERCRED) and
    /// serve says why: its vCPUs would otherwise hang at their next
    /// missing page, forever.
    #[arg(long)]
    pub leave_peer_on_error: bool,
    /// On SIGTERM, SIGINT or SIGHUP serve stops accepting (its socket is removed)
    /// and serves the peers it has until they hang up, for at most this
    /// many seconds; then kills those left (see --leave-peer-on-error),
    /// writes --json and exits. A second signal ends it at once. Default 30.
    #[arg(long, default_value = "30", value_parser = seconds)]
    pub grace: Duration,
    /// Seconds a connected peer has to send its handshake. Default 5.
    #[arg(long, default_value = "5", value_parser = seconds)]
    pub handshake_timeout: Duration,
    /// Shared (zero-copy) mode: keep a copy of the snapshot's bytes in
    /// PATH, a file on tmpfs (e.g. /dev/shm/NAME): written at start when
    /// absent (mode 0444; the time it takes is printed: the one-time
    /// population of the shared page cache), reused when present (same
    /// size, and content equal to the memory file's as --verify checks). A peer that maps
    /// PATH `MAP_PRIVATE` at its regions' offsets and registers them
    /// MISSING|MINOR (`UFFD_FEATURE_MINOR_SHMEM`) is served with
    /// `UFFDIO_CONTINUE` (no copy); serve checks the mapping in the peer's
    /// memory map (PROCMAP_QUERY on /proc/PID/maps) and registers the
    /// regions MISSING|MINOR itself through the peer's userfaultfd (a no-op
    /// for a peer that did). Peers with anonymous memory are served by copy as
    /// before, by the same process. PATH is never removed by serve.
    #[arg(long)]
    pub shared: Option<PathBuf>,
    /// With --shared: once a peer is found mapping the shared copy, give
    /// its memory back to the kernel: serve unregisters its regions
    /// through its userfaultfd and the kernel serves every fault from the
    /// copy's page cache itself, as for a VMM that mapped the file
    /// without one; on a tmpfs mounted `huge=always` that is a 2 MiB
    /// mapping a fault (UFFDIO_CONTINUE maps 4 KiB a page), the kernel's
    /// own warm speed. What it gives up: a page the VMM drops (balloon)
    /// reads the copy's bytes again, not zeros (as with Firecracker's File
    /// backend); nothing is recorded, tracked or prefetched for it. A
    /// peer served by copy (its memory is not the copy) is served as
    /// without the flag.
    #[arg(long, requires = "shared", conflicts_with_all = ["record", "track_dirty", "prefetch"])]
    pub hand_back: bool,
    /// How an existing --shared file's content is checked against the
    /// memory file before it is reused: `sample` (64 pages spread over it)
    /// or `full` (every byte; about as long as writing it). Default sample.
    #[arg(long, value_enum, default_value_t = VerifyArg::Sample)]
    pub verify: VerifyArg,
    /// Write every peer's statistics to FILE (JSON) on exit.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Survive a crash: a keeper process (this program run again, started
    /// by the first serve; its command line `faultline-serve-keeper`, its
    /// name `fl-serve-keeper`, so `pkill -f` of serve's command line spares
    /// it) holds every peer's userfaultfd, connection and REMOVE journal;
    /// after `kill -9` of serve, the same command started again takes the
    /// peers over (wakes their blocked vCPUs, serves on). The keeper exits
    /// when its peers are gone, or kills them after --keeper-wait without
    /// a serve (see --leave-peer-on-error).
    #[arg(long)]
    pub takeover: bool,
    /// Survive a crash under systemd: as --takeover, with the service
    /// manager's file-descriptor store as the keeper (needs $NOTIFY_SOCKET
    /// and FileDescriptorStoreMax= in the unit): the listener, every
    /// connection, userfaultfd, journal and handshake are stored
    /// (FDSTORE=1) and taken back from $LISTEN_FDS when it restarts serve
    /// (Restart=always).
    #[arg(long, conflicts_with = "takeover")]
    pub fd_store: bool,
    /// With --takeover: how long the keeper holds the peers of a dead serve
    /// for a new one (more than 0 seconds, finite) before it kills them
    /// (see --leave-peer-on-error). Default: --timeout (30 with
    /// `--timeout none`).
    #[arg(long, requires = "takeover", value_parser = positive_seconds)]
    pub keeper_wait: Option<Duration>,
    /// Serve live metrics (OpenMetrics text, `GET /metrics`) on ADDR: a
    /// unix socket path (with a '/'), a TCP port on 127.0.0.1, or a
    /// loopback HOST:PORT. Per peer: faults by kind, pages installed on
    /// demand / by fault-around / by prefetch, bytes read, REMOVEs,
    /// EAGAIN, EEXIST, a fault-service-time histogram, prefetch
    /// progress; peers connected and hand-offs refused by reason.
    #[arg(long, value_parser = metrics_addr)]
    pub metrics: Option<MetricsAddr>,
    /// How serve's lines on stderr are written: `text` (`faultline serve:
    /// ...`) or `json` (one object a line: time, source, msg).
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
    /// Track the pages each restore writes (a diff snapshot's pages): its
    /// regions are registered write-protect through its own userfaultfd,
    /// pages are installed write-protected, and each page's first write is
    /// noted (a write-protect fault) and un-protected; pages it drops
    /// (balloon, MADV_DONTNEED) count too, they read zeros now. The set
    /// (bitmap and page list, naming the memory file) is written to FILE at
    /// the peer's hang-up and, for every tracked peer, on SIGUSR1 or `POST
    /// /dirty` to --metrics. With `{peer}` in FILE's name (not its
    /// directory) every peer is tracked,
    /// each to its own file; without, the first. A peer whose userfaultfd
    /// has UFFD_FEATURE_WP_ASYNC (the kernel un-protects written pages
    /// itself) is read from its page tables (PAGEMAP_SCAN of
    /// /proc/PID/pagemap) on request only: they go with it at its exit.
    /// With --takeover (or --fd-store) a VMM taken over stays tracked:
    /// the pages it wrote before are read from its page tables.
    #[arg(long)]
    pub track_dirty: Option<PathBuf>,
    /// Keep TSC stamps of each peer's last N faults along the handler's
    /// path (message read, store read, copy, wake) and write them in its
    /// --json summary (`phases`): what `bench restore` breaks a demand
    /// fault down with, joined with the peer's own stamps of its touches.
    /// 0 to 1048576; 64 bytes a sample. Default 0: off.
    #[arg(long, default_value_t = 0, value_parser = phase_samples)]
    pub phase_samples: usize,
    /// Copy mode: install a fault's window faulting page first and wake
    /// the faulting vCPU at once, then copy the rest of the window (by
    /// default one ioctl copies the whole window, then the vCPU is woken:
    /// it waits for every page of it).
    #[arg(long)]
    pub wake_first: bool,
    /// The window of an isolated fault, in pages (1 to 1024; at most
    /// --fault-around): 16 as the kernel's fault-around by default, 128 in
    /// shared mode (--shared: no copy, a page more costs less; or
    /// --fault-around when smaller); 1 installs only the faulting page (a
    /// sequential stream still grows its window from there, doubling up
    /// to --fault-around). Given, it holds in both modes.
    #[arg(long, value_parser = initial_window)]
    pub fault_around_initial: Option<usize>,
    /// Shared mode on hugetlbfs (guest memory in 2 MiB pages): the 2 MiB
    /// pages one fault maps, the aligned block holding it (1 to 512).
    /// CONTINUE maps a huge page with one page-table entry and no copy,
    /// so mapping its neighbours costs less than the faults they save.
    #[arg(long, default_value_t = faultline::HUGE_WINDOW, value_parser = huge_window)]
    pub fault_around_huge: usize,
    /// Size the window of an isolated fault from the evidence: start at
    /// --fault-around-initial, halve it while the pages a window leaves
    /// out (one fault in four installs half the window) are rarely asked
    /// for, double it while faults keep landing next to earlier windows,
    /// weighing a fault against the pages installed (copy mode: a fault
    /// is worth 25 pages, window 1 to 64; --shared: 40, 1 to 256; never
    /// above --fault-around). Default off: every isolated fault installs
    /// --fault-around-initial pages.
    #[arg(long)]
    pub adaptive_window: bool,
    /// Run a populator thread per region of each peer that installs this
    /// many bytes ahead of its sequential and strided fault streams
    /// (the library's run-ahead, seed 004: the next window is in place
    /// before the vCPU reaches it, at the cost of a thread and of pages
    /// the stream may not reach). 0 to 256M, a multiple of 4 KiB; off
    /// while recording. Default 0: none.
    #[arg(long, default_value = "0", value_parser = faultline_cli_support::flags::byte_size(0, 256 << 20, 4096))]
    pub run_ahead: usize,
}

/// Parses `--fault-around-initial`: 1 to 1024 pages.
fn initial_window(s: &str) -> Result<usize, String> {
    pages_between(s, 1, 1024)
}

/// Parses `--fault-around-huge`: 1 to 512 pages of 2 MiB (1 GiB).
fn huge_window(s: &str) -> Result<usize, String> {
    pages_between(s, 1, 512)
}

fn pages_between(s: &str, lo: u64, hi: u64) -> Result<usize, String> {
    let v = faultline_cli_support::flags::parse_u64(s)?;
    if !(lo..=hi).contains(&v) {
        return Err(faultline_cli_support::flags::range_error(lo, hi, "pages"));
    }
    Ok(v as usize)
}

/// Parses `--phase-samples`: 0 to 1 Mi samples.
fn phase_samples(s: &str) -> Result<usize, String> {
    let v = faultline_cli_support::flags::parse_u64(s)?;
    if v > 1 << 20 {
        return Err(faultline_cli_support::flags::range_error(
            0u64,
            1u64 << 20,
            "samples",
        ));
    }
    Ok(v as usize)
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    /// `faultline serve: MESSAGE`.
    Text,
    /// One JSON object a line.
    Json,
}

/// Parses `--metrics`.
fn metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    s.parse()
        .map_err(|e: crate::metrics::EndpointError| e.to_string())
}

/// `--engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    /// Sleep in poll(2) between messages.
    Poll,
    /// Never sleep.
    Spin,
    /// Spin while a peer faults, sleep once it is idle.
    Adaptive,
    /// Adaptive, every handler thread serving every peer: one VM's windows
    /// copied on several CPUs at once (faster on a sweeping guest, slower
    /// on scattered faults).
    Workers,
    /// One handler thread pinned on each CPU, asleep in poll(2), every one
    /// serving every peer: a fault is read by the thread on its vCPU's
    /// CPU, woken without an inter-processor wake-up.
    PerCpu,
}

impl EngineArg {
    /// The handler threads' wait this names.
    pub fn wait(self) -> HandlerWait {
        match self {
            EngineArg::Poll => HandlerWait::Poll,
            EngineArg::Spin => HandlerWait::Spin,
            EngineArg::Adaptive | EngineArg::Workers => HandlerWait::ADAPTIVE,
            EngineArg::PerCpu => HandlerWait::Poll,
        }
    }

    /// The handler threads for `--threads` (`None`: not given): workers
    /// default to one per CPU (at least 2), per-cpu has one per CPU.
    pub fn threads(self, threads: Option<usize>) -> usize {
        let cpus = || std::thread::available_parallelism().map_or(1, |n| n.get());
        match (self, threads) {
            // Every CPU serve may run on (a CPU quota does not remove any).
            (EngineArg::PerCpu, _) => {
                faultline_sys::thread::allowed_cpus().map_or_else(|_| cpus(), |c| c.len().max(1))
            }
            (_, Some(n)) => n,
            (EngineArg::Workers, None) => cpus().max(2),
            (_, None) => 1,
        }
    }

    /// Every handler thread serves every peer.
    pub fn spreads(self) -> bool {
        matches!(self, EngineArg::Workers | EngineArg::PerCpu)
    }
}

/// `--verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyArg {
    /// 64 sampled pages.
    Sample,
    /// Every byte.
    Full,
}

/// Parses a number of seconds (fractions allowed; not negative, not
/// infinite, not NaN; whether 0 is allowed is [`ServeConfig::check`]'s).
fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number of seconds: {e}"))?;
    if !v.is_finite() {
        return Err(format!("{s:?}: must be a finite number of seconds"));
    }
    Duration::try_from_secs_f64(v).map_err(|e| format!("{s:?}: {e}"))
}

/// How long the keeper holds a dead serve's peers when neither
/// `--keeper-wait` nor a `--timeout` says: a keeper never holds a VM for
/// ever.
const DEFAULT_KEEPER_WAIT: Duration = Duration::from_secs(30);

/// `--timeout`: a time, or none (no limit).
#[derive(Debug, Clone, Copy)]
pub struct IdleTimeout(pub Option<Duration>);

/// [`seconds`] (more than 0), or `none` (no limit).
fn seconds_or_none(s: &str) -> Result<IdleTimeout, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Ok(IdleTimeout(None));
    }
    positive_seconds(s)
        .map(|d| IdleTimeout(Some(d)))
        .map_err(|e| format!("{e} (or `none`: no timeout)"))
}

/// [`seconds`], more than 0.
fn positive_seconds(s: &str) -> Result<Duration, String> {
    let d = seconds(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: must be more than 0 seconds"));
    }
    Ok(d)
}

impl ServeArgs {
    /// The configuration these flags say.
    pub fn config(&self) -> anyhow::Result<ServeConfig> {
        let source = match (&self.store, &self.mem) {
            (Some(url), _) => Source::Store(url.clone()),
            (None, Some(mem)) => Source::Mem(mem.clone()),
            (None, None) => anyhow::bail!("--mem or --store is required"),
        };
        if let (EngineArg::PerCpu, Some(n)) = (self.engine, self.threads) {
            anyhow::bail!(
                "--threads {n} with --engine per-cpu: that engine has one handler thread on each \
                 CPU serve may use (restrict those with taskset to have fewer)"
            );
        }
        if let Some(n) = self.fault_around_initial {
            anyhow::ensure!(
                n <= self.fault_around.max(1),
                "--fault-around-initial {n} is more than --fault-around {}: the first window \
                 of an isolated fault cannot be larger than the largest window",
                self.fault_around
            );
        }
        Ok(ServeConfig {
            timeout: self.timeout.0,
            peers: self.peers,
            threads: self.engine.threads(self.threads),
            engine: self.engine.wait(),
            fault_around: self.fault_around,
            record: self.record.clone(),
            prefetch: self.prefetch.clone(),
            prefetch_helpers: self.prefetch_helpers,
            prefetch_chunk: self.prefetch_chunk,
            leave_peer_on_error: self.leave_peer_on_error,
            keeper_wait: self
                .keeper_wait
                .unwrap_or(self.timeout.0.unwrap_or(DEFAULT_KEEPER_WAIT)),
            grace: self.grace,
            prefetch_idle: self.prefetch_idle,
            handshake_timeout: self.handshake_timeout,
            shared: self.shared.clone(),
            verify: match self.verify {
                VerifyArg::Sample => Verify::Sample,
                VerifyArg::Full => Verify::Full,
            },
            json: self.json.clone(),
            summaries: self.json.is_some(),
            takeover: self.takeover,
            fd_store: self.fd_store,
            metrics: self.metrics.clone(),
            log_format: match self.log_format {
                LogFormatArg::Text => LogFormat::Text,
                LogFormatArg::Json => LogFormat::Json,
            },
            phase_samples: self.phase_samples,
            workers: self.engine.spreads(),
            pin: self.engine == EngineArg::PerCpu,
            wake_first: self.wake_first,
            hand_back: self.hand_back,
            adaptive_window: self.adaptive_window,
            fault_around_initial: self
                .fault_around_initial
                .unwrap_or(crate::config::FAULT_AROUND_INITIAL),
            fault_around_initial_shared: self
                .fault_around_initial
                .unwrap_or(crate::config::FAULT_AROUND_INITIAL_SHARED),
            fault_around_huge: self.fault_around_huge,
            run_ahead: self.run_ahead,
            track_dirty: self.track_dirty.clone(),
            ..ServeConfig::new(self.socket.clone(), source)
        })
    }
}

/// What a signal asks of a running server: how many files it wrote.
type Request = fn(&RequestHandle) -> usize;

/// The signals serve takes on threads of its own, and what each asks:
/// SIGUSR1 the dirty sets (`--track-dirty`), SIGUSR2 the records' cut
/// (`--record`). Taken with or without those flags (then said to do
/// nothing): their default action would end serve and every VM's
/// restore with it.
const REQUESTS: [(i32, &str, Request); 2] = [
    (signal::SIGUSR1, "sigusr1", RequestHandle::write_dirty_sets),
    (signal::SIGUSR2, "sigusr2", RequestHandle::cut_records),
];

/// Blocks the signals serve takes on threads of its own (SIGUSR1, SIGUSR2):
/// call it before the process starts any thread (a thread started before
/// would take the signal's default action, the end of the process).
/// [`run`] calls it; a front door that starts threads before `run`
/// (`faultline`'s signal thread) calls it first.
pub fn block_signals() -> anyhow::Result<()> {
    for (sig, name, _) in REQUESTS {
        signal::set_blocked_all(&[sig], true).with_context(|| format!("blocking {name}"))?;
    }
    Ok(())
}

/// Runs this process as a takeover keeper and exits when a serve started
/// it as one ([`keeper::Spec`](crate::keeper::Spec) in
/// [`KEEPER_ENV`](crate::keeper::KEEPER_ENV): a keeper has no arguments,
/// see [`Keeper::start`](crate::keeper::Keeper::start)); returns at once
/// otherwise. `faultline-serve` and `faultline` call it first in `main`.
/// The keeper blocks serve's request signals (SIGUSR1, SIGUSR2): one sent
/// to serve's and its keeper's pids ignores the keeper rather than end it.
pub fn main_if_keeper() {
    let Some(spec) = crate::keeper::Spec::of_this_process() else {
        return;
    };
    crate::log::format_from_env();
    let done = block_signals().and_then(|()| Ok(crate::keeper::run(&spec?)?));
    if let Err(e) = done {
        end_with(&e, "faultline serve keeper");
    }
    std::process::exit(0);
}

/// Ends the process on `e`, said as `--log-format` says (an `error`
/// object in JSON) by `source`.
fn end_with(e: &anyhow::Error, source: &str) -> ! {
    if crate::log::is_json() {
        let text = faultline_cli_support::error_lines(e).join(": ");
        crate::log::say_as(source, Some("error"), format_args!("{text}"));
    } else {
        faultline_cli_support::print_error(e);
    }
    std::process::exit(1);
}

/// Runs `faultline-serve ARGS` (`faultline serve ARGS`): SIGINT, SIGTERM
/// and SIGHUP stop the server gracefully (see `--grace`); a second one
/// ends it at once. With `--track-dirty`, SIGUSR1 writes the dirty sets of
/// the tracked peers; with `--record`, SIGUSR2 cuts the recording peers'
/// records (each taken, like the others, on a thread of its own; without
/// the flag, said to do nothing).
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    // First, before any thread starts: the requests' signals go to
    // threads of their own.
    block_signals()?;
    // The stop signals too (faultline_cli_support::cleanup).
    faultline_cli_support::cleanup::install().context("taking SIGINT, SIGTERM and SIGHUP")?;
    end_on_panic();
    let config = args.config()?;
    crate::log::set_format(config.log_format);
    let server = Server::start(config).unwrap_or_else(|e| end_with(&e.into(), "faultline serve"));
    for (sig, name, ask) in REQUESTS {
        let handle = server.request_handle();
        std::thread::Builder::new()
            .name(format!("fl-{name}"))
            .spawn(move || loop {
                if let Ok(Some(_)) = signal::wait_any(&[sig], Duration::from_secs(3600)) {
                    ask(&handle);
                }
            })
            .with_context(|| format!("starting the {name} thread"))?;
    }
    let stop = server.stop_handle();
    faultline_cli_support::cleanup::on_stop(move |sig| stop.stop(sig));
    let abort = server.abort_handle();
    faultline_cli_support::cleanup::on_abort(move |sig| abort.abort(sig));
    if let Err(e) = server.run() {
        end_with(&e.into(), "faultline serve");
    }
    Ok(())
}

/// A panic on any of serve's threads is a bug, and a handler thread that
/// unwinds leaves the VMMs it served with nobody reading their faults
/// while serve looks alive: hung, and no keeper steps in. The process
/// ends at once instead (`abort`, after the panic's message), so its
/// supervisor sees it die and, with `--takeover`, the next serve takes
/// every VMM over. (A program that embeds [`Server`] should do the same.)
fn end_on_panic() {
    let said = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        said(info);
        crate::server::say(format_args!(
            "a thread panicked (a bug: please report it): serve ends now rather than leave the VMMs that thread served hanging; with --takeover the next serve takes them over"
        ));
        std::process::abort();
    }));
}
