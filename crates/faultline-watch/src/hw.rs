//! Exact write watchpoints through the x86 debug registers, process-wide.
//!
//! A slot is one `perf_event_open(PERF_TYPE_BREAKPOINT)` write breakpoint
//! per thread (see `faultline_sys::perf`), opened on every thread listed in
//! `/proc/self/task`. Every write by user code to the watched range raises
//! a synchronous `SIGTRAP` in the writing thread, after the write (the
//! saved RIP is the next instruction), with `si_code = TRAP_PERF` and
//! `si_perf_data` = the slot's tag (`SignalContext::perf` reads it). Installing a `SIGTRAP` handler is the caller's job: without
//! one, the first hit kills the process.
//!
//! What is covered (verified by `tests/hw_breakpoints.rs` on Linux 6.18):
//! * every thread that existed when [`HwSlots::arm`] listed the threads;
//! * every thread created later by a covered thread (`clone` with
//!   `CLONE_THREAD`, i.e. `pthread_create` / `std::thread::spawn`): the
//!   breakpoint is inherited (`inherit` + `inherit_thread`), transitively,
//!   and stays in force even after the creating thread exits.
//!
//! What is not covered:
//! * child *processes* (`fork`, or `clone` without `CLONE_THREAD`) and
//!   clones made with `CLONE_CLEAR_SIGHAND`: no inheritance; after `exec`
//!   the breakpoints are removed (`remove_on_exec`);
//! * writes made by the kernel on the process's behalf (`read(2)` into the
//!   range, ...): `exclude_kernel` is set, they do not trigger.
//! * a thread whose `clone` overlaps `arm` can copy its creator's
//!   breakpoints before the creator is armed and still be missing from the
//!   listing. `arm` lists the threads again once it has armed them all and,
//!   if a new thread showed up, closes everything and starts over (up to 8
//!   times). What remains is a window of about one `clone` (a thread still
//!   inside `clone` when the second listing is taken); threads are never
//!   armed twice. The tests cannot provoke it; arm while the process is not
//!   creating threads if exactness matters.
//!
//! Disarming closes the slot's fds, which removes the breakpoint from the
//! threads it was opened on and from all the threads that inherited it.
//!
//! False positives: the debug-register match is on the accessed range, and
//! on this CPU (AMD EPYC, AVX-512) a *masked* vector store whose full
//! vector width covers the range triggers even when the watched bytes are
//! masked off and keep their value. glibc's small `memset`/`memcpy`
//! (`vmovdqu8 zmm{k}`) do that to memory up to 63 bytes beyond their
//! buffer: a heap neighbour of a watched variable being cleared raises a
//! hit. A handler that needs "the value changed" must compare values.
//!
//! Other notes: a thread has 4 debug registers in all, shared with anything
//! else that uses them (a debugger, another `HwSlots`), so `arm` can fail
//! with ENOSPC on one thread while [`HwSlots::armed`] < [`HwSlots::MAX`].
//! If `SIGTRAP` is blocked in a thread, its hits stay pending and coalesce
//! into one signal delivered at unblock. Each hit costs ~45,000 cycles in
//! a KVM guest (the hypervisor intercepts `#DB`).

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard};

use faultline_sys::perf::{self, PerfError};
use faultline_sys::Errno;

/// Attempts of `arm` before it settles for an arming during which threads
/// kept appearing.
const MAX_ATTEMPTS: usize = 8;

/// A failed [`HwSlots`] operation.
#[derive(Debug, thiserror::Error)]
pub enum HwError {
    /// All slots are in use.
    #[error("no free hardware watchpoint slot (all {max} in use)")]
    NoFreeSlot {
        /// The number of slots.
        max: usize,
    },
    /// The range cannot use a debug register.
    #[error(
        "[{addr:#x}, +{len}) cannot use a debug register: the length must be 1, 2, 4 or 8 \
         and the address a multiple of it"
    )]
    Unfit {
        /// Start of the range.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// `disarm` of a slot that is not armed (or out of range).
    #[error("hardware watchpoint slot {0} is not armed")]
    NotArmed(usize),
    /// `perf_event_open` failed for one thread (ENOSPC: that thread's debug
    /// registers are all in use). Nothing stays armed.
    #[error("arming a hardware watchpoint on thread {tid}: {source}")]
    Open {
        /// The thread.
        tid: i32,
        /// The failed call, with its errno.
        #[source]
        source: PerfError,
    },
    /// Listing `/proc/self/task` failed.
    #[error("listing the threads in /proc/self/task: {0}")]
    ListThreads(#[source] io::Error),
}

impl HwError {
    /// The errno behind the error, if the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            HwError::Open { source, .. } => Some(source.errno()),
            HwError::ListThreads(e) => e.raw_os_error(),
            _ => None,
        }
    }
}

