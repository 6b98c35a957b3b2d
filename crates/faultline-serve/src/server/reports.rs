//! What a peer reports of itself after its hand-off: its vCPUs' stalls.
//!
//! serve times a fault from the moment it reads the message (the service
//! time); how long the faulting vCPU waited is longer (the message waits
//! in the userfaultfd until serve reads it, and the vCPU's wake-up comes
//! after) and only the VMM can time it: the kernel does not stamp a
//! fault. A peer that times its vCPUs' accesses may write them, at any
//! time while it is served, on the connection it handed its userfaultfd
//! over, as lines of JSON, each one object ended by `\n`:
//!
//! ```text
//! {"vcpu_stall_ns":[48211,51020,9874]}
//! ```
//!
//! Each number is one access of a vCPU that waited for a missing page,
//! from the access to its retirement, in ns. serve adds them to the peer's
//! stall histogram (the metrics' `faultline_peer_vcpu_stall_seconds`, the
//! summary's `vcpu_stalls`). `faultline peer` sends its touches slower than
//! `--stall-ns` while its vCPUs run (a line each 50 ms); Firecracker sends
//! nothing, and a peer that sends nothing has no stall series.
//!
//! 1. The connection is a stream: a line may arrive in pieces, several in
//!    one read; a piece is kept until its line ends (up to
//!    [`MAX_LINE`]).
//! 2. Bytes that cannot begin such a line (a second handshake, anything
//!    else), descriptors, a line that does not parse or is too long are
//!    said once each and dropped, with whatever of the line was kept.

use faultline::ServiceTimes;

/// The start every report line has.
const HEAD: &[u8] = b"{\"vcpu_stall_ns\":";

/// The longest report line kept, bytes.
pub const MAX_LINE: usize = 4 << 20;

/// One line of a peer's report.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    vcpu_stall_ns: Vec<u64>,
}

/// One peer's report stream: the line being received, the stalls so far.
#[derive(Debug, Default)]
pub struct PeerReports {
    /// The start of a line whose end has not arrived.
    pending: Vec<u8>,
    /// The stalls reported so far (`None`: nothing reported).
    pub stalls: Option<ServiceTimes>,
}

/// What one message of the peer held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Stalls added.
    pub stalls: usize,
    /// Bytes dropped, and why (to be said).
    pub dropped: Option<(usize, &'static str)>,
}

impl PeerReports {
    /// Takes `data` (and `fds` descriptors, already closed) received from
    /// the peer.
    pub fn feed(&mut self, data: &[u8], fds: usize) -> Fed {
        let mut fed = Fed::default();
        if fds > 0 {
            let n = self.pending.len() + data.len();
            self.pending.clear();
            fed.dropped = Some((n, "it came with descriptors"));
            return fed;
        }
        self.pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(nl) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let line = &self.pending[start..start + nl];
            start += nl + 1;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Line>(line) {
                Ok(l) => {
                    let h = self.stalls.get_or_insert_with(ServiceTimes::default);
                    l.vcpu_stall_ns.iter().for_each(|&ns| h.record(ns));
                    fed.stalls += l.vcpu_stall_ns.len();
                }
                Err(_) => fed.dropped = Some((line.len() + 1, "a line that is not a stall report")),
            }
        }
        self.pending.drain(..start);
        // What is left must be the start of a report line.
        let k = self.pending.len().min(HEAD.len());
        if self.pending[..k] != HEAD[..k] {
            fed.dropped = Some((self.pending.len(), "not a stall report line"));
            self.pending.clear();
        } else if self.pending.len() > MAX_LINE {
            fed.dropped = Some((self.pending.len(), "a report line over 4 MiB"));
            self.pending.clear();
        }
        fed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_in_pieces_add_their_stalls() {
        let mut r = PeerReports::default();
        let text = b"{\"vcpu_stall_ns\":[1000,3000]}\n{\"vcpu_stall_ns\":[5000]}\n";
        // Any split of the stream gives the same histogram.
        for cut in 1..text.len() {
            let mut r = PeerReports::default();
            let a = r.feed(&text[..cut], 0);
            let b = r.feed(&text[cut..], 0);
            assert_eq!((a.dropped, b.dropped), (None, None), "cut {cut}");
            assert_eq!(a.stalls + b.stalls, 3);
            let h = r.stalls.unwrap();
            assert_eq!((h.count(), h.sum_ns), (3, 9000));
            assert_eq!(&h.counts[..4], &[1, 0, 1, 1]);
        }
        assert!(r.feed(b"", 0).dropped.is_none());
        assert!(r.stalls.is_none(), "nothing reported: no histogram");
    }

    #[test]
    fn anything_else_is_dropped_and_said() {
        let mut r = PeerReports::default();
        // A second handshake (Firecracker's JSON array), no newline.
        let f = r.feed(br#"[{"base_host_virt_addr":4096}]"#, 1);
        assert_eq!(f.dropped.map(|d| d.0), Some(30));
        let f = r.feed(br#"[{"base_host_virt_addr":4096}]"#, 0);
        assert_eq!(f.dropped, Some((30, "not a stall report line")));
        assert!(r.pending.is_empty());
        // A report line that does not parse; the next good one counts.
        let f = r.feed(b"{\"vcpu_stall_ns\":[1,-2]}\n{\"vcpu_stall_ns\":[7]}\n", 0);
        assert_eq!(f.stalls, 1);
        assert_eq!(
            f.dropped.map(|d| d.1),
            Some("a line that is not a stall report")
        );
        // Unknown fields are not stalls.
        let f = r.feed(b"{\"vcpu_stall_ns\":[1],\"x\":2}\n", 0);
        assert_eq!((f.stalls, f.dropped.is_some()), (0, true));
        assert_eq!(r.stalls.unwrap().count(), 1);
    }
}
