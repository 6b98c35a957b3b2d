//! Sorted sets of non-overlapping address intervals.
//!
//! [`IntervalMap`] is the pure data structure: a sorted vector of
//! `[start, end)` intervals, each with a value. It implements seed 000's
//! Algorithm 3 (merge overlapping or adjacent intervals on insert, when
//! their values agree) and the matching split on removal, and Algorithm 1
//! (binary search for the interval holding an address, `O(log n)`).
//!
//! ```text
//!  insert [a,b) v   with [b,c) v present   -> [a,c) v          (merge)
//!  remove [x,y)     from [a,c) v, a<x<y<c  -> [a,x) v, [y,c) v  (split)
//! ```
//!
//! The region table uses values that identify a region (adjacent regions
//! stay distinct; a region grown in place merges); a watch list uses `()`
//! so every adjacent or overlapping range merges.
//!
//! [`SnapshotTable`] wraps an `IntervalMap` for concurrent use: writers
//! serialise on a mutex, build a new sorted array and publish it with one
//! atomic pointer store; readers (including signal handlers) never block
//! and never allocate. Retired arrays are freed after a grace period
//! tracked by two epoch-parity reader counters (a minimal userspace RCU).

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

/// One interval and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval<V> {
    /// First address (inclusive).
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// The value attached to the interval.
    pub value: V,
}

/// Why an insertion was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// `start >= end`.
    #[error("empty interval [{start:#x}, {end:#x})")]
    Empty { start: u64, end: u64 },
    /// Overlaps an interval with a different value.
    #[error("[{start:#x}, {end:#x}) overlaps existing [{other_start:#x}, {other_end:#x})")]
    Overlap {
        start: u64,
        end: u64,
        other_start: u64,
        other_end: u64,
    },
}

/// A sorted vector of non-overlapping intervals. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntervalMap<V> {
    items: Vec<Interval<V>>,
}

impl<V: Copy + Eq> IntervalMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        IntervalMap { items: Vec::new() }
    }

    /// The intervals, sorted by start.
    pub fn as_slice(&self) -> &[Interval<V>] {
        &self.items
    }

    /// Number of intervals.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Index of the first interval whose end is > `addr`.
    fn first_ending_after(&self, addr: u64) -> usize {
        self.items.partition_point(|i| i.end <= addr)
    }

    /// Algorithm 1: the interval containing `addr`, in `O(log n)`.
    pub fn lookup(&self, addr: u64) -> Option<&Interval<V>> {
        lookup_sorted(&self.items, addr)
    }

    /// Inserts `[start, end)` with `value`.
    ///
    /// Overlapping or adjacent intervals holding the same value are merged
    /// into one (Algorithm 3). Overlap with a different value is an error
    /// and leaves the map unchanged; adjacency with a different value keeps
    /// both intervals.
    pub fn insert(&mut self, start: u64, end: u64, value: V) -> Result<(), IntervalError> {
        if start >= end {
            return Err(IntervalError::Empty { start, end });
        }
        // Candidates: intervals with i.end >= start (adjacent on the left
        // counts) and i.start <= end (adjacent on the right counts).
        let lo = self.items.partition_point(|i| i.end < start);
        let mut hi = lo;
        let (mut s, mut e) = (start, end);
        while hi < self.items.len() && self.items[hi].start <= end {
            let it = self.items[hi];
            let overlaps = it.start < end && it.end > start;
            if it.value != value {
                if overlaps {
                    return Err(IntervalError::Overlap {
                        start,
                        end,
                        other_start: it.start,
                        other_end: it.end,
                    });
                }
                // Adjacent with another value: not merged. Only possible at
                // the two ends of the candidate run.
                hi += 1;
                continue;
            }
            s = s.min(it.start);
            e = e.max(it.end);
            hi += 1;
        }
        // Remove the merged (same-value) candidates, keep the others.
        let mut kept: Vec<Interval<V>> = Vec::new();
        for it in &self.items[lo..hi] {
            if it.value != value {
                kept.push(*it);
            }
        }
        let merged = Interval {
            start: s,
            end: e,
            value,
        };
        kept.push(merged);
        kept.sort_by_key(|i| i.start);
        self.items.splice(lo..hi, kept);
        Ok(())
    }

    /// Removes `[start, end)` from whatever intervals cover it, splitting
    /// an interval that extends past either side. Returns the pieces that
    /// were removed.
    pub fn remove(&mut self, start: u64, end: u64) -> Vec<Interval<V>> {
        let mut removed = Vec::new();
        if start >= end {
            return removed;
        }
        let lo = self.first_ending_after(start);
        let mut hi = lo;
        while hi < self.items.len() && self.items[hi].start < end {
            hi += 1;
        }
        let mut replacement = Vec::new();
        for it in &self.items[lo..hi] {
            if it.start < start {
                replacement.push(Interval {
                    start: it.start,
                    end: start,
                    value: it.value,
                });
            }
            removed.push(Interval {
                start: it.start.max(start),
                end: it.end.min(end),
                value: it.value,
            });
            if it.end > end {
                replacement.push(Interval {
                    start: end,
                    end: it.end,
                    value: it.value,
                });
            }
        }
        self.items.splice(lo..hi, replacement);
        removed
    }

    /// All intervals overlapping `[start, end)`.
    pub fn overlapping(&self, start: u64, end: u64) -> &[Interval<V>] {
        let lo = self.first_ending_after(start);
        let hi = self.items.partition_point(|i| i.start < end);
        &self.items[lo..hi.max(lo)]
    }
}

