//! `faultline peer` (hidden): a VMM stand-in for tests and benchmarks,
//! written from Firecracker's hand-off protocol.
//!
//! It creates the userfaultfd as Firecracker does (non-blocking,
//! close-on-exec, kernel faults handled, `UFFD_FEATURE_EVENT_REMOVE` only),
//! maps two regions with a gap between them (anonymous 4 KiB, or 2 MiB
//! hugetlb with `--huge`), registers them MISSING, connects and sends the
//! JSON with the userfaultfd attached (`SCM_RIGHTS`), then runs N "vCPU"
//! threads reading a seeded working set (clusters and scattered pages),
//! times every first touch, and checks every byte against the memory file.
//! `--balloon` drops a range with `MADV_DONTNEED` and expects zeros there;
//! `--storm` does so repeatedly while the vCPUs fault (the EAGAIN path).
//! `--backend file` maps the file `MAP_PRIVATE` instead (Firecracker's
//! `File` backend: the kernel baseline).

use std::io::Read as _;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use faultline_sys::mem::{self, Advice, Mapping};
use faultline_sys::sock;
use faultline_sys::uffd::{self, feature, register_mode, Uffd};
use rand::{rngs::SmallRng, Rng, SeedableRng};

use faultline_serve::handshake::{encode, Variant};
use faultline_serve::PeerReport;

const PAGE: usize = 4096;

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
    /// Seed of the working set.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// After the working set, read every page of every region and compare
    /// it with the file (else only the working set is compared).
    #[arg(long)]
    pub verify_all: bool,
    /// After the working set, MADV_DONTNEED the first half of the last
    /// region and expect zeros there.
    #[arg(long)]
    pub balloon: bool,
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
    /// Write timings to FILE (JSON).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seconds to wait for the socket to appear. Default 10.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
}

/// This thread's (voluntary, nonvoluntary) context switches.
fn thread_switches() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        get("voluntary_ctxt_switches:"),
        get("nonvoluntary_ctxt_switches:"),
    )
}

/// `minflt` of /proc/self/stat (field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces: count after its ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(7)?.parse().ok())
        .unwrap_or(0)
}

/// `RssAnon`, `RssShmem`, `RssFile` and private hugetlb memory of this
/// process, KiB.
fn rss_kib() -> (u64, u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    // Private hugetlb pages only (HugetlbPages counts mapped shared
    // page-cache pages of a hugetlbfs file too).
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let private_hugetlb = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Private_Hugetlb:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (
        get("RssAnon:"),
        get("RssShmem:"),
        get("RssFile:"),
        private_hugetlb,
    )
}

struct Layout {
    maps: Vec<Mapping>,
    /// (base, len, file offset)
    regions: Vec<(u64, usize, u64)>,
}

fn say(msg: std::fmt::Arguments<'_>) {
    eprintln!("faultline peer {}: {msg}", std::process::id());
}

/// Runs `faultline peer`.
pub fn run(args: PeerArgs) -> anyhow::Result<()> {
    let file = std::fs::File::open(&args.mem)
        .with_context(|| format!("opening {}", args.mem.display()))?;
    let file_len = file.metadata()?.len() as usize;
    let ps = if args.huge { 2 << 20 } else { PAGE };
    let sizes = if args.regions.is_empty() {
        let half = (file_len / 2) / ps * ps;
        vec![half, file_len / ps * ps - half]
    } else {
        args.regions.clone()
    };
    if sizes.iter().any(|&s| s == 0 || s % ps != 0) {
        bail!("region sizes must be positive multiples of {ps}: {sizes:?}");
    }
    let mapped = match &args.map_file {
        Some(p) => std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?,
        None => file.try_clone()?,
    };
    let layout = match args.backend {
        Backend::Uffd => map_anon(&sizes, args.gap.next_multiple_of(ps), args.huge)?,
        Backend::File | Backend::Shared => map_file(&mapped, &sizes)?,
    };
    let mut t0 = (Instant::now(), faultline_sys::monotonic_ns());
    let mut _conn = None;
    if args.backend != Backend::File {
        let u = match uffd::dev_userfaultfd(uffd::open_flags(true)) {
            Ok(u) => u,
            Err(_) => uffd::syscall_userfaultfd(uffd::open_flags(true))?,
        };
        let (features, mode) = if args.backend == Backend::Shared {
            let minor = if args.huge {
                feature::MINOR_HUGETLBFS | feature::MISSING_HUGETLBFS
            } else {
                feature::MINOR_SHMEM | feature::MISSING_SHMEM
            };
            let minor_mode = if args.missing_only {
                0
            } else {
                register_mode::MINOR
            };
            (
                feature::EVENT_REMOVE | minor,
                register_mode::MISSING | minor_mode,
            )
        } else {
            (feature::EVENT_REMOVE, register_mode::MISSING)
        };
        u.api(features)?;
        for &(base, len, _) in &layout.regions {
            u.register(base, len as u64, mode)?;
        }
        let conn = connect(&args)?;
        t0 = (Instant::now(), faultline_sys::monotonic_ns());
        if send_handshake(&args, &conn, &u, &layout, ps as u64, file_len as u64)? {
            return Ok(());
        }
        // Keep the uffd and the connection open for the process's life, as
        // Firecracker does.
        _conn = Some((conn, u));
    }
    let report = touch_and_check(&args, &file, &layout, t0)?;
    say(format_args!(
        "{} pages in {:.3} ms (median {} ns, p99 {} ns); {} bytes verified",
        report.pages,
        report.seconds * 1e3,
        report.median_ns,
        report.p99_ns,
        report.verified_bytes
    ));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string(&report)?)?;
    }
    if args.hold_ms > 0 {
        say(format_args!("holding for {} ms", args.hold_ms));
        std::thread::sleep(Duration::from_millis(args.hold_ms));
    }
    Ok(())
}

