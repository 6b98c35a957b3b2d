//! `serve --fd-store`: systemd's file-descriptor store as the keeper.
//! systemd is not PID 1 here (a container init is), so the test plays the
//! service manager as `sd_notify(3)`, `sd_listen_fds(3)` and
//! `systemd.service(5)` describe it: a datagram socket (`$NOTIFY_SOCKET`)
//! that keeps the descriptors of each `FDSTORE=1` message under its
//! `FDNAME=` and drops those of `FDSTOREREMOVE=1`; when serve dies
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
    store: Arc<Mutex<Vec<(String, OwnedFd)>>>,
    /// Reads that found the socket empty (the store is up to date with
    /// every message sent before the last one).
    idle: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Manager {
    fn start(dir: &Dir) -> Manager {
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
                    store.extend(got.fds.into_iter().map(|fd| (name.clone(), fd)));
                } else if var("FDSTOREREMOVE=").as_deref() == Some("1") {
                    store.retain(|(n, _)| *n != name);
                }
            }
        });
        Manager {
            path,
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
            .env("NOTIFY_SOCKET", &self.path)
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
    assert!(err.contains("NOTIFY_SOCKET"), "{err}");
    assert!(!dir.sock().exists());
}
