//! What the engine reports of the peers being served (hang-up, failure,
//! a second message, prefetch done, a store error), and a peer's end: its
//! summary, and its record when it recorded.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use faultline::{ForeignPeer, PeerEvent};

use super::state::{Served, State};
use crate::log::say;
use crate::summary::{Handoff, PeerSummary, StallSummary};

/// Handles one engine event.
pub fn on_event(state: &State, ev: PeerEvent) {
    match ev {
        PeerEvent::HungUp { peer } => finish(state, &peer, "hung up".into(), true),
        PeerEvent::Failed { peer, error } => {
            let Served { n, pid, .. } = state.lookup(peer.id());
            say(format_args!(
                "peer {n} (pid {pid}): serving failed: {error}"
            ));
            if let Some(m) = &state.mem {
                m.say_if_changed();
            }
            state.failed.fetch_add(1, SeqCst);
            let fate = state.kill(n, pid, "serve can no longer serve it");
            finish(state, &peer, format!("failed ({fate}): {error}"), false);
        }
        PeerEvent::Message { peer, data, fds } => {
            let fed = state
                .reports
                .lock()
                .expect("reports")
                .entry(peer.id())
                .or_default()
                .feed(&data, fds);
            if let Some((bytes, why)) = fed.dropped {
                let Served { n, pid, .. } = state.lookup(peer.id());
                say(format_args!(
                    "peer {n} (pid {pid}): sent a second message ({bytes} bytes, {fds} descriptor(s)); ignored ({why}): the hand-off is one message, and what may follow it is stall reports"
                ));
            }
        }
        PeerEvent::PrefetchDone { peer, at } => {
            let Served {
                n, pid, received, ..
            } = state.lookup(peer.id());
            let s = peer.stats();
            say(format_args!(
                "peer {n} (pid {pid}): prefetch done: {} pages in {} ioctls, {:.1} ms after its handshake was read",
                s.prefetched,
                s.prefetch_ioctls,
                at.saturating_duration_since(received).as_secs_f64() * 1e3
            ));
        }
        PeerEvent::StoreError { peer, error } => {
            let Served { n, pid, .. } = state.lookup(peer.id());
            say(format_args!("peer {n} (pid {pid}): {error}"));
            if let Some(m) = &state.mem {
                m.say_if_changed();
            }
        }
    }
}

/// Ends peer `peer` with `outcome`: its summary, its record and dirty set
/// when it `ran` to its own end (hung up; one that failed or was killed
/// leaves them, and the `--record`/`--track-dirty` without `{peer}`, to
/// the next peer), its removal from the engine (and from the keeper's
/// peers).
pub fn finish(state: &State, peer: &Arc<ForeignPeer>, outcome: String, ran: bool) {
    end(state, peer, outcome, true, ran);
}

/// Ends peer `peer` here and leaves it with the keeper (the next serve
/// takes it over): as [`finish`], the keeper not told.
pub fn leave_with_keeper(state: &State, peer: &Arc<ForeignPeer>, outcome: String) {
    end(state, peer, outcome, false, true);
}

