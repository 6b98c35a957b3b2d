//! The watcher's data structures: what the signal handlers read.
//!
//! ```text
//!  writer (watch/unwatch, under a mutex)          signal handler (no locks)
//!  ------------------------------------          -------------------------
//!  RangeTree: BTreeMap start -> end               PageTable (open addressing,
//!    merged on insert, split on remove              page -> &PageEntry)
//!         |  recompute the pages touched            |
//!         v                                         v
//!  PageEntry.ranges <- new RangeSet ---------->  RangeSet: watched [start,end)
//!  (old RangeSet retired, freed after               clipped to the page,
//!   a Grace period)                                 binary search
//! ```
//!
//! The thesis kept every watched range in one splay tree and searched it on
//! each fault. A splay tree rotates on lookup: a write on every read, which a
//! lock-free signal handler cannot do. Here the handler finds the faulting
//! page's entry with one hash probe and searches only the ranges that touch
//! that page (usually one or two), so lookup cost does not grow with the
//! number of watches; the writer keeps the global merged set in a B-tree
//! (`O(log n)` insert/remove), so 100,000 watches cost 100,000 cheap
//! updates, not a quadratic rebuild.
//!
//! Memory the handler *writes* (counters, locks, per-thread slots) lives in
//! an [`Arena`] of private `mmap` chunks that can never be watched, so the
//! handler cannot fault on its own bookkeeping. What it only *reads* (the
//! hash table, range sets) may live on the heap: write protection does not
//! stop reads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;

use faultline::interval::Grace;
use faultline_sys::mem::{Mapping, Prot};
use faultline_sys::thread::sched_yield;

/// The calling thread's key: its TCB address (`fs:0`), unique among live
/// threads.
#[inline]
pub fn thread_key() -> u64 {
    let k: u64;
    // SAFETY: on x86_64 Linux fs:0 holds the thread control block's self
    // pointer (glibc and musl); reading it has no side effects.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) k, options(nostack, readonly, preserves_flags))
    };
    k
}

/// Size of a base page.
pub const PAGE: u64 = 4096;

/// The page holding `addr`.
#[inline]
pub fn page_of(addr: u64) -> u64 {
    addr & !(PAGE - 1)
}

/// A bump allocator over private anonymous `mmap` chunks. Objects live until
/// the arena is dropped; nothing is freed individually.
pub struct Arena {
    chunks: Mutex<Vec<Mapping>>,
    cur: AtomicUsize,
    left: AtomicUsize,
    ranges: Mutex<Vec<(u64, u64)>>,
}

const CHUNK: usize = 1 << 20;

impl Arena {
    pub fn new() -> std::io::Result<Arena> {
        Ok(Arena {
            chunks: Mutex::new(Vec::new()),
            cur: AtomicUsize::new(0),
            left: AtomicUsize::new(0),
            ranges: Mutex::new(Vec::new()),
        })
    }

    /// Moves `value` into the arena. Not for use in signal handlers.
    pub fn alloc<T>(&self, value: T) -> std::io::Result<&'static T> {
        let size = std::mem::size_of::<T>().max(1);
        let align = std::mem::align_of::<T>();
        assert!(size <= CHUNK / 4 && align <= 4096);
        let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        let mut cur = self.cur.load(Relaxed);
        let mut left = self.left.load(Relaxed);
        let pad = (align - cur % align) % align;
        if chunks.is_empty() || left < pad + size {
            let m = Mapping::anon(CHUNK).map_err(|e| e.source)?;
            self.ranges
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((m.addr(), m.addr() + CHUNK as u64));
            cur = m.addr() as usize;
            left = CHUNK;
            chunks.push(m);
        }
        let pad = (align - cur % align) % align;
        let p = (cur + pad) as *mut T;
        // SAFETY: `p` is inside a live chunk with at least `size` bytes left,
        // aligned for T; chunks stay mapped until the arena is dropped, and
        // the `'static` lifetime is upheld by the owner (the watcher keeps
        // the arena alive until no handler can run on it).
        unsafe { p.write(value) };
        self.cur.store(cur + pad + size, Relaxed);
        self.left.store(left - pad - size, Relaxed);
        // SAFETY: just initialised; see above.
        Ok(unsafe { &*p })
    }

    /// Whether `[start, end)` overlaps arena memory.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|&(s, e)| start < e && s < end)
    }
}

