//! B8 (digest §3): the cost of the I/O page access log (seed 003 §4.2.1,
//! §5.3: lossy by design, its cost regulated by how often the host
//! drains it).
//!
//! * **Runtime** (timed): the real [`faultline_io`] device and its log.
//!   B2's I/O (random 4 KiB reads, io_uring QD 32, page-cached file) and
//!   B3's (UDP receives over loopback, a credit-limited sender so the
//!   socket never drops) at the highest rate this machine gives, into
//!   resident region memory (no faults: the log's cost alone), with the
//!   log off (`log_slots: 0`) and on, rings of 64, 4 Ki and 64 Ki slots,
//!   drained by the device's own consumer (ADP) every 10 ms (the default)
//!   or every 500 ms (a deliberately slow consumer), and log off a second
//!   time (an A/A point: the run's noise). Per point: IOPS (the
//!   median of the rounds), its change against log-off in the same run,
//!   events logged and dropped (`pal_dropped`), CPU time per I/O of the
//!   whole process (the consumer included).
//! * **ADP quality vs drop rate** (simulated, deterministic): B5's fleet
//!   at r = 20% with ADP, every device access going through the runtime's
//!   own [`faultline_io::AccessLog`] of 64 slots, drained (and the policy
//!   ticked) every D simulated seconds: the drop rate, and the I/O-fault
//!   reduction (against no pinning behind the same log: the reclaimer's
//!   access hints come through the log as well) and pinned memory ADP
//!   achieves on what it still sees.

use std::fs::File;
use std::net::UdpSocket;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::{MemoryStore, PollEngine, Region};
use faultline_io::{Backend, DeviceConfig, IoDevice, Ordering, PinMode, Target, Tenant};
use faultline_sys::BASE_PAGE as PS;
use rand::{Rng, SeedableRng};

use crate::harness::paper::line;
use crate::harness::report::print_table;
use crate::harness::BenchCtx;
use crate::sim::round::{fleet, round, LogModel, RoundCfg};

const QD: usize = 32;
/// Resident buffer pages the block workload reads into.
const HOT: usize = 1024;

/// B8's settings.
pub(crate) struct B8 {
    /// Seconds per point per round.
    pub secs: f64,
    /// Rounds (each point's IOPS is the median over them).
    pub reps: usize,
}

/// A log setting: label, ring slots (0 = off), consumer period.
struct Pal {
    label: &'static str,
    slots: usize,
    drain: Duration,
}

fn pals() -> Vec<Pal> {
    let fast = Duration::from_millis(10);
    let slow = Duration::from_millis(500);
    vec![
        Pal {
            label: "off",
            slots: 0,
            drain: fast,
        },
        Pal {
            label: "64",
            slots: 64,
            drain: fast,
        },
        Pal {
            label: "4Ki",
            slots: 4096,
            drain: fast,
        },
        Pal {
            label: "64Ki",
            slots: 65536,
            drain: fast,
        },
        Pal {
            label: "64 slow",
            slots: 64,
            drain: slow,
        },
        Pal {
            label: "4Ki slow",
            slots: 4096,
            drain: slow,
        },
        Pal {
            label: "64Ki slow",
            slots: 65536,
            drain: slow,
        },
        // Log off again: its difference from the first is the run's
        // noise (an A/A comparison), what a delta must exceed to count.
        Pal {
            label: "off A/A",
            slots: 0,
            drain: fast,
        },
    ]
}

/// One measured point.
#[derive(Clone, Copy, Default)]
struct Run {
    ios: u64,
    secs: f64,
    cpu_s: f64,
    logged: u64,
    dropped: u64,
}

fn cpu_now() -> f64 {
    faultline_sys::process::usage()
        .map(|u| u.user_seconds + u.system_seconds)
        .unwrap_or(0.0)
}

/// A device over a region of `pages` zero pages, all resident before the
/// clock starts (B8 measures the log, not faults).
fn device(
    engine: &Arc<PollEngine>,
    pages: usize,
    pal: &Pal,
    tenant: &Arc<Tenant>,
) -> anyhow::Result<IoDevice> {
    let region = Arc::new(
        Region::builder(pages * PS)
            .store(MemoryStore::new(vec![0u8; pages * PS]))
            .build(engine)?,
    );
    region.populate(0, pages * PS)?;
    Ok(IoDevice::new(
        region,
        tenant,
        DeviceConfig {
            name: "b8".into(),
            ordering: Ordering::Unordered,
            // The consumer does ADP's work on what it drains.
            pin: PinMode::Adp(None),
            unit_pages: 16,
            log_slots: pal.slots,
            drain_period: pal.drain,
            ..Default::default()
        },
    )?)
}

