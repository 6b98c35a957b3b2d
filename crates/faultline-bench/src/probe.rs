//! `faultline vpri probe`: what the kernel does when a system call touches
//! a missing (or clean, write-protected) page of a faultline region: the
//! table of digest §2.1 (seed 003), measured now on this kernel, through
//! real regions: a `poll`-engine region whose store takes 20 ms per fill
//! ("normal": the kernel sleeps in the fault) and a `signal`-engine region
//! (`UFFD_FEATURE_SIGBUS`: the kernel gets EFAULT). Exits non-zero, naming
//! the rows, if the kernel behaves otherwise.
//!
//! This is a kernel-baseline probe: it makes the system calls itself
//! (`vmsplice` and `O_DIRECT` through `faultline-sys`'s typed wrappers,
//! io_uring reads), as the kernel benchmarks do.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline::policy::PolicyKind;
use faultline::{
    capabilities, EvictionConfig, MemoryStore, PageStore, PollEngine, Region, SignalEngine,
    StoreError,
};
use faultline_sys::{mem, Errno};

/// `faultline vpri ...`.
#[derive(clap::Subcommand)]
pub enum VpriCmd {
    /// Print the kernel behaviour table (digest §2.1) measured now; exit
    /// non-zero if this kernel behaves otherwise.
    Probe(ProbeArgs),
}

/// Arguments of `faultline vpri probe`.
#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Store latency of the normal-mode region, ms (default 20, the
    /// digest's; 0 to 60,000).
    #[arg(long, default_value_t = 20, value_parser = faultline_cli_support::flags::range_u64(0, 60_000))]
    pub store_ms: u64,
}

/// Runs a `vpri` command.
pub fn run(cmd: VpriCmd) -> anyhow::Result<()> {
    match cmd {
        VpriCmd::Probe(a) => probe(&a),
    }
}

const PS: usize = 4096;

/// A store that sleeps in every fill (the "store fetch" of the probe).
struct Slow {
    inner: MemoryStore,
    delay: Duration,
}
impl PageStore for Slow {
    fn describe(&self) -> &str {
        "probe-slow-store"
    }
    fn len(&self) -> Option<u64> {
        self.inner.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        self.inner.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.inner.write_back(offset, data)
    }
}

/// What a row expects.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Succeeds with this count after blocking >= n store latencies.
    Blocks(i64, u32),
    /// Succeeds with this count (no blocking requirement).
    Ok(i64),
    /// Fails with EFAULT.
    Efault,
}

struct Row {
    mode: &'static str,
    path: String,
    ret: i64,
    ms: f64,
    expect: Expect,
    note: String,
    ok: bool,
}

struct Probe {
    region: Region,
    next: usize,
    mode: &'static str,
    lat: Duration,
    rows: Vec<Row>,
}

impl Probe {
    /// A fresh missing page.
    fn fresh(&mut self) -> *mut u8 {
        let p = self.next;
        self.next += 1;
        assert!(p < self.region.pages(), "probe region too small");
        // SAFETY: in bounds of the mapping.
        unsafe { self.region.as_ptr().add(p * PS) }
    }

    fn record(&mut self, path: &str, ret: i64, t: Instant, expect: Expect, note: String) {
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let lat = self.lat.as_secs_f64() * 1e3;
        let ok = match expect {
            Expect::Blocks(n, k) => ret == n && ms >= lat * f64::from(k) * 0.95,
            Expect::Ok(n) => ret == n,
            Expect::Efault => ret == -(Errno::EFAULT.0 as i64),
        };
        self.rows.push(Row {
            mode: self.mode,
            path: path.into(),
            ret,
            ms,
            expect,
            note,
            ok,
        });
    }
}

fn ret_of(r: std::io::Result<usize>) -> i64 {
    match r {
        Ok(n) => n as i64,
        Err(e) => -(e.raw_os_error().unwrap_or(0) as i64),
    }
}

