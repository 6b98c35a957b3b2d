//! `faultline-serve` against `faultline-peer`: real processes, real
//! userfaultfds handed over a UNIX socket, every byte compared with the
//! memory file. Every wait is bounded; every process is stopped by its pid.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use faultline_serve::metrics::{scrape, MetricsAddr};
use faultline_serve::testing::{self, assert_ok, Dir, Proc, WAIT};

const SERVE: &[&str] = &[env!("CARGO_BIN_EXE_faultline-serve")];
const PEER: &[&str] = &[env!("CARGO_BIN_EXE_faultline-peer")];
const MIB: usize = 1 << 20;

fn serve(dir: &Dir, extra: &[&str]) -> Proc {
    testing::serve(dir, SERVE, extra)
}

fn peer(dir: &Dir, name: &str, extra: &[&str]) -> Proc {
    testing::peer(dir, PEER, name, extra)
}

#[test]
fn every_handshake_variant_is_served() {
    let dir = Dir::new("variants", 8 * MIB);
    let variants = ["page-size", "kib-bytes", "kib", "none", "extra"];
    let mut s = serve(&dir, &["--peers", "5"]);
    for v in variants {
        let mut p = peer(&dir, v, &["--variant", v, "--verify-all", "--threads", "2"]);
        assert_ok(&mut p, &dir);
    }
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert_eq!(log.matches("hung up;").count(), 5, "{log}");
    assert!(log.contains("features [EVENT_REMOVE]"), "{log}");
}

/// Waits for refused peer `p` and checks that serve killed it (SIGKILL)
/// and said why.
fn assert_killed(p: &mut Proc, dir: &Dir, why: &str) {
    use std::os::unix::process::ExitStatusExt;
    let st = p.wait(WAIT);
    let log = dir.text("serve.err");
    assert_eq!(st.signal(), Some(9), "{} {st}:\n{log}", p.name);
    assert!(
        log.contains(&format!("killed pid {}: {why}", p.pid())),
        "{}: no kill message:\n{log}",
        p.name
    );
}

#[test]
fn each_refused_hand_off_is_killed_by_default_while_a_good_peer_is_served() {
    let dir = Dir::new("bad", 16 * MIB);
    let mut s = serve(&dir, &["--peers", "7"]);
    // The good peer is mid-restore (paused) while the bad ones arrive.
    let mut good = peer(
        &dir,
        "good",
        &[
            "--verify-all",
            "--pause-at",
            "30",
            "--pause-ms",
            "1500",
            "--working-set",
            "30",
        ],
    );
    dir.wait_for("good.err", "paused");
    // Every refusal of the handshake matrix: the peer (a VMM that handed
    // its userfaultfd over and now waits for pages) is killed, with the
    // reason, before its connection closes (it never sees the close).
    let cases = [
        ("json", "malformed handshake"),
        ("no-fd", "expected exactly one descriptor"),
        ("overlap", "overlap in the peer's address space"),
        ("past-end", "runs past the end of the store"),
        ("page-size", "page size 65536 bytes is not supported"),
    ];
    for (bad, _) in cases {
        let mut p = peer(&dir, bad, &["--bad", bad]);
        assert_killed(&mut p, &dir, "its hand-off was refused");
        assert!(
            !dir.text(&format!("{bad}.err"))
                .contains("closed the connection"),
            "{bad} saw its connection close before it was killed"
        );
    }
    let mut twice = peer(&dir, "twice", &["--bad", "twice", "--verify-all"]);
    assert_ok(&mut twice, &dir);
    assert_ok(&mut good, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    for (bad, why) in cases {
        assert!(log.contains(why), "no refusal for {bad}:\n{log}");
    }
    assert!(log.contains("sent a second message"), "{log}");
    assert_eq!(log.matches("refused:").count(), 5, "{log}");
}

#[test]
fn leave_peer_on_error_leaves_a_refused_peer_running() {
    let dir = Dir::new("leave", 4 * MIB);
    let mut s = serve(&dir, &["--peers", "1", "--leave-peer-on-error"]);
    // The refused peer sees its connection close and exits by itself.
    let mut p = peer(&dir, "bad", &["--bad", "json"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains("left running (its hand-off was refused"),
        "{log}"
    );
    assert!(!log.contains("killed pid"), "{log}");
}

#[test]
fn a_peer_serve_can_no_longer_serve_is_killed_by_default() {
    // Its handshake declares one region of the two it registered: its
    // first fault in the other is one serve cannot serve.
    let dir = Dir::new("failed", 4 * MIB);
    let json = dir.path("serve.json");
    let mut s = serve(&dir, &["--peers", "1", "--json", json.to_str().unwrap()]);
    let mut p = peer(&dir, "p", &["--bad", "undeclared", "--verify-all"]);
    assert_killed(&mut p, &dir, "serve can no longer serve it");
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains("lies outside every region it declared"),
        "{log}"
    );
    let sums = summaries(&dir, "serve.json");
    let outcome = sums[0]["outcome"].as_str().unwrap();
    assert!(outcome.starts_with("failed (killed): "), "{outcome}");
}

#[test]
fn a_shared_peer_without_a_snapshot_is_killed_by_default() {
    // It declares a shared backing; this serve has no --shared copy.
    let dir = Dir::new("no-snapshot", 4 * MIB);
    let snap = Shm::new("no-snapshot");
    std::fs::copy(dir.path("mem"), &snap.0).unwrap();
    let mut s = serve(&dir, &["--peers", "1"]);
    let mut p = shared_peer(&dir, "p", &snap, &["--declare-backing"]);
    assert_killed(&mut p, &dir, "its hand-off was refused");
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains("serve has no --shared snapshot"), "{log}");
}

