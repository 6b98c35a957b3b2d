//! `bench restore --takeover`: the `on-demand-takeover` row, a restore
//! whose serve is killed midway and taken over by the same command started
//! again, beside the uninterrupted `on-demand` row of the same run.
//!
//! ```text
//!   serve --takeover (FAULTLINE_FAILPOINT=fault-read:N) ── spawns its keeper
//!   peer: handshake ─ faults ... the Nth fault read: serve SIGKILLs itself
//!          (stamps T_kill, CLOCK_MONOTONIC)           │ vCPUs block
//!   bench: woken by serve's pidfd ─ spawns the same serve (T_start)
//!   new serve: takes the peer from the keeper, wakes its regions,
//!          reads its first fault (T_first) ─ ... ─ the peer's last touch
//! ```
//!
//! N is half the demand faults of this repetition's `on-demand` run (run
//! just before, same working set and cache state), so the kill comes
//! mid-restore with a fault in flight (read, never answered). Reported per
//! (working set, cache), medians over the reps: the restore's time (the
//! peer's, handshake to last touch, the gap included) against
//! `on-demand`'s, the gap `T_first - T_kill` (kill to the first fault the
//! new serve reads: what bounds it is the new serve's start, opening the
//! memory file and taking the peer over), its part before the new serve
//! was started (`T_start - T_kill`: the bench noticing the death), and the
//! longest a vCPU stalled on one page (the peer's largest first-touch
//! latency).

use std::time::Duration;

use anyhow::{bail, Context};
use faultline_serve::PeerSummary;

