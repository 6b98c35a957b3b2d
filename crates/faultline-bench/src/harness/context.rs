//! The context of one `faultline bench` run, handed to every sub-bench.
//!
//! 1. [`BenchCtx::new`] calibrates the TSC and starts an empty
//!    [`Report`] (with the machine's description).
//! 2. A sub-bench measures, prints its tables, draws its figures with
//!    [`BenchCtx::figure`] (only under `--plot`) and pushes its
//!    [`Record`](super::report::Record)s onto [`BenchCtx::report`].
//! 3. [`BenchCtx::finish`] fills in `ratio_to_kernel` and the load
//!    average at the end, writes `--json`, lists the figures written and
//!    prints the machine's load at the start and the end of the run.

use std::path::{Path, PathBuf};

use super::plot;
use super::progress::Progress;
use super::report::Report;
use super::tsc;

/// Benches whose records get a `ratio_to_kernel` (fault latency benches).
pub const RATIO_BENCHES: [&str; 2] = ["kernel", "latency"];

/// State shared by the sub-benches of one `faultline bench` run.
pub struct BenchCtx {
    /// Every record measured so far.
    pub report: Report,
    /// Where figures go (`--plot`), if anywhere.
    pub plot_dir: Option<PathBuf>,
    /// Where the JSON goes (`--json`), if anywhere.
    pub json: Option<PathBuf>,
    /// Figures written so far (stems, without `.svg`/`.png`).
    pub plots: Vec<PathBuf>,
}

impl BenchCtx {
    /// A context for one run; calibrates the TSC if not done yet.
    pub fn new(json: Option<PathBuf>, plot_dir: Option<PathBuf>) -> BenchCtx {
        BenchCtx {
            report: Report::new(tsc::tsc()),
            plot_dir,
            json,
            plots: Vec::new(),
        }
    }

    /// A progress display for a sub-bench of `steps` steps (hidden off a TTY).
    pub fn progress(&self, steps: u64, name: &str) -> Progress {
        Progress::new(steps, name)
    }

    /// With `--plot`, draws figure `name` with `draw(dir, name)` and
    /// remembers it; without, does nothing.
    pub fn figure(
        &mut self,
        name: &str,
        draw: impl FnOnce(&Path, &str) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        if let Some(dir) = self.plot_dir.clone() {
            draw(&dir, name)?;
            self.note_plot(&dir, name);
        }
        Ok(())
    }

    /// With `--plot`, figure `name`: grouped bars of ms on a log scale,
    /// from (group, [(series, ms)]) ([`plot::bar_groups`]).
    pub fn ms_bars(
        &mut self,
        name: &str,
        title: &str,
        groups: &[(String, Vec<(String, f64)>)],
    ) -> anyhow::Result<()> {
        let (names, series) = plot::bar_groups(groups);
        self.figure(name, |dir, name| {
            plot::group_bars(dir, name, title, "ms (log scale)", &names, &series)
        })
    }

    /// Remember that figure `dir/name.{svg,png}` was written.
    pub fn note_plot(&mut self, dir: &Path, name: &str) {
        self.plots.push(dir.join(name));
    }

    /// Fill in ratios to the kernel and the load at the end, write the
    /// JSON file, list the outputs, say how loaded the machine was.
    pub fn finish(mut self) -> anyhow::Result<Report> {
        self.report.apply_kernel_ratios(&RATIO_BENCHES);
        self.report.machine.loadavg_end = super::report::loadavg();
        if let Some(path) = &self.json {
            self.report.write_json(path)?;
            println!(
                "\nwrote {} ({} records)",
                path.display(),
                self.report.records.len()
            );
        }
        if !self.plots.is_empty() {
            println!("figures (.svg and .png):");
            for p in &self.plots {
                println!("  {}", p.display());
            }
            if !plot::font_available() {
                println!(
                    "  (no font found: figures have no text; set FAULTLINE_PLOT_FONT to a .ttf)"
                );
            }
        }
        println!("{}", self.report.machine.load_line());
        Ok(self.report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON's machine block says how loaded the machine was when the
    /// run started and when it ended, and on how many CPUs.
    #[test]
    fn the_json_records_the_load_at_start_and_end() {
        let d = std::env::temp_dir().join(format!("faultline-ctx-load-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        let json = d.join("r.json");
        let ctx = BenchCtx::new(Some(json.clone()), None);
        let rep = ctx.finish().unwrap();
        assert!(rep.machine.loadavg_end.is_some());
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let m = &v["machine"];
        for field in ["loadavg_start", "loadavg_end"] {
            let l = m[field]
                .as_array()
                .unwrap_or_else(|| panic!("{field}: {m}"));
            assert_eq!(l.len(), 3, "{field}: {m}");
            assert!(l.iter().all(|x| x.as_f64().unwrap() >= 0.0), "{m}");
        }
        assert!(m["online_cpus"].as_u64().unwrap() >= 1, "{m}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
