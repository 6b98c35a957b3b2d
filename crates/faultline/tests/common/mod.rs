//! Helpers shared by the integration tests.
#![allow(dead_code, reason = "each test binary uses a subset")]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use faultline::testing::child::*;
use faultline::EvictionConfig;
use faultline::*;

/// The byte a pattern store holds at `off`.
pub fn pat(off: usize) -> u8 {
    ((off as u64).wrapping_mul(2654435761) >> 13) as u8
}

pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(pat).collect()
}

/// A temporary file, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn with(data: &[u8]) -> TempFile {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "faultline-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(data).unwrap();
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Zero,
    Memory,
    File,
    FilePread,
}

impl StoreKind {
    pub const ALL: [StoreKind; 4] = [
        StoreKind::Zero,
        StoreKind::Memory,
        StoreKind::File,
        StoreKind::FilePread,
    ];

    /// The store, the expected contents, and a temp file to keep alive.
    pub fn make(self, len: usize) -> (Arc<dyn PageStore>, Arc<Vec<u8>>, Option<TempFile>) {
        match self {
            StoreKind::Zero => (Arc::new(ZeroStore), Arc::new(vec![0; len]), None),
            StoreKind::Memory => {
                let d = pattern(len);
                (Arc::new(MemoryStore::new(d.clone())), Arc::new(d), None)
            }
            StoreKind::File | StoreKind::FilePread => {
                let d = pattern(len);
                let f = TempFile::with(&d);
                let access = if self == StoreKind::File {
                    FileAccess::Mmap
                } else {
                    FileAccess::Pread
                };
                let s = FileStore::open_with(&f.0, 0, access).unwrap();
                (Arc::new(s), Arc::new(d), Some(f))
            }
        }
    }
}

/// Memory kinds usable here, with the reason for those that are not.
pub fn usable_kinds() -> Vec<MemoryKind> {
    let caps = capabilities();
    let mut v = Vec::new();
    for k in [
        MemoryKind::PrivateAnon,
        MemoryKind::Shmem,
        MemoryKind::Hugetlb,
    ] {
        match &caps.kind(k).ioctls {
            Ok(_) => v.push(k),
            Err(why) => eprintln!("SKIP memory kind {}: {why}", k.name()),
        }
    }
    v
}

/// Reads a byte through a volatile load (the fault must really happen).
pub fn read(p: *const u8, off: usize) -> u8 {
    // SAFETY: callers pass offsets inside a live region.
    unsafe { p.add(off).read_volatile() }
}

pub fn write(p: *mut u8, off: usize, v: u8) {
    // SAFETY: as in `read`.
    unsafe { p.add(off).write_volatile(v) }
}

/// `threads` threads touch every page of `region` in their own random
/// order; a thread writes a marker at byte `8*t` of the pages it owns for
/// writing. While they run, every read checks bytes outside the marker
/// area against `expect`; afterwards every byte of the region is checked.
pub fn hammer(region: &Region, expect: &[u8], threads: usize, seed: u64) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let ps = region.page_size();
    let len = region.len();
    let base = region.as_ptr() as usize;
    let pages = len / 4096; // touch at base-page granularity
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let p = base as *mut u8;
                let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ (t as u64 * 7919));
                let mut order: Vec<usize> = (0..pages).collect();
                order.shuffle(&mut rng);
                for pg in order {
                    let off = pg * 4096;
                    let writer = (pg + t) % threads == 0 && pg % 3 != 1;
                    if writer {
                        write(p, off + 8 * t, 0xA0 | t as u8);
                    }
                    // Check a sample of bytes past the marker area.
                    for k in [64usize, 100, 1000, 2047, 4095] {
                        let o = off + k;
                        let got = read(p, o);
                        assert_eq!(
                            got, expect[o],
                            "thread {t} page {pg} offset {o:#x} (region page size {ps})"
                        );
                    }
                }
            });
        }
    });
    // SAFETY: every page is resident now; the region lives across this call.
    let all = unsafe { std::slice::from_raw_parts(region.as_ptr(), len) };
    for pg in 0..pages {
        let off = pg * 4096;
        for t in 0..threads {
            let writer = (pg + t) % threads == 0 && pg % 3 != 1;
            let want = if writer {
                0xA0 | t as u8
            } else {
                expect[off + 8 * t]
            };
            assert_eq!(all[off + 8 * t], want, "marker of thread {t} in page {pg}");
        }
        let rest = off + 8 * threads..off + 4096;
        if all[rest.clone()] != expect[rest.clone()] {
            let bad = rest.clone().find(|&i| all[i] != expect[i]).unwrap();
            panic!(
                "byte {bad:#x}: got {:#x}, store has {:#x}",
                all[bad], expect[bad]
            );
        }
    }
}

