//! Shared by the C tests of `faultline-capi` and `umap`: install the
//! libraries this `cargo test` built into a temporary prefix (through
//! `scripts/c-install.sh`, the same installer users run), compile C and C++
//! programs with `pkg-config`, and run them with a deadline.

#![allow(
    dead_code,
    reason = "each test binary that includes this module uses a different part of it"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Whether the C toolchain is there; tests skip with a reason otherwise.
pub fn toolchain() -> Result<(), String> {
    for tool in ["gcc", "g++", "pkg-config"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!(
                "{tool} is missing (bash scripts/setup.sh installs it)"
            ));
        }
    }
    Ok(())
}

/// A prefix holding the installed libraries, headers and `.pc` files,
/// made once per test binary.
pub fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        // The test binary is target/<profile>/deps/NAME; the libraries this
        // `cargo test` built are beside it (`cargo test` does not copy them
        // up to target/<profile>).
        let exe = std::env::current_exe().expect("current exe");
        let build = exe.parent().expect("deps dir");
        let prefix = fresh_dir(&format!("c-prefix-{}", env!("CARGO_CRATE_NAME")));
        let _ = std::fs::remove_dir_all(&prefix);
        let out = Command::new("bash")
            .arg(root().join("scripts/c-install.sh"))
            .arg(&prefix)
            .arg(build)
            .output()
            .expect("run scripts/c-install.sh");
        assert!(
            out.status.success(),
            "c-install.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        prefix
    })
}

/// `CARGO_TARGET_TMPDIR/NAME-PID` for this process, after removing the
/// `NAME-*` directories of earlier runs whose process is gone (an installed
/// prefix is ~70 MiB).
pub fn fresh_dir(name: &str) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let stem = format!("{name}-");
    for e in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = file.strip_prefix(&stem) {
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    tmp.join(format!("{stem}{}", std::process::id()))
}

/// `pkg-config ARGS` with the temporary prefix on the search path.
pub fn pkg_config(args: &[&str]) -> Vec<String> {
    pkg_config_in(prefix(), args)
}

/// `pkg-config ARGS` with `prefix`'s `lib/pkgconfig` on the search path.
pub fn pkg_config_in(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config");
    assert!(
        out.status.success(),
        "pkg-config {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Compiles `sources` into an executable linked against the pkg-config
/// package `package` installed in `prefix` (usually [`prefix()`]; C with
/// gcc, C++ with g++ when `cxx`). Returns its path.
pub fn compile(
    prefix: &Path,
    name: &str,
    sources: &[PathBuf],
    package: &str,
    cxx: bool,
    extra: &[&str],
) -> PathBuf {
    let exe = prefix.join("bin").join(name);
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let mut cmd = Command::new(if cxx { "g++" } else { "gcc" });
    cmd.args(["-O2", "-g", "-Wall", "-Wextra", "-Werror"])
        .args(if cxx {
            &["-std=c++17"][..]
        } else {
            &["-std=c11", "-D_GNU_SOURCE"][..]
        })
        .args(sources)
        .arg("-o")
        .arg(&exe)
        .args(pkg_config_in(prefix, &["--cflags", "--libs", package]))
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .args(["-lpthread"])
        .args(extra);
    let out = cmd.output().expect("run the compiler");
    assert!(
        out.status.success(),
        "compiling {name} failed: {cmd:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `exe ARGS` with `env` set, killing it (by pid) after `limit`.
pub fn run(exe: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the C program");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("collect output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!(
                "{} {args:?} did not finish within {limit:?}; stdout:\n{}\nstderr:\n{}",
                exe.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Asserts that `out` is a success that printed `ok MODE`.
pub fn assert_ok(out: &Output, mode: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("ok {mode}")),
        "{mode}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A file of `pages` 4 KiB pages with a position-dependent pattern.
pub fn pattern_file(dir: &Path, name: &str, pages: usize) -> PathBuf {
    let path = dir.join(name);
    let data: Vec<u8> = (0..pages * 4096)
        .map(|i| (i as u64 * 7 + i as u64 / 4096) as u8)
        .collect();
    std::fs::write(&path, data).expect("write the pattern file");
    path
}

/// Runs `cargo cinstall -p PACKAGE` (dev profile) into a fresh prefix and
/// returns it, or `None` (saying why) without a cargo-c of at least 0.10
/// (Debian's 0.9.14 cannot read Cargo.lock v4 and prints no version;
/// `scripts/setup.sh` says which there is but builds none). Builds in
/// `CARGO_TARGET_TMPDIR/cinstall-target`, because this `cargo test` holds
/// the workspace's target directory; later runs reuse it (about 35 s the
/// first time, seconds after).
pub fn cargo_cinstall(package: &str) -> Option<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let version = Command::new(&cargo)
        .args(["cinstall", "--version"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // "cargo-c 0.10.24+cargo-0.98.0"
    let minor = version
        .strip_prefix("cargo-c 0.")
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    if minor.is_none_or(|m| m < 10) {
        eprintln!(
            "skipping: no cargo-c >= 0.10 (`cargo cinstall --version`: {version:?}); \
             the distributors' path is not checked here (cargo install --locked cargo-c adds it)"
        );
        return None;
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cinstall-target");
    let prefix = fresh_dir(&format!("cinstall-{package}"));
    let _ = std::fs::remove_dir_all(&prefix);
    let manifest = root().join("Cargo.toml");
    let out = run(
        Path::new(&cargo),
        &[
            "cinstall",
            "--manifest-path",
            manifest.to_str().unwrap(),
            "-p",
            package,
            "--profile",
            "dev",
            "--prefix",
            prefix.to_str().unwrap(),
            "--libdir",
            "lib",
            "--target-dir",
            target.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(900),
    );
    assert!(
        out.status.success(),
        "cargo cinstall -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(prefix)
}

/// Checks what cargo-c installs for the C library `name` in `prefix`:
/// `libNAME.so.0.1.0` with SONAME `libNAME.so.0`, the `.so.0` and `.so`
/// symlinks, `libNAME.a`, and `-lNAME` from `NAME.pc`.
pub fn assert_installed_library(prefix: &Path, name: &str) {
    let lib = prefix.join("lib");
    let so = std::fs::read(lib.join(format!("lib{name}.so.0.1.0"))).unwrap();
    let soname = format!("lib{name}.so.0");
    assert!(
        so.windows(soname.len()).any(|w| w == soname.as_bytes()),
        "SONAME {soname}"
    );
    for link in [soname.clone(), format!("lib{name}.so")] {
        assert_eq!(
            std::fs::read_link(lib.join(link)).unwrap(),
            PathBuf::from(format!("lib{name}.so.0.1.0"))
        );
    }
    assert!(lib.join(format!("lib{name}.a")).metadata().unwrap().len() > 0);
    assert!(pkg_config_in(prefix, &["--libs", name]).contains(&format!("-l{name}")));
}
