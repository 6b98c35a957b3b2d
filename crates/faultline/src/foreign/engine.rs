//! The foreign engine: handler threads serving the faults of any number
//! of peers, and the prefetch helpers they share.
//!
//! ```text
//!   ForeignEngine::add(peer) ─► the least loaded Slot (a handler thread's peers)
//!
//!   handler thread (Worker), one per slot:
//!     poll(2) over: the slot's wake eventfd, per peer its uffd + hang-up fd
//!       (timeout 0 while spinning, see 4; else until the next deferred
//!       fault is due, at most 200 ms)
//!       uffd readable   ─► the one handler loop (engine/handler.rs) over
//!                          that peer: read under its copy gate, events
//!                          first (REMOVE), then faults ─► fault::resolve
//!       hang-up         ─► PeerEvent::HungUp, the peer is dropped
//!       a failure       ─► PeerEvent::Failed, the peer is dropped
//!     retry the deferred faults that are due
//!     one prefetch chunk of one peer (prefetch.rs), then poll again
//!
//!   prefetch helpers (threads shared by all slots): first the pieces of
//!     faults' long windows, beside the thread resolving them (the
//!     engine's crew, fault/crew.rs), then prefetch (prefetch.rs)
//! ```
//!
//! 1. **One reader per userfaultfd** (by default). Each peer is served by
//!    exactly one handler thread, which reads its events, its faults and
//!    runs its prefetch: the copy of a fault read before a REMOVE finishes
//!    before the REMOVE is read (and the peer's `madvise` released), so a
//!    removed range never gets the store's bytes installed after the fact.
//!    **Workers** ([`ForeignEngineConfig::spread`]): every thread reads
//!    every peer's userfaultfd (the kernel hands each message to one
//!    reader), so one peer's copies run on several CPUs. The rule above
//!    then holds through the peer's copy gate (`CopyGate`): a thread reads
//!    (and handles the events of its batch) holding it exclusively, and
//!    each install holds it shared, so no copy is in flight when a REMOVE
//!    is read. A window copied from the store goes in pieces of
//!    [`GATE_PIECE`](super::GATE_PIECE), a hold each, so the other thread
//!    reads the next fault after one piece, not after the whole window,
//!    and two sweeping vCPUs' windows are copied at once. Overlapping windows of two threads are settled by the
//!    residency map's claims (a page claimed by the other thread: the
//!    vCPU is woken to retry; one installed meanwhile: EEXIST, done). The
//!    first thread alone watches the peer's hang-up descriptor and runs
//!    its prefetch steps, and a dropped peer is reported once.
//!
//!    ```text
//!      peer uffd ──► thread 0: read ─► fault ─► COPY     (+ hang-up, prefetch)
//!                └─► thread 1: read ─► fault ─► COPY
//!    ```
//! 2. **What differs from a thread engine** is its [`Serve`], `Peers`: a
//!    fault's owner is its peer (looked up in the peer's own regions, not
//!    the region table), a store error is sent as
//!    [`PeerEvent::StoreError`], and what cannot be served drops the peer
//!    ([`PeerEvent::Failed`]) while the others are served on.
//! 3. **Peers come and go at run time**: [`ForeignEngine::add`] and
//!    [`ForeignEngine::remove`] change a slot's list and wake its thread,
//!    which takes a copy of the list and forgets the deferred faults of
//!    peers it no longer serves.
//! 4. **No sleeping handler on a busy peer** ([`HandlerWait`]). A thread
//!    asleep in `poll(2)` costs every fault its own wake-up before the
//!    copy starts. With `Adaptive` (the default) the thread polls with a
//!    zero timeout (yielding the CPU between empty polls) as long as a
//!    message came within the idle interval, and sleeps in `poll(2)` once
//!    none did:
//!
//!    ```text
//!      messages:  ||| |||||  ||                              |||
//!      thread:    spin ─────────────┤idle├ sleep in poll(2) ─┤ spin ...
//!                                   1 ms
//!    ```
//!
//!    An idle peer costs at most the idle interval of CPU per burst of
//!    faults; `Spin` never sleeps (a whole CPU per thread), `Poll` always
//!    does. Each thread's CPU time (`getrusage(RUSAGE_THREAD)`, updated
//!    before it sleeps and every 256 empty polls) is in
//!    [`ForeignEngine::handler_stats`].
//! 5. **Or a handler on the faulting CPU** ([`ForeignEngineConfig::pin`]):
//!    what a wake-up costs here is the other CPU's (an inter-processor
//!    interrupt to a halted vCPU), not the sleeping itself. A fault wakes
//!    every thread asleep on the peer's userfaultfd; with one thread
//!    pinned on each CPU, all reading every peer (`spread`) and asleep in
//!    `poll(2)`, the one on the faulting thread's CPU runs as soon as that
//!    thread sleeps, reads its message, copies, and wakes it on the same
//!    CPU: no wake-up crosses CPUs when the fault's own thread reads it
//!    (the others find nothing or another CPU's fault). Such threads read
//!    one message per `read(2)` (serve's `--engine per-cpu`).
//!
//!    ```text
//!      CPU 0: vCPU ─fault─► sleeps ─► fl-handler-0: read, COPY, wake ─► vCPU
//!      CPU 1: (other vCPU)            fl-handler-1: woken, reads nothing, sleeps
//!    ```
//!
//!    A thread that is to read a peer's userfaultfd while another holds
//!    the peer's copy gate spins for it (up to `GATE_SPIN`, longer than
//!    one piece's copy) before it sleeps on it: the holder's unlock would
//!    wake it from another CPU.

