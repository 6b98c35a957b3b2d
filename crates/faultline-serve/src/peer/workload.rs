//! The peer's restore: vCPU threads touch a seeded working set, then every
//! byte they (or `--verify-all`) read is compared with the memory file.
//!
//! 1. [`working_set`] draws the pages (70% in clusters, the rest
//!    scattered) from the seed, the same set for the same seed and layout.
//! 2. [`touch`] runs the vCPU threads, page `i` on thread `i % threads`,
//!    timing each first touch; a storm thread (`--storm`) drops a range and
//!    reads it back meanwhile. With `--stamps N` each thread keeps TSC
//!    stamps around its last N slow touches (those that waited for a
//!    fault), for `bench restore`'s phases.
//! 3. [`verify`] drops the balloon range (`--balloon`), then compares each
//!    page with the file: a dropped page must read zeros.
//! 4. [`scribble`] (`--scribble`) writes every working-set page and reads
//!    the writes back; [`write_set`] (`--write-set`) writes a seeded set of
//!    pages from the vCPU threads and says which (what a handler's dirty
//!    tracking must find), timing each first write.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use faultline_sys::mem::{self, Advice};

use super::args::{Backend, Pattern, PeerArgs};
use super::layout::{Layout, PAGE};
use super::procfs;
use super::report::{say, PeerReport};
use super::vcpu::{mine, Thread, Touched};

/// xorshift64* (Vigna): the working set's few random numbers, reproducible
/// from the seed whatever the dependencies' versions.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Any state but 0; the first outputs of nearby seeds are alike,
        // so a few are dropped.
        let mut r = Rng(match seed ^ 0x9e37_79b9_7f4a_7c15 {
            0 => 1,
            s => s,
        });
        for _ in 0..8 {
            r.next_u64();
        }
        r
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `range` (its length times 64 random bits, the high word).
    fn in_range(&mut self, range: std::ops::Range<usize>) -> usize {
        let len = (range.end - range.start) as u128;
        range.start + ((u128::from(self.next_u64()) * len) >> 64) as usize
    }
}

/// The working set: 4 KiB pages (as (region, page)) in touch order. The
/// seeded one (`Clustered`): 70% in clusters of 8-64 pages, the rest
/// scattered; `Sweep`: the first `pct`% of the pages in address order.
pub fn working_set(layout: &Layout, pct: f64, seed: u64, pattern: Pattern) -> Vec<(usize, usize)> {
    let counts: Vec<usize> = layout.regions.iter().map(|r| r.1 / PAGE).collect();
    let total: usize = counts.iter().sum();
    let target = ((total as f64 * pct / 100.0) as usize).min(total);
    if pattern == Pattern::Sweep {
        return in_regions(&counts, 0..target);
    }
    let mut taken = vec![false; total];
    let mut order = Vec::with_capacity(target);
    let mut rng = Rng::new(seed);
    let mut n = 0;
    let mut tries = 0;
    while n < target && tries < 100 * total + 1000 {
        tries += 1;
        let len = if n < target * 7 / 10 {
            rng.in_range(8..65)
        } else {
            1
        };
        let start = rng.in_range(0..total);
        for (g, t) in taken.iter_mut().enumerate().take(start + len).skip(start) {
            if n < target && !*t {
                *t = true;
                order.push(g);
                n += 1;
            }
        }
    }
    in_regions(&counts, order)
}

/// Global page numbers as (region, page) of regions of `counts` pages.
fn in_regions(counts: &[usize], pages: impl IntoIterator<Item = usize>) -> Vec<(usize, usize)> {
    pages
        .into_iter()
        .map(|mut g| {
            let mut r = 0;
            while g >= counts[r] {
                g -= counts[r];
                r += 1;
            }
            (r, g)
        })
        .collect()
}

