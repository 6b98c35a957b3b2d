//! The kernel's own fault paths: the baselines every faultline engine is compared
//! with.
//!
//! Each latency function maps a fresh region, then times one access per 4 KiB page
//! with [`rdtsc`] around that single load or store, so each sample is one trip
//! through the kernel's fault handler (or, for the warm file, one fault that maps
//! many pages followed by plain accesses: fault-around maps at least 16 pages, and
//! where the page cache holds large folios far more, ~200-250 pages per fault on
//! ext4 under Linux 6.18):
//!
//! ```text
//!   page:   0      1      2           n-1
//!         +------+------+------+ ... +------+
//!         | t0 W t1     |      |     |      |   W = write_volatile(1) (or a read)
//!         +------+------+------+ ... +------+   sample[i] = t1 - t0 (cycles)
//! ```
//!
//! Transparent huge pages are switched off for every anonymous and shmem mapping
//! (`MADV_NOHUGEPAGE`), so every 4 KiB page faults on its own. Each mapping is
//! unmapped and each temporary file removed when the measuring function returns.
//! Minor-fault counts come from `getrusage(RUSAGE_THREAD)` around the timed loop.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use faultline_sys::mem::Mapping;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::harness::report::{
    fmt_count, fmt_ns, print_latency_table, print_table, Record, SpeedupBase,
};
use crate::harness::stats::{cycles_to_ns_vec, Summary};
use crate::harness::tsc::{rdtsc, tsc};
use crate::harness::BenchCtx;
use crate::harness::{parallel, plot};

/// Base page size these benchmarks touch.
pub const PAGE: usize = 4096;

use faultline_sys::mem::Advice;

/// Private anonymous read-write memory with THP off.
fn anon(len: usize) -> anyhow::Result<Mapping> {
    let m =
        Mapping::anon(len).with_context(|| format!("mmap of {len} bytes (private anonymous)"))?;
    no_huge_pages(&m)?;
    Ok(m)
}

/// `MADV_NOHUGEPAGE` over the whole mapping. EINVAL is accepted only on a
/// kernel without THP support (then nothing can be mapped huge anyway).
fn no_huge_pages(m: &Mapping) -> anyhow::Result<()> {
    match m.advise(0, m.len(), faultline_sys::mem::Advice::NoHugePage) {
        Err(e)
            if e.source.raw_os_error() == Some(faultline_sys::Errno::EINVAL.0)
                && !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() =>
        {
            Ok(())
        }
        r => r.context("MADV_NOHUGEPAGE"),
    }
}

/// Address of 4 KiB page `i` of `m` (must be inside it).
fn page(m: &Mapping, i: usize) -> *mut u8 {
    assert!(i < m.len() / PAGE);
    m.as_ptr().wrapping_add(i * PAGE)
}

/// A temporary file in `std::env::temp_dir()`, removed on drop.
pub struct TempFile {
    /// Where the file is.
    pub path: PathBuf,
    file: File,
}

impl TempFile {
    /// A file of `pages` pages of non-zero bytes, read once so its page cache is warm.
    pub fn warm(pages: usize) -> anyhow::Result<TempFile> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "faultline-bench-{}-{}.dat",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let t = TempFile {
            path,
            file: file.try_clone()?,
        };
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251 + 1) as u8).collect();
        let mut left = pages * PAGE;
        while left > 0 {
            let n = left.min(chunk.len());
            file.write_all(&chunk[..n])
                .with_context(|| format!("writing {}", t.path.display()))?;
            left -= n;
        }
        let mut f = File::open(&t.path).with_context(|| format!("opening {}", t.path.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0usize;
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("reading {}", t.path.display()))?;
            if n == 0 {
                break;
            }
            total += n;
        }
        if total != pages * PAGE {
            bail!(
                "{}: read back {total} bytes, wrote {}",
                t.path.display(),
                pages * PAGE
            );
        }
        Ok(t)
    }

    /// Read-only private mapping of the whole file.
    fn map_private_ro(&self, pages: usize) -> anyhow::Result<Mapping> {
        Mapping::file_private_readonly(&self.file, pages * PAGE).context("MAP_PRIVATE file")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            eprintln!("faultline bench: removing {}: {e}", self.path.display());
        }
    }
}

