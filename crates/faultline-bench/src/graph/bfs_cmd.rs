//! `faultline bfs`: level-synchronous BFS ([`bfs`](super::bfs)) over a CSR
//! graph file mapped through the kernel or a faultline region
//! ([`source`](super::source)), every run validated against an in-memory
//! reference BFS, reported as a table and JSON lines.
//!
//! [`run_bfs`], step by step:
//! 1. check `--json` before any work; pick the engines ([`selected_engines`]);
//!    resolve `--budget` against the file's size;
//! 2. load and validate the graph once, compute the reference levels, then
//!    free the copy so the timed runs see only the mapped file
//!    ([`Reference::load`]);
//! 3. one configuration per mode and engine ([`specs`]): the mmap baseline,
//!    then each faultline engine;
//! 4. per configuration, `--reps` runs, each from a warm or a dropped page
//!    cache, each validated; the median run by time ([`median_run`]);
//! 5. its record ([`RunRecord`]): a table row, per-level lines with
//!    `--levels`, a JSON line with `--json`, and its time relative to the
//!    mmap run under `--compare`.
//!
//! In faultline mode the file is one region backed by a `File` store
//! ([`FaultlineSource`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::ValueEnum;
use serde::Serialize;

use super::bfs::{bfs_parallel, bfs_reference, first_mismatch, BfsResult, UNREACHED};
use super::csr::{self, CsrLayout};
use super::source::{
    drop_file_cache, warm_file, FaultlineOptions, FaultlineSource, GraphSource, MmapSource,
    SourceStats,
};
use super::units::{format_size, parse_size, Budget};

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
    /// A handler thread asleep on each CPU, the faulting thread's answering.
    #[serde(rename = "per-cpu")]
    PerCpu,
}

impl Engine {
    /// Every engine, in the order `--compare` runs them by default.
    pub const ALL: [Engine; 5] = [
        Engine::Poll,
        Engine::Spin,
        Engine::Signal,
        Engine::Workers,
        Engine::PerCpu,
    ];

    /// The library's engine kind.
    pub fn kind(self) -> faultline::EngineKind {
        match self {
            Engine::Poll => faultline::EngineKind::Poll,
            Engine::Spin => faultline::EngineKind::Spin,
            Engine::Signal => faultline::EngineKind::Signal,
            Engine::Workers => faultline::EngineKind::Workers,
            Engine::PerCpu => faultline::EngineKind::PerCpu,
        }
    }

    /// Where the engine's handler time is spent (the `handler` column).
    pub fn handler_time_on(self) -> HandlerTime {
        match self {
            Engine::Signal => HandlerTime::FaultingThreads,
            _ => HandlerTime::HandlerThreads,
        }
    }
}

/// What the `handler` column (`handler_seconds`) measures for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandlerTime {
    /// mmap: system CPU time of the whole process (`getrusage`), summed
    /// over threads; almost all of it is kernel fault handling.
    SystemCpu,
    /// `signal` engine: time in the SIGBUS handler, i.e. on the BFS threads
    /// themselves; it is part of the run's wall time.
    FaultingThreads,
    /// Thread engines: time the handler threads spent resolving, while the
    /// faulting BFS thread sleeps (poll, workers) or waits; it overlaps the
    /// run's wall time and adds CPU on other threads.
    HandlerThreads,
}

/// How a faultline region gets the graph file's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileAccessArg {
    /// page-cache when the file is on tmpfs (e.g. `/dev/shm`), else mmap.
    Auto,
    /// Copy straight from a read-only mapping of the file (page cache).
    Mmap,
    /// `pread(2)` into a scratch buffer, then copy.
    Pread,
    /// Zero copy: the region maps the file itself, privately (it must be
    /// on tmpfs), and installs its page-cache pages with `UFFDIO_CONTINUE`;
    /// no copy, no allocation.
    PageCache,
}

