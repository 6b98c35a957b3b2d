//! Watchpoints against the real kernel: every tier, hits and false
//! positives, values before/after, other threads, many watches, chaining.
//!
//! One watcher exists per process at a time, so the tests serialise on a
//! lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use faultline_watch::{Hit, HitPath, WatchError, Watcher};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fixed-capacity, allocation-free log the callback can append to.
struct Log {
    n: AtomicUsize,
    items: Vec<[AtomicU64; 5]>,
}

impl Log {
    fn new(cap: usize) -> Arc<Log> {
        Arc::new(Log {
            n: AtomicUsize::new(0),
            items: (0..cap).map(|_| Default::default()).collect(),
        })
    }
    fn push(&self, h: &Hit) {
        let i = self.n.fetch_add(1, SeqCst);
        if let Some(s) = self.items.get(i) {
            s[0].store(h.addr, SeqCst);
            s[1].store(h.len as u64, SeqCst);
            s[2].store(h.before_u64(), SeqCst);
            s[3].store(h.after_u64(), SeqCst);
            s[4].store(h.tid as u64, SeqCst);
        }
    }
    fn len(&self) -> usize {
        self.n.load(SeqCst)
    }
    fn get(&self, i: usize) -> (u64, usize, u64, u64, i32) {
        let s = &self.items[i];
        (
            s[0].load(SeqCst),
            s[1].load(SeqCst) as usize,
            s[2].load(SeqCst),
            s[3].load(SeqCst),
            s[4].load(SeqCst) as i32,
        )
    }
}

fn watcher(log: &Arc<Log>, exact: bool, hardware: bool) -> Watcher {
    let l = log.clone();
    Watcher::builder()
        .on_hit(move |h| l.push(h))
        .exact(exact)
        .hardware(hardware)
        .build()
        .expect("watcher")
}

fn wr<T>(p: *mut T, v: T) {
    // SAFETY: tests pass valid, aligned pointers into memory they own.
    unsafe { std::ptr::write_volatile(p, v) }
}

/// Writes to a watched byte and its neighbours on a page of `mem`.
fn hit_and_false_positive(w: &Watcher, log: &Log, base: *mut u8) {
    let target = base.wrapping_add(100);
    w.watch(target as u64, 1).unwrap();
    let before = w.stats();
    wr(base.wrapping_add(99), 7u8); // false positive
    wr(base.wrapping_add(101), 7u8); // false positive
    wr(target, 42u8); // hit
    wr(target as *mut u16, 0x1234u16); // hit (covers 100..102)
    let after = w.stats();
    assert_eq!(after.hits - before.hits, 2, "{after:?}");
    assert_eq!(
        after.false_positives - before.false_positives,
        2,
        "{after:?}"
    );
    assert_eq!(log.len(), 2);
    let (addr, len, b, a, tid) = log.get(0);
    assert_eq!((addr, len, b, a), (target as u64, 1, 0, 42));
    // SAFETY: gettid has no preconditions.
    assert_eq!(tid, unsafe { libc::gettid() });
    let (addr, len, b, a, _) = log.get(1);
    assert_eq!((addr, len, b, a), (target as u64, 1, 42, 0x34));
    // SAFETY: reading our own memory.
    unsafe {
        assert_eq!(*base.wrapping_add(99), 7);
        assert_eq!(*base.wrapping_add(101), 0x12);
        assert_eq!(*target, 0x34);
    }
    w.unwatch(target as u64, 1).unwrap();
    wr(target, 1u8);
    assert_eq!(log.len(), 2, "unwatched bytes are not reported");
    assert_eq!(w.stats().pages_armed, 0);
}

#[test]
fn heap_memory_uffd_tier() {
    let _g = serial();
    let log = Log::new(64);
    let w = watcher(&log, false, false);
    let mut v = vec![0u8; 3 * 4096];
    let base = v.as_mut_ptr().wrapping_add(4096);
    hit_and_false_positive(&w, &log, base);
    drop(w);
    v[100] = 3; // still writable after the watcher is gone
}

