//! What a peer's faults cost and what kind they were: the counters a live
//! metrics endpoint reads while a restore runs.
//!
//! 1. **Kind.** Each fault message is counted once, when it is read, by
//!    its flags: `minor` (a page-cache page exists: shared mode's
//!    CONTINUE), `wp` (a write-protected page was written), `write`,
//!    else `read`.
//! 2. **Service time.** From the moment the peer's handler thread starts
//!    on a fault (just after the message is read; for a fault deferred
//!    after EAGAIN, when it is tried again) to the end of the resolve
//!    ioctl that wakes the faulting thread, in `CLOCK_MONOTONIC`
//!    nanoseconds. Counted when the fault's resolution is final (not a
//!    deferral), into power-of-two buckets from 1 µs to about 1 s:
//!
//! ```text
//!   bucket i counts services of at most SERVICE_BOUNDS_NS[i] ns
//!   1µs 2µs 4µs ... 524ms 1.05s | +Inf (the last count)
//! ```
//!
//! 3. **Demand pages.** A fault whose page is present once it is resolved
//!    counts one demand page (the faulting page itself); the pages its
//!    read-ahead window installed beside it are the peer's installed pages
//!    less demand, prefetch and run-ahead pages.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use faultline_sys::uffd::pagefault_flag;

/// Buckets of [`ServiceTimes`] with an upper bound.
pub const SERVICE_BUCKETS: usize = 21;

/// The upper bounds of [`ServiceTimes::counts`], ns: 1 µs doubling to
/// about 1.05 s (the last count, `counts[SERVICE_BUCKETS]`, is +Inf).
pub const SERVICE_BOUNDS_NS: [u64; SERVICE_BUCKETS] = {
    let mut b = [0u64; SERVICE_BUCKETS];
    let mut i = 0;
    while i < SERVICE_BUCKETS {
        b[i] = 1000 << i;
        i += 1;
    }
    b
};

/// Fault messages of a peer by kind (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultKinds {
    /// MISSING faults of reads.
    pub read: u64,
    /// MISSING faults of writes.
    pub write: u64,
    /// MINOR faults (shared mode).
    pub minor: u64,
    /// Write-protect faults.
    pub wp: u64,
}

impl FaultKinds {
    /// Every fault message counted (each is of exactly one kind).
    pub fn total(&self) -> u64 {
        self.read + self.write + self.minor + self.wp
    }
}

/// A peer's fault-service-time histogram (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceTimes {
    /// Services per bucket (not cumulative): `counts[i]` took at most
    /// `SERVICE_BOUNDS_NS[i]` and more than the bound before it; the last
    /// took longer than every bound.
    pub counts: [u64; SERVICE_BUCKETS + 1],
    /// All services, ns, summed.
    pub sum_ns: u64,
}

impl ServiceTimes {
    /// Services counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Counts one duration of `ns` (the histogram is used for other
    /// durations than services too: a peer's reported vCPU stalls).
    pub fn record(&mut self, ns: u64) {
        self.counts[SERVICE_BOUNDS_NS.partition_point(|&b| b < ns)] += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }
}

/// The counters behind [`FaultKinds`], [`ServiceTimes`] and demand pages
/// (relaxed atomics, written by the peer's handler thread).
#[derive(Debug, Default)]
pub(super) struct ServiceCounters {
    read: AtomicU64,
    write: AtomicU64,
    minor: AtomicU64,
    wp: AtomicU64,
    demand: AtomicU64,
    counts: [AtomicU64; SERVICE_BUCKETS + 1],
    sum_ns: AtomicU64,
}

impl ServiceCounters {
    /// Counts a fault message with `flags` by its kind.
    pub(super) fn message(&self, flags: u64) {
        let c = if flags & pagefault_flag::MINOR != 0 {
            &self.minor
        } else if flags & pagefault_flag::WP != 0 {
            &self.wp
        } else if flags & pagefault_flag::WRITE != 0 {
            &self.write
        } else {
            &self.read
        };
        c.fetch_add(1, Relaxed);
    }

    /// A fault's resolution is final after `ns`; `present`: its page is
    /// there (one demand page).
    pub(super) fn served(&self, ns: u64, present: bool) {
        // The bucket as `ServiceTimes::record` picks it.
        let i = SERVICE_BOUNDS_NS.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        if present {
            self.demand.fetch_add(1, Relaxed);
        }
    }

    pub(super) fn kinds(&self) -> FaultKinds {
        FaultKinds {
            read: self.read.load(Relaxed),
            write: self.write.load(Relaxed),
            minor: self.minor.load(Relaxed),
            wp: self.wp.load(Relaxed),
        }
    }

    pub(super) fn times(&self) -> ServiceTimes {
        ServiceTimes {
            counts: std::array::from_fn(|i| self.counts[i].load(Relaxed)),
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }

    pub(super) fn demand(&self) -> u64 {
        self.demand.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_land_in_their_power_of_two_bucket_and_kinds_by_flags() {
        let c = ServiceCounters::default();
        for ns in [0, 1000, 1001, 3000, 2_000_000_000] {
            c.served(ns, true);
        }
        c.served(5000, false);
        let t = c.times();
        assert_eq!(t.counts[0], 2, "0 and 1000 ns: at most 1 µs");
        assert_eq!(t.counts[1], 1, "1001 ns: at most 2 µs");
        assert_eq!(t.counts[2], 1, "3 µs: at most 4 µs");
        assert_eq!(t.counts[3], 1, "5 µs: at most 8 µs");
        assert_eq!(t.counts[SERVICE_BUCKETS], 1, "2 s: +Inf");
        assert_eq!(t.count(), 6);
        assert_eq!(t.sum_ns, 2_000_010_001);
        // `record` bins as the counters do.
        let mut r = ServiceTimes::default();
        for ns in [0, 1000, 1001, 3000, 2_000_000_000, 5000] {
            r.record(ns);
        }
        assert_eq!(r, t);
        assert_eq!(c.demand(), 5);
        for f in [
            0,
            pagefault_flag::WRITE,
            pagefault_flag::WRITE | pagefault_flag::WP,
            pagefault_flag::MINOR,
            pagefault_flag::MINOR | pagefault_flag::WRITE,
        ] {
            c.message(f);
        }
        assert_eq!(
            c.kinds(),
            FaultKinds {
                read: 1,
                write: 1,
                minor: 2,
                wp: 1
            }
        );
    }
}
