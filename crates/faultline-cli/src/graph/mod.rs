//! Graph files and the BFS benchmark.
//!
//! - `faultline graph gen`: R-MAT graph ([`rmat`]) written as a headerless
//!   binary CSR file ([`csr`]), the layout UMap's BFS reads.
//! - `faultline graph import`: text edge list ([`import`]) to the same
//!   format.
//! - `faultline bfs`: level-synchronous BFS ([`bfs`]) over the file mapped
//!   through the kernel or faultline ([`source`]), validated against an
//!   in-memory reference BFS, reported as a table and JSON lines.

pub mod bfs;
pub mod csr;
pub mod import;
pub mod rmat;
pub mod rng;
pub mod source;
pub mod units;

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use self::bfs::{bfs_parallel, bfs_reference, first_mismatch, UNREACHED};
use self::csr::CsrLayout;
use self::source::{drop_file_cache, warm_file, GraphSource, MmapSource};
use self::units::{format_size, parse_size, Budget};

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
    /// 2^SCALE vertices.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=rmat::MAX_SCALE as i64))]
    pub scale: u32,
    /// EDGE_FACTOR * 2^SCALE generated edges (each stored in both directions).
    #[arg(long, default_value_t = 16)]
    pub edge_factor: u64,
    /// PRNG seed: the same parameters and seed give the same file.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Keep R-MAT's vertex numbering (hubs at low ids) instead of scrambling it.
    #[arg(long)]
    pub no_scramble: bool,
    /// Generator threads (default: available CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Largest adjacency buffer held in memory; bigger graphs are built in
    /// vertex chunks, regenerating the edge stream per chunk.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
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

/// How the BFS maps the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Kernel `mmap` of the file (the baseline).
    Mmap,
    /// A faultline region backed by a `File` store.
    Faultline,
}

/// faultline fault-delivery engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// One handler thread blocking in poll(2).
    Poll,
    /// A handler thread busy-polling the userfaultfd.
    Spin,
    /// SIGBUS delivery (UFFD_FEATURE_SIGBUS) handled in the faulting thread.
    Signal,
    /// A pool of handler threads.
    Workers,
}

/// Arguments of `faultline bfs`.
#[derive(clap::Args)]
pub struct BfsArgs {
    /// Binary CSR graph file (`faultline graph gen` / `import`).
    pub file: PathBuf,
    /// Source vertex.
    #[arg(long, default_value_t = 0)]
    pub source: u64,
    /// BFS worker threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// How the graph is mapped.
    #[arg(long, value_enum, default_value_t = Mode::Mmap)]
    pub mode: Mode,
    /// faultline engine(s), comma-separated (faultline mode and --compare).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "poll")]
    pub engine: Vec<Engine>,
    /// faultline page size: 4K up to 2M, a power of two.
    #[arg(long, default_value = "4K", value_parser = parse_page_size)]
    pub page_size: u64,
    /// Extra pages fetched after the faulting one (faultline).
    #[arg(long, default_value_t = 0)]
    pub fault_around: usize,
    /// faultline memory budget: bytes (`512M`) or share of the file (`25%`);
    /// default unlimited.
    #[arg(long)]
    pub budget: Option<Budget>,
    /// Drop the file's cached pages before each run (cold cache).
    #[arg(long)]
    pub cold: bool,
    /// Run mmap, then each chosen faultline engine, on the same file.
    #[arg(long)]
    pub compare: bool,
    /// Append one JSON record per run to this file (JSON lines; truncated first).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print per-level statistics of each run.
    #[arg(long)]
    pub levels: bool,
}

fn parse_page_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v.is_power_of_two() && (4096..=2 << 20).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "page size {s:?} must be a power of two from 4K to 2M"
        ))
    }
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

fn create_output(path: &Path) -> anyhow::Result<BufWriter<File>> {
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    Ok(BufWriter::with_capacity(8 << 20, f))
}

fn finish_output(w: BufWriter<File>, path: &Path, sync: bool) -> anyhow::Result<()> {
    let f = w
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", path.display()))?;
    if sync {
        f.sync_all()
            .with_context(|| format!("fsync {}", path.display()))?;
    }
    Ok(())
}

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
    let t0 = Instant::now();
    let mut out = create_output(&args.output)?;
    let pb = progress_bar(0);
    let summary = rmat::generate(&params, &opts, &mut out, &pb)
        .with_context(|| format!("generating into {}", args.output.display()))?;
    pb.set_message("syncing");
    finish_output(out, &args.output, !args.no_sync)?;
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

