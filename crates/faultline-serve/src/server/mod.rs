//! The snapshot-restore server: one process serving the page faults of
//! every VM restored from one snapshot.
//!
//! ```text
//!  Server::start: check the config; open the store (--mem or --store); read
//!     │           the recorded set (--prefetch); open or write the shared
//!     │           snapshot (--shared); start the handler threads and the
//!     │           metrics endpoint (--metrics); bind the socket last, so
//!     │           that once it exists serve is up
//!     ▼
//!  Server::run, listener (this thread) ── accept ──► a connection (accept.rs):
//!     │    on this thread when its handshake is         1 receive the hand-off
//!     │    there within 2 ms, else a thread of its own  2 choose the backing
//!     │                                                 3 build the peer
//!     │                                                 4 report
//!     ▼
//!  engine events (hang-up, failure, prefetch done, what the peer sends
//!     after its hand-off: stall reports, reports.rs) ─► stderr, the record
//!     file, the summaries (events.rs)
//!     ▼
//!  stop: --peers served, or no peer for --timeout, or a StopHandle
//!        (SIGTERM/SIGINT/SIGHUP in the binaries): the socket removed, the
//!        summaries written (--json)
//! ```
//!
//! A stop asked for ([`StopHandle::stop`]) runs in four steps:
//!
//! 1. The socket is removed (only the one this server bound, see
//!    `socket.rs`): no new connection reaches it.
//! 2. Connections already queued are accepted and served as any other.
//! 3. The peers being served are served on until they hang up, for at most
//!    the grace period (`--grace`).
//! 4. Those still there are killed (SIGKILL, unless
//!    `--leave-peer-on-error`; without a handler their vCPUs hang at the
//!    next missing page), each with its summary; `--json` is written.
//!
//! The same end (step 4) meets the peers still served when the server
//! stops on an error. With `--takeover` ([`crate::keeper`]) a stop skips
//! steps 3 and 4: the peers stay with the keeper for the next serve, and
//! peers the keeper held for a dead serve are taken over when `run`
//! starts.
//!
//! One memory file serves every peer: one read-only shared mapping
//! (`FileStore`), so many VMs restored from one snapshot share its page
//! cache and the handler's memory does not grow with them beyond each
//! peer's bookkeeping (residency map, record log).

mod accept;
mod backing;
mod build;
mod dirty;
mod error;
mod events;
mod oom;
mod outputs;
mod receive;
mod recording;
mod reports;
mod setup;
mod socket;
mod state;
mod unprotected;

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use faultline::{EngineKind, ForeignEngine, ForeignEngineConfig, PeerEvent, PrefetchPlan};
use faultline_cli_support::OutputPath;
use faultline_sys::poll::{self, PollFd};
use faultline_sys::process;
use faultline_sys::signal::{SIGHUP, SIGINT, SIGTERM};

pub use error::ServeError;

use crate::config::ServeConfig;
use crate::keeper::{Joined, Keeper, KeeperError, Spec, Taken};
pub(crate) use crate::log::say;
use crate::metrics::{Endpoint, Exposition, ServerCounters};
use crate::record;
use crate::summary::PeerSummary;
use socket::Socket;
use state::{Recorder, State};

/// How long the listener waits for a new connection's handshake before it
/// hands the connection to a thread of its own, ms.
const HANDSHAKE_INLINE_MS: i32 = 2;

/// How long the listener sleeps in `poll` between looks at the engine's
/// events, the stop flag and the timeout, ms.
const TICK_MS: i32 = 50;

/// A server, started and listening (see the module docs).
pub struct Server {
    state: Arc<State>,
    socket: Socket,
    events: Receiver<PeerEvent>,
    /// The metrics endpoint (`--metrics`), stopped when the server is.
    metrics: Option<Endpoint>,
    stop: StopHandle,
    /// Where `--json` goes (checked at start).
    json: Option<OutputPath>,
    /// Peers a dead serve left with the keeper, taken over when `run`
    /// starts.
    taken: Vec<Taken>,
}

/// Asks a running [`Server`] to stop (see the module docs); cheap to clone,
/// usable from any thread (the binaries call it from their signal thread).
#[derive(Clone, Debug, Default)]
pub struct StopHandle(Arc<AtomicI32>);