use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::atomic::{AtomicI32, AtomicU64};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parking_lot::{RwLock, RwLockWriteGuard};

use super::config::{ForeignEngineConfig, HandlerWait};
use super::error::ForeignError;
use super::peer::{ForeignPeer, PeerEvent};
use super::phases::FaultPhases;
use super::prefetch::{self, prefetch_chunk, Work};
use crate::background::{Background, StopFlag};
use crate::engine::handler::{poll_timeout, settle, Action, Attempt, Handler, Serve};
use crate::engine::EngineKind;
use crate::fault::crew::Crew;
use crate::fault::resolve::{self, resolve, Access, Origin};
use crate::page::PageSize;
use faultline_sys::poll::{self, events, PollFd};
use faultline_sys::rdtsc;
use faultline_sys::sock;
use faultline_sys::thread::{self, EventFd};
use faultline_sys::uffd::{Msg, Uffd, UffdError};
use faultline_sys::Errno;

/// One handler thread's share of the peers (with `spread`: every peer).
struct Slot {
    /// Its peers; the thread keeps a copy, refreshed when `changed`.
    peers: Mutex<Vec<Arc<ForeignPeer>>>,
    changed: AtomicBool,
    /// Wakes the thread from `poll(2)` (a peer added or removed, stop).
    wake: EventFd,
    /// The thread's CPU time, microseconds (see [`Worker::account`]).
    cpu_us: AtomicU64,
    /// Sleeps in `poll(2)` (a timeout other than 0).
    sleeps: AtomicU64,
    /// Polls with a zero timeout that found nothing (spinning).
    empty_spins: AtomicU64,
    /// The thread's id, once it runs (0 before).
    tid: AtomicI32,
    /// The CPU it is pinned to ([`ForeignEngineConfig::pin`]).
    cpu: Option<usize>,
    /// The fault it is resolving now (see [`ForeignEngine::busy`]).
    busy: Arc<BusyOn>,
}

/// What a handler thread is resolving now: `CLOCK_MONOTONIC` ns when it
/// took the fault up (0: none) and the peer's id. Written at the start
/// and end of every fault (a store or two, no lock), read by whoever
/// watches for a thread that does not come back.
#[derive(Default)]
struct BusyOn {
    since_ns: AtomicU64,
    peer: AtomicU64,
}

/// A handler thread busy on one fault ([`ForeignEngine::busy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandlerBusy {
    /// The thread (`fl-handler-N`).
    pub thread: usize,
    /// The peer whose fault it is.
    pub peer: u64,
    /// When it took the fault up (`CLOCK_MONOTONIC` ns).
    pub since_ns: u64,
}