/// Algorithm 1 over a sorted slice.
#[inline]
pub fn lookup_sorted<V>(items: &[Interval<V>], addr: u64) -> Option<&Interval<V>> {
    let (mut lo, mut hi) = (0usize, items.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let it = &items[mid];
        if addr < it.start {
            hi = mid;
        } else if addr >= it.end {
            lo = mid + 1;
        } else {
            return Some(it);
        }
    }
    None
}

struct Snapshot<V> {
    items: Box<[Interval<V>]>,
}

/// An [`IntervalMap`] readable without locks or allocation (from signal
/// handlers) while other threads insert and remove. See the module docs.
pub struct SnapshotTable<V: Copy + Eq + Send + Sync + 'static> {
    writer: Mutex<IntervalMap<V>>,
    current: AtomicPtr<Snapshot<V>>,
    grace: Grace,
}

/// A minimal userspace RCU: readers enter and leave read-side sections
/// without locks, allocation or system calls (so signal handlers may read);
/// a writer that has unpublished an object calls [`Grace::synchronize`] and,
/// when it returns, no reader can still hold the object.
///
/// Two reader counters indexed by the parity of an epoch: a reader
/// increments the counter of the current parity and re-checks the epoch; a
/// writer flips the epoch and waits for the old parity's counter to drain.
pub struct Grace {
    epoch: AtomicU64,
    readers: [AtomicUsize; 2],
}

impl Default for Grace {
    fn default() -> Self {
        Self::new()
    }
}

impl Grace {
    /// No readers, epoch 0 (usable in a `static`).
    pub const fn new() -> Self {
        Grace {
            epoch: AtomicU64::new(0),
            readers: [AtomicUsize::new(0), AtomicUsize::new(0)],
        }
    }

    /// Enters a read-side section; pass the result to [`Grace::exit`].
    /// Async-signal-safe.
    #[inline]
    pub fn enter(&self) -> usize {
        loop {
            let e = self.epoch.load(SeqCst);
            let parity = (e & 1) as usize;
            self.readers[parity].fetch_add(1, SeqCst);
            if self.epoch.load(SeqCst) == e {
                return parity;
            }
            self.readers[parity].fetch_sub(1, SeqCst);
        }
    }

    /// Leaves the read-side section entered with parity `parity`.
    #[inline]
    pub fn exit(&self, parity: usize) {
        self.readers[parity].fetch_sub(1, SeqCst);
    }

