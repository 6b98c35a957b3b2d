//! The external watchpoint baseline of Table 4.1 (seed 002): a write
//! watchpoint built the usual way, measured on this machine.
//!
//! [`sigsegv_breakdown`] (Table 4.1, "Signal Handling" column): one page
//! `mprotect`ed read-only, a SIGSEGV
//! handler that looks the address up and unprotects, the trap flag to get
//! control back after the store, and a SIGTRAP handler that re-protects. Each
//! step is timed with the TSC inside the C program
//! (`tools/watchbench/sigwatch.c`, `-O2`):
//!
//! ```text
//! loop      t0 | *p = v  ......................................... | t8
//!                   | #PF                                ^ #DB     ^ sigreturn
//! SIGSEGV handler   t1 lookup t2 mprotect RW t3 TF=1 t4  |         |
//! SIGTRAP handler                                        t5 mprotect R t6 TF=0 t7
//! rows: (1) t1-t0  (2) t2-t1  (3) t3-t2  (4)+(5) t5-t4  (6) t6-t5  return t8-t7
//! ```
//!
//! (4) "exiting the handler" and (5) "re-executing the write" are one interval
//! in that run (the store is the only instruction between the two kernel
//! exits). A second run without the trap flag, whose handler only unprotects,
//! times (4) alone as handler end -> store completed; (5) is reported as the
//! difference of the two medians (p99s), i.e. the store plus the single-step
//! `#DB` and the SIGTRAP delivery.
//!
//! [`signal_floor`] is the cheapest signal-based write catch
//! (`tools/watchbench/floor.c`): the handler only steps over the store.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{bail, Context};
use faultline_cli_support::cleanup;
use serde::Serialize;

use super::cprog::{compile, get_u64, parse_kv, TempDir};

/// Source of the SIGSEGV + trap-flag watchpoint (Table 4.1).
pub const SIGWATCH_C: &str = include_str!("../../../../../tools/watchbench/sigwatch.c");
/// `tools/watchbench/floor.c`: the cheapest possible signal-based write
/// catch (the handler only steps over the store).
pub const FLOOR_C: &str = include_str!("../../../../../tools/watchbench/floor.c");
/// Watched byte addresses in the page of [`sigsegv_breakdown`].
pub const SIG_WATCHED: usize = 16;

/// Median and 99th percentile of one row, TSC cycles (nearest rank; each
/// includes one `lfence; rdtsc; lfence` pair, ~20-50 cycles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RowCycles {
    /// 50th percentile.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl RowCycles {
    fn read(kv: &BTreeMap<String, String>, key: &str) -> anyhow::Result<RowCycles> {
        Ok(RowCycles {
            median: get_u64(kv, &format!("{key}.median"), "sigwatch")? as f64,
            p99: get_u64(kv, &format!("{key}.p99"), "sigwatch")? as f64,
        })
    }
}

/// The run without the trap flag: its handler only unprotects, the loop
/// re-protects after the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PlainRun {
    /// Store -> first line of the SIGSEGV handler.
    pub fault_to_handler: RowCycles,
    /// Binary search of the fault address.
    pub lookup: RowCycles,
    /// `mprotect(PROT_READ | PROT_WRITE)` in the handler.
    pub allow_write: RowCycles,
    /// Last line of the handler -> store completed (sigreturn + the store).
    pub exit: RowCycles,
    /// `mprotect(PROT_READ)` in the loop, outside any handler.
    pub reprotect: RowCycles,
    /// Store -> store completed (without the re-protect).
    pub total: RowCycles,
}

/// Table 4.1, signal column, measured here: one event = one write to the
/// watched page. Cycles are TSC cycles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SigBreakdown {
    /// Timed writes per run (plus 1000 untimed warm-up writes).
    pub writes: usize,
    /// Watched byte addresses in the page.
    pub watched: usize,
    /// Timed writes that hit a watched byte.
    pub hits: u64,
    /// Timed writes to the page that hit no watched byte.
    pub false_positives: u64,
    /// (1) store -> first line of the SIGSEGV handler (#PF, kernel, signal frame).
    pub fault_to_handler: RowCycles,
    /// (2) binary search of `si_addr` in the sorted watched addresses.
    pub lookup: RowCycles,
    /// (3) `mprotect(PROT_READ | PROT_WRITE)`.
    pub allow_write: RowCycles,
    /// (4) last line of the handler -> store completed, from the run without TF
    /// ([`PlainRun::exit`]).
    pub exit_handler: RowCycles,
    /// (5) `exit_to_trap - exit_handler` (medians and p99s subtracted): the
    /// store, the single-step `#DB` and the SIGTRAP delivery.
    pub reexecute_write: RowCycles,
    /// (4)+(5) as measured with TF: last line of the SIGSEGV handler -> first
    /// line of the SIGTRAP handler.
    pub exit_to_trap: RowCycles,
    /// (6) `mprotect(PROT_READ)` in the SIGTRAP handler.
    pub restore_ro: RowCycles,
    /// Last line of the SIGTRAP handler -> back in the loop after the store.
    pub trap_return: RowCycles,
    /// Store -> store completed, the whole watched write (the loop's own pair).
    pub total: RowCycles,
    /// The calibration run without the trap flag.
    pub plain: PlainRun,
}

