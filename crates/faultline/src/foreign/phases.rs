//! Phase samples: where the time of a peer's demand faults goes, as TSC
//! stamps taken along the handler's path, kept for the last N faults of
//! each peer ([`ForeignOptions::phase_samples`]; none by default).
//!
//! ```text
//!   vCPU touch ─► kernel queues the message ─► read(2) returns ─► this
//!   fault's turn in the batch ─► store read / page cache filled ─► install
//!   ioctl returns ─► UFFDIO_WAKE returns ─► vCPU resumes
//!   (peer's stamp)                 read        start         filled
//!                                  resolved    woken         (peer's stamp)
//! ```
//!
//! 1. The handler thread stamps the `read(2)` that returned a batch
//!    (`read`), the start of each fault's handling (`start`), and the
//!    resolve path stamps its steps on the thread (`filled`, `resolved`,
//!    `woken`, and the pages the ioctl installed: its window).
//! 2. Only faults read from the userfaultfd are sampled (not deferred
//!    faults tried again), into a ring of the last N: bounded memory, one
//!    uncontended lock per fault while sampling, nothing when off.
//! 3. The TSC is invariant and shared by the CPUs here, so a peer that
//!    stamps each touch before and after (`faultline peer --stamps`) can
//!    join its stamps with these by page address: `bench restore` does,
//!    and reports each phase's median and 99th percentile.
//!
//! [`ForeignOptions::phase_samples`]: super::ForeignOptions::phase_samples

use std::sync::Mutex;

use crate::fault::resolve::Stamps;

/// One sampled fault: TSC stamps along the handler's path (0: the step
/// did not happen, e.g. the page was already there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultPhases {
    /// The fault's address (page-aligned unless the peer asked for exact
    /// addresses).
    pub addr: u64,
    /// The `read(2)` that returned it returned.
    pub read: u64,
    /// Its handling started (after the batch's earlier messages).
    pub start: u64,
    /// The bytes were ready: the install ioctl was about to start.
    pub filled: u64,
    /// The install ioctl of its page's run returned.
    pub resolved: u64,
    /// The faulting thread's `UFFDIO_WAKE` returned.
    pub woken: u64,
    /// Its handling ended.
    pub done: u64,
    /// Pages the install ioctl installed (the fault's window).
    pub pages: u64,
}

impl FaultPhases {
    /// Its fields in order: address, read, start, filled, resolved,
    /// woken, done, pages (how `faultline serve` writes a sample).
    pub fn fields(&self) -> [u64; 8] {
        [
            self.addr,
            self.read,
            self.start,
            self.filled,
            self.resolved,
            self.woken,
            self.done,
            self.pages,
        ]
    }

    /// The sample whose [`FaultPhases::fields`] are `f`.
    pub fn from_fields(f: [u64; 8]) -> FaultPhases {
        let [addr, read, start, filled, resolved, woken, done, pages] = f;
        FaultPhases {
            addr,
            read,
            start,
            filled,
            resolved,
            woken,
            done,
            pages,
        }
    }

    /// A fault at `addr` read at `read`, handled from `start` to `done`,
    /// with the resolve path's stamps `s`.
    pub(super) fn new(addr: u64, (read, start, done): (u64, u64, u64), s: Stamps) -> Self {
        FaultPhases {
            addr,
            read,
            start,
            filled: s.filled,
            resolved: s.resolved,
            woken: s.woken,
            done,
            pages: s.pages,
        }
    }
}

/// The last `cap` samples of one peer.
#[derive(Debug)]
pub(super) struct PhaseRing {
    cap: usize,
    /// The samples and where the next one goes once full.
    buf: Mutex<(Vec<FaultPhases>, usize)>,
}

impl PhaseRing {
    /// A ring of the last `cap` samples (`None`: 0, sampling off).
    pub fn new(cap: usize) -> Option<PhaseRing> {
        (cap > 0).then(|| PhaseRing {
            cap,
            buf: Mutex::new((Vec::new(), 0)),
        })
    }

    /// Keeps `f`, dropping the oldest sample when full.
    pub fn push(&self, f: FaultPhases) {
        let mut g = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        let (v, next) = &mut *g;
        if v.len() < self.cap {
            v.push(f);
        } else {
            v[*next] = f;
            *next = (*next + 1) % self.cap;
        }
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> Vec<FaultPhases> {
        let g = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        let (v, next) = &*g;
        v[*next..].iter().chain(&v[..*next]).copied().collect()
    }

    /// Bytes it holds at most.
    pub fn bytes(&self) -> usize {
        self.cap * std::mem::size_of::<FaultPhases>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: u64) -> FaultPhases {
        FaultPhases {
            addr,
            ..Default::default()
        }
    }

    #[test]
    fn a_full_ring_keeps_the_last_samples_oldest_first() {
        let r = PhaseRing::new(3).unwrap();
        for a in 1..=5 {
            r.push(at(a));
        }
        let got: Vec<u64> = r.samples().iter().map(|f| f.addr).collect();
        assert_eq!(got, vec![3, 4, 5]);
        r.push(at(6));
        let got: Vec<u64> = r.samples().iter().map(|f| f.addr).collect();
        assert_eq!(got, vec![4, 5, 6]);
    }

    #[test]
    fn fields_round_trip() {
        let f = FaultPhases::from_fields([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!((f.addr, f.woken, f.pages), (1, 6, 8));
        assert_eq!(f.fields(), [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn no_ring_without_samples() {
        assert!(PhaseRing::new(0).is_none());
        let r = PhaseRing::new(2).unwrap();
        r.push(at(9));
        assert_eq!(r.samples(), vec![at(9)]);
    }
}
