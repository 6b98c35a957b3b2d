//! Nothing a user names is destroyed and no value crashes a command: the
//! `faultline` binary run as a user would (real files, device nodes,
//! FIFOs, symlinks, signals), every run under a deadline. The Redis side
//! (an old store intact after a killed or failed `store put`, a
//! destination intact after a failed `store get`) is in `tests/store.rs`,
//! against a real `redis-server` on a unix socket.
//!
//! Each case checks the exit status (0, 1 or 2: never 101, a panic, or
//! 134, an abort), that an error is one `error:` line (and its causes),
//! and what is on disk afterwards: the device node, the FIFO, the
//! symlink's target and a file at a refused path byte-for-byte as before,
//! and no temporary left behind.

mod support;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{
    children_of, dead_pid, finish, refused, run_for, running, signal, start, Dir, KillOnDrop, Out,
};

fn run(d: &Dir, args: &[&str]) -> Out {
    run_for(d, 30, args)
}

/// Waits until `ready` holds (at most `secs`), then SIGTERMs `child` and
/// collects it.
fn term_when(child: std::process::Child, secs: u64, what: &str, ready: impl Fn() -> bool) -> Out {
    let end = Instant::now() + Duration::from_secs(secs);
    while !ready() {
        assert!(Instant::now() < end, "{what}: not ready after {secs} s");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&child, "TERM");
    finish(child, Duration::from_secs(20), what)
}

/// (type, device number) of a node, to see it is the same node after.
fn node(p: &str) -> (bool, u64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.file_type().is_char_device(), m.rdev())
}

