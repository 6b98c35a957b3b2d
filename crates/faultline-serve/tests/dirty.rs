//! Dirty tracking (`--track-dirty`): real serve and test-VMM processes, the
//! userfaultfd handed over as Firecracker hands it. The peer reads a
//! seeded working set and writes a seeded set of pages (inside and outside
//! it) from several threads; the dirty set serve writes must be exactly
//! the pages written, plus the ones the peer dropped (they read zeros):
//! no page only read, no page only installed by fault-around or prefetch,
//! and no written page missing.

use std::collections::BTreeSet;
use std::time::Duration;

use faultline_serve::dirty_set;
use faultline_serve::peer::PeerReport;
use faultline_serve::testing::{self, assert_ok, Dir, Proc, WAIT};

const SERVE: &[&str] = &[env!("CARGO_BIN_EXE_faultline-serve")];
const PEER: &[&str] = &[env!("CARGO_BIN_EXE_faultline-peer")];
const MIB: usize = 1 << 20;

/// The peer's `--json` report `f` of `dir`.
fn report(dir: &Dir, f: &str) -> PeerReport {
    serde_json::from_str(&dir.text(f)).unwrap_or_else(|e| panic!("{f}: {e}"))
}

/// The dirty set in `f` of `dir`, as a set of offsets (read and checked
/// by the format's reader).
fn dirty(dir: &Dir, f: &str) -> BTreeSet<u64> {
    let d = dirty_set::read(&dir.path(f)).unwrap_or_else(|e| panic!("{e}"));
    d.offsets.into_iter().collect()
}

/// What the peer says it wrote and dropped.
fn expected(r: &PeerReport) -> BTreeSet<u64> {
    r.written_offsets
        .iter()
        .chain(&r.dropped_offsets)
        .copied()
        .collect()
}

/// Says which pages differ, if any.
fn assert_same(got: &BTreeSet<u64>, want: &BTreeSet<u64>, what: &str) {
    let extra: Vec<_> = got.difference(want).take(8).collect();
    let missing: Vec<_> = want.difference(got).take(8).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{what}: {} pages dirty, {} expected; not written but dirty {extra:x?}, written but not dirty {missing:x?}",
        got.len(),
        want.len()
    );
}

