//! The writer side: [`Watcher`] and its builder, and how watches become
//! armed pages.
//!
//! 1. A small aligned watch takes a free debug register first
//!    ([`crate::hw`]), if the builder allows it.
//! 2. Otherwise every page of the range is validated before anything
//!    changes: its mapping is found in `/proc/self/maps` and, on first use,
//!    registered with the watcher's userfaultfd in write-protect mode, or
//!    armed with `mprotect` when userfaultfd does not apply (file-backed
//!    private memory, or [`WatcherBuilder::exact`]).
//! 3. The range joins the merged range tree; each page it touches gets a
//!    new set of watched ranges (the old set is retired and freed after a
//!    grace period, as handlers may still read it).
//! 4. Pages that now hold watched bytes are armed, pages that no longer do
//!    are disarmed.
//!
//! `unwatch`, `enable` and `disable` recompute the same way. All of it
//! runs under the writer mutex and refuses to run inside the callback.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Mutex;

use faultline_sys::mem::{Advice, Mapping, Prot};
use faultline_sys::uffd::{feature, register_mode};
use faultline_sys::Errno;

use crate::error::{sys_err, WatchError};
use crate::handler;
use crate::hit::{Callback, Hit, PageStat, Stats};
use crate::hw;
use crate::maps;
use crate::state::{read_small, Armable, HwEntry, HwWatch, Inner, Shared, Writer};
use crate::table::{page_of, Arena, PageEntry, Pages, RangeTree, Retired, Tier, PAGE};

/// Configures a [`Watcher`].
pub struct WatcherBuilder {
    callback: Option<Callback>,
    exact: bool,
    hardware: bool,
    classify: bool,
    trace: bool,
    interpret: bool,
}

impl WatcherBuilder {
    /// The function called on every hit (see the crate docs for its
    /// rules). Without one, hits are only counted.
    pub fn on_hit(mut self, f: impl Fn(&Hit) + Send + Sync + 'static) -> Self {
        self.callback = Some(Box::new(f));
        self
    }
    /// Arm anonymous memory with `mprotect` (stores through
    /// `/proc/self/mem`) instead of uffd write-protect, so that no page is
    /// ever writable while armed and writes racing from other threads are
    /// never missed. Splits VMAs.
    pub fn exact(mut self, yes: bool) -> Self {
        self.exact = yes;
        self
    }
    /// Use CPU debug registers for up to 4 small aligned watches
    /// (default on).
    pub fn hardware(mut self, yes: bool) -> Self {
        self.hardware = yes;
        self
    }
    /// Look the written bytes up in the watch list (default on). Off, every
    /// fault is emulated and counted but nothing is reported: the
    /// "no lookup" configuration of the thesis's tables.
    pub fn classify(mut self, yes: bool) -> Self {
        self.classify = yes;
        self
    }
    /// After emulating the faulting store, keep interpreting the
    /// following instructions while they keep touching protected pages
    /// (default on): a loop writing a watched page then costs one signal per
    /// run instead of one per store. Every store still goes through the
    /// emulator (and is reported); registers, flags and memory are exactly
    /// what native execution gives.
    pub fn interpret(mut self, yes: bool) -> Self {
        self.interpret = yes;
        self
    }
    /// Record TSC timestamps of the last fault's phases
    /// ([`Watcher::last_trace`]); for benchmarks.
    pub fn trace(mut self, yes: bool) -> Self {
        self.trace = yes;
        self
    }
    /// Creates the watcher (installs the signal handlers on first use).
    pub fn build(self) -> Result<Watcher, WatchError> {
        Watcher::create(self)
    }
}

/// Watches byte ranges of this process's memory. See the crate docs.
pub struct Watcher {
    inner: Box<Inner>,
}

/// Memory from [`Watcher::alloc`]: memfd pages mapped twice, so emulated
/// stores go through the second mapping and the watched mapping is never
/// writable while armed.
pub struct WatchedMem<'w> {
    watcher: &'w Watcher,
    main: Mapping,
    _alias: Mapping,
    _fd: OwnedFd,
}

impl WatchedMem<'_> {
    /// Start of the (watchable) memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.main.as_ptr()
    }
    /// Its address.
    pub fn addr(&self) -> u64 {
        self.main.addr()
    }
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.main.len()
    }
    /// Whether it is empty (never: `alloc` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.main.is_empty()
    }
}

impl Drop for WatchedMem<'_> {
    fn drop(&mut self) {
        let (s, e) = (self.main.addr(), self.main.addr() + self.main.len() as u64);
        let _ = self.watcher.unwatch(s, self.main.len());
        let mut w = self.watcher.inner.lock_writer();
        w.known.retain(|a| !(a.start == s && a.end == e));
        w.registered.retain(|&(rs, re)| !(rs == s && re == e));
        let _ = self.watcher.inner.uffd.unregister(s, e - s);
    }
}

