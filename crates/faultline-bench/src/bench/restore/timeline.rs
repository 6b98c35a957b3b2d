//! Where a restore's time goes: the hand-off's steps, stamped with
//! `CLOCK_MONOTONIC` by the peer (its send, its vCPUs' touches) and by
//! serve (accept, receive, adopt, ... first fault, prefetch), laid on one
//! axis: ms from the peer's handshake send (the kernel rows: from its
//! mapping).
//!
//! ```text
//!   peer:  send ─────────────── vcpus ─ 1st touch ─────────────── last touch
//!   serve:   accept thread recv adopt check built queued serving
//!                                      1st fault  1st pf ── pf done
//! ```
//!
//! [`steps`] takes one run's stamps from both reports, [`median_finite`]
//! the medians over the reps, [`row`] and [`print()`] the table, [`record`]
//! the JSON fields (`handoff_KEY_ms`).

use faultline_serve::peer::PeerReport;
use faultline_serve::PeerSummary;

use crate::harness::report::{print_table, Record};

/// The steps of a restore's hand-off, in the order they usually happen:
/// (column, JSON key, what it is). Times are ms from the peer's handshake
/// send (the kernel rows: from its mapping), stamped with `CLOCK_MONOTONIC`
/// by the peer and by serve.
pub const STEPS: [(&str, &str, &str); 14] = [
    (
        "accept",
        "accepted",
        "serve's listener accepted the connection (before the send: the peer connects first)",
    ),
    (
        "thread",
        "thread",
        "serve began handling it (on its listener thread, or a thread of its own)",
    ),
    ("recv", "received", "recvmsg returned the handshake"),
    ("adopt", "adopted", "parsed, userfaultfd adopted (fdinfo)"),
    (
        "check",
        "checked",
        "mode check ended (shared snapshot or anonymous)",
    ),
    ("built", "built", "the peer's regions set up"),
    ("queued", "queued", "prefetch queued"),
    ("serving", "serving", "handed to the handler threads"),
    (
        "vcpus",
        "vcpus",
        "the peer drew its working set, starts its vCPUs",
    ),
    ("1st touch", "first_touch", "the first vCPU touch began"),
    ("1st fault", "first_fault", "serve read the first fault"),
    (
        "1st pf",
        "first_prefetch",
        "the first prefetch ioctl finished",
    ),
    (
        "pf done",
        "prefetch_done",
        "the last prefetch ioctl finished",
    ),
    (
        "last touch",
        "last_touch",
        "the last working-set touch ended (the restore time)",
    ),
];

/// The hand-off steps of one run (see [`STEPS`]).
pub fn steps(p: &PeerReport, s: Option<&PeerSummary>) -> Vec<f64> {
    let at = |ns: u64| {
        if ns == 0 || p.sent_ns == 0 || ns == u64::MAX {
            f64::NAN
        } else {
            (ns as f64 - p.sent_ns as f64) / 1e6
        }
    };
    let h = s.map(|s| s.handoff).unwrap_or_default();
    [
        h.accepted_ns,
        h.thread_ns,
        h.received_ns,
        h.adopted_ns,
        h.checked_ns,
        h.built_ns,
        h.queued_ns,
        h.serving_ns,
        p.vcpus_ns,
        p.first_touch_ns,
        h.first_fault_ns,
        h.first_prefetch_ns,
        h.prefetch_done_ns,
        p.last_touch_ns,
    ]
    .into_iter()
    .map(at)
    .collect()
}

/// The median of the finite values (NaN when none).
pub fn median_finite(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    crate::harness::stats::median(&mut v)
}

/// The table row of a configuration's median steps, with the vCPU
/// threads' preemptions and sleeps.
pub fn row(lead: [String; 3], steps: &[f64], preempted: u64, slept: u64) -> Vec<String> {
    let mut line = lead.to_vec();
    line.extend(steps.iter().map(|ms| {
        if ms.is_finite() {
            format!("{ms:.2}")
        } else {
            "-".into()
        }
    }));
    line.push(preempted.to_string());
    line.push(slept.to_string());
    line
}

/// `rec` with a `handoff_KEY_ms` field per step taken.
pub fn record(mut rec: Record, steps: &[f64]) -> Record {
    for ((_, key, _), ms) in STEPS.iter().zip(steps) {
        if ms.is_finite() {
            rec = rec.with(&format!("handoff_{key}_ms"), *ms);
        }
    }
    rec
}

/// Prints the table of [`row`]s and what each column is.
pub fn print(rows: &[Vec<String>]) {
    let mut head = vec!["ws", "cache", "config"];
    head.extend(STEPS.iter().map(|s| s.0));
    head.extend(["preempted", "slept"]);
    println!("\nwhere the restore time goes: ms from the peer's handshake send (kernel rows: from its mapping), medians; CLOCK_MONOTONIC stamps of the peer and of serve");
    print_table(&head, rows);
    for (col, _, what) in STEPS {
        println!("  {col}: {what}");
    }
    println!("  preempted, slept: the vCPU threads' involuntary and voluntary context switches while touching (other threads took their CPU; they waited for a fault)");
}
