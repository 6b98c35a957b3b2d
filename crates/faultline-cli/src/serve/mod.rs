//! `faultline serve`: a page-fault handler process for Firecracker's `Uffd`
//! memory backend (and any VMM speaking its hand-off; see `handshake`).
//!
//! ```text
//!  listener (main thread) ── accept ──► the handshake (on the listener when it
//!     │                                   is there within 2 ms, else a thread)
//!     │                                   recvmsg: JSON + SCM_RIGHTS uffd, SO_PEERCRED
//!     │                                   parse, check layout vs the memory file
//!     │                                   ForeignPeer ─► ForeignEngine::add
//!     ▼
//!  engine events (hang-up, failure, second message, prefetch done) ─► stderr, record file
//! ```
//!
//! One memory file serves every peer: one read-only shared mapping
//! (`FileStore`), so many VMs restored from one snapshot share its page
//! cache and the handler's memory does not grow with them beyond each
//! peer's bookkeeping (residency map, record log).

pub use faultline_serve::{handshake, record, Handoff, PeerSummary};

use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use faultline::store::FileAccess;
use faultline::{
    EngineKind, FileStore, ForeignEngine, ForeignEngineConfig, ForeignOptions, ForeignPeer,
    ForeignUffd, PageStore, PeerBacking, PeerEvent, PrefetchPlan, ReadaheadConfig, SharedSnapshot,
    SnapshotError, Verify,
};
use faultline_sys::poll::{self, events, PollFd};
use faultline_sys::process;
use faultline_sys::sock;

/// `faultline serve` arguments.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// UNIX socket to bind (give its path to Firecracker as `backend_path`).
    /// A stale socket file is replaced.
    #[arg(long)]
    pub socket: PathBuf,
    /// The snapshot's memory file (the regions' bytes, back to back).
    #[arg(long, required_unless_present = "store")]
    pub mem: Option<PathBuf>,
    /// Read the snapshot's bytes from a remote store instead of --mem:
    /// `redis://HOST:PORT#NAME`, `redis+unix:///PATH#NAME` or
    /// `redis-cluster://HOST:PORT,...#NAME`, uploaded with `faultline
    /// store put MEMFILE URL`. The handler threads read it in batches;
    /// a page the store fails to give is never zeros (the peer's fault is
    /// not resolved and the peer is dropped, see --kill-peer-on-error).
    #[arg(long, conflicts_with = "mem")]
    pub store: Option<String>,
    /// Exit with an error when no peer is connected for this many seconds
    /// (at start, and whenever every peer has gone). Default 30.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Exit once this many peers have connected and all of them have gone.
    /// Default: serve until killed (or the timeout).
    #[arg(long)]
    pub peers: Option<usize>,
    /// Handler threads (each peer is served by one of them). Default 1.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Engine for the handler threads: poll, spin or workers (signal cannot
    /// serve another process). Default poll.
    #[arg(long, default_value = "poll")]
    pub engine: String,
    /// Fault-around: the read-ahead window grows up to this many pages
    /// (0: one page per fault). Default 16.
    #[arg(long, default_value_t = 16)]
    pub fault_around: usize,
    /// Write the order in which the first peer's restore touched its pages
    /// to FILE when it hangs up (one page per fault: fault-around is off
    /// for that peer).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Install the pages listed in FILE (written by --record) eagerly on
    /// every restore; faults are served first, and pages outside the set on
    /// demand.
    #[arg(long)]
    pub prefetch: Option<PathBuf>,
    /// Prefetch helper threads beside the handler threads (each installs
    /// queued prefetch runs of any peer, under that peer's copy gate; 0:
    /// the handler threads alone). Default: the number of CPUs (more
    /// copiers than CPUs still helped: `bench restore` 10% warm, 2 CPUs,
    /// 1/2/3 helpers: ~52/~40/~36 ms).
    #[arg(long)]
    pub prefetch_helpers: Option<usize>,
    /// Kill a peer (SIGKILL, pid from SO_PEERCRED) when serving it fails or
    /// its handshake is refused: its vCPUs would otherwise hang.
    #[arg(long)]
    pub kill_peer_on_error: bool,
    /// Seconds a connected peer has to send its handshake. Default 5.
    #[arg(long, default_value_t = 5.0)]
    pub handshake_timeout: f64,
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
    /// How an existing --shared file's content is checked against the
    /// memory file before it is reused: `sample` (64 pages spread over it)
    /// or `full` (every byte; about as long as writing it). Default sample.
    #[arg(long, value_enum, default_value_t = VerifyArg::Sample)]
    pub verify: VerifyArg,
    /// Write every peer's statistics to FILE (JSON) on exit.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `--verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyArg {
    /// 64 sampled pages.
    Sample,
    /// Every byte.
    Full,
}

