//! B2's load: fio-like random 4 KiB reads from a page-cached file into a
//! region, arriving open loop at a fixed rate (fio's `rate_iops`: a stalled
//! queue does not slow the arrivals, so every I/O that arrives during a
//! stall waits for it), at most 32 in flight, each buffer a hot page or,
//! at the injected rate, a page never touched (an I/O fault whose store
//! fill is slow).
//!
//! ```text
//!   Arrivals ──► backlog ──► Picker (hot page | fresh page = I/O fault)
//!                               │
//!               plain: io_uring read ─┐      api: IoQueue::submit_batch ─┐
//!                                     ▼                                  ▼
//!                 latency from arrival, binned per 100 ms (p99 per bin)
//! ```

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::Region;
use faultline_io::{Backend, DeviceConfig, IoDevice, Ordering, Tenant, TenantConfig};
use faultline_sys::BASE_PAGE as PS;
use rand::{Rng, SeedableRng};

/// One mode's load.
pub(super) struct Load {
    /// I/Os arriving per second.
    pub iops: f64,
    /// Seconds of arrivals.
    pub secs: f64,
    /// Leave the submitting thread at the caller's priority (else
    /// SCHED_FIFO 10, see [`Fifo`]).
    pub normal_priority: bool,
    /// Injected I/O faults per second (0: none).
    pub rate: f64,
    /// Buffer pages in the hot set (resident).
    pub hot: usize,
    /// 4 KiB blocks of the file read at random.
    pub blocks: usize,
}

/// The calling thread at SCHED_FIFO 10 (threads it starts get the normal
/// policy back: `SCHED_RESET_ON_FORK`) until dropped; a no-op when not
/// asked for or not permitted.
pub(super) struct Fifo(pub bool);

impl Fifo {
    /// Enters SCHED_FIFO 10 if `want` (and permitted).
    pub(super) fn enter(want: bool) -> Fifo {
        if !want {
            return Fifo(false);
        }
        Fifo(faultline_sys::thread::set_fifo(10).is_ok())
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        if self.0 {
            let _ = faultline_sys::thread::set_normal();
        }
    }
}

/// A mode's run: every I/O's latency (ns, from its arrival), the p99 per
/// 100 ms bin (ms, us), and the I/O faults injected.
pub(super) type B2Out = (Vec<f64>, Vec<(f64, f64)>, u64);

/// The next buffer page: a hot one, or (at `rate`/s) a fresh one.
struct Picker {
    rng: rand::rngs::SmallRng,
    hot: usize,
    next_fresh: usize,
    every: Option<Duration>,
    due: Instant,
    injected: u64,
}
impl Picker {
    fn new(hot: usize, rate: f64) -> Picker {
        let every = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
        Picker {
            rng: rand::rngs::SmallRng::seed_from_u64(5),
            hot,
            next_fresh: hot,
            every,
            // Half a period in: a run of whole tenths of a second at 10/s
            // gets exactly rate x length faults.
            due: Instant::now() + every.unwrap_or_default() / 2,
            injected: 0,
        }
    }
    fn page(&mut self, busy: &[bool]) -> usize {
        if let Some(e) = self.every {
            if Instant::now() >= self.due {
                self.due += e;
                self.injected += 1;
                self.next_fresh += 1;
                return self.next_fresh - 1;
            }
        }
        loop {
            let p = self.rng.gen_range(0..self.hot);
            if !busy[p] {
                return p;
            }
        }
    }
}

/// Files latency `ns` of an I/O that arrived at `at` under its 100 ms bin.
fn bin(timeline: &mut Vec<Vec<f64>>, t0: Instant, at: Instant, ns: f64) {
    let b = (at.saturating_duration_since(t0).as_millis() / 100) as usize;
    if timeline.len() <= b {
        timeline.resize(b + 1, Vec::new());
    }
    timeline[b].push(ns);
}

/// Each bin's p99 latency, us.
fn to_series(t: &mut [Vec<f64>]) -> Vec<(f64, f64)> {
    t.iter_mut()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(i, v)| {
            v.sort_by(f64::total_cmp);
            let k = ((v.len() as f64 * 0.99) as usize).min(v.len() - 1);
            (i as f64 * 100.0, v[k] / 1e3)
        })
        .collect()
}