/// `ws` varied by `run_seed` as one restore of many varies (`--jitter`):
/// `pct`% of its pages replaced by pages outside it, each page moved up
/// to 64 places in the order.
pub fn jittered(
    layout: &Layout,
    ws: &[(usize, usize)],
    pct: f64,
    run_seed: u64,
) -> Vec<(usize, usize)> {
    let counts: Vec<usize> = layout.regions.iter().map(|r| r.1 / PAGE).collect();
    let total: usize = counts.iter().sum();
    let global = |(r, p): (usize, usize)| counts[..r].iter().sum::<usize>() + p;
    let local = |mut g: usize| {
        let mut r = 0;
        while g >= counts[r] {
            g -= counts[r];
            r += 1;
        }
        (r, g)
    };
    let mut rng = Rng::new(run_seed ^ 0x6a09_e667_f3bc_c908);
    let mut in_set = vec![false; total];
    ws.iter().for_each(|&x| in_set[global(x)] = true);
    let mut out: Vec<usize> = ws.iter().map(|&x| global(x)).collect();
    let swaps = ((ws.len() as f64 * pct / 100.0) as usize).min(total - ws.len());
    for _ in 0..swaps {
        let i = rng.in_range(0..out.len());
        let mut g = rng.in_range(0..total);
        while in_set[g] {
            g = (g + 1) % total;
        }
        in_set[g] = true;
        out[i] = g;
    }
    for i in 0..out.len() {
        let j = rng.in_range(i..(i + 64).min(out.len()));
        out.swap(i, j);
    }
    out.into_iter().map(local).collect()
}

/// Keeps the CPU busy for `d` (`--compute-us`): a vCPU computing
/// between touches.
fn compute(d: Duration) {
    if d.is_zero() {
        return;
    }
    let until = Instant::now() + d;
    let mut x = 1u64;
    while Instant::now() < until {
        for _ in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}

/// An address range `(start, bytes)` of the peer's memory.
type Range = (u64, usize);

/// The range `--storm` drops over and over: the last quarter of the last
/// region, in whole pages of `ps` bytes.
pub fn storm_range(layout: &Layout, ps: usize) -> Range {
    let last = *layout.regions.last().expect("a region");
    let len = (last.1 / 4).next_multiple_of(ps).min(last.1);
    (last.0 + (last.1 - len) as u64, len)
}

/// A touch slower than this waited for a fault to be served (a touch of
/// a present page takes well under it), ns.
const SLOW_TOUCH_NS: u64 = 1_000;

/// A vCPU thread's last `cap` slow touches (page, TSC before, TSC after).
struct TouchRing {
    cap: usize,
    buf: Vec<(u64, u64, u64)>,
    next: usize,
}

impl TouchRing {
    fn new(cap: usize) -> TouchRing {
        TouchRing {
            cap,
            buf: Vec::with_capacity(cap),
            next: 0,
        }
    }

    fn push(&mut self, s: (u64, u64, u64)) {
        if self.buf.len() < self.cap {
            self.buf.push(s);
        } else if self.cap > 0 {
            self.buf[self.next] = s;
            self.next = (self.next + 1) % self.cap;
        }
    }

    fn into_vec(mut self) -> Vec<(u64, u64, u64)> {
        self.buf.rotate_left(self.next);
        self.buf
    }
}

/// Touches `ws` from `args.threads` vCPU threads (pausing once at
/// `--pause-at`), while a storm thread drops `storm` `args.storm` times.
/// Each touch slower than `--stall-ns` goes to `stalls` as it happens.
pub fn touch(
    args: &PeerArgs,
    layout: &Layout,
    ws: &Arc<Vec<(usize, usize)>>,
    storm: Range,
    stalls: Option<Sender<u64>>,
) -> Touched {
    let regions = Arc::new(layout.regions.clone());
    let nthreads = args.threads.max(1);
    let pattern = args.pattern;
    let touched = Arc::new(AtomicUsize::new(0));
    let pause_after = args
        .pause_at
        .map(|p| (ws.len() as f64 * p / 100.0) as usize);
    let pause = Duration::from_millis(args.pause_ms);
    let compute_for = Duration::from_micros(args.compute_us);
    let stamps = args.stamps as usize;
    let paused = Arc::new(AtomicBool::new(false));
    let vcpus_done = Arc::new(AtomicBool::new(false));
    let stormer = (args.storm > 0).then(|| {
        let (n, done) = (args.storm, vcpus_done.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while i < n || !done.load(Relaxed) {
                let _ = mem::madvise(storm.0, storm.1, Advice::DontNeed);
                // Read a few pages back (faults racing the next drop).
                for k in (0..storm.1).step_by(storm.1 / 4 + 1) {
                    // SAFETY: inside our own registered mapping.
                    unsafe { std::ptr::read_volatile((storm.0 + k as u64) as *const u8) };
                }
                i += 1;
                if i > 100 * n {
                    break;
                }
            }
        })
    });
    let mut handles = Vec::new();
    let vcpus_ns = faultline_sys::monotonic_ns();
    let stall_ns = args.stall_ns;
    for t in 0..nthreads {
        let (ws, regions, touched) = (ws.clone(), regions.clone(), touched.clone());
        let (paused, stalls) = (paused.clone(), stalls.clone());
        handles.push(std::thread::spawn(move || {
            let mut lat = Vec::with_capacity(ws.len() / nthreads + 1);
            let mut first_ns = u64::MAX;
            let switches = procfs::thread_switches();
            let mut ring = TouchRing::new(stamps);
            for (i, &(r, p)) in ws.iter().enumerate() {
                if !mine(pattern, i, t, nthreads, ws.len()) {
                    continue;
                }
                if let Some(limit) = pause_after {
                    if touched.load(Relaxed) >= limit && !paused.swap(true, Relaxed) {
                        say(format_args!("paused after {limit} pages"));
                        std::thread::sleep(pause);
                    }
                }
                let addr = regions[r].0 + (p * PAGE) as u64;
                if first_ns == u64::MAX {
                    first_ns = faultline_sys::monotonic_ns();
                }
                let s = Instant::now();
                let tsc = || {
                    if stamps > 0 {
                        faultline_sys::rdtsc()
                    } else {
                        0
                    }
                };
                let c0 = tsc();
                // SAFETY: `addr` lies in a live mapping of this process.
                unsafe { std::ptr::read_volatile(addr as *const u8) };
                let c1 = tsc();
                let ns = s.elapsed().as_nanos() as u64;
                lat.push(ns);
                if let Some(tx) = stalls.as_ref().filter(|_| ns > stall_ns) {
                    // The reporter gone (its write failed) stops nothing.
                    let _ = tx.send(ns);
                }
                if stamps > 0 && ns > SLOW_TOUCH_NS {
                    ring.push((addr, c0, c1));
                }
                touched.fetch_add(1, Relaxed);
                compute(compute_for);
            }
            let (end, end_ns) = (Instant::now(), faultline_sys::monotonic_ns());
            let after = procfs::thread_switches();
            Thread {
                end,
                span_ns: (first_ns, end_ns),
                switches: (after.0 - switches.0, after.1 - switches.1),
                latencies: lat,
                stamps: ring.into_vec(),
            }
        }));
    }
    let threads: Vec<Thread> = handles
        .into_iter()
        .map(|h| h.join().expect("vCPU thread"))
        .collect();
    vcpus_done.store(true, Relaxed);
    if let Some(s) = stormer {
        s.join().expect("storm thread");
    }
    Touched::of(vcpus_ns, threads)
}

