//! What `faultline bench` writes and reports, run as a user would: its
//! outputs never replace each other nor a user's file, conflicts are
//! refused before any work, and what it reports is true.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{finish, spawn, Out};

/// Runs `faultline args...` in `dir`, killing it after `timeout`.
fn faultline(dir: &Path, args: &[&str], timeout: Duration) -> Out {
    finish(spawn(dir, args), timeout, &format!("faultline {args:?}"))
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!(
            "faultline-bench-outputs-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }

    /// The names in `sub` (`""`: the directory itself), sorted.
    fn names(&self, sub: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.0.join(sub))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const QUICK: Duration = Duration::from_secs(60);

/// A notify run of a few hundred microseconds of work (what an old build
/// would run before failing at the end).
const NOTIFY: [&str; 6] = ["notify", "-n", "10", "--warmup", "0", "--settle-us"];

fn notify_with(outputs: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["bench"].iter().map(|s| s.to_string()).collect();
    v.extend(outputs.iter().map(|s| s.to_string()));
    v.extend(NOTIFY.iter().map(|s| s.to_string()));
    v.push("0".into());
    v.extend(["--mechanisms", "futex"].map(String::from));
    v
}

/// `--json` where `--plot` writes (its directory, or a file in it, even
/// one named as a figure), or a path ending in `/`, is refused before any
/// work: before, the JSON replaced a figure the summary still listed, or
/// the run failed only at its end ("is a directory", a failed rename).
#[test]
fn output_conflicts_are_refused_before_any_work() {
    let d = Scratch::new("conflicts");
    std::fs::create_dir(d.path("figs")).unwrap();
    let cases: [(&[&str], i32, &str); 5] = [
        (
            &["--json", "p2/notify_latency.png", "--plot", "p2"],
            2,
            "is in the directory of --plot p2",
        ),
        (
            &["--json", "figs/out.json", "--plot", "./figs"],
            2,
            "is in the directory of --plot ./figs",
        ),
        (
            &["--json", "same", "--plot", "same"],
            2,
            "the same path as --plot same",
        ),
        (&["--json", "x.json/"], 1, "names a directory"),
        (&["--json", "x.json/."], 1, "names a directory"),
    ];
    for (outputs, code, want) in cases {
        let args = notify_with(outputs);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = faultline(&d.0, &args, QUICK);
        assert_eq!(o.code, Some(code), "{outputs:?}: {}", o.stderr);
        assert!(o.stderr.contains(want), "{outputs:?}: {}", o.stderr);
        assert!(
            !o.stdout.contains("machine:"),
            "{outputs:?} started working: {}",
            o.stdout
        );
        assert_eq!(d.names(""), ["figs"], "{outputs:?}: nothing made");
        assert!(d.names("figs").is_empty(), "{outputs:?}");
    }
    // Beside the figures' directory is fine.
    let args = notify_with(&["--json", "out.json", "--plot", "figs"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = faultline(&d.0, &args, QUICK);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(d.path("out.json").is_file());
}

/// Every bench run ends with a line of the machine's load averages, at
/// the start and at the end, and its CPUs; the JSON's machine block has
/// them.
#[test]
fn every_run_reports_the_machine_load() {
    let d = Scratch::new("load");
    let args = notify_with(&["--json", "out.json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = faultline(&d.0, &args, QUICK);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("load average (1/5/15 min): "))
        .unwrap_or_else(|| panic!("no load line: {}", o.stdout));
    assert!(
        line.contains(" at the start, ")
            && line.contains(" at the end; ")
            && line.ends_with("CPUs online"),
        "{line}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path("out.json")).unwrap()).unwrap();
    let m = &v["machine"];
    for field in ["loadavg_start", "loadavg_end"] {
        assert_eq!(m[field].as_array().map(Vec::len), Some(3), "{field}: {m}");
    }
    assert!(m["online_cpus"].as_u64().is_some_and(|n| n >= 1), "{m}");
}

/// The rows of `stdout`'s table whose first cells are `lead`, split on
/// whitespace.
fn rows<'a>(stdout: &'a str, lead: &[&str]) -> Vec<Vec<&'a str>> {
    stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|r| r.len() > lead.len() && r[..lead.len()] == *lead)
        .collect()
}

fn records(path: &Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["records"].as_array().unwrap().clone()
}

/// Speedups are against one thread wherever it stands in --threads (it
/// was the first count listed: `--threads 2,1` gave 2 threads "1.00x vs 1
/// thread"), and without a 1-thread run they say what they are against.
#[test]
fn scaling_speedups_are_against_one_thread() {
    let d = Scratch::new("speedup");
    let o = faultline(
        &d.0,
        &[
            "bench",
            "scale",
            "--pages",
            "256",
            "--threads",
            "2,1",
            "--engines",
            "signal",
            "--json",
            "a.json",
        ],
        QUICK,
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let header = rows(&o.stdout, &["mechanism", "threads"]);
    assert!(
        header.iter().any(|h| h.ends_with(&["vs", "1", "thread"])),
        "{}",
        o.stdout
    );
    for mech in ["signal", "kernel-anon-write"] {
        let one = rows(&o.stdout, &[mech, "1"]);
        assert_eq!(one.len(), 1, "{}", o.stdout);
        assert_eq!(one[0].last(), Some(&"1.00x"), "{mech}: {}", o.stdout);
    }
    for r in records(&d.path("a.json")) {
        let one = r["threads"] == 1;
        let s = r["speedup_vs_1_thread"].as_f64().unwrap();
        assert_eq!(one, s == 1.0, "{r}");
    }

    // Without one thread: against the fewest, named so.
    let o = faultline(
        &d.0,
        &[
            "bench",
            "scale",
            "--pages",
            "256",
            "--threads",
            "3,2",
            "--engines",
            "signal",
            "--json",
            "b.json",
        ],
        QUICK,
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let header = rows(&o.stdout, &["mechanism", "threads"]);
    assert!(
        header.iter().any(|h| h.ends_with(&["vs", "2", "threads"])),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("vs 1 thread"), "{}", o.stdout);
    for r in records(&d.path("b.json")) {
        assert!(r.get("speedup_vs_1_thread").is_none(), "{r}");
        let s = r["speedup_vs_2_threads"].as_f64().unwrap();
        assert_eq!(r["threads"] == 2, s == 1.0, "{r}");
    }

    // bench kernel's scaling table, the same.
    let o = faultline(
        &d.0,
        &[
            "bench",
            "kernel",
            "-n",
            "100",
            "--seq-mib",
            "1",
            "--scale-pages",
            "256",
            "--threads",
            "2,1",
            "--reps",
            "1",
            "--json",
            "c.json",
        ],
        QUICK,
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let header = rows(&o.stdout, &["threads", "faults"]);
    assert!(
        header.iter().any(|h| h.ends_with(&["vs", "1", "thread"])),
        "{}",
        o.stdout
    );
    let one: Vec<_> = rows(&o.stdout, &["1"])
        .into_iter()
        .filter(|r| r.len() == 6)
        .collect();
    assert_eq!(one.len(), 1, "{}", o.stdout);
    assert_eq!(one[0].last(), Some(&"1.00x"), "{}", o.stdout);
    let scale: Vec<_> = records(&d.path("c.json"))
        .into_iter()
        .filter(|r| r["bench"] == "scale")
        .collect();
    assert_eq!(scale.len(), 2);
    for r in scale {
        let s = r["speedup_vs_1_thread"].as_f64().unwrap();
        assert_eq!(r["threads"] == 1, s == 1.0, "{r}");
    }
}

/// `bench restore --dir d` made its files in d itself: a user's `mem`,
/// `all.txt` or `ws10-clustered.txt` there was replaced without a word,
/// its memory file and a socket were left behind, and a missing d was
/// made. Now d must exist, the bench works in a new directory of its own
/// inside it, removed at the end, and nothing else in d is touched.
#[test]
fn bench_restore_touches_nothing_in_its_dir() {
    let d = Scratch::new("restore-dir");
    std::fs::create_dir(d.path("d")).unwrap();
    let mine = [
        ("mem", "precious"),
        ("all.txt", "notes"),
        ("ws10-clustered.txt", "mine"),
        ("base.sock", "not a socket"),
        ("serve.json", "{}"),
    ];
    for (name, text) in mine {
        std::fs::write(d.path("d").join(name), text).unwrap();
    }
    let o = faultline(
        &d.0,
        &[
            "bench",
            "restore",
            "--size",
            "8M",
            "--reps",
            "1",
            "--working-set",
            "10",
            "--pattern",
            "clustered",
            "--cache",
            "warm",
            "--configs",
            "kernel,baseline,on-demand",
            "--dir",
            "d",
            "--json",
            "out.json",
        ],
        Duration::from_secs(180),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    for (name, text) in mine {
        let now = std::fs::read(d.path("d").join(name)).unwrap();
        assert!(now == text.as_bytes(), "{name} was replaced");
    }
    let mut want: Vec<&str> = mine.iter().map(|m| m.0).collect();
    want.sort();
    assert_eq!(d.names("d"), want, "nothing left behind in d");
    let recs = records(&d.path("out.json"));
    assert!(recs.iter().any(|r| r["mechanism"] == "on-demand"), "ran");

    // A missing --dir is refused, not made; so is a file.
    for dir in ["nodir", "d/mem", "nodir/deeper"] {
        let o = faultline(
            &d.0,
            &[
                "bench", "restore", "--size", "8M", "--reps", "1", "--dir", dir,
            ],
            QUICK,
        );
        assert_eq!(o.code, Some(1), "--dir {dir}: {}", o.stderr);
        assert!(o.stderr.contains(&format!("--dir {dir}")), "{}", o.stderr);
    }
    assert!(!d.path("nodir").exists(), "a missing --dir was made");
    assert_eq!(
        std::fs::read_to_string(d.path("d/mem")).unwrap(),
        "precious"
    );
}
