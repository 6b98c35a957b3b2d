//! Memory access from the handlers ([`WatchMem`], the emulator's
//! [`Memory`]): where each emulated load and store goes.
//!
//! | page | load | store |
//! |---|---|---|
//! | protected (any tier) | directly (protection never stops reads) | through the tier: the memfd alias; `/proc/self/mem` with the page fenced read-only and its uffd protection lifted (uffd); `/proc/self/mem`, the kernel's forced write (mprotect) |
//! | not protected | `process_vm_readv` (fails instead of faulting) | refused: left to native execution |
//!
//! Each store is looked up in the page's watched ranges and reported
//! (bytes before and after, thread, IP); contiguous stores to an open uffd
//! page are coalesced into one forced write. Locked updates stay atomic:
//! a compare-and-swap on the alias, or load-compare-store under the page
//! lock that every writer of the page takes.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use faultline_sys::mem::{mprotect, process_vm_read, Prot};
use faultline_sys::rdtsc;
use faultline_sys::signal::SignalContext;

use super::runtime::{abort_with, deliver, Runtime, Slot, RUNTIME};
use crate::emulate::{MemFault, Memory};
use crate::hit::{Hit, HitPath};
use crate::state::Inner;
use crate::table::{page_of, PageEntry, Tier, PAGE};

/// Copies `data` to `dst` with one access of the native width when it is a
/// naturally aligned 1/2/4/8-byte store (so racing readers never see it
/// torn), bytewise otherwise.
///
/// # Safety
/// `dst..dst+data.len()` must be writable.
unsafe fn copy_native(dst: u64, data: &[u8]) {
    // SAFETY: the caller guarantees the destination; each arm writes
    // exactly `data.len()` bytes at an address aligned for its type.
    unsafe {
        match data.len() {
            1 => std::ptr::write_volatile(dst as *mut u8, data[0]),
            2 if dst.is_multiple_of(2) => {
                std::ptr::write_volatile(dst as *mut u16, u16::from_le_bytes([data[0], data[1]]))
            }
            4 if dst.is_multiple_of(4) => std::ptr::write_volatile(
                dst as *mut u32,
                u32::from_le_bytes(data.try_into().expect("4 bytes")),
            ),
            8 if dst.is_multiple_of(8) => std::ptr::write_volatile(
                dst as *mut u64,
                u64::from_le_bytes(data.try_into().expect("8 bytes")),
            ),
            _ => std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()),
        }
    }
}

/// Reads `out.len()` bytes at `src`, with one native-width access for an
/// aligned 1/2/4/8-byte read when `whole` (the chunk is the whole access).
///
/// # Safety
/// `src..src+out.len()` must be readable.
unsafe fn load_native(src: u64, out: &mut [u8], whole: bool) {
    // SAFETY: as in `copy_native`, reading.
    unsafe {
        match out.len() {
            2 if whole && src.is_multiple_of(2) => {
                out.copy_from_slice(&std::ptr::read_volatile(src as *const u16).to_le_bytes())
            }
            4 if whole && src.is_multiple_of(4) => {
                out.copy_from_slice(&std::ptr::read_volatile(src as *const u32).to_le_bytes())
            }
            8 if whole && src.is_multiple_of(8) => {
                out.copy_from_slice(&std::ptr::read_volatile(src as *const u64).to_le_bytes())
            }
            _ => std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), out.len()),
        }
    }
}

/// Reads our own memory without risking a fault: `process_vm_readv` fails
/// with EFAULT where a load would raise a signal.
pub(super) fn checked_read(src: u64, out: &mut [u8]) -> bool {
    let pid = RUNTIME.get().map_or(0, |r| r.pid.load(Relaxed));
    process_vm_read(pid, src, out) == Ok(out.len())
}

/// Where emulated accesses go: the alias, a briefly opened page, the
/// kernel's forced write, or (unwatched pages) straight to memory.
pub(super) struct WatchMem<'a> {
    inner: &'a Inner,
    slot: &'a Slot,
    /// The interrupted context, for the IP of each reported store.
    ctx: SignalContext,
    /// Unprotected pages read successfully during this handler.
    validated: [u64; 4],
    nvalid: usize,
    /// uffd pages opened for stores (entry addresses), closed on return.
    open: [usize; 4],
    nopen: usize,
    /// Contiguous stores to an open page not yet written (`flush`).
    pend: [u8; 64],
    pend_addr: u64,
    pend_len: usize,
}

/// Watched runs of one store, with their bytes before it.
struct Runs {
    items: [(u64, u64, [u8; 32]); 4],
    n: usize,
}

impl<'a> WatchMem<'a> {
    pub(super) fn new(inner: &'a Inner, slot: &'a Slot, ctx: SignalContext) -> Self {
        WatchMem {
            inner,
            slot,
            ctx,
            validated: [0; 4],
            nvalid: 0,
            open: [0; 4],
            nopen: 0,
            pend: [0; 64],
            pend_addr: 0,
            pend_len: 0,
        }
    }
}

