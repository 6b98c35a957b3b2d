//! The snapshot-restore server: one process serving the page faults of
//! every VM restored from one snapshot.
//!
//! ```text
//!  Server::start: check the config; open the store (--mem or --store); read
//!     │           the recorded set (--prefetch); open or write the shared
//!     │           snapshot (--shared); start the handler threads; bind
//!     ▼
//!  Server::run, listener (this thread) ── accept ──► a connection (accept.rs):
//!     │    on this thread when its handshake is         1 receive the hand-off
//!     │    there within 2 ms, else a thread of its own  2 choose the backing
//!     │                                                 3 build the peer
//!     │                                                 4 report
//!     ▼
//!  engine events (hang-up, failure, second message, prefetch done) ─► stderr,
//!     the record file, the summaries (events.rs)
//!     ▼
//!  stop: --peers served, or no peer for --timeout; the socket removed, the
//!        summaries written (--json)
//! ```
//!
//! One memory file serves every peer: one read-only shared mapping
//! (`FileStore`), so many VMs restored from one snapshot share its page
//! cache and the handler's memory does not grow with them beyond each
//! peer's bookkeeping (residency map, record log).

mod accept;
mod backing;
mod build;
mod error;
mod events;
mod log;
mod receive;
mod setup;
mod state;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, Once};
use std::time::Instant;

use faultline::{EngineKind, ForeignEngine, ForeignEngineConfig, PeerEvent, PrefetchPlan};
use faultline_sys::poll::{self, PollFd};

pub use error::ServeError;

use crate::config::ServeConfig;
use crate::record;
use crate::summary::PeerSummary;
use log::say;
use state::{Recorder, State};

/// How long the listener waits for a new connection's handshake before it
/// hands the connection to a thread of its own, ms.
const HANDSHAKE_INLINE_MS: i32 = 2;

/// How long the listener sleeps in `poll` between looks at the engine's
/// events and the timeout, ms.
const TICK_MS: i32 = 50;

/// A server, started and listening (see the module docs).
pub struct Server {
    state: Arc<State>,
    listener: UnixListener,
    events: Receiver<PeerEvent>,
}

impl Server {
    /// Checks `config`, opens what it serves and binds its socket; says
    /// so on stderr.
    pub fn start(config: ServeConfig) -> Result<Server, ServeError> {
        config.check()?;
        let (store, source) = setup::open_store(&config.source)?;
        let store_len = store.len().unwrap_or(0);
        let prefetch = match &config.prefetch {
            Some(p) => Some(record::read(p)?),
            None => None,
        };
        let snapshot = match &config.shared {
            Some(path) => Some(Arc::new(setup::shared_snapshot(
                path,
                &*store,
                config.verify,
            )?)),
            None => None,
        };
        // The foreign engine serves with handler threads reading the
        // peers' userfaultfds (the only kind that can serve another
        // process: `signal` is refused), waiting as --engine says.
        let (engine, events) = ForeignEngine::new(
            EngineKind::Poll,
            ForeignEngineConfig {
                threads: config.threads,
                wait: config.engine,
                prefetch_helpers: config
                    .prefetch_helpers
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
                ..Default::default()
            },
        )
        .map_err(ServeError::Engine)?;
        let listener = bind(&config.socket)?;
        say(format_args!(
            "listening on {} for peers of {source} ({store_len} bytes); timeout {}s",
            config.socket.display(),
            config.timeout.as_secs_f64()
        ));
        let prepared = Once::new();
        if let (Some(offs), None) = (&prefetch, &snapshot) {
            // The recorded set is known before any peer connects: read it
            // and map it now, so installs after a handshake only copy.
            // (With --shared, at the first peer served by copy: shared
            // peers never read the memory file.)
            prepared.call_once(|| ());
            setup::prepare(&store, offs).map_err(|source| ServeError::Spawn {
                what: "the thread preparing the recorded set".into(),
                source,
            })?;
        }
        let state = Arc::new(State {
            config,
            store,
            store_len,
            snapshot,
            prepared,
            engine,
            plan: prefetch.as_deref().map(PrefetchPlan::new),
            prefetch,
            connected: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            recorder: Mutex::new(Recorder::Free),
            served: Mutex::new(Vec::new()),
            summaries: Mutex::new(Vec::new()),
        });
        Ok(Server {
            state,
            listener,
            events,
        })
    }

    /// Serves until the configured peers have come and gone, or no peer
    /// was connected for the timeout (an error); then removes the socket
    /// and writes the summaries (`json`). Gives the summaries.
    pub fn run(self) -> Result<Vec<PeerSummary>, ServeError> {
        let result = self.serve();
        let config = &self.state.config;
        let _ = std::fs::remove_file(&config.socket);
        let summaries = self.state.summaries.lock().expect("summaries").clone();
        if let Some(path) = &config.json {
            let text = serde_json::to_string_pretty(&summaries).map_err(std::io::Error::from);
            text.and_then(|t| std::fs::write(path, t))
                .map_err(|source| ServeError::WriteJson {
                    path: path.clone(),
                    source,
                })?;
        }
        result.map(|()| summaries)
    }

    /// The listener's loop.
    fn serve(&self) -> Result<(), ServeError> {
        let state = &self.state;
        let timeout = state.config.timeout;
        let mut idle_since = Some(Instant::now());
        loop {
            let mut fds = [PollFd {
                fd: self.listener.as_raw_fd(),
                events: poll::events::IN,
                revents: 0,
            }];
            let _ = poll::poll(&mut fds, TICK_MS);
            self.accept_all()?;
            while let Ok(ev) = self.events.try_recv() {
                events::on_event(state, ev);
            }
            let (c, f) = (state.connected.load(SeqCst), state.finished.load(SeqCst));
            if state.config.peers.is_some_and(|n| c >= n && f >= c) {
                say(format_args!("all {c} peers served; exiting"));
                return Ok(());
            }
            if c > f {
                idle_since = None;
            } else if idle_since.get_or_insert_with(Instant::now).elapsed() > timeout {
                return Err(ServeError::Timeout(timeout));
            }
        }
    }

    /// Accepts every pending connection.
    fn accept_all(&self) -> Result<(), ServeError> {
        loop {
            match self.listener.accept() {
                Ok((conn, _)) => {
                    let accepted_ns = faultline_sys::monotonic_ns();
                    let n = self.state.connected.fetch_add(1, SeqCst) + 1;
                    // A peer sends its handshake right after connecting:
                    // when it is there within HANDSHAKE_INLINE_MS, the peer
                    // is set up on this thread (no thread start on the
                    // restore's critical path); else on a thread of its
                    // own, so a slow or silent peer never holds the
                    // listener up.
                    if receive::readable_within(&conn, HANDSHAKE_INLINE_MS) {
                        accept::handle(&self.state, n, conn, accepted_ns);
                        continue;
                    }
                    let s = self.state.clone();
                    std::thread::Builder::new()
                        .name(format!("faultline-handshake-{n}"))
                        .spawn(move || accept::handle(&s, n, conn, accepted_ns))
                        .map_err(|source| ServeError::Spawn {
                            what: format!("the handshake thread of peer {n}"),
                            source,
                        })?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => say(format_args!("accept failed: {e}")),
            }
        }
    }
}

/// Binds `path` (non-blocking), replacing a stale socket there; anything
/// else at `path` is refused, never removed.
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(ServeError::NotASocket { path: path.into() })
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
    let bind_err = |source| ServeError::Bind {
        path: path.into(),
        source,
    };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    Ok(listener)
}
