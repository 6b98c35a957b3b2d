//! What the vCPU threads share, whichever runs them (the peer's own
//! loads in `workload`, or KVM vCPUs in `kvm`): which pages each touches,
//! and what they measured together.

use std::time::Instant;

use super::args::Pattern;

/// Whether vCPU `t` of `n` touches page `i` of a `len`-page working set:
/// every `n`-th page (clustered), or its contiguous share (sweep).
pub fn mine(pattern: Pattern, i: usize, t: usize, n: usize, len: usize) -> bool {
    match pattern {
        Pattern::Clustered => i % n == t,
        Pattern::Sweep => i * n / len.max(1) == t,
    }
}

/// What the vCPU threads measured.
pub struct Touched {
    /// First-touch latencies, ns, sorted.
    pub latencies: Vec<u64>,
    /// When the last thread finished.
    pub end: Instant,
    /// `CLOCK_MONOTONIC` ns when the threads were about to start.
    pub vcpus_ns: u64,
    /// ... when the first touch began.
    pub first_touch_ns: u64,
    /// ... when the last touch ended.
    pub last_touch_ns: u64,
    /// Voluntary context switches of the threads, summed.
    pub slept: u64,
    /// Nonvoluntary ones.
    pub preempted: u64,
    /// `--stamps`: the threads' last slow touches (page, TSC before, TSC
    /// after).
    pub stamps: Vec<(u64, u64, u64)>,
}

/// One vCPU thread's part of [`Touched`].
pub struct Thread {
    /// When it finished.
    pub end: Instant,
    /// `CLOCK_MONOTONIC` ns of its first touch and of its last touch's end.
    pub span_ns: (u64, u64),
    /// Its (voluntary, nonvoluntary) context switches.
    pub switches: (u64, u64),
    /// Its first-touch latencies, ns.
    pub latencies: Vec<u64>,
    /// Its last slow touches.
    pub stamps: Vec<(u64, u64, u64)>,
}

impl Touched {
    /// The threads' parts together; `vcpus_ns` when they were started.
    pub fn of(vcpus_ns: u64, threads: impl IntoIterator<Item = Thread>) -> Touched {
        let mut out = Touched {
            latencies: Vec::new(),
            end: Instant::now(),
            vcpus_ns,
            first_touch_ns: u64::MAX,
            last_touch_ns: 0,
            slept: 0,
            preempted: 0,
            stamps: Vec::new(),
        };
        let mut end = None;
        for t in threads {
            end = end.max(Some(t.end));
            out.first_touch_ns = out.first_touch_ns.min(t.span_ns.0);
            out.last_touch_ns = out.last_touch_ns.max(t.span_ns.1);
            out.slept += t.switches.0;
            out.preempted += t.switches.1;
            out.latencies.extend(t.latencies);
            out.stamps.extend(t.stamps);
        }
        out.end = end.unwrap_or(out.end);
        out.latencies.sort_unstable();
        out
    }
}
