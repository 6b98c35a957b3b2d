//! The floor under any copying restore handler on this machine: how fast
//! the working set's bytes can be moved at all, measured in the same run
//! as `bench restore` (see the `restore` module).
//!
//! * `memcpy`: the working set's bytes copied from a mapping of the
//!   memory file into anonymous memory already faulted in (the pure
//!   memory-bandwidth floor, no page allocation);
//! * `UFFDIO_COPY`, source populated: a userfaultfd of this process, an
//!   anonymous region registered MISSING, the working set's bytes
//!   installed in runs from the file mapping whose page tables were filled
//!   first (`MADV_POPULATE_READ`): allocation, copy and mapping of each
//!   destination page, no source faults;
//! * `UFFDIO_COPY`, source not populated: the same with the source's page
//!   tables empty (each source page costs a minor fault of this process);
//! * two threads splitting the populated case;
//! * `UFFDIO_CONTINUE` (shared mode's floor, when the shared tmpfs copy
//!   exists): a private mapping of it registered MISSING|MINOR, the working
//!   set's pages mapped from its page cache in runs (no allocation, no
//!   copy), one and two threads, and one 4 KiB page per ioctl;
//! * `UFFDIO_CONTINUE` of exactly the recorded set's runs (what prefetch in
//!   shared mode installs, in its order, one ioctl per run), one and two
//!   threads; and on the hugetlbfs copy, one 2 MiB ioctl per huge page the
//!   set touches: the least shared-mode prefetch can spend, with nothing
//!   else running.
//!
//! Everything above runs warm (the file is in the page cache). With
//! `--cache cold`, two disk floors beside them, each the median of three
//! reads with the file's page cache dropped first:
//!
//! * the recorded set read as serve prepares it for prefetch
//!   ([`faultline::prepare_store`]: the kernel's reads of its runs all
//!   asked for at once, then its exact runs mapped): the least a cold
//!   prefetch can take, with the disk as it is;
//! * the whole memory file read the same way (one run): what reading
//!   everything costs, which the kernel's own cold restore approaches when
//!   its read-ahead ends up reading most of the file.

use std::path::Path;
use std::time::Instant;

use faultline::caps::open_uffd;
use faultline::{prepare_store, FileStore, PrefetchPlan};
use faultline_sys::mem::{Advice, Mapping};
use faultline_sys::uffd::{feature, mode, register_mode, Outcome};

use crate::harness::report::{print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

use super::memory::{drop_cache, warm};
use super::timeline::median_finite;

/// Throughputs measured, bytes per second.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Floor {
    /// Bytes moved per case.
    pub bytes: usize,
    /// Bytes per UFFDIO_COPY.
    pub run_bytes: usize,
    /// memcpy into faulted-in anonymous memory.
    pub memcpy_bps: f64,
    /// UFFDIO_COPY from a populated source, one thread.
    pub copy_populated_bps: f64,
    /// UFFDIO_COPY from an unpopulated source, one thread.
    pub copy_unpopulated_bps: f64,
    /// UFFDIO_COPY from a populated source, two threads.
    pub copy_populated_2t_bps: f64,
    /// MADV_POPULATE_READ of the source (what preparing it costs).
    pub populate_bps: f64,
    /// UFFDIO_COPY one 4 KiB page per ioctl, populated source, one thread.
    pub copy_page_bps: f64,
    /// UFFDIO_CONTINUE from the shared tmpfs copy, one thread (0: not
    /// measured).
    pub continue_bps: f64,
    /// The same, two threads.
    pub continue_2t_bps: f64,
    /// UFFDIO_CONTINUE one 4 KiB page per ioctl, one thread.
    pub continue_page_bps: f64,
    /// Bytes of the recorded set (its runs' pages).
    pub set_bytes: usize,
    /// Its runs (ioctls on the tmpfs copy).
    pub set_runs: usize,
    /// UFFDIO_CONTINUE of the set's runs on the tmpfs copy, one thread, s
    /// (0: not measured).
    pub continue_set_s: f64,
    /// The same, two threads.
    pub continue_set_2t_s: f64,
    /// Huge pages the set touches (ioctls on the hugetlbfs copy).
    pub huge_set_pages: usize,
    /// UFFDIO_CONTINUE of those 2 MiB pages, one thread, s (0: not
    /// measured).
    pub continue_huge_set_s: f64,
    /// The recorded set read cold as serve prepares it, s (0: not
    /// measured).
    pub cold_set_s: f64,
    /// The whole memory file read cold the same way, s (0: not measured).
    pub cold_file_s: f64,
    /// Its bytes.
    pub file_bytes: usize,
}