impl StopHandle {
    /// Asks the server to stop, because of signal `sig` (0: asked by the
    /// program itself).
    pub fn stop(&self, sig: i32) {
        let _ = self.0.compare_exchange(-1, sig, SeqCst, SeqCst);
    }

    /// The stop asked for, if any: its signal.
    fn asked(&self) -> Option<i32> {
        Some(self.0.load(SeqCst)).filter(|&s| s >= 0)
    }
}

/// Ends serve's VMMs at once, for a second stop signal that ends serve
/// before its grace period (see [`Server::abort_handle`]).
pub struct AbortHandle(Arc<State>);

impl AbortHandle {
    /// Serve ends now (signal `sig`): the VMMs still served are killed
    /// (their vCPUs would wait at their next missing page forever) unless
    /// `--leave-peer-on-error`; with a keeper they stay with it for the
    /// next serve. Says so.
    pub fn abort(&self, sig: i32) {
        let state = &self.0;
        let peers = state.engine.peers();
        let cause = stop_cause(sig);
        if state.keeper.is_some() {
            say(format_args!(
                "ending at once ({cause} again): the {} VMM(s) still served stay with the keeper; the next serve takes them over",
                peers.len()
            ));
            return;
        }
        say(format_args!(
            "ending at once ({cause} again): {} VMM(s) still served",
            peers.len()
        ));
        for p in peers {
            let s = state.lookup(p.id());
            state.kill(s.n, s.pid, &format!("serve ended at once ({cause} again)"));
        }
    }
}

/// What asked a stop, in words.
fn stop_cause(sig: i32) -> String {
    match sig {
        SIGTERM => "SIGTERM".into(),
        SIGINT => "SIGINT".into(),
        SIGHUP => "SIGHUP".into(),
        0 => "a stop asked by the program".into(),
        n => format!("signal {n}"),
    }
}

/// How the listener's loop ended without an error.
enum End {
    /// `--peers` were served.
    Served,
    /// A stop was asked (its signal), and every peer hung up.
    Stopped(i32),
    /// A stop was asked, and the grace period ended with peers left.
    Grace(i32),
    /// A stop was asked, and the peers were left with the keeper.
    Kept(i32),
}

