//! What every faultline command (`faultline`, `faultline-serve`, the
//! benchmarks) shares. Fail fast: checks that run before any work, and
//! the one place errors are printed.
//!
//! * Numeric flags have ranges, checked by their clap value parsers before
//!   any work, and sizes derived from several flags are checked against
//!   the machine ([`flags`]).
//! * Output files are checked before any work and written whole or not at
//!   all ([`output`]); what a command creates for a while (temporaries,
//!   mounts, child processes, changed settings) is given back on error,
//!   on SIGINT/SIGTERM and by later runs, and its children die with it
//!   ([`cleanup`]).
//! * Resource limits ([`mem_available`], [`disk_free`]) let a command
//!   refuse up front with the size it would need.
//! * [`print_error`] prints an error chain with each cause once (a context
//!   that already quotes its source's text does not repeat it).
//! * [`step`] is progress for stderr that is not a terminal: a line per
//!   step.

pub mod cleanup;
pub mod flags;
pub mod output;

use std::io::{IsTerminal, Write};
use std::path::Path;

pub use output::{output_dir, refuse_file_in_dir, temp_sibling, OutputPath, PendingOutput};

/// Checks `path` as an output file named by `flag` (see [`OutputPath`]):
/// for callers that write it later through [`OutputPath::check`] again.
pub fn output_file(path: &Path, flag: &str) -> anyhow::Result<()> {
    OutputPath::check(path, flag).map(drop)
}

/// Parses a count that must be at least 1, with no upper bound (prefer
/// [`flags::range`] or [`flags::threads`]: every flag has a range).
pub fn at_least_one(s: &str) -> Result<usize, String> {
    let v: usize = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a count: {e}"))?;
    if v == 0 {
        return Err("must be at least 1".into());
    }
    Ok(v)
}

/// [`at_least_one`] as a `u64`.
pub fn at_least_one_u64(s: &str) -> Result<u64, String> {
    at_least_one(s).map(|v| v as u64)
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Free bytes on the file system that will hold `path`.
pub fn disk_free(path: &Path) -> Option<u64> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    faultline_sys::mem::free_disk_bytes(dir).ok()
}

/// Whether stderr is a terminal (progress bars) or not (a line per step).
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// A progress line on stderr when it is not a terminal (`what: msg`).
pub fn step(what: &str, msg: &str) {
    if !stderr_is_terminal() {
        eprintln!("{what}: {msg}");
    }
}

/// The messages of an error chain, each cause once: a cause whose text the
/// message before it already contains is skipped.
pub fn error_lines(e: &anyhow::Error) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.last().is_some_and(|prev| prev.contains(&s)) {
            continue;
        }
        out.push(s);
    }
    out
}

/// Prints `e` to stderr: `error: <msg>` then `  caused by: <cause>` lines.
pub fn print_error(e: &anyhow::Error) {
    let lines = error_lines(e);
    let mut err = std::io::stderr().lock();
    for (i, l) in lines.iter().enumerate() {
        let _ = if i == 0 {
            writeln!(err, "error: {l}")
        } else {
            writeln!(err, "  caused by: {l}")
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_refuse_zero() {
        assert_eq!(at_least_one("3"), Ok(3));
        assert!(at_least_one("0").unwrap_err().contains("at least 1"));
        assert!(at_least_one("x").is_err());
    }

    #[test]
    fn causes_are_printed_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let text = io.to_string();
        // A context quoting its source, as thiserror's "{op}: {source}".
        let e = anyhow::Error::new(io).context(format!("opening x: {text}"));
        let e = e.context("bench seq");
        let lines = error_lines(&e);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines.iter().filter(|l| l.contains(&text)).count(), 1);
    }
}