/// CONTINUE of a plan's runs (pieces of at most 2 MiB, as prefetch
/// installs them) into a fresh private mapping of `snap` registered
/// MISSING|MINOR, dealt to `threads` threads; seconds. With `huge`, the
/// file is on hugetlbfs and each huge page the runs touch is one 2 MiB
/// ioctl.
fn continue_set(
    snap: &Path,
    plan: &PrefetchPlan,
    threads: usize,
    huge: bool,
) -> anyhow::Result<(f64, usize)> {
    const PIECE: u64 = 2 << 20;
    let file = std::fs::File::open(snap)?;
    let len = file.metadata()?.len() as usize;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    if huge {
        let mut seen = vec![false; len.div_ceil(PIECE as usize)];
        for (off, bytes) in plan.runs() {
            for h in off / PIECE..(off + bytes as u64).div_ceil(PIECE) {
                if !std::mem::replace(&mut seen[h as usize], true) {
                    ranges.push((h * PIECE, PIECE));
                }
            }
        }
    } else {
        for (off, bytes) in plan.runs() {
            let mut at = off;
            while at < off + bytes as u64 {
                let n = PIECE.min(off + bytes as u64 - at);
                ranges.push((at, n));
                at += n;
            }
        }
    }
    let dst = Mapping::file_private(None, &file, len, 0)?;
    let features = if huge {
        feature::MINOR_HUGETLBFS | feature::MISSING_HUGETLBFS
    } else {
        feature::MINOR_SHMEM | feature::MISSING_SHMEM
    };
    let u = open_uffd(true, features)?;
    u.register(
        dst.addr(),
        len as u64,
        register_mode::MISSING | register_mode::MINOR,
    )?;
    let (u, d, ranges) = (&u, dst.addr(), &ranges);
    let secs = timed_runs(threads, ranges.len(), |i| {
        let (off, n) = ranges[i];
        let out = u.continue_(d + off, n, mode::CONTINUE_DONTWAKE)?;
        anyhow::ensure!(
            matches!(out, Outcome::Done(m) if m as u64 == n),
            "UFFDIO_CONTINUE: {out:?}"
        );
        Ok(())
    })?;
    Ok((secs, ranges.len()))
}

/// The floors of one working set of `ws_bytes` of `mem` (warm, in 2 MiB
/// runs), and of its recorded set `rec` (its runs, as shared-mode
/// prefetch installs them) on the shared tmpfs copy `shared` and the
/// hugetlbfs copy `hshared` when they exist; with `cold` (`Some(root)`:
/// whether `drop_caches` may be used), the disk floors too.
pub fn of_set(
    mem: &Path,
    shared: Option<&Path>,
    hshared: Option<&Path>,
    ws_bytes: usize,
    rec: &Path,
    cold: Option<bool>,
) -> anyhow::Result<Floor> {
    let mut f = measure(mem, shared, ws_bytes, 2 << 20)?;
    let offsets = faultline_serve::record::read(rec)?;
    if let Some(root) = cold {
        (f.cold_set_s, f.cold_file_s, f.file_bytes) = cold_reads(mem, &offsets, root)?;
        // The floors above assume the file warm, as the runs after do.
        warm(mem)?;
    }
    // The recorded set's own runs: shared-mode prefetch's floor.
    let plan = PrefetchPlan::new(&offsets);
    f.set_bytes = plan.pages() * 4096;
    if let Some(snap) = shared {
        (f.continue_set_s, f.set_runs) = continue_set(snap, &plan, 1, false)?;
        f.continue_set_2t_s = continue_set(snap, &plan, 2, false)?.0;
    }
    if let Some(h) = hshared {
        (f.continue_huge_set_s, f.huge_set_pages) = continue_set(h, &plan, 1, true)?;
    }
    Ok(f)
}

/// The disk floors (see the module's docs): seconds to read the recorded
/// set at `offsets` as serve prepares it, and the whole of `mem` the same
/// way, each the median of three reads after [`drop_cache`]; and the
/// file's bytes.
fn cold_reads(mem: &Path, offsets: &[u64], root: bool) -> anyhow::Result<(f64, f64, usize)> {
    const REPS: usize = 3;
    let bytes = std::fs::metadata(mem)?.len() as usize;
    let every: Vec<u64> = (0..bytes as u64).step_by(4096).collect();
    let read = |offsets: &[u64]| -> anyhow::Result<f64> {
        // A store of its own each time: the pages its mapping maps stay
        // cached until it is gone.
        let store = FileStore::open(mem)?;
        drop_cache(mem, root)?;
        let t = Instant::now();
        prepare_store(&store, offsets, 4096);
        Ok(t.elapsed().as_secs_f64())
    };
    let (mut set, mut file) = (Vec::with_capacity(REPS), Vec::with_capacity(REPS));
    for _ in 0..REPS {
        set.push(read(offsets)?);
        file.push(read(&every)?);
    }
    Ok((median_finite(set), median_finite(file), bytes))
}

