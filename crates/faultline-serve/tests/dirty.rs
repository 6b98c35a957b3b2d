//! Dirty tracking (`--track-dirty`): real serve and test-VMM processes, the
//! userfaultfd handed over as Firecracker hands it. The peer reads a
//! seeded working set and writes a seeded set of pages (inside and outside
//! it) from several threads; the dirty set serve writes must be exactly
//! the pages written, plus the ones the peer dropped (they read zeros):
//! no page only read, no page only installed by fault-around or prefetch,
//! and no written page missing.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use faultline_serve::dirty_set;
use faultline_serve::peer::PeerReport;
use faultline_serve::testing::{self, assert_ok, Dir, WAIT};

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

#[test]
fn the_dirty_set_is_exactly_the_pages_written_and_dropped() {
    let dir = Dir::new("dirty-exact", 16 * MIB);
    let pattern = dir.path("dirty-{peer}.txt");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &["--peers", "3", "--track-dirty", pattern.to_str().unwrap()],
    );
    // 1: on demand (fault-around installs pages nobody touches), three
    // writing threads.
    let mut p = testing::peer(
        &dir,
        PEER,
        "p1",
        &[
            "--threads",
            "3",
            "--working-set",
            "20",
            "--write-set",
            "5",
            "--json",
            dir.path("p1.json").to_str().unwrap(),
        ],
    );
    assert_ok(&mut p, &dir);
    // 2: a balloon drop before the writes (its pages read zeros: dirty).
    let mut p = testing::peer(
        &dir,
        PEER,
        "p2",
        &[
            "--threads",
            "2",
            "--working-set",
            "30",
            "--balloon",
            "--write-set",
            "10",
            "--write-seed",
            "9",
            "--json",
            dir.path("p2.json").to_str().unwrap(),
        ],
    );
    assert_ok(&mut p, &dir);
    // 3: drops racing the vCPUs' faults (the EAGAIN path).
    let mut p = testing::peer(
        &dir,
        PEER,
        "p3",
        &[
            "--threads",
            "2",
            "--working-set",
            "20",
            "--storm",
            "5",
            "--write-set",
            "5",
            "--write-seed",
            "11",
            "--json",
            dir.path("p3.json").to_str().unwrap(),
        ],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    for n in 1..=3 {
        let r = report(&dir, &format!("p{n}.json"));
        assert!(!r.written_offsets.is_empty(), "peer {n} wrote nothing");
        let got = dirty(&dir, &format!("dirty-{n}.txt"));
        assert_same(&got, &expected(&r), &format!("peer {n}"));
    }
    assert!(!report(&dir, "p2.json").dropped_offsets.is_empty());
}

#[test]
fn prefetched_pages_are_installed_protected_and_only_written_ones_are_dirty() {
    let dir = Dir::new("dirty-prefetch", 16 * MIB);
    let all = dir.record_all(16 * MIB);
    let pattern = dir.path("dirty-{peer}.txt");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &[
            "--peers",
            "1",
            "--prefetch",
            all.to_str().unwrap(),
            "--track-dirty",
            pattern.to_str().unwrap(),
        ],
    );
    let mut p = testing::peer(
        &dir,
        PEER,
        "p1",
        &[
            "--threads",
            "2",
            "--working-set",
            "10",
            "--verify-all",
            "--write-set",
            "3",
            "--json",
            dir.path("p1.json").to_str().unwrap(),
        ],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    assert!(
        dir.text("serve.err").contains("prefetching 4096 pages"),
        "{}",
        dir.text("serve.err")
    );
    let r = report(&dir, "p1.json");
    assert_same(&dirty(&dir, "dirty-1.txt"), &expected(&r), "peer 1");
}

/// `POST /dirty` to the metrics socket at `sock`: the answer's status line.
fn post_dirty(sock: &std::path::Path) -> String {
    let mut c = UnixStream::connect(sock).expect("connecting to the metrics socket");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"POST /dirty HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text.lines().next().unwrap_or("").to_string()
}

