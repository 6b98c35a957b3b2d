//! A connection, from `accept` to a peer served or refused.
//!
//! ```text
//!  handle ─► receive the hand-off ─► choose the backing ─► build the peer ─► report
//!             (receive.rs)            (backing.rs)          (build.rs)        "serving ..."
//!                  │ ReceiveError          │ BackingError        │ BuildError
//!                  └───────────────────────┴─────────────────────┴──► refuse: say why,
//!                                          kill it (--kill-peer-on-error), its summary
//! ```

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::SeqCst;

use faultline_sys::sock;

use super::backing::{self, BackingError, Chosen};
use super::build::{self, BuildError, Built};
use super::log::say;
use super::receive::{self, ReceiveError, Received};
use super::state::{Served, State};
use crate::summary::{Handoff, PeerSummary};

/// Why a connection serves no peer: the step that refused it.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Receiving the hand-off.
    #[error(transparent)]
    Receive(#[from] ReceiveError),
    /// Choosing the backing.
    #[error(transparent)]
    Backing(#[from] BackingError),
    /// Building the peer.
    #[error(transparent)]
    Build(#[from] BuildError),
}

impl Refusal {
    /// The reason label of the metrics' `faultline_handoffs_refused`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Receive(e) => match e {
                ReceiveError::Silent(_) => "silent",
                ReceiveError::Recv(_) => "recvmsg",
                ReceiveError::HungUp => "hung_up",
                ReceiveError::TooLong => "too_long",
                ReceiveError::DescriptorsLost | ReceiveError::Descriptors(_) => "descriptors",
                ReceiveError::Handshake(_) => "handshake",
                ReceiveError::Adopt(_) => "userfaultfd",
            },
            Refusal::Backing(e) => match e {
                BackingError::Mismatch { .. } => "backing_mismatch",
                BackingError::Check(_) => "backing_check",
                BackingError::NoSnapshot => "no_snapshot",
            },
            Refusal::Build(_) => "regions",
        }
    }
}

/// Handles connection `n` (accepted at `accepted_ns`) on this thread; a
/// connection that serves no peer counts as finished.
pub fn handle(state: &State, n: usize, conn: UnixStream, accepted_ns: u64) {
    let handoff = Handoff {
        accepted_ns,
        thread_ns: faultline_sys::monotonic_ns(),
        ..Default::default()
    };
    let pid = sock::peer_cred(conn.as_fd()).map(|c| c.pid).unwrap_or(0);
    // A second descriptor of the connection, closed once a refusal was
    // acted on: a refused peer sees its connection close only after it
    // was killed (--kill-peer-on-error); it may exit at the close.
    let held = conn.try_clone().ok();
    let accepted = accept(state, n, pid, conn, handoff);
    if let Err(why) = accepted {
        say(format_args!("peer {n} (pid {pid}): refused: {why}"));
        state.kill(n, pid);
        drop(held);
        state.counters.refused(why.reason());
        state
            .summaries
            .lock()
            .expect("summaries")
            .push(PeerSummary {
                peer: n,
                pid,
                outcome: format!("refused: {why}"),
                ..Default::default()
            });
        state.finished.fetch_add(1, SeqCst);
    }
}

/// Steps 1-4 of connection `n` from peer `pid`.
fn accept(
    state: &State,
    n: usize,
    pid: i32,
    conn: UnixStream,
    mut handoff: Handoff,
) -> Result<(), Refusal> {
    let Received {
        specs,
        declared,
        uffd,
        at,
    } = receive::receive(&conn, state.config.handshake_timeout, &mut handoff)?;
    let total: u64 = specs.iter().map(|s| s.len as u64).sum();
    if total != state.store_len {
        say(format_args!(
            "peer {n} (pid {pid}): note: its regions add up to {total} bytes, the memory file holds {}",
            state.store_len
        ));
    }
    let chosen = backing::choose(state.snapshot.as_ref(), pid, &specs, declared)?;
    if let Some(why) = &chosen.unchecked {
        say(format_args!(
            "peer {n} (pid {pid}): note: its memory map is out of reach ({why}); serving it as its handshake declares: {:?} memory",
            chosen.backing
        ));
    }
    handoff.checked_ns = faultline_sys::monotonic_ns();
    let mode = chosen.mode();
    let Chosen { snapshot, .. } = chosen;
    let built = build::build(state, n, conn, uffd, &specs, snapshot, &mut handoff)?;
    let served = Served {
        id: built.peer.id(),
        n,
        pid,
        received: at,
        handoff,
    };
    report(state, served, &built, mode, specs.len(), total);
    Ok(())
}

/// Step 4: the peer joins the served list, and the operator is told.
fn report(state: &State, served: Served, built: &Built, mode: &str, regions: usize, bytes: u64) {
    state.served.lock().expect("served").push(served);
    let uffd = built.peer.uffd();
    let features: Vec<&str> = uffd.feature_names();
    say(format_args!(
        "peer {} (pid {}): serving {regions} region(s), {bytes} bytes, {mode} mode, {:.2} ms after its handshake was read; features [{}]{}{}{}",
        served.n,
        served.pid,
        served.received.elapsed().as_secs_f64() * 1e3,
        features.join(", "),
        if uffd.reports_removes() {
            ""
        } else {
            "; no EVENT_REMOVE: pages it drops are re-read from the file"
        },
        if built.record { "; recording" } else { "" },
        built
            .queued
            .map_or(String::new(), |q| format!("; prefetching {q} pages")),
    ));
}