impl FileAccessArg {
    /// The library's store setting (the page-cache mode maps the file).
    pub fn access(self) -> faultline::FileAccess {
        match self {
            FileAccessArg::Pread => faultline::FileAccess::Pread,
            _ => faultline::FileAccess::Mmap,
        }
    }
    /// Whether the region must (`Some(true)`), may (`None`) or must not
    /// map the file's page cache.
    pub fn zero_copy(self) -> Option<bool> {
        match self {
            FileAccessArg::Auto => None,
            FileAccessArg::PageCache => Some(true),
            FileAccessArg::Mmap | FileAccessArg::Pread => Some(false),
        }
    }
}

/// Arguments of `faultline bfs`.
#[derive(clap::Args)]
pub struct BfsArgs {
    /// Binary CSR graph file (`faultline graph gen` / `import`).
    pub file: PathBuf,
    /// Source vertex (0 to the graph's vertices less one, checked when the
    /// graph is read).
    #[arg(long, default_value_t = 0, value_parser = faultline_cli_support::flags::range_u64(0, u64::MAX))]
    pub source: u64,
    /// BFS worker threads (1 to the threads this machine can still start).
    #[arg(long, default_value_t = 1, value_parser = faultline_cli_support::flags::threads(1))]
    pub threads: usize,
    /// How the graph is mapped.
    #[arg(long, value_enum, default_value_t = Mode::Mmap)]
    pub mode: Mode,
    /// faultline engine(s), comma-separated. Faultline mode runs each one
    /// listed (default: signal, the fastest); --compare runs each one
    /// listed, or all five when the option is not given.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub engine: Vec<Engine>,
    /// faultline region page size: a power of two from 4K to 2M.
    #[arg(long, default_value = "4K", value_parser = parse_page_size)]
    pub page_size: u64,
    /// faultline fault-around: region pages resolved per fault, the
    /// aligned window of N pages around the faulting one (1 = only the
    /// faulting page). Default: adaptive read-ahead, 16 pages per fault
    /// growing to 256 on sequential streams when pages are copied from the
    /// file, 64 growing to 512 when the file's page cache is mapped.
    /// Alone, a fixed window; with --readahead, the initial one (1 to
    /// 1048576).
    #[arg(long, value_parser = faultline_cli_support::flags::range_u64(1, 1 << 20))]
    pub fault_around: Option<u64>,
    /// How the faultline region gets the file's pages. Default: auto, the
    /// zero-copy page-cache mapping when the file is on tmpfs (e.g.
    /// `/dev/shm`), copies from a mapping of the file otherwise.
    #[arg(long, value_enum, default_value_t = FileAccessArg::Auto)]
    pub file_access: FileAccessArg,
    /// faultline memory budget: bytes (`512M`) or share of the file (`25%`);
    /// default unlimited. Past it, pages are evicted (and read again on the
    /// next fault).
    #[arg(long)]
    pub budget: Option<Budget>,
    /// Eviction policy under a budget: fifo, clock, refault.
    #[arg(long, default_value = "clock")]
    pub policy: faultline::policy::PolicyKind,
    /// Runs per configuration; the median (by time) is reported (1 to
    /// 1000).
    #[arg(long, default_value_t = 1, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
    /// faultline adaptive read-ahead: windows start at --fault-around (1
    /// if not given) and grow up to this many region pages on sequential
    /// streams; 0 fixes them at --fault-around. Default: adaptive (see
    /// --fault-around).
    #[arg(long, value_parser = faultline_cli_support::flags::range(0, 1 << 20))]
    pub readahead: Option<usize>,
    /// Drop the file's cached pages before each run (cold cache).
    #[arg(long)]
    pub cold: bool,
    /// Run mmap, then each chosen faultline engine (all five unless
    /// --engine is given), on the same file, and report each run's time
    /// relative to mmap. The `handler` column is system CPU time for mmap,
    /// time in the SIGBUS handler on the BFS threads for `signal`, and time
    /// on the handler threads for poll, spin, workers and per-cpu.
    #[arg(long)]
    pub compare: bool,
    /// Write one JSON record per run to this file (JSON lines), replacing
    /// it when every run is done (a failed run leaves the old file).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print per-level statistics of each run.
    #[arg(long)]
    pub levels: bool,
    /// Read the faultline region's pages from this store instead of the
    /// file: `redis://HOST:PORT#NAME`, `redis+unix:///PATH#NAME`,
    /// `redis-cluster://HOST:PORT,...#NAME` (uploaded with `faultline
    /// store put FILE URL`; FILE still gives the layout and the mmap
    /// baseline). Network stores are not signal-safe: the default engine
    /// becomes workers (--compare: poll, spin, workers).
    #[arg(long)]
    pub store: Option<String>,
}