/// One engine per kind with a 4 MiB scratch and, for the workers engine,
/// `workers` threads.
pub fn engine_of(kind: EngineKind) -> Arc<dyn Engine> {
    let cfg = EngineConfig {
        workers: 3,
        ..EngineConfig::default()
    };
    engine::create(kind, cfg).unwrap()
}

/// The matrix: engine x store x memory kind, `threads` threads hammering
/// a region of `len` bytes.
pub fn matrix(engines: &[EngineKind], len: usize, threads: usize) {
    let mut ran = 0;
    for kind in usable_kinds() {
        if kind == MemoryKind::Hugetlb
            && faultline_sys::mem::hugetlb_free_pages() < (len >> 21) as u64
        {
            eprintln!(
                "SKIP hugetlb: pool has fewer than {} free 2 MiB pages",
                len >> 21
            );
            continue;
        }
        for sk in StoreKind::ALL {
            for &e in engines {
                let (store, expect, _tmp) = sk.make(len);
                let fa = match sk {
                    StoreKind::Memory | StoreKind::FilePread => 4,
                    _ => 1,
                };
                let t0 = Instant::now();
                let region = Region::builder(len)
                    .kind(kind)
                    .shared_store(store)
                    .fault_around(fa)
                    .build_dyn(engine_of(e))
                    .unwrap_or_else(|err| panic!("{e:?} {sk:?} {kind:?}: {err}"));
                hammer(&region, &expect, threads, 42 + ran);
                let st = region.stats();
                assert_eq!(
                    region.resident_pages(),
                    region.pages(),
                    "{e:?} {sk:?} {kind:?}"
                );
                assert_eq!(st.poisoned, 0);
                eprintln!(
                    "ok {:>8} {:>10} {:>12}: {:>6} faults {:>6} installed {:>5} ioctls in {:?}",
                    e.name(),
                    format!("{sk:?}"),
                    kind.name(),
                    st.faults,
                    st.installed,
                    st.ioctls,
                    t0.elapsed()
                );
                ran += 1;
            }
        }
    }
    assert!(ran > 0);
}

/// Regions of 4, 16 and 64 KiB pages: every fault installs a whole region
/// page, so faults <= pages and data is intact.
pub fn page_sizes(engines: &[EngineKind]) {
    for &e in engines {
        for ps in [4096usize, 16384, 65536] {
            let len = 16 << 20;
            let (store, expect, _t) = StoreKind::Memory.make(len);
            let region = Region::builder(len)
                .page_size(ps)
                .shared_store(store)
                .fault_around(2)
                .build_dyn(engine_of(e))
                .unwrap();
            hammer(&region, &expect, 4, ps as u64);
            let st = region.stats();
            assert_eq!(st.installed as usize, len / ps, "{e:?} page size {ps}");
            // Signal-engine threads that lose a page's claim retry the access
            // (counted in `busy`); every other fault installs or finds a page.
            assert!((st.faults - st.busy) as usize <= len / 4096, "{e:?} {st:?}");
            assert_eq!(region.resident_pages(), len / ps);
        }
    }
}

/// Many threads fault on the same pages at once; every page must be
/// fetched from the store and installed exactly once.
pub fn concurrent_faults_once(e: EngineKind) {
    let pages = 256;
    let len = pages * 4096;
    let (store, expect, _t) = StoreKind::FilePread.make(len);
    let region = Region::builder(len)
        .shared_store(store)
        .build_dyn(engine_of(e))
        .unwrap();
    let base = region.as_ptr() as usize;
    let barrier = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for pg in 0..pages {
                    if pg % 16 == 0 {
                        barrier.wait();
                    }
                    let off = pg * 4096 + 123;
                    assert_eq!(read(base as *const u8, off), expect[off]);
                }
            });
        }
    });
    // A handler counts a window after the ioctl that woke its faulting
    // threads: with the per-cpu engine the woken thread runs on the
    // handler's CPU at once, and the counting waits (seen once in CI:
    // installed 144 of 256, every byte read right). Bounded; the asserts
    // say what was missing.
    wait_until(Duration::from_secs(5), || {
        region.stats().installed >= pages as u64
    });
    let st = region.stats();
    assert_eq!(
        st.store_fills, pages as u64,
        "{e:?}: each page fetched once ({st:?})"
    );
    assert_eq!(
        st.installed, pages as u64,
        "{e:?}: each page installed once ({st:?})"
    );
}

