//! What `faultline-peer` (and the hidden `faultline peer`) is asked to do.

use std::path::PathBuf;

use clap::Args;

use crate::handshake::Variant;

/// Bad input the peer can send (tests of the handler's refusals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Bad {
    /// Malformed JSON.
    Json,
    /// No descriptor attached.
    NoFd,
    /// Two regions overlapping in the address space.
    Overlap,
    /// A region past the end of the memory file.
    PastEnd,
    /// A page size the handler refuses (64 KiB).
    PageSize,
    /// A valid handshake sent twice (the peer then runs normally).
    Twice,
    /// Only the first region declared (both registered): the peer then
    /// runs normally, and its first fault in the second region is one the
    /// handler cannot serve.
    Undeclared,
}

/// How the working set is laid out and shared between the vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pattern {
    /// 70% in seeded clusters of 8-64 pages, the rest scattered; page `i`
    /// of the set on vCPU `i % threads`.
    Clustered,
    /// The first pages of memory in address order (a guest re-reading its
    /// memory); each vCPU sweeps its own contiguous share.
    Sweep,
}

/// Where the peer's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A userfaultfd handed to the handler (Firecracker's `Uffd` backend).
    Uffd,
    /// The memory file (or --map-file) mapped `MAP_PRIVATE` (Firecracker's
    /// `File` backend).
    File,
    /// Shared (zero-copy) mode: the snapshot's tmpfs copy (--map-file, made
    /// by `faultline serve --shared`) mapped `MAP_PRIVATE`, registered
    /// MISSING|MINOR with `UFFD_FEATURE_MINOR_SHMEM` (with --huge: a copy
    /// on hugetlbfs, `MINOR_HUGETLBFS`), handed over like `uffd`.
    Shared,
}

