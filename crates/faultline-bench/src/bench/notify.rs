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
//! back the same way). Every wait has a deadline (`--timeout-ms`). A missed
//! one (a loaded machine: the other thread was not scheduled for that long)
//! ends that mechanism's measurement, never the bench: its row keeps the
//! samples taken before and says `timed out at sample K`, its JSON record
//! has `timed_out_at`, and the other mechanisms run as usual. Other
//! failures (a system call's error) still fail the bench.
//!
//! Mechanisms: `signal` (`tgkill(SIGUSR1)`, what `pthread_kill` does; receiver
//! running, timestamp taken in the handler: the seed's "POSIX signal"), `sigwait`
//! (receiver blocked in `sigtimedwait`), `futex` (`FUTEX_WAKE` / `FUTEX_WAIT`), `eventfd` and `pipe`
//! (receiver blocked in `poll` then `read`), `spin` (shared-memory flag, receiver
//! busy-spinning: the seed's "shared memory").
//!
//! Every system call goes through `faultline-sys` (`thread` for affinity, futex,
//! eventfd and `poll`, `signal` for handlers, masks, `sigtimedwait` and `tgkill`);
//! pipes are `std::io::pipe`.

use std::ffi::c_void;
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use faultline_sys::signal::{self, SigAction, SigInfo, SIGUSR1, SIGUSR2};
use faultline_sys::thread::{self, EventFd};

use crate::harness::plot;
use crate::harness::report::{fmt_count, print_table, Record};
use crate::harness::stats::{cycles_to_ns_vec, Summary};
use crate::harness::tsc::{rdtsc, tsc, Tsc};
use crate::harness::BenchCtx;

use super::{named_once, FailedAfterResults};

/// A notification mechanism.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// `tgkill(SIGUSR1)` to a running receiver; timestamp in the handler.
    Signal,
    /// `tgkill(SIGUSR2)` to a receiver blocked in `sigtimedwait`.
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
    /// Measured notifications per mechanism (1 to 10,000,000).
    #[arg(short = 'n', long, default_value_t = 10_000, value_parser = faultline_cli_support::flags::range(1, 10_000_000))]
    pub iters: usize,
    /// Unrecorded notifications before measuring (0 to 1,000,000).
    #[arg(long, default_value_t = 100, value_parser = faultline_cli_support::flags::range(0, 1_000_000))]
    pub warmup: usize,
    /// Mechanisms to measure (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Mechanism::ALL)]
    pub mechanisms: Vec<Mechanism>,
    /// Microseconds the sender waits after the receiver said it is ready, so a
    /// blocking receiver is really asleep when notified (0 to 1,000,000).
    #[arg(long, default_value_t = 20, value_parser = faultline_cli_support::flags::range_u64(0, 1_000_000))]
    pub settle_us: u64,
    /// Deadline of every single wait, in milliseconds (1 to 3,600,000). A
    /// sample that misses it is counted as timed out in the table, not
    /// measured; a mechanism none of whose samples arrived fails the run.
    #[arg(long, default_value_t = 1000, value_parser = faultline_cli_support::flags::range_u64(1, 3_600_000))]
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
    /// The measured sample (1-based, after the warm-up) whose wait passed
    /// its deadline, ending the measurement (0: a warm-up one).
    pub timed_out_at: Option<usize>,
}

/// A wait that passed its deadline (`--timeout-ms`): the measurement ends
/// there and the table says so, unlike other errors.
#[derive(Debug)]
struct TimedOut(String);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TimedOut {}

fn is_timeout(e: &anyhow::Error) -> bool {
    e.downcast_ref::<TimedOut>().is_some()
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
    /// Receiver's thread id.
    receiver: AtomicU64,
    /// Set by a side that failed, so the other stops waiting.
    abort: AtomicBool,
    /// Set with `abort` when the failure was a missed deadline: the other
    /// side ends without an error.
    timed_out: AtomicBool,
    /// Set once the sender's loop has ended: the receiver thread lives
    /// until then, so a signal sent after the receiver gave up (its wait
    /// timed out while the sender was settling) still finds its thread.
    sender_done: AtomicBool,
    /// Pin to CPUs (receiver, sender), or spin politely on one CPU.
    cpus: Option<(usize, usize)>,
    settle: u64,
    timeout: u64,
    timeout_ms: u64,
    /// The eventfd (non-blocking: the receiver polls first).
    eventfd: Option<EventFd>,
    /// The pipe's read and write ends.
    pipe: Option<(PipeReader, PipeWriter)>,
}