    /// Waits until every reader that entered before this call has left.
    /// Never call it from inside a read-side section.
    pub fn synchronize(&self) {
        let e = self.epoch.fetch_add(1, SeqCst);
        let parity = (e & 1) as usize;
        let mut spins = 0u32;
        while self.readers[parity].load(SeqCst) != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// A read-side critical section: the snapshot stays valid while it lives.
pub struct ReadGuard<'a, V: Copy + Eq + Send + Sync + 'static> {
    table: &'a SnapshotTable<V>,
    parity: usize,
    snap: *const Snapshot<V>,
}

impl<V: Copy + Eq + Send + Sync + 'static> ReadGuard<'_, V> {
    /// Algorithm 1 on the snapshot.
    #[inline]
    pub fn lookup(&self, addr: u64) -> Option<&Interval<V>> {
        lookup_sorted(self.items(), addr)
    }
    /// Every interval of the snapshot.
    pub fn items(&self) -> &[Interval<V>] {
        if self.snap.is_null() {
            return &[];
        }
        // SAFETY: the snapshot cannot be freed while this guard's reader
        // count is held (writers wait for it to drop to zero).
        unsafe { &(*self.snap).items }
    }
}

impl<V: Copy + Eq + Send + Sync + 'static> Drop for ReadGuard<'_, V> {
    fn drop(&mut self) {
        self.table.grace.exit(self.parity);
    }
}

impl<V: Copy + Eq + Send + Sync + 'static> Default for SnapshotTable<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Copy + Eq + Send + Sync + 'static> SnapshotTable<V> {
    /// An empty table (usable in a `static`).
    pub const fn new() -> Self {
        SnapshotTable {
            writer: Mutex::new(IntervalMap { items: Vec::new() }),
            current: AtomicPtr::new(std::ptr::null_mut()),
            grace: Grace::new(),
        }
    }

    /// Enters a read-side critical section. Lock-free, allocation-free,
    /// async-signal-safe.
    #[inline]
    pub fn read(&self) -> ReadGuard<'_, V> {
        let parity = self.grace.enter();
        let snap = self.current.load(SeqCst);
        ReadGuard {
            table: self,
            parity,
            snap,
        }
    }

    /// Inserts (merging, see [`IntervalMap::insert`]) and publishes.
    pub fn insert(&self, start: u64, end: u64, value: V) -> Result<(), IntervalError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        w.insert(start, end, value)?;
        self.publish(&w);
        Ok(())
    }

    /// Removes (splitting) and publishes; when this returns no reader can
    /// still see the removed intervals.
    pub fn remove(&self, start: u64, end: u64) -> Vec<Interval<V>> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let removed = w.remove(start, end);
        self.publish(&w);
        removed
    }

    /// A copy of the current contents.
    pub fn to_vec(&self) -> Vec<Interval<V>> {
        self.read().items().to_vec()
    }

    fn publish(&self, w: &IntervalMap<V>) {
        let snap = Box::into_raw(Box::new(Snapshot {
            items: w.items.clone().into_boxed_slice(),
        }));
        let old = self.current.swap(snap, SeqCst);
        self.grace.synchronize();
        if !old.is_null() {
            // SAFETY: `old` was created by Box::into_raw in an earlier
            // publish, is no longer reachable through `current`, and no
            // reader holds it any more (grace period above).
            drop(unsafe { Box::from_raw(old) });
        }
    }
}

