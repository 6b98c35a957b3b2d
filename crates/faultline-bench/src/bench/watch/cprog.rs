//! The C baselines of `bench watch`, built at run time: their sources are
//! embedded in the binary (`tools/watchbench/`), written to a temporary
//! directory and compiled with `cc`; each prints `key=value` lines the
//! bench parses. [`available`] says whether `cc` and `gdb` are there, so
//! callers can skip the columns that need them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context};

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
    match Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("`{tool} --version` failed ({}): {why}", o.status)),
        Err(e) => Err(format!("cannot run `{tool}` ({e}): {why}")),
    }
}

/// A temporary directory, removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory under the temporary directory.
    pub fn new() -> anyhow::Result<TempDir> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "faultline-watchbench-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("faultline bench: removing {}: {e}", self.0.display());
        }
    }
}

/// Write `src` to `dir/name.c` and compile it with `cc flags` into `dir/name`.
pub fn compile(dir: &Path, name: &str, src: &str, flags: &[&str]) -> anyhow::Result<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&c, src).with_context(|| format!("writing {}", c.display()))?;
    let out = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&c)
        .stdin(Stdio::null())
        .output()
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
