//! `faultline store put|get|gc` run as a user would (the binary, real
//! files, a real `redis-server` on a unix socket in a temporary
//! directory, or a 3-master cluster on loopback), each process stopped
//! by pid and each wait bounded. What the user points the commands at
//! is never destroyed: a `put` killed (SIGKILL) or stopped (SIGTERM) in
//! the middle leaves the old store byte for byte; `gc`, or the next
//! `put`, removes what a killed one left; a `get` that fails or is
//! stopped leaves the destination as it was and no temporary file.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod support;

use faultline::testing::child::deadline;
use faultline_redis::server::{pattern, sleep_nodes, Keys, RedisCluster, RedisServer};
use support::{finish, spawn, Dir, Out};

const QUICK: Duration = Duration::from_secs(60);

fn faultline(dir: &Path, args: &[&str]) -> Out {
    finish(spawn(dir, args), QUICK, &format!("faultline {args:?}"))
}

fn ok(dir: &Path, args: &[&str]) -> Out {
    let o = faultline(dir, args);
    assert_eq!(
        o.code,
        Some(0),
        "faultline {args:?}:\n{}{}",
        o.stdout,
        o.stderr
    );
    o
}

/// Slows every master down (a `DEBUG SLEEP` of 20 ms after another)
/// until dropped, so a command's progress can be caught in the middle.
struct Throttle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Throttle {
    fn new(k: &impl Keys) -> Throttle {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, urls) = (stop.clone(), k.node_urls());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                sleep_nodes(&urls, 0.02).unwrap();
            }
        });
        Throttle {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts `faultline args`, waits until its progress line says at least
/// `percent`% (at most 60 s), sends `sig`, and returns how it ended.
/// Panics if it finished before the signal.
fn signal_at(dir: &Path, args: &[&str], percent: f64, sig: i32, throttle: Throttle) -> Out {
    let mut child = spawn(dir, args);
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("faultline {args:?}: no progress to {percent}% ({e})");
            }
        };
        let pct = line
            .rsplit_once('(')
            .and_then(|(_, p)| p.strip_suffix("%)"))
            .and_then(|p| p.parse::<f64>().ok());
        if pct.is_some_and(|p| p >= percent) {
            assert!(pct.unwrap() < 100.0, "finished before the signal: {line}");
            break;
        }
    }
    faultline_sys::process::kill(child.id() as i32, sig).unwrap();
    drop(throttle);
    let mut out = finish(child, QUICK, &format!("faultline {args:?}"));
    out.stderr = reader.join().unwrap();
    out
}

fn store_keys(k: &impl Keys, name: &str) -> Vec<String> {
    k.keys(&format!("fl:{{{name}*")).unwrap()
}