/// Measures the floor for `bytes` of `mem` (warm), in runs of `run_bytes`;
/// with `snap` (the shared tmpfs copy), the CONTINUE floor too.
fn measure(
    mem: &Path,
    snap: Option<&Path>,
    bytes: usize,
    run_bytes: usize,
) -> anyhow::Result<Floor> {
    let file = std::fs::File::open(mem)?;
    let len = (file.metadata()?.len() as usize).min(bytes) / run_bytes * run_bytes;
    anyhow::ensure!(len > 0, "the memory file is smaller than one run");
    let mut f = Floor {
        bytes: len,
        run_bytes,
        ..Floor::default()
    };
    // memcpy: destination faulted in first, source populated.
    {
        let src = Mapping::file_readonly(&file, len, 0)?;
        src.advise(0, len, Advice::PopulateRead)?;
        let dst = Mapping::anon(len)?;
        dst.advise(0, len, Advice::PopulateWrite)?;
        let t = Instant::now();
        // SAFETY: both mappings are live and `len` bytes long; they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), len) };
        f.memcpy_bps = len as f64 / t.elapsed().as_secs_f64();
    }
    let copy = |populate: bool, threads: usize, run_bytes: usize| -> anyhow::Result<(f64, f64)> {
        let src = Mapping::file_readonly(&file, len, 0)?;
        let mut populate_bps = 0.0;
        if populate {
            let t = Instant::now();
            src.advise(0, len, Advice::PopulateRead)?;
            populate_bps = len as f64 / t.elapsed().as_secs_f64();
        }
        let dst = Mapping::anon(len)?;
        dst.advise(0, len, Advice::NoHugePage)?;
        let u = open_uffd(true, 0)?;
        u.register(dst.addr(), len as u64, register_mode::MISSING)?;
        let (u, s, d) = (&u, src.addr(), dst.addr());
        let secs = timed_runs(threads, len / run_bytes, |i| {
            let off = (i * run_bytes) as u64;
            // SAFETY: the source run lies inside the live file mapping.
            let out = unsafe {
                u.copy(
                    d + off,
                    (s + off) as *const u8,
                    run_bytes as u64,
                    mode::COPY_DONTWAKE,
                )
            }?;
            anyhow::ensure!(
                matches!(out, Outcome::Done(n) if n == run_bytes),
                "UFFDIO_COPY: {out:?}"
            );
            Ok(())
        })?;
        Ok((len as f64 / secs, populate_bps))
    };
    (f.copy_populated_bps, f.populate_bps) = copy(true, 1, run_bytes)?;
    f.copy_unpopulated_bps = copy(false, 1, run_bytes)?.0;
    f.copy_populated_2t_bps = copy(true, 2, run_bytes)?.0;
    f.copy_page_bps = copy(true, 1, 4096)?.0;
    if let Some(snap) = snap {
        let snap = std::fs::File::open(snap)?;
        let cont = |threads: usize, run_bytes: usize| -> anyhow::Result<f64> {
            let dst = Mapping::file_private(None, &snap, len, 0)?;
            let u = open_uffd(true, feature::MINOR_SHMEM | feature::MISSING_SHMEM)?;
            u.register(
                dst.addr(),
                len as u64,
                register_mode::MISSING | register_mode::MINOR,
            )?;
            let (u, d) = (&u, dst.addr());
            let secs = timed_runs(threads, len / run_bytes, |i| {
                let at = d + (i * run_bytes) as u64;
                let out = u.continue_(at, run_bytes as u64, mode::CONTINUE_DONTWAKE)?;
                anyhow::ensure!(
                    matches!(out, Outcome::Done(n) if n == run_bytes),
                    "UFFDIO_CONTINUE: {out:?}"
                );
                Ok(())
            })?;
            Ok(len as f64 / secs)
        };
        f.continue_bps = cont(1, run_bytes)?;
        f.continue_2t_bps = cont(2, run_bytes)?;
        f.continue_page_bps = cont(1, 4096)?;
    }
    Ok(f)
}

