//! What every thread of a server shares: the store, the engine, the
//! recorded set, and who is being served.
//!
//! Locks (each held for a few instructions, never two at once, never
//! while calling the engine or the kernel): `recorder`, `served`,
//! `summaries`, `dirty_before`, `pidfds` (held across one
//! `pidfd_send_signal`).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Once};
use std::time::Instant;

use faultline::{ForeignEngine, PageStore, PrefetchPlan, SharedSnapshot};
use std::os::fd::BorrowedFd;

use faultline_sys::process::{self, Pidfd};
use faultline_sys::sock;

use super::reports::PeerReports;
use crate::config::{ServeConfig, Source};
use crate::keeper::Keeper;
use crate::log::say;
use crate::metrics::{PeerSample, Sample, ServerCounters};
use crate::record::Identity;
use crate::summary::{Handoff, PeerSummary};

/// Whose restore `--record` records: the first peer whose handshake is
/// accepted, and only that one. A handshake claims the slot before it
/// sets its peer up, so two peers that connect at once cannot both record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorder {
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
pub struct Served {
    /// Its id in the engine.
    pub id: u64,
    /// Its connection number (from 1).
    pub n: usize,
    /// Its pid (`SO_PEERCRED`; 0 when unknown).
    pub pid: i32,
    /// When its handshake was read.
    pub received: Instant,
    /// Its hand-off's milestones so far.
    pub handoff: Handoff,
    /// Its id at the keeper (`--takeover`).
    pub kept: Option<u64>,
}

/// The server's shared state.
pub struct State {
    /// How it runs.
    pub config: ServeConfig,
    /// The snapshot's bytes.
    pub store: Arc<dyn PageStore>,
    /// Their length (0 when the store does not say).
    pub store_len: u64,
    /// The memory file as opened (`--mem`).
    pub mem: Option<super::setup::MemFile>,
    /// The shared (zero-copy) snapshot, with `--shared`.
    pub snapshot: Option<Arc<SharedSnapshot>>,
    /// The recorded set was read and mapped (or is being).
    pub prepared: Once,
    /// A peer is being served: the preparation of the recorded set stops
    /// mapping it (see `faultline::prepare_store_until`).
    pub served_one: Arc<AtomicBool>,
    /// The handler threads.
    pub engine: ForeignEngine,
    /// The recorded set's offsets, with `--prefetch`.
    pub prefetch: Option<Vec<u64>>,
    /// The recorded set made into runs once, queued for every peer.
    pub plan: Option<PrefetchPlan>,
    /// Connections accepted.
    pub connected: AtomicUsize,
    /// Connections done with (refused, hung up, failed).
    pub finished: AtomicUsize,
    /// Connections that hung up without a handshake: not peers (another
    /// serve checking whether the socket is in use connects and hangs up).
    pub ignored: AtomicUsize,
    /// Peers served in shared mode.
    pub shared_peers: AtomicUsize,
    /// Peers taken over from the keeper.
    pub taken_over: AtomicUsize,
    /// The note that shared mode fell back to copy for a peer was said.
    pub said_fallback: AtomicBool,
    /// The keeper the peers are deposited with (`--takeover`).
    pub keeper: Option<Keeper>,
    /// Whose restore is recorded.
    pub recorder: Mutex<Recorder>,
    /// The peers being served.
    pub served: Mutex<Vec<Served>>,
    /// The summaries of the peers done with.
    pub summaries: Mutex<Vec<PeerSummary>>,
    /// What the server counts itself (the metrics' refusals).
    pub counters: ServerCounters,
    /// The memory file records are made for and checked against (with
    /// `--record` or `--prefetch`), and dirty sets name (`--track-dirty`).
    pub identity: Option<Identity>,
    /// What a peer's journal names as the file it is served from
    /// (`--takeover`, `--fd-store`).
    pub served_from: Option<crate::keeper::journal::Served>,
    /// The first peer claimed dirty tracking (`--track-dirty` without
    /// `{peer}`: the first peer only).
    pub dirty_claimed: AtomicBool,
    /// The pages each tracked peer taken over wrote before (by engine
    /// id): merged into its dirty set (see `dirty.rs`).
    pub dirty_before: Mutex<Vec<(u64, Vec<u64>)>>,
    /// The highest connection number given (a serve taking over goes on
    /// from the keeper's).
    pub last_n: AtomicUsize,
    /// Each connection's peer process, by connection number ([`State::watch`]):
    /// the pidfd a kill goes through.
    pub pidfds: Mutex<Vec<(usize, Pidfd)>>,
    /// The peers (engine ids) still served whose record is written: cut
    /// on request, or at their hang-up; never written twice (see
    /// `recording.rs`; a peer leaves the set once the engine dropped it).
    pub records_written: Mutex<HashSet<u64>>,
    /// Of those, the peers whose cut record could not be written (said
    /// then; their hang-up says nothing was recorded).
    pub records_lost: Mutex<HashSet<u64>>,
    /// What the peers report of themselves (by engine id; see
    /// `reports.rs`).
    pub reports: Mutex<HashMap<u64, PeerReports>>,
    /// Each peer's memory cgroup, by engine id (see `oom.rs`).
    pub oom: Mutex<HashMap<u64, super::oom::OomWatch>>,
    /// What an output written must not be (see `outputs.rs`).
    pub protected: super::outputs::Protected,
    /// Peers whose serving failed (they were killed, or left).
    pub failed: AtomicUsize,
    /// Peers served that the keeper does not hold yet (see
    /// `unprotected.rs`).
    pub unprotected: Mutex<super::unprotected::Waiting>,
}