/// The ranges the peer dropped, which must read zeros.
pub struct Dropped {
    /// `--balloon`'s range (dropped once, after the touches).
    pub balloon: Option<Range>,
    /// `--storm`'s range (dropped while the vCPUs ran).
    pub storm: Option<Range>,
}

impl Dropped {
    fn reads_zeros(&self, addr: u64) -> bool {
        let inside = |(a, l): Range| addr >= a && addr < a + l as u64;
        self.balloon.is_some_and(inside) || self.storm.is_some_and(inside)
    }
}

/// Drops the balloon range (`--balloon`: the first half of the last
/// region), then compares the working set (or, with `--verify-all`,
/// `--balloon` or `--storm`, every page) with `file`: the bytes compared.
pub fn verify(
    args: &PeerArgs,
    file: &std::fs::File,
    layout: &Layout,
    ws: &[(usize, usize)],
    storm: Range,
) -> anyhow::Result<u64> {
    let balloon = balloon_range(args, layout);
    if let Some((a, l)) = balloon {
        mem::madvise(a, l, Advice::DontNeed)?;
        if args.balloon_pause_ms > 0 {
            say(format_args!(
                "ballooned {l} bytes; pausing {} ms",
                args.balloon_pause_ms
            ));
            std::thread::sleep(std::time::Duration::from_millis(args.balloon_pause_ms));
        }
    }
    let dropped = Dropped {
        balloon,
        storm: (args.storm > 0).then_some(storm),
    };
    let regions = &layout.regions;
    let mut verified = 0u64;
    let mut want = vec![0u8; PAGE];
    let mut check = |r: usize, p: usize| -> anyhow::Result<()> {
        let (base, _, off) = regions[r];
        let addr = base + (p * PAGE) as u64;
        let zero = dropped.reads_zeros(addr);
        if zero {
            want.fill(0);
        } else {
            file.read_exact_at(&mut want, off + (p * PAGE) as u64)?;
        }
        // SAFETY: a whole page inside a live mapping of this process.
        let got = unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE) };
        if got != &want[..] {
            let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            bail!(
                "byte mismatch at {:#x} (region {r}, file offset {:#x}): got {:#04x}, want {:#04x}{}",
                addr + i as u64,
                off + (p * PAGE + i) as u64,
                got[i],
                want[i],
                if zero { " (a dropped range must read zeros)" } else { "" }
            );
        }
        verified += PAGE as u64;
        Ok(())
    };
    if args.verify_all || args.balloon || args.storm > 0 {
        for (r, &(_, len, _)) in regions.iter().enumerate() {
            for p in 0..len / PAGE {
                check(r, p)?;
            }
        }
    } else {
        for &(r, p) in ws {
            check(r, p)?;
        }
    }
    Ok(verified)
}