/// Runs `run(i)` for every `i` in `0..runs`, dealt round-robin to
/// `threads` threads; the wall time in seconds.
fn timed_runs(
    threads: usize,
    runs: usize,
    run: impl Fn(usize) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<f64> {
    let run = &run;
    let t = Instant::now();
    std::thread::scope(|sc| -> anyhow::Result<()> {
        let hs: Vec<_> = (0..threads)
            .map(|k| sc.spawn(move || (k..runs).step_by(threads).try_for_each(run)))
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| anyhow::anyhow!("an ioctl thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(t.elapsed().as_secs_f64())
}

/// Prints and records the floors per working set: what moving its bytes
/// costs at best.
/// `floors`: (percent, the working set's name, its floors).
pub fn print(ctx: &mut BenchCtx, floors: &[(f64, String, Floor)]) {
    let ms = |bytes: usize, bps: f64| format!("{:.1}", bytes as f64 / bps * 1e3);
    let gbs = |bps: f64| format!("{:.2}", bps / 1e9);
    let mut rows = Vec::new();
    for (ws, label, f) in floors {
        let cases = [
            ("memcpy", "memcpy", f.memcpy_bps),
            (
                "MADV_POPULATE_READ of the source",
                "POPULATE",
                f.populate_bps,
            ),
            (
                "UFFDIO_COPY, source populated",
                "COPY",
                f.copy_populated_bps,
            ),
            (
                "UFFDIO_COPY, source not populated",
                "COPY",
                f.copy_unpopulated_bps,
            ),
            (
                "UFFDIO_COPY, populated, 2 threads",
                "COPY",
                f.copy_populated_2t_bps,
            ),
            (
                "UFFDIO_COPY, populated, 4 KiB per ioctl",
                "COPY",
                f.copy_page_bps,
            ),
            (
                "UFFDIO_CONTINUE (shared tmpfs copy)",
                "CONTINUE",
                f.continue_bps,
            ),
            ("UFFDIO_CONTINUE, 2 threads", "CONTINUE", f.continue_2t_bps),
            (
                "UFFDIO_CONTINUE, 4 KiB per ioctl",
                "CONTINUE",
                f.continue_page_bps,
            ),
        ];
        let set = [
            (
                format!(
                    "UFFDIO_CONTINUE of the recorded set's {} runs (tmpfs)",
                    f.set_runs
                ),
                "CONTINUE",
                f.continue_set_s,
                f.set_bytes,
            ),
            (
                format!("the same, 2 threads ({} runs)", f.set_runs),
                "CONTINUE",
                f.continue_set_2t_s,
                f.set_bytes,
            ),
            (
                format!(
                    "UFFDIO_CONTINUE of the {} huge pages the set touches (hugetlbfs)",
                    f.huge_set_pages
                ),
                "CONTINUE",
                f.continue_huge_set_s,
                f.huge_set_pages << 21,
            ),
            (
                "the recorded set read cold, as serve prepares it".to_string(),
                "disk",
                f.cold_set_s,
                f.set_bytes,
            ),
            (
                "the whole memory file read cold, the same way".to_string(),
                "disk",
                f.cold_file_s,
                f.file_bytes,
            ),
        ];
        for (what, op, secs, bytes) in set.into_iter().filter(|c| c.2 > 0.0) {
            let bps = bytes as f64 / secs;
            let s = Summary::from_ns(&mut [secs * 1e9]);
            ctx.report.push(
                Record::new("restore-floor", &what, op, "read", &s)
                    .with("working_set_pct", *ws)
                    .with("working_set", label.as_str())
                    .with("bytes", bytes as u64)
                    .with("ms", secs * 1e3)
                    .with("bytes_per_second", bps),
            );
            rows.push(vec![
                label.clone(),
                what,
                format!("{}", bytes >> 20),
                gbs(bps),
                format!("{:.2}", secs * 1e3),
            ]);
        }
        for (what, op, bps) in cases.into_iter().filter(|c| c.2 > 0.0) {
            let s = Summary::from_ns(&mut [f.bytes as f64 / bps * 1e9]);
            ctx.report.push(
                Record::new("restore-floor", what, op, "read", &s)
                    .with("working_set_pct", *ws)
                    .with("working_set", label.as_str())
                    .with("bytes", f.bytes as u64)
                    .with("run_bytes", f.run_bytes as u64)
                    .with("bytes_per_second", bps),
            );
            rows.push(vec![
                label.clone(),
                what.to_string(),
                format!("{}", f.bytes >> 20),
                gbs(bps),
                ms(f.bytes, bps),
            ]);
        }
    }
    print_table(&["ws", "floor (one process)", "MiB", "GB/s", "ms"], &rows);
    println!("(warm but for the rows that say cold; the working set's bytes moved in 2 MiB runs: the least any copying handler spends; CONTINUE: mapped from the shared page cache, no copy; cold: medians of 3 reads from the disk)");
}
