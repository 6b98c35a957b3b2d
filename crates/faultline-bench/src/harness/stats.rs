//! Summary statistics of latency samples.
//!
//! Percentiles use the nearest-rank method on the sorted samples: the p-th
//! percentile is the smallest sample such that at least p % of the samples are
//! less than or equal to it (rank `ceil(p/100 * n)`, 1-based). The median is
//! the middle sample, or the mean of the two middle ones for an even count
//! ([`median_sorted`]: two runs' median is neither the faster nor the
//! slower). The standard deviation is the sample (n - 1) deviation.

use super::tsc::Tsc;

/// Latency summary, every field except `n` in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// The median ([`median_sorted`]).
    pub median: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// 99.9th percentile (nearest rank).
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Smallest sample.
    pub min: f64,
    /// Sample standard deviation (n - 1); 0 for fewer than two samples.
    pub std: f64,
}

impl Summary {
    /// Nothing measured: every figure NaN (written as `null` in the
    /// JSON, `-` in tables), no samples. Fill in what was measured:
    /// `Summary { n, median, p99, ..Summary::NONE }`.
    pub const NONE: Summary = Summary {
        n: 0,
        mean: f64::NAN,
        median: f64::NAN,
        p99: f64::NAN,
        p999: f64::NAN,
        max: f64::NAN,
        min: f64::NAN,
        std: f64::NAN,
    };

    /// Summarise TSC cycle samples, converted to ns with `tsc`. Sorts `cycles`.
    pub fn from_cycles(cycles: &mut [u64], tsc: &Tsc) -> Summary {
        cycles.sort_unstable();
        let mut ns: Vec<f64> = cycles.iter().map(|&c| tsc.cycles_to_ns(c)).collect();
        Self::from_sorted_ns(&mut ns)
    }

    /// Summarise nanosecond samples. Sorts `ns` (NaNs sort last).
    pub fn from_ns(ns: &mut [f64]) -> Summary {
        ns.sort_unstable_by(f64::total_cmp);
        Self::from_sorted_ns(ns)
    }

    fn from_sorted_ns(ns: &mut [f64]) -> Summary {
        let n = ns.len();
        if n == 0 {
            return Summary::default();
        }
        let mean = ns.iter().sum::<f64>() / n as f64;
        let std = if n > 1 {
            (ns.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Summary {
            n,
            mean,
            median: median_sorted(ns),
            p99: percentile_sorted(ns, 99.0),
            p999: percentile_sorted(ns, 99.9),
            max: ns[n - 1],
            min: ns[0],
            std,
        }
    }
}

/// The median of already sorted samples: the middle one, or the mean of
/// the two middle ones; NaN if empty.
pub fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The median of `v` ([`median_sorted`]); sorts `v` (NaNs last).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    median_sorted(v)
}

/// Nearest-rank percentile `p` (0..=100) of already sorted samples; 0 if empty.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let n = sorted.len();
    // The epsilon keeps e.g. 0.999 * 1000 = 999.0000000000001 at rank 999.
    let rank = ((p / 100.0) * n as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Convert cycle samples to nanoseconds (helper for plots).
pub fn cycles_to_ns_vec(cycles: &[u64], tsc: &Tsc) -> Vec<f64> {
    cycles.iter().map(|&c| tsc.cycles_to_ns(c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_all_zero() {
        assert_eq!(Summary::from_ns(&mut []), Summary::default());
    }

    #[test]
    fn one_sample() {
        let s = Summary::from_ns(&mut [7.0]);
        assert_eq!(s.n, 1);
        assert_eq!(
            (s.min, s.median, s.p99, s.max, s.std),
            (7.0, 7.0, 7.0, 7.0, 0.0)
        );
    }

    #[test]
    fn nearest_rank_on_1_to_1000() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let s = Summary::from_ns(&mut v);
        assert_eq!(s.n, 1000);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0);
        assert_eq!(s.median, 500.5);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert!((s.mean - 500.5).abs() < 1e-9);
        // Sample std of 1..=n is sqrt(n(n+1)/12).
        assert!((s.std - (1000.0f64 * 1001.0 / 12.0).sqrt()).abs() < 1e-6);
    }

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut [0.23, 7.93]), (0.23 + 7.93) / 2.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn percentile_small_sets() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile_sorted(&v, 50.0), 2.0);
        assert_eq!(percentile_sorted(&v, 75.0), 3.0);
        assert_eq!(percentile_sorted(&v, 76.0), 4.0);
        assert_eq!(percentile_sorted(&v, 0.0), 1.0);
        assert_eq!(percentile_sorted(&v, 100.0), 4.0);
    }

    #[test]
    fn cycles_are_converted() {
        let tsc = Tsc::from_ghz(2.0);
        let mut c = vec![4000, 2000, 6000];
        let s = Summary::from_cycles(&mut c, &tsc);
        assert_eq!(c, vec![2000, 4000, 6000]);
        assert_eq!(
            (s.min, s.median, s.max, s.mean),
            (1000.0, 2000.0, 3000.0, 2000.0)
        );
        assert!((s.std - 1000.0).abs() < 1e-9);
    }
}
