//! One run of a configuration, and the medians over its reps.
//!
//! | configuration | the peer's memory | the handler |
//! |---|---|---|
//! | `kernel`, `kernel-tmpfs`, `kernel-hugetlbfs` | `MAP_PRIVATE` of the file, the tmpfs or the hugetlbfs copy | none (the kernel's faults) |
//! | `baseline` | anonymous, handed over | [`baseline::handler`] in this process |
//! | `on-demand*` | anonymous, hugetlb, or the shared copy | `faultline serve` |
//! | `prefetch*`, `eager` | the same | `faultline serve --prefetch` of the recorded set (`eager`: every page; `prefetch-idle`: with `--prefetch-idle`, helpers under SCHED_IDLE) |
//! | `*-tracked*` | anonymous | `faultline serve --track-dirty` (the `tracked` module's `one`) |

use std::os::unix::net::UnixListener;
use std::path::Path;

use anyhow::{bail, Context};
use faultline_serve::peer::PeerReport;
use faultline_serve::PeerSummary;

use super::baseline;
use super::launch::{Backing, Launcher, Mode};
use super::phases::{self, Phases};
use super::timeline::{median_finite, steps, STEPS};

/// What one run measured (or the medians of several).
pub struct Run {
    /// Handshake to the last working-set page touched, s.
    pub seconds: f64,
    /// The vCPUs' median first-touch latency, ns.
    pub median_ns: f64,
    /// Their 99th percentile, ns.
    pub p99_ns: f64,
    /// Demand faults the handler read (kernel rows: the peer's minor faults).
    pub faults: u64,
    /// Bytes the handler read.
    pub bytes_read: u64,
    /// Working-set pages the vCPUs touched.
    pub pages: u64,
    /// `read(2)`s of the userfaultfd that returned messages (0: no
    /// handler, or one that does not count them).
    pub reads: u64,
    /// CPU time of serve's handler thread over the run, ms (NaN: not
    /// serve).
    pub handler_cpu_ms: f64,
    /// serve's prefetch helpers' CPU time, ms (NaN for kernel rows).
    pub helpers_cpu_ms: f64,
    /// Pages installed that no vCPU touched (the peer's resident pages
    /// beyond its working set; anonymous copy mode only, else NaN).
    pub wasted: f64,
    /// Pages serve's run-ahead populators installed (`--run-ahead`; NaN:
    /// not serve).
    pub run_ahead: f64,
    /// serve's reading and mapping of the recorded set (prefetch), ms.
    pub prepare_ms: f64,
    /// The peer's private memory after the working set (anonymous and
    /// hugetlb), KiB.
    pub peer_anon_kib: u64,
    /// The hand-off's steps ([`STEPS`]), ms from the peer's handshake send
    /// (NaN: not taken by this configuration).
    pub steps: Vec<f64>,
    /// The vCPU threads' preemptions while touching.
    pub preempted: u64,
    /// ... and their sleeps.
    pub slept: u64,
    /// Where a demand fault's time went (served configurations).
    pub phases: Phases,
    /// `--write-set`: the median first write as the vCPUs saw it, ns, to
    /// pages of the working set (present when written) and to all pages
    /// written (NaN: no writes).
    pub write_ns: (f64, f64),
    /// Pages in serve's dirty set (tracked configurations; NaN: not
    /// tracked).
    pub dirty_pages: f64,
    /// `--adaptive-window`: the isolated window serve's handler ended
    /// with, pages (NaN: not adaptive).
    pub window: f64,
}

impl Run {
    /// Each figure's median over `runs` (at least one).
    pub fn median(runs: &[Run]) -> Run {
        let med = |f: &dyn Fn(&Run) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            crate::harness::stats::median(&mut v)
        };
        Run {
            seconds: med(&|r| r.seconds),
            median_ns: med(&|r| r.median_ns),
            p99_ns: med(&|r| r.p99_ns),
            faults: med(&|r| r.faults as f64) as u64,
            bytes_read: med(&|r| r.bytes_read as f64) as u64,
            pages: med(&|r| r.pages as f64) as u64,
            reads: med(&|r| r.reads as f64) as u64,
            handler_cpu_ms: med(&|r| r.handler_cpu_ms),
            helpers_cpu_ms: med(&|r| r.helpers_cpu_ms),
            wasted: med(&|r| r.wasted),
            run_ahead: med(&|r| r.run_ahead),
            prepare_ms: med(&|r| r.prepare_ms),
            peer_anon_kib: med(&|r| r.peer_anon_kib as f64) as u64,
            preempted: med(&|r| r.preempted as f64) as u64,
            slept: med(&|r| r.slept as f64) as u64,
            phases: Phases::median(&runs.iter().map(|r| &r.phases).collect::<Vec<_>>()),
            write_ns: (med(&|r| r.write_ns.0), med(&|r| r.write_ns.1)),
            dirty_pages: med(&|r| r.dirty_pages),
            window: med(&|r| r.window),
            steps: (0..STEPS.len())
                .map(|k| median_finite(runs.iter().map(|r| r.steps[k]).collect()))
                .collect(),
        }
    }
}

