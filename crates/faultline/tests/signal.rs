//! The `signal` engine in process: this binary installs the runtime's
//! SIGBUS handler (and nothing else does), so it lives apart from the
//! thread-engine tests.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use faultline::*;

#[test]
fn matrix_signal_engine_stores_kinds_64mib_8_threads() {
    let _deadline = deadline(300);
    matrix(&[EngineKind::Signal], 64 << 20, 8);
}

#[test]
fn page_sizes_4k_16k_64k() {
    let _deadline = deadline(300);
    page_sizes(&[EngineKind::Signal]);
}

#[test]
fn concurrent_faults_on_one_page_resolved_once() {
    let _deadline = deadline(300);
    concurrent_faults_once(EngineKind::Signal);
}

#[test]
fn zero_store_read_maps_the_zero_page_and_write_copies() {
    let _deadline = deadline(300);
    let e = engine_of(EngineKind::Signal);
    let r = Region::builder(16 * 4096).build_dyn(e).unwrap();
    assert_eq!(read(r.as_ptr(), 5), 0);
    assert_eq!(r.page_state(0), PageState::ReadOnly);
    write(r.as_ptr(), 4096 + 5, 9);
    assert_eq!(r.page_state(1), PageState::Writable);
    assert_eq!(read(r.as_ptr(), 4096 + 5), 9);
    // A write to the zero page is an ordinary COW fault the kernel handles.
    write(r.as_ptr(), 7, 3);
    assert_eq!(read(r.as_ptr(), 7), 3);
    assert_eq!(r.stats().faults, 2);
}

#[test]
fn a_store_that_is_not_signal_safe_is_refused() {
    let _deadline = deadline(300);
    struct NotSafe;
    impl PageStore for NotSafe {
        fn describe(&self) -> &str {
            "remote-thing"
        }
        fn len(&self) -> Option<u64> {
            None
        }
        fn fill(&self, _o: u64, b: &mut [u8]) -> Result<(), StoreError> {
            b.fill(1);
            Ok(())
        }
        fn write_back(&self, _o: u64, _d: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
    }
    let err = Region::builder(4096)
        .store(NotSafe)
        .build_dyn(engine_of(EngineKind::Signal))
        .unwrap_err();
    assert!(matches!(err, Error::StoreNotSignalSafe { .. }), "{err}");
    assert!(err.to_string().contains("remote-thing"));
    // The same store is fine with a thread engine.
    let r = Region::builder(4096)
        .store(NotSafe)
        .build_dyn(engine_of(EngineKind::Poll))
        .unwrap();
    assert_eq!(read(r.as_ptr(), 0), 1);
}

#[test]
fn syscalls_into_unpopulated_pages_get_efault_until_populated() {
    let _deadline = deadline(300);
    let len = 8 * 4096;
    let data = pattern(len);
    let f = TempFile::with(&data);
    let r = Region::builder(len)
        .store(MemoryStore::new(vec![0x11; len]))
        .build_dyn(engine_of(EngineKind::Signal))
        .unwrap();
    let file = std::fs::File::open(&f.0).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: reading into the region's memory, which is ours.
    let n = unsafe { libc::pread(file.as_raw_fd(), r.as_ptr().cast(), 4096, 0) };
    let e = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        (n, e),
        (-1, Some(libc::EFAULT)),
        "a kernel-mode fault is not a signal"
    );
    r.populate(0, 4096).unwrap();
    // SAFETY: as above.
    let n = unsafe { libc::pread(file.as_raw_fd(), r.as_ptr().cast(), 4096, 0) };
    assert_eq!(n, 4096);
    assert_eq!(read(r.as_ptr(), 100), data[100]);
}