impl Server {
    /// Checks `config` (its numbers, its output paths, what is at its
    /// socket path), opens what it serves and binds its socket; says so on
    /// stderr.
    pub fn start(config: ServeConfig) -> Result<Server, ServeError> {
        config.check()?;
        crate::log::set_format(config.log_format);
        // Before the keeper starts: it inherits the limit.
        fd_limit(config.takeover);
        let (json, protected) = check_outputs(&config)?;
        let joined = join_keeper(&config)?;
        let (keeper, taken, inherited, last_n) = match joined {
            Some((k, j)) => (Some(k), j.taken, j.listener, j.last_n),
            None => (None, Vec::new(), None, 0),
        };
        let (store, source) = setup::open_store(&config.source)?;
        let store_len = store.len().unwrap_or(0);
        let mem = match &config.source {
            crate::config::Source::Mem(path) => setup::MemFile::of(path),
            crate::config::Source::Store(_) => None,
        };
        // Records name the memory file they were made for: one made for
        // another is refused.
        // And the peers a keeper holds: one restored from another file is
        // never served from this one.
        let identity = match config.record.is_some()
            || config.prefetch.is_some()
            || config.track_dirty.is_some()
            || keeper.is_some()
        {
            true => Some(record::identity(&*store)?),
            false => None,
        };
        // A file's journal names it by device, inode and modification time
        // too (a remote store's by its identity only).
        let served_from = identity.map(|id| {
            let [dev, ino, mtime] = mem.as_ref().map_or([0; 3], setup::MemFile::identity);
            [id.memory_bytes, id.fingerprint, dev, ino, mtime]
        });
        if let Some(ours) = served_from {
            check_taken(&taken, ours, &source)?;
        }
        let prefetch = match (&config.prefetch, identity) {
            (Some(p), Some(id)) => {
                let rec = record::read_record(p)?;
                rec.check(p, id)?;
                if rec.identity.is_none() {
                    say(format_args!(
                        "{}: a v1 record (it names no memory file): not checked against {source}",
                        p.display()
                    ));
                }
                Some(rec.offsets())
            }
            _ => None,
        };
        let snapshot = match &config.shared {
            Some(path) => Some(Arc::new(setup::shared_snapshot(
                path,
                &*store,
                config.verify,
            )?)),
            None => None,
        };
        if let (true, Some(path)) = (config.hand_back, &config.shared) {
            if let Some(why) = setup::small_pages(path) {
                say(format_args!(
                    "--hand-back: {} {why}: the kernel maps its pages 4 KiB a fault; on a tmpfs mounted huge=always (or huge=within_size) it maps 2 MiB a fault, 2-5x faster (RESULTS.md)",
                    path.display()
                ));
            }
        }
        if config.run_ahead > 0 {
            if config.record.is_some() {
                say(format_args!(
                    "--run-ahead: off for a peer while it is recorded (the record is the order the VM touched its pages in, not what ran ahead of it)"
                ));
            }
            if config.hand_back {
                say(format_args!(
                    "--run-ahead: for peers served by copy only: a peer handed back (--hand-back) takes its faults in the kernel"
                ));
            }
        }
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
                prefetch_idle: config.prefetch_idle,
                spread: config.workers,
                pin: config.pin,
                // Pinned threads read one message at a time: the messages
                // queued behind one are most likely other CPUs' faults,
                // whose own threads are already woken (batches of 64
                // served them too and woke their vCPUs across CPUs: 1.2x
                // faster than adaptive at one page a fault, against 1.6x
                // reading one at a time; RESULTS.md).
                batch: if config.pin {
                    1
                } else {
                    ForeignEngineConfig::default().batch
                },
                prefetch_chunk_bytes: config
                    .prefetch_chunk
                    .unwrap_or(faultline::foreign::PREFETCH_CHUNK),
                ..Default::default()
            },
        )
        .map_err(ServeError::Engine)?;
        let prepared = Once::new();
        let served_one = Arc::new(AtomicBool::new(false));
        if let (Some(offs), None) = (&prefetch, &snapshot) {
            // The recorded set is known before any peer connects: read it
            // and map it now, so installs after a handshake only copy.
            // (With --shared, at the first peer served by copy: shared
            // peers never read the memory file.)
            prepared.call_once(|| ());
            setup::prepare(&store, offs, &served_one).map_err(|source| ServeError::Spawn {
                what: "the thread preparing the recorded set".into(),
                source,
            })?;
        }
        let state = Arc::new(State {
            config,
            store,
            store_len,
            mem,
            snapshot,
            prepared,
            served_one,
            engine,
            plan: prefetch.as_deref().map(PrefetchPlan::new),
            prefetch,
            connected: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            ignored: AtomicUsize::new(0),
            shared_peers: AtomicUsize::new(0),
            taken_over: AtomicUsize::new(0),
            said_fallback: AtomicBool::new(false),
            keeper,
            recorder: Mutex::new(Recorder::Free),
            served: Mutex::new(Vec::new()),
            summaries: Mutex::new(Vec::new()),
            counters: ServerCounters::default(),
            identity,
            served_from,
            dirty_claimed: AtomicBool::new(false),
            last_n: AtomicUsize::new(last_n),
            dirty_before: Mutex::new(Vec::new()),
            pidfds: Mutex::new(Vec::new()),
            records_written: Mutex::new(HashSet::new()),
            records_lost: Mutex::new(HashSet::new()),
            reports: Mutex::default(),
            oom: Mutex::default(),
            protected,
            failed: AtomicUsize::new(0),
            unprotected: Mutex::default(),
        });
        let metrics = match &state.config.metrics {
            Some(addr) => {
                let s = state.clone();
                let mut exposition = Exposition::new(Box::new(move || s.sample()));
                if state.config.track_dirty.is_some() {
                    let s = state.clone();
                    exposition = exposition.with_post(
                        "/dirty",
                        "dirty set(s)",
                        Box::new(move || dirty::write_all(&s)),
                    );
                }
                if state.config.record.is_some() {
                    let s = state.clone();
                    exposition = exposition.with_post(
                        "/record",
                        "record(s)",
                        Box::new(move || recording::cut_all(&s)),
                    );
                }
                let exposition = Arc::new(exposition);
                let e = Endpoint::start(addr, exposition)?;
                say(format_args!("metrics on {}", e.addr));
                Some(e)
            }
            None => None,
        };
        // Bound last: once the socket exists, serve is up (its metrics
        // answer), which is what a launcher waiting for the path expects.
        let config = &state.config;
        let socket = listen(config, state.keeper.as_ref(), inherited)?;
        if let Some(k) = &state.keeper {
            k.ready().map_err(|e| keeper_error(config, e))?;
        }
        say(format_args!(
            "listening on {} for peers of {source} ({store_len} bytes); {}",
            config.socket.display(),
            match config.timeout {
                Some(t) => format!("timeout {}s", t.as_secs_f64()),
                None => "no timeout".into(),
            }
        ));
        if config.pin {
            say_per_cpu(config.threads);
        }
        Ok(Server {
            state,
            socket,
            events,
            stop: StopHandle(Arc::new(AtomicI32::new(-1))),
            json,
            taken,
            metrics,
        })
    }

    /// A handle that answers an operator's requests (from another
    /// thread): dirty sets, records.
    pub fn request_handle(&self) -> RequestHandle {
        RequestHandle(self.state.clone())
    }

    /// A handle that stops this server (from another thread).
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// What a second stop signal runs before the process ends (see
    /// [`AbortHandle`]).
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.state.clone())
    }

    /// Serves until the configured peers have come and gone, no peer was
    /// connected for the timeout (an error), or a stop was asked and its
    /// grace period is over; then ends the peers still served (see the
    /// module docs), removes the socket and writes the summaries
    /// (`json`). Gives the summaries (empty unless `summaries` or `json`
    /// is set in the config).
    pub fn run(self) -> Result<Vec<PeerSummary>, ServeError> {
        let Server {
            state,
            socket,
            events,
            stop,
            json,
            taken,
            metrics,
        } = self;
        if !taken.is_empty() {
            say(format_args!(
                "taking {} peer(s) over from the keeper",
                taken.len()
            ));
        }
        for t in taken {
            // A peer keeps its number (its `{peer}` paths and its lines
            // go on under it).
            state.connected.fetch_add(1, SeqCst);
            let Some(conn) = accept::adopt(&state, t) else {
                continue;
            };
            // Its hand-off was never deposited: read again, as from a
            // connection just accepted.
            let (n, id, conn) = conn;
            let now = faultline_sys::monotonic_ns();
            dispatch(&state, n, conn, now, Ok(Some(id)), 0)?;
        }
        let result = serve(&state, socket, &events, &stop);
        drop(metrics);
        let why = match &result {
            Ok(End::Grace(sig)) => format!(
                "serve is stopping ({}) and its grace period of {}s ended",
                stop_cause(*sig),
                state.config.grace.as_secs_f64()
            ),
            Ok(_) => "serve is stopping".into(),
            Err(e) => format!("serve is stopping on an error ({e})"),
        };
        for peer in state.engine.peers() {
            let served = state.lookup(peer.id());
            if let Ok(End::Kept(_)) = result {
                let outcome = "left with the keeper: the next serve takes it over";
                say(format_args!("peer {}: {outcome}", served.n));
                events::leave_with_keeper(&state, &peer, outcome.into());
                continue;
            }
            let fate = state.kill(served.n, served.pid, &why);
            events::finish(&state, &peer, format!("{fate}: {why}"), false);
        }
        if let (Some(snap), 0) = (&state.config.shared, state.shared_peers.load(SeqCst)) {
            say(format_args!(
                "note: no peer was served from the shared copy {} (it stays: serve never removes it)",
                snap.display()
            ));
        }
        let summaries = state.summaries.lock().expect("summaries").clone();
        if let Some(out) = &json {
            let text = serde_json::to_string_pretty(&summaries).map_err(std::io::Error::from);
            text.map_err(anyhow::Error::from)
                .and_then(|t| out.write_bytes(t.as_bytes()))
                .map_err(ServeError::WriteJson)?;
        }
        match result? {
            End::Served => {}
            End::Stopped(sig) => say(format_args!(
                "stopped ({}): every peer hung up",
                stop_cause(sig)
            )),
            End::Grace(sig) => say(format_args!(
                "stopped ({}) at the end of its grace period",
                stop_cause(sig)
            )),
            End::Kept(sig) => say(format_args!(
                "stopped ({}); the peers it served stay with the keeper",
                stop_cause(sig)
            )),
        }
        Ok(summaries)
    }
}

