//! Device queues: I/O between files or sockets and region memory, through
//! plain system calls or io_uring, that never lets the kernel take a fault
//! on region memory.
//!
//! Per I/O (digest §2.3):
//!
//! 1. take an I/O reference on every page it touches (the evictor skips
//!    referenced pages), then check the presence bitmap with the
//!    direction's rule ([`faultline::Region::io_ready`]);
//! 2. all ready: log it to the device's access log (unless the device
//!    has none, `log_slots: 0`) and issue it; the
//!    references drop when it completes;
//! 3. a miss (an *I/O page fault*): drop the references, post every page
//!    that is not ready to the tenant's fault queue (deduplicated) and
//!    park the I/O. [`Ordering::Ordered`] pauses the queue behind it;
//!    [`Ordering::Unordered`] parks only it. A page response reissues the
//!    parked I/Os on that page and no others (an ordered queue goes on
//!    from its head), so it costs O(its I/Os), not O(parked); the check
//!    runs again: a page evicted meanwhile is a new miss, posted again.
//!
//! An EFAULT the kernel returns anyway (a check that lost a race) is never
//! handed to the user: the I/O is parked and reissued, and counted.
//!
//! No call waits unboundedly. With [`Backend::Syscall`] a socket receive
//! or send is issued with `MSG_DONTWAIT`: when no data (or no buffer
//! space) is there it waits in the queue, without I/O references, until
//! [`IoQueue::complete`] sees the socket ready, so a receive for a
//! datagram that never comes costs nothing and blocks nobody. With
//! io_uring a full ring parks the I/O until a slot frees, and dropping the
//! queue cancels the socket I/Os the kernel still holds.
//!
//! The caller owns the region bytes an I/O targets until its completion,
//! as with any DMA buffer: reading or writing them meanwhile races with
//! the kernel.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io;
use std::net::{TcpStream, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline_sys::mem;
use faultline_sys::poll::{self, events, PollFd};
use faultline_sys::sock;
use io_uring::{opcode, types, IoUring};

use crate::error::{Error, Result};
use crate::log::AccessEvent;
use crate::shared::{DeviceInner, Ordering};
use crate::tenant::{Responder, Response};

/// How a queue issues its I/Os.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Plain system calls on the submitting thread (`pread`, `pwrite`,
    /// `recv`, `send`): a ready I/O completes inside `submit`.
    Syscall,
    /// An io_uring of `depth` entries owned by the queue.
    Uring {
        /// Submission queue entries.
        depth: u32,
    },
}

/// What an I/O reads from or writes to.
#[derive(Debug, Clone)]
pub enum Target {
    /// A file (positioned I/O).
    File(Arc<File>),
    /// A UDP socket (connected for `send`).
    Udp(Arc<UdpSocket>),
    /// A TCP stream.
    Tcp(Arc<TcpStream>),
}

impl Target {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Target::File(f) => f.as_fd(),
            Target::Udp(s) => s.as_fd(),
            Target::Tcp(s) => s.as_fd(),
        }
    }
}

/// The operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `pread` at this file offset into region memory (the device writes
    /// the region).
    ReadAt(u64),
    /// `pwrite` at this file offset from region memory (the device reads
    /// the region).
    WriteAt(u64),
    /// `recv` into region memory.
    Recv,
    /// `send` from region memory.
    Send,
}

impl Op {
    /// Whether the kernel writes region memory.
    pub fn writes_region(self) -> bool {
        matches!(self, Op::ReadAt(_) | Op::Recv)
    }
}

/// How many I/Os ahead a batch prefetches the presence-check words
/// ([`IoQueue::submit_batch`]): enough misses in flight to cover one
/// DRAM latency with one check's work between them.
pub const PREFETCH_AHEAD: usize = 8;

/// One I/O request.
#[derive(Debug, Clone)]
pub struct Io {
    /// What to do.
    pub op: Op,
    /// On what.
    pub target: Target,
    /// Region byte offset of the buffer.
    pub region_off: usize,
    /// Buffer length.
    pub len: usize,
    /// Returned with the completion.
    pub tag: u64,
}

