//! A connection, from `accept` to a peer served or refused.
//!
//! ```text
//!  handle ─► receive the hand-off ─► choose the backing ─► build the peer ─► report
//!             (receive.rs)            (backing.rs)          (build.rs)        "serving ..."
//!                  │ ReceiveError          │ BackingError        │ BuildError
//!                  └───────────────────────┴─────────────────────┴──► refuse: say why,
//!                                          kill it (unless --leave-peer-on-error), its summary
//! ```
//!
//! A refused peer that handed something over is killed before serve closes
//! its connection (a clone of it is held until then): a VMM that sent its
//! userfaultfd waits for pages that will never come, and one that watches
//! the connection must not see it close and go on first. A connection
//! that hangs up without a handshake is no peer at all (another serve
//! checking whether the socket is in use does this): it is not counted.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Instant;

use faultline::{ForeignPeer, ForeignUffd};

use faultline_sys::{process, sock};

use super::backing::{self, BackingError, Chosen};
use super::build::{self, BuildError, Built, Origin};
use super::receive::{self, ReceiveError, Received};
use super::state::{Served, State};
use crate::handshake;
use crate::keeper::{Journal, KeeperError, Taken};
use crate::log::say;
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
    /// The memory file's path names another file than serve opened (why):
    /// a VMM restored from it would be served the old one's bytes.
    #[error("{0}")]
    MemReplaced(String),
}

impl Refusal {
    /// Whether the peer handed something over and now waits on serve (a
    /// peer that was silent or hung up did not: it is not killed).
    fn waits(&self) -> bool {
        !matches!(
            self,
            Refusal::Receive(ReceiveError::Silent(_) | ReceiveError::HungUp)
        )
    }

    /// This refusal, or, when its cause is serve's own descriptors
    /// running out (`EMFILE`, `ENFILE` anywhere in its chain: receiving,
    /// inspecting the userfaultfd, opening a pidfd or a journal), that
    /// (with this one's text), so the operator reads the cause and the
    /// metrics count it as such.
    fn or_out_of_fds(self) -> Refusal {
        // (One said as such already has no `io::Error` in its chain.)
        if !receive::out_of_fds(&self) {
            return self;
        }
        let o = receive::OutOfFds::said(Some(self.to_string()));
        Refusal::Receive(ReceiveError::OutOfFds(o))
    }

    /// The reason label of the metrics' `faultline_handoffs_refused`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Receive(e) => match e {
                ReceiveError::Silent(_) => "silent",
                ReceiveError::Recv(_) => "recvmsg",
                ReceiveError::HungUp => "hung_up",
                ReceiveError::TooLong => "too_long",
                ReceiveError::DescriptorsLost | ReceiveError::Descriptors(_) => "descriptors",
                ReceiveError::OutOfFds(_) => "out_of_fds",
                ReceiveError::Handshake(_) => "handshake",
                ReceiveError::Adopt(_) => "userfaultfd",
            },
            Refusal::Backing(e) => match e {
                BackingError::Mismatch { .. } => "backing_mismatch",
                BackingError::Check(_) => "backing_check",
                BackingError::NoSnapshot => "no_snapshot",
            },
            Refusal::Build(_) => "regions",
            Refusal::MemReplaced(_) => "memory_file_replaced",
        }
    }
}

/// `--takeover`: deposits connection `n`, just accepted, with the keeper
/// (before its hand-off is read: a serve that dies from here on leaves
/// it to the next); its id there. `Ok(None)` without a keeper.
pub fn deposit(state: &State, n: usize, conn: &UnixStream) -> Result<Option<u64>, KeeperError> {
    let Some(keeper) = &state.keeper else {
        return Ok(None);
    };
    let pid = sock::peer_cred(conn.as_fd()).map(|c| c.pid).unwrap_or(0);
    let id = keeper.deposit(n, pid, conn.as_fd())?;
    // Deposited, its hand-off not read: the next serve reads it.
    faultline_sys::failpoint::hit("connection-deposited");
    Ok(Some(id))
}