#[test]
fn alias_memory_tier() {
    let _g = serial();
    let log = Log::new(64);
    let w = watcher(&log, false, false);
    let m = w.alloc(2 * 4096).unwrap();
    hit_and_false_positive(&w, &log, m.as_ptr());
}

#[test]
fn mprotect_tier_exact_mode() {
    let _g = serial();
    let log = Log::new(64);
    let w = watcher(&log, true, false);
    let mut v = vec![0u8; 3 * 4096];
    let base = v.as_mut_ptr().wrapping_add(4096);
    hit_and_false_positive(&w, &log, base);
}

static mut DATA_VAR: [u64; 1024] = [1; 1024];

#[test]
fn file_backed_data_section_uses_mprotect() {
    let _g = serial();
    let log = Log::new(64);
    let w = watcher(&log, false, false);
    let p = &raw mut DATA_VAR as *mut u64;
    let t = p.wrapping_add(512);
    w.watch(t as u64, 8).unwrap();
    wr(t, 99u64);
    wr(p.wrapping_add(511), 5u64);
    assert_eq!(log.len(), 1);
    let (_, len, b, a, _) = log.get(0);
    assert_eq!((len, b, a), (8, 1, 99));
    assert_eq!(w.stats().false_positives, 1);
}

#[test]
fn hardware_tier_for_small_aligned_watches() {
    let _g = serial();
    let log = Log::new(64);
    let w = watcher(&log, false, true);
    let v = Box::new([0u64; 16]);
    let p = v.as_ptr() as *mut u64;
    w.watch(p.wrapping_add(3) as u64, 8).unwrap();
    assert_eq!(w.stats().hw_watches, 1);
    assert_eq!(w.stats().pages_armed, 0);
    wr(p.wrapping_add(3), 77u64);
    wr(p.wrapping_add(4), 1u64); // no false positives on this tier
    assert_eq!(log.len(), 1);
    let (addr, len, b, a, _) = log.get(0);
    assert_eq!((addr, len, b, a), (p.wrapping_add(3) as u64, 8, 0, 77));
    assert_eq!(w.stats().false_positives, 0);
    w.unwatch(p.wrapping_add(3) as u64, 8).unwrap();
    wr(p.wrapping_add(3), 78u64);
    assert_eq!(log.len(), 1);
}

#[test]
fn errors_are_typed() {
    let _g = serial();
    let log = Log::new(4);
    let w = watcher(&log, false, false);
    assert!(matches!(w.watch(0x1000, 0), Err(WatchError::ZeroLength)));
    assert!(matches!(
        w.watch(u64::MAX - 2, 8),
        Err(WatchError::Wraps { .. })
    ));
    assert!(matches!(w.watch(8, 1), Err(WatchError::NotMapped { .. })));
    let code = errors_are_typed as *const () as usize as u64;
    assert!(matches!(
        w.watch(code, 1),
        Err(WatchError::NotWritable { .. })
    ));
    let local = 0u64;
    assert!(matches!(
        w.watch_value(&local),
        Err(WatchError::Unsupported { .. })
    ));
    assert!(matches!(
        Watcher::new(|_| {}),
        Err(WatchError::AlreadyActive)
    ));
}

#[test]
fn single_watch_many_writes_timing_smoke() {
    let _g = serial();
    let log = Log::new(16);
    let w = watcher(&log, false, false);
    let m = w.alloc(4096).unwrap();
    w.watch(m.addr() + 4000, 1).unwrap();
    let t = Instant::now();
    for i in 0..2000 {
        wr(m.as_ptr().wrapping_add(i % 3000), i as u8);
    }
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(w.stats().false_positives, 2000);
    assert_eq!(log.len(), 0);
    let _ = HitPath::Emulated;
}

