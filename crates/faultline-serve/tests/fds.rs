//! serve and its descriptor limit: raised at start, and at the limit a VMM
//! refused (and killed), never left queued and hung, while the VMMs
//! already served are served on. Real processes, each started with the
//! limit set between `fork` and `exec`; every wait bounded, every process
//! stopped by its pid.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use faultline_serve::testing::{self, assert_ok, Dir, Proc, WAIT};
use faultline_sys::process::{self, FdLimit, SIGTERM};

const SERVE: &[&str] = &[env!("CARGO_BIN_EXE_faultline-serve")];
const PEER: &[&str] = &[env!("CARGO_BIN_EXE_faultline-peer")];
const MIB: usize = 1 << 20;

/// The keeper (serve's child, not ours), killed by its pid on drop if it
/// is still there.
struct KeeperGuard(i32);

impl Drop for KeeperGuard {
    fn drop(&mut self) {
        if process::alive(self.0) {
            let _ = process::kill(self.0, process::SIGKILL);
        }
    }
}

/// A peer that verifies every byte of its memory on one vCPU, then stays
/// connected (served) for `hold_ms`.
fn holding_peer(dir: &Dir, name: &str, hold_ms: &str) -> Proc {
    let args = [
        "--threads",
        "1",
        "--working-set",
        "10",
        "--verify-all",
        "--hold-ms",
        hold_ms,
    ];
    testing::peer(dir, PEER, name, &args)
}