impl State {
    /// Whether every peer records (`{peer}` in the record's path).
    pub fn record_every(&self) -> bool {
        self.config
            .record
            .as_ref()
            .is_some_and(|p| p.to_string_lossy().contains("{peer}"))
    }

    /// Where peer `n`'s record goes (`{peer}` replaced by `n`).
    pub fn record_path(&self, n: usize) -> Option<PathBuf> {
        let p = self.config.record.as_ref()?;
        Some(p.to_string_lossy().replace("{peer}", &n.to_string()).into())
    }

    /// Claims the record for a peer being set up: whether it records
    /// (every peer with `{peer}` in the path, else the first).
    pub fn claim_record(&self) -> bool {
        if self.record_every() {
            return true;
        }
        self.config.record.is_some() && {
            let mut r = self.recorder.lock().expect("recorder");
            let free = *r == Recorder::Free;
            if free {
                *r = Recorder::Claimed;
            }
            free
        }
    }

    /// Sets the recorder (to `Free` when a claim came to nothing, to the
    /// peer once it is served).
    pub fn set_recorder(&self, r: Recorder) {
        *self.recorder.lock().expect("recorder") = r;
    }

    /// Whether peer `id` records.
    pub fn records(&self, id: u64) -> bool {
        self.record_every() || *self.recorder.lock().expect("recorder") == Recorder::Peer(id)
    }

    /// Drops what serve kept of peer `id` while it was served ([`State::find`]
    /// then finds nothing).
    pub fn forget(&self, id: u64) {
        self.served.lock().expect("served").retain(|p| p.id != id);
    }

    /// Peer `id` is held by the keeper now, under `kept`.
    pub fn set_kept(&self, id: u64, kept: u64) {
        let mut served = self.served.lock().expect("served");
        if let Some(p) = served.iter_mut().find(|p| p.id == id) {
            p.kept = Some(kept);
        }
    }

    /// Peer `id` as it was when its serving started, while it is served.
    pub fn find(&self, id: u64) -> Option<Served> {
        self.served
            .lock()
            .expect("served")
            .iter()
            .find(|p| p.id == id)
            .copied()
    }

    /// Peer `id` as it was when its serving started (connection 0, pid 0
    /// if unknown).
    pub fn lookup(&self, id: u64) -> Served {
        self.find(id).unwrap_or(Served {
            id,
            n: 0,
            pid: 0,
            received: Instant::now(),
            handoff: Handoff::default(),
            kept: None,
        })
    }

    /// The stalls peer `id` reported so far (`None`: none).
    pub fn stalls(&self, id: u64) -> Option<faultline::ServiceTimes> {
        self.reports.lock().expect("reports").get(&id)?.stalls
    }

