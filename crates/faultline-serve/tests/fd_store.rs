//! `serve --fd-store`: systemd's file-descriptor store as the keeper.
//! systemd is not PID 1 here (a container init is), so the test plays the
//! service manager as `sd_notify(3)`, `sd_listen_fds(3)` and
//! `systemd.service(5)` describe it: a datagram socket (`$NOTIFY_SOCKET`)
//! that keeps the descriptors of each `FDSTORE=1` message under its
//! `FDNAME=` (past `FileDescriptorStoreMax=`, when a test sets one, it
//! drops them with no word to serve, as systemd does, and says the max in
//! `$FDSTORE`) and drops those of `FDSTOREREMOVE=1`; when serve dies
//! (`SIGKILL`, at a failpoint) it starts it again with the store at fd 3,
//! 4, ... and `$LISTEN_FDS`, `$LISTEN_FDNAMES`, `$LISTEN_PID` set. 4 peers
//! (`faultline-peer`, 4 vCPU threads each) verify every byte.
//!
//! Every wait is bounded; every process is stopped by its pid (`Proc`'s
//! drop), also when an assertion fails.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use faultline_serve::testing::{self, assert_ok, Dir, Proc, WAIT};

const SERVE: &str = env!("CARGO_BIN_EXE_faultline-serve");
const PEER: &[&str] = &[env!("CARGO_BIN_EXE_faultline-peer")];
const MEM: usize = 16 << 20;
const PEER_ARGS: &[&str] = &["--threads", "4", "--working-set", "30", "--verify-all"];

