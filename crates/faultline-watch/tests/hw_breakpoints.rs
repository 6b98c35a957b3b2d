//! Hardware write breakpoints (`faultline_watch::hw`) against the real
//! kernel: exact hits, slot exhaustion, rollback when one thread has no free
//! debug register, threads created before and after arming, moving a
//! breakpoint.
//!
//! These tests install a process-wide `SIGTRAP` handler, so they are a test
//! binary of their own (as Wasmtime keeps its signal tests), serialised on
//! one lock: arming "every thread" also uses the debug registers of the
//! other test threads.

use std::cell::Cell;
use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use faultline_sys::perf::{self, PERF_TYPE_BREAKPOINT};
use faultline_sys::signal::{
    install_sigaction, restore_sigaction, SigAction, SigInfo, SignalContext, SIGTRAP,
};
use faultline_sys::thread::gettid;
use faultline_watch::hw::{HwError, HwSlots};

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

extern "C" fn on_sigtrap(sig: i32, info: *mut SigInfo, ctx: *mut c_void) {
    // SAFETY: the arguments of this running SA_SIGINFO handler; `sc` is
    // dropped before it returns.
    let sc = unsafe { SignalContext::from_raw(sig, info, ctx) };
    let Some(t) = sc.perf() else {
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
    LAST_RIP.store(sc.rip(), SeqCst);
    MY_HITS.with(|c| c.set(c.get() + 1));
}

/// Serialises the tests and installs the counting SIGTRAP handler;
/// restores the previous handler on drop.
struct Trap {
    old: SigAction,
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
    let old = install_sigaction(SIGTRAP, on_sigtrap, false).expect("sigaction");
    Trap {
        old,
        _serial: serial,
    }
}

impl Drop for Trap {
    fn drop(&mut self) {
        restore_sigaction(SIGTRAP, &self.old).expect("restoring the SIGTRAP action");
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
    let t0 = faultline_sys::rdtsc();
    for i in 0..n {
        write(watched, i);
    }
    let per_hit = (faultline_sys::rdtsc() - t0) / n;
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
