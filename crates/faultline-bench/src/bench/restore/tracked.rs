//! The dirty-tracked configurations (`serve --track-dirty`) and the
//! first-write table: what tracking costs a restore and a vCPU's first
//! write, beside the untracked configuration of the same run.
//!
//! ```text
//!   on-demand-tracked, prefetch-tracked
//!     serve --track-dirty D [--prefetch REC] ── peer --write-set PCT (exits)
//!     at the peer's hang-up serve writes D: it must equal the pages written
//!   on-demand-tracked-async
//!     serve --track-dirty D ── peer --write-set PCT --wp-async --hold-ms ...
//!     the report written: SIGUSR1 to serve (it scans the peer's page
//!     tables, PAGEMAP_SCAN, and writes D), D appears, the peer is killed
//! ```
//!
//! 1. Every configuration's peer writes the same seeded set when
//!    `--write-set` (or a tracked configuration) asks for it, after its
//!    restore (the restore time ends at the last working-set page read, so
//!    the writes are not in it), timing each first write: to a page of
//!    the working set (present: no missing-page fault; a write-protect
//!    fault round trip through serve when tracked, the kernel's own fault
//!    with `WP_ASYNC`) and to any page written.
//! 2. A tracked run fails unless serve's dirty set is exactly the pages
//!    the peer wrote (and dropped).
//! 3. The table: per tracked configuration its restore time and first
//!    writes beside its untracked twin's (`on-demand`, `prefetch`), as
//!    ratios of the medians.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline_serve::peer::PeerReport;