static ACTIVE_LOCK: Mutex<bool> = Mutex::new(false);

impl Watcher {
    /// A builder with the defaults: no callback, uffd arming for anonymous
    /// memory, debug registers on, lookup on.
    pub fn builder() -> WatcherBuilder {
        WatcherBuilder {
            callback: None,
            exact: false,
            hardware: true,
            classify: true,
            trace: false,
            interpret: true,
        }
    }

    /// A watcher calling `f` on every hit.
    pub fn new(f: impl Fn(&Hit) + Send + Sync + 'static) -> Result<Watcher, WatchError> {
        Self::builder().on_hit(f).build()
    }

    fn create(b: WatcherBuilder) -> Result<Watcher, WatchError> {
        let mut active = ACTIVE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        if *active {
            return Err(WatchError::AlreadyActive);
        }
        let rt = handler::runtime()?;
        let uffd = faultline::caps::open_uffd(false, feature::SIGBUS | feature::WP_UNPOPULATED)?;
        let mem_fd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .map_err(|e| WatchError::Sys {
                op: "open /proc/self/mem",
                addr: 0,
                source: e,
            })?;
        let arena = Arena::new().map_err(|e| WatchError::Sys {
            op: "mmap arena",
            addr: 0,
            source: e,
        })?;
        let shared = arena
            .alloc(Shared {
                faults: AtomicU64::new(0),
                hits: AtomicU64::new(0),
                false_positives: AtomicU64::new(0),
                emulated: AtomicU64::new(0),
                single_stepped: AtomicU64::new(0),
                interpreted: AtomicU64::new(0),
                hw_hits: AtomicU64::new(0),
                suppressed: AtomicU64::new(0),
                handler_cycles: AtomicU64::new(0),
                trace: Default::default(),
                hw: std::array::from_fn(|_| HwWatch {
                    active: AtomicBool::new(false),
                    addr: AtomicU64::new(0),
                    len: AtomicU64::new(0),
                    shadow: AtomicU64::new(0),
                }),
            })
            .map_err(|e| WatchError::Sys {
                op: "mmap arena",
                addr: 0,
                source: e,
            })?;
        let inner = Box::new(Inner {
            pages: Pages::new(),
            shared,
            uffd,
            mem_fd: mem_fd.into(),
            callback: b.callback,
            classify: b.classify,
            trace: b.trace,
            interpret: b.interpret,
            writer: Mutex::new(Writer {
                tree: RangeTree::default(),
                entries: 0,
                known: Vec::new(),
                registered: Vec::new(),
                hw: Vec::new(),
                enabled: true,
                exact: b.exact,
                hardware: b.hardware,
                armed: 0,
            }),
            hw: hw::HwSlots::new(),
            arena,
        });
        rt.active
            .store(&*inner as *const Inner as *mut Inner, SeqCst);
        *active = true;
        Ok(Watcher { inner })
    }

    /// Watches `[addr, addr + len)`: every later write to one of these
    /// bytes is reported. Overlapping and adjacent watches merge.
    pub fn watch(&self, addr: u64, len: usize) -> Result<(), WatchError> {
        self.inner.watch(addr, len)
    }

    /// Watches the bytes of `*value`.
    pub fn watch_value<T>(&self, value: &T) -> Result<(), WatchError> {
        self.watch(value as *const T as u64, std::mem::size_of::<T>().max(1))
    }

    /// Stops watching `[addr, addr + len)` (splitting watches that straddle
    /// it). Pages left without watched bytes are un-protected.
    pub fn unwatch(&self, addr: u64, len: usize) -> Result<(), WatchError> {
        self.inner.unwatch(addr, len)
    }

    /// Un-protects every page (watches are kept; writes are not reported)
    /// until [`Watcher::enable`].
    pub fn disable(&self) -> Result<(), WatchError> {
        self.inner.set_enabled(false)
    }

    /// Re-arms every watch after [`Watcher::disable`].
    pub fn enable(&self) -> Result<(), WatchError> {
        self.inner.set_enabled(true)
    }