/// A memfd of `pages` pages mapped `MAP_SHARED` read-write with THP off.
fn shmem(pages: usize) -> anyhow::Result<(OwnedFd, Mapping)> {
    let len = pages * PAGE;
    let fd = faultline_sys::mem::memfd("faultline-bench", false).context("memfd_create")?;
    faultline_sys::mem::ftruncate(&fd, len as u64).context("ftruncate memfd")?;
    let m = Mapping::shared(&fd, len, 0).context("MAP_SHARED memfd")?;
    no_huge_pages(&m)?;
    Ok((fd, m))
}

/// Minor faults taken so far by the calling thread.
pub fn minor_faults() -> u64 {
    // RUSAGE_THREAD cannot fail on Linux.
    faultline_sys::process::thread_usage().map_or(0, |u| u.minor_faults)
}

/// Read or write one byte per page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `read_volatile` of the page's first byte.
    Read,
    /// `write_volatile(1)` to the page's first byte.
    Write,
}

impl Access {
    /// `read` or `write`.
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }

    /// Touch `p` once.
    ///
    /// # Safety
    /// `p` must point into a live mapping that permits this access.
    #[inline(always)]
    pub unsafe fn touch(self, p: *mut u8) -> u8 {
        match self {
            // SAFETY: guaranteed by the caller.
            Access::Read => unsafe { std::ptr::read_volatile(p) },
            Access::Write => {
                // SAFETY: guaranteed by the caller.
                unsafe { std::ptr::write_volatile(p, 1) };
                1
            }
        }
    }
}

/// Time one access to each of the first `n` pages of `m`.
fn time_each(m: &Mapping, n: usize, access: Access) -> Vec<u64> {
    // Written now so the result buffer does not fault inside the loop.
    let mut out = vec![u64::MAX; n];
    let mut sink = 0u8;
    for (i, slot) in out.iter_mut().enumerate() {
        let p = page(m, i);
        let t0 = rdtsc();
        // SAFETY: `p` is inside the live mapping, which permits `access`.
        sink ^= unsafe { access.touch(p) };
        let t1 = rdtsc();
        *slot = t1.wrapping_sub(t0);
    }
    std::hint::black_box(sink);
    out
}

/// A kernel fault path measured one access per page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    /// Private anonymous memory, write (allocates and zeroes a page).
    AnonWrite,
    /// Private anonymous memory, read (maps the shared zero page).
    AnonRead,
    /// memfd `MAP_SHARED`, write.
    ShmemWrite,
    /// memfd `MAP_SHARED`, read of a hole.
    ShmemRead,
    /// `MAP_PRIVATE` read-only file mapping, page cache warm (fault-around: 16 or
    /// more pages per fault; see the module docs).
    FileWarm,
    /// Private anonymous write, `MADV_POPULATE_WRITE` of the next page before each
    /// access.
    PopulateAhead,
}

impl KernelPath {
    /// Every path, in table order.
    pub const ALL: [KernelPath; 6] = [
        KernelPath::AnonWrite,
        KernelPath::AnonRead,
        KernelPath::ShmemWrite,
        KernelPath::ShmemRead,
        KernelPath::FileWarm,
        KernelPath::PopulateAhead,
    ];

