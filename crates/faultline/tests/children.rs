//! Scenarios that must kill, abort or hang a process run in a child
//! process (this test binary re-executed with `FAULTLINE_CHILD` set); the
//! parent checks how it ended and what it printed, with a timeout on every
//! wait. The parent itself installs no signal handlers.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use faultline::*;

const SIGBUS: i32 = libc::SIGBUS;
const SIGABRT: i32 = libc::SIGABRT;
const CHILD_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- store errors

/// A store that fails from page `fail_from` on; `fault_around` pages per
/// fault (None: the default read-ahead). Reads a page before the failing
/// ones (it must succeed although its read-ahead window reaches them),
/// then a failing one (SIGBUS).
struct StoreErrorCase {
    fault_around: Option<usize>,
    fail_from: usize,
    good: usize,
    bad: usize,
}

const WHOLE_REGION_FAILS_PAST_8: StoreErrorCase = StoreErrorCase {
    fault_around: None,
    fail_from: 8,
    good: 1,
    bad: 9,
};

fn store_error_child(kind: EngineKind, case: &StoreErrorCase) {
    let len = 16 * 4096;
    let data = vec![0x5Au8; len];
    let mut b = Region::builder(len).store(FailingStore {
        inner: MemoryStore::new(data),
        fail_from: (case.fail_from * 4096) as u64,
    });
    if let Some(fa) = case.fault_around {
        b = b.fault_around(fa);
    }
    let region = b.build_dyn(engine_of(kind)).unwrap();
    say(&format!("REGION {}", region.id()));
    say(&format!(
        "GOOD {:#x}",
        read(region.as_ptr(), case.good * 4096)
    ));
    let v = read(region.as_ptr(), case.bad * 4096 + 3);
    // Must not get here: the page is poisoned.
    say(&format!("READ {v:#x}"));
}

fn check_store_error(name: &str, kind: EngineKind) {
    check_store_error_case(name, kind, &WHOLE_REGION_FAILS_PAST_8);
}

fn check_store_error_case(name: &str, kind: EngineKind, case: &StoreErrorCase) {
    if let Some(s) = child_scenario() {
        if s == name {
            store_error_child(kind, case);
        }
        return;
    }
    let r = run_child(name, name, CHILD_TIMEOUT);
    assert!(!r.timed_out, "{name}: child hung\n{}", r.stderr);
    assert_eq!(
        r.signal(),
        Some(SIGBUS),
        "{name}: {:?}\n{}",
        r.status,
        r.stderr
    );
    assert!(r.stdout.contains("GOOD 0x5a"), "{}", r.stdout);
    assert!(
        !r.stdout.contains("READ"),
        "{name}: the faulting thread read a value: {}",
        r.stdout
    );
    assert!(
        r.stderr.contains("store error at region #")
            && r.stderr.contains(&format!("offset {:#x}", case.bad * 4096))
            && r.stderr.contains("injected failure"),
        "{name}: message names region, offset and cause:\n{}",
        r.stderr
    );
}

#[test]
fn store_error_poisons_poll() {
    check_store_error("store_error_poisons_poll", EngineKind::Poll);
}
#[test]
fn store_error_poisons_spin() {
    check_store_error("store_error_poisons_spin", EngineKind::Spin);
}
#[test]
fn store_error_poisons_workers() {
    check_store_error("store_error_poisons_workers", EngineKind::Workers);
}
#[test]
fn store_error_poisons_signal() {
    check_store_error("store_error_poisons_signal", EngineKind::Signal);
}

/// Fault-around must not widen a failure: with 8 pages per fault and a
/// store failing from page 5, page 0 reads its data (its window is cut back
/// to the page itself), and only page 6's own failure poisons page 6.
const WINDOW_REACHES_FAILING_PAGES: StoreErrorCase = StoreErrorCase {
    fault_around: Some(8),
    fail_from: 5,
    good: 0,
    bad: 6,
};