use faultline::testing::child;

/// Per-address hit counters the callback can update without allocating.
struct Tally {
    base: u64,
    count: Vec<AtomicU64>,
    sum: Vec<AtomicU64>,
}

impl Tally {
    fn new(base: u64, n: usize) -> Arc<Tally> {
        Arc::new(Tally {
            base,
            count: (0..n).map(|_| AtomicU64::new(0)).collect(),
            sum: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }
    fn record(&self, h: &Hit, stride: u64) {
        let i = ((h.addr - self.base) / stride) as usize;
        if let (Some(c), Some(s)) = (self.count.get(i), self.sum.get(i)) {
            c.fetch_add(1, SeqCst);
            s.fetch_add(h.after_u64(), SeqCst);
        }
    }
}

/// Four threads write their own watched words and unwatched neighbours on
/// the same pages, and increment one shared watched atomic: every write is
/// reported exactly once, with its value, and the atomic loses nothing.
fn no_miss_under_threads(exact: bool, use_alias: bool) {
    const THREADS: usize = 4;
    const K: u64 = 3000;
    let mut heap = vec![0u64; 1024];
    let tally_cell: Arc<Mutex<Option<Arc<Tally>>>> = Arc::new(Mutex::new(None));
    let tc = tally_cell.clone();
    let tally_ptr: Arc<std::sync::OnceLock<Arc<Tally>>> = Arc::new(std::sync::OnceLock::new());
    let tp = tally_ptr.clone();
    let _ = tc;
    let w = Watcher::builder()
        .on_hit(move |h| {
            if let Some(t) = tp.get() {
                t.record(h, 64);
            }
        })
        .exact(exact)
        .hardware(false)
        .build()
        .unwrap();
    let mem = if use_alias {
        Some(w.alloc(4096).unwrap())
    } else {
        None
    };
    let base = match &mem {
        Some(m) => m.as_ptr() as *mut u64,
        None => heap
            .as_mut_ptr()
            .wrapping_add(512 - (heap.as_ptr() as usize / 8) % 512),
    };
    // Word i*8 (byte offset 64*i) is thread i's; word 8*THREADS is shared.
    let tally = Tally::new(base as u64, THREADS + 1);
    let _ = tally_ptr.set(tally.clone());
    for i in 0..=THREADS {
        w.watch(base.wrapping_add(8 * i) as u64, 8).unwrap();
    }
    let addr = base as usize;
    let _dl = child::deadline(120);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let base = addr as *mut u64;
                let mine = base.wrapping_add(8 * t);
                let shared = base.wrapping_add(8 * THREADS);
                // SAFETY: an aligned u64 inside the watched page.
                let shared = unsafe { &*(shared as *const std::sync::atomic::AtomicU64) };
                for k in 1..=K {
                    wr(mine, k);
                    wr(mine.wrapping_add(1), k); // unwatched neighbour
                    shared.fetch_add(1, SeqCst);
                }
            });
        }
    });
    let st = w.stats();
    for t in 0..THREADS {
        assert_eq!(tally.count[t].load(SeqCst), K, "thread {t}: {st:?}");
        assert_eq!(tally.sum[t].load(SeqCst), K * (K + 1) / 2, "thread {t}");
        // SAFETY: reading our own memory.
        assert_eq!(unsafe { *base.wrapping_add(8 * t) }, K);
    }
    // SAFETY: as above.
    let total = unsafe { *base.wrapping_add(8 * THREADS) };
    assert_eq!(total, THREADS as u64 * K, "atomic increments lost: {st:?}");
    assert_eq!(tally.count[THREADS].load(SeqCst), THREADS as u64 * K);
    let n = THREADS as u64 * K;
    assert_eq!(
        tally.sum[THREADS].load(SeqCst),
        n * (n + 1) / 2,
        "each value once"
    );
    assert!(st.false_positives >= THREADS as u64 * K, "{st:?}");
    drop(mem);
    drop(heap);
}

