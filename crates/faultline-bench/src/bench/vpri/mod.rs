//! `faultline bench vpri`: seed 003 (VPRI) reproduced in software, each
//! figure printed next to the paper's under the same label (digest §3).
//!
//! | part | what | where |
//! |---|---|---|
//! | **B1** (Table 2) | the presence check, hot and cold, and its update | [`b1`] |
//! | **B2** (Fig 6) | random reads with injected I/O faults: plain io_uring vs the API, p99.9 ratios | [`b2`] |
//! | **B3** (Figs 4-5, NIC) | UDP receive into evicted pages: plain `recv` (EFAULT loses the datagram) vs the API | [`b3`] |
//! | **B4** (Fig 15) | the fault worker serialized vs per tenant | [`b4`] |
//! | **B5** (Fig 16, 17), **B7** (Figs 9-11) | the pinning policies on a simulated fleet; the traces' statistics | [`crate::sim::b5`], [`crate::sim::b7`] |
//! | **B8** (§5.3) | the access log's cost, and ADP on a lossy log | [`b8`] |
//! | **B9** (Figs 7, 18) | whole simulated days, production-like | [`crate::sim::day`] |
//!
//! B8 and B9 run only when asked for (`--only b8,b9`). [`run`] checks the
//! parts named, then runs them in the order B1, B3, B4, B2, B5/B7, B8, B9,
//! each with its settings taken from [`VpriArgs`].
//!
//! Time constants are the paper's times the scale factor `S` (printed).

mod b1;
mod b2;
mod b3;
mod b4;
mod b8;

use std::path::PathBuf;

use anyhow::Context;
use faultline_cli_support::cleanup;

use crate::harness::paper::line;
use crate::harness::BenchCtx;

/// Arguments of `faultline bench vpri`.
#[derive(clap::Args, Clone, Debug)]
pub struct VpriArgs {
    /// Which parts, comma-separated: b1,b2,b3,b4,b5,b7,b8,b9 (default
    /// b1,b2,b3,b4,b5,b7; b8 and b9 take about half a minute each).
    #[arg(long, value_delimiter = ',', default_value = "b1,b2,b3,b4,b5,b7", value_parser = PARTS)]
    pub only: Vec<String>,
    /// Time-scaling factor S applied to the paper's constants (default 1/100; more than 0, at most 1).
    #[arg(long, default_value_t = 0.01, value_parser = faultline_cli_support::flags::float(0.0, 1.0, true))]
    pub scale: f64,
    /// B2: seconds per mode per round (default 0.5; more than 0, at most 3600).
    #[arg(long, default_value_t = 0.5, value_parser = faultline_cli_support::flags::float(0.0, 3600.0, true))]
    pub b2_secs: f64,
    /// B2: I/Os arriving per second, open loop (default 26,800: the
    /// paper's virtio-blk device, Table 1; more than 0, at most
    /// 10,000,000). Latency counts from arrival.
    #[arg(long, default_value_t = 26_800.0, value_parser = faultline_cli_support::flags::float(0.0, 10_000_000.0, true))]
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
    /// with the defaults (1 to 1000).
    #[arg(long, default_value_t = 30, value_parser = faultline_cli_support::flags::reps())]
    pub b2_reps: usize,
    /// B2: run the submitting thread at the caller's priority. Default:
    /// SCHED_FIFO 10 while it submits and reaps, in every mode alike (the
    /// application's I/O thread; the library's threads and the poll
    /// engine stay at normal priority), so kernel threads and agents of
    /// this shared guest cannot preempt it; falls back to the caller's
    /// priority, and says so, without the permission.
    #[arg(long)]
    pub b2_normal_priority: bool,
    /// B2: injected I/O faults per second (default 10, the paper's Fig 6 rate; 0 to 1,000,000).
    #[arg(long, default_value_t = 10.0, value_parser = faultline_cli_support::flags::float(0.0, 1_000_000.0, false))]
    pub b2_rate: f64,
    /// B2: store latency of an injected fault, ms (default 5, the paper's; 0 to 60,000).
    #[arg(long, default_value_t = 5.0, value_parser = faultline_cli_support::flags::float(0.0, 60_000.0, false))]
    pub b2_store_ms: f64,
    /// B3: datagrams per mode (default 40,000; 1 to 100,000,000).
    #[arg(long, default_value_t = 40_000, value_parser = faultline_cli_support::flags::range_u32(1, 100_000_000))]
    pub b3_packets: u32,
    /// B3: datagrams per second (default 20,000; 1 to 10,000,000).
    #[arg(long, default_value_t = 20_000, value_parser = faultline_cli_support::flags::range_u32(1, 10_000_000))]
    pub b3_pps: u32,
    /// B4: I/O faults per second per device (default 10, the paper's Fig 15
    /// top rate; 0 to 1,000,000).
    #[arg(long, default_value_t = 10.0, value_parser = faultline_cli_support::flags::float(0.0, 1_000_000.0, false))]
    pub b4_rate: f64,
    /// B4: seconds per point (default 3; more than 0, at most 3600).
    #[arg(long, default_value_t = 3.0, value_parser = faultline_cli_support::flags::float(0.0, 3600.0, true))]
    pub b4_secs: f64,
    /// B5: how each VM's reclaim ratio is set (default psi: the server's
    /// memory fixed at 1 - r, balanced across VMs by their pressure, as the
    /// paper's §3.4 and §7.3 say; static: every VM at r all hour; redraw:
    /// random redraws, see --b5-reclaim-every; psi-avg10/psi-avg60/
    /// psi-avg300: the kernel's PSI averages as the pressure; psi-abs:
    /// Senpai's absolute 10 ms / 6 s target).
    #[arg(long, default_value = "psi", value_parser = b5_model)]
    pub b5_reclaim: String,
    /// B5: further reclaim models printed beside it, comma-separated, or
    /// "none" (default static).
    #[arg(long, value_delimiter = ',', default_value = "static", value_parser = b5_model_or_none)]
    pub b5_compare: Vec<String>,
    /// B5: the redraw model's period, simulated seconds: each VM's ratio
    /// redrawn within 0-50% with mean r (default 600; 1 to 31,536,000: a year).
    #[arg(long, default_value_t = 600, value_parser = faultline_cli_support::flags::range_u64(1, 31_536_000))]
    pub b5_reclaim_every: u64,
    /// B8: seconds per point per round (default 0.6; 8 log settings x 2
    /// workloads per round; more than 0, at most 3600).
    #[arg(long, default_value_t = 0.6, value_parser = faultline_cli_support::flags::float(0.0, 3600.0, true))]
    pub b8_secs: f64,
    /// B8: rounds (default 3; each point's IOPS is the median; 1 to 1000).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::flags::reps())]
    pub b8_reps: usize,
    /// B9: simulated VMs (default 28: B5's 14-VM mix twice; 1 to 10,000).
    #[arg(long, default_value_t = 28, value_parser = faultline_cli_support::flags::range(1, 10_000))]
    pub b9_vms: usize,
    /// B9: simulated days (default 1; 1 to 3650).
    #[arg(long, default_value_t = 1, value_parser = faultline_cli_support::flags::range_u64(1, 3650))]
    pub b9_days: u64,
    /// B9: the host's reclaim (default psi: a server of 12.5% overcommit,
    /// the middle of the paper's 10-15%, balanced by pressure; drift: each
    /// VM's ratio redrawn hourly as 0.5 U^3).
    #[arg(long, default_value = "psi", value_parser = ["psi", "drift"])]
    pub b9_reclaim: String,
    /// B1: samples per measurement (default 1,000,000 hot, 1/10 of it cold; 1 to 100,000,000).
    #[arg(long, default_value_t = 1_000_000, value_parser = faultline_cli_support::flags::range(1, 100_000_000))]
    pub b1_samples: usize,
}