impl<V: Copy + Eq + Send + Sync + 'static> Drop for SnapshotTable<V> {
    fn drop(&mut self) {
        let p = *self.current.get_mut();
        if !p.is_null() {
            // SAFETY: exclusive access in drop; created by Box::into_raw.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn merge_and_split() {
        let mut m = IntervalMap::new();
        m.insert(0x1000, 0x2000, ()).unwrap();
        m.insert(0x3000, 0x4000, ()).unwrap();
        m.insert(0x2000, 0x3000, ()).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m.as_slice()[0].start, m.as_slice()[0].end),
            (0x1000, 0x4000)
        );
        m.remove(0x1800, 0x2800);
        assert_eq!(m.len(), 2);
        assert!(m.lookup(0x1800).is_none());
        assert!(m.lookup(0x17ff).is_some());
        assert!(m.lookup(0x2800).is_some());
    }

    #[test]
    fn distinct_values_do_not_merge_or_overlap() {
        let mut m = IntervalMap::new();
        m.insert(0x1000, 0x2000, 1u32).unwrap();
        m.insert(0x2000, 0x3000, 2u32).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m.lookup(0x2000).unwrap().value, 2);
        let err = m.insert(0x1800, 0x2800, 3).unwrap_err();
        assert!(matches!(err, IntervalError::Overlap { .. }));
        assert_eq!(m.len(), 2);
        assert!(matches!(
            m.insert(5, 5, 1),
            Err(IntervalError::Empty { .. })
        ));
    }

    // Model: one value per unit cell in a small universe.
    fn check_against_model(m: &IntervalMap<u8>, model: &BTreeMap<u64, u8>, universe: u64) {
        // Sorted, non-overlapping, non-empty, and same-value neighbours that
        // touch are merged.
        for w in m.as_slice().windows(2) {
            assert!(w[0].end <= w[1].start);
            assert!(!(w[0].end == w[1].start && w[0].value == w[1].value));
        }
        for it in m.as_slice() {
            assert!(it.start < it.end);
        }
        for a in 0..universe {
            assert_eq!(
                m.lookup(a).map(|i| i.value),
                model.get(&a).copied(),
                "addr {a}"
            );
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_cell_model(ops in prop::collection::vec((any::<bool>(), 0u64..64, 1u64..16, 0u8..3), 1..60)) {
            let mut m = IntervalMap::new();
            let mut model = BTreeMap::new();
            for (ins, start, len, v) in ops {
                let end = start + len;
                if ins {
                    let clash = (start..end).any(|a| model.get(&a).is_some_and(|&x| x != v));
                    let r = m.insert(start, end, v);
                    prop_assert_eq!(r.is_err(), clash);
                    if !clash {
                        for a in start..end { model.insert(a, v); }
                    }
                } else {
                    let removed: u64 = m.remove(start, end).iter().map(|i| i.end - i.start).sum();
                    let mut n = 0;
                    for a in start..end { if model.remove(&a).is_some() { n += 1; } }
                    prop_assert_eq!(removed, n);
                }
                check_against_model(&m, &model, 96);
            }
        }

        #[test]
        fn snapshot_table_matches_map(ops in prop::collection::vec((any::<bool>(), 0u64..64, 1u64..16), 1..40)) {
            let t = SnapshotTable::<()>::new();
            let mut m = IntervalMap::new();
            for (ins, s, l) in ops {
                if ins { let _ = t.insert(s, s + l, ()); let _ = m.insert(s, s + l, ()); }
                else { t.remove(s, s + l); m.remove(s, s + l); }
                prop_assert_eq!(t.to_vec(), m.as_slice().to_vec());
            }
        }
    }

    #[test]
    fn concurrent_readers_see_consistent_snapshots() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let t = Arc::new(SnapshotTable::<u64>::new());
        // A permanent interval readers must always find.
        t.insert(0, 0x1000, 7).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (t, stop, reads) = (t.clone(), stop.clone(), reads.clone());
                std::thread::spawn(move || {
                    while !stop.load(SeqCst) {
                        let g = t.read();
                        assert_eq!(g.lookup(0x800).map(|i| i.value), Some(7));
                        for w in g.items().windows(2) {
                            assert!(w[0].end <= w[1].start);
                        }
                        reads.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        // Write until the readers have overlapped with plenty of writes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut i = 0u64;
        while i < 2000 || (reads.load(SeqCst) < 10_000 && std::time::Instant::now() < deadline) {
            let s = 0x10000 + (i % 50) * 0x1000;
            t.insert(s, s + 0x1000, i).unwrap();
            t.remove(s, s + 0x1000);
            i += 1;
        }
        stop.store(true, SeqCst);
        for r in readers {
            r.join().unwrap();
        }
        assert!(reads.load(SeqCst) > 0);
        assert_eq!(t.to_vec().len(), 1);
    }
}
