//! The options of `faultline bench restore` and its configurations' names.

use std::path::PathBuf;

/// Options of `faultline bench restore`.
#[derive(clap::Args, Clone, Debug)]
pub struct RestoreArgs {
    /// Bytes of the memory file (made in the bench's directory, see
    /// --dir; `256M`, `1GiB` also read): a multiple of 4 MiB from 8 MiB
    /// to what MemAvailable holds. Default 1 GiB.
    #[arg(long, default_value_t = 1 << 30, value_parser = memory_size)]
    pub size: usize,
    /// Working sets, percent of memory (each more than 0, at most 100).
    #[arg(long, default_value = "10,30", value_delimiter = ',', value_parser = faultline_cli_support::flags::float(0.0, 100.0, true))]
    pub working_set: Vec<f64>,
    /// Working-set patterns: `clustered` (70% in seeded clusters of 8-64
    /// pages, the rest scattered, page i on vCPU i % vCPUs) and `sweep`
    /// (the first pages of memory in address order, each vCPU sweeping
    /// its own share: a guest re-reading its memory). Default both.
    #[arg(long, value_delimiter = ',', default_value = "clustered,sweep")]
    pub pattern: Vec<String>,
    /// vCPU threads of the peer (1 to the threads this machine can still
    /// start).
    #[arg(long, default_value_t = 2, value_parser = faultline_cli_support::flags::threads(1))]
    pub vcpus: usize,
    /// Repetitions per configuration (medians are reported; 1 to 1000).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
    /// An existing directory on the file system to measure: the bench
    /// makes its files (the memory file, sockets, records) in a new
    /// subdirectory of it, faultline-restore-PID, removed afterwards (and
    /// on SIGINT, SIGTERM or SIGHUP; a killed run's by the next run), and
    /// touches nothing else in it. Default: the system's temporary
    /// directory ($TMPDIR, else /tmp).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Configurations to run (the ratios need kernel, baseline and
    /// on-demand). Default: the eight below; the others are asked for by
    /// name: on-demand-poll (serve's handler
    /// sleeping in poll(2) between faults, as before the adaptive engine),
    /// on-demand-workers (serve --engine workers --threads 2: one peer's
    /// faults on two handler threads), on-demand-per-cpu (serve --engine
    /// per-cpu: a handler thread asleep on each CPU, the faulting vCPU's
    /// own reads its fault), on-demand-per-cpu-w4 and
    /// on-demand-per-cpu-adaptive (per-cpu with --fault-around-initial 4,
    /// or with --adaptive-window), on-demand-per-cpu-shared and
    /// on-demand-per-cpu-shared-huge (per-cpu in shared mode, on tmpfs or
    /// hugetlbfs), on-demand-wake-first (serve
    /// --wake-first), on-demand-single (serve --fault-around-initial 1:
    /// an isolated fault installs its page alone), on-demand-wN (serve
    /// --fault-around-initial N, N 4, 8 or 32), on-demand-wN-shared (the same
    /// in shared mode, N 16, 32 or 64), on-demand-adaptive and
    /// on-demand-adaptive-shared (serve --adaptive-window: the isolated
    /// window sized from the evidence), on-demand-workers-adaptive (both:
    /// --engine workers --threads 2 --adaptive-window),
    /// on-demand-run-ahead and on-demand-run-ahead-shared (serve
    /// --run-ahead 4M: a populator 4 MiB ahead of each stream), prefetch-idle
    /// (prefetch in SCHED_IDLE), on-demand-huge, prefetch-huge,
    /// kernel-hugetlbfs, on-demand-shared-huge and prefetch-shared-huge
    /// (they reserve 2 MiB pages for the peer), and the
    /// dirty-tracked on-demand-tracked, on-demand-tracked-async and
    /// prefetch-tracked (serve --track-dirty; see --write-set), and
    /// hand-back-shared, hand-back-shared-huge (serve --shared
    /// --hand-back: the peer's faults are the kernel's, from the shared
    /// copy; on a tmpfs mounted huge=always it maps 2 MiB a fault).
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
    /// Each 1 to the threads this machine can still start.
    #[arg(long, value_delimiter = ',', value_parser = faultline_cli_support::flags::threads(1))]
    pub peers: Vec<usize>,
    /// Serve faultline's configurations (on-demand, prefetch, eager) from
    /// this Redis store (`redis://HOST:PORT#NAME`, `redis+unix:///PATH#NAME`
    /// or `unix:///PATH#NAME`): the memory file is uploaded there first,
    /// replacing a store of that name. The kernel and the baseline handler
    /// still read the file, and the peer checks bytes against it. "cold"
    /// then only drops the file's cache (Redis keeps its data in memory).
    #[arg(long)]
    pub store: Option<String>,
    /// `faultline serve --prefetch-helpers N` for every served
    /// configuration (0 to the threads this machine can still start).
    /// Default: serve's default.
    #[arg(long, value_parser = faultline_cli_support::flags::threads(0))]
    pub prefetch_helpers: Option<usize>,
    /// `faultline serve --prefetch-chunk SIZE` for every served
    /// configuration. Default: serve's default (2M).
    #[arg(long, value_parser = faultline_cli_support::flags::byte_size(4096, 64 << 20, 4096))]
    pub prefetch_chunk: Option<usize>,
    /// `faultline serve --prefetch-idle` (helpers under SCHED_IDLE) for
    /// every served configuration.
    #[arg(long)]
    pub prefetch_idle: bool,
    /// Start each served configuration's peer this many milliseconds
    /// after its `faultline serve`, as a platform that starts the handler
    /// ahead of the restore does: serve reads (and maps) the recorded set
    /// meanwhile, so a cold prefetch finds it read. The restore is still
    /// timed from the hand-off. Default 0: the peer starts with serve.
    #[arg(long, default_value_t = 0, value_parser = faultline_cli_support::flags::range_u64(0, 60_000))]
    pub serve_lead_ms: u64,
    /// The peer's vCPUs compute (spin) this many microseconds after each
    /// touch, keeping every CPU busy as a booting guest does (`faultline
    /// peer --compute-us`). Default 0: touch only.
    #[arg(long, default_value_t = 0)]
    pub compute_us: u64,
    /// The peer's vCPUs are KVM vCPUs (`faultline peer --kvm`, needs
    /// /dev/kvm): a guest reads the working set, so every fault is KVM's
    /// (an EPT violation resolved by `get_user_pages` in the kernel), as a
    /// real VMM's guest's is. No per-touch latencies or phases then (the
    /// guest is not timed page by page); not with --compute-us. In the
    /// huge-page configurations the guest's memory is 2 MiB hugetlb
    /// pages, which KVM maps 2 MiB at a time.
    #[arg(long, conflicts_with = "compute_us")]
    pub kvm: bool,
    /// Do not evict the CPU caches before each run (by default a buffer
    /// twice the last-level cache is read first, so no configuration's
    /// vCPUs find their lines cached by an earlier run or by the memory
    /// file's warm-up).
    #[arg(long)]
    pub keep_caches: bool,
    /// Do not take the phase samples of served configurations (by
    /// default serve keeps TSC stamps of its last 4096 faults and the peer
    /// of its vCPUs' last 4096 slow touches each, joined into the
    /// phase table: message read, batch, store read, copy, wake, return).
    #[arg(long)]
    pub no_phases: bool,
    /// Add the `on-demand-takeover` row (after `on-demand`, added if
    /// missing): serve `--takeover` killed mid-restore (at half the
    /// faults of the same repetition's `on-demand` run) and the same
    /// command started again; its restore time beside `on-demand`'s, and
    /// the time from the kill to the first fault the new serve reads (a
    /// table of its own, `--json`, the figure `restore_takeover`).
    #[arg(long)]
    pub takeover: bool,
    /// After its restore the peer writes the first byte of a seeded PCT%
    /// of all pages (`faultline peer --write-set`, working set or not),
    /// timing each first write as its vCPU threads see it: the first-write
    /// table, beside the untracked configurations of the same run.
    /// Default: 2 when a `-tracked` configuration runs, else none.
    #[arg(long, value_parser = faultline_cli_support::flags::float(0.0, 100.0, true))]
    pub write_set: Option<f64>,
}