/// A finished I/O.
#[derive(Debug)]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// Bytes transferred, or the error (never EFAULT from a missing page).
    pub result: io::Result<usize>,
    /// Whether the I/O was parked on an I/O page fault.
    pub iopf: bool,
    /// Submission to completion.
    pub latency: Duration,
}

struct Pending {
    io: Io,
    pages: Range<usize>,
    seq: u64,
    t_submit: Instant,
    iopf: bool,
    /// Why it waits besides a page: socket readiness (`poll` events) for
    /// a syscall-backend socket I/O that would block, [`WAIT_SLOT`] for an
    /// io_uring completion, 0 for neither.
    wait: i16,
}

/// [`Pending::wait`]: waits for an io_uring completion: the ring is full,
/// or (ordered queue) an earlier I/O it depends on is in flight
/// ([`depends`]). io_uring runs the SQEs it holds in any order (a cached
/// write completes inline while an O_DIRECT read before it is still on
/// the disk), so an ordered queue keeps dependent I/Os apart itself;
/// independent ones still run together. (`IOSQE_IO_LINK` would order
/// them too, but it serialises every I/O of the chain and turns one short
/// or failed I/O into `ECANCELED` for the rest.)
const WAIT_SLOT: i16 = -1;

/// Whether `later` must wait for `earlier` to finish in an ordered queue:
/// both on one socket (the kernel does not keep two receives, or sends,
/// on one socket in submission order); region buffers that overlap where
/// either I/O writes region memory (a `recv`/read into a buffer and a
/// send/write out of it); or the same open file with overlapping byte
/// ranges where either writes the file.
fn depends(later: &Pending, earlier: &Pending) -> bool {
    let (a, b) = (&later.io, &earlier.io);
    let overlap = |x: u64, xl: usize, y: u64, yl: usize| x < y + yl as u64 && y < x + xl as u64;
    if a.target.fd().as_raw_fd() == b.target.fd().as_raw_fd() {
        match (a.op, b.op) {
            (Op::ReadAt(_), Op::ReadAt(_)) => {}
            (Op::ReadAt(x) | Op::WriteAt(x), Op::ReadAt(y) | Op::WriteAt(y)) => {
                if overlap(x, a.len, y, b.len) {
                    return true;
                }
            }
            _ => return true, // a socket
        }
    }
    (a.op.writes_region() || b.op.writes_region())
        && overlap(a.region_off as u64, a.len, b.region_off as u64, b.len)
}

struct Uring {
    ring: IoUring,
    slots: Vec<Option<Pending>>,
    free: Vec<usize>,
    wake_armed: bool,
}

const WAKE: u64 = u64::MAX;
const EFAULT: i32 = 14;
const CANCEL: u64 = u64::MAX - 1;

/// A device queue. See the [module docs](self). Owned by one thread.
pub struct IoQueue {
    dev: Arc<DeviceInner>,
    responder: Arc<Responder>,
    parked: VecDeque<Pending>,
    ready: VecDeque<Completion>,
    reorder: BTreeMap<u64, Completion>,
    next_seq: u64,
    next_deliver: u64,
    kick: bool,
    uring: Option<Uring>,
    fixed: bool,
    /// Access-log events of the current call, logged together at its end
    /// ([`AccessLog::push_batch`](crate::AccessLog::push_batch)).
    log_buf: Vec<AccessEvent>,
}

impl std::fmt::Debug for IoQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoQueue")
            .field("device", &self.dev.name)
            .field("parked", &self.parked.len())
            .field("uring", &self.uring.is_some())
            .finish()
    }
}