/// Open-loop arrivals at a fixed rate (fio's `rate_iops`): a stalled
/// queue does not slow the arrivals down, so every I/O that arrives during
/// a stall waits for it (no coordinated omission).
struct Arrivals {
    t0: Instant,
    every: Duration,
    next: u64,
    end: Instant,
}

impl Arrivals {
    fn new(iops: f64, secs: f64) -> Arrivals {
        let t0 = Instant::now();
        Arrivals {
            t0,
            every: Duration::from_secs_f64(1.0 / iops),
            next: 0,
            end: t0 + Duration::from_secs_f64(secs),
        }
    }
    /// The arrival time of the next I/O if it has arrived (and the run is
    /// not over).
    fn due(&mut self) -> Option<Instant> {
        let at = self.t0 + self.every * self.next as u32;
        (at < self.end && at <= Instant::now()).then(|| {
            self.next += 1;
            at
        })
    }
    /// How long until the next arrival (zero if due).
    fn wait(&self) -> Duration {
        (self.t0 + self.every * self.next as u32).saturating_duration_since(Instant::now())
    }
    /// Whether every arrival of the run has been taken: a stall that
    /// outlasts the run still delivers the arrivals it held up (checking
    /// the clock instead dropped them, and with them the stall's tail).
    fn all_taken(&self) -> bool {
        self.t0 + self.every * self.next as u32 >= self.end
    }
}

const B2_QD: usize = 32;

/// Plain io_uring: the kernel takes a fault on a missing buffer page on
/// the submitting thread, inside `io_uring_enter` (blocking).
pub(super) fn plain(region: &Arc<Region>, file: &Arc<File>, l: &Load) -> anyhow::Result<B2Out> {
    let (blocks, hot, rate) = (l.blocks, l.hot, l.rate);
    use io_uring::{opcode, types, IoUring};
    let mut ring = IoUring::new(64)?;
    let mut pick = Picker::new(hot, rate);
    let mut busy = vec![false; region.pages()];
    let mut start = vec![Instant::now(); B2_QD];
    let mut page_of = vec![0usize; B2_QD];
    let mut free: Vec<usize> = (0..B2_QD).collect();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(6);
    let mut lat = Vec::new();
    let mut timeline = Vec::new();
    let _fifo = Fifo::enter(!l.normal_priority);
    let mut arr = Arrivals::new(l.iops, l.secs);
    let mut backlog = std::collections::VecDeque::new();
    let mut inflight = 0;
    while !arr.all_taken() || inflight > 0 || !backlog.is_empty() {
        while let Some(t) = arr.due() {
            backlog.push_back(t);
        }
        while !backlog.is_empty() && !free.is_empty() {
            let slot = free.pop().expect("a free slot");
            let p = pick.page(&busy);
            busy[p] = true;
            page_of[slot] = p;
            start[slot] = backlog.pop_front().expect("an arrival");
            let blk = rng.gen_range(0..blocks);
            // SAFETY: in the region.
            let buf = unsafe { region.as_ptr().add(p * PS) };
            let e = opcode::Read::new(types::Fd(file.as_raw_fd()), buf, PS as u32)
                .offset((blk * PS) as u64)
                .build()
                .user_data(slot as u64);
            // SAFETY: the buffer stays mapped until the CQE (we reap all below).
            unsafe { ring.submission().push(&e) }.map_err(|_| anyhow::anyhow!("SQ full"))?;
            inflight += 1;
            // The kernel takes a fault on a missing buffer page right here,
            // on this thread, inside io_uring_enter.
            ring.submit()?;
        }
        // Wait for a completion or the next arrival (the same ring wait
        // as the API's queue uses); with every slot busy, for a
        // completion only, as the API loop does: a SCHED_FIFO submitter
        // spinning on 1 us waits behind a stuck read would starve the
        // normal-priority threads that unstick it (one blocking segment
        // stalled 955 ms, the RT throttling budget).
        let wait = if free.is_empty() {
            Duration::from_millis(100)
        } else {
            arr.wait()
        };
        let ts = types::Timespec::from(wait.max(Duration::from_micros(1)));
        let args = types::SubmitArgs::new().timespec(&ts);
        let _ = ring.submitter().submit_with_args(1, &args);
        for c in ring.completion() {
            let slot = c.user_data() as usize;
            anyhow::ensure!(c.result() == PS as i32, "read failed: {}", c.result());
            let ns = start[slot].elapsed().as_nanos() as f64;
            lat.push(ns);
            busy[page_of[slot]] = false;
            free.push(slot);
            inflight -= 1;
            bin(&mut timeline, arr.t0, start[slot], ns);
        }
    }
    Ok((lat, to_series(&mut timeline), pick.injected))
}

