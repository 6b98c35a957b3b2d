//! `faultline bench restore`: VM snapshot restore through Firecracker's
//! hand-off, every configuration in one run, `faultline peer` as the VMM.
//!
//! Configurations (each a fresh peer process; the handler a fresh
//! `faultline serve` process unless noted):
//! * `kernel`: the peer maps the memory file `MAP_PRIVATE` (Firecracker's
//!   `File` backend), no handler;
//! * `baseline`: a handler written like Firecracker's example (one thread
//!   in this process, one page per fault, `UFFDIO_COPY` from a mapping of
//!   the file);
//! * `on-demand`: `faultline serve` (poll engine, fault-around up to 16);
//! * `prefetch`: `faultline serve --prefetch` of the set a `--record` run
//!   of the same working set wrote (recorded once, warm, before);
//! * `eager`: `faultline serve --prefetch` of every page of the file
//!   (installed from the handshake on, faults first);
//! * `kernel-tmpfs`: the peer maps the shared tmpfs copy of the file
//!   `MAP_PRIVATE` (the kernel on the same page cache as the shared modes);
//! * `on-demand-shared`, `prefetch-shared`: `faultline serve --shared` and a
//!   peer that maps the shared tmpfs copy `MAP_PRIVATE`, registered
//!   MISSING|MINOR: faults and prefetch are `UFFDIO_CONTINUE` (zero copy);
//! * `on-demand-huge`, `prefetch-huge` (only when asked for with
//!   `--configs`): the peer's memory is 2 MiB hugetlb pages (`--huge`),
//!   copied 2 MiB per fault or prefetch run; a pool of 2 MiB pages is
//!   reserved for the run (`vm.nr_hugepages` grown as root and given back);
//! * `kernel-hugetlbfs`, `on-demand-shared-huge`, `prefetch-shared-huge`
//!   (only when asked for): the shared copy on a hugetlbfs mount the bench
//!   makes (2 MiB pages, root), mapped by the kernel, or served with
//!   `UFFDIO_CONTINUE` of 2 MiB pages; its population (warm) is reported.
//!
//! The shared tmpfs copy is written once per run, before the
//! configurations run; how long that takes (the one-time population of the
//! shared page cache) is measured separately, from a warm and from a cold
//! memory file, and reported beside the table. Cold runs drop the memory
//! file's page cache; the tmpfs copy stays in memory (it *is* the shared
//! cache; dropping it means populating it again, the cost reported).
//!
//! Reported: seconds from the handshake to the last working-set page
//! touched (the peer measures it), first-touch latency seen by the vCPU
//! threads (median, p99), demand faults and bytes read by the handler;
//! medians over `--reps`. Cold runs drop the file's page cache before each
//! run (`posix_fadvise(DONTNEED)`, plus `drop_caches` as root).

mod floor;
mod peers;

use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline_sys::mem::{self, Mapping};
use faultline_sys::poll::{self, events, PollFd};
use faultline_sys::sock;
use faultline_sys::uffd::{Msg, Outcome, Uffd, UffdMsg};

use crate::harness::report::{fmt_ratio, print_table, Record};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;

use faultline_serve::PeerReport;
use faultline_serve::PeerSummary;

/// Options of `faultline bench restore`.
#[derive(clap::Args, Clone, Debug)]
pub struct RestoreArgs {
    /// Bytes of the memory file (created in --dir). Default 1 GiB.
    #[arg(long, default_value_t = 1 << 30)]
    pub size: usize,
    /// Working sets, percent of memory.
    #[arg(long, default_value = "10,30", value_delimiter = ',')]
    pub working_set: Vec<f64>,
    /// vCPU threads of the peer.
    #[arg(long, default_value_t = 2)]
    pub vcpus: usize,
    /// Repetitions per configuration (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Directory for the memory file, sockets and records. Default: a
    /// temporary directory in /tmp, removed afterwards.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Configurations to run (the ratios need kernel, baseline and
    /// on-demand). Default: all but on-demand-huge and prefetch-huge
    /// (they reserve 2 MiB pages for the peer: ask for them).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kernel,baseline,on-demand,prefetch,eager,kernel-tmpfs,on-demand-shared,prefetch-shared"
    )]
    pub configs: Vec<String>,
    /// Page-cache states to run. Default: warm,cold.
    #[arg(long, value_delimiter = ',', default_value = "warm,cold")]
    pub cache: Vec<String>,
    /// Instead of the configurations: N peers restored at once by one
    /// `faultline serve` (prefetch of the recorded set, warm), for each N
    /// given (e.g. 1,2,4,8), reporting the handler's RssAnon/RssFile.
    /// Uses the first --working-set.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<usize>,
    /// Serve faultline's configurations (on-demand, prefetch, eager) from
    /// this Redis store (`redis://HOST:PORT/NAME`, `unix:///PATH?name=NAME`
    /// or `redis+unix://...`): the memory file is uploaded there first,
    /// replacing a store of that name. The kernel and the baseline handler
    /// still read the file, and the peer checks bytes against it. "cold"
    /// then only drops the file's cache (Redis keeps its data in memory).
    #[arg(long)]
    pub store: Option<String>,
    /// `faultline serve --prefetch-helpers N` for every served
    /// configuration. Default: serve's default.
    #[arg(long)]
    pub prefetch_helpers: Option<usize>,
    /// Do not evict the CPU caches before each run (by default a buffer
    /// twice the last-level cache is read first, so no configuration's
    /// vCPUs find their lines cached by an earlier run or by the memory
    /// file's warm-up).
    #[arg(long)]
    pub keep_caches: bool,
}

