//! `faultline graph gen` and `faultline graph import`: a binary CSR graph
//! file ([`csr`]) from an R-MAT generator ([`rmat`]) or a text edge list
//! ([`import`]).
//!
//! 1. `gen` checks first that the memory (degrees and offsets, one
//!    adjacency chunk) and the disk the file needs are there, and says
//!    what it needs against what there is otherwise.
//! 2. `-o` is checked before any work (`OutputPath`: a regular file or a
//!    new path in an existing directory; a device, FIFO or socket is
//!    refused, `/dev/null` is written in place, a symlink is followed).
//! 3. The file is written under a temporary name in its directory
//!    (`.NAME.partial-PID`, removed on error, SIGINT and SIGTERM, and by a
//!    later run if this one was killed), synced (unless `--no-sync`) and
//!    renamed over the output on success: a failed run leaves the old file
//!    (or nothing), never a partial graph.

use std::fs::File;
use std::io::{BufReader, IsTerminal};
use std::path::PathBuf;

use faultline_cli_support::OutputPath;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::output::{buffered, flush};
use super::units::{format_size, parse_size};
use super::{csr, import, rmat};

/// `faultline graph ...` subcommands.
#[derive(clap::Subcommand)]
pub enum GraphCmd {
    /// Generate an R-MAT graph (a=0.57, b=0.19, c=0.19) as a binary CSR file.
    Gen(GenArgs),
    /// Convert a text edge list (`src dst` per line) to a binary CSR file.
    Import(ImportArgs),
}

/// Arguments of `faultline graph gen`.
#[derive(clap::Args)]
pub struct GenArgs {
    /// 2^SCALE vertices (1 to 40).
    #[arg(long, default_value_t = 20, value_parser = faultline_cli_support::flags::range_u32(1, rmat::MAX_SCALE))]
    pub scale: u32,
    /// EDGE_FACTOR * 2^SCALE generated edges (each stored in both
    /// directions; 1 to 1024).
    #[arg(long, default_value_t = 16, value_parser = faultline_cli_support::flags::range_u64(1, 1024))]
    pub edge_factor: u64,
    /// PRNG seed: the same parameters and seed give the same file (any
    /// number to 2^64 - 1).
    #[arg(long, default_value_t = 1, value_parser = faultline_cli_support::flags::range_u64(0, u64::MAX))]
    pub seed: u64,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Keep R-MAT's vertex numbering (hubs at low ids) instead of scrambling it.
    #[arg(long)]
    pub no_scramble: bool,
    /// Generator threads (default: available CPUs; 1 to the threads this
    /// machine can still start).
    #[arg(long, value_parser = faultline_cli_support::flags::threads(1))]
    pub threads: Option<usize>,
    /// Largest adjacency buffer held in memory; bigger graphs are built in
    /// vertex chunks, regenerating the edge stream per chunk.
    #[arg(long, default_value = "4G", value_parser = parse_mem_limit)]
    pub mem_limit: u64,
    /// Skip the final fsync (the reported speed then excludes the disk).
    #[arg(long)]
    pub no_sync: bool,
}

/// Arguments of `faultline graph import`.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// Edge list: `src dst` per line, `#` or `%` comments; `-` for stdin.
    pub input: PathBuf,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Store each edge only as given (default: both directions).
    #[arg(long)]
    pub directed: bool,
}

