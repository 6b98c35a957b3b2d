//! What a user audit of `faultline bench` found, run as the user ran it:
//! the `faultline` binary with stdout and stderr piped, each run under a
//! deadline, TMPDIR a scratch directory (so what a bench leaves behind is
//! seen). Every case failed on the code before its fix.

mod support;

use std::time::Duration;

use support::{children_of, dead_pid, refused, run_for, running, Dir, KillOnDrop, Out};

fn run(d: &Dir, args: &[&str]) -> Out {
    run_for(d, 60, args)
}

/// The records of a `--json` file.
fn records(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["records"].as_array().unwrap().clone()
}

/// A deadline shorter than the settle time: every mechanism's first wait
/// times out. That is a row saying so, never a crash (the signal
/// mechanisms' sender used to `tgkill` the receiver thread that had
/// given up and exited: ESRCH failed the bench and lost every row and the
/// JSON); and a mechanism with no sample at all fails the run, once the
/// rows and the JSON are out (it used to exit 0 with no records).
#[test]
fn notify_reports_timed_out_samples_and_fails_a_mechanism_with_none() {
    let d = Dir::new("audit-notify");
    for mechs in ["spin,signal,sigwait", "futex,eventfd"] {
        let json = d.path("n.json");
        let _ = std::fs::remove_file(&json);
        let o = run(
            &d,
            &[
                "bench",
                "notify",
                "-n",
                "5",
                "--warmup",
                "0",
                "--timeout-ms",
                "1",
                "--settle-us",
                "5000",
                "--mechanisms",
                mechs,
                "--json",
                json.to_str().unwrap(),
            ],
        );
        assert_eq!(o.code, Some(1), "{mechs}: {}{}", o.stdout, o.stderr);
        assert!(!o.stderr.contains("No such process"), "{}", o.stderr);
        let names = mechs.replace(',', ", ");
        assert!(
            o.stderr.contains(&format!("no sample of {names} arrived")),
            "{mechs}: {}",
            o.stderr
        );
        for m in mechs.split(',') {
            assert!(
                o.stdout
                    .lines()
                    .any(|l| l.starts_with(m) && l.contains("timed out at sample 1")),
                "{m}'s row: {}",
                o.stdout
            );
        }
        assert!(records(&json).is_empty(), "written, without a record");
    }
}

#[test]
fn notify_refuses_a_mechanism_named_twice() {
    let d = Dir::new("audit-notify-twice");
    let o = run(
        &d,
        &["bench", "notify", "--mechanisms", "signal,futex,signal"],
    );
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("--mechanisms: \"signal\" is named twice (entries 1 and 3)"),
        "{}",
        o.stderr
    );
    assert!(o.stdout.is_empty(), "nothing run: {}", o.stdout);
}

/// A list flag naming a value twice ran it twice (two rows, two records
/// of one name); a flag the other makes meaningless was accepted. Both
/// are refused before any work.
#[test]
fn values_named_twice_and_flags_that_conflict_are_refused() {
    let d = Dir::new("audit-twice");
    let cases: &[(&str, i32, &str)] = &[
        (
            "bench seq --engines signal,poll,signal",
            1,
            "--engines: \"signal\" is named twice (entries 1 and 3)",
        ),
        (
            "bench latency --engines poll,poll",
            1,
            "--engines: \"poll\" is named twice (entries 1 and 2)",
        ),
        (
            "bench scale --engines spin,spin",
            1,
            "--engines: \"spin\" is named twice",
        ),
        (
            "bench seq --mib 1 --depths 1,1",
            1,
            "--depths: 1 is named twice (entries 1 and 2)",
        ),
        (
            "bench scale --threads 2,1,2",
            1,
            "--threads: 2 is named twice (entries 1 and 3)",
        ),
        (
            "bench watch --no-gdb --gdb-bytes 5",
            2,
            "cannot be used with",
        ),
    ];
    for (line, code, want) in cases {
        let args: Vec<&str> = line.split(' ').collect();
        refused(&d, &args, *code, want);
    }
}