fn uring_rw(
    ring: &mut io_uring::IoUring,
    write: bool,
    fd: i32,
    buf: *mut u8,
    len: usize,
    flags: io_uring::squeue::Flags,
) -> i64 {
    use io_uring::{opcode, types};
    let e = if write {
        opcode::Write::new(types::Fd(fd), buf, len as u32).build()
    } else {
        opcode::Read::new(types::Fd(fd), buf, len as u32).build()
    }
    .flags(flags)
    .user_data(1);
    // SAFETY: the buffer is region memory that stays mapped; we wait for
    // the completion before returning.
    unsafe { ring.submission().push(&e) }.expect("ring has room");
    ring.submit_and_wait(1).expect("io_uring_enter");
    let c = ring.completion().next().expect("a completion");
    i64::from(c.result())
}

fn vmsplice_from(buf: *mut u8) -> i64 {
    match mem::vmsplice_into_pipe(buf, PS) {
        Ok(n) => n as i64,
        Err(e) => -(e.0 as i64),
    }
}

fn one_mode(
    mode: &'static str,
    region: Region,
    lat: Duration,
    dir: &std::path::Path,
) -> anyhow::Result<Vec<Row>> {
    let sig = mode == "SIGBUS";
    let mut p = Probe {
        region,
        next: 0,
        mode,
        lat,
        rows: Vec::new(),
    };
    let blocks = |n: i64, k: u32| {
        if sig {
            Expect::Efault
        } else {
            Expect::Blocks(n, k)
        }
    };
    let path = dir.join("data.bin");
    std::fs::write(&path, vec![0x33u8; 16 * PS])?;
    let fb = File::open(&path)?;
    let fd = OpenOptions::new()
        .read(true)
        .custom_flags(mem::O_DIRECT)
        .open(&path)
        .context("O_DIRECT open (the probe's temp dir must not be tmpfs)")?;
    let mut ring = io_uring::IoUring::new(8).context("io_uring_setup")?;
    let sl = |b: *mut u8, n: usize| {
        // SAFETY: `n` bytes of region memory from `b`, in bounds.
        unsafe { std::slice::from_raw_parts_mut(b, n) }
    };

    let b = p.fresh();
    let t = Instant::now();
    let r = ret_of(fb.read_at(sl(b, PS), 0));
    p.record(
        "pread buffered (copy_to_user)",
        r,
        t,
        blocks(4096, 1),
        String::new(),
    );

    let b = p.fresh();
    let _ = p.fresh();
    p.region.populate((p.next - 2) * PS, PS)?;
    let t = Instant::now();
    // SAFETY: half a page into `b`, still in bounds.
    let r = ret_of(fb.read_at(sl(unsafe { b.add(PS / 2) }, PS), 0));
    let e = if sig {
        Expect::Ok(2048)
    } else {
        Expect::Blocks(4096, 1)
    };
    p.record(
        "pread buffered 4K: 2K present|2K missing",
        r,
        t,
        e,
        String::new(),
    );

    let b = p.fresh();
    let t = Instant::now();
    let r = ret_of(fd.read_at(sl(b, PS), 0));
    p.record(
        "pread O_DIRECT (GUP pin)",
        r,
        t,
        blocks(4096, 1),
        String::new(),
    );

    let b = p.fresh();
    for _ in 0..3 {
        p.fresh();
    }
    p.region.populate((p.next - 4) * PS, 2 * PS)?;
    let t = Instant::now();
    let r = ret_of(fd.read_at(sl(b, 4 * PS), 0));
    p.record(
        "pread O_DIRECT 16K: 2 present|2 missing",
        r,
        t,
        blocks(16384, 2),
        if sig {
            "all or nothing".into()
        } else {
            "faults served one after another".into()
        },
    );

    for (name, file, flags) in [
        (
            "io_uring READ buffered",
            &fb,
            io_uring::squeue::Flags::empty(),
        ),
        (
            "io_uring READ O_DIRECT",
            &fd,
            io_uring::squeue::Flags::empty(),
        ),
        (
            "io_uring READ buffered IOSQE_ASYNC",
            &fb,
            io_uring::squeue::Flags::ASYNC,
        ),
    ] {
        let b = p.fresh();
        let t = Instant::now();
        let r = uring_rw(&mut ring, false, file.as_raw_fd(), b, PS, flags);
        p.record(name, r, t, blocks(4096, 1), String::new());
    }

    // UDP: is the datagram kept after a failed copy?
    let us = UdpSocket::bind("127.0.0.1:0")?;
    let uc = UdpSocket::bind("127.0.0.1:0")?;
    uc.send_to(&[7u8; 1000], us.local_addr()?)?;
    let b = p.fresh();
    let t = Instant::now();
    let r = ret_of(us.recv(sl(b, 2000)));
    us.set_nonblocking(true)?;
    let mut tmp = [0u8; 2000];
    let after = ret_of(us.recv(&mut tmp));
    let lost = after == -(Errno::EAGAIN.0 as i64);
    let mut e = blocks(1000, 1);
    if sig && !lost {
        e = Expect::Ok(i64::MIN); // forces a mismatch: expected the datagram to be lost
    }
    p.record(
        "recv UDP",
        r,
        t,
        e,
        format!("udp_datagram_lost_after_efault={}", u8::from(sig && lost)),
    );

    // TCP: are the bytes kept?
    let ls = TcpListener::bind("127.0.0.1:0")?;
    let mut tc = TcpStream::connect(ls.local_addr()?)?;
    let (ts, _) = ls.accept()?;
    tc.write_all(&[9u8; 1000])?;
    std::thread::sleep(Duration::from_millis(10));
    let b = p.fresh();
    let t = Instant::now();
    let r = ret_of((&ts).read(sl(b, 2000)));
    ts.set_nonblocking(true)?;
    let after = ret_of((&ts).read(&mut tmp));
    let kept = after == 1000;
    let mut e = blocks(1000, 1);
    if sig && !kept {
        e = Expect::Ok(i64::MIN);
    }
    p.record(
        "recv TCP",
        r,
        t,
        e,
        format!("tcp_data_kept_after_efault={}", u8::from(sig && kept)),
    );

    let out = File::create(dir.join("out.bin"))?;
    let b = p.fresh();
    let t = Instant::now();
    let r = ret_of((&out).write(sl(b, PS)));
    p.record(
        "write(2) from a missing page",
        r,
        t,
        blocks(4096, 1),
        String::new(),
    );

    let b = p.fresh();
    let t = Instant::now();
    let r = vmsplice_from(b);
    p.record(
        "vmsplice from a missing page",
        r,
        t,
        blocks(4096, 1),
        String::new(),
    );

    let b = p.fresh();
    let t = Instant::now();
    let r = uring_rw(
        &mut ring,
        true,
        out.as_raw_fd(),
        b,
        PS,
        io_uring::squeue::Flags::empty(),
    );
    p.record(
        "io_uring WRITE from a missing page",
        r,
        t,
        blocks(4096, 1),
        String::new(),
    );
    Ok(p.rows)
}

