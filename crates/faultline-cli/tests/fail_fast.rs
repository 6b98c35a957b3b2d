//! The CLI fails fast and talks: the `faultline` binary run as a user
//! would, with stderr piped (not a terminal), each run under a deadline.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{finish, spawn, Out};

/// Runs `faultline args...` in `dir`, killing it after `timeout`.
fn faultline(dir: &Path, args: &[&str], timeout: Duration) -> Out {
    finish(spawn(dir, args), timeout, &format!("faultline {args:?}"))
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("faultline-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const QUICK: Duration = Duration::from_secs(20);

#[test]
fn graph_gen_refuses_what_it_cannot_hold_and_leaves_no_file() {
    let d = tempdir("gen40");
    let o = faultline(&d, &["graph", "gen", "--scale", "40", "-o", "g.bin"], QUICK);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr.contains("--scale 40")
            && o.stderr.contains("needs about")
            && o.stderr.contains("available"),
        "the size it needs against what there is: {}",
        o.stderr
    );
    let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
    assert!(left.is_empty(), "no output file left behind: {left:?}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn graph_gen_talks_per_step_when_piped_and_renames_on_success() {
    let d = tempdir("gen10");
    let o = faultline(
        &d,
        &["graph", "gen", "--scale", "10", "--no-sync", "-o", "g.bin"],
        QUICK,
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    for step in [
        "graph gen: counting degrees",
        "graph gen: filling chunk 1/1",
        "graph gen: writing chunk 1/1",
    ] {
        assert!(o.stderr.contains(step), "missing {step:?}: {}", o.stderr);
    }
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["g.bin"], "the file, and no temporary left");
    // And a BFS over it says which run it is on.
    let o = faultline(&d, &["bfs", "g.bin", "--reps", "2"], QUICK);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains("bfs: mmap run 1/2") && o.stderr.contains("bfs: mmap run 2/2"),
        "{}",
        o.stderr
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn output_paths_are_checked_before_any_work() {
    let d = tempdir("paths");
    std::fs::write(d.join("afile"), b"x").unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["bench", "--json", "afile/out.json", "notify"],
            "afile is not a directory",
        ),
        (&["bench", "--plot", "afile", "notify"], "--plot afile"),
        (&["bench", "--json", ".", "notify"], "is a directory"),
    ];
    for (args, want) in cases {
        let o = faultline(&d, args, QUICK);
        assert_eq!(o.code, Some(1), "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(want), "{args:?}: {}", o.stderr);
        assert!(
            !o.stdout.contains("machine:"),
            "{args:?} started working: {}",
            o.stdout
        );
    }
    let o = faultline(&d, &["bfs", "nograph.bin", "--json", "afile/x.json"], QUICK);
    assert!(
        o.stderr.contains("--json afile/x.json"),
        "checked before loading: {}",
        o.stderr
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn nonsense_values_are_refused_with_a_message() {
    let d = tempdir("values");
    let cases: [(&[&str], &str); 8] = [
        (&["bench", "latency", "-n", "0"], "must be from 100 to"),
        (&["bench", "latency", "-n", "50"], "must be from 100 to"),
        (&["bench", "seq", "--reps", "0"], "must be from 1 to 1000"),
        (
            &["bench", "kernel", "--threads", "1,0"],
            "must be from 1 to",
        ),
        (
            &["graph", "gen", "--threads", "0", "-o", "g.bin"],
            "must be from 1 to",
        ),
        (
            &["graph", "gen", "--mem-limit", "10K", "-o", "g.bin"],
            "must be from 1048576 to",
        ),
        (&["bfs", "g.bin", "--budget", "1"], "give a unit"),
        (&["bfs", "g.bin", "--reps", "0"], "must be from 1 to 1000"),
    ];
    for (args, want) in cases {
        let o = faultline(&d, args, QUICK);
        assert_ne!(o.code, Some(0), "{args:?} accepted");
        assert!(o.stderr.contains(want), "{args:?}: {}", o.stderr);
    }
    assert!(
        std::fs::read_dir(&d).unwrap().next().is_none(),
        "nothing written"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn each_cause_is_printed_once() {
    let d = tempdir("cause");
    let o = faultline(&d, &["bfs", "missing.bin"], QUICK);
    assert_eq!(o.code, Some(1));
    assert_eq!(
        o.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        o.stderr
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bench_rows_are_reported_on_piped_stderr() {
    let d = tempdir("notify");
    let o = faultline(
        &d,
        &[
            "bench",
            "notify",
            "-n",
            "200",
            "--warmup",
            "10",
            "--mechanisms",
            "futex,eventfd",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains("notify: [1/2] futex") && o.stderr.contains("notify: [2/2] eventfd"),
        "{}",
        o.stderr
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bench_refuses_an_output_given_twice_before_it_runs() {
    // --json is global: before and after the sub-bench both parse; the
    // second took the first's place silently.
    let d = tempdir("json-twice");
    let o = faultline(
        &d,
        &["bench", "--json", "a.json", "notify", "--json", "b.json"],
        QUICK,
    );
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(
        o.stderr.contains("--json given 2 times (a.json, b.json)"),
        "{}",
        o.stderr
    );
    let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
    assert!(left.is_empty(), "nothing ran: {left:?}");
    std::fs::remove_dir_all(&d).unwrap();
}