/// A part's temporary directory, `$TMPDIR/faultline-{part}-PID`, made
/// anew: a cleanup temporary (removed when the guard drops, an error
/// included, on SIGINT, SIGTERM and SIGHUP, and by a later run once PID
/// is gone); the directories killed runs left are removed first.
fn temp_dir(part: &str) -> anyhow::Result<(PathBuf, cleanup::Guard)> {
    let tmp = std::env::temp_dir();
    let prefix = format!("faultline-{part}-");
    cleanup::sweep_prefixed(&tmp, &prefix);
    let guard = cleanup::temp(&tmp, &prefix, "");
    let dir = guard.path().to_path_buf();
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok((dir, guard))
}

/// The parts, as `--only` names them.
const PARTS: [&str; 8] = ["b1", "b2", "b3", "b4", "b5", "b7", "b8", "b9"];

/// `--b5-reclaim`'s value parser: a reclaim model B5 knows, refused at
/// once otherwise (not after the parts before B5 have run).
fn b5_model(s: &str) -> Result<String, String> {
    crate::sim::b5::B5Model::parse(s, 1)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// `--b5-compare`'s value parser: a model, or `none`.
fn b5_model_or_none(s: &str) -> Result<String, String> {
    match s {
        "none" => Ok(s.to_string()),
        _ => b5_model(s),
    }
}

/// What `bench vpri` needs, checked before any bench runs (the values
/// themselves are checked by their parsers): each part and each compared
/// model named once.
pub fn check(a: &VpriArgs) -> anyhow::Result<()> {
    crate::bench::named_once("--only", &a.only)?;
    crate::bench::named_once("--b5-compare", &a.b5_compare)
}

/// Entry point.
pub fn run(ctx: &mut BenchCtx, a: &VpriArgs) -> anyhow::Result<()> {
    let parts: Vec<&str> = a.only.iter().map(String::as_str).collect();
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
        b1::run(ctx, a.b1_samples).context("B1")?;
    }
    if parts.contains(&"b3") {
        b3::run(
            ctx,
            &b3::B3 {
                packets: a.b3_packets,
                pps: a.b3_pps,
            },
        )
        .context("B3")?;
    }
    if parts.contains(&"b4") {
        b4::run(
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
        b2::run(
            ctx,
            &b2::B2 {
                secs: a.b2_secs,
                iops: a.b2_iops,
                reps: a.b2_reps,
                normal_priority: a.b2_normal_priority,
                rate: a.b2_rate,
                store_ms: a.b2_store_ms,
            },
        )
        .context("B2")?;
    }
    if parts.contains(&"b5") || parts.contains(&"b7") {
        let model = |m: &str| crate::sim::b5::B5Model::parse(m.trim(), a.b5_reclaim_every);
        let compare = a
            .b5_compare
            .iter()
            .filter(|m| *m != "none")
            .map(|m| model(m))
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
        b8::run(
            ctx,
            &b8::B8 {
                secs: a.b8_secs,
                reps: a.b8_reps,
            },
        )
        .context("B8")?;
    }
    if parts.contains(&"b9") {
        crate::sim::day::run(
            ctx,
            &crate::sim::day::B9 {
                vms: a.b9_vms,
                days: a.b9_days,
                // The parser admits only these two.
                psi: a.b9_reclaim == "psi",
            },
        )
        .context("B9")?;
    }
    println!("not reproduced here: B4's CPU contention (its fills are sleeps: 16 tenants' workers on 2 CPUs), B6 as its own run (Fig 17 is plotted from B5's NIC domain).");
    Ok(())
}