#[test]
fn removed_ranges_read_zeros() {
    let dir = Dir::new("balloon", 8 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    let mut p = peer(&dir, "p", &["--balloon", "--threads", "4"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains("1 REMOVE events (512 pages)"), "{log}");
}

/// Two peers dropping and re-reading a range (`--storm`) while their
/// vCPUs fault, served by `faultline serve --peers 2 EXTRA`; every byte is
/// checked by the peers (started with `peer_extra` too). Returns serve's
/// log.
fn two_storming_peers(dir: &Dir, extra: &[&str], peer_extra: &[&str]) -> String {
    let mut args = vec!["--peers", "2"];
    args.extend_from_slice(extra);
    let mut s = serve(dir, &args);
    let a_args = ["--storm", "40", "--working-set", "30", "--threads", "4"];
    let mut a = peer(dir, "a", &[&a_args[..], peer_extra].concat());
    let b_args = ["--storm", "40", "--working-set", "30", "--seed", "7"];
    let mut b = peer(dir, "b", &[&b_args[..], peer_extra].concat());
    assert_ok(&mut a, dir);
    assert_ok(&mut b, dir);
    assert_ok(&mut s, dir);
    let log = dir.text("serve.err");
    // The storm really raced: REMOVE events were read (whether a given run
    // also hit EAGAIN is timing; the bytes are checked either way).
    assert!(!log.contains(" 0 REMOVE events"), "{log}");
    eprintln!("{log}");
    log
}

#[test]
fn remove_storms_racing_faults_keep_every_byte_right() {
    let dir = Dir::new("storm", 8 * MIB);
    two_storming_peers(&dir, &["--threads", "2"], &[]);
}

#[test]
fn prefetch_helpers_racing_remove_storms_keep_every_byte_right() {
    // Every page queued for prefetch, installed by the handler thread and
    // a helper thread while both peers drop and re-read a range: the copy
    // gate keeps the store's bytes out of every dropped range.
    let dir = Dir::new("prefetch-storm", 8 * MIB);
    let all = dir.record_all(8 * MIB);
    let all = all.to_str().unwrap();
    let log = two_storming_peers(&dir, &["--prefetch", all, "--prefetch-helpers", "1"], &[]);
    assert!(!log.contains(" 0 prefetched"), "{log}");
}

#[test]
fn shared_mode_remove_storms_racing_continue_prefetch_keep_every_byte_right() {
    // The same storm in shared mode: CONTINUE prefetch of every page (the
    // handler thread and a helper) and minor faults racing the drops;
    // dropped ranges must read zeros (a private page), never the
    // snapshot's bytes again.
    let dir = Dir::new("shared-storm", 8 * MIB);
    let snap = Shm::new("storm");
    let all = dir.record_all(8 * MIB);
    let all = all.to_str().unwrap();
    let log = two_storming_peers(
        &dir,
        &[
            "--shared",
            snap.arg(),
            "--prefetch",
            all,
            "--prefetch-helpers",
            "1",
        ],
        &["--backend", "shared", "--map-file", snap.arg()],
    );
    assert_eq!(log.matches("shared mode").count(), 2, "{log}");
    assert!(!log.contains(" 0 prefetched"), "{log}");
}

#[test]
fn eight_peers_restored_at_once_from_one_file_get_every_byte() {
    // One handler, one memory file, eight peers at once (two handler
    // threads, a prefetch helper): every byte of every peer compared.
    let dir = Dir::new("eight", 8 * MIB);
    let rec = dir.record_all(8 * MIB);
    let mut s = serve(
        &dir,
        &[
            "--peers",
            "8",
            "--threads",
            "2",
            "--prefetch",
            rec.to_str().unwrap(),
        ],
    );
    let mut peers: Vec<Proc> = (0..8)
        .map(|i| {
            let seed = (i + 1).to_string();
            let name = format!("p{i}");
            peer(
                &dir,
                &name,
                &["--verify-all", "--threads", "2", "--seed", &seed],
            )
        })
        .collect();
    for p in &mut peers {
        assert_ok(p, &dir);
    }
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert_eq!(log.matches("hung up;").count(), 8, "{log}");
    assert!(log.contains("all 8 peers served"), "{log}");
}

#[test]
fn a_peer_killed_mid_restore_leaves_the_others_served() {
    let dir = Dir::new("killed", 8 * MIB);
    let mut s = serve(&dir, &["--peers", "2"]);
    let mut victim = peer(&dir, "victim", &["--pause-at", "50", "--pause-ms", "30000"]);
    dir.wait_for("victim.err", "paused");
    victim.kill();
    let mut other = peer(&dir, "other", &["--verify-all"]);
    assert_ok(&mut other, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert_eq!(log.matches("hung up;").count(), 2, "{log}");
}

#[test]
fn a_killed_handler_leaves_the_peer_blocked_in_the_kernel() {
    // What Firecracker documents: with its handler gone, a VM hangs at its
    // next missing page. The peer's vCPU sleeps in handle_userfault.
    let dir = Dir::new("handler", 8 * MIB);
    let mut s = serve(&dir, &[]);
    let mut p = peer(
        &dir,
        "p",
        &[
            "--pause-at",
            "50",
            "--pause-ms",
            "300",
            "--threads",
            "1",
            "--verify-all",
        ],
    );
    dir.wait_for("p.err", "paused");
    s.kill();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        p.running(),
        "the peer should hang, not exit: {}",
        dir.text("p.err")
    );
    let wchans = testing::wchans(p.pid());
    assert!(
        wchans.iter().any(|w| w.contains("userfault")),
        "no thread blocked in handle_userfault: {wchans:?}"
    );
    p.kill();
}

#[test]
fn four_vcpus_on_two_regions_with_a_gap() {
    let dir = Dir::new("vcpus", 16 * MIB);
    let mut s = serve(&dir, &["--peers", "1", "--fault-around", "8"]);
    let mut p = peer(
        &dir,
        "p",
        &[
            "--threads",
            "4",
            "--regions",
            "6291456,10485760",
            "--gap",
            "4194304",
            "--verify-all",
        ],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
}

/// A guest on KVM reads its memory: the faults come from KVM in the
/// kernel (an EPT violation, then `get_user_pages` on the VMM's mapping,
/// waiting in `handle_userfault`), as a real VMM's guest's do, not from
/// the peer's own loads. Each vCPU's sum of its pages' first words is
/// checked against the file by the peer, then every byte. Needs
/// `/dev/kvm` (this machine's kind has it, nested); skipped, and says
/// so, where there is none.
#[test]
fn a_kvm_guest_reads_its_memory_through_serve() {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("skipped: no /dev/kvm on this machine");
        return;
    }
    let dir = Dir::new("kvm", 16 * MIB);
    let mut s = serve(&dir, &["--peers", "2"]);
    for pattern in ["sweep", "clustered"] {
        let mut p = peer(
            &dir,
            pattern,
            &[
                "--kvm",
                "--threads",
                "2",
                "--working-set",
                "50",
                "--pattern",
                pattern,
                "--regions",
                "6291456,10485760",
                "--verify-all",
            ],
        );
        assert_ok(&mut p, &dir);
        let out = dir.text(&format!("{pattern}.err"));
        assert!(out.contains("16777216 bytes verified"), "{out}");
    }
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert_eq!(log.matches("hung up;").count(), 2, "{log}");
}

#[test]
fn a_kvm_guest_in_huge_pages_reads_its_memory_through_serve() {
    // --kvm --huge: the guest's memory is 2 MiB hugetlb pages (KVM maps
    // them whole), each fault a huge page copied in; sums and bytes checked.
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("skipped: no /dev/kvm on this machine");
        return;
    }
    let Some(_pool) = huge_pool(8, "hugetlb guest memory") else {
        return;
    };
    let dir = Dir::new("kvm-huge", 8 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    let args = [
        "--kvm",
        "--huge",
        "--threads",
        "2",
        "--working-set",
        "60",
        "--verify-all",
    ];
    let mut p = peer(&dir, "p", &args);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let out = dir.text("p.err");
    assert!(
        out.contains("read by the KVM guest") && out.contains("8388608 bytes verified"),
        "{out}"
    );
    let log = dir.text("serve.err");
    // Every huge page once: 4 pages, 8 MiB.
    assert!(log.contains("4 pages installed"), "{log}");
}

#[test]
fn a_handshake_whose_page_size_is_not_its_mappings_is_refused() {
    // Hugetlb memory declared with 4 KiB pages (a handshake without a
    // page size): refused at the hand-off, saying both sizes (every
    // install would fail with EINVAL at the VM's first fault).
    let Some(_pool) = huge_pool(8, "hugetlb regions") else {
        return;
    };
    let dir = Dir::new("huge-said-4k", 8 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    let mut p = peer(&dir, "p", &["--huge", "--variant", "none"]);
    let st = p.wait(WAIT);
    assert!(!st.success(), "{st}");
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains(
            "refused: region 0: the handshake says 4096-byte pages, the peer's mapping at"
        ) && log.contains("has 2097152-byte pages"),
        "{log}"
    );
}

#[test]
fn hugetlb_regions_are_served_and_prefetched() {
    // Two 4 MiB regions of 2 MiB hugetlb pages: on demand, then a record
    // and a prefetch of it; every byte compared each time.
    let Some(pool) = huge_pool(8, "hugetlb rows") else {
        return;
    };
    let dir = Dir::new("huge", 8 * MIB);
    let rec = dir.path("ws.txt");
    let huge = ["--huge", "--verify-all", "--threads", "2"];
    let json = dir.path("serve.json");
    let mut s = serve(
        &dir,
        &[
            "--peers",
            "1",
            "--record",
            rec.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let mut p = peer(&dir, "p", &huge);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let summary = std::fs::read_to_string(&json).unwrap();
    assert!(
        summary.contains(&format!("\"bytes_read\": {}", 8 * MIB)),
        "{summary}"
    );
    let log = dir.text("serve.err");
    // --verify-all touches every page: 4 huge pages, 8 MiB read.
    assert!(log.contains("4 pages installed"), "{log}");
    assert!(log.contains("recorded 4 pages"), "{log}");
    let mut s = serve(&dir, &["--peers", "1", "--prefetch", rec.to_str().unwrap()]);
    let mut p = peer(&dir, "pre", &huge);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains("prefetching 4 pages"), "{log}");
    assert!(!log.contains(" 0 prefetched"), "{log}");
    drop(pool);
}

#[test]
fn record_then_prefetch_gives_identical_bytes() {
    let dir = Dir::new("record", 16 * MIB);
    let rec = dir.path("ws.txt");
    let mut s = serve(&dir, &["--peers", "1", "--record", rec.to_str().unwrap()]);
    let mut p = peer(&dir, "rec", &["--working-set", "25", "--seed", "3"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let pages = faultline_serve::record::read(&rec).unwrap().len();
    assert!(pages > 0, "{}", std::fs::read_to_string(&rec).unwrap());
    let mut s = serve(&dir, &["--peers", "1", "--prefetch", rec.to_str().unwrap()]);
    let mut p = peer(
        &dir,
        "pre",
        &["--working-set", "25", "--seed", "3", "--verify-all"],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains(&format!("prefetching {pages} pages")), "{log}");
    assert!(!log.contains(" 0 prefetched"), "{log}");
}

/// A peer is named in serve's log before anything else is said of it:
/// its prefetch starts once it is listed and its "serving" line is out.
/// The peer's handshake comes late, so serve sets it up on a thread of
/// its own while the listener says events; serve is held 300 ms just
/// after it built the peer (a failpoint). When the engine had the peer
/// before it was listed, its prefetch of 16 pages ended meanwhile and was
/// said of "peer 0 (pid 0)", before its "serving" line.
#[test]
fn a_peer_is_named_before_its_prefetch_can_end() {
    let dir = Dir::new("named-first", 4 * MIB);
    let rec = dir.path("set.txt");
    let offsets: Vec<u64> = (0..16).map(|i| i * 4096).collect();
    faultline_serve::record::write(&rec, &offsets).unwrap();
    let args = ["--peers", "1", "--prefetch", rec.to_str().unwrap()];
    let env = [(faultline_sys::failpoint::ENV, "peer-built!sleep=300")];
    let mut s = testing::serve_with_env(&dir, SERVE, &args, &env);
    let peer_args = [
        "--working-set",
        "25",
        "--compute-us",
        "200",
        "--verify-all",
        "--handshake-delay-ms",
        "50",
    ];
    let mut p = peer(&dir, "p", &peer_args);
    let pid = p.pid();
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    let serving = log.find(&format!("peer 1 (pid {pid}): serving "));
    let done = log.find(&format!("peer 1 (pid {pid}): prefetch done: 16 pages"));
    assert!(
        matches!((serving, done), (Some(s), Some(d)) if s < d),
        "{log}"
    );
}

/// `dir`'s memory file (`bytes` long) put in `server` as "snap", and
/// serve started on it (`--store`, one peer); its URL.
#[cfg(feature = "redis")]
fn serve_from_redis(
    dir: &Dir,
    server: &faultline_redis::server::RedisServer,
    bytes: usize,
    extra: &[&str],
) -> (Proc, String) {
    use faultline_redis::{RedisConfig, RedisStore};
    let url = server.store_url("snap");
    let mem = std::fs::File::open(dir.path("mem")).unwrap();
    let mem = std::io::BufReader::new(mem);
    RedisStore::put(&url, RedisConfig::default(), mem, bytes as u64, |_| {}).unwrap();
    let sock = dir.sock();
    let args = ["--socket", sock.to_str().unwrap(), "--store", &url];
    let s = Proc::start(
        "serve",
        SERVE,
        &[&args[..], &["--timeout", "20", "--peers", "1"], extra].concat(),
        &dir.path("serve.err"),
    );
    dir.wait_for("serve.err", "listening on");
    (s, url)
}

/// The store stops answering while a VM faults (its `redis-server`
/// SIGSTOPped, as a paused container or a host thrashing does): serve
/// says its handler thread is held once it has been a second, and that
/// it is back when the server answers again (SIGCONT, within the
/// store's 5 s deadline); the VM verifies every byte.
#[cfg(feature = "redis")]
#[test]
fn a_store_that_stops_answering_is_said_and_the_vm_served_when_it_answers() {
    use faultline_sys::process::{kill, SIGCONT, SIGSTOP};
    let dir = Dir::new("redis-stopped", 16 * MIB);
    let server = faultline_redis::server::RedisServer::start().unwrap();
    let pid = server.pid().expect("redis-server's pid") as i32;
    let (mut s, _) = serve_from_redis(&dir, &server, 16 * MIB, &[]);
    let args = [
        "--verify-all",
        "--threads",
        "2",
        "--working-set",
        "50",
        "--pause-at",
        "30",
        "--pause-ms",
        "1000",
    ];
    let mut p = peer(&dir, "peer", &args);
    dir.wait_for("peer.err", "paused after");
    kill(pid, SIGSTOP).unwrap();
    // Said whatever happens next; the server answers again either way.
    let held =
        std::panic::catch_unwind(|| dir.wait_for("serve.err", "has been on one fault of peer 1"));
    kill(pid, SIGCONT).unwrap();
    held.unwrap();
    dir.wait_for("serve.err", "handler thread 0 is back, after");
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
}

/// A snapshot uploaded to a real `redis-server` (the test's own, on a
/// unix socket) is served with `--store`, every byte checked by the peer.
#[cfg(feature = "redis")]
#[test]
fn a_snapshot_in_redis_is_served_byte_for_byte() {
    let dir = Dir::new("redis", 8 * MIB);
    let server = faultline_redis::server::RedisServer::start().unwrap();
    let (mut s, url) = serve_from_redis(&dir, &server, 8 * MIB, &[]);
    let mut p = peer(&dir, "peer", &["--verify-all", "--threads", "2"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains(&format!("peers of {url}")), "{log}");
    assert_eq!(log.matches("hung up;").count(), 1, "{log}");
    // A store that was never put is refused at start, by name.
    let bad_sock = dir.path("bad.sock");
    let bad_args = ["--socket", bad_sock.to_str().unwrap(), "--store"];
    let nothing = server.store_url("nothing");
    let mut bad = Proc::start(
        "bad",
        SERVE,
        &[&bad_args[..], &[nothing.as_str()]].concat(),
        &dir.path("bad.err"),
    );
    assert!(!bad.wait(WAIT).success());
    assert!(
        dir.text("bad.err").contains("no store named"),
        "{}",
        dir.text("bad.err")
    );
}

/// Without the `redis` feature, `--store` is refused at start, naming the
/// feature, before anything is bound.
#[cfg(not(feature = "redis"))]
#[test]
fn a_store_without_the_redis_feature_is_refused_by_name() {
    let dir = Dir::new("no-redis", MIB);
    let sock = dir.sock();
    let args = [
        "--socket",
        sock.to_str().unwrap(),
        "--store",
        "redis://127.0.0.1:1#snap",
    ];
    let mut s = Proc::start("serve", SERVE, &args, &dir.path("serve.err"));
    assert!(!s.wait(WAIT).success());
    let log = dir.text("serve.err");
    assert!(log.contains("`redis` cargo feature"), "{log}");
    assert!(!sock.exists(), "a socket was bound");
}

/// What serve refuses before it binds anything: flags clap rejects (the
/// removed `--engine` and `--kill-peer-on-error` among them), counts of
/// zero or past the limits, waits that are zero, infinite or not a number,
/// output paths it could not write and a record it cannot read, and a
/// socket path that holds a file of someone's (which is left as it was).
#[test]
fn a_missing_source_names_both_flags() {
    // Neither --mem nor --store: the error names both; both: refused.
    for (extra, why) in [
        (&[][..], "<--mem <MEM>|--store <STORE>>"),
        (
            &["--mem", "m", "--store", "unix:///s#n"][..],
            "cannot be used with",
        ),
    ] {
        let out = Command::new(SERVE[0])
            .args(["--socket", "/nonexistent/serve.sock"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "{extra:?}: {err}"
        );
    }
}

#[test]
fn bad_flags_and_a_taken_socket_path_are_refused_at_start() {
    let dir = Dir::new("flags", MIB);
    let no_dir = dir.path("no/such/dir/out.json");
    let no_dir = no_dir.to_str().unwrap();
    let a_dir = dir.path("");
    let a_dir = a_dir.to_str().unwrap();
    let missing = dir.path("missing.txt");
    let missing = missing.to_str().unwrap();
    for (i, (extra, why)) in [
        (&["--engine", "signal"][..], "invalid value 'signal'"),
        (&["--kill-peer-on-error"][..], "unexpected argument"),
        (&["--threads", "0"][..], "must be at least 1"),
        (
            &["--engine", "per-cpu", "--threads", "2"][..],
            "--threads 2 with --engine per-cpu",
        ),
        (&["--threads", "100000"][..], "100000 is more than the 1024"),
        (
            &["--prefetch-helpers", "5000"][..],
            "5000 is more than the 1024",
        ),
        (
            &["--fault-around", "1000000"][..],
            "1000000 is more than the 1024",
        ),
        (&["--peers", "0"][..], "must be at least 1"),
        (&["--timeout=-1"][..], "--timeout"),
        (
            &["--timeout", "inf"][..],
            "must be a finite number of seconds",
        ),
        (
            &["--timeout", "NaN"][..],
            "must be a finite number of seconds",
        ),
        (
            &["--timeout", "0"][..],
            "must be more than 0 seconds (or `none`: no timeout)",
        ),
        (&["--timeout", "1e30"][..], "--timeout"),
        (&["--handshake-timeout", "inf"][..], "--handshake-timeout"),
        (
            &["--handshake-timeout", "0"][..],
            "--handshake-timeout must be more",
        ),
        (&["--grace", "inf"][..], "--grace"),
        (&["--json", no_dir][..], "does not exist"),
        (&["--json", a_dir][..], "is a directory"),
        (&["--record", no_dir][..], "does not exist"),
        (&["--prefetch", missing][..], "missing.txt"),
        (
            &["--fault-around", "16", "--fault-around-initial", "32"][..],
            "more than --fault-around 16",
        ),
        (
            &["--fault-around-initial", "0"][..],
            "--fault-around-initial",
        ),
        (&["--run-ahead", "1000"][..], "a multiple of 4096"),
        (
            &["--record", "/tmp/{peer}/rec.txt"][..],
            "{peer} is replaced in the file's name only",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("flags-{i}");
        let mut s = testing::start(&dir, &name, SERVE, extra);
        let st = s.wait(WAIT);
        let log = dir.text(&format!("{name}.err"));
        assert!(!st.success() && log.contains(why), "{extra:?}: {st}: {log}");
        assert!(!dir.sock().exists(), "{extra:?}: a socket was bound");
    }
    std::fs::write(dir.sock(), b"not a socket").unwrap();
    let mut s = testing::start(&dir, "taken", SERVE, &["--timeout", "1"]);
    assert!(!s.wait(WAIT).success());
    let log = dir.text("taken.err");
    assert!(log.contains("exists and is not a socket"), "{log}");
    assert_eq!(std::fs::read(dir.sock()).unwrap(), b"not a socket");
}

/// A memory file that is a FIFO (opening it would wait for a writer
/// forever), a directory, a character device or empty is refused at
/// start, before the socket is bound; a `--prefetch` record with pages
/// past the file is refused too (one near 2^64 once aborted serve).
#[test]
fn a_memory_file_that_is_no_snapshot_is_refused_at_start() {
    let dir = Dir::new("mem-kinds", MIB);
    let fifo = dir.path("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::write(dir.path("empty"), b"").unwrap();
    std::fs::write(dir.path("tiny"), b"ab").unwrap();
    std::fs::create_dir(dir.path("dir")).unwrap();
    let sock = dir.sock();
    for (mem, why) in [
        (fifo.clone(), "not a regular file"),
        (dir.path("dir"), "not a regular file"),
        (PathBuf::from("/dev/zero"), "not a regular file"),
        (dir.path("empty"), "empty: there is nothing to serve"),
        (dir.path("tiny"), "smaller than one page"),
    ] {
        let args = [
            "--socket",
            sock.to_str().unwrap(),
            "--mem",
            mem.to_str().unwrap(),
        ];
        let mut s = Proc::start("serve", SERVE, &args, &dir.path("kinds.err"));
        let st = s.wait(WAIT);
        let log = dir.text("kinds.err");
        assert!(!st.success() && log.contains(why), "{mem:?}: {st}: {log}");
        assert!(!sock.exists());
    }
    let rec = dir.path("far.txt");
    faultline_serve::record::write(&rec, &[0x1000, 0xffff_ffff_ffff_f000]).unwrap();
    let mut s = testing::start(&dir, "far", SERVE, &["--prefetch", rec.to_str().unwrap()]);
    let st = s.wait(WAIT);
    let log = dir.text("far.err");
    assert!(
        !st.success() && log.contains("outside the memory file"),
        "{st}: {log}"
    );
}

/// `--timeout none` serves until stopped (a daemon under systemd): it
/// outlives an idle `--timeout 1`, which exits with its error, and then
/// serves a VMM that comes later.
#[test]
fn timeout_none_serves_until_stopped() {
    let idle = Dir::new("idle", MIB);
    let mut quick = testing::start(&idle, "quick", SERVE, &["--timeout", "1"]);
    let dir = Dir::new("notimeout", 4 * MIB);
    let mut s = testing::start(&dir, "serve", SERVE, &["--timeout", "none", "--peers", "1"]);
    let st = quick.wait(WAIT);
    let log = idle.text("quick.err");
    assert!(
        !st.success() && log.contains("no peer connected for"),
        "{st}: {log}"
    );
    dir.wait_for("serve.err", "no timeout");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(s.running(), "{}", dir.text("serve.err"));
    let mut p = peer(&dir, "p", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    for bad in ["0", "never"] {
        let mut b = testing::start(&dir, "bad", SERVE, &["--timeout", bad]);
        assert!(!b.wait(WAIT).success());
        let log = dir.text("bad.err");
        assert!(log.contains("--timeout"), "{bad}: {log}");
    }
}

/// Sends SIGTERM to `p`.
fn term(p: &Proc) {
    faultline_sys::process::kill(p.pid() as i32, faultline_sys::process::SIGTERM).unwrap();
}

#[test]
fn sigterm_stops_accepting_serves_the_live_peer_to_its_end_and_writes_json() {
    let dir = Dir::new("sigterm", 8 * MIB);
    let json = dir.path("serve.json");
    let mut s = serve(&dir, &["--json", json.to_str().unwrap(), "--grace", "30"]);
    let mut p = peer(
        &dir,
        "p",
        &[
            "--verify-all",
            "--threads",
            "4",
            "--pause-at",
            "30",
            "--pause-ms",
            "1000",
        ],
    );
    dir.wait_for("p.err", "paused");
    term(&s);
    dir.wait_for("serve.err", "SIGTERM: stopping");
    // No new peer reaches it...
    assert!(!dir.sock().exists(), "the socket is still there");
    assert!(std::os::unix::net::UnixStream::connect(dir.sock()).is_err());
    // ...and the one it serves gets every byte.
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains("1 peer(s) still served"), "{log}");
    assert!(
        log.contains("stopped (SIGTERM): every peer hung up"),
        "{log}"
    );
    let sums = summaries(&dir, "serve.json");
    assert_eq!(sums.len(), 1, "{sums:?}");
    assert_eq!(sums[0]["outcome"], "hung up", "{sums:?}");
    assert!(sums[0]["faults"].as_u64().unwrap() > 0, "{sums:?}");
}

/// A second stop signal ends serve at once (Ctrl-C twice): the VMM it
/// served is killed, with the reason, not left waiting forever for pages
/// no one will serve.
#[test]
fn a_second_signal_ends_serve_at_once_and_kills_the_vmms_it_served() {
    use std::os::unix::process::ExitStatusExt;
    let dir = Dir::new("second-signal", 4 * MIB);
    let paused = ["--pause-at", "30", "--pause-ms", "30000", "--threads", "2"];
    let mut s = serve(&dir, &["--grace", "20"]);
    let mut p = peer(&dir, "p", &paused);
    dir.wait_for("p.err", "paused");
    term(&s);
    dir.wait_for("serve.err", "SIGTERM: stopping");
    faultline_sys::process::kill(s.pid() as i32, faultline_sys::process::SIGINT).unwrap();
    let st = s.wait(WAIT);
    assert_eq!(st.signal(), Some(2), "{st}: {}", dir.text("serve.err"));
    assert_killed(&mut p, &dir, "serve ended at once (SIGINT again)");
    let log = dir.text("serve.err");
    assert!(
        log.contains("ending at once (SIGINT again): 1 VMM(s) still served"),
        "{log}"
    );
    assert!(!dir.sock().exists());
}

/// A new snapshot renamed over the memory file while serve runs: a VMM
/// that comes after is refused (served the old file's bytes its memory
/// would be wrong) and killed, with the reason.
#[test]
fn a_vmm_after_the_memory_file_was_replaced_is_refused() {
    let dir = Dir::new("mem-replaced", 4 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    let new = dir.path("mem.new");
    std::fs::copy(dir.path("mem"), &new).unwrap();
    std::fs::rename(&new, dir.path("mem")).unwrap();
    let mut p = peer(&dir, "p", &["--verify-all"]);
    assert_killed(&mut p, &dir, "its hand-off was refused");
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains("is another file now (replaced while serve ran)"),
        "{log}"
    );
}

#[test]
fn a_peer_still_served_when_the_grace_period_ends_is_killed_or_left() {
    let dir = Dir::new("grace", 4 * MIB);
    let json = dir.path("serve.json");
    let json = json.to_str().unwrap();
    let paused = ["--pause-at", "30", "--pause-ms", "30000", "--threads", "2"];
    let mut s = serve(&dir, &["--json", json, "--grace", "0.3"]);
    let mut p = peer(&dir, "p", &paused);
    dir.wait_for("p.err", "paused");
    term(&s);
    assert_killed(
        &mut p,
        &dir,
        "serve is stopping (SIGTERM) and its grace period of 0.3s ended",
    );
    assert_ok(&mut s, &dir);
    assert!(dir
        .text("serve.err")
        .contains("stopped (SIGTERM) at the end of its grace period"));
    let sums = summaries(&dir, "serve.json");
    assert!(
        sums[0]["outcome"].as_str().unwrap().starts_with("killed: "),
        "{sums:?}"
    );
    // With --leave-peer-on-error it is left (blocked in the kernel, as
    // without a handler); the test stops it.
    let mut s = serve(&dir, &["--grace", "0.3", "--leave-peer-on-error"]);
    let mut p = peer(&dir, "left", &paused);
    dir.wait_for("left.err", "paused");
    term(&s);
    assert_ok(&mut s, &dir);
    assert!(p.running(), "{}", dir.text("left.err"));
    assert!(dir
        .text("serve.err")
        .contains("left running (serve is stopping"));
    p.kill();
}

#[test]
fn a_live_socket_is_refused_by_pid_and_only_the_own_socket_is_removed() {
    let dir = Dir::new("owner", 4 * MIB);
    let mut a = serve(&dir, &["--peers", "1"]);
    // A second serve on the same path: refused, naming the first's pid;
    // the first's socket stays and serves on.
    let mut b = testing::start(&dir, "b", SERVE, &["--timeout", "5"]);
    assert!(!b.wait(WAIT).success());
    let log = dir.text("b.err");
    assert!(log.contains(&format!("in use by pid {}", a.pid())), "{log}");
    assert!(dir.sock().exists());
    let mut p = peer(&dir, "p", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut a, &dir);
    let log = dir.text("serve.err");
    // b's look at the socket was no peer.
    assert!(
        log.contains("hung up without a handshake; not a peer"),
        "{log}"
    );
    assert!(log.contains("all 1 peers served"), "{log}");
    // Someone removes c's socket and d binds the path: c's stop leaves
    // d's socket in place, and d serves on.
    let mut c = testing::start(&dir, "c", SERVE, &["--timeout", "20"]);
    dir.wait_for("c.err", "listening on");
    std::fs::remove_file(dir.sock()).unwrap();
    let mut d = testing::start(&dir, "d", SERVE, &["--timeout", "20", "--peers", "1"]);
    dir.wait_for("d.err", "listening on");
    term(&c);
    assert!(c.wait(WAIT).success(), "{}", dir.text("c.err"));
    assert!(
        dir.text("c.err")
            .contains("no longer the socket this serve bound"),
        "{}",
        dir.text("c.err")
    );
    assert!(dir.sock().exists(), "c removed d's socket");
    let mut p = peer(&dir, "q", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert!(d.wait(WAIT).success(), "{}", dir.text("d.err"));
    assert!(!dir.sock().exists(), "d left its socket behind");
}

/// Outputs that name a file serve reads (the memory file by a symbolic or
/// a hard link, the recorded set), a socket path it binds, or another
/// output are refused at start, and the memory file is left as it was;
/// `--record` may name the `--prefetch` set (a restore replacing it).
#[test]
fn outputs_that_name_what_serve_reads_or_binds_are_refused() {
    let dir = Dir::new("same-file", MIB);
    let mem = dir.path("mem");
    let before = std::fs::read(&mem).unwrap();
    std::os::unix::fs::symlink(&mem, dir.path("mem-link")).unwrap();
    std::fs::hard_link(&mem, dir.path("mem-hard")).unwrap();
    std::fs::write(dir.path("set.txt"), b"a set").unwrap();
    std::os::unix::fs::symlink(dir.path("later.txt"), dir.path("dangling")).unwrap();
    let p = |f: &str| dir.path(f).to_str().unwrap().to_string();
    let sock = dir.sock().to_str().unwrap().to_string();
    let (link, hard, set, out) = (p("mem-link"), p("mem-hard"), p("set.txt"), p("out.json"));
    let metrics = p("metrics.sock");
    for (i, (extra, why)) in [
        (vec!["--metrics", &sock], "the path of --socket"),
        (vec!["--json", &link], "the same file as --mem"),
        (vec!["--record", &hard], "the same file as --mem"),
        (vec!["--track-dirty", &p("mem")], "the same file as --mem"),
        (vec!["--json", &sock], "the same file as --socket"),
        (
            vec!["--metrics", &metrics, "--record", &metrics],
            "the same file as --metrics",
        ),
        (
            vec!["--prefetch", &set, "--json", &set],
            "the same file as --prefetch",
        ),
        (
            vec!["--json", &out, "--track-dirty", &out],
            "the same file as --json",
        ),
        (
            vec!["--json", &p("r-3.txt"), "--record", &p("r-{peer}.txt")],
            "its {peer} path can become --json",
        ),
        (
            vec!["--shared", &p("copy"), "--track-dirty", &p("copy")],
            "the same file as --shared",
        ),
        (
            vec!["--record", &p("o{peer}1"), "--track-dirty", &p("o1{peer}")],
            "become the same file for one peer",
        ),
        (
            vec!["--json", &p("dangling"), "--record", &p("later.txt")],
            "the same file as --json",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("same-{i}");
        let mut s = testing::start(&dir, &name, SERVE, &extra);
        let st = s.wait(WAIT);
        let log = dir.text(&format!("{name}.err"));
        assert!(!st.success() && log.contains(why), "{extra:?}: {st}: {log}");
        assert!(!dir.sock().exists(), "{extra:?}: a socket was bound");
    }
    assert_eq!(std::fs::read(&mem).unwrap(), before);
    assert_eq!(std::fs::read(dir.path("set.txt")).unwrap(), b"a set");
    assert!(!dir.path("out.json").exists());
    // The set itself as --record's output is not refused as an output
    // (it is read first, then fails as the record it is not).
    let mut s = testing::start(&dir, "set", SERVE, &["--prefetch", &set, "--record", &set]);
    assert!(!s.wait(WAIT).success());
    let log = dir.text("set.err");
    assert!(!log.contains("the same file"), "{log}");
}

/// A record's path, once its `{peer}` is a number, checked again when it is
/// written: one that became the memory file (a hard link `m1.bin`) is not
/// written, and said; a file beside the record named like its temporary
/// (`rec.tmp` for `rec.txt`) is left alone.
#[test]
fn a_record_is_never_written_over_the_memory_file_or_a_neighbour() {
    let dir = Dir::new("record-over-mem", 4 * MIB);
    let mem = dir.path("mem");
    let before = std::fs::read(&mem).unwrap();
    std::fs::hard_link(&mem, dir.path("m1.bin")).unwrap();
    std::fs::write(dir.path("rec.tmp"), b"precious").unwrap();
    let template = dir.path("m{peer}.bin");
    let mut s = serve(
        &dir,
        &["--peers", "1", "--record", template.to_str().unwrap()],
    );
    let mut p = peer(&dir, "p", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains("peer 1: writing the record failed") && log.contains("the same file as --mem"),
        "{log}"
    );
    assert_eq!(std::fs::read(&mem).unwrap(), before);
    let rec = dir.path("rec.txt");
    let mut s = serve(&dir, &["--peers", "1", "--record", rec.to_str().unwrap()]);
    let mut p = peer(&dir, "q", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    assert_eq!(std::fs::read(dir.path("rec.tmp")).unwrap(), b"precious");
    assert!(
        dir.text("rec.txt").starts_with("# faultline working set"),
        "{}",
        dir.text("rec.txt")
    );
}

/// `--record` and `--track-dirty` without `{peer}` go to the first peer
/// that runs to its end: one that fails (a fault in a region it did not
/// declare: killed) writes neither, so a bad restore never empties the
/// set or the dirty file; the next peer's are written.
#[test]
fn a_peer_that_fails_writes_no_record_and_leaves_it_to_the_next() {
    let dir = Dir::new("record-failed", 4 * MIB);
    let (rec, dirty) = (dir.path("rec.txt"), dir.path("dirty.txt"));
    let args = [
        "--peers",
        "2",
        "--record",
        rec.to_str().unwrap(),
        "--track-dirty",
        dirty.to_str().unwrap(),
    ];
    let mut s = serve(&dir, &args);
    let mut bad = peer(
        &dir,
        "bad",
        &["--bad", "undeclared", "--working-set", "100"],
    );
    assert_killed(&mut bad, &dir, "serve can no longer serve it");
    let mut good = peer(&dir, "good", &["--verify-all", "--scribble"]);
    assert_ok(&mut good, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains("peer 1: its restore did not run to its end: its record is not written"),
        "{log}"
    );
    assert!(
        log.contains("peer 1: it did not run to its end: its dirty set is not written"),
        "{log}"
    );
    let recorded = testing::number_after(&log, "peer 2: recorded ");
    assert!(recorded > 0, "{log}");
    assert!(
        testing::number_after(&log, "peer 2: hung up: ") > 0,
        "{log}"
    );
}

/// A client at the wrong socket (an HTTP request meant for the VMM's API
/// socket: bytes, no descriptor) holds no userfaultfd: refused, and not
/// killed, since nothing of it waits for serve; a VMM is served after it.
#[test]
fn a_client_that_holds_no_userfaultfd_is_refused_and_not_killed() {
    let dir = Dir::new("not-a-vmm", 4 * MIB);
    let mut s = serve(&dir, &["--peers", "2"]);
    let script = "import socket,sys,time\n\
        c=socket.socket(socket.AF_UNIX); c.connect(sys.argv[1])\n\
        c.sendall(b'PUT /snapshot/load HTTP/1.1\\r\\n\\r\\n{}')\n\
        c.recv(1); time.sleep(1)\n";
    let sock = dir.sock();
    let mut client = Proc::start(
        "client",
        &["python3"],
        &["-c", script, sock.to_str().unwrap()],
        &dir.path("client.err"),
    );
    let st = client.wait(WAIT);
    assert!(st.success(), "{st}: {}", dir.text("client.err"));
    let mut p = peer(&dir, "p", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains(&format!(
            "(pid {}): not killed: it holds no userfaultfd",
            client.pid()
        )),
        "{log}"
    );
    assert!(
        log.contains("all 2 peers done with: 1 served to their end, 1 refused, 0 failed"),
        "{log}"
    );
}

/// `--metrics` at a socket another process listens on (here another
/// serve's VMM socket) is refused naming its pid, and that socket stays
/// and serves; a stale one is replaced.
#[test]
fn a_metrics_path_on_a_live_socket_is_refused_and_the_socket_kept() {
    let dir = Dir::new("metrics-live", 4 * MIB);
    let mut a = serve(&dir, &["--peers", "1"]);
    let other = Dir::new("metrics-live-b", MIB);
    let taken = dir.sock();
    let mut b = testing::start(
        &other,
        "b",
        SERVE,
        &["--timeout", "5", "--metrics", taken.to_str().unwrap()],
    );
    assert!(!b.wait(WAIT).success());
    let log = other.text("b.err");
    assert!(
        log.contains(&format!("a socket in use (pid {} listens on it)", a.pid())),
        "{log}"
    );
    assert!(taken.exists(), "b removed a's socket");
    let mut p = peer(&dir, "p", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut a, &dir);
    // A stale socket (nothing listens) is replaced.
    let stale = other.path("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let mut c = testing::start(
        &other,
        "c",
        SERVE,
        &["--timeout", "1", "--metrics", stale.to_str().unwrap()],
    );
    other.wait_for("c.err", "metrics on unix:");
    let _ = c.wait(WAIT);
    assert!(!stale.exists(), "c left its metrics socket behind");
}

/// A file in /dev/shm (tmpfs), removed on drop.
struct Shm(PathBuf);

impl Shm {
    fn new(name: &str) -> Shm {
        let p = PathBuf::from(format!(
            "/dev/shm/faultline-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        Shm(p)
    }
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A peer in shared mode: it maps `snap` `MAP_PRIVATE`, MISSING|MINOR.
fn shared_peer(dir: &Dir, name: &str, snap: &Shm, extra: &[&str]) -> Proc {
    let args = [&["--backend", "shared", "--map-file", snap.arg()], extra].concat();
    peer(dir, name, &args)
}

/// serve's `--json` summaries.
fn summaries(dir: &Dir, f: &str) -> Vec<serde_json::Value> {
    serde_json::from_str(&dir.text(f)).unwrap()
}

#[test]
fn shared_mode_record_then_prefetch_gives_identical_bytes_without_a_copy() {
    let dir = Dir::new("shared-record", 16 * MIB);
    let snap = Shm::new("record");
    let (rec, json) = (dir.path("ws.txt"), dir.path("serve.json"));
    let (rec, json) = (rec.to_str().unwrap(), json.to_str().unwrap());
    // One shared serve and one shared peer touching the same working set.
    let round = |serve_extra: &[&str], name: &str, peer_extra: &[&str]| {
        let args = [&["--peers", "1", "--shared", snap.arg()], serve_extra].concat();
        let mut s = serve(&dir, &args);
        let ws = ["--working-set", "25", "--seed", "3"];
        let mut p = shared_peer(&dir, name, &snap, &[&ws[..], peer_extra].concat());
        assert_ok(&mut p, &dir);
        assert_ok(&mut s, &dir);
        dir.text("serve.err")
    };
    let log = round(&["--record", rec], "rec", &[]);
    assert!(log.contains("populated 16 MiB"), "{log}");
    assert!(log.contains("shared mode"), "{log}");
    let pages = faultline_serve::record::read(rec.as_ref()).unwrap().len();
    assert!(pages > 0);
    round(
        &["--prefetch", rec, "--json", json],
        "pre",
        &["--verify-all"],
    );
    let log = dir.text("serve.err");
    assert!(log.contains("reused"), "{log}");
    assert!(log.contains(&format!("prefetching {pages} pages")), "{log}");
    let sum = &summaries(&dir, "serve.json")[0];
    assert_eq!(sum["mode"], "shared", "{sum}");
    assert!(sum["prefetched"].as_u64().unwrap() > 0, "{sum}");
    // Every page was mapped from the shared page cache: nothing was read
    // from the memory file, nothing copied.
    assert_eq!(sum["bytes_read"], 0, "{sum}");
    assert_eq!(
        sum["installed"].as_u64().unwrap(),
        (16 * MIB / 4096) as u64,
        "{sum}"
    );
}

/// `faultline serve --peers 1 --shared SNAP --json DIR/serve.json EXTRA`.
fn serve_shared_one(dir: &Dir, snap: &Shm, extra: &[&str]) -> Proc {
    let json = dir.path("serve.json");
    let args = [&["--shared", snap.arg()], extra].concat();
    let mut all = vec!["--peers", "1", "--json", json.to_str().unwrap()];
    all.extend_from_slice(&args);
    serve(dir, &all)
}

/// Serves one shared-mode peer (`--working-set 10`, two vCPUs, its bytes
/// checked, `peer_extra` too) with `serve_extra`; serve's summary.
fn shared_once(name: &str, serve_extra: &[&str], peer_extra: &[&str]) -> serde_json::Value {
    let dir = Dir::new(name, 16 * MIB);
    let snap = Shm::new(name);
    let mut s = serve_shared_one(&dir, &snap, serve_extra);
    let ws = ["--working-set", "10", "--seed", "5", "--threads", "2"];
    let mut p = shared_peer(&dir, "p", &snap, &[&ws[..], peer_extra].concat());
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    summaries(&dir, "serve.json").remove(0)
}

#[test]
fn hand_back_gives_a_shared_peer_to_the_kernel_and_every_byte_is_right() {
    // --hand-back: serve unregisters the peer's regions before it reads
    // any of its faults; the kernel maps the copy's pages itself: serve
    // reads no fault and installs nothing, and every byte is right
    // (--verify-all reads all of memory after the working set).
    let s = shared_once("hand-back", &["--hand-back"], &["--verify-all"]);
    assert_eq!(s["mode"], "handed back", "{s}");
    assert_eq!(s["faults"], 0, "{s}");
    assert_eq!(s["installed"], 0, "{s}");
    // Without it the same peer's faults are serve's.
    let s = shared_once("no-hand-back", &[], &["--verify-all"]);
    assert_eq!(s["mode"], "shared", "{s}");
    assert!(s["faults"].as_u64().unwrap() > 0, "{s}");
    // A peer whose memory is not the copy (anonymous) is served by copy.
    let dir = Dir::new("hand-back-copy", 16 * MIB);
    let snap = Shm::new("hand-back-copy");
    let mut serve = serve_shared_one(&dir, &snap, &["--hand-back"]);
    let mut p = peer(&dir, "p", &["--working-set", "10", "--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut serve, &dir);
    let s = summaries(&dir, "serve.json").remove(0);
    assert_eq!(s["mode"], "copy", "{s}");
    assert!(s["faults"].as_u64().unwrap() > 0, "{s}");
}

#[test]
fn shared_mode_isolated_faults_take_larger_windows_by_default() {
    // A page more costs no copy in shared mode: an isolated fault maps 128
    // pages by default, 16 in copy mode or when asked for. Pages mapped
    // per fault (the same seeded set, the same vCPUs) say which.
    let per_fault = |s: &serde_json::Value| {
        s["installed"].as_u64().unwrap() as f64 / s["faults"].as_u64().unwrap().max(1) as f64
    };
    let wide = shared_once("shared-wide", &[], &[]);
    let narrow = shared_once("shared-narrow", &["--fault-around-initial", "16"], &[]);
    assert_eq!(wide["mode"], "shared", "{wide}");
    assert!(
        per_fault(&wide) > 1.5 * per_fault(&narrow),
        "{} pages a fault by default, {} with 16: {wide} {narrow}",
        per_fault(&wide),
        per_fault(&narrow)
    );
}

#[test]
fn adaptive_windows_serve_every_byte_in_both_modes() {
    // --adaptive-window: the isolated window moves within its bounds (1 to
    // 64 copied, 1 to 256 mapped) and every byte is right (--verify-all).
    let all = ["--working-set", "10", "--verify-all"];
    let (s, _) = served_once("adaptive-copy", &["--adaptive-window"], &all);
    let w = s["isolated_window"].as_u64().unwrap();
    assert!((1..=64).contains(&w), "{s}");
    let s = shared_once("adaptive-shared", &["--adaptive-window"], &["--verify-all"]);
    let w = s["isolated_window"].as_u64().unwrap();
    assert!((1..=256).contains(&w), "{s}");
    // Without the flag it is not reported.
    let s = shared_once("fixed-shared", &[], &[]);
    assert!(s.get("isolated_window").is_none(), "{s}");
    assert!(s.get("window_changes").is_none(), "{s}");
}

#[test]
fn shared_mode_writes_stay_private_and_removed_pages_read_zeros() {
    let dir = Dir::new("shared-private", 16 * MIB);
    let snap = Shm::new("private");
    let mut s = serve(&dir, &["--peers", "3", "--shared", snap.arg()]);
    // A writes to 30% of its pages and stays alive...
    let mut a = shared_peer(
        &dir,
        "a",
        &snap,
        &["--working-set", "30", "--scribble", "--hold-ms", "30000"],
    );
    dir.wait_for("a.err", "scribbled on");
    // ...while B (shared) sees the snapshot's bytes everywhere, and zeros
    // where it ballooned, and C (copy mode, same handler) is served too.
    let mut b = shared_peer(&dir, "b", &snap, &["--working-set", "30", "--balloon"]);
    let mut c = peer(&dir, "c", &["--verify-all", "--threads", "2"]);
    assert_ok(&mut b, &dir);
    assert_ok(&mut c, &dir);
    a.kill();
    assert_ok(&mut s, &dir);
    assert_eq!(
        std::fs::read(&snap.0).unwrap(),
        std::fs::read(dir.path("mem")).unwrap(),
        "a peer's writes reached the shared snapshot"
    );
    let log = dir.text("serve.err");
    assert_eq!(log.matches("shared mode").count(), 2, "{log}");
    assert_eq!(log.matches("copy mode").count(), 1, "{log}");
    assert!(log.contains("1 REMOVE events (1024 pages)"), "{log}");
}

#[test]
fn verify_full_refuses_a_reused_snapshot_changed_where_the_sample_does_not_look() {
    use std::os::unix::fs::FileExt;
    let dir = Dir::new("shared-verify", 16 * MIB);
    let snap = Shm::new("verify");
    // serve with no peer: it sets the snapshot up, then times out.
    let run = |name: &str, extra: &[&str]| {
        let args = [&["--shared", snap.arg(), "--timeout", "0.2"], extra].concat();
        let mut p = testing::start(&dir, name, SERVE, &args);
        let st = p.wait(WAIT);
        (st, dir.text(&format!("{name}.err")))
    };
    let (_, log) = run("make", &[]);
    assert!(log.contains("populated 16 MiB"), "{log}");
    // Change one byte of page 1: none of the 64 sampled pages (0, 65,
    // 130, ... of 4096).
    let flip = || {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(&snap.0)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 0x1000 + 7).unwrap();
        f.write_all_at(&[!b[0]], 0x1000 + 7).unwrap();
    };
    flip();
    let (_, log) = run("sample", &[]);
    assert!(
        log.contains("reused") && log.contains("64 sampled pages"),
        "{log}"
    );
    let (st, log) = run("full", &["--verify", "full"]);
    assert!(!st.success(), "{log}");
    assert!(
        log.contains("the page at 0x1000 differs (byte 0x1007)"),
        "{log}"
    );
    flip();
    let (_, log) = run("full-ok", &["--verify", "full"]);
    assert!(
        log.contains("reused") && log.contains("every byte match"),
        "{log}"
    );
}

#[test]
fn a_shared_peer_in_another_pid_namespace_is_served_by_its_declared_backing() {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let unshare = Command::new("unshare").arg("--help").output().is_ok();
    if !root || !unshare {
        eprintln!("SKIPPED: needs root and unshare(1) (root {root}, unshare {unshare})");
        return;
    }
    let dir = Dir::new("shared-pidns", 16 * MIB);
    let snap = Shm::new("pidns");
    // serve in a pid namespace of its own with its own /proc: SO_PEERCRED
    // gives it pid 0 for the peers, and their memory maps are out of its
    // reach.
    let mut args = vec![
        "--pid".to_string(),
        "--fork".into(),
        "--mount-proc".into(),
        "--kill-child".into(),
        SERVE[0].into(),
    ];
    args.extend(testing::command(
        &dir,
        &["--timeout", "20", "--peers", "2", "--shared", snap.arg()],
    ));
    let child = Command::new("unshare")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path("serve.err")).unwrap())
        .spawn()
        .unwrap();
    let mut s = Proc {
        child,
        name: "serve".into(),
    };
    dir.wait_for("serve.err", "listening on");
    // Undeclared: its backing cannot be checked, so it is served by copy
    // (as serve without --shared would), every byte checked.
    let mut a = shared_peer(&dir, "a", &snap, &["--working-set", "10", "--verify-all"]);
    assert_ok(&mut a, &dir);
    // Declared: served in shared mode as it says, every byte checked (with
    // zeros after its balloon).
    let mut b = shared_peer(
        &dir,
        "b",
        &snap,
        &["--declare-backing", "--working-set", "30", "--balloon"],
    );
    assert_ok(&mut b, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains(
            "(pid 0): note: shared mode cannot be used for it: its memory map is out of reach"
        ),
        "{log}"
    );
    assert!(log.contains("serving it by copy"), "{log}");
    assert_eq!(log.matches("copy mode, ").count(), 1, "{log}");
    assert!(log.contains("out of reach"), "{log}");
    assert!(log.contains("as its handshake declares: Shared"), "{log}");
    assert_eq!(log.matches("shared mode, ").count(), 1, "{log}");
}

#[test]
fn serve_registers_minor_for_a_shared_peer_that_registered_missing_only() {
    let dir = Dir::new("shared-missing-only", 16 * MIB);
    let snap = Shm::new("missing-only");
    let mut s = serve_shared_one(&dir, &snap, &[]);
    // The peer registers MISSING only: its touches of cached pages would be
    // the kernel's, and after its balloon the kernel would map the
    // snapshot's page again, not zeros. serve registers MINOR through the
    // peer's userfaultfd, so the faults are ours and the ballooned range
    // reads zeros (the peer checks every byte).
    let mut p = shared_peer(
        &dir,
        "p",
        &snap,
        &["--missing-only", "--working-set", "30", "--balloon"],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains("shared mode"), "{log}");
    assert!(log.contains("1 REMOVE events (1024 pages)"), "{log}");
    let sum = &summaries(&dir, "serve.json")[0];
    // Its touches reached serve as minor faults (with MISSING only, none
    // would: the snapshot has no holes), answered by CONTINUE; only the
    // ballooned pages (1024, read back as zeros) were copied.
    assert!(sum["faults"].as_u64().unwrap() > 0, "{sum}");
    assert_eq!(sum["bytes_read"], 1024 * 4096, "{sum}");
    // The hand-off's milestones are stamped in order. The engine reads
    // faults as soon as it has the peer, which may be before `serving` is
    // stamped (after `add` returns): the first fault follows `queued`.
    let h = &sum["handoff"];
    let at = |k: &str| h[k].as_u64().unwrap();
    assert!(at("accepted_ns") > 0, "{h}");
    for (a, b) in [
        ("accepted_ns", "received_ns"),
        ("received_ns", "checked_ns"),
        ("checked_ns", "built_ns"),
        ("built_ns", "queued_ns"),
        ("queued_ns", "serving_ns"),
        ("queued_ns", "first_fault_ns"),
    ] {
        assert!(at(a) <= at(b), "{a} after {b}: {h}");
    }
}

#[test]
fn a_peer_mapping_another_file_is_refused_while_a_shared_peer_is_served() {
    let dir = Dir::new("shared-bad", 16 * MIB);
    let snap = Shm::new("bad");
    let other = Shm::new("other");
    let mut s = serve(&dir, &["--peers", "2", "--shared", snap.arg()]);
    let mut good = shared_peer(
        &dir,
        "good",
        &snap,
        &["--verify-all", "--pause-at", "30", "--pause-ms", "1000"],
    );
    dir.wait_for("good.err", "paused");
    // Same bytes, another file: not the page cache serve vouches for.
    std::fs::copy(&snap.0, &other.0).unwrap();
    let mut bad = shared_peer(&dir, "bad", &other, &[]);
    assert_killed(&mut bad, &dir, "its hand-off was refused");
    assert_ok(&mut good, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(
        log.contains("refused: shared mode: region 0: it maps"),
        "{log}"
    );
    assert!(log.contains("not the shared snapshot"), "{log}");
}

/// A hugetlbfs mount (2 MiB pages) in `dir`, unmounted on drop.
struct HugeMount(PathBuf);

impl HugeMount {
    fn new(dir: &Dir) -> Result<HugeMount, String> {
        let at = dir.path("hugetlbfs");
        std::fs::create_dir_all(&at).map_err(|e| e.to_string())?;
        let st = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M", "none"])
            .arg(&at)
            .stderr(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        if !st.success() {
            return Err(format!("mount -t hugetlbfs failed ({st}; needs root)"));
        }
        Ok(HugeMount(at))
    }
}

/// A pool of at least `pages` free huge pages; `None` (said, skipping
/// `what`) where the machine cannot have one.
fn huge_pool(pages: u64, what: &str) -> Option<faultline::testing::HugePool> {
    faultline::testing::HugePool::get(pages)
        .map_err(|why| eprintln!("SKIPPED: {what}: {why}"))
        .ok()
}

/// A hugetlbfs mount in `dir` and a pool of at least `pages` free huge
/// pages, in the order they are dropped (unmounted, then the pool put
/// back); `None` (said) where the machine has neither.
fn huge_snapshot(dir: &Dir, pages: u64) -> Option<(HugeMount, faultline::testing::HugePool)> {
    let pool =
        faultline::testing::HugePool::get(pages).and_then(|pool| Ok((HugeMount::new(dir)?, pool)));
    pool.map_err(|why| eprintln!("SKIPPED: hugetlbfs shared mode: {why}"))
        .ok()
}

impl Drop for HugeMount {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.join("snap"));
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn shared_mode_on_hugetlbfs_maps_2m_pages_and_keeps_writes_private() {
    // The snapshot on hugetlbfs: CONTINUE maps 2 MiB page-cache pages; a
    // balloon reads zeros (a private 2 MiB page), writes stay private.
    let dir = Dir::new("shared-huge", 8 * MIB);
    // The snapshot (4), each peer's private mapping's reservation (4), spare.
    let Some(huge) = huge_snapshot(&dir, 12) else {
        return;
    };
    let snap = huge.0 .0.join("snap");
    let snap = snap.to_str().unwrap();
    let json = dir.path("serve.json");
    let mut s = serve(
        &dir,
        &[
            "--peers",
            "1",
            "--shared",
            snap,
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let mut p = peer(
        &dir,
        "huge",
        &[
            "--backend",
            "shared",
            "--huge",
            "--map-file",
            snap,
            "--balloon",
            "--scribble",
            "--threads",
            "2",
        ],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains("shared mode"), "{log}");
    assert!(log.contains("MINOR_HUGETLBFS"), "{log}");
    // One REMOVE of the balloon's 2 MiB page.
    assert!(log.contains("1 REMOVE events (1 pages)"), "{log}");
    let sum = &summaries(&dir, "serve.json")[0];
    assert_eq!(sum["mode"], "shared", "{sum}");
    // Only the ballooned page was copied (zeros): 2 MiB.
    assert_eq!(sum["bytes_read"], 2 * MIB as u64, "{sum}");
    assert_eq!(
        std::fs::read(snap).unwrap(),
        std::fs::read(dir.path("mem")).unwrap(),
        "the peer's writes reached the snapshot"
    );
    drop(huge);
}

#[test]
fn shared_mode_on_hugetlbfs_maps_a_block_of_huge_pages_a_fault() {
    // Two regions of 4 huge pages swept by one vCPU: a fault maps the
    // aligned block of --fault-around-huge pages holding it.
    let dir = Dir::new("shared-huge-window", 16 * MIB);
    // The snapshot (8), the peer's private mapping's reservation (8).
    let Some(huge) = huge_snapshot(&dir, 16) else {
        return;
    };
    let snap = huge.0 .0.join("snap");
    let snap = snap.to_str().unwrap();
    for (window, faults) in [("1", 8), ("2", 4), ("16", 2)] {
        let json = dir.path(&format!("serve-{window}.json"));
        let mut s = serve(
            &dir,
            &[
                "--peers",
                "1",
                "--shared",
                snap,
                "--fault-around-huge",
                window,
                "--json",
                json.to_str().unwrap(),
            ],
        );
        let mut p = peer(
            &dir,
            &format!("huge-{window}"),
            &[
                "--backend",
                "shared",
                "--huge",
                "--map-file",
                snap,
                "--working-set",
                "100",
                "--pattern",
                "sweep",
                "--threads",
                "1",
            ],
        );
        assert_ok(&mut p, &dir);
        assert_ok(&mut s, &dir);
        let sum = &summaries(&dir, &format!("serve-{window}.json"))[0];
        assert_eq!(sum["mode"], "shared", "{sum}");
        assert_eq!(sum["faults"], faults, "window {window}: {sum}");
        assert_eq!(sum["installed"], 8, "window {window}: {sum}");
        assert_eq!(sum["bytes_read"], 0, "nothing copied: {sum}");
    }
    drop(huge);
}

/// Kills serve `s` (started with `args` on `dir`, `--takeover`), starts it
/// again once its keeper holds all of `peers`, and checks that every peer
/// finishes, the new serve too, and that it says it took them over.
/// Returns the new serve's log.
fn killed_then_taken_over(
    dir: &Dir,
    s: &mut Proc,
    args: &[&str],
    peers: &mut [&mut Proc],
) -> String {
    s.kill();
    let mut again = testing::serve_again(dir, SERVE, args, peers.len());
    for p in peers.iter_mut() {
        assert_ok(p, dir);
    }
    assert_ok(&mut again, dir);
    let log = dir.text("again.err");
    let said = format!("taking {} peer(s) over from the keeper", peers.len());
    assert!(log.contains(&said), "{log}");
    log
}

/// `kill -9` of serve with `--takeover` when `kill_at` appears in the
/// peer's stderr (plus `delay`), then the same command again: the peer
/// (`peer_args`) is taken over from the keeper and verifies every byte,
/// and the keeper exits once the peer is gone. Gives the new serve's log.
fn kill_and_take_over(
    name: &str,
    peer_args: &[&str],
    kill_at: &str,
    delay: Duration,
    stop: fn(&mut Proc),
) -> String {
    let dir = Dir::new(name, 16 * MIB);
    let args = ["--takeover", "--peers", "1"];
    let mut s = serve(&dir, &args);
    let keeper = testing::keeper_pid(&dir);
    // Nothing of serve's command line or name is the keeper's: what
    // matches serve (`pkill -f 'faultline-serve --socket SOCK'`, `pkill
    // faultline-serve`) does not match its keeper.
    assert_eq!(
        testing::cmdline(keeper).expect("the keeper's command line"),
        ["faultline-serve-keeper"]
    );
    let comm = std::fs::read_to_string(format!("/proc/{keeper}/comm")).unwrap();
    assert_eq!(comm.trim_end(), "fl-serve-keeper");
    let mut p = peer(&dir, "p", peer_args);
    dir.wait_for("p.err", kill_at);
    std::thread::sleep(delay);
    stop(&mut s);
    let mut again = testing::serve_again(&dir, SERVE, &args, 1);
    assert_ok(&mut p, &dir);
    let st = again.wait(WAIT);
    let log = dir.text("again.err");
    let keeper_log = dir.text("serve.err");
    assert!(st.success(), "{st}: {log}\nkeeper:\n{keeper_log}");
    assert!(log.contains("taken over from the keeper"), "{log}");
    assert!(log.contains("all 1 peers served"), "{log}");
    // Its counters are of what this serve did: pages around faulting
    // pages are among those installed (pages already there are not).
    let line = log
        .lines()
        .find(|l| l.contains("hung up;"))
        .expect("its end");
    let installed = testing::number_after(line, "reads, ");
    let around = testing::number_after(line, "installed (");
    assert!(around <= installed, "{line}");
    dir.wait_for("serve.err", "no peer and no serve: exiting");
    testing::wait_exited(keeper, "the keeper");
    log
}

/// The keeper killed while serve runs: serve starts another at once (its
/// watcher sees the keeper's end of the attach connection close) and
/// deposits with it the VMM the dead one held; a second VMM is deposited
/// with the new one; after `kill -9` of serve the same command takes both
/// VMMs over from the new keeper, every byte of each verified.
#[test]
fn a_keeper_that_dies_is_replaced_and_keeps_every_peer() {
    let dir = Dir::new("keeper-replaced", 16 * MIB);
    let args = ["--takeover", "--peers", "2"];
    let mut s = serve(&dir, &args);
    let first = testing::keeper_pid(&dir);
    let pause = ["--verify-all", "--pause-at", "30", "--pause-ms", "600"];
    let mut a = peer(&dir, "a", &pause);
    dir.wait_for("a.err", "paused");
    faultline_sys::process::kill(first, faultline_sys::process::SIGKILL).unwrap();
    dir.wait_for("serve.err", "started another, pid");
    let mut b = peer(&dir, "b", &pause);
    let log = dir.text("serve.err");
    assert!(
        log.contains("deposited with it the 1 peer(s) the dead one held"),
        "{log}"
    );
    let second: i32 = log
        .split("started another, pid ")
        .nth(1)
        .map_or("", |t| {
            t.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("")
        })
        .parse()
        .unwrap_or_else(|_| panic!("no pid of the new keeper: {log}"));
    dir.wait_for("b.err", "paused");
    killed_then_taken_over(&dir, &mut s, &args, &mut [&mut a, &mut b]);
    testing::wait_exited(second, "the new keeper");
}

/// `kill -9` of serve mid-restore, then a serve started on another memory
/// file (same size, other bytes): it refuses to take the VM over (served
/// that file's bytes its memory would be corrupt) and leaves it with the
/// keeper; a serve started with the right file takes it over, every byte
/// verified.
#[test]
fn a_serve_on_another_memory_file_refuses_to_take_over() {
    let dir = Dir::new("takeover-other-mem", 16 * MIB);
    let other = dir.path("other");
    let mut bytes = std::fs::read(dir.path("mem")).unwrap();
    bytes.iter_mut().for_each(|b| *b = !*b);
    std::fs::write(&other, &bytes).unwrap();
    let args = ["--takeover", "--peers", "1"];
    let mut s = serve(&dir, &args);
    let pause = ["--verify-all", "--pause-at", "30", "--pause-ms", "1500"];
    let mut p = peer(&dir, "p", &pause);
    dir.wait_for("p.err", "paused");
    s.kill();
    dir.wait_for("serve.err", "holding 1 peer(s) for the next serve");
    // Without --takeover: told who holds the socket, and how to go on.
    let mut plain = testing::start(&dir, "plain", SERVE, &["--timeout", "5"]);
    assert!(!plain.wait(WAIT).success());
    let log = dir.text("plain.err");
    assert!(
        log.contains("a keeper of a serve started with --takeover"),
        "{log}"
    );
    let sock = dir.sock();
    let wrong = [
        "--socket",
        sock.to_str().unwrap(),
        "--mem",
        other.to_str().unwrap(),
        "--takeover",
        "--timeout",
        "20",
    ];
    let mut w = Proc::start("wrong", SERVE, &wrong, &dir.path("wrong.err"));
    let st = w.wait(WAIT);
    let log = dir.text("wrong.err");
    assert!(!st.success(), "{st}: {log}");
    assert!(log.contains("served from another memory file"), "{log}");
    // A copy with one byte changed where the fingerprint does not sample
    // (page 1 of 4,096): another file all the same.
    let mut near = std::fs::read(dir.path("mem")).unwrap();
    near[4096 + 1] ^= 1;
    std::fs::write(&other, &near).unwrap();
    let mut w = Proc::start("near", SERVE, &wrong, &dir.path("near.err"));
    let st = w.wait(WAIT);
    let log = dir.text("near.err");
    assert!(!st.success(), "{st}: {log}");
    assert!(log.contains("served from another memory file"), "{log}");
    assert!(p.running(), "{}", dir.text("p.err"));
    let mut again = testing::start(
        &dir,
        "again",
        SERVE,
        &[&["--timeout", "20"][..], &args].concat(),
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut again, &dir);
    assert!(dir.text("again.err").contains("taken over from the keeper"));
}

/// A keeper that does not answer (stopped) when a VMM connects: its
/// deposit times out and the VMM is served without takeover, said and
/// shown (`faultline_peers_unprotected 1`); once the keeper answers again
/// serve deposits it, hand-off and journal, and a `kill -9` of serve is
/// survived: the same command takes it over, every byte verified.
#[test]
fn a_vmm_served_unprotected_is_deposited_once_the_keeper_answers() {
    use faultline_sys::process::{kill, SIGCONT, SIGSTOP};
    let dir = Dir::new("keeper-late", 16 * MIB);
    let (mut s, args, metrics) = takeover_with_metrics(&dir);
    // Up: its listener is with the keeper (the socket appears just before).
    dir.wait_for("serve.err", "listening on");
    let keeper = testing::keeper_pid(&dir);
    kill(keeper, SIGSTOP).unwrap();
    let pause = ["--verify-all", "--pause-at", "30", "--pause-ms", "12000"];
    let mut p = peer(&dir, "p", &pause);
    dir.wait_for("serve.err", "served without takeover for now");
    dir.wait_for("p.err", "paused");
    let unprotected = || metrics_now(&metrics, &["faultline_peers_unprotected"]);
    assert_eq!(unprotected(), [1.0]);
    kill(keeper, SIGCONT).unwrap();
    dir.wait_for("serve.err", "deposited with the keeper at last");
    assert_eq!(unprotected(), [0.0]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    killed_then_taken_over(&dir, &mut s, &args, &mut [&mut p]);
}

/// Serve on `dir` with `--takeover --peers 1 --metrics DIR/metrics.sock`:
/// the process, those arguments and the metrics socket's path.
fn takeover_with_metrics(dir: &Dir) -> (Proc, Vec<String>, PathBuf) {
    let metrics = dir.path("metrics.sock");
    // Its keeper is killed and replaced before any peer comes: the
    // replacement's waits (the dead keeper's name freed, up to 10 s; a
    // keeper's start, up to 5 s) must not run into the idle timeout on a
    // loaded machine (20 s: seen once in CI, serve gone before the peer).
    let args: Vec<String> = ["--timeout", "60", "--takeover", "--peers", "1", "--metrics"]
        .iter()
        .map(|a| a.to_string())
        .chain([metrics.to_str().unwrap().to_string()])
        .collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    (serve(dir, &argv), args, metrics)
}

/// The values of `names` in a scrape of the metrics socket `sock`.
fn metrics_now(sock: &std::path::Path, names: &[&str]) -> Vec<f64> {
    let text = scrape(&MetricsAddr::Unix(sock.to_path_buf())).expect("a scrape");
    names
        .iter()
        .map(|name| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        })
        .collect()
}

/// serve's executable replaced on disk (an upgrade: the path now holds a
/// file that cannot run) and its keeper killed: serve starts another keeper
/// from its own running binary (`/proc/self/exe`), deposits a VMM with it,
/// and the VMM is taken over when serve is killed, every byte verified.
#[test]
fn a_serve_whose_executable_was_replaced_still_replaces_its_keeper() {
    let dir = Dir::new("keeper-upgraded", 16 * MIB);
    let exe = dir.path("faultline-serve-old");
    std::fs::copy(SERVE[0], &exe).unwrap();
    let args = ["--takeover", "--peers", "1"];
    let mut s = testing::serve(&dir, &[exe.to_str().unwrap()], &args);
    let first = testing::keeper_pid(&dir);
    // The upgrade: the file replaced by one that fails if executed.
    std::fs::remove_file(&exe).unwrap();
    std::fs::write(&exe, "#!/bin/sh\nexit 3\n").unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&exe).unwrap().permissions(),
        0o755,
    );
    faultline_sys::process::kill(first, faultline_sys::process::SIGKILL).unwrap();
    dir.wait_for("serve.err", "started another, pid");
    let pause = ["--verify-all", "--pause-at", "30", "--pause-ms", "600"];
    let mut p = peer(&dir, "p", &pause);
    dir.wait_for("p.err", "paused");
    killed_then_taken_over(&dir, &mut s, &args, &mut [&mut p]);
}

/// No keeper can be started (its name is taken by something that answers
/// nothing) after the keeper is killed: a VMM connecting then is served
/// on (said), not refused and killed, and once the name is free again
/// serve's next try starts a keeper and deposits the VMM with it: a
/// `kill -9` of serve then is survived, every byte verified (zeros where
/// its balloon, inflated while no keeper ran, dropped pages).
#[test]
fn a_vmm_served_while_no_keeper_can_start_goes_to_the_next_keeper() {
    use faultline_sys::process::{kill, SIGCONT, SIGKILL, SIGSTOP};
    use std::os::linux::net::SocketAddrExt;
    let dir = Dir::new("keeper-unstartable", 16 * MIB);
    let (mut s, args, metrics) = takeover_with_metrics(&dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // What a scrape says of the keeper now: down, peers deposited,
    // keepers replaced, peers taken over.
    let keeper_metrics = || {
        metrics_now(
            &metrics,
            &[
                "faultline_keeper_down",
                "faultline_keeper_peers",
                "faultline_keepers_replaced_total",
                "faultline_peers_taken_over_total",
            ],
        )
    };
    assert_eq!(keeper_metrics(), [0.0, 0.0, 0.0, 0.0]);
    let keeper = testing::keeper_pid(&dir);
    // Frozen, serve cannot replace the keeper before the name is taken.
    kill(s.pid() as i32, SIGSTOP).unwrap();
    kill(keeper, SIGKILL).unwrap();
    // Free once the keeper has exited (a zombie until serve reaps it).
    let addr = faultline_serve::keeper::address(&dir.sock()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let squatter = loop {
        match std::os::unix::net::UnixListener::bind_addr(&addr) {
            Ok(l) => break l,
            Err(e) if std::time::Instant::now() > deadline => {
                panic!("binding {:?}: {e}", addr.as_abstract_name())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    squatter.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let squat = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Every connection closed unanswered; the name freed at the end.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match squatter.accept() {
                    Ok((conn, _)) => drop(conn),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        })
    };
    kill(s.pid() as i32, SIGCONT).unwrap();
    dir.wait_for("serve.err", "replacing the keeper of");
    // Its balloon's REMOVE comes while no keeper runs: journaled anyway.
    let balloon = ["--balloon", "--balloon-pause-ms", "600"];
    let mut p = peer(&dir, "p", &balloon);
    dir.wait_for("p.err", "ballooned");
    // Held until the next serve has taken it over.
    kill(p.pid() as i32, SIGSTOP).unwrap();
    let log = dir.text("serve.err");
    assert!(log.contains("no keeper to deposit it with"), "{log}");
    assert_eq!(keeper_metrics(), [1.0, 1.0, 0.0, 0.0]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    squat.join().unwrap();
    dir.wait_for(
        "serve.err",
        "deposited with it the 1 peer(s) served meanwhile",
    );
    assert_eq!(keeper_metrics(), [0.0, 1.0, 1.0, 0.0]);
    s.kill();
    let mut again = testing::serve_again(&dir, SERVE, &args, 1);
    dir.wait_for("again.err", "its regions are woken");
    assert_eq!(keeper_metrics(), [0.0, 1.0, 0.0, 1.0]);
    kill(p.pid() as i32, SIGCONT).unwrap();
    assert_ok(&mut p, &dir);
    assert_ok(&mut again, &dir);
    let log = dir.text("again.err");
    assert!(log.contains("1 REMOVE'd range(s) replayed"), "{log}");
    let log = dir.text("serve.err");
    assert!(!log.contains("refused"), "{log}");
    assert!(!log.contains("served without takeover"), "{log}");
}

/// `kill -9` of serve mid-restore (4 vCPUs faulting, REMOVE storms racing
/// them), and right after a balloon's REMOVE was read: the same command
/// started again takes the peer over; it verifies every byte, zeros where
/// it dropped pages (the balloon's only from the dead serve's journal).
/// `FAULTLINE_TAKEOVER_LOOPS=20` runs it 20 times, killing at varying
/// points of the restore.
#[test]
fn kill_9_of_serve_then_the_same_command_takes_the_peer_over() {
    let loops: u64 = std::env::var("FAULTLINE_TAKEOVER_LOOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..loops {
        // One vCPU pauses for 200 ms while the other three fault (faults
        // read and never answered); the kill comes 0-185 ms into the
        // pause, so the peer is never done before it.
        kill_and_take_over(
            &format!("takeover-{round}"),
            &[
                "--threads",
                "4",
                "--working-set",
                "30",
                "--storm",
                "20",
                "--verify-all",
                "--pause-at",
                "40",
                "--pause-ms",
                "200",
            ],
            "paused",
            Duration::from_millis((round * 37) % 190),
            Proc::kill,
        );
        let log = kill_and_take_over(
            &format!("takeover-balloon-{round}"),
            &[
                "--threads",
                "4",
                "--working-set",
                "30",
                "--balloon",
                "--balloon-pause-ms",
                "300",
            ],
            "ballooned",
            Duration::ZERO,
            Proc::kill,
        );
        assert!(log.contains("1 REMOVE'd range(s) replayed"), "{log}");
    }
}

/// A handshake longer than one read (1,000 regions: about 90 KB of JSON,
/// where a stream read stops about 36 KiB in, at the end of the data the
/// descriptor came with) is read whole: served and every byte verified,
/// without `--takeover` and with it, through a `kill -9` of serve (the
/// keeper keeps it and hands it back whole, and the next serve peeks it
/// in pieces before it reads it off).
#[test]
fn a_handshake_longer_than_one_read_is_read_whole() {
    let regions = vec!["4096"; 1000].join(",");
    let args = [
        "--regions",
        &regions,
        "--gap",
        "4096",
        "--threads",
        "2",
        "--working-set",
        "100",
        "--verify-all",
    ];
    let dir = Dir::new("long-handshake", 4 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    let mut p = peer(&dir, "p", &args);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    assert!(dir.text("serve.err").contains("serving 1000 region(s)"));
    let paused = [&args[..], &["--pause-at", "30", "--pause-ms", "400"]].concat();
    let log = kill_and_take_over(
        "long-handshake-takeover",
        &paused,
        "paused",
        Duration::ZERO,
        Proc::kill,
    );
    assert!(log.contains("serving 1000 region(s)"), "{log}");
}

/// With `--takeover`, SIGTERM leaves the peers with the keeper (no grace
/// period, no kill): the next serve takes them over.
#[test]
fn sigterm_with_takeover_leaves_the_peer_to_the_next_serve() {
    kill_and_take_over(
        "takeover-term",
        &["--verify-all", "--pause-at", "30", "--pause-ms", "300"],
        "paused",
        Duration::ZERO,
        |s| {
            term(s);
            assert!(s.wait(WAIT).success(), "serve failed after SIGTERM");
        },
    );
}

/// CPU time (user + system, ms) of the threads of process `pid` whose name
/// starts with `prefix` (`/proc/PID/task/TID/stat`, clock ticks), and how
/// many such threads there are.
fn threads_cpu_ms(pid: u32, prefix: &str) -> (f64, usize) {
    let hz = faultline_sys::thread::clock_ticks_per_sec() as f64;
    let (mut ticks, mut n) = (0u64, 0);
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the task list") {
        let Ok(stat) = std::fs::read_to_string(t.expect("a task").path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        // After the name: state (field 3) ... utime (14), stime (15).
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        n += 1;
    }
    (ticks as f64 * 1e3 / hz, n)
}

/// The states (`/proc/PID/task/TID/stat` field 3) of `pid`'s threads
/// whose names start with `prefix`: `R` running or runnable (waiting for
/// a CPU counts: a thread that spins and yields stays `R` however little
/// CPU a busy machine gives it), `S` asleep, ...
fn thread_states(pid: u32, prefix: &str) -> Vec<char> {
    let mut states = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the task list") {
        let Ok(stat) = std::fs::read_to_string(t.expect("a task").path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if stat[open + 1..close].starts_with(prefix) {
            states.extend(stat[close + 1..].trim_start().chars().next());
        }
    }
    states
}

/// Starts serve for one peer, its summary to `serve.json`, with `extra`.
fn serve_one(dir: &Dir, extra: &[&str]) -> Proc {
    let json = dir.path("serve.json");
    let mut args = vec!["--peers", "1", "--json", json.to_str().unwrap()];
    args.extend_from_slice(extra);
    serve(dir, &args)
}

/// Serves a 4-vCPU peer that holds on for a while once verified, with
/// `--engine ENGINE`; returns the handler thread's CPU time (ms) over 1 s
/// of the peer's idleness, the share of 50 samples over that second that
/// found it runnable (`R`), and the peer's summary.
fn handler_cpu_while_idle(name: &str, engine: &str) -> (f64, f64, serde_json::Value) {
    let dir = Dir::new(name, 16 * MIB);
    let mut s = serve_one(&dir, &["--engine", engine]);
    let mut p = peer(
        &dir,
        "p",
        &[
            "--threads",
            "4",
            "--working-set",
            "60",
            "--verify-all",
            "--hold-ms",
            "3000",
        ],
    );
    dir.wait_for("p.err", "holding for");
    // Past the adaptive idle interval (1 ms) with a wide margin.
    std::thread::sleep(Duration::from_millis(200));
    let (before, threads) = threads_cpu_ms(s.pid(), "fl-handler-");
    assert_eq!(threads, 1, "one handler thread");
    let mut runnable = 0;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(20));
        let states = thread_states(s.pid(), "fl-handler-");
        runnable += usize::from(states == ['R']);
    }
    let (after, _) = threads_cpu_ms(s.pid(), "fl-handler-");
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let summary = summaries(&dir, "serve.json").remove(0);
    (after - before, runnable as f64 / 50.0, summary)
}

#[test]
fn the_adaptive_engine_serves_four_vcpus_and_sleeps_once_the_peer_is_idle() {
    let (idle_cpu, idle_runnable, summary) = handler_cpu_while_idle("adaptive", "adaptive");
    // Every byte was compared by the peer (--verify-all). The faults were
    // read in batches, and the handler slept through the peer's idle
    // second: a tick or two at most (clock ticks are 10 ms).
    let (faults, reads) = (summary["faults"].as_u64(), summary["reads"].as_u64());
    assert!(faults.unwrap() > 0 && reads.unwrap() > 0, "{summary}");
    assert!(reads <= faults, "{summary}");
    assert!(
        summary["handler_cpu_ms"].as_f64().unwrap() > 0.0,
        "{summary}"
    );
    assert!(idle_cpu <= 30.0, "{idle_cpu} ms of CPU over an idle second");
    // The same measurement sees a handler that does not sleep: runnable
    // in most samples. (Not its CPU time: it yields its CPU to any thread
    // that wants one, so on a busy machine it gets next to none.)
    let (spin_cpu, spin_runnable, _) = handler_cpu_while_idle("spinning", "spin");
    eprintln!(
        "handler over an idle second: adaptive {idle_cpu} ms CPU, runnable in {idle_runnable} \
         of the samples; spin {spin_cpu} ms, {spin_runnable}"
    );
    assert!(
        spin_runnable >= 0.8 && idle_runnable <= 0.2,
        "runnable in {spin_runnable} of the samples spinning, {idle_runnable} adaptive"
    );
}

/// Serves one peer of a 16 MiB file with `serve_extra`, the peer running
/// `peer_extra` (4 vCPUs, --json); returns serve's summary and the peer's
/// report.
fn served_once(
    name: &str,
    serve_extra: &[&str],
    peer_extra: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let dir = Dir::new(name, 16 * MIB);
    let pj = dir.path("peer.json");
    let mut s = serve_one(&dir, serve_extra);
    let mut args = vec!["--threads", "4", "--json", pj.to_str().unwrap()];
    args.extend_from_slice(peer_extra);
    let mut p = peer(&dir, "p", &args);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let report = serde_json::from_str(&dir.text("peer.json")).unwrap();
    (summaries(&dir, "serve.json").remove(0), report)
}

/// Every page a summary says installed is counted once: a fault's own
/// (at most one a fault), its window's (`around`) or run-ahead's (each
/// piece of a long run-ahead window counted too: only the first was).
fn run_ahead_counted(s: &serde_json::Value) {
    let n = |k: &str| s[k].as_u64().unwrap();
    let (installed, faults) = (n("installed"), n("faults"));
    let others = n("around") + n("run_ahead");
    assert!(
        others <= installed && installed <= others + faults,
        "installed pages in no counter: {s}"
    );
}

/// A Redis store with --run-ahead: what the populator read is counted
/// in `bytes_read` (a batched fill's own run was not), every byte right.
#[cfg(feature = "redis")]
#[test]
fn run_ahead_from_a_redis_store_counts_what_it_read() {
    let dir = Dir::new("redis-run-ahead", 16 * MIB);
    let server = faultline_redis::server::RedisServer::start().unwrap();
    let json = dir.path("serve.json");
    let extra = ["--run-ahead", "64K", "--json", json.to_str().unwrap()];
    let (mut s, _) = serve_from_redis(&dir, &server, 16 * MIB, &extra);
    let sweep = [
        "--pattern",
        "clustered",
        "--working-set",
        "60",
        "--verify-all",
        "--compute-us",
        "20",
    ];
    let mut p = peer(&dir, "peer", &sweep);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let sum = summaries(&dir, "serve.json").remove(0);
    assert!(sum["run_ahead"].as_u64().unwrap() > 0, "{sum}");
    run_ahead_counted(&sum);
    assert_eq!(
        sum["bytes_read"].as_u64().unwrap(),
        sum["installed"].as_u64().unwrap() * 4096,
        "{sum}"
    );
}

#[test]
fn run_ahead_installs_ahead_of_sweeping_vcpus_and_every_byte_is_right() {
    // --run-ahead: a populator per region installs ahead of each vCPU's
    // sweep (its pages counted apart), in copy and in shared mode; off by
    // default and while recording. The vCPUs compute 20 us a page, as a
    // guest does between touches: the populator gets a CPU beside them
    // (touch-only sweeps on a loaded 2-CPU machine can finish before it
    // runs: seen once in CI, 0 pages ahead in shared mode).
    let sweep = [
        "--pattern",
        "sweep",
        "--working-set",
        "60",
        "--verify-all",
        "--compute-us",
        "20",
    ];
    let (s, _) = served_once("run-ahead", &["--run-ahead", "1M"], &sweep);
    assert!(s["run_ahead"].as_u64().unwrap() > 0, "{s}");
    run_ahead_counted(&s);
    let dir = Dir::new("run-ahead-shared", 16 * MIB);
    let snap = Shm::new("run-ahead-shared");
    // More than shared mode's largest window (2 MiB), which would leave
    // a populator 1 MiB ahead nothing to install.
    let mut serve = serve_shared_one(&dir, &snap, &["--run-ahead", "8M"]);
    let mut p = shared_peer(&dir, "p", &snap, &sweep);
    assert_ok(&mut p, &dir);
    assert_ok(&mut serve, &dir);
    let s = summaries(&dir, "serve.json").remove(0);
    assert_eq!(s["mode"], "shared", "{s}");
    assert!(s["run_ahead"].as_u64().unwrap() > 0, "{s}");
    let (s, _) = served_once("no-run-ahead", &[], &sweep);
    assert_eq!(s["run_ahead"], 0, "{s}");
    let dir = Dir::new("run-ahead-record", 16 * MIB);
    let rec = dir.path("ws.rec");
    let mut serve = serve_one(
        &dir,
        &["--run-ahead", "1M", "--record", rec.to_str().unwrap()],
    );
    let mut p = peer(&dir, "p", &sweep);
    assert_ok(&mut p, &dir);
    assert_ok(&mut serve, &dir);
    let s = summaries(&dir, "serve.json").remove(0);
    assert_eq!(s["run_ahead"], 0, "{s}");
    let log = dir.text("serve.err");
    assert!(
        log.contains("--run-ahead: off for a peer while it is recorded"),
        "{log}"
    );
}

#[test]
fn windows_grow_on_sweeping_vcpus_and_isolated_faults_take_sixteen_pages() {
    // Four vCPUs each sweep their share of the first 75% of memory; one
    // handler reads all their faults. Each sweep is a stream of its own:
    // 16, 32, ... 512 pages a fault (the default cap), every byte checked.
    let sweep = ["--pattern", "sweep", "--working-set", "75", "--verify-all"];
    let (s, p) = served_once("sweep", &[], &sweep);
    let (faults, pages) = (s["faults"].as_u64().unwrap(), p["pages"].as_u64().unwrap());
    assert_eq!(pages, 3072);
    assert!(faults <= 64, "{faults} faults for {pages} pages: {s}");
    // What the windows installed beyond the set: never touched, wasted;
    // serve's `around` (pages installed beside a faulting one) bounds it.
    let wasted = p["resident_pages"].as_u64().unwrap() - pages;
    assert!(wasted <= s["around"].as_u64().unwrap(), "{s} {p}");
    // The old cap of 16 takes one fault per 16 pages at best.
    let (s16, _) = served_once("sweep16", &["--fault-around", "16"], &sweep);
    assert!(s16["faults"].as_u64().unwrap() >= pages / 16, "{s16}");
    // Scattered and clustered pages: an isolated fault installs its
    // aligned 16 pages (the clusters' pages come a few to a fault), where
    // one page per fault takes a fault per page and wastes nothing.
    let (s1, p1) = served_once("single", &["--fault-around", "1"], &["--working-set", "10"]);
    assert_eq!(s1["around"].as_u64(), Some(0), "{s1}");
    assert_eq!(p1["resident_pages"], p1["pages"], "{p1}");
    assert_eq!(s1["faults"], p1["pages"], "{s1}");
    let (s, p) = served_once("clustered", &[], &["--working-set", "10"]);
    let (faults, pages) = (s["faults"].as_u64().unwrap(), p["pages"].as_u64().unwrap());
    assert!(faults * 2 < pages, "{faults} faults for {pages} pages: {s}");
    let resident = p["resident_pages"].as_u64().unwrap();
    assert_eq!(resident, s["installed"].as_u64().unwrap(), "{s} {p}");
}

#[test]
fn workers_serve_one_peer_on_two_threads_through_remove_storms() {
    // Both handler threads read each peer's userfaultfd while the peers
    // drop and re-read a range: faults resolve under the copy gate, so no
    // copy lands in a dropped range after its REMOVE (the peers check
    // every byte, dropped ranges reading zeros).
    let dir = Dir::new("workers-storm", 8 * MIB);
    two_storming_peers(&dir, &["--engine", "workers", "--threads", "2"], &[]);
    // A sweep served by two workers: every byte right, the windows still
    // grow (faults stay few), and serve ran two handler threads.
    let dir = Dir::new("workers-sweep", 16 * MIB);
    let mut s = serve_one(&dir, &["--engine", "workers", "--threads", "2"]);
    let sweep = [
        "--threads",
        "4",
        "--pattern",
        "sweep",
        "--working-set",
        "75",
        "--verify-all",
        "--hold-ms",
        "300",
    ];
    let mut p = peer(&dir, "p", &sweep);
    dir.wait_for("p.err", "holding for");
    let (_, threads) = threads_cpu_ms(s.pid(), "fl-handler-");
    assert_eq!(threads, 2, "two handler threads");
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let summary = summaries(&dir, "serve.json").remove(0);
    let faults = summary["faults"].as_u64().unwrap();
    assert!(faults > 0 && faults <= 256, "{summary}");
    assert!(dir.text("serve.err").contains("hung up;"));
}

/// The CPUs each of `pid`'s handler threads (`fl-handler-N`) may run on
/// (`Cpus_allowed_list`), in thread order.
fn handler_cpus(pid: u32) -> Vec<String> {
    let mut threads: Vec<_> = faultline::testing::threads(pid, "fl-handler-")
        .into_iter()
        .map(|t| {
            (
                t.name["fl-handler-".len()..].parse::<usize>().unwrap(),
                t.cpus,
            )
        })
        .collect();
    threads.sort();
    threads.into_iter().map(|(_, cpus)| cpus).collect()
}

#[test]
fn per_cpu_handlers_are_pinned_one_per_cpu_and_serve_through_remove_storms() {
    // One handler thread on each CPU, every one reading every peer's
    // userfaultfd: the storming peers check every byte (dropped ranges
    // read zeros).
    let dir = Dir::new("per-cpu-storm", 8 * MIB);
    two_storming_peers(&dir, &["--engine", "per-cpu"], &[]);
    // A clustered working set on 4 vCPUs: every byte right, and serve ran
    // a handler thread pinned on each CPU it may use, each on its own.
    let dir = Dir::new("per-cpu-clustered", 16 * MIB);
    let mut s = serve_one(&dir, &["--engine", "per-cpu"]);
    let args = [
        "--threads",
        "4",
        "--working-set",
        "30",
        "--verify-all",
        "--hold-ms",
        "300",
    ];
    let mut p = peer(&dir, "p", &args);
    dir.wait_for("p.err", "holding for");
    let cpus = faultline_sys::thread::allowed_cpus().unwrap();
    let want: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
    assert_eq!(handler_cpus(s.pid()), want, "one handler thread per CPU");
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let said = format!(
        "per-cpu: {} handler thread(s), one asleep on each of CPUs {}",
        cpus.len(),
        want.join(",")
    );
    assert!(
        dir.text("serve.err").contains(&said),
        "serve never said {said:?}"
    );
    let summary = summaries(&dir, "serve.json").remove(0);
    assert!(summary["faults"].as_u64().unwrap() > 0, "{summary}");
}

/// Voluntary context switches of `pid`'s thread named `name` (each a
/// sleep it woke from).
fn wakeups(pid: u32, name: &str) -> u64 {
    let t = faultline::testing::threads(pid, name)
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no thread {name}"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{}/status", t.tid)).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

#[test]
fn per_cpu_handlers_elsewhere_sleep_through_a_vm_held_to_one_cpu() {
    // A VM whose threads may run on one CPU only: serve's handler on that
    // CPU reads its faults; the handler on the other CPU is not woken by
    // them (it still watches the VM's hang-up).
    let cpus = faultline_sys::thread::allowed_cpus().unwrap();
    if cpus.len() < 2 {
        eprintln!("skipping: one CPU, one handler thread");
        return;
    }
    let (held, other) = (cpus.len() - 1, 0);
    let dir = Dir::new("per-cpu-held", 64 * MIB);
    let mut s = serve_one(&dir, &["--engine", "per-cpu", "--fault-around", "0"]);
    dir.wait_for("serve.err", "per-cpu:");
    let names = [format!("fl-handler-{held}"), format!("fl-handler-{other}")];
    let before = names.clone().map(|n| wakeups(s.pid(), &n));
    let cpu = cpus[held].to_string();
    let cmd = ["taskset", "-c", &cpu, PEER[0]];
    let args = ["--threads", "2", "--working-set", "30", "--hold-ms", "300"];
    let mut p = testing::peer(&dir, &cmd, "p", &args);
    dir.wait_for("p.err", "holding for");
    let after = names.clone().map(|n| wakeups(s.pid(), &n));
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let faults = summaries(&dir, "serve.json")[0]["faults"].as_u64().unwrap();
    let (on, off) = (after[0] - before[0], after[1] - before[1]);
    let log = dir.text("serve.err");
    assert!(
        log.contains(&format!("its threads may run on CPUs {cpu}:")),
        "{log}"
    );
    // One page a fault: thousands of faults, each a wake-up of the
    // handler on the VM's CPU at most; the other wakes at its poll
    // timeouts (200 ms) and the hang-up.
    assert!(faults > 2000, "{faults} faults");
    assert!(
        off * 20 < faults,
        "{off} wake-ups off the VM's CPU for {faults} faults (on it: {on})"
    );
}

#[test]
fn wake_first_installs_the_whole_window_and_keeps_every_byte_right() {
    // The faulting page first, then the rest of its window: the windows
    // are still installed (pages around faulting ones), everything that
    // was installed is resident (counted before the checks, once the last
    // window's rest had time to go in), the working set's bytes checked;
    // then every byte (--verify-all).
    let clustered = ["--working-set", "30", "--settle-ms", "300"];
    let (s, p) = served_once("wake-first", &["--wake-first"], &clustered);
    assert!(s["around"].as_u64().unwrap() > 0, "{s}");
    let resident = p["resident_pages"].as_u64().unwrap();
    assert_eq!(resident, s["installed"].as_u64().unwrap(), "{s} {p}");
    let all = ["--working-set", "30", "--verify-all"];
    let (s, _) = served_once("wake-first-all", &["--wake-first"], &all);
    assert_eq!(s["installed"].as_u64(), Some(4096), "{s}");
    // And through REMOVE storms.
    let dir = Dir::new("wake-first-storm", 8 * MIB);
    two_storming_peers(&dir, &["--wake-first"], &[]);
}

#[test]
fn phase_samples_stamp_each_fault_in_order_and_join_the_peers_touches() {
    let (s, p) = served_once(
        "phases",
        &["--phase-samples", "64"],
        &["--working-set", "30", "--stamps", "64"],
    );
    let phases = s["phases"].as_array().expect("phases in the summary");
    assert!(!phases.is_empty() && phases.len() <= 64, "{s}");
    let touches = p["touch_stamps"].as_array().expect("touch stamps");
    assert!(!touches.is_empty() && touches.len() <= 4 * 64, "{p}");
    // Handler stamps in order; the installing ones stamped every step.
    let names = [
        "addr", "read", "start", "filled", "resolved", "woken", "done", "pages",
    ];
    let at = |f: &serde_json::Value, k: &str| {
        f[names.iter().position(|n| *n == k).unwrap()]
            .as_u64()
            .unwrap()
    };
    let mut installed = 0;
    for f in phases {
        assert!(at(f, "read") > 0 && at(f, "read") <= at(f, "start"), "{f}");
        assert!(at(f, "start") <= at(f, "done"), "{f}");
        if at(f, "filled") > 0 {
            installed += 1;
            assert!(at(f, "start") <= at(f, "filled"), "{f}");
            assert!(at(f, "filled") <= at(f, "resolved"), "{f}");
            assert!(at(f, "resolved") <= at(f, "woken"), "{f}");
            assert!(at(f, "woken") <= at(f, "done"), "{f}");
            assert!(at(f, "pages") >= 1, "{f}");
        }
    }
    assert!(installed > 0, "{s}");
    // The TSC is shared by both processes: a sampled fault's page was
    // touched by a vCPU before serve read its message, and the touch
    // retired after its page's install ioctl returned.
    let touched: std::collections::HashMap<u64, (u64, u64)> = touches
        .iter()
        .map(|t| {
            let t: Vec<u64> = t
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            (t[0] & !4095, (t[1], t[2]))
        })
        .collect();
    let mut joined = 0;
    for f in phases.iter().filter(|f| at(f, "filled") > 0) {
        if let Some(&(c0, c1)) = touched.get(&(at(f, "addr") & !4095)) {
            joined += 1;
            assert!(
                c0 < at(f, "read") && at(f, "resolved") < c1,
                "{f} {c0} {c1}"
            );
        }
    }
    assert!(joined > 0, "no sampled fault joined a stamped touch");
}

/// The library's `Server::run` gives every peer's summary when the config
/// asks (the default), and keeps none when it does not (a serve that runs
/// for months without `--json`).
#[test]
fn summaries_are_kept_only_when_asked_for() {
    use faultline_serve::{ServeConfig, Server, Source};
    for keep in [true, false] {
        let dir = Dir::new(&format!("summaries-{keep}"), 8 * MIB);
        let mut config = ServeConfig::new(dir.sock(), Source::Mem(dir.path("mem")));
        config.peers = Some(2);
        config.timeout = Some(Duration::from_secs(20));
        config.summaries = keep;
        let server = Server::start(config).expect("starting serve in process");
        let run = std::thread::spawn(move || server.run());
        for name in ["a", "b"] {
            let mut p = peer(&dir, name, &["--threads", "2", "--verify-all"]);
            assert_ok(&mut p, &dir);
        }
        let summaries = run.join().unwrap().expect("serve's run");
        match keep {
            true => {
                assert_eq!(summaries.len(), 2);
                assert!(summaries.iter().all(|s| s.outcome.starts_with("hung up")));
            }
            false => assert!(summaries.is_empty()),
        }
    }
}

/// The memory file truncated while serve serves a VM from it (an operator
/// copying a new snapshot over it in place): the VM whose pages are gone
/// is killed, and serve says what happened to the file rather than only
/// "UFFDIO_COPY: Bad address"; serve itself goes on (no SIGBUS).
#[test]
fn a_memory_file_truncated_under_serve_is_said() {
    use std::os::unix::process::ExitStatusExt;
    let dir = Dir::new("truncated", 32 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    let args = [
        "--threads",
        "2",
        "--working-set",
        "60",
        "--pause-at",
        "20",
        "--pause-ms",
        "1000",
    ];
    let mut p = peer(&dir, "p", &args);
    dir.wait_for("p.err", "paused after");
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path("mem"))
        .and_then(|f| f.set_len(0))
        .expect("truncating the memory file");
    let st = p.wait(WAIT);
    assert_eq!(st.signal(), Some(9), "{st}: {}", dir.text("serve.err"));
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    let said = format!("is 0 bytes now, {} when serve started: truncated", 32 * MIB);
    assert!(log.contains(&said), "{log}");
    assert_eq!(log.matches("the memory file").count(), 1, "{log}");
}

/// A memory cgroup limited to `limit` bytes, made under this process's
/// own and removed on drop (`None` where this process cannot make one:
/// not root, or a v2 group whose parent does not delegate the memory
/// controller).
struct MemCgroup(PathBuf);

impl MemCgroup {
    fn new(name: &str, limit: usize) -> Option<MemCgroup> {
        let own = faultline_sys::cgroup::of(0, "memory").ok()??;
        let dir = own.dir.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let g = MemCgroup(dir);
        let file = if own.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(g.0.join(file), limit.to_string()).ok()?;
        Some(g)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Empty once its processes are gone.
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A VMM in a memory cgroup whose limit (16 MiB) is below what its
/// restore installs (64 MiB): the pages serve installs are charged to the
/// VMM's cgroup, whose OOM killer kills it, as the kernel's own faults
/// would; serve, which sees only a hang-up, says what killed it.
#[test]
fn a_vmm_killed_by_its_memory_cgroup_during_restore_is_said() {
    use std::os::unix::process::ExitStatusExt;
    let Some(cg) = MemCgroup::new("faultline-serve-oom", 16 * MIB) else {
        eprintln!("skipped: no memory cgroup can be made here");
        return;
    };
    let dir = Dir::new("oom", 64 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    // The VMM joins the group before it runs (a jailer's way).
    let procs = cg.0.join("cgroup.procs");
    let args = testing::command(&dir, &["--threads", "2", "--working-set", "100"]);
    let mut argv = vec![
        "-c",
        "echo $$ > \"$0\" && exec \"$@\"",
        procs.to_str().unwrap(),
        PEER[0],
    ];
    argv.extend(args.iter().map(String::as_str));
    let mut p = Proc::start("vmm", &["sh"], &argv, &dir.path("vmm.err"));
    let st = p.wait(WAIT);
    assert_eq!(st.signal(), Some(9), "{st}: {}", dir.text("vmm.err"));
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    let group = format!("/{}", cg.0.file_name().unwrap().to_str().unwrap());
    assert!(
        log.lines()
            .any(|l| l.contains("hung up (its memory cgroup ")
                && l.contains(&group)
                && l.contains("limit 16 MiB, OOM-killed 1 process(es)")),
        "{log}"
    );
}
