//! `faultline bench notify`: how long one thread takes to notice a notification
//! from another, per mechanism; the seed's Table 2.1 next to ours.
//!
//! How it works, per iteration `i` (sender and receiver pinned to different CPUs):
//!
//! ```text
//!   receiver                              sender
//!   ready = i ------------------------->  sees ready == i, spins `settle` us
//!   blocks (futex/read/poll/sigwait)      (so the receiver is really asleep)
//!   or spins (spin, signal handler)       t_send = rdtsc(); notify
//!   wakes: t_recv = rdtsc()   <--------
//!   sample = t_recv - t_send
//!   done = i  ------------------------->  sees done == i: rtt = rdtsc() - t_send
//! ```
//!
//! The TSC is invariant and synchronised across CPUs on the project's machines, so
//! `t_recv - t_send` is a one-way latency. Sanity check: for `spin` the one-way
//! median should be about half the round trip (`rtt/2`, the `done` flag coming
//! back the same way). Every wait has a deadline (`--timeout-ms`); a missed one
//! fails the bench instead of hanging.
//!
//! Mechanisms: `signal` (`pthread_kill(SIGUSR1)`, receiver running, timestamp taken
//! in the handler: the seed's "POSIX signal"), `sigwait` (receiver blocked in
//! `sigtimedwait`), `futex` (`FUTEX_WAKE` / `FUTEX_WAIT`), `eventfd` and `pipe`
//! (receiver blocked in `poll` then `read`), `spin` (shared-memory flag, receiver
//! busy-spinning: the seed's "shared memory").

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use anyhow::{anyhow, bail, Context};

use super::plot;
use super::report::{fmt_count, print_table, Record};
use super::stats::{cycles_to_ns_vec, Summary};
use super::tsc::{rdtsc, tsc, Tsc};
use super::BenchCtx;

/// A notification mechanism.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// `pthread_kill(SIGUSR1)` to a running receiver; timestamp in the handler.
    Signal,
    /// `pthread_kill(SIGUSR2)` to a receiver blocked in `sigtimedwait`.
    Sigwait,
    /// `FUTEX_WAKE` on a word the receiver `FUTEX_WAIT`s on.
    Futex,
    /// `write` to an eventfd the receiver blocks on (`poll` + `read`).
    Eventfd,
    /// `write` to a pipe the receiver blocks on (`poll` + `read`).
    Pipe,
    /// Shared-memory flag, receiver busy-spinning.
    Spin,
}

impl Mechanism {
    /// Every mechanism, in table order.
    pub const ALL: [Mechanism; 6] = [
        Mechanism::Spin,
        Mechanism::Futex,
        Mechanism::Eventfd,
        Mechanism::Pipe,
        Mechanism::Signal,
        Mechanism::Sigwait,
    ];

    /// Name in tables and records.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Signal => "signal",
            Mechanism::Sigwait => "sigwait",
            Mechanism::Futex => "futex",
            Mechanism::Eventfd => "eventfd",
            Mechanism::Pipe => "pipe",
            Mechanism::Spin => "spin",
        }
    }

    /// The seed's row this mechanism reproduces, if any.
    pub fn seed(self) -> Option<&'static SeedRow> {
        match self {
            Mechanism::Signal => Some(&SEED[2]),
            Mechanism::Spin => Some(&SEED[1]),
            _ => None,
        }
    }
}

/// One row of seed 000, Table 2.1 (ns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeedRow {
    /// Mechanism as the seed names it.
    pub name: &'static str,
    /// Mean, ns.
    pub mean: f64,
    /// Minimum, ns.
    pub min: f64,
    /// Maximum, ns.
    pub max: f64,
    /// Median, ns.
    pub median: f64,
    /// Standard deviation, ns.
    pub std: f64,
}

/// Seed 000, Table 2.1: notification latency on bare metal.
pub const SEED: [SeedRow; 3] = [
    SeedRow {
        name: "user interrupt",
        mean: 924.0,
        min: 867.0,
        max: 4889.0,
        median: 891.0,
        std: 267.0,
    },
    SeedRow {
        name: "shared memory",
        mean: 4082.0,
        min: 3504.0,
        max: 17995.0,
        median: 4159.0,
        std: 640.0,
    },
    SeedRow {
        name: "POSIX signal",
        mean: 5203.0,
        min: 3719.0,
        max: 20898.0,
        median: 5549.0,
        std: 948.0,
    },
];

