//! The kill matrix of `serve --takeover`: 4 peers (`faultline-peer`, real
//! processes, real userfaultfds handed over a UNIX socket) x 4 vCPU
//! threads, each verifying every byte of its memory; serve killed with
//! `SIGKILL` at a named step by a failpoint (`FAULTLINE_FAILPOINT`, see
//! `faultline_sys::failpoint`), the same command started again, and every
//! peer finishing with every byte right.
//!
//! | failpoint | where serve dies |
//! |---|---|
//! | `handoff-deposited:3` | the 3rd peer's hand-off deposited with the keeper, not yet read off nor served; peers 1 and 2 mid-restore |
//! | `handoff-received:3` | the 3rd peer's hand-off peeked, not deposited: read again by the new serve |
//! | `connection-deposited:3` | the 3rd connection deposited, its hand-off not read |
//! | (SIGSTOP, then SIGKILL) | two connections queued in the listener's backlog |
//! | `fault-read:40` | the 40th fault message read, not answered; 4 peers faulting |
//! | `prefetch-run:N` | mid-prefetch of the 4th peer (N past 3 peers' runs) |
//! | `remove-journaled:30` | right after a REMOVE was journaled, before serve acted on it; REMOVE storms and balloons |
//! | `connection-accepted:3` | the window takeover leaves: a connection accepted and not deposited; that peer hangs |
//! | `fault-read:40!panic` | a handler thread panics (a bug) with a fault read: serve aborts rather than leave that thread's peers unserved |
//!
//! Every wait is bounded; every process (the keeper too) is stopped by its
//! pid at the end, also when an assertion fails. `FAULTLINE_KILL_LOOPS=20`
//! runs each case 20 times.

use std::os::unix::process::ExitStatusExt as _;
use std::time::{Duration, Instant};

use faultline_serve::testing::{self, assert_ok, Dir, Proc, WAIT};

const SERVE: &[&str] = &[env!("CARGO_BIN_EXE_faultline-serve")];
const PEER: &[&str] = &[env!("CARGO_BIN_EXE_faultline-peer")];
const MIB: usize = 1 << 20;
/// The peers' memory (both regions): 4096 pages.
const MEM: usize = 16 * MIB;
const PAGE: usize = 4096;

/// Every peer: 4 vCPUs, a 30% working set, every byte verified.
const PEER_ARGS: &[&str] = &["--threads", "4", "--working-set", "30", "--verify-all"];

/// The keeper (not our child: serve started it), killed by its pid on drop
/// if it is still there.
struct KeeperGuard(i32);

impl Drop for KeeperGuard {
    fn drop(&mut self) {
        if faultline_sys::process::alive(self.0) {
            let _ = faultline_sys::process::kill(self.0, faultline_sys::process::SIGKILL);
        }
    }
}