#[test]
fn other_threads_writes_never_missed_alias() {
    let _g = serial();
    no_miss_under_threads(false, true);
}

#[test]
fn other_threads_writes_never_missed_heap_uffd() {
    let _g = serial();
    no_miss_under_threads(false, false);
}

#[test]
fn other_threads_writes_never_missed_exact() {
    let _g = serial();
    no_miss_under_threads(true, false);
}

#[test]
fn a_hundred_thousand_watches() {
    let _g = serial();
    let hits = Arc::new(AtomicU64::new(0));
    let h2 = hits.clone();
    let w = Watcher::builder()
        .on_hit(move |_| {
            h2.fetch_add(1, SeqCst);
        })
        .hardware(false)
        .build()
        .unwrap();
    const N: usize = 100_000;
    let m = w.alloc(N * 16).unwrap();
    let p = m.as_ptr();
    for i in 0..N {
        w.watch(p as u64 + 16 * i as u64, 1).unwrap();
    }
    let st = w.stats();
    assert_eq!(st.ranges, N as u64);
    assert_eq!(st.pages_armed, (N * 16).div_ceil(4096) as u64);
    // Every watched byte once, plus one unwatched byte per 16.
    for i in 0..N {
        wr(p.wrapping_add(16 * i), 1u8);
        wr(p.wrapping_add(16 * i + 3), 1u8);
    }
    let st = w.stats();
    assert_eq!(hits.load(SeqCst), N as u64);
    assert_eq!(st.false_positives, N as u64);
    // Merging: watching the gaps joins everything into one range.
    for i in 0..N {
        w.watch(p as u64 + 16 * i as u64 + 1, 15).unwrap();
    }
    assert_eq!(w.stats().ranges, 1);
    w.unwatch(p as u64, N * 16).unwrap();
    assert_eq!(w.stats().ranges, 0);
    assert_eq!(w.stats().pages_armed, 0);
}

#[test]
fn callback_writes_are_performed_not_reported() {
    let _g = serial();
    let cell = Arc::new(AtomicU64::new(0));
    let target = Arc::new(AtomicU64::new(0));
    let (c2, t2) = (cell.clone(), target.clone());
    let w = Watcher::builder()
        .on_hit(move |_| {
            c2.fetch_add(1, SeqCst);
            // Writes a watched byte from inside the callback.
            let p = t2.load(SeqCst) as *mut u8;
            wr(p.wrapping_add(1), 9u8);
        })
        .hardware(false)
        .build()
        .unwrap();
    let m = w.alloc(4096).unwrap();
    target.store(m.addr(), SeqCst);
    w.watch(m.addr(), 2).unwrap();
    wr(m.as_ptr(), 5u8);
    assert_eq!(cell.load(SeqCst), 1);
    let st = w.stats();
    assert_eq!(st.suppressed, 1, "{st:?}");
    // SAFETY: our memory.
    assert_eq!(unsafe { *m.as_ptr().add(1) }, 9);
}

#[test]
fn disable_and_enable() {
    let _g = serial();
    let log = Log::new(8);
    let w = watcher(&log, false, false);
    let m = w.alloc(4096).unwrap();
    w.watch(m.addr() + 8, 1).unwrap();
    w.disable().unwrap();
    assert_eq!(w.stats().pages_armed, 0);
    wr(m.as_ptr().wrapping_add(8), 1u8);
    assert_eq!(log.len(), 0);
    w.enable().unwrap();
    wr(m.as_ptr().wrapping_add(8), 2u8);
    assert_eq!(log.len(), 1);
}