/// A store that fails from `fail_from` on (signal-safe).
pub struct FailingStore {
    pub inner: MemoryStore,
    pub fail_from: u64,
}

impl PageStore for FailingStore {
    fn describe(&self) -> &str {
        "failing-test-store"
    }
    fn len(&self) -> Option<u64> {
        self.inner.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if offset + buf.len() as u64 > self.fail_from {
            return Err(StoreError::Failed {
                offset,
                reason: "injected failure".into(),
            });
        }
        self.inner.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.inner.write_back(offset, data)
    }
    fn signal_safe(&self) -> bool {
        true
    }
}

/// A store whose fill panics.
pub struct PanickingStore;

impl PageStore for PanickingStore {
    fn describe(&self) -> &str {
        "panicking-test-store"
    }
    fn len(&self) -> Option<u64> {
        None
    }
    fn fill(&self, _offset: u64, _buf: &mut [u8]) -> Result<(), StoreError> {
        panic!("test store panics on purpose")
    }
    fn write_back(&self, _offset: u64, _data: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn signal_safe(&self) -> bool {
        true
    }
}

/// A store that sleeps `delay` in every fill and counts entries.
pub struct SlowStore {
    pub inner: MemoryStore,
    pub delay: Duration,
    pub entered: std::sync::atomic::AtomicUsize,
}

impl PageStore for SlowStore {
    fn describe(&self) -> &str {
        "slow-test-store"
    }
    fn len(&self) -> Option<u64> {
        self.inner.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(self.delay);
        self.inner.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.inner.write_back(offset, data)
    }
    fn signal_safe(&self) -> bool {
        true
    }
}

/// A store whose write-backs wait while its gate is closed (each at most
/// [`GateStore::MAX_WAIT`], so a test that never opens it still ends),
/// counting the write-backs waiting there. Signal-safe: atomics and
/// `nanosleep`.
pub struct GateStore {
    pub inner: MemoryStore,
    closed: std::sync::atomic::AtomicBool,
    waiting: std::sync::atomic::AtomicUsize,
}

impl GateStore {
    pub const MAX_WAIT: Duration = Duration::from_secs(60);

    /// A gate store over `inner`, its gate closed.
    pub fn closed(inner: MemoryStore) -> GateStore {
        GateStore {
            inner,
            closed: true.into(),
            waiting: 0.into(),
        }
    }