/// Waits until peer `name` (`p`) holds (served, every byte verified:
/// `true`) or has exited (`false`).
fn holds(dir: &Dir, name: &str, p: &mut Proc) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        if dir.text(&format!("{name}.err")).contains("holding for") {
            return true;
        }
        if !p.running() {
            return false;
        }
        assert!(Instant::now() < deadline, "{name} neither held nor exited");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Descriptors open in process `pid` below `limit` (the test harness may
/// leave it some above, its jobserver's pipe).
fn open_fds(pid: u32, limit: u64) -> usize {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter(|&fd| fd < limit)
        .count()
}

/// Started with a soft limit of 40 (as a service manager's 1024, only
/// lower), serve raises it to the hard one and serves 16 VMMs at once:
/// more descriptors than 40.
#[test]
fn serve_raises_its_descriptor_limit_and_serves_more_vmms_than_the_soft_one_allows() {
    let hard = process::fd_limit().unwrap().hard.min(4096);
    let dir = Dir::new("fd-raise", 8 * MIB);
    let limit = FdLimit { soft: 40, hard };
    let mut s = testing::serve_with_fd_limit(&dir, SERVE, &["--peers", "16"], limit);
    dir.wait_for(
        "serve.err",
        &format!("open files: limit raised from 40 to {hard}"),
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let max: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(max, [hard.to_string(), hard.to_string()], "{line}");
    let mut peers: Vec<Proc> = (0..16)
        .map(|i| holding_peer(&dir, &format!("p{i}"), "2000"))
        .collect();
    for (i, p) in peers.iter_mut().enumerate() {
        assert!(
            holds(&dir, &format!("p{i}"), p),
            "{}",
            dir.text("serve.err")
        );
    }
    // All 16 served at once: past the soft limit it was started with.
    let fds = open_fds(s.pid(), u64::MAX);
    assert!(fds > 40, "serve holds {fds} descriptors");
    for p in &mut peers {
        assert_ok(p, &dir);
    }
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(!log.contains("refused"), "{log}");
}

/// serve at a hard limit of 48, 49 and 50 descriptors (so that, whatever
/// it holds before the first VMM, it runs out at each step a VMM takes
/// one in: the `recvmsg` of its userfaultfd, the inspection of that, the
/// pidfd; then, filled up by connections that say nothing, at `accept`):
/// VMMs are served until one more cannot be; that one is refused and
/// killed, said, never left queued (hung) or the listener spinning on
/// `EMFILE`; the VMMs served are served on, and once two go a new one is
/// served again.
#[test]
fn a_vmm_past_serves_descriptor_limit_is_refused_and_killed_and_later_ones_served() {
    for max in [48, 49, 50] {
        at_the_limit(max, false);
    }
}

/// The same with `--takeover` (7 descriptors a VMM in serve, 4 in its
/// keeper, which inherits the limit) at 60, 61, ... 66: a VMM serve
/// cannot take is refused whichever step runs out, depositing it with
/// the keeper too (never "served without takeover").
#[test]
fn with_takeover_a_vmm_past_the_limit_is_refused_not_served_unprotected() {
    for max in 60..67 {
        at_the_limit(max, true);
    }
}

/// One round of the tests above at a hard limit of `max`.
fn at_the_limit(max: u64, takeover: bool) {
    let dir = Dir::new(&format!("fd-limit-{max}-{takeover}"), 8 * MIB);
    let limit = FdLimit {
        soft: max,
        hard: max,
    };
    let extra: &[&str] = if takeover { &["--takeover"] } else { &[] };
    let mut s = testing::serve_with_fd_limit(&dir, SERVE, extra, limit);
    let keeper = takeover.then(|| KeeperGuard(testing::keeper_pid(&dir)));
    dir.wait_for(
        "serve.err",
        &format!("open files: limit {max} (hard): about"),
    );
    let mut held = Vec::new();
    let mut refused = loop {
        assert!(held.len() < 20, "20 VMMs served within {max} descriptors");
        let name = format!("p{}", held.len());
        let mut p = holding_peer(&dir, &name, "60000");
        if !holds(&dir, &name, &mut p) {
            break p;
        }
        held.push(p);
    };
    let killed = |p: &mut Proc, step: &str| {
        let status = p.wait(WAIT);
        let log = dir.text("serve.err");
        assert_eq!(status.signal(), Some(9), "{status}\n{log}");
        let pid = p.pid();
        assert!(log.contains(&format!("killed pid {pid}")), "{log}");
        let said = log
            .lines()
            .find(|l| l.contains(&format!("(pid {pid}): refused")))
            .unwrap_or_else(|| panic!("{log}"));
        assert!(said.contains("serve is out of file descriptors"), "{said}");
        assert!(said.contains(step), "{log}");
    };
    killed(&mut refused, "");
    // Connections that say nothing (each holds its connection in serve,
    // a clone of it and a pidfd, taken on a thread of its own) until
    // serve has every descriptor open: the next VMM's connection is one
    // `accept` cannot take.
    let mut silent = Vec::new();
    let deadline = Instant::now() + WAIT;
    let settled = || {
        let mut last = open_fds(s.pid(), max);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            match open_fds(s.pid(), max) {
                n if n == last => return n,
                n => last = n,
            }
        }
    };
    while settled() < max as usize {
        assert!(Instant::now() < deadline, "serve never took them");
        silent.push(std::os::unix::net::UnixStream::connect(dir.sock()).unwrap());
    }
    let mut refused = holding_peer(&dir, "at-accept", "0");
    // With a keeper the deposit (a connection to it, duplicates) may be
    // the step that runs out: a silent connection refused there frees
    // what `accept` then takes.
    let step = match takeover {
        false => "(accept: Too many open files",
        true => "",
    };
    killed(&mut refused, step);
    drop(silent);
    let log = dir.text("serve.err");
    // Said once, not a line per poll round.
    let said = log.matches("accept failed").count() + log.matches("none left in reserve").count();
    assert!(said <= 1, "{log}");
    // The VMMs served are served on; two go (their descriptors with them).
    assert!(held.len() >= 2, "{log}");
    for p in &mut held {
        assert!(p.running(), "{log}");
    }
    for mut p in held.drain(..2) {
        let pid = p.pid();
        p.kill();
        // Its descriptors are closed once serve has seen it go.
        dir.wait_for("serve.err", &format!("(pid {pid}): hung up"));
    }
    let mut again = holding_peer(&dir, "again", "0");
    assert_ok(&mut again, &dir);
    for p in &mut held {
        p.kill();
    }
    process::kill(s.pid() as i32, SIGTERM).unwrap();
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(!log.contains("served without takeover"), "{log}");
    if let Some(k) = keeper {
        // Its peers gone, it exits.
        testing::wait_exited(k.0, "the keeper");
    }
}