/// The service manager's side: the notify socket and the store.
struct Manager {
    path: std::path::PathBuf,
    /// `FileDescriptorStoreMax=` (`None`: not said, no limit).
    max: Option<usize>,
    store: Arc<Mutex<Vec<(String, OwnedFd)>>>,
    /// Reads that found the socket empty (the store is up to date with
    /// every message sent before the last one).
    idle: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Manager {
    fn start(dir: &Dir) -> Manager {
        Manager::with_max(dir, None)
    }

    /// The service manager of a unit with `FileDescriptorStoreMax=max`.
    fn with_max(dir: &Dir, max: Option<usize>) -> Manager {
        let path = dir.path("notify");
        let sock = UnixDatagram::bind(&path).expect("the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("a read timeout");
        let store: Arc<Mutex<Vec<(String, OwnedFd)>>> = Arc::default();
        let (idle, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (s, i, st) = (store.clone(), idle.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while !st.load(SeqCst) {
                let Ok(got) = faultline_sys::sock::recv_with_fds(sock.as_fd(), &mut buf, false)
                else {
                    i.fetch_add(1, SeqCst);
                    continue;
                };
                let text = String::from_utf8_lossy(&buf[..got.bytes]).into_owned();
                let var = |k: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(k).map(str::to_string))
                };
                let name = var("FDNAME=").unwrap_or_else(|| "stored".into());
                let mut store = s.lock().expect("the store");
                if var("FDSTORE=").as_deref() == Some("1") {
                    // Past the max, closed ("Hit fd store limit", logged
                    // at debug level only).
                    let room = max.map_or(usize::MAX, |m| m.saturating_sub(store.len()));
                    let fds = got.fds.into_iter().take(room);
                    store.extend(fds.map(|fd| (name.clone(), fd)));
                } else if var("FDSTOREREMOVE=").as_deref() == Some("1") {
                    store.retain(|(n, _)| *n != name);
                }
            }
        });
        Manager {
            path,
            max,
            store,
            idle,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until every message sent so far is read (two reads found the
    /// socket empty since the call); gives the names stored.
    fn drained(&self) -> Vec<String> {
        let at = self.idle.load(SeqCst);
        let deadline = Instant::now() + WAIT;
        while self.idle.load(SeqCst) < at + 2 {
            assert!(Instant::now() < deadline, "the notify socket never drained");
            std::thread::sleep(Duration::from_millis(5));
        }
        let store = self.store.lock().expect("the store");
        store.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Starts serve (as `name`) the way the service manager does after a
    /// crash: the store at fd 3, 4, ..., `$LISTEN_*` set (`$LISTEN_PID`
    /// by a shell that execs serve, so it is serve's pid).
    fn restart(&self, dir: &Dir, name: &str, args: &[String]) -> Proc {
        let store = self.store.lock().expect("the store");
        let names: Vec<&str> = store.iter().map(|(n, _)| n.as_str()).collect();
        let fds: Vec<_> = store.iter().map(|(_, f)| f.as_fd()).collect();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"")
            .arg(SERVE)
            .args(args)
            .envs(self.env())
            .env("LISTEN_FDS", fds.len().to_string())
            .env("LISTEN_FDNAMES", names.join(":"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path(&format!("{name}.err"))).expect("stderr"));
        let _held = faultline_sys::process::pass_fds(&mut cmd, &fds).expect("passing the fds");
        let child = cmd.spawn().expect("starting serve");
        Proc {
            child,
            name: name.into(),
        }
    }
}

impl Manager {
    /// What the service manager sets in serve's environment.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("NOTIFY_SOCKET", self.path.display().to_string())];
        if let Some(max) = self.max {
            env.push(("FDSTORE", max.to_string()));
        }
        env
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts peer `i` with `PEER_ARGS` and `extra`.
fn peer(dir: &Dir, i: usize, extra: &[&str]) -> Proc {
    let args = [PEER_ARGS, extra].concat();
    testing::peer(dir, PEER, &format!("p{i}"), &args)
}

fn loops() -> usize {
    std::env::var("FAULTLINE_KILL_LOOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Serve (`--fd-store --peers 4`) under the played service manager, with
/// `failpoint` armed; `start` starts the peers and gives them once serve
/// is about to die; serve dies there; the store then holds `stored` names;
/// serve is started again from it, and every peer (and `later` new ones)
/// finishes with every byte right.
fn killed_and_restarted(
    name: &str,
    failpoint: &str,
    start: impl Fn(&Dir) -> Vec<Proc>,
    later: &[usize],
    held: usize,
) {
    for round in 0..loops() {
        let dir = Dir::new(&format!("{name}-{round}"), MEM);
        let manager = Manager::start(&dir);
        let args = testing::command(&dir, &["--timeout", "20", "--fd-store", "--peers", "4"]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let notify = manager.path.to_str().expect("a UTF-8 path");
        let mut s = Proc::start_with_env(
            "serve",
            &[SERVE],
            &argv,
            &[
                ("NOTIFY_SOCKET", notify),
                (faultline_sys::failpoint::ENV, failpoint),
            ],
            &dir.path("serve.err"),
        );
        let mut peers = start(&dir);
        let st = s.wait(WAIT);
        assert_eq!(
            st.signal(),
            Some(faultline_sys::process::SIGKILL),
            "serve should die at its failpoint ({st}):\n{}",
            dir.text("serve.err")
        );
        let stored = manager.drained();
        assert_eq!(
            stored.iter().filter(|n| n.contains("-conn-")).count(),
            held,
            "{stored:?}"
        );
        for kind in ["-listener-", "-counter"] {
            assert_eq!(
                stored.iter().filter(|n| n.contains(kind)).count(),
                1,
                "{stored:?}"
            );
        }
        let mut again = manager.restart(&dir, "again", &args);
        dir.wait_for("again.err", "taken from the keeper");
        for &i in later {
            peers.push(peer(&dir, i, &[]));
        }
        for p in &mut peers {
            assert_ok(p, &dir);
        }
        let st = again.wait(WAIT);
        let log = dir.text("again.err");
        assert!(st.success(), "{st}: {log}");
        assert_eq!(
            log.matches("taken over from the keeper").count(),
            held,
            "{log}"
        );
        assert!(log.contains("all 4 peers served"), "{log}");
        // Every peer done with was removed from the store (FDSTOREREMOVE);
        // the listener and the counter stay.
        let left = manager.drained();
        assert!(
            left.iter()
                .all(|n| n.contains("-listener-") || n.contains("-counter")),
            "left in the store: {left:?}"
        );
    }
}

/// Serve dies with fault messages read and not answered, 4 peers running
/// (`SIGKILL` at the 40th).
#[test]
fn killed_with_faults_in_flight_the_restarted_serve_takes_every_peer_from_the_store() {
    killed_and_restarted(
        "fdstore-fault-read",
        "fault-read:40",
        |dir| {
            // Handed off and waiting on a go file until serve serves all
            // four, then running.
            let go = dir.path("go");
            let go_arg = ["--go-file", go.to_str().expect("a UTF-8 path")];
            let peers: Vec<Proc> = (1..=4).map(|i| peer(dir, i, &go_arg)).collect();
            let deadline = Instant::now() + WAIT;
            while dir.text("serve.err").matches("): serving ").count() < 4 {
                assert!(Instant::now() < deadline, "{}", dir.text("serve.err"));
                std::thread::sleep(Duration::from_millis(5));
            }
            std::fs::write(&go, b"").expect("the go file");
            peers
        },
        &[],
        4,
    );
}

/// Serve dies with the 3rd peer's hand-off peeked and not stored (peers 1
/// and 2 mid-restore): the restarted serve reads it again off the
/// connection the store holds; the 4th peer comes to it.
#[test]
fn killed_between_reading_a_hand_off_and_storing_it_every_peer_finishes() {
    killed_and_restarted(
        "fdstore-received",
        "handoff-received:3",
        |dir| {
            let pause = ["--pause-at", "50", "--pause-ms", "1500"];
            let peers = vec![peer(dir, 1, &pause), peer(dir, 2, &pause)];
            dir.wait_for("p1.err", "paused");
            dir.wait_for("p2.err", "paused");
            let mut peers = peers;
            peers.push(peer(dir, 3, &[]));
            peers
        },
        &[4],
        3,
    );
}

/// Without `$NOTIFY_SOCKET` `--fd-store` is refused before the socket is
/// bound.
#[test]
fn fd_store_without_a_service_manager_is_refused() {
    let dir = Dir::new("fdstore-no-notify", 1 << 20);
    let mut p = testing::start(&dir, "serve", &[SERVE], &["--fd-store"]);
    let st = p.wait(WAIT);
    let err = dir.text("serve.err");
    assert!(!st.success(), "{err}");
    assert!(
        err.contains("--fd-store: ") && err.contains("$NOTIFY_SOCKET is not set"),
        "{err}"
    );
    assert!(!dir.sock().exists());
    // A $NOTIFY_SOCKET that names no socket: named, with the flag.
    let gone = dir.path("no-manager.sock");
    let gone_s = gone.display().to_string();
    let mut p = Proc::start_with_env(
        "gone",
        &[SERVE],
        &testing::command(&dir, &["--fd-store"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[("NOTIFY_SOCKET", gone_s.as_str())],
        &dir.path("gone.err"),
    );
    let st = p.wait(WAIT);
    let err = dir.text("gone.err");
    assert!(!st.success(), "{err}");
    assert!(
        err.contains("--fd-store: ")
            && err.contains(&format!("$NOTIFY_SOCKET ({})", gone.display())),
        "{err}"
    );
}

/// A unit whose store has room for 2 VMMs (`FileDescriptorStoreMax=13`:
/// the listener and the counter take 2, each VMM 4) and 4 VMMs at once:
/// the first 2 are stored whole; the other 2 are served, said to be served
/// without takeover and shown as unprotected, and none of their
/// descriptors is stored (a store filled to its max would have kept the
/// 3rd's connection, userfaultfd and journal and dropped its handshake,
/// leaving the next serve a peer it cannot take over). After a kill, the
/// next serve takes the 2 stored over (every byte verified); the other 2
/// hang at their next missing page, as said.
#[test]
fn a_store_with_room_for_two_vmms_keeps_two_whole_and_says_the_others_are_unprotected() {
    use faultline_serve::metrics::{scrape, MetricsAddr};
    let dir = Dir::new("fdstore-full", MEM);
    let manager = Manager::with_max(&dir, Some(13));
    let metrics = dir.path("metrics.sock");
    let args = testing::command(
        &dir,
        &[
            "--fd-store",
            "--metrics",
            metrics.to_str().expect("a UTF-8 path"),
        ],
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = manager.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut s = Proc::start_with_env("serve", &[SERVE], &argv, &env, &dir.path("serve.err"));
    dir.wait_for("serve.err", "room for 2 VMM(s) at once");
    let go = dir.path("go");
    let go_arg = ["--go-file", go.to_str().expect("a UTF-8 path")];
    let mut peers: Vec<Proc> = (1..=4).map(|i| peer(&dir, i, &go_arg)).collect();
    let deadline = Instant::now() + WAIT;
    while dir.text("serve.err").matches("): serving ").count() < 4 {
        assert!(Instant::now() < deadline, "{}", dir.text("serve.err"));
        std::thread::sleep(Duration::from_millis(5));
    }
    let log = dir.text("serve.err");
    let unprotected: Vec<u32> = log
        .lines()
        .filter(|l| l.contains("depositing it with the keeper failed"))
        .map(|l| {
            assert!(
                l.contains("store is full: FileDescriptorStoreMax=13 holds 2 VMM(s)"),
                "{l}"
            );
            l.split("(pid ")
                .nth(1)
                .and_then(|t| t.split(')').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no pid in {l}"))
        })
        .collect();
    assert_eq!(unprotected.len(), 2, "{log}");
    let text = scrape(&MetricsAddr::Unix(metrics)).expect("a scrape");
    let at = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(at("faultline_peers_unprotected"), 2.0, "{text}");
    assert_eq!(at("faultline_keeper_peers"), 2.0, "{text}");
    assert_eq!(at("faultline_keeper_room_peers"), 2.0, "{text}");
    // Each peer stored, stored whole; nothing of the others.
    let stored = manager.drained();
    // (In any order: two hand-offs may be deposited in either order.)
    let of = |kind: &str| -> Vec<&str> {
        let mut v: Vec<&str> = stored
            .iter()
            .filter_map(|n| n.strip_prefix(&format!("faultline-{kind}-")))
            .collect();
        v.sort_unstable();
        v
    };
    let conns = of("conn");
    assert_eq!(conns.len(), 2, "{stored:?}");
    for kind in ["uffd", "journal", "handshake"] {
        assert_eq!(of(kind), conns, "{kind}: {stored:?}");
    }
    assert_eq!(stored.len(), 10, "{stored:?}");
    s.kill();
    let again = testing::command(&dir, &["--fd-store", "--timeout", "20"]);
    let mut again = manager.restart(&dir, "again", &again);
    dir.wait_for("again.err", "room for 2 VMM(s) at once");
    let deadline = Instant::now() + WAIT;
    while dir
        .text("again.err")
        .matches("taken over from the keeper:")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "{}", dir.text("again.err"));
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&go, b"").expect("the go file");
    let (mut lost, kept): (Vec<Proc>, Vec<Proc>) = peers
        .drain(..)
        .partition(|p| unprotected.contains(&p.pid()));
    for mut p in kept {
        assert_ok(&mut p, &dir);
    }
    // Their serve is gone and no keeper held them: nobody answers their
    // faults.
    for p in &mut lost {
        assert!(p.running(), "an unprotected VMM finished without its serve");
        p.kill();
    }
    again.kill();
}

/// `FileDescriptorStoreMax=` too small for one VMM is refused at start,
/// before the socket is bound.
#[test]
fn a_store_with_no_room_for_one_vmm_is_refused() {
    let dir = Dir::new("fdstore-no-room", 1 << 20);
    let manager = Manager::with_max(&dir, Some(5));
    let env = manager.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = testing::command(&dir, &["--fd-store"]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut p = Proc::start_with_env("serve", &[SERVE], &argv, &env, &dir.path("serve.err"));
    let st = p.wait(WAIT);
    let err = dir.text("serve.err");
    assert!(!st.success(), "{err}");
    assert!(err.contains("no room for one VMM"), "{err}");
    assert!(!dir.sock().exists());
}