/// The files a run reads besides the memory file.
pub struct Inputs<'a> {
    /// The recorded working set (prefetch).
    pub rec: &'a Path,
    /// Every page of the memory file (eager).
    pub all: &'a Path,
    /// The shared tmpfs copy.
    pub snap: &'a Path,
    /// The shared copy on hugetlbfs.
    pub hsnap: &'a Path,
}

/// Runs configuration `cfg` once on working set `ws`.
pub fn one(l: &Launcher<'_>, ws: f64, cfg: &str, inputs: &Inputs<'_>) -> anyhow::Result<Run> {
    let Inputs {
        rec,
        all,
        snap,
        hsnap,
    } = *inputs;
    let from = |p: PeerReport, faults: u64, bytes: u64| Run {
        write_ns: write_ns(&p),
        dirty_pages: f64::NAN,
        window: f64::NAN,
        steps: steps(&p, None),
        preempted: p.vcpu_preempted,
        slept: p.vcpu_slept,
        seconds: p.seconds,
        median_ns: p.median_ns as f64,
        p99_ns: p.p99_ns as f64,
        faults,
        bytes_read: bytes,
        pages: p.pages as u64,
        reads: 0,
        handler_cpu_ms: f64::NAN,
        helpers_cpu_ms: f64::NAN,
        wasted: f64::NAN,
        run_ahead: f64::NAN,
        prepare_ms: f64::NAN,
        peer_anon_kib: p.rss_anon_kib + p.hugetlb_kib,
        phases: Phases::default(),
    };
    Ok(match cfg {
        "kernel" | "kernel-tmpfs" | "kernel-hugetlbfs" => {
            let backing = match cfg {
                "kernel" => Backing::File(l.mem),
                "kernel-tmpfs" => Backing::File(snap),
                _ => Backing::FileHuge(hsnap),
            };
            let p = l.peer(ws, backing)?;
            // The faults the kernel took (each may map several pages).
            let (faults, n) = (p.minor_faults, p.pages as u64);
            from(p, faults, n * 4096)
        }
        "baseline" => {
            let sock = l.dir.join("base.sock");
            let _ = std::fs::remove_file(&sock);
            let listener = UnixListener::bind(&sock)?;
            let m = l.mem.to_path_buf();
            let h = std::thread::spawn(move || baseline::handler(listener, &m));
            let p = l.peer(ws, Backing::Uffd(&sock));
            let faults = h
                .join()
                .map_err(|_| anyhow::anyhow!("baseline handler panicked"))??;
            let p = p?;
            // One page per fault: nothing installed beyond the set.
            let wasted = p.resident_pages.saturating_sub(p.pages as u64) as f64;
            Run {
                wasted,
                ..from(p, faults, faults * 4096)
            }
        }
        "on-demand"
        | "on-demand-poll"
        | "on-demand-workers"
        | "on-demand-per-cpu"
        | "on-demand-per-cpu-w4"
        | "on-demand-per-cpu-adaptive"
        | "on-demand-per-cpu-shared"
        | "on-demand-per-cpu-shared-huge"
        | "on-demand-wake-first"
        | "on-demand-single"
        | "on-demand-w4"
        | "on-demand-w8"
        | "on-demand-w32"
        | "on-demand-adaptive"
        | "on-demand-w32-shared"
        | "on-demand-w64-shared"
        | "on-demand-w16-shared"
        | "on-demand-adaptive-shared"
        | "on-demand-workers-adaptive"
        | "on-demand-run-ahead"
        | "on-demand-run-ahead-shared"
        | "on-demand-shared"
        | "on-demand-huge"
        | "on-demand-shared-huge"
        | "hand-back-shared"
        | "hand-back-shared-huge" => {
            let extra: &[&str] = match cfg {
                "on-demand-poll" => &["--engine", "poll"],
                "on-demand-workers" => &["--engine", "workers", "--threads", "2"],
                "on-demand-per-cpu"
                | "on-demand-per-cpu-shared"
                | "on-demand-per-cpu-shared-huge" => &["--engine", "per-cpu"],
                "on-demand-per-cpu-w4" => &["--engine", "per-cpu", "--fault-around-initial", "4"],
                "on-demand-per-cpu-adaptive" => &["--engine", "per-cpu", "--adaptive-window"],
                "on-demand-wake-first" => &["--wake-first"],
                "on-demand-single" => &["--fault-around-initial", "1"],
                "on-demand-w4" => &["--fault-around-initial", "4"],
                "on-demand-w8" => &["--fault-around-initial", "8"],
                "on-demand-w32" => &["--fault-around-initial", "32"],
                "on-demand-w32-shared" => &["--fault-around-initial", "32"],
                "on-demand-w64-shared" => &["--fault-around-initial", "64"],
                "on-demand-w16-shared" => &["--fault-around-initial", "16"],
                "on-demand-adaptive" | "on-demand-adaptive-shared" => &["--adaptive-window"],
                "on-demand-workers-adaptive" => {
                    &["--engine", "workers", "--threads", "2", "--adaptive-window"]
                }
                "on-demand-run-ahead" | "on-demand-run-ahead-shared" => &["--run-ahead", "4M"],
                "hand-back-shared" | "hand-back-shared-huge" => &["--hand-back"],
                _ => &[],
            };
            let (p, s, _) = l.served(ws, extra, Mode::of(cfg, snap, hsnap))?;
            served(p, s, f64::NAN, Mode::of(cfg, snap, hsnap))
        }
        "prefetch"
        | "prefetch-idle"
        | "eager"
        | "prefetch-shared"
        | "prefetch-huge"
        | "prefetch-shared-huge" => {
            let list = if cfg == "eager" { all } else { rec };
            let list = list.to_str().context("path")?;
            let idle: &[&str] = if cfg == "prefetch-idle" {
                &["--prefetch-idle"]
            } else {
                &[]
            };
            let (p, s, prepare_ms) = l.served(
                ws,
                &[&["--prefetch", list], idle].concat(),
                Mode::of(cfg, snap, hsnap),
            )?;
            served(p, s, prepare_ms, Mode::of(cfg, snap, hsnap))
        }
        other => bail!("unknown configuration {other}"),
    })
}

