//! `faultline bench`: fault latency and throughput benchmarks, side by side with
//! the kernel's own fault paths. The dispatcher: nothing in the crate imports it.
//!
//! How the pieces fit:
//! 1. [`run`] checks `--json`, `--plot` and what each sub-bench's flags
//!    ask for together (`BenchCmd::check`: sizes against the machine),
//!    then builds a `BenchCtx` (calibrated TSC, an empty report, the
//!    `--plot` directory) and runs the selected sub-benches in order; with
//!    no sub-command it runs `BenchCmd::default_selection`.
//! 2. Each sub-bench (`kernel`, `notify`, ...) measures, prints its tables to stdout,
//!    draws its figures with `BenchCtx::figure`, and pushes its records onto
//!    `ctx.report`.
//! 3. `BenchCtx::finish` fills in `ratio_to_kernel` and writes `--json`.
//!
//! ```text
//!   bench/mod.rs (BenchArgs, BenchCmd, run)
//!        │ one arm per sub-bench
//!        ▼
//!   kernel notify engines offload watch/ random store restore/ vpri/
//!        │      (engines, offload ─► kernel; store ─► graph; vpri/ ─► sim)
//!        ▼
//!   harness (BenchCtx, report, paper, plot, stats, tsc, progress)
//! ```
//!
//! Adding a sub-bench: a module with an `Args` struct and
//! `run(&mut BenchCtx, &Args)`, a [`BenchCmd`] variant, and one arm in
//! `BenchCmd::run`.

mod engines;
mod kernel;
mod notify;
mod offload;
mod random;
mod restore;
mod store;
mod vpri;
mod watch;

use std::path::PathBuf;

use anyhow::Context;

use crate::harness::BenchCtx;
use kernel::KernelArgs;
use notify::NotifyArgs;

/// Arguments of `faultline bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which bench to run. Omitted: the quick suite (latency, seq, scale,
    /// offload, watch and notify at small sizes, about two minutes).
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// Write every record as JSON to this file.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,
    /// Write figures (SVG and PNG) into this directory.
    #[arg(long, global = true)]
    pub plot: Option<PathBuf>,
}

/// The sub-benches.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum BenchCmd {
    /// Cross-thread notification latency (signal, futex, eventfd, pipe, spin),
    /// next to the seed's Table 2.1.
    Notify(NotifyArgs),
    /// The kernel's own fault paths: per-fault latency, sequential per-page cost,
    /// first-touch scaling over threads.
    Kernel(KernelArgs),
    /// Per-fault latency of every engine x resolve op, with the phase
    /// breakdown (trigger / resolve / return), next to the kernel's paths.
    Latency(engines::LatencyArgs),
    /// Sequential first touch with fault-around 1..64 pages per fault,
    /// against the kernel's first touch and a warm mmap file scan.
    Seq(engines::SeqArgs),
    /// Faults per second with 1, 2, 4, 8 faulting threads per engine.
    Scale(engines::ScaleArgs),
    /// Frame pool and run-ahead population (seed 004) on four workloads.
    Offload(offload::OffloadArgs),
    /// Watchpoints (seed 002 chapter 4): Tables 4.1, 4.3-4.6 next to
    /// seed 002's numbers, a C mprotect+SIGSEGV baseline and GDB.
    Watch(watch::WatchArgs),
    /// N threads reading a file in shuffled page order (UMap's
    /// pfbenchmark) through mmap, a faultline region and libumap.
    Random(random::RandomArgs),
    /// A Redis-backed region vs the local file store: sequential first
    /// touch, BFS, throughput over handler threads (starts its own
    /// redis-server unless given --url). Not in the default selection.
    Store(store::StoreArgs),
    /// VM snapshot restore through Firecracker's hand-off: the kernel's
    /// MAP_PRIVATE file mapping, a one-page baseline handler, faultline on
    /// demand, with a recorded working set prefetched, and eager copy.
    Restore(restore::RestoreArgs),
    /// I/O page faults (seed 003, VPRI): Table 2 (B1), Fig 6 (B2), UDP
    /// receive (B3), Fig 16/17 (B5), Figs 9-11 (B7), next to the paper.
    /// Not in the default selection.
    Vpri(vpri::VpriArgs),
}