#[test]
fn instructions_not_emulated_are_single_stepped() {
    let _g = serial();
    let log = Log::new(8);
    let w = watcher(&log, false, false);
    let m = w.alloc(4096).unwrap();
    w.watch(m.addr() + 130, 1).unwrap();
    let p = m.as_ptr().wrapping_add(128);
    let v: u32 = 0x0001_0000 | 0x77;
    // `bswap` + `movbe`-free path: an x87 store, which the emulator does
    // not cover (FISTP m32), writes 4 bytes over the watched byte.
    let f: f64 = 0x00AB_0000 as f64;
    // SAFETY: p..p+4 is inside our watched page; fistp stores 4 bytes.
    unsafe {
        std::arch::asm!("fld qword ptr [{f}]", "fistp dword ptr [{p}]", f = in(reg) &f, p = in(reg) p, out("st(0)") _);
    }
    let _ = v;
    let st = w.stats();
    assert_eq!(st.single_stepped, 1, "{st:?}");
    assert_eq!(log.len(), 1);
    let (addr, _, before, after, _) = log.get(0);
    assert_eq!(addr, m.addr() + 130);
    assert_eq!((before, after), (0, 0xAB));
}

#[test]
fn coexists_with_a_paging_region_and_refuses_its_memory() {
    let _g = serial();
    let log = Log::new(8);
    let engine = faultline::SignalEngine::new().unwrap();
    let region = faultline::Region::builder(16 * 4096)
        .store(faultline::MemoryStore::new(vec![3u8; 16 * 4096]))
        .build(&engine)
        .unwrap();
    let w = watcher(&log, false, false);
    assert!(matches!(
        w.watch(region.as_ptr() as u64, 1),
        Err(WatchError::Unsupported { .. })
    ));
    let m = w.alloc(4096).unwrap();
    w.watch(m.addr(), 1).unwrap();
    // Region faults go to the engine through the chain; watch faults to us.
    for i in 0..16 {
        // SAFETY: mapped region memory.
        let v = unsafe { std::ptr::read_volatile(region.as_ptr().add(i * 4096)) };
        assert_eq!(v, 3);
        wr(m.as_ptr(), i as u8);
    }
    assert_eq!(log.len(), 16);
    drop(m);
    drop(w);
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile(region.as_ptr().add(5), 1) };
}

static APP_SEGV: AtomicU64 = AtomicU64::new(0);

extern "C" fn app_segv(_: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    APP_SEGV.fetch_add(1, SeqCst);
    // SAFETY: the application's own handler: make its page writable.
    unsafe {
        let a = (*info).si_addr() as usize & !4095;
        libc::mprotect(
            a as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        );
    }
}

#[test]
fn chains_to_the_applications_own_handler() {
    if child::child_scenario().as_deref() == Some("chain") {
        // SAFETY: installing a plain SA_SIGINFO handler.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = app_segv as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
        let log = Log::new(8);
        let w = watcher(&log, true, false);
        let mut v = vec![0u8; 3 * 4096];
        let base = v
            .as_mut_ptr()
            .wrapping_add(4096 - v.as_ptr() as usize % 4096);
        w.watch(base as u64 + 10, 1).unwrap();
        wr(base.wrapping_add(10), 1u8);
        // The application's own protected page: not ours, chained.
        let own = faultline_sys::mem::Mapping::anon(4096).unwrap();
        own.protect(libc::PROT_READ).unwrap();
        wr(own.as_ptr(), 4u8);
        assert_eq!(APP_SEGV.load(SeqCst), 1);
        assert_eq!(log.len(), 1);
        println!("CHAIN-OK");
        return;
    }
    let r = child::run_child(
        "chains_to_the_applications_own_handler",
        "chain",
        Duration::from_secs(60),
    );
    assert!(r.stdout.contains("CHAIN-OK"), "{}\n{}", r.stdout, r.stderr);
}

/// A loop that writes every byte of watched pages and keeps a running
/// value in registers.
#[inline(never)]
fn fill_and_mix(p: *mut u8, n: usize) -> u64 {
    let mut acc = 0x1234_5678u64;
    for i in 0..n {
        wr(p.wrapping_add(i), (i * 7) as u8);
        acc = acc.rotate_left(5) ^ (i as u64).wrapping_mul(0x9E37_79B9);
    }
    acc
}