impl WatchMem<'_> {
    /// The watched runs of `[a, a+n)` (within one page), or None if there
    /// are more than fit (the caller then stores byte by byte).
    fn collect_runs(&self, e: Option<&PageEntry>, a: u64, n: usize) -> Option<Runs> {
        let mut runs = Runs {
            items: [(0, 0, [0; 32]); 4],
            n: 0,
        };
        let Some(e) = e else { return Some(runs) };
        if !self.inner.classify {
            return Some(runs);
        }
        let set = e.ranges.load(Acquire);
        if set.is_null() {
            return Some(runs);
        }
        // SAFETY: range sets are freed only after a grace period; every
        // caller holds a read section.
        let set = unsafe { &*set };
        for (s, t) in set.intersect(a, a + n as u64) {
            if runs.n == runs.items.len() {
                return None;
            }
            let k = ((t - s) as usize).min(32);
            let r = &mut runs.items[runs.n];
            // SAFETY: watched bytes stay readable on every tier.
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, r.2.as_mut_ptr(), k) };
            r.0 = s;
            r.1 = t;
            runs.n += 1;
        }
        Some(runs)
    }

    /// Stores `data` at `addr` (within one page) through the page's tier.
    /// For the Uffd and Mprotect tiers the caller holds the page lock.
    fn raw_store(&self, e: Option<&PageEntry>, addr: u64, data: &[u8]) -> Result<(), MemFault> {
        let tier = e.map_or(Tier::Off, |e| e.tier());
        match (tier, e) {
            (Tier::Alias, Some(e)) => {
                let dst = addr.wrapping_add(e.alias_delta.load(Relaxed));
                // SAFETY: the alias maps the same memfd pages writable.
                unsafe { copy_native(dst, data) };
                Ok(())
            }
            (Tier::Uffd, Some(_)) => {
                // The caller opened the page (`open_page`): the kernel's
                // forced write now goes through.
                faultline_sys::mem::pwrite_all(self.inner.mem_raw(), data, addr)
                    .map_err(|_| MemFault)
            }
            (Tier::Mprotect, Some(_)) => {
                faultline_sys::mem::pwrite_all(self.inner.mem_raw(), data, addr)
                    .map_err(|_| MemFault)
            }
            _ => {
                // Not a protected page: leave the store to native execution
                // (it may be unmapped, read-only or the application's own
                // guard page; faulting on it here would be in our frame).
                Err(MemFault)
            }
        }
    }

    fn needs_lock(e: Option<&PageEntry>) -> Option<&PageEntry> {
        e.filter(|e| e.tier() == Tier::Mprotect)
    }

    /// Opens a uffd-armed page for stores until [`WatchMem::close_all`]:
    /// private anonymous memory has no second mapping and the kernel's
    /// forced write refuses uffd-write-protected pages, so the page is
    /// fenced read-only with `mprotect` (other threads' writes now fault and
    /// wait for the page lock), its uffd protection lifted, and stores go
    /// through `/proc/self/mem`. The page is never writable for another
    /// thread. The fence splits the VMA only until `close_all` restores
    /// the protection (then it merges back).
    fn open_page(&mut self, e: &'static PageEntry) -> Result<(), MemFault> {
        let p = e as *const PageEntry as usize;
        if self.open[..self.nopen].contains(&p) || e.held_by_me() {
            // Ours, or opened by the handler frame this one interrupted.
            return Ok(());
        }
        if self.nopen == self.open.len() {
            self.close_all();
        }
        // Never block on a page lock while holding another: if it is taken,
        // close (and unlock) our open pages first. Two threads running
        // loops over the same pages in opposite orders cannot deadlock.
        if !e.try_lock() {
            self.close_all();
            e.lock();
        }
        let prot = e.prot();
        if mprotect(e.page, PAGE as usize, prot.without(Prot::WRITE)).is_err() {
            e.unlock();
            return Err(MemFault);
        }
        if self
            .inner
            .uffd
            .writeprotect(e.page, PAGE, false, true)
            .is_err()
        {
            let _ = mprotect(e.page, PAGE as usize, prot);
            e.unlock();
            return Err(MemFault);
        }
        self.open[self.nopen] = p;
        self.nopen += 1;
        Ok(())
    }

    /// Re-protects and un-fences every page this handler opened.
    /// Performs the coalesced stores (see `write`).
    fn flush(&mut self) -> Result<(), MemFault> {
        if self.pend_len == 0 {
            return Ok(());
        }
        let r = faultline_sys::mem::pwrite_all(
            self.inner.mem_raw(),
            &self.pend[..self.pend_len],
            self.pend_addr,
        );
        self.pend_len = 0;
        r.map_err(|_| MemFault)
    }

    pub(super) fn close_all(&mut self) {
        if self.flush().is_err() {
            abort_with(b"a store to a watched page failed after it was emulated");
        }
        for &p in &self.open[..self.nopen] {
            // SAFETY: entries are arena objects alive while the watcher is.
            let e: &PageEntry = unsafe { &*(p as *const PageEntry) };
            if self
                .inner
                .uffd
                .writeprotect(e.page, PAGE, true, false)
                .is_err()
            {
                abort_with(b"cannot re-protect a watched page");
            }
            if mprotect(e.page, PAGE as usize, e.prot()).is_err() {
                abort_with(b"cannot lift the write fence of a watched page");
            }
            e.unlock();
        }
        self.nopen = 0;
    }

    /// Reports the runs of a store of `data` at `write.0`.
    fn report_runs(
        &mut self,
        e: Option<&PageEntry>,
        runs: &Runs,
        write: (u64, usize),
        data: &[u8],
    ) {
        let Some(e) = e else { return };
        if runs.n == 0 && self.inner.classify && e.tier() != Tier::Off {
            // A store to a protected page that touched no watched byte: a
            // false positive (counted per store, so stores performed by
            // continued interpretation count as the faults they replace).
            self.inner.shared.false_positives.fetch_add(1, Relaxed);
            e.false_positives.fetch_add(1, Relaxed);
        }
        for r in &runs.items[..runs.n] {
            self.report(e, r.0, r.1, write, &r.2, data);
        }
    }

    fn report(
        &mut self,
        e: &PageEntry,
        start: u64,
        end: u64,
        write: (u64, usize),
        before: &[u8; 32],
        data: &[u8],
    ) {
        // `after` is what this store wrote (memory may already hold another
        // thread's later write).
        let mut after = [0u8; 32];
        let n = ((end - start) as usize).min(32);
        let k = (start - write.0) as usize;
        after[..n].copy_from_slice(&data[k..k + n]);
        let hit = Hit {
            addr: start,
            len: (end - start) as usize,
            write_addr: write.0,
            write_len: write.1,
            before: *before,
            after,
            tid: Runtime::tid(self.slot),
            // The instruction being performed (continued interpretation
            // moves RIP past the faulting one).
            ip: self.ctx.rip(),
            path: HitPath::Emulated,
        };
        // A callback sees memory as the program would: pending stores
        // first.
        if self.inner.callback.is_some() && self.flush().is_err() {
            abort_with(b"a store to a watched page failed after it was emulated");
        }
        deliver(self.inner, self.slot, Some(e), &hit);
    }

    fn load(&self, addr: u64, size: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: readable (see `read`).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), size.min(8)) };
        u64::from_le_bytes(b)
    }
}