impl BenchCmd {
    /// What `faultline bench` without a sub-command runs, with small defaults.
    fn default_selection() -> Vec<BenchCmd> {
        vec![
            BenchCmd::Latency(engines::LatencyArgs::quick()),
            BenchCmd::Seq(engines::SeqArgs::quick()),
            BenchCmd::Scale(engines::ScaleArgs::quick()),
            BenchCmd::Offload(offload::OffloadArgs::quick()),
            BenchCmd::Watch(watch::WatchArgs::quick()),
            BenchCmd::Notify(NotifyArgs::quick()),
        ]
    }

    /// Checks what the sub-bench's flags ask for together (sizes derived
    /// from several flags against the machine), before any bench runs.
    fn check(&self) -> anyhow::Result<()> {
        match self {
            BenchCmd::Kernel(a) => kernel::check(a).context("bench kernel"),
            BenchCmd::Latency(a) => engines::check_latency(a).context("bench latency"),
            BenchCmd::Seq(a) => engines::check_seq(a).context("bench seq"),
            BenchCmd::Scale(a) => engines::check_scale(a).context("bench scale"),
            BenchCmd::Offload(a) => offload::check(a).context("bench offload"),
            BenchCmd::Random(a) => random::check(a).context("bench random"),
            BenchCmd::Notify(a) => notify::check(a).context("bench notify"),
            BenchCmd::Store(a) => store::check(a).context("bench store"),
            BenchCmd::Vpri(a) => vpri::check(a).context("bench vpri"),
            BenchCmd::Watch(_) | BenchCmd::Restore(_) => Ok(()),
        }
    }

    /// Run this sub-bench into `ctx`.
    fn run(&self, ctx: &mut BenchCtx) -> anyhow::Result<()> {
        match self {
            BenchCmd::Notify(a) => notify::run(ctx, a).context("bench notify"),
            BenchCmd::Kernel(a) => kernel::run(ctx, a).context("bench kernel"),
            BenchCmd::Latency(a) => engines::run_latency(ctx, a).context("bench latency"),
            BenchCmd::Seq(a) => engines::run_seq(ctx, a).context("bench seq"),
            BenchCmd::Scale(a) => engines::run_scale(ctx, a).context("bench scale"),
            BenchCmd::Offload(a) => offload::run(ctx, a).context("bench offload"),
            BenchCmd::Watch(a) => watch::run(ctx, a).context("bench watch"),
            BenchCmd::Random(a) => random::run(ctx, a).context("bench random"),
            BenchCmd::Store(a) => store::run(ctx, a).context("bench store"),
            BenchCmd::Restore(a) => restore::run(ctx, a).context("bench restore"),
            BenchCmd::Vpri(a) => vpri::run(ctx, a).context("bench vpri"),
        }
    }
}

/// Refuses `--json` or `--plot` given twice in `bench`'s arguments
/// (`args`: those after the word `bench`). Both are global, so one given
/// before the sub-bench and one after would both parse, the second
/// silently taking the place of the first.
pub fn refuse_repeated_outputs<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> anyhow::Result<()> {
    for flag in ["--json", "--plot"] {
        let mut given = Vec::new();
        let mut it = args.iter().map(|a| a.as_ref().to_string_lossy());
        while let Some(a) = it.next() {
            if a == "--" {
                break;
            }
            if a == flag {
                // Without a value, clap says so.
                given.extend(it.next().map(|v| v.into_owned()));
            } else if let Some(v) = a.strip_prefix(flag).and_then(|v| v.strip_prefix('=')) {
                given.push(v.to_string());
            }
        }
        if given.len() > 1 {
            anyhow::bail!(
                "{flag} given {} times ({}): give it once, before or after the bench's name",
                given.len(),
                given.join(", ")
            );
        }
    }
    Ok(())
}

