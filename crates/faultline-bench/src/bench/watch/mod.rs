//! `faultline bench watch`: seed 002's chapter 4 on this machine.
//!
//! - Tables 4.3-4.5: 256 consecutive pages, one-byte watchpoints placed
//!   sparsely (uniform random), densely (every 256 bytes), one per page, or
//!   over the whole block; a loop writes every byte; slowdown against the
//!   same loop on unwatched memory, with and without the watch-list lookup.
//! - Table 4.1: per-event costs of one watched write (fault to handler,
//!   lookup, performing the write, exit) for each arming tier, next to a
//!   plain `mprotect` + SIGSEGV + trap-flag watchpoint written in C the
//!   usual way (`tools/watchbench/sigwatch.c`).
//! - Table 4.6: 8 pages, 1 to 64 watched addresses, against GDB software
//!   and hardware watchpoints on the same workload compiled at `-O0`.
//! - Scale: the cost of setting and clearing 100,000 watches.
//!
//! Every configuration is measured in the same run as its unwatched
//! baseline; tables show medians over `--reps` runs.
//!
//! | module | what |
//! |---|---|
//! | `args` | the options |
//! | `block` | the watched block and the measured loop |
//! | `table_41` | Table 4.1, per-event costs |
//! | `table_43_45` | Tables 4.3-4.5, slowdowns by distribution |
//! | `table_46` | Table 4.6, against GDB |
//! | `scale` | setting and clearing many watches |
//! | `cprog` | the C baselines, compiled at run time |
//! | `sigwatch` | the mprotect + SIGSEGV + trap-flag watchpoint in C (Table 4.1) |
//! | `gdb` | GDB's watchpoints on the `-O0` workload (Table 4.6) |

mod args;
mod block;
mod cprog;
mod gdb;
mod scale;
mod sigwatch;
mod table_41;
mod table_43_45;
mod table_46;

pub use args::WatchArgs;

use crate::harness::BenchCtx;

/// Runs the selected tables.
pub fn run(ctx: &mut BenchCtx, a: &WatchArgs) -> anyhow::Result<()> {
    if a.wants("4.1") {
        table_41::run(ctx, a)?;
    }
    if a.wants("4.3") || a.wants("4.4") || a.wants("4.5") {
        table_43_45::run(ctx, a)?;
    }
    if a.wants("4.6") {
        table_46::run(ctx, a)?;
    }
    if a.wants("scale") {
        scale::run(ctx, a)?;
    }
    Ok(())
}