impl SigBreakdown {
    fn parse(text: &str) -> anyhow::Result<SigBreakdown> {
        let kv = parse_kv(text);
        let r = |k: &str| RowCycles::read(&kv, k);
        let exit_to_trap = r("tf.exit_to_trap")?;
        let plain = PlainRun {
            fault_to_handler: r("plain.entry")?,
            lookup: r("plain.lookup")?,
            allow_write: r("plain.allow")?,
            exit: r("plain.exit")?,
            reprotect: r("plain.reprotect")?,
            total: r("plain.total")?,
        };
        Ok(SigBreakdown {
            writes: get_u64(&kv, "writes", "sigwatch")? as usize,
            watched: get_u64(&kv, "watched", "sigwatch")? as usize,
            hits: get_u64(&kv, "tf.hits", "sigwatch")?,
            false_positives: get_u64(&kv, "tf.false_positives", "sigwatch")?,
            fault_to_handler: r("tf.entry")?,
            lookup: r("tf.lookup")?,
            allow_write: r("tf.allow")?,
            exit_handler: plain.exit,
            reexecute_write: RowCycles {
                median: exit_to_trap.median - plain.exit.median,
                p99: exit_to_trap.p99 - plain.exit.p99,
            },
            exit_to_trap,
            restore_ro: r("tf.restore")?,
            trap_return: r("tf.trap_return")?,
            total: r("tf.total")?,
            plain,
        })
    }
}

/// The signal-delivery floor on this machine: median TSC cycles of a write
/// to a protected page whose handler only steps over the store, with
/// (mprotect + SIGSEGV, uffd-wp + SIGBUS). Nothing that catches writes with
/// page protection and signals can be cheaper.
pub fn signal_floor(writes: usize) -> anyhow::Result<(f64, f64)> {
    let dir = TempDir::new()?;
    let exe = compile(&dir.0, "floor", FLOOR_C, &["-O2"])?;
    let out = cleanup::output(Command::new(&exe).arg(writes.max(1).to_string()))
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!("floor failed ({})", out.status);
    }
    let kv = parse_kv(&String::from_utf8_lossy(&out.stdout));
    Ok((
        get_u64(&kv, "segv.total", "floor")? as f64,
        get_u64(&kv, "uffd.total", "floor")? as f64,
    ))
}

/// Compile `sigwatch.c` (`cc -O2`) and time `writes` watched writes with the
/// trap flag and `writes` without (see the module docs).
pub fn sigsegv_breakdown(writes: usize) -> anyhow::Result<SigBreakdown> {
    if writes == 0 {
        bail!("sigsegv_breakdown: need at least one write");
    }
    let dir = TempDir::new()?;
    let exe = compile(&dir.0, "sigwatch", SIGWATCH_C, &["-O2"])?;
    let out = cleanup::output(
        Command::new(&exe)
            .arg(writes.to_string())
            .arg(SIG_WATCHED.to_string()),
    )
    .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "sigwatch {writes} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    SigBreakdown::parse(&String::from_utf8_lossy(&out.stdout)).context("parsing sigwatch output")
}

#[cfg(test)]
mod tests {
    use super::super::cprog;
    use super::*;

    #[test]
    fn sigsegv_breakdown_runs() {
        if let Err(e) = cprog::cc_available() {
            eprintln!("skipped: {e}");
            return;
        }
        let b = sigsegv_breakdown(5000).unwrap();
        println!("{}", serde_json::to_string_pretty(&b).unwrap());
        assert_eq!(b.writes, 5000);
        assert_eq!(b.hits + b.false_positives, 5000);
        assert!(b.fault_to_handler.median > 0.0 && b.total.median >= b.exit_to_trap.median);
    }
}