#[test]
fn the_set_so_far_is_written_on_request_while_the_peer_runs() {
    let dir = Dir::new("dirty-asked", 8 * MIB);
    let metrics = dir.path("metrics.sock");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &[
            "--peers",
            "1",
            "--metrics",
            metrics.to_str().unwrap(),
            "--track-dirty",
            dir.path("dirty.txt").to_str().unwrap(),
        ],
    );
    let mut p = testing::peer(
        &dir,
        PEER,
        "p1",
        &[
            "--threads",
            "2",
            "--write-set",
            "4",
            "--hold-ms",
            "60000",
            "--json",
            dir.path("p1.json").to_str().unwrap(),
        ],
    );
    // The peer writes its report, then holds: still served.
    dir.wait_for("p1.err", "holding for");
    let want = expected(&report(&dir, "p1.json"));
    assert!(post_dirty(&metrics).contains("200"), "POST /dirty");
    dir.wait_for("serve.err", "peer 1: asked:");
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
    let mut s = testing::serve(
        &dir,
        SERVE,
        &[
            "--peers",
            "1",
            "--metrics",
            metrics.to_str().unwrap(),
            "--track-dirty",
            dir.path("dirty.txt").to_str().unwrap(),
        ],
    );
    let mut p = testing::peer(
        &dir,
        PEER,
        "p1",
        &[
            "--wp-async",
            "--threads",
            "2",
            "--balloon",
            "--write-set",
            "4",
            "--hold-ms",
            "60000",
            "--json",
            dir.path("p1.json").to_str().unwrap(),
        ],
    );
    dir.wait_for("p1.err", "holding for");
    assert!(
        dir.text("serve.err")
            .contains("WP_ASYNC: read from its page tables"),
        "{}",
        dir.text("serve.err")
    );
    let want = expected(&report(&dir, "p1.json"));
    assert!(post_dirty(&metrics).contains("200"), "POST /dirty");
    dir.wait_for("serve.err", "peer 1: asked:");
    assert_same(&dirty(&dir, "dirty.txt"), &want, "WP_ASYNC peer");
    // Its page tables go with it: at hang-up the set is not rewritten
    // (it would lack the pages), and serve says so.
    p.kill();
    assert_ok(&mut s, &dir);
    assert!(
        dir.text("serve.err")
            .contains("its dirty set is not written"),
        "{}",
        dir.text("serve.err")
    );
    assert_same(&dirty(&dir, "dirty.txt"), &want, "the set asked for");
}

#[test]
fn dirty_tracking_with_takeover_is_refused_with_the_reason() {
    let dir = Dir::new("dirty-refused", 4 * MIB);
    let out = std::process::Command::new(SERVE[0])
        .args(testing::command(
            &dir,
            &["--takeover", "--track-dirty", "/tmp/x-{peer}.txt"],
        ))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be combined with --takeover"), "{err}");
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
    let guard = Shm(std::path::PathBuf::from(format!(
        "/dev/shm/faultline-test-dirty-{}",
        std::process::id()
    )));
    let shm = &guard.0;
    let _ = std::fs::remove_file(shm);
    let mut s = testing::serve(
        &dir,
        SERVE,
        &[
            "--peers",
            "1",
            "--shared",
            shm.to_str().unwrap(),
            "--track-dirty",
            dir.path("dirty.txt").to_str().unwrap(),
        ],
    );
    let mut p = testing::peer(
        &dir,
        PEER,
        "p1",
        &[
            "--backend",
            "shared",
            "--map-file",
            shm.to_str().unwrap(),
            "--threads",
            "2",
            "--balloon",
            "--write-set",
            "5",
            "--json",
            dir.path("p1.json").to_str().unwrap(),
        ],
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    assert!(dir.text("serve.err").contains("shared mode"));
    let r = report(&dir, "p1.json");
    assert_same(&dirty(&dir, "dirty.txt"), &expected(&r), "shared peer");
}
