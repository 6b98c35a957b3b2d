//! `faultline bench random`: UMap's `pfbenchmark` shape under a buffer.
//!
//! For every page size (4 KiB, 64 KiB), access order (shuffled,
//! sequential) and buffer (10% and 50% of the data, and 100%: no
//! eviction), each mechanism runs pfbenchmark's two phases:
//!
//! 1. **write**: a fresh file is created and preallocated (as
//!    `pfbenchmark-write` does), mapped, and N threads write 8 bytes at the
//!    start of every page, each thread a contiguous piece of the order
//!    (OpenMP's static schedule); the mapping is unmapped (written back);
//! 2. **read**: the file is mapped again and every page is read and
//!    checked (as `pfbenchmark-read --noinit`).
//!
//! The mechanisms:
//!
//! * `mmap`: the kernel's `MAP_SHARED` mapping of the file (the page
//!   cache; no buffer of its own): the baseline of every shape;
//! * `faultline`: a region over a [`FileStore`] with a budget of the
//!   buffer's pages (signal engine: faults evict for themselves when the
//!   budget is full);
//! * `libumap`: `umap()` of a descriptor opened `O_RDWR | O_DIRECT`, as
//!   pfbenchmark opens it, with `UMAP_BUFSIZE` and `UMAP_PAGESIZE` set; in a
//!   child process per configuration (`--umap-child`), because libumap
//!   reads its `UMAP_*` variables once per process.
//!
//! The cost of a phase is its wall time per page (the access loop, as
//! pfbenchmark times it); every access is also timed with the TSC (the
//! latency distribution in the JSON). Ratios are to `mmap` of the same
//! shape and phase, in the same run.

use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::Context;
use faultline::policy::PolicyKind;
use faultline::{EvictionConfig, FileStore, Region, SignalEngine};
use faultline_cli_support::cleanup::{self, Guard};
use faultline_sys::mem::{Mapping, O_DIRECT};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::harness::report::{fmt_ns, fmt_ratio, print_table, Record};
use crate::harness::stats::median;
use crate::harness::stats::Summary;
use crate::harness::tsc::{rdtsc, tsc};
use crate::harness::BenchCtx;

/// Options of `faultline bench random`.
#[derive(clap::Args, Clone, Debug)]
pub struct RandomArgs {
    /// Directory of the data file (created and removed by the bench; it
    /// decides the file system). Default: the system's temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// MiB of data (256: pfbenchmark's 65,536 pages of 4 KiB; 1 to what
    /// MemAvailable holds).
    #[arg(long, default_value_t = 256, value_parser = faultline_cli_support::flags::mib())]
    pub mib: usize,
    /// Accessing threads, comma-separated (each count is a run; each 1 to
    /// the threads this machine can still start).
    #[arg(long, default_value = "2", value_delimiter = ',', value_parser = faultline_cli_support::flags::threads(1))]
    pub threads: Vec<usize>,
    /// Buffers in percent of the data, comma-separated (100: no eviction;
    /// each 1 to 100).
    #[arg(long, default_value = "10,50,100", value_delimiter = ',', value_parser = faultline_cli_support::flags::range_u32(1, 100))]
    pub buffer: Vec<u32>,
    /// Page sizes in KiB, comma-separated (UMAP_PAGESIZE; the region's;
    /// each a power of two from 4 to 2048).
    #[arg(long, default_value = "4,64", value_delimiter = ',', value_parser = faultline_cli_support::flags::power_of_two(4, 2048))]
    pub page_kib: Vec<usize>,
    /// Access orders, comma-separated: shuffled, seq.
    #[arg(long, default_value = "shuffled,seq", value_delimiter = ',')]
    pub order: Vec<Order>,
    /// Mechanisms, comma-separated: mmap, faultline, libumap.
    #[arg(long, default_value = "mmap,faultline,libumap", value_delimiter = ',')]
    pub mech: Vec<Mech>,
    /// Repetitions of every configuration (medians are reported; 1 to
    /// 1000).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
    /// Shuffle seed (any number to 2^64 - 1).
    #[arg(long, default_value_t = 1, value_parser = faultline_cli_support::flags::range_u64(0, u64::MAX))]
    pub seed: u64,
    /// Internal: run one libumap configuration in this process and print
    /// its result (the parent sets the UMAP_* variables).
    #[arg(long, hide = true)]
    pub umap_child: Option<String>,
}