use super::args::{tracks_dirty, untracked, ws_label};
use super::launch::{Launcher, Mode, Then};
use super::runs::{served, Run};
use crate::harness::report::{print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

/// How long serve has to write a dirty set asked for with SIGUSR1.
const ASKED_WAIT: Duration = Duration::from_secs(60);

/// Runs tracked configuration `cfg` once on working set `ws` (`rec`: the
/// recorded set, for `prefetch-tracked`); checks serve's dirty set.
pub fn one(l: &Launcher<'_>, ws: f64, cfg: &str, rec: &Path) -> anyhow::Result<Run> {
    let dirty = l.dir.join("dirty.txt");
    let _ = std::fs::remove_file(&dirty);
    let path = dirty.to_str().context("path")?;
    let mut extra = vec!["--track-dirty", path];
    if cfg == "prefetch-tracked" {
        extra.extend(["--prefetch", rec.to_str().context("path")?]);
    }
    let ask = |serve: i32| -> anyhow::Result<()> {
        faultline_sys::process::kill(serve, faultline_sys::signal::SIGUSR1)
            .context("asking serve for the dirty set (SIGUSR1)")?;
        let deadline = Instant::now() + ASKED_WAIT;
        // Written to a temporary sibling and renamed: whole once there.
        while !dirty.exists() {
            if Instant::now() > deadline {
                bail!("serve wrote no dirty set within {ASKED_WAIT:?} of SIGUSR1");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    };
    let then = if cfg.ends_with("-async") {
        Then::Hold(&ask)
    } else {
        Then::Exit
    };
    let (p, s, prepare_ms) = l.served_then(ws, &extra, Mode::Copy, &then)?;
    let dirty_pages = check(&dirty, &p).with_context(|| format!("configuration {cfg}"))?;
    Ok(Run {
        dirty_pages: dirty_pages as f64,
        ..served(p, s, prepare_ms, Mode::Copy)
    })
}

/// Step 2: the dirty set at `path` must be the pages the peer `p` wrote
/// and dropped; their number.
fn check(path: &Path, p: &PeerReport) -> anyhow::Result<usize> {
    let set = faultline_serve::dirty_set::read(path)
        .with_context(|| format!("reading serve's dirty set {}", path.display()))?;
    let mut want: Vec<u64> = p
        .written_offsets
        .iter()
        .chain(&p.dropped_offsets)
        .copied()
        .collect();
    want.sort_unstable();
    want.dedup();
    if set.offsets != want {
        let missing = want
            .iter()
            .filter(|o| set.offsets.binary_search(o).is_err());
        let extra = set
            .offsets
            .iter()
            .filter(|o| want.binary_search(o).is_err());
        bail!(
            "serve's dirty set is not the pages written: {} pages, {} written; {} written pages missing, {} pages never written in it",
            set.offsets.len(),
            want.len(),
            missing.count(),
            extra.count()
        );
    }
    let _ = std::fs::remove_file(path);
    Ok(set.offsets.len())
}

/// The first-write table (step 3), filled in as the medians come.
#[derive(Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Records and tabulates the tracked configurations of `medians`
    /// (working set `set`, cache state `cache`) beside their untracked
    /// twins; the untracked ones with writes too (the baselines).
    pub fn add(
        &mut self,
        ctx: &mut BenchCtx,
        (set, cache): ((f64, &str), &str),
        medians: &[(String, super::runs::Run)],
    ) {
        let get = |n: &str| medians.iter().find(|m| m.0 == n).map(|m| &m.1);
        let us = |ns: f64| {
            if ns.is_finite() {
                format!("{:.2}", ns / 1e3)
            } else {
                "-".into()
            }
        };
        for (cfg, m) in medians {
            if !m.write_ns.1.is_finite() {
                continue;
            }
            let twin = tracks_dirty(cfg).then(|| get(untracked(cfg))).flatten();
            let ratio = |a: f64, b: Option<f64>| b.map(|b| a / b).filter(|r| r.is_finite());
            let restore = ratio(m.seconds, twin.map(|t| t.seconds));
            let write = ratio(m.write_ns.0, twin.map(|t| t.write_ns.0.max(1.0)));
            // The peer reports medians only: no other figure.
            let s = Summary {
                n: 1,
                median: m.write_ns.0,
                ..Summary::NONE
            };
            let mut rec = Record::new("restore-write", cfg, "write", "write", &s)
                .with("working_set_pct", set.0)
                .with("pattern", set.1)
                .with("cache", cache)
                .with("seconds", m.seconds)
                .with("write_present_median_ns", m.write_ns.0)
                .with("write_median_ns", m.write_ns.1);
            if m.dirty_pages.is_finite() {
                rec = rec.with("dirty_pages", m.dirty_pages);
            }
            if let Some(t) = twin {
                rec = rec.with("untracked", untracked(cfg));
                if let Some(r) = restore {
                    rec = rec.with("restore_vs_untracked", r);
                }
                if let Some(r) = write {
                    rec = rec.with("write_vs_untracked", r);
                }
                rec = rec.with("untracked_write_present_median_ns", t.write_ns.0);
            }
            ctx.report.push(rec);
            let show = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
            self.rows.push(vec![
                ws_label(set),
                cache.to_string(),
                cfg.clone(),
                format!("{:.1}", m.seconds * 1e3),
                show(restore),
                us(m.write_ns.0),
                show(write),
                us(m.write_ns.1),
                if m.dirty_pages.is_finite() {
                    format!("{:.0}", m.dirty_pages)
                } else {
                    "-".into()
                },
            ]);
        }
    }

    /// Prints the table (nothing without writes).
    pub fn print(&self) {
        if self.rows.is_empty() {
            return;
        }
        print_table(
            &[
                "ws",
                "cache",
                "config",
                "restore ms",
                "x untracked",
                "first write us (ws page)",
                "x untracked",
                "first write us (any)",
                "dirty pages",
            ],
            &self.rows,
        );
        println!(
            "(first writes after the restore, medians as the vCPUs saw them: to a working-set page (present: untracked no fault, tracked a write-protect fault through serve, -async the kernel's own) and to any page written (missing ones take a missing-page fault either way); x untracked: this / on-demand's or prefetch's of the same run, lower is cheaper; dirty pages: serve's set, checked equal to the pages written)"
        );
    }
}