/// Entry point of `faultline bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let cmds = match args.cmd {
        Some(c) => vec![c],
        None => BenchCmd::default_selection(),
    };
    // Before any work: a long run must not end in "cannot write".
    if let Some(p) = &args.json {
        faultline_cli_support::OutputPath::check(p, "--json")?;
    }
    if let Some(d) = &args.plot {
        faultline_cli_support::output_dir(d, "--plot")?;
    }
    for c in &cmds {
        c.check()?;
    }
    let mut ctx = BenchCtx::new(args.json, args.plot);
    let m = &ctx.report.machine;
    println!(
        "machine: {} | kernel {} | {} CPUs | TSC {:.3} GHz | {}",
        m.cpu, m.kernel, m.nproc, m.tsc_ghz, m.date
    );
    // A sub-bench that failed after its results (FailedAfterResults)
    // leaves them in the report: the others run, the JSON is written,
    // then the run fails.
    let mut failed = Vec::new();
    for c in &cmds {
        match c.run(&mut ctx) {
            Ok(()) => {}
            Err(e) if e.downcast_ref::<FailedAfterResults>().is_some() => failed.push(e),
            Err(e) => return Err(e),
        }
    }
    ctx.finish()?;
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        n => Err(anyhow::anyhow!(
            "{n} benches failed: {}",
            failed
                .iter()
                .map(|e| format!("{e:#}"))
                .collect::<Vec<_>>()
                .join("; ")
        )),
    }
}

/// A sub-bench's failure found once its results were out: its rows are
/// printed and its records pushed, so `run` writes `--json` (and runs the
/// other sub-benches) before failing with it.
#[derive(Debug)]
pub(crate) struct FailedAfterResults(pub String);

impl std::fmt::Display for FailedAfterResults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FailedAfterResults {}

/// Refuses a list flag naming a value twice (it would run twice: two rows
/// and two records of one name), as `bench restore` refuses its
/// configurations: `{flag}: "x" is named twice (entries i and j)`.
pub(crate) fn named_once<T: PartialEq + std::fmt::Debug>(
    flag: &str,
    values: &[T],
) -> anyhow::Result<()> {
    for (i, v) in values.iter().enumerate() {
        if let Some(first) = values[..i].iter().position(|w| w == v) {
            anyhow::bail!(
                "{flag}: {v:?} is named twice (entries {} and {})",
                first + 1,
                i + 1
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{named_once, refuse_repeated_outputs};

    #[test]
    fn a_value_named_twice_is_refused() {
        named_once("--depths", &[1usize, 2, 4]).unwrap();
        named_once::<usize>("--depths", &[]).unwrap();
        let e = named_once("--depths", &[1usize, 2, 1])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "--depths: 1 is named twice (entries 1 and 3)");
        let e = named_once("--engines", &["signal", "signal"])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "--engines: \"signal\" is named twice (entries 1 and 2)");
    }

    #[test]
    fn an_output_flag_given_twice_is_refused() {
        let ok: [&[&str]; 4] = [
            &["--json", "a.json", "latency"],
            &["latency", "--json=a.json", "--plot", "figs"],
            &["latency", "--", "--json", "x", "--json", "y"],
            // A --json without its value is clap's to refuse, as such.
            &["--json", "a.json", "latency", "--json"],
        ];
        for args in ok {
            refuse_repeated_outputs(args).unwrap();
        }
        let e = refuse_repeated_outputs(&["--json", "a.json", "latency", "--json=b.json"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--json given 2 times (a.json, b.json)"), "{e}");
        assert!(refuse_repeated_outputs(&["--plot", "a", "seq", "--plot", "b"]).is_err());
    }
}