fn parse_page_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v.is_power_of_two() && (4096..=2 << 20).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{s:?}: {} (a power of two: 4K to 2M)",
            faultline_cli_support::flags::range_error(4096, 2 << 20, "")
        ))
    }
}

impl BfsArgs {
    /// The read-ahead the flags ask for (`None`: the library's adaptive
    /// default).
    fn readahead(&self) -> Option<faultline::ReadaheadConfig> {
        let initial = self.fault_around.map(|n| n as usize);
        match (initial, self.readahead) {
            (None, None) => None,
            (Some(n), None) | (Some(n), Some(0)) => Some(faultline::ReadaheadConfig::fixed(n)),
            (None, Some(0)) => Some(faultline::ReadaheadConfig::off()),
            (n, Some(max)) => Some(faultline::ReadaheadConfig::adaptive(n.unwrap_or(1), max)),
        }
    }
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
    /// How the faultline store read the file (`None` for mmap).
    file_access: Option<FileAccessArg>,
    /// Whether the faultline region mapped the page cache without copies.
    zero_copy: Option<bool>,
    page_size: u64,
    /// Read-ahead: the fault-around window and the largest window
    /// (0 for mmap).
    fault_around: u64,
    readahead_max: u64,
    budget_bytes: Option<u64>,
    threads: usize,
    cold: bool,
    /// `true`/`false` whether dropping the cache worked; `None` when warm.
    cache_dropped: Option<bool>,
    seconds: f64,
    handler_seconds: f64,
    /// What `handler_seconds` measures (see [`HandlerTime`]).
    handler_time_on: HandlerTime,
    faults: u64,
    major_faults: u64,
    bytes_read: Option<u64>,
    ratio_to_mmap: Option<f64>,
    levels: usize,
    reached: u64,
    valid: bool,
}

/// Faultline configuration of a run (what the faultline source needs).
#[derive(Debug, Clone, Copy)]
struct FaultlineConfig<'a> {
    engine: Engine,
    page_size: u64,
    readahead: Option<faultline::ReadaheadConfig>,
    file_access: FileAccessArg,
    budget_bytes: Option<u64>,
    policy: faultline::policy::PolicyKind,
    /// A store URL to read pages from instead of the file (`--store`).
    store: Option<&'a str>,
}

