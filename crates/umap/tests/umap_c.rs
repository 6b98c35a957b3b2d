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
    assert!(num(&kv, "buf_pages") > 1000, "90% of free memory: {kv:?}");
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

/// UMap's marks: once a sweep of 256 pages is over and the evictor has
/// settled, the resident pages are between `BUFSIZE * LOW / 100` (where
/// it stops) and `BUFSIZE * HIGH / 100` (where it starts).
#[test]
fn high_and_low_water_marks_are_where_the_evictor_starts_and_stops() {
    if programs().is_none() {
        return;
    }
    let (kv, _) = config_run("buf32", &[("UMAP_BUFSIZE", "32"), ("UMAP_READ_AHEAD", "0")]);
    assert_eq!(num(&kv, "buf_pages"), 32);
    let r = num(&kv, "resident_after_sweep");
    assert!((22..28).contains(&r), "LOW 70% = 22, HIGH 90% = 28: {kv:?}");
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
    let r = num(&kv, "resident_after_sweep");
    assert!((8..16).contains(&r), "LOW 25% = 8, HIGH 50% = 16: {kv:?}");
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
    // Unset: the signal engine, no filler threads (only the evictors,
    // UMAP_PAGE_EVICTORS of them, at most 8).
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
        num(&unset, "threads_added"),
        num(&unset, "evictors").min(8),
        "unset: only the region's evictors {unset:?}"
    );
    // Filler threads read the region's events: its zaps go one at a time,
    // through one evictor, whatever UMAP_PAGE_EVICTORS says.
    assert_eq!(
        num(&three, "threads_added"),
        3 + 1,
        "3 fillers and 1 evictor {three:?}"
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
    // An unknown level is warned about and ignored, as UMap does.
    let (kv, stderr) = config_run("log-bad", &[("UMAP_LOG_LEVEL", "LOUD")]);
    assert!(!kv.contains_key("umap_errno"), "{kv:?}");
    assert!(
        stderr.contains("[umap WARNING] UMAP_LOG_LEVEL=\"LOUD\"")
            && !stderr.contains("[umap INFO]"),
        "{stderr}"
    );
}