use super::args::{ws_label, RestoreArgs};
use super::launch::{wait_bounded, Backing, Launcher, Mode, SpawnLogged};
use super::runs::{served, Run};
use crate::harness::report::{fmt_ratio, print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

/// The configuration's name.
pub const CONFIG: &str = "on-demand-takeover";

/// What one kill and takeover measured, ms.
#[derive(Debug, Clone, Copy)]
pub struct Gap {
    /// From the kill to the first fault the new serve read.
    pub gap_ms: f64,
    /// From the kill to the new serve's start (the bench noticing).
    pub restart_ms: f64,
    /// The longest first-touch latency of a vCPU (the peer's).
    pub stall_ms: f64,
    /// The fault the first serve died at.
    pub kill_at: u64,
}

/// `configs` with [`CONFIG`] right after `on-demand` (added first if it is
/// missing: N comes from its run), when `takeover`.
pub fn with_row(mut configs: Vec<String>, takeover: bool) -> Vec<String> {
    if !takeover || configs.iter().any(|c| c == CONFIG) {
        return configs;
    }
    let at = match configs.iter().position(|c| c == "on-demand") {
        Some(i) => i + 1,
        None => {
            configs.push("on-demand".into());
            configs.len()
        }
    };
    configs.insert(at, CONFIG.into());
    configs
}

/// `CLOCK_MONOTONIC` ns of a failpoint's kill, from the log `log`.
fn kill_ns(log: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.starts_with("failpoint "))?;
    line.split(" SIGKILL at ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The keeper's pid, from the first serve's log (the keeper shares it).
fn keeper_pid(log: &str) -> Option<i32> {
    let line = log.lines().find(|l| l.contains("keeps the peers of"))?;
    line.split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)?
        .parse()
        .ok()
}

/// Waits (10 s at most) for the keeper of `log` to exit once its peer is
/// gone, so the next run starts without it; then kills it by its pidfd.
fn reap_keeper(log: &str) {
    let Some(pid) = keeper_pid(log) else { return };
    let Ok(pidfd) = faultline_sys::process::Pidfd::open(pid) else {
        return;
    };
    if !pidfd.wait_exit(10_000).unwrap_or(false) {
        eprintln!("restore: the keeper {pid} did not exit with its peer; killing it");
        let _ = pidfd.send_signal(faultline_sys::process::SIGKILL);
    }
}

/// One restore of working set `ws` whose serve dies at its `kill_at`th
/// fault read and is taken over (see the module docs).
pub fn one(l: &Launcher<'_>, ws: f64, kill_at: u64) -> anyhow::Result<(Run, Gap)> {
    let sock = l.dir.join("takeover.sock");
    let json = l.dir.join("takeover.json");
    let (err, again_err) = (l.dir.join("takeover.err"), l.dir.join("taken.err"));
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(&json);
    let mut first = l.serve_command(&sock, &json, &["--takeover"], &Mode::Copy)?;
    first.env(
        faultline_sys::failpoint::ENV,
        format!("fault-read:{}", kill_at.max(1)),
    );
    let mut first = first.spawn_logged(&err)?;
    let result = std::thread::scope(|s| -> anyhow::Result<(Run, Gap)> {
        let peer = s.spawn(|| l.peer(ws, Backing::Uffd(&sock)));
        let st = wait_bounded(&mut first, Duration::from_secs(600))?;
        let restart_ns = faultline_sys::monotonic_ns();
        let mut again = l
            .serve_command(&sock, &json, &["--takeover"], &Mode::Copy)?
            .spawn_logged(&again_err)?;
        let log = std::fs::read_to_string(&err).unwrap_or_default();
        let died = std::os::unix::process::ExitStatusExt::signal(&st)
            == Some(faultline_sys::process::SIGKILL);
        let rep = peer
            .join()
            .map_err(|_| anyhow::anyhow!("the peer thread panicked"))?;
        let again_st = wait_bounded(&mut again, Duration::from_secs(60))?;
        if !died {
            bail!("serve was not killed at its fault {kill_at} ({st}): the restore ended first?\n{log}");
        }
        let rep = rep?;
        let taken = std::fs::read_to_string(&again_err).unwrap_or_default();
        if !again_st.success() {
            bail!("the serve taking over failed ({again_st}):\n{taken}");
        }
        let sums: Vec<PeerSummary> = serde_json::from_str(
            &std::fs::read_to_string(&json).context("the new serve's --json")?,
        )?;
        let s = sums
            .into_iter()
            .next()
            .context("the new serve reported no peer")?;
        let kill = kill_ns(&log).context("no failpoint line in serve's log")?;
        let ms = |ns: u64| ns.saturating_sub(kill) as f64 / 1e6;
        let gap = Gap {
            gap_ms: ms(s.handoff.first_fault_ns),
            restart_ms: ms(restart_ns),
            stall_ms: rep.max_ns as f64 / 1e6,
            kill_at,
        };
        let mut run = served(rep, s, f64::NAN, Mode::Copy);
        // Faults of both serves; handler and helper CPU of the second
        // only: not comparable.
        run.faults += kill_at;
        run.handler_cpu_ms = f64::NAN;
        run.helpers_cpu_ms = f64::NAN;
        Ok((run, gap))
    });
    reap_keeper(&std::fs::read_to_string(&err).unwrap_or_default());
    result
}

/// The median and the 99th percentile (nearest rank) of `v`.
fn median_p99(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let p99 = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    (crate::harness::stats::median_sorted(v), v[p99])
}

/// The medians (and 99th percentiles) of one (working set, cache)'s gaps.
#[derive(Debug, Clone, Copy)]
pub struct Gaps {
    /// Gap, median and p99, ms.
    pub gap: (f64, f64),
    /// Its part before the new serve started, median, ms.
    pub restart: f64,
    /// Longest vCPU stall, median and p99, ms.
    pub stall: (f64, f64),
    /// The kills measured.
    pub kills: usize,
}

impl Gaps {
    /// Of `gaps` (at least one).
    pub fn of(gaps: &[Gap]) -> Gaps {
        let pick = |f: &dyn Fn(&Gap) -> f64| {
            let mut v: Vec<f64> = gaps.iter().map(f).collect();
            median_p99(&mut v)
        };
        Gaps {
            gap: pick(&|g| g.gap_ms),
            restart: pick(&|g| g.restart_ms).0,
            stall: pick(&|g| g.stall_ms),
            kills: gaps.len(),
        }
    }
}

/// The takeover table and figure, filled as the medians come.
#[derive(Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
    /// Per (working set, cache): on-demand's ms, the taken-over row's,
    /// the gap's (the figure's bar groups).
    groups: Vec<(String, Vec<(String, f64)>)>,
}

