//! The external watchpoint baseline of Table 4.6 (seed 002): GDB's
//! hardware and software watchpoints, measured on this machine.
//!
//! [`gdb_table`] (Table 4.6): GDB hardware and software watchpoints on the
//! microbenchmark compiled `-O0 -g` (`tools/watchbench/gdbtarget.c`): a block
//! of `pages` 4 KiB pages written byte by byte, N random watched bytes. GDB runs
//! in batch mode with a generated script (appendix 7.1 of the seed): break in
//! `ready()`, `watch -l *(char*)watch_addrs[i]` for each i, each watchpoint
//! with a `commands` block (`silent`, `continue`), `continue` to the end,
//! then `info watchpoints` for GDB's hit counts. The program times its own
//! write loop with the TSC; slowdown =
//! cycles under GDB / median native cycles of the same writes. x86 has four
//! debug registers: a fifth hardware watchpoint fails when GDB inserts it at
//! `continue` ("Could not insert hardware watchpoint"), reported as `None`
//! (a "-" in the thesis table). Software watchpoints single-step every
//! instruction (~100-150 us per step here), so their runs write only the first
//! `sw_bytes` bytes of the block, against a native run of the same bytes.
//!
//! The program is compiled at run time ([`cprog`]); GDB must be on `PATH`
//! for the table ([`cprog::available`] says whether both are there).
//!
//! Watched addresses come from [`random_offsets`], the same xorshift64
//! selection as `gdbtarget.c`, so a caller can watch the same bytes with its own
//! watcher.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline_cli_support::cleanup::{self, OwnedChild};
use faultline_sys::process;
use serde::Serialize;

use super::block::PAGE;
use super::cprog::{self, compile, get_u64, parse_kv, TempDir};
use crate::harness::stats::median;

/// Source of the `-O0` microbenchmark run under GDB (Table 4.6).
pub const GDBTARGET_C: &str = include_str!("../../../../../tools/watchbench/gdbtarget.c");
/// Most watched addresses `gdbtarget.c` accepts (`MAX_WATCH`).
pub const MAX_WATCH: usize = 1024;
/// Native runs per baseline (the median is used).
pub const NATIVE_RUNS: usize = 11;

/// `n` distinct offsets in `0..block_len`, the selection `gdbtarget.c` makes:
///
/// ```text
/// x = seed ^ 0x9E3779B97F4A7C15; if x == 0 { x = 0x9E3779B97F4A7C15 }
/// repeat: x ^= x << 13; x ^= x >> 7; x ^= x << 17;  (xorshift64)
///         o = x % block_len; keep o unless already kept
/// until n are kept (in the order drawn).
/// ```
///
/// # Panics
/// If `n > block_len` (there are not that many distinct offsets).
pub fn random_offsets(n: usize, block_len: usize, seed: u64) -> Vec<usize> {
    assert!(
        n <= block_len,
        "random_offsets: {n} distinct offsets in a block of {block_len} bytes"
    );
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut x = seed ^ GOLDEN;
    if x == 0 {
        x = GOLDEN;
    }
    let mut kept = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::with_capacity(n);
    while kept.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let o = (x % block_len as u64) as usize;
        if seen.insert(o) {
            kept.push(o);
        }
    }
    kept
}

/// GDB watchpoint kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum WatchKind {
    /// Debug registers (GDB's default; at most four on x86_64).
    Hardware,
    /// `set can-use-hw-watchpoints 0`: single-step and compare after each step.
    Software,
}

/// One run of `gdbtarget` (natively or under GDB).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TargetRun {
    /// TSC cycles of the write loop, as the program measured them.
    pub cycles: u64,
    /// Byte writes in the loop.
    pub writes: u64,
    /// Watchpoint stops GDB counted (`info watchpoints`; `None` natively).
    pub hits: Option<u64>,
    /// Wall time of the whole process (GDB start-up and the rest of the
    /// program included), seconds.
    pub wall_s: f64,
}