#[test]
fn continued_interpretation_is_exact_and_saves_faults() {
    let _g = serial();
    let log = Log::new(64);
    let w = watcher(&log, false, false);
    let m = w.alloc(4 * 4096).unwrap();
    let plain = faultline_sys::mem::Mapping::anon(4 * 4096).unwrap();
    let want = fill_and_mix(plain.as_ptr(), 4 * 4096);
    let watched = [5usize, 4096 + 17, 3 * 4096 + 4095];
    for &o in &watched {
        w.watch(m.addr() + o as u64, 1).unwrap();
    }
    let got = fill_and_mix(m.as_ptr(), 4 * 4096);
    let st = w.stats();
    assert_eq!(got, want, "registers after interpretation");
    // SAFETY: both mappings are 4 pages long.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(m.as_ptr(), 4 * 4096),
            std::slice::from_raw_parts(plain.as_ptr(), 4 * 4096),
        )
    };
    assert!(a == b, "memory after interpretation");
    assert_eq!(st.hits, 3, "{st:?}");
    assert_eq!(log.len(), 3);
    for (i, &o) in watched.iter().enumerate() {
        let (addr, _, _, after, _) = log.get(i);
        assert_eq!(
            (addr, after),
            (m.addr() + o as u64, ((o * 7) & 0xff) as u64)
        );
    }
    assert_eq!(st.false_positives, 3 * 4096 - 3, "{st:?}");
    assert!(st.interpreted > 0 && st.faults < 100, "{st:?}");

    // The same with interpretation off: one fault per store.
    drop(m);
    drop(w);
    let w = Watcher::builder()
        .interpret(false)
        .hardware(false)
        .build()
        .unwrap();
    let m = w.alloc(4096).unwrap();
    w.watch(m.addr() + 5, 1).unwrap();
    fill_and_mix(m.as_ptr(), 4096);
    assert_eq!(w.stats().faults, 4096);
}

#[inline(never)]
fn copy_loop(dst: *mut u8, src: *const u8, n: usize) -> u64 {
    let mut sum = 0u64;
    for i in 0..n {
        // SAFETY: both buffers are n bytes long.
        let v = unsafe { std::ptr::read_volatile(src.add(i)) };
        wr(dst.wrapping_add(i), v);
        sum = sum.wrapping_add(v as u64);
    }
    sum
}

#[test]
fn interpreted_copy_loop_reads_unwatched_memory_safely() {
    let _g = serial();
    let log = Log::new(16);
    let w = watcher(&log, false, false);
    let m = w.alloc(3 * 4096).unwrap();
    let src: Vec<u8> = (0..3 * 4096).map(|i| (i * 13 % 251) as u8).collect();
    w.watch(m.addr() + 4096 + 77, 2).unwrap();
    let sum = copy_loop(m.as_ptr(), src.as_ptr(), src.len());
    assert_eq!(sum, src.iter().map(|&b| b as u64).sum::<u64>());
    // SAFETY: 3 pages.
    let got = unsafe { std::slice::from_raw_parts(m.as_ptr(), src.len()) };
    assert!(got == &src[..]);
    assert_eq!(log.len(), 2);
    let st = w.stats();
    assert!(st.interpreted > 0 && st.faults < 50, "{st:?}");
}

#[inline(never)]
fn rewrite_twice(p: *mut u8, n: usize) {
    for i in 0..n {
        wr(p.wrapping_add(i), 1u8);
        wr(p.wrapping_add(i), 2u8);
    }
}