/// Handles connection `n` (accepted at `accepted_ns`; `kept`: its id at
/// the keeper, or why depositing it failed) on this thread; a connection
/// that serves no peer counts as finished.
pub fn handle(
    state: &State,
    n: usize,
    conn: UnixStream,
    accepted_ns: u64,
    kept: Result<Option<u64>, KeeperError>,
) {
    let handoff = Handoff {
        accepted_ns,
        thread_ns: faultline_sys::monotonic_ns(),
        ..Default::default()
    };
    let pid = sock::peer_cred(conn.as_fd()).map(|c| c.pid).unwrap_or(0);
    state.watch(n, conn.as_fd());
    // Held until a refused peer is killed (see the module docs).
    let held = conn.try_clone();
    let kept = match kept {
        Ok(kept) => kept,
        // Out of descriptors, its hand-off cannot be received either.
        Err(e) if receive::out_of_fds(&e) => {
            let why = refusal_out_of_fds(&conn, format!("depositing it with the keeper: {e}"));
            return refuse(state, n, pid, &why, held.ok(), None);
        }
        // Killing it would be sure to lose it; serving it loses it only if
        // this serve dies.
        Err(e) => {
            say(format_args!(
                "peer {n} (pid {pid}): depositing it with the keeper failed ({e}): served without takeover for now (should this serve die before, it hangs at its next missing page); deposited again every {}s until the keeper takes it",
                super::unprotected::RETRY.as_secs()
            ));
            None
        }
    };
    if let Err(why) = accept(state, n, pid, conn, handoff, kept) {
        refuse(state, n, pid, &why.or_out_of_fds(), held.ok(), kept);
    }
}

/// Tries again, every [`super::unprotected::RETRY`], to deposit each VMM served
/// unprotected (see `unprotected.rs`); one deposited is protected from
/// then on (said, and its keeper id kept for its end).
pub fn deposit_again(state: &State) {
    let Some(keeper) = &state.keeper else { return };
    // Out of the lock while the keeper is asked (a request may take its
    // timeout): a peer set up meanwhile is added beside them.
    let due = state.unprotected.lock().expect("unprotected").take_due();
    let mut left = Vec::new();
    for (id, u) in due {
        let fds = [u.uffd.as_fd(), u.journal.fd()];
        let done = keeper.deposit(u.n, u.pid, u.conn.as_fd()).and_then(|kept| {
            keeper
                .hand(kept, &u.raw, fds)
                .map(|()| kept)
                .inspect_err(|_| {
                    // Not held half: the next try deposits it anew.
                    let _ = keeper.forget(kept);
                })
        });
        match done {
            Ok(kept) => {
                say(format_args!(
                    "peer {} (pid {}): deposited with the keeper at last: a kill of this serve no longer loses it",
                    u.n, u.pid
                ));
                state.set_kept(id, kept);
            }
            // Still served: tried again later.
            Err(_) if state.find(id).is_some() => left.push((id, u)),
            Err(_) => {}
        }
    }
    state
        .unprotected
        .lock()
        .expect("unprotected")
        .give_back(left);
}

/// How long a connection serve cannot take a hand-off from may take to
/// show whether it handed something over.
const SHED_WAIT_MS: i32 = 100;

/// Connection `n`, accepted with the descriptor serve keeps in reserve
/// because it had no other (`e`: `EMFILE`): the userfaultfd it sends
/// cannot be received (the kernel drops descriptors a process cannot
/// install), and left queued its VMM would hang. Refused
/// ([`refusal_out_of_fds`]). Nothing here takes a descriptor.
pub fn shed(state: &State, n: usize, conn: UnixStream, e: &std::io::Error) {
    let pid = sock::peer_cred(conn.as_fd()).map(|c| c.pid).unwrap_or(0);
    let why = refusal_out_of_fds(&conn, format!("accept: {e}"));
    refuse(state, n, pid, &why, Some(conn), None);
}

/// Why `conn` is refused when serve, out of descriptors (at the step
/// `during` says), cannot take its hand-off: as one whose hand-off failed
/// (killed) if it sent it within [`SHED_WAIT_MS`]; no peer if it hung up
/// (another serve checking whether the socket is in use); silent (not
/// killed) if nothing came.
fn refusal_out_of_fds(conn: &UnixStream, during: String) -> Refusal {
    let why = match receive::readable_within(conn, SHED_WAIT_MS) {
        false => ReceiveError::Silent(std::time::Duration::from_millis(SHED_WAIT_MS as u64)),
        // Its bytes only: at the limit, the kernel installs none of the
        // descriptors a peek would duplicate.
        true => match sock::peek_with_fds(conn.as_fd(), &mut [0u8; 1], true) {
            Ok(got) if got.bytes == 0 && got.fds.is_empty() => ReceiveError::HungUp,
            Ok(_) => ReceiveError::OutOfFds(receive::OutOfFds::said(Some(during))),
            Err(e) => ReceiveError::Recv(e),
        },
    };
    why.into()
}

/// Tells the keeper connection `n` (its id there: `kept`) is done with.
fn forget(state: &State, n: usize, kept: Option<u64>) {
    if let (Some(keeper), Some(id)) = (&state.keeper, kept) {
        if let Err(e) = keeper.forget(id) {
            say(format_args!(
                "peer {n}: telling the keeper it is done failed: {e}"
            ));
        }
    }
}