/// The WP rows: a budget region (pages installed clean, write-protected).
fn wp_rows(engine_sig: bool, dir: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    let store = MemoryStore::new(vec![0x5a; 16 * PS]);
    let b = Region::builder(16 * PS)
        .store(store)
        .fault_around(1)
        .budget(EvictionConfig {
            budget_pages: 16,
            policy: PolicyKind::Clock,
        });
    let region = if engine_sig {
        b.build(&SignalEngine::new()?)?
    } else {
        b.build(&PollEngine::new()?)?
    };
    // SAFETY: in bounds; a read installs the page clean.
    let _ = unsafe { std::ptr::read_volatile(region.as_ptr()) };
    let path = dir.join("data.bin");
    let f = File::open(&path)?;
    let mode = if engine_sig { "SIGBUS" } else { "normal" };
    let mut p = Probe {
        region,
        next: 0,
        mode,
        lat: Duration::ZERO,
        rows: Vec::new(),
    };
    let base = p.region.as_ptr();
    let t = Instant::now();
    // SAFETY: the first page, resident.
    let r = ret_of(f.read_at(unsafe { std::slice::from_raw_parts_mut(base, PS) }, 0));
    let e = if engine_sig {
        Expect::Efault
    } else {
        Expect::Ok(4096)
    };
    p.record(
        "pread into a resident clean (WP) page",
        r,
        t,
        e,
        "pread_into_wp_page".into(),
    );
    // SAFETY: in bounds; install page 1 clean.
    let _ = unsafe { std::ptr::read_volatile(base.add(PS)) };
    let out = File::create(dir.join("out2.bin"))?;
    let t = Instant::now();
    // SAFETY: page 1, resident.
    let r = ret_of((&out).write(unsafe { std::slice::from_raw_parts(base.add(PS), PS) }));
    p.record(
        "write(2) from a resident clean (WP) page",
        r,
        t,
        Expect::Ok(4096),
        String::new(),
    );
    Ok(p.rows)
}