    /// Mechanism name used in records.
    pub fn mechanism(self) -> &'static str {
        match self {
            KernelPath::AnonWrite => "kernel-anon-write",
            KernelPath::AnonRead => "kernel-anon-read",
            KernelPath::ShmemWrite | KernelPath::ShmemRead => "kernel-shmem",
            KernelPath::FileWarm => "kernel-file-warm",
            KernelPath::PopulateAhead => "kernel-populate-ahead",
        }
    }

    /// The access each sample makes.
    pub fn access(self) -> Access {
        match self {
            KernelPath::AnonRead | KernelPath::ShmemRead | KernelPath::FileWarm => Access::Read,
            _ => Access::Write,
        }
    }

    /// Measure `n` pages.
    pub fn measure(self, n: usize) -> anyhow::Result<PathRun> {
        if n == 0 {
            bail!("need at least one page");
        }
        match self {
            KernelPath::AnonWrite | KernelPath::AnonRead => {
                let m = anon(n * PAGE)?;
                Ok(PathRun::timed(|| time_each(&m, n, self.access())))
            }
            KernelPath::ShmemWrite | KernelPath::ShmemRead => {
                let (_fd, m) = shmem(n)?;
                Ok(PathRun::timed(|| time_each(&m, n, self.access())))
            }
            KernelPath::FileWarm => {
                let f = TempFile::warm(n)?;
                let m = f.map_private_ro(n)?;
                Ok(PathRun::timed(|| time_each(&m, n, Access::Read)))
            }
            KernelPath::PopulateAhead => populate_ahead_run(n),
        }
    }
}

/// The samples of one [`KernelPath::measure`].
#[derive(Clone, Debug)]
pub struct PathRun {
    /// Cycles of each access, one per page.
    pub cycles: Vec<u64>,
    /// Minor faults the thread took during the loop.
    pub minor_faults: u64,
    /// Wall time of the whole loop divided by pages (includes the `madvise` calls
    /// of `PopulateAhead` and the timing overhead).
    pub wall_ns_per_page: f64,
}

impl PathRun {
    fn timed(f: impl FnOnce() -> Vec<u64>) -> PathRun {
        let f0 = minor_faults();
        let t = Instant::now();
        let cycles = f();
        let wall = t.elapsed().as_nanos() as f64;
        PathRun {
            minor_faults: minor_faults() - f0,
            wall_ns_per_page: wall / cycles.len().max(1) as f64,
            cycles,
        }
    }

    /// Pages per minor fault (16 or more for the warm file, 1 for the others).
    pub fn pages_per_fault(&self) -> f64 {
        self.cycles.len() as f64 / self.minor_faults.max(1) as f64
    }
}

fn populate_ahead_run(n: usize) -> anyhow::Result<PathRun> {
    let m = &anon(n * PAGE)?;
    let mut out = vec![u64::MAX; n];
    let f0 = minor_faults();
    let start = Instant::now();
    m.advise(0, PAGE, Advice::PopulateWrite)
        .context("MADV_POPULATE_WRITE")?;
    for (i, slot) in out.iter_mut().enumerate() {
        if i + 1 < n {
            m.advise((i + 1) * PAGE, PAGE, Advice::PopulateWrite)
                .context("MADV_POPULATE_WRITE")?;
        }
        let p = page(m, i);
        let t0 = rdtsc();
        // SAFETY: `p` is inside the live read-write mapping.
        unsafe { std::ptr::write_volatile(p, 1) };
        let t1 = rdtsc();
        *slot = t1.wrapping_sub(t0);
    }
    let wall = start.elapsed().as_nanos() as f64;
    Ok(PathRun {
        cycles: out,
        minor_faults: minor_faults() - f0,
        wall_ns_per_page: wall / n as f64,
    })
}

/// Result of a sequential pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeqRun {
    /// Pages touched.
    pub pages: usize,
    /// Wall time per page.
    pub ns_per_page: f64,
    /// Minor faults taken.
    pub minor_faults: u64,
}

impl SeqRun {
    /// Pages per minor fault.
    pub fn pages_per_fault(&self) -> f64 {
        self.pages as f64 / self.minor_faults.max(1) as f64
    }
}

fn pages_of(bytes: usize) -> anyhow::Result<usize> {
    let p = bytes / PAGE;
    if p == 0 {
        bail!("need at least one page ({bytes} bytes given)");
    }
    Ok(p)
}