/// How a watched page is protected, and so how an emulated store reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Tier {
    /// Not protected (no watches, or the watcher is disabled).
    Off = 0,
    /// userfaultfd write-protect; stores briefly un-protect the page.
    Uffd = 1,
    /// userfaultfd write-protect on memory with a writable alias mapping;
    /// stores go through the alias and the page never becomes writable.
    Alias = 2,
    /// `mprotect` read-only + SIGSEGV; stores go through `/proc/self/mem`
    /// (the kernel's forced write), the page never becomes writable.
    Mprotect = 3,
}

impl Tier {
    pub fn from_u32(v: u32) -> Tier {
        match v {
            1 => Tier::Uffd,
            2 => Tier::Alias,
            3 => Tier::Mprotect,
            _ => Tier::Off,
        }
    }
}

/// Watched ranges clipped to one page, sorted, non-overlapping.
pub struct RangeSet {
    pub items: Box<[(u64, u64)]>,
}

impl RangeSet {
    /// The watched sub-ranges of `[start, end)`, in order.
    pub fn intersect(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.items.partition_point(|&(_, e)| e <= start);
        self.items[first..]
            .iter()
            .take_while(move |&&(s, _)| s < end)
            .map(move |&(s, e)| (s.max(start), e.min(end)))
    }
}

/// Everything known about one page that has ever been watched. Lives in the
/// arena: the handler updates its counters and lock.
pub struct PageEntry {
    pub page: u64,
    pub tier: AtomicU32,
    /// `alias - page` (wrapping) for [`Tier::Alias`].
    pub alias_delta: AtomicU64,
    /// The protection to restore for [`Tier::Mprotect`].
    pub prot: AtomicU32,
    pub ranges: AtomicPtr<RangeSet>,
    /// Serialises stores that open the page (un-protect or forced write)
    /// and single-steps: 0, or the owning thread's key (its TCB address).
    pub lock: AtomicU64,
    pub hits: AtomicU64,
    pub false_positives: AtomicU64,
}

impl PageEntry {
    pub fn new(page: u64) -> PageEntry {
        PageEntry {
            page,
            tier: AtomicU32::new(0),
            alias_delta: AtomicU64::new(0),
            prot: AtomicU32::new(0),
            ranges: AtomicPtr::new(std::ptr::null_mut()),
            lock: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            false_positives: AtomicU64::new(0),
        }
    }

    pub fn tier(&self) -> Tier {
        Tier::from_u32(self.tier.load(Acquire))
    }

    /// The protection to restore for [`Tier::Mprotect`].
    pub fn prot(&self) -> Prot {
        Prot::from_bits(self.prot.load(Relaxed) as i32)
    }

    /// Sets the protection to restore.
    pub fn set_prot(&self, prot: Prot) {
        self.prot.store(prot.bits() as u32, Relaxed)
    }

    /// Spins (yielding) until the page lock is ours. Signal-safe as long as
    /// the holder never waits for the caller, which holds because the lock
    /// is only taken around stores, one handler's stores, or a single step.
    pub fn lock(&self) {
        let me = thread_key();
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(0, me, Acquire, Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
            } else {
                sched_yield();
            }
        }
    }

    /// Takes the page lock if it is free.
    pub fn try_lock(&self) -> bool {
        self.lock
            .compare_exchange(0, thread_key(), Acquire, Relaxed)
            .is_ok()
    }

    /// Whether the calling thread holds the page lock.
    pub fn held_by_me(&self) -> bool {
        self.lock.load(Acquire) == thread_key()
    }

    pub fn unlock(&self) {
        self.lock.store(0, Release);
    }
}

/// An open-addressing hash table from page to entry, published through an
/// atomic pointer. Entries are never removed (an unwatched page keeps its
/// entry, unarmed, with its statistics), so readers never see a slot go
/// from one page to another.
pub struct PageTable {
    slots: Box<[AtomicPtr<PageEntry>]>,
    mask: usize,
}

impl PageTable {
    fn with_capacity(cap: usize) -> PageTable {
        let cap = cap.next_power_of_two().max(64);
        PageTable {
            slots: (0..cap)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            mask: cap - 1,
        }
    }