/// Whose restore `--record` records: the first peer whose handshake is
/// accepted, and only that one. A handshake claims the slot before it
/// sets its peer up, so two peers that connect at once cannot both record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorder {
    /// No peer has claimed it yet.
    Free,
    /// A handshake claimed it and is setting its peer up.
    Claimed,
    /// This peer records.
    Peer(u64),
}

/// A peer being served: its engine id, connection number, pid, when its
/// handshake was read, its hand-off so far.
#[derive(Clone, Copy)]
struct Served {
    id: u64,
    n: usize,
    pid: i32,
    received: Instant,
    handoff: Handoff,
}

struct Shared {
    args: ServeArgs,
    store: Arc<dyn PageStore>,
    store_len: u64,
    shared: Option<Arc<SharedSnapshot>>,
    /// The recorded set was read and mapped (or is being).
    prepared: std::sync::Once,
    engine: ForeignEngine,
    prefetch: Option<Vec<u64>>,
    /// The recorded set made into runs once, queued for every peer.
    plan: Option<PrefetchPlan>,
    connected: AtomicUsize,
    finished: AtomicUsize,
    recorder: Mutex<Recorder>,
    pids: Mutex<Vec<Served>>,
    summaries: Mutex<Vec<PeerSummary>>,
}

fn say(msg: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "faultline serve: {msg}");
}

/// The pages' source (--mem or --store) and its name for messages.
fn open_store(args: &ServeArgs) -> anyhow::Result<(Arc<dyn PageStore>, String)> {
    Ok(match (&args.mem, &args.store) {
        (_, Some(url)) => (
            Arc::new(
                faultline_redis::RedisStore::open(url)
                    .with_context(|| format!("opening the store {url}"))?,
            ),
            url.clone(),
        ),
        (Some(mem), None) => (
            Arc::new(
                FileStore::open_with(mem, 0, FileAccess::Mmap)
                    .with_context(|| format!("opening the memory file {}", mem.display()))?,
            ),
            mem.display().to_string(),
        ),
        (None, None) => anyhow::bail!("--mem or --store is required"),
    })
}

/// How long the listener waits for a new connection's handshake before it
/// hands the connection to a thread of its own, ms.
const HANDSHAKE_INLINE_MS: i32 = 2;