    /// `len` bytes of memfd memory mapped twice (see [`WatchedMem`]):
    /// the fastest and exact tier.
    pub fn alloc(&self, len: usize) -> Result<WatchedMem<'_>, WatchError> {
        self.inner.check_reentrant()?;
        if len == 0 {
            return Err(WatchError::ZeroLength);
        }
        let len = len.div_ceil(PAGE as usize) * PAGE as usize;
        let map = |op| {
            move |e: faultline_sys::mem::MemError| WatchError::Sys {
                op,
                addr: 0,
                source: e.source,
            }
        };
        let fd =
            faultline_sys::mem::memfd("faultline-watch", false).map_err(map("memfd_create"))?;
        faultline_sys::mem::ftruncate(&fd, len as u64).map_err(map("ftruncate"))?;
        let main = Mapping::shared(&fd, len, 0).map_err(map("mmap"))?;
        let alias = Mapping::shared(&fd, len, 0).map_err(map("mmap alias"))?;
        let _ = main.advise(0, len, Advice::NoHugePage);
        let (s, e) = (main.addr(), main.addr() + len as u64);
        self.inner
            .uffd
            .register(s, len as u64, register_mode::WP)
            .map_err(|e| WatchError::Sys {
                op: "UFFDIO_REGISTER",
                addr: s,
                source: e.source,
            })?;
        let mut w = self.inner.lock_writer();
        w.registered.push((s, e));
        w.known.push(Armable {
            start: s,
            end: e,
            tier: Tier::Alias,
            prot: Prot::READ_WRITE,
            alias_delta: alias.addr().wrapping_sub(s),
        });
        drop(w);
        Ok(WatchedMem {
            watcher: self,
            main,
            _alias: alias,
            _fd: fd,
        })
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        let s = self.inner.shared;
        let w = self.inner.lock_writer();
        Stats {
            faults: s.faults.load(Relaxed),
            hits: s.hits.load(Relaxed),
            false_positives: s.false_positives.load(Relaxed),
            emulated: s.emulated.load(Relaxed),
            single_stepped: s.single_stepped.load(Relaxed),
            interpreted: s.interpreted.load(Relaxed),
            hw_hits: s.hw_hits.load(Relaxed),
            suppressed: s.suppressed.load(Relaxed),
            handler_cycles: s.handler_cycles.load(Relaxed),
            pages_armed: w.armed,
            ranges: (w.tree.len() + w.hw.len()) as u64,
            hw_watches: w.hw.len() as u64,
        }
    }

    /// Per-page counters of every page that has held a watch.
    pub fn page_stats(&self) -> Vec<PageStat> {
        let _w = self.inner.lock_writer();
        let mut v: Vec<PageStat> = self
            .inner
            .pages
            .entries()
            .into_iter()
            .map(|e| PageStat {
                page: e.page,
                armed: e.tier() != Tier::Off,
                hits: e.hits.load(Relaxed),
                false_positives: e.false_positives.load(Relaxed),
            })
            .collect();
        v.sort_by_key(|p| p.page);
        v
    }

    /// TSC timestamps of the last fault handled with tracing on: handler
    /// entry, after the watch-list lookup, after the store, handler exit.
    pub fn last_trace(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.inner.shared.trace[i].load(SeqCst))
    }

    /// The watched ranges (page-tier and debug-register ones), sorted.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let w = self.inner.lock_writer();
        let mut v: Vec<(u64, u64)> = w.tree.iter().collect();
        v.extend(w.hw.iter().map(|h| (h.addr, h.addr + h.len)));
        v.sort();
        v
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let inner = &*self.inner;
        let _ = inner.set_enabled(false);
        {
            let mut w = inner.lock_writer();
            for h in w.hw.drain(..) {
                let _ = inner.hw.disarm(h.slot);
            }
            for (s, e) in w.registered.drain(..) {
                let _ = inner.uffd.unregister(s, e - s);
            }
        }
        let rt = handler::runtime().expect("created with the watcher");
        rt.active.store(std::ptr::null_mut(), SeqCst);
        // Handlers that found the watcher before it was unpublished are
        // gone after this.
        rt.grace.synchronize();
        *ACTIVE_LOCK.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }
}

impl Inner {
    fn lock_writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_reentrant(&self) -> Result<(), WatchError> {
        if handler::in_handler() {
            return Err(WatchError::Reentrant);
        }
        Ok(())
    }

    fn check_range(&self, addr: u64, len: usize) -> Result<u64, WatchError> {
        self.check_reentrant()?;
        if len == 0 {
            return Err(WatchError::ZeroLength);
        }
        let end = addr.checked_add(len as u64).ok_or(WatchError::Wraps {
            addr,
            len: len as u64,
        })?;
        if self.arena.overlaps(addr, end) || handler::runtime_overlaps(addr, end) {
            return Err(WatchError::Unsupported {
                addr,
                reason: "the watcher's own bookkeeping lives there".into(),
            });
        }
        Ok(end)
    }