#[test]
fn shmem_continue_refaults_from_the_page_cache() {
    let _deadline = deadline(300);
    let len = 32 * 4096;
    let data = pattern(len);
    let r = Region::builder(len)
        .kind(MemoryKind::Shmem)
        .store(MemoryStore::new(data.clone()))
        .fault_around(1)
        .build_dyn(engine_of(EngineKind::Signal))
        .unwrap();
    assert_eq!(r.resolve_op(), ResolveOp::Continue);
    write(r.as_ptr(), 3 * 4096, 0x77);
    assert_eq!(r.stats().store_fills, 1);
    // Zap the mapping: the page cache keeps the data, the next access is a
    // minor fault resolved with CONTINUE alone (no store read).
    faultline_sys::mem::madvise(
        r.addr() + 3 * 4096,
        4096,
        faultline_sys::mem::Advice::DontNeed,
    )
    .unwrap();
    assert_eq!(read(r.as_ptr(), 3 * 4096), 0x77);
    assert_eq!(read(r.as_ptr(), 3 * 4096 + 1), data[3 * 4096 + 1]);
    assert_eq!(r.stats().store_fills, 1);
    assert_eq!(r.stats().faults, 2);
}

#[test]
fn residency_is_visible_to_a_presence_check() {
    let _deadline = deadline(300);
    let r = Arc::new(
        Region::builder(64 * 4096)
            .store(MemoryStore::new(pattern(64 * 4096)))
            .fault_around(8)
            .build_dyn(engine_of(EngineKind::Signal))
            .unwrap(),
    );
    assert!(!r.is_resident(0, 4096));
    let _ = read(r.as_ptr(), 10 * 4096);
    assert!(r.is_resident(8 * 4096, 8 * 4096));
    assert!(!r.is_resident(0, 8 * 4096));
    assert!(!r.is_resident(16 * 4096, 1));
    assert_eq!(r.resident_pages(), 8);
}

#[test]
fn move_from_a_background_filled_huge_frame_pool() {
    let _deadline = deadline(300);
    huge_frame_pool(EngineKind::Signal);
}

#[test]
fn run_ahead_installs_sequential_streams_ahead() {
    let _deadline = deadline(300);
    run_ahead_sequential(EngineKind::Signal);
}

#[test]
fn eviction_under_a_10_percent_budget_keeps_every_write() {
    let _deadline = deadline(300);
    eviction_integrity(EngineKind::Signal, faultline::policy::PolicyKind::Clock);
}

#[test]
fn eviction_region_drop_writes_dirty_pages_back() {
    let _deadline = deadline(120);
    eviction_drop_writes_back(EngineKind::Signal);
}

#[test]
fn adaptive_readahead_grows_on_streams_only() {
    let _deadline = deadline(120);
    adaptive_readahead(EngineKind::Signal);
}