impl IoQueue {
    pub(crate) fn new(dev: Arc<DeviceInner>, backend: Backend) -> Result<IoQueue> {
        let uring = match backend {
            Backend::Syscall => None,
            Backend::Uring { depth } => {
                let ring = IoUring::new(depth.max(2)).map_err(|e| Error::Io {
                    op: "io_uring_setup",
                    source: e,
                })?;
                let n = ring.params().sq_entries() as usize;
                Some(Uring {
                    ring,
                    slots: (0..n).map(|_| None).collect(),
                    free: (0..n).rev().collect(),
                    wake_armed: false,
                })
            }
        };
        Ok(IoQueue {
            dev,
            responder: Responder::new()?,
            parked: VecDeque::new(),
            ready: VecDeque::new(),
            reorder: BTreeMap::new(),
            next_seq: 0,
            next_deliver: 0,
            kick: false,
            uring,
            fixed: false,
            log_buf: Vec::new(),
        })
    }

    /// `pread(file, len, file_off)` into region bytes at `region_off`.
    pub fn read_at(
        &mut self,
        file: &Arc<File>,
        file_off: u64,
        region_off: usize,
        len: usize,
        tag: u64,
    ) -> Result<()> {
        self.submit(Io {
            op: Op::ReadAt(file_off),
            target: Target::File(file.clone()),
            region_off,
            len,
            tag,
        })
    }

    /// `pwrite(file, len, file_off)` from region bytes at `region_off`.
    pub fn write_at(
        &mut self,
        file: &Arc<File>,
        file_off: u64,
        region_off: usize,
        len: usize,
        tag: u64,
    ) -> Result<()> {
        self.submit(Io {
            op: Op::WriteAt(file_off),
            target: Target::File(file.clone()),
            region_off,
            len,
            tag,
        })
    }

    /// `recv` from a socket into region bytes at `region_off`.
    pub fn recv(&mut self, sock: Target, region_off: usize, len: usize, tag: u64) -> Result<()> {
        self.submit(Io {
            op: Op::Recv,
            target: sock,
            region_off,
            len,
            tag,
        })
    }

    /// `send` region bytes at `region_off` on a socket.
    pub fn send(&mut self, sock: Target, region_off: usize, len: usize, tag: u64) -> Result<()> {
        self.submit(Io {
            op: Op::Send,
            target: sock,
            region_off,
            len,
            tag,
        })
    }

    /// Submits `io`. With the syscall backend a ready file I/O, or a
    /// socket I/O whose socket is ready, has completed when this returns
    /// (collect it with [`complete`](Self::complete)); an I/O that missed,
    /// or whose socket is not ready, is parked and this returns at once.
    /// Never waits.
    pub fn submit(&mut self, io: Io) -> Result<()> {
        let pages = self.dev.region.page_range(io.region_off, io.len);
        let r = self.submit_one(io, pages);
        self.flush_log();
        r
    }

    /// Logs the access-log events this call gathered, in one batch, all
    /// stamped with one clock read (the I/Os were issued within this call).
    fn flush_log(&mut self) {
        if !self.log_buf.is_empty() {
            let now = self.dev.now_ns();
            self.log_buf.iter_mut().for_each(|e| e.ts_ns = now);
            self.dev.log.push_batch(&self.log_buf);
            self.log_buf.clear();
        }
    }

    /// `pages`: the region pages `io` touches (`page_range`), `None` if
    /// it reaches past the region.
    fn submit_one(&mut self, io: Io, pages: Option<Range<usize>>) -> Result<()> {
        let region = &self.dev.region;
        let pages = pages.ok_or(Error::OutOfRange {
            offset: io.region_off,
            len: io.len,
            region_len: region.len(),
        })?;
        let file = matches!(io.target, Target::File(_));
        if file != matches!(io.op, Op::ReadAt(_) | Op::WriteAt(_)) {
            return Err(Error::Unsupported {
                what: "operation",
                reason: format!("{:?} on {:?}", io.op, io.target),
            });
        }
        if io.len > u32::MAX as usize {
            return Err(Error::Unsupported {
                what: "length",
                reason: "one I/O moves at most 4 GiB".into(),
            });
        }
        self.dev.counters.submitted.fetch_add(1, Relaxed);
        let p = Pending {
            io,
            pages,
            seq: self.next_seq,
            t_submit: Instant::now(),
            iopf: false,
            wait: 0,
        };
        self.next_seq += 1;
        if self.dev.ordering == Ordering::Ordered && !self.parked.is_empty() {
            // Paused behind an earlier miss: it waits its turn, but its own
            // missing pages are requested now, so they are served while it
            // waits (the issue order is unchanged).
            let write = p.io.op.writes_region();
            if let Err(first) = self.dev.region.io_ready(p.pages.clone(), write) {
                self.post_missing(first..p.pages.end, write);
            }
            self.park(p);
            return Ok(());
        }
        if let Some(p) = self.try_issue(p) {
            self.park(p);
        }
        Ok(())
    }