fn connect(args: &PeerArgs) -> anyhow::Result<UnixStream> {
    let path = args
        .socket
        .as_ref()
        .context("--socket is required with --backend uffd")?;
    let deadline = Instant::now() + Duration::from_secs_f64(args.connect_timeout);
    loop {
        match UnixStream::connect(path) {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => {
                return Err(e).with_context(|| format!("connecting to {}", path.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Sends the handshake (or the bad input asked for). Returns whether the
/// peer is done (bad input: it waited for the handler to close).
fn send_handshake(
    args: &PeerArgs,
    conn: &UnixStream,
    u: &Uffd,
    layout: &Layout,
    ps: u64,
    file_len: u64,
) -> anyhow::Result<bool> {
    let mut regions: Vec<(u64, u64, u64, u64)> = layout
        .regions
        .iter()
        .map(|&(b, l, o)| (b, l as u64, o, ps))
        .collect();
    let mut msg = encode(args.variant, &regions);
    if args.declare_backing {
        let backing = if args.backend == Backend::Shared {
            faultline::PeerBacking::Shared
        } else {
            faultline::PeerBacking::Anonymous
        };
        msg = faultline_serve::handshake::declare_backing(&msg, &backing);
    }
    let mut with_fd = true;
    match args.bad {
        None | Some(Bad::Twice) => {}
        Some(Bad::Json) => msg = r#"[{"base_host_virt_addr": 4096, "size": oops"#.into(),
        Some(Bad::NoFd) => with_fd = false,
        Some(Bad::Overlap) => {
            regions[1].0 = regions[0].0 + ps;
            msg = encode(args.variant, &regions);
        }
        Some(Bad::PastEnd) => {
            regions[1].2 = file_len;
            msg = encode(args.variant, &regions);
        }
        Some(Bad::PageSize) => {
            msg = msg.replace(&format!("\"page_size\":{ps}"), "\"page_size\":65536");
        }
    }
    let fds = if with_fd { vec![u.as_fd()] } else { vec![] };
    sock::send_with_fds(conn.as_fd(), msg.as_bytes(), &fds).context("sendmsg")?;
    match args.bad {
        None => Ok(false),
        Some(Bad::Twice) => {
            std::thread::sleep(Duration::from_millis(50));
            sock::send_with_fds(conn.as_fd(), msg.as_bytes(), &fds).context("sendmsg")?;
            Ok(false)
        }
        Some(_) => {
            // The handler must refuse and close the connection.
            conn.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut b = [0u8; 16];
            let n = (&*conn)
                .read(&mut b)
                .context("waiting for the handler to close")?;
            say(format_args!("handler closed the connection ({n} bytes)"));
            Ok(true)
        }
    }
}

fn map_anon(sizes: &[usize], gap: usize, huge: bool) -> anyhow::Result<Layout> {
    let total: usize = sizes.iter().sum::<usize>() + gap * sizes.len();
    for _attempt in 0..8 {
        // Find room for the whole layout, then map each region in it.
        let probe = Mapping::anon_aligned(total, 2 << 20)?;
        let start = probe.addr();
        drop(probe);
        let mut maps = Vec::new();
        let mut regions = Vec::new();
        let (mut at, mut off) = (start, 0u64);
        let mut ok = true;
        for &len in sizes {
            let m = if huge {
                mem::anon_huge_2m(Some(at), len)
            } else {
                mem::anon_at(at, len)
            };
            match m {
                Ok(m) => {
                    if !huge {
                        // One fault per 4 KiB page, as guest memory without THP.
                        let _ = m.advise(0, len, Advice::NoHugePage);
                    }
                    regions.push((at, len, off));
                    maps.push(m);
                }
                Err(e) if huge => bail!("mapping {len} bytes of 2 MiB hugetlb memory: {e}"),
                Err(_) => {
                    ok = false;
                    break;
                }
            }
            at += (len + gap) as u64;
            off += len as u64;
        }
        if ok {
            return Ok(Layout { maps, regions });
        }
    }
    bail!("could not place {} regions with gaps", sizes.len())
}

fn map_file(file: &std::fs::File, sizes: &[usize]) -> anyhow::Result<Layout> {
    let mut maps = Vec::new();
    let mut regions = Vec::new();
    let mut off = 0u64;
    for &len in sizes {
        let m = Mapping::file_private(None, file, len, off)?;
        regions.push((m.addr(), len, off));
        maps.push(m);
        off += len as u64;
    }
    Ok(Layout { maps, regions })
}

/// The seeded working set: 4 KiB pages (as (region, page)) in touch order,
/// 70% in clusters of 8-64 pages, the rest scattered.
fn working_set(layout: &Layout, pct: f64, seed: u64) -> Vec<(usize, usize)> {
    let counts: Vec<usize> = layout.regions.iter().map(|r| r.1 / PAGE).collect();
    let total: usize = counts.iter().sum();
    let target = ((total as f64 * pct / 100.0) as usize).min(total);
    let mut taken = vec![false; total];
    let mut order = Vec::with_capacity(target);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut n = 0;
    let mut tries = 0;
    while n < target && tries < 100 * total + 1000 {
        tries += 1;
        let len = if n < target * 7 / 10 {
            rng.gen_range(8..=64)
        } else {
            1
        };
        let start = rng.gen_range(0..total);
        for (g, t) in taken.iter_mut().enumerate().take(start + len).skip(start) {
            if n < target && !*t {
                *t = true;
                order.push(g);
                n += 1;
            }
        }
    }
    order
        .into_iter()
        .map(|mut g| {
            let mut r = 0;
            while g >= counts[r] {
                g -= counts[r];
                r += 1;
            }
            (r, g)
        })
        .collect()
}

fn touch_and_check(
    args: &PeerArgs,
    file: &std::fs::File,
    layout: &Layout,
    (t0, sent_ns): (Instant, u64),
) -> anyhow::Result<PeerReport> {
    let ws = Arc::new(working_set(layout, args.working_set, args.seed));
    let minflt0 = minor_faults();
    let regions = Arc::new(layout.regions.clone());
    let nthreads = args.threads.max(1);
    let touched = Arc::new(AtomicUsize::new(0));
    let pause_after = args
        .pause_at
        .map(|p| (ws.len() as f64 * p / 100.0) as usize);
    let pause = Duration::from_millis(args.pause_ms);
    let paused = Arc::new(AtomicBool::new(false));
    // The storm range: the last quarter of the last region.
    let last = *layout.regions.last().expect("a region");
    let ps = if args.huge { 2 << 20 } else { PAGE };
    let storm_len = (last.1 / 4).next_multiple_of(ps).min(last.1);
    let storm = (last.0 + (last.1 - storm_len) as u64, storm_len);
    let vcpus_done = Arc::new(AtomicBool::new(false));
    let stormer = (args.storm > 0).then(|| {
        let (n, done) = (args.storm, vcpus_done.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while i < n || !done.load(Relaxed) {
                let _ = mem::madvise(storm.0, storm.1, Advice::DontNeed);
                // Read a few pages back (faults racing the next drop).
                for k in (0..storm.1).step_by(storm.1 / 4 + 1) {
                    // SAFETY: inside our own registered mapping.
                    unsafe { std::ptr::read_volatile((storm.0 + k as u64) as *const u8) };
                }
                i += 1;
                if i > 100 * n {
                    break;
                }
            }
        })
    });
    let mut handles = Vec::new();
    let vcpus_ns = faultline_sys::monotonic_ns();
    for t in 0..nthreads {
        let (ws, regions, touched) = (ws.clone(), regions.clone(), touched.clone());
        let paused = paused.clone();
        handles.push(std::thread::spawn(move || {
            let mut lat = Vec::with_capacity(ws.len() / nthreads + 1);
            let mut first_ns = u64::MAX;
            let switches = thread_switches();
            for (i, &(r, p)) in ws.iter().enumerate() {
                if i % nthreads != t {
                    continue;
                }
                if let Some(limit) = pause_after {
                    if touched.load(Relaxed) >= limit && !paused.swap(true, Relaxed) {
                        say(format_args!("paused after {limit} pages"));
                        std::thread::sleep(pause);
                    }
                }
                let addr = regions[r].0 + (p * PAGE) as u64;
                if first_ns == u64::MAX {
                    first_ns = faultline_sys::monotonic_ns();
                }
                let s = Instant::now();
                // SAFETY: `addr` lies in a live mapping of this process.
                unsafe { std::ptr::read_volatile(addr as *const u8) };
                lat.push(s.elapsed().as_nanos() as u64);
                touched.fetch_add(1, Relaxed);
            }
            let (end, end_ns) = (Instant::now(), faultline_sys::monotonic_ns());
            let after = thread_switches();
            (
                lat,
                end,
                first_ns,
                end_ns,
                (after.0 - switches.0, after.1 - switches.1),
            )
        }));
    }
    let mut lat = Vec::new();
    let mut end = t0;
    let (mut first_touch_ns, mut last_touch_ns) = (u64::MAX, 0);
    let (mut vcpu_slept, mut vcpu_preempted) = (0, 0);
    for h in handles {
        let (l, e, first, last, (slept, preempted)) = h.join().expect("vCPU thread");
        vcpu_slept += slept;
        vcpu_preempted += preempted;
        lat.extend(l);
        end = end.max(e);
        first_touch_ns = first_touch_ns.min(first);
        last_touch_ns = last_touch_ns.max(last);
    }
    vcpus_done.store(true, Relaxed);
    if let Some(s) = stormer {
        s.join().expect("storm thread");
    }
    let seconds = end.duration_since(t0).as_secs_f64();
    let minor_faults = minor_faults() - minflt0;
    let (rss_anon_kib, rss_shmem_kib, rss_file_kib, hugetlb_kib) = rss_kib();
    lat.sort_unstable();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let (median_ns, p99_ns) = (pick(0.5), pick(0.99));
    // The balloon: drop the first half of the last region.
    let balloon = args.balloon.then(|| {
        let len = (last.1 / 2).next_multiple_of(ps).min(last.1);
        (last.0, len)
    });
    if let Some((a, l)) = balloon {
        mem::madvise(a, l, Advice::DontNeed)?;
    }
    let zero = |addr: u64| {
        balloon.is_some_and(|(a, l)| addr >= a && addr < a + l as u64)
            || (args.storm > 0 && addr >= storm.0 && addr < storm.0 + storm.1 as u64)
    };
    let mut verified = 0u64;
    let mut want = vec![0u8; PAGE];
    let mut check = |r: usize, p: usize| -> anyhow::Result<()> {
        let (base, _, off) = regions[r];
        let addr = base + (p * PAGE) as u64;
        if zero(addr) {
            want.fill(0);
        } else {
            file.read_exact_at(&mut want, off + (p * PAGE) as u64)?;
        }
        // SAFETY: a whole page inside a live mapping of this process.
        let got = unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE) };
        if got != &want[..] {
            let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            bail!(
                "byte mismatch at {:#x} (region {r}, file offset {:#x}): got {:#04x}, want {:#04x}{}",
                addr + i as u64,
                off + (p * PAGE + i) as u64,
                got[i],
                want[i],
                if zero(addr) { " (a dropped range must read zeros)" } else { "" }
            );
        }
        verified += PAGE as u64;
        Ok(())
    };
    if args.verify_all || args.balloon || args.storm > 0 {
        for (r, &(_, len, _)) in regions.iter().enumerate() {
            for p in 0..len / PAGE {
                check(r, p)?;
            }
        }
    } else {
        for &(r, p) in ws.iter() {
            check(r, p)?;
        }
    }
    if args.scribble {
        let mut wrote = Vec::with_capacity(ws.len());
        for &(r, p) in ws.iter() {
            let addr = regions[r].0 + (p * PAGE) as u64;
            // SAFETY: a byte inside a live, writable mapping of this process.
            unsafe {
                let b = !std::ptr::read_volatile(addr as *const u8);
                std::ptr::write_volatile(addr as *mut u8, b);
                wrote.push(b);
            }
        }
        for (&(r, p), &b) in ws.iter().zip(&wrote) {
            let addr = regions[r].0 + (p * PAGE) as u64;
            // SAFETY: as above.
            let got = unsafe { std::ptr::read_volatile(addr as *const u8) };
            if got != b {
                bail!("the write at {addr:#x} did not stick: read {got:#04x}, wrote {b:#04x}");
            }
        }
        say(format_args!("scribbled on {} pages", ws.len()));
    }
    let _ = &layout.maps;
    Ok(PeerReport {
        seconds,
        pages: ws.len(),
        median_ns,
        p99_ns,
        verified_bytes: verified,
        rss_anon_kib,
        rss_shmem_kib,
        rss_file_kib,
        hugetlb_kib,
        minor_faults,
        sent_ns,
        vcpus_ns,
        first_touch_ns,
        last_touch_ns,
        vcpu_preempted,
        vcpu_slept,
    })
}
