//! Where the library's background threads run: off the CPU of the
//! latency-critical thread they serve. A queue's submitting thread sleeps
//! between I/Os, so its CPU often looks idle when a fault worker or the
//! access-log drainer wakes, and the kernel keeps a waking thread on its
//! idle previous CPU: the submitter, woken by its next I/O, then waits
//! behind the page's fill and copy or a drain (B2's trace: 20-50 µs each).

use faultline_sys::thread::{allowed_cpus, set_affinity};

/// A background thread's CPU placement that keeps off one CPU: the one a
/// latency-critical thread (a queue's submitter) runs on. The thread may
/// use every CPU it was allowed at [`KeepOff::new`] but that one, as long
/// as another is left; with one allowed CPU it stays put.
pub(crate) struct KeepOff {
    allowed: Vec<usize>,
    off: Option<usize>,
}

impl KeepOff {
    /// The calling thread's allowed CPUs, none kept off yet.
    pub(crate) fn new() -> KeepOff {
        KeepOff {
            allowed: allowed_cpus().unwrap_or_default(),
            off: None,
        }
    }

    /// Keeps the calling thread off `cpu` (`None`: allows all again);
    /// one `sched_setaffinity` when that changes. Whether it now keeps
    /// off a CPU.
    pub(crate) fn keep_off(&mut self, cpu: Option<usize>) -> bool {
        if self.allowed.len() < 2 {
            return false;
        }
        let want = cpu.filter(|c| self.allowed.contains(c));
        if want != self.off {
            let cpus: Vec<usize> = self
                .allowed
                .iter()
                .copied()
                .filter(|&c| Some(c) != want)
                .collect();
            if set_affinity(&cpus).is_ok() {
                self.off = want;
            }
        }
        self.off.is_some()
    }
}