fn run_import(args: ImportArgs) -> anyhow::Result<()> {
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
    let mut out = create_output(&args.output)?;
    csr::write_csr(&mut out, &graph)
        .with_context(|| format!("writing {}", args.output.display()))?;
    finish_output(out, &args.output, true)?;
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

/// One configuration to run.
#[derive(Debug, Clone, Copy)]
struct RunSpec {
    mode: Mode,
    engine: Option<Engine>,
}

/// One JSON record per run.
#[derive(Debug, Clone, Serialize)]
struct RunRecord {
    file: String,
    vertices: u64,
    edges: u64,
    source: u64,
    mode: Mode,
    engine: Option<Engine>,
    page_size: u64,
    fault_around: usize,
    budget_bytes: Option<u64>,
    threads: usize,
    cold: bool,
    /// `true`/`false` whether dropping the cache worked; `None` when warm.
    cache_dropped: Option<bool>,
    seconds: f64,
    handler_seconds: f64,
    faults: u64,
    major_faults: u64,
    bytes_read: Option<u64>,
    ratio_to_mmap: Option<f64>,
    levels: usize,
    reached: u64,
    valid: bool,
}

/// Faultline configuration of a run (what the faultline source needs).
// Fields are read once the faultline source is wired.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy)]
struct FaultlineConfig {
    engine: Engine,
    page_size: u64,
    fault_around: usize,
    budget_bytes: Option<u64>,
}

/// Builds the faultline-backed source.
///
/// FAULTLINE SOURCE GOES HERE: create a region of `layout.file_bytes()`
/// bytes backed by a `File` store on `path`, with `cfg.engine`,
/// `cfg.page_size`, `cfg.fault_around` and `cfg.budget_bytes`, and wrap it
/// in a `GraphSource` whose `stats()` reports the runtime's fault count,
/// bytes read from the store and handler time.
fn open_faultline_source(
    path: &Path,
    layout: CsrLayout,
    cfg: FaultlineConfig,
) -> anyhow::Result<Box<dyn GraphSource>> {
    let _ = (path, layout, cfg);
    bail!("faultline mode: not wired yet")
}

fn print_header() {
    println!(
        "{:<9} {:<7} {:>6} {:>9} {:>7} {:>9} {:>8} {:>11} {:>10} {:>7} {:>5}",
        "mode",
        "engine",
        "page",
        "budget",
        "threads",
        "seconds",
        "handler",
        "faults",
        "read",
        "ratio",
        "valid"
    );
}

fn print_row(r: &RunRecord) {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!(
        "{:<9} {:<7} {:>6} {:>9} {:>7} {:>9.3} {:>7.1}% {:>11} {:>10} {:>7} {:>5}",
        format!("{:?}", r.mode).to_lowercase(),
        opt(r.engine.map(|e| format!("{e:?}").to_lowercase())),
        format_size(r.page_size),
        opt(r.budget_bytes.map(format_size)),
        r.threads,
        r.seconds,
        100.0 * r.handler_seconds / r.seconds.max(1e-9),
        r.faults,
        opt(r.bytes_read.map(format_size)),
        opt(r.ratio_to_mmap.map(|x| format!("{x:.2}x"))),
        if r.valid { "yes" } else { "NO" },
    );
}

/// Runs `faultline bfs`.
pub fn run_bfs(args: BfsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.threads >= 1, "--threads must be at least 1");
    let path = &args.file;

    // Load and validate once, compute the reference levels, then free the
    // copy so the timed runs see only the mapped file.
    let t0 = Instant::now();
    let graph = csr::load(path).with_context(|| format!("loading graph {}", path.display()))?;
    let layout = graph.layout();
    anyhow::ensure!(
        layout.vertices > 0,
        "{}: graph has no vertices",
        path.display()
    );
    let reference = bfs_reference(&graph.index, &graph.edges, args.source)
        .with_context(|| format!("reference BFS on {}", path.display()))?;
    let ref_levels = reference
        .iter()
        .filter(|&&l| l != UNREACHED)
        .max()
        .map_or(0, |&l| l + 1);
    let ref_reached = reference.iter().filter(|&&l| l != UNREACHED).count() as u64;
    println!(
        "{}: {} vertices, {} edges, {}; source {} (degree {}) reaches {} vertices in {} levels \
         [loaded and checked in {:.2} s]",
        path.display(),
        layout.vertices,
        layout.edges,
        format_size(layout.file_bytes()),
        args.source,
        graph.degree(args.source),
        ref_reached,
        ref_levels,
        t0.elapsed().as_secs_f64(),
    );
    if graph.degree(args.source) == 0 {
        println!(
            "note: source {} has degree 0; the search ends at once",
            args.source
        );
    }
    drop(graph);

    let budget_bytes = args.budget.map(|b| b.resolve(layout.file_bytes()));
    let mut specs = Vec::new();
    if args.compare || args.mode == Mode::Mmap {
        specs.push(RunSpec {
            mode: Mode::Mmap,
            engine: None,
        });
    }
    if args.compare || args.mode == Mode::Faultline {
        for &e in &args.engine {
            specs.push(RunSpec {
                mode: Mode::Faultline,
                engine: Some(e),
            });
        }
    }

    let mut json = match &args.json {
        Some(p) => Some(create_output(p)?),
        None => None,
    };
    let mut mmap_seconds = None;
    print_header();
    for spec in specs {
        let cache_dropped = if args.cold {
            let d = drop_file_cache(path)?;
            if !d.worked() {
                eprintln!(
                    "warning: dropping the page cache of {} did not work: {} of {} pages still cached",
                    path.display(),
                    d.still_cached.map_or("unknown".into(), |c| c.to_string()),
                    d.pages
                );
            }
            Some(d.worked())
        } else {
            warm_file(path)?;
            None
        };
        let src: Box<dyn GraphSource> = match spec.mode {
            Mode::Mmap => Box::new(MmapSource::open(path, layout)?),
            Mode::Faultline => {
                let cfg = FaultlineConfig {
                    engine: spec.engine.unwrap_or(Engine::Poll),
                    page_size: args.page_size,
                    fault_around: args.fault_around,
                    budget_bytes,
                };
                open_faultline_source(path, layout, cfg)?
            }
        };
        let before = src.stats();
        let result = bfs_parallel(src.index(), src.edges(), args.source, args.threads)
            .with_context(|| format!("BFS on {}", path.display()))?;
        let stats = src.stats().since(&before);
        let page_size = src.page_size();
        drop(src);

        let mismatch = first_mismatch(&result.levels, &reference);
        if let Some((v, got, want)) = mismatch {
            eprintln!("error: BFS level of vertex {v} is {got}, reference says {want}");
        }
        if spec.mode == Mode::Mmap {
            mmap_seconds = Some(result.seconds);
        }
        let record = RunRecord {
            file: path.display().to_string(),
            vertices: layout.vertices,
            edges: layout.edges,
            source: args.source,
            mode: spec.mode,
            engine: spec.engine,
            page_size,
            fault_around: if spec.mode == Mode::Mmap {
                0
            } else {
                args.fault_around
            },
            budget_bytes: if spec.mode == Mode::Mmap {
                None
            } else {
                budget_bytes
            },
            threads: args.threads,
            cold: args.cold,
            cache_dropped,
            seconds: result.seconds,
            handler_seconds: stats.handler_seconds,
            faults: stats.faults,
            major_faults: stats.major_faults,
            bytes_read: stats.bytes_read,
            ratio_to_mmap: mmap_seconds.map(|m| result.seconds / m.max(1e-12)),
            levels: result.per_level.len(),
            reached: result.reached(),
            valid: mismatch.is_none(),
        };
        print_row(&record);
        if args.levels {
            for l in &result.per_level {
                println!(
                    "    level {:>3}: frontier {:>10} scanned {:>12} discovered {:>10} {:>8.3} s",
                    l.level, l.frontier, l.edges_scanned, l.discovered, l.seconds
                );
            }
        }
        if let (Some(w), Some(p)) = (json.as_mut(), args.json.as_ref()) {
            serde_json::to_writer(&mut *w, &record).context("encoding JSON record")?;
            writeln!(w)
                .and_then(|_| w.flush())
                .with_context(|| format!("writing {}", p.display()))?;
        }
        if !record.valid {
            bail!(
                "BFS result does not match the reference ({:?} run)",
                spec.mode
            );
        }
    }
    if let (Some(w), Some(p)) = (json, args.json.as_ref()) {
        finish_output(w, p, false)?;
    }
    Ok(())
}