/// A `gdb` child (started in a process group of its own): its group is
/// killed when dropped, gdb and the program it traces. A signal ending
/// the bench kills gdb itself ([`cleanup`]), and gdb traces the program
/// with `PTRACE_O_EXITKILL`, so the program dies with it.
struct GdbChild(OwnedChild);

impl std::ops::Deref for GdbChild {
    type Target = OwnedChild;
    fn deref(&self) -> &OwnedChild {
        &self.0
    }
}

impl std::ops::DerefMut for GdbChild {
    fn deref_mut(&mut self) -> &mut OwnedChild {
        &mut self.0
    }
}

impl Drop for GdbChild {
    fn drop(&mut self) {
        // Unless reaped already: its pid (the group's id) may name
        // another process's group once reaped.
        if let Ok(None) = self.0.try_wait() {
            let _ = process::kill_group(self.0.id() as i32, process::SIGKILL);
            let _ = self.0.wait();
        }
    }
}

/// `gdbtarget.c` compiled `-O0 -g` in a temporary directory.
pub struct GdbTarget {
    dir: TempDir,
    exe: PathBuf,
}

impl GdbTarget {
    /// Compile `gdbtarget.c` with `cc -O0 -g`.
    pub fn build() -> anyhow::Result<GdbTarget> {
        let dir = TempDir::new()?;
        let exe = compile(&dir.0, "gdbtarget", GDBTARGET_C, &["-O0", "-g"])?;
        Ok(GdbTarget { dir, exe })
    }

    fn args(pages: usize, n: usize, seed: u64, bytes: usize) -> anyhow::Result<[String; 5]> {
        if pages == 0 || bytes == 0 || bytes > pages * PAGE {
            bail!("gdbtarget: need 1 <= bytes <= pages * 4096 (pages {pages}, bytes {bytes})");
        }
        if n > MAX_WATCH || n > bytes {
            bail!("gdbtarget: {n} watched addresses: at most {MAX_WATCH} and at most the {bytes} written bytes");
        }
        Ok([
            pages.to_string(),
            n.to_string(),
            seed.to_string(),
            "1".into(),
            bytes.to_string(),
        ])
    }

    fn parse(text: &str, what: &str, wall: Duration) -> anyhow::Result<TargetRun> {
        let kv = parse_kv(text);
        Ok(TargetRun {
            cycles: get_u64(&kv, "cycles", what)?,
            writes: get_u64(&kv, "writes", what)?,
            hits: None,
            wall_s: wall.as_secs_f64(),
        })
    }