/// `--help` of the engine benches names every engine the default runs
/// (`bench seq`'s said "signal, spin, poll, workers"; per-cpu ran too).
#[test]
fn engine_benches_help_names_the_engines_they_run_by_default() {
    let d = Dir::new("audit-help");
    for bench in ["latency", "seq", "scale"] {
        let o = run(&d, &["bench", bench, "--help"]);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        // The --engines paragraph: from its flag to the next flag.
        let help = o.stdout.split("--engines").nth(1).unwrap_or("");
        let help = help.split("\n  -").next().unwrap_or("");
        for e in ["signal", "spin", "poll", "workers", "per-cpu"] {
            assert!(help.contains(e), "bench {bench} --help, --engines: {help}");
        }
    }
}

/// Values only a late part of a bench used were checked when it got
/// there: `bench vpri --b5-compare foo` ran B1, B3, B4 and B2 (minutes)
/// and then failed without its JSON; `bench store --server-cpus` naming
/// a CPU the machine lacks failed in `taskset` after redis-server had
/// started. Both are refused before any work now.
#[test]
fn late_values_are_refused_before_any_work() {
    let d = Dir::new("audit-late");
    let cases: &[(&str, i32, &str)] = &[
        (
            "bench vpri --b5-compare foo",
            2,
            "unknown reclaim model \"foo\"",
        ),
        (
            "bench vpri --b5-compare static,foo",
            2,
            "unknown reclaim model \"foo\"",
        ),
        (
            "bench vpri --b5-reclaim foo",
            2,
            "unknown reclaim model \"foo\"",
        ),
        ("bench vpri --b9-reclaim foo", 2, "possible values"),
        ("bench vpri --only b1,b6", 2, "possible values"),
        (
            "bench vpri --only b5 --b5-compare static,redraw,static",
            1,
            "--b5-compare: \"static\" is named twice (entries 1 and 3)",
        ),
        (
            "bench vpri --only b9,b9",
            1,
            "--only: \"b9\" is named twice",
        ),
        (
            "bench store --server-cpus 4096",
            1,
            "--server-cpus 4096: CPU 4096 is not one this process may run on",
        ),
        ("bench store --server-cpus 1-x", 1, "not a CPU list"),
        (
            "bench store --chunk 4096,4096",
            1,
            "--chunk: 4096 is named twice",
        ),
    ];
    for (line, code, want) in cases {
        let args: Vec<&str> = line.split(' ').collect();
        refused(&d, &args, *code, want);
    }
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
}

/// The `measured` of the record labelled `label`.
fn measured(records: &[serde_json::Value], label: &str) -> serde_json::Value {
    records
        .iter()
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no record {label}"))["measured"]
        .clone()
}