/// Options of `faultline bench notify`.
#[derive(clap::Args, Clone, Debug)]
pub struct NotifyArgs {
    /// Measured notifications per mechanism.
    #[arg(short = 'n', long, default_value_t = 10_000)]
    pub iters: usize,
    /// Unrecorded notifications before measuring.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Mechanisms to measure (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Mechanism::ALL)]
    pub mechanisms: Vec<Mechanism>,
    /// Microseconds the sender waits after the receiver said it is ready, so a
    /// blocking receiver is really asleep when notified.
    #[arg(long, default_value_t = 20)]
    pub settle_us: u64,
    /// Deadline of every single wait, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
}

impl NotifyArgs {
    /// Small defaults for the all-benches run.
    pub fn quick() -> NotifyArgs {
        NotifyArgs {
            iters: 2_000,
            warmup: 100,
            mechanisms: Mechanism::ALL.to_vec(),
            settle_us: 20,
            timeout_ms: 1000,
        }
    }
}

/// Samples of one mechanism.
#[derive(Clone, Debug)]
pub struct NotifyRun {
    /// One-way latency of each notification, cycles.
    pub latency: Vec<u64>,
    /// Sender's round trip (notify, then see the receiver's `done` flag), cycles.
    pub rtt: Vec<u64>,
    /// Receipts timestamped before their send (TSC skew between CPUs); counted as 0.
    pub negative: usize,
}

