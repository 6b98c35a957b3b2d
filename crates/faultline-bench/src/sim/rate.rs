//! A device's I/O faults per second, folded into days (B9, the shape of
//! the paper's Fig 7): faults, burst seconds, the peak rate.

/// One device's I/O faults in one simulated day (B9, Fig 7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DayRate {
    /// I/O faults that day.
    pub iopfs: u64,
    /// Seconds with more than [`BURST_PER_S`] I/O faults.
    pub burst_secs: u64,
    /// The most I/O faults in one second.
    pub peak_per_s: u64,
}

/// A device's I/O faults per second, folded into days.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FaultRate {
    /// One entry per simulated day begun (the last may be partial).
    pub days: Vec<DayRate>,
}

/// A burst second (Fig 7): more than this many I/O faults.
pub(crate) const BURST_PER_S: u64 = 5;
/// Seconds per simulated day.
pub(crate) const DAY_S: u64 = 86_400;

impl FaultRate {
    /// Adds second `t`'s `n` I/O faults.
    pub fn second(&mut self, t: u64, n: u64) {
        let d = (t / DAY_S) as usize;
        if self.days.len() <= d {
            self.days.resize(d + 1, DayRate::default());
        }
        let day = &mut self.days[d];
        day.iopfs += n;
        if n > BURST_PER_S {
            day.burst_secs += 1;
        }
        day.peak_per_s = day.peak_per_s.max(n);
    }
}
