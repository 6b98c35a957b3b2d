//! Time-stamp counter: the clock every latency in `faultline bench` is taken with.
//!
//! How it works:
//! 1. [`rdtsc`] reads the TSC between two `lfence`s, so the read is neither hoisted
//!    above the code being timed nor sunk below it (the page fault of a timed access
//!    is taken before the second read can execute).
//! 2. [`Tsc::calibrate`] compares TSC ticks with `CLOCK_MONOTONIC` over ~60 ms, giving
//!    cycles per nanosecond; the TSC is invariant and synchronised across CPUs on the
//!    project's machines, so one calibration serves every thread.
//! 3. [`tsc()`] calibrates once per process and hands out the result.
//!
//! On other architectures [`rdtsc`] falls back to `CLOCK_MONOTONIC` nanoseconds, so
//! the calibration yields 1 cycle per ns and everything still works, less precisely.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Read the time-stamp counter, ordered by `lfence` on both sides.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn rdtsc() -> u64 {
    use core::arch::x86_64::{_mm_lfence, _rdtsc};
    // SAFETY: `lfence` and `rdtsc` only read the counter and order instructions; they
    // touch no memory and are available on every x86_64 CPU (SSE2 is baseline).
    unsafe {
        _mm_lfence();
        let t = _rdtsc();
        _mm_lfence();
        t
    }
}

/// Fallback for non-x86_64 targets: `CLOCK_MONOTONIC` in nanoseconds.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn rdtsc() -> u64 {
    monotonic_ns()
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn monotonic_ns() -> u64 {
    faultline_sys::monotonic_ns()
}

/// A calibrated TSC: converts cycle counts to nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tsc {
    cycles_per_ns: f64,
    /// Median cost in cycles of two back-to-back [`rdtsc`] calls (the floor of
    /// every timed access).
    pub overhead_cycles: u64,
}

impl Tsc {
    /// Measure TSC cycles per nanosecond against `CLOCK_MONOTONIC` over about 60 ms.
    pub fn calibrate() -> Tsc {
        Self::calibrate_for(Duration::from_millis(60))
    }

    /// Like [`Tsc::calibrate`] with a chosen measuring window.
    pub fn calibrate_for(window: Duration) -> Tsc {
        let (n0, c0) = Self::paired_read();
        let start = Instant::now();
        while start.elapsed() < window {
            std::thread::sleep(window / 4);
        }
        let (n1, c1) = Self::paired_read();
        let ns = n1.saturating_sub(n0).max(1) as f64;
        let cycles_per_ns = (c1.wrapping_sub(c0) as f64 / ns).max(1e-9);
        Tsc {
            cycles_per_ns,
            overhead_cycles: Self::measure_overhead(),
        }
    }

    /// A TSC built from a known frequency (tests).
    #[cfg(test)]
    pub fn from_ghz(ghz: f64) -> Tsc {
        Tsc {
            cycles_per_ns: ghz,
            overhead_cycles: 0,
        }
    }

    /// Read the monotonic clock and the TSC as close together as possible: keep
    /// the pair whose TSC bracket is narrowest out of a few tries.
    fn paired_read() -> (u64, u64) {
        let mut best = (0, 0, u64::MAX);
        for _ in 0..16 {
            let a = rdtsc();
            let ns = monotonic_ns();
            let b = rdtsc();
            if b.wrapping_sub(a) < best.2 {
                best = (ns, a / 2 + b / 2, b.wrapping_sub(a));
            }
        }
        (best.0, best.1)
    }

    fn measure_overhead() -> u64 {
        let mut v: Vec<u64> = (0..1001)
            .map(|_| {
                let a = rdtsc();
                let b = rdtsc();
                b.wrapping_sub(a)
            })
            .collect();
        v.sort_unstable();
        v[v.len() / 2]
    }

    /// Convert a cycle count to nanoseconds.
    #[inline]
    pub fn cycles_to_ns(&self, cycles: u64) -> f64 {
        cycles as f64 / self.cycles_per_ns
    }

    /// Convert nanoseconds to a cycle count (rounded).
    #[inline]
    pub fn ns_to_cycles(&self, ns: f64) -> u64 {
        (ns * self.cycles_per_ns).round() as u64
    }

    /// TSC frequency in GHz (= cycles per nanosecond).
    #[inline]
    pub fn ghz(&self) -> f64 {
        self.cycles_per_ns
    }
}

/// The process-wide calibrated TSC (calibrated on first use, ~60 ms).
pub fn tsc() -> &'static Tsc {
    static TSC: OnceLock<Tsc> = OnceLock::new();
    TSC.get_or_init(Tsc::calibrate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdtsc_is_monotonic_on_one_thread() {
        let a = rdtsc();
        let b = rdtsc();
        assert!(b >= a);
    }

    #[test]
    fn conversion_round_trips() {
        let t = Tsc::from_ghz(2.5);
        assert_eq!(t.cycles_to_ns(2500), 1000.0);
        assert_eq!(t.ns_to_cycles(1000.0), 2500);
        assert_eq!(t.ghz(), 2.5);
    }

    #[test]
    fn calibration_is_plausible() {
        let t = Tsc::calibrate_for(Duration::from_millis(20));
        // Any machine this runs on has a TSC between 0.5 and 10 GHz (or the 1 GHz
        // monotonic fallback).
        assert!(t.ghz() > 0.5 && t.ghz() < 10.0, "ghz = {}", t.ghz());
    }
}