/// An access order.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// pfbenchmark's `--shuffle`.
    Shuffled,
    /// Page order.
    Seq,
}

impl Order {
    fn name(self) -> &'static str {
        match self {
            Order::Shuffled => "shuffled",
            Order::Seq => "seq",
        }
    }
}

/// A way of mapping the file.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mech {
    /// The kernel's MAP_SHARED mapping.
    Mmap,
    /// A faultline region with a budget.
    Faultline,
    /// umap() of an O_DIRECT descriptor, in a child process.
    Libumap,
}

impl Mech {
    fn name(self) -> &'static str {
        match self {
            Mech::Mmap => "mmap",
            Mech::Faultline => "faultline",
            Mech::Libumap => "libumap",
        }
    }
}

/// One configuration: the shape of the data and the buffer.
#[derive(Clone, Copy, Debug)]
struct Shape {
    page: usize,
    pages: usize,
    order: Order,
    threads: usize,
    /// Buffer in pages (the budget; `pages` for no eviction).
    buffer: usize,
}

/// What one run of both phases measured.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Phases {
    write_ns_per_page: f64,
    read_ns_per_page: f64,
    write: Summary,
    read: Summary,
}

/// The data file, `DIR/faultline-random-PID.bin`: a cleanup temporary,
/// removed when dropped (an error included), on SIGINT, SIGTERM and
/// SIGHUP, and by a later run into the same directory once PID is gone.
struct DataFile(
    PathBuf,
    #[allow(dead_code, reason = "removes the file when dropped")] Guard,
);

impl DataFile {
    fn new(dir: &Path) -> DataFile {
        cleanup::sweep_prefixed(dir, "faultline-random-");
        let guard = cleanup::temp(dir, "faultline-random-", ".bin");
        DataFile(guard.path().to_path_buf(), guard)
    }
}

/// Creates `path` anew, preallocated to `len` bytes (pfbenchmark-write's
/// `O_CREAT` after `unlink`, then `posix_fallocate`).
fn fresh_file(path: &Path, len: usize) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    faultline_sys::mem::fallocate(&f, len as u64)
        .with_context(|| format!("preallocating {} bytes of {}", len, path.display()))?;
    Ok(())
}

/// The page indices in access order.
fn order_of(shape: &Shape, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shape.pages).collect();
    if shape.order == Order::Shuffled {
        order.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(seed));
    }
    order
}

/// The value pfbenchmark writes into page `idx` (its first u64).
fn value_of(idx: usize, page: usize) -> u64 {
    (idx * (page / 8)) as u64
}

