//! `faultline bench vpri`: seed 003 (VPRI) reproduced in software, each
//! figure printed next to the paper's under the same label (digest §3).
//!
//! * **B1** (Table 2): the presence check (`Residency::io_ready`) on a
//!   4 KiB and a 64 KiB range, hot and cold (the words flushed with
//!   `clflush`, the paper's "caching disabled"); the evictor-side update
//!   (claim + invalidate + release), without and with the `MADV_DONTNEED`
//!   zap (our "PCIe").
//! * **B2** (Fig 6): fio-like random 4 KiB reads, io_uring QD 32, from a
//!   page-cached file into a region, with I/O faults injected at R/s (the
//!   next I/O's buffer is a page never touched) and a 5 ms store: plain
//!   io_uring (blocking, the kernel takes the fault on the submitter), the
//!   API ordered, the API unordered, and the fault-free run; p99.9 ratios.
//! * **B3** (Figs 4-5, NIC): UDP over loopback into a ring of 2 KiB
//!   buffers over a budget region the evictor keeps cycling, signal
//!   engine: plain `recv` (EFAULT loses the datagram) vs the API.
//! * **B5** (Fig 16) and **B7** (Figs 9-11): see [`crate::sim`].
//! * **B8** (§5.3, the access log's cost and ADP on a lossy log): see
//!   [`b8`]; **B9** (Figs 7, 18, production-like): see
//!   [`crate::sim::day`]. Both run only when asked for (`--only b8,b9`).
//!
//! Time constants are the paper's times the scale factor `S` (printed).

mod b4;
mod b8;

use std::fs::File;
use std::net::UdpSocket;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use faultline::policy::PolicyKind;
use faultline::residency::{PageState, Residency};
use faultline::store::FileAccess;
use faultline::testing::{Action, Fault, FaultyStore};
use faultline::{EvictionConfig, FileStore, MemoryStore, PollEngine, Region, SignalEngine};
use faultline_io::{Backend, DeviceConfig, IoDevice, Ordering, Target, Tenant, TenantConfig};
use rand::{Rng, SeedableRng};

use crate::harness::paper::line;
use crate::harness::report::print_table;
use crate::harness::stats::Summary;
use crate::harness::tsc::tsc;
use crate::harness::BenchCtx;

const PS: usize = 4096;

/// Arguments of `faultline bench vpri`.
#[derive(clap::Args, Clone, Debug)]
pub struct VpriArgs {
    /// Which parts, comma-separated: b1,b2,b3,b4,b5,b7,b8,b9 (default
    /// b1,b2,b3,b4,b5,b7; b8 and b9 take about half a minute each).
    #[arg(long, default_value = "b1,b2,b3,b4,b5,b7")]
    pub only: String,
    /// Time-scaling factor S applied to the paper's constants (default 1/100).
    #[arg(long, default_value_t = 0.01)]
    pub scale: f64,
    /// B2: seconds per mode per round (default 0.5).
    #[arg(long, default_value_t = 0.5)]
    pub b2_secs: f64,
    /// B2: I/Os arriving per second, open loop (default 26,800: the
    /// paper's virtio-blk device, Table 1). Latency counts from arrival.
    #[arg(long, default_value_t = 26_800.0)]
    pub b2_iops: f64,
    /// B2: rounds (default 30). Each round runs the five modes (plain
    /// fault-free, API fault-free, blocking, ordered, unordered) back to
    /// back, in a shuffled order (seeded), each after a random 0-50 ms
    /// pause (so periodic noise of the machine does not phase-lock onto
    /// one mode), at the same priority (`--b2-normal-priority`), wherever
    /// the scheduler puts them. Each round's ratio is a mode's p99.9 over
    /// that round's plain fault-free p99.9; the headline is the median
    /// over the rounds (range and the pooled p99.9s printed too), beside
    /// the floor the parked I/Os alone give. Each round's steal time and
    /// other processes' CPU (from /proc/stat) are printed. About 1.5 min
    /// with the defaults.
    #[arg(long, default_value_t = 30)]
    pub b2_reps: usize,
    /// B2: run the submitting thread at the caller's priority. Default:
    /// SCHED_FIFO 10 while it submits and reaps, in every mode alike (the
    /// application's I/O thread; the library's threads and the poll
    /// engine stay at normal priority), so kernel threads and agents of
    /// this shared guest cannot preempt it; falls back to the caller's
    /// priority, and says so, without the permission.
    #[arg(long)]
    pub b2_normal_priority: bool,
    /// B2: injected I/O faults per second (default 10, the paper's Fig 6 rate).
    #[arg(long, default_value_t = 10.0)]
    pub b2_rate: f64,
    /// B2: store latency of an injected fault, ms (default 5, the paper's).
    #[arg(long, default_value_t = 5.0)]
    pub b2_store_ms: f64,
    /// B3: datagrams per mode (default 40,000).
    #[arg(long, default_value_t = 40_000)]
    pub b3_packets: u32,
    /// B3: datagrams per second (default 20,000).
    #[arg(long, default_value_t = 20_000)]
    pub b3_pps: u32,
    /// B4: I/O faults per second per device (default 10, the paper's Fig 15
    /// top rate).
    #[arg(long, default_value_t = 10.0)]
    pub b4_rate: f64,
    /// B4: seconds per point (default 3).
    #[arg(long, default_value_t = 3.0)]
    pub b4_secs: f64,
    /// B5: how each VM's reclaim ratio is set (default psi: the server's
    /// memory fixed at 1 - r, balanced across VMs by their pressure, as the
    /// paper's §3.4 and §7.3 say; static: every VM at r all hour; redraw:
    /// random redraws, see --b5-reclaim-every; psi-avg10/psi-avg60/
    /// psi-avg300: the kernel's PSI averages as the pressure; psi-abs:
    /// Senpai's absolute 10 ms / 6 s target).
    #[arg(long, default_value = "psi")]
    pub b5_reclaim: String,
    /// B5: further reclaim models printed beside it, comma-separated, or
    /// "none" (default static).
    #[arg(long, default_value = "static")]
    pub b5_compare: String,
    /// B5: the redraw model's period, simulated seconds: each VM's ratio
    /// redrawn within 0-50% with mean r (default 600).
    #[arg(long, default_value_t = 600)]
    pub b5_reclaim_every: u64,
    /// B8: seconds per point per round (default 0.6; 8 log settings x 2
    /// workloads per round).
    #[arg(long, default_value_t = 0.6)]
    pub b8_secs: f64,
    /// B8: rounds (default 3; each point's IOPS is the median).
    #[arg(long, default_value_t = 3)]
    pub b8_reps: usize,
    /// B9: simulated VMs (default 28: B5's 14-VM mix twice).
    #[arg(long, default_value_t = 28)]
    pub b9_vms: usize,
    /// B9: simulated days (default 1).
    #[arg(long, default_value_t = 1)]
    pub b9_days: u64,
    /// B9: the host's reclaim (default psi: a server of 12.5% overcommit,
    /// the middle of the paper's 10-15%, balanced by pressure; drift: each
    /// VM's ratio redrawn hourly as 0.5 U^3).
    #[arg(long, default_value = "psi")]
    pub b9_reclaim: String,
    /// B1: samples per measurement (default 1,000,000 hot, 1/10 of it cold).
    #[arg(long, default_value_t = 1_000_000)]
    pub b1_samples: usize,
}

