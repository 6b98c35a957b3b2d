//! Fault-delivery engines: how a fault reaches the resolve path.
//!
//! All four engines share the resolve path (`resolve.rs`); they differ only in who runs
//! it and how that thread learns about the fault:
//!
//! ```text
//!  poll     app thread ──fault──► kernel queues msg, app thread sleeps
//!           handler thread: poll() wakes ─► read() ─► resolve ─► ioctl wakes app thread
//!  spin     same, but the handler never sleeps: read() in a loop
//!  workers  N poll-style threads on one fd; a fault is handled by the
//!           worker that owns its fault-around window (hand-off via eventfd)
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

mod poll;
mod signal;
mod spin;
mod threaded;
mod workers;

pub use poll::PollEngine;
pub use signal::SignalEngine;
pub use spin::SpinEngine;
pub use workers::WorkersEngine;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::sys::uffd::Uffd;

/// The four engines.
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
}

impl EngineKind {
    /// Every engine.
    pub const ALL: [EngineKind; 4] = [
        EngineKind::Poll,
        EngineKind::Spin,
        EngineKind::Signal,
        EngineKind::Workers,
    ];
    /// Name for reports and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Poll => "poll",
            EngineKind::Spin => "spin",
            EngineKind::Signal => "signal",
            EngineKind::Workers => "workers",
        }
    }
    /// Parses a name.
    pub fn from_name(s: &str) -> Option<EngineKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
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
    /// Pin handler threads to CPUs. Default true.
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
            workers: crate::sys::thread::online_cpus(),
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
/// [`SignalEngine`] and [`WorkersEngine`]; regions hold an `Arc<dyn Engine>`.
pub trait Engine: Send + Sync + 'static {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;
    /// The userfaultfd regions register with.
    fn uffd(&self) -> &Arc<Uffd>;
    /// Scratch bytes each handler has (see [`EngineConfig::scratch_bytes`]).
    fn scratch_bytes(&self) -> usize;
    /// Counters.
    fn stats(&self) -> EngineStats;
    /// Fails if the engine cannot take new regions (its threads are gone).
    fn check_alive(&self) -> crate::Result<()> {
        Ok(())
    }
    /// Called when a region starts using the engine.
    fn region_added(&self) {}
    /// Called when a region stops using the engine.
    fn region_removed(&self) {}
}

/// Creates an engine by kind with `config`.
pub fn create(kind: EngineKind, config: EngineConfig) -> crate::Result<Arc<dyn Engine>> {
    Ok(match kind {
        EngineKind::Poll => PollEngine::with_config(config)?,
        EngineKind::Spin => SpinEngine::with_config(config)?,
        EngineKind::Signal => SignalEngine::with_config(config)?,
        EngineKind::Workers => WorkersEngine::with_config(config)?,
    })
}

/// A fixed-size, allocation-free `fmt::Write` target for messages written
/// from signal handlers and dying threads.
pub struct StackWriter {
    buf: [u8; 1024],
    len: usize,
}

impl Default for StackWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl StackWriter {
    /// Empty.
    pub const fn new() -> Self {
        StackWriter {
            buf: [0; 1024],
            len: 0,
        }
    }
    /// The bytes written (truncated at 1 KiB).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for StackWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes `faultline: <what>` plus a newline to stderr, allocation-free.
pub(crate) fn report(f: impl FnOnce(&mut StackWriter)) {
    use std::fmt::Write;
    let mut w = StackWriter::new();
    let _ = w.write_str("faultline: ");
    f(&mut w);
    let _ = w.write_str("\n");
    crate::sys::write_stderr(w.as_bytes());
}

/// Prints a message and aborts: the fail-closed exit.
pub(crate) fn fail_closed(f: impl FnOnce(&mut StackWriter)) -> ! {
    report(|w| {
        f(w);
        use std::fmt::Write;
        let _ = w.write_str("; failing closed (abort)");
    });
    std::process::abort()
}

/// Feature bits every engine asks for when the kernel has them: memory
/// kinds beyond private anonymous, POISON and MOVE.
pub(crate) fn common_features() -> u64 {
    use crate::sys::uffd::feature::*;
    crate::caps::capabilities().features
        & (PAGEFAULT_FLAG_WP
            | MISSING_SHMEM
            | MINOR_SHMEM
            | MISSING_HUGETLBFS
            | MINOR_HUGETLBFS
            | POISON
            | MOVE)
}

/// What the thread engines share: the fd, shutdown, counters, watchdog.
pub(crate) struct ThreadCore {
    pub uffd: Arc<Uffd>,
    pub config: EngineConfig,
    pub counters: Arc<Counters>,
    pub shutdown: Arc<std::sync::atomic::AtomicBool>,
    pub wake: Arc<crate::sys::thread::EventFd>,
    pub epoch: std::time::Instant,
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    watchdog: std::sync::Mutex<Option<threaded::Watchdog>>,
}

impl ThreadCore {
    pub fn new(config: EngineConfig, nonblocking: bool) -> crate::Result<ThreadCore> {
        use crate::sys::uffd::feature::*;
        let uffd =
            crate::caps::open_uffd(nonblocking, EVENT_REMOVE | THREAD_ID | common_features())?;
        let wake = crate::sys::thread::EventFd::new().map_err(|e| crate::Error::Io {
            op: "eventfd",
            source: e,
        })?;
        Ok(ThreadCore {
            uffd: Arc::new(uffd),
            config,
            counters: Arc::new(Counters::default()),
            shutdown: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            wake: Arc::new(wake),
            epoch: std::time::Instant::now(),
            threads: std::sync::Mutex::new(Vec::new()),
            watchdog: std::sync::Mutex::new(None),
        })
    }

    /// A handler for one thread, with its watchdog slot.
    pub fn handler(&self, slots: &mut Vec<Arc<threaded::BusySlot>>) -> threaded::Handler {
        let slot = Arc::new(threaded::BusySlot::default());
        slots.push(slot.clone());
        threaded::Handler::new(
            self.uffd.clone(),
            self.counters.clone(),
            slot,
            self.epoch,
            self.config.scratch_bytes,
            self.config.batch,
        )
    }

    /// Starts `bodies` as handler threads and the watchdog over `slots`.
    pub fn start(
        &self,
        name: &'static str,
        bodies: Vec<Box<dyn FnOnce() + Send>>,
        slots: Vec<Arc<threaded::BusySlot>>,
    ) -> crate::Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for (i, body) in bodies.into_iter().enumerate() {
            let t =
                threaded::spawn_handler(format!("faultline-{name}-{i}"), body).map_err(|e| {
                    crate::Error::Io {
                        op: "spawn handler thread",
                        source: e,
                    }
                })?;
            threads.push(t);
        }
        if let Some(timeout) = self.config.stall_timeout {
            let w = threaded::Watchdog::spawn(name, slots, self.epoch, timeout).map_err(|e| {
                crate::Error::Io {
                    op: "spawn watchdog",
                    source: e,
                }
            })?;
            *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
        }
        Ok(())
    }

    /// Fails if a handler thread has exited.
    pub fn check_alive(&self) -> crate::Result<()> {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        if threads.iter().any(|t| t.is_finished()) {
            return Err(crate::Error::Io {
                op: "engine handler thread",
                source: std::io::Error::other("a handler thread has exited"),
            });
        }
        Ok(())
    }
}

impl Drop for ThreadCore {
    fn drop(&mut self) {
        self.shutdown
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.wake.notify();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        self.watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}