    /// Submits a batch of I/Os as [`submit`](Self::submit) does, with
    /// the presence checks pipelined: while one I/O is checked, the words
    /// of the next [`PREFETCH_AHEAD`] are already on their way
    /// ([`faultline::Region::io_prefetch`]), so the cache misses of a
    /// cold bitmap overlap instead of queueing. Stops at the first error
    /// (the I/Os before it are submitted, the rest dropped).
    pub fn submit_batch(&mut self, ios: impl IntoIterator<Item = Io>) -> Result<()> {
        let ios: Vec<Io> = ios.into_iter().collect();
        let region = self.dev.region.clone();
        let pages: Vec<_> = ios
            .iter()
            .map(|io| region.page_range(io.region_off, io.len))
            .collect();
        let prefetch = |i: usize| {
            if let Some(Some(p)) = pages.get(i) {
                region.io_prefetch(p.clone());
            }
        };
        (0..PREFETCH_AHEAD).for_each(prefetch);
        let mut r = Ok(());
        for (i, io) in ios.into_iter().enumerate() {
            prefetch(i + PREFETCH_AHEAD);
            r = self.submit_one(io, pages[i].clone());
            if r.is_err() {
                break;
            }
        }
        self.flush_log();
        r
    }

    fn park(&mut self, p: Pending) {
        self.dev.counters.parked.fetch_add(1, Relaxed);
        self.parked.push_back(p);
    }

    /// The presence check, then issue; gives the I/O back on a miss (after
    /// posting its missing pages), or when it would have to wait (a socket
    /// not ready, a full ring, an EFAULT to retry).
    fn try_issue(&mut self, mut p: Pending) -> Option<Pending> {
        let region = self.dev.region.clone();
        let write = p.io.op.writes_region();
        region.io_acquire(p.pages.clone());
        match region.io_ready(p.pages.clone(), write) {
            Ok(()) => {
                if self.dev.log_on {
                    self.log_buf.push(AccessEvent {
                        page: p.pages.start,
                        pages: p.pages.len() as u32,
                        ts_ns: 0, // stamped by `flush_log`
                        write,
                    });
                }
                self.issue(p)
            }
            Err(first) => {
                region.io_release(p.pages.clone());
                if !p.iopf {
                    self.dev.counters.iopfs.fetch_add(1, Relaxed);
                }
                self.post_missing(first..p.pages.end, write);
                p.iopf = true;
                Some(p)
            }
        }
    }

    /// Requests every page of `pages` not ready for the direction (each
    /// request, new or joined, brings this queue a response). When none
    /// is missing any more (resolved since the check that sent us here),
    /// no response will come: the queue is kicked to check again.
    fn post_missing(&mut self, pages: Range<usize>, write: bool) {
        let region = &self.dev.region;
        let mut requested = false;
        let keep_off = (self.dev.ordering == Ordering::Unordered)
            .then(faultline_sys::thread::current_cpu)
            .flatten();
        for pg in pages {
            if region.io_ready(pg..pg + 1, write).is_err() {
                requested = true;
                if self.dev.tenant.post(
                    region,
                    pg,
                    write,
                    &self.responder,
                    self.dev.home_cpu,
                    keep_off,
                ) {
                    self.dev.counters.posted.fetch_add(1, Relaxed);
                }
            }
        }
        if !requested {
            self.kick = true;
        }
    }