/// Peer `n` (pid `pid`) is refused because `why`: said, killed (unless it
/// handed nothing over), its summary, forgotten by the keeper (`kept`);
/// `held` (a clone of its connection) is closed after the kill. One that
/// hung up without a handshake is no peer: said, not counted.
fn refuse(
    state: &State,
    n: usize,
    pid: i32,
    why: &Refusal,
    held: Option<UnixStream>,
    kept: Option<u64>,
) {
    if matches!(why, Refusal::Receive(ReceiveError::HungUp)) {
        state.ignored.fetch_add(1, SeqCst);
        say(format_args!(
            "connection {n} (pid {pid}): hung up without a handshake; not a peer (another serve checking whether this socket is in use does this)"
        ));
        state.unwatch(n);
        forget(state, n, kept);
        return;
    }
    say(format_args!("peer {n} (pid {pid}): refused: {why}"));
    // A process that holds no userfaultfd (a client at the wrong socket)
    // has no fault to hang on: only a VMM's is killed.
    let vmm = pid <= 0 || process::holds_userfaultfd(pid).unwrap_or(true);
    let fate = match (why.waits(), vmm) {
        (true, true) => state.kill(n, pid, "its hand-off was refused"),
        (true, false) => {
            say(format_args!(
                "peer {n} (pid {pid}): not killed: it holds no userfaultfd, so nothing of it waits for serve (not a VMM?)"
            ));
            "not killed: it holds no userfaultfd"
        }
        (false, _) => "not killed: it handed nothing over",
    };
    forget(state, n, kept);
    drop(held);
    state.unwatch(n);
    state.counters.refused(why.reason());
    state.keep(PeerSummary {
        peer: n,
        pid,
        outcome: format!("refused ({fate}): {why}"),
        ..Default::default()
    });
    state.finished.fetch_add(1, SeqCst);
}

/// Takes peer `t` over from the keeper (a serve before this one died),
/// under its own number. Its hand-off deposited: built again from its
/// handshake, its journal replayed, every region woken (see
/// [`crate::keeper`]), refused as a new peer would be. Not deposited:
/// given back (number, id, connection) to be handled as a connection just
/// accepted (its hand-off is still queued on it).
pub fn adopt(state: &State, t: Taken) -> Option<(usize, u64, UnixStream)> {
    let (n, pid) = (t.n, t.pid);
    let conn = UnixStream::from(t.conn);
    let Some(handed) = t.handed else {
        say(format_args!(
            "peer {n} (pid {pid}): taken over from the keeper before its hand-off was deposited: read again from its connection"
        ));
        return Some((n, t.id, conn));
    };
    state.watch(n, conn.as_fd());
    let held = conn.try_clone().ok();
    let adopted = || -> Result<(), Refusal> {
        let hs =
            handshake::parse_handshake(handed.handshake.as_bytes()).map_err(ReceiveError::from)?;
        // Deposited, maybe not yet read off the connection (the serve
        // before died between the two): read now, so the engine does not
        // take it for a second message.
        receive::consume_if(&conn, handed.handshake.as_bytes()).map_err(ReceiveError::Recv)?;
        let uffd = ForeignUffd::adopt(handed.uffd).map_err(ReceiveError::Adopt)?;
        let journal = Journal::open(handed.journal).map_err(BuildError::Journal)?;
        let received = Received {
            specs: hs.regions,
            declared: hs.backing,
            uffd,
            at: Instant::now(),
            raw: String::new(),
        };
        let regions: Vec<(u64, usize)> = received.specs.iter().map(|s| (s.base, s.len)).collect();
        let origin = Origin::Adopted {
            journal,
            id: t.id,
            pid,
        };
        let peer = set_up(state, n, pid, conn, received, Handoff::default(), origin)?;
        for (base, len) in regions {
            peer.uffd()
                .wake(base, len as u64)
                .map_err(BuildError::Peer)?;
        }
        Ok(())
    };
    if let Err(why) = adopted() {
        refuse(state, n, pid, &why, held, Some(t.id));
    }
    None
}

/// Steps 1-4 of connection `n` from peer `pid` (`kept`: its id at the
/// keeper: its hand-off is peeked, deposited, then read off).
fn accept(
    state: &State,
    n: usize,
    pid: i32,
    conn: UnixStream,
    mut handoff: Handoff,
    kept: Option<u64>,
) -> Result<(), Refusal> {
    let peek = kept.is_some();
    let mut received = receive::receive(&conn, state.config.handshake_timeout, &mut handoff, peek)?;
    // Peeked, not yet deposited with the keeper: the next serve reads it
    // again off the connection the keeper holds.
    faultline_sys::failpoint::hit("handoff-received");
    if let Some(why) = state.mem.as_ref().and_then(|m| m.replaced()) {
        return Err(Refusal::MemReplaced(why));
    }
    let raw = std::mem::take(&mut received.raw);
    let origin = Origin::Handed {
        raw: &raw,
        pid,
        kept,
    };
    set_up(state, n, pid, conn, received, handoff, origin).map(drop)
}

