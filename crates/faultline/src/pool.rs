//! Frame pools: page frames prepared off the fault path, installed by the
//! fault with `UFFDIO_MOVE` (seed 004's MFOE, in software).
//!
//! ```text
//!   refill thread (other CPU)            faulting thread
//!   ─────────────────────────            ───────────────
//!   MADV_POPULATE_WRITE slots  ──ready──► take(n) ─► [fill from store] ─► UFFDIO_MOVE
//!   [prepared ... next+slots)             slots [next, next+n)             (zero-copy)
//! ```
//!
//! The pool is a ring of `slots` frames in one private anonymous mapping.
//! `next` counts frames taken, `prepared` frames populated; ring index `i`
//! is ready while `next <= i < prepared`. Each slot also has a state,
//!
//! ```text
//!   HOLE ──refill (madvise)──► READY ──take (CAS on next)──► TAKEN ──move/discard──► HOLE
//! ```
//!
//! and a refill only populates slots that are HOLEs, so a slot taken by a
//! slow fault (still filling or moving it) is never re-prepared and handed
//! to a second fault. Taking is one CAS on `next`; refilling populates the
//! run of holes from `prepared` on with one `madvise` per contiguous run. The
//! fault path refills inline only when the ring runs dry and no one else
//! is refilling; with `background`, a thread keeps the ring at least half
//! full so allocation and zeroing never happen on the fault path.
//!
//! With `huge`, each slot is a 2 MiB transparent huge page (the mapping is
//! `MADV_HUGEPAGE`, 2 MiB aligned). A fault whose fault-around window is a
//! whole aligned 2 MiB of absent pages moves the huge page in with one
//! PMD-level MOVE (about 1.2 us for 512 pages here); other faults fall back
//! to COPY.
//!
//! Frames are `MADV_DONTFORK`: a forked child sharing them would make MOVE
//! fail with EBUSY. Frames handed back after a failed MOVE are zapped, so a
//! reused frame always starts as a fresh zero page, never with stale data.

use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Acquire, Ordering::Relaxed,
    Ordering::SeqCst,
};
use std::sync::Arc;
use std::time::Duration;

use crate::background::Background;
use crate::error::{Error, Result};
use crate::page::PageSize;
use faultline_sys::mem::{self, Advice, Mapping};

/// A huge frame: one 2 MiB transparent huge page.
const HUGE: usize = PageSize::HUGE_2M.bytes();

/// How a region's frame pool is built.
#[derive(Debug, Clone)]
pub struct FramePoolConfig {
    /// Capacity in region pages.
    pub pages: usize,
    /// 2 MiB transparent huge frames (region page size must divide 2 MiB and
    /// fault-around must cover 2 MiB).
    pub huge: bool,
    /// A background thread keeps the pool at least half full.
    pub background: bool,
}

impl Default for FramePoolConfig {
    fn default() -> Self {
        FramePoolConfig {
            pages: 64,
            huge: false,
            background: false,
        }
    }
}

/// Pool counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FramePoolStats {
    /// Takes that got frames.
    pub hits: u64,
    /// Takes that found the pool dry (the fault fell back to COPY).
    pub misses: u64,
    /// Refill passes (inline or background).
    pub refills: u64,
    /// Frames populated by refills.
    pub frames_prepared: u64,
}

const HOLE: u8 = 0;
const READY: u8 = 1;
const TAKEN: u8 = 2;

struct Inner {
    map: Mapping,
    state: Box<[AtomicU8]>,
    slot_bytes: usize,
    slot_pages: usize,
    slots: usize,
    next: AtomicUsize,
    prepared: AtomicUsize,
    refilling: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    refills: AtomicU64,
    frames_prepared: AtomicU64,
}

/// Frames taken from a pool.
pub(crate) struct Slots {
    pub addr: u64,
    /// Region pages covered.
    pub pages: usize,
}

/// A region's frame pool. See the module docs.
pub(crate) struct FramePool {
    inner: Arc<Inner>,
    refiller: Option<Background>,
}

