//! Fault-delivery engines: how a fault reaches the resolve path.
//!
//! All five engines share the fault path (`fault/`); they differ
//! only in who runs it and how that thread learns about the fault:
//!
//! ```text
//!  poll     app thread ──fault──► kernel queues msg, app thread sleeps
//!           handler thread: poll() wakes ─► read() ─► resolve ─► ioctl wakes app thread
//!  spin     same, but the handler never sleeps: read() in a loop
//!  workers  N poll-style threads on one fd; a fault is handled by the
//!           worker that owns its fault-around window (hand-off via eventfd)
//!  per-cpu  one poll-style thread pinned on each CPU, one fd; each resolves
//!           what it reads: the one on the faulting thread's CPU runs first
//!  signal   app thread ──fault──► SIGBUS on the same thread ─► resolve ─► return, retry access
//! ```
//!
//! # Failure policy
//! A store error poisons the page: the faulting thread gets SIGBUS (and the
//! runtime prints which region, offset and cause). A handler thread that
//! panics, or a resolve ioctl failing in a way the runtime does not
//! understand, aborts the process with a message: a dead handler would
//! otherwise leave faulting threads blocked forever. An optional watchdog
//! ([`EngineConfig::stall_timeout`]) aborts, with a message, when one
//! resolution takes longer than the timeout (a stalled store).

pub(crate) mod handler;
mod poll;
mod signal;
mod spin;
mod threaded;
mod workers;

pub use poll::PollEngine;
pub use signal::SignalEngine;
pub use spin::SpinEngine;
pub use workers::{PerCpuEngine, WorkersEngine};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::background::{Background, StopFlag};
use crate::error::{Error, Result};
use crate::fault::report::fail_closed;
pub use crate::fault::Delivery;
use crate::page::MemoryKind;
use faultline_sys::thread::EventFd;
use faultline_sys::uffd::{feature, Uffd};

/// The five engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// Handler thread blocking in `poll()`+`read()`.
    Poll,
    /// Handler thread busy-polling.
    Spin,
    /// Same-thread SIGBUS delivery.
    Signal,
    /// Pinned worker threads, sharded by page window.
    Workers,
    /// A handler thread pinned on each CPU, each resolving what it reads.
    PerCpu,
}

impl EngineKind {
    /// Every engine.
    pub const ALL: [EngineKind; 5] = [
        EngineKind::Poll,
        EngineKind::Spin,
        EngineKind::Signal,
        EngineKind::Workers,
        EngineKind::PerCpu,
    ];
    /// Name for reports and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Poll => "poll",
            EngineKind::Spin => "spin",
            EngineKind::Signal => "signal",
            EngineKind::Workers => "workers",
            EngineKind::PerCpu => "per-cpu",
        }
    }
    /// Parses a name.
    pub fn from_name(s: &str) -> Option<EngineKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
    /// How this engine delivers faults.
    pub fn delivery(self) -> Delivery {
        match self {
            EngineKind::Signal => Delivery::SAME_THREAD,
            _ => Delivery::HANDLER_THREAD,
        }
    }
    /// Whether this engine can serve regions of `kind` on this kernel, or
    /// why not.
    pub fn usable_on(self, kind: MemoryKind) -> Result<(), String> {
        let caps = crate::caps::capabilities();
        if let Err(why) = &caps.kind(kind).ioctls {
            return Err(format!("memory kind unusable: {why}"));
        }
        if self.delivery().on_faulting_thread && !caps.has(feature::SIGBUS) {
            return Err("kernel lacks UFFD_FEATURE_SIGBUS".into());
        }
        Ok(())
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Bytes of scratch buffer per handler (bounds fault-around for stores
    /// without a zero-copy view). Default 4 MiB.
    pub scratch_bytes: usize,
    /// Messages read per `read(2)`. Default 64.
    pub batch: usize,
    /// Worker threads (`workers` engine). Default: number of CPUs.
    pub workers: usize,
    /// Pin handler threads to CPUs, within those the thread creating the
    /// engine may use: poll and spin to the last of them (a thread
    /// faulting on that CPU is answered without a wake-up across CPUs),
    /// workers round robin. Default true.
    pub pin: bool,
    /// Abort the process, with a message, if one resolution takes longer
    /// than this (thread engines). Default: none.
    pub stall_timeout: Option<Duration>,
    /// `signal` engine: run the SIGBUS handler on a per-thread alternate
    /// stack of this many bytes (`SA_ONSTACK`), which every faulting thread
    /// installs with [`SignalEngine::prepare_thread`]. Default: none, the
    /// handler runs on the faulting thread's own stack. (Rust's standard
    /// library gives every thread a small alternate stack for its overflow
    /// handler; with `SA_ONSTACK` and no `prepare_thread`, the handler
    /// would run there, which is too small for stores with deep stacks.)
    pub altstack_bytes: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            scratch_bytes: 4 << 20,
            batch: 64,
            workers: faultline_sys::thread::online_cpus(),
            pin: true,
            stall_timeout: None,
            altstack_bytes: None,
        }
    }
}