/// Entry point.
pub fn run(ctx: &mut BenchCtx, a: &VpriArgs) -> anyhow::Result<()> {
    let parts: Vec<&str> = a.only.split(',').map(str::trim).collect();
    for p in &parts {
        if !["b1", "b2", "b3", "b4", "b5", "b7", "b8", "b9"].contains(p) {
            anyhow::bail!("unknown part {p:?} (b1, b2, b3, b4, b5, b7, b8, b9)");
        }
    }
    println!(
        "Table 1 analogue: {} | S (time scale) = {} (paper 20 s scan -> {:.2} s, 180 s threshold -> {:.2} s, 30 min trace -> {:.1} s)",
        ctx.report.machine.kernel,
        a.scale,
        20.0 * a.scale,
        180.0 * a.scale,
        1800.0 * a.scale
    );
    line(ctx, "scale.S", a.scale, "", "1 (real time)");
    if parts.contains(&"b1") {
        b1(ctx, a).context("B1")?;
    }
    if parts.contains(&"b3") {
        b3(ctx, a).context("B3")?;
    }
    if parts.contains(&"b4") {
        b4::b4(
            ctx,
            &b4::B4 {
                rate: a.b4_rate,
                secs: a.b4_secs,
                store_ms: a.b2_store_ms,
            },
        )
        .context("B4")?;
    }
    if parts.contains(&"b2") {
        b2(ctx, a).context("B2")?;
    }
    if parts.contains(&"b5") || parts.contains(&"b7") {
        let model = |m: &str| crate::sim::b5::B5Model::parse(m.trim(), a.b5_reclaim_every);
        let compare = a
            .b5_compare
            .split(',')
            .filter(|m| !m.trim().is_empty() && m.trim() != "none")
            .map(model)
            .collect::<anyhow::Result<Vec<_>>>()?;
        crate::sim::b5::run(
            ctx,
            model(&a.b5_reclaim)?,
            &compare,
            parts.contains(&"b5"),
            parts.contains(&"b7"),
        )
        .context("B5/B7")?;
    }
    if parts.contains(&"b8") {
        b8::b8(
            ctx,
            &b8::B8 {
                secs: a.b8_secs,
                reps: a.b8_reps,
            },
        )
        .context("B8")?;
    }
    if parts.contains(&"b9") {
        crate::sim::day::b9(
            ctx,
            &crate::sim::day::B9 {
                vms: a.b9_vms,
                days: a.b9_days,
                psi: match a.b9_reclaim.as_str() {
                    "psi" => true,
                    "drift" => false,
                    m => anyhow::bail!("unknown B9 reclaim {m:?} (psi, drift)"),
                },
            },
        )
        .context("B9")?;
    }
    println!("not reproduced here: B4's CPU contention (its fills are sleeps: 16 tenants' workers on 2 CPUs), B6 as its own run (Fig 17 is plotted from B5's NIC domain).");
    Ok(())
}

fn summary_ns(cycles: &mut [u64], overhead: u64) -> Summary {
    for c in cycles.iter_mut() {
        *c = c.saturating_sub(overhead);
    }
    Summary::from_cycles(cycles, tsc())
}

#[inline(always)]
fn rdtscp() -> u64 {
    let mut aux = 0u32;
    // SAFETY: rdtscp has no preconditions on x86_64.
    unsafe { core::arch::x86_64::__rdtscp(&mut aux) }
}

fn flush(addrs: &[*const u8]) {
    for &a in addrs {
        // SAFETY: clflush of a mapped address (words of a live Residency).
        unsafe { core::arch::x86_64::_mm_clflush(a) };
    }
    // SAFETY: a fence has no preconditions.
    unsafe { core::arch::x86_64::_mm_mfence() };
}

