//! UMap programs on libumap: compiled with `pkg-config --cflags --libs umap`
//! (C with gcc, C++ with g++) and run, each mode in its own process (the
//! `UMAP_*` variables are read once per process).

#[path = "../../faultline-capi/tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use support::*;

const LIMIT: Duration = Duration::from_secs(60);

struct Programs {
    c: PathBuf,
    cxx: PathBuf,
}

fn programs() -> Option<&'static Programs> {
    static P: OnceLock<Option<Programs>> = OnceLock::new();
    P.get_or_init(|| match toolchain() {
        Ok(()) => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c");
            Some(Programs {
                c: compile(
                    prefix(),
                    "umap_test",
                    &[dir.join("umap_test.c")],
                    "umap",
                    false,
                    &[],
                ),
                cxx: compile(
                    prefix(),
                    "umap_store",
                    &[dir.join("umap_store.cpp")],
                    "umap",
                    true,
                    &[],
                ),
            })
        }
        Err(why) => {
            eprintln!("skipping: {why}");
            None
        }
    })
    .as_ref()
}

fn tmp() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = fresh_dir("umap");
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .clone()
}

/// Runs the C program's `config` mode on a fresh 256-page file with `env`
/// and returns its `key value` lines.
fn config_run(name: &str, env: &[(&str, &str)]) -> (HashMap<String, String>, String) {
    config_run_on(name, env, 256)
}