/// CPUs this process may run on.
fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    thread::allowed_cpus().context("sched_getaffinity")
}

/// Pin the calling thread to `cpu`.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    thread::pin_to_cpu(cpu).with_context(|| format!("pinning thread to CPU {cpu}"))
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
                    return Err(TimedOut(format!(
                        "timed out after {} ms waiting for {what}",
                        self.timeout_ms
                    ))
                    .into());
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
            return Err(TimedOut(format!("timed out after {} ms", self.timeout_ms)).into());
        }
        Ok(tsc().cycles_to_ns(deadline - now).max(1e6) as u64)
    }

    /// [`Shared::remaining_ns`] as a duration.
    fn remaining(&self, deadline: u64) -> anyhow::Result<Duration> {
        Ok(Duration::from_nanos(self.remaining_ns(deadline)?))
    }

    fn poll_in(&self, fd: i32, deadline: u64) -> anyhow::Result<()> {
        loop {
            let ms = (self.remaining_ns(deadline)? / 1_000_000).clamp(1, i32::MAX as u64);
            let mut revents = [0i16];
            if faultline_sys::poll::poll_in(&[fd], ms as i32, &mut revents).context("poll")? > 0 {
                return Ok(());
            }
            // Timeout or EINTR: `remaining_ns` fails once the deadline has passed.
        }
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
                    // Returns on wake, value change, timeout or signal: look again.
                    thread::futex_wait(&self.word, expected, self.remaining(deadline)?);
                }
                Ok(rdtsc())
            }
            Mechanism::Eventfd => {
                let ev = self.eventfd.as_ref().expect("eventfd set up");
                self.poll_in(ev.raw(), deadline)?;
                ev.take().context("eventfd read")?;
                Ok(rdtsc())
            }
            Mechanism::Pipe => {
                let (rx, _) = self.pipe.as_ref().expect("pipe set up");
                self.poll_in(rx.as_raw_fd(), deadline)?;
                let mut byte = [0u8; 1];
                (&*rx).read_exact(&mut byte).context("pipe read")?;
                Ok(rdtsc())
            }
            Mechanism::Sigwait => loop {
                if signal::wait_for(SIGUSR2, self.remaining(deadline)?).context("sigtimedwait")? {
                    return Ok(rdtsc());
                }
            },
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
                thread::futex_wake(&self.word);
            }
            Mechanism::Eventfd => {
                let ev = self.eventfd.as_ref().expect("eventfd set up");
                ev.add(1).context("eventfd write")?;
            }
            Mechanism::Pipe => {
                let (_, tx) = self.pipe.as_ref().expect("pipe set up");
                (&*tx).write_all(&[1]).context("pipe write")?;
            }
            Mechanism::Signal | Mechanism::Sigwait => {
                let sig = if self.mech == Mechanism::Signal {
                    SIGUSR1
                } else {
                    SIGUSR2
                };
                // The receiver, alive until the sender's loop has ended
                // (`sender_done`), even when it stopped waiting first.
                let tid = self.receiver.load(Ordering::Acquire) as i32;
                signal::tgkill(tid, sig).context("tgkill")?;
            }
        }
        Ok(())
    }

    /// Ends a side's loop at a missed deadline (its own, or the other
    /// side's): `Ok` to stop with the samples so far; other errors pass.
    fn stop_at(&self, e: anyhow::Error) -> anyhow::Result<()> {
        if is_timeout(&e) {
            self.timed_out.store(true, Ordering::Relaxed);
            self.abort.store(true, Ordering::Relaxed);
            return Ok(());
        }
        if self.timed_out.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(e)
    }

    fn receiver_thread(&self, total: usize) -> anyhow::Result<(Vec<u64>, usize)> {
        if let Some((cpu, _)) = self.cpus {
            pin_to(cpu)?;
        }
        match self.mech {
            Mechanism::Sigwait => signal::set_blocked(SIGUSR2, true).context("pthread_sigmask")?,
            Mechanism::Signal => signal::set_blocked(SIGUSR1, false).context("pthread_sigmask")?,
            _ => {}
        }
        self.receiver
            .store(thread::gettid() as u64, Ordering::Release);
        let mut lat = Vec::with_capacity(total);
        let mut negative = 0;
        for i in 0..total {
            let seq = i as u64 + 1;
            self.ready.store(seq, Ordering::Release);
            let t_recv = match self.receive(seq) {
                Ok(t) => t,
                Err(e) => {
                    self.stop_at(e)?;
                    break;
                }
            };
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
            if let Err(e) = self.spin_until("the receiver to be ready", || {
                self.ready.load(Ordering::Acquire) >= seq
            }) {
                self.stop_at(e)?;
                break;
            }
            let until = rdtsc() + self.settle;
            while rdtsc() < until {
                std::hint::spin_loop();
            }
            let t = rdtsc();
            self.send_tsc.store(t, Ordering::Release);
            if let Err(e) = self.notify(seq) {
                // After the receiver gave up (a missed deadline), ends
                // quietly like the waits do; otherwise fails.
                self.stop_at(e)?;
                break;
            }
            if let Err(e) = self.spin_until("the receiver to finish", || {
                self.done.load(Ordering::Acquire) >= seq
            }) {
                self.stop_at(e)?;
                break;
            }
            rtt.push(rdtsc() - t);
        }
        Ok(rtt)
    }
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