/// B1: Table 2.
fn b1(ctx: &mut BenchCtx, a: &VpriArgs) -> anyhow::Result<()> {
    println!("\n== B1: presence check and update (Table 2) ==");
    let pages = 1 << 20; // a 4 GiB region's map
    let r = Residency::new(pages);
    r.set_range(0..pages, PageState::Writable);
    // Timer overhead: an empty measured section.
    let mut empty: Vec<u64> = (0..10_000)
        .map(|_| {
            let t = rdtscp();
            rdtscp() - t
        })
        .collect();
    empty.sort_unstable();
    let overhead = empty[empty.len() / 2];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut rows = Vec::new();
    for (name, span) in [("4KiB", 1usize), ("64KiB", 16)] {
        // Hot: the same words every time.
        let n = a.b1_samples;
        let mut hot = Vec::with_capacity(n);
        let p0 = 1000;
        for _ in 0..n {
            let t = rdtscp();
            let ok = r.io_ready(p0..p0 + span, true, true).is_ok();
            hot.push(rdtscp() - t);
            std::hint::black_box(ok);
        }
        let hs = summary_ns(&mut hot, overhead);
        // Cold: random pages, their words flushed first.
        let mut cold = Vec::with_capacity(n / 10);
        for _ in 0..n / 10 {
            let p = rng.gen_range(0..pages - span);
            let mut w: Vec<*const u8> = r.words_of(p).to_vec();
            w.extend(r.words_of(p + span - 1));
            flush(&w);
            let t = rdtscp();
            let ok = r.io_ready(p..p + span, true, true).is_ok();
            cold.push(rdtscp() - t);
            std::hint::black_box(ok);
        }
        let cs = summary_ns(&mut cold, overhead);
        rows.push(vec![
            format!("lookup {name} hot"),
            format!("{:.1}", hs.mean),
            format!("{:.1}", hs.p99),
        ]);
        rows.push(vec![
            format!("lookup {name} cold (clflush)"),
            format!("{:.1}", cs.mean),
            format!("{:.1}", cs.p99),
        ]);
        line(
            ctx,
            &format!("table2.lookup_{name}.hot.avg_ns"),
            hs.mean,
            "ns",
            "69 (DPU DRAM; target < 10 hot)",
        );
        line(
            ctx,
            &format!("table2.lookup_{name}.hot.p99_ns"),
            hs.p99,
            "ns",
            "92",
        );
        line(
            ctx,
            &format!("table2.lookup_{name}.cold.avg_ns"),
            cs.mean,
            "ns",
            "69 (target < 200 cold)",
        );
        line(
            ctx,
            &format!("table2.lookup_{name}.cold.p99_ns"),
            cs.p99,
            "ns",
            "92",
        );
    }
    // The floor: one plain cache-missing load of a random word of the same
    // bitmap (flushed, same timer), what any cold check costs at least.
    let mut floor = Vec::with_capacity(a.b1_samples / 10);
    for _ in 0..a.b1_samples / 10 {
        let p = rng.gen_range(0..pages);
        let w = r.words_of(p)[0];
        flush(&[w]);
        let t = rdtscp();
        // SAFETY: `w` points into the live bitmap (an aligned u64 word).
        let v = unsafe { std::ptr::read_volatile(w.cast::<u64>()) };
        floor.push(rdtscp() - t);
        std::hint::black_box(v);
    }
    let fs = summary_ns(&mut floor, overhead);
    // Batched cold checks, as `IoQueue::submit_batch` does them: B random
    // pages, every word flushed, then each page checked while the words
    // of the next PREFETCH_AHEAD are already being loaded. The cost per
    // check is the batch's time over B (a pipeline's checks overlap, so
    // one check alone has no time of its own): its mean, and its p99 over
    // batches.
    const BATCH: usize = 64;
    let ahead = faultline_io::PREFETCH_AHEAD;
    let mut batched = Vec::with_capacity(a.b1_samples / 10 / BATCH);
    let mut ps = vec![0usize; BATCH];
    for _ in 0..(a.b1_samples / 10 / BATCH).max(1) {
        for p in ps.iter_mut() {
            *p = rng.gen_range(0..pages);
            flush(&r.words_of(*p));
        }
        let t = rdtscp();
        for &p in &ps[..ahead] {
            r.prefetch_io(p..p + 1);
        }
        let mut ok = 0;
        for i in 0..BATCH {
            if let Some(&q) = ps.get(i + ahead) {
                r.prefetch_io(q..q + 1);
            }
            ok += usize::from(r.io_ready(ps[i]..ps[i] + 1, true, true).is_ok());
        }
        let dt = rdtscp() - t;
        std::hint::black_box(ok);
        batched.push(dt.saturating_sub(overhead) / BATCH as u64);
    }
    let bs = summary_ns(&mut batched, 0);
    rows.push(vec![
        format!("lookup 4KiB cold, batched ({BATCH}, prefetch {ahead} ahead), per check"),
        format!("{:.1}", bs.mean),
        format!("{:.1}", bs.p99),
    ]);
    line(
        ctx,
        "table2.lookup_4KiB.cold_batched.avg_ns",
        bs.mean,
        "ns",
        "69 (target < 200 cold; per check of a pipelined batch)",
    );
    line(
        ctx,
        "table2.lookup_4KiB.cold_batched.p99_ns",
        bs.p99,
        "ns",
        "92 (p99 over batches of the per-check cost)",
    );
    rows.push(vec![
        "floor: one clflushed load".into(),
        format!("{:.1}", fs.mean),
        format!("{:.1}", fs.p99),
    ]);
    line(
        ctx,
        "table2.cold_floor.one_missing_load.avg_ns",
        fs.mean,
        "ns",
        "(this machine's floor for a cold check)",
    );
    line(
        ctx,
        "table2.cold_floor.one_missing_load.p99_ns",
        fs.p99,
        "ns",
        "(a cold p99 below it is impossible here)",
    );
    // Update: the evictor's invalidation (claim, set absent, release).
    let n = a.b1_samples / 10;
    let mut upd = Vec::with_capacity(n);
    for i in 0..n {
        let p = (i * 7919) % pages;
        r.set(p, PageState::Writable);
        let t = rdtscp();
        if r.try_claim(p) {
            r.set(p, PageState::Absent);
            r.release(p..p + 1);
        }
        upd.push(rdtscp() - t);
    }
    let us = summary_ns(&mut upd, overhead);
    // With the zap: MADV_DONTNEED of a resident page.
    let m = faultline_sys::mem::Mapping::anon(256 * PS)?;
    let mut zap = Vec::with_capacity(20_000);
    for i in 0..20_000 {
        let off = (i % 256) * PS;
        // SAFETY: inside the mapping; touch it resident.
        unsafe { std::ptr::write_volatile(m.as_ptr().add(off), 1u8) };
        let t = rdtscp();
        let _ = faultline_sys::mem::madvise(
            m.addr() + off as u64,
            PS,
            faultline_sys::mem::Advice::DontNeed,
        );
        zap.push(rdtscp() - t);
    }
    let zs = summary_ns(&mut zap, overhead);
    rows.push(vec![
        "update (claim+invalidate+release)".into(),
        format!("{:.1}", us.mean),
        format!("{:.1}", us.p99),
    ]);
    rows.push(vec![
        "update + MADV_DONTNEED zap".into(),
        format!("{:.1}", us.mean + zs.mean),
        format!("{:.1}", us.p99 + zs.p99),
    ]);
    print_table(&["Table 2", "avg ns", "p99 ns"], &rows);
    line(
        ctx,
        "table2.update.avg_ns",
        us.mean,
        "ns",
        "1742 (host update incl. PCIe)",
    );
    line(ctx, "table2.update.p99_ns", us.p99, "ns", "2341");
    line(
        ctx,
        "table2.update_with_zap.avg_ns",
        us.mean + zs.mean,
        "ns",
        "1742",
    );
    line(
        ctx,
        "table2.update_with_zap.p99_ns",
        us.p99 + zs.p99,
        "ns",
        "2341",
    );
    Ok(())
}

