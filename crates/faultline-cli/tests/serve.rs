//! The front door: `faultline serve` and the hidden `faultline peer`
//! forward to faultline-serve (its own tests run its binaries), `faultline
//! store put` feeds `faultline serve --store`, and `faultline bench
//! restore` runs both through its own executable. Real processes, every
//! byte compared; every wait is bounded, every process stopped by its pid.

#![cfg(feature = "serve")]

use std::path::Path;

use faultline_serve::testing::{self, assert_ok, Dir, Proc};

const BIN: &str = env!("CARGO_BIN_EXE_faultline");
const SERVE: &[&str] = &[BIN, "serve"];
const PEER: &[&str] = &[BIN, "peer"];
const MIB: usize = 1 << 20;

/// `faultline store put` uploads a snapshot to a real `redis-server` (the
/// test's own), `faultline serve --store` serves it to `faultline peer`,
/// every byte checked: the front door forwards both, with Redis support.
#[test]
fn a_snapshot_in_redis_is_served_byte_for_byte() {
    let dir = Dir::new("redis", 8 * MIB);
    let server = faultline_redis::server::RedisServer::start().unwrap();
    let url = server.store_url("snap");
    let mut put = Proc::start(
        "put",
        &[BIN],
        &["store", "put", dir.path("mem").to_str().unwrap(), &url],
        &dir.path("put.err"),
    );
    assert_ok(&mut put, &dir);
    let sock = dir.sock();
    let mut s = Proc::start(
        "serve",
        SERVE,
        &[
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
    dir.wait_for("serve.err", "listening on");
    let mut p = testing::peer(&dir, PEER, "peer", &["--verify-all", "--threads", "2"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert!(log.contains(&format!("peers of {url}")), "{log}");
    assert_eq!(log.matches("hung up;").count(), 1, "{log}");
}

/// `faultline serve --takeover` started its keeper through the front
/// door (which runs it before parsing arguments: it has none); `pkill -f
/// 'serve --socket SOCK'`, as an operator stops the serve of one socket,
/// kills serve and not the keeper, and `faultline serve --takeover` again
/// takes the paused VMM over, which verifies every byte.
#[test]
fn pkill_of_serve_by_its_socket_leaves_the_keeper_to_the_next_serve() {
    let dir = Dir::new("front-pkill", 8 * MIB);
    let args = ["--takeover", "--peers", "1"];
    let mut s = testing::serve(&dir, SERVE, &args);
    let keeper = testing::keeper_pid(&dir);
    let mut p = testing::peer(
        &dir,
        PEER,
        "p",
        &["--verify-all", "--pause-at", "30", "--pause-ms", "300"],
    );
    dir.wait_for("p.err", "paused");
    let sock = dir.sock();
    let killed = testing::pkill_f(&format!("serve --socket {}", sock.display()));
    assert_eq!(
        killed,
        [s.pid() as i32],
        "the pattern matched besides serve"
    );
    assert!(!s.wait(testing::WAIT).success(), "serve outlived SIGKILL");
    let mut again = testing::serve_again(&dir, SERVE, &args, 1);
    assert_ok(&mut p, &dir);
    assert_ok(&mut again, &dir);
    let log = dir.text("again.err");
    assert!(log.contains("taken over from the keeper"), "{log}");
    dir.wait_for("serve.err", "no peer and no serve: exiting");
    testing::wait_exited(keeper, "the keeper");
}

/// Runs `bench restore` on a 16 MiB file (10% working set, clustered
/// unless `extra` names a `--pattern`, warm, one rep) with `configs` and
/// `extra` arguments; its JSON and its pid.
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
        if extra.contains(&"--pattern") {
            &[]
        } else {
            &["--pattern", "clustered"][..]
        },
        extra,
    ]
    .concat();
    let mut b = Proc::start("bench", &[BIN], &args, &dir.path("bench.err"));
    let pid = b.pid();
    assert_ok(&mut b, dir);
    let out = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (out, pid)
}

/// The `restore` records of a `bench restore` JSON (not its floors).
#[cfg(feature = "bench")]
fn restore_rows(out: &serde_json::Value) -> Vec<&serde_json::Value> {
    out["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["bench"] == "restore")
        .collect()
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
    let rows = restore_rows(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for r in rows {
        assert_eq!(r["store"], url.as_str(), "{r}");
        assert!(r["bytes_read"].as_u64().unwrap() > 0, "{r}");
    }
    // The store holds the uploaded file.
    assert!(
        dir.text("bench.err")
            .contains(&format!("uploading the memory file to {url}")),
        "{}",
        dir.text("bench.err")
    );
}

/// `bench restore --kvm`: the peer's vCPUs are KVM vCPUs whose guest
/// reads the working set (its faults are KVM's, in the kernel), for the
/// kernel's mapping and for serve alike; a row has its restore time and
/// no per-touch latency. Skipped, and said, without `/dev/kvm`.
#[test]
#[cfg(feature = "bench")]
fn bench_restore_kvm_rows_are_a_kvm_guests() {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("skipped: no /dev/kvm on this machine");
        return;
    }
    let dir = Dir::new("bench-kvm", MIB);
    let (out, _) = bench_restore(&dir, "kernel,on-demand", &["--kvm"]);
    let rows = restore_rows(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
        // A KVM guest's touches are not timed: no latency (null, not 0).
        assert!(r.get("vcpu_median_ns").is_none(), "{r}");
        assert!(r["median_ns"].is_null(), "{r}");
    }
    let served = rows.iter().find(|r| r["mechanism"] == "on-demand").unwrap();
    assert!(served["demand_faults"].as_f64().unwrap() > 0.0, "{served}");
    let log = dir.text("bench.err");
    assert!(log.matches("read by the KVM guest").count() >= 2, "{log}");
}

/// `bench restore`'s sweep rows: serve's windows grow on the vCPUs'
/// sweeps (far fewer faults than pages), and each row says its faults per
/// page, per read(2), the handler's and the helpers' CPU time and the
/// pages it wasted.
#[test]
#[cfg(feature = "bench")]
fn bench_restore_sweep_rows_count_faults_per_page_and_wasted_pages() {
    let dir = Dir::new("bench-sweep", MIB);
    let (out, _) = bench_restore(&dir, "kernel,on-demand", &["--pattern", "sweep"]);
    let records = out["records"].as_array().unwrap();
    let row = records
        .iter()
        .find(|r| r["bench"] == "restore" && r["mechanism"] == "on-demand")
        .unwrap_or_else(|| panic!("no on-demand row: {out}"));
    assert_eq!(row["pattern"], "sweep", "{row}");
    assert!(row["faults_per_page"].as_f64().unwrap() < 0.1, "{row}");
    assert!(row["faults_per_read"].as_f64().unwrap() >= 1.0, "{row}");
    assert!(row["handler_cpu_ms"].as_f64().unwrap() > 0.0, "{row}");
    // The helpers' share (pieces of the sweep's windows) is its own column.
    assert!(row["helpers_cpu_ms"].as_f64().unwrap() >= 0.0, "{row}");
    // The set is the first 10% of memory: a window may run past its end,
    // by less than the largest window (512 pages) per vCPU.
    assert!(row["wasted_pages"].as_f64().unwrap() < 2.0 * 512.0, "{row}");
    // Serve's run-ahead column: none ran (off by default); the kernel's
    // row has no such column.
    assert_eq!(row["run_ahead_pages"].as_f64(), Some(0.0), "{row}");
    let kernel = records
        .iter()
        .find(|r| r["bench"] == "restore" && r["mechanism"] == "kernel")
        .unwrap_or_else(|| panic!("no kernel row: {out}"));
    assert!(kernel.get("run_ahead_pages").is_none(), "{kernel}");
}

/// `bench restore`'s dirty-tracked rows: the peer writes the same seeded
/// set in every configuration; the tracked ones (synchronous write-protect
/// faults, and a `WP_ASYNC` peer whose set `faultline serve` writes on
/// SIGUSR1 while it holds) have their dirty set checked equal to the
/// pages written by the bench, and each first-write record names its
/// untracked twin.
#[test]
#[cfg(feature = "bench")]
fn bench_restore_tracked_rows_check_the_dirty_set_and_time_first_writes() {
    let dir = Dir::new("bench-tracked", MIB);
    let (out, _) = bench_restore(
        &dir,
        "on-demand,on-demand-tracked,on-demand-tracked-async",
        &["--write-set", "2"],
    );
    let records = out["records"].as_array().unwrap();
    let row = |cfg: &str| {
        records
            .iter()
            .find(|r| r["bench"] == "restore-write" && r["mechanism"] == cfg)
            .unwrap_or_else(|| panic!("no {cfg} first-write row: {out}"))
    };
    // 2% of 16 MiB's 4096 pages.
    let written = 4096 * 2 / 100;
    for cfg in ["on-demand-tracked", "on-demand-tracked-async"] {
        let r = row(cfg);
        assert_eq!(r["dirty_pages"].as_f64(), Some(written as f64), "{r}");
        assert_eq!(r["untracked"], "on-demand", "{r}");
        assert!(r["write_vs_untracked"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["restore_vs_untracked"].as_f64().unwrap() > 0.0, "{r}");
    }
    let plain = row("on-demand");
    assert!(plain["write_median_ns"].as_f64().unwrap() > 0.0, "{plain}");
    assert!(plain.get("dirty_pages").is_none(), "{plain}");
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
    let log = dir.text("bench.err") + &dir.text("bench.out");
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

/// `faultline record` forwards to the record tool: a record written by
/// `faultline serve --record` is inspected and merged through the front
/// door, and the merged set is the record's pages.
#[test]
fn records_are_inspected_and_merged_through_the_front_door() {
    let dir = Dir::new("record", 8 * MIB);
    let rec = dir.path("rec.txt");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &["--peers", "1", "--record", rec.to_str().unwrap()],
    );
    let mut p = testing::peer(&dir, PEER, "peer", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .arg("record")
            .args(args)
            .output()
            .expect("running faultline record");
        assert!(
            out.status.success(),
            "faultline record {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()
    };
    let one = run(&["inspect", "--json", rec.to_str().unwrap()]);
    let pages = one["pages"].as_u64().expect("inspect --json gives pages");
    assert!(pages > 0, "{one}");
    assert_eq!(one["recordings"].as_u64(), Some(1), "{one}");
    let merged = dir.path("merged.txt");
    run(&[
        "merge",
        "-k",
        "1",
        "-o",
        merged.to_str().unwrap(),
        rec.to_str().unwrap(),
    ]);
    let m = run(&["inspect", "--json", merged.to_str().unwrap()]);
    assert_eq!(m["pages"].as_u64(), Some(pages), "{m}");
}

/// `bench restore --serve-lead-ms` reaches the runs: the served peer
/// (every byte checked) starts after the lead, and the record says it.
#[test]
#[cfg(feature = "bench")]
fn bench_restore_starts_peers_after_the_serve_lead() {
    let dir = Dir::new("bench-lead", MIB);
    let (out, _) = bench_restore(&dir, "prefetch", &["--serve-lead-ms", "300"]);
    let rows = restore_rows(&out);
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["serve_lead_ms"].as_u64(), Some(300), "{}", rows[0]);
}