/// A run served by `faultline serve`: the peer's report `p`, serve's
/// summary `s`.
pub(super) fn served(p: PeerReport, s: PeerSummary, prepare_ms: f64, mode: Mode<'_>) -> Run {
    // The peer's resident pages count what was installed in its
    // anonymous memory (shared mode maps the page cache, huge pages come
    // 2 MiB at a time: not comparable).
    let wasted = match mode {
        Mode::Copy => p.resident_pages.saturating_sub(p.pages as u64) as f64,
        // What serve installed (`UFFDIO_CONTINUE` maps page-cache pages:
        // the peer's residency says nothing) beyond the set.
        Mode::Shared(_) => s.installed.saturating_sub(p.pages as u64) as f64,
        _ => f64::NAN,
    };
    let page = match mode {
        Mode::Huge | Mode::SharedHuge(_) => 2 << 20,
        _ => 4096,
    };
    Run {
        write_ns: write_ns(&p),
        dirty_pages: f64::NAN,
        window: s.isolated_window.map_or(f64::NAN, |w| w as f64),
        phases: phases::of_run(&p.touch_stamps, &s.phases, page),
        steps: steps(&p, Some(&s)),
        prepare_ms,
        reads: s.reads,
        handler_cpu_ms: s.handler_cpu_ms,
        helpers_cpu_ms: s.helpers_cpu_ms,
        wasted,
        run_ahead: s.run_ahead as f64,
        pages: p.pages as u64,
        seconds: p.seconds,
        median_ns: p.median_ns as f64,
        p99_ns: p.p99_ns as f64,
        faults: s.faults,
        bytes_read: s.bytes_read,
        peer_anon_kib: p.rss_anon_kib + p.hugetlb_kib,
        preempted: p.vcpu_preempted,
        slept: p.vcpu_slept,
    }
}

/// The peer's median first writes (working-set pages, all pages), ns;
/// NaN without `--write-set`.
fn write_ns(p: &PeerReport) -> (f64, f64) {
    if p.written_offsets.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    (p.write_present_median_ns as f64, p.write_median_ns as f64)
}