/// B2's I/O at QD 32, closed loop (as fast as it goes).
fn block_run(
    engine: &Arc<PollEngine>,
    tenant: &Arc<Tenant>,
    file: &Arc<File>,
    blocks: usize,
    pal: &Pal,
    secs: f64,
) -> anyhow::Result<Run> {
    let dev = device(engine, HOT, pal, tenant)?;
    let mut q = dev.queue(Backend::Uring { depth: 64 })?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(8);
    // Slot i reads into pages i, i + QD, ...: no two I/Os share a buffer.
    let mut io = |slot: usize| {
        let page = slot + QD * rng.gen_range(0..HOT / QD);
        let blk = rng.gen_range(0..blocks);
        faultline_io::Io {
            op: faultline_io::Op::ReadAt((blk * PS) as u64),
            target: faultline_io::Target::File(file.clone()),
            region_off: page * PS,
            len: PS,
            tag: slot as u64,
        }
    };
    q.submit_batch((0..QD).map(&mut io).collect::<Vec<_>>())?;
    let (t0, c0) = (Instant::now(), cpu_now());
    let end = t0 + Duration::from_secs_f64(secs);
    let mut ios = 0u64;
    while Instant::now() < end {
        let Some(first) = q.complete(Duration::from_millis(100)) else {
            continue;
        };
        let done: Vec<_> = std::iter::once(first)
            .chain(q.drain_completions())
            .collect();
        let mut again = Vec::with_capacity(done.len());
        for c in done {
            anyhow::ensure!(c.result.as_ref().ok() == Some(&PS), "read: {:?}", c.result);
            ios += 1;
            again.push(io(c.tag as usize));
        }
        // Reissued as one batch (pipelined presence checks).
        q.submit_batch(again)?;
    }
    let (took, cpu) = (t0.elapsed().as_secs_f64(), cpu_now() - c0);
    while q.outstanding() > 0 {
        anyhow::ensure!(
            q.complete(Duration::from_secs(10)).is_some(),
            "a read did not complete in 10 s"
        );
    }
    let st = dev.stats();
    Ok(Run {
        ios,
        secs: took,
        cpu_s: cpu,
        logged: st.log_logged,
        dropped: st.log_dropped,
    })
}

