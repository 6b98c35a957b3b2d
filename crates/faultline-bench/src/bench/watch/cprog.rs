//! The C baselines of `bench watch`, built at run time: their sources are
//! embedded in the binary (`tools/watchbench/`), written to a temporary
//! directory ([`TempDir`]) and compiled with `cc`; each prints `key=value`
//! lines the bench parses. Every program the bench runs (`cc`, `gdb`, the
//! baselines) is a child it owns ([`cleanup::spawn`]): killed on SIGINT,
//! SIGTERM and SIGHUP and when the bench dies. [`available`] says whether `cc` and `gdb` are there, so
//! callers can skip the columns that need them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use faultline_cli_support::cleanup::{self, Guard};

/// Ok if both `cc` and `gdb` can be run, else why not.
pub fn available() -> Result<(), String> {
    cc_available()?;
    tool_runs("gdb", "the GDB watchpoint baselines need it (install gdb)")
}

/// Ok if `cc` can be run (all the signal baseline needs), else why not.
pub fn cc_available() -> Result<(), String> {
    tool_runs(
        "cc",
        "the external baselines compile C at run time (install gcc)",
    )
}

/// Ok if `tool --version` runs, else why not (with `why` it is needed).
fn tool_runs(tool: &str, why: &str) -> Result<(), String> {
    match cleanup::output(Command::new(tool).arg("--version")) {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("`{tool} --version` failed ({}): {why}", o.status)),
        Err(e) => Err(format!("cannot run `{tool}` ({e}): {why}")),
    }
}

/// What the temporary directories are named: `faultline-watchbench-PID`,
/// then `faultline-watchbench-PID-N`.
const TEMP_PREFIX: &str = "faultline-watchbench-";

/// A temporary directory (in the temporary directory, `$TMPDIR`), a
/// cleanup temporary: removed with its contents when dropped (an error
/// included), on SIGINT, SIGTERM and SIGHUP, and by a later run once its
/// PID is gone (what a killed run left).
pub struct TempDir(
    pub PathBuf,
    #[allow(dead_code, reason = "removes the directory when dropped")] Guard,
);

impl TempDir {
    /// A fresh directory under the temporary directory; the leftovers of
    /// killed runs there are removed first.
    pub fn new() -> anyhow::Result<TempDir> {
        let tmp = std::env::temp_dir();
        cleanup::sweep_prefixed(&tmp, TEMP_PREFIX);
        let guard = cleanup::temp(&tmp, TEMP_PREFIX, "");
        let p = guard.path().to_path_buf();
        std::fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p, guard))
    }
}

/// Write `src` to `dir/name.c` and compile it with `cc flags` into `dir/name`.
pub fn compile(dir: &Path, name: &str, src: &str, flags: &[&str]) -> anyhow::Result<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&c, src).with_context(|| format!("writing {}", c.display()))?;
    let out = cleanup::output(Command::new("cc").args(flags).arg("-o").arg(&exe).arg(&c))
        .with_context(|| {
            format!("running `cc` to build {name}.c: the external baselines compile C at run time (install gcc)")
        })?;
    if !out.status.success() {
        bail!(
            "cc {} {name}.c failed ({}):\n{}",
            flags.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    Ok(exe)
}

/// Parse `key=value` lines; other lines are ignored.
pub fn parse_kv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once('='))
        .filter(|(k, _)| !k.is_empty() && !k.contains(char::is_whitespace))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// The number after `key=` (`what` names the program in the error).
pub fn get_u64(kv: &BTreeMap<String, String>, key: &str, what: &str) -> anyhow::Result<u64> {
    let v = kv
        .get(key)
        .with_context(|| format!("{what}: no `{key}=` line in its output"))?;
    v.parse()
        .with_context(|| format!("{what}: `{key}={v}` is not a number"))
}