    #[inline]
    fn start(&self, page: u64) -> usize {
        ((page >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize & self.mask
    }

    /// The entry of `page`, if any. Lock-free and allocation-free.
    #[inline]
    pub fn get(&self, page: u64) -> Option<&'static PageEntry> {
        let mut i = self.start(page);
        loop {
            let p = self.slots[i].load(Acquire);
            if p.is_null() {
                return None;
            }
            // SAFETY: entries are arena objects that live as long as the
            // watcher, which outlives every reader of this table.
            let e: &'static PageEntry = unsafe { &*p };
            if e.page == page {
                return Some(e);
            }
            i = (i + 1) & self.mask;
        }
    }

    fn insert(&self, e: &'static PageEntry) {
        let mut i = self.start(e.page);
        while !self.slots[i].load(Relaxed).is_null() {
            i = (i + 1) & self.mask;
        }
        self.slots[i].store(e as *const PageEntry as *mut PageEntry, Release);
    }

    fn entries(&self) -> impl Iterator<Item = &'static PageEntry> + '_ {
        self.slots.iter().filter_map(|s| {
            let p = s.load(Acquire);
            // SAFETY: as in `get`.
            (!p.is_null()).then(|| unsafe { &*(p as *const PageEntry) })
        })
    }
}

/// The page table plus its grace period: what readers use.
pub struct Pages {
    table: AtomicPtr<PageTable>,
    pub grace: Grace,
}

/// Objects unpublished by a writer, freed after the next grace period.
#[derive(Default)]
pub struct Retired {
    sets: Vec<*mut RangeSet>,
    tables: Vec<*mut PageTable>,
}

impl Default for Pages {
    fn default() -> Self {
        Self::new()
    }
}

impl Pages {
    pub fn new() -> Pages {
        Pages {
            table: AtomicPtr::new(Box::into_raw(Box::new(PageTable::with_capacity(1024)))),
            grace: Grace::new(),
        }
    }

    /// Looks `page` up. Call inside a grace read section.
    #[inline]
    pub fn get(&self, page: u64) -> Option<&'static PageEntry> {
        // SAFETY: the table is freed only after a grace period, and the
        // caller is inside a read section.
        unsafe { &*self.table.load(Acquire) }.get(page)
    }