/// Waits until `f` says `needle` at least `k` times.
fn wait_count(dir: &Dir, f: &str, needle: &str, k: usize) {
    let deadline = Instant::now() + WAIT;
    while dir.text(f).matches(needle).count() < k {
        assert!(
            Instant::now() < deadline,
            "{f} never said {needle:?} {k} times:\n{}",
            dir.text(f)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts serve `--takeover --peers 4 EXTRA` (and `--timeout 20` unless
/// EXTRA has one) with `failpoint` armed.
fn serve_with_failpoint(dir: &Dir, failpoint: &str, extra: &[&str]) -> Proc {
    let args = [&["--takeover", "--peers", "4"], extra].concat();
    testing::serve_with_env(
        dir,
        SERVE,
        &args,
        &[(faultline_sys::failpoint::ENV, failpoint)],
    )
}

/// Waits for `p` to end, killed by SIGKILL (`why`: whose kill; `log`: the
/// file that tells).
fn assert_sigkilled(p: &mut Proc, dir: &Dir, why: &str, log: &str) {
    let st = p.wait(WAIT);
    assert_eq!(
        st.signal(),
        Some(faultline_sys::process::SIGKILL),
        "{} should be killed by {why} ({st}):\n{}",
        p.name,
        dir.text(log)
    );
}

/// Waits for serve to die of its failpoint `name`: killed by SIGKILL,
/// having said so.
fn assert_died_at(s: &mut Proc, dir: &Dir, name: &str) {
    assert_sigkilled(s, dir, "its failpoint", "serve.err");
    let log = dir.text("serve.err");
    assert!(log.contains(&format!("failpoint {name}: SIGKILL")), "{log}");
}

/// Waits for serve to end of a panic at failpoint `name` on one of its
/// threads: aborted (SIGABRT), having said the panic and why it ends.
fn assert_panicked_at(s: &mut Proc, dir: &Dir, name: &str) {
    let st = s.wait(WAIT);
    let log = dir.text("serve.err");
    assert_eq!(st.signal(), Some(6), "serve should abort ({st}):\n{log}");
    assert!(log.contains(&format!("failpoint {name}: a panic")), "{log}");
    assert!(log.contains("a thread panicked (a bug"), "{log}");
}

/// Starts peer `i` with `PEER_ARGS` and `extra`.
fn peer(dir: &Dir, i: usize, extra: &[&str]) -> Proc {
    let args = [PEER_ARGS, extra].concat();
    testing::peer(dir, PEER, &format!("p{i}"), &args)
}

/// The same command again (no failpoint): takes `held` peers over from the
/// keeper; `later` peers are started once it has, then every peer verifies
/// every byte, the new serve serves 4 and exits, the keeper exits.
fn take_over_and_finish(
    dir: &Dir,
    keeper: &KeeperGuard,
    held: usize,
    mut peers: Vec<Proc>,
    later: &[usize],
    serve_extra: &[&str],
    go: Option<&std::path::Path>,
) -> String {
    dir.wait_for(
        "serve.err",
        &format!("holding {held} peer(s) for the next serve"),
    );
    let args = [
        &["--timeout", "20", "--takeover", "--peers", "4"][..],
        serve_extra,
    ]
    .concat();
    let mut again = testing::start(dir, "again", SERVE, &args);
    dir.wait_for("again.err", &format!("taking {held} peer(s) over"));
    for &i in later {
        peers.push(peer(dir, i, &[]));
    }
    if let Some(go) = go {
        std::fs::write(go, b"").expect("the go file");
    }
    for p in &mut peers {
        assert_ok(p, dir);
    }
    let st = again.wait(WAIT);
    let log = dir.text("again.err");
    assert!(
        st.success(),
        "{st}: {log}\nkeeper:\n{}",
        dir.text("serve.err")
    );
    assert_eq!(
        log.matches("taken over from the keeper").count(),
        held,
        "{log}"
    );
    assert!(log.contains("all 4 peers served"), "{log}");
    dir.wait_for("serve.err", "no peer and no serve: exiting");
    let deadline = Instant::now() + WAIT;
    while faultline_sys::process::alive(keeper.0) {
        assert!(
            Instant::now() < deadline,
            "the keeper {} is still there",
            keeper.0
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    log
}

fn loops() -> usize {
    std::env::var("FAULTLINE_KILL_LOOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// 4 peers handed off and waiting on a go file (their vCPUs not started),
/// then `go` created: serve dies at `failpoint` while they run (killed by
/// it, or of its panic with `!panic`).
fn four_running_peers(name: &str, failpoint: &str, serve_extra: &[&str], peer_extra: &[&str]) {
    for round in 0..loops() {
        let dir = Dir::new(&format!("{name}-{round}"), MEM);
        let go = dir.path("go");
        let mut s = serve_with_failpoint(&dir, failpoint, serve_extra);
        let keeper = KeeperGuard(testing::keeper_pid(&dir));
        let go_arg = go.to_str().expect("a UTF-8 path");
        let extra = [&["--go-file", go_arg][..], peer_extra].concat();
        let peers: Vec<Proc> = (1..=4).map(|i| peer(&dir, i, &extra)).collect();
        wait_count(&dir, "serve.err", "): serving ", 4);
        std::fs::write(&go, b"").expect("the go file");
        let fp = failpoint.split([':', '!']).next().expect("a name");
        match failpoint.ends_with("!panic") {
            true => assert_panicked_at(&mut s, &dir, fp),
            false => assert_died_at(&mut s, &dir, fp),
        }
        take_over_and_finish(&dir, &keeper, 4, peers, &[], serve_extra, None);
    }
}

/// Serve dies with fault messages read and not answered (vCPUs blocked on
/// them): the new serve wakes every region, the faults are raised again.
#[test]
fn killed_with_faults_in_flight_every_peer_finishes() {
    four_running_peers("kill-fault-read", "fault-read:40", &[], &[]);
}

/// A handler thread panics (a bug) with fault messages read and not
/// answered: serve ends (its VMMs would otherwise hang with no one
/// reading their faults while serve looked alive), and the next serve
/// takes every peer over.
#[test]
fn a_handler_thread_that_panics_ends_serve_and_the_next_takes_over() {
    four_running_peers("panic-fault-read", "fault-read:40!panic", &[], &[]);
}

/// Serve dies right after journaling a REMOVE, before its bookkeeping (the
/// pages it dropped recorded absent): the new serve replays the journal,
/// the storms' and balloons' ranges read zeros.
#[test]
fn killed_right_after_a_remove_every_dropped_range_reads_zeros() {
    four_running_peers(
        "kill-remove",
        "remove-journaled:30",
        &[],
        &["--storm", "20", "--balloon"],
    );
}

/// Serve dies mid-prefetch: 4 peers hand off and prefetch a recorded set of
/// every third page (one ioctl a page, 1366 a peer); the kill comes at the
/// 3 x 1366 + 600th, so every peer was handed off and the 4th (at least)
/// is mid-prefetch. The new serve queues the set again (pages installed
/// answer EEXIST); then the vCPUs run.
#[test]
fn killed_mid_prefetch_every_peer_finishes() {
    for round in 0..loops() {
        let dir = Dir::new(&format!("kill-prefetch-{round}"), MEM);
        let rec = dir.path("set.txt");
        let offsets: Vec<u64> = (0..MEM as u64).step_by(3 * PAGE).collect();
        faultline_serve::record::write(&rec, &offsets).expect("the record");
        let runs = offsets.len();
        let failpoint = format!("prefetch-run:{}", 3 * runs + 600);
        let rec_arg = rec.to_str().expect("a UTF-8 path");
        let serve_extra = ["--prefetch", rec_arg];
        let go = dir.path("go");
        let go_arg = go.to_str().expect("a UTF-8 path");
        let mut s = serve_with_failpoint(&dir, &failpoint, &serve_extra);
        let keeper = KeeperGuard(testing::keeper_pid(&dir));
        let peers: Vec<Proc> = (1..=4)
            .map(|i| peer(&dir, i, &["--go-file", go_arg]))
            .collect();
        assert_died_at(&mut s, &dir, "prefetch-run");
        // The kill at run 3 x 1366 + 600 means a 4th peer was prefetching,
        // so each of the 4 was named first (a peer's prefetch starts once
        // it is listed and said).
        let log = dir.text("serve.err");
        assert_eq!(log.matches("): serving ").count(), 4, "{log}");
        take_over_and_finish(&dir, &keeper, 4, peers, &[], &serve_extra, Some(&go));
    }
}

/// Serve dies during the hand-off of the 3rd peer (at `failpoint`) while
/// peers 1 and 2 are mid-restore (one vCPU of each paused, three
/// faulting); the keeper holds the 3rd peer's connection (and, past
/// `handoff-deposited`, its hand-off); the new serve takes the three over
/// (reading the 3rd's hand-off again when it was not deposited) and the
/// 4th peer comes to it.
fn killed_during_a_hand_off(name: &str, failpoint: &str) {
    for round in 0..loops() {
        let dir = Dir::new(&format!("{name}-{round}"), MEM);
        let mut s = serve_with_failpoint(&dir, failpoint, &[]);
        let keeper = KeeperGuard(testing::keeper_pid(&dir));
        let pause = ["--pause-at", "50", "--pause-ms", "1500"];
        let mut peers = vec![peer(&dir, 1, &pause), peer(&dir, 2, &pause)];
        dir.wait_for("p1.err", "paused");
        dir.wait_for("p2.err", "paused");
        peers.push(peer(&dir, 3, &[]));
        let fp = failpoint.split(':').next().expect("a name");
        assert_died_at(&mut s, &dir, fp);
        let log = take_over_and_finish(&dir, &keeper, 3, peers, &[4], &[], None);
        // Each peer keeps its number: the 4th, new, is numbered on.
        for n in 1..=4 {
            assert!(log.contains(&format!("peer {n} (pid ")), "{log}");
        }
    }
}

/// Deposited (the connection and the hand-off), not yet read off the
/// connection nor served.
#[test]
fn killed_with_a_hand_off_deposited_every_peer_finishes() {
    killed_during_a_hand_off("kill-handoff", "handoff-deposited:3");
}

/// The hand-off peeked (its userfaultfd installed in serve), not
/// deposited: the keeper holds the connection with the hand-off still
/// queued on it; the new serve reads it again.
#[test]
fn killed_between_reading_a_hand_off_and_depositing_it_every_peer_finishes() {
    killed_during_a_hand_off("kill-received", "handoff-received:3");
}

/// The connection deposited, its hand-off not yet read.
#[test]
fn killed_between_depositing_a_connection_and_reading_it_every_peer_finishes() {
    killed_during_a_hand_off("kill-deposited-conn", "connection-deposited:3");
}

/// Two VMMs connect while serve is frozen (`SIGSTOP`): their connections
/// and hand-offs wait in the listener's backlog (their vCPUs already block
/// on missing pages), and serve dies. The keeper holds a dup of the
/// listener: the new serve takes it, accepts both and serves them with
/// the two it takes over.
#[test]
fn killed_with_connections_queued_in_the_backlog_every_peer_finishes() {
    for round in 0..loops() {
        let dir = Dir::new(&format!("kill-backlog-{round}"), MEM);
        // A failpoint never reached: serve dies by the test's SIGKILL.
        let mut s = serve_with_failpoint(&dir, "connection-accepted:1000", &[]);
        let keeper = KeeperGuard(testing::keeper_pid(&dir));
        let pause = ["--pause-at", "50", "--pause-ms", "1500"];
        let mut peers = vec![peer(&dir, 1, &pause), peer(&dir, 2, &pause)];
        dir.wait_for("p1.err", "paused");
        dir.wait_for("p2.err", "paused");
        let serve_pid = s.pid() as i32;
        faultline_sys::process::kill(serve_pid, faultline_sys::process::SIGSTOP)
            .expect("SIGSTOP to serve");
        peers.push(peer(&dir, 3, &[]));
        peers.push(peer(&dir, 4, &[]));
        for i in [2, 3] {
            wait_blocked(&dir, &peers[i], i + 1);
        }
        faultline_sys::process::kill(serve_pid, faultline_sys::process::SIGKILL)
            .expect("SIGKILL to serve");
        assert_sigkilled(&mut s, &dir, "the test", "serve.err");
        let log = take_over_and_finish(&dir, &keeper, 2, peers, &[], &[], None);
        assert!(log.contains("taken from the keeper"), "{log}");
    }
}

/// Waits until a thread of `p` (the `i`th peer) blocks on a missing page
/// (`handle_userfault`): its hand-off was sent.
fn wait_blocked(dir: &Dir, p: &Proc, i: usize) {
    let deadline = Instant::now() + WAIT;
    while !testing::wchans(p.pid())
        .iter()
        .any(|w| w.contains("userfault"))
    {
        assert!(
            Instant::now() < deadline,
            "peer {i} never blocked on a page: {}",
            dir.text(&format!("p{i}.err"))
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The window takeover leaves: serve dies right after `accept` returned
/// the 3rd peer's connection, before depositing it with the keeper. The
/// keeper never knew that connection: the new serve takes peers 1 and 2
/// over (both finish), and the 3rd, whose hand-off was sent (serve was
/// frozen until it was: a VMM still sending gets `EPIPE` instead), hangs
/// in the kernel at its first missing page, as without `--takeover` (the
/// test then kills it by its pid).
#[test]
fn killed_between_accepting_a_connection_and_depositing_it_that_peer_hangs() {
    use faultline_sys::process::{kill, SIGCONT, SIGSTOP};
    let dir = Dir::new("kill-accepted", MEM);
    let mut s = serve_with_failpoint(&dir, "connection-accepted:3", &[]);
    let keeper = KeeperGuard(testing::keeper_pid(&dir));
    let pause = ["--pause-at", "50", "--pause-ms", "1500"];
    let mut p1 = peer(&dir, 1, &pause);
    let mut p2 = peer(&dir, 2, &pause);
    dir.wait_for("p1.err", "paused");
    dir.wait_for("p2.err", "paused");
    kill(s.pid() as i32, SIGSTOP).expect("SIGSTOP to serve");
    let mut p3 = peer(&dir, 3, &[]);
    wait_blocked(&dir, &p3, 3);
    kill(s.pid() as i32, SIGCONT).expect("SIGCONT to serve");
    assert_died_at(&mut s, &dir, "connection-accepted");
    dir.wait_for("serve.err", "holding 2 peer(s) for the next serve");
    let mut again = testing::start(
        &dir,
        "again",
        SERVE,
        &["--timeout", "20", "--takeover", "--peers", "2"],
    );
    assert_ok(&mut p1, &dir);
    assert_ok(&mut p2, &dir);
    assert!(again.wait(WAIT).success(), "{}", dir.text("again.err"));
    assert!(p3.running(), "the 3rd peer: {}", dir.text("p3.err"));
    wait_blocked(&dir, &p3, 3);
    p3.kill();
    drop(keeper);
}

/// No serve comes back: the keeper waits `--keeper-wait` (not serve's
/// `--timeout`), then kills its peers (through the pidfd of each one's
/// connection) rather than leave them hung, and exits.
#[test]
fn a_keeper_no_serve_comes_back_to_kills_its_peers_and_exits() {
    let dir = Dir::new("kill-no-serve", MEM);
    let mut s = serve_with_failpoint(&dir, "fault-read:20", &["--keeper-wait", "2"]);
    let keeper = KeeperGuard(testing::keeper_pid(&dir));
    let mut p = peer(&dir, 1, &[]);
    assert_died_at(&mut s, &dir, "fault-read");
    // A VMM connecting now queues on the listener the keeper holds: no
    // serve comes, so it is killed too.
    let mut late = peer(&dir, 2, &[]);
    assert_sigkilled(&mut p, &dir, "the keeper", "serve.err");
    assert_sigkilled(&mut late, &dir, "the keeper", "serve.err");
    dir.wait_for("serve.err", "no serve for 2.0s: killing its 1 peer(s)");
    dir.wait_for("serve.err", "a connection queued: killed pid");
    let deadline = Instant::now() + WAIT;
    while faultline_sys::process::alive(keeper.0) {
        assert!(Instant::now() < deadline, "the keeper is still there");
        std::thread::sleep(Duration::from_millis(10));
    }
    // No serve listens on the path any more: the keeper removed it.
    assert!(!dir.sock().exists(), "the socket was left behind");
}

/// The pages of the record at `path`, sorted.
fn recorded(path: &std::path::Path) -> Vec<u64> {
    let rec = faultline_serve::record::read_record(path).expect("the record");
    let mut offs = rec.offsets();
    offs.sort_unstable();
    offs
}

/// A recording peer taken over records on: serve `--record` dies with
/// faults in flight, the same command takes the peer over, replays the
/// pages its journal holds and writes a record of the whole restore, the
/// same pages an uninterrupted recording of the same working set has.
#[test]
fn a_recording_peer_taken_over_records_its_whole_restore() {
    let dir = Dir::new("kill-record", MEM);
    let (reference, rec) = (dir.path("ref.txt"), dir.path("rec.txt"));
    let ref_arg = reference.to_str().expect("a UTF-8 path");
    let mut s = testing::serve(&dir, SERVE, &["--peers", "1", "--record", ref_arg]);
    let mut p = peer(&dir, 1, &[]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let _ = std::fs::remove_file(dir.sock());
    let rec_arg = rec.to_str().expect("a UTF-8 path");
    let extra = ["--record", rec_arg, "--timeout", "20"];
    let mut s = serve_with_failpoint(&dir, "fault-read:300", &extra);
    let keeper = KeeperGuard(testing::keeper_pid(&dir));
    let p = peer(&dir, 2, &[]);
    assert_died_at(&mut s, &dir, "fault-read");
    dir.wait_for("serve.err", "holding 1 peer(s) for the next serve");
    let args = [&["--takeover", "--peers", "1"][..], &extra].concat();
    let mut again = testing::start(&dir, "again", SERVE, &args);
    let mut p = p;
    assert_ok(&mut p, &dir);
    let st = again.wait(WAIT);
    let log = dir.text("again.err");
    assert!(st.success(), "{st}: {log}");
    let journaled = testing::number_after(&log, "its record goes on from the ");
    assert!(journaled >= 299, "{journaled} pages journaled: {log}");
    let (want, got) = (recorded(&reference), recorded(&rec));
    assert_eq!(got.len(), want.len(), "{log}");
    assert_eq!(got, want);
    drop(keeper);
}

/// `--keeper-wait` is more than 0 seconds, finite, and needs `--takeover`.
#[test]
fn a_keeper_wait_of_zero_or_without_takeover_is_refused() {
    let dir = Dir::new("keeper-wait-flags", MIB);
    for (i, bad) in [
        &["--takeover", "--keeper-wait", "0"][..],
        &["--takeover", "--keeper-wait", "inf"],
        &["--keeper-wait", "5"],
    ]
    .iter()
    .enumerate()
    {
        let name = format!("bad{i}");
        let mut p = testing::start(&dir, &name, SERVE, bad);
        let st = p.wait(WAIT);
        let err = dir.text(&format!("{name}.err"));
        assert!(!st.success(), "{bad:?} was accepted: {err}");
        assert!(err.contains("--keeper-wait"), "{bad:?}: {err}");
        assert!(!dir.sock().exists(), "{bad:?} bound the socket");
    }
}
