//! Paging policies: which resident page to evict when the memory budget is
//! full, and how far to read ahead on a fault.
//!
//! Everything here is pure state-machine code: no syscalls, no `unsafe`, no
//! clocks. The runtime owns the pages and the locking; a policy only sees
//! page numbers (page index within a region) and answers questions, so every
//! policy can be unit- and property-tested in isolation.
//!
//! # Eviction
//!
//! How the runtime drives an [`EvictionPolicy`] (the evictor thread of a
//! region with a budget, [`crate::evict`], makes every call):
//!
//! 1. Every page the fault path installs is logged; the evictor hands each
//!    logged install to [`on_fault(p)`](EvictionPolicy::on_fault). Calling
//!    it for a page the policy already holds counts as an observed access.
//! 2. While more pages are resident than the budget, the evictor calls
//!    [`pick_victim`](EvictionPolicy::pick_victim) with a predicate that
//!    is true for pages a fault or a flush holds right now (their claim
//!    bit) or an I/O holds (its I/O references, which also carry pins; see
//!    [`crate::residency`]): those are pinned for this call. The returned page is no longer
//!    tracked; the evictor writes it back if dirty and drops it, and calls
//!    `on_fault(p)` again if that failed and the page stays resident.
//!
//! 3. Accesses the runtime learns of by other means (an I/O access log:
//!    [`crate::Region::access_hint`], fed by the `faultline-io` crate) are
//!    handed to [`on_access_hint`](EvictionPolicy::on_access_hint) (the
//!    hint ring is lossy: a full ring drops hints, counted).
//!
//! [`on_evicted`](EvictionPolicy::on_evicted) is part of the contract for
//! runtimes that learn of pages leaving memory by other means (a discard);
//! faultline's evictor does not call it today, and the policies' property
//! tests exercise it.
//!
//! Pinned pages are never returned: `pick_victim` takes a predicate, so the
//! pin state stays with the runtime.
//!
//! | policy          | victim                                    | per op       |
//! |-----------------|-------------------------------------------|--------------|
//! | [`Fifo`]        | oldest resident page (what UMap does)      | O(1)*        |
//! | [`Clock`]       | oldest page not referenced since its last  | amortised O(1)* |
//! |                 | sweep (second chance)                      |              |
//! | [`RefaultAware`]| 2Q: new pages on probation (FIFO); pages   | amortised O(1)* |
//! |                 | that re-fault soon after eviction are      |              |
//! |                 | protected (CLOCK)                          |              |
//!
//! (*) plus one step per pinned page skipped. Memory is bounded: O(resident
//! pages), plus a ghost list of at most `capacity / 2` page numbers for
//! [`RefaultAware`].
//!
//! # Read-ahead
//!
//! [`ReadaheadConfig`] decides, for a fault at page `p`, which pages to
//! install: the aligned fault-around window of `p` for an isolated fault,
//! a window that doubles (up to a maximum) for a thread that keeps
//! faulting where its last window ended, like the kernel's fault-around
//! plus on-demand read-ahead. A fixed fault-around depth is the special
//! case `initial == max`. The fault path keeps one [`ReadaheadStream`] per
//! thread. [`IsolatedWindows`] sizes the isolated fault's window of a
//! peer's region from where later faults land (halving or doubling it by
//! what a fault costs against a page installed, [`WindowTuning`]).
//!
//! # Run-ahead
//!
//! [`StreamPredictor`] confirms sequential and strided fault streams and
//! predicts the windows a background thread installs ahead of them
//! ([`crate::runahead`]).

mod clock;
mod fifo;
mod isolated;
mod list;
mod predict;
mod readahead;
mod refault;

pub use clock::Clock;
pub use fifo::Fifo;
pub use isolated::{IsolatedWindows, WindowTuning};
pub use predict::StreamPredictor;
pub use readahead::{ReadaheadConfig, Stream as ReadaheadStream, STRIDE_SLACK};
pub use refault::RefaultAware;

use std::fmt;
use std::str::FromStr;

/// An eviction policy: tracks resident pages and chooses victims.
///
/// Page numbers are opaque `usize` values (normally the page index within a
/// region). See the [module docs](self) for the calling protocol.
pub trait EvictionPolicy: Send {
    /// Short name for reports (`"fifo"`, `"clock"`, `"refault"`).
    fn name(&self) -> &'static str;

    /// `page` became resident (a fault on it was resolved). If the policy
    /// already holds `page`, this counts as an observed access instead.
    fn on_fault(&mut self, page: usize);

    /// The runtime observed an access to resident `page`. Ignored for pages
    /// the policy does not hold. The default does nothing (FIFO).
    fn on_access_hint(&mut self, page: usize) {
        let _ = page;
    }

    /// `page` left memory without being chosen by [`pick_victim`]
    /// (discard, unmap, failed fill). No-op if the policy does not hold it.
    ///
    /// [`pick_victim`]: EvictionPolicy::pick_victim
    fn on_evicted(&mut self, page: usize);

    /// Chooses a victim among held pages for which `is_pinned` is false,
    /// stops tracking it and returns it. `None` if the policy holds no
    /// unpinned page.
    fn pick_victim(&mut self, is_pinned: &dyn Fn(usize) -> bool) -> Option<usize>;