/// [`config_run`] on a file of `pages` system pages.
fn config_run_on(
    name: &str,
    env: &[(&str, &str)],
    pages: usize,
) -> (HashMap<String, String>, String) {
    let p = programs().unwrap();
    let f = pattern_file(&tmp(), &format!("{name}.bin"), pages);
    let out = run(&p.c, &["config", f.to_str().unwrap()], env, LIMIT);
    assert_ok(&out, "config");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let kv = stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (kv, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn num(kv: &HashMap<String, String>, k: &str) -> u64 {
    kv.get(k)
        .unwrap_or_else(|| panic!("no {k} in {kv:?}"))
        .parse()
        .unwrap()
}

#[test]
fn umap_of_a_file_reads_back_byte_for_byte() {
    let Some(p) = programs() else { return };
    let f = pattern_file(&tmp(), "readback.bin", 300);
    assert_ok(
        &run(&p.c, &["readback", f.to_str().unwrap()], &[], LIMIT),
        "readback",
    );
    // Bigger pages and a small buffer still read back exactly.
    let env = [("UMAP_PAGESIZE", "16384"), ("UMAP_BUFSIZE", "8")];
    let f = pattern_file(&tmp(), "readback16k.bin", 512);
    assert_ok(
        &run(&p.c, &["readback", f.to_str().unwrap()], &env, LIMIT),
        "readback",
    );
}

#[test]
fn writes_reach_the_file_after_flush_and_uunmap() {
    let Some(p) = programs() else { return };
    let f = pattern_file(&tmp(), "writeback.bin", 64);
    assert_ok(
        &run(&p.c, &["writeback", f.to_str().unwrap()], &[], LIMIT),
        "writeback",
    );
    let f = pattern_file(&tmp(), "writeback-small.bin", 64);
    let env = [("UMAP_BUFSIZE", "4"), ("UMAP_PAGE_FILLERS", "2")];
    assert_ok(
        &run(&p.c, &["writeback", f.to_str().unwrap()], &env, LIMIT),
        "writeback",
    );
}

#[test]
fn defaults_are_umaps() {
    if programs().is_none() {
        return;
    }
    let (kv, stderr) = config_run("defaults", &[]);
    assert_eq!(num(&kv, "page_size"), 4096);
    assert_eq!(num(&kv, "high"), 90);
    assert_eq!(num(&kv, "low"), 70);
    assert_eq!(num(&kv, "read_ahead"), 0);
    assert_eq!(num(&kv, "max_fault_events"), 256);
    assert_eq!(num(&kv, "system_page"), 4096);
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(num(&kv, "fillers"), cpus);
    assert_eq!(num(&kv, "evictors"), cpus);
    assert!(
        num(&kv, "buf_pages") > 1000,
        "90% of available memory: {kv:?}"
    );
    // Default log level: errors only, so nothing on stderr.
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(
        num(&kv, "sum"),
        (0..256u64).map(|p| (p * 4096 * 7 + p) as u8 as u64).sum()
    );
}

#[test]
fn page_size_and_read_ahead_set_what_one_fault_installs() {
    if programs().is_none() {
        return;
    }
    let (kv, _) = config_run(
        "ps16k",
        &[("UMAP_PAGESIZE", "16384"), ("UMAP_READ_AHEAD", "0")],
    );
    assert_eq!(num(&kv, "page_size"), 16384);
    assert_eq!(
        num(&kv, "resident_after_one_fault"),
        4,
        "one 16 KiB page: {kv:?}"
    );
    let (kv, _) = config_run("ra0", &[("UMAP_READ_AHEAD", "0")]);
    assert_eq!(num(&kv, "resident_after_one_fault"), 1, "{kv:?}");
    let (kv, _) = config_run("ra7", &[("UMAP_READ_AHEAD", "7")]);
    assert_eq!(num(&kv, "read_ahead"), 7);
    assert_eq!(num(&kv, "resident_after_one_fault"), 8, "{kv:?}");
}

/// A `UMAP_PAGESIZE` that is a multiple of the system page but not a power
/// of two (UMap accepts those): a UMap page of 12 KiB is three 4 KiB
/// region pages that one fault installs together, read-ahead counts in
/// UMap pages, and `UMAP_BUFSIZE` counts UMap pages. A size that is not a
/// multiple of the system page is refused.
#[test]
fn a_page_size_that_is_not_a_power_of_two_groups_system_pages() {
    if programs().is_none() {
        return;
    }
    // 255 system pages: 85 UMap pages of 12 KiB.
    let sum: u64 = (0..255u64).map(|p| (p * 4096 * 7 + p) as u8 as u64).sum();
    let ps = ("UMAP_PAGESIZE", "12288");
    let (kv, _) = config_run_on("ps12k", &[ps, ("UMAP_READ_AHEAD", "0")], 255);
    assert_eq!(num(&kv, "page_size"), 12288);
    assert_eq!(num(&kv, "resident_after_one_fault"), 3, "{kv:?}");
    assert_eq!(num(&kv, "sum"), sum);
    let (kv, _) = config_run_on("ps12k_ra1", &[ps, ("UMAP_READ_AHEAD", "1")], 255);
    assert_eq!(num(&kv, "resident_after_one_fault"), 6, "{kv:?}");
    // Unset read-ahead: adaptive, in whole UMap pages.
    let (kv, _) = config_run_on("ps12k_adaptive", &[ps], 255);
    assert_eq!(num(&kv, "resident_after_one_fault"), 3, "{kv:?}");
    assert_eq!(num(&kv, "sum"), sum);
    // A buffer of 8 UMap pages at HIGH 90: 7 UMap pages, 21 system pages.
    let (kv, _) = config_run_on(
        "ps12k_buf8",
        &[ps, ("UMAP_BUFSIZE", "8"), ("UMAP_READ_AHEAD", "0")],
        255,
    );
    let r = num(&kv, "resident_after_sweep");
    assert!((3..=21).contains(&r), "budget 21 system pages: {kv:?}");
    assert_eq!(num(&kv, "sum"), sum);
    // umap_prefetch installs the whole UMap page holding the address.
    let f = pattern_file(&tmp(), "ps12k_prefetch.bin", 255);
    let out = run(
        &programs().unwrap().c,
        &["prefetch", f.to_str().unwrap()],
        &[ps, ("UMAP_READ_AHEAD", "0")],
        LIMIT,
    );
    assert_ok(&out, "prefetch");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("resident_after_prefetch 3\n"), "{stdout}");
    let (kv, _) = config_run("ps6000", &[("UMAP_PAGESIZE", "6000")]);
    assert_eq!(num(&kv, "umap_errno"), 22);
}

#[test]
fn bufsize_and_high_water_bound_the_resident_pages() {
    if programs().is_none() {
        return;
    }
    // 256 pages swept; the buffer holds BUFSIZE * HIGH / 100.
    let (kv, _) = config_run("buf32", &[("UMAP_BUFSIZE", "32"), ("UMAP_READ_AHEAD", "0")]);
    assert_eq!(num(&kv, "buf_pages"), 32);
    let r90 = num(&kv, "resident_after_sweep");
    assert!(
        (17..=28).contains(&r90),
        "budget 28 (more than the 16 of HIGH=50 below): {kv:?}"
    );
    let (kv, _) = config_run(
        "buf32h50",
        &[
            ("UMAP_BUFSIZE", "32"),
            ("UMAP_EVICT_HIGH_WATER_THRESHOLD", "50"),
            ("UMAP_EVICT_LOW_WATER_THRESHOLD", "25"),
            ("UMAP_READ_AHEAD", "0"),
        ],
    );
    assert_eq!((num(&kv, "high"), num(&kv, "low")), (50, 25));
    assert!(num(&kv, "resident_after_sweep") <= 16, "budget 16: {kv:?}");
    // LOW above HIGH is refused.
    let (kv, _) = config_run(
        "lowhigh",
        &[
            ("UMAP_EVICT_HIGH_WATER_THRESHOLD", "50"),
            ("UMAP_EVICT_LOW_WATER_THRESHOLD", "60"),
        ],
    );
    assert_eq!(num(&kv, "umap_errno"), 22);
}

#[test]
fn fillers_are_handler_threads_and_the_rest_is_reported() {
    if programs().is_none() {
        return;
    }
    // Unset: the signal engine, no filler threads (only the evictor).
    let (unset, _) = config_run("fillers-unset", &[]);
    let (three, _) = config_run(
        "fillers3",
        &[
            ("UMAP_PAGE_FILLERS", "3"),
            ("UMAP_PAGE_EVICTORS", "5"),
            ("UMAP_MAX_FAULT_EVENTS", "32"),
        ],
    );
    assert_eq!(num(&three, "fillers"), 3);
    assert_eq!(num(&three, "evictors"), 5);
    assert_eq!(num(&three, "max_fault_events"), 32);
    assert_eq!(
        num(&three, "threads_added"),
        num(&unset, "threads_added") + 3,
        "unset {unset:?} vs 3 fillers {three:?}"
    );
}

#[test]
fn log_level_controls_what_is_printed() {
    if programs().is_none() {
        return;
    }
    let (_, debug) = config_run("log-debug", &[("UMAP_LOG_LEVEL", "DEBUG")]);
    assert!(debug.contains("[umap DEBUG] umap("), "{debug}");
    assert!(
        debug.contains("[umap INFO] umap config: page size 4096"),
        "{debug}"
    );
    let (_, info) = config_run("log-info", &[("UMAP_LOG_LEVEL", "INFO")]);
    assert!(
        info.contains("[umap INFO]") && !info.contains("DEBUG"),
        "{info}"
    );
    let (kv, _) = config_run("log-bad", &[("UMAP_LOG_LEVEL", "LOUD")]);
    assert_eq!(num(&kv, "umap_errno"), 22);
}

#[test]
fn bad_inputs_fail_with_umap_failed_and_errno() {
    let Some(p) = programs() else { return };
    let f = pattern_file(&tmp(), "bad.bin", 64);
    assert_ok(
        &run(&p.c, &["bad-inputs", f.to_str().unwrap()], &[], LIMIT),
        "bad-inputs",
    );
}

#[test]
fn many_threads_fault_at_once() {
    let Some(p) = programs() else { return };
    let f = pattern_file(&tmp(), "threads.bin", 2048);
    for env in [
        &[][..],
        &[("UMAP_PAGE_FILLERS", "2"), ("UMAP_BUFSIZE", "256")][..],
    ] {
        assert_ok(
            &run(&p.c, &["threads", f.to_str().unwrap()], env, LIMIT),
            "threads",
        );
    }
}

/// Runs the C program's eviction `mode` on a 64-page file with
/// `UMAP_BUFSIZE`, high and low water `[buf, high, low]` and no read-ahead,
/// on the signal engine and then with 2 fillers.
fn eviction_mode(mode: &str, [buf, high, low]: [&str; 3]) {
    let Some(p) = programs() else { return };
    let f = pattern_file(&tmp(), &format!("{mode}.bin"), 64);
    let base = [
        ("UMAP_BUFSIZE", buf),
        ("UMAP_EVICT_HIGH_WATER_THRESHOLD", high),
        ("UMAP_EVICT_LOW_WATER_THRESHOLD", low),
        ("UMAP_READ_AHEAD", "0"),
    ];
    for fillers in [None, Some("2")] {
        let mut env = base.to_vec();
        env.extend(fillers.map(|n| ("UMAP_PAGE_FILLERS", n)));
        assert_ok(&run(&p.c, &[mode, f.to_str().unwrap()], &env, LIMIT), mode);
    }
}

/// `UMAP_EVICT_LOW_WATER_THRESHOLD`: past the budget the evictor stops at
/// `BUFSIZE * LOW / 100`; `umap_fetch_and_pin` pages survive a sweep that
/// evicts everything else (signal engine, then 2 fillers).
#[test]
fn low_water_mark_and_pinned_pages() {
    eviction_mode("watermarks", ["20", "80", "30"]);
}

/// `UMAP_BUFSIZE` is one buffer for every region, as in UMap: two regions
/// of 12 pages each are evicted to 16 together (each alone is under it),
/// stay within it through a sweep of both, and once one is unmapped the
/// other holds all 16.
#[test]
fn two_regions_share_one_buffer() {
    eviction_mode("buffer", ["32", "50", "50"]);
}

/// `cargo cinstall -p umap` installs libumap (versioned `.so` with its
/// SONAME, symlinks, `.a`), UMap's headers and `umap.pc`, through which the
/// C test compiles and reads a file back and the C++ store test compiles
/// and runs.
#[test]
fn cargo_cinstall_installs_libumap_its_headers_and_pc_file() {
    if programs().is_none() {
        return;
    }
    let Some(prefix) = cargo_cinstall("umap") else {
        return;
    };
    assert_installed_library(&prefix, "umap");
    let include = prefix.join("include/umap");
    let header = std::fs::read_to_string(include.join("umap.h")).unwrap();
    assert!(header.contains("uunmap"), "umap/umap.h");
    assert!(
        include.join("store/Store.hpp").exists(),
        "umap/store/Store.hpp"
    );
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let c = compile(
        &prefix,
        "umap_test",
        &[dir.join("umap_test.c")],
        "umap",
        false,
        &[],
    );
    let f = pattern_file(&tmp(), "cinstall.bin", 40);
    assert_ok(
        &run(&c, &["readback", f.to_str().unwrap()], &[], LIMIT),
        "readback",
    );
    let cxx = compile(
        &prefix,
        "umap_store",
        &[dir.join("umap_store.cpp")],
        "umap",
        true,
        &[],
    );
    assert_ok(&run(&cxx, &["custom"], &[], LIMIT), "custom");
}

#[test]
fn cpp_stores_through_umap_ex() {
    let Some(p) = programs() else { return };
    assert_ok(&run(&p.cxx, &["custom"], &[], LIMIT), "custom");
    let f = pattern_file(&tmp(), "cxxfile.bin", 32);
    assert_ok(
        &run(&p.cxx, &["file", f.to_str().unwrap()], &[], LIMIT),
        "file",
    );
}

#[test]
fn a_failing_store_is_sigbus_never_a_zero_page() {
    let Some(p) = programs() else { return };
    let out = run(&p.cxx, &["failing"], &[], LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("reading the failing page"), "{stdout}");
    assert!(!stdout.contains("read "), "a value came back: {stdout}");
    assert_eq!(out.status.signal(), Some(7), "not SIGBUS: {:?}", out.status);
}
