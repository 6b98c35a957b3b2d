//! `faultline-peer` (also the hidden `faultline peer`): a VMM stand-in for
//! tests and benchmarks, written from Firecracker's hand-off protocol.
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
//! `File` backend: the kernel baseline). `--kvm` makes the vCPU threads
//! KVM vCPUs whose guest reads the working set, so the faults come from
//! the kernel (KVM's `get_user_pages`), as a real VMM's do.
//!
//! | module | what |
//! |---|---|
//! | [`args`] | what it is asked to do (`PeerArgs`) |
//! | [`layout`] | its guest memory, mapped as a VMM maps it |
//! | [`workload`] | the working set, the vCPU threads, the byte checks |
//! | `kvm` | `--kvm`: the vCPUs as KVM vCPUs running a tiny guest |
//! | [`vcpu`] | what the vCPU threads share: who touches what, what they measured |
//! | [`procfs`] | what the kernel counts of it (faults, context switches, RSS) |
//! | [`report`] | what it measured (`--json`) |
//!
//! Its code returns `anyhow` errors: it is a program's (`faultline-peer`'s
//! and `faultline peer`'s), kept in the library so both can run it.

pub mod args;
mod kvm;
pub mod layout;
pub mod procfs;
pub mod report;
pub mod vcpu;
pub mod workload;

use std::io::Read as _;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline_sys::sock;
use faultline_sys::uffd::{self, feature, register_mode, Uffd};

use crate::handshake::{declare_backing, encode};
pub use args::{Backend, Bad, PeerArgs};
use layout::Layout;
use report::say;
pub use report::PeerReport;

/// Runs the peer (`faultline-peer ARGS`, `faultline peer ARGS`).
pub fn run(args: PeerArgs) -> anyhow::Result<()> {
    let file = std::fs::File::open(&args.mem)
        .with_context(|| format!("opening {}", args.mem.display()))?;
    let file_len = file.metadata()?.len() as usize;
    let ps = args.page_size();
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
        Backend::Uffd => layout::map_anon(&sizes, args.gap.next_multiple_of(ps), args.huge)?,
        Backend::File | Backend::Shared => layout::map_file(&mapped, &sizes)?,
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
        let features = if args.wp_async {
            features | feature::WP_ASYNC
        } else {
            features
        };
        u.api(features)?;
        for &(base, len, _) in &layout.regions {
            u.register(base, len as u64, mode)?;
        }
        let conn = connect(&args)?;
        std::thread::sleep(Duration::from_millis(args.handshake_delay_ms));
        t0 = (Instant::now(), faultline_sys::monotonic_ns());
        if send_handshake(&args, &conn, &u, &layout, ps as u64, file_len as u64)? {
            return Ok(());
        }
        // Keep the uffd and the connection open for the process's life, as
        // Firecracker does.
        _conn = Some((conn, u));
    }
    if let Some(go) = &args.go_file {
        say(format_args!("handed off; waiting for {}", go.display()));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !go.exists() {
            if Instant::now() > deadline {
                bail!("{} did not appear within 60 s", go.display());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // The stalls go to the handler while the vCPUs run.
    let (stalls, reporter) = match &_conn {
        Some((conn, _)) if args.stall_ns > 0 => {
            let (tx, rx) = std::sync::mpsc::channel();
            let conn = conn.try_clone()?;
            (
                Some(tx),
                Some(std::thread::spawn(move || report_stalls(&conn, &rx))),
            )
        }
        _ => (None, None),
    };
    let report = workload::touch_and_check(&args, &file, &layout, t0, stalls)?;
    if let Some(r) = reporter {
        let n = r.join().expect("stall reporter")?;
        say(format_args!("reported {n} vCPU stalls to the handler"));
    }
    if args.kvm {
        say(format_args!(
            "{} pages read by the KVM guest in {:.3} ms (its sums checked); {} bytes verified",
            report.pages,
            report.seconds * 1e3,
            report.verified_bytes
        ));
    } else {
        say(format_args!(
            "{} pages in {:.3} ms (median {} ns, p99 {} ns); {} bytes verified",
            report.pages,
            report.seconds * 1e3,
            report.median_ns,
            report.p99_ns,
            report.verified_bytes
        ));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string(&report)?)?;
    }
    if args.hold_ms > 0 {
        say(format_args!("holding for {} ms", args.hold_ms));
        std::thread::sleep(Duration::from_millis(args.hold_ms));
    }
    Ok(())
}

/// Sends the stalls `rx` receives to the handler as stall report lines
/// (docs/serve.md, "The stall a vCPU sees"): what came in each 50 ms, at
/// most 1024 a line, until the vCPU threads drop their senders. It sleeps
/// between looks rather than wait on the channel, so a vCPU's send never
/// wakes it (a wake-up per stall would be one more cost on the vCPU). A
/// handler that does not read would block a write: it gives up after 5 s.
/// Returns the stalls sent.
fn report_stalls(conn: &UnixStream, rx: &Receiver<u64>) -> anyhow::Result<usize> {
    use std::io::Write as _;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let (mut batch, mut sent, mut open) = (Vec::new(), 0, true);
    while open {
        std::thread::sleep(STALL_REPORT_EVERY);
        loop {
            match rx.try_recv() {
                Ok(ns) => batch.push(ns),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        for chunk in batch.chunks(1024) {
            let mut line = serde_json::to_string(&serde_json::json!({ "vcpu_stall_ns": chunk }))?;
            line.push('\n');
            (&*conn)
                .write_all(line.as_bytes())
                .context("reporting the vCPUs' stalls to the handler")?;
        }
        sent += batch.len();
        batch.clear();
    }
    Ok(sent)
}

/// How often the vCPUs' stalls go to the handler while they run.
const STALL_REPORT_EVERY: Duration = Duration::from_millis(50);

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
        msg = declare_backing(&msg, &backing);
    }
    let mut with_fd = true;
    match args.bad {
        None | Some(Bad::Twice) => {}
        Some(Bad::Undeclared) => {
            regions.truncate(1);
            msg = encode(args.variant, &regions);
        }
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
        None | Some(Bad::Undeclared) => Ok(false),
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