#[test]
fn window_store_error_poisons_only_its_page_signal() {
    check_store_error_case(
        "window_store_error_poisons_only_its_page_signal",
        EngineKind::Signal,
        &WINDOW_REACHES_FAILING_PAGES,
    );
}
#[test]
fn window_store_error_poisons_only_its_page_poll() {
    check_store_error_case(
        "window_store_error_poisons_only_its_page_poll",
        EngineKind::Poll,
        &WINDOW_REACHES_FAILING_PAGES,
    );
}

// ---------------------------------------------------------------- panics

fn check_panic(name: &str, kind: EngineKind) {
    if let Some(s) = child_scenario() {
        if s == name {
            let region = Region::builder(4 * 4096)
                .store(PanickingStore)
                .build_dyn(engine_of(kind))
                .unwrap();
            let v = read(region.as_ptr(), 0);
            say(&format!("READ {v:#x}"));
        }
        return;
    }
    let r = run_child(name, name, CHILD_TIMEOUT);
    assert!(!r.timed_out, "{name}: child hung\n{}", r.stderr);
    assert_eq!(
        r.signal(),
        Some(SIGABRT),
        "{name}: {:?}\n{}",
        r.status,
        r.stderr
    );
    assert!(!r.stdout.contains("READ"), "{}", r.stdout);
    assert!(
        r.stderr.contains("panicked") && r.stderr.contains("failing closed"),
        "{}",
        r.stderr
    );
}

#[test]
fn store_panic_fails_closed_poll() {
    check_panic("store_panic_fails_closed_poll", EngineKind::Poll);
}
#[test]
fn store_panic_fails_closed_workers() {
    check_panic("store_panic_fails_closed_workers", EngineKind::Workers);
}
#[test]
fn store_panic_fails_closed_signal() {
    check_panic("store_panic_fails_closed_signal", EngineKind::Signal);
}

// ---------------------------------------------------------------- stalls

fn stall_child(watchdog: bool) {
    let cfg = EngineConfig {
        stall_timeout: watchdog.then_some(Duration::from_millis(300)),
        ..EngineConfig::default()
    };
    let store = SlowStore {
        inner: MemoryStore::new(vec![1; 4 * 4096]),
        delay: Duration::from_secs(3600),
        entered: AtomicUsize::new(0),
    };
    let region = Region::builder(4 * 4096)
        .store(store)
        .build_dyn(engine::create(EngineKind::Poll, cfg).unwrap())
        .unwrap();
    say("BLOCKING");
    let v = read(region.as_ptr(), 0);
    say(&format!("READ {v:#x}"));
}

#[test]
fn stalled_store_with_watchdog_fails_closed() {
    let name = "stalled_store_with_watchdog_fails_closed";
    if let Some(s) = child_scenario() {
        if s == name {
            stall_child(true);
        }
        return;
    }
    let r = run_child(name, name, CHILD_TIMEOUT);
    assert!(!r.timed_out, "watchdog did not fire\n{}", r.stderr);
    assert_eq!(r.signal(), Some(SIGABRT), "{:?}\n{}", r.status, r.stderr);
    assert!(
        r.stderr.contains("has taken more than") && r.stderr.contains("slow-test-store"),
        "{}",
        r.stderr
    );
    assert!(!r.stdout.contains("READ"));
}

#[test]
fn stalled_store_without_watchdog_times_out_cleanly() {
    let name = "stalled_store_without_watchdog_times_out_cleanly";
    if let Some(s) = child_scenario() {
        if s == name {
            stall_child(false);
        }
        return;
    }
    let r = run_child(name, name, Duration::from_secs(2));
    assert!(
        r.timed_out,
        "the child should still be blocked in its fault: {:?}",
        r.status
    );
    assert!(
        r.stdout.contains("BLOCKING") && !r.stdout.contains("READ"),
        "{}",
        r.stdout
    );
}

// ---------------------------------------------------------------- teardown