    /// One native run writing the first `bytes` bytes of a `pages`-page block once.
    pub fn native(&self, pages: usize, bytes: usize) -> anyhow::Result<TargetRun> {
        let args = Self::args(pages, 0, 0, bytes)?;
        let t = Instant::now();
        let out = cleanup::output(Command::new(&self.exe).args(&args))
            .with_context(|| format!("running {}", self.exe.display()))?;
        let wall = t.elapsed();
        if !out.status.success() {
            bail!(
                "gdbtarget {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
        }
        Self::parse(&String::from_utf8_lossy(&out.stdout), "gdbtarget", wall)
    }

    /// Median cycles of `runs` native runs (see [`GdbTarget::native`]).
    pub fn native_median(&self, pages: usize, bytes: usize, runs: usize) -> anyhow::Result<f64> {
        let mut c = Vec::with_capacity(runs.max(1));
        for _ in 0..runs.max(1) {
            c.push(self.native(pages, bytes)?.cycles as f64);
        }
        Ok(median(&mut c))
    }

    /// Run under GDB with `n` watchpoints of `kind` on the bytes
    /// [`random_offsets`]`(n, bytes, seed)` of the block, writing the first
    /// `bytes` bytes once. `Ok(None)`: GDB could not insert that many hardware
    /// watchpoints. GDB is killed after `timeout` (an error).
    pub fn under_gdb(
        &self,
        kind: WatchKind,
        pages: usize,
        n: usize,
        seed: u64,
        bytes: usize,
        timeout: Duration,
    ) -> anyhow::Result<Option<TargetRun>> {
        let args = Self::args(pages, n, seed, bytes)?;
        let tag = format!(
            "{}-{n}-{bytes}",
            match kind {
                WatchKind::Hardware => "hw",
                WatchKind::Software => "sw",
            }
        );
        let script = self.dir.0.join(format!("{tag}.gdb"));
        std::fs::write(&script, gdb_script(kind, n))
            .with_context(|| format!("writing {}", script.display()))?;
        let log = self.dir.0.join(format!("{tag}.out"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = file.try_clone().context("dup of the gdb log file")?;
        let what = format!(
            "gdb with {n} {kind:?} watchpoints on gdbtarget {}",
            args.join(" ")
        );
        let t = Instant::now();
        // A child the bench owns: killed on SIGINT/SIGTERM/SIGHUP, when
        // dropped (an error), and when this thread dies; the program it
        // traces dies with it (see `GdbChild`).
        let mut child = {
            use std::os::unix::process::CommandExt;
            GdbChild(
                cleanup::spawn(
                    Command::new("gdb")
                        .args(["-nx", "-batch", "-x"])
                        .arg(&script)
                        .arg("--args")
                        .arg(&self.exe)
                        .args(&args)
                        .stdin(Stdio::null())
                        .stdout(file)
                        .stderr(err)
                        // Own process group, so a timeout can kill everything gdb started.
                        .process_group(0),
                )
                .context("running `gdb`: the GDB watchpoint baselines need it (install gdb)")?,
            )
        };
        let status = loop {
            if let Some(s) = child
                .try_wait()
                .with_context(|| format!("waiting for {what}"))?
            {
                break s;
            }
            if t.elapsed() > timeout {
                // Dropping the child kills gdb's group (see `GdbChild`).
                drop(child);
                bail!(
                    "{what}: no result after {:.0} s, killed (lower the written bytes or raise the timeout)",
                    timeout.as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let wall = t.elapsed();
        let text =
            std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
        if kind == WatchKind::Hardware && text.contains("Could not insert hardware") {
            return Ok(None);
        }
        match Self::parse(&text, &what, wall) {
            Ok(r) if status.success() => Ok(Some(TargetRun {
                hits: Some(hits_in(&text)),
                ..r
            })),
            r => {
                let tail: Vec<&str> = text.lines().rev().take(12).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                let e = r.err().map_or(String::new(), |e| format!("{e:#}; "));
                bail!(
                    "{what} failed ({status}): {e}gdb output ends with:\n{}",
                    tail.join("\n")
                )
            }
        }
    }
}

/// The GDB script of one run (see the module docs). Each watchpoint stop runs
/// `silent` + `continue` and nothing else: evaluating an expression there (e.g.
/// `set $hits = $hits + 1`) costs ~9 ms at the first stop and ~0.1 ms at each
/// later one here (a stop alone is ~0.3 ms). Hits are read afterwards from
/// GDB's own counts (`info watchpoints`: "breakpoint already hit N times").
pub fn gdb_script(kind: WatchKind, n: usize) -> String {
    let mut s = String::from(
        "set pagination off\nset confirm off\nset startup-with-shell off\n\
         set disable-randomization off\n",
    );
    if kind == WatchKind::Software {
        s.push_str("set can-use-hw-watchpoints 0\n");
    }
    s.push_str("break ready\nrun\n");
    for i in 0..n {
        s.push_str(&format!(
            "watch -l *(char*)watch_addrs[{i}]\ncommands\nsilent\ncontinue\nend\n"
        ));
    }
    s.push_str("continue\ninfo watchpoints\n");
    s
}

/// Sum of the "breakpoint already hit N time(s)" lines of `info watchpoints`.
fn hits_in(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("breakpoint already hit "))
        .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// One row of Table 4.6.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GdbRow {
    /// Watched addresses.
    pub watchpoints: usize,
    /// Median native cycles writing the whole block (`pages * 4096` bytes).
    pub native_cycles: f64,
    /// Cycles of the same writes under GDB hardware watchpoints on
    /// `random_offsets(watchpoints, pages * 4096, seed)`.
    pub hw_cycles: Option<f64>,
    /// `hw_cycles / native_cycles`; `None` if GDB could not insert that many
    /// hardware watchpoints (more than the four debug registers of x86_64).
    pub hw_slowdown: Option<f64>,
    /// Bytes written by the software-watchpoint run and its native baseline.
    pub sw_bytes: usize,
    /// Median native cycles writing the first `sw_bytes` bytes.
    pub sw_native_cycles: f64,
    /// Cycles under GDB software watchpoints on
    /// `random_offsets(watchpoints, sw_bytes, seed)`; `None` if `sw_bytes == 0`.
    pub sw_cycles: Option<f64>,
    /// `sw_cycles / sw_native_cycles`.
    pub sw_slowdown: Option<f64>,
    /// Watchpoint stops GDB counted, hardware + software runs (each watched
    /// byte is written once per run, so `watchpoints` per run is expected).
    pub hits_seen: Option<u64>,
    /// Stops counted in the hardware run.
    pub hw_hits: Option<u64>,
    /// Stops counted in the software run.
    pub sw_hits: Option<u64>,
    /// Wall seconds of the hardware run (GDB start-up included).
    pub hw_wall_s: Option<f64>,
    /// Wall seconds of the software run (GDB start-up included).
    pub sw_wall_s: Option<f64>,
}

/// Table 4.6: for each count in `counts`, GDB hardware and software watchpoints
/// on the `-O0` microbenchmark over `pages` pages (software runs capped to the
/// first `sw_bytes` bytes; 0 skips them), addresses from
/// [`random_offsets`] with `seed`. Each GDB run is killed after `timeout`.
/// Fails with the reason if `cc` or `gdb` is missing (see
/// [`cprog::available`]).
pub fn gdb_table(
    counts: &[usize],
    pages: usize,
    sw_bytes: usize,
    seed: u64,
    timeout: Duration,
) -> anyhow::Result<Vec<GdbRow>> {
    cprog::available().map_err(|e| anyhow::anyhow!("GDB watchpoint baseline unavailable: {e}"))?;
    let len = pages * PAGE;
    if pages == 0 || sw_bytes > len {
        bail!("gdb_table: need pages >= 1 and sw_bytes <= pages * 4096 (pages {pages}, sw_bytes {sw_bytes})");
    }
    let target = GdbTarget::build()?;
    let native = target.native_median(pages, len, NATIVE_RUNS)?;
    let sw_native = if sw_bytes > 0 {
        target.native_median(pages, sw_bytes, NATIVE_RUNS)?
    } else {
        f64::NAN
    };
    let mut rows = Vec::with_capacity(counts.len());
    for &n in counts {
        let hw = target
            .under_gdb(WatchKind::Hardware, pages, n, seed, len, timeout)
            .with_context(|| format!("GDB hardware watchpoints, {n} addresses"))?;
        let sw = if sw_bytes > 0 {
            target
                .under_gdb(WatchKind::Software, pages, n, seed, sw_bytes, timeout)
                .with_context(|| format!("GDB software watchpoints, {n} addresses"))?
        } else {
            None
        };
        let hits_seen = match (hw.and_then(|r| r.hits), sw.and_then(|r| r.hits)) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        rows.push(GdbRow {
            watchpoints: n,
            native_cycles: native,
            hw_cycles: hw.map(|r| r.cycles as f64),
            hw_slowdown: hw.map(|r| r.cycles as f64 / native),
            sw_bytes,
            sw_native_cycles: sw_native,
            sw_cycles: sw.map(|r| r.cycles as f64),
            sw_slowdown: sw.map(|r| r.cycles as f64 / sw_native),
            hits_seen,
            hw_hits: hw.and_then(|r| r.hits),
            sw_hits: sw.and_then(|r| r.hits),
            hw_wall_s: hw.map(|r| r.wall_s),
            sw_wall_s: sw.map(|r| r.wall_s),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_distinct_in_range_and_seeded() {
        let a = random_offsets(64, 8 * PAGE, 1);
        assert_eq!(a.len(), 64);
        assert!(a.iter().all(|&o| o < 8 * PAGE));
        let set: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(set.len(), 64);
        assert_eq!(a, random_offsets(64, 8 * PAGE, 1));
        assert_ne!(a, random_offsets(64, 8 * PAGE, 2));
        // Every offset of a small block, and the seed that would zero the state.
        let mut all = random_offsets(16, 16, 0x9E37_79B9_7F4A_7C15);
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn kv_parsing() {
        let text = "cycles=12\n[Inferior 1 exited]\nHardware watchpoint 2: x\n writes=3 \n\
                    2       hw watchpoint  keep y    -location *(char*)watch_addrs[0]\n\
                    \tbreakpoint already hit 1 time\n\
                    \tbreakpoint already hit 10 times\n";
        let kv = parse_kv(text);
        assert_eq!(kv.get("cycles").map(String::as_str), Some("12"));
        assert_eq!(kv.get("writes").map(String::as_str), Some("3"));
        assert_eq!(kv.len(), 2);
        assert_eq!(hits_in(text), 11);
    }

    #[test]
    fn script_shape() {
        let s = gdb_script(WatchKind::Software, 2);
        assert!(s.contains("set can-use-hw-watchpoints 0"));
        assert_eq!(s.matches("watch -l").count(), 2);
        assert!(!gdb_script(WatchKind::Hardware, 1).contains("can-use-hw"));
    }

    /// The C program picks the offsets the Rust function does.
    #[test]
    fn c_selection_matches_rust() {
        if let Err(e) = cprog::available() {
            eprintln!("skipped: {e}");
            return;
        }
        let t = GdbTarget::build().unwrap();
        let script = t.dir.0.join("print.gdb");
        std::fs::write(
            &script,
            "break ready\nrun\nset $i = 0\nwhile $i < n_watch\nprintf \"off=%ld\\n\", watch_addrs[$i] - block\nset $i = $i + 1\nend\nkill\n",
        )
        .unwrap();
        let out = Command::new("gdb")
            .args(["-nx", "-batch", "-x"])
            .arg(&script)
            .arg("--args")
            .arg(&t.exe)
            .args(["8", "12", "7", "1", "5000"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let got: Vec<usize> = text
            .lines()
            .filter_map(|l| l.strip_prefix("off="))
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(got, random_offsets(12, 5000, 7), "gdb output:\n{text}");
    }

    /// A run past its timeout is killed and reported, gdb and program gone.
    #[test]
    fn gdb_timeout_kills() {
        if let Err(e) = cprog::available() {
            eprintln!("skipped: {e}");
            return;
        }
        let t = GdbTarget::build().unwrap();
        let start = Instant::now();
        let e = t
            .under_gdb(
                WatchKind::Software,
                8,
                1,
                1,
                8 * PAGE,
                Duration::from_secs(2),
            )
            .unwrap_err();
        assert!(format!("{e:#}").contains("killed"), "{e:#}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    /// ~15 s here (software watchpoints single-step).
    #[test]
    #[ignore]
    fn gdb_table_runs() {
        if let Err(e) = cprog::available() {
            eprintln!("skipped: {e}");
            return;
        }
        let t = Instant::now();
        let rows = gdb_table(&[1, 4, 8], 8, 2048, 1, Duration::from_secs(120)).unwrap();
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        println!("gdb_table took {:.1} s", t.elapsed().as_secs_f64());
        assert!(rows[0].hw_slowdown.is_some() && rows[1].hw_slowdown.is_some());
        assert!(rows[2].hw_slowdown.is_none());
        for r in &rows {
            assert_eq!(r.sw_hits, Some(r.watchpoints as u64));
        }
    }
}