    fn buf(&self, p: &Pending) -> *mut u8 {
        // SAFETY (for the pointer's later use): `region_off + len` lies in
        // the region (checked at submit) and the region stays mapped while
        // the device holds it.
        self.dev.region.as_ptr().wrapping_add(p.io.region_off)
    }

    /// Issues a ready I/O (its references held); gives it back if it has
    /// to wait (see [`try_issue`](Self::try_issue)).
    fn issue(&mut self, mut p: Pending) -> Option<Pending> {
        let ptr = self.buf(&p);
        let len = p.io.len;
        if self.uring.is_none() {
            let res = {
                let (rd, wr) = (
                    // SAFETY: the pages are mapped and ready and hold our
                    // I/O references (no eviction); the caller owns these
                    // bytes until the completion (module docs).
                    || unsafe { std::slice::from_raw_parts_mut(ptr, len) },
                    // SAFETY: as above, read-only use.
                    || unsafe { std::slice::from_raw_parts(ptr, len) },
                );
                match (&p.io.op, &p.io.target) {
                    (Op::ReadAt(off), Target::File(f)) => f.read_at(rd(), *off),
                    (Op::WriteAt(off), Target::File(f)) => f.write_at(wr(), *off),
                    (Op::Recv, t) => sock::recv_nowait(t.fd(), rd()),
                    (Op::Send, t) => sock::send_nowait(t.fd(), wr()),
                    _ => unreachable!("checked at submit"),
                }
            };
            self.dev.region.io_release(p.pages.clone());
            match &res {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    p.wait = if p.io.op == Op::Recv {
                        events::IN
                    } else {
                        events::OUT
                    };
                    return Some(p);
                }
                Err(e) if e.raw_os_error() == Some(EFAULT) => {
                    self.efault(&mut p);
                    return Some(p);
                }
                _ => {}
            }
            self.finish(p, res);
            return None;
        }
        // A full ring, or an ordered socket I/O behind another on its
        // socket: reap what is done; if still so, the I/O waits (without
        // references) for a completion.
        if self.must_wait_inflight(&p) {
            self.reap();
            if self.must_wait_inflight(&p) {
                self.dev.region.io_release(p.pages.clone());
                p.wait = WAIT_SLOT;
                return Some(p);
            }
        }
        let fixed = self.fixed;
        let region_base = self.dev.region.as_ptr();
        let u = self.uring.as_mut().expect("uring backend");
        let slot = u.free.pop().expect("a free slot");
        let fd = types::Fd(p.io.target.fd().as_raw_fd());
        let sqe = match p.io.op {
            Op::ReadAt(off) if fixed => {
                let _ = region_base;
                opcode::ReadFixed::new(fd, ptr, len as u32, 0)
                    .offset(off)
                    .build()
            }
            Op::WriteAt(off) if fixed => opcode::WriteFixed::new(fd, ptr, len as u32, 0)
                .offset(off)
                .build(),
            Op::ReadAt(off) => opcode::Read::new(fd, ptr, len as u32).offset(off).build(),
            Op::WriteAt(off) => opcode::Write::new(fd, ptr, len as u32).offset(off).build(),
            Op::Recv => opcode::Recv::new(fd, ptr, len as u32).build(),
            Op::Send => opcode::Send::new(fd, ptr, len as u32).build(),
        }
        .user_data(slot as u64);
        u.slots[slot] = Some(p);
        // SAFETY: the buffer is region memory that stays mapped and
        // referenced until the CQE; the target fd is kept open by the
        // pending I/O's Arc.
        while unsafe { u.ring.submission().push(&sqe) }.is_err() {
            let _ = u.ring.submit();
        }
        let _ = u.ring.submit();
        None
    }

    /// See [`WAIT_SLOT`].
    fn must_wait_inflight(&self, p: &Pending) -> bool {
        let Some(u) = self.uring.as_ref() else {
            return false;
        };
        if u.free.is_empty() {
            return true;
        }
        self.dev.ordering == Ordering::Ordered && u.slots.iter().flatten().any(|q| depends(p, q))
    }

    /// The kernel met a page that was not there after all (EFAULT). Never
    /// the user's problem: the I/O is parked (by the caller) and reissued
    /// once its pages are back; a reissue is kicked at once in case they
    /// already are.
    fn efault(&mut self, p: &mut Pending) {
        self.dev.counters.efault_caught.fetch_add(1, Relaxed);
        if p.io.op == Op::Recv && matches!(p.io.target, Target::Udp(_)) {
            self.dev.counters.efault_lost.fetch_add(1, Relaxed);
        }
        self.post_missing(p.pages.clone(), p.io.op.writes_region());
        p.iopf = true;
        self.kick = true;
    }

    /// An issued I/O returned `res`.
    fn finish(&mut self, mut p: Pending, res: io::Result<usize>) {
        if let Err(e) = &res {
            if e.raw_os_error() == Some(EFAULT) {
                self.efault(&mut p);
                self.park(p);
                return;
            }
        }
        let c = Completion {
            tag: p.io.tag,
            result: res,
            iopf: p.iopf,
            latency: p.t_submit.elapsed(),
        };
        match self.dev.ordering {
            Ordering::Unordered => self.deliver(c),
            Ordering::Ordered => {
                self.reorder.insert(p.seq, c);
                while let Some(c) = self.reorder.remove(&self.next_deliver) {
                    self.next_deliver += 1;
                    self.deliver(c);
                }
            }
        }
    }

    fn deliver(&mut self, c: Completion) {
        self.dev.counters.completed.fetch_add(1, Relaxed);
        self.ready.push_back(c);
    }

    /// Processes page responses (reissuing parked I/Os), io_uring
    /// completions and sockets found ready, without blocking.
    pub fn poll(&mut self) {
        let responses: Vec<Response> =
            std::mem::take(&mut *self.responder.inbox.lock().expect("inbox lock"));
        if !responses.is_empty() || self.kick {
            self.fail_parked(&responses);
            // A kick (a slot freed, a socket ready, an EFAULT) may concern
            // any parked I/O; a page response only those on its page.
            let answered: Vec<usize> = responses.iter().map(|r| r.page).collect();
            let all = std::mem::take(&mut self.kick);
            self.reissue((!all).then_some(&answered));
        }
        self.reap();
    }

    /// Completes the parked I/Os whose page could not be resolved.
    fn fail_parked(&mut self, responses: &[Response]) {
        let region = self.dev.region.id();
        for r in responses
            .iter()
            .filter(|r| r.error.is_some() && r.region == region)
        {
            let msg = r.error.clone().unwrap_or_default();
            let mut keep = VecDeque::new();
            while let Some(p) = self.parked.pop_front() {
                if p.pages.contains(&r.page) {
                    self.dev.counters.parked.fetch_sub(1, Relaxed);
                    self.finish(p, Err(io::Error::other(msg.clone())));
                } else {
                    keep.push_back(p);
                }
            }
            self.parked = keep;
        }
    }

    /// Checks parked I/Os again and issues those now ready: all of them
    /// (`answered` = `None`), or in an unordered queue only those on an
    /// answered page. A parked miss always has a posted page of its own
    /// whose response is still to come (it posted every page it missed,
    /// and a recheck that misses again re-posts), so it is never stranded;
    /// skipping the others keeps a response O(its I/Os), not O(parked),
    /// with no re-posts of pages already requested.
    fn reissue(&mut self, answered: Option<&[usize]>) {
        let due =
            |p: &Pending| answered.is_none_or(|pages| pages.iter().any(|pg| p.pages.contains(pg)));
        let unordered = self.dev.ordering == Ordering::Unordered;
        let n = self.parked.len();
        // Pipelined checks, as in `submit_batch`.
        for p in self.parked.iter().filter(|p| due(p)).take(PREFETCH_AHEAD) {
            self.dev.region.io_prefetch(p.pages.clone());
        }
        for _ in 0..n {
            let Some(mut p) = self.parked.pop_front() else {
                break;
            };
            if unordered && !due(&p) {
                self.parked.push_back(p);
                continue;
            }
            if let Some(next) = self.parked.get(PREFETCH_AHEAD - 1).filter(|q| due(q)) {
                self.dev.region.io_prefetch(next.pages.clone());
            }
            self.dev.counters.parked.fetch_sub(1, Relaxed);
            if p.wait == 0 {
                self.dev.counters.reissued.fetch_add(1, Relaxed);
            }
            p.wait = 0;
            if let Some(p) = self.try_issue(p) {
                self.dev.counters.parked.fetch_add(1, Relaxed);
                match self.dev.ordering {
                    // The head still misses: the queue stays paused.
                    Ordering::Ordered => {
                        self.parked.push_front(p);
                        break;
                    }
                    Ordering::Unordered => self.parked.push_back(p),
                }
            }
        }
        self.flush_log();
    }

    fn reap(&mut self) {
        let Some(u) = self.uring.as_mut() else {
            return;
        };
        let mut done = Vec::new();
        for cqe in u.ring.completion() {
            if cqe.user_data() == WAKE {
                u.wake_armed = false;
                self.responder.wake.drain();
                continue;
            }
            if cqe.user_data() == CANCEL {
                continue;
            }
            let slot = cqe.user_data() as usize;
            let p = u.slots[slot].take().expect("a CQE for a live slot");
            u.free.push(slot);
            let r = cqe.result();
            done.push((
                p,
                if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(r as usize)
                },
            ));
        }
        if !done.is_empty() && self.parked.iter().any(|p| p.wait == WAIT_SLOT) {
            self.kick = true;
        }
        for (p, res) in done {
            self.dev.region.io_release(p.pages.clone());
            self.finish(p, res);
        }
    }

    /// Blocks on the ring (an I/O completion or a page response) for at
    /// most `d`.
    fn wait_uring(&mut self, d: Duration) {
        let efd = self.responder.wake.raw();
        let u = self.uring.as_mut().expect("uring backend");
        if !u.wake_armed {
            let sqe = opcode::PollAdd::new(types::Fd(efd), 1 /* POLLIN */)
                .build()
                .user_data(WAKE);
            // SAFETY: polling our own eventfd, which outlives the ring
            // (the queue owns both; the ring is dropped first).
            if unsafe { u.ring.submission().push(&sqe) }.is_ok() {
                u.wake_armed = true;
            }
        }
        let ts = types::Timespec::from(d);
        let args = types::SubmitArgs::new().timespec(&ts);
        let _ = u.ring.submitter().submit_with_args(1, &args);
        self.reap();
    }

    /// The next completion, waiting up to `timeout` for one.
    pub fn complete(&mut self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        loop {
            self.poll();
            if let Some(c) = self.ready.pop_front() {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if self.kick {
                continue;
            }
            let left = deadline - now;
            // Where this queue's thread sleeps: the device's drain keeps
            // off that CPU.
            self.dev.queue_cpu.store(
                faultline_sys::thread::current_cpu().unwrap_or(crate::shared::NO_CPU),
                Relaxed,
            );
            if self.uring.is_some() {
                self.wait_uring(left);
            } else {
                self.wait_syscall(left);
            }
        }
    }

    /// Syscall backend: waits at most `d` for a page response or for a
    /// socket a waiting I/O needs (in an ordered queue only the head's:
    /// the others cannot go before it) to become ready.
    fn wait_syscall(&mut self, d: Duration) {
        let entry = |fd: i32, events: i16| PollFd {
            fd,
            events,
            revents: 0,
        };
        let mut fds = vec![entry(self.responder.wake.raw(), events::IN)];
        let waiting = self.parked.iter().filter(|p| p.wait > 0);
        let socket = |p: &Pending| entry(p.io.target.fd().as_raw_fd(), p.wait);
        match self.dev.ordering {
            Ordering::Ordered => fds.extend(self.parked.front().filter(|p| p.wait > 0).map(socket)),
            Ordering::Unordered => fds.extend(waiting.map(socket)),
        }
        let ms = d.as_millis().clamp(1, i32::MAX as u128) as i32;
        if poll::poll(&mut fds, ms).is_ok() && fds[1..].iter().any(|f| f.revents != 0) {
            self.kick = true;
        }
        self.responder.wake.drain();
    }

    /// Completions already available, without waiting.
    pub fn drain_completions(&mut self) -> Vec<Completion> {
        self.poll();
        self.ready.drain(..).collect()
    }

    /// I/Os submitted and not yet delivered (parked, waiting for a socket,
    /// in flight, or waiting for an earlier one in an ordered queue).
    pub fn outstanding(&self) -> usize {
        let inflight = self
            .uring
            .as_ref()
            .map_or(0, |u| u.slots.len() - u.free.len());
        self.parked.len() + inflight + self.reorder.len() + self.ready.len()
    }

    /// I/Os parked now: on a page fault, or (syscall backend) waiting for
    /// their socket, or for a free io_uring slot.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Registers the whole region as io_uring fixed buffer 0, after which
    /// file reads and writes use `READ_FIXED`/`WRITE_FIXED`. The kernel
    /// pins registered memory for the registration's lifetime, so this is
    /// refused ([`Error::Unsupported`]) for a region that can evict (a
    /// budget region) unless the device pins all of it
    /// ([`crate::PinMode::All`]); every page is resolved first.
    pub fn register_region_buffers(&mut self) -> Result<()> {
        let region = self.dev.region.clone();
        if self.uring.is_none() {
            return Err(Error::Unsupported {
                what: "fixed buffers",
                reason: "only for the io_uring backend".into(),
            });
        }
        if region.tracks_dirty() && !self.dev.pin_all {
            return Err(Error::Unsupported {
                what: "fixed buffers",
                reason: "the region evicts under a budget and io_uring pins registered memory \
                         long-term: a concurrent eviction would orphan the pinned pages (use \
                         PinMode::All)"
                    .into(),
            });
        }
        region
            .resolve_pages(0..region.pages(), true, Duration::from_secs(60))
            .map_err(Error::Resolve)?;
        let u = self.uring.as_ref().expect("uring backend");
        // SAFETY: the region stays mapped while the device (held by this
        // queue) holds it, and the ring is dropped with the queue.
        unsafe {
            u.ring
                .submitter()
                .register_buffers(&[mem::iovec(region.as_ptr(), region.len())])
        }
        .map_err(|e| Error::Io {
            op: "IORING_REGISTER_BUFFERS",
            source: e,
        })?;
        self.fixed = true;
        Ok(())
    }
}

impl Drop for IoQueue {
    fn drop(&mut self) {
        // Wait for I/Os the kernel still holds: their buffers are region
        // memory and their pages hold our references. Socket I/Os may wait
        // for data forever: cancel them first (file I/Os finish by
        // themselves).
        if let Some(u) = self.uring.as_mut() {
            for (slot, p) in u.slots.iter().enumerate() {
                if p.as_ref()
                    .is_some_and(|p| !matches!(p.io.target, Target::File(_)))
                {
                    let sqe = opcode::AsyncCancel::new(slot as u64)
                        .build()
                        .user_data(CANCEL);
                    // SAFETY: a cancel request carries no buffer.
                    while unsafe { u.ring.submission().push(&sqe) }.is_err() {
                        let _ = u.ring.submit();
                    }
                }
            }
            let _ = u.ring.submit();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .uring
            .as_ref()
            .is_some_and(|u| u.slots.iter().any(Option::is_some))
            && Instant::now() < deadline
        {
            self.wait_uring(Duration::from_millis(10));
        }
        let parked = self.parked.len() as u64;
        self.dev.counters.parked.fetch_sub(parked, Relaxed);
    }
}