    /// Number of resident pages held.
    fn len(&self) -> usize;

    /// Whether the policy holds no page.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `page` is held (resident as far as the policy knows).
    fn contains(&self, page: usize) -> bool;
}

/// The available eviction policies, for configuration and command lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// [`Fifo`].
    Fifo,
    /// [`Clock`].
    Clock,
    /// [`RefaultAware`].
    RefaultAware,
}

impl PolicyKind {
    /// All kinds, in documentation order.
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::Fifo,
        PolicyKind::Clock,
        PolicyKind::RefaultAware,
    ];

    /// Builds the policy for a budget of `capacity_pages` resident pages,
    /// sized to hold that many without allocating ([`RefaultAware`] also
    /// sizes its lists from it).
    pub fn build(self, capacity_pages: usize) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::Fifo => Box::new(Fifo::with_capacity(capacity_pages)),
            PolicyKind::Clock => Box::new(Clock::with_capacity(capacity_pages)),
            PolicyKind::RefaultAware => Box::new(RefaultAware::new(capacity_pages)),
        }
    }

    /// The name used by [`FromStr`] and [`EvictionPolicy::name`].
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Fifo => "fifo",
            PolicyKind::Clock => "clock",
            PolicyKind::RefaultAware => "refault",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that [`PolicyKind::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {0:?} (expected fifo, clock or refault)")]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fifo" => Ok(PolicyKind::Fifo),
            "clock" => Ok(PolicyKind::Clock),
            "refault" | "refault-aware" | "2q" => Ok(PolicyKind::RefaultAware),
            _ => Err(UnknownPolicy(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashSet};

    #[test]
    fn kinds_parse_and_name() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.as_str().parse::<PolicyKind>(), Ok(kind));
            assert_eq!(kind.build(16).name(), kind.as_str());
        }
        assert!("lru".parse::<PolicyKind>().is_err());
    }

    /// One step of a random workload against a policy.
    #[derive(Debug, Clone)]
    enum Op {
        Fault(usize),
        Hint(usize),
        Evicted(usize),
        Pick,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..64).prop_map(Op::Fault),
            2 => (0usize..64).prop_map(Op::Hint),
            1 => (0usize..64).prop_map(Op::Evicted),
            3 => Just(Op::Pick),
        ]
    }

    /// Runs `ops` against `policy` and a model resident set; checks that the
    /// policy never returns a page it does not hold or a pinned page, never
    /// returns `None` while an unpinned page is held, and that `len` and
    /// `contains` agree with the model.
    fn check_against_model(
        mut policy: Box<dyn EvictionPolicy>,
        ops: &[Op],
        pinned: &HashSet<usize>,
    ) {
        let mut model = BTreeSet::new();
        let is_pinned = |p: usize| pinned.contains(&p);
        for op in ops {
            match *op {
                Op::Fault(p) => {
                    policy.on_fault(p);
                    model.insert(p);
                }
                Op::Hint(p) => policy.on_access_hint(p),
                Op::Evicted(p) => {
                    policy.on_evicted(p);
                    model.remove(&p);
                }
                Op::Pick => match policy.pick_victim(&is_pinned) {
                    Some(v) => {
                        assert!(
                            model.remove(&v),
                            "{} returned page {v} it does not hold",
                            policy.name()
                        );
                        assert!(
                            !pinned.contains(&v),
                            "{} returned pinned page {v}",
                            policy.name()
                        );
                    }
                    None => assert!(
                        model.iter().all(|p| pinned.contains(p)),
                        "{} returned None with unpinned pages held",
                        policy.name()
                    ),
                },
            }
            assert_eq!(policy.len(), model.len());
        }
        for p in 0..64 {
            assert_eq!(
                policy.contains(p),
                model.contains(&p),
                "{} contains({p})",
                policy.name()
            );
        }
        // Draining returns every unpinned page exactly once.
        let mut drained = BTreeSet::new();
        while let Some(v) = policy.pick_victim(&is_pinned) {
            assert!(drained.insert(v), "{} returned {v} twice", policy.name());
        }
        let unpinned: BTreeSet<usize> = model
            .iter()
            .copied()
            .filter(|p| !pinned.contains(p))
            .collect();
        assert_eq!(drained, unpinned);
        assert_eq!(policy.len(), model.len() - unpinned.len());
    }

    proptest! {
        #[test]
        fn policies_agree_with_model(
            ops in proptest::collection::vec(op(), 0..300),
            pinned in proptest::collection::hash_set(0usize..64, 0..8),
            capacity in 1usize..40,
        ) {
            for kind in PolicyKind::ALL {
                check_against_model(kind.build(capacity), &ops, &pinned);
            }
        }

        #[test]
        fn every_page_evicted_exactly_once(pages in proptest::collection::vec(0usize..10_000, 0..500)) {
            for kind in PolicyKind::ALL {
                let mut policy = kind.build(64);
                let distinct: HashSet<usize> = pages.iter().copied().collect();
                for &p in &pages {
                    policy.on_fault(p);
                }
                let mut seen = HashSet::new();
                while let Some(v) = policy.pick_victim(&|_| false) {
                    prop_assert!(seen.insert(v));
                }
                prop_assert_eq!(seen, distinct);
                prop_assert!(policy.is_empty());
            }
        }
    }
}