#[test]
fn devices_fifos_symlinks_and_refused_paths_are_left_as_they_were() {
    let d = Dir::new("outputs");
    std::fs::create_dir(d.path("tmp")).unwrap();
    // A character device is refused and stays one; /dev/null is written
    // in place (timing the generator) and stays /dev/null.
    let full = node("/dev/full");
    refused(
        &d,
        &["graph", "gen", "--scale", "10", "-o", "/dev/full"],
        1,
        "is a character device",
    );
    assert_eq!(node("/dev/full"), full);
    let null = node("/dev/null");
    let o = run(
        &d,
        &[
            "graph",
            "gen",
            "--scale",
            "10",
            "--no-sync",
            "-o",
            "/dev/null",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert_eq!(node("/dev/null"), null);
    // A FIFO: refused at once (no open that waits for a reader).
    let fifo = d.path("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    refused(
        &d,
        &["graph", "gen", "--scale", "10", "-o", "fifo"],
        1,
        "is a FIFO",
    );
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // A symlink is followed: the target gets the graph, the link stays.
    std::fs::write(d.path("target.bin"), b"old").unwrap();
    std::os::unix::fs::symlink("target.bin", d.path("link.bin")).unwrap();
    let o = run(
        &d,
        &[
            "graph",
            "gen",
            "--scale",
            "10",
            "--no-sync",
            "-o",
            "link.bin",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(std::fs::symlink_metadata(d.path("link.bin"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::metadata(d.path("target.bin")).unwrap().len() > 1000);
    // A regular file where a run is refused (more memory than there is)
    // keeps every byte.
    std::fs::write(d.path("keep.bin"), b"precious bytes").unwrap();
    refused(
        &d,
        &["graph", "gen", "--scale", "40", "-o", "keep.bin"],
        1,
        "needs about",
    );
    assert_eq!(
        std::fs::read(d.path("keep.bin")).unwrap(),
        b"precious bytes"
    );
    // A missing parent directory is not created.
    refused(
        &d,
        &["graph", "gen", "--scale", "10", "-o", "no/such/g.bin"],
        1,
        "does not exist",
    );
    refused(
        &d,
        &["bench", "--json", "nodir/x.json", "notify"],
        1,
        "does not exist",
    );
    assert!(!d.path("no").exists() && !d.path("nodir").exists());
    assert_eq!(
        d.names(""),
        ["fifo", "keep.bin", "link.bin", "target.bin", "tmp"],
        "no temporary left"
    );
}

#[test]
fn values_that_crashed_or_ran_nonsense_are_refused_before_any_work() {
    let d = Dir::new("values");
    std::fs::create_dir(d.path("tmp")).unwrap();
    // The command line (split at spaces), its exit status, what it says.
    let cases: &[(&str, i32, &str)] = &[
        (
            "bench latency -n 18446744073709551615",
            2,
            "must be from 100 to",
        ),
        ("bench latency -n 1000000000000", 2, "MemAvailable"),
        ("bench scale --threads 100000", 2, "threads this machine"),
        ("bfs g.bin --threads 100000", 2, "threads this machine"),
        (
            "bench restore --prefetch-helpers 100000",
            2,
            "threads this machine",
        ),
        (
            "store put f redis+unix:///nonexistent#x --chunk 1099511627776",
            2,
            "must be from 512 to 536870912",
        ),
        ("bench random --threads 0", 2, "must be from 1 to"),
        ("bench restore --reps 0", 2, "must be from 1 to 1000"),
        ("bench watch --tables 9.9", 2, "possible values"),
        (
            "bench seq --depths 1048576 --mib 1",
            2,
            "must be from 1 to 512",
        ),
        // A window larger than the region: refused, not rounded up.
        (
            "bench seq --depths 512 --mib 1",
            1,
            "larger than the region",
        ),
        (
            "bench offload --mib 1 --fault-around 1000000000",
            2,
            "must be from 1 to 512",
        ),
        (
            "bench offload --mib 1 --fault-around 512",
            1,
            "not a whole number of fault-around windows",
        ),
        ("bench restore --size 1000", 2, "must be from 8388608 to"),
        ("bench restore --working-set NaN", 2, "not a number"),
        ("bench vpri --scale inf", 2, "infinite"),
    ];
    for (line, code, want) in cases {
        let args: Vec<&str> = line.split(' ').collect();
        refused(&d, &args, *code, want);
    }
    assert_eq!(d.names(""), ["tmp"]);
    assert!(d.names("tmp").is_empty());
}

#[test]
fn a_killed_graph_gen_leaves_nothing_and_a_later_run_sweeps_what_one_left() {
    let d = Dir::new("killed");
    std::fs::create_dir(d.path("tmp")).unwrap();
    // What a run killed by SIGKILL (no handler can run) left.
    let left = format!(".g.bin.partial-{}", dead_pid());
    std::fs::write(d.path(&left), b"partial").unwrap();
    std::fs::write(d.path("g.bin"), b"old graph").unwrap();
    // SIGTERM while writing: the temporary goes, the old file stays.
    let child = start(
        &d,
        &[
            "graph",
            "gen",
            "--scale",
            "22",
            "--mem-limit",
            "16M",
            "--no-sync",
            "-o",
            "g.bin",
        ],
    );
    let partial = d.path(&format!(".g.bin.partial-{}", child.id()));
    let o = term_when(child, 20, "graph gen (SIGTERM)", || partial.exists());
    assert_eq!(o.code, None, "ended by the signal: {}", o.stderr);
    assert_eq!(std::fs::read(d.path("g.bin")).unwrap(), b"old graph");
    assert_eq!(
        d.names(""),
        ["g.bin", "tmp"],
        "the temporary and the killed run's leftover"
    );
}

#[test]
fn bench_random_removes_its_file_and_a_killed_runs() {
    let d = Dir::new("random");
    std::fs::create_dir(d.path("tmp")).unwrap();
    let dead = format!("faultline-random-{}.bin", dead_pid());
    std::fs::write(d.path("tmp").join(&dead), b"left by a killed run").unwrap();
    let o = run(
        &d,
        &[
            "bench",
            "random",
            "--mib",
            "1",
            "--reps",
            "1",
            "--threads",
            "1",
            "--mech",
            "mmap,faultline",
            "--buffer",
            "50",
            "--page-kib",
            "4",
            "--order",
            "seq",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
    // Killed by SIGTERM with its file written: removed by the handler.
    let child = start(
        &d,
        &[
            "bench",
            "random",
            "--mib",
            "64",
            "--reps",
            "200",
            "--threads",
            "1",
            "--mech",
            "mmap",
            "--buffer",
            "100",
            "--page-kib",
            "4",
            "--order",
            "seq",
        ],
    );
    let file = d
        .path("tmp")
        .join(format!("faultline-random-{}.bin", child.id()));
    term_when(child, 30, "bench random (SIGTERM)", || {
        std::fs::metadata(&file).is_ok_and(|m| m.len() == 64 << 20)
    });
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
}

/// The hugetlbfs mounts under `dir`.
fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|at| at.starts_with(dir.to_str().unwrap()))
        .map(str::to_string)
        .collect()
}

/// `bench restore` runs `faultline serve` and `faultline peer` children
/// and (as root) a hugetlbfs mount: a SIGTERM gives all of it back, and a
/// SIGKILL, which no handler sees, still takes the children along (they
/// die with their parent) and leaves the mount and the directory to the
/// next run, which removes them.
#[test]
fn a_killed_bench_restore_leaves_no_child_running_and_no_mount() {
    let d = Dir::new("restore");
    let tmp = d.path("tmp");
    let restore = [
        "bench",
        "restore",
        "--size",
        "67108864",
        "--working-set",
        "30",
        "--pattern",
        "sweep",
        "--reps",
        "1000",
        "--cache",
        "warm",
        // Served first, and slow (the vCPUs spin 10 ms after each touch:
        // a run takes about 25 s), so its children outlive the test's
        // wait unless they die with the bench.
        "--compute-us",
        "10000",
        "--configs",
        "on-demand,kernel-hugetlbfs,on-demand-shared-huge",
    ];
    std::fs::create_dir_all(&tmp).unwrap();
    let nr_hugepages = || std::fs::read_to_string("/proc/sys/vm/nr_hugepages").ok();
    // What a SIGKILLed bench leaves grown (no handler runs): the pool size
    // before it, and what it grew it to.
    let mut pool = (None, None);
    for sig in ["TERM", "KILL"] {
        if sig == "KILL" {
            pool.0 = nr_hugepages();
        }
        // Output to files, not pipes: a child writing to a pipe the test
        // has stopped reading would die of SIGPIPE and hide a leftover.
        let log = std::fs::File::create(d.path(&format!("restore-{sig}.log"))).unwrap();
        let child = Command::new(support::bin())
            .args(restore)
            .current_dir(&d.0)
            .env("TMPDIR", &tmp)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait for a served run: serve and the peer both running.
        let end = Instant::now() + Duration::from_secs(120);
        let kids = loop {
            let kids = children_of(pid);
            if kids.len() >= 2 {
                break kids;
            }
            assert!(
                Instant::now() < end,
                "bench restore never started serve and a peer"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        if sig == "KILL" {
            pool.1 = nr_hugepages();
        }
        // Stopped by their pids whatever happens (the test may fail).
        let _kids = KillOnDrop(kids.clone());
        signal(&child, sig);
        let mut child = child;
        let end = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("SIG{sig}: bench restore still running after 20 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_ne!(status.code(), Some(101), "SIG{sig}: {status}");
        let end = Instant::now() + Duration::from_secs(10);
        while kids.iter().any(|&k| running(k)) {
            assert!(
                Instant::now() < end,
                "SIG{sig}: children {kids:?} of the killed bench still run"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        if sig == "TERM" {
            assert!(mounts_under(&tmp).is_empty(), "{:?}", mounts_under(&tmp));
            assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
        }
    }
    // What the SIGKILLed run left (its directory, as root its mount) goes
    // with the next run.
    let o = run(
        &d,
        &[
            "bench",
            "restore",
            "--size",
            "16777216",
            "--working-set",
            "10",
            "--pattern",
            "sweep",
            "--reps",
            "1",
            "--cache",
            "warm",
            "--configs",
            "kernel,baseline,on-demand",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(mounts_under(&tmp).is_empty(), "{:?}", mounts_under(&tmp));
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
    // Put back the pool the SIGKILLed bench grew, unless something else
    // changed it since (other tests grow and shrink it too).
    if let (Some(before), Some(grown)) = pool {
        if before != grown && nr_hugepages().as_deref() == Some(grown.as_str()) {
            let _ = std::fs::write("/proc/sys/vm/nr_hugepages", before.trim());
        }
    }
}