impl FramePool {
    /// A pool for a region of `page_size` pages whose faults install
    /// aligned windows of `fault_around` pages.
    pub fn new(
        cfg: FramePoolConfig,
        page_size: PageSize,
        fault_around: usize,
    ) -> Result<FramePool> {
        let ps = page_size.bytes();
        let (slot_bytes, slot_pages) = if cfg.huge {
            if page_size > PageSize::HUGE_2M || !(fault_around * ps).is_multiple_of(HUGE) {
                return Err(Error::BadPageSize {
                    page_size: ps,
                    reason: "huge frames need a page size dividing 2 MiB and fault-around covering whole 2 MiB",
                });
            }
            (HUGE, HUGE / ps)
        } else {
            (ps, 1)
        };
        let slots = cfg.pages.div_ceil(slot_pages).max(1);
        let map = if cfg.huge {
            Mapping::anon_aligned(slots * slot_bytes, HUGE)?
        } else {
            Mapping::anon(slots * slot_bytes)?
        };
        let thp = if cfg.huge {
            Advice::HugePage
        } else {
            Advice::NoHugePage
        };
        map.advise(0, map.len(), thp)?;
        map.advise(0, map.len(), Advice::DontFork)?;
        let inner = Arc::new(Inner {
            map,
            state: (0..slots).map(|_| AtomicU8::new(HOLE)).collect(),
            slot_bytes,
            slot_pages,
            slots,
            next: AtomicUsize::new(0),
            prepared: AtomicUsize::new(0),
            refilling: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            refills: AtomicU64::new(0),
            frames_prepared: AtomicU64::new(0),
        });
        if !inner.refill() {
            return Err(Error::Io {
                op: "populating the frame pool",
                source: std::io::Error::last_os_error(),
            });
        }
        let refiller = if cfg.background {
            let inner = inner.clone();
            Some(
                Background::spawn("fl-frame-refill", move |stop| {
                    while !stop.is_set() {
                        let ready = inner
                            .prepared
                            .load(Acquire)
                            .saturating_sub(inner.next.load(Acquire));
                        if ready * 2 < inner.slots {
                            inner.refill();
                        } else {
                            std::thread::park_timeout(Duration::from_micros(100));
                        }
                    }
                })
                .map_err(|e| Error::Io {
                    op: "spawn frame refill thread",
                    source: e,
                })?,
            )
        } else {
            None
        };
        Ok(FramePool { inner, refiller })
    }

    /// Takes frames for up to `want` region pages: whole slots only, no
    /// wrap. Async-signal-safe (refills inline with one `madvise` when dry).
    pub fn take(&self, want: usize) -> Option<Slots> {
        let p = &*self.inner;
        let want_slots = want / p.slot_pages;
        if want_slots == 0 {
            return None;
        }
        for round in 0..2 {
            let mut cur = p.next.load(Relaxed);
            loop {
                let ready = p.prepared.load(Acquire).saturating_sub(cur);
                let to_wrap = p.slots - cur % p.slots;
                let n = want_slots.min(ready).min(to_wrap);
                if n == 0 {
                    break;
                }
                match p.next.compare_exchange_weak(cur, cur + n, SeqCst, Relaxed) {
                    Ok(_) => {
                        for i in cur..cur + n {
                            p.state[i % p.slots].store(TAKEN, SeqCst);
                        }
                        p.hits.fetch_add(1, Relaxed);
                        return Some(Slots {
                            addr: p.map.addr() + ((cur % p.slots) * p.slot_bytes) as u64,
                            pages: n * p.slot_pages,
                        });
                    }
                    Err(c) => cur = c,
                }
            }
            // Dry: refill inline unless the background thread is at it.
            if round == 0 && (self.refiller.is_some() || !p.refill()) {
                break;
            }
        }
        p.misses.fetch_add(1, Relaxed);
        None
    }

    /// Region pages per frame (1, or 2 MiB / page size for huge frames).
    pub fn slot_pages(&self) -> usize {
        self.inner.slot_pages
    }

    /// Zaps frames whose pages were not (all) moved, so reuse starts from
    /// a fresh page, and returns them to the refiller.
    pub fn discard(&self, s: Slots) {
        let p = &*self.inner;
        let bytes = s.pages / p.slot_pages * p.slot_bytes;
        let _ = mem::madvise(s.addr, bytes, Advice::DontNeed);
        self.finish(s);
    }

    /// Returns moved-away frames (now holes) to the refiller.
    pub fn finish(&self, s: Slots) {
        let p = &*self.inner;
        let first = ((s.addr - p.map.addr()) as usize) / p.slot_bytes;
        for i in first..first + s.pages / p.slot_pages {
            p.state[i].store(HOLE, SeqCst);
        }
    }

    /// Counters.
    pub fn stats(&self) -> FramePoolStats {
        let p = &*self.inner;
        FramePoolStats {
            hits: p.hits.load(Relaxed),
            misses: p.misses.load(Relaxed),
            refills: p.refills.load(Relaxed),
            frames_prepared: p.frames_prepared.load(Relaxed),
        }
    }
}

impl Inner {
    /// Populates the run of finished holes from `prepared` up to
    /// `next + slots`; false if another refill is running or a populate
    /// failed.
    fn refill(&self) -> bool {
        if self.refilling.swap(true, SeqCst) {
            return false;
        }
        let start = self.prepared.load(SeqCst);
        let end = self.next.load(SeqCst) + self.slots;
        let mut i = start;
        let mut ok = true;
        while ok && i < end {
            // The contiguous run of holes from ring index i (no wrap).
            let slot = i % self.slots;
            let mut run = 0;
            while i + run < end
                && slot + run < self.slots
                && self.state[slot + run].load(SeqCst) == HOLE
            {
                run += 1;
            }
            if run == 0 {
                break; // a slow fault still holds this slot
            }
            ok = mem::madvise(
                self.map.addr() + (slot * self.slot_bytes) as u64,
                run * self.slot_bytes,
                Advice::PopulateWrite,
            )
            .is_ok();
            if ok {
                for k in slot..slot + run {
                    self.state[k].store(READY, SeqCst);
                }
                i += run;
                self.prepared.store(i, SeqCst);
                self.frames_prepared.fetch_add(run as u64, Relaxed);
            }
        }
        self.refills.fetch_add(1, Relaxed);
        self.refilling.store(false, SeqCst);
        ok
    }
}