static HANDLER_TSC: AtomicU64 = AtomicU64::new(0);
static HANDLER_SEQ: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigusr1(_sig: i32, _info: *mut SigInfo, _ctx: *mut c_void) {
    // Async-signal-safe: an rdtsc and two atomic stores.
    HANDLER_TSC.store(rdtsc(), Ordering::Relaxed);
    HANDLER_SEQ.fetch_add(1, Ordering::Release);
}

/// The SIGUSR1 handler of the `signal` mechanism, installed for the guard's life.
struct HandlerGuard {
    old: SigAction,
}

impl HandlerGuard {
    fn install() -> anyhow::Result<HandlerGuard> {
        HANDLER_SEQ.store(0, Ordering::SeqCst);
        let old =
            signal::install_sigaction(SIGUSR1, on_sigusr1, false).context("sigaction(SIGUSR1)")?;
        Ok(HandlerGuard { old })
    }
}

impl Drop for HandlerGuard {
    fn drop(&mut self) {
        if let Err(e) = signal::restore_sigaction(SIGUSR1, &self.old) {
            eprintln!("faultline bench: restoring SIGUSR1 action: {e}");
        }
    }
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
    let eventfd = match mech {
        Mechanism::Eventfd => Some(EventFd::new().context("eventfd")?),
        _ => None,
    };
    let pipe = match mech {
        Mechanism::Pipe => Some(std::io::pipe().context("pipe")?),
        _ => None,
    };
    let sh = Shared {
        mech,
        ready: AtomicU64::new(0),
        done: AtomicU64::new(0),
        send_tsc: AtomicU64::new(0),
        word: AtomicU32::new(0),
        receiver: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        timed_out: AtomicBool::new(false),
        sender_done: AtomicBool::new(false),
        cpus,
        settle: t.ns_to_cycles(settle_us as f64 * 1e3),
        timeout: t.ns_to_cycles(timeout_ms as f64 * 1e6),
        timeout_ms,
        eventfd,
        pipe,
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
            // The sender may still signal this thread (it was settling
            // when this side stopped): the thread, and its id, must
            // outlive the sender's loop. That loop ends soon: every wait
            // in it has a deadline and sees `abort`.
            while !sh.sender_done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(100));
            }
            r
        });
        let w = s.spawn(move || {
            // Set however the loop ends (a panic included), so the
            // receiver never waits for it in vain.
            let _done = SetOnDrop(&sh.sender_done);
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
    let timed_out_at = sh
        .timed_out
        .load(Ordering::Relaxed)
        .then(|| (lat.len() + 1).saturating_sub(warmup));
    lat.drain(..warmup.min(lat.len()));
    rtt.drain(..warmup.min(rtt.len()));
    // A sample the receiver took but whose round trip the sender did not
    // see end (it timed out first) is kept: both vectors stay paired.
    let n = lat.len().min(rtt.len());
    lat.truncate(n);
    rtt.truncate(n);
    Ok(NotifyRun {
        latency: lat,
        rtt,
        negative,
        timed_out_at,
    })
}

/// What `bench notify` needs, checked before any bench runs: each
/// mechanism named once (twice would measure it twice, two rows and two
/// records of one name).
pub fn check(args: &NotifyArgs) -> anyhow::Result<()> {
    let names: Vec<&str> = args.mechanisms.iter().map(|m| m.name()).collect();
    named_once("--mechanisms", &names)
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
    let mut timeouts = Vec::new();
    // Mechanisms none of whose measured samples arrived: the run fails
    // for them, once the others' rows and records are out.
    let mut none_arrived = Vec::new();
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
        let timed_out = run.timed_out_at.map(|k| {
            timeouts.push(m.name());
            match k {
                0 => " (timed out in the warm-up)".to_string(),
                k => format!(" (timed out at sample {k})"),
            }
        });
        if run.latency.is_empty() {
            let mut row = vec![
                m.name().to_string(),
                format!("0{}", timed_out.unwrap_or_default()),
            ];
            row.extend(std::iter::repeat_n("-".to_string(), 6));
            rows.push(row);
            none_arrived.push(m.name());
            continue;
        }
        samples.push((m.name().to_string(), cycles_to_ns_vec(&run.latency, t)));
        let s = Summary::from_cycles(&mut run.latency, t);
        let rtt = Summary::from_cycles(&mut run.rtt, t);
        if m == Mechanism::Spin {
            spin_check = Some((s.median, rtt.median / 2.0));
        }
        let seed = m.seed();
        rows.push(vec![
            m.name().to_string(),
            format!("{}{}", fmt_count(s.n as u64), timed_out.unwrap_or_default()),
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
        if let Some(k) = run.timed_out_at {
            rec = rec.with("timed_out_at", k);
        }
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
    if !timeouts.is_empty() {
        let why = if args.settle_us >= args.timeout_ms * 1000 {
            format!(
                "every wait includes the sender's --settle-us {}, longer than the deadline",
                args.settle_us
            )
        } else {
            "the other thread was not scheduled in time, a loaded machine".to_string()
        };
        println!(
            "timed out: {} (a wait passed --timeout-ms {}: {why}; the row keeps the samples \
             before it)",
            timeouts.join(", "),
            args.timeout_ms
        );
    }
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
    if !none_arrived.is_empty() {
        return Err(FailedAfterResults(format!(
            "no sample of {} arrived: a wait passed --timeout-ms {} before the first measured \
             one (a wait includes the sender's --settle-us {} us and the other thread's \
             scheduling: raise --timeout-ms)",
            none_arrived.join(", "),
            args.timeout_ms,
            args.settle_us
        ))
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taken by the tests that measure the signal mechanisms: one SIGUSR1
    /// handler at a time (a test putting back the default action while
    /// another's signal is on its way would end the test process).
    static SIGNALS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn every_mechanism_delivers() {
        let _one = SIGNALS.lock().unwrap_or_else(|e| e.into_inner());
        let cpus = allowed_cpus().unwrap();
        let pin = (cpus.len() >= 2).then(|| (cpus[1], cpus[0]));
        for m in Mechanism::ALL {
            let r = measure(m, 20, 2, 5, 2000, pin).unwrap();
            assert_eq!(r.latency.len(), 20, "{m:?}");
            assert_eq!(r.rtt.len(), 20, "{m:?}");
        }
    }

    #[test]
    fn a_missed_deadline_is_a_table_entry_not_an_error() {
        let _one = SIGNALS.lock().unwrap_or_else(|e| e.into_inner());
        // Settling 50 ms before each notification with a 10 ms deadline:
        // the receiver's first wait passes its deadline.
        // The signal mechanisms too: the sender signals a receiver that
        // has stopped waiting (tgkill to an exited thread failed the bench
        // with ESRCH).
        let cpus = allowed_cpus().unwrap();
        let pin = (cpus.len() >= 2).then(|| (cpus[1], cpus[0]));
        for (m, pin) in [
            (Mechanism::Futex, None),
            (Mechanism::Pipe, None),
            (Mechanism::Signal, pin),
            (Mechanism::Sigwait, pin),
            (Mechanism::Signal, None),
            (Mechanism::Sigwait, None),
        ] {
            let r = measure(m, 5, 0, 50_000, 10, pin).unwrap();
            assert_eq!(r.timed_out_at, Some(1), "{m:?}");
            assert!(r.latency.is_empty() && r.rtt.is_empty(), "{m:?}");
        }
        let r = measure(Mechanism::Futex, 5, 0, 0, 2000, None).unwrap();
        assert_eq!(r.timed_out_at, None);
        assert_eq!(r.latency.len(), 5);
    }

    #[test]
    fn seed_mapping() {
        assert_eq!(Mechanism::Signal.seed().unwrap().name, "POSIX signal");
        assert_eq!(Mechanism::Spin.seed().unwrap().name, "shared memory");
        assert!(Mechanism::Futex.seed().is_none());
    }
}
