//! `faultline serve` against `faultline peer`: real processes, real
//! userfaultfds handed over a UNIX socket, every byte compared with the
//! memory file. Every wait is bounded; every process is stopped by its pid.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_faultline");
const MIB: usize = 1 << 20;

/// A temp dir with a memory file of seeded bytes, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str, mem_bytes: usize) -> Dir {
        let d = std::env::temp_dir().join(format!("faultline-serve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut f = std::fs::File::create(d.join("mem")).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ mem_bytes as u64;
        let mut buf = Vec::with_capacity(mem_bytes);
        while buf.len() < mem_bytes {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.extend_from_slice(&x.to_le_bytes());
        }
        f.write_all(&buf[..mem_bytes]).unwrap();
        Dir(d)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
    fn sock(&self) -> PathBuf {
        self.path("sock")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (by pid) and reaped on drop.
struct Proc {
    child: Child,
    name: String,
}

impl Proc {
    fn start(name: &str, args: &[&str], stderr: &Path) -> Proc {
        let child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(stderr).unwrap())
            .spawn()
            .unwrap();
        Proc {
            child,
            name: name.into(),
        }
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

const WAIT: Duration = Duration::from_secs(60);

/// `faultline CMD --socket SOCK --mem MEM EXTRA...` of `dir`.
fn command(dir: &Dir, cmd: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![cmd.into(), "--socket".into()];
    args.push(dir.sock().to_str().unwrap().into());
    args.push("--mem".into());
    args.push(dir.path("mem").to_str().unwrap().into());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn start(dir: &Dir, name: &str, cmd: &str, extra: &[&str]) -> Proc {
    let args = command(dir, cmd, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::start(name, &args, &dir.path(&format!("{name}.err")))
}

fn serve(dir: &Dir, extra: &[&str]) -> Proc {
    let mut args = vec!["--timeout", "20"];
    args.extend_from_slice(extra);
    let p = start(dir, "serve", "serve", &args);
    let deadline = Instant::now() + WAIT;
    while !dir.sock().exists() {
        assert!(Instant::now() < deadline, "serve never bound its socket");
        std::thread::sleep(Duration::from_millis(5));
    }
    p
}

fn peer(dir: &Dir, name: &str, extra: &[&str]) -> Proc {
    start(dir, name, "peer", extra)
}

/// Writes a working-set record of every page of the memory file.
fn record_all(dir: &Dir, mem_bytes: usize) -> PathBuf {
    let path = dir.path("all.txt");
    let mut text = String::from("# faultline working set v1\n");
    for off in (0..mem_bytes).step_by(4096) {
        text.push_str(&format!("{off:#x}\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn text(dir: &Dir, f: &str) -> String {
    std::fs::read_to_string(dir.path(f)).unwrap_or_default()
}

fn assert_ok(p: &mut Proc, dir: &Dir) {
    let s = p.wait(WAIT);
    assert!(
        s.success(),
        "{} failed ({s}):\n{}\nserve:\n{}",
        p.name,
        text(dir, &format!("{}.err", p.name)),
        text(dir, "serve.err")
    );
}

/// Waits until `f` of `dir` contains `needle`.
fn wait_for(dir: &Dir, f: &str, needle: &str) {
    let deadline = Instant::now() + WAIT;
    while !text(dir, f).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "{f} never said {needle:?}:\n{}",
            text(dir, f)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
    let log = text(&dir, "serve.err");
    assert_eq!(log.matches("hung up;").count(), 5, "{log}");
    assert!(log.contains("features [EVENT_REMOVE]"), "{log}");
}

#[test]
fn bad_input_is_refused_while_a_good_peer_is_served() {
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
    wait_for(&dir, "good.err", "paused");
    let cases = [
        ("json", "malformed handshake"),
        ("no-fd", "expected exactly one descriptor"),
        ("overlap", "overlap in the peer's address space"),
        ("past-end", "runs past the end of the store"),
        ("page-size", "page size 65536 bytes is not supported"),
    ];
    for (bad, _) in cases {
        let mut p = peer(&dir, bad, &["--bad", bad]);
        assert_ok(&mut p, &dir);
    }
    let mut twice = peer(&dir, "twice", &["--bad", "twice", "--verify-all"]);
    assert_ok(&mut twice, &dir);
    assert_ok(&mut good, &dir);
    assert_ok(&mut s, &dir);
    let log = text(&dir, "serve.err");
    for (bad, why) in cases {
        assert!(log.contains(why), "no refusal for {bad}:\n{log}");
    }
    assert!(log.contains("sent a second message"), "{log}");
    assert_eq!(log.matches("refused:").count(), 5, "{log}");
}

#[test]
fn kill_peer_on_error_kills_a_peer_with_a_bad_handshake() {
    let dir = Dir::new("kill", 4 * MIB);
    let mut s = serve(&dir, &["--peers", "1", "--kill-peer-on-error"]);
    let mut p = peer(&dir, "bad", &["--bad", "json"]);
    let st = p.wait(WAIT);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9), "{st}: {}", text(&dir, "serve.err"));
    assert_ok(&mut s, &dir);
    assert!(text(&dir, "serve.err").contains(&format!("killed pid {}", p.pid())));
}

#[test]
fn removed_ranges_read_zeros() {
    let dir = Dir::new("balloon", 8 * MIB);
    let mut s = serve(&dir, &["--peers", "1"]);
    let mut p = peer(&dir, "p", &["--balloon", "--threads", "4"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = text(&dir, "serve.err");
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
    let log = text(dir, "serve.err");
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
    let all = record_all(&dir, 8 * MIB);
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
    let all = record_all(&dir, 8 * MIB);
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
    let rec = record_all(&dir, 8 * MIB);
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
    let log = text(&dir, "serve.err");
    assert_eq!(log.matches("hung up;").count(), 8, "{log}");
    assert!(log.contains("all 8 peers served"), "{log}");
}

#[test]
fn a_peer_killed_mid_restore_leaves_the_others_served() {
    let dir = Dir::new("killed", 8 * MIB);
    let mut s = serve(&dir, &["--peers", "2"]);
    let mut victim = peer(&dir, "victim", &["--pause-at", "50", "--pause-ms", "30000"]);
    wait_for(&dir, "victim.err", "paused");
    victim.kill();
    let mut other = peer(&dir, "other", &["--verify-all"]);
    assert_ok(&mut other, &dir);
    assert_ok(&mut s, &dir);
    let log = text(&dir, "serve.err");
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
    wait_for(&dir, "p.err", "paused");
    s.kill();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        p.running(),
        "the peer should hang, not exit: {}",
        text(&dir, "p.err")
    );
    let tasks = std::fs::read_dir(format!("/proc/{}/task", p.pid())).unwrap();
    let wchans: Vec<String> = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("wchan")).ok())
        .collect();
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

#[test]
fn hugetlb_regions_are_served_and_prefetched() {
    // Two 4 MiB regions of 2 MiB hugetlb pages: on demand, then a record
    // and a prefetch of it; every byte compared each time.
    let pool = match faultline::testing::HugePool::get(8) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED: hugetlb rows: {why}");
            return;
        }
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
    let log = text(&dir, "serve.err");
    // --verify-all touches every page: 4 huge pages, 8 MiB read.
    assert!(log.contains("4 pages installed"), "{log}");
    assert!(log.contains("recorded 4 pages"), "{log}");
    let mut s = serve(&dir, &["--peers", "1", "--prefetch", rec.to_str().unwrap()]);
    let mut p = peer(&dir, "pre", &huge);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = text(&dir, "serve.err");
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
    let recorded = std::fs::read_to_string(&rec).unwrap();
    let pages = recorded.lines().count() - 1;
    assert!(pages > 0, "{recorded}");
    let mut s = serve(&dir, &["--peers", "1", "--prefetch", rec.to_str().unwrap()]);
    let mut p = peer(
        &dir,
        "pre",
        &["--working-set", "25", "--seed", "3", "--verify-all"],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = text(&dir, "serve.err");
    assert!(log.contains(&format!("prefetching {pages} pages")), "{log}");
    assert!(!log.contains(" 0 prefetched"), "{log}");
}

#[test]
fn a_snapshot_in_redis_is_served_byte_for_byte() {
    let dir = Dir::new("redis", 8 * MIB);
    let server = faultline_redis::server::RedisServer::start().unwrap();
    let url = server.store_url("snap");
    let mut put = Proc::start(
        "put",
        &["store", "put", dir.path("mem").to_str().unwrap(), &url],
        &dir.path("put.err"),
    );
    assert_ok(&mut put, &dir);
    let sock = dir.sock();
    let mut s = Proc::start(
        "serve",
        &[
            "serve",
            "--socket",
            sock.to_str().unwrap(),
            "--store",
            &url,
            "--timeout",
            "20",
            "--peers",
            "1",
        ],
        &dir.path("serve.err"),
    );
    let deadline = Instant::now() + WAIT;
    while !sock.exists() {
        assert!(Instant::now() < deadline, "serve never bound its socket");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut p = peer(&dir, "peer", &["--verify-all", "--threads", "2"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = text(&dir, "serve.err");
    assert!(log.contains(&format!("peers of {url}")), "{log}");
    assert_eq!(log.matches("hung up;").count(), 1, "{log}");
    // A store that was never put is refused at start, by name.
    let mut bad = Proc::start(
        "bad",
        &[
            "serve",
            "--socket",
            dir.path("bad.sock").to_str().unwrap(),
            "--store",
            &server.store_url("nothing"),
        ],
        &dir.path("bad.err"),
    );
    assert!(!bad.wait(WAIT).success());
    assert!(
        text(&dir, "bad.err").contains("no store named"),
        "{}",
        text(&dir, "bad.err")
    );
}

/// Runs `bench restore` on a 16 MiB file (10% working set, warm, one
/// rep) with `configs` and `extra` arguments; its JSON and its pid.
/// (`bench` is the lab's, behind faultline-cli's `bench` feature.)
#[cfg(feature = "bench")]
fn bench_restore(dir: &Dir, configs: &str, extra: &[&str]) -> (serde_json::Value, u32) {
    let json = dir.path("restore.json");
    let size = (16 * MIB).to_string();
    let args = [
        &[
            "bench",
            "--json",
            json.to_str().unwrap(),
            "restore",
            "--size",
            &size,
            "--working-set",
            "10",
            "--configs",
            configs,
            "--cache",
            "warm",
            "--reps",
            "1",
        ][..],
        extra,
    ]
    .concat();
    let mut b = Proc::start("bench", &args, &dir.path("bench.err"));
    let pid = b.pid();
    assert_ok(&mut b, dir);
    let out = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (out, pid)
}

/// `bench restore --store`: the memory file is uploaded to a real Redis
/// server, faultline's configurations are served from it (every byte
/// checked by the peer), and the records say which store served them.
#[test]
#[cfg(feature = "bench")]
fn bench_restore_serves_from_redis() {
    let dir = Dir::new("bench-redis", MIB);
    let server = faultline_redis::server::RedisServer::start().unwrap();
    let url = server.store_url("restore");
    let (out, _) = bench_restore(&dir, "on-demand,prefetch", &["--store", &url]);
    let rows: Vec<_> = out["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["bench"] == "restore")
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for r in rows {
        assert_eq!(r["store"], url.as_str(), "{r}");
        assert!(r["bytes_read"].as_u64().unwrap() > 0, "{r}");
    }
    // The store holds the uploaded file.
    assert!(
        text(&dir, "bench.err").contains(&format!("uploading the memory file to {url}")),
        "{}",
        text(&dir, "bench.err")
    );
}

/// `bench restore`'s shared-mode rows: the tmpfs copy is written (and
/// timed), the kernel maps it, serve maps its pages into the peer with
/// CONTINUE (no byte read, no private copy); the copy is removed after.
#[test]
#[cfg(feature = "bench")]
fn bench_restore_shared_rows_read_nothing_and_clean_up() {
    let dir = Dir::new("bench-shared", MIB);
    let (out, pid) = bench_restore(&dir, "kernel-tmpfs,prefetch-shared", &[]);
    let records = out["records"].as_array().unwrap();
    let row = |cfg: &str| {
        records
            .iter()
            .find(|r| r["bench"] == "restore" && r["mechanism"] == cfg)
            .unwrap_or_else(|| panic!("no {cfg} row: {out}"))
    };
    let shared = row("prefetch-shared");
    assert_eq!(shared["op"], "CONTINUE", "{shared}");
    assert_eq!(shared["bytes_read"], 0, "{shared}");
    // 10% of 16 MiB touched: the peer's private memory stays below it.
    assert!(shared["peer_anon_kib"].as_u64().unwrap() < 1600, "{shared}");
    assert_eq!(row("kernel-tmpfs")["store"], "tmpfs copy");
    let populated = records
        .iter()
        .filter(|r| r["bench"] == "restore-populate")
        .count();
    assert_eq!(populated, 2, "{out}");
    let snap = format!("/dev/shm/faultline-restore-{pid}.mem");
    assert!(!Path::new(&snap).exists(), "{snap} was left behind");
}

/// `bench restore` on hugetlbfs: the shared rows with their hand-off
/// steps and the hugetlbfs CONTINUE floor, then `--peers` rounds on
/// hugetlbfs (every byte of every peer's set checked by the peer); the
/// pool and the mount are given back.
#[test]
#[cfg(feature = "bench")]
fn bench_restore_on_hugetlbfs_rows_floor_and_peer_rounds() {
    let nr = || std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap();
    let before = nr();
    let dir = Dir::new("bench-huge", MIB);
    let (out, _) = bench_restore(&dir, "kernel,prefetch-shared-huge", &[]);
    let log = text(&dir, "bench.err") + &text(&dir, "bench.out");
    let records = out["records"].as_array().unwrap();
    let Some(row) = records
        .iter()
        .find(|r| r["bench"] == "restore" && r["mechanism"] == "prefetch-shared-huge")
    else {
        eprintln!("SKIPPED: no hugetlbfs rows (no pool or mount here): {log}");
        return;
    };
    assert_eq!(row["op"], "CONTINUE", "{row}");
    assert_eq!(row["bytes_read"], 0, "{row}");
    // The hand-off's steps, in ms from the handshake's send: serve had
    // queued the peer's prefetch before its last touch ended (no touch can
    // end before serve maps the page; `serving` is stamped after the
    // engine took the peer, which on a 16 MiB set may be after the vCPUs
    // are done), and its prefetch ran.
    let ms = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("no {k}: {row}"));
    assert!(
        ms("handoff_queued_ms") < ms("handoff_last_touch_ms"),
        "{row}"
    );
    assert!(
        ms("handoff_first_prefetch_ms") <= ms("handoff_prefetch_done_ms"),
        "{row}"
    );
    let floor = records
        .iter()
        .find(|r| {
            r["bench"] == "restore-floor"
                && r["mechanism"]
                    .as_str()
                    .is_some_and(|m| m.contains("huge pages the set touches"))
        })
        .unwrap_or_else(|| panic!("no hugetlbfs CONTINUE floor: {out}"));
    assert_eq!(floor["bytes"], 16 * MIB as u64, "{floor}");
    let (out, _) = bench_restore(&dir, "prefetch-shared-huge", &["--peers", "1,2"]);
    let rounds: Vec<_> = out["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["bench"] == "restore-peers" && r["mechanism"] == "prefetch-shared-huge")
        .collect();
    assert_eq!(rounds.len(), 2, "{out}");
    for r in rounds {
        let n = r["peers"].as_u64().unwrap();
        // 10% of 16 MiB (409 pages) per peer, every byte compared.
        assert_eq!(r["verified_bytes"], n * 409 * 4096, "{r}");
    }
    assert_eq!(nr(), before, "vm.nr_hugepages was not given back");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains("faultline-restore-"), "{mounts}");
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
    serde_json::from_str(&text(dir, f)).unwrap()
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
        text(&dir, "serve.err")
    };
    let log = round(&["--record", rec], "rec", &[]);
    assert!(log.contains("populated 16 MiB"), "{log}");
    assert!(log.contains("shared mode"), "{log}");
    let pages = std::fs::read_to_string(rec).unwrap().lines().count() - 1;
    assert!(pages > 0);
    round(
        &["--prefetch", rec, "--json", json],
        "pre",
        &["--verify-all"],
    );
    let log = text(&dir, "serve.err");
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
    wait_for(&dir, "a.err", "scribbled on");
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
    let log = text(&dir, "serve.err");
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
        let mut p = start(&dir, name, "serve", &args);
        let st = p.wait(WAIT);
        (st, text(&dir, &format!("{name}.err")))
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
        BIN.into(),
    ];
    args.extend(command(
        &dir,
        "serve",
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
    wait_for(&dir, "serve.err", "listening on");
    // Undeclared: its backing cannot be checked, so it is refused (its
    // vCPUs then block in the kernel; the test stops it by pid).
    let mut a = shared_peer(&dir, "a", &snap, &["--working-set", "10"]);
    wait_for(&dir, "serve.err", "refused: shared mode");
    a.kill();
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
    let log = text(&dir, "serve.err");
    assert!(
        log.contains("(pid 0): refused: shared mode: reading the peer's memory map"),
        "{log}"
    );
    assert!(log.contains("out of reach"), "{log}");
    assert!(log.contains("as its handshake declares: Shared"), "{log}");
    assert_eq!(log.matches("shared mode, ").count(), 1, "{log}");
}

#[test]
fn serve_registers_minor_for_a_shared_peer_that_registered_missing_only() {
    let dir = Dir::new("shared-missing-only", 16 * MIB);
    let snap = Shm::new("missing-only");
    let json = dir.path("serve.json");
    let mut s = serve(
        &dir,
        &[
            "--peers",
            "1",
            "--shared",
            snap.arg(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
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
    let log = text(&dir, "serve.err");
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
    let mut s = serve(
        &dir,
        &[
            "--peers",
            "2",
            "--shared",
            snap.arg(),
            "--kill-peer-on-error",
        ],
    );
    let mut good = shared_peer(
        &dir,
        "good",
        &snap,
        &["--verify-all", "--pause-at", "30", "--pause-ms", "1000"],
    );
    wait_for(&dir, "good.err", "paused");
    // Same bytes, another file: not the page cache serve vouches for.
    std::fs::copy(&snap.0, &other.0).unwrap();
    let mut bad = shared_peer(&dir, "bad", &other, &[]);
    let st = bad.wait(WAIT);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9), "{st}: {}", text(&dir, "serve.err"));
    assert_ok(&mut good, &dir);
    assert_ok(&mut s, &dir);
    let log = text(&dir, "serve.err");
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
    let pool = match faultline::testing::HugePool::get(12) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED: hugetlbfs shared mode: {why}");
            return;
        }
    };
    let mount = match HugeMount::new(&dir) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("SKIPPED: hugetlbfs shared mode: {why}");
            return;
        }
    };
    let snap = mount.0.join("snap");
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
    let log = text(&dir, "serve.err");
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
    drop(mount);
    drop(pool);
}