/// B3's I/O: UDP receives into a ring of 2 KiB buffers; the sender keeps
/// at most 64 datagrams unreceived, so the socket never drops one.
fn nic_run(
    engine: &Arc<PollEngine>,
    tenant: &Arc<Tenant>,
    pal: &Pal,
    secs: f64,
) -> anyhow::Result<Run> {
    const SLOTS: usize = 256;
    const SLOT: usize = 2048;
    let pages = SLOTS * SLOT / PS;
    let dev = device(engine, pages, pal, tenant)?;
    let mut q = dev.queue(Backend::Syscall)?;
    let rx = Arc::new(UdpSocket::bind("127.0.0.1:0")?);
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (received, stop) = (received.clone(), stop.clone());
        std::thread::Builder::new().name("b8-udp-tx".into()).spawn(
            move || -> std::io::Result<()> {
                let d = [7u8; 1200];
                let mut sent = 0u64;
                while !stop.load(Relaxed) {
                    if sent - received.load(Relaxed) < 64 {
                        tx.send(&d)?;
                        sent += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
                Ok(())
            },
        )?
    };
    let target = Target::Udp(rx.clone());
    let mut s = 0usize;
    let (t0, c0) = (Instant::now(), cpu_now());
    let end = t0 + Duration::from_secs_f64(secs);
    let mut ios = 0u64;
    let mut res = Ok(());
    while Instant::now() < end {
        while q.outstanding() < 8 {
            if let Err(e) = q.recv(target.clone(), s * SLOT, SLOT, s as u64) {
                res = Err(e.into());
                break;
            }
            s = (s + 1) % SLOTS;
        }
        if let Some(c) = q.complete(Duration::from_millis(50)) {
            if let Err(e) = c.result {
                res = Err(anyhow::anyhow!("recv: {e}"));
                break;
            }
            ios += 1;
            received.store(ios, Relaxed);
        }
    }
    let (took, cpu) = (t0.elapsed().as_secs_f64(), cpu_now() - c0);
    stop.store(true, Relaxed);
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    res?;
    // The receives still outstanding go with the queue.
    drop(q);
    let st = dev.stats();
    Ok(Run {
        ios,
        secs: took,
        cpu_s: cpu,
        logged: st.log_logged,
        dropped: st.log_dropped,
    })
}

/// Entry point of B8.
pub(crate) fn run(ctx: &mut BenchCtx, cfg: &B8) -> anyhow::Result<()> {
    println!(
        "\n== B8: access-log (IO-PAL) cost: B2 and B3 I/O at max rate, log off / rings 64..64Ki, consumer every 10 ms or 500 ms (slow), {} s x {} rounds per point ==",
        cfg.secs, cfg.reps
    );
    let engine = PollEngine::new()?;
    let tenant = Arc::new(Tenant::new(Default::default())?);
    let (dir, dir_guard) = super::temp_dir("b8")?;
    let blocks = 4096usize;
    let path = dir.join("disk.img");
    std::fs::write(&path, vec![0x42u8; blocks * PS])?;
    let file = Arc::new(File::open(&path)?);
    let mut tmp = vec![0u8; PS];
    for b in 0..blocks {
        file.read_at(&mut tmp, (b * PS) as u64)?;
    }
    let pals = pals();
    let reps = cfg.reps.max(1);
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); pals.len()]; 2];
    let mut progress =
        crate::harness::progress::Progress::new((2 * reps * pals.len()) as u64, "B8");
    for rep in 0..reps {
        // A different order each round, so drift hits every point alike.
        for k in 0..pals.len() {
            let i = (k + rep) % pals.len();
            for (w, name) in ["block", "nic"].into_iter().enumerate() {
                progress.step(&format!("round {}: {name}, log {}", rep + 1, pals[i].label));
                let r = if w == 0 {
                    block_run(&engine, &tenant, &file, blocks, &pals[i], cfg.secs)?
                } else {
                    nic_run(&engine, &tenant, &pals[i], cfg.secs)?
                };
                runs[w][i].push(r);
            }
        }
    }
    progress.finish();
    drop(dir_guard);
    let mut rows = Vec::new();
    let mut drop_series = Vec::new();
    let mut delta_series = Vec::new();
    for (w, name) in ["block", "nic"].into_iter().enumerate() {
        let iops: Vec<f64> = runs[w]
            .iter()
            .map(|rs| {
                let mut v: Vec<f64> = rs.iter().map(|r| r.ios as f64 / r.secs).collect();
                crate::harness::stats::median(&mut v)
            })
            .collect();
        let off = iops[0].max(1e-9);
        let (mut fast_drop, mut slow_drop, mut fast_delta, mut slow_delta) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, pal) in pals.iter().enumerate() {
            let rs = &runs[w][i];
            let logged: u64 = rs.iter().map(|r| r.logged).sum();
            let dropped: u64 = rs.iter().map(|r| r.dropped).sum();
            let ios: u64 = rs.iter().map(|r| r.ios).sum();
            let cpu: f64 = rs.iter().map(|r| r.cpu_s).sum();
            let drop_pct = dropped as f64 / (logged + dropped).max(1) as f64 * 100.0;
            let delta = (iops[i] / off - 1.0) * 100.0;
            rows.push(vec![
                name.into(),
                pal.label.into(),
                if pal.slots == 0 {
                    "-".into()
                } else {
                    format!("{} ms", pal.drain.as_millis())
                },
                format!("{:.0}", iops[i]),
                format!("{delta:+.2}"),
                logged.to_string(),
                dropped.to_string(),
                format!("{drop_pct:.1}"),
                format!("{:.2}", cpu / ios.max(1) as f64 * 1e6),
            ]);
            if pal.slots == 0 && i == 0 {
                line(
                    ctx,
                    &format!("b8.{name}.log_off.iops"),
                    iops[i],
                    "/s",
                    "(same-run baseline)",
                );
                continue;
            }
            if pal.slots == 0 {
                line(
                    ctx,
                    &format!("b8.{name}.log_off_again.iops_delta_pct"),
                    delta,
                    "%",
                    "(A/A: this run's noise)",
                );
                continue;
            }
            let tag = pal.label.replace(' ', "_");
            line(
                ctx,
                &format!("b8.{name}.ring{tag}.iops_delta_pct"),
                delta,
                "%",
                "(digest check 10: within 1% of log-off; §5.3 no number)",
            );
            line(
                ctx,
                &format!("b8.{name}.ring{tag}.pal_dropped_pct"),
                drop_pct,
                "%",
                "(lossy by design: drops, never blocks)",
            );
            let x = pal.slots as f64;
            if pal.drain.as_millis() >= 500 {
                slow_drop.push((x, drop_pct));
                slow_delta.push((x, 100.0 + delta));
            } else {
                fast_drop.push((x, drop_pct));
                fast_delta.push((x, 100.0 + delta));
            }
        }
        drop_series.push((format!("{name}, consumer 10 ms"), fast_drop));
        drop_series.push((format!("{name}, consumer 500 ms"), slow_drop));
        delta_series.push((format!("{name}, consumer 10 ms"), fast_delta));
        delta_series.push((format!("{name}, consumer 500 ms"), slow_delta));
    }
    print_table(
        &[
            "I/O",
            "log ring",
            "consumer",
            "IOPS (median)",
            "vs off %",
            "logged",
            "dropped",
            "dropped %",
            "CPU us/IO",
        ],
        &rows,
    );
    ctx.figure("vpri_b8_dropped", |d, nm| {
        crate::harness::plot::line_chart(
            d,
            nm,
            "B8: access-log events dropped vs ring size",
            "ring slots",
            "dropped %",
            &drop_series,
            true,
        )
    })?;
    ctx.figure("vpri_b8_iops_delta", |d, nm| {
        crate::harness::plot::line_chart(
            d,
            nm,
            "B8: IOPS with the access log, % of log off (same run)",
            "ring slots",
            "% of log-off IOPS",
            &delta_series,
            true,
        )
    })?;
    adp_vs_drops(ctx)
}