const CONFIGS: [&str; 13] = [
    "kernel",
    "baseline",
    "on-demand",
    "prefetch",
    "eager",
    "kernel-tmpfs",
    "on-demand-shared",
    "prefetch-shared",
    "on-demand-huge",
    "prefetch-huge",
    "kernel-hugetlbfs",
    "on-demand-shared-huge",
    "prefetch-shared-huge",
];

/// Configurations that use the shared copy on hugetlbfs.
fn uses_huge_snapshot(cfg: &str) -> bool {
    cfg == "kernel-hugetlbfs" || cfg.ends_with("-shared-huge")
}

/// A hugetlbfs mount (2 MiB pages) holding the shared copy, unmounted on
/// drop.
struct HugeMount(PathBuf);

impl HugeMount {
    fn new(at: PathBuf) -> anyhow::Result<HugeMount> {
        std::fs::create_dir_all(&at)?;
        let st = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M", "none"])
            .arg(&at)
            .stderr(Stdio::null())
            .status()?;
        anyhow::ensure!(st.success(), "mount -t hugetlbfs failed ({st}; needs root)");
        Ok(HugeMount(at))
    }
    fn snap(&self) -> PathBuf {
        self.0.join("snap.mem")
    }
}

impl Drop for HugeMount {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.snap());
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Configurations that use the shared tmpfs copy.
fn uses_snapshot(cfg: &str) -> bool {
    cfg == "kernel-tmpfs" || cfg.ends_with("-shared")
}