impl Table {
    /// Records and tabulates the takeover of working set `set` in cache
    /// state `cache`: its `gaps`, its row and on-demand's among `medians`.
    pub fn add(
        &mut self,
        (ctx, a): (&mut BenchCtx, &RestoreArgs),
        gaps: &[Gap],
        medians: &[(String, Run)],
        (set, cache): ((f64, &str), &str),
    ) {
        let get = |n: &str| medians.iter().find(|m| m.0 == n).map(|m| m.1.seconds * 1e3);
        let (Some(plain), Some(taken)) = (get("on-demand"), get(CONFIG)) else {
            return;
        };
        let g = Gaps::of(gaps);
        let label = ws_label(set);
        let mut ns: Vec<f64> = gaps.iter().map(|g| g.gap_ms * 1e6).collect();
        let kill_at = gaps.iter().map(|g| g.kill_at).sum::<u64>() / gaps.len().max(1) as u64;
        ctx.report.push(
            Record::new(
                "restore-takeover",
                CONFIG,
                "COPY",
                "read",
                &Summary::from_ns(&mut ns),
            )
            .with("working_set_pct", set.0)
            .with("pattern", set.1)
            .with("cache", cache)
            .with("reps", a.reps as u64)
            .with("kills", g.kills as u64)
            .with("killed_at_fault", kill_at)
            .with("on_demand_ms", plain)
            .with("taken_over_ms", taken)
            .with("taken_over_vs_on_demand", plain / taken)
            .with("gap_ms_median", g.gap.0)
            .with("gap_ms_p99", g.gap.1)
            .with("restart_ms_median", g.restart)
            .with("longest_stall_ms_median", g.stall.0)
            .with("longest_stall_ms_p99", g.stall.1),
        );
        self.rows.push(vec![
            label.clone(),
            cache.to_string(),
            g.kills.to_string(),
            kill_at.to_string(),
            format!("{plain:.1}"),
            format!("{taken:.1}"),
            fmt_ratio(plain / taken),
            format!("{:.2}", g.gap.0),
            format!("{:.2}", g.gap.1),
            format!("{:.2}", g.restart),
            format!("{:.2}", g.stall.0),
            format!("{:.2}", g.stall.1),
        ]);
        self.groups.push((
            format!("{label} {cache}"),
            vec![
                ("on-demand".into(), plain),
                ("killed and taken over".into(), taken),
                ("gap: kill to the new serve's first fault".into(), g.gap.0),
                ("longest vCPU stall".into(), g.stall.0),
            ],
        ));
    }

    /// Prints the table and draws the figure (`restore_takeover`).
    pub fn print(&self, ctx: &mut BenchCtx, a: &RestoreArgs) -> anyhow::Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        println!("\nrestore --takeover: serve killed mid-restore (a fault read, not answered), the same command started again");
        print_table(
            &[
                "ws",
                "cache",
                "kills",
                "at fault",
                "on-demand ms",
                "taken over ms",
                "vs on-demand",
                "gap med ms",
                "gap p99 ms",
                "restart ms",
                "stall med ms",
                "stall p99 ms",
            ],
            &self.rows,
        );
        println!(
            "(medians over the kills; at fault: the demand fault serve died at, half of the same rep's on-demand run's; ms: the peer's restore, handshake to last touch, gap included; gap: from the kill to the first fault the new serve read (its start, opening the memory file, taking the peer from the keeper, waking the regions); restart: its part until the new serve was started; stall: the longest first-touch latency of a vCPU; p99: nearest rank, the largest below 100 kills)"
        );
        let title = format!(
            "restore --takeover: serve killed mid-restore, {} MiB, median of {}",
            a.size >> 20,
            a.reps
        );
        ctx.ms_bars("restore_takeover", &title, &self.groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_follows_on_demand_and_the_logs_are_read() {
        let c = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            with_row(c(&["kernel", "on-demand", "prefetch"]), true),
            c(&["kernel", "on-demand", CONFIG, "prefetch"])
        );
        assert_eq!(
            with_row(c(&["kernel"]), true),
            c(&["kernel", "on-demand", CONFIG])
        );
        assert_eq!(with_row(c(&["kernel"]), false), c(&["kernel"]));
        let log = "faultline serve keeper: pid 4242 keeps the peers of /x\nfailpoint fault-read: SIGKILL at 123456789 ns (CLOCK_MONOTONIC)\n";
        assert_eq!(kill_ns(log), Some(123_456_789));
        assert_eq!(keeper_pid(log), Some(4242));
        assert_eq!(median_p99(&mut [3.0, 1.0, 2.0]), (2.0, 3.0));
    }
}
