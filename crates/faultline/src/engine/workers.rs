//! N handler threads, pinned to CPUs, all polling one userfaultfd. A fault
//! belongs to the worker that owns its fault-around window (the aligned
//! block of the region's initial read-ahead window: `hash(region, block) % N`), so one page is only ever resolved by one
//! worker and concurrent faults on a window never race (seed 000's
//! "forwarding to other cores", seed 003 §6.1's affinity-aware fault
//! scheduling). A worker that reads a message for another worker's window
//! hands it over through that worker's inbox and eventfd.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use super::{EngineConfig, EngineKind, HandlerBody, ThreadCore, Threaded};
use crate::background::StopFlag;
use crate::error::{Error, Result};
use crate::fault::report::fail_closed;
use crate::fault::table::enter;
use faultline_sys::poll::poll_in;
use faultline_sys::rdtsc;
use faultline_sys::thread::{online_cpus, pin_to_cpu, EventFd};
use faultline_sys::uffd::Msg;

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
            let page = r.pages.index(addr);
            let window = (page / r.readahead.config().initial) as u64;
            let h = (r.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ window)
                .wrapping_mul(0xff51_afd7_ed55_8ccd);
            ((h >> 32) % n as u64) as usize
        }
        None => 0,
    }
}

impl WorkersEngine {
    /// With the default [`EngineConfig`] (one worker per CPU).
    pub fn new() -> Result<Arc<WorkersEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config` (`config.workers` threads).
    pub fn with_config(config: EngineConfig) -> Result<Arc<WorkersEngine>> {
        let n = config.workers.max(1);
        let core = ThreadCore::new(config)?;
        let mut inboxes = Vec::new();
        for _ in 0..n {
            inboxes.push(Arc::new(Inbox {
                queue: Mutex::new(VecDeque::new()),
                bell: EventFd::new().map_err(|e| Error::Io {
                    op: "eventfd",
                    source: e,
                })?,
            }));
        }
        let inboxes = Arc::new(inboxes);
        let mut slots = Vec::new();
        let mut bodies: Vec<HandlerBody> = Vec::new();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*core.uffd);
        let ncpu = online_cpus();
        for me in 0..n {
            let mut h = core.handler(&mut slots);
            let (wake, inboxes) = (core.wake.clone(), inboxes.clone());
            let counters = core.counters.clone();
            let pin = core.config.pin;
            bodies.push(Box::new(move |stop: &StopFlag| {
                if pin {
                    let _ = pin_to_cpu(me % ncpu);
                }
                let mine = inboxes[me].clone();
                let mut rev = [0i16; 3];
                let mut local = VecDeque::new();
                while !stop.is_set() {
                    let timeout = h.timeout_ms(1000);
                    if let Err(e) = poll_in(&[fd, mine.bell.raw(), wake.raw()], timeout, &mut rev) {
                        fail_closed(|w| {
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

impl Threaded for WorkersEngine {
    const KIND: EngineKind = EngineKind::Workers;
    fn core(&self) -> &ThreadCore {
        &self.core
    }
}