/// The listener's loop; the socket is removed (and closed) when it ends or
/// a stop is asked.
fn serve(
    state: &Arc<State>,
    socket: Socket,
    events: &Receiver<PeerEvent>,
    stop: &StopHandle,
) -> Result<End, ServeError> {
    let timeout = state.config.timeout;
    let mut idle_since = Some(Instant::now());
    let mut socket = Some(socket);
    let mut stopping: Option<(i32, Instant)> = None;
    let mut stuck = events::Stuck::default();
    loop {
        match &mut socket {
            Some(sock) => {
                let mut fds = [PollFd {
                    fd: sock.listener().as_raw_fd(),
                    events: poll::events::IN,
                    revents: 0,
                }];
                let _ = poll::poll(&mut fds, TICK_MS);
                accept_all(state, sock)?;
            }
            None => match events.recv_timeout(Duration::from_millis(TICK_MS as u64)) {
                Ok(ev) => events::on_event(state, ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(TICK_MS as u64))
                }
            },
        }
        while let Ok(ev) = events.try_recv() {
            events::on_event(state, ev);
        }
        // Before any way out below: a thread back just before its peer
        // ended is said too.
        stuck.look(state);
        accept::deposit_again(state);
        if let (None, Some(sig)) = (stopping, stop.asked()) {
            // Steps 1 and 2 of a stop: no new connection, the queued ones
            // accepted.
            if let Some(mut sock) = socket.take() {
                sock.remove();
                accept_all(state, &mut sock)?;
            }
            let (c, f) = state.counts();
            let until = match state.keeper {
                Some(_) => ": they stay with the keeper for the next serve".to_string(),
                None => format!(
                    ", for at most {}s until they hang up",
                    state.config.grace.as_secs_f64()
                ),
            };
            say(format_args!(
                "{}: stopping: the socket is removed (no new peers); {} peer(s) still served{until}",
                stop_cause(sig),
                c.saturating_sub(f),
            ));
            stopping = Some((sig, Instant::now()));
        }
        let (c, f) = state.counts();
        if let Some((sig, at)) = stopping {
            if state.keeper.is_some() && f < c {
                return Ok(End::Kept(sig));
            }
            if f >= c {
                return Ok(End::Stopped(sig));
            }
            if at.elapsed() >= state.config.grace {
                return Ok(End::Grace(sig));
            }
            continue;
        }
        if state.config.peers.is_some_and(|n| c >= n && f >= c) {
            let refused: u64 = state.counters.refusals().values().sum();
            let failed = state.failed.load(SeqCst) as u64;
            match refused + failed {
                0 => say(format_args!("all {c} peers served; exiting")),
                _ => say(format_args!(
                    "all {c} peers done with: {} served to their end, {refused} refused, {failed} failed; exiting",
                    (c as u64).saturating_sub(refused + failed)
                )),
            }
            return Ok(End::Served);
        }
        if c > f {
            idle_since = None;
        } else if let Some(t) = timeout {
            if idle_since.get_or_insert_with(Instant::now).elapsed() > t {
                return Err(ServeError::Timeout(t));
            }
        }
    }
}