fn seq_pass(m: &Mapping, pages: usize, access: Access) -> SeqRun {
    let f0 = minor_faults();
    let t = Instant::now();
    let mut sink = 0u8;
    for i in 0..pages {
        // SAFETY: page `i` is inside the live mapping, which permits `access`.
        sink ^= unsafe { access.touch(page(m, i)) };
    }
    let wall = t.elapsed().as_nanos() as f64;
    std::hint::black_box(sink);
    SeqRun {
        pages,
        ns_per_page: wall / pages as f64,
        minor_faults: minor_faults() - f0,
    }
}

/// Sequential first write of one byte per page of fresh anonymous memory (THP off).
pub fn seq_first_touch_anon_run(bytes: usize) -> anyhow::Result<SeqRun> {
    let pages = pages_of(bytes)?;
    let m = anon(pages * PAGE)?;
    Ok(seq_pass(&m, pages, Access::Write))
}

/// Sequential read of one byte per page of a warm file mapped `MAP_PRIVATE`.
pub fn seq_scan_file_warm_run(bytes: usize) -> anyhow::Result<SeqRun> {
    let pages = pages_of(bytes)?;
    let f = TempFile::warm(pages)?;
    let m = f.map_private_ro(pages)?;
    Ok(seq_pass(&m, pages, Access::Read))
}

/// `threads` threads each first-write their own `pages_per_thread` slice of one
/// anonymous mapping (THP off); returns total faults per second, over the
/// time from the first thread's first write to the last one's last
/// ([`parallel::timed`]: each thread stamps its own).
pub fn scale_anon(threads: usize, pages_per_thread: usize) -> anyhow::Result<f64> {
    if threads == 0 || pages_per_thread == 0 {
        bail!("need at least one thread and one page per thread");
    }
    let m = anon(threads * pages_per_thread * PAGE)?;
    let secs = parallel::timed(threads, |t| {
        for i in t * pages_per_thread..(t + 1) * pages_per_thread {
            // SAFETY: each thread writes only its own pages of the live,
            // read-write mapping.
            unsafe { std::ptr::write_volatile(page(&m, i), 1) };
        }
    })
    .as_secs_f64();
    Ok((threads * pages_per_thread) as f64 / secs.max(1e-9))
}

/// Options of `faultline bench kernel`.
#[derive(clap::Args, Clone, Debug)]
pub struct KernelArgs {
    /// Pages (one fault each) per latency measurement (1 to what
    /// MemAvailable holds).
    #[arg(short = 'n', long, default_value_t = 100_000, value_parser = faultline_cli_support::flags::pages())]
    pub pages: usize,
    /// MiB per sequential pass (anonymous first touch, warm file scan;
    /// 1 to what MemAvailable holds).
    #[arg(long, default_value_t = 64, value_parser = faultline_cli_support::flags::mib())]
    pub seq_mib: usize,
    /// Pages each thread first-touches in the scaling run (1 to what
    /// MemAvailable holds; times the most threads, checked before the run).
    #[arg(long, default_value_t = 16_384, value_parser = faultline_cli_support::flags::pages())]
    pub scale_pages: usize,
    /// Thread counts of the scaling run (each 1 to the threads this
    /// machine can still start).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8], value_parser = faultline_cli_support::flags::threads(1))]
    pub threads: Vec<usize>,
    /// Repetitions of each sequential and scaling pass (the median is
    /// reported; 1 to 1000).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
}

/// What `bench kernel` needs, checked before any bench runs: its most
/// threads, and memory for the largest of its passes.
pub fn check(args: &KernelArgs) -> anyhow::Result<()> {
    let most = faultline_cli_support::flags::most_threads(&args.threads, "bench kernel")?;
    let scale_bytes = (most as u64).saturating_mul(args.scale_pages as u64 * PAGE as u64);
    let need = scale_bytes
        .max((args.seq_mib as u64) << 21)
        .max(args.pages as u64 * PAGE as u64);
    faultline_cli_support::flags::check_memory(
        need,
        format_args!(
            "bench kernel: -n {}, --seq-mib {} (and its file), {most} threads x {} pages",
            args.pages, args.seq_mib, args.scale_pages
        ),
    )
}