/// Every configuration `--configs` accepts.
pub const CONFIGS: [&str; 39] = [
    "kernel",
    "baseline",
    "on-demand",
    "on-demand-poll",
    "on-demand-workers",
    "on-demand-per-cpu",
    "on-demand-per-cpu-w4",
    "on-demand-per-cpu-adaptive",
    "on-demand-per-cpu-shared",
    "on-demand-per-cpu-shared-huge",
    "on-demand-wake-first",
    "on-demand-single",
    "on-demand-w4",
    "on-demand-w8",
    "on-demand-w32",
    "on-demand-adaptive",
    "on-demand-w16-shared",
    "on-demand-w32-shared",
    "on-demand-w64-shared",
    "on-demand-adaptive-shared",
    "on-demand-workers-adaptive",
    "on-demand-run-ahead",
    "on-demand-run-ahead-shared",
    "prefetch",
    "prefetch-idle",
    "eager",
    "kernel-tmpfs",
    "on-demand-shared",
    "prefetch-shared",
    "hand-back-shared",
    "on-demand-huge",
    "prefetch-huge",
    "kernel-hugetlbfs",
    "on-demand-shared-huge",
    "prefetch-shared-huge",
    "hand-back-shared-huge",
    "on-demand-tracked",
    "on-demand-tracked-async",
    "prefetch-tracked",
];