/// Handles connection `n`: a peer sends its handshake right after
/// connecting: when it is there within `inline_ms`, the peer is set up on
/// this thread (no thread start on the restore's critical path); else on
/// a thread of its own, so a slow or silent peer never holds the listener
/// up.
fn dispatch(
    state: &Arc<State>,
    n: usize,
    conn: std::os::unix::net::UnixStream,
    accepted_ns: u64,
    kept: Result<Option<u64>, KeeperError>,
    inline_ms: i32,
) -> Result<(), ServeError> {
    if receive::readable_within(&conn, inline_ms) {
        accept::handle(state, n, conn, accepted_ns, kept);
        return Ok(());
    }
    let s = state.clone();
    std::thread::Builder::new()
        .name(format!("fl-handoff-{n}"))
        .spawn(move || accept::handle(&s, n, conn, accepted_ns, kept))
        .map_err(|source| ServeError::Spawn {
            what: format!("the handshake thread of peer {n}"),
            source,
        })?;
    Ok(())
}

/// Checks serve's outputs (`--json`, `--record`, `--track-dirty`) as
/// [`OutputPath::check`] does, and refuses one that is (or whose `{peer}`
/// template can become) a file serve reads or binds ([`outputs::Protected`]) or
/// another output; `--json`'s, checked, and what each written output is
/// checked against again when it is written.
fn check_outputs(
    config: &ServeConfig,
) -> Result<(Option<OutputPath>, outputs::Protected), ServeError> {
    let protected = outputs::Protected::of(config);
    let flags = [
        (config.json.as_ref(), "--json"),
        (config.record.as_ref(), "--record"),
        (config.track_dirty.as_ref(), "--track-dirty"),
    ];
    let mut outputs: Vec<(OutputPath, &str)> = Vec::new();
    for (path, flag) in flags {
        let Some(p) = path else { continue };
        if let Some(dir) = p
            .parent()
            .filter(|d| d.to_string_lossy().contains("{peer}"))
        {
            let above = dir.parent().unwrap_or(std::path::Path::new("."));
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            return Err(ServeError::CheckOutput(anyhow::anyhow!(
                "{flag} {}: {{peer}} is replaced in the file's name only, not in its directory (e.g. {}/{{peer}}-{name})",
                p.display(),
                above.display(),
            )));
        }
        let out = OutputPath::check(p, flag).map_err(ServeError::CheckOutput)?;
        for (o, f) in &outputs {
            if outputs::templates_meet(p, o.path()) {
                return Err(ServeError::CheckOutput(anyhow::anyhow!(
                    "{flag} {} and {f} {} become the same file for one peer: one would replace the other",
                    p.display(),
                    o.path().display()
                )));
            }
        }
        let others = outputs.iter().map(|(o, f)| (o.path(), *f));
        for (other, what) in protected.against(flag).chain(others) {
            out.refuse_same_as(other, what)
                .map_err(ServeError::CheckOutput)?;
            for (a, b, what) in [(p.as_path(), other, what), (other, p.as_path(), flag)] {
                if outputs::template_matches(a, b) {
                    return Err(ServeError::CheckOutput(anyhow::anyhow!(
                        "{flag} {}: its {{peer}} path can become {what} {}: writing it would replace that",
                        p.display(),
                        other.display()
                    )));
                }
            }
        }
        outputs.push((out, flag));
    }
    let json = outputs
        .into_iter()
        .find_map(|(o, flag)| (flag == "--json").then_some(o));
    Ok((json, protected))
}