/// One armed slot: the breakpoint's fd on each thread it was opened on.
#[derive(Debug)]
struct Slot {
    fds: Vec<(i32, OwnedFd)>,
}

/// Up to 4 exact write watchpoints on 1/2/4/8-byte naturally aligned
/// ranges, in EVERY thread of the process (see the module documentation
/// for what exactly is covered).
#[derive(Debug, Default)]
pub struct HwSlots {
    slots: Mutex<[Option<Slot>; HwSlots::MAX]>,
}

impl HwSlots {
    /// Debug registers per thread on x86_64.
    pub const MAX: usize = 4;

    /// No slot armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `[addr, addr + len)` can use a debug register (`len` in
    /// {1, 2, 4, 8}, `addr % len == 0`). The kernel also rejects kernel
    /// addresses (EINVAL from [`HwSlots::arm`]).
    pub fn fits(addr: u64, len: u64) -> bool {
        matches!(len, 1 | 2 | 4 | 8) && addr.is_multiple_of(len)
    }

    fn lock(&self) -> MutexGuard<'_, [Option<Slot>; HwSlots::MAX]> {
        // A panic while holding the lock cannot leave a slot half-built:
        // slots are only stored once complete.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms a free slot on every current thread of the process (listed in
    /// `/proc/self/task`) with `si_perf_data = tag`; returns the slot
    /// index. Threads created later by an armed thread inherit the
    /// breakpoint. Threads that exit before they can be armed (ESRCH) are
    /// skipped. On error nothing is left armed.
    pub fn arm(&self, addr: u64, len: u64, tag: u64) -> Result<usize, HwError> {
        if !Self::fits(addr, len) {
            return Err(HwError::Unfit { addr, len });
        }
        let mut slots = self.lock();
        let idx = slots
            .iter()
            .position(Option::is_none)
            .ok_or(HwError::NoFreeSlot { max: Self::MAX })?;
        // A thread whose clone() overlaps the arming may have copied its
        // creator's breakpoints before the creator was armed, yet not have
        // been listed: re-list after arming and, if a thread appeared, start
        // over from scratch (closing the fds removes every copy, inherited
        // ones included, so no thread ever ends up with two).
        let mut fds = Vec::new();
        for _ in 0..MAX_ATTEMPTS {
            // Close the previous attempt first, so that no thread can
            // inherit from both attempts.
            drop(std::mem::take(&mut fds));
            let before = list_threads().map_err(HwError::ListThreads)?;
            fds = open_on_all(&before, addr, len, tag)?;
            let after = list_threads().map_err(HwError::ListThreads)?;
            let before: HashSet<i32> = before.into_iter().collect();
            if after.iter().all(|t| before.contains(t)) {
                break;
            }
        }
        slots[idx] = Some(Slot { fds });
        Ok(idx)
    }

    /// Disarms slot `slot` on every thread (closes its fds; inherited
    /// copies go with them).
    pub fn disarm(&self, slot: usize) -> Result<(), HwError> {
        let taken = self
            .lock()
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or(HwError::NotArmed(slot))?;
        drop(taken);
        Ok(())
    }

    /// Number of armed slots.
    pub fn armed(&self) -> usize {
        self.lock().iter().filter(|s| s.is_some()).count()
    }

    /// The threads slot `slot` was opened on directly (threads that
    /// inherited it are not listed); empty if not armed.
    pub fn armed_threads(&self, slot: usize) -> Vec<i32> {
        self.lock()
            .get(slot)
            .and_then(Option::as_ref)
            .map(|s| s.fds.iter().map(|(tid, _)| *tid).collect())
            .unwrap_or_default()
    }
}

/// Opens the breakpoint on each of `tids`, skipping threads that are gone.
/// On error, the fds opened so far are closed (dropped).
fn open_on_all(
    tids: &[i32],
    addr: u64,
    len: u64,
    tag: u64,
) -> Result<Vec<(i32, OwnedFd)>, HwError> {
    let mut fds = Vec::with_capacity(tids.len());
    for &tid in tids {
        match perf::open_write_breakpoint(tid, addr, len, tag) {
            Ok(fd) => fds.push((tid, fd)),
            // Exited (or a zombie thread-group leader): nothing to watch.
            Err(e) if e.is(Errno::ESRCH) => {}
            Err(source) => return Err(HwError::Open { tid, source }),
        }
    }
    Ok(fds)
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<HwSlots>();
};

/// The tids in `/proc/self/task`.
fn list_threads() -> io::Result<Vec<i32>> {
    let mut tids = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            tids.push(tid);
        }
    }
    Ok(tids)
}