/// One phase over a mapping at `base`: `threads` threads each take a
/// contiguous piece of `order`; writes store [`value_of`], reads check
/// it. Returns the wall time in ns, every access's cycles, and the number
/// of pages read back wrong.
fn phase(base: usize, shape: &Shape, order: &[usize], write: bool) -> (f64, Vec<u64>, usize) {
    let per = order.len().div_ceil(shape.threads.max(1));
    let barrier = Barrier::new(shape.threads.max(1) + 1);
    let mut samples = Vec::with_capacity(order.len());
    let mut bad = 0;
    let mut wall = 0.0;
    let page = shape.page;
    std::thread::scope(|s| {
        let handles: Vec<_> = order
            .chunks(per)
            .map(|chunk| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut cycles = Vec::with_capacity(chunk.len());
                    let mut wrong = 0;
                    barrier.wait();
                    for &idx in chunk {
                        let p = (base + idx * page) as *mut u64;
                        let want = value_of(idx, page);
                        let t0 = rdtsc();
                        if write {
                            // SAFETY: `idx` is a page of the mapping, which
                            // is writable and outlives the threads.
                            unsafe { p.write_volatile(want) };
                        } else {
                            // SAFETY: as above; readable.
                            let got = unsafe { p.read_volatile() };
                            wrong += usize::from(got != want);
                        }
                        cycles.push(rdtsc() - t0);
                    }
                    (cycles, wrong)
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        for h in handles {
            let (c, w) = h.join().expect("accessing thread");
            samples.extend(c);
            bad += w;
        }
        wall = t0.elapsed().as_nanos() as f64;
    });
    (wall, samples, bad)
}

/// Both phases through `map` (which maps the file for a phase and returns
/// the address and what unmaps it).
fn both_phases<M>(
    path: &Path,
    shape: &Shape,
    order: &[usize],
    map: impl Fn(&Path, usize, bool) -> anyhow::Result<(usize, M)>,
) -> anyhow::Result<Phases> {
    let len = shape.page * shape.pages;
    fresh_file(path, len)?;
    let mut out = Phases::default();
    for write in [true, false] {
        let (base, mapping) = map(path, len, write)?;
        let (wall, mut cycles, bad) = phase(base, shape, order, write);
        drop(mapping);
        anyhow::ensure!(bad == 0, "{bad} pages read back wrong");
        let per_page = wall / shape.pages as f64;
        let s = Summary::from_cycles(&mut cycles, tsc());
        if write {
            (out.write_ns_per_page, out.write) = (per_page, s);
        } else {
            (out.read_ns_per_page, out.read) = (per_page, s);
        }
    }
    Ok(out)
}

/// A mapping that unmaps (and writes back) on drop.
enum Mapped {
    Mmap(#[allow(dead_code, reason = "kept mapped until dropped")] Mapping),
    Region(#[allow(dead_code, reason = "kept mapped until dropped")] Region),
    Umap(
        *mut u8,
        usize,
        #[allow(dead_code, reason = "kept open until unmapped")] std::fs::File,
    ),
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Mapped::Umap(p, len, _) = *self {
            // SAFETY: the pointer came from umap() and no thread uses it now.
            let rc = unsafe { umap::uunmap(p.cast(), len) };
            if rc != 0 {
                eprintln!("uunmap failed: {}", std::io::Error::last_os_error());
            }
        }
    }
}

fn run_mmap(path: &Path, shape: &Shape, order: &[usize]) -> anyhow::Result<Phases> {
    both_phases(path, shape, order, |path, len, _| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let m = Mapping::shared(&f, len, 0)?;
        Ok((m.addr() as usize, Mapped::Mmap(m)))
    })
}

fn run_faultline(path: &Path, shape: &Shape, order: &[usize]) -> anyhow::Result<Phases> {
    let engine = SignalEngine::new()?;
    both_phases(path, shape, order, |path, len, _| {
        let r = Region::builder(len)
            .page_size(shape.page)
            .store(FileStore::open(path)?)
            .zero_copy(false)
            .budget(EvictionConfig {
                budget_pages: shape.buffer,
                policy: PolicyKind::Clock,
            })
            .build(&engine)?;
        Ok((r.as_ptr() as usize, Mapped::Region(r)))
    })
}

/// In the child: both phases through umap() (the UMAP_* variables are
/// the parent's).
fn run_umap_here(path: &Path, shape: &Shape, order: &[usize]) -> anyhow::Result<Phases> {
    both_phases(path, shape, order, |path, len, _| {
        // As pfbenchmark opens it.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(O_DIRECT)
            .open(path)?;
        // SAFETY: no fixed address; the descriptor is open.
        let p = unsafe {
            umap::umap(
                std::ptr::null_mut(),
                len,
                0x1 | 0x2, // PROT_READ | PROT_WRITE
                0x2,       // UMAP_PRIVATE
                f.as_raw_fd(),
                0,
            )
        };
        anyhow::ensure!(
            p as usize != usize::MAX,
            "umap: {}",
            std::io::Error::last_os_error()
        );
        Ok((p as usize, Mapped::Umap(p.cast(), len, f)))
    })
}

/// The child's arguments: `PATH PAGE PAGES ORDER THREADS SEED`.
fn child_spec(path: &Path, shape: &Shape, seed: u64) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}",
        path.display(),
        shape.page,
        shape.pages,
        shape.order.name(),
        shape.threads,
        seed
    )
}

/// `--umap-child`: runs one configuration and prints its [`Phases`] as
/// JSON on stdout.
fn umap_child(spec: &str) -> anyhow::Result<()> {
    let f: Vec<&str> = spec.split('\t').collect();
    anyhow::ensure!(f.len() == 6, "bad --umap-child spec {spec:?}");
    let order = match f[3] {
        "shuffled" => Order::Shuffled,
        _ => Order::Seq,
    };
    let shape = Shape {
        page: f[1].parse()?,
        pages: f[2].parse()?,
        order,
        threads: f[4].parse()?,
        buffer: 0,
    };
    let seed: u64 = f[5].parse()?;
    let idx = order_of(&shape, seed);
    let out = run_umap_here(Path::new(f[0]), &shape, &idx)?;
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &out)?;
    writeln!(stdout)?;
    Ok(())
}