/// How the peer's memory is backed.
enum Backing<'a> {
    /// Anonymous memory handed over to the handler at `socket`.
    Uffd(&'a Path),
    /// `MAP_PRIVATE` of a file (the kernel baseline), no handler.
    File(&'a Path),
    /// `MAP_PRIVATE` of the shared snapshot, handed over (shared mode).
    Shared(&'a Path, &'a Path),
    /// 2 MiB hugetlb memory handed over (copy mode).
    Huge(&'a Path),
    /// `MAP_PRIVATE` of a file on hugetlbfs (2 MiB pages), no handler.
    FileHuge(&'a Path),
    /// `MAP_PRIVATE` of the shared copy on hugetlbfs, handed over.
    SharedHuge(&'a Path, &'a Path),
}

/// How `faultline serve` serves the peer of a configuration.
#[derive(Clone, Copy)]
enum Mode<'a> {
    /// Anonymous 4 KiB memory, copied.
    Copy,
    /// The shared snapshot (`--shared`), `UFFDIO_CONTINUE`.
    Shared(&'a Path),
    /// 2 MiB hugetlb memory, copied.
    Huge,
    /// The shared copy on hugetlbfs, `UFFDIO_CONTINUE` of 2 MiB pages.
    SharedHuge(&'a Path),
}

impl<'a> Mode<'a> {
    fn of(cfg: &str, snap: &'a Path, hsnap: &'a Path) -> Mode<'a> {
        if cfg.ends_with("-shared") {
            Mode::Shared(snap)
        } else if cfg.ends_with("-shared-huge") {
            Mode::SharedHuge(hsnap)
        } else if cfg.ends_with("-huge") {
            Mode::Huge
        } else {
            Mode::Copy
        }
    }
}

/// The shared tmpfs copy of the memory file, removed on drop.
struct Snapshot(PathBuf);

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct Run {
    seconds: f64,
    median_ns: f64,
    p99_ns: f64,
    faults: u64,
    bytes_read: u64,
    /// serve's reading and mapping of the recorded set (prefetch), ms.
    prepare_ms: f64,
    /// The peer's private memory after the working set (anonymous and
    /// hugetlb), KiB.
    peer_anon_kib: u64,
    /// The hand-off's steps ([`STEPS`]), ms from the peer's handshake send
    /// (NaN: not taken by this configuration).
    steps: Vec<f64>,
    /// The vCPU threads' preemptions and sleeps while touching.
    preempted: u64,
    slept: u64,
}

/// The steps of a restore's hand-off, in the order they usually happen:
/// (column, JSON key, what it is). Times are ms from the peer's handshake
/// send (the kernel rows: from its mapping), stamped with `CLOCK_MONOTONIC`
/// by the peer and by serve.
const STEPS: [(&str, &str, &str); 14] = [
    (
        "accept",
        "accepted",
        "serve's listener accepted the connection (before the send: the peer connects first)",
    ),
    (
        "thread",
        "thread",
        "serve began handling it (on its listener thread, or a thread of its own)",
    ),
    ("recv", "received", "recvmsg returned the handshake"),
    ("adopt", "adopted", "parsed, userfaultfd adopted (fdinfo)"),
    (
        "check",
        "checked",
        "mode check ended (shared snapshot or anonymous)",
    ),
    ("built", "built", "the peer's regions set up"),
    ("queued", "queued", "prefetch queued"),
    ("serving", "serving", "handed to the handler threads"),
    (
        "vcpus",
        "vcpus",
        "the peer drew its working set, starts its vCPUs",
    ),
    ("1st touch", "first_touch", "the first vCPU touch began"),
    ("1st fault", "first_fault", "serve read the first fault"),
    (
        "1st pf",
        "first_prefetch",
        "the first prefetch ioctl finished",
    ),
    (
        "pf done",
        "prefetch_done",
        "the last prefetch ioctl finished",
    ),
    (
        "last touch",
        "last_touch",
        "the last working-set touch ended (the restore time)",
    ),
];

/// The hand-off steps of one run (see [`STEPS`]).
fn steps(p: &PeerReport, s: Option<&PeerSummary>) -> Vec<f64> {
    let at = |ns: u64| {
        if ns == 0 || p.sent_ns == 0 || ns == u64::MAX {
            f64::NAN
        } else {
            (ns as f64 - p.sent_ns as f64) / 1e6
        }
    };
    let h = s.map(|s| s.handoff).unwrap_or_default();
    [
        h.accepted_ns,
        h.thread_ns,
        h.received_ns,
        h.adopted_ns,
        h.checked_ns,
        h.built_ns,
        h.queued_ns,
        h.serving_ns,
        p.vcpus_ns,
        p.first_touch_ns,
        h.first_fault_ns,
        h.first_prefetch_ns,
        h.prefetch_done_ns,
        p.last_touch_ns,
    ]
    .into_iter()
    .map(at)
    .collect()
}

/// The median of the finite values (NaN when none).
fn median_finite(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs the bench.
pub fn run(ctx: &mut BenchCtx, a: &RestoreArgs) -> anyhow::Result<()> {
    if a.size < 8 << 20 || !a.size.is_multiple_of(4 << 20) {
        bail!("--size must be a multiple of 4 MiB, at least 8 MiB");
    }
    let tmp = a.dir.is_none();
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("faultline-restore-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let result = run_in(ctx, a, &dir);
    if tmp {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn run_in(ctx: &mut BenchCtx, a: &RestoreArgs, dir: &Path) -> anyhow::Result<()> {
    for c in &a.configs {
        if !CONFIGS.contains(&c.as_str()) {
            bail!(
                "unknown configuration {c:?} (known: {})",
                CONFIGS.join(", ")
            );
        }
    }
    for c in &a.cache {
        if c != "warm" && c != "cold" {
            bail!("unknown cache state {c:?} (warm, cold)");
        }
    }
    let mem = dir.join("mem");
    eprintln!("restore: writing a {} MiB memory file", a.size >> 20);
    write_mem(&mem, a.size)?;
    let all = dir.join("all.txt");
    let offs: Vec<u64> = (0..a.size as u64).step_by(4096).collect();
    faultline_serve::record::write(&all, &offs)?;
    if let Some(url) = &a.store {
        eprintln!("restore: uploading the memory file to {url}");
        let f = std::fs::File::open(&mem)?;
        let t = Instant::now();
        faultline_redis::RedisStore::put(
            url,
            faultline_redis::RedisConfig::default(),
            std::io::BufReader::new(f),
            a.size as u64,
            |_| {},
        )
        .with_context(|| format!("uploading the memory file to {url}"))?;
        eprintln!("restore: uploaded in {:.2} s", t.elapsed().as_secs_f64());
    }
    if !a.peers.is_empty() {
        return run_peers(ctx, a, dir, &mem);
    }
    // Hugetlb rows: a pool for the peer's 2 MiB pages (grown as root and
    // given back afterwards), or the rows are skipped with the reason.
    let mut configs = a.configs.clone();
    let mut _pool = None;
    let huge_pages = a.size as u64 / (2 << 20);
    // The shared copy on hugetlbfs stays in the pool, and a peer's
    // MAP_PRIVATE mapping of it reserves its size again.
    let need = if configs.iter().any(|c| uses_huge_snapshot(c)) {
        2 * huge_pages + 8
    } else {
        huge_pages + 4
    };
    if configs
        .iter()
        .any(|c| c.ends_with("-huge") || uses_huge_snapshot(c))
    {
        match faultline::testing::HugePool::get(need) {
            Ok(p) => _pool = Some(p),
            Err(why) => {
                println!("restore: hugetlb rows skipped: {why}");
                configs.retain(|c| !c.ends_with("-huge") && !uses_huge_snapshot(c));
            }
        }
    }
    let mut hmount = None;
    let mut populated: Vec<(&str, f64)> = Vec::new();
    if configs.iter().any(|c| uses_huge_snapshot(c)) {
        let made = HugeMount::new(dir.join("hugetlbfs")).and_then(|m| {
            warm(&mem)?;
            let store =
                faultline::FileStore::open_with(&mem, 0, faultline::store::FileAccess::Mmap)?;
            let (_, done) = faultline::SharedSnapshot::create(&m.snap(), &store, |_, _| {})?;
            Ok((m, done))
        });
        match made {
            Ok((m, done)) => {
                let ms = done.elapsed.as_secs_f64() * 1e3;
                eprintln!(
                    "restore: shared hugetlbfs copy written from a warm memory file in {ms:.1} ms"
                );
                populated.push(("warm memory file, to hugetlbfs", ms));
                hmount = Some(m);
            }
            Err(why) => {
                println!("restore: hugetlbfs shared rows skipped: {why:#}");
                configs.retain(|c| !uses_huge_snapshot(c));
            }
        }
    }
    let hsnap = hmount.as_ref().map_or_else(PathBuf::new, |m| m.snap());
    let a = &RestoreArgs {
        configs,
        ..a.clone()
    };
    let snap = Snapshot(PathBuf::from(format!(
        "/dev/shm/faultline-restore-{}.mem",
        std::process::id()
    )));
    if a.configs.iter().any(|c| uses_snapshot(c)) {
        let store = faultline::FileStore::open_with(&mem, 0, faultline::store::FileAccess::Mmap)?;
        for cache in ["cold", "warm"] {
            if cache == "cold" {
                drop_cache(&mem, is_root())?;
            } else {
                warm(&mem)?;
            }
            let _ = std::fs::remove_file(&snap.0);
            let (_, done) = faultline::SharedSnapshot::create(&snap.0, &store, |_, _| {})
                .context("writing the shared tmpfs copy")?;
            eprintln!(
                "restore: shared tmpfs copy written from a {cache} memory file in {:.1} ms",
                done.elapsed.as_secs_f64() * 1e3
            );
            let label = if cache == "cold" {
                "cold memory file"
            } else {
                "warm memory file"
            };
            populated.push((label, done.elapsed.as_secs_f64() * 1e3));
        }
    }
    let root = is_root();
    println!(
        "\nrestore: {} MiB memory file, {} vCPU threads, {} reps (medians, interleaved); cold cache: posix_fadvise(DONTNEED){}; CPU caches {}",
        a.size >> 20,
        a.vcpus,
        a.reps,
        if root { " + drop_caches" } else { " (not root: drop_caches skipped)" },
        if a.keep_caches {
            "kept between runs (--keep-caches)"
        } else {
            "evicted before each run"
        }
    );
    if let Some(url) = &a.store {
        println!("restore: faultline's configurations are served from {url} (kernel and baseline read the file)");
    }
    let steps = (a.working_set.len() * a.cache.len() * a.configs.len() * a.reps) as u64;
    let mut progress = ctx.progress(steps, "restore");
    let mut rows = Vec::new();
    let mut handoff_rows = Vec::new();
    let evictor = if a.keep_caches {
        Evictor(Mapping::anon(4096)?)
    } else {
        Evictor::new()?
    };
    let mut floors = Vec::new();
    // Per (working set, cache): prefetch's preparation of the record.
    let mut prepared: Vec<(String, f64)> = Vec::new();
    // Per (working set, cache): each configuration's median ms (plot).
    let mut groups: Vec<(String, Vec<(String, f64)>)> = Vec::new();
    for &ws in &a.working_set {
        let rec = dir.join(format!("ws{ws}.txt"));
        warm(&mem)?;
        let ws_bytes = ((a.size as f64 * ws / 100.0) as usize).max(2 << 20);
        let shared = snap.0.exists().then_some(snap.0.as_path());
        record(a, dir, &mem, ws, &rec)?;
        let hshared = (!hsnap.as_os_str().is_empty()).then_some(hsnap.as_path());
        let floor = progress.suspend(|| -> anyhow::Result<_> {
            let mut f = floor::measure(&mem, shared, ws_bytes, 2 << 20)?;
            // The recorded set's own runs: shared-mode prefetch's floor.
            let plan = faultline::PrefetchPlan::new(&faultline_serve::record::read(&rec)?);
            f.set_bytes = plan.pages() * 4096;
            if let Some(snap) = shared {
                (f.continue_set_s, f.set_runs) = floor::continue_set(snap, &plan, 1, false)?;
                f.continue_set_2t_s = floor::continue_set(snap, &plan, 2, false)?.0;
            }
            if let Some(h) = hshared {
                (f.continue_huge_set_s, f.huge_set_pages) = floor::continue_set(h, &plan, 1, true)?;
            }
            Ok(f)
        })?;
        floors.push((ws, floor));
        for cache in &a.cache {
            let cold = cache == "cold";
            let mut medians: Vec<(String, Run)> = Vec::new();
            // Reps interleaved (every configuration once, then again), so a
            // slow spell of the machine hits all of them alike.
            let mut all_runs: Vec<Vec<Run>> = a.configs.iter().map(|_| Vec::new()).collect();
            for rep in 0..a.reps.max(1) {
                for (cfg, runs) in a.configs.iter().zip(&mut all_runs) {
                    progress.step(&format!("ws {ws}% {cache} {cfg} {rep}"));
                    if cold {
                        drop_cache(&mem, root)?;
                    } else {
                        warm(&mem)?;
                    }
                    if !a.keep_caches {
                        evictor.evict();
                    }
                    runs.push(one(a, dir, &mem, ws, cfg, &rec, &all, &snap.0, &hsnap)?);
                }
            }
            for (cfg, runs) in a.configs.iter().zip(all_runs) {
                let med = |f: &dyn Fn(&Run) -> f64| {
                    let mut v: Vec<f64> = runs.iter().map(f).collect();
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                };
                let m = Run {
                    seconds: med(&|r| r.seconds),
                    median_ns: med(&|r| r.median_ns),
                    p99_ns: med(&|r| r.p99_ns),
                    faults: med(&|r| r.faults as f64) as u64,
                    bytes_read: med(&|r| r.bytes_read as f64) as u64,
                    prepare_ms: med(&|r| r.prepare_ms),
                    peer_anon_kib: med(&|r| r.peer_anon_kib as f64) as u64,
                    preempted: med(&|r| r.preempted as f64) as u64,
                    slept: med(&|r| r.slept as f64) as u64,
                    steps: (0..STEPS.len())
                        .map(|k| median_finite(runs.iter().map(|r| r.steps[k]).collect()))
                        .collect(),
                };
                medians.push((cfg.to_string(), m));
            }
            let mut bars: Vec<(String, f64)> = medians
                .iter()
                .map(|(c, m)| (c.clone(), m.seconds * 1e3))
                .collect();
            if !cold {
                bars.push((
                    "floor: UFFDIO_COPY of the set, 1 thread".into(),
                    floor.bytes as f64 / floor.copy_populated_bps * 1e3,
                ));
                if floor.continue_set_s > 0.0 {
                    bars.push((
                        "floor: UFFDIO_CONTINUE of the recorded set's runs, 1 thread".into(),
                        floor.continue_set_s * 1e3,
                    ));
                }
                if floor.continue_huge_set_s > 0.0 {
                    bars.push((
                        "floor: UFFDIO_CONTINUE of its 2 MiB pages (hugetlbfs)".into(),
                        floor.continue_huge_set_s * 1e3,
                    ));
                }
            }
            groups.push((format!("{ws}% {cache}"), bars));
            if let Some(m) = medians.iter().find(|m| m.0 == "prefetch") {
                prepared.push((format!("{ws}% {cache} prefetch"), m.1.prepare_ms));
            }
            let get = |n: &str| medians.iter().find(|m| m.0 == n).map(|m| &m.1);
            let ratio = |x: Option<&Run>, m: &Run| x.map(|x| x.seconds / m.seconds);
            let show = |r: Option<f64>| r.map_or("-".to_string(), fmt_ratio);
            let (base, kern, dem) = (get("baseline"), get("kernel"), get("on-demand"));
            let ktmp = get("kernel-tmpfs");
            for (cfg, m) in &medians {
                let s = Summary::from_ns(&mut [m.median_ns]);
                let op = if cfg.contains("-shared") {
                    "CONTINUE"
                } else if cfg.starts_with("kernel") {
                    "kernel"
                } else {
                    "COPY"
                };
                let mut rec = Record::new("restore", cfg, op, "read", &s)
                    .with("working_set_pct", ws)
                    .with("cache", cache.as_str())
                    .with(
                        "store",
                        match (cfg.as_str(), &a.store) {
                            (c, _) if uses_snapshot(c) => "tmpfs copy",
                            (c, _) if uses_huge_snapshot(c) => "hugetlbfs copy",
                            ("kernel" | "baseline", _) | (_, None) => "file",
                            (_, Some(url)) => url.as_str(),
                        },
                    )
                    .with("reps", a.reps as u64)
                    .with("seconds", m.seconds)
                    .with("vcpu_median_ns", m.median_ns)
                    .with("vcpu_p99_ns", m.p99_ns)
                    .with("demand_faults", m.faults)
                    .with("bytes_read", m.bytes_read);
                if !uses_huge_snapshot(cfg) {
                    rec = rec.with("peer_anon_kib", m.peer_anon_kib);
                }
                if m.prepare_ms.is_finite() {
                    rec = rec.with("prepare_ms", m.prepare_ms);
                }
                for ((_, key, _), ms) in STEPS.iter().zip(&m.steps) {
                    if ms.is_finite() {
                        rec = rec.with(&format!("handoff_{key}_ms"), *ms);
                    }
                }
                rec = rec
                    .with("vcpu_preempted", m.preempted)
                    .with("vcpu_slept", m.slept);
                let mut line = vec![format!("{ws}%"), cache.clone(), cfg.clone()];
                line.extend(m.steps.iter().map(|ms| {
                    if ms.is_finite() {
                        format!("{ms:.2}")
                    } else {
                        "-".into()
                    }
                }));
                line.push(m.preempted.to_string());
                line.push(m.slept.to_string());
                handoff_rows.push(line);
                if let Some(r) = ratio(base, m) {
                    rec = rec.with("speedup_vs_baseline", r);
                }
                if let Some(r) = ratio(kern, m) {
                    rec = rec.with("speedup_vs_kernel", r);
                }
                if let Some(r) = ratio(dem, m) {
                    rec = rec.with("speedup_vs_on_demand", r);
                }
                if let Some(r) = ratio(ktmp, m) {
                    rec = rec.with("speedup_vs_kernel_tmpfs", r);
                }
                ctx.report.push(rec);
                rows.push(vec![
                    format!("{ws}%"),
                    cache.clone(),
                    cfg.clone(),
                    format!("{:.1}", m.seconds * 1e3),
                    format!("{:.1}", m.median_ns / 1e3),
                    format!("{:.1}", m.p99_ns / 1e3),
                    m.faults.to_string(),
                    format!("{}", m.bytes_read >> 20),
                    // A hugetlbfs page-cache page mapped by one process
                    // counts as Private_Hugetlb: no private figure there.
                    if uses_huge_snapshot(cfg) {
                        "-".to_string()
                    } else {
                        format!("{}", m.peer_anon_kib >> 10)
                    },
                    show(ratio(base, m)),
                    show(ratio(kern, m)),
                    show(ratio(ktmp, m)),
                    show(ratio(dem, m)),
                ]);
            }
            if let (Some(pre), Some(dem)) = (get("prefetch"), dem) {
                rows.push(vec![
                    format!("{ws}%"),
                    cache.clone(),
                    "REAP (paper)".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    format!(
                        "ours: -{:.0}% (REAP -97%)",
                        100.0 * (1.0 - pre.faults as f64 / dem.faults.max(1) as f64)
                    ),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    format!("ours {} (REAP 3.70x)", fmt_ratio(dem.seconds / pre.seconds)),
                ]);
            }
        }
    }
    progress.finish();
    print_table(
        &[
            "ws",
            "cache",
            "config",
            "ms",
            "vCPU med us",
            "p99 us",
            "faults",
            "MiB read",
            "peer anon MiB",
            "vs baseline",
            "vs kernel",
            "vs kernel-tmpfs",
            "vs on-demand",
        ],
        &rows,
    );
    println!(
        "(ms: handshake to last working-set page; vs X: X's time / this time, higher is faster; faults: demand faults the handler read (kernel rows: the peer's minor faults, each mapping one or more pages); peer anon: the VM's private memory after the restore (RssAnon + private hugetlb), shared mode maps the one shared page cache instead)"
    );
    let mut head = vec!["ws", "cache", "config"];
    head.extend(STEPS.iter().map(|s| s.0));
    head.extend(["preempted", "slept"]);
    println!("\nwhere the restore time goes: ms from the peer's handshake send (kernel rows: from its mapping), medians; CLOCK_MONOTONIC stamps of the peer and of serve");
    print_table(&head, &handoff_rows);
    for (col, _, what) in STEPS {
        println!("  {col}: {what}");
    }
    println!("  preempted, slept: the vCPU threads' involuntary and voluntary context switches while touching (other threads took their CPU; they waited for a fault)");
    for (label, ms) in &prepared {
        println!(
            "{label}: serve read and mapped the recorded set in {ms:.1} ms from its own start (the peer starts with it; not a pause before the handshake)"
        );
    }
    if !populated.is_empty() {
        println!(
            "shared tmpfs copy ({} MiB), the one-time population of the shared page cache (not in the restore times above; cold rows drop the memory file's cache, the tmpfs copy stays):",
            a.size >> 20
        );
        for (cache, ms) in &populated {
            println!("  written from a {cache}: {ms:.1} ms");
            let s = Summary::from_ns(&mut [ms * 1e6]);
            ctx.report.push(
                Record::new("restore-populate", "shared tmpfs copy", "write", "read", &s)
                    .with("cache", *cache)
                    .with("bytes", a.size as u64)
                    .with("ms", *ms),
            );
        }
    }
    print_floors(ctx, &floors);
    let names: Vec<String> = groups.iter().map(|g| g.0.clone()).collect();
    let mut series: Vec<(String, Vec<f64>)> = Vec::new();
    for (_, bars) in &groups {
        for (cfg, _) in bars {
            if !series.iter().any(|s| &s.0 == cfg) {
                series.push((cfg.clone(), Vec::new()));
            }
        }
    }
    for (name, values) in &mut series {
        *values = groups
            .iter()
            .map(|(_, bars)| bars.iter().find(|b| &b.0 == name).map_or(0.0, |b| b.1))
            .collect();
    }
    let title = format!(
        "restore: handshake to last working-set page, {} MiB, median of {}",
        a.size >> 20,
        a.reps
    );
    ctx.figure("restore_ms", |dir, name| {
        crate::harness::plot::group_bars(dir, name, &title, "ms (log scale)", &names, &series)
    })
}

/// The copy floor per working set: what moving its bytes costs at best.
fn print_floors(ctx: &mut BenchCtx, floors: &[(f64, floor::Floor)]) {
    let ms = |bytes: usize, bps: f64| format!("{:.1}", bytes as f64 / bps * 1e3);
    let gbs = |bps: f64| format!("{:.2}", bps / 1e9);
    let mut rows = Vec::new();
    for (ws, f) in floors {
        let cases = [
            ("memcpy", f.memcpy_bps),
            ("MADV_POPULATE_READ of the source", f.populate_bps),
            ("UFFDIO_COPY, source populated", f.copy_populated_bps),
            ("UFFDIO_COPY, source not populated", f.copy_unpopulated_bps),
            ("UFFDIO_COPY, populated, 2 threads", f.copy_populated_2t_bps),
            ("UFFDIO_COPY, populated, 4 KiB per ioctl", f.copy_page_bps),
            ("UFFDIO_CONTINUE (shared tmpfs copy)", f.continue_bps),
            ("UFFDIO_CONTINUE, 2 threads", f.continue_2t_bps),
            ("UFFDIO_CONTINUE, 4 KiB per ioctl", f.continue_page_bps),
        ];
        let set = [
            (
                format!(
                    "UFFDIO_CONTINUE of the recorded set's {} runs (tmpfs)",
                    f.set_runs
                ),
                f.continue_set_s,
                f.set_bytes,
            ),
            (
                format!("the same, 2 threads ({} runs)", f.set_runs),
                f.continue_set_2t_s,
                f.set_bytes,
            ),
            (
                format!(
                    "UFFDIO_CONTINUE of the {} huge pages the set touches (hugetlbfs)",
                    f.huge_set_pages
                ),
                f.continue_huge_set_s,
                f.huge_set_pages << 21,
            ),
        ];
        for (what, secs, bytes) in set.into_iter().filter(|c| c.1 > 0.0) {
            let bps = bytes as f64 / secs;
            let s = Summary::from_ns(&mut [secs * 1e9]);
            ctx.report.push(
                Record::new("restore-floor", &what, "CONTINUE", "read", &s)
                    .with("working_set_pct", *ws)
                    .with("bytes", bytes as u64)
                    .with("ms", secs * 1e3)
                    .with("bytes_per_second", bps),
            );
            rows.push(vec![
                format!("{ws}%"),
                what,
                format!("{}", bytes >> 20),
                gbs(bps),
                format!("{:.2}", secs * 1e3),
            ]);
        }
        for (what, bps) in cases.into_iter().filter(|c| c.1 > 0.0) {
            let s = Summary::from_ns(&mut [f.bytes as f64 / bps * 1e9]);
            ctx.report.push(
                Record::new("restore-floor", what, "COPY", "read", &s)
                    .with("working_set_pct", *ws)
                    .with("bytes", f.bytes as u64)
                    .with("run_bytes", f.run_bytes as u64)
                    .with("bytes_per_second", bps),
            );
            rows.push(vec![
                format!("{ws}%"),
                what.to_string(),
                format!("{}", f.bytes >> 20),
                gbs(bps),
                ms(f.bytes, bps),
            ]);
        }
    }
    print_table(
        &["ws", "floor (warm, one process)", "MiB", "GB/s", "ms"],
        &rows,
    );
    println!("(the working set's bytes moved in 2 MiB runs: the least any copying handler spends; CONTINUE: mapped from the shared page cache, no copy)");
}

/// `--peers`: one round per N (see `restore_peers.rs`).
fn run_peers(ctx: &mut BenchCtx, a: &RestoreArgs, dir: &Path, mem: &Path) -> anyhow::Result<()> {
    let ws = *a.working_set.first().context("--working-set is empty")?;
    let rec = dir.join(format!("ws{ws}.txt"));
    warm(mem)?;
    record(a, dir, mem, ws, &rec)?;
    // Shared mode too when asked for (prefetch-shared among --configs, as
    // by default): the clones map one tmpfs copy.
    let snap = a.configs.iter().any(|c| c == "prefetch-shared").then(|| {
        Snapshot(PathBuf::from(format!(
            "/dev/shm/faultline-restore-{}.mem",
            std::process::id()
        )))
    });
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
        let made = faultline::testing::HugePool::get(huge_pages + 8)
            .map_err(|why| anyhow::anyhow!(why))
            .and_then(|pool| {
                let m = HugeMount::new(dir.join("hugetlbfs"))?;
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
                match faultline::testing::HugePool::get(n.max(1) as u64 * huge_pages + 8) {
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
            rounds.push(peers::round(
                &exe()?,
                dir,
                mem,
                &rec,
                shared,
                huge,
                n.max(1),
                ws,
                a.vcpus,
            )?);
        }
    }
    progress.finish();
    peers::report(ctx, ws, &rounds)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|v| v.split_whitespace().next() == Some("0"))
            })
        })
        .unwrap_or(false)
}

fn write_mem(path: &Path, size: usize) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..size >> 20 {
        for w in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&chunk)?;
    }
    f.into_inner()?.sync_all()?;
    Ok(())
}

/// Pushes the working set's cache lines out of the CPU caches before each
/// run: every configuration's vCPUs start from memory, not from lines an
/// earlier run (or `warm`, for the memory file) left in a last-level cache
/// that here is hundreds of MiB.
struct Evictor(Mapping);

impl Evictor {
    fn new() -> anyhow::Result<Evictor> {
        // Twice the last-level cache (sysfs; 64 MiB when unknown), at most
        // 2 GiB.
        let llc = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
            .ok()
            .and_then(|s| s.trim().strip_suffix('K')?.parse::<usize>().ok())
            .map_or(32 << 20, |k| k << 10);
        let len = (2 * llc).clamp(64 << 20, 2 << 30);
        let m = Mapping::anon(len)?;
        m.advise(0, len, mem::Advice::PopulateWrite)?;
        Ok(Evictor(m))
    }

    fn evict(&self) {
        let mut sum = 0u64;
        for off in (0..self.0.len()).step_by(64) {
            // SAFETY: inside a live, populated anonymous mapping.
            sum = sum
                .wrapping_add(unsafe { std::ptr::read_volatile(self.0.as_ptr().add(off)) } as u64);
        }
        std::hint::black_box(sum);
    }
}

fn warm(path: &Path) -> anyhow::Result<()> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len() as usize;
    let m = Mapping::file_readonly(&f, len, 0)?;
    let mut sum = 0u64;
    for off in (0..len).step_by(4096) {
        // SAFETY: inside a live read-only mapping of the file.
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(m.as_ptr().add(off)) } as u64);
    }
    std::hint::black_box(sum);
    Ok(())
}