/// Serve tracking to `file` of `dir` (`{peer}` allowed), with `extra`.
fn serve(dir: &Dir, file: &str, extra: &[&str]) -> Proc {
    let file = dir.path(file);
    let mut args = vec!["--track-dirty", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    testing::serve(dir, SERVE, &args)
}

/// A peer `name` writing `--write-set PCT` (seeded `seed`), its report in
/// `NAME.json`, with `extra`.
fn writer(dir: &Dir, name: &str, pct: &str, seed: &str, extra: &[&str]) -> Proc {
    let json = dir.path(&format!("{name}.json"));
    let mut args = vec![
        "--write-set",
        pct,
        "--write-seed",
        seed,
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    testing::peer(dir, PEER, name, &args)
}

/// A writer that then holds (still served); waits until it holds and
/// gives the pages it wrote and dropped.
fn holding_writer(dir: &Dir, extra: &[&str]) -> (Proc, BTreeSet<u64>) {
    let mut args = vec!["--threads", "2", "--hold-ms", "60000"];
    args.extend_from_slice(extra);
    let p = writer(dir, "p1", "4", "7", &args);
    dir.wait_for("p1.err", "holding for");
    (p, expected(&report(dir, "p1.json")))
}

/// The `faultline_peer_dirty_pages` gauge of peer 1 a scrape of the
/// metrics socket `sock` reads (the exposition parsed by a Prometheus
/// text parser).
fn dirty_gauge(sock: &std::path::Path) -> f64 {
    use faultline_serve::metrics::{scrape, MetricsAddr};
    let text = scrape(&MetricsAddr::Unix(sock.into())).expect("scraping --metrics");
    let m = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("parsing the scrape");
    let hit = m
        .samples
        .iter()
        .find(|x| x.metric == "faultline_peer_dirty_pages" && x.labels.get("peer") == Some("1"))
        .unwrap_or_else(|| panic!("no dirty-pages gauge of peer 1 in\n{text}"));
    match hit.value {
        prometheus_parse::Value::Gauge(v) => v,
        ref v => panic!("not a gauge: {v:?}"),
    }
}

/// `POST /dirty` to the metrics socket at `sock`, which must answer 200;
/// waits for serve's line saying it wrote peer 1's set.
fn post_dirty(dir: &Dir, sock: &std::path::Path) {
    testing::post(sock, "/dirty");
    dir.wait_for("serve.err", "peer 1: asked:");
}

#[test]
fn the_dirty_set_is_exactly_the_pages_written_and_dropped() {
    let dir = Dir::new("dirty-exact", 16 * MIB);
    let mut s = serve(&dir, "dirty-{peer}.txt", &["--peers", "3"]);
    // 1: on demand (fault-around installs pages nobody touches), three
    // writing threads; 2: a balloon drop before the writes (its pages read
    // zeros: dirty); 3: drops racing the vCPUs' faults (the EAGAIN path).
    let peers: [(&str, &[&str]); 3] = [
        ("5", &["--threads", "3", "--working-set", "20"]),
        (
            "10",
            &["--threads", "2", "--working-set", "30", "--balloon"],
        ),
        (
            "5",
            &["--threads", "2", "--working-set", "20", "--storm", "5"],
        ),
    ];
    for (n, (pct, extra)) in peers.iter().enumerate() {
        let mut p = writer(
            &dir,
            &format!("p{}", n + 1),
            pct,
            &(9 + n).to_string(),
            extra,
        );
        assert_ok(&mut p, &dir);
    }
    assert_ok(&mut s, &dir);
    for n in 1..=3 {
        let r = report(&dir, &format!("p{n}.json"));
        assert!(!r.written_offsets.is_empty(), "peer {n} wrote nothing");
        let got = dirty(&dir, &format!("dirty-{n}.txt"));
        assert_same(&got, &expected(&r), &format!("peer {n}"));
    }
    assert!(!report(&dir, "p2.json").dropped_offsets.is_empty());
}

/// The other ways serve installs a fault's window keep the set exact: the
/// faulting page first and the rest after (`--wake-first`), one peer's
/// faults spread over two handler threads (`--engine workers`), and a
/// handler asleep on each CPU reading every fault (`--engine per-cpu`).
#[test]
fn wake_first_windows_workers_and_per_cpu_keep_the_dirty_set_exact() {
    let engines: [(&str, &[&str]); 2] = [
        (
            "wake-first, workers",
            &["--wake-first", "--engine", "workers", "--threads", "2"],
        ),
        ("per-cpu", &["--engine", "per-cpu"]),
    ];
    for (i, (what, extra)) in engines.into_iter().enumerate() {
        let dir = Dir::new(&format!("dirty-engine-{i}"), 16 * MIB);
        let mut args = vec!["--peers", "1"];
        args.extend_from_slice(extra);
        let mut s = serve(&dir, "dirty-{peer}.txt", &args);
        let mut p = writer(
            &dir,
            "p1",
            "5",
            "21",
            &["--threads", "3", "--working-set", "30"],
        );
        assert_ok(&mut p, &dir);
        assert_ok(&mut s, &dir);
        let r = report(&dir, "p1.json");
        assert!(
            !r.written_offsets.is_empty(),
            "{what}: the peer wrote nothing"
        );
        assert_same(&dirty(&dir, "dirty-1.txt"), &expected(&r), what);
    }
}

#[test]
fn prefetched_pages_are_installed_protected_and_only_written_ones_are_dirty() {
    let dir = Dir::new("dirty-prefetch", 16 * MIB);
    let all = dir.record_all(16 * MIB);
    let mut s = serve(
        &dir,
        "dirty.txt",
        &["--peers", "1", "--prefetch", all.to_str().unwrap()],
    );
    let mut p = writer(
        &dir,
        "p1",
        "3",
        "7",
        &["--threads", "2", "--working-set", "10", "--verify-all"],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let err = dir.text("serve.err");
    assert!(err.contains("prefetching 4096 pages"), "{err}");
    let r = report(&dir, "p1.json");
    assert_same(&dirty(&dir, "dirty.txt"), &expected(&r), "peer 1");
}

#[test]
fn the_set_so_far_is_written_on_request_while_the_peer_runs() {
    let dir = Dir::new("dirty-asked", 8 * MIB);
    let metrics = dir.path("metrics.sock");
    let mut s = serve(
        &dir,
        "dirty.txt",
        &["--peers", "1", "--metrics", metrics.to_str().unwrap()],
    );
    let (mut p, want) = holding_writer(&dir, &[]);
    // Every write was resolved before the peer said it holds: the gauge
    // counts them all, and the set asked for next has as many.
    assert_eq!(dirty_gauge(&metrics), want.len() as f64);
    post_dirty(&dir, &metrics);
    assert_same(&dirty(&dir, "dirty.txt"), &want, "POST /dirty");
    std::fs::remove_file(dir.path("dirty.txt")).unwrap();
    faultline_sys::process::kill(s.pid() as i32, faultline_sys::signal::SIGUSR1).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while !dir.path("dirty.txt").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGUSR1 wrote nothing"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_same(&dirty(&dir, "dirty.txt"), &want, "SIGUSR1");
    assert!(s.running(), "SIGUSR1 must not end serve");
    p.kill();
    assert_ok(&mut s, &dir);
    // At hang-up: the final set, the same pages.
    assert_same(&dirty(&dir, "dirty.txt"), &want, "at hang-up");
}

#[test]
fn a_wp_async_peer_is_tracked_from_its_page_tables_while_it_runs() {
    // WP_ASYNC: the kernel un-protects written pages itself (no fault
    // reaches serve); PAGEMAP_SCAN of the peer's page tables finds them.
    let dir = Dir::new("dirty-async", 8 * MIB);
    let metrics = dir.path("metrics.sock");
    let mut s = serve(
        &dir,
        "dirty.txt",
        &["--peers", "1", "--metrics", metrics.to_str().unwrap()],
    );
    let (mut p, want) = holding_writer(&dir, &["--wp-async", "--balloon"]);
    let err = dir.text("serve.err");
    assert!(err.contains("WP_ASYNC: read from its page tables"), "{err}");
    // The gauge scans its page tables too.
    assert_eq!(dirty_gauge(&metrics), want.len() as f64);
    post_dirty(&dir, &metrics);
    assert_same(&dirty(&dir, "dirty.txt"), &want, "WP_ASYNC peer");
    // Its page tables go with it: at hang-up the set is not rewritten
    // (it would lack the pages), and serve says so.
    p.kill();
    assert_ok(&mut s, &dir);
    let err = dir.text("serve.err");
    assert!(err.contains("its dirty set is not written"), "{err}");
    assert_same(&dirty(&dir, "dirty.txt"), &want, "the set asked for");
}

/// Tracking survives a takeover: serve `--takeover --track-dirty` is
/// killed (`SIGKILL`) while a writing peer is mid-restore (one vCPU paused
/// after 60 of its writes, the other writing on; a balloon drop before);
/// the same command
/// takes it over, reads the pages written so far from the peer's page
/// tables and tracks on: the set written at the peer's end is exactly the
/// pages written and dropped, before the kill and after.
#[test]
fn a_peer_taken_over_mid_restore_keeps_an_exact_dirty_set() {
    let dir = Dir::new("dirty-takeover", 16 * MIB);
    let file = dir.path("dirty-{peer}.txt");
    let args = [
        "--takeover",
        "--peers",
        "1",
        "--track-dirty",
        file.to_str().unwrap(),
    ];
    let mut s = testing::serve(&dir, SERVE, &args);
    let keeper = testing::keeper_pid(&dir);
    let mut p = writer(
        &dir,
        "p1",
        "10",
        "5",
        &[
            "--threads",
            "2",
            "--working-set",
            "30",
            "--balloon",
            "--write-pause-after",
            "60",
            "--pause-ms",
            "1500",
        ],
    );
    dir.wait_for("p1.err", "paused writing");
    s.kill();
    let mut again = testing::serve_again(&dir, SERVE, &args, 1);
    assert_ok(&mut p, &dir);
    let st = again.wait(WAIT);
    let log = dir.text("again.err");
    assert!(st.success(), "{st}: {log}");
    let before = testing::number_after(&log, "tracked on: ");
    assert!(before > 0, "nothing written before the kill: {log}");
    let r = report(&dir, "p1.json");
    let want = expected(&r);
    assert!(
        before < want.len(),
        "everything written before the kill: {log}"
    );
    assert_same(&dirty(&dir, "dirty-1.txt"), &want, "peer 1 taken over");
    testing::wait_exited(keeper, "the keeper");
}

#[test]
fn shared_mode_pages_mapped_by_continue_are_tracked_too() {
    // A peer mapping the shared tmpfs copy MAP_PRIVATE: pages mapped with
    // CONTINUE_MODE_WP, a write un-protects (then the kernel copies the
    // page privately).
    /// The tmpfs copy, removed on drop (a failed assertion too).
    struct Shm(std::path::PathBuf);
    impl Drop for Shm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let dir = Dir::new("dirty-shared", 16 * MIB);
    let shm = Shm(std::path::PathBuf::from(format!(
        "/dev/shm/faultline-test-dirty-{}",
        std::process::id()
    )));
    let _ = std::fs::remove_file(&shm.0);
    let copy = shm.0.to_str().unwrap();
    let mut s = serve(&dir, "dirty.txt", &["--peers", "1", "--shared", copy]);
    let mut p = writer(
        &dir,
        "p1",
        "5",
        "7",
        &[
            "--backend",
            "shared",
            "--map-file",
            copy,
            "--threads",
            "2",
            "--balloon",
        ],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    assert!(dir.text("serve.err").contains("shared mode"));
    let r = report(&dir, "p1.json");
    assert_same(&dirty(&dir, "dirty.txt"), &expected(&r), "shared peer");
}