fn end(state: &State, peer: &Arc<ForeignPeer>, mut outcome: String, forget: bool, ran: bool) {
    let oom = state.oom.lock().expect("oom").remove(&peer.id());
    state
        .unprotected
        .lock()
        .expect("unprotected")
        .forget(peer.id());
    if let Some(killed) = oom.and_then(|w| w.since()) {
        outcome = format!("{outcome} ({killed})");
    }
    let Served {
        n,
        pid,
        received,
        handoff,
        kept,
        ..
    } = state.lookup(peer.id());
    if let (true, Some(keeper), Some(id)) = (forget, &state.keeper, kept) {
        if let Err(e) = keeper.forget(id) {
            say(format_args!(
                "peer {n}: telling the keeper it is done failed: {e}"
            ));
        }
    }
    let s = peer.stats();
    let times = peer.times();
    let handler = state.engine.handler_stats();
    let stalls = state
        .reports
        .lock()
        .expect("reports")
        .remove(&peer.id())
        .and_then(|r| r.stalls);
    let summary = PeerSummary {
        peer: n,
        pid,
        outcome: outcome.clone(),
        regions: peer.regions(),
        mode: if peer.is_handed_back() {
            "handed back"
        } else if peer.is_shared() {
            "shared"
        } else {
            "copy"
        }
        .into(),
        features: peer
            .uffd()
            .feature_names()
            .iter()
            .map(|s| s.to_string())
            .collect(),
        faults: s.faults,
        reads: s.reads,
        handler_cpu_ms: handler.cpu.as_secs_f64() * 1e3,
        helpers_cpu_ms: handler.helpers_cpu.as_secs_f64() * 1e3,
        installed: s.regions.installed,
        around: s.regions.around,
        isolated_window: peer.isolated_windows().map(|w| w.0),
        window_changes: peer.isolated_windows().map(|w| [w.1, w.2]),
        bytes_read: s.bytes_read,
        removes: s.removes,
        removed_pages: s.removed_pages,
        deferred: s.deferred,
        exists: s.regions.exists,
        prefetched: s.prefetched,
        run_ahead: s.run_ahead_pages,
        bookkeeping_bytes: peer.bookkeeping_bytes() as u64,
        seconds: received.elapsed().as_secs_f64(),
        handoff: Handoff {
            first_fault_ns: times.first_fault_ns.unwrap_or(0),
            first_prefetch_ns: times.first_prefetch_ns.unwrap_or(0),
            prefetch_done_ns: times.prefetch_done_ns.unwrap_or(0),
            ..handoff
        },
        phases: peer.phases().iter().map(|f| f.fields()).collect(),
        vcpu_stalls: stalls.map(|h| StallSummary {
            count: h.count(),
            sum_ms: h.sum_ns as f64 / 1e6,
        }),
    };
    say(format_args!(
        "peer {n} (pid {pid}): {outcome}; {} faults in {} reads, {} pages installed ({} around faulting pages, {} run ahead), {} REMOVE events ({} pages), {} deferred (EAGAIN), {} EEXIST, {} prefetched; handler threads' CPU so far {:.1} ms ({} sleeps), prefetch helpers' {:.1} ms",
        s.faults,
        s.reads,
        s.regions.installed,
        s.regions.around,
        s.run_ahead_pages,
        s.removes,
        s.removed_pages,
        s.deferred,
        s.regions.exists,
        s.prefetched,
        handler.cpu.as_secs_f64() * 1e3,
        handler.sleeps,
        handler.helpers_cpu.as_secs_f64() * 1e3
    ));
    if let Some(h) = stalls {
        say(format_args!(
            "peer {n} (pid {pid}): its vCPUs reported {} stalls, {:.1} ms in all",
            h.count(),
            h.sum_ns as f64 / 1e6
        ));
    }
    if ran {
        super::recording::at_end(state, peer, n);
        super::dirty::at_end(state, peer, n, &outcome);
    } else {
        super::recording::left(state, peer, n);
        super::dirty::left(state, peer, n);
    }
    state.engine.remove(peer.id());
    // Served no more: what serve keeps of it is at most its summary (see
    // `State::keep`).
    state.forget(peer.id());
    state.unwatch(n);
    state.keep(summary);
    state.finished.fetch_add(1, SeqCst);
}

/// How long a handler thread may stay on one fault before serve says so.
pub const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The handler threads serve said were stuck on one fault: (thread, when
/// it took the fault up, the peer's number).
#[derive(Default)]
pub struct Stuck(Vec<(usize, u64, usize)>);

impl Stuck {
    /// Says of each handler thread on one fault for [`STUCK_AFTER`] or more
    /// that it is (once), and of each said before that it is back: a
    /// thread whose store read or kernel call does not return holds up
    /// every fault it would read next, which nothing else would show.
    pub fn look(&mut self, state: &State) {
        let now = faultline_sys::monotonic_ns();
        let busy = state.engine.busy();
        self.0.retain(|&(thread, since, n)| {
            let still = busy
                .iter()
                .any(|b| b.thread == thread && b.since_ns == since);
            if !still {
                say(format_args!(
                    "handler thread {thread} is back, after {:.1}s on one fault of peer {n}",
                    now.saturating_sub(since) as f64 / 1e9
                ));
            }
            still
        });
        for b in busy {
            let age = now.saturating_sub(b.since_ns);
            let said = self
                .0
                .iter()
                .any(|&(t, since, _)| t == b.thread && since == b.since_ns);
            if said || age < STUCK_AFTER.as_nanos() as u64 {
                continue;
            }
            let Served { n, pid, .. } = state.lookup(b.peer);
            let others = state
                .engine
                .peers()
                .iter()
                .filter(|p| p.id() != b.peer)
                .count();
            say(format_args!(
                "handler thread {} has been on one fault of peer {n} (pid {pid}) for {:.1}s: the store (or the kernel) has not returned; until it does, the faults that thread would read next wait ({} other peer(s) served)",
                b.thread,
                age as f64 / 1e9,
                others
            ));
            self.0.push((b.thread, b.since_ns, n));
        }
    }
}