#[test]
fn heap_tier_coalesced_stores_keep_exact_values() {
    let _g = serial();
    let log = Log::new(16);
    let w = watcher(&log, false, false);
    let mut v = vec![9u8; 3 * 4096];
    let base = v
        .as_mut_ptr()
        .wrapping_add(4096 - v.as_ptr() as usize % 4096);
    w.watch(base as u64 + 100, 1).unwrap();
    rewrite_twice(base, 4096);
    // Two reports for the watched byte: 9 -> 1, then 1 -> 2.
    assert_eq!(log.len(), 2, "{:?}", w.stats());
    assert_eq!(log.get(0).2, 9);
    assert_eq!(log.get(0).3, 1);
    assert_eq!(log.get(1).2, 1);
    assert_eq!(log.get(1).3, 2);
    // SAFETY: our memory.
    let page = unsafe { std::slice::from_raw_parts(base, 4096) };
    assert!(page.iter().all(|&b| b == 2));
    assert!(w.stats().faults < 64, "{:?}", w.stats());
}

/// Two threads run copy loops between two watched heap pages in opposite
/// directions (each handler run opens both pages): no deadlock, every
/// byte right.
#[test]
fn opposite_copy_loops_on_two_pages_do_not_deadlock() {
    let _g = serial();
    let w = watcher(&Log::new(4), false, false);
    let mut v = vec![0u8; 5 * 4096];
    let base = v
        .as_mut_ptr()
        .wrapping_add(4096 - v.as_ptr() as usize % 4096) as usize;
    // Pages: A = base, B = base + 2 pages (the page between unwatched).
    w.watch(base as u64 + 4000, 1).unwrap();
    w.watch(base as u64 + 2 * 4096 + 4000, 1).unwrap();
    let _dl = child::deadline(60);
    std::thread::scope(|s| {
        for t in 0..2usize {
            s.spawn(move || {
                let a = base as *mut u8;
                let b = (base + 2 * 4096) as *mut u8;
                let (src, dst) = if t == 0 { (a, b) } else { (b, a) };
                for _ in 0..20 {
                    for i in 0..2048 {
                        let i = i + 2048 * t;
                        // SAFETY: both pages are inside `v`.
                        let x = unsafe { std::ptr::read_volatile(src.add(i)) };
                        wr(dst.wrapping_add(i), x.wrapping_add(1));
                        wr(src.wrapping_add(i), x);
                    }
                }
            });
        }
    });
    assert!(w.stats().faults > 0);
    // SAFETY: both pages are inside `v`.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(base as *const u8, 4096),
            std::slice::from_raw_parts((base + 2 * 4096) as *const u8, 4096),
        )
    };
    assert!(a[..2048].iter().all(|&x| x == 0) && a[2048..].iter().all(|&x| x == 1));
    assert!(b[..2048].iter().all(|&x| x == 1) && b[2048..].iter().all(|&x| x == 0));
    drop(w);
    drop(v);
}

static mut FORK_VAR: [u64; 1024] = [3; 1024];

/// A forked child is not watched: its writes to an mprotect-armed page
/// land in its own memory (not, through the parent's /proc/self/mem, in
/// the parent's), and the parent sees no hit.
#[test]
fn a_forked_child_writes_its_own_memory() {
    let _g = serial();
    let log = Log::new(8);
    let w = watcher(&log, false, false);
    let p = (&raw mut FORK_VAR as *mut u64).wrapping_add(512);
    w.watch(p as u64, 8).unwrap();
    // SAFETY: the child only stores, reads and calls _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        wr(p, 77u64);
        // SAFETY: reading our own memory, then leaving without unwinding.
        unsafe {
            let ok = std::ptr::read_volatile(p) == 77;
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    assert!(pid > 0);
    let mut status = 0;
    // SAFETY: waiting for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    // SAFETY: our memory.
    let now = unsafe { std::ptr::read_volatile(p) };
    assert_eq!(now, 3, "the child wrote the parent");
    assert_eq!(log.len(), 0);
    wr(p, 4u64);
    assert_eq!(log.len(), 1, "the parent is still watched");
}