/// put A; put B over it, interrupted by `sig` at 30%; A is what `info`
/// and `get` give. SIGTERM: B removed its keys and said so. SIGKILL: B's
/// keys are there until `gc` (or, with `next_put`, the next `put`)
/// removes them, saying whose they were.
fn interrupted_put(k: &impl Keys, url: &str, name: &str, sig: i32, next_put: bool) {
    let d = Dir::new(&format!("put-{name}-{sig}-{next_put}"));
    let a = pattern(2 << 20, 1);
    std::fs::write(d.path("a"), &a).unwrap();
    std::fs::write(d.path("b"), pattern(16 << 20, 2)).unwrap();
    ok(&d.0, &["store", "put", &d.s("a"), url, "--chunk", "4096"]);
    let info_a = ok(&d.0, &["store", "info", url]).stdout;
    let keys_a = store_keys(k, name);

    let out = signal_at(
        &d.0,
        &["store", "put", &d.s("b"), url, "--chunk", "4096"],
        30.0,
        sig,
        Throttle::new(k),
    );
    assert_eq!(
        out.signal,
        Some(sig),
        "ends as the signal would: {}",
        out.stderr
    );
    // The old store, byte for byte.
    assert_eq!(ok(&d.0, &["store", "info", url]).stdout, info_a);
    ok(&d.0, &["store", "get", url, &d.s("got")]);
    assert!(std::fs::read(d.path("got")).unwrap() == a, "get gives A");
    if sig != faultline_sys::process::SIGKILL {
        assert!(
            out.stderr.contains("interrupted by SIGTERM")
                && out.stderr.contains("the store is unchanged")
                && out.stderr.contains("chunk keys were removed"),
            "{}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
    assert!(info_a.contains("generation 1,"), "{info_a}");
    assert_eq!(keys_a.len(), 512 + 2, "A's chunks, metadata, records");

    if sig != faultline_sys::process::SIGKILL {
        assert_eq!(store_keys(k, name), keys_a, "B removed its keys");
        return;
    }
    let left = store_keys(k, name);
    let b_keys = left.iter().filter(|k| k.contains(":g2:")).count();
    assert!(
        b_keys >= 16 * 256 * 30 / 100,
        "B's keys up to 30%: {b_keys}"
    );
    assert_eq!(left.len(), keys_a.len() + b_keys, "{left:?}");
    let pid_note = "that ended";
    if next_put {
        let c = pattern(1 << 20, 3);
        std::fs::write(d.path("c"), &c).unwrap();
        let o = ok(&d.0, &["store", "put", &d.s("c"), url, "--chunk", "4096"]);
        assert!(
            o.stdout.contains("removed generation 2 (an upload by pid")
                && o.stdout.contains(pid_note)
                && o.stdout.contains(&format!("): {b_keys} keys")),
            "{}",
            o.stdout
        );
        assert!(
            o.stdout.contains("generation 3, replacing generation 1"),
            "{}",
            o.stdout
        );
        assert_eq!(store_keys(k, name).len(), 256 + 2, "only C is left");
        ok(&d.0, &["store", "get", url, &d.s("got")]);
        assert!(std::fs::read(d.path("got")).unwrap() == c);
    } else {
        let o = ok(&d.0, &["store", "gc", url]);
        assert!(
            o.stdout.contains("removed generation 2 (an upload by pid")
                && o.stdout.contains(pid_note)
                && o.stdout.contains(&format!("): {b_keys} keys"))
                && o.stdout.contains("the store is generation 1"),
            "{}",
            o.stdout
        );
        assert_eq!(store_keys(k, name), keys_a, "gc removed B's keys");
        let o = ok(&d.0, &["store", "gc", url]);
        assert!(
            o.stdout.contains("removed 0 keys of 0 generations"),
            "{}",
            o.stdout
        );
        ok(&d.0, &["store", "get", url, &d.s("got")]);
        assert!(std::fs::read(d.path("got")).unwrap() == a);
    }
}

#[test]
fn a_put_killed_or_stopped_mid_upload_leaves_the_old_store() {
    let _d = deadline(300);
    let s = RedisServer::start().unwrap();
    use faultline_sys::process::{SIGKILL, SIGTERM};
    interrupted_put(&s, &s.store_url("term"), "term", SIGTERM, false);
    interrupted_put(&s, &s.store_url("kill"), "kill", SIGKILL, false);
    interrupted_put(&s, &s.store_url("next"), "next", SIGKILL, true);
}

#[test]
fn a_put_killed_or_stopped_mid_upload_leaves_the_old_store_on_a_cluster() {
    let _d = deadline(300);
    let c = RedisCluster::start(3).unwrap();
    use faultline_sys::process::{SIGKILL, SIGTERM};
    interrupted_put(&c, &c.store_url("term"), "term", SIGTERM, false);
    interrupted_put(&c, &c.store_url("kill"), "kill", SIGKILL, false);
}

#[test]
fn a_get_that_fails_or_is_stopped_leaves_the_destination() {
    let _d = deadline(240);
    let s = RedisServer::start().unwrap();
    let d = Dir::new("get");
    let url = s.store_url("g");
    let a = pattern(4 << 20, 4);
    std::fs::write(d.path("a"), &a).unwrap();
    ok(&d.0, &["store", "put", &d.s("a"), &url]);
    let old = b"what the user had before".to_vec();
    std::fs::write(d.path("dst"), &old).unwrap();
    // Chunk c's key (whatever the layout: 16 chunks per hash tag).
    let chunk = |c: u64| {
        let k = s.keys(&format!("fl:{{g:{}}}*:{c}", c / 16)).unwrap();
        assert_eq!(k.len(), 1, "{k:?}");
        k[0].clone()
    };

    // A missing chunk.
    s.del(&chunk(40)).unwrap();
    let o = faultline(&d.0, &["store", "get", &url, &d.s("dst")]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert_eq!(std::fs::read(d.path("dst")).unwrap(), old);
    assert!(
        o.stderr.contains("missing") && o.stderr.contains("is unchanged"),
        "{}",
        o.stderr
    );
    assert!(d.hidden().is_empty(), "{:?}", d.hidden());

    // A corrupted chunk (same length, other bytes).
    ok(&d.0, &["store", "put", &d.s("a"), &url]);
    s.set(&chunk(7), &[0x55u8; 64 * 1024]).unwrap();
    let o = faultline(&d.0, &["store", "get", &url, &d.s("dst")]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert_eq!(std::fs::read(d.path("dst")).unwrap(), old);
    assert!(o.stderr.contains("checksum mismatch"), "{}", o.stderr);
    assert!(d.hidden().is_empty(), "{:?}", d.hidden());

    // Stopped half way (SIGTERM, then SIGINT): 32 steps of 1 MiB.
    let a = pattern(32 << 20, 6);
    std::fs::write(d.path("a"), &a).unwrap();
    ok(&d.0, &["store", "put", &d.s("a"), &url, "--chunk", "4096"]);
    for sig in [
        faultline_sys::process::SIGTERM,
        faultline_sys::process::SIGINT,
    ] {
        let out = signal_at(
            &d.0,
            &["store", "get", &url, &d.s("dst")],
            30.0,
            sig,
            Throttle::new(&s),
        );
        assert_eq!(out.signal, Some(sig), "{}", out.stderr);
        assert!(out.stderr.contains("interrupted by SIG"), "{}", out.stderr);
        assert!(out.stderr.contains("is unchanged"), "{}", out.stderr);
        assert_eq!(std::fs::read(d.path("dst")).unwrap(), old);
        assert!(d.hidden().is_empty(), "{:?}", d.hidden());
    }

    // A killed get's temporary is removed by the next get into the
    // directory (a live process's is not).
    let mut t = Command::new("true").spawn().unwrap();
    let dead = t.id();
    t.wait().unwrap();
    let live = std::process::id();
    for n in [
        format!(".dst.partial-{dead}"),
        format!(".other.partial-{dead}"),
        format!(".dst.partial-{live}"),
    ] {
        std::fs::write(d.path(&n), b"leftover").unwrap();
    }
    let o = ok(&d.0, &["store", "get", &url, &d.s("dst")]);
    assert!(std::fs::read(d.path("dst")).unwrap() == a);
    assert_eq!(d.hidden(), [format!(".dst.partial-{live}")], "{}", o.stderr);
    std::fs::remove_file(d.path(&format!(".dst.partial-{live}"))).unwrap();

    // A symlink is followed: its target is replaced, the link stays.
    std::fs::write(d.path("target"), &old).unwrap();
    std::os::unix::fs::symlink("target", d.path("link")).unwrap();
    ok(&d.0, &["store", "get", &url, &d.s("link")]);
    assert!(std::fs::symlink_metadata(d.path("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read(d.path("target")).unwrap() == a);

    // /dev/null is written in place (a check of the store); a FIFO is
    // refused, and stays a FIFO.
    let o = ok(&d.0, &["store", "get", &url, "/dev/null"]);
    assert!(o.stdout.contains("verified"), "{}", o.stdout);
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    let st = Command::new("mkfifo").arg(d.path("fifo")).status().unwrap();
    assert!(st.success());
    let o = faultline(&d.0, &["store", "get", &url, &d.s("fifo")]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(o.stderr.contains("is a FIFO"), "{}", o.stderr);
    assert!(std::fs::metadata(d.path("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(d.hidden().is_empty(), "{:?}", d.hidden());
}

#[test]
fn sizes_out_of_range_are_refused_before_any_work() {
    let _d = deadline(60);
    let s = RedisServer::start().unwrap();
    let d = Dir::new("sizes");
    std::fs::write(d.path("f"), pattern(1 << 20, 5)).unwrap();
    let url = s.store_url("sizes");
    for (flag, v, says) in [
        ("--chunk", "1099511627776", "must be from 512 to 536870912"),
        (
            "--chunk",
            "18446744073709551615",
            "must be from 512 to 536870912",
        ),
        (
            "--chunk",
            "18446744073709551616",
            "past 18446744073709551615",
        ),
        ("--chunk", "1000", "1000 is not a power of two"),
        ("--chunk", "256", "must be from 512"),
        ("--chunk", "0", "must be from 512"),
        ("--chunk=-1", "", "is negative"),
        ("--group", "0", "must be from 1 to 1048576"),
        ("--group", "1048577", "must be from 1 to 1048576"),
    ] {
        let f = d.s("f");
        let mut args = vec!["store", "put", &f, &url, flag];
        if !v.is_empty() {
            args.push(v);
        }
        let o = faultline(&d.0, &args);
        assert_eq!(o.code, Some(2), "{flag} {v}: {}", o.stderr);
        assert!(o.stderr.contains(says), "{flag} {v}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
    assert_eq!(s.dbsize().unwrap(), 0, "nothing was written");
}