/// Patterns `--pattern` accepts.
pub const PATTERNS: [&str; 2] = ["clustered", "sweep"];

/// Configurations served with dirty tracking (`serve --track-dirty`):
/// `on-demand-tracked` and `prefetch-tracked` (each install
/// write-protected, a first write a write-protect fault through serve),
/// `on-demand-tracked-async` (a peer with `UFFD_FEATURE_WP_ASYNC`: the
/// kernel un-protects a written page itself; serve reads the set from its
/// page tables on SIGUSR1 while it holds).
pub fn tracks_dirty(cfg: &str) -> bool {
    cfg.contains("-tracked")
}

/// The untracked configuration a tracked one is compared with.
pub fn untracked(cfg: &str) -> &str {
    cfg.split("-tracked").next().unwrap_or(cfg)
}

/// Configurations that use the shared copy on hugetlbfs.
pub fn uses_huge_snapshot(cfg: &str) -> bool {
    cfg == "kernel-hugetlbfs" || cfg.ends_with("-shared-huge")
}

/// Configurations that use the shared tmpfs copy.
pub fn uses_snapshot(cfg: &str) -> bool {
    cfg == "kernel-tmpfs" || cfg.ends_with("-shared")
}

/// `--size`: a multiple of 4 MiB from 8 MiB to what `MemAvailable` holds
/// (the memory file lives in the page cache or on tmpfs, and every served
/// configuration maps all of it).
fn memory_size(s: &str) -> Result<usize, String> {
    use faultline_cli_support::flags;
    const STEP: u64 = 4 << 20;
    let v = flags::parse_bytes(s)?;
    let avail = faultline_cli_support::mem_available().unwrap_or(u64::MAX);
    let hi = (avail / STEP * STEP).max(8 << 20);
    if !(8 << 20..=hi).contains(&v) {
        let why = format!(
            "bytes, a multiple of {STEP}; MemAvailable is {}",
            flags::fmt_bytes(avail)
        );
        return Err(flags::range_error(8u64 << 20, hi, &why));
    }
    if v % STEP != 0 {
        return Err(format!(
            "{v} is not a multiple of {STEP} (4 MiB; {})",
            flags::range_error(8u64 << 20, hi, "")
        ));
    }
    usize::try_from(v).map_err(|_| format!("{v} does not fit this machine's address space"))
}

/// A working set's name in tables: `10%`, `10% sweep`.
pub fn ws_label((ws, pattern): (f64, &str)) -> String {
    match pattern {
        "clustered" => format!("{ws}%"),
        p => format!("{ws}% {p}"),
    }
}
