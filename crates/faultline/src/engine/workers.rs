//! N handler threads, pinned to CPUs, all polling one userfaultfd. A fault
//! belongs to the worker that owns its fault-around window
//! (`hash(region, window) % N`), so one page is only ever resolved by one
//! worker and concurrent faults on a window never race (seed 000's
//! "forwarding to other cores", seed 003 §6.1's affinity-aware fault
//! scheduling). A worker that reads a message for another worker's window
//! hands it over through that worker's inbox and eventfd.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, Mutex};

use super::{Engine, EngineConfig, EngineKind, EngineStats, ThreadCore};
use crate::region::enter;
use crate::sys::rdtsc;
use crate::sys::thread::{poll_in, EventFd};
use crate::sys::uffd::{Msg, Uffd};

struct Inbox {
    queue: Mutex<VecDeque<(u64, u64, u64)>>,
    bell: EventFd,
}

/// Pinned, sharded worker threads. See the module docs.
pub struct WorkersEngine {
    core: ThreadCore,
    workers: usize,
}

fn shard_of(addr: u64, n: usize) -> usize {
    match enter(addr) {
        Some(r) => {
            let page = (addr - r.base) / r.page_size as u64;
            let window = page / r.fault_around.max(1) as u64;
            let h = (r.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ window)
                .wrapping_mul(0xff51_afd7_ed55_8ccd);
            ((h >> 32) % n as u64) as usize
        }
        None => 0,
    }
}

impl WorkersEngine {
    /// With the default [`EngineConfig`] (one worker per CPU).
    pub fn new() -> crate::Result<Arc<WorkersEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config` (`config.workers` threads).
    pub fn with_config(config: EngineConfig) -> crate::Result<Arc<WorkersEngine>> {
        let n = config.workers.max(1);
        let core = ThreadCore::new(config, true)?;
        let mut inboxes = Vec::new();
        for _ in 0..n {
            inboxes.push(Arc::new(Inbox {
                queue: Mutex::new(VecDeque::new()),
                bell: EventFd::new().map_err(|e| crate::Error::Io {
                    op: "eventfd",
                    source: e,
                })?,
            }));
        }
        let inboxes = Arc::new(inboxes);
        let mut slots = Vec::new();
        let mut bodies: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*core.uffd);
        let ncpu = crate::sys::thread::online_cpus();
        for me in 0..n {
            let mut h = core.handler(&mut slots);
            let (shutdown, wake, inboxes) =
                (core.shutdown.clone(), core.wake.clone(), inboxes.clone());
            let counters = core.counters.clone();
            let pin = core.config.pin;
            bodies.push(Box::new(move || {
                if pin {
                    let _ = crate::sys::thread::pin_to_cpu(me % ncpu);
                }
                let mine = inboxes[me].clone();
                let mut rev = [0i16; 3];
                let mut local = VecDeque::new();
                while !shutdown.load(SeqCst) {
                    let timeout = h.timeout_ms(1000);
                    if let Err(e) = poll_in(&[fd, mine.bell.raw(), wake.raw()], timeout, &mut rev) {
                        super::fail_closed(|w| {
                            use std::fmt::Write;
                            let _ = write!(w, "poll on the userfaultfd failed: {e}");
                        });
                    }
                    mine.bell.drain();
                    while h.read_batch(|h, m| match m {
                        Msg::PageFault { addr, flags, .. } => {
                            let t0 = rdtsc();
                            let owner = shard_of(addr, n);
                            if owner == me {
                                h.on_fault(addr, flags, t0);
                            } else {
                                counters.forwarded.fetch_add(1, Relaxed);
                                let ib = &inboxes[owner];
                                ib.queue
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push_back((addr, flags, t0));
                                ib.bell.notify();
                            }
                        }
                        other => h.on_msg(other),
                    }) > 0
                    {}
                    std::mem::swap(
                        &mut local,
                        &mut *mine.queue.lock().unwrap_or_else(|p| p.into_inner()),
                    );
                    while let Some((addr, flags, t0)) = local.pop_front() {
                        h.on_fault(addr, flags, t0);
                    }
                }
            }));
        }
        core.start("workers", bodies, slots)?;
        Ok(Arc::new(WorkersEngine { core, workers: n }))
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }
}

impl Engine for WorkersEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Workers
    }
    fn uffd(&self) -> &Arc<Uffd> {
        &self.core.uffd
    }
    fn scratch_bytes(&self) -> usize {
        self.core.config.scratch_bytes
    }
    fn stats(&self) -> EngineStats {
        self.core.counters.snapshot()
    }
    fn check_alive(&self) -> crate::Result<()> {
        self.core.check_alive()
    }
}
