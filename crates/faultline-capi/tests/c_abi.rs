//! libfaultline from C and C++: install into a temporary prefix, compile
//! `tests/c/fl_test.c` with `pkg-config --cflags --libs faultline`, run each
//! mode. Crashing modes (a store that fails) run in their own process.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use support::*;

const LIMIT: Duration = Duration::from_secs(60);

fn program() -> Option<&'static PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| match toolchain() {
        Ok(()) => {
            let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/fl_test.c");
            Some(compile(
                prefix(),
                "fl_test",
                &[src],
                "faultline",
                false,
                &[],
            ))
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
        let d = fresh_dir("c-abi");
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .clone()
}

#[test]
fn pkg_config_names_the_library_and_header() {
    if program().is_none() {
        return;
    }
    let libs = pkg_config(&["--libs", "faultline"]).join(" ");
    assert!(libs.contains("-lfaultline"), "{libs}");
    let header = prefix().join("include/faultline/faultline.h");
    assert!(header.exists());
    // The installed shared library carries the SONAME.
    let so = std::fs::read(prefix().join("lib/libfaultline.so")).unwrap();
    assert!(so.windows(17).any(|w| w == b"libfaultline.so.0"));
    // The header compiles as C++ too, and the static library links.
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/fl_test.c");
    let cxx_check = prefix().join("header_check.cpp");
    std::fs::write(
        &cxx_check,
        "#include <faultline/faultline.h>\nint main() { fl_region_stats s{}; return (int)s.faults + (fl_version() == nullptr); }\n",
    )
    .unwrap();
    let exe = compile(
        prefix(),
        "header_check",
        &[cxx_check],
        "faultline",
        true,
        &[],
    );
    assert!(run(exe.as_path(), &[], &[], LIMIT).status.success());
    let out = prefix().join("bin/fl_test_static");
    let status = std::process::Command::new("gcc")
        .args(["-std=c11", "-D_GNU_SOURCE", "-O1"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .args(pkg_config(&["--cflags", "faultline"]))
        .arg(prefix().join("lib/libfaultline.a"))
        .args(
            pkg_config(&["--libs-only-l", "--static", "faultline"])
                .iter()
                .filter(|f| *f != "-lfaultline"),
        )
        .status()
        .unwrap();
    assert!(status.success(), "static link failed");
    let o = run(&out, &["version"], &[], LIMIT);
    assert_ok(&o, "version");
}

/// The documented install path, `cargo cinstall` (cargo-c >= 0.10, which
/// `scripts/setup.sh` installs): the versioned shared library with its
/// SONAME and symlinks, the static library, the header and `faultline.pc`,
/// through which a C program compiles, links and runs. Builds in its own
/// target directory (this `cargo test` holds the workspace's), reused by
/// later runs: about 35 s the first time, seconds after.
#[test]
fn cargo_cinstall_installs_the_library_header_and_pc_file() {
    if program().is_none() {
        return;
    }
    let Some(prefix) = cargo_cinstall("faultline-capi") else {
        return;
    };
    assert_installed_library(&prefix, "faultline");
    let header = std::fs::read_to_string(prefix.join("include/faultline/faultline.h")).unwrap();
    assert!(header.contains("fl_region_new"), "header");
    // A C program through this prefix's faultline.pc.
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/fl_test.c");
    let exe = compile(&prefix, "fl_test", &[src], "faultline", false, &[]);
    assert_ok(&run(&exe, &["version"], &[], LIMIT), "version");
    let f = pattern_file(&tmp(), "cinstall.bin", 40);
    assert_ok(
        &run(&exe, &["readback", f.to_str().unwrap()], &[], LIMIT),
        "readback",
    );
}

#[test]
fn file_is_read_back_byte_for_byte() {
    let Some(exe) = program() else { return };
    let f = pattern_file(&tmp(), "readback.bin", 300);
    assert_ok(
        &run(exe, &["readback", f.to_str().unwrap()], &[], LIMIT),
        "readback",
    );
}

#[test]
fn writes_reach_the_file_after_flush_and_free() {
    let Some(exe) = program() else { return };
    let f = pattern_file(&tmp(), "writeback.bin", 64);
    assert_ok(
        &run(exe, &["writeback", f.to_str().unwrap()], &[], LIMIT),
        "writeback",
    );
}

#[test]
fn callback_store_fills_writes_back_and_is_destroyed_once() {
    let Some(exe) = program() else { return };
    assert_ok(&run(exe, &["callbacks"], &[], LIMIT), "callbacks");
}

#[test]
fn bad_inputs_return_the_documented_errno() {
    let Some(exe) = program() else { return };
    assert_ok(&run(exe, &["bad-inputs"], &[], LIMIT), "bad-inputs");
}

#[test]
fn a_failing_store_is_sigbus_never_a_zero_page() {
    let Some(exe) = program() else { return };
    for engine in ["signal", "poll"] {
        let out = run(exe, &["failing-store", engine], &[], LIMIT);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("reading the failing page"),
            "{engine}: {stdout}"
        );
        assert!(
            !stdout.contains("read "),
            "{engine}: a value came back: {stdout}"
        );
        assert_eq!(
            out.status.signal(),
            Some(7),
            "{engine}: not SIGBUS: {:?}",
            out.status
        );
    }
}

#[test]
fn many_threads_fault_at_once() {
    let Some(exe) = program() else { return };
    for engine in ["signal", "workers", "per-cpu"] {
        assert_ok(&run(exe, &["threads", engine], &[], LIMIT), "threads");
    }
}