fn probe(a: &ProbeArgs) -> anyhow::Result<()> {
    let caps = capabilities();
    println!(
        "kernel {} | userfaultfd created via {} | normal mode: poll engine, store {} ms per fill | SIGBUS mode: signal engine",
        caps.kernel,
        caps.path.map_or("none".to_string(), |p| p.name().to_string()),
        a.store_ms
    );
    let dir = std::env::temp_dir().join(format!("faultline-vpri-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let lat = Duration::from_millis(a.store_ms);
    let res = (|| -> anyhow::Result<Vec<Row>> {
        let poll = PollEngine::new()?;
        let normal = Region::builder(64 * PS)
            .store(Slow {
                inner: MemoryStore::new(vec![0x5a; 64 * PS]),
                delay: lat,
            })
            .fault_around(1)
            .build(&poll)?;
        let mut rows = one_mode("normal", normal, lat, &dir)?;
        let sig = SignalEngine::new()?;
        let sigr = Region::builder(64 * PS)
            .store(MemoryStore::new(vec![0x5a; 64 * PS]))
            .fault_around(1)
            .build(&sig)?;
        rows.extend(one_mode("SIGBUS", sigr, Duration::ZERO, &dir)?);
        rows.extend(wp_rows(false, &dir)?);
        rows.extend(wp_rows(true, &dir)?);
        Ok(rows)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let rows = res?;
    let mut bad = Vec::new();
    println!(
        "{:<7} {:<44} {:>7} {:<7} {:>8}  {:<34} check",
        "mode", "path", "ret", "errno", "ms", "expected"
    );
    for r in &rows {
        let errno = if r.ret < 0 && r.ret > -4096 {
            faultline_sys::errno_name(-r.ret as i32)
        } else {
            "-"
        };
        let exp = match r.expect {
            Expect::Blocks(n, k) => format!("{n} after >= {k} store fetch(es)"),
            Expect::Ok(i64::MIN) => "EFAULT + see note".into(),
            Expect::Ok(n) => format!("{n}"),
            Expect::Efault => "EFAULT".into(),
        };
        println!(
            "{:<7} {:<44} {:>7} {:<7} {:>8.1}  {:<34} {} {}",
            r.mode,
            r.path,
            r.ret,
            errno,
            r.ms,
            exp,
            if r.ok { "ok" } else { "MISMATCH" },
            r.note
        );
        if !r.ok {
            bad.push(format!("{} / {}", r.mode, r.path));
        }
    }
    if !bad.is_empty() {
        bail!(
            "this kernel behaves differently from the digest's table (seed 003 digest §2.1) in {} row(s): {}",
            bad.len(),
            bad.join("; ")
        );
    }
    println!("all {} rows as in the digest (§2.1)", rows.len());
    Ok(())
}