/// Builds the faultline-backed source: one region covering `path` (rounded
/// up to the page size) backed by a `File` store, served by a fresh engine
/// of kind `cfg.engine`.
fn open_faultline_source(
    path: &Path,
    layout: CsrLayout,
    cfg: FaultlineConfig,
) -> anyhow::Result<Box<dyn GraphSource>> {
    let opts = FaultlineOptions {
        engine: cfg.engine.kind(),
        page_size: cfg.page_size,
        readahead: cfg.readahead,
        file_access: cfg.file_access.access(),
        zero_copy: cfg.file_access.zero_copy(),
        budget: cfg.budget_bytes.map(|b| (b, cfg.policy)),
        store: cfg.store,
    };
    Ok(Box::new(FaultlineSource::open(path, layout, opts)?))
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
        opt(r.engine.map(|e| e.kind().name().to_string())),
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
    let json_out = args
        .json
        .as_deref()
        .map(|p| faultline_cli_support::OutputPath::check(p, "--json"))
        .transpose()?;
    let path = &args.file;
    if let Some(out) = &json_out {
        out.refuse_same_as(path, "the graph")?;
    }
    let engines = selected_engines(&args);
    let budget_bytes = match args.budget {
        Some(b) => {
            let layout = csr::read_layout(path)
                .with_context(|| format!("reading the layout of {}", path.display()))?;
            Some(b.resolve(layout.file_bytes()))
        }
        None => None,
    };
    let reference = Reference::load(path, args.source)?;
    let mut json = json_out.as_ref().map(|_| Vec::new());
    let mut mmap_seconds = None;
    print_header();
    for spec in specs(&args, engines) {
        let run = median_run(&args, spec, &reference, budget_bytes)?;
        let mismatch = first_mismatch(&run.result.levels, &reference.levels);
        if let Some((v, got, want)) = mismatch {
            eprintln!("error: BFS level of vertex {v} is {got}, reference says {want}");
        }
        if spec.mode == Mode::Mmap {
            mmap_seconds = Some(run.result.seconds);
        }
        let record = RunRecord {
            file: path.display().to_string(),
            vertices: reference.layout.vertices,
            edges: reference.layout.edges,
            source: args.source,
            mode: spec.mode,
            engine: spec.engine,
            file_access: spec.engine.map(|_| args.file_access),
            zero_copy: run.paging.map(|p| p.1),
            page_size: run.page_size,
            fault_around: run.paging.map_or(0, |p| p.0.initial as u64),
            readahead_max: run.paging.map_or(0, |p| p.0.max as u64),
            budget_bytes: if spec.mode == Mode::Mmap {
                None
            } else {
                budget_bytes
            },
            threads: args.threads,
            cold: args.cold,
            cache_dropped: run.cache_dropped,
            seconds: run.result.seconds,
            handler_seconds: run.stats.handler_seconds,
            handler_time_on: spec
                .engine
                .map_or(HandlerTime::SystemCpu, Engine::handler_time_on),
            faults: run.stats.faults,
            major_faults: run.stats.major_faults,
            bytes_read: run.stats.bytes_read,
            ratio_to_mmap: mmap_seconds.map(|m| run.result.seconds / m.max(1e-12)),
            levels: run.result.per_level.len(),
            reached: run.result.reached(),
            valid: mismatch.is_none(),
        };
        report(&args, &record, &run.result, json.as_mut())?;
        if !record.valid {
            bail!(
                "BFS result does not match the reference ({:?} run)",
                spec.mode
            );
        }
    }
    if let (Some(lines), Some(out)) = (json, json_out) {
        out.write_bytes(&lines)?;
    }
    println!(
        "handler: mmap = system CPU time of the process; signal = SIGBUS handler time on the \
         BFS threads (inside the run's time); poll/spin/workers/per-cpu = resolve time on the handler \
         threads (overlaps the run, extra CPU). faults: kernel minor+major for mmap, faults \
         handled by faultline otherwise; read = region pages filled from the file x page size."
    );
    Ok(())
}

/// The graph's layout and the reference BFS levels from the source.
struct Reference {
    layout: CsrLayout,
    levels: Vec<u32>,
}

