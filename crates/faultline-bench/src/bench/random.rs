//! `faultline bench random`: the shape of UMap's `pfbenchmark`. N threads
//! read one byte of every page of a file in a shuffled page order, through
//!
//! * `mmap`: the kernel's `mmap(MAP_PRIVATE)` of the file (the baseline),
//! * `faultline`: a region over a [`FileStore`] (signal engine, defaults),
//! * `libumap`: `umap()` of the file descriptor, the `umap` crate's C entry
//!   point (UMap's defaults: a resident budget with dirty tracking; the
//!   `UMAP_*` variables of the environment apply),
//!
//! each in the same run, on a fresh mapping per repetition, the file's page
//! cache warm (it is read once before). Every access is timed with the TSC
//! (the per-page cost distribution) and the wall time of the whole pass
//! gives the per-page throughput cost; ratios are to `mmap`'s.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::Context;
use faultline::{FileStore, Region, SignalEngine};
use faultline_cli_support::cleanup;
use faultline_sys::mem::Mapping;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::harness::report::{fmt_ns, fmt_ratio, print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::tsc::{rdtsc, tsc};
use crate::harness::BenchCtx;

const PAGE: usize = 4096;

/// Options of `faultline bench random`.
#[derive(clap::Args, Clone, Debug)]
pub struct RandomArgs {
    /// File to read (created with a pattern when missing). Default: a
    /// temporary file in /tmp, removed afterwards.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// MiB of the temporary file (1 to what MemAvailable holds).
    #[arg(long, default_value_t = 256, value_parser = faultline_cli_support::flags::mib())]
    pub mib: usize,
    /// Reading threads, comma-separated (each count is a run; each 1 to
    /// the threads this machine can still start).
    #[arg(long, default_value = "1,2", value_delimiter = ',', value_parser = faultline_cli_support::flags::threads(1))]
    pub threads: Vec<usize>,
    /// Repetitions per mechanism and thread count (medians are reported;
    /// 1 to 1000).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
    /// Shuffle seed (any number to 2^64 - 1).
    #[arg(long, default_value_t = 1, value_parser = faultline_cli_support::flags::range_u64(0, u64::MAX))]
    pub seed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mech {
    Mmap,
    Faultline,
    Umap,
}

impl Mech {
    const ALL: [Mech; 3] = [Mech::Mmap, Mech::Faultline, Mech::Umap];
    fn name(self) -> &'static str {
        match self {
            Mech::Mmap => "mmap",
            Mech::Faultline => "faultline",
            Mech::Umap => "libumap",
        }
    }
}

/// A mapping of the file by one mechanism, unmapped on drop.
enum Mapped {
    Mmap(Mapping),
    Region(Region),
    Umap(*mut u8, usize),
}

impl Mapped {
    fn ptr(&self) -> *const u8 {
        match self {
            Mapped::Mmap(m) => m.as_ptr(),
            Mapped::Region(r) => r.as_ptr(),
            Mapped::Umap(p, _) => *p,
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Mapped::Umap(p, len) = *self {
            // SAFETY: the pointer came from umap() and no thread uses it now.
            let rc = unsafe { umap::uunmap(p.cast(), len) };
            if rc != 0 {
                eprintln!("uunmap failed: {}", std::io::Error::last_os_error());
            }
        }
    }
}

fn map(
    mech: Mech,
    file: &std::fs::File,
    path: &std::path::Path,
    len: usize,
) -> anyhow::Result<Mapped> {
    Ok(match mech {
        Mech::Mmap => Mapped::Mmap(Mapping::file_private_readonly(file, len)?),
        Mech::Faultline => {
            let engine = SignalEngine::new()?;
            Mapped::Region(
                Region::builder(len)
                    .store(FileStore::open(path)?)
                    .zero_copy(false)
                    .build(&engine)?,
            )
        }
        Mech::Umap => {
            // SAFETY: no fixed address; the file descriptor is open.
            let p = unsafe {
                umap::umap(
                    std::ptr::null_mut(),
                    len,
                    0x1, // PROT_READ
                    0x2, // UMAP_PRIVATE
                    file.as_raw_fd(),
                    0,
                )
            };
            if p as usize == usize::MAX {
                anyhow::bail!("umap: {}", std::io::Error::last_os_error());
            }
            Mapped::Umap(p.cast(), len)
        }
    })
}

/// One pass: `threads` threads read the pages of `order` (each a slice);
/// returns the wall time in ns and every access's cycles.
fn pass(base: *const u8, order: &[usize], threads: usize) -> (f64, Vec<u64>) {
    let per = order.len().div_ceil(threads);
    let barrier = Barrier::new(threads + 1);
    let base = base as usize;
    let mut samples = Vec::with_capacity(order.len());
    let mut wall = 0.0;
    std::thread::scope(|s| {
        let handles: Vec<_> = order
            .chunks(per)
            .map(|chunk| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut cycles = Vec::with_capacity(chunk.len());
                    let mut sink = 0u64;
                    barrier.wait();
                    for &page in chunk {
                        let p = (base + page * PAGE) as *const u8;
                        let t0 = rdtsc();
                        // SAFETY: `page` is inside the mapping, which is
                        // readable and outlives the threads.
                        sink = sink.wrapping_add(unsafe { p.read_volatile() } as u64);
                        cycles.push(rdtsc() - t0);
                    }
                    std::hint::black_box(sink);
                    cycles
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        for h in handles {
            samples.extend(h.join().expect("reader thread"));
        }
        wall = t0.elapsed().as_nanos() as f64;
    });
    (wall, samples)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What `bench random` needs, checked before any bench runs: its most
/// threads.
pub fn check(args: &RandomArgs) -> anyhow::Result<()> {
    let most = args.threads.iter().copied().max().unwrap_or(1);
    faultline_cli_support::flags::check_threads(
        most as u64,
        format_args!("bench random --threads {most}"),
    )
}

/// Runs the benchmark.
pub fn run(ctx: &mut BenchCtx, args: &RandomArgs) -> anyhow::Result<()> {
    // The default file is a temporary: `/tmp/faultline-random-PID.bin`,
    // removed on return or error, on SIGINT/SIGTERM/SIGHUP, and by a later
    // run once PID is gone.
    let (path, _temp) = match &args.file {
        Some(p) => (p.clone(), None),
        None => {
            let tmp = std::env::temp_dir();
            cleanup::sweep_prefixed(&tmp, "faultline-random-");
            let guard = cleanup::temp(&tmp, "faultline-random-", ".bin");
            (guard.path().to_path_buf(), Some(guard))
        }
    };
    if !path.exists() {
        let out = faultline_cli_support::OutputPath::check(&path, "--file")?;
        faultline_cli_support::flags::check_disk(
            out.target(),
            (args.mib as u64) << 20,
            format_args!("bench random --mib {}", args.mib),
        )?;
        let data: Vec<u8> = (0..args.mib << 20)
            .map(|i| (i / PAGE) as u8 ^ i as u8)
            .collect();
        out.write_bytes(&data)?;
    }
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let len = (file.metadata()?.len() as usize) / PAGE * PAGE;
    anyhow::ensure!(len > 0, "{} is shorter than a page", path.display());
    // Warm the page cache so every mechanism starts from the same state.
    let _ = std::fs::read(&path)?;
    let pages = len / PAGE;
    let mut order: Vec<usize> = (0..pages).collect();
    order.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(args.seed));
    println!(
        "\n== random: {} threads reading {} pages of {} in shuffled order (page cache warm), {} reps ==",
        args.threads.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(","),
        pages,
        path.display(),
        args.reps
    );
    let steps = (args.threads.len() * Mech::ALL.len() * args.reps) as u64;
    let mut progress = ctx.progress(steps, "random");
    let mut rows = Vec::new();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Mech::ALL
        .iter()
        .map(|m| (m.name().to_string(), Vec::new()))
        .collect();
    for &threads in &args.threads {
        let threads = threads.max(1);
        let mut walls: Vec<Vec<f64>> = vec![Vec::new(); Mech::ALL.len()];
        let mut samples: Vec<Vec<u64>> = vec![Vec::new(); Mech::ALL.len()];
        // Alternate mechanisms within each repetition.
        for rep in 0..args.reps {
            for (i, &mech) in Mech::ALL.iter().enumerate() {
                progress.step(&format!("{} x{threads} rep {rep}", mech.name()));
                let m = map(mech, &file, &path, len)
                    .with_context(|| format!("mapping through {}", mech.name()))?;
                let (wall, s) = pass(m.ptr(), &order, threads);
                drop(m);
                walls[i].push(wall / pages as f64);
                samples[i].extend(s);
            }
        }
        let mmap_ns = median(&mut walls[0].clone());
        for (i, &mech) in Mech::ALL.iter().enumerate() {
            let per_page = median(&mut walls[i]);
            let s = Summary::from_cycles(&mut samples[i], tsc());
            let ratio = per_page / mmap_ns;
            rows.push(vec![
                mech.name().to_string(),
                threads.to_string(),
                fmt_ns(per_page),
                fmt_ns(s.median),
                fmt_ns(s.p99),
                fmt_ratio(ratio),
            ]);
            series[i].1.push((threads as f64, per_page));
            ctx.report.push(
                Record::new("random", mech.name(), "-", "read", &s)
                    .with("threads", threads)
                    .with("pages", pages)
                    .with("wall_ns_per_page", per_page)
                    .with("ratio_to_mmap", ratio),
            );
        }
    }
    progress.finish();
    print_table(
        &[
            "mechanism",
            "threads",
            "wall/page",
            "access p50",
            "access p99",
            "x mmap",
        ],
        &rows,
    );
    ctx.figure("random", |dir, name| {
        crate::harness::plot::line_chart(
            dir,
            name,
            "Shuffled page reads (pfbenchmark shape)",
            "reading threads",
            "wall time per page (ns)",
            &series,
            false,
        )
    })?;
    drop(file);
    Ok(())
}