    /// Write-backs waiting at the gate now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Lets every write-back through, from now on.
    pub fn open(&self) {
        self.closed
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl PageStore for GateStore {
    fn describe(&self) -> &str {
        "gate-test-store"
    }
    fn len(&self) -> Option<u64> {
        self.inner.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.waiting.fetch_add(1, SeqCst);
        let t0 = Instant::now();
        while self.closed.load(SeqCst) && t0.elapsed() < Self::MAX_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.waiting.fetch_sub(1, SeqCst);
        self.inner.write_back(offset, data)
    }
    fn signal_safe(&self) -> bool {
        true
    }
}

/// MOVE from a pool of 2 MiB huge frames refilled in the background: data
/// intact, every page installed once, most windows moved in whole.
pub fn huge_frame_pool(e: EngineKind) {
    for sk in [StoreKind::Zero, StoreKind::Memory] {
        let len = 32 << 20;
        let (store, expect, _t) = sk.make(len);
        let r = Region::builder(len)
            .shared_store(store)
            .resolve_op(ResolveOp::Move)
            .fault_around(512)
            .frame_pool(FramePoolConfig {
                pages: 2048,
                huge: true,
                background: true,
            })
            .build_dyn(engine_of(e))
            .unwrap();
        assert_eq!(
            r.addr() % (2 << 20),
            0,
            "huge frames need a 2 MiB aligned region"
        );
        hammer(&r, &expect, 4, 11);
        let st = r.stats();
        let ps = r.frame_pool_stats().unwrap();
        assert_eq!(st.installed as usize, r.pages(), "{e:?} {sk:?} {st:?}");
        assert!(
            ps.hits > 0,
            "{e:?} {sk:?}: no window was moved in whole: {ps:?}"
        );
        eprintln!("{e:?} {sk:?}: {st:?} {ps:?}");
    }
    // A fault-around that does not cover 2 MiB is refused.
    let err = Region::builder(4 << 20)
        .resolve_op(ResolveOp::Move)
        .fault_around(8)
        .frame_pool(FramePoolConfig {
            pages: 512,
            huge: true,
            background: false,
        })
        .build_dyn(engine_of(e))
        .unwrap_err();
    assert!(matches!(err, Error::BadPageSize { .. }), "{err}");
}

/// Run-ahead: a sequential stream over a store-backed region reads the
/// store's bytes everywhere, and the populator installs pages before the
/// application reaches them.
pub fn run_ahead_sequential(e: EngineKind) {
    // On a loaded 2-CPU machine the populator thread may not get a CPU
    // while the scan runs; the timing-dependent checks get three tries
    // (the data checks are hard on every try).
    let mut last = String::new();
    for _ in 0..3 {
        match run_ahead_attempt(e) {
            Ok(()) => return,
            Err(why) => last = why,
        }
    }
    panic!("run-ahead never got ahead in 3 tries: {last}");
}

fn run_ahead_attempt(e: EngineKind) -> Result<(), String> {
    let len = 32 << 20;
    let (store, expect, _t) = StoreKind::Memory.make(len);
    let r = Region::builder(len)
        .shared_store(store)
        .fault_around(16)
        .run_ahead(RunAheadConfig { budget_pages: 512 })
        .build_dyn(engine_of(e))
        .unwrap();
    let p = r.as_ptr();
    for pg in 0..len / 4096 {
        // Some work per page so the populator can get ahead.
        for k in [0usize, 1000, 2000, 3000, 4095] {
            assert_eq!(read(p, pg * 4096 + k), expect[pg * 4096 + k], "page {pg}");
        }
    }
    // The populator may still be finishing its last window: its ioctl
    // can be done (the scan read the pages) while the thread, preempted,
    // has not yet counted them (seen once in CI: installed 8176 of 8192).
    let count = || (0..r.pages()).filter(|&pg| r.populated_ahead(pg)).count();
    // (Bounded: the asserts below say what was missing.)
    wait_until(Duration::from_secs(5), || {
        r.stats().installed as usize == r.pages()
            && r.run_ahead_stats().unwrap().pages_populated as usize == count()
    });
    let ra = r.run_ahead_stats().unwrap();
    let ahead = count();
    let st = r.stats();
    eprintln!("{e:?}: {st:?} {ra:?} ahead {ahead}");
    assert_eq!(st.installed as usize, r.pages(), "{st:?} {ra:?}");
    assert_eq!(ra.pages_populated as usize, ahead, "{ra:?}");
    // A populator that got no CPU during the scan saw no fault and
    // installed nothing: timing, not a wrong result.
    if ahead == 0 {
        return Err(format!("the populator installed nothing: {ra:?}"));
    }
    assert!(
        ra.faults_seen > 0,
        "pages installed ahead of no fault: {ra:?}"
    );
    // Faults that did not just wait for the populator's claim installed a
    // window each: at most one per window.
    if ((st.faults - st.busy) as usize) > r.pages() / 16 {
        return Err(format!("more faults than windows: {st:?}"));
    }
    Ok(())
}

/// Writers modify pages of a region whose budget is 10% of its size while
/// the evictor runs; every value read is the last one written, and after
/// the region is dropped the store holds every last write.
pub fn eviction_integrity(e: EngineKind, policy: faultline::policy::PolicyKind) {
    use rand::{Rng, SeedableRng};
    let pages = 2048;
    let len = pages * 4096;
    let store = Arc::new(MemoryStore::new(pattern(len)));
    let r = Region::builder(len)
        .shared_store(store.clone())
        .fault_around(4)
        .budget(EvictionConfig {
            budget_pages: pages / 10,
            policy,
        })
        .build_dyn(engine_of(e))
        .unwrap();
    let base = r.as_ptr() as usize;
    let threads = 4;
    // Thread t owns pages with p % threads == t; it remembers what it wrote.
    let models: Vec<Vec<(usize, u8)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let p = base as *mut u8;
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                    let mut model: std::collections::HashMap<usize, u8> = Default::default();
                    for i in 0..6000 {
                        let pg = rng.gen_range(0..pages / threads) * threads + t;
                        let off = pg * 4096 + rng.gen_range(0..64) * 64;
                        if i % 3 == 0 {
                            let v = rng.gen::<u8>();
                            write(p, off, v);
                            model.insert(off, v);
                        } else {
                            let want = model.get(&off).copied().unwrap_or(pat(off));
                            assert_eq!(read(p, off), want, "thread {t} offset {off:#x}");
                        }
                    }
                    model.into_iter().collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let es = r.eviction_stats().unwrap();
    eprintln!("{e:?} {policy:?}: {:?} {es:?}", r.stats());
    assert!(es.evicted > 0, "no eviction happened: {es:?}");
    assert!(
        es.written_back > 0,
        "no dirty page was written back: {es:?}"
    );
    assert_eq!(es.write_back_errors, 0);
    assert!(
        es.max_resident as usize <= pages / 2,
        "the budget ({}) did not hold even loosely: {es:?}",
        pages / 10
    );
    drop(r);
    let snap = store.snapshot();
    let mut expect = pattern(len);
    for m in &models {
        for &(off, v) in m {
            expect[off] = v;
        }
    }
    if snap != expect {
        let bad = (0..len).find(|&i| snap[i] != expect[i]).unwrap();
        panic!(
            "store byte {bad:#x}: {} != last written {}",
            snap[bad], expect[bad]
        );
    }
}

/// Dropping a budget region writes its dirty pages back; a store that
/// cannot take writes is reported by `flush`, not silently dropped.
pub fn eviction_drop_writes_back(e: EngineKind) {
    let len = 64 * 4096;
    let store = Arc::new(MemoryStore::new(vec![0; len]));
    let r = Region::builder(len)
        .shared_store(store.clone())
        .budget(EvictionConfig {
            budget_pages: 1000,
            policy: faultline::policy::PolicyKind::Clock,
        })
        .build_dyn(engine_of(e))
        .unwrap();
    for pg in 0..64 {
        if pg % 2 == 0 {
            write(r.as_ptr(), pg * 4096 + 7, pg as u8 + 1);
        } else {
            assert_eq!(read(r.as_ptr(), pg * 4096), 0);
        }
    }
    assert_eq!(r.page_state(0), PageState::Writable, "written: dirty");
    assert_eq!(r.page_state(1), PageState::ReadOnly, "only read: clean");
    drop(r);
    let snap = store.snapshot();
    for pg in (0..64).step_by(2) {
        assert_eq!(
            snap[pg * 4096 + 7],
            pg as u8 + 1,
            "page {pg} written back at drop"
        );
    }
    // A store that refuses writes (a read-only file can still be written
    // by root, so it never took this branch in CI): the write-back fails,
    // `flush` says so, and the statistics count it, every time.
    let refusing = Arc::new(
        faultline::testing::FaultyStore::builder(MemoryStore::new(vec![3u8; len]))
            .rule(faultline::testing::Fault::write_back(
                faultline::testing::Action::Fail,
            ))
            .build(),
    );
    let r = Region::builder(len)
        .shared_store(refusing.clone())
        .budget(EvictionConfig {
            budget_pages: 1000,
            policy: faultline::policy::PolicyKind::Fifo,
        })
        .build_dyn(engine_of(e))
        .unwrap();
    write(r.as_ptr(), 5, 9);
    let err = r.flush().unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert_eq!(r.eviction_stats().unwrap().write_back_errors, 1);
    assert_eq!(r.page_state(0), PageState::Writable, "still dirty");
    // The store recovers: the next flush writes the page.
    refusing.heal();
    assert_eq!(r.flush().unwrap(), 1);
    assert_eq!(refusing.inner().snapshot()[5], 9);
}

/// Adaptive read-ahead: a sequential scan grows its window to the maximum
/// (few faults); random accesses keep it at the initial size.
pub fn adaptive_readahead(e: EngineKind) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let pages = 2048;
    let len = pages * 4096;
    let (store, expect, _t) = StoreKind::Memory.make(len);
    // 64 stream slots (the default): a handler thread must not take each
    // engine thread for a stream of its own.
    let ra = faultline::policy::ReadaheadConfig::adaptive(1, 64);
    let r = Region::builder(len)
        .shared_store(store.clone())
        .readahead(ra)
        .build_dyn(engine_of(e))
        .unwrap();
    for pg in 0..pages {
        assert_eq!(read(r.as_ptr(), pg * 4096 + 9), expect[pg * 4096 + 9]);
    }
    let st = r.stats();
    // 1 + 2 + ... + 64 = 127 pages in 7 faults, then 64 per fault.
    assert!(
        st.faults <= 7 + (pages as u64 - 127).div_ceil(64) + 2,
        "{e:?} sequential: {st:?}"
    );
    assert_eq!(st.installed as usize, pages);
    drop(r);
    let r = Region::builder(len)
        .shared_store(store)
        .readahead(ra)
        .build_dyn(engine_of(e))
        .unwrap();
    let mut order: Vec<usize> = (0..pages).step_by(7).collect();
    order.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(1));
    for &pg in &order {
        assert_eq!(read(r.as_ptr(), pg * 4096), expect[pg * 4096]);
    }
    let st = r.stats();
    assert!(
        st.installed < 2 * order.len() as u64,
        "{e:?} random: windows must stay small: {st:?}"
    );
}