    fn watch(&self, addr: u64, len: usize) -> Result<(), WatchError> {
        let end = self.check_range(addr, len)?;
        let mut w = self.lock_writer();
        // Debug registers for a small aligned watch, if one is free and the
        // bytes are not watched already.
        if w.hardware
            && hw::HwSlots::fits(addr, len as u64)
            && w.hw.len() < hw::HwSlots::MAX
            && !w.tree.overlaps(addr, end)
            && !w.hw.iter().any(|h| h.addr < end && addr < h.addr + h.len)
        {
            if let Some(i) = self.shared.hw.iter().position(|h| !h.active.load(SeqCst)) {
                // Validate that the memory is ours to watch first.
                self.armable(&mut w, addr)?;
                let h = &self.shared.hw[i];
                h.addr.store(addr, SeqCst);
                h.len.store(len as u64, SeqCst);
                // SAFETY: `addr..end` is mapped and writable (checked by
                // `armable`); a racy read of plain data is what a debugger
                // does too.
                h.shadow.store(unsafe { read_small(addr, len) }, SeqCst);
                h.active.store(true, SeqCst);
                match self.hw.arm(addr, len as u64, i as u64) {
                    Ok(slot) => {
                        w.hw.push(HwEntry {
                            addr,
                            len: len as u64,
                            slot,
                        });
                        return Ok(());
                    }
                    Err(_) => {
                        // No debug register after all (e.g. another user of
                        // perf): fall back to page protection.
                        h.active.store(false, SeqCst);
                    }
                }
            }
        }
        // Validate every page before changing anything.
        let mut plan = Vec::new();
        let mut p = page_of(addr);
        while p < end {
            let a = self.armable(&mut w, p)?;
            plan.push((p, a));
            p += PAGE;
        }
        w.tree.insert(addr, end);
        self.refresh(&mut w, &plan)
    }

    fn unwatch(&self, addr: u64, len: usize) -> Result<(), WatchError> {
        let end = self.check_range(addr, len)?;
        let mut w = self.lock_writer();
        let mut keep = Vec::new();
        let mut i = 0;
        while i < w.hw.len() {
            let h = &w.hw[i];
            if h.addr < end && addr < h.addr + h.len {
                let h = w.hw.remove(i);
                let _ = self.hw.disarm(h.slot);
                for s in &self.shared.hw {
                    if s.active.load(SeqCst) && s.addr.load(SeqCst) == h.addr {
                        s.active.store(false, SeqCst);
                    }
                }
                // Parts outside the unwatched range stay watched.
                if h.addr < addr {
                    keep.push((h.addr, addr));
                }
                if h.addr + h.len > end {
                    keep.push((end, h.addr + h.len));
                }
            } else {
                i += 1;
            }
        }
        w.tree.remove(addr, end);
        let mut plan = Vec::new();
        let mut p = page_of(addr);
        while p < end {
            if let Some(a) = w.known.iter().find(|a| a.start <= p && p < a.end) {
                plan.push((p, *a));
            } else if let Some(e) = self.pages.get(p) {
                // Not re-resolvable (mapping gone): just disarm.
                let a = Armable {
                    start: p,
                    end: p + PAGE,
                    tier: e.tier(),
                    prot: e.prot(),
                    alias_delta: e.alias_delta.load(Relaxed),
                };
                plan.push((p, a));
            }
            p += PAGE;
        }
        self.refresh(&mut w, &plan)?;
        drop(w);
        for (s, e) in keep {
            self.watch(s, (e - s) as usize)?;
        }
        Ok(())
    }