/// The `label measured=... ` line of stdout, its value.
fn printed<'a>(stdout: &'a str, label: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(label) && l[label.len()..].starts_with(' '))
        .and_then(|l| l.split("measured=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_else(|| panic!("no line {label}: {stdout}"))
}

/// A ratio whose denominator is 0 was shown as a result: B9 with 2 VMs
/// (no block device) printed a block I/O-fault reduction of 100% and a
/// p99/avg of 0.00x; B5 a 100% reduction of "0 -> 0" I/O faults; B2
/// without a single I/O ratios of 0.00 and a round "< 1.5x" (a target
/// met without data). Each is `-` now, and null in the JSON.
#[test]
fn ratios_of_nothing_are_no_results() {
    let d = Dir::new("audit-ratios");
    let json = d.path("v.json");
    let j = json.to_str().unwrap();

    let o = run(
        &d,
        &[
            "bench", "vpri", "--only", "b9", "--b9-vms", "2", "--json", j,
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let r = records(&json);
    for label in [
        "fig7.block.p99_over_avg",
        "fig7.block.iopf_per_device_day.avg",
        "fig18.adp.block.iopf_reduction_pct",
        "fig18.adp_derived.block.iopf_reduction_pct",
    ] {
        assert_eq!(printed(&o.stdout, label), "-", "{label}: {}", o.stdout);
        assert!(measured(&r, label).is_null(), "{label}");
    }
    // The NIC devices had days: those are numbers.
    assert!(measured(&r, "fig7.nic.iopf_per_device_day.avg").is_number());

    let o = run(
        &d,
        &["bench", "vpri", "--only", "b5", "--b5-compare", "none"],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // B5's rows: r, policy, class, IOPF none, IOPF, reduction %, pinned, RPR, ...
    let rows: Vec<Vec<&str>> = o
        .stdout
        .lines()
        .filter(|l| l.ends_with(']') && l.contains('%'))
        .map(|l| l.split_whitespace().collect())
        .filter(|c: &Vec<&str>| c.len() > 7 && (c[2] == "nic" || c[2] == "block"))
        .collect();
    assert!(!rows.is_empty(), "B5's table: {}", o.stdout);
    let nothing: Vec<_> = rows.iter().filter(|c| c[3] == "0").collect();
    assert!(
        !nothing.is_empty(),
        "a round with no I/O faults without pinning (r=10%, NIC)"
    );
    for c in nothing {
        assert_eq!((c[5], c[7]), ("-", "-"), "no reduction of nothing: {c:?}");
    }

    let o = run(
        &d,
        &[
            "bench",
            "vpri",
            "--only",
            "b2",
            "--b2-reps",
            "1",
            "--b2-secs",
            "1e-12",
            "--json",
            j,
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let r = records(&json);
    for label in [
        "fig6.blocking.p999_ratio_vs_no_iopf",
        "fig6.vpri_unordered.p999_ratio_vs_no_iopf",
    ] {
        assert_eq!(printed(&o.stdout, label), "-", "{label}: {}", o.stdout);
        assert!(measured(&r, label).is_null(), "{label}");
    }
    assert!(
        !o.stdout.contains("1/1") && o.stdout.contains("0/1 (1 without data)"),
        "no round without data meets a target: {}",
        o.stdout
    );
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
}

/// Polls `ready` every 10 ms until it holds or `secs` pass.
fn wait_for(secs: u64, what: &str, mut ready: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    while !ready() {
        assert!(
            std::time::Instant::now() < end,
            "{what}: not after {secs} s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `args` in `d` (TMPDIR its `tmp/`), waits for `ready(pid)`,
/// sends SIGINT by pid, and returns once the bench has ended (its exit
/// status) with what `ready` returned.
fn interrupt<T>(
    d: &Dir,
    args: &[&str],
    secs: u64,
    mut ready: impl FnMut(u32) -> Option<T>,
) -> (std::process::ExitStatus, T) {
    let tmp = d.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let log = std::fs::File::create(d.path("bench.log")).unwrap();
    // Output to a file, not a pipe nobody reads once the test waits.
    let mut child = std::process::Command::new(support::bin())
        .args(args)
        .current_dir(&d.0)
        .env("TMPDIR", &tmp)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let _bench = KillOnDrop(vec![pid]);
    let mut got = None;
    wait_for(secs, &format!("{args:?} getting ready"), || {
        got = ready(pid);
        got.is_some() || child.try_wait().unwrap().is_some()
    });
    let got = got.unwrap_or_else(|| {
        panic!(
            "{args:?} ended first: {}",
            std::fs::read_to_string(d.path("bench.log")).unwrap_or_default()
        )
    });
    support::signal(&child, "INT");
    let mut status = None;
    wait_for(20, &format!("{args:?} ending on SIGINT"), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    (status.unwrap(), got)
}

/// SIGINT in `bench watch`'s GDB phase left gdb and the program it
/// traced running (orphans) and the directory of the compiled program
/// behind, which no later run removed. The bench's children are its own
/// now (killed by pid), its directory a cleanup temporary, and a killed
/// run's directory goes with the next run.
#[test]
fn an_interrupted_bench_watch_leaves_no_gdb_and_no_directory() {
    if std::process::Command::new("gdb")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no gdb");
        return;
    }
    let d = Dir::new("audit-watch");
    let tmp = d.path("tmp");
    let (status, (gdb, traced)) = interrupt(
        &d,
        &[
            "bench",
            "watch",
            "--tables",
            "4.6",
            "--reps",
            "3",
            "--gdb-bytes",
            "20000",
        ],
        180,
        |pid| {
            // gdb running a software-watchpoint run (seconds long: it
            // single-steps the program), and the program under it.
            let gdb = children_of(pid).into_iter().find(|&k| {
                let comm = std::fs::read_to_string(format!("/proc/{k}/comm"));
                let cmd = std::fs::read(format!("/proc/{k}/cmdline"));
                comm.is_ok_and(|c| c.trim() == "gdb")
                    && cmd.is_ok_and(|c| String::from_utf8_lossy(&c).contains("/sw-"))
            })?;
            let traced = children_of(gdb);
            (!traced.is_empty()).then_some((gdb, traced))
        },
    );
    let mut all = traced.clone();
    all.push(gdb);
    let _kids = KillOnDrop(all.clone());
    // Ended by the signal; or, when the main thread trips over a
    // temporary the signal thread has just removed, by that error (exit
    // 1): either way not a success.
    assert!(!status.success(), "ended by the signal: {status}");
    // Killed with the bench, not left to finish their run.
    wait_for(
        2,
        &format!("gdb {gdb} and its program {traced:?} ending"),
        || !all.iter().any(|&p| running(p)),
    );
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));

    // What a SIGKILLed run left (no handler runs) goes with the next run.
    let left = tmp.join(format!("faultline-watchbench-{}-0", dead_pid()));
    std::fs::create_dir(&left).unwrap();
    std::fs::write(left.join("gdbtarget"), b"left by a killed run").unwrap();
    let o = run_for(
        &d,
        120,
        &[
            "bench", "watch", "--tables", "4.1", "--reps", "1", "--events", "100",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
}

/// SIGINT in `bench vpri`'s B2 left its 64 MiB disk image in
/// `$TMPDIR/faultline-b2-PID` (and B3's and B8's directories were no
/// better off). Each is a cleanup temporary now; a killed run's goes
/// with the next run.
#[test]
fn an_interrupted_bench_vpri_leaves_no_disk_image() {
    let d = Dir::new("audit-vpri");
    let tmp = d.path("tmp");
    let (status, ()) = interrupt(
        &d,
        &[
            "bench",
            "vpri",
            "--only",
            "b2,b3",
            "--b3-packets",
            "2000",
            "--b2-reps",
            "100",
        ],
        120,
        |_| {
            let img = std::fs::read_dir(&tmp)
                .unwrap()
                .flatten()
                .find(|e| e.file_name().to_string_lossy().starts_with("faultline-b2-"))?
                .path()
                .join("disk.img");
            (std::fs::metadata(img).ok()?.len() == 64 << 20).then_some(())
        },
    );
    let log = std::fs::read_to_string(d.path("bench.log")).unwrap_or_default();
    // See the watch case.
    assert!(!status.success(), "ended by the signal: {status}: {log}");
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));

    let dead = dead_pid();
    for part in ["b2", "b3"] {
        let left = tmp.join(format!("faultline-{part}-{dead}"));
        std::fs::create_dir(&left).unwrap();
        std::fs::write(left.join("disk.img"), b"left by a killed run").unwrap();
    }
    let o = run(
        &d,
        &[
            "bench",
            "vpri",
            "--only",
            "b2,b3",
            "--b3-packets",
            "100",
            "--b2-reps",
            "1",
            "--b2-secs",
            "0.01",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(d.names("tmp").is_empty(), "{:?}", d.names("tmp"));
}

/// `bench offload --plot DIR` made the directory and drew nothing: it
/// draws the latency it measures now, mean and p99 per workload and
/// configuration.
#[test]
fn bench_offload_draws_its_figures() {
    let d = Dir::new("audit-offload");
    let o = run(
        &d,
        &[
            "bench", "offload", "--mib", "4", "--pool", "1024", "--plot", "figs",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let names = d.names("figs");
    for f in [
        "offload_mean.png",
        "offload_mean.svg",
        "offload_p99.png",
        "offload_p99.svg",
    ] {
        assert!(names.iter().any(|n| n == f), "{f} in {names:?}");
        let len = std::fs::metadata(d.path("figs").join(f)).unwrap().len();
        assert!(len > 1000, "{f}: {len} bytes");
    }
    assert!(o.stdout.contains("offload_mean"), "listed: {}", o.stdout);
}