/// `faultline bench kernel`: latency of every kernel path, sequential per-page
/// cost, and multi-threaded first-touch throughput.
pub fn run(ctx: &mut BenchCtx, args: &KernelArgs) -> anyhow::Result<()> {
    let reps = args.reps.max(1);
    let steps = KernelPath::ALL.len() + 2 * reps + args.threads.len() * reps;
    let mut progress = ctx.progress(steps as u64, "kernel");
    let tsc = tsc();

    let mut records = Vec::new();
    let mut samples = Vec::new();
    for path in KernelPath::ALL {
        progress.step(&format!("{} {}", path.mechanism(), path.access().name()));
        let mut run = path
            .measure(args.pages)
            .with_context(|| format!("{} {}", path.mechanism(), path.access().name()))?;
        let ppf = run.pages_per_fault();
        samples.push((
            format!("{} {}", path.mechanism(), path.access().name()),
            cycles_to_ns_vec(&run.cycles, tsc),
        ));
        let s = Summary::from_cycles(&mut run.cycles, tsc);
        records.push(
            Record::new("kernel", path.mechanism(), "-", path.access().name(), &s)
                .with("minor_faults", run.minor_faults)
                .with("pages_per_fault", ppf)
                .with("wall_ns_per_page", run.wall_ns_per_page),
        );
    }

    let bytes = args.seq_mib << 20;
    let mut seq_rows = Vec::new();
    let mut seq_records = Vec::new();
    for (mech, access) in [
        ("kernel-anon-write", Access::Write),
        ("kernel-file-warm", Access::Read),
    ] {
        let mut runs = Vec::new();
        for _ in 0..reps {
            progress.step(&format!("seq {mech}"));
            runs.push(match access {
                Access::Write => seq_first_touch_anon_run(bytes)?,
                Access::Read => seq_scan_file_warm_run(bytes)?,
            });
        }
        let mut ns: Vec<f64> = runs.iter().map(|r| r.ns_per_page).collect();
        let s = Summary::from_ns(&mut ns);
        let ppf = runs.iter().map(SeqRun::pages_per_fault).sum::<f64>() / runs.len() as f64;
        seq_rows.push(vec![
            mech.to_string(),
            access.name().into(),
            fmt_count(runs[0].pages as u64),
            fmt_ns(s.median),
            fmt_ns(s.min),
            fmt_ns(s.max),
            format!("{ppf:.1}"),
        ]);
        seq_records.push(
            Record::new("seq", mech, "-", access.name(), &s)
                .with("pages", runs[0].pages)
                .with("reps", reps)
                .with("ns_per_page", s.median)
                .with("pages_per_fault", ppf),
        );
    }

    let mut scale = Vec::new();
    for &t in &args.threads {
        let mut rates = Vec::new();
        for _ in 0..reps {
            progress.step(&format!("scale {t} threads"));
            rates.push(scale_anon(t, args.scale_pages)?);
        }
        // Summary over ns per fault (the inverse of the rate).
        let mut ns: Vec<f64> = rates.iter().map(|r| 1e9 / r).collect();
        let s = Summary::from_ns(&mut ns);
        scale.push((t, s, 1e9 / s.median));
    }
    // Speedups against one thread (or the fewest measured), wherever it
    // stands in --threads.
    let points: Vec<(usize, f64)> = scale.iter().map(|p| (p.0, p.2)).collect();
    let base = SpeedupBase::of(&args.threads).context("no thread counts")?;
    let base_fps = base.rate(&points).unwrap_or(f64::NAN);
    let scale_points: Vec<(f64, f64)> = points.iter().map(|p| (p.0 as f64, p.1)).collect();
    let mut scale_rows = Vec::new();
    let mut scale_records = Vec::new();
    for (t, s, fps) in &scale {
        scale_rows.push(vec![
            t.to_string(),
            fmt_count((t * args.scale_pages) as u64),
            fmt_count(fps.round() as u64),
            fmt_ns(s.median),
            format!("{:.2}x", fps / base_fps),
        ]);
        scale_records.push(
            Record::new("scale", "kernel-anon-write", "-", "write", s)
                .with("threads", *t)
                .with("pages_per_thread", args.scale_pages)
                .with("faults_per_sec", *fps)
                .with(&base.json_key(), fps / base_fps)
                .with("reps", reps),
        );
    }
    progress.finish();

    println!("\nKernel fault paths, one access per 4 KiB page, TSC cycles of the access itself");
    println!(
        "(TSC {:.3} GHz, empty rdtsc pair {} cycles included; ratio = median / kernel-anon-write median)",
        tsc.ghz(),
        tsc.overhead_cycles
    );
    let k = records[0].median_ns;
    for r in &mut records {
        r.ratio_to_kernel = Some(r.median_ns / k);
    }
    print_latency_table(&records);
    let extra_rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                format!("{} {}", r.mechanism, r.access),
                fmt_count(r.extra_f64("minor_faults").unwrap_or(0.0) as u64),
                format!("{:.1}", r.extra_f64("pages_per_fault").unwrap_or(0.0)),
                fmt_ns(r.extra_f64("wall_ns_per_page").unwrap_or(f64::NAN)),
            ]
        })
        .collect();
    println!();
    print_table(
        &["path", "minor faults", "pages/fault", "wall per page"],
        &extra_rows,
    );

    println!("\nSequential pass, one byte per 4 KiB page, wall time per page ({reps} reps)");
    print_table(
        &[
            "mechanism",
            "access",
            "pages",
            "median/page",
            "min",
            "max",
            "pages/fault",
        ],
        &seq_rows,
    );
    println!(
        "\nFirst-touch scaling: T threads, {} pages each, one anonymous mapping (median of {reps})",
        fmt_count(args.scale_pages as u64)
    );
    print_table(
        &["threads", "faults", "faults/s", "ns/fault", &base.column()],
        &scale_rows,
    );

    ctx.figure("kernel_latency", |d, n| {
        plot::latency_histograms(d, n, &samples)
    })?;
    ctx.figure("kernel_scale", |d, n| {
        plot::line_chart(
            d,
            n,
            "Kernel anonymous first-touch throughput",
            "threads",
            "faults/s",
            &[("kernel-anon-write".into(), scale_points)],
            false,
        )
    })?;

    for r in records.into_iter().chain(seq_records).chain(scale_records) {
        ctx.report.push(r);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_measures_small_n() {
        for p in KernelPath::ALL {
            let r = p.measure(64).unwrap();
            assert_eq!(r.cycles.len(), 64);
            assert!(r.cycles.iter().all(|&c| c != u64::MAX));
        }
    }

    #[test]
    fn anon_write_faults_every_page() {
        let r = KernelPath::AnonWrite.measure(256).unwrap();
        // Allow a few extra faults (stack, allocator), never fewer than one per page.
        assert!(r.minor_faults >= 256, "minor faults {}", r.minor_faults);
    }

    #[test]
    fn seq_and_scale_run() {
        let s = seq_first_touch_anon_run(64 * PAGE).unwrap();
        assert_eq!(s.pages, 64);
        assert!(s.ns_per_page > 0.0);
        assert!(seq_scan_file_warm_run(64 * PAGE).unwrap().ns_per_page > 0.0);
        assert!(scale_anon(2, 64).unwrap() > 0.0);
        assert!(seq_first_touch_anon_run(100).is_err());
    }

    /// A first write of an anonymous page is a trip through the kernel
    /// that zeroes 4 KiB: never 20 ns per thread. The clock started by the
    /// coordinating thread after the workers were released missed what
    /// they did before it ran again: billions of faults per second on a
    /// loaded machine (more threads than CPUs here: 3 on 2).
    #[test]
    fn first_touch_rates_are_possible() {
        for _ in 0..30 {
            for threads in [1, 2, 3] {
                let fps = scale_anon(threads, 256).unwrap();
                assert!(
                    fps < threads as f64 * 5e7,
                    "{threads} threads: {fps:.0} faults/s"
                );
            }
        }
    }
}