/// `faultline peer` arguments.
#[derive(Args, Debug, Clone)]
pub struct PeerArgs {
    /// The handler's socket (required with the uffd backend).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The memory file (to compare every byte with).
    #[arg(long)]
    pub mem: PathBuf,
    /// Region sizes in bytes, comma separated; laid out back to back in
    /// the file. Default: the file split in two halves (rounded to pages).
    #[arg(long, value_delimiter = ',')]
    pub regions: Vec<usize>,
    /// Bytes of unmapped gap between regions in the address space.
    #[arg(long, default_value_t = 2 << 20)]
    pub gap: usize,
    /// 2 MiB hugetlb pages (MAP_HUGETLB) instead of 4 KiB anonymous memory.
    #[arg(long)]
    pub huge: bool,
    /// Handshake field variant.
    #[arg(long, value_enum, default_value_t = Variant::PageSize)]
    pub variant: Variant,
    /// vCPU threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Working set, percent of memory.
    #[arg(long, default_value_t = 20.0)]
    pub working_set: f64,
    /// How the working set is drawn.
    #[arg(long, value_enum, default_value_t = Pattern::Clustered)]
    pub pattern: Pattern,
    /// Seed of the working set.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// This restore's own variation of the working set (restores of one
    /// snapshot touch mostly, not exactly, the same pages): with
    /// --run-seed, drop this percentage of the seed's pages and touch as
    /// many others instead, and move each page up to 64 places in the
    /// touch order. Default 0 (the seed's set as it is).
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,
    /// Microseconds each vCPU thread computes (spins) after each touch, as
    /// a booting guest keeps its CPUs busy between faults. Default 0 (touch
    /// only).
    #[arg(long, default_value_t = 0)]
    pub compute_us: u64,
    /// Seed of --jitter's variation.
    #[arg(long, default_value_t = 0)]
    pub run_seed: u64,
    /// After the working set, read every page of every region and compare
    /// it with the file (else only the working set is compared).
    #[arg(long)]
    pub verify_all: bool,
    /// After the working set, MADV_DONTNEED the first half of the last
    /// region and expect zeros there.
    #[arg(long)]
    pub balloon: bool,
    /// After --balloon's drop, say "ballooned" and sleep this many ms
    /// before reading the range back (tests kill the handler there).
    #[arg(long, default_value_t = 0)]
    pub balloon_pause_ms: u64,
    /// While the vCPUs run, MADV_DONTNEED the last quarter of the last
    /// region this many times (reading it between drops); then expect
    /// zeros there.
    #[arg(long, default_value_t = 0)]
    pub storm: usize,
    /// Send this bad input instead of a valid handshake.
    #[arg(long, value_enum)]
    pub bad: Option<Bad>,
    /// Stop (sleep --pause-ms) after touching this percentage of the
    /// working set (tests kill the peer or the handler there).
    #[arg(long)]
    pub pause_at: Option<f64>,
    /// Stop (sleep --pause-ms, saying "paused writing") after the first
    /// vCPU thread wrote this many of its --write-set pages (tests kill
    /// the handler there).
    #[arg(long)]
    pub write_pause_after: Option<usize>,
    /// How long --pause-at sleeps, ms. Default 60000.
    #[arg(long, default_value_t = 60_000)]
    pub pause_ms: u64,
    /// Memory backend.
    #[arg(long, value_enum, default_value_t = Backend::Uffd)]
    pub backend: Backend,
    /// The file the `file` and `shared` backends map (default: --mem).
    #[arg(long)]
    pub map_file: Option<PathBuf>,
    /// After the checks, write to every working-set page (its first byte
    /// inverted) and read the writes back (they must stay private).
    #[arg(long)]
    pub scribble: bool,
    /// After the checks (and --balloon's drop), write the first byte of a
    /// seeded PCT% of all the pages of all regions (drawn with
    /// --write-seed, working set or not) from the vCPU threads (page i on
    /// thread i % --threads), timing each first write; the written pages'
    /// file offsets go to --json (`written_offsets`, with the dropped
    /// pages' in `dropped_offsets`): what a handler's dirty tracking must
    /// find. Not with --scribble (which writes the working set).
    #[arg(long, conflicts_with = "scribble")]
    pub write_set: Option<f64>,
    /// Ask for UFFD_FEATURE_WP_ASYNC in the userfaultfd's handshake (the
    /// kernel then resolves write-protect faults itself): a handler's
    /// synchronous dirty tracking must refuse such a peer.
    #[arg(long)]
    pub wp_async: bool,
    /// Seed of --write-set.
    #[arg(long, default_value_t = 7)]
    pub write_seed: u64,
    /// Declare the regions' backing in the handshake (`"backing"`:
    /// `anonymous`, or `shared` with --backend shared), for a handler that
    /// cannot read this process's memory map (another pid namespace).
    #[arg(long)]
    pub declare_backing: bool,
    /// Shared backend: register the regions MISSING only (no MINOR), as a
    /// VMM unaware of shared mode would; the handler registers MINOR.
    #[arg(long)]
    pub missing_only: bool,
    /// Stay alive this many ms after finishing (others run meanwhile).
    #[arg(long, default_value_t = 0)]
    pub hold_ms: u64,
    /// Report the first touches that took longer than this many ns to the
    /// handler as vCPU stalls, on the hand-off connection while the vCPUs
    /// run (`{"vcpu_stall_ns":[...]}` lines each 50 ms, which `faultline
    /// serve` reads; other handlers may not); 0: report nothing.
    #[arg(long, default_value_t = 0)]
    pub stall_ns: u64,
    /// Wait this many ms after the touches before counting the resident
    /// pages (`resident_pages`): a handler that wakes a vCPU before it
    /// installs the rest of the window (`serve --wake-first`) may still
    /// be installing when the last touch returns.
    #[arg(long, default_value_t = 0)]
    pub settle_ms: u64,
    /// Write timings to FILE (JSON).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seconds to wait for the socket to appear. Default 10.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Milliseconds between connecting and sending the handshake (a slow
    /// VMM: serve then sets it up on a thread of its own).
    #[arg(long, default_value_t = 0)]
    pub handshake_delay_ms: u64,
    /// Keep TSC stamps (before, after) of each vCPU thread's last N slow
    /// touches (over 1 us: the ones that waited for a fault) and write
    /// them to --json (`touch_stamps`): joined by page with serve's
    /// `--phase-samples`, they split a demand fault into its phases as
    /// the vCPU sees it. Default 0: off.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1 << 20))]
    pub stamps: u32,
    /// The vCPU threads are KVM vCPUs (`/dev/kvm`): a guest reads the
    /// first word of each working-set page, so the faults come from KVM
    /// in the kernel, as a real VMM's guest's do, and its sums are checked
    /// against the file (then the pages byte for byte). Guest memory is
    /// the regions back to back from guest-physical 0, under 4 GiB (with
    /// --huge, 2 MiB hugetlb pages, which KVM maps 2 MiB at a time).
    #[arg(long, conflicts_with_all = ["pause_at", "stall_ns", "stamps", "compute_us", "storm", "write_pause_after"])]
    pub kvm: bool,
    /// After the hand-off, wait (at most 60 s) for this file to exist
    /// before the vCPUs start (tests start several peers' faults at once,
    /// after every hand-off; the wait counts in the restore's time).
    #[arg(long)]
    pub go_file: Option<PathBuf>,
}

impl PeerArgs {
    /// The page size of the peer's memory: 2 MiB with `--huge`, else 4 KiB.
    pub fn page_size(&self) -> usize {
        if self.huge {
            2 << 20
        } else {
            super::layout::PAGE
        }
    }
}