/// Refuses to take over the peers a keeper holds (`taken`) when one was
/// served from another memory file than this serve's (`ours`, read from
/// `source`): another file (device, inode, modification time), or a
/// store whose size or sampled pages differ. Served this file's bytes,
/// its guest memory would be corrupt. They stay with the keeper for a
/// serve started with theirs.
fn check_taken(
    taken: &[Taken],
    ours: crate::keeper::journal::Served,
    source: &str,
) -> Result<(), ServeError> {
    let other = |theirs: &crate::keeper::journal::Served| match theirs[2..] {
        // A remote store's: its size and sampled pages.
        [0, 0, 0] => theirs[..2] != ours[..2],
        _ => *theirs != ours,
    };
    let theirs: Vec<(usize, crate::keeper::journal::Served)> = taken
        .iter()
        .filter_map(|t| {
            let fd = t.handed.as_ref()?.journal.try_clone().ok()?;
            Some((t.n, crate::keeper::Journal::open(fd).ok()?.identity()?))
        })
        .filter(|(_, id)| other(id))
        .collect();
    let Some((_, [bytes, fingerprint, dev, ino, _])) = theirs.first() else {
        return Ok(());
    };
    Err(ServeError::OtherSnapshot(format!(
        "the keeper holds {} VM(s) (peer {}) served from another memory file ({bytes} bytes, fingerprint {fingerprint:016x}, inode {dev}:{ino}) than {source} ({} bytes, fingerprint {:016x}, inode {}:{}; a file's inode and modification time name it, even a copy with the same bytes is another): served from it their memory could be corrupt; start serve with the memory file they were restored from (the keeper keeps them for --keeper-wait)",
        theirs.len(),
        theirs.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>().join(", "),
        ours[0],
        ours[1],
        ours[2],
        ours[3]
    )))
}