/// As in UMap, a numeric variable set to 0 counts as unset: the default
/// buffer, the default thresholds (a warning says so).
#[test]
fn a_variable_set_to_zero_is_unset() {
    if programs().is_none() {
        return;
    }
    let (defaults, _) = config_run("zero-defaults", &[]);
    let (kv, stderr) = config_run(
        "zero",
        &[
            ("UMAP_BUFSIZE", "0"),
            ("UMAP_EVICT_LOW_WATER_THRESHOLD", "0"),
            ("UMAP_PAGE_FILLERS", "0"),
        ],
    );
    assert!(!kv.contains_key("umap_errno"), "{kv:?}");
    // The default buffer follows MemFree, which moves a little between
    // the two processes.
    let (a, b) = (num(&defaults, "buf_pages"), num(&kv, "buf_pages"));
    assert!(a.abs_diff(b) < a / 10 + 1000, "{a} vs {b}");
    assert_eq!(num(&kv, "low"), 70);
    assert_eq!(num(&kv, "fillers"), num(&defaults, "fillers"));
    assert!(
        stderr.contains("UMAP_BUFSIZE=\"0\" is treated as unset"),
        "{stderr}"
    );
    // What UMap's `stringstream >> uint64_t` reads: no digit is 0 (unset),
    // the leading digits of the rest. Every umap() failed with EINVAL.
    let (kv, stderr) = config_run(
        "not-numbers",
        &[
            ("UMAP_BUFSIZE", ""),
            ("UMAP_PAGE_FILLERS", "abc"),
            ("UMAP_PAGESIZE", "65536k"),
        ],
    );
    assert!(!kv.contains_key("umap_errno"), "{kv:?}\n{stderr}");
    assert_eq!(num(&kv, "fillers"), num(&defaults, "fillers"));
    assert_eq!(num(&kv, "page_size"), 65536, "{kv:?}");
    assert!(
        stderr.contains("UMAP_PAGE_FILLERS=\"abc\" is not a number"),
        "{stderr}"
    );
    assert!(stderr.contains("is read as 65536"), "{stderr}");
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

/// `UMAP_EVICT_LOW_WATER_THRESHOLD`: from the high-water mark on the
/// evictor evicts down to `BUFSIZE * LOW / 100`; `umap_fetch_and_pin`
/// pages survive a sweep that evicts everything else (signal engine, then
/// 2 fillers).
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
    assert!(
        include.join("store/SparseStore.h").exists(),
        "umap/store/SparseStore.h"
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

/// The file-system type of `dir`, as `stat -f` names it ("ext2/ext3" for
/// ext4, "xfs", "tmpfs").
fn fs_type(dir: &std::path::Path) -> String {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .expect("run stat -f");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An xfs file system in a loop-mounted image under `dir`, unmounted (by
/// its mount point) and removed on drop.
struct XfsMount {
    dir: PathBuf,
    mnt: PathBuf,
}

impl XfsMount {
    /// Makes and mounts it, or says why it cannot (no mkfs.xfs, not
    /// root, no loop device, no xfs in the kernel).
    fn new(dir: PathBuf) -> Result<XfsMount, String> {
        let cmd = |prog: &str, args: &[&std::ffi::OsStr]| {
            let out = std::process::Command::new(prog)
                .args(args)
                .output()
                .map_err(|e| format!("{prog}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{prog} {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let img = dir.join("xfs.img");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(320 << 20))
            .map_err(|e| e.to_string())?;
        cmd("mkfs.xfs", &["-q".as_ref(), img.as_os_str()])?;
        cmd(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                img.as_os_str(),
                mnt.as_os_str(),
            ],
        )?;
        Ok(XfsMount { dir, mnt })
    }
}

impl Drop for XfsMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the `direct` mode (a file opened `O_RDWR | O_DIRECT`, as UMap's
/// programs open theirs: read back byte for byte, written, flushed,
/// checked with `pread`) in `dir`, with both ways of reopening the file
/// and with a buffer small enough that pages are evicted and re-read.
fn direct_in(dir: &std::path::Path, what: &str) {
    let p = programs().unwrap();
    let file = dir.join("direct.bin");
    for env in [
        &[][..],
        &[("UMAP_BUFSIZE", "8")][..],
        &[("UMAP_PAGESIZE", "65536")][..],
        &[("UMAP_PAGESIZE", "65536"), ("UMAP_BUFSIZE", "2")][..],
        &[("FAULTLINE_UMAP_FILE_IO", "buffered")][..],
        &[
            ("FAULTLINE_UMAP_FILE_IO", "buffered"),
            ("UMAP_BUFSIZE", "8"),
        ][..],
        &[("FAULTLINE_UMAP_FILE_IO", "direct")][..],
        &[("FAULTLINE_UMAP_FILE_IO", "direct"), ("UMAP_BUFSIZE", "8")][..],
        &[("UMAP_PAGE_FILLERS", "2"), ("UMAP_BUFSIZE", "8")][..],
    ] {
        let out = run(&p.c, &["direct", file.to_str().unwrap()], env, LIMIT);
        assert_ok(&out, "direct");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains("skip direct"),
            "{what} refused O_DIRECT: {stdout}"
        );
        eprintln!("direct I/O descriptor on {what} with {env:?}: ok");
    }
}

/// UMap's programs open their files `O_DIRECT`: on ext4 (this test's own
/// directory on the root file system), on xfs (a loop-mounted image, when
/// mkfs.xfs and mounting are possible here; skipped with the reason
/// otherwise) and on tmpfs (/dev/shm), umap() maps such a descriptor,
/// reads it back byte for byte and writes back what was written.
#[test]
fn o_direct_descriptors_map_on_ext4_xfs_and_tmpfs() {
    if programs().is_none() {
        return;
    }
    let dir = tmp().join("direct-ext4");
    std::fs::create_dir_all(&dir).unwrap();
    let fs = fs_type(&dir);
    if fs == "ext2/ext3" {
        direct_in(&dir, "ext4");
    } else {
        eprintln!("skipping ext4: {} is on {fs}", dir.display());
    }
    match XfsMount::new(tmp().join("direct-xfs")) {
        Ok(m) => {
            assert_eq!(fs_type(&m.mnt), "xfs");
            direct_in(&m.mnt, "xfs");
        }
        Err(why) => eprintln!("skipping xfs: {why}"),
    }
    let shm = std::path::Path::new("/dev/shm").join(format!("umap-direct-{}", std::process::id()));
    if std::fs::create_dir_all(&shm).is_ok() && fs_type(&shm) == "tmpfs" {
        direct_in(&shm, "tmpfs");
    } else {
        eprintln!("skipping tmpfs: no /dev/shm");
    }
    let _ = std::fs::remove_dir_all(&shm);
}

/// UMap's SparseStore (umap/store/SparseStore.h): a region over files of
/// a fixed size in a directory, created on demand, written, unmapped and
/// read back through a store opened again read-only.
#[test]
fn sparse_store_round_trip() {
    let Some(p) = programs() else { return };
    let dir = tmp().join("sparse-store");
    let _ = std::fs::remove_dir_all(&dir);
    assert_ok(
        &run(&p.cxx, &["sparse", dir.to_str().unwrap()], &[], LIMIT),
        "sparse",
    );
    // With filler threads (the workers engine) and a small buffer.
    let _ = std::fs::remove_dir_all(&dir);
    let env = [("UMAP_PAGE_FILLERS", "2"), ("UMAP_BUFSIZE", "6")];
    assert_ok(
        &run(&p.cxx, &["sparse", dir.to_str().unwrap()], &env, LIMIT),
        "sparse",
    );
}

/// `UMAP_BUFSIZE` is a bound, as in UMap: a second thread sampling
/// `mincore` of the region throughout a shuffled write sweep and a
/// shuffled read sweep of 2,048 pages never sees more than the buffer's
/// 100 pages resident (on
/// the signal engine, where faults evict for themselves; with filler
/// threads, where they wait for the evictor; with the evictor starting
/// only when the buffer is full); every byte written reaches the file.
#[test]
fn bufsize_bounds_the_resident_pages_of_a_shuffled_sweep() {
    let Some(p) = programs() else { return };
    for env in [
        &[("UMAP_BUFSIZE", "100")][..],
        &[("UMAP_BUFSIZE", "100"), ("UMAP_PAGE_FILLERS", "2")][..],
        &[
            ("UMAP_BUFSIZE", "100"),
            ("UMAP_EVICT_HIGH_WATER_THRESHOLD", "100"),
            ("UMAP_EVICT_LOW_WATER_THRESHOLD", "100"),
        ][..],
    ] {
        let f = pattern_file(&tmp(), "bound.bin", 2048);
        let out = run(&p.c, &["bound", f.to_str().unwrap()], env, LIMIT);
        assert_ok(&out, "bound");
        eprintln!("{env:?}: {}", String::from_utf8_lossy(&out.stdout).trim());
    }
}