    /// What a metrics scrape reads now: every peer being served (the
    /// engine's counters) and the server's own.
    pub fn sample(&self) -> Sample {
        let peers = self
            .engine
            .peers()
            .iter()
            .map(|p| {
                let Served {
                    n, pid, handoff, ..
                } = self.lookup(p.id());
                PeerSample {
                    peer: n,
                    pid,
                    stats: p.stats(),
                    prefetch_done_s: p
                        .times()
                        .prefetch_done_ns
                        .map(|t| t.saturating_sub(handoff.received_ns) as f64 / 1e9),
                    // The set a request would write now (a WP_ASYNC
                    // peer's: scanned from its page tables).
                    dirty_pages: p.dirty_set().ok().flatten().map(|d| d.len() as u64),
                    vcpu_stalls: self.stalls(p.id()),
                }
            })
            .collect();
        // Connections that hung up without a handshake (another serve
        // checking whether the socket is in use) are not peers.
        let (accepted, finished) = self.counts();
        let cpu = self.engine.handler_stats();
        Sample {
            snapshot: match &self.config.source {
                Source::Mem(p) => p.display().to_string(),
                Source::Store(url) => url.clone(),
            },
            peers,
            accepted: accepted as u64,
            finished: finished as u64,
            refused: self.counters.refusals(),
            handler_cpu_s: cpu.cpu.as_secs_f64(),
            helpers_cpu_s: cpu.helpers_cpu.as_secs_f64(),
            taken_over: self.taken_over.load(SeqCst) as u64,
            keeper: self.keeper.as_ref().map(Keeper::status),
            // Served although serve keeps its peers for takeover: their
            // deposit failed (said).
            unprotected: self.keeper.as_ref().map(|_| {
                let served = self.served.lock().expect("served");
                served.iter().filter(|p| p.kept.is_none()).count() as u64
            }),
            longest_fault_s: {
                let now = faultline_sys::monotonic_ns();
                let busy = self.engine.busy().into_iter();
                busy.map(|b| now.saturating_sub(b.since_ns))
                    .max()
                    .unwrap_or(0) as f64
                    / 1e9
            },
            fds: process::open_fds()
                .ok()
                .zip(process::fd_limit().ok().map(|l| l.soft)),
        }
    }

    /// Peers connected (handshakes being read included) and done with.
    pub fn counts(&self) -> (usize, usize) {
        let ignored = self.ignored.load(SeqCst);
        let connected = self.connected.load(SeqCst).saturating_sub(ignored);
        (connected, self.finished.load(SeqCst))
    }

    /// Keeps the summary of a peer done with, for `--json` and
    /// [`Server::run`](super::Server::run), when the config asks for them:
    /// otherwise a serve that runs for months keeps nothing per VM.
    pub fn keep(&self, summary: PeerSummary) {
        if self.config.summaries || self.config.json.is_some() {
            self.summaries.lock().expect("summaries").push(summary);
        }
    }

    /// Holds the process at the other end of connection `n` (`conn`) as a
    /// pidfd (`SO_PEERPIDFD`), so a kill of peer `n` reaches that process
    /// and never one that was given its pid after it exited.
    pub fn watch(&self, n: usize, conn: BorrowedFd<'_>) {
        if let Ok(p) = sock::peer_pidfd(conn) {
            self.pidfds.lock().expect("pidfds").push((n, p));
        }
    }

    /// Lets go of connection `n`'s pidfd (its peer is done with).
    pub fn unwatch(&self, n: usize) {
        self.pidfds.lock().expect("pidfds").retain(|(k, _)| *k != n);
    }

    /// SIGKILL to peer `n`: through its pidfd (`ESRCH` once it has
    /// exited, whoever has its pid now), else by pid `pid`.
    fn kill_peer(&self, n: usize, pid: i32) -> std::io::Result<()> {
        let pidfds = self.pidfds.lock().expect("pidfds");
        match pidfds.iter().find(|(k, _)| *k == n) {
            Some((_, p)) => p.send_signal(process::SIGKILL),
            None => process::kill(pid, process::SIGKILL),
        }
    }

    /// Ends peer `n` (pid `pid`), which serve will not serve because
    /// `why`: kills it (SIGKILL, through its pidfd when serve holds one)
    /// unless `leave_peer_on_error`, since its vCPUs would hang at their
    /// next missing page; says so. Gives what became of it, for its
    /// summary.
    pub fn kill(&self, n: usize, pid: i32, why: &str) -> &'static str {
        if self.config.leave_peer_on_error {
            say(format_args!(
                "peer {n} (pid {pid}): left running ({why}; --leave-peer-on-error): its vCPUs hang at their next missing page"
            ));
            return "left running";
        }
        if pid <= 0 {
            say(format_args!(
                "peer {n}: cannot be killed ({why}): SO_PEERCRED gave no pid (another pid namespace); its vCPUs hang at their next missing page"
            ));
            return "not killed: pid unknown";
        }
        match self.kill_peer(n, pid) {
            Ok(()) => {
                say(format_args!(
                    "peer {n}: killed pid {pid}: {why}, and its vCPUs would hang at their next missing page (--leave-peer-on-error leaves it running)"
                ));
                "killed"
            }
            Err(e) => {
                say(format_args!(
                    "peer {n}: killing pid {pid} ({why}) failed: {e}"
                ));
                "killing it failed"
            }
        }
    }
}
