//! Exact write watchpoints through the x86 debug registers, process-wide.
//!
//! A slot is one `perf_event_open(PERF_TYPE_BREAKPOINT)` write breakpoint
//! per thread (see [`faultline::sys::perf`]), opened on every thread listed in
//! `/proc/self/task`. Every write by user code to the watched range raises
//! a synchronous `SIGTRAP` in the writing thread, after the write (the
//! saved RIP is the next instruction), with `si_code = TRAP_PERF` and
//! `si_perf_data` = the slot's tag ([`faultline::sys::perf::perf_sig_data`]
//! decodes it). Installing a `SIGTRAP` handler is the caller's job: without
//! one, the first hit kills the process.
//!
//! What is covered (verified by the tests below on Linux 6.18):
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

use faultline::sys::perf::{self, PerfError};

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
            Err(e) if e.errno() == libc::ESRCH => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use faultline::sys::perf::{perf_trap, PERF_TYPE_BREAKPOINT};
    use faultline::sys::thread::{gettid, install_sigaction};
    use std::cell::Cell;
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::time::Duration;

    const TAG_BASE: u64 = 0x4857_7000;
    const NTAGS: usize = 8;
    const T: Duration = Duration::from_secs(20);

    static HITS: [AtomicU64; NTAGS] = [const { AtomicU64::new(0) }; NTAGS];
    static FOREIGN: AtomicU64 = AtomicU64::new(0);
    static NON_PERF: AtomicU64 = AtomicU64::new(0);
    static BAD_TYPE: AtomicU64 = AtomicU64::new(0);
    static LAST_ADDR: AtomicU64 = AtomicU64::new(0);
    static LAST_RIP: AtomicU64 = AtomicU64::new(0);
    static LAST_TID: AtomicU64 = AtomicU64::new(0);

    /// Serialises the tests that use debug registers: arming "every
    /// thread" also uses slots of other test threads.
    static HW_TEST_LOCK: Mutex<()> = Mutex::new(());

    thread_local! {
        static MY_HITS: Cell<u64> = const { Cell::new(0) };
    }

    extern "C" fn on_sigtrap(_sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
        let Some(t) = (unsafe { perf_trap(info) }) else {
            NON_PERF.fetch_add(1, SeqCst);
            return;
        };
        let i = t.data.wrapping_sub(TAG_BASE);
        if i < NTAGS as u64 {
            HITS[i as usize].fetch_add(1, SeqCst);
        } else {
            FOREIGN.fetch_add(1, SeqCst);
        }
        if t.perf_type != PERF_TYPE_BREAKPOINT || t.flags != 0 {
            BAD_TYPE.fetch_add(1, SeqCst);
        }
        LAST_ADDR.store(t.addr, SeqCst);
        LAST_TID.store(gettid() as u64, SeqCst);
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the kernel passes a valid ucontext to SA_SIGINFO
            // handlers.
            let rip = unsafe {
                (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize]
            };
            LAST_RIP.store(rip as u64, SeqCst);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = ctx;
        MY_HITS.with(|c| c.set(c.get() + 1));
    }

    /// Serialises the tests and installs the counting SIGTRAP handler;
    /// restores the previous handler on drop.
    struct Trap {
        old: libc::sigaction,
        _serial: MutexGuard<'static, ()>,
    }

    fn trap() -> Trap {
        let serial = HW_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for h in &HITS {
            h.store(0, SeqCst);
        }
        for c in [
            &FOREIGN, &NON_PERF, &BAD_TYPE, &LAST_ADDR, &LAST_RIP, &LAST_TID,
        ] {
            c.store(0, SeqCst);
        }
        let old = install_sigaction(libc::SIGTRAP, on_sigtrap, false).expect("sigaction");
        Trap {
            old,
            _serial: serial,
        }
    }

    impl Drop for Trap {
        fn drop(&mut self) {
            // SAFETY: restoring the action saved by `trap`.
            unsafe {
                libc::sigaction(libc::SIGTRAP, &self.old, std::ptr::null_mut());
            }
        }
    }

    fn hits(tag: usize) -> u64 {
        HITS[tag].load(SeqCst)
    }

    fn total_hits() -> u64 {
        HITS.iter().map(|h| h.load(SeqCst)).sum::<u64>() + FOREIGN.load(SeqCst)
    }

    fn my_hits() -> u64 {
        MY_HITS.with(Cell::get)
    }

    /// A page that nothing else in the process ever touches (leaked, so
    /// never reused while a test thread may still be armed).
    #[repr(C, align(4096))]
    struct Page([u64; 512]);

    /// 64 usable bytes in the middle of a private page, far from any other
    /// allocation: glibc's masked vector stores next to a watched range
    /// trigger it (see the module documentation).
    fn cells() -> usize {
        Box::leak(Box::new(Page([0; 512]))).0.as_mut_ptr() as usize + 2048
    }

    fn write(addr: usize, v: u64) {
        // SAFETY: `addr` is inside a leaked `Page`, aligned for u64.
        unsafe { std::ptr::write_volatile(addr as *mut u64, v) }
    }

    fn write_u8(addr: usize, v: u8) {
        // SAFETY: `addr` is inside a leaked `Page`.
        unsafe { std::ptr::write_volatile(addr as *mut u8, v) }
    }

    fn read(addr: usize) -> u64 {
        // SAFETY: as in `write`.
        unsafe { std::ptr::read_volatile(addr as *const u64) }
    }

    /// One 8-byte store; returns the addresses of the store instruction and
    /// of the next one.
    #[cfg(target_arch = "x86_64")]
    fn store_at_known_ip(addr: usize, v: u64) -> (u64, u64) {
        let (before, after): (u64, u64);
        // SAFETY: `addr` is inside a leaked `Page`, aligned for u64; the
        // asm only computes two addresses and does that store.
        unsafe {
            std::arch::asm!(
                "lea {b}, [rip + 2f]",
                "lea {a}, [rip + 3f]",
                "2:",
                "mov qword ptr [{p}], {v}",
                "3:",
                p = in(reg) addr,
                v = in(reg) v,
                b = out(reg) before,
                a = out(reg) after,
                options(nostack, preserves_flags),
            );
        }
        (before, after)
    }

    #[test]
    fn fits_rules() {
        assert!(HwSlots::fits(0x1000, 8));
        assert!(HwSlots::fits(0x1004, 4));
        assert!(HwSlots::fits(0x1002, 2));
        assert!(HwSlots::fits(0x1003, 1));
        assert!(!HwSlots::fits(0x1004, 8));
        assert!(!HwSlots::fits(0x1002, 4));
        assert!(!HwSlots::fits(0x1000, 3));
        assert!(!HwSlots::fits(0x1000, 16));
        assert!(!HwSlots::fits(0x1000, 0));
    }

    #[test]
    fn one_slot_exact_hits() {
        let _trap = trap();
        let slots = HwSlots::new();
        let base = cells();
        let watched = base + 8;
        let slot = slots.arm(watched as u64, 8, TAG_BASE).expect("arm");
        assert_eq!(slots.armed(), 1);
        assert!(slots.armed_threads(slot).contains(&gettid()));

        let mine = my_hits();
        for i in 0..1000 {
            write(watched, i);
        }
        assert_eq!(hits(0), 1000);
        assert_eq!(
            my_hits() - mine,
            1000,
            "the writing thread gets the SIGTRAP"
        );
        assert_eq!(LAST_TID.load(SeqCst), gettid() as u64);
        assert_eq!(LAST_ADDR.load(SeqCst), watched as u64, "si_addr = bp_addr");
        assert_eq!(FOREIGN.load(SeqCst) + NON_PERF.load(SeqCst), 0);
        assert_eq!(BAD_TYPE.load(SeqCst), 0);

        // The trap comes after the store, which has completed.
        #[cfg(target_arch = "x86_64")]
        {
            let (before, after) = store_at_known_ip(watched, 77);
            assert_eq!(hits(0), 1001);
            assert_eq!(read(watched), 77);
            assert_ne!(LAST_RIP.load(SeqCst), before);
            assert_eq!(LAST_RIP.load(SeqCst), after, "RIP = next instruction");
        }
        let h = hits(0);

        // A one-byte store inside the range hits.
        write_u8(watched + 5, 1);
        assert_eq!(hits(0), h + 1);
        assert_eq!(LAST_ADDR.load(SeqCst), watched as u64);

        // Neighbouring bytes and reads do not.
        for i in 0..1000u64 {
            write_u8(watched - 1, i as u8);
            write_u8(watched + 8, i as u8);
            write(watched + 16, i);
            std::hint::black_box(read(watched));
        }
        assert_eq!(hits(0), h + 1);

        // Cost per hit.
        let n = 2000u64;
        let t0 = faultline::sys::rdtsc();
        for i in 0..n {
            write(watched, i);
        }
        let per_hit = (faultline::sys::rdtsc() - t0) / n;
        assert_eq!(hits(0), h + 1 + n);
        eprintln!("hardware watchpoint: {per_hit} cycles per hit");

        slots.disarm(slot).expect("disarm");
        assert_eq!(slots.armed(), 0);
        assert!(matches!(slots.disarm(slot), Err(HwError::NotArmed(_))));
        for i in 0..1000 {
            write(watched, i);
        }
        assert_eq!(total_hits(), h + 1 + n, "no hits after disarm");
    }

    #[test]
    fn four_slots_then_no_free_slot() {
        let _trap = trap();
        let slots = HwSlots::new();
        let base = cells();
        // One slot of each length.
        let ranges = [
            (base + 8, 8u64),
            (base + 20, 4),
            (base + 26, 2),
            (base + 29, 1),
        ];
        for (i, &(addr, len)) in ranges.iter().enumerate() {
            assert_eq!(slots.arm(addr as u64, len, TAG_BASE + i as u64).unwrap(), i);
        }
        assert_eq!(slots.armed(), 4);
        for (i, &(addr, _)) in ranges.iter().enumerate() {
            for _ in 0..10 {
                write_u8(addr, 1);
            }
            assert_eq!(hits(i), 10, "slot {i}");
        }
        // Bytes just outside each range.
        for &(addr, len) in &ranges {
            write_u8(addr - 1, 2);
            write_u8(addr + len as usize, 2);
        }
        assert_eq!(total_hits(), 40);

        let err = slots.arm(base as u64 + 32, 8, TAG_BASE + 4).unwrap_err();
        assert!(matches!(err, HwError::NoFreeSlot { max: 4 }), "{err}");
        assert!(err.to_string().contains("no free"), "{err}");
        assert_eq!(slots.armed(), 4);
        write(base + 32, 1);
        assert_eq!(total_hits(), 40, "nothing half-armed");

        // Unfit ranges are refused before looking for a slot.
        let err = slots.arm(base as u64 + 4, 8, TAG_BASE).unwrap_err();
        assert!(matches!(err, HwError::Unfit { .. }), "{err}");
        assert!(matches!(
            slots.arm(base as u64, 3, TAG_BASE),
            Err(HwError::Unfit { .. })
        ));

        // A freed slot is reused.
        slots.disarm(2).unwrap();
        assert_eq!(slots.arm(base as u64 + 32, 8, TAG_BASE + 4).unwrap(), 2);
        write(base + 32, 1);
        write_u8(base + 26, 1);
        assert_eq!(hits(4), 1);
        assert_eq!(hits(2), 10);
        drop(slots);
        write(base + 32, 1);
        write(base + 8, 1);
        assert_eq!(total_hits(), 41, "dropping HwSlots disarms everything");
    }

    #[test]
    fn failure_on_one_thread_leaves_nothing_armed() {
        let _trap = trap();
        let slots = HwSlots::new();
        let base = cells();
        // A thread whose four debug registers are taken by breakpoints of
        // its own (never hit).
        let (tx, rx) = channel::<i32>();
        let (done_tx, done_rx) = channel::<()>();
        let helper = std::thread::spawn(move || {
            let me = gettid();
            let _fds: Vec<OwnedFd> = (0..4)
                .map(|i| perf::open_write_breakpoint(me, (base + 32 + 8 * i) as u64, 8, 0).unwrap())
                .collect();
            tx.send(me).unwrap();
            done_rx.recv_timeout(T).unwrap();
        });
        let busy = rx.recv_timeout(T).expect("helper ready");
        let err = slots.arm(base as u64, 8, TAG_BASE).unwrap_err();
        match &err {
            HwError::Open { tid, source } => {
                assert_eq!(*tid, busy, "{err}");
                assert_eq!(source.errno(), libc::ENOSPC, "{err}");
            }
            e => panic!("unexpected {e}"),
        }
        assert_eq!(err.errno(), Some(libc::ENOSPC));
        assert!(err.to_string().contains(&busy.to_string()), "{err}");
        assert_eq!(slots.armed(), 0);
        write(base, 1);
        assert_eq!(total_hits(), 0, "rolled back on the threads armed first");
        done_tx.send(()).unwrap();
        helper.join().unwrap();
        // With the registers free again it works.
        let slot = slots.arm(base as u64, 8, TAG_BASE).unwrap();
        write(base, 1);
        assert_eq!(hits(0), 1);
        slots.disarm(slot).unwrap();
    }

    enum Report {
        Tid(i32),
        Armed { own: u64, child: u64 },
        Disarmed { own: u64, late_child: u64 },
    }

    /// Writes `n` times to `addr` in a new thread (spawned by the calling
    /// thread) once `go` fires; reports the hits that thread received.
    fn spawn_writer(addr: usize, n: u64, go: Option<Receiver<()>>) -> Receiver<u64> {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            if let Some(go) = go {
                go.recv_timeout(T).expect("go");
            }
            let mine = my_hits();
            for i in 0..n {
                write(addr, i);
            }
            tx.send(my_hits() - mine).unwrap();
        });
        rx
    }

    fn worker(addr: usize, n: u64, m: u64, ctl: Receiver<()>, rep: Sender<Report>) {
        rep.send(Report::Tid(gettid())).unwrap();
        // Phase 1: armed.
        ctl.recv_timeout(T).expect("phase 1");
        let mine = my_hits();
        for i in 0..n {
            write(addr, i);
        }
        let own = my_hits() - mine;
        // A thread created after arming by this (armed) thread.
        let child = spawn_writer(addr, m, None).recv_timeout(T).expect("child");
        // Another, created now but writing only after the disarm.
        let (late_go, late_rx) = channel();
        let late = spawn_writer(addr, m, Some(late_rx));
        rep.send(Report::Armed { own, child }).unwrap();
        // Phase 2: disarmed.
        ctl.recv_timeout(T).expect("phase 2");
        let mine = my_hits();
        for i in 0..n {
            write(addr, i);
        }
        let own = my_hits() - mine;
        late_go.send(()).unwrap();
        let late_child = late.recv_timeout(T).expect("late child");
        rep.send(Report::Disarmed { own, late_child }).unwrap();
    }

    #[test]
    fn threads_before_and_after_arming() {
        const W: usize = 3;
        const N: u64 = 500;
        const M: u64 = 100;
        let _trap = trap();
        let slots = HwSlots::new();
        let base = cells();
        let addr = base + 24;

        let mut ctls = Vec::new();
        let mut reps = Vec::new();
        let mut handles = Vec::new();
        for _ in 0..W {
            let (ctl_tx, ctl_rx) = channel();
            let (rep_tx, rep_rx) = channel();
            handles.push(std::thread::spawn(move || {
                worker(addr, N, M, ctl_rx, rep_tx)
            }));
            ctls.push(ctl_tx);
            reps.push(rep_rx);
        }
        let tids: Vec<i32> = reps
            .iter()
            .map(|r| match r.recv_timeout(T).expect("tid") {
                Report::Tid(t) => t,
                _ => unreachable!(),
            })
            .collect();

        let slot = slots.arm(addr as u64, 8, TAG_BASE + 1).expect("arm");
        let armed_on = slots.armed_threads(slot);
        for t in tids.iter().chain([&gettid()]) {
            assert!(armed_on.contains(t), "thread {t} armed directly");
        }

        for c in &ctls {
            c.send(()).unwrap();
        }
        for (i, r) in reps.iter().enumerate() {
            match r.recv_timeout(T).expect("phase 1 report") {
                Report::Armed { own, child } => {
                    assert_eq!(own, N, "worker {i} gets its own SIGTRAPs");
                    assert_eq!(child, M, "thread created by armed worker {i} inherits");
                }
                _ => unreachable!(),
            }
        }
        // A thread created after arming by the (armed) test thread.
        let main_child = spawn_writer(addr, M, None)
            .recv_timeout(T)
            .expect("main child");
        assert_eq!(main_child, M);
        assert_eq!(hits(1), W as u64 * (N + M) + M);
        assert_eq!(FOREIGN.load(SeqCst) + NON_PERF.load(SeqCst), 0);

        // Disarm: no more hits, including threads that inherited the
        // breakpoint and are still alive.
        slots.disarm(slot).unwrap();
        for c in &ctls {
            c.send(()).unwrap();
        }
        for (i, r) in reps.iter().enumerate() {
            match r.recv_timeout(T).expect("phase 2 report") {
                Report::Disarmed { own, late_child } => {
                    assert_eq!(own, 0, "worker {i} after disarm");
                    assert_eq!(
                        late_child, 0,
                        "inherited copy in worker {i}'s child removed"
                    );
                }
                _ => unreachable!(),
            }
        }
        assert_eq!(hits(1), W as u64 * (N + M) + M);
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn modify_moves_breakpoint_and_tag() {
        let _trap = trap();
        let base = cells();
        let fd = perf::open_write_breakpoint(gettid(), base as u64, 8, TAG_BASE).unwrap();
        write(base, 1);
        perf::modify_breakpoint(&fd, base as u64 + 8, 4, TAG_BASE + 1).unwrap();
        write(base, 1);
        write(base + 8, 1);
        perf::disable(&fd).unwrap();
        write(base + 8, 1);
        perf::enable(&fd).unwrap();
        write_u8(base + 11, 1);
        write_u8(base + 12, 1);
        assert_eq!((hits(0), hits(1)), (1, 2));
        assert_eq!(total_hits(), 3);
    }
}