/// `--mem-limit`: at least 1 MiB (smaller limits would cut the graph into
/// absurdly many chunks, each a full pass over the edge stream).
fn parse_mem_limit(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < 1 << 20 {
        return Err(format!(
            "{s:?}: {} (bytes, or with a K/M/G/T suffix; at least 1M)",
            faultline_cli_support::flags::range_error(1u64 << 20, u64::MAX, "")
        ));
    }
    Ok(v)
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
fn progress_bar(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:40} {percent:>3}% {msg} (eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// MiB per second.
fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// Runs `faultline graph ...`.
pub fn run_graph(cmd: GraphCmd) -> anyhow::Result<()> {
    match cmd {
        GraphCmd::Gen(args) => run_gen(args),
        GraphCmd::Import(args) => run_import(args),
    }
}

/// What `graph gen` needs, checked before any work: memory for the degree
/// and offset arrays (16 bytes per vertex) plus one adjacency chunk (at
/// most `--mem-limit`), and disk for the file (at most `8 (n + 1 + 2 m)`
/// bytes before duplicates are dropped).
fn check_gen_resources(args: &GenArgs) -> anyhow::Result<OutputPath> {
    let out = OutputPath::check(&args.output, "--output")?;
    let v = 1u128 << args.scale;
    let edges = 2 * args.edge_factor as u128 * v;
    let adjacency = (8 * edges).min(args.mem_limit as u128);
    let mem = 16 * v + adjacency;
    let disk = 8 * (v + 1 + edges);
    let fmt = |b: u128| format_size(b.min(u64::MAX as u128) as u64);
    let scale = args.scale;
    if let Some(avail) = faultline_cli_support::mem_available() {
        if mem > avail as u128 {
            bail!(
                "graph gen --scale {scale}: needs about {} of memory (16 bytes per vertex \
                 for degrees and offsets, plus an adjacency chunk of up to --mem-limit), \
                 {} available",
                fmt(mem),
                format_size(avail)
            );
        }
    }
    if let Some(free) = faultline_cli_support::disk_free(out.target()).filter(|_| !out.is_null()) {
        if disk > free as u128 {
            bail!(
                "graph gen --scale {scale} --edge-factor {}: the file takes up to {}, \
                 {} free for {}",
                args.edge_factor,
                fmt(disk),
                format_size(free),
                args.output.display()
            );
        }
    }
    Ok(out)
}

/// `faultline graph gen`.
fn run_gen(args: GenArgs) -> anyhow::Result<()> {
    let params = rmat::RmatParams {
        scale: args.scale,
        edge_factor: args.edge_factor,
        seed: args.seed,
        scramble: !args.no_scramble,
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let opts = rmat::GenOptions {
        threads,
        mem_limit: args.mem_limit,
    };
    let output = check_gen_resources(&args)?;
    let t0 = Instant::now();
    // Written under a temporary name and renamed on success: a failed run
    // leaves the old file or nothing, never a partial graph.
    let mut pending = output.begin()?;
    let mut out = buffered(&mut pending);
    let pb = progress_bar(0);
    let summary = rmat::generate(&params, &opts, &mut out, &pb)
        .with_context(|| format!("generating into {}", args.output.display()))?;
    pb.set_message("syncing");
    flush(out, &args.output)?;
    if args.no_sync {
        pending.commit_unsynced()?;
    } else {
        pending.commit()?;
    }
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{}: R-MAT scale {} edge factor {} seed {}: {} vertices, {} stored edges \
         ({} self-loops and {} duplicate directed edges dropped), {} chunk(s)",
        args.output.display(),
        args.scale,
        args.edge_factor,
        args.seed,
        summary.vertices,
        summary.edges,
        summary.self_loops,
        summary.duplicates,
        summary.chunks,
    );
    println!(
        "{} written in {secs:.2} s ({:.0} MB/s{}, {threads} threads)",
        format_size(summary.bytes),
        mb_per_s(summary.bytes, secs),
        if args.no_sync {
            ", not synced"
        } else {
            ", synced"
        },
    );
    Ok(())
}

/// `faultline graph import`.
fn run_import(args: ImportArgs) -> anyhow::Result<()> {
    let output = OutputPath::check(&args.output, "--output")?;
    output.refuse_same_as(&args.input, "the input")?;
    let t0 = Instant::now();
    let graph = if args.input.as_os_str() == "-" {
        import::read_edge_list(std::io::stdin().lock(), !args.directed)
            .context("importing edge list from stdin")?
    } else {
        let f =
            File::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
        import::read_edge_list(BufReader::with_capacity(1 << 20, f), !args.directed)
            .with_context(|| format!("importing {}", args.input.display()))?
    };
    let mut pending = output.begin()?;
    let mut out = buffered(&mut pending);
    csr::write_csr(&mut out, &graph)
        .with_context(|| format!("writing {}", args.output.display()))?;
    flush(out, &args.output)?;
    pending.commit()?;
    let layout = graph.layout();
    println!(
        "{}: {} vertices, {} stored edges ({}), {} in {:.2} s",
        args.output.display(),
        layout.vertices,
        layout.edges,
        if args.directed {
            "directed"
        } else {
            "both directions"
        },
        format_size(layout.file_bytes()),
        t0.elapsed().as_secs_f64(),
    );
    Ok(())
}