fn drop_cache(path: &Path, root: bool) -> anyhow::Result<()> {
    let f = std::fs::File::open(path)?;
    mem::fadvise_dontneed(&f)?;
    if root {
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
    }
    Ok(())
}

fn exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("locating the faultline binary")
}

/// Runs the peer (against `socket`, or the file backend), returns its report.
fn peer(
    a: &RestoreArgs,
    dir: &Path,
    mem: &Path,
    ws: f64,
    backing: Backing<'_>,
) -> anyhow::Result<PeerReport> {
    let out = dir.join("peer.json");
    let _ = std::fs::remove_file(&out);
    let mut cmd = Command::new(exe()?);
    cmd.arg("peer")
        .arg("--mem")
        .arg(mem)
        .arg("--json")
        .arg(&out);
    cmd.args([
        "--threads",
        &a.vcpus.to_string(),
        "--working-set",
        &ws.to_string(),
    ]);
    match backing {
        Backing::Uffd(s) => cmd.arg("--socket").arg(s),
        Backing::File(f) => cmd.args(["--backend", "file"]).arg("--map-file").arg(f),
        Backing::Shared(s, f) => cmd
            .arg("--socket")
            .arg(s)
            .args(["--backend", "shared"])
            .arg("--map-file")
            .arg(f),
        Backing::Huge(s) => cmd.arg("--socket").arg(s).arg("--huge"),
        Backing::FileHuge(f) => cmd
            .args(["--backend", "file", "--huge", "--map-file"])
            .arg(f),
        Backing::SharedHuge(s, f) => cmd
            .arg("--socket")
            .arg(s)
            .args(["--backend", "shared", "--huge", "--map-file"])
            .arg(f),
    };
    let st = run_bounded(cmd, Duration::from_secs(600))?;
    if !st {
        bail!("the peer failed (see its messages above)");
    }
    Ok(serde_json::from_str(&std::fs::read_to_string(&out)?)?)
}

