//! `PageList`: an ordered set of page numbers with O(1) insert, remove,
//! membership and rotation; the shared building block of every policy.
//!
//! ```text
//!   map: page -> slot          nodes (slab, reused through `free`)
//!   head ─▶ [p7|r] ⇄ [p2| ] ⇄ [p9|r] ◀─ tail
//! ```
//!
//! Each node carries one flag bit (`r` above) that CLOCK uses as the
//! referenced bit. Memory is proportional to the number of pages held.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const NIL: usize = usize::MAX;

/// A fast non-cryptographic hasher for page numbers (FxHash mixing).
///
/// Page numbers are not attacker-controlled, and a multiplication by an odd
/// constant keeps distinct consecutive pages in distinct buckets.
#[derive(Default, Clone, Copy)]
pub(crate) struct PageHasher(u64);

impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

type PageMap = HashMap<usize, usize, BuildHasherDefault<PageHasher>>;

#[derive(Clone, Copy)]
struct Node {
    page: usize,
    prev: usize,
    next: usize,
    flag: bool,
}

/// Doubly linked list of distinct pages, indexed by a hash map.
#[derive(Default)]
pub(crate) struct PageList {
    nodes: Vec<Node>,
    free: Vec<usize>,
    map: PageMap,
    head: usize,
    tail: usize,
}

impl PageList {
    /// An empty list.
    pub(crate) fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty list that holds `pages` pages without allocating: the map
    /// gets twice that room, so that the tombstones of pages removed and
    /// re-inserted are cleared by rehashing in place, never by growing.
    pub(crate) fn with_capacity(pages: usize) -> Self {
        Self {
            nodes: Vec::with_capacity(pages),
            free: Vec::with_capacity(pages),
            map: PageMap::with_capacity_and_hasher(pages.saturating_mul(2), Default::default()),
            head: NIL,
            tail: NIL,
        }
    }

    /// Number of pages held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether `page` is held.
    pub(crate) fn contains(&self, page: usize) -> bool {
        self.map.contains_key(&page)
    }

    /// Appends `page` at the back with the given flag; returns `false` (and
    /// changes nothing) if it is already held.
    pub(crate) fn push_back(&mut self, page: usize, flag: bool) -> bool {
        if self.map.contains_key(&page) {
            return false;
        }
        let node = Node {
            page,
            prev: self.tail,
            next: NIL,
            flag,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        if self.tail == NIL {
            self.head = slot;
        } else {
            self.nodes[self.tail].next = slot;
        }
        self.tail = slot;
        self.map.insert(page, slot);
        true
    }

    fn unlink(&mut self, slot: usize) {
        let Node { prev, next, .. } = self.nodes[slot];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next].prev = prev;
        }
    }

    /// Removes `page`; returns whether it was held.
    pub(crate) fn remove(&mut self, page: usize) -> bool {
        match self.map.remove(&page) {
            Some(slot) => {
                self.unlink(slot);
                self.free.push(slot);
                self.shrink_if_idle();
                true
            }
            None => false,
        }
    }

    /// Removes and returns the front page.
    pub(crate) fn pop_front(&mut self) -> Option<usize> {
        let page = self.front()?;
        self.remove(page);
        Some(page)
    }

    /// The front (oldest) page.
    pub(crate) fn front(&self) -> Option<usize> {
        (self.head != NIL).then(|| self.nodes[self.head].page)
    }

    /// Moves the front page to the back (one step of a CLOCK hand).
    pub(crate) fn rotate(&mut self) {
        let slot = self.head;
        if slot == NIL || slot == self.tail {
            return;
        }
        self.unlink(slot);
        self.nodes[slot].prev = self.tail;
        self.nodes[slot].next = NIL;
        self.nodes[self.tail].next = slot;
        self.tail = slot;
    }

    /// The flag of `page`, if held.
    pub(crate) fn flag(&self, page: usize) -> Option<bool> {
        self.map.get(&page).map(|&slot| self.nodes[slot].flag)
    }

    /// Sets the flag of `page`; returns whether it was held.
    pub(crate) fn set_flag(&mut self, page: usize, flag: bool) -> bool {
        match self.map.get(&page) {
            Some(&slot) => {
                self.nodes[slot].flag = flag;
                true
            }
            None => false,
        }
    }

    /// The first page from the front for which `pred` holds (O(position)).
    pub(crate) fn find_from_front(&self, mut pred: impl FnMut(usize) -> bool) -> Option<usize> {
        let mut slot = self.head;
        while slot != NIL {
            let node = self.nodes[slot];
            if pred(node.page) {
                return Some(node.page);
            }
            slot = node.next;
        }
        None
    }

    /// Pages from front to back (for tests and debugging).
    #[cfg(test)]
    pub(crate) fn pages(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.len());
        let mut slot = self.head;
        while slot != NIL {
            out.push(self.nodes[slot].page);
            slot = self.nodes[slot].next;
        }
        out
    }

    /// Returns slab memory once the list is empty, so a drained policy does
    /// not keep its high-water mark.
    fn shrink_if_idle(&mut self) {
        if self.map.is_empty() {
            self.nodes.clear();
            self.free.clear();
            self.head = NIL;
            self.tail = NIL;
        }
    }
}

/// One CLOCK sweep over `list`: the hand is the front; a referenced page has
/// its bit cleared and moves to the back (second chance), a pinned page moves
/// to the back untouched, the first unreferenced unpinned page is removed and
/// returned. Ends after at most two full turns, so it returns `None` only if
/// every page is pinned.
pub(crate) fn clock_sweep(list: &mut PageList, is_pinned: &dyn Fn(usize) -> bool) -> Option<usize> {
    let limit = list.len().saturating_mul(2);
    for _ in 0..limit {
        let page = list.front()?;
        if is_pinned(page) {
            list.rotate();
        } else if list.flag(page) == Some(true) {
            list.set_flag(page, false);
            list.rotate();
        } else {
            list.remove(page);
            return Some(page);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_remove_rotate() {
        let mut l = PageList::new();
        assert!(l.push_back(1, false));
        assert!(l.push_back(2, true));
        assert!(l.push_back(3, false));
        assert!(!l.push_back(2, false));
        assert_eq!(l.pages(), vec![1, 2, 3]);
        l.rotate();
        assert_eq!(l.pages(), vec![2, 3, 1]);
        assert!(l.remove(3));
        assert!(!l.remove(3));
        assert_eq!(l.pages(), vec![2, 1]);
        assert_eq!(l.flag(2), Some(true));
        assert_eq!(l.pop_front(), Some(2));
        assert_eq!(l.pop_front(), Some(1));
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn clock_sweep_all_pinned_is_none() {
        let mut l = PageList::new();
        for p in 0..5 {
            l.push_back(p, true);
        }
        assert_eq!(clock_sweep(&mut l, &|_| true), None);
        assert_eq!(l.len(), 5);
    }
}