/// A region over a tmpfs file whose page cache already holds the data:
/// minor faults resolved with CONTINUE, nothing copied from a store; holes
/// read as zeros; the bytes are the file's.
#[test]
fn page_cache_file_is_installed_without_copies() {
    use std::io::{Seek, SeekFrom, Write};
    let _dl = deadline(60);
    let pages = 256;
    let path = std::path::PathBuf::from(format!("/dev/shm/faultline-pcf-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let data = pattern(pages * 4096);
    // Pages 100..120 stay a hole.
    f.write_all(&data[..100 * 4096]).unwrap();
    f.seek(SeekFrom::Start(120 * 4096)).unwrap();
    f.write_all(&data[120 * 4096..]).unwrap();
    let file = f;
    std::fs::remove_file(&path).unwrap();
    for kind in [EngineKind::Signal, EngineKind::Poll] {
        let engine = engine_of(kind);
        let region = Region::builder(pages * 4096)
            .page_cache_file(file.try_clone().unwrap())
            .fault_around(16)
            .build_dyn(engine)
            .unwrap();
        assert_eq!(region.kind(), MemoryKind::Shmem);
        assert_eq!(region.resolve_op(), ResolveOp::Continue);
        for p in 0..pages {
            for off in [0, 4095] {
                let want = if (100..120).contains(&p) {
                    0
                } else {
                    data[p * 4096 + off]
                };
                assert_eq!(
                    read(region.as_ptr(), p * 4096 + off),
                    want,
                    "{kind:?} page {p}"
                );
            }
        }
        let s = region.stats();
        assert_eq!(s.store_fills, 0, "{s:?}");
        assert!(
            s.faults <= (pages / 16 + 4) as u64,
            "fault-around windows: {s:?}"
        );
    }
    // Not tmpfs: refused with a reason.
    let exe = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
    let r = Region::builder(4096)
        .page_cache_file(exe)
        .build(&SignalEngine::new().unwrap());
    assert!(matches!(r, Err(Error::Unsupported { .. })), "{:?}", r.err());
}

/// With no tuning, a region over a `FileStore` of a tmpfs file maps the
/// file's page cache privately (CONTINUE, nothing copied), with the
/// adaptive zero-copy read-ahead; writes stay in the region (the file keeps
/// its bytes); a region longer than the file, or `zero_copy(false)`, copies
/// instead, and reads past the end of the file are zeros.
#[test]
fn zero_copy_is_the_default_for_a_tmpfs_file() {
    let _dl = deadline(60);
    let pages = 128;
    let data = pattern(pages * 4096);
    let path = std::path::PathBuf::from(format!("/dev/shm/faultline-zc-{}", std::process::id()));
    std::fs::write(&path, &data).unwrap();
    for kind in [EngineKind::Signal, EngineKind::Poll] {
        let engine = engine_of(kind);
        let region = Region::builder(pages * 4096)
            .store(FileStore::open(&path).unwrap())
            .build_dyn(engine.clone())
            .unwrap();
        assert!(region.is_zero_copy(), "{kind:?}: {region:?}");
        assert_eq!(region.kind(), MemoryKind::Shmem);
        assert_eq!(region.resolve_op(), ResolveOp::Continue);
        assert_eq!(region.readahead(), ReadaheadConfig::adaptive(64, 512));
        for p in 0..pages {
            assert_eq!(
                read(region.as_ptr(), p * 4096 + 7),
                data[p * 4096 + 7],
                "{kind:?} page {p}"
            );
        }
        write(region.as_ptr(), 5 * 4096, !data[5 * 4096]);
        assert_eq!(read(region.as_ptr(), 5 * 4096), !data[5 * 4096]);
        let s = region.stats();
        assert_eq!(
            (s.store_fills, s.zero_copy_fills),
            (0, 0),
            "{kind:?}: {s:?}"
        );
        assert!(s.faults <= 4, "{kind:?}: 64-page windows: {s:?}");
        drop(region);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            data,
            "{kind:?}: writes stay private"
        );

        // Longer than the file: copies, zeros past its end.
        let region = Region::builder((pages + 16) * 4096)
            .store(FileStore::open(&path).unwrap())
            .build_dyn(engine.clone())
            .unwrap();
        assert!(!region.is_zero_copy());
        assert_eq!(region.kind(), MemoryKind::PrivateAnon);
        assert_eq!(region.readahead(), ReadaheadConfig::adaptive(16, 256));
        assert_eq!(read(region.as_ptr(), 3 * 4096), data[3 * 4096]);
        assert_eq!(read(region.as_ptr(), (pages + 3) * 4096), 0);
        drop(region);

        // Turned off.
        let region = Region::builder(pages * 4096)
            .store(FileStore::open(&path).unwrap())
            .zero_copy(false)
            .build_dyn(engine)
            .unwrap();
        assert!(!region.is_zero_copy());
        assert_eq!(read(region.as_ptr(), 9 * 4096), data[9 * 4096]);
        assert!(region.stats().zero_copy_fills > 0);
    }
    std::fs::remove_file(&path).unwrap();
    // A zero store reads ahead only on streams.
    let region = Region::builder(4096 * 4)
        .build(&SignalEngine::new().unwrap())
        .unwrap();
    assert_eq!(region.readahead(), ReadaheadConfig::adaptive(1, 64));
}

/// A budget of 256 pages with a low-water mark of 64, four evictors
/// (the signal engine: faults evict for themselves too).
fn four_evictors(store: Arc<dyn PageStore>, len: usize, low: usize) -> Region {
    Region::builder(len)
        .shared_store(store)
        .readahead(ReadaheadConfig::fixed(1))
        .budget(EvictionConfig {
            budget_pages: 256,
            policy: faultline::policy::PolicyKind::Fifo,
        })
        .budget_low_water(low)
        .evictors(4)
        .build_dyn(engine_of(EngineKind::Signal))
        .unwrap()
}

/// The evictors drain to the low-water mark whenever the count reached
/// the high-water mark (here the budget), also when a fault that found
/// the budget full evicted a batch for itself and took the count back
/// under the mark before any evictor looked. Fifty rounds, each a fresh
/// region: 256 pages read (the last one takes the count to the mark),
/// then one more, whose fault finds the budget full unless the evictors
/// were quicker; either way they bring the count down to the low-water
/// mark (one past it when that page went in after they drained). Evicted
/// pages read back.
#[test]
fn evictors_drain_after_a_fault_evicted_for_itself() {
    let _deadline = deadline(300);
    let (budget, low, touched) = (256usize, 64usize, 257usize);
    let len = 2 * budget * 4096;
    let store = Arc::new(MemoryStore::new(pattern(len)));
    let mut inline = 0;
    for round in 0..50 {
        let r = four_evictors(store.clone(), len, low);
        for pg in 0..touched {
            assert_eq!(read(r.as_ptr(), pg * 4096 + 7), pat(pg * 4096 + 7));
        }
        assert!(
            wait_until(Duration::from_secs(20), || {
                r.eviction_stats().unwrap().resident <= low as u64 + 1
            }),
            "round {round}: the evictors did not drain to the mark: {:?}",
            r.eviction_stats()
        );
        let s = r.eviction_stats().unwrap();
        assert!(s.max_resident <= budget as u64, "a bound: {s:?}");
        inline += s.evicted_inline;
        for pg in 0..touched {
            assert_eq!(
                read(r.as_ptr(), pg * 4096 + 7),
                pat(pg * 4096 + 7),
                "page {pg}"
            );
        }
    }
    eprintln!("pages evicted by faults for themselves in 50 rounds: {inline}");
}

/// Several evictors draining together stop at the low-water mark instead
/// of each evicting a batch past it (each takes on only what the others
/// have not). 256 dirty pages and a mark of 216: 40 pages to evict, in
/// batches of at most 16. The write-backs wait at a closed gate until
/// three evictors hold a batch, so every evictor chooses its batch before
/// any page leaves: 16, 16 and 8 then, where each evictor reading the
/// count for itself would take 16 (48 or 64 pages, past the mark).
#[test]
fn evictors_draining_together_stop_at_the_low_water_mark() {
    let _deadline = deadline(300);
    let (budget, low) = (256usize, 216usize);
    let len = 2 * budget * 4096;
    let store = Arc::new(GateStore::closed(MemoryStore::new(vec![0; len])));
    let r = four_evictors(store.clone(), len, low);
    for pg in 0..budget {
        write(r.as_ptr(), pg * 4096, pg as u8 | 1);
    }
    assert!(
        wait_until(Duration::from_secs(30), || store.waiting() >= 3),
        "three evictors never held a batch each: {:?}",
        r.eviction_stats()
    );
    // A fourth evictor that would take a batch too gets the time to.
    std::thread::sleep(Duration::from_millis(100));
    let held = store.waiting();
    store.open();
    assert!(
        wait_until(Duration::from_secs(30), || {
            r.eviction_stats().unwrap().resident <= low as u64 && store.waiting() == 0
        }),
        "the evictors did not drain to the mark: {:?}",
        r.eviction_stats()
    );
    // Any batch still being evicted is done.
    std::thread::sleep(Duration::from_millis(50));
    let s = r.eviction_stats().unwrap();
    assert_eq!(
        s.resident, low as u64,
        "stopped at the mark ({held} evictors held batches at the gate): {s:?}"
    );
    assert_eq!(
        s.written_back, s.evicted,
        "dirty evictions write back: {s:?}"
    );
    for pg in 0..budget {
        assert_eq!(read(r.as_ptr(), pg * 4096), pg as u8 | 1, "page {pg}");
    }
}