/// ADP quality against the access log's drop rate (simulated, B5's fleet).
fn adp_vs_drops(ctx: &mut BenchCtx) -> anyhow::Result<()> {
    println!("\n== B8: ADP quality vs access-log drop rate (simulated hour, B5's fleet, r = 20%, 64-slot ring drained every D s, baseline: no pinning with the same log; deterministic) ==");
    let sizes = fleet(14);
    let r = 0.2;
    let none = round(&RoundCfg::hour("none", r), &sizes).classes;
    let lossless = round(&RoundCfg::hour("adp", r), &sizes).classes;
    let mut rows = Vec::new();
    let mut series: Vec<(String, Vec<(f64, f64)>)> =
        vec![("nic".into(), Vec::new()), ("block".into(), Vec::new())];
    let red = |c: &str, iopfs: u64| (1.0 - iopfs as f64 / none[c].iopfs.max(1) as f64) * 100.0;
    for (ci, c) in ["nic", "block"].into_iter().enumerate() {
        rows.push(vec![
            "no log (B5)".into(),
            c.into(),
            "0.0".into(),
            format!("{:.1}", red(c, lossless[c].iopfs)),
            format!("{:.2}", lossless[c].pinned_pct),
        ]);
        series[ci].1.push((0.0, red(c, lossless[c].iopfs)));
    }
    for d in [1u64, 10, 30, 60, 120, 300, 600] {
        let with_log = |kind| RoundCfg {
            log: Some(LogModel {
                slots: 64,
                drain_every_s: d,
            }),
            ..RoundCfg::hour(kind, r)
        };
        // The baseline loses the same events: in the runtime the
        // reclaimer's access hints come through the log too.
        let base = round(&with_log("none"), &sizes).classes;
        let out = round(&with_log("adp"), &sizes).classes;
        let red = |c: &str, iopfs: u64| (1.0 - iopfs as f64 / base[c].iopfs.max(1) as f64) * 100.0;
        for (ci, c) in ["nic", "block"].into_iter().enumerate() {
            let res = &out[c];
            let drop_pct = res.dropped as f64 / (res.logged + res.dropped).max(1) as f64 * 100.0;
            let rd = red(c, res.iopfs);
            rows.push(vec![
                format!("64 slots, every {d} s"),
                c.into(),
                format!("{drop_pct:.1}"),
                format!("{rd:.1}"),
                format!("{:.2}", res.pinned_pct),
            ]);
            series[ci].1.push((drop_pct, rd));
            line(
                ctx,
                &format!("b8.sim.adp.{c}.drain{d}s.dropped_pct"),
                drop_pct,
                "%",
                "(lossy OK, §5.3)",
            );
            line(
                ctx,
                &format!("b8.sim.adp.{c}.drain{d}s.iopf_reduction_pct"),
                rd,
                "%",
                if c == "nic" {
                    "95-97 lossless (Fig 16)"
                } else {
                    "36-49 lossless (Fig 16)"
                },
            );
        }
    }
    print_table(
        &[
            "access log",
            "class",
            "dropped %",
            "IOPF reduction %",
            "pinned %/VM",
        ],
        &rows,
    );
    for s in &mut series {
        s.1.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    ctx.figure("vpri_b8_adp_vs_drops", |d, nm| {
        crate::harness::plot::line_chart(
            d,
            nm,
            "B8: ADP's I/O-fault reduction vs access-log drop rate (simulated)",
            "events dropped %",
            "IOPF reduction vs no pinning %",
            &series,
            false,
        )
    })?;
    Ok(())
}