/// Runs `faultline serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let kind = EngineKind::from_name(&args.engine)
        .with_context(|| format!("unknown engine {:?}", args.engine))?;
    let (store, source) = open_store(&args)?;
    let store_len = store.len().unwrap_or(0);
    let prefetch = match &args.prefetch {
        Some(p) => Some(record::read(p)?),
        None => None,
    };
    let shared = match &args.shared {
        Some(path) => Some(Arc::new(shared_snapshot(path, &*store, args.verify)?)),
        None => None,
    };
    let (engine, events) = ForeignEngine::new(
        kind,
        ForeignEngineConfig {
            threads: args.threads.max(1),
            prefetch_helpers: args
                .prefetch_helpers
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            ..Default::default()
        },
    )?;
    let _ = std::fs::remove_file(&args.socket);
    let listener = UnixListener::bind(&args.socket)
        .with_context(|| format!("binding {}", args.socket.display()))?;
    listener.set_nonblocking(true)?;
    say(format_args!(
        "listening on {} for peers of {source} ({store_len} bytes); timeout {}s",
        args.socket.display(),
        args.timeout
    ));
    let prepared = std::sync::Once::new();
    if let (Some(offs), None) = (&prefetch, &shared) {
        // The recorded set is known before any peer connects: read it and
        // map it now, so installs after a handshake only copy. (With
        // --shared, at the first peer served by copy: shared peers never
        // read the memory file.)
        prepared.call_once(|| ());
        prepare(&store, offs)?;
    }
    let shared = Arc::new(Shared {
        args: args.clone(),
        store,
        store_len,
        shared,
        prepared,
        engine,
        plan: prefetch.as_deref().map(PrefetchPlan::new),
        prefetch,
        connected: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        recorder: Mutex::new(Recorder::Free),
        pids: Mutex::new(Vec::new()),
        summaries: Mutex::new(Vec::new()),
    });
    let timeout = Duration::from_secs_f64(args.timeout.max(0.0));
    let mut idle_since = Some(Instant::now());
    let result = loop {
        let mut fds = [PollFd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
            events: events::IN,
            revents: 0,
        }];
        let _ = poll::poll(&mut fds, 50);
        loop {
            match listener.accept() {
                Ok((conn, _)) => {
                    let accepted_ns = faultline_sys::monotonic_ns();
                    let n = shared.connected.fetch_add(1, SeqCst) + 1;
                    // A peer sends its handshake right after connecting:
                    // when it is there within HANDSHAKE_INLINE, the peer is
                    // set up on this thread (no thread start on the
                    // restore's critical path); else on a thread of its
                    // own, so a slow or silent peer never holds the
                    // listener up.
                    let mut fds = [PollFd {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&conn),
                        events: events::IN,
                        revents: 0,
                    }];
                    if poll::poll(&mut fds, HANDSHAKE_INLINE_MS).is_ok_and(|r| r == 1) {
                        shared.handle(n, conn, accepted_ns);
                        continue;
                    }
                    let s = shared.clone();
                    std::thread::Builder::new()
                        .name(format!("faultline-handshake-{n}"))
                        .spawn(move || s.handle(n, conn, accepted_ns))?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => say(format_args!("accept failed: {e}")),
            }
        }
        while let Ok(ev) = events.try_recv() {
            shared.on_event(ev);
        }
        let (c, f) = (shared.connected.load(SeqCst), shared.finished.load(SeqCst));
        if args.peers.is_some_and(|n| c >= n && f >= c) {
            say(format_args!("all {c} peers served; exiting"));
            break Ok(());
        }
        if c > f {
            idle_since = None;
        } else {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() > timeout {
                break Err(anyhow::anyhow!(
                    "no peer connected for {:.1}s (timeout); exiting",
                    timeout.as_secs_f64()
                ));
            }
        }
    };
    let _ = std::fs::remove_file(&args.socket);
    if let Some(path) = &args.json {
        let s = shared.summaries.lock().expect("summaries").clone();
        std::fs::write(path, serde_json::to_string_pretty(&s)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    result
}

/// Reads and maps the recorded set of the memory file on a thread of its
/// own, so copies into peers never wait for the disk (see
/// `faultline::prepare_store`).
fn prepare(store: &Arc<dyn PageStore>, offs: &[u64]) -> std::io::Result<()> {
    let (store, offs) = (store.clone(), offs.to_vec());
    std::thread::Builder::new()
        .name("faultline-prepare".into())
        .spawn(move || {
            let t = Instant::now();
            let bytes = faultline::prepare_store(&*store, &offs, 4096);
            say(format_args!(
                "prepared the recorded set: {} MiB of the memory file read and mapped in {:.1} ms",
                bytes >> 20,
                t.elapsed().as_secs_f64() * 1e3
            ));
        })?;
    Ok(())
}

/// Opens (or writes) the shared snapshot at `path`; says how long
/// writing it took.
fn shared_snapshot(
    path: &std::path::Path,
    store: &dyn PageStore,
    verify: VerifyArg,
) -> anyhow::Result<SharedSnapshot> {
    if path.exists() {
        let t = Instant::now();
        let (verify, what) = match verify {
            VerifyArg::Sample => (Verify::Sample, "64 sampled pages"),
            VerifyArg::Full => (Verify::Full, "every byte"),
        };
        let snap = SharedSnapshot::open_verified(path, store, verify)
            .with_context(|| format!("reusing the shared snapshot {}", path.display()))?;
        say(format_args!(
            "shared snapshot {}: reused ({} bytes; size and {what} match) in {:.1} ms",
            path.display(),
            snap.len(),
            t.elapsed().as_secs_f64() * 1e3
        ));
        return Ok(snap);
    }
    let mut next = 0u64;
    let (snap, done) = SharedSnapshot::create(path, store, |d, total| {
        if d >= next || d == total {
            say(format_args!(
                "shared snapshot {}: written {} / {} MiB",
                path.display(),
                d >> 20,
                total >> 20
            ));
            next = d + (256 << 20);
        }
    })
    .with_context(|| format!("writing the shared snapshot {}", path.display()))?;
    say(format_args!(
        "shared snapshot {}: populated {} MiB in {:.1} ms (the one-time cost of the shared page cache)",
        path.display(),
        done.bytes >> 20,
        done.elapsed.as_secs_f64() * 1e3
    ));
    Ok(snap)
}

impl Shared {
    /// Handles connection `n` (accepted at `accepted_ns`) on this thread;
    /// a connection that serves no peer counts as finished.
    fn handle(&self, n: usize, conn: UnixStream, accepted_ns: u64) {
        let handoff = Handoff {
            accepted_ns,
            thread_ns: faultline_sys::monotonic_ns(),
            ..Default::default()
        };
        if !self.accept(n, conn, handoff) {
            self.finished.fetch_add(1, SeqCst);
        }
    }

    /// Handles connection `n`; returns whether a peer is now being served.
    fn accept(&self, n: usize, conn: UnixStream, mut handoff: Handoff) -> bool {
        let now = faultline_sys::monotonic_ns;
        let pid = sock::peer_cred(conn.as_fd()).map(|c| c.pid).unwrap_or(0);
        let refuse = |why: String| {
            say(format_args!("peer {n} (pid {pid}): refused: {why}"));
            self.kill(n, pid);
            self.summaries.lock().expect("summaries").push(PeerSummary {
                peer: n,
                pid,
                outcome: format!("refused: {why}"),
                ..Default::default()
            });
            false
        };
        let mut fds = [PollFd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&conn),
            events: events::IN,
            revents: 0,
        }];
        let wait = Duration::from_secs_f64(self.args.handshake_timeout.max(0.0));
        match poll::poll(&mut fds, wait.as_millis() as i32) {
            Ok(1) => {}
            _ => return refuse(format!("no handshake within {:.1}s", wait.as_secs_f64())),
        }
        let mut buf = vec![0u8; 1 << 16];
        let got = match sock::recv_with_fds(conn.as_fd(), &mut buf, true) {
            Ok(g) => g,
            Err(e) => return refuse(format!("recvmsg failed: {e}")),
        };
        let received = Instant::now();
        handoff.received_ns = now();
        if got.bytes == 0 && got.fds.is_empty() {
            return refuse("it hung up without a handshake".into());
        }
        if got.data_truncated {
            return refuse("the handshake is longer than 64 KiB".into());
        }
        if got.control_truncated {
            return refuse("it attached more descriptors than one (some were lost)".into());
        }
        let mut fds: Vec<OwnedFd> = got.fds;
        if fds.len() != 1 {
            return refuse(format!(
                "expected exactly one descriptor (the userfaultfd) attached with SCM_RIGHTS, got {}",
                fds.len()
            ));
        }
        let (specs, declared) = match handshake::parse_handshake(&buf[..got.bytes]) {
            Ok(h) => (h.regions, h.backing),
            Err(e) => return refuse(e.to_string()),
        };
        let uffd = match ForeignUffd::adopt(fds.remove(0)) {
            Ok(u) => u,
            Err(e) => return refuse(e.to_string()),
        };
        handoff.adopted_ns = now();
        let total: u64 = specs.iter().map(|s| s.len as u64).sum();
        if total != self.store_len {
            say(format_args!(
                "peer {n} (pid {pid}): note: its regions add up to {total} bytes, the memory file holds {}",
                self.store_len
            ));
        }
        // Shared mode when the peer maps the shared snapshot (checked in
        // its memory map; what its handshake declares when the map cannot
        // be read); copy mode for anonymous memory.
        let backing = match &self.shared {
            Some(snap) => {
                let regions: Vec<(u64, usize, u64)> = specs
                    .iter()
                    .map(|s| (s.base, s.len, s.store_offset))
                    .collect();
                match (snap.check_peer(pid, &regions), declared) {
                    (Ok(seen), Some(said)) if seen != said => {
                        return refuse(format!(
                            "shared mode: its handshake declares {said:?} memory, its memory map shows {seen:?}"
                        ))
                    }
                    (Ok(seen), _) => seen,
                    (Err(SnapshotError::ReadPeerMap { source, path }), Some(said)) => {
                        say(format_args!(
                            "peer {n} (pid {pid}): note: its memory map is out of reach ({}: {source}); serving it as its handshake declares: {said:?} memory",
                            path.display()
                        ));
                        said
                    }
                    (Err(e), _) => return refuse(format!("shared mode: {e}")),
                }
            }
            None if declared == Some(PeerBacking::Shared) => {
                return refuse(
                    "its handshake declares a shared backing, and serve has no --shared snapshot"
                        .into(),
                )
            }
            None => PeerBacking::Anonymous,
        };
        let shared = match (&self.shared, backing) {
            (Some(snap), PeerBacking::Shared) => Some(snap.clone()),
            _ => None,
        };
        handoff.checked_ns = now();
        let record = self.args.record.is_some() && {
            let mut r = self.recorder.lock().expect("recorder");
            let free = *r == Recorder::Free;
            if free {
                *r = Recorder::Claimed;
            }
            free
        };
        let mode = if shared.is_some() { "shared" } else { "copy" };
        let opts = ForeignOptions {
            readahead: if record || self.args.fault_around <= 1 {
                ReadaheadConfig::off()
            } else {
                ReadaheadConfig::adaptive(1, self.args.fault_around)
            },
            record,
            shared,
            ..Default::default()
        };
        let features: Vec<String> = uffd.feature_names().iter().map(|s| s.to_string()).collect();
        let removes = uffd.reports_removes();
        let peer =
            match ForeignPeer::new(format!("peer {n}"), uffd, &specs, self.store.clone(), &opts) {
                Ok(p) => p,
                Err(e) => {
                    if record {
                        // Leave the record to the next peer.
                        *self.recorder.lock().expect("recorder") = Recorder::Free;
                    }
                    return refuse(e.to_string());
                }
            };
        handoff.built_ns = now();
        let conn: OwnedFd = conn.into();
        let peer = peer.with_hangup(conn);
        if let (Some(offs), false) = (&self.prefetch, peer.is_shared()) {
            self.prepared.call_once(|| {
                if let Err(e) = prepare(&self.store, offs) {
                    say(format_args!("preparing the recorded set failed: {e}"));
                }
            });
        }
        // The store was prepared with the record (`prepare`), or needs no
        // preparation (shared mode).
        let queued = self
            .plan
            .as_ref()
            .map(|plan| peer.prefetch_plan(plan, false));
        handoff.queued_ns = now();
        let peer = self.engine.add(peer);
        handoff.serving_ns = now();
        if record {
            *self.recorder.lock().expect("recorder") = Recorder::Peer(peer.id());
        }
        self.pids.lock().expect("pids").push(Served {
            id: peer.id(),
            n,
            pid,
            received,
            handoff,
        });
        say(format_args!(
            "peer {n} (pid {pid}): serving {} region(s), {} bytes, {mode} mode, {:.2} ms after its handshake was read; features [{}]{}{}{}",
            specs.len(),
            total,
            received.elapsed().as_secs_f64() * 1e3,
            features.join(", "),
            if removes {
                ""
            } else {
                "; no EVENT_REMOVE: pages it drops are re-read from the file"
            },
            if record { "; recording" } else { "" },
            queued.map_or(String::new(), |q| format!("; prefetching {q} pages")),
        ));
        true
    }

    fn kill(&self, n: usize, pid: i32) {
        if self.args.kill_peer_on_error && pid > 0 {
            match process::kill(pid, process::SIGKILL) {
                Ok(()) => say(format_args!(
                    "peer {n}: killed pid {pid} (--kill-peer-on-error)"
                )),
                Err(e) => say(format_args!("peer {n}: killing pid {pid} failed: {e}")),
            }
        }
    }

    fn lookup(&self, id: u64) -> (usize, i32, Instant) {
        let s = self.lookup_all(id);
        (s.n, s.pid, s.received)
    }

    fn lookup_all(&self, id: u64) -> Served {
        self.pids
            .lock()
            .expect("pids")
            .iter()
            .find(|p| p.id == id)
            .copied()
            .unwrap_or(Served {
                id,
                n: 0,
                pid: 0,
                received: Instant::now(),
                handoff: Handoff::default(),
            })
    }

    fn on_event(&self, ev: PeerEvent) {
        match ev {
            PeerEvent::HungUp { peer } => {
                self.finish(&peer, "hung up".into());
            }
            PeerEvent::Failed { peer, error } => {
                let (n, pid, _) = self.lookup(peer.id());
                say(format_args!(
                    "peer {n} (pid {pid}): serving failed: {error}"
                ));
                self.kill(n, pid);
                self.finish(&peer, format!("failed: {error}"));
            }
            PeerEvent::Message { peer, bytes, fds } => {
                let (n, pid, _) = self.lookup(peer.id());
                say(format_args!(
                    "peer {n} (pid {pid}): sent a second message ({bytes} bytes, {fds} descriptor(s)); ignored: the hand-off is one message"
                ));
            }
            PeerEvent::PrefetchDone { peer, at } => {
                let (n, pid, t) = self.lookup(peer.id());
                let s = peer.stats();
                say(format_args!(
                    "peer {n} (pid {pid}): prefetch done: {} pages in {} ioctls, {:.1} ms after its handshake was read",
                    s.prefetched,
                    s.prefetch_ioctls,
                    at.saturating_duration_since(t).as_secs_f64() * 1e3
                ));
            }
            PeerEvent::StoreError { peer, error } => {
                let (n, pid, _) = self.lookup(peer.id());
                say(format_args!("peer {n} (pid {pid}): {error}"));
            }
        }
    }

    fn finish(&self, peer: &Arc<ForeignPeer>, outcome: String) {
        let Served {
            n,
            pid,
            received: t,
            handoff,
            ..
        } = self.lookup_all(peer.id());
        let s = peer.stats();
        let times = peer.times();
        let summary = PeerSummary {
            peer: n,
            pid,
            outcome: outcome.clone(),
            regions: peer.regions(),
            mode: if peer.is_shared() { "shared" } else { "copy" }.into(),
            features: peer
                .uffd()
                .feature_names()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            faults: s.faults,
            installed: s.regions.installed,
            bytes_read: s.bytes_read,
            removes: s.removes,
            removed_pages: s.removed_pages,
            deferred: s.deferred,
            exists: s.regions.exists,
            prefetched: s.prefetched,
            bookkeeping_bytes: peer.bookkeeping_bytes() as u64,
            seconds: t.elapsed().as_secs_f64(),
            handoff: Handoff {
                first_fault_ns: times.first_fault_ns.unwrap_or(0),
                first_prefetch_ns: times.first_prefetch_ns.unwrap_or(0),
                prefetch_done_ns: times.prefetch_done_ns.unwrap_or(0),
                ..handoff
            },
        };
        say(format_args!(
            "peer {n} (pid {pid}): {outcome}; {} faults, {} pages installed, {} REMOVE events ({} pages), {} deferred (EAGAIN), {} EEXIST, {} prefetched",
            s.faults,
            s.regions.installed,
            s.removes,
            s.removed_pages,
            s.deferred,
            s.regions.exists,
            s.prefetched
        ));
        if *self.recorder.lock().expect("recorder") == Recorder::Peer(peer.id()) {
            if let Some(path) = &self.args.record {
                let offs = peer.take_record();
                match record::write(path, &offs) {
                    Ok(()) => say(format_args!(
                        "peer {n}: recorded {} pages to {}",
                        offs.len(),
                        path.display()
                    )),
                    Err(e) => say(format_args!("peer {n}: writing the record failed: {e:#}")),
                }
            }
        }
        self.engine.remove(peer.id());
        self.summaries.lock().expect("summaries").push(summary);
        self.finished.fetch_add(1, SeqCst);
    }
}