    /// How page `p` can be armed, registering its mapping with our
    /// userfaultfd on first use.
    fn armable(&self, w: &mut Writer, p: u64) -> Result<Armable, WatchError> {
        if let Some(a) = w.known.iter().find(|a| a.start <= p && p < a.end) {
            return Ok(*a);
        }
        let maps = maps::read_maps().map_err(|e| WatchError::Sys {
            op: "read /proc/self/maps",
            addr: p,
            source: e,
        })?;
        let v = maps::find(&maps, p).ok_or(WatchError::NotMapped { addr: p })?;
        if !v.write {
            return Err(WatchError::NotWritable {
                addr: p,
                path: if v.path.is_empty() {
                    "anonymous".into()
                } else {
                    v.path.clone()
                },
            });
        }
        let sp: u64;
        // SAFETY: reads the stack pointer; no memory access.
        unsafe {
            std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
        };
        if v.start <= sp && sp < v.end {
            return Err(WatchError::Unsupported {
                addr: p,
                reason: "the calling thread's stack (the kernel writes signal frames there)".into(),
            });
        }
        if v.path == "[stack]" {
            return Err(WatchError::Unsupported {
                addr: p,
                reason: "the main thread's stack (the kernel writes signal frames there)".into(),
            });
        }
        let mut a = Armable {
            start: v.start,
            end: v.end,
            tier: Tier::Mprotect,
            prot: v.prot(),
            alias_delta: 0,
        };
        if !w.exact || v.shared {
            match self
                .uffd
                .register(v.start, v.end - v.start, register_mode::WP)
            {
                Ok(_) => {
                    w.registered.push((v.start, v.end));
                    a.tier = Tier::Uffd;
                }
                Err(e) if e.is(Errno::EBUSY) => {
                    return Err(WatchError::Unsupported {
                        addr: p,
                        reason: "the mapping is registered with another userfaultfd (a faultline Region?)".into(),
                    });
                }
                Err(e) if e.is(Errno::EINVAL) && !v.shared => {
                    // File-backed private memory: uffd-wp does not apply.
                }
                Err(e) => {
                    return Err(WatchError::Sys {
                        op: "UFFDIO_REGISTER",
                        addr: p,
                        source: e.source,
                    })
                }
            }
        }
        if a.tier == Tier::Mprotect && v.shared {
            return Err(WatchError::Unsupported {
                addr: p,
                reason: format!("shared file mapping {} (writes through /proc/self/mem would need a writable mapping)", v.path),
            });
        }
        w.known.push(a);
        Ok(a)
    }

    /// Recomputes the range sets of the planned pages from the tree and
    /// arms or disarms them.
    fn refresh(&self, w: &mut Writer, plan: &[(u64, Armable)]) -> Result<(), WatchError> {
        let mut retired = Retired::default();
        let mut result = Ok(());
        for &(p, a) in plan {
            let items = w.tree.clipped(p, p + PAGE);
            let e = match self
                .pages
                .get_or_insert(p, &self.arena, &mut w.entries, &mut retired)
            {
                Ok(e) => e,
                Err(err) => {
                    result = Err(WatchError::Sys {
                        op: "mmap arena",
                        addr: p,
                        source: err,
                    });
                    break;
                }
            };
            let want = !items.is_empty() && w.enabled;
            self.pages.set_ranges(e, items, &mut retired);
            let armed = e.tier() != Tier::Off;
            if want && !armed {
                if let Err(err) = self.arm(e, a) {
                    result = Err(err);
                    break;
                }
                w.armed += 1;
            } else if !want && armed {
                if let Err(err) = self.disarm(e) {
                    result = Err(err);
                    break;
                }
                w.armed -= 1;
            }
        }
        self.pages.reclaim(&mut retired);
        result
    }

    fn arm(&self, e: &PageEntry, a: Armable) -> Result<(), WatchError> {
        e.alias_delta.store(a.alias_delta, Relaxed);
        e.set_prot(a.prot);
        // Publish the tier first: a fault that races the protection finds
        // the page armed.
        e.tier.store(a.tier as u32, Release);
        let r = self
            .protect(e, a.tier, true)
            .map_err(|(op, errno)| sys_err(op, e.page, errno));
        if r.is_err() {
            e.tier.store(Tier::Off as u32, Release);
        }
        r
    }

    fn disarm(&self, e: &PageEntry) -> Result<(), WatchError> {
        // The page lock waits out a single-step in progress on this page.
        e.lock();
        let r = self
            .protect(e, e.tier(), false)
            .map_err(|(op, errno)| sys_err(op, e.page, errno));
        // A mapping that was unmapped under us has nothing left to disarm.
        let gone = matches!(&r, Err(WatchError::Sys { source, .. })
            if matches!(Errno::of(source), Some(Errno::ENOENT | Errno::ENOMEM | Errno::EINVAL)));
        if r.is_ok() || gone {
            e.tier.store(Tier::Off as u32, Release);
        }
        e.unlock();
        if gone {
            Ok(())
        } else {
            r
        }
    }

    fn set_enabled(&self, on: bool) -> Result<(), WatchError> {
        self.check_reentrant()?;
        let mut w = self.lock_writer();
        if w.enabled == on {
            return Ok(());
        }
        w.enabled = on;
        let mut plan = Vec::new();
        for e in self.pages.entries() {
            let p = e.page;
            let a = w.known.iter().find(|a| a.start <= p && p < a.end).copied();
            match a {
                Some(a) => plan.push((p, a)),
                None if e.tier() != Tier::Off => {
                    let _ = self.disarm(e);
                    w.armed -= 1;
                }
                None => {}
            }
        }
        self.refresh(&mut w, &plan)
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Watcher>();
};