/// `--balloon`'s range: the first half of the last region, in whole
/// pages.
fn balloon_range(args: &PeerArgs, layout: &Layout) -> Option<Range> {
    let last = *layout.regions.last().expect("a region");
    args.balloon.then(|| {
        let len = (last.1 / 2).next_multiple_of(args.page_size()).min(last.1);
        (last.0, len)
    })
}

/// The file offsets of the 4 KiB pages of `range` (inside one region).
fn file_offsets(layout: &Layout, (addr, len): Range) -> Vec<u64> {
    let Some(&(base, _, off)) = layout
        .regions
        .iter()
        .find(|&&(b, l, _)| addr >= b && addr < b + l as u64)
    else {
        return Vec::new();
    };
    (0..len / PAGE)
        .map(|i| off + (addr - base) + (i * PAGE) as u64)
        .collect()
}

/// What `--write-set` wrote.
pub struct Written {
    /// File offsets of the pages written, sorted.
    pub offsets: Vec<u64>,
    /// Median first-write latency, ns (all pages; those of the working
    /// set).
    pub median_ns: u64,
    /// ... of the working set's pages only.
    pub present_median_ns: u64,
}

/// `--write-set PCT`: inverts the first byte of a seeded `PCT`% of all
/// pages (`--write-seed`), page `i` of the set on vCPU thread `i %
/// threads`, timing each first write.
pub fn write_set(args: &PeerArgs, layout: &Layout, ws: &[(usize, usize)], pct: f64) -> Written {
    let counts: Vec<usize> = layout.regions.iter().map(|r| r.1 / PAGE).collect();
    let total: usize = counts.iter().sum();
    let want = ((total as f64 * pct / 100.0) as usize).min(total);
    let mut rng = Rng::new(args.write_seed ^ 0xbb67_ae85_84ca_a73b);
    let mut taken = vec![false; total];
    let mut set = Vec::with_capacity(want);
    while set.len() < want {
        let mut g = rng.in_range(0..total);
        while taken[g] {
            g = (g + 1) % total;
        }
        taken[g] = true;
        set.push(g);
    }
    let set = Arc::new(in_regions(&counts, set));
    let in_ws: std::collections::HashSet<(usize, usize)> = ws.iter().copied().collect();
    let in_ws = Arc::new(in_ws);
    let nthreads = args.threads.max(1);
    let regions = Arc::new(layout.regions.clone());
    let (pause_after, pause) = (args.write_pause_after, Duration::from_millis(args.pause_ms));
    let handles: Vec<_> = (0..nthreads)
        .map(|t| {
            let (set, regions, in_ws) = (set.clone(), regions.clone(), in_ws.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                for (i, &(r, p)) in set.iter().enumerate() {
                    if i % nthreads != t {
                        continue;
                    }
                    if t == 0 && pause_after == Some(lat.len()) {
                        say(format_args!("paused writing after {} pages", lat.len()));
                        std::thread::sleep(pause);
                    }
                    let addr = regions[r].0 + (p * PAGE) as u64;
                    let s = Instant::now();
                    // SAFETY: a byte inside a live, writable mapping of
                    // this process.
                    unsafe {
                        let b = !std::ptr::read_volatile(addr as *const u8);
                        std::ptr::write_volatile(addr as *mut u8, b);
                    }
                    lat.push((s.elapsed().as_nanos() as u64, in_ws.contains(&(r, p))));
                }
                lat
            })
        })
        .collect();
    let lat: Vec<(u64, bool)> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("writer thread"))
        .collect();
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let mut offsets: Vec<u64> = set
        .iter()
        .map(|&(r, p)| layout.regions[r].2 + (p * PAGE) as u64)
        .collect();
    offsets.sort_unstable();
    say(format_args!("wrote {} pages", offsets.len()));
    Written {
        offsets,
        median_ns: median(lat.iter().map(|l| l.0).collect()),
        present_median_ns: median(lat.iter().filter(|l| l.1).map(|l| l.0).collect()),
    }
}