static DROPPED_BASE: AtomicU64 = AtomicU64::new(0);
static DROPPED_LEN: AtomicU64 = AtomicU64::new(0);
static FIXUPS: AtomicUsize = AtomicUsize::new(0);

/// The application's own SIGSEGV/SIGBUS handler in the teardown child: an
/// access to the dropped region gets a fresh page filled with 0xEE, so the
/// test can tell "signal" (0xEE) from "zero page" (0x00) from "data".
extern "C" fn fixup(sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: valid siginfo from the kernel.
    let addr = unsafe { (*info).si_addr() } as u64;
    let (b, l) = (DROPPED_BASE.load(SeqCst), DROPPED_LEN.load(SeqCst));
    if b != 0 && addr >= b && addr < b + l {
        let page = addr & !4095;
        // SAFETY: replaces a page of the dropped (unmapped or poisoned)
        // region that nothing else owns any more.
        unsafe {
            let p = libc::mmap(
                page as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            if p != libc::MAP_FAILED {
                libc::memset(p, 0xEE, 4096);
            }
        }
        FIXUPS.fetch_add(1, SeqCst);
        return;
    }
    // SAFETY: restoring the default action and re-raising.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install_fixup() {
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: installing a plain SA_SIGINFO handler.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = fixup as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// `inflight` threads fault on pages whose store fetch is slow; one more
/// thread faults behind them (queued) for the thread engines. The region is
/// dropped while they are in flight.
fn drop_inflight_child(kind: EngineKind, inflight: usize, pages: usize) {
    install_fixup();
    let len = pages * 4096;
    let data = pattern(len);
    let store = Arc::new(SlowStore {
        inner: MemoryStore::new(data.clone()),
        delay: Duration::from_millis(300),
        entered: AtomicUsize::new(0),
    });
    // One page per fault: each reader has a fill of its own in flight.
    let region = Region::builder(len)
        .shared_store(store.clone())
        .fault_around(1)
        .build_dyn(engine_of(kind))
        .unwrap();
    DROPPED_BASE.store(region.addr(), SeqCst);
    DROPPED_LEN.store(len as u64, SeqCst);
    let base = region.as_ptr() as usize;
    let offsets: Vec<usize> = (0..inflight + 1).map(|i| i * 3 * 4096 + 5).collect();
    let mut readers = Vec::new();
    for (i, &off) in offsets.iter().enumerate() {
        if i == inflight {
            // The queued fault: start it once the others are in flight.
            assert!(wait_until(Duration::from_secs(5), || store
                .entered
                .load(SeqCst)
                >= inflight));
        }
        readers.push(std::thread::spawn(move || read(base as *const u8, off)));
    }
    std::thread::sleep(Duration::from_millis(20));
    let t0 = std::time::Instant::now();
    drop(region);
    say(&format!("DROP {:?}", t0.elapsed()));
    for (i, r) in readers.into_iter().enumerate() {
        let v = r.join().unwrap();
        say(&format!("READER {i} {v:#x} want {:#x}", data[offsets[i]]));
    }
    say(&format!("FIXUPS {}", FIXUPS.load(SeqCst)));
}

/// Scenario `name`: in the child, `child` runs (and `None` is
/// returned); in the parent, the child is run and must end well within
/// the timeout: what it printed.
fn child_that_succeeds(name: &str, child: impl FnOnce()) -> Option<ChildResult> {
    if let Some(s) = child_scenario() {
        if s == name {
            child();
        }
        return None;
    }
    let r = run_child(name, name, CHILD_TIMEOUT);
    assert!(!r.timed_out, "{name}: hung\n{}\n{}", r.stdout, r.stderr);
    assert!(
        r.status.is_some_and(|s| s.success()),
        "{name}: {:?}\n{}\n{}",
        r.status,
        r.stdout,
        r.stderr
    );
    Some(r)
}

fn check_drop_inflight(name: &str, kind: EngineKind, inflight: usize, pages: usize) {
    let Some(r) = child_that_succeeds(name, || drop_inflight_child(kind, inflight, pages)) else {
        return;
    };
    let mut data_reads = 0;
    for line in r.stdout.lines().filter(|l| l.starts_with("READER")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (got, want) = (f[2], f[4]);
        assert_ne!(got, "0x0", "{name}: a reader got a zero page: {line}");
        assert!(got == want || got == "0xee", "{name}: {line}");
        if got == want {
            data_reads += 1;
        }
    }
    // The in-flight resolutions completed with the store's data... unless
    // a woken reader lost the race with the unmap (then it saw 0xee).
    assert!(r.stdout.contains("DROP"), "{}", r.stdout);
    eprintln!("{name}: {data_reads} reader(s) got data\n{}", r.stdout);
}

#[test]
fn drop_with_faults_in_flight_never_hands_out_zero_pages_poll() {
    check_drop_inflight(
        "drop_with_faults_in_flight_never_hands_out_zero_pages_poll",
        EngineKind::Poll,
        1,
        64,
    );
}

/// The same in a region whose absent pages after the readers' form a run
/// of more than 2 MiB, made inaccessible at the drop rather than poisoned
/// page by page: the queued reader's page is in it.
#[test]
fn drop_with_faults_in_flight_never_hands_out_zero_pages_long_run() {
    check_drop_inflight(
        "drop_with_faults_in_flight_never_hands_out_zero_pages_long_run",
        EngineKind::Poll,
        1,
        1024,
    );
}

#[test]
fn drop_with_faults_in_flight_never_hands_out_zero_pages_signal() {
    check_drop_inflight(
        "drop_with_faults_in_flight_never_hands_out_zero_pages_signal",
        EngineKind::Signal,
        3,
        64,
    );
}

/// A region dropped while its store still reads a page leaks its state
/// (the drain timeout ran out); the next region of the same length on the
/// same engine must not receive that read's bytes when the store answers.
/// The leaked range stayed unmapped before, so the next region was mapped
/// at the same address and the late `UFFDIO_COPY` installed the dropped
/// region's page in it.
fn drop_leaked_then_new_region_child(kind: EngineKind) {
    install_fixup();
    let len = 16 * 4096;
    let store = Arc::new(SlowStore {
        inner: MemoryStore::new(pattern(len)),
        delay: Duration::from_millis(1000),
        entered: AtomicUsize::new(0),
    });
    let engine = engine_of(kind);
    let old = Region::builder(len)
        .shared_store(store.clone())
        .fault_around(1)
        .drain_timeout(Duration::from_millis(50))
        .build_dyn(engine.clone())
        .unwrap();
    DROPPED_BASE.store(old.addr(), SeqCst);
    DROPPED_LEN.store(len as u64, SeqCst);
    let base = old.as_ptr() as usize;
    let reader = std::thread::spawn(move || read(base as *const u8, 0));
    assert!(wait_until(Duration::from_secs(5), || store
        .entered
        .load(SeqCst)
        >= 1));
    drop(old);
    let new = Region::builder(len)
        .store(MemoryStore::new(vec![0x77; len]))
        .build_dyn(engine)
        .unwrap();
    say(&format!(
        "OLD {base:#x} NEW {:#x} READER {:#x}",
        new.addr(),
        reader.join().unwrap()
    ));
    // The slow read ends, and its copy is tried.
    std::thread::sleep(Duration::from_millis(1500));
    let p = new.as_ptr();
    say(&format!("NEW BYTES {:#x} {:#x}", read(p, 0), read(p, 4096)));
}

fn check_drop_leaked(name: &str, kind: EngineKind) {
    let Some(r) = child_that_succeeds(name, || drop_leaked_then_new_region_child(kind)) else {
        return;
    };
    assert!(r.stderr.contains("leaking its state"), "{}", r.stderr);
    assert!(r.stdout.contains("NEW BYTES 0x77 0x77"), "{}", r.stdout);
}

#[test]
fn a_dropped_regions_late_fill_never_lands_in_the_next_region_poll() {
    check_drop_leaked(
        "a_dropped_regions_late_fill_never_lands_in_the_next_region_poll",
        EngineKind::Poll,
    );
}

#[test]
fn a_dropped_regions_late_fill_never_lands_in_the_next_region_workers() {
    check_drop_leaked(
        "a_dropped_regions_late_fill_never_lands_in_the_next_region_workers",
        EngineKind::Workers,
    );
}

// ---------------------------------------------------------------- chaining

static FOREIGN: AtomicUsize = AtomicUsize::new(0);

extern "C" fn app_sigbus(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: valid siginfo.
    let addr = unsafe { (*info).si_addr() } as u64 & !4095;
    FOREIGN.fetch_add(1, SeqCst);
    // Map something readable where the file ended, so the access can go on.
    // SAFETY: replaces the page past EOF of the test's own file mapping.
    unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

#[test]
fn signal_engine_chains_foreign_sigbus_and_preserves_errno() {
    let name = "signal_engine_chains_foreign_sigbus_and_preserves_errno";
    if let Some(s) = child_scenario() {
        if s != name {
            return;
        }
        // The application's handler comes first.
        // SAFETY: installing a plain SA_SIGINFO handler.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = app_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
        let region = Region::builder(64 * 4096)
            .store(MemoryStore::new(pattern(64 * 4096)))
            .build_dyn(engine_of(EngineKind::Signal))
            .unwrap();
        // errno survives a fault handled in between.
        faultline_sys::set_errno(1234);
        let v = read(region.as_ptr(), 7 * 4096 + 9);
        let e = faultline_sys::errno();
        say(&format!(
            "ERRNO {e} VALUE {v:#x} WANT {:#x}",
            pat(7 * 4096 + 9)
        ));
        // A SIGBUS that is not ours: a file mapping read past EOF.
        let f = TempFile::with(&[7u8; 100]);
        let file = std::fs::File::open(&f.0).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh read-only mapping of a small file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * 4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        } as *const u8;
        assert_eq!(read(p, 0), 7);
        let past = read(p, 4096 + 1);
        say(&format!("FOREIGN {} PAST {past}", FOREIGN.load(SeqCst)));
        say(&format!("STILL {:#x}", read(region.as_ptr(), 9 * 4096)));
        return;
    }
    let r = run_child(name, name, CHILD_TIMEOUT);
    assert!(
        r.status.is_some_and(|s| s.success()),
        "{:?}\n{}\n{}",
        r.status,
        r.stdout,
        r.stderr
    );
    let want = format!(
        "ERRNO 1234 VALUE {:#x} WANT {:#x}",
        pat(7 * 4096 + 9),
        pat(7 * 4096 + 9)
    );
    assert!(r.stdout.contains(&want), "{}", r.stdout);
    assert!(
        r.stdout.contains("FOREIGN 1 PAST 0"),
        "the application's handler saw the foreign SIGBUS: {}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!("STILL {:#x}", pat(9 * 4096))),
        "{}",
        r.stdout
    );
}

// ------------------------------------------------------------ handler CPUs

/// The thread engines pin their handlers within the CPUs the thread that
/// starts them may use (a `taskset`, or the caller's own affinity): started
/// from a thread restricted to the last CPU, the poll, spin, workers and
/// per-cpu handlers all run there (they used to pin to CPU "count - 1" or
/// "i % count" of the count of allowed CPUs: CPU 0 here, outside the
/// mask). Each engine still serves a fault.
#[test]
fn thread_engine_handlers_stay_within_their_creators_cpus() {
    const NAME: &str = "thread_engine_handlers_stay_within_their_creators_cpus";
    if let Some(s) = child_scenario() {
        if s != NAME {
            return;
        }
        let cpus = faultline_sys::thread::allowed_cpus().unwrap();
        let last = *cpus.last().unwrap();
        faultline_sys::thread::pin_to_cpu(last).unwrap();
        let engines: Vec<(Arc<dyn Engine>, &str)> = vec![
            (PollEngine::new().unwrap(), "fl-poll-0"),
            (SpinEngine::new().unwrap(), "fl-spin-0"),
            (WorkersEngine::new().unwrap(), "fl-workers-0"),
            (PerCpuEngine::new().unwrap(), "fl-per-cpu-0"),
        ];
        for (engine, thread) in &engines {
            let region = Region::builder(1 << 20)
                .store(MemoryStore::new(vec![7u8; 1 << 20]))
                .build_dyn(engine.clone())
                .unwrap();
            // SAFETY: inside the live region.
            let v = unsafe { std::ptr::read_volatile(region.as_ptr().add(4096 * 5)) };
            say(&format!("{thread} served {v}"));
            // Read once the handlers have run (a handler not yet started
            // would show the mask it inherited, the expected one).
            std::thread::sleep(Duration::from_millis(20));
            let got: Vec<String> = faultline::testing::threads(std::process::id(), thread)
                .into_iter()
                .filter(|t| t.name == *thread)
                .map(|t| t.cpus)
                .collect();
            say(&format!("{thread} {got:?} want {last}"));
        }
        return;
    }
    let r = run_child(NAME, NAME, CHILD_TIMEOUT);
    assert!(!r.timed_out, "child hung\n{}", r.stderr);
    assert!(r.success(), "{:?}\n{}\n{}", r.status, r.stdout, r.stderr);
    let last = faultline_sys::thread::allowed_cpus()
        .unwrap()
        .last()
        .copied()
        .unwrap();
    for thread in ["fl-poll-0", "fl-spin-0", "fl-workers-0", "fl-per-cpu-0"] {
        assert!(
            r.stdout
                .contains(&format!("{thread} [\"{last}\"] want {last}")),
            "{thread}: {}",
            r.stdout
        );
        assert!(
            r.stdout.contains(&format!("{thread} served 7")),
            "{}",
            r.stdout
        );
    }
}

/// The per-cpu engine puts one handler thread on each CPU its creator may
/// use, pinned there, and a thread faulting on each CPU is served (every
/// byte of its pages checked).
#[test]
fn per_cpu_engine_pins_one_handler_on_each_cpu() {
    const NAME: &str = "per_cpu_engine_pins_one_handler_on_each_cpu";
    if let Some(s) = child_scenario() {
        if s != NAME {
            return;
        }
        let engine = PerCpuEngine::new().unwrap();
        let cpus = faultline_sys::thread::allowed_cpus().unwrap();
        let data: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
        let region = Region::builder(4 << 20)
            .store(MemoryStore::new(data.clone()))
            .build(&engine)
            .unwrap();
        let base = region.as_ptr() as usize;
        let share = (4 << 20) / cpus.len();
        std::thread::scope(|t| {
            for (i, &cpu) in cpus.iter().enumerate() {
                let data = &data;
                t.spawn(move || {
                    faultline_sys::thread::pin_to_cpu(cpu).unwrap();
                    // Every other page of its own share.
                    for off in (i * share..(i + 1) * share).step_by(8192) {
                        // SAFETY: inside the live region.
                        let v = unsafe { std::ptr::read_volatile((base + off) as *const u8) };
                        assert_eq!(v, data[off], "byte {off}");
                    }
                });
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        let mut got: Vec<(String, String)> =
            faultline::testing::threads(std::process::id(), "fl-per-cpu-")
                .into_iter()
                .map(|t| (t.name, t.cpus))
                .collect();
        got.sort();
        say(&format!("threads {} {got:?}", engine.threads()));
        say(&format!("cpus {cpus:?} faults {}", engine.stats().faults));
        return;
    }
    let r = run_child(NAME, NAME, CHILD_TIMEOUT);
    assert!(!r.timed_out, "child hung\n{}", r.stderr);
    assert!(r.success(), "{:?}\n{}\n{}", r.status, r.stdout, r.stderr);
    let cpus = faultline_sys::thread::allowed_cpus().unwrap();
    let want: Vec<(String, String)> = cpus
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("fl-per-cpu-{i}"), c.to_string()))
        .collect();
    assert!(
        r.stdout
            .contains(&format!("threads {} {want:?}", cpus.len())),
        "want {want:?}: {}",
        r.stdout
    );
    assert!(!r.stdout.contains("faults 0"), "{}", r.stdout);
}

/// fork, from Rust (what the C ABI and UMap users get too): a forked
/// child makes a region of its own and reads it right, is refused work on
/// its copy of the parent's region, drops it and exits; the parent's region then still serves
/// a page it never touched; a child touching the parent's region dies of
/// SIGSEGV (the memory is `MADV_DONTFORK`), not reading zeros.
#[test]
fn a_forked_child_never_reads_or_breaks_its_parents_region() {
    const NAME: &str = "a_forked_child_never_reads_or_breaks_its_parents_region";
    if let Some(s) = child_scenario() {
        if s != NAME {
            return;
        }
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8 | 1).collect();
        let engine = PollEngine::new().unwrap();
        let parent = Region::builder(1 << 20)
            .store(MemoryStore::new(data.clone()))
            .fault_around(1)
            .build(&engine)
            .unwrap();
        let base = parent.as_ptr() as usize;
        // SAFETY: inside the live region.
        let first = unsafe { std::ptr::read_volatile(base as *const u8) };
        assert_eq!(first, data[0]);
        let wait = |pid: i32| {
            let mut st = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
            st
        };
        // SAFETY: the child only maps, reads and exits (no lock the
        // parent's other threads might hold is taken on the way: the
        // library makes its engine anew, and the allocator is fork-safe).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let engine = PollEngine::new().unwrap();
            let own = Region::builder(1 << 20)
                .store(MemoryStore::new(data.clone()))
                .build(&engine)
                .unwrap();
            // SAFETY: inside the live region.
            let ok = (0..1 << 20)
                .step_by(4096)
                .all(|o| unsafe { std::ptr::read_volatile(own.as_ptr().add(o)) } == data[o]);
            drop(own);
            // The parent's region refuses work here (its userfaultfd would
            // install into the parent's memory), and goes.
            let refused = matches!(parent.populate(0, 4096), Err(Error::Unsupported { .. }));
            drop(parent);
            let ok = ok && refused;
            // SAFETY: ends the child.
            unsafe { libc::_exit(if ok { 0 } else { 3 }) };
        }
        say(&format!("own region {}", wait(pid)));
        let last = (1 << 20) - 4096;
        // SAFETY: inside the live region.
        let v = unsafe { std::ptr::read_volatile((base + last) as *const u8) };
        say(&format!("parent after {}", v == data[last]));
        // SAFETY: as above.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the parent's page, not mapped here.
            let v = unsafe { std::ptr::read_volatile((base + 8192) as *const u8) };
            // SAFETY: ends the child.
            unsafe { libc::_exit(if v == 0 { 4 } else { 5 }) };
        }
        let st = wait(pid);
        say(&format!(
            "touch {}",
            if libc::WIFSIGNALED(st) {
                libc::WTERMSIG(st)
            } else {
                -libc::WEXITSTATUS(st)
            }
        ));
        return;
    }
    let r = run_child(NAME, NAME, CHILD_TIMEOUT);
    assert!(!r.timed_out, "child hung\n{}", r.stderr);
    assert!(r.success(), "{:?}\n{}\n{}", r.status, r.stdout, r.stderr);
    for line in ["own region 0", "parent after true", "touch 11"] {
        assert!(r.stdout.contains(line), "{line:?}: {}", r.stdout);
    }
}