/// Counters of one engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Page-fault messages (or signals) handled.
    pub faults: u64,
    /// `read(2)` calls that returned messages.
    pub reads: u64,
    /// Non-fault events (REMOVE) handled.
    pub events: u64,
    /// Faults deferred after EAGAIN.
    pub deferred: u64,
    /// Faults handed to another worker.
    pub forwarded: u64,
    /// TSC cycles spent resolving.
    pub handler_cycles: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub faults: AtomicU64,
    pub reads: AtomicU64,
    pub events: AtomicU64,
    pub deferred: AtomicU64,
    pub forwarded: AtomicU64,
    pub handler_cycles: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> EngineStats {
        EngineStats {
            faults: self.faults.load(Relaxed),
            reads: self.reads.load(Relaxed),
            events: self.events.load(Relaxed),
            deferred: self.deferred.load(Relaxed),
            forwarded: self.forwarded.load(Relaxed),
            handler_cycles: self.handler_cycles.load(Relaxed),
        }
    }
}

/// A fault-delivery engine. Implemented by [`PollEngine`], [`SpinEngine`],
/// [`SignalEngine`], [`WorkersEngine`] and [`PerCpuEngine`]; regions hold an
/// `Arc<dyn Engine>`.
pub trait Engine: Send + Sync + 'static {
    /// Which engine this is (for reports).
    fn kind(&self) -> EngineKind;
    /// How it delivers faults: what regions and the fault path may assume.
    fn delivery(&self) -> Delivery {
        self.kind().delivery()
    }
    /// The userfaultfd regions register with.
    fn uffd(&self) -> &Arc<Uffd>;
    /// Scratch bytes each handler has (see [`EngineConfig::scratch_bytes`]).
    fn scratch_bytes(&self) -> usize;
    /// Counters.
    fn stats(&self) -> EngineStats;
    /// Fails if the engine cannot take new regions (its threads are gone,
    /// or this is a forked child and the engine its parent's: its
    /// userfaultfd serves the parent's memory).
    fn check_alive(&self) -> Result<()> {
        made_here(self.uffd())
    }
    /// Called when a region starts using the engine.
    fn region_added(&self) {}
    /// Called when a region stops using the engine.
    fn region_removed(&self) {}
}

/// Fails in a forked child for a userfaultfd its parent opened (an
/// engine, or a region of the parent's, copied by the fork): it serves the
/// parent's memory, and its ioctls act there.
pub(crate) fn made_here(uffd: &Uffd) -> Result<()> {
    match uffd.inherited() {
        true => Err(Error::Unsupported {
            what: "an engine or region in this process",
            reason: "it was made by the parent of this forked process: a userfaultfd serves the memory of the process that opened it (make engines and regions in this process)".into(),
        }),
        false => Ok(()),
    }
}

/// Creates an engine by kind with `config`.
pub fn create(kind: EngineKind, config: EngineConfig) -> Result<Arc<dyn Engine>> {
    Ok(match kind {
        EngineKind::Poll => PollEngine::with_config(config)?,
        EngineKind::Spin => SpinEngine::with_config(config)?,
        EngineKind::Signal => SignalEngine::with_config(config)?,
        EngineKind::Workers => WorkersEngine::with_config(config)?,
        EngineKind::PerCpu => PerCpuEngine::with_config(config)?,
    })
}

/// Feature bits every engine asks for when the kernel has them: memory
/// kinds beyond private anonymous, POISON and MOVE.
pub(crate) fn common_features() -> u64 {
    crate::caps::capabilities().features
        & (feature::PAGEFAULT_FLAG_WP
            | feature::MISSING_SHMEM
            | feature::MINOR_SHMEM
            | feature::MISSING_HUGETLBFS
            | feature::MINOR_HUGETLBFS
            | feature::POISON
            | feature::MOVE)
}