fn run_bounded(mut cmd: Command, limit: Duration) -> anyhow::Result<bool> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn()?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s.success());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Starts `faultline serve` with `extra`, runs one peer, returns both sides.
fn served(
    a: &RestoreArgs,
    dir: &Path,
    mem: &Path,
    ws: f64,
    extra: &[&str],
    mode: Mode<'_>,
) -> anyhow::Result<(PeerReport, PeerSummary, f64)> {
    let sock = dir.join("serve.sock");
    let json = dir.join("serve.json");
    let _ = std::fs::remove_file(&sock);
    let mut cmd = Command::new(exe()?);
    cmd.arg("serve").arg("--socket").arg(&sock);
    match &a.store {
        Some(url) => cmd.arg("--store").arg(url),
        None => cmd.arg("--mem").arg(mem),
    };
    cmd.arg("--json")
        .arg(&json)
        .args(["--peers", "1", "--timeout", "60"]);
    cmd.args(extra);
    if let Some(n) = a.prefetch_helpers {
        cmd.args(["--prefetch-helpers", &n.to_string()]);
    }
    if let Mode::Shared(snap) | Mode::SharedHuge(snap) = mode {
        cmd.arg("--shared").arg(snap);
    }
    let err = dir.join("serve.err");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err)?)
        .spawn()?;
    let backing = match mode {
        Mode::Shared(snap) => Backing::Shared(&sock, snap),
        Mode::Huge => Backing::Huge(&sock),
        Mode::SharedHuge(snap) => Backing::SharedHuge(&sock, snap),
        Mode::Copy => Backing::Uffd(&sock),
    };
    let rep = peer(a, dir, mem, ws, backing);
    let deadline = Instant::now() + Duration::from_secs(60);
    let st = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("faultline serve did not exit");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let rep = rep?;
    if !st.success() {
        bail!("faultline serve failed");
    }
    let sums: Vec<PeerSummary> = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let s = sums.into_iter().next().context("serve reported no peer")?;
    Ok((rep, s, prepared_ms(&std::fs::read_to_string(&err)?)))
}

