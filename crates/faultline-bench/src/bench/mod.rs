//! `faultline bench`: fault latency and throughput benchmarks, side by side with
//! the kernel's own fault paths.
//!
//! How the pieces fit:
//! 1. [`run`] builds a [`BenchCtx`] (calibrated TSC, an empty [`report::Report`],
//!    the `--plot` directory) and runs the selected sub-benches in order; with no
//!    sub-command it runs [`BenchCmd::default_selection`].
//! 2. Each sub-bench (`kernel`, `notify`, ...) measures, prints its tables to stdout,
//!    writes its figures into `ctx.plot_dir`, and pushes [`report::Record`]s onto
//!    `ctx.report`.
//! 3. [`BenchCtx::finish`] fills in `ratio_to_kernel` and writes `--json`.
//!
//! Adding a sub-bench: a module with an `Args` struct and
//! `run(&mut BenchCtx, &Args)`, a [`BenchCmd`] variant, and one arm in
//! [`BenchCmd::run`].
//!
//! Building blocks: [`tsc`] (clock), [`stats`] (summaries), [`report`] (records,
//! JSON, tables), [`progress`] (stderr progress), [`plot`] (SVG + PNG figures),
//! [`kernel`] (kernel fault-path baselines), [`notify`] (cross-thread
//! notification latency).

// The building blocks are also the API of the engine benches (latency, seq,
// scale) still to be added: until then parts of them are unused in this binary.
pub mod engines;
#[allow(dead_code)]
pub mod kernel;
pub mod notify;
pub mod offload;
#[allow(dead_code)]
pub mod plot;
#[allow(dead_code)]
pub mod progress;
pub mod random;
#[allow(dead_code)]
pub mod report;
pub mod restore;
mod restore_floor;
mod restore_peers;
#[allow(dead_code)]
pub mod stats;
pub mod store;
#[allow(dead_code)]
pub mod tsc;
pub mod vpri;
mod vpri_day;
mod vpri_pal;
mod vpri_psi;
mod vpri_scale;
mod vpri_sim;
pub mod watch;
#[allow(dead_code)]
pub mod watch_ext;

use std::path::{Path, PathBuf};

use anyhow::Context;

pub use kernel::KernelArgs;
pub use notify::NotifyArgs;

/// Benches whose records get a `ratio_to_kernel` (fault latency benches).
pub const RATIO_BENCHES: [&str; 2] = ["kernel", "latency"];

/// Arguments of `faultline bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which bench to run (all of them if omitted).
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
    pub fn default_selection() -> Vec<BenchCmd> {
        vec![
            BenchCmd::Latency(engines::LatencyArgs::quick()),
            BenchCmd::Seq(engines::SeqArgs::quick()),
            BenchCmd::Scale(engines::ScaleArgs::quick()),
            BenchCmd::Offload(offload::OffloadArgs::quick()),
            BenchCmd::Watch(watch::WatchArgs::quick()),
            BenchCmd::Notify(NotifyArgs::quick()),
        ]
    }

    /// Run this sub-bench into `ctx`.
    pub fn run(&self, ctx: &mut BenchCtx) -> anyhow::Result<()> {
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

/// State shared by the sub-benches of one `faultline bench` run.
pub struct BenchCtx {
    /// Every record measured so far.
    pub report: report::Report,
    /// Where figures go (`--plot`), if anywhere.
    pub plot_dir: Option<PathBuf>,
    /// Where the JSON goes (`--json`), if anywhere.
    pub json: Option<PathBuf>,
    /// Figures written so far (stems, without `.svg`/`.png`).
    pub plots: Vec<PathBuf>,
}

impl BenchCtx {
    /// A context for one run; calibrates the TSC if not done yet.
    pub fn new(json: Option<PathBuf>, plot_dir: Option<PathBuf>) -> BenchCtx {
        BenchCtx {
            report: report::Report::new(tsc::tsc()),
            plot_dir,
            json,
            plots: Vec::new(),
        }
    }

    /// A progress display for a sub-bench of `steps` steps (hidden off a TTY).
    pub fn progress(&self, steps: u64, name: &str) -> progress::Progress {
        progress::Progress::new(steps, name)
    }

    /// With `--plot`, draws figure `name` with `draw(dir, name)` and
    /// remembers it; without, does nothing.
    pub fn figure(
        &mut self,
        name: &str,
        draw: impl FnOnce(&Path, &str) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        if let Some(dir) = self.plot_dir.clone() {
            draw(&dir, name)?;
            self.note_plot(&dir, name);
        }
        Ok(())
    }

    /// Remember that figure `dir/name.{svg,png}` was written.
    pub fn note_plot(&mut self, dir: &Path, name: &str) {
        self.plots.push(dir.join(name));
    }

    /// Fill in ratios to the kernel, write the JSON file, list the outputs.
    pub fn finish(mut self) -> anyhow::Result<report::Report> {
        self.report.apply_kernel_ratios(&RATIO_BENCHES);
        if let Some(path) = &self.json {
            self.report.write_json(path)?;
            println!(
                "\nwrote {} ({} records)",
                path.display(),
                self.report.records.len()
            );
        }
        if !self.plots.is_empty() {
            println!("figures (.svg and .png):");
            for p in &self.plots {
                println!("  {}", p.display());
            }
            if !plot::font_available() {
                println!(
                    "  (no font found: figures have no text; set FAULTLINE_PLOT_FONT to a .ttf)"
                );
            }
        }
        Ok(self.report)
    }
}

/// Entry point of `faultline bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let cmds = match args.cmd {
        Some(c) => vec![c],
        None => BenchCmd::default_selection(),
    };
    // Before any work: a long run must not end in "cannot write".
    if let Some(p) = &args.json {
        faultline_cli_support::output_file(p, "--json")?;
    }
    if let Some(d) = &args.plot {
        faultline_cli_support::output_dir(d, "--plot")?;
    }
    let mut ctx = BenchCtx::new(args.json, args.plot);
    let m = &ctx.report.machine;
    println!(
        "machine: {} | kernel {} | {} CPUs | TSC {:.3} GHz | {}",
        m.cpu, m.kernel, m.nproc, m.tsc_ghz, m.date
    );
    for c in &cmds {
        c.run(&mut ctx)?;
    }
    ctx.finish()?;
    Ok(())
}