/// The I/O API (`faultline_io`, io_uring backend) with `ordering`: an I/O
/// into a missing page is parked until its page is in, the others go on
/// (unordered) or wait behind it (ordered).
pub(super) fn api(
    region: &Arc<Region>,
    file: &Arc<File>,
    l: &Load,
    ordering: Ordering,
) -> anyhow::Result<B2Out> {
    let (blocks, hot, rate) = (l.blocks, l.hot, l.rate);
    let tenant = Arc::new(Tenant::new(TenantConfig::default())?);
    let dev = IoDevice::new(
        region.clone(),
        &tenant,
        DeviceConfig {
            ordering,
            unit_pages: 1,
            ..Default::default()
        },
    )?;
    let mut q = dev.queue(Backend::Uring { depth: 64 })?;
    let mut pick = Picker::new(hot, rate);
    let mut busy = vec![false; region.pages()];
    let mut arrived = vec![Instant::now(); region.pages()];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(6);
    let mut lat = Vec::new();
    let mut timeline = Vec::new();
    let _fifo = Fifo::enter(!l.normal_priority);
    let mut arr = Arrivals::new(l.iops, l.secs);
    let mut backlog = std::collections::VecDeque::new();
    while !arr.all_taken() || q.outstanding() > 0 || !backlog.is_empty() {
        while let Some(t) = arr.due() {
            backlog.push_back(t);
        }
        // The arrivals that fit go in as one batch (pipelined presence
        // checks: `IoQueue::submit_batch`).
        let mut batch = Vec::new();
        while !backlog.is_empty() && q.outstanding() + batch.len() < B2_QD {
            let p = pick.page(&busy);
            busy[p] = true;
            arrived[p] = backlog.pop_front().expect("an arrival");
            let blk = rng.gen_range(0..blocks);
            batch.push(faultline_io::Io {
                op: faultline_io::Op::ReadAt((blk * PS) as u64),
                target: faultline_io::Target::File(file.clone()),
                region_off: p * PS,
                len: PS,
                tag: p as u64,
            });
        }
        q.submit_batch(batch)?;
        let wait = if q.outstanding() >= B2_QD {
            Duration::from_millis(100)
        } else {
            arr.wait()
        };
        let Some(first) = q.complete(wait.max(Duration::from_micros(1))) else {
            continue;
        };
        for c in std::iter::once(first).chain(q.drain_completions()) {
            anyhow::ensure!(
                c.result.as_ref().ok() == Some(&PS),
                "read failed: {:?}",
                c.result
            );
            let at = arrived[c.tag as usize];
            let ns = at.elapsed().as_nanos() as f64;
            lat.push(ns);
            busy[c.tag as usize] = false;
            bin(&mut timeline, arr.t0, at, ns);
        }
    }
    Ok((lat, to_series(&mut timeline), pick.injected))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop stalled past the end of the run still gets every arrival
    /// the stall held up, and only then is the run's arrival stream done.
    #[test]
    fn arrivals_held_up_by_a_stall_past_the_end_are_delivered() {
        let mut arr = Arrivals::new(1000.0, 0.01); // 10 arrivals in 10 ms
        std::thread::sleep(Duration::from_millis(30)); // a stall past the end
        assert!(!arr.all_taken(), "nothing taken yet");
        let mut n = 0;
        while arr.due().is_some() {
            n += 1;
        }
        assert_eq!(n, 10);
        assert!(arr.all_taken());
        assert_eq!(arr.wait(), Duration::ZERO);
    }
}