/// Steps 2-4 of peer `n` (pid `pid`), received.
fn set_up(
    state: &State,
    n: usize,
    pid: i32,
    conn: UnixStream,
    received: Received,
    mut handoff: Handoff,
    origin: Origin<'_>,
) -> Result<Arc<ForeignPeer>, Refusal> {
    let Received {
        specs,
        declared,
        uffd,
        at,
        ..
    } = received;
    let total: u64 = specs.iter().map(|s| s.len as u64).sum();
    if total != state.store_len {
        say(format_args!(
            "peer {n} (pid {pid}): note: its regions add up to {total} bytes, the memory file holds {}",
            state.store_len
        ));
    }
    let chosen = backing::choose(state.snapshot.as_ref(), pid, &specs, declared)?;
    if let (true, Some(why)) = (chosen.fallback, &chosen.unchecked) {
        if !state.said_fallback.swap(true, SeqCst) {
            say(format_args!(
                "peer {n} (pid {pid}): note: shared mode cannot be used for it: its memory map is out of reach ({why}) and its handshake declares no backing; serving it by copy, as serve without --shared would (said once: later such peers are served by copy too)"
            ));
        }
    } else if let Some(why) = &chosen.unchecked {
        say(format_args!(
            "peer {n} (pid {pid}): note: its memory map is out of reach ({why}); serving it as its handshake declares: {:?} memory",
            chosen.backing
        ));
    }
    handoff.checked_ns = faultline_sys::monotonic_ns();
    let mode = chosen.mode();
    let Chosen { snapshot, .. } = chosen;
    let taken = matches!(origin, Origin::Adopted { .. });
    let built = build::build(state, n, conn, uffd, &specs, snapshot, &mut handoff, origin)?;
    faultline_sys::failpoint::hit("peer-built");
    if built.peer.is_shared() {
        state.shared_peers.fetch_add(1, SeqCst);
    }
    // Listed and said before the engine has it: from then on its events
    // (its prefetch's end, its hang-up) can come at any moment, and they
    // name it from the list.
    handoff.serving_ns = faultline_sys::monotonic_ns();
    let served = Served {
        id: built.peer.id(),
        n,
        pid,
        received: at,
        handoff,
        kept: built.kept,
    };
    report(state, served, &built, mode, specs.len(), total, taken);
    Ok(state.engine.add(built.peer))
}

/// Step 4: the peer joins the served list, and the operator is told; the
/// engine gets it next.
fn report(
    state: &State,
    served: Served,
    built: &Built,
    mode: &str,
    regions: usize,
    bytes: u64,
    taken: bool,
) {
    if let Some(w) = super::oom::OomWatch::of(served.pid) {
        state.oom.lock().expect("oom").insert(served.id, w);
    }
    state.served.lock().expect("served").push(served);
    if taken {
        state.taken_over.fetch_add(1, SeqCst);
        say(format_args!(
            "peer {} (pid {}): taken over from the keeper: {} REMOVE'd range(s) replayed from its journal{}; its regions are woken",
            served.n,
            served.pid,
            built.replayed,
            if built.record {
                format!("; its record goes on from the {} page(s) journaled", built.recorded)
            } else {
                String::new()
            }
        ));
    }
    let uffd = built.peer.uffd();
    let features: Vec<&str> = uffd.feature_names();
    say(format_args!(
        "peer {} (pid {}): serving {regions} region(s), {bytes} bytes, {mode} mode, {:.2} ms after its handshake was read; features [{}]{}{}{}{}",
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
        if built.handed_back {
            "; handed back to the kernel (--hand-back): its faults are the kernel's"
        } else {
            ""
        },
        built
            .queued
            .map_or(String::new(), |q| format!("; prefetching {q} pages")),
    ));
    if built.peer.tracks_dirty() {
        say(format_args!(
            "peer {}: tracking its writes (--track-dirty{}){}",
            served.n,
            if built.peer.dirty_async() {
                "; WP_ASYNC: read from its page tables with PAGEMAP_SCAN, on request only"
            } else {
                ""
            },
            built
                .peer
                .dirty_caveat()
                .map_or(String::new(), |c| format!(": {c}"))
        ));
    }
}