/// What the handler threads of a [`ForeignEngine`] cost, summed over the
/// threads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HandlerStats {
    /// CPU time (user + system) of the handler threads, as of each
    /// thread's last sleep or its last 256 empty polls.
    pub cpu: Duration,
    /// Times a thread went to sleep in `poll(2)`.
    pub sleeps: u64,
    /// Polls with a zero timeout that found nothing (the spinning).
    pub empty_spins: u64,
    /// CPU time (user + system) of the prefetch helpers, which install
    /// prefetch queues and pieces of faults' long windows (`fault::crew`),
    /// as of each helper's last wait or last pass over the queues.
    pub helpers_cpu: Duration,
}

/// The peers of every slot with prefetch pending.
fn prefetching(slots: &[Arc<Slot>]) -> Vec<Arc<ForeignPeer>> {
    slots
        .iter()
        .flat_map(|s| {
            s.peers
                .lock()
                .expect("peers")
                .iter()
                .filter(|p| p.prefetch_pending())
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Handler threads serving the faults of any number of peers. See [the
/// foreign path's docs](super).
pub struct ForeignEngine {
    slots: Vec<Arc<Slot>>,
    threads: Vec<Background>,
    helpers: Vec<Background>,
    /// Each helper's CPU time, microseconds (see [`prefetch::helper`]).
    helper_cpu_us: Vec<Arc<AtomicU64>>,
    work: Arc<Work>,
    /// The helpers as a crew for long windows (none without helpers).
    crew: Option<Arc<Crew>>,
    /// Every thread serves every peer (workers).
    spread: bool,
}

impl std::fmt::Debug for ForeignEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignEngine")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl ForeignEngine {
    /// Starts the handler threads. `kind` is the engine the caller would
    /// use for its own memory: the thread engines all serve peers the same
    /// way (poll-style threads); `signal` is refused.
    pub fn new(
        kind: EngineKind,
        cfg: ForeignEngineConfig,
    ) -> Result<(ForeignEngine, Receiver<PeerEvent>), ForeignError> {
        if kind.delivery().on_faulting_thread {
            return Err(ForeignError::Refused {
                what: "the signal engine",
                why: "the faults happen on the peer's threads, which never run our SIGBUS handler",
            });
        }
        let (tx, rx) = channel();
        let mut slots = Vec::new();
        // Round robin over the CPUs the creating thread may use (the mask
        // its threads inherit).
        let allowed = match cfg.pin {
            true => thread::allowed_cpus().map_err(|source| ForeignError::Spawn {
                what: "a pinned handler thread (the CPUs it may use)",
                source,
            })?,
            false => Vec::new(),
        };
        for i in 0..cfg.threads.max(1) {
            slots.push(Arc::new(Slot {
                peers: Mutex::new(Vec::new()),
                changed: AtomicBool::new(false),
                wake: EventFd::new().map_err(|source| ForeignError::Spawn {
                    what: "an eventfd",
                    source,
                })?,
                cpu_us: AtomicU64::new(0),
                sleeps: AtomicU64::new(0),
                empty_spins: AtomicU64::new(0),
                tid: AtomicI32::new(0),
                cpu: allowed.get(i % allowed.len().max(1)).copied(),
                busy: Arc::default(),
            }));
        }
        let all = Arc::new(slots.clone());
        let mut threads = Vec::new();
        let (pinned_tx, pinned) = channel();
        for i in 0..slots.len() {
            let (all, tx, cfg) = (all.clone(), tx.clone(), cfg.clone());
            let pinned_tx = pinned_tx.clone();
            threads.push(
                Background::spawn(format!("fl-handler-{i}"), move |stop| {
                    all[i].tid.store(thread::gettid(), Relaxed);
                    let pin = all[i].cpu.map_or(Ok(()), thread::pin_to_cpu);
                    let ok = pin.is_ok();
                    let _ = pinned_tx.send(pin);
                    if ok {
                        Worker::new(all, i, tx, &cfg).run(stop)
                    }
                })
                .map_err(|source| ForeignError::Spawn {
                    what: "a handler thread",
                    source,
                })?,
            );
        }
        drop(pinned_tx);
        // Each thread says whether it is where it was asked to be before
        // it serves anything; one that could not be pinned ends, and so
        // does the engine.
        for pin in pinned.iter().take(threads.len()) {
            pin.map_err(|source| ForeignError::Spawn {
                what: "a pinned handler thread (its CPU affinity)",
                source,
            })?;
        }
        let work = Arc::new(Work::default());
        // The helpers install pieces of long windows beside the thread
        // resolving the fault (fault/crew.rs).
        let crew = (cfg.prefetch_helpers > 0).then(|| {
            let work = work.clone();
            Arc::new(Crew::new(move || work.notify()))
        });
        let (mut helpers, mut helper_cpu_us) = (Vec::new(), Vec::new());
        for i in 0..cfg.prefetch_helpers {
            let (slots, work, tx) = (slots.clone(), work.clone(), tx.clone());
            let cpu_us = Arc::new(AtomicU64::new(0));
            helper_cpu_us.push(cpu_us.clone());
            let crew = crew.clone().expect("helpers have a crew");
            let scratch = cfg.scratch_bytes.max(PageSize::HUGE_2M.bytes());
            let idle = cfg.prefetch_idle;
            helpers.push(
                Background::spawn(format!("fl-helper-{i}"), move |stop| {
                    prefetch::helper(
                        || prefetching(&slots),
                        (&work, &crew),
                        &tx,
                        (scratch, idle),
                        (&cpu_us, stop),
                    )
                })
                .map_err(|source| ForeignError::Spawn {
                    what: "a prefetch helper thread",
                    source,
                })?,
            );
        }
        Ok((
            ForeignEngine {
                slots,
                threads,
                helpers,
                helper_cpu_us,
                work,
                crew,
                spread: cfg.spread,
            },
            rx,
        ))
    }

    /// Starts serving `peer` (on the least loaded thread; workers: on
    /// every thread).
    pub fn add(&self, mut peer: ForeignPeer) -> Arc<ForeignPeer> {
        if let Some(crew) = &self.crew {
            peer.join_crew(crew);
        }
        peer.read_by = self.readers(&peer);
        let peer = Arc::new(peer);
        let on: Vec<&Arc<Slot>> = if self.spread {
            self.slots.iter().collect()
        } else {
            let least = self
                .slots
                .iter()
                .min_by_key(|s| s.peers.lock().expect("peers").len())
                .expect("at least one thread");
            vec![least]
        };
        for slot in on {
            slot.peers.lock().expect("peers").push(peer.clone());
            slot.changed.store(true, Relaxed);
            slot.wake.notify();
        }
        if peer.prefetch_pending() {
            self.work.notify();
        }
        peer
    }

    /// Which threads read `peer`'s userfaultfd (`None`: all of its
    /// threads): with every thread reading every peer (`spread`) and the
    /// threads pinned, a peer that said where its threads run
    /// ([`ForeignPeer::with_cpus`]) is read by the threads on those CPUs,
    /// or by all when none is there.
    fn readers(&self, peer: &ForeignPeer) -> Option<Vec<bool>> {
        let cpus = peer.cpus.as_ref().filter(|_| self.spread)?;
        let on: Vec<bool> = self
            .slots
            .iter()
            .map(|s| s.cpu.is_some_and(|c| cpus.contains(&c)))
            .collect();
        on.contains(&true).then_some(on)
    }

    /// Stops serving peer `id`; returns it (the caller decides when its
    /// descriptors close by dropping it).
    pub fn remove(&self, id: u64) -> Option<Arc<ForeignPeer>> {
        let mut found = None;
        for s in &self.slots {
            let mut peers = s.peers.lock().expect("peers");
            if let Some(i) = peers.iter().position(|p| p.id == id) {
                found = Some(peers.remove(i));
                s.changed.store(true, Relaxed);
                s.wake.notify();
            }
        }
        found
    }

    /// What the handler threads cost so far (CPU time, sleeps, empty
    /// spins), and the prefetch helpers' CPU time.
    pub fn handler_stats(&self) -> HandlerStats {
        let mut h = HandlerStats::default();
        for s in &self.slots {
            h.cpu += Duration::from_micros(s.cpu_us.load(Relaxed));
            h.sleeps += s.sleeps.load(Relaxed);
            h.empty_spins += s.empty_spins.load(Relaxed);
        }
        for c in &self.helper_cpu_us {
            h.helpers_cpu += Duration::from_micros(c.load(Relaxed));
        }
        h
    }

    /// The handler threads resolving a fault now, each with the peer and
    /// when it took the fault up. A thread on one fault for long (its
    /// store read, or the kernel, not returning) holds up every other
    /// fault it would read: whoever watches (serve) says so.
    pub fn busy(&self) -> Vec<HandlerBusy> {
        let mut busy = Vec::new();
        for (thread, s) in self.slots.iter().enumerate() {
            // `since_ns` first: its Acquire pairs with the Release that
            // published it after `peer`.
            let since_ns = s.busy.since_ns.load(Acquire);
            let peer = s.busy.peer.load(Relaxed);
            if since_ns != 0 {
                busy.push(HandlerBusy {
                    thread,
                    peer,
                    since_ns,
                });
            }
        }
        busy
    }

    /// The handler threads' ids (`gettid`), in thread order: to find them
    /// in `/proc` (their CPUs, their names `fl-handler-N`).
    pub fn handler_tids(&self) -> Vec<i32> {
        self.slots.iter().map(|s| s.tid.load(Relaxed)).collect()
    }

    /// The peers being served.
    pub fn peers(&self) -> Vec<Arc<ForeignPeer>> {
        if self.spread {
            return self.slots[0].peers.lock().expect("peers").clone();
        }
        self.slots
            .iter()
            .flat_map(|s| s.peers.lock().expect("peers").clone())
            .collect()
    }
}

impl Drop for ForeignEngine {
    fn drop(&mut self) {
        for h in &mut self.helpers {
            h.stop(|| self.work.notify());
        }
        for (t, s) in self.threads.iter_mut().zip(&self.slots) {
            t.stop(|| s.wake.notify());
        }
    }
}

/// The longest a handler thread sleeps in `poll(2)`.
const IDLE_MS: i32 = 200;

/// Bytes read at most per wake-up of a peer's hang-up descriptor (what
/// the peer sends after its hand-off: [`PeerEvent::Message`]).
const HANGUP_MSG_BYTES: usize = 16 << 10;

/// A peer worker's faults: each belongs to a peer (its regions, counters
/// and record), is resolved with the worker's scratch buffer, and what
/// cannot be served drops the peer (the stop is the message it is
/// reported with).
struct Peers {
    tx: Sender<PeerEvent>,
    scratch: Vec<u8>,
    /// TSC when the last `read(2)` returned messages (phase samples).
    read_tsc: Cell<u64>,
    /// The fault this thread resolves now.
    busy: Arc<BusyOn>,
}

/// Marks its thread busy on one fault until dropped (every way out of
/// [`Peers::fault`]).
struct BusyGuard<'a>(&'a BusyOn);

impl<'a> BusyGuard<'a> {
    fn on(busy: &'a BusyOn, peer: u64, now_ns: u64) -> BusyGuard<'a> {
        busy.peer.store(peer, Relaxed);
        busy.since_ns.store(now_ns, Release);
        BusyGuard(busy)
    }
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.since_ns.store(0, Release);
    }
}

impl Serve for Peers {
    type Owner = Arc<ForeignPeer>;
    type Stop = String;

    fn uffd<'a>(&'a self, p: &'a Arc<ForeignPeer>) -> &'a Uffd {
        &p.uffd.uffd
    }

    fn batch_read(&self, p: &Arc<ForeignPeer>, n: usize) {
        self.read_tsc.set(rdtsc());
        p.stats.messages.fetch_add(n as u64, Relaxed);
    }

    fn event(&mut self, p: &Arc<ForeignPeer>, m: Msg) {
        match m {
            Msg::Remove { start, end } => p.on_remove(start, end),
            _ => {
                p.stats.other_events.fetch_add(1, Relaxed);
            }
        }
    }

    fn fault(
        &mut self,
        p: &Arc<ForeignPeer>,
        addr: u64,
        flags: u64,
        t0: u64,
        attempt: Attempt,
    ) -> Action<String> {
        let started_ns = faultline_sys::monotonic_ns();
        let _busy = BusyGuard::on(&self.busy, p.id(), started_ns);
        // Each install holds the peer's copy gate (`CopyGate`), so no
        // REMOVE is read by another thread while its copy is in flight.
        let (reg, page) = match p.on_fault(addr, flags, attempt != Attempt::Retry) {
            Ok(found) => found,
            Err(why) => return Action::Stop(why),
        };
        let r = &reg.state;
        r.fault_seen(page, t0);
        let access = Access::of_message(flags);
        let res = resolve(r, page, access, &Origin::Fault, &mut self.scratch);
        let done = rdtsc();
        r.add_cycles(done.wrapping_sub(t0));
        if let (Some(ring), Attempt::Read) = (&p.phases, attempt) {
            let stamps = (self.read_tsc.get(), t0, done);
            ring.push(FaultPhases::new(addr, stamps, resolve::stamps()));
        }
        p.fault_served(&res, started_ns);
        settle(
            r,
            page,
            res,
            |e| {
                let error = format!(
                    "store error at peer page {:#x} (store offset {:#x}): {e}; the page is poisoned and the faulting thread gets SIGBUS",
                    r.pages.addr(page),
                    reg.store_offset + r.pages.offset(page)
                );
                let _ = self.tx.send(PeerEvent::StoreError {
                    peer: p.clone(),
                    error,
                });
            },
            |e| {
                // Where the kernel's own fault would stop too (or wait,
                // under a cgroup v1 `oom_kill_disable`).
                let limit = match e.is(Errno::ENOMEM) {
                    true => ": the peer is out of memory (its memory cgroup at its limit, its OOM killer disabled or with nothing to kill, or its huge page pool empty)",
                    false => "",
                };
                format!("resolving the fault at {addr:#x} failed: {e}{limit}")
            },
        )
    }

    fn deferred(&self, p: &Arc<ForeignPeer>) {
        p.stats.deferred.fetch_add(1, Relaxed);
    }

    fn read_failed(&mut self, _: &Arc<ForeignPeer>, e: UffdError) -> String {
        format!("reading its userfaultfd: {e}")
    }
}

/// One handler thread of a [`ForeignEngine`]: polls its peers'
/// userfaultfds and hang-up descriptors, runs the handler loop over each
/// peer with messages, and one bounded prefetch step per round.
struct Worker {
    /// Its place among the engine's threads.
    index: usize,
    slot: Arc<Slot>,
    /// Every thread's slot (workers: a dropped peer leaves them all).
    all: Arc<Vec<Arc<Slot>>>,
    /// This thread watches hang-ups and runs prefetch steps (the only
    /// thread, or the first of the workers).
    primary: bool,
    spread: bool,
    peers: Vec<Arc<ForeignPeer>>,
    handler: Handler<Peers>,
    chunk: usize,
    next_prefetch: usize,
    wait: HandlerWait,
    /// When a read last returned messages.
    last_msg: Instant,
}

/// How long a thread that is to read a peer's userfaultfd spins for its
/// copy gate before it sleeps on it: longer than a hold (one piece, about
/// 0.1 ms here). A sleeping reader is woken by the holder's unlock from
/// another CPU, an inter-processor wake-up of tens of microseconds here,
/// while the vCPU whose fault it is to read waits; its CPU has nothing
/// else to do meanwhile (RESULTS.md, "A handler on the faulting CPU").
const GATE_SPIN: Duration = Duration::from_micros(200);

/// Takes a peer's copy gate exclusively (to read its userfaultfd),
/// spinning up to [`GATE_SPIN`] before sleeping on it.
fn write_soon(gate: &RwLock<()>) -> RwLockWriteGuard<'_, ()> {
    // Free (the common case): no clock read on the way to the read.
    if let Some(g) = gate.try_write() {
        return g;
    }
    let until = Instant::now() + GATE_SPIN;
    loop {
        std::hint::spin_loop();
        if let Some(g) = gate.try_write() {
            return g;
        }
        if Instant::now() > until {
            return gate.write();
        }
    }
}

/// Empty spins between two updates of a spinning thread's CPU time.
const ACCOUNT_EVERY: u64 = 256;

impl Worker {
    fn new(
        all: Arc<Vec<Arc<Slot>>>,
        index: usize,
        tx: Sender<PeerEvent>,
        cfg: &ForeignEngineConfig,
    ) -> Worker {
        let peers = Peers {
            tx,
            scratch: vec![0u8; cfg.scratch_bytes.max(PageSize::HUGE_2M.bytes())],
            read_tsc: Cell::new(0),
            busy: all[index].busy.clone(),
        };
        Worker {
            index,
            slot: all[index].clone(),
            all,
            primary: !cfg.spread || index == 0,
            spread: cfg.spread,
            peers: Vec::new(),
            handler: Handler::new(peers, cfg.batch),
            chunk: cfg.prefetch_chunk_bytes.max(PageSize::BASE.bytes()),
            next_prefetch: 0,
            wait: cfg.wait,
            last_msg: Instant::now(),
        }
    }

    /// Publishes this thread's CPU time so far.
    fn account(&self) {
        if let Ok(u) = faultline_sys::process::thread_usage() {
            self.slot.cpu_us.store(u.cpu_us(), Relaxed);
        }
    }

    fn run(mut self, stop: &StopFlag) {
        let mut fds: Vec<PollFd> = Vec::new();
        while !stop.is_set() {
            if self.slot.changed.swap(false, Relaxed) {
                self.peers = self.slot.peers.lock().expect("peers").clone();
                let live: Vec<u64> = self.peers.iter().map(|p| p.id).collect();
                self.handler.forget(|p| live.contains(&p.id));
            }
            fds.clear();
            fds.push(PollFd {
                fd: self.slot.wake.raw(),
                events: events::IN,
                revents: 0,
            });
            for p in &self.peers {
                fds.push(PollFd {
                    // (See `ForeignEngine::readers`.)
                    fd: match p.read_by.as_ref().is_none_or(|r| r[self.index]) {
                        true => p.uffd.raw_fd(),
                        false => -1,
                    },
                    events: events::IN,
                    revents: 0,
                });
                // (A negative descriptor is ignored by poll(2).)
                let hangup = p.hangup.as_ref().filter(|_| self.primary);
                fds.push(PollFd {
                    fd: hangup.map_or(-1, |f| f.as_raw_fd()),
                    events: events::IN | events::RDHUP,
                    revents: 0,
                });
            }
            let prefetching = self.primary && self.peers.iter().any(|p| p.prefetch_pending());
            let spinning = !prefetching && self.wait.spins(self.last_msg.elapsed());
            let timeout = if prefetching || spinning {
                0
            } else {
                poll_timeout(self.handler.next_due(), IDLE_MS)
            };
            if timeout != 0 {
                self.account();
                self.slot.sleeps.fetch_add(1, Relaxed);
            }
            if poll::poll(&mut fds, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            if fds[0].revents != 0 {
                self.slot.wake.drain();
            }
            let mut dropped: Vec<(u64, PeerEvent)> = Vec::new();
            let ready = fds.iter().any(|f| f.revents != 0);
            for (i, p) in self.peers.clone().iter().enumerate() {
                let (u, h) = (fds[1 + 2 * i].revents, fds[2 + 2 * i].revents);
                if u & events::IN != 0 {
                    self.last_msg = Instant::now();
                    if let Err(error) = self.serve(p) {
                        dropped.push((
                            p.id,
                            PeerEvent::Failed {
                                peer: p.clone(),
                                error,
                            },
                        ));
                        continue;
                    }
                } else if u & (events::ERR | events::NVAL) != 0 {
                    dropped.push((
                        p.id,
                        PeerEvent::Failed {
                            peer: p.clone(),
                            error: format!("its userfaultfd reports poll events {u:#x}"),
                        },
                    ));
                    continue;
                }
                if h != 0 {
                    if let Some(ev) = self.on_hangup_fd(p, h) {
                        dropped.push((p.id, ev));
                    }
                }
            }
            for (id, ev) in dropped {
                self.forget(id);
                self.report(ev);
            }
            if let Err((peer, error)) = self.handler.retry_deferred() {
                self.forget(peer.id);
                self.report(PeerEvent::Failed { peer, error });
            }
            // Faults first: the ones read this round are resolved; then one
            // bounded prefetch step, and back to poll (timeout 0).
            if prefetching {
                self.prefetch_step();
            } else if spinning && !ready {
                let n = self.slot.empty_spins.fetch_add(1, Relaxed) + 1;
                if n.is_multiple_of(ACCOUNT_EVERY) {
                    self.account();
                }
                // Two vCPUs may be shared with the peer's own threads:
                // give them the CPU if they want it.
                std::thread::yield_now();
            }
        }
        self.account();
    }

    /// Stops serving peer `id` (it was dropped); workers: on every
    /// thread.
    fn forget(&mut self, id: u64) {
        self.peers.retain(|p| p.id != id);
        self.handler.forget(|p| p.id != id);
        let mine = std::slice::from_ref(&self.slot);
        for s in if self.spread { &self.all[..] } else { mine } {
            let mut peers = s.peers.lock().expect("peers");
            let before = peers.len();
            peers.retain(|p| p.id != id);
            if peers.len() != before && !Arc::ptr_eq(s, &self.slot) {
                s.changed.store(true, Relaxed);
                s.wake.notify();
            }
        }
    }

    /// Sends a peer's drop (hung up, failed) unless another thread of
    /// the workers already did.
    fn report(&self, ev: PeerEvent) {
        let peer = match &ev {
            PeerEvent::HungUp { peer } | PeerEvent::Failed { peer, .. } => Some(peer),
            _ => None,
        };
        if peer.is_some_and(|p| p.dropped.swap(true, Relaxed)) {
            return;
        }
        let _ = self.handler.serve.tx.send(ev);
    }

    /// Something on the peer's hang-up descriptor: a message (its bytes
    /// reported; the peer is still served) or a hang-up.
    fn on_hangup_fd(&mut self, p: &Arc<ForeignPeer>, revents: i16) -> Option<PeerEvent> {
        let fd = p.hangup.as_ref()?;
        if revents & events::IN != 0 {
            let mut buf = vec![0u8; HANGUP_MSG_BYTES];
            match sock::recv_with_fds(fd.as_fd(), &mut buf, true) {
                Ok(got) if got.bytes > 0 || !got.fds.is_empty() => {
                    buf.truncate(got.bytes);
                    let _ = self.handler.serve.tx.send(PeerEvent::Message {
                        peer: p.clone(),
                        data: buf,
                        fds: got.fds.len(),
                    });
                    return None;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                _ => {}
            }
        }
        (revents & (events::HUP | events::RDHUP | events::ERR | events::IN) != 0)
            .then(|| PeerEvent::HungUp { peer: p.clone() })
    }

    /// Reads and handles the peer's pending messages, a batch at a time
    /// (events first within a batch, under the peer's copy gate: see
    /// `ForeignPeer::copy_gate`); the error says why the peer must be
    /// dropped.
    fn serve(&mut self, p: &Arc<ForeignPeer>) -> Result<(), String> {
        loop {
            let n = self.handler.read(p, || write_soon(&p.copy_gate))?;
            if n > 0 {
                p.stats.reads.fetch_add(1, Relaxed);
            }
            if n < self.handler.batch() {
                return Ok(());
            }
        }
    }

    /// Installs up to one chunk of one peer's prefetch queue (each
    /// install under the peer's copy gate, as a fault's).
    fn prefetch_step(&mut self) {
        let n = self.peers.len();
        for k in 0..n {
            let i = (self.next_prefetch + k) % n;
            let p = self.peers[i].clone();
            if p.prefetch_pending() {
                self.next_prefetch = i + 1;
                let peers = &mut self.handler.serve;
                prefetch_chunk(&p, self.chunk, &mut peers.scratch, &peers.tx);
                return;
            }
        }
    }
}
