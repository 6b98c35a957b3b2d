//! `faultline bench restore --peers 1,2,4,8`: N peers restored at once
//! from one memory file by one `faultline serve`, and the handler's
//! resident memory for each N (see the `restore` module).
//!
//! Each round starts `serve --peers N --prefetch RECORD`, waits until it
//! has prepared the recorded set (its own mapping of the file populated),
//! samples `/proc/PID/status` (`RssAnon`, `RssFile`), then starts N peers
//! at once (same working set, as N clones of one snapshot would touch) and
//! samples every 2 ms until they are done. Reported per N: the handler's
//! peak `RssAnon` and `RssFile` over the round against the idle handler,
//! the growth per peer against the bookkeeping `serve` reports per peer,
//! the restore times (median and slowest), the peers' own private memory
//! (their `RssAnon` after the restore, summed), every byte of every peer's
//! working set checked by the peer. With a shared tmpfs copy, the same
//! rounds in shared mode (`serve --shared`, peers mapping the copy): the
//! clones share its page cache instead of holding private copies; and with
//! the copy on hugetlbfs, the same with 2 MiB pages (peers `--huge`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline_cli_support::cleanup::{self, OwnedChild};
use faultline_serve::peer::PeerReport;
use faultline_serve::PeerSummary;

use super::args::RestoreArgs;
use super::launch::{exe, Launcher};
use super::memory::{warm, HugeMount, Pool, Snapshot};
use crate::harness::report::{print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

/// `--peers`: one round per N and mode, then the table and figures.
pub fn run(ctx: &mut BenchCtx, a: &RestoreArgs, l: &Launcher<'_>) -> anyhow::Result<()> {
    let (dir, mem) = (l.dir, l.mem);
    let ws = *a.working_set.first().context("--working-set is empty")?;
    let rec = dir.join(format!("ws{ws}.txt"));
    warm(mem)?;
    l.record(ws, &rec)?;
    // Shared mode too when asked for (prefetch-shared among --configs, as
    // by default): the clones map one tmpfs copy.
    let snap = a
        .configs
        .iter()
        .any(|c| c == "prefetch-shared")
        .then(Snapshot::in_dev_shm);
    if let Some(snap) = &snap {
        let store = faultline::FileStore::open_with(mem, 0, faultline::store::FileAccess::Mmap)?;
        faultline::SharedSnapshot::create(&snap.0, &store, |_, _| {})
            .context("writing the shared tmpfs copy")?;
    }
    // And on hugetlbfs when asked for (prefetch-shared-huge among
    // --configs): a pool for the copy, a mount; each round then reserves
    // its peers' private mappings (a hugetlbfs MAP_PRIVATE mapping
    // reserves its size in the pool).
    let huge_pages = a.size as u64 / (2 << 20);
    // (Dropped in reverse: the mount, then the pool.)
    let mut _pool = None;
    let mut hmount = None;
    if a.configs.iter().any(|c| c == "prefetch-shared-huge") {
        let made = Pool::get(huge_pages + 8)
            .map_err(|why| anyhow::anyhow!(why))
            .and_then(|pool| {
                let m = HugeMount::new(dir)?;
                let store =
                    faultline::FileStore::open_with(mem, 0, faultline::store::FileAccess::Mmap)?;
                faultline::SharedSnapshot::create(&m.snap(), &store, |_, _| {})?;
                Ok((pool, m))
            });
        match made {
            Ok((pool, m)) => {
                _pool = Some(pool);
                hmount = Some(m);
            }
            Err(why) => println!("restore --peers: hugetlbfs rounds skipped: {why:#}"),
        }
    }
    let hsnap = hmount.as_ref().map(|m| m.snap());
    println!(
        "\nrestore --peers: {} MiB memory file, {ws}% working set, {} vCPU threads per peer, warm",
        a.size >> 20,
        a.vcpus
    );
    let modes: Vec<(Option<&Path>, bool)> = std::iter::once((None, false))
        .chain(snap.as_ref().map(|s| (Some(s.0.as_path()), false)))
        .chain(hsnap.as_deref().map(|h| (Some(h), true)))
        .collect();
    let mut progress = ctx.progress((a.peers.len() * modes.len()) as u64, "restore peers");
    let mut rounds = Vec::new();
    for &(shared, huge) in &modes {
        for &n in &a.peers {
            let mode = match (shared, huge) {
                (None, _) => "copy",
                (Some(_), false) => "shared",
                (Some(_), true) => "shared-huge",
            };
            progress.step(&format!("{n} peers, {mode}"));
            // The peers' private mappings of the hugetlbfs copy, reserved
            // in the pool for this round.
            let _round_pool = if huge {
                match Pool::get(n.max(1) as u64 * huge_pages + 8) {
                    Ok(p) => Some(p),
                    Err(why) => {
                        progress.suspend(|| {
                            println!("restore --peers: {n} peers on hugetlbfs skipped: {why}")
                        });
                        continue;
                    }
                }
            } else {
                None
            };
            warm(mem)?;
            rounds.push(round(l, &rec, shared, huge, n.max(1), ws)?);
        }
    }
    progress.finish();
    report(ctx, ws, &rounds)
}

/// What one round measured.
#[derive(Debug, Clone, Default)]
struct PeersRound {
    /// Peers restored at once.
    pub peers: usize,
    /// Shared (zero-copy) mode, else copy mode.
    pub shared: bool,
    /// The shared copy is on hugetlbfs (2 MiB pages).
    pub huge: bool,
    /// The peers' private memory after their restores (RssAnon +
    /// private hugetlb), summed, KiB.
    pub peers_private_kib: u64,
    /// The handler's RssAnon / RssFile before any peer connected, KiB.
    pub idle_anon_kib: u64,
    /// See `idle_anon_kib`.
    pub idle_file_kib: u64,
    /// Peaks over the round, KiB.
    pub peak_anon_kib: u64,
    /// See `peak_anon_kib`.
    pub peak_file_kib: u64,
    /// VmHWM at the last sample, KiB.
    pub hwm_kib: u64,
    /// Bookkeeping `serve` reports, summed over the peers, bytes.
    pub bookkeeping_bytes: u64,
    /// Restore times (handshake to last working-set page), seconds.
    pub seconds: Vec<f64>,
    /// Bytes the peers compared with the file.
    pub verified_bytes: u64,
}

/// `(RssAnon, RssFile, VmHWM)` of `pid`, KiB.
fn rss(pid: u32) -> Option<(u64, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    Some((field("RssAnon:")?, field("RssFile:")?, field("VmHWM:")?))
}

fn kill(c: &mut OwnedChild) {
    let _ = c.kill();
    let _ = c.wait();
}

/// Runs one round of `n` peers.
fn round(
    l: &Launcher<'_>,
    rec: &Path,
    shared: Option<&Path>,
    huge: bool,
    n: usize,
    ws: f64,
) -> anyhow::Result<PeersRound> {
    let (dir, mem, vcpus) = (l.dir, l.mem, l.vcpus);
    let exe = &exe()?;
    let sock = dir.join("peers.sock");
    let json = dir.join("peers-serve.json");
    let err = dir.join("peers-serve.err");
    let _ = std::fs::remove_file(&sock);
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .arg("--socket")
        .arg(&sock)
        .arg("--mem")
        .arg(mem)
        .arg("--prefetch")
        .arg(rec)
        .arg("--json")
        .arg(&json)
        .args(["--peers", &n.to_string(), "--timeout", "120"]);
    if let Some(snap) = shared {
        cmd.arg("--shared").arg(snap);
    }
    let mut serve = cleanup::spawn(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err)?),
    )?;
    let pid = serve.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Ready: the recorded set prepared (copy mode); listening (shared
    // mode: serve prepares nothing for shared peers).
    let ready = if shared.is_some() {
        "listening on"
    } else {
        "prepared the recorded set"
    };
    while !std::fs::read_to_string(&err)
        .unwrap_or_default()
        .contains(ready)
    {
        if Instant::now() > deadline || serve.try_wait()?.is_some() {
            kill(&mut serve);
            bail!("faultline serve never prepared its record");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut r = PeersRound {
        peers: n,
        shared: shared.is_some(),
        huge,
        ..Default::default()
    };
    (r.idle_anon_kib, r.idle_file_kib, _) = rss(pid).context("reading the handler's status")?;
    let mut peers: Vec<(OwnedChild, std::path::PathBuf)> = Vec::new();
    for i in 0..n {
        let out = dir.join(format!("peer-{i}.json"));
        let _ = std::fs::remove_file(&out);
        let mut cmd = Command::new(exe);
        cmd.arg("peer")
            .arg("--socket")
            .arg(&sock)
            .arg("--mem")
            .arg(mem)
            .arg("--json")
            .arg(&out)
            .args(["--threads", &vcpus.to_string()])
            .args(["--working-set", &ws.to_string()]);
        if let Some(snap) = shared {
            cmd.args(["--backend", "shared", "--map-file"]).arg(snap);
        }
        if huge {
            cmd.arg("--huge");
        }
        let child = cleanup::spawn(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        match child {
            Ok(c) => peers.push((c, out)),
            Err(e) => {
                peers.iter_mut().for_each(|p| kill(&mut p.0));
                kill(&mut serve);
                return Err(e.into());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut failed = None;
    loop {
        if let Some((a, f, h)) = rss(pid) {
            r.peak_anon_kib = r.peak_anon_kib.max(a);
            r.peak_file_kib = r.peak_file_kib.max(f);
            r.hwm_kib = h;
        }
        let mut running = 0;
        for (c, _) in &mut peers {
            match c.try_wait()? {
                None => running += 1,
                Some(s) if !s.success() => failed = Some(s),
                Some(_) => {}
            }
        }
        if running == 0 || failed.is_some() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if failed.is_some() || Instant::now() > deadline {
        peers.iter_mut().for_each(|p| kill(&mut p.0));
        kill(&mut serve);
        bail!(
            "a peer failed ({failed:?}) or the round timed out; serve said:\n{}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while serve.try_wait()?.is_none() {
        if Instant::now() > deadline {
            kill(&mut serve);
            bail!("faultline serve did not exit after its peers");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for (_, out) in &peers {
        let p: PeerReport = serde_json::from_str(&std::fs::read_to_string(out)?)?;
        r.seconds.push(p.seconds);
        r.verified_bytes += p.verified_bytes;
        // A hugetlbfs page-cache page mapped by one process counts as
        // private hugetlb: in the hugetlbfs rounds only RssAnon is.
        r.peers_private_kib += p.rss_anon_kib + if huge { 0 } else { p.hugetlb_kib };
    }
    let sums: Vec<PeerSummary> = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    if sums.len() != n {
        bail!("serve reported {} peers, {n} ran", sums.len());
    }
    r.bookkeeping_bytes = sums.iter().map(|s| s.bookkeeping_bytes).sum();
    Ok(r)
}

/// Prints the rounds, records them, draws them.
fn report(ctx: &mut BenchCtx, ws: f64, rounds: &[PeersRound]) -> anyhow::Result<()> {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut rows = Vec::new();
    for r in rounds {
        let mut secs = r.seconds.clone();
        let med = crate::harness::stats::median(&mut secs);
        let slowest = secs.last().copied().unwrap_or(0.0);
        let anon_growth = r.peak_anon_kib.saturating_sub(r.idle_anon_kib);
        // Over the peers' restore times: the median and the slowest are
        // the table's.
        let s = Summary::from_ns(&mut secs.iter().map(|s| s * 1e9).collect::<Vec<_>>());
        let mode = match (r.shared, r.huge) {
            (false, _) => "copy",
            (true, false) => "shared",
            (true, true) => "shared-huge",
        };
        ctx.report.push(
            Record::new(
                "restore-peers",
                match mode {
                    "copy" => "prefetch",
                    "shared" => "prefetch-shared",
                    _ => "prefetch-shared-huge",
                },
                if r.shared { "CONTINUE" } else { "COPY" },
                "read",
                &s,
            )
            .with("working_set_pct", ws)
            .with("peers", r.peers as u64)
            .with("idle_rss_anon_kib", r.idle_anon_kib)
            .with("idle_rss_file_kib", r.idle_file_kib)
            .with("peak_rss_anon_kib", r.peak_anon_kib)
            .with("peak_rss_file_kib", r.peak_file_kib)
            .with("vm_hwm_kib", r.hwm_kib)
            .with("bookkeeping_bytes", r.bookkeeping_bytes)
            .with("median_seconds", med)
            .with("slowest_seconds", slowest)
            .with("verified_bytes", r.verified_bytes)
            .with("peers_private_kib", r.peers_private_kib),
        );
        rows.push(vec![
            mode.to_string(),
            r.peers.to_string(),
            format!("{:.1}", mib(r.idle_anon_kib)),
            format!("{:.1}", mib(r.peak_anon_kib)),
            format!("{:.2}", mib(anon_growth) / r.peers as f64),
            format!(
                "{:.2}",
                r.bookkeeping_bytes as f64 / r.peers as f64 / 1048576.0
            ),
            format!("{:.1}", mib(r.idle_file_kib)),
            format!("{:.1}", mib(r.peak_file_kib)),
            format!("{:.1}", med * 1e3),
            format!("{:.1}", slowest * 1e3),
            format!("{}", r.verified_bytes >> 20),
            format!("{:.1}", mib(r.peers_private_kib)),
        ]);
    }
    print_table(
        &[
            "mode",
            "peers",
            "anon idle MiB",
            "anon peak MiB",
            "anon growth/peer MiB",
            "bookkeeping/peer MiB",
            "file idle MiB",
            "file peak MiB",
            "median ms",
            "slowest ms",
            "MiB verified",
            "peers' private MiB",
        ],
        &rows,
    );
    println!(
        "(the handler's RssAnon/RssFile from /proc/PID/status: idle = prefetch record prepared, no peer yet; peak over the round; bookkeeping = what serve reports per peer: residency map, removed bits, prefetch queue; peers' private = the peers' RssAnon after their restores, summed: copy mode copies the working set into each, shared mode maps the one tmpfs copy's page cache; shared-huge: the copy on hugetlbfs, RssAnon only)"
    );
    // One line per measure and mode (copy; shared when it ran).
    let mut anon = Vec::new();
    let mut file = Vec::new();
    for (shared, huge, mode) in [
        (false, false, "copy"),
        (true, false, "shared"),
        (true, true, "shared, hugetlbfs"),
    ] {
        let of: Vec<&PeersRound> = rounds
            .iter()
            .filter(|r| r.shared == shared && r.huge == huge)
            .collect();
        if of.is_empty() {
            continue;
        }
        let series = |f: &dyn Fn(&PeersRound) -> f64| -> Vec<(f64, f64)> {
            of.iter().map(|r| (r.peers as f64, f(r))).collect()
        };
        anon.push((
            format!("RssAnon peak ({mode})"),
            series(&|r| mib(r.peak_anon_kib)),
        ));
        anon.push((
            format!("RssAnon idle ({mode})"),
            series(&|r| mib(r.idle_anon_kib)),
        ));
        anon.push((
            format!("RssAnon idle + bookkeeping of N peers ({mode})"),
            series(&|r| mib(r.idle_anon_kib) + r.bookkeeping_bytes as f64 / 1048576.0),
        ));
        file.push((
            format!("RssFile peak ({mode})"),
            series(&|r| mib(r.peak_file_kib)),
        ));
        file.push((
            format!("RssFile idle ({mode})"),
            series(&|r| mib(r.idle_file_kib)),
        ));
        file.push((
            format!("the peers' private memory, summed ({mode})"),
            series(&|r| mib(r.peers_private_kib)),
        ));
    }
    for (name, what, lines) in [
        ("restore_peers_anon", "anonymous", &anon),
        (
            "restore_peers_file",
            "file (handler) and the peers' private",
            &file,
        ),
    ] {
        ctx.figure(name, |dir, name| {
            crate::harness::plot::line_chart(
                dir,
                name,
                &format!(
                    "faultline serve: {what} resident memory, N peers at once ({ws}% working set)"
                ),
                "peers restored at once",
                "MiB",
                lines,
                true,
            )
        })?;
    }
    Ok(())
}