/// B3: UDP receive into a ring over evicted pages, signal engine.
fn b3(ctx: &mut BenchCtx, a: &VpriArgs) -> anyhow::Result<()> {
    println!("\n== B3: UDP receive into paged memory (Figs 4-5, NIC), signal engine ==");
    let engine = SignalEngine::new()?;
    let slots = 256;
    let slot = 2048;
    let pages = slots * slot / PS;
    let dir = std::env::temp_dir().join(format!("faultline-b3-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store_path = dir.join("ring.store");
    std::fs::write(&store_path, vec![0u8; pages * PS])?;
    let mut rows = Vec::new();
    let mut drops = [0u64; 2];
    for (mi, mode) in ["plain recv", "I/O API"].into_iter().enumerate() {
        let region = Arc::new(
            Region::builder(pages * PS)
                .store(FileStore::open_with(&store_path, 0, FileAccess::Pread)?)
                .budget(EvictionConfig {
                    budget_pages: pages / 4,
                    policy: PolicyKind::Clock,
                })
                .fault_around(1)
                .build(&engine)?,
        );
        let rx = Arc::new(UdpSocket::bind("127.0.0.1:0")?);
        let tx = UdpSocket::bind("127.0.0.1:0")?;
        tx.connect(rx.local_addr()?)?;
        rx.set_read_timeout(Some(Duration::from_millis(200)))?;
        // Both modes get the same 8 MiB socket buffer (the NIC's ring):
        // what is lost below is lost to the receive path, not to a small
        // default buffer.
        set_rcvbuf(&rx, 8 << 20);
        let n = a.b3_packets;
        let pps = a.b3_pps.max(1);
        let sender = std::thread::spawn(move || -> std::io::Result<Duration> {
            let t0 = Instant::now();
            let d = [0u8; 1200];
            for i in 0..n {
                let due = t0 + Duration::from_secs_f64(f64::from(i) / f64::from(pps));
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
                tx.send(&d)?;
            }
            Ok(t0.elapsed())
        });
        let mut received = 0u64;
        let mut efaults = 0u64;
        let t0 = Instant::now();
        let mut timeline = vec![0u64; 1 + (f64::from(n) / f64::from(pps) * 100.0) as usize + 200];
        let mut s = 0usize;
        let (mut iopfs, mut efault_lost) = (0, 0);
        if mi == 0 {
            loop {
                // SAFETY: a ring slot inside the region.
                let buf =
                    unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(s * slot), slot) };
                match rx.recv(buf) {
                    Ok(_) => {
                        received += 1;
                        let bin = (t0.elapsed().as_millis() / 10) as usize;
                        if let Some(b) = timeline.get_mut(bin) {
                            *b += 1;
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(14) => {
                        // The datagram is gone; bring the page in and go on.
                        efaults += 1;
                        region.populate((s * slot) / PS * PS, PS)?;
                    }
                    Err(_) => break, // timeout: the sender is done
                }
                s = (s + 1) % slots;
            }
        } else {
            let tenant = Arc::new(Tenant::new(TenantConfig::default())?);
            let dev = IoDevice::new(
                region.clone(),
                &tenant,
                DeviceConfig {
                    ordering: Ordering::Ordered,
                    unit_pages: 1,
                    ..Default::default()
                },
            )?;
            let mut q = dev.queue(Backend::Syscall)?;
            let target = Target::Udp(rx.clone());
            let mut last = Instant::now();
            loop {
                while q.outstanding() < 8 {
                    q.recv(target.clone(), s * slot, slot, s as u64)?;
                    s = (s + 1) % slots;
                }
                match q.complete(Duration::from_millis(50)) {
                    Some(c) if c.result.is_ok() => {
                        received += 1;
                        last = Instant::now();
                        let bin = (t0.elapsed().as_millis() / 10) as usize;
                        if let Some(b) = timeline.get_mut(bin) {
                            *b += 1;
                        }
                    }
                    _ => {
                        if last.elapsed() > Duration::from_millis(300) {
                            break;
                        }
                    }
                }
            }
            let st = dev.stats();
            iopfs = st.iopfs;
            efault_lost = st.efault_lost;
            // Parked receives are dropped with the queue.
        }
        let took = sender
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))??;
        let lost = u64::from(n).saturating_sub(received);
        drops[mi] = lost;
        let es = region.eviction_stats().unwrap_or_default();
        rows.push(vec![
            mode.to_string(),
            n.to_string(),
            received.to_string(),
            lost.to_string(),
            efaults.to_string(),
            iopfs.to_string(),
            efault_lost.to_string(),
            es.evicted.to_string(),
            format!("{:.0}", f64::from(n) / took.as_secs_f64()),
        ]);
        let series: Vec<(f64, f64)> = timeline
            .iter()
            .enumerate()
            .take_while(|(i, _)| (*i as f64) * 10.0 < took.as_secs_f64() * 1000.0 + 100.0)
            .map(|(i, &c)| (i as f64 * 10.0, c as f64 * 100.0))
            .collect();
        let name = format!("vpri_b3_{}", if mi == 0 { "plain" } else { "api" });
        let title = format!("B3 UDP receive PPS, {mode} (10 ms bins)");
        ctx.figure(&name, |d, nm| {
            crate::harness::plot::line_chart(
                d,
                nm,
                &title,
                "ms",
                "datagrams/s",
                &[(mode.to_string(), series)],
                false,
            )
        })?;
    }
    print_table(
        &[
            "mode",
            "sent",
            "received",
            "lost",
            "EFAULT",
            "I/O faults",
            "EFAULT lost (API)",
            "evicted",
            "pps sent",
        ],
        &rows,
    );
    line(
        ctx,
        "b3.udp.drops_signal_plain_recv",
        drops[0] as f64,
        "",
        "> 0 (Fig 5: packets dropped during an IOPF)",
    );
    line(
        ctx,
        "b3.udp.drops_vpri_api",
        drops[1] as f64,
        "",
        "0 (target)",
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `SO_RCVBUFFORCE` (root), else `SO_RCVBUF` (capped by `rmem_max`).
fn set_rcvbuf(s: &UdpSocket, bytes: i32) {
    // Best effort: the default buffer only makes the plain-recv row lose more.
    let _ = faultline_sys::sock::set_rcvbuf(s.as_fd(), bytes);
}

/// B2's modes, in the order of the tables: name, injected faults/s
/// (0 or `--b2-rate`), and the API queue's ordering (`None`: plain
/// io_uring).
fn b2_modes(rate: f64) -> [(&'static str, f64, Option<Ordering>); 5] {
    [
        ("fault-free", 0.0, None),
        ("fault-free, API unordered", 0.0, Some(Ordering::Unordered)),
        ("blocking (plain io_uring)", rate, None),
        ("VPRI ordered", rate, Some(Ordering::Ordered)),
        ("VPRI unordered", rate, Some(Ordering::Unordered)),
    ]
}

/// CPU time of the whole machine and of this process, from `/proc`.
#[derive(Clone, Copy, Default)]
struct CpuSnap {
    /// Non-idle time of all CPUs (user, nice, system, irq, softirq), ticks.
    busy: u64,
    /// Time the hypervisor ran something else on our vCPUs, ticks.
    steal: u64,
    /// This process's user + system time, ticks.
    own: u64,
    at: Option<Instant>,
}

impl CpuSnap {
    fn now() -> CpuSnap {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let f: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        let own_stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name's closing parenthesis: utime and
        // stime are fields 14 and 15 of the line (11 and 12 after it).
        let rest = own_stat.rsplit_once(')').map_or("", |(_, r)| r);
        let g: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        CpuSnap {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            steal: at(7),
            own: g.get(11).copied().unwrap_or(0) + g.get(12).copied().unwrap_or(0),
            at: Some(Instant::now()),
        }
    }

    /// Since `before`: steal in ms, and the other processes' CPU time as a
    /// share of one CPU (the machine's busy time minus ours).
    fn since(&self, before: &CpuSnap) -> (f64, f64) {
        let hz = faultline_sys::thread::clock_ticks_per_sec() as f64;
        let secs = match (self.at, before.at) {
            (Some(a), Some(b)) => a.duration_since(b).as_secs_f64().max(1e-9),
            _ => 1.0,
        };
        let steal_ms = self.steal.saturating_sub(before.steal) as f64 / hz * 1e3;
        let others = (self.busy.saturating_sub(before.busy) as f64
            - self.own.saturating_sub(before.own) as f64)
            .max(0.0)
            / hz;
        (steal_ms, others / secs * 100.0)
    }
}

/// The calling thread at SCHED_FIFO 10 (threads it starts get the normal
/// policy back: `SCHED_RESET_ON_FORK`) until dropped; a no-op when not
/// asked for or not permitted.
struct Fifo(bool);

impl Fifo {
    fn enter(want: bool) -> Fifo {
        if !want {
            return Fifo(false);
        }
        Fifo(faultline_sys::thread::set_fifo(10).is_ok())
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        if self.0 {
            let _ = faultline_sys::thread::set_normal();
        }
    }
}

/// B2: random reads with injected I/O faults.
fn b2(ctx: &mut BenchCtx, a: &VpriArgs) -> anyhow::Result<()> {
    let modes = b2_modes(a.b2_rate);
    let reps = a.b2_reps.max(1);
    println!(
        "\n== B2: random 4 KiB reads arriving at {} IOPS (open loop, latency from arrival), io_uring QD <= 32, {} injected I/O faults/s, {} ms store (Fig 6), poll engine ==",
        a.b2_iops, a.b2_rate, a.b2_store_ms
    );
    println!(
        "method: {reps} rounds; each round runs all {} modes for {} s each, in a shuffled order (seeded), each after \
         a random 0-50 ms pause; a ratio is a mode's p99.9 over the plain fault-free p99.9 of the same round, and \
         the headline is the median over the rounds (range and all rounds pooled printed too); steal and the other \
         processes' CPU (% of one CPU, /proc/stat, the round's busiest segment) per round show a noisy one. Same method, priority (the \
         next line) and CPUs (wherever the scheduler puts them) for every mode.",
        modes.len(),
        a.b2_secs
    );
    let fifo = !a.b2_normal_priority && Fifo::enter(true).0;
    println!(
        "priority of the submitting thread: {}",
        match (a.b2_normal_priority, fifo) {
            (true, _) => "the caller's (--b2-normal-priority)",
            (false, true) =>
                "SCHED_FIFO 10 in every mode (library threads and the poll engine: normal)",
            (false, false) => "the caller's (SCHED_FIFO not permitted)",
        }
    );
    let hot = 1024usize; // buffer pages in the hot set
    let fresh = ((a.b2_rate * a.b2_secs * 2.0) as usize + 64).max(64);
    let pages = hot + fresh;
    let dir = std::env::temp_dir().join(format!("faultline-b2-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file_blocks = 16384usize;
    let path = dir.join("disk.img");
    std::fs::write(&path, vec![0x42u8; file_blocks * PS])?;
    let file = Arc::new(File::open(&path)?);
    // Warm the page cache.
    let mut tmp = vec![0u8; PS];
    for b in 0..file_blocks {
        file.read_at(&mut tmp, (b * PS) as u64)?;
    }
    let engine = PollEngine::new()?;
    // Per mode and round: the latencies (ns) and the injected faults.
    let mut lat_by: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); reps]; modes.len()];
    let mut faults_by = vec![vec![0u64; reps]; modes.len()];
    let mut order_rng = rand::rngs::SmallRng::seed_from_u64(13);
    let mut rows = Vec::new();
    let mut timelines: Vec<(String, Vec<(f64, f64)>)> = modes
        .iter()
        .map(|(mode, _, _)| (mode.to_string(), Vec::new()))
        .collect();
    let mut progress = crate::harness::progress::Progress::new((reps * modes.len()) as u64, "B2");
    for round in 0..reps {
        let mut order: Vec<usize> = (0..modes.len()).collect();
        rand::seq::SliceRandom::shuffle(&mut order[..], &mut order_rng);
        let (mut round_steal, mut round_others, mut round_iops) = (0.0, 0.0f64, f64::MAX);
        let mut p999_row = vec![0.0; modes.len()];
        for &m in &order {
            let (mode, rate, ordering) = modes[m];
            // A random pause, so that no periodic noise of the machine
            // (a kernel thread every 512 ms, an agent every second) keeps
            // falling into the same mode.
            std::thread::sleep(Duration::from_millis(order_rng.gen_range(0..50)));
            progress.step(&format!("round {}: {mode}", round + 1));
            let region = Arc::new(
                Region::builder(pages * PS)
                    // Fills past the hot buffer pages are injected faults.
                    .store(
                        FaultyStore::builder(MemoryStore::new(vec![0u8; pages * PS]))
                            .rule(
                                Fault::fill(Action::Slow(Duration::from_secs_f64(
                                    a.b2_store_ms / 1000.0,
                                )))
                                .pages(hot as u64..),
                            )
                            .build(),
                    )
                    .fault_around(1)
                    .build(&engine)?,
            );
            region.populate(0, hot * PS)?;
            let before = CpuSnap::now();
            let (lat, timeline, faults) = match ordering {
                Some(o) => b2_api(&region, &file, file_blocks, hot, rate, a, o)?,
                None => b2_plain(&region, &file, file_blocks, hot, rate, a)?,
            };
            let (steal_ms, others) = CpuSnap::now().since(&before);
            round_steal += steal_ms;
            round_others = round_others.max(others);
            round_iops = round_iops.min(lat.len() as f64 / a.b2_secs);
            p999_row[m] = Summary::from_ns(&mut lat.clone()).p999;
            lat_by[m][round] = lat;
            faults_by[m][round] = faults;
            // A mode's rounds end to end.
            let t_off = round as f64 * a.b2_secs * 1e3;
            timelines[m]
                .1
                .extend(timeline.into_iter().map(|(t, p)| (t + t_off, p)));
        }
        let mut row = vec![
            (round + 1).to_string(),
            order
                .iter()
                .map(|m| (m + 1).to_string())
                .collect::<String>(),
            format!("{round_iops:.0}"),
        ];
        row.extend(p999_row.iter().map(|p| format!("{:.1}", p / 1e3)));
        row.extend([
            format!("{:.2}", p999_row[4] / p999_row[0].max(1.0)),
            format!("{round_steal:.0}"),
            format!("{round_others:.1}"),
        ]);
        rows.push(row);
    }
    progress.finish();
    print_table(
        &[
            "round",
            "order",
            "min IOPS",
            "p99.9 us: 1 fault-free",
            "2 API fault-free",
            "3 blocking",
            "4 ordered",
            "5 unordered",
            "5/1",
            "steal ms",
            "others %CPU (max)",
        ],
        &rows,
    );
    let p999 = |v: &[f64]| Summary::from_ns(&mut v.to_vec()).p999;
    // What the unordered queue's p99.9 would be if a fault delayed only
    // the I/O into its page: the fault-free I/Os plus as many parked ones
    // per I/O as the unordered run had, each slower than all.
    let floor_of = |ff: &[f64], faults: u64, n_un: usize| {
        let parked = (faults as f64 * ff.len() as f64 / n_un.max(1) as f64).round() as usize;
        let mut v = ff.to_vec();
        v.extend(std::iter::repeat_n(f64::MAX, parked));
        p999(&v)
    };
    let pooled: Vec<Vec<f64>> = lat_by.iter().map(|r| r.concat()).collect();
    let base = p999(&pooled[0]).max(1.0);
    let pooled_floor = floor_of(&pooled[0], faults_by[4].iter().sum(), pooled[4].len());
    // Each round's ratios to the same round's plain fault-free p99.9; the
    // last row is the floor.
    let ff_round: Vec<f64> = lat_by[0].iter().map(|v| p999(v).max(1.0)).collect();
    let mut ratios: Vec<Vec<f64>> = lat_by
        .iter()
        .map(|r| r.iter().zip(&ff_round).map(|(v, b)| p999(v) / b).collect())
        .collect();
    ratios.push(
        (0..reps)
            .map(|i| floor_of(&lat_by[0][i], faults_by[4][i], lat_by[4][i].len()) / ff_round[i])
            .collect(),
    );
    let spread = |r: &[f64]| {
        let mut r = r.to_vec();
        r.sort_by(f64::total_cmp);
        (r[r.len() / 2], r[0], r[r.len() - 1])
    };
    let names = modes
        .iter()
        .map(|(m, _, _)| *m)
        .chain(["floor: fault-free + the parked I/Os only"]);
    let mut summary = Vec::new();
    for (m, name) in names.enumerate() {
        let (med, lo, hi) = spread(&ratios[m]);
        let (p50, p99, p999_ns) = match pooled.get(m) {
            Some(v) => {
                let s = Summary::from_ns(&mut v.clone());
                (
                    format!("{:.1}", s.median / 1e3),
                    format!("{:.1}", s.p99 / 1e3),
                    s.p999,
                )
            }
            None => ("-".into(), "-".into(), pooled_floor),
        };
        summary.push(vec![
            name.to_string(),
            p50,
            p99,
            format!("{:.1}", p999_ns / 1e3),
            format!("{:.2}", p999_ns / base),
            format!("{med:.2} [{lo:.2}-{hi:.2}]"),
            format!("{}/{reps}", ratios[m].iter().filter(|&&x| x < 1.5).count()),
        ]);
        if m > 0 {
            let key = [
                "",
                "api_fault_free",
                "blocking",
                "vpri_ordered",
                "vpri_unordered",
                "vpri_unordered_floor",
            ][m];
            let label = format!("fig6.{key}.p999_ratio_pooled");
            let s = Summary {
                n: 1,
                median: p999_ns / base,
                ..Summary::default()
            };
            ctx.report.push(
                crate::harness::report::Record::new("vpri", &label, "-", "-", &s)
                    .with("label", label.as_str())
                    .with("measured", p999_ns / base)
                    .with("unit", "x")
                    .with("round_ratios", serde_json::json!(ratios[m])),
            );
        }
    }
    println!(
        "the {reps} rounds (each ratio: a mode's p99.9 / the same round's plain fault-free p99.9; \
         the headline is their median), and all rounds pooled:"
    );
    print_table(
        &[
            "mode",
            "pooled p50 us",
            "p99 us",
            "p99.9 us",
            "pooled ratio",
            "round ratio median [min-max]",
            "rounds < 1.5x",
        ],
        &summary,
    );
    let ratio = |m: usize| spread(&ratios[m]).0;
    line(
        ctx,
        "fig6.api_fault_free.p999_ratio_vs_no_iopf",
        ratio(1),
        "x",
        "(the API's own tail, no faults)",
    );
    line(
        ctx,
        "fig6.blocking.p999_ratio_vs_no_iopf",
        ratio(2),
        "x",
        "2-11x at 10/s (target > 2)",
    );
    line(
        ctx,
        "fig6.vpri_ordered.p999_ratio_vs_no_iopf",
        ratio(3),
        "x",
        "(paper: the paused queue = blocking)",
    );
    line(
        ctx,
        "fig6.vpri_unordered.p999_ratio_vs_no_iopf",
        ratio(4),
        "x",
        "(target < 1.5; §8 future work)",
    );
    line(
        ctx,
        "fig6.vpri_unordered.p999_ratio_floor",
        ratio(5),
        "x",
        "(the parked I/Os alone, nothing else delayed)",
    );
    ctx.figure("vpri_b2_p99", |d, nm| {
        crate::harness::plot::line_chart(
            d,
            nm,
            "B2: p99 latency of the I/Os arriving in each 100 ms (a mode's rounds end to end)",
            "ms",
            "p99 us",
            &timelines,
            false,
        )
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

type B2Out = (Vec<f64>, Vec<(f64, f64)>, u64);

/// The next buffer page: a hot one, or (at `rate`/s) a fresh one.
struct Picker {
    rng: rand::rngs::SmallRng,
    hot: usize,
    next_fresh: usize,
    every: Option<Duration>,
    due: Instant,
    injected: u64,
}
impl Picker {
    fn new(hot: usize, rate: f64) -> Picker {
        let every = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
        Picker {
            rng: rand::rngs::SmallRng::seed_from_u64(5),
            hot,
            next_fresh: hot,
            every,
            // Half a period in: a run of whole tenths of a second at 10/s
            // gets exactly rate x length faults.
            due: Instant::now() + every.unwrap_or_default() / 2,
            injected: 0,
        }
    }
    fn page(&mut self, busy: &[bool]) -> usize {
        if let Some(e) = self.every {
            if Instant::now() >= self.due {
                self.due += e;
                self.injected += 1;
                self.next_fresh += 1;
                return self.next_fresh - 1;
            }
        }
        loop {
            let p = self.rng.gen_range(0..self.hot);
            if !busy[p] {
                return p;
            }
        }
    }
}

/// Files latency `ns` of an I/O that arrived at `at` under its 100 ms bin.
fn bin(timeline: &mut Vec<Vec<f64>>, t0: Instant, at: Instant, ns: f64) {
    let b = (at.saturating_duration_since(t0).as_millis() / 100) as usize;
    if timeline.len() <= b {
        timeline.resize(b + 1, Vec::new());
    }
    timeline[b].push(ns);
}

/// Each bin's p99 latency, us.
fn to_series(t: &mut [Vec<f64>]) -> Vec<(f64, f64)> {
    t.iter_mut()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(i, v)| {
            v.sort_by(f64::total_cmp);
            let k = ((v.len() as f64 * 0.99) as usize).min(v.len() - 1);
            (i as f64 * 100.0, v[k] / 1e3)
        })
        .collect()
}

/// Open-loop arrivals at a fixed rate (fio's `rate_iops`): a stalled
/// queue does not slow the arrivals down, so every I/O that arrives during
/// a stall waits for it (no coordinated omission).
struct Arrivals {
    t0: Instant,
    every: Duration,
    next: u64,
    end: Instant,
}

impl Arrivals {
    fn new(iops: f64, secs: f64) -> Arrivals {
        let t0 = Instant::now();
        Arrivals {
            t0,
            every: Duration::from_secs_f64(1.0 / iops),
            next: 0,
            end: t0 + Duration::from_secs_f64(secs),
        }
    }
    /// The arrival time of the next I/O if it has arrived (and the run is
    /// not over).
    fn due(&mut self) -> Option<Instant> {
        let at = self.t0 + self.every * self.next as u32;
        (at < self.end && at <= Instant::now()).then(|| {
            self.next += 1;
            at
        })
    }
    /// How long until the next arrival (zero if due).
    fn wait(&self) -> Duration {
        (self.t0 + self.every * self.next as u32).saturating_duration_since(Instant::now())
    }
    /// Whether every arrival of the run has been taken: a stall that
    /// outlasts the run still delivers the arrivals it held up (checking
    /// the clock instead dropped them, and with them the stall's tail).
    fn all_taken(&self) -> bool {
        self.t0 + self.every * self.next as u32 >= self.end
    }
}

const B2_QD: usize = 32;

fn b2_plain(
    region: &Arc<Region>,
    file: &Arc<File>,
    blocks: usize,
    hot: usize,
    rate: f64,
    a: &VpriArgs,
) -> anyhow::Result<B2Out> {
    use io_uring::{opcode, types, IoUring};
    let mut ring = IoUring::new(64)?;
    let mut pick = Picker::new(hot, rate);
    let mut busy = vec![false; region.pages()];
    let mut start = vec![Instant::now(); B2_QD];
    let mut page_of = vec![0usize; B2_QD];
    let mut free: Vec<usize> = (0..B2_QD).collect();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(6);
    let mut lat = Vec::new();
    let mut timeline = Vec::new();
    let _fifo = Fifo::enter(!a.b2_normal_priority);
    let mut arr = Arrivals::new(a.b2_iops, a.b2_secs);
    let mut backlog = std::collections::VecDeque::new();
    let mut inflight = 0;
    while !arr.all_taken() || inflight > 0 || !backlog.is_empty() {
        while let Some(t) = arr.due() {
            backlog.push_back(t);
        }
        while !backlog.is_empty() && !free.is_empty() {
            let slot = free.pop().expect("a free slot");
            let p = pick.page(&busy);
            busy[p] = true;
            page_of[slot] = p;
            start[slot] = backlog.pop_front().expect("an arrival");
            let blk = rng.gen_range(0..blocks);
            // SAFETY: in the region.
            let buf = unsafe { region.as_ptr().add(p * PS) };
            let e = opcode::Read::new(types::Fd(file.as_raw_fd()), buf, PS as u32)
                .offset((blk * PS) as u64)
                .build()
                .user_data(slot as u64);
            // SAFETY: the buffer stays mapped until the CQE (we reap all below).
            unsafe { ring.submission().push(&e) }.map_err(|_| anyhow::anyhow!("SQ full"))?;
            inflight += 1;
            // The kernel takes a fault on a missing buffer page right here,
            // on this thread, inside io_uring_enter.
            ring.submit()?;
        }
        // Wait for a completion or the next arrival (the same ring wait
        // as the API's queue uses); with every slot busy, for a
        // completion only, as the API loop does: a SCHED_FIFO submitter
        // spinning on 1 us waits behind a stuck read would starve the
        // normal-priority threads that unstick it (one blocking segment
        // stalled 955 ms, the RT throttling budget).
        let wait = if free.is_empty() {
            Duration::from_millis(100)
        } else {
            arr.wait()
        };
        let ts = types::Timespec::from(wait.max(Duration::from_micros(1)));
        let args = types::SubmitArgs::new().timespec(&ts);
        let _ = ring.submitter().submit_with_args(1, &args);
        for c in ring.completion() {
            let slot = c.user_data() as usize;
            anyhow::ensure!(c.result() == PS as i32, "read failed: {}", c.result());
            let ns = start[slot].elapsed().as_nanos() as f64;
            lat.push(ns);
            busy[page_of[slot]] = false;
            free.push(slot);
            inflight -= 1;
            bin(&mut timeline, arr.t0, start[slot], ns);
        }
    }
    Ok((lat, to_series(&mut timeline), pick.injected))
}

fn b2_api(
    region: &Arc<Region>,
    file: &Arc<File>,
    blocks: usize,
    hot: usize,
    rate: f64,
    a: &VpriArgs,
    ordering: Ordering,
) -> anyhow::Result<B2Out> {
    let tenant = Arc::new(Tenant::new(TenantConfig::default())?);
    let dev = IoDevice::new(
        region.clone(),
        &tenant,
        DeviceConfig {
            ordering,
            unit_pages: 1,
            ..Default::default()
        },
    )?;
    let mut q = dev.queue(Backend::Uring { depth: 64 })?;
    let mut pick = Picker::new(hot, rate);
    let mut busy = vec![false; region.pages()];
    let mut arrived = vec![Instant::now(); region.pages()];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(6);
    let mut lat = Vec::new();
    let mut timeline = Vec::new();
    let _fifo = Fifo::enter(!a.b2_normal_priority);
    let mut arr = Arrivals::new(a.b2_iops, a.b2_secs);
    let mut backlog = std::collections::VecDeque::new();
    while !arr.all_taken() || q.outstanding() > 0 || !backlog.is_empty() {
        while let Some(t) = arr.due() {
            backlog.push_back(t);
        }
        // The arrivals that fit go in as one batch (pipelined presence
        // checks: `IoQueue::submit_batch`).
        let mut batch = Vec::new();
        while !backlog.is_empty() && q.outstanding() + batch.len() < B2_QD {
            let p = pick.page(&busy);
            busy[p] = true;
            arrived[p] = backlog.pop_front().expect("an arrival");
            let blk = rng.gen_range(0..blocks);
            batch.push(faultline_io::Io {
                op: faultline_io::Op::ReadAt((blk * PS) as u64),
                target: faultline_io::Target::File(file.clone()),
                region_off: p * PS,
                len: PS,
                tag: p as u64,
            });
        }
        q.submit_batch(batch)?;
        let wait = if q.outstanding() >= B2_QD {
            Duration::from_millis(100)
        } else {
            arr.wait()
        };
        let Some(first) = q.complete(wait.max(Duration::from_micros(1))) else {
            continue;
        };
        for c in std::iter::once(first).chain(q.drain_completions()) {
            anyhow::ensure!(
                c.result.as_ref().ok() == Some(&PS),
                "read failed: {:?}",
                c.result
            );
            let at = arrived[c.tag as usize];
            let ns = at.elapsed().as_nanos() as f64;
            lat.push(ns);
            busy[c.tag as usize] = false;
            bin(&mut timeline, arr.t0, at, ns);
        }
    }
    Ok((lat, to_series(&mut timeline), pick.injected))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop stalled past the end of the run still gets every arrival
    /// the stall held up, and only then is the run's arrival stream done.
    #[test]
    fn arrivals_held_up_by_a_stall_past_the_end_are_delivered() {
        let mut arr = Arrivals::new(1000.0, 0.01); // 10 arrivals in 10 ms
        std::thread::sleep(Duration::from_millis(30)); // a stall past the end
        assert!(!arr.all_taken(), "nothing taken yet");
        let mut n = 0;
        while arr.due().is_some() {
            n += 1;
        }
        assert_eq!(n, 10);
        assert!(arr.all_taken());
        assert_eq!(arr.wait(), Duration::ZERO);
    }
}