/// A keeper's error, named by the flag that asked for the keeper.
fn keeper_error(config: &ServeConfig, e: KeeperError) -> ServeError {
    if config.fd_store {
        ServeError::FdStore(e)
    } else {
        ServeError::Keeper(e)
    }
}

/// With `--fd-store`: systemd's store and what it passed; with
/// `--takeover`: attaches to the keeper of the socket, or (none
/// answers: checks the socket path first) starts one.
fn join_keeper(config: &ServeConfig) -> Result<Option<(Keeper, Joined)>, ServeError> {
    if config.fd_store {
        let (keeper, joined) = Keeper::fd_store(&config.socket).map_err(ServeError::FdStore)?;
        if let Keeper::FdStore(s) = &keeper {
            say(format_args!("{}", s.describe()));
        }
        return Ok(Some((keeper, joined)));
    }
    if !config.takeover {
        Socket::check(&config.socket)?;
        return Ok(None);
    }
    let in_use = |e| match e {
        KeeperError::InUse(pid) => ServeError::InUse {
            path: config.socket.clone(),
            pid,
        },
        e => ServeError::Keeper(e),
    };
    let spec = Spec::new(
        &config.socket,
        config.keeper_wait,
        config.leave_peer_on_error,
    )
    .map_err(|e| ServeError::Keeper(e.into()))?;
    if let Some(j) = Keeper::join(&spec, say).map_err(in_use)? {
        return Ok(Some(j));
    }
    Socket::check(&config.socket)?;
    Keeper::start(&spec, say).map(Some).map_err(in_use)
}

/// The listening socket: the one the keeper held for a dead serve when
/// the path still names it, else bound (and, with a keeper, a dup of it
/// deposited there).
fn listen(
    config: &ServeConfig,
    keeper: Option<&Keeper>,
    inherited: Option<(std::os::fd::OwnedFd, (u64, u64))>,
) -> Result<Socket, ServeError> {
    if let Some((fd, id)) = inherited {
        if let Some(s) = Socket::adopt(fd, &config.socket, id) {
            say(format_args!(
                "{}: taken from the keeper (connections queued on it are served)",
                config.socket.display()
            ));
            return Ok(s);
        }
    }
    let socket = Socket::bind(&config.socket)?;
    if let Some(k) = keeper {
        k.listen(socket.listener().as_fd(), socket.id())
            .map_err(|e| keeper_error(config, e))?;
    }
    Ok(socket)
}

/// Accepts every pending connection.
fn accept_all(state: &Arc<State>, sock: &mut Socket) -> Result<(), ServeError> {
    loop {
        match sock.listener().accept() {
            Ok((conn, _)) => {
                let accepted_ns = faultline_sys::monotonic_ns();
                // Accepted, not yet deposited with the keeper: the window
                // takeover leaves (see `crate::keeper`).
                faultline_sys::failpoint::hit("connection-accepted");
                state.connected.fetch_add(1, SeqCst);
                let n = state.last_n.fetch_add(1, SeqCst) + 1;
                let kept = accept::deposit(state, n, &conn);
                dispatch(state, n, conn, accepted_ns, kept, HANDSHAKE_INLINE_MS)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted
                ) => {}
            // Left queued, its VMM would hang (see `socket.rs`).
            Err(e) if process::out_of_fds(&e) => {
                let shed = match sock.accept_with_reserve() {
                    Some(Ok(conn)) => {
                        state.connected.fetch_add(1, SeqCst);
                        let n = state.last_n.fetch_add(1, SeqCst) + 1;
                        accept::shed(state, n, conn, &e);
                        true
                    }
                    Some(Err(w)) if w.kind() == std::io::ErrorKind::WouldBlock => {
                        sock.restock();
                        return Ok(());
                    }
                    Some(Err(_)) | None => false,
                };
                // Another thread may have taken the descriptor freed.
                if !sock.restock() || !shed {
                    pause();
                    return Ok(());
                }
            }
            // Not retried at once: the listener stays readable.
            Err(e) => {
                say(format_args!("accept failed: {e}"));
                pause();
                return Ok(());
            }
        }
    }
}