/// Inverts the first byte of every working-set page, then reads the
/// writes back (they must stick, and stay private to this process).
pub fn scribble(layout: &Layout, ws: &[(usize, usize)]) -> anyhow::Result<()> {
    let regions = &layout.regions;
    let mut wrote = Vec::with_capacity(ws.len());
    for &(r, p) in ws {
        let addr = regions[r].0 + (p * PAGE) as u64;
        // SAFETY: a byte inside a live, writable mapping of this process.
        unsafe {
            let b = !std::ptr::read_volatile(addr as *const u8);
            std::ptr::write_volatile(addr as *mut u8, b);
            wrote.push(b);
        }
    }
    for (&(r, p), &b) in ws.iter().zip(&wrote) {
        let addr = regions[r].0 + (p * PAGE) as u64;
        // SAFETY: as above.
        let got = unsafe { std::ptr::read_volatile(addr as *const u8) };
        if got != b {
            bail!("the write at {addr:#x} did not stick: read {got:#04x}, wrote {b:#04x}");
        }
    }
    say(format_args!("scribbled on {} pages", ws.len()));
    Ok(())
}

/// Runs the restore (steps 1-4 of the module docs) on `layout`, timed
/// from `t0` (`sent_ns` in `CLOCK_MONOTONIC` ns); the first touches
/// slower than `--stall-ns` go to `stalls` as they happen.
pub fn touch_and_check(
    args: &PeerArgs,
    file: &std::fs::File,
    layout: &Layout,
    (t0, sent_ns): (Instant, u64),
    stalls: Option<Sender<u64>>,
) -> anyhow::Result<PeerReport> {
    let mut ws = working_set(layout, args.working_set, args.seed, args.pattern);
    if args.jitter > 0.0 {
        ws = jittered(layout, &ws, args.jitter, args.run_seed);
    }
    let ws = Arc::new(ws);
    let minflt0 = procfs::minor_faults();
    let storm = storm_range(layout, args.page_size());
    let t = if args.kvm {
        super::kvm::touch(args, file, layout, &ws)?
    } else {
        touch(args, layout, &ws, storm, stalls)
    };
    let seconds = t.end.max(t0).duration_since(t0).as_secs_f64();
    let minor_faults = procfs::minor_faults() - minflt0;
    let mut resident_pages = 0;
    if args.backend == Backend::Uffd {
        std::thread::sleep(Duration::from_millis(args.settle_ms));
        for &(addr, len, _) in &layout.regions {
            resident_pages += mem::resident_pages_at(addr, len)? as u64;
        }
    }
    let (rss_anon_kib, rss_shmem_kib, rss_file_kib, hugetlb_kib) = procfs::rss_kib();
    let lat = &t.latencies;
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    // What went to `stalls`.
    let stalls = match args.stall_ns {
        0 => &[][..],
        min => &lat[lat.partition_point(|&ns| ns <= min)..],
    };
    let verified_bytes = verify(args, file, layout, &ws, storm)?;
    if args.scribble {
        scribble(layout, &ws)?;
    }
    let written = args.write_set.map(|pct| write_set(args, layout, &ws, pct));
    let mut dropped_offsets = Vec::new();
    if written.is_some() {
        if let Some(b) = balloon_range(args, layout) {
            dropped_offsets.extend(file_offsets(layout, b));
        }
        if args.storm > 0 {
            dropped_offsets.extend(file_offsets(layout, storm));
        }
        dropped_offsets.sort_unstable();
        dropped_offsets.dedup();
    }
    let written = written.unwrap_or(Written {
        offsets: Vec::new(),
        median_ns: 0,
        present_median_ns: 0,
    });
    Ok(PeerReport {
        seconds,
        pages: ws.len(),
        median_ns: pick(0.5),
        p99_ns: pick(0.99),
        max_ns: lat.last().copied().unwrap_or(0),
        verified_bytes,
        stalls: stalls.len() as u64,
        stall_sum_ns: stalls.iter().sum(),
        resident_pages,
        rss_anon_kib,
        rss_shmem_kib,
        rss_file_kib,
        hugetlb_kib,
        minor_faults,
        sent_ns,
        vcpus_ns: t.vcpus_ns,
        first_touch_ns: t.first_touch_ns,
        last_touch_ns: t.last_touch_ns,
        vcpu_preempted: t.preempted,
        vcpu_slept: t.slept,
        touch_stamps: t.stamps,
        written_offsets: written.offsets,
        dropped_offsets,
        write_median_ns: written.median_ns,
        write_present_median_ns: written.present_median_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(pages: &[usize]) -> Layout {
        let mut off = 0;
        let regions = pages
            .iter()
            .map(|&n| {
                let r = (0x1000_0000 + off, n * PAGE, off);
                off += (n * PAGE) as u64;
                r
            })
            .collect();
        Layout {
            maps: Vec::new(),
            regions,
        }
    }

    #[test]
    fn a_working_set_is_the_seeds_own_and_covers_its_share_once() {
        let l = layout(&[3000, 1096]);
        let a = working_set(&l, 20.0, 1, Pattern::Clustered);
        assert_eq!(a.len(), 4096 / 5, "20% of 4096 pages");
        assert_eq!(
            a,
            working_set(&l, 20.0, 1, Pattern::Clustered),
            "same seed, same set"
        );
        assert_ne!(
            a,
            working_set(&l, 20.0, 2, Pattern::Clustered),
            "another seed, another set"
        );
        let mut seen = std::collections::HashSet::new();
        for &(r, p) in &a {
            assert!(p < [3000, 1096][r], "page {p} outside region {r}");
            assert!(seen.insert((r, p)), "({r}, {p}) drawn twice");
        }
        assert!(a.iter().any(|&(r, _)| r == 1), "both regions are drawn");
        // Clusters: most pages follow their predecessor.
        let runs = a
            .windows(2)
            .filter(|w| w[1] == (w[0].0, w[0].1 + 1))
            .count();
        assert!(runs > a.len() / 2, "{runs} of {} pages follow", a.len());
        assert_eq!(working_set(&l, 100.0, 9, Pattern::Clustered).len(), 4096);
    }

    #[test]
    fn a_sweep_is_memory_in_order_and_each_vcpu_sweeps_its_own_share() {
        let l = layout(&[3000, 1096]);
        let ws = working_set(&l, 100.0, 1, Pattern::Sweep);
        assert_eq!(ws.len(), 4096);
        assert_eq!((ws[0], ws[2999], ws[3000]), ((0, 0), (0, 2999), (1, 0)));
        assert_eq!(working_set(&l, 50.0, 1, Pattern::Sweep), ws[..2048]);
        for t in 0..3 {
            let share: Vec<usize> = (0..ws.len())
                .filter(|&i| mine(Pattern::Sweep, i, t, 3, ws.len()))
                .collect();
            assert!(share.windows(2).all(|w| w[1] == w[0] + 1), "contiguous");
            assert!(share.len().abs_diff(ws.len() / 3) <= 1);
        }
    }

    #[test]
    fn a_jittered_set_keeps_its_size_and_most_of_its_pages() {
        let l = layout(&[1024, 3072]);
        let a = working_set(&l, 20.0, 1, Pattern::Clustered);
        let j = jittered(&l, &a, 5.0, 7);
        assert_eq!(j.len(), a.len());
        let set: std::collections::HashSet<_> = a.iter().collect();
        let kept = j.iter().filter(|p| set.contains(p)).count();
        let swapped = a.len() * 5 / 100;
        assert!(kept >= a.len() - swapped, "{kept} of {}", a.len());
        assert_eq!(
            j.iter().collect::<std::collections::HashSet<_>>().len(),
            j.len()
        );
        assert_ne!(
            j,
            jittered(&l, &a, 5.0, 8),
            "another run, another variation"
        );
    }

    #[test]
    fn the_rng_stays_in_range() {
        let mut r = Rng::new(0);
        for _ in 0..10_000 {
            let v = r.in_range(8..65);
            assert!((8..65).contains(&v));
        }
        let mut hits = [0u32; 4];
        for _ in 0..4000 {
            hits[r.in_range(0..4)] += 1;
        }
        assert!(hits.iter().all(|&h| h > 800), "{hits:?}");
    }
}