/// What the thread engines share: the fd, their handler threads (stopped
/// together by one flag and an eventfd), counters, the stall watchdog.
pub(crate) struct ThreadCore {
    pub uffd: Arc<Uffd>,
    pub config: EngineConfig,
    pub counters: Arc<Counters>,
    pub stop: StopFlag,
    pub wake: Arc<EventFd>,
    pub epoch: std::time::Instant,
    threads: std::sync::Mutex<Vec<Background>>,
    watchdog: std::sync::Mutex<Option<Background>>,
}

impl ThreadCore {
    pub fn new(config: EngineConfig) -> Result<ThreadCore> {
        // poll() on a blocking uffd reports POLLERR: the fd is non-blocking.
        let uffd = crate::caps::open_uffd(
            true,
            feature::EVENT_REMOVE | feature::THREAD_ID | common_features(),
        )?;
        let wake = EventFd::new().map_err(|e| Error::Io {
            op: "eventfd",
            source: e,
        })?;
        Ok(ThreadCore {
            uffd: Arc::new(uffd),
            config,
            counters: Arc::new(Counters::default()),
            stop: StopFlag::new(),
            wake: Arc::new(wake),
            epoch: std::time::Instant::now(),
            threads: std::sync::Mutex::new(Vec::new()),
            watchdog: std::sync::Mutex::new(None),
        })
    }

    /// What one handler thread serves, with its watchdog slot.
    pub fn local(&self, slots: &mut Vec<Arc<threaded::BusySlot>>) -> threaded::Local {
        let slot = Arc::new(threaded::BusySlot::default());
        slots.push(slot.clone());
        threaded::Local::new(
            self.uffd.clone(),
            self.counters.clone(),
            slot,
            self.epoch,
            self.config.scratch_bytes,
        )
    }

    /// A handler for one thread (see [`ThreadCore::local`]).
    pub fn handler(&self, slots: &mut Vec<Arc<threaded::BusySlot>>) -> threaded::LocalHandler {
        handler::Handler::new(self.local(slots), self.config.batch)
    }

    /// Starts `bodies` as handler threads and the watchdog over `slots`.
    /// A body must never unwind: a panic outside the resolve path (which
    /// has its own message) fails closed.
    pub fn start(
        &self,
        name: &'static str,
        bodies: Vec<HandlerBody>,
        slots: Vec<Arc<threaded::BusySlot>>,
    ) -> Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for (i, body) in bodies.into_iter().enumerate() {
            let t = Background::spawn_with(format!("fl-{name}-{i}"), &self.stop, |stop| {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(stop))).is_err() {
                    fail_closed(|w| {
                        let _ = std::fmt::Write::write_str(w, "a fault handler thread panicked");
                    });
                }
            })
            .map_err(|e| Error::Io {
                op: "spawn handler thread",
                source: e,
            })?;
            threads.push(t);
        }
        if let Some(timeout) = self.config.stall_timeout {
            let w =
                threaded::watchdog(name, slots, self.epoch, timeout).map_err(|e| Error::Io {
                    op: "spawn watchdog",
                    source: e,
                })?;
            *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
        }
        Ok(())
    }
}

impl Drop for ThreadCore {
    fn drop(&mut self) {
        self.stop.set();
        self.wake.notify();
        // Each Background joins its thread on drop.
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

/// The body of one handler thread.
pub(crate) type HandlerBody = Box<dyn FnOnce(&StopFlag) + Send>;

/// The engines built on [`ThreadCore`] (poll, spin, workers, per-cpu): one
/// implementation of [`Engine`] serves all three.
pub(crate) trait Threaded: Send + Sync + 'static {
    const KIND: EngineKind;
    fn core(&self) -> &ThreadCore;
}

impl<T: Threaded> Engine for T {
    fn kind(&self) -> EngineKind {
        T::KIND
    }
    fn uffd(&self) -> &Arc<Uffd> {
        &self.core().uffd
    }
    fn scratch_bytes(&self) -> usize {
        self.core().config.scratch_bytes
    }
    fn stats(&self) -> EngineStats {
        self.core().counters.snapshot()
    }
    fn check_alive(&self) -> Result<()> {
        made_here(&self.core().uffd)?;
        let threads = self
            .core()
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if threads.iter().any(Background::is_finished) {
            return Err(Error::Io {
                op: "engine handler thread",
                source: std::io::Error::other("a handler thread has exited"),
            });
        }
        Ok(())
    }
}