/// Raises the descriptor limit to the hard one and says so, or says how
/// many VMMs the limit allows when it cannot be raised and is low. Each
/// VMM served holds 3 descriptors, 7 with `takeover` (its journal, and
/// duplicates of what is deposited with the keeper, to give another
/// keeper should that one die).
fn fd_limit(takeover: bool) {
    let per_vmm = if takeover { 7 } else { 3 };
    match process::raise_fd_limit() {
        Ok((before, now)) if now.soft > before.soft => say(format_args!(
            "open files: limit raised from {} to {} (a VMM takes {per_vmm})",
            before.soft, now.soft
        )),
        Ok((_, now)) if now.soft < 1024 * per_vmm => say(format_args!(
            "open files: limit {} (hard): about {} VMMs at once (a VMM takes {per_vmm}); more are refused (LimitNOFILE= of serve's unit, ulimit -Hn)",
            now.soft,
            now.soft.saturating_sub(16) / per_vmm
        )),
        Ok(_) => {}
        Err(e) => say(format_args!("open files: raising the limit failed: {e}")),
    }
}

/// Waits a tick before the listener is polled again (it stays readable
/// while a connection that cannot be accepted is queued).
fn pause() {
    std::thread::sleep(Duration::from_millis(TICK_MS as u64));
}

/// Answers an operator's requests to a running server, from another
/// thread (the binaries' signal threads, the metrics endpoint).
#[derive(Clone)]
pub struct RequestHandle(Arc<State>);

impl RequestHandle {
    /// `--track-dirty` (SIGUSR1, `POST /dirty`): writes every tracked
    /// peer's dirty set so far; how many were written.
    pub fn write_dirty_sets(&self) -> usize {
        if self.0.config.track_dirty.is_none() {
            say(format_args!(
                "asked for dirty sets: none, dirty tracking is off (--track-dirty)"
            ));
            return 0;
        }
        dirty::write_all(&self.0)
    }

    /// `--record` (SIGUSR2, `POST /record`): cuts every recording peer's
    /// record, written now and not at its hang-up (its last cycle); how
    /// many were written.
    pub fn cut_records(&self) -> usize {
        if self.0.config.record.is_none() {
            say(format_args!(
                "asked to cut the records: none, recording is off (--record)"
            ));
            return 0;
        }
        recording::cut_all(&self.0)
    }
}

impl std::fmt::Debug for RequestHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestHandle")
    }
}

/// Says where `--engine per-cpu` put its `threads` handler threads, and
/// what that costs on a host of many CPUs: a fault of a VM that may run
/// anywhere wakes them all.
fn say_per_cpu(threads: usize) {
    let cpus = faultline_sys::thread::allowed_cpus().unwrap_or_default();
    say(format_args!(
        "per-cpu: {threads} handler thread(s), one asleep on each of CPUs {}",
        cpu_list(&cpus)
    ));
    if threads > PER_CPU_HERD {
        say(format_args!(
            "per-cpu: a fault of a VM whose threads may run on every CPU wakes all {threads} \
             handler threads (a VM held to some CPUs wakes the handlers there): hold VMs to \
             their CPUs, restrict serve (taskset, a cpuset), or use --engine adaptive"
        ));
    }
}

/// `0,1,5`.
pub(super) fn cpu_list(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
    list.join(",")
}

/// Handler threads past which `--engine per-cpu` warns at start.
const PER_CPU_HERD: usize = 8;