    /// Writer side: the entry of `page`, created (in `arena`) if needed.
    /// `count` is the writer's entry count; the table doubles at half load.
    pub fn get_or_insert(
        &self,
        page: u64,
        arena: &Arena,
        count: &mut usize,
        retired: &mut Retired,
    ) -> std::io::Result<&'static PageEntry> {
        if let Some(e) = self.get(page) {
            return Ok(e);
        }
        let e = arena.alloc(PageEntry::new(page))?;
        // SAFETY: writers are serialised by the caller's mutex; the table
        // pointer is valid until this writer retires it.
        let table = unsafe { &*self.table.load(Acquire) };
        if (*count + 1) * 2 > table.slots.len() {
            let bigger = PageTable::with_capacity(table.slots.len() * 2);
            for old in table.entries() {
                bigger.insert(old);
            }
            bigger.insert(e);
            let old = self.table.swap(Box::into_raw(Box::new(bigger)), AcqRel);
            retired.tables.push(old);
        } else {
            table.insert(e);
        }
        *count += 1;
        Ok(e)
    }

    /// Every entry (writer side).
    pub fn entries(&self) -> Vec<&'static PageEntry> {
        let mut v = Vec::new();
        self.for_each(|e| v.push(e));
        v
    }

    /// Calls `f` on every entry without allocating (also usable in a
    /// freshly forked child, where no writer can be running).
    pub fn for_each(&self, mut f: impl FnMut(&'static PageEntry)) {
        // SAFETY: as in `get_or_insert`: the table is freed only by a writer
        // after a grace period, and callers are writers or alone.
        for e in unsafe { &*self.table.load(Acquire) }.entries() {
            f(e);
        }
    }

    /// Replaces the ranges of `e`, retiring the old set.
    pub fn set_ranges(&self, e: &PageEntry, items: Vec<(u64, u64)>, retired: &mut Retired) {
        let new = if items.is_empty() {
            std::ptr::null_mut()
        } else {
            Box::into_raw(Box::new(RangeSet {
                items: items.into_boxed_slice(),
            }))
        };
        let old = e.ranges.swap(new, AcqRel);
        if !old.is_null() {
            retired.sets.push(old);
        }
    }

    /// Waits for readers, then frees what was retired.
    pub fn reclaim(&self, retired: &mut Retired) {
        if retired.sets.is_empty() && retired.tables.is_empty() {
            return;
        }
        self.grace.synchronize();
        for p in retired.sets.drain(..) {
            // SAFETY: created by Box::into_raw, unpublished, and no reader
            // can hold it after the grace period.
            drop(unsafe { Box::from_raw(p) });
        }
        for p in retired.tables.drain(..) {
            // SAFETY: as above.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        let t = *self.table.get_mut();
        for e in
            // SAFETY: exclusive access in drop.
            unsafe { &*t }.entries()
        {
            let r = e.ranges.swap(std::ptr::null_mut(), Relaxed);
            if !r.is_null() {
                // SAFETY: created by Box::into_raw in set_ranges.
                drop(unsafe { Box::from_raw(r) });
            }
        }
        // SAFETY: created by Box::into_raw; exclusive access in drop.
        drop(unsafe { Box::from_raw(t) });
    }
}

/// The merged set of watched byte ranges (writer side).
#[derive(Default, Debug)]
pub struct RangeTree {
    map: BTreeMap<u64, u64>,
}

impl RangeTree {
    /// Adds `[start, end)`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, mut start: u64, mut end: u64) {
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        let inside: Vec<(u64, u64)> = self.map.range(start..=end).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in inside {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
    }

    /// Removes `[start, end)`, splitting ranges that straddle it.
    pub fn remove(&mut self, start: u64, end: u64) {
        let mut touched: Vec<(u64, u64)> = Vec::new();
        if let Some((&s, &e)) = self.map.range(..start).next_back() {
            if e > start {
                touched.push((s, e));
            }
        }
        touched.extend(self.map.range(start..end).map(|(&s, &e)| (s, e)));
        for (s, e) in touched {
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, start);
            }
            if e > end {
                self.map.insert(end, e);
            }
        }
    }

    /// The ranges intersecting `[start, end)`, clipped to it.
    pub fn clipped(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if let Some((&s, &e)) = self.map.range(..start).next_back() {
            if e > start {
                out.push((s.max(start), e.min(end)));
            }
        }
        out.extend(self.map.range(start..end).map(|(&s, &e)| (s, e.min(end))));
        out
    }

    /// Number of disjoint ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is watched.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether any byte of `[start, end)` is watched.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        !self.clipped(start, end).is_empty()
    }

    /// Every range, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn range_tree_matches_a_byte_model(ops in proptest::collection::vec((any::<bool>(), 0u64..512, 1u64..64), 1..60)) {
            let mut t = RangeTree::default();
            let mut model = [false; 600];
            for (add, s, l) in ops {
                let e = s + l;
                if add { t.insert(s, e) } else { t.remove(s, e) }
                for b in &mut model[s as usize..e as usize] { *b = add; }
                // Canonical: sorted, disjoint, non-adjacent.
                let v: Vec<_> = t.iter().collect();
                for w in v.windows(2) { prop_assert!(w[0].1 < w[1].0); }
                for (i, &m) in model.iter().enumerate() {
                    prop_assert_eq!(t.overlaps(i as u64, i as u64 + 1), m);
                }
            }
        }
    }

    #[test]
    fn page_table_grows_and_finds_everything() {
        let arena = Arena::new().unwrap();
        let pages = Pages::new();
        let mut count = 0;
        let mut retired = Retired::default();
        for i in 0..5000u64 {
            pages
                .get_or_insert(0x1000_0000 + i * PAGE * 7, &arena, &mut count, &mut retired)
                .unwrap();
        }
        pages.reclaim(&mut retired);
        for i in 0..5000u64 {
            let p = 0x1000_0000 + i * PAGE * 7;
            assert_eq!(pages.get(p).unwrap().page, p);
        }
        assert!(pages.get(0x1000_0000 + PAGE).is_none());
        assert_eq!(pages.entries().len(), 5000);
    }

    #[test]
    fn range_set_intersection() {
        let s = RangeSet {
            items: vec![(10, 20), (30, 40), (50, 60)].into_boxed_slice(),
        };
        let v: Vec<_> = s.intersect(15, 35).collect();
        assert_eq!(v, vec![(15, 20), (30, 35)]);
        assert_eq!(s.intersect(20, 30).count(), 0);
        assert_eq!(s.intersect(0, 100).count(), 3);
    }
}