impl Memory for WatchMem<'_> {
    fn hot(&self, addr: u64) -> bool {
        self.inner
            .pages
            .get(page_of(addr))
            .is_some_and(|e| e.tier() != Tier::Off)
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        if self.pend_len > 0
            && addr < self.pend_addr + self.pend_len as u64
            && self.pend_addr < addr + buf.len() as u64
        {
            self.flush()?;
        }
        let mut off = 0usize;
        while off < buf.len() {
            let a = addr + off as u64;
            let n = ((page_of(a) + PAGE - a) as usize).min(buf.len() - off);
            let page = page_of(a);
            if self.hot(a) || self.validated[..self.nvalid].contains(&page) {
                // Protected pages stay readable on every tier; validated
                // pages were read safely earlier in this handler.
                let one = n == buf.len();
                // SAFETY: readable (see above).
                unsafe { load_native(a, &mut buf[off..off + n], one) };
            } else {
                // Any other page may be unmapped, PROT_NONE or a page of
                // another userfaultfd: read it with a call that fails
                // instead of faulting in this frame.
                if !checked_read(a, &mut buf[off..off + n]) {
                    return Err(MemFault);
                }
                let i = self.nvalid % self.validated.len();
                self.validated[i] = page;
                self.nvalid = (self.nvalid + 1).min(self.validated.len());
            }
            off += n;
        }
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault> {
        let mut off = 0usize;
        while off < data.len() {
            let a = addr + off as u64;
            let n = ((page_of(a) + PAGE - a) as usize).min(data.len() - off);
            let chunk = &data[off..off + n];
            let e = self.inner.pages.get(page_of(a));
            if self.pend_len > 0
                && a < self.pend_addr + self.pend_len as u64
                && self.pend_addr < a + n as u64
            {
                // Rewriting pending bytes: their `before` must be current.
                self.flush()?;
            }
            let Some(runs) = self.collect_runs(e, a, n) else {
                // More watched runs than fit: store byte by byte so every
                // run is reported.
                for i in 0..n {
                    self.write(a + i as u64, &chunk[i..i + 1])?;
                }
                off += n;
                continue;
            };
            if self.inner.trace {
                self.inner.shared.trace[1].store(rdtsc(), Relaxed);
            }
            if let Some(u) = e.filter(|e| e.tier() == Tier::Uffd) {
                self.open_page(u)?;
                // Coalesce contiguous stores into one forced write (a byte
                // loop: one pwrite per 64 bytes instead of per byte). The
                // page is fenced and locked, so nobody else writes it.
                if self.pend_len > 0
                    && (self.pend_addr + self.pend_len as u64 != a
                        || self.pend_len + n > self.pend.len())
                {
                    self.flush()?;
                }
                if n <= self.pend.len() {
                    if self.pend_len == 0 {
                        self.pend_addr = a;
                    }
                    self.pend[self.pend_len..self.pend_len + n].copy_from_slice(chunk);
                    self.pend_len += n;
                    if self.inner.trace {
                        self.inner.shared.trace[2].store(rdtsc(), Relaxed);
                    }
                    self.report_runs(e, &runs, (a, n), chunk);
                    off += n;
                    continue;
                }
            }
            let lock = Self::needs_lock(e);
            if let Some(l) = lock {
                l.lock();
            }
            let r = self.raw_store(e, a, chunk);
            if let Some(l) = lock {
                l.unlock();
            }
            r?;
            if self.inner.trace {
                self.inner.shared.trace[2].store(rdtsc(), Relaxed);
            }
            self.report_runs(e, &runs, (a, n), chunk);
            off += n;
        }
        Ok(())
    }

    fn cas(&mut self, addr: u64, size: usize, expected: u64, new: u64) -> Result<u64, MemFault> {
        if size == 0 || size > 8 || page_of(addr) != page_of(addr + size as u64 - 1) {
            // A split-lock atomic: not emulated.
            return Err(MemFault);
        }
        self.flush()?;
        let e = self.inner.pages.get(page_of(addr));
        let runs = self.collect_runs(e, addr, size).ok_or(MemFault)?;
        let tier = e.map_or(Tier::Off, |e| e.tier());
        if tier == Tier::Off {
            // Not protected: native execution does it.
            return Err(MemFault);
        }
        let found = if tier == Tier::Alias {
            let dst = addr.wrapping_add(e.map_or(0, |e| e.alias_delta.load(Relaxed)));
            // SAFETY: a page-contained atomic on the writable alias.
            unsafe { atomic_cas(dst, size, expected, new) }
        } else {
            // All writers to this page go through a handler holding the
            // page lock, so load-compare-store under it is atomic.
            let l = e.expect("tier implies entry");
            let uffd = tier == Tier::Uffd;
            if uffd {
                // Held until the handler returns.
                self.open_page(l)?;
            } else {
                l.lock();
            }
            let cur = self.load(addr, size);
            let r = if cur == expected {
                self.raw_store(e, addr, &new.to_le_bytes()[..size])
                    .map(|_| cur)
            } else {
                Ok(cur)
            };
            if !uffd {
                l.unlock();
            }
            r?
        };
        if found == expected {
            let mut runs = runs;
            // `before` was read outside the atomic: use the value replaced.
            let old = expected.to_le_bytes();
            for r in &mut runs.items[..runs.n] {
                let k = (r.0 - addr) as usize;
                let m = (r.1 - r.0) as usize;
                r.2[..m].copy_from_slice(&old[k..k + m]);
            }
            self.report_runs(e, &runs, (addr, size), &new.to_le_bytes()[..size]);
        }
        Ok(found)
    }
}

/// # Safety
/// `addr` must be valid for an atomic access of `size` bytes.
unsafe fn atomic_cas(addr: u64, size: usize, expected: u64, new: u64) -> u64 {
    use std::sync::atomic::{AtomicU16, AtomicU8};
    // SAFETY: the caller guarantees validity; x86 tolerates misaligned
    // locked accesses (they are slow, not wrong), so the casts are sound on
    // this architecture for accesses that do not cross a page.
    unsafe {
        let r = match size {
            1 => (*(addr as *const AtomicU8))
                .compare_exchange(expected as u8, new as u8, SeqCst, SeqCst)
                .map(u64::from)
                .map_err(u64::from),
            2 => (*(addr as *const AtomicU16))
                .compare_exchange(expected as u16, new as u16, SeqCst, SeqCst)
                .map(u64::from)
                .map_err(u64::from),
            4 => (*(addr as *const AtomicU32))
                .compare_exchange(expected as u32, new as u32, SeqCst, SeqCst)
                .map(u64::from)
                .map_err(u64::from),
            _ => (*(addr as *const AtomicU64)).compare_exchange(expected, new, SeqCst, SeqCst),
        };
        match r {
            Ok(v) | Err(v) => v,
        }
    }
}