impl Reference {
    /// Loads and validates the graph at `path` once, computes the
    /// reference levels from `source` and says what the graph is, then
    /// frees the copy so the timed runs see only the mapped file.
    fn load(path: &Path, source: u64) -> anyhow::Result<Reference> {
        let t0 = Instant::now();
        let graph = csr::load(path).with_context(|| format!("loading graph {}", path.display()))?;
        let layout = graph.layout();
        anyhow::ensure!(
            layout.vertices > 0,
            "{}: graph has no vertices",
            path.display()
        );
        let levels = bfs_reference(&graph.index, &graph.edges, source)
            .with_context(|| format!("reference BFS on {}", path.display()))?;
        let ref_levels = levels
            .iter()
            .filter(|&&l| l != UNREACHED)
            .max()
            .map_or(0, |&l| l + 1);
        let ref_reached = levels.iter().filter(|&&l| l != UNREACHED).count() as u64;
        println!(
            "{}: {} vertices, {} edges, {}; source {} (degree {}) reaches {} vertices in {} levels \
             [loaded and checked in {:.2} s]",
            path.display(),
            layout.vertices,
            layout.edges,
            format_size(layout.file_bytes()),
            source,
            graph.degree(source),
            ref_reached,
            ref_levels,
            t0.elapsed().as_secs_f64(),
        );
        if graph.degree(source) == 0 {
            println!("note: source {source} has degree 0; the search ends at once");
        }
        Ok(Reference { layout, levels })
    }
}

/// The configurations to run: the mmap baseline (mmap mode or
/// `--compare`), then each of `engines` (faultline mode or `--compare`).
fn specs(args: &BfsArgs, engines: Vec<Engine>) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    if args.compare || args.mode == Mode::Mmap {
        specs.push(RunSpec {
            mode: Mode::Mmap,
            engine: None,
        });
    }
    if args.compare || args.mode == Mode::Faultline {
        for e in engines {
            specs.push(RunSpec {
                mode: Mode::Faultline,
                engine: Some(e),
            });
        }
    }
    specs
}

/// One timed run of a configuration.
struct Run {
    result: BfsResult,
    stats: SourceStats,
    /// The mapping's page size.
    page_size: u64,
    /// The faultline region's read-ahead and whether it maps the page
    /// cache (`None`: mmap).
    paging: Option<(faultline::ReadaheadConfig, bool)>,
    /// Whether dropping the page cache worked (`None`: warm).
    cache_dropped: Option<bool>,
}

/// `--reps` runs of `spec`, each validated against the reference (a
/// mismatch ends the command); the median run by time.
fn median_run(
    args: &BfsArgs,
    spec: RunSpec,
    reference: &Reference,
    budget_bytes: Option<u64>,
) -> anyhow::Result<Run> {
    let path = &args.file;
    let mut runs = Vec::new();
    for rep in 0..args.reps {
        faultline_cli_support::step(
            "bfs",
            &format!(
                "{}{} run {}/{}",
                match spec.mode {
                    Mode::Mmap => "mmap",
                    Mode::Faultline => "faultline",
                },
                spec.engine
                    .map_or(String::new(), |e| format!(" {}", e.kind().name())),
                rep + 1,
                args.reps
            ),
        );
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
            Mode::Mmap => Box::new(MmapSource::open(path, reference.layout)?),
            Mode::Faultline => {
                let cfg = FaultlineConfig {
                    engine: spec.engine.unwrap_or(Engine::Signal),
                    page_size: args.page_size,
                    readahead: args.readahead(),
                    file_access: args.file_access,
                    budget_bytes,
                    policy: args.policy,
                    store: args.store.as_deref(),
                };
                open_faultline_source(path, reference.layout, cfg)?
            }
        };
        let before = src.stats();
        let result = bfs_parallel(src.index(), src.edges(), args.source, args.threads)
            .with_context(|| format!("BFS on {}", path.display()))?;
        let stats = src.stats().since(&before);
        let page_size = src.page_size();
        let paging = src.paging();
        drop(src);

        if let Some((v, got, want)) = first_mismatch(&result.levels, &reference.levels) {
            bail!(
                "BFS level of vertex {v} is {got}, reference says {want} ({:?} run)",
                spec.mode
            );
        }
        runs.push(Run {
            result,
            stats,
            page_size,
            paging,
            cache_dropped,
        });
    }
    runs.sort_by(|x, y| x.result.seconds.total_cmp(&y.result.seconds));
    let mid = runs.len() / 2;
    Ok(runs.swap_remove(mid))
}