/// libumap in a child process with `UMAP_BUFSIZE` and `UMAP_PAGESIZE`.
fn run_libumap(path: &Path, shape: &Shape, seed: u64) -> anyhow::Result<Phases> {
    let exe = std::env::current_exe().context("finding the faultline binary")?;
    // Owned: killed with this process on a signal or when it dies.
    let out = faultline_cli_support::cleanup::output(
        Command::new(exe)
            .args(["bench", "random", "--umap-child"])
            .arg(child_spec(path, shape, seed))
            .env("UMAP_BUFSIZE", shape.buffer.to_string())
            .env("UMAP_PAGESIZE", shape.page.to_string()),
    )
    .context("running the libumap child")?;
    anyhow::ensure!(
        out.status.success(),
        "libumap child failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let last = line
        .lines()
        .last()
        .context("the libumap child printed nothing")?;
    serde_json::from_str(last).with_context(|| format!("the libumap child printed {last:?}"))
}

/// What `bench random` needs, checked before any bench runs: its most
/// threads.
pub fn check(args: &RandomArgs) -> anyhow::Result<()> {
    faultline_cli_support::flags::most_threads(&args.threads, "bench random").map(drop)
}

/// Runs the benchmark.
pub fn run(ctx: &mut BenchCtx, args: &RandomArgs) -> anyhow::Result<()> {
    if let Some(spec) = &args.umap_child {
        return umap_child(spec);
    }
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    faultline_cli_support::flags::check_disk(
        &dir,
        (args.mib as u64) << 20,
        format_args!("bench random --mib {}: the data file", args.mib),
    )?;
    let data = DataFile::new(&dir);
    anyhow::ensure!(
        args.mib > 0 && args.reps > 0,
        "--mib and --reps must be at least 1"
    );
    anyhow::ensure!(
        args.buffer.iter().all(|&b| (1..=100).contains(&b)),
        "--buffer is a percentage of the data, 1-100"
    );
    let mut shapes = Vec::new();
    for &kib in &args.page_kib {
        anyhow::ensure!(
            kib >= 4 && kib.is_power_of_two(),
            "--page-kib {kib}: a power of two of at least 4"
        );
        let page = kib << 10;
        let pages = (args.mib << 20) / page;
        anyhow::ensure!(
            pages > 0,
            "{} MiB is less than a page of {kib} KiB",
            args.mib
        );
        for &order in &args.order {
            for &threads in &args.threads {
                shapes.push(Shape {
                    page,
                    pages,
                    order,
                    threads: threads.max(1),
                    buffer: pages,
                });
            }
        }
    }
    println!(
        "\n== random: pfbenchmark's write then read of {} MiB in {} (each phase's wall time per page; ratios to mmap of the same shape), buffers {:?}% of the data, {} reps ==",
        args.mib,
        dir.display(),
        args.buffer,
        args.reps
    );
    let with_buffer = args.mech.iter().filter(|&&m| m != Mech::Mmap).count();
    let steps = (shapes.len()
        * args.reps
        * (usize::from(args.mech.contains(&Mech::Mmap)) + with_buffer * args.buffer.len()))
        as u64;
    let mut progress = ctx.progress(steps, "random");
    let mut rows = Vec::new();
    let mut groups = Vec::new();
    let mut series: Vec<(String, Vec<f64>)> = Vec::new();
    for base in &shapes {
        let what = format!(
            "{} KiB {} x{}",
            base.page >> 10,
            base.order.name(),
            base.threads
        );
        let order = order_of(base, args.seed);
        // (mechanism, buffer %) -> per-page write and read costs of every rep.
        let mut runs: Vec<(Mech, u32, Vec<Phases>)> = Vec::new();
        for rep in 0..args.reps {
            // Alternate the mechanisms within each repetition.
            if args.mech.contains(&Mech::Mmap) {
                progress.step(&format!("{what} mmap rep {rep}"));
                let p = run_mmap(&data.0, base, &order).context("mmap")?;
                push_run(&mut runs, Mech::Mmap, 100, p);
            }
            for &pct in &args.buffer {
                let shape = Shape {
                    buffer: (base.pages * pct as usize / 100).max(1),
                    ..*base
                };
                for &mech in args.mech.iter().filter(|&&m| m != Mech::Mmap) {
                    progress.step(&format!("{what} {} {pct}% rep {rep}", mech.name()));
                    let p = match mech {
                        Mech::Faultline => run_faultline(&data.0, &shape, &order),
                        Mech::Libumap => run_libumap(&data.0, &shape, args.seed),
                        Mech::Mmap => unreachable!("mmap has no buffer"),
                    }
                    .with_context(|| format!("{what} {} {pct}%", mech.name()))?;
                    push_run(&mut runs, mech, pct, p);
                }
            }
        }
        let mut mmap_cost = [f64::NAN; 2];
        for (mech, pct, phases) in &mut runs {
            for (k, op) in ["write", "read"].into_iter().enumerate() {
                let of = |p: &Phases| {
                    if k == 0 {
                        (p.write_ns_per_page, p.write)
                    } else {
                        (p.read_ns_per_page, p.read)
                    }
                };
                let mut costs: Vec<f64> = phases.iter().map(|p| of(p).0).collect();
                let cost = median(&mut costs);
                if *mech == Mech::Mmap {
                    mmap_cost[k] = cost;
                }
                let ratio = cost / mmap_cost[k];
                // The latency distribution of the median run.
                let s = phases
                    .iter()
                    .map(of)
                    .find(|(c, _)| *c == cost)
                    .map(|(_, s)| s)
                    .unwrap_or_default();
                let buffer = if *mech == Mech::Mmap {
                    "-".to_string()
                } else if *pct == 100 {
                    "100% (no eviction)".to_string()
                } else {
                    format!("{pct}%")
                };
                rows.push(vec![
                    format!("{} KiB", base.page >> 10),
                    base.order.name().to_string(),
                    base.threads.to_string(),
                    op.to_string(),
                    buffer.clone(),
                    mech.name().to_string(),
                    fmt_ns(cost),
                    fmt_ratio(ratio),
                ]);
                let group = format!("{} {op} {buffer}", &what);
                if !groups.contains(&group) && *mech != Mech::Mmap {
                    groups.push(group.clone());
                }
                ctx.report.push(
                    Record::new("random", mech.name(), op, base.order.name(), &s)
                        .with("page_bytes", base.page)
                        .with("pages", base.pages)
                        .with("threads", base.threads)
                        .with("buffer_percent", *pct)
                        .with("wall_ns_per_page", cost)
                        .with("ratio_to_mmap", ratio),
                );
                if *mech != Mech::Mmap {
                    let name = mech.name().to_string();
                    let gi = groups.iter().position(|g| *g == group).expect("pushed");
                    let si = match series.iter().position(|(n, _)| *n == name) {
                        Some(i) => i,
                        None => {
                            series.push((name, Vec::new()));
                            series.len() - 1
                        }
                    };
                    let v = &mut series[si].1;
                    v.resize(gi + 1, 0.0);
                    v[gi] = ratio;
                }
            }
        }
    }
    progress.finish();
    print_table(
        &[
            "page",
            "order",
            "threads",
            "phase",
            "buffer",
            "mechanism",
            "per page",
            "x mmap",
        ],
        &rows,
    );
    for (_, v) in &mut series {
        v.resize(groups.len(), 0.0);
    }
    ctx.figure("random", |dir, name| {
        crate::harness::plot::group_bars(
            dir,
            name,
            "pfbenchmark shape: cost per page relative to mmap",
            "x mmap (log)",
            &groups,
            &series,
        )
    })?;
    drop(data);
    Ok(())
}

/// Adds one run's phases to `runs` under (mechanism, buffer).
fn push_run(runs: &mut Vec<(Mech, u32, Vec<Phases>)>, mech: Mech, pct: u32, p: Phases) {
    match runs.iter_mut().find(|(m, b, _)| *m == mech && *b == pct) {
        Some((_, _, v)) => v.push(p),
        None => runs.push((mech, pct, vec![p])),
    }
}