/// The state both threads share.
struct Shared {
    mech: Mechanism,
    /// Receiver is about to wait for notification `i` (value `i`, 1-based).
    ready: AtomicU64,
    /// Receiver got notification `i`.
    done: AtomicU64,
    /// TSC the sender took just before notifying.
    send_tsc: AtomicU64,
    /// Futex word / spin flag: the last notification sent.
    word: AtomicU32,
    /// Receiver's `pthread_t`.
    receiver: AtomicU64,
    /// Set by a side that failed, so the other stops waiting.
    abort: AtomicBool,
    /// Pin to CPUs (receiver, sender), or spin politely on one CPU.
    cpus: Option<(usize, usize)>,
    settle: u64,
    timeout: u64,
    timeout_ms: u64,
    /// eventfd, or the pipe's read end.
    rfd: Option<OwnedFd>,
    /// The pipe's write end.
    wfd: Option<OwnedFd>,
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// CPUs this process may run on.
fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return Err(errno()).context("sched_getaffinity");
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pin the calling thread to `cpu`.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` comes from `allowed_cpus`, below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pthread_self() is the calling thread; `set` is valid for its size.
    let r = unsafe {
        libc::pthread_setaffinity_np(
            libc::pthread_self(),
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r))
            .with_context(|| format!("pinning thread to CPU {cpu}"));
    }
    Ok(())
}

impl Shared {
    fn deadline(&self) -> u64 {
        rdtsc() + self.timeout
    }

    /// Spin until `cond` holds; error on deadline or abort.
    fn spin_until(&self, what: &str, cond: impl Fn() -> bool) -> anyhow::Result<()> {
        let deadline = self.deadline();
        let mut k = 0u32;
        while !cond() {
            k = k.wrapping_add(1);
            if k & 63 == 0 {
                if self.abort.load(Ordering::Relaxed) {
                    bail!("other side failed");
                }
                if rdtsc() > deadline {
                    bail!("timed out after {} ms waiting for {what}", self.timeout_ms);
                }
                if self.cpus.is_none() {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Nanoseconds left until `deadline` (at least 1 ms); error once it passed.
    fn remaining_ns(&self, deadline: u64) -> anyhow::Result<u64> {
        let now = rdtsc();
        if now >= deadline {
            bail!("timed out after {} ms", self.timeout_ms);
        }
        Ok(tsc().cycles_to_ns(deadline - now).max(1e6) as u64)
    }

    /// [`Shared::remaining_ns`] as a relative timespec.
    fn remaining(&self, deadline: u64) -> anyhow::Result<libc::timespec> {
        let ns = self.remaining_ns(deadline)?;
        Ok(libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        })
    }

    fn poll_in(&self, fd: libc::c_int, deadline: u64) -> anyhow::Result<()> {
        loop {
            let ms = (self.remaining_ns(deadline)? / 1_000_000).clamp(1, i32::MAX as u64);
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, ms as libc::c_int) };
            if r > 0 {
                return Ok(());
            }
            if r < 0 {
                let e = errno();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e).context("poll");
                }
            }
            // r == 0 or EINTR: `remaining` fails once the deadline has passed.
        }
    }

    fn read_exact(&self, fd: libc::c_int, len: usize) -> anyhow::Result<()> {
        let mut buf = [0u8; 8];
        // SAFETY: `buf` is writable for `len` <= 8 bytes.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), len) };
        if r != len as isize {
            return Err(errno()).with_context(|| format!("read returned {r}, wanted {len}"));
        }
        Ok(())
    }

    /// Receiver side of iteration `seq`: returns the TSC of receipt.
    fn receive(&self, seq: u64) -> anyhow::Result<u64> {
        let deadline = self.deadline();
        match self.mech {
            Mechanism::Spin => {
                self.spin_until("the flag", || {
                    self.word.load(Ordering::Acquire) as u64 >= seq
                })?;
                Ok(rdtsc())
            }
            Mechanism::Futex => {
                let expected = (seq - 1) as u32;
                while (self.word.load(Ordering::Acquire) as u64) < seq {
                    let ts = self.remaining(deadline)?;
                    // SAFETY: the word is a live, aligned u32 for the whole call;
                    // `ts` is a valid relative timeout.
                    let r = unsafe {
                        libc::syscall(
                            libc::SYS_futex,
                            self.word.as_ptr(),
                            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                            expected,
                            &ts as *const libc::timespec,
                            std::ptr::null::<u32>(),
                            0u32,
                        )
                    };
                    if r != 0 {
                        let e = errno();
                        match e.raw_os_error() {
                            Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ETIMEDOUT) => {}
                            _ => return Err(e).context("FUTEX_WAIT"),
                        }
                    }
                }
                Ok(rdtsc())
            }
            Mechanism::Eventfd | Mechanism::Pipe => {
                let fd = self.rfd.as_ref().expect("fd set up").as_raw_fd();
                self.poll_in(fd, deadline)?;
                let len = if self.mech == Mechanism::Eventfd {
                    8
                } else {
                    1
                };
                self.read_exact(fd, len)?;
                Ok(rdtsc())
            }
            Mechanism::Sigwait => {
                let set = sigset_of(libc::SIGUSR2);
                loop {
                    let ts = self.remaining(deadline)?;
                    // SAFETY: siginfo_t is plain old data; all-zero is valid.
                    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                    // SAFETY: `set`, `info` and `ts` are valid for the call.
                    let r = unsafe { libc::sigtimedwait(&set, &mut info, &ts) };
                    if r == libc::SIGUSR2 {
                        return Ok(rdtsc());
                    }
                    let e = errno();
                    if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                        return Err(e).context("sigtimedwait");
                    }
                }
            }
            Mechanism::Signal => {
                self.spin_until("the signal handler", || {
                    HANDLER_SEQ.load(Ordering::Acquire) >= seq
                })?;
                Ok(HANDLER_TSC.load(Ordering::Relaxed))
            }
        }
    }

    /// Sender side of iteration `seq` (the send TSC is already published).
    fn notify(&self, seq: u64) -> anyhow::Result<()> {
        match self.mech {
            Mechanism::Spin => self.word.store(seq as u32, Ordering::Release),
            Mechanism::Futex => {
                self.word.store(seq as u32, Ordering::Release);
                // SAFETY: the word is a live, aligned u32; FUTEX_WAKE only reads
                // the address as a key.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        self.word.as_ptr(),
                        libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                        1i32,
                    )
                };
                if r < 0 {
                    return Err(errno()).context("FUTEX_WAKE");
                }
            }
            Mechanism::Eventfd | Mechanism::Pipe => {
                let (fd, len) = if self.mech == Mechanism::Eventfd {
                    (self.rfd.as_ref().expect("fd set up").as_raw_fd(), 8)
                } else {
                    (self.wfd.as_ref().expect("fd set up").as_raw_fd(), 1)
                };
                let one = 1u64.to_ne_bytes();
                // SAFETY: `one` is readable for `len` <= 8 bytes.
                let r = unsafe { libc::write(fd, one.as_ptr().cast(), len) };
                if r != len as isize {
                    return Err(errno()).with_context(|| format!("write returned {r}"));
                }
            }
            Mechanism::Signal | Mechanism::Sigwait => {
                let sig = if self.mech == Mechanism::Signal {
                    libc::SIGUSR1
                } else {
                    libc::SIGUSR2
                };
                let tid = self.receiver.load(Ordering::Acquire) as libc::pthread_t;
                // SAFETY: `tid` is the receiver, alive until it has received every
                // notification (it cannot exit before `done == seq`).
                let r = unsafe { libc::pthread_kill(tid, sig) };
                if r != 0 {
                    return Err(std::io::Error::from_raw_os_error(r)).context("pthread_kill");
                }
            }
        }
        Ok(())
    }

    fn receiver_thread(&self, total: usize) -> anyhow::Result<(Vec<u64>, usize)> {
        if let Some((cpu, _)) = self.cpus {
            pin_to(cpu)?;
        }
        match self.mech {
            Mechanism::Sigwait => set_thread_mask(libc::SIG_BLOCK, libc::SIGUSR2)?,
            Mechanism::Signal => set_thread_mask(libc::SIG_UNBLOCK, libc::SIGUSR1)?,
            _ => {}
        }
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        self.receiver.store(me as u64, Ordering::Release);
        let mut lat = Vec::with_capacity(total);
        let mut negative = 0;
        for i in 0..total {
            let seq = i as u64 + 1;
            self.ready.store(seq, Ordering::Release);
            let t_recv = self.receive(seq)?;
            let t_send = self.send_tsc.load(Ordering::Acquire);
            if t_recv < t_send {
                negative += 1;
            }
            lat.push(t_recv.saturating_sub(t_send));
            self.done.store(seq, Ordering::Release);
        }
        Ok((lat, negative))
    }

    fn sender_thread(&self, total: usize) -> anyhow::Result<Vec<u64>> {
        if let Some((_, cpu)) = self.cpus {
            pin_to(cpu)?;
        }
        let mut rtt = Vec::with_capacity(total);
        for i in 0..total {
            let seq = i as u64 + 1;
            self.spin_until("the receiver to be ready", || {
                self.ready.load(Ordering::Acquire) >= seq
            })?;
            let until = rdtsc() + self.settle;
            while rdtsc() < until {
                std::hint::spin_loop();
            }
            let t = rdtsc();
            self.send_tsc.store(t, Ordering::Release);
            self.notify(seq)?;
            self.spin_until("the receiver to finish", || {
                self.done.load(Ordering::Acquire) >= seq
            })?;
            rtt.push(rdtsc() - t);
        }
        Ok(rtt)
    }
}

fn sigset_of(sig: libc::c_int) -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it fully.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; `sig` is a valid signal number.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
    }
    set
}

fn set_thread_mask(how: libc::c_int, sig: libc::c_int) -> anyhow::Result<()> {
    let set = sigset_of(sig);
    // SAFETY: `set` is valid; only the calling thread's mask changes.
    let r = unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r)).context("pthread_sigmask");
    }
    Ok(())
}

static HANDLER_TSC: AtomicU64 = AtomicU64::new(0);
static HANDLER_SEQ: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigusr1(_sig: libc::c_int) {
    // Async-signal-safe: an rdtsc and two atomic stores.
    HANDLER_TSC.store(rdtsc(), Ordering::Relaxed);
    HANDLER_SEQ.fetch_add(1, Ordering::Release);
}

/// The SIGUSR1 handler of the `signal` mechanism, installed for the guard's life.
struct HandlerGuard {
    old: libc::sigaction,
}

impl HandlerGuard {
    fn install() -> anyhow::Result<HandlerGuard> {
        HANDLER_SEQ.store(0, Ordering::SeqCst);
        // SAFETY: sigaction is plain old data; all-zero is valid (empty mask).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigusr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: see above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `sa` is fully initialised and its handler is async-signal-safe;
        // `old` is writable.
        if unsafe { libc::sigaction(libc::SIGUSR1, &sa, &mut old) } != 0 {
            return Err(errno()).context("sigaction(SIGUSR1)");
        }
        Ok(HandlerGuard { old })
    }
}

impl Drop for HandlerGuard {
    fn drop(&mut self) {
        // SAFETY: restores the action saved by `install`.
        if unsafe { libc::sigaction(libc::SIGUSR1, &self.old, std::ptr::null_mut()) } != 0 {
            eprintln!("faultline bench: restoring SIGUSR1 action: {}", errno());
        }
    }
}

fn owned(fd: libc::c_int, what: &str) -> anyhow::Result<OwnedFd> {
    if fd < 0 {
        return Err(errno()).context(what.to_string());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Measure `warmup + iters` notifications of `mech`, keeping the last `iters`.
/// `cpus` = (receiver CPU, sender CPU), or `None` not to pin.
pub fn measure(
    mech: Mechanism,
    iters: usize,
    warmup: usize,
    settle_us: u64,
    timeout_ms: u64,
    cpus: Option<(usize, usize)>,
) -> anyhow::Result<NotifyRun> {
    let t = tsc();
    let (rfd, wfd) = match mech {
        // SAFETY: plain syscall; the result is checked by `owned`.
        Mechanism::Eventfd => (
            Some(owned(
                unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) },
                "eventfd",
            )?),
            None,
        ),
        Mechanism::Pipe => {
            let mut fds = [-1; 2];
            // SAFETY: `fds` is a writable array of two ints.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(errno()).context("pipe2");
            }
            (Some(owned(fds[0], "pipe")?), Some(owned(fds[1], "pipe")?))
        }
        _ => (None, None),
    };
    let sh = Shared {
        mech,
        ready: AtomicU64::new(0),
        done: AtomicU64::new(0),
        send_tsc: AtomicU64::new(0),
        word: AtomicU32::new(0),
        receiver: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        cpus,
        settle: t.ns_to_cycles(settle_us as f64 * 1e3),
        timeout: t.ns_to_cycles(timeout_ms as f64 * 1e6),
        timeout_ms,
        rfd,
        wfd,
    };
    let _handler = if mech == Mechanism::Signal {
        Some(HandlerGuard::install()?)
    } else {
        None
    };
    let total = warmup + iters;
    let (recv, send) = std::thread::scope(|s| {
        let sh = &sh;
        let r = s.spawn(move || {
            let r = sh.receiver_thread(total);
            if r.is_err() {
                sh.abort.store(true, Ordering::Relaxed);
            }
            r
        });
        let w = s.spawn(move || {
            let r = sh.sender_thread(total);
            if r.is_err() {
                sh.abort.store(true, Ordering::Relaxed);
            }
            r
        });
        (r.join(), w.join())
    });
    let recv = recv.map_err(|_| anyhow!("receiver thread panicked"))?;
    let send = send.map_err(|_| anyhow!("sender thread panicked"))?;
    // Report the side that failed first (the other usually reports "other side failed").
    let (mut lat, negative) = match (recv, &send) {
        (Err(e), Err(s)) if e.to_string().contains("other side") => {
            return Err(anyhow!("{s:#}")).context("sender")
        }
        (Err(e), _) => return Err(e).context("receiver"),
        (Ok(v), _) => v,
    };
    let mut rtt = send.context("sender")?;
    lat.drain(..warmup.min(lat.len()));
    rtt.drain(..warmup.min(rtt.len()));
    Ok(NotifyRun {
        latency: lat,
        rtt,
        negative,
    })
}

fn ns0(v: f64) -> String {
    fmt_count(v.round().max(0.0) as u64)
}

/// `faultline bench notify`.
pub fn run(ctx: &mut BenchCtx, args: &NotifyArgs) -> anyhow::Result<()> {
    if args.iters == 0 {
        bail!("--iters must be at least 1");
    }
    let t: &Tsc = tsc();
    let cpus = allowed_cpus()?;
    let pin = (cpus.len() >= 2).then(|| (cpus[1], cpus[0]));
    let mut progress = ctx.progress(args.mechanisms.len() as u64, "notify");
    let mut rows = Vec::new();
    let mut samples = Vec::new();
    let mut records = Vec::new();
    let mut spin_check = None;
    for &m in &args.mechanisms {
        progress.step(m.name());
        let mut run = measure(
            m,
            args.iters,
            args.warmup,
            args.settle_us,
            args.timeout_ms,
            pin,
        )
        .with_context(|| format!("mechanism {}", m.name()))?;
        samples.push((m.name().to_string(), cycles_to_ns_vec(&run.latency, t)));
        let s = Summary::from_cycles(&mut run.latency, t);
        let rtt = Summary::from_cycles(&mut run.rtt, t);
        if m == Mechanism::Spin {
            spin_check = Some((s.median, rtt.median / 2.0));
        }
        let seed = m.seed();
        rows.push(vec![
            m.name().to_string(),
            fmt_count(s.n as u64),
            ns0(s.mean),
            ns0(s.min),
            ns0(s.max),
            ns0(s.median),
            ns0(s.std),
            seed.map_or_else(
                || "-".into(),
                |r| format!("{}: {} / {}", r.name, ns0(r.mean), ns0(r.median)),
            ),
        ]);
        let mut rec = Record::new("notify", m.name(), "-", "-", &s)
            .with("rtt_median_ns", rtt.median)
            .with("negative_samples", run.negative)
            .with("pinned", pin.is_some())
            .with("settle_us", args.settle_us);
        if let Some(r) = seed {
            rec = rec
                .with("seed_name", r.name)
                .with("seed_mean_ns", r.mean)
                .with("seed_median_ns", r.median);
        }
        if run.negative > 0 {
            eprintln!(
                "warning: {}: {} receipts timestamped before their send (TSC skew?)",
                m.name(),
                run.negative
            );
        }
        records.push(rec);
    }
    progress.finish();

    for r in &SEED {
        rows.push(vec![
            format!("(seed) {}", r.name),
            "-".into(),
            ns0(r.mean),
            ns0(r.min),
            ns0(r.max),
            ns0(r.median),
            ns0(r.std),
            "reference".into(),
        ]);
    }
    println!("\nNotification latency, sender rdtsc -> receiver rdtsc, ns");
    match pin {
        Some((r, s)) => println!(
            "(receiver on CPU {r}, sender on CPU {s}; settle {} us)",
            args.settle_us
        ),
        None => {
            println!("(only one CPU available: threads NOT pinned, numbers include scheduling)")
        }
    }
    print_table(
        &[
            "mechanism",
            "n",
            "mean",
            "min",
            "max",
            "median",
            "std",
            "seed (mean / median)",
        ],
        &rows,
    );
    if let Some((one_way, half_rtt)) = spin_check {
        println!(
            "TSC sanity check (spin): one-way median {} ns, round-trip/2 median {} ns",
            ns0(one_way),
            ns0(half_rtt)
        );
    }

    ctx.figure("notify_latency", |d, n| {
        plot::latency_histograms(d, n, &samples)
    })?;
    for r in records {
        ctx.report.push(r);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mechanism_delivers() {
        let cpus = allowed_cpus().unwrap();
        let pin = (cpus.len() >= 2).then(|| (cpus[1], cpus[0]));
        for m in Mechanism::ALL {
            let r = measure(m, 20, 2, 5, 2000, pin).unwrap();
            assert_eq!(r.latency.len(), 20, "{m:?}");
            assert_eq!(r.rtt.len(), 20, "{m:?}");
        }
    }

    #[test]
    fn seed_mapping() {
        assert_eq!(Mechanism::Signal.seed().unwrap().name, "POSIX signal");
        assert_eq!(Mechanism::Spin.seed().unwrap().name, "shared memory");
        assert!(Mechanism::Futex.seed().is_none());
    }
}