/// Prints `record` as a table row (and `result`'s levels with
/// `--levels`), and appends it to the `--json` file.
fn report(
    args: &BfsArgs,
    record: &RunRecord,
    result: &BfsResult,
    json: Option<&mut Vec<u8>>,
) -> anyhow::Result<()> {
    print_row(record);
    if args.levels {
        for l in &result.per_level {
            println!(
                "    level {:>3}: frontier {:>10} scanned {:>12} discovered {:>10} {:>8.3} s",
                l.level, l.frontier, l.edges_scanned, l.discovered, l.seconds
            );
        }
    }
    if let Some(w) = json {
        serde_json::to_writer(&mut *w, record).context("encoding JSON record")?;
        w.push(b'\n');
    }
    Ok(())
}

/// The faultline engines to run: those given with `--engine`; if none,
/// all five under `--compare`, signal in faultline mode, none in mmap mode.
fn selected_engines(args: &BfsArgs) -> Vec<Engine> {
    if !args.engine.is_empty() {
        if args.compare || args.mode == Mode::Faultline {
            return args.engine.clone();
        }
        return Vec::new();
    }
    // A network store is not signal-safe: the thread engines serve it.
    let signal_ok = args.store.is_none();
    if args.compare {
        let all = Engine::ALL.iter().copied();
        all.filter(|&e| signal_ok || e != Engine::Signal).collect()
    } else if args.mode == Mode::Faultline {
        vec![if signal_ok {
            Engine::Signal
        } else {
            Engine::Workers
        }]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::time::Duration;

    use super::*;
    use crate::graph::rmat::{generate, GenOptions, RmatParams};
    use indicatif::ProgressBar;

    /// A generated R-MAT graph file, removed on drop.
    struct TempGraph {
        path: PathBuf,
        layout: CsrLayout,
        reference: Vec<u32>,
    }

    impl TempGraph {
        fn new(tag: &str, scale: u32) -> TempGraph {
            Self::new_in(&std::env::temp_dir(), tag, scale)
        }

        fn new_in(dir: &Path, tag: &str, scale: u32) -> TempGraph {
            let path = dir.join(format!(
                "faultline-bfs-{tag}-{}-{scale}.bin",
                std::process::id()
            ));
            let p = RmatParams {
                scale,
                edge_factor: 8,
                seed: 7,
                scramble: true,
            };
            let opts = GenOptions {
                threads: 2,
                mem_limit: 1 << 30,
            };
            let mut f = File::create(&path).unwrap();
            generate(&p, &opts, &mut f, &ProgressBar::hidden()).unwrap();
            drop(f);
            let g = csr::load(&path).unwrap();
            let reference = bfs_reference(&g.index, &g.edges, 0).unwrap();
            TempGraph {
                path,
                layout: g.layout(),
                reference,
            }
        }

        /// Runs the BFS through faultline with `cfg`; checks the levels and
        /// the counters.
        fn check(&self, cfg: FaultlineConfig, threads: usize) {
            let src = open_faultline_source(&self.path, self.layout, cfg).unwrap();
            let before = src.stats();
            let r = bfs_parallel(src.index(), src.edges(), 0, threads).unwrap();
            let stats = src.stats().since(&before);
            assert_eq!(first_mismatch(&r.levels, &self.reference), None, "{cfg:?}");
            assert!(r.reached() > 1, "the search went nowhere: {cfg:?}");
            assert_eq!(src.page_size(), cfg.page_size);
            assert!(stats.faults > 0, "{cfg:?}: {stats:?}");
            let read = stats.bytes_read.unwrap();
            if src.paging().is_some_and(|(_, zero_copy)| zero_copy) {
                assert_eq!(read, 0, "zero copy: nothing read through a store");
                return;
            }
            let region = self.layout.file_bytes().next_multiple_of(cfg.page_size);
            // Under a budget evicted pages are read again.
            assert!(
                read > 0 && (read <= region || cfg.budget_bytes.is_some()),
                "{cfg:?}: read {read} of {region}"
            );
            assert!(read.is_multiple_of(cfg.page_size));
            // The handler adds a fault's time after its resolve ioctl has
            // woken the faulting thread, so a search that ends within a
            // fault or two (this graph is a few pages) can be read before
            // the handler has booked it: wait, bounded, until the handler
            // time shows, instead of asserting it at once.
            let booked = faultline::testing::child::wait_until(Duration::from_secs(10), || {
                src.stats().since(&before).handler_seconds > 0.0
            });
            let stats = src.stats().since(&before);
            assert!(
                booked && stats.handler_seconds < 60.0,
                "{cfg:?}: no handler time booked for {} faults: {stats:?}",
                stats.faults
            );
        }

        fn config(&self, engine: Engine) -> FaultlineConfig<'static> {
            FaultlineConfig {
                engine,
                page_size: 4096,
                readahead: Some(faultline::ReadaheadConfig::off()),
                file_access: FileAccessArg::Mmap,
                budget_bytes: None,
                policy: faultline::policy::PolicyKind::Clock,
                store: None,
            }
        }
    }

    impl Drop for TempGraph {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    #[test]
    fn faultline_poll_matches_reference() {
        let g = TempGraph::new("poll", 11);
        // The file is not a multiple of 64K: the last page reads zeros past
        // its end.
        assert!(!g.layout.file_bytes().is_multiple_of(64 << 10));
        g.check(g.config(Engine::Poll), 2);
        g.check(
            FaultlineConfig {
                page_size: 64 << 10,
                readahead: Some(faultline::ReadaheadConfig::fixed(4)),
                ..g.config(Engine::Poll)
            },
            2,
        );
        g.check(
            FaultlineConfig {
                page_size: 16 << 10,
                readahead: Some(faultline::ReadaheadConfig::fixed(3)),
                file_access: FileAccessArg::Pread,
                ..g.config(Engine::Workers)
            },
            3,
        );
        // A budget that covers the file needs no eviction.
        g.check(
            FaultlineConfig {
                budget_bytes: Some(g.layout.file_bytes()),
                ..g.config(Engine::Spin)
            },
            1,
        );
    }

    /// The only test that uses the `signal` engine (it installs a
    /// process-wide SIGBUS handler).
    #[test]
    fn faultline_signal_matches_reference() {
        let g = TempGraph::new("signal", 11);
        g.check(g.config(Engine::Signal), 2);
        g.check(
            FaultlineConfig {
                page_size: 64 << 10,
                readahead: Some(faultline::ReadaheadConfig::fixed(4)),
                ..g.config(Engine::Signal)
            },
            2,
        );
    }

    /// `--store`: the region reads a Redis copy of the graph (a server
    /// started for the test), thread engines, adaptive read-ahead; a store
    /// of another length is refused.
    #[test]
    fn redis_store_matches_reference() {
        let server = faultline_redis::server::RedisServer::start().unwrap();
        let g = TempGraph::new("redis", 11);
        let url = server.store_url("graph");
        let f = File::open(&g.path).unwrap();
        let len = g.layout.file_bytes();
        faultline_redis::RedisStore::put(&url, Default::default(), f, len, |_| {}).unwrap();
        for (engine, readahead) in [
            (Engine::Poll, None),
            (Engine::Workers, Some(faultline::ReadaheadConfig::fixed(16))),
        ] {
            g.check(
                FaultlineConfig {
                    readahead,
                    store: Some(&url),
                    ..g.config(engine)
                },
                2,
            );
        }
        let short = server.store_url("short");
        faultline_redis::RedisStore::put(
            &short,
            Default::default(),
            &[0u8; 4096][..],
            4096,
            |_| {},
        )
        .unwrap();
        let err = open_faultline_source(
            &g.path,
            g.layout,
            FaultlineConfig {
                store: Some(&short),
                ..g.config(Engine::Poll)
            },
        )
        .err()
        .unwrap();
        assert!(format!("{err:#}").contains("holds 4096 bytes"), "{err:#}");
    }

    /// Zero copy from a tmpfs file's page cache (CONTINUE), poll engine
    /// (the signal engine's SIGBUS handler is left to the test above).
    #[test]
    fn page_cache_mode_matches_reference() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("no /dev/shm: skipped");
            return;
        }
        let g = TempGraph::new_in(shm, "pagecache", 11);
        for fa in [1, 16] {
            g.check(
                FaultlineConfig {
                    file_access: FileAccessArg::PageCache,
                    readahead: Some(faultline::ReadaheadConfig::fixed(fa)),
                    ..g.config(Engine::Poll)
                },
                2,
            );
        }
        // With no flags, a tmpfs file is mapped without copies.
        g.check(
            FaultlineConfig {
                file_access: FileAccessArg::Auto,
                readahead: None,
                ..g.config(Engine::Poll)
            },
            2,
        );
        // A file that is not on tmpfs is refused with a reason.
        let disk = TempGraph::new("pagecache-disk", 8);
        let f = File::open(&disk.path).unwrap();
        if faultline_sys::mem::is_tmpfs(&f).unwrap() {
            eprintln!("the temp dir is tmpfs: refusal not checked");
            return;
        }
        let err = open_faultline_source(
            &disk.path,
            disk.layout,
            FaultlineConfig {
                file_access: FileAccessArg::PageCache,
                ..disk.config(Engine::Poll)
            },
        )
        .err()
        .expect("refused");
        assert!(format!("{err:#}").contains("tmpfs"), "{err:#}");
    }

    #[test]
    fn a_quarter_budget_evicts_and_stays_valid() {
        let g = TempGraph::new("budget", 11);
        for policy in [
            faultline::policy::PolicyKind::Fifo,
            faultline::policy::PolicyKind::Clock,
        ] {
            let cfg = FaultlineConfig {
                budget_bytes: Some(g.layout.file_bytes() / 4),
                policy,
                ..g.config(Engine::Poll)
            };
            g.check(cfg, 2);
        }
    }

    #[test]
    fn page_size_and_engine_selection() {
        assert_eq!(parse_page_size("4K"), Ok(4096));
        assert!(parse_page_size("12K").is_err(), "not a power of two");
        assert_eq!(parse_page_size("16K"), Ok(16 << 10));
        assert_eq!(parse_page_size("2M"), Ok(2 << 20));
        assert!(parse_page_size("6000").is_err());
        assert!(parse_page_size("4M").is_err());
        assert!(parse_page_size("0").is_err());
        let args = |mode, compare, engine: Vec<Engine>| BfsArgs {
            file: PathBuf::from("g.bin"),
            source: 0,
            threads: 1,
            mode,
            engine,
            page_size: 4096,
            fault_around: Some(1),
            file_access: FileAccessArg::Mmap,
            budget: None,
            policy: faultline::policy::PolicyKind::Clock,
            reps: 1,
            readahead: Some(0),
            cold: false,
            compare,
            json: None,
            levels: false,
            store: None,
        };
        assert_eq!(
            selected_engines(&args(Mode::Mmap, true, vec![])),
            Engine::ALL
        );
        assert_eq!(
            selected_engines(&args(Mode::Mmap, true, vec![Engine::Signal])),
            [Engine::Signal]
        );
        assert_eq!(
            selected_engines(&args(Mode::Faultline, false, vec![])),
            [Engine::Signal]
        );
        assert!(selected_engines(&args(Mode::Mmap, false, vec![Engine::Spin])).is_empty());
    }
}