/// The ms `serve` said reading and mapping its recorded set took (from its
/// start, concurrent with the peer's start and restore).
fn prepared_ms(log: &str) -> f64 {
    log.lines()
        .find(|l| l.contains("prepared the recorded set"))
        .and_then(|l| l.rsplit(" in ").next())
        .and_then(|t| t.trim_end_matches(" ms").parse().ok())
        .unwrap_or(f64::NAN)
}

fn record(a: &RestoreArgs, dir: &Path, mem: &Path, ws: f64, rec: &Path) -> anyhow::Result<()> {
    served(
        a,
        dir,
        mem,
        ws,
        &["--record", rec.to_str().context("path")?],
        Mode::Copy,
    )?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn one(
    a: &RestoreArgs,
    dir: &Path,
    mem: &Path,
    ws: f64,
    cfg: &str,
    rec: &Path,
    all: &Path,
    snap: &Path,
    hsnap: &Path,
) -> anyhow::Result<Run> {
    let from = |p: PeerReport, faults: u64, bytes: u64| Run {
        steps: steps(&p, None),
        preempted: p.vcpu_preempted,
        slept: p.vcpu_slept,
        seconds: p.seconds,
        median_ns: p.median_ns as f64,
        p99_ns: p.p99_ns as f64,
        faults,
        bytes_read: bytes,
        prepare_ms: f64::NAN,
        peer_anon_kib: p.rss_anon_kib + p.hugetlb_kib,
    };
    Ok(match cfg {
        "kernel" | "kernel-tmpfs" | "kernel-hugetlbfs" => {
            let backing = match cfg {
                "kernel" => Backing::File(mem),
                "kernel-tmpfs" => Backing::File(snap),
                _ => Backing::FileHuge(hsnap),
            };
            let p = peer(a, dir, mem, ws, backing)?;
            // The faults the kernel took (each may map several pages).
            let (faults, n) = (p.minor_faults, p.pages as u64);
            from(p, faults, n * 4096)
        }
        "baseline" => {
            let sock = dir.join("base.sock");
            let _ = std::fs::remove_file(&sock);
            let listener = UnixListener::bind(&sock)?;
            let m = mem.to_path_buf();
            let h = std::thread::spawn(move || baseline_handler(listener, &m));
            let p = peer(a, dir, mem, ws, Backing::Uffd(&sock));
            let faults = h
                .join()
                .map_err(|_| anyhow::anyhow!("baseline handler panicked"))??;
            from(p?, faults, faults * 4096)
        }
        "on-demand" | "on-demand-shared" | "on-demand-huge" | "on-demand-shared-huge" => {
            let (p, s, _) = served(a, dir, mem, ws, &[], Mode::of(cfg, snap, hsnap))?;
            Run {
                steps: steps(&p, Some(&s)),
                ..from(p, s.faults, s.bytes_read)
            }
        }
        "prefetch" | "eager" | "prefetch-shared" | "prefetch-huge" | "prefetch-shared-huge" => {
            let list = if cfg == "eager" { all } else { rec };
            let (p, s, prepare_ms) = served(
                a,
                dir,
                mem,
                ws,
                &["--prefetch", list.to_str().context("path")?],
                Mode::of(cfg, snap, hsnap),
            )?;
            Run {
                prepare_ms,
                steps: steps(&p, Some(&s)),
                ..from(p, s.faults, s.bytes_read)
            }
        }
        other => bail!("unknown configuration {other}"),
    })
}

/// A handler as Firecracker's example writes it: one thread, one page per
/// fault, `UFFDIO_COPY` from a mapping of the file. Returns the faults
/// served.
fn baseline_handler(listener: UnixListener, mem: &Path) -> anyhow::Result<u64> {
    listener.set_nonblocking(false)?;
    let (conn, _) = listener.accept()?;
    let mut buf = vec![0u8; 1 << 16];
    let got = sock::recv_with_fds(conn.as_fd(), &mut buf, false)?;
    let regions = faultline_serve::handshake::parse(&buf[..got.bytes])?;
    let fd = got
        .fds
        .into_iter()
        .next()
        .context("no userfaultfd attached")?;
    let uffd = Uffd::adopt(fd);
    let file = std::fs::File::open(mem)?;
    let len = file.metadata()?.len() as usize;
    let map = Mapping::file_readonly(&file, len, 0)?;
    let mut msgs = [UffdMsg::ZERO; 1];
    let mut faults = 0u64;
    loop {
        let mut fds = [
            PollFd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&uffd),
                events: events::IN,
                revents: 0,
            },
            PollFd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&conn),
                events: events::RDHUP,
                revents: 0,
            },
        ];
        poll::poll(&mut fds, 1000)?;
        if fds[1].revents != 0 {
            return Ok(faults);
        }
        if uffd.read_msgs(&mut msgs)? == 0 {
            continue;
        }
        if let Msg::PageFault { addr, .. } = msgs[0].decode() {
            faults += 1;
            let page = addr & !4095;
            let r = regions
                .iter()
                .find(|r| page >= r.base && page < r.base + r.len as u64)
                .context("fault outside the regions")?;
            let off = r.store_offset + (page - r.base);
            loop {
                // SAFETY: `off + 4096` lies inside the file mapping (the
                // regions were laid out from it).
                let out = unsafe { uffd.copy(page, map.as_ptr().add(off as usize), 4096, 0) }?;
                if out != Outcome::Retry {
                    break;
                }
            }
        }
    }
}
