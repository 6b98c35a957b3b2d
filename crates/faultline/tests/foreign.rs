//! Foreign regions through the library API: a userfaultfd adopted as if it
//! came from another process (here: our own, so a thread of this test is
//! the "peer"; the out-of-process protocol is tested by faultline-cli's
//! `tests/serve.rs`). Every wait is bounded.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, wait_until};
use faultline::*;
use faultline_sys::mem::{self, Advice, Mapping};
use faultline_sys::uffd::{self, feature, register_mode, Uffd};

fn new_uffd(features: u64) -> Uffd {
    let u = uffd::dev_userfaultfd(uffd::open_flags(true))
        .or_else(|_| uffd::syscall_userfaultfd(uffd::open_flags(true)))
        .expect("a userfaultfd");
    u.api(features).expect("UFFDIO_API");
    u
}

fn dup(u: &Uffd) -> OwnedFd {
    u.as_fd().try_clone_to_owned().unwrap()
}

fn spec(base: u64, len: usize, off: u64) -> ForeignRegionSpec {
    ForeignRegionSpec {
        base,
        len,
        page_size: 4096,
        store_offset: off,
    }
}

#[test]
fn what_cannot_work_on_foreign_memory_is_refused() {
    let u = new_uffd(feature::EVENT_REMOVE);
    let fu = ForeignUffd::adopt(dup(&u)).unwrap();
    assert!(fu.reports_removes());
    assert_eq!(fu.feature_names(), vec!["EVENT_REMOVE"]);
    let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(pattern(1 << 20)));
    let specs = [spec(0x7000_0000_0000, 1 << 20, 0)];
    let refused = |opts: ForeignOptions| {
        ForeignPeer::new("t", fu.clone(), &specs, store.clone(), &opts).unwrap_err()
    };
    let e = refused(ForeignOptions {
        budget: Some(EvictionConfig {
            budget_pages: 8,
            policy: faultline::policy::PolicyKind::ALL[0],
        }),
        ..Default::default()
    });
    assert!(e.to_string().contains("MADV_DONTNEED"), "{e}");
    let e = refused(ForeignOptions {
        zero_copy: true,
        ..Default::default()
    });
    assert!(e.to_string().contains("mapped into another process"), "{e}");
    let e = ForeignEngine::new(EngineKind::Signal, Default::default()).unwrap_err();
    assert!(e.to_string().contains("signal engine"), "{e}");
    let bad = |s: &[ForeignRegionSpec]| {
        ForeignPeer::new("t", fu.clone(), s, store.clone(), &Default::default())
            .unwrap_err()
            .to_string()
    };
    let mut odd = specs;
    odd[0].page_size = 65536;
    assert!(bad(&odd).contains("page size 65536"));
    assert!(bad(&[
        spec(0x7000_0000_0000, 8192, 0),
        spec(0x7000_0000_1000, 8192, 8192)
    ])
    .contains("overlap"));
    assert!(bad(&[spec(0x7000_0000_0000, 2 << 20, 0)]).contains("past the end"));
    // Not a userfaultfd; a userfaultfd whose handshake is not done.
    let f: OwnedFd = std::fs::File::open("/proc/self/stat").unwrap().into();
    assert!(matches!(
        ForeignUffd::adopt(f),
        Err(ForeignError::NotUserfaultfd)
    ));
    let raw = uffd::dev_userfaultfd(uffd::open_flags(true))
        .or_else(|_| uffd::syscall_userfaultfd(uffd::open_flags(true)))
        .unwrap();
    assert!(matches!(
        ForeignUffd::adopt(dup(&raw)),
        Err(ForeignError::NotUserfaultfd)
    ));
}

#[test]
fn a_foreign_region_is_served_recorded_and_zeroed_after_remove() {
    let len = 2 << 20;
    let data = pattern(2 * len);
    let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(data.clone()));
    let u = new_uffd(feature::EVENT_REMOVE);
    let a = Mapping::anon(len).unwrap();
    let b = Mapping::anon(len).unwrap();
    for m in [&a, &b] {
        m.advise(0, len, Advice::NoHugePage).unwrap();
        u.register(m.addr(), len as u64, register_mode::MISSING)
            .unwrap();
    }
    let (engine, events) = ForeignEngine::new(EngineKind::Poll, Default::default()).unwrap();
    // Region b's bytes come first in the store.
    let specs = [spec(a.addr(), len, len as u64), spec(b.addr(), len, 0)];
    let opts = ForeignOptions {
        readahead: ReadaheadConfig::off(),
        record: true,
        ..Default::default()
    };
    let peer = engine.add(
        ForeignPeer::new(
            "self",
            ForeignUffd::adopt(dup(&u)).unwrap(),
            &specs,
            store,
            &opts,
        )
        .unwrap(),
    );
    let (pa, pb) = (a.addr() as usize, b.addr() as usize);
    let t = std::thread::spawn(move || {
        let mut sum = 0u64;
        for off in (0..len).step_by(4096).rev() {
            // SAFETY: inside live mappings.
            unsafe {
                sum += std::ptr::read_volatile((pa + off) as *const u8) as u64;
                sum += std::ptr::read_volatile((pb + off) as *const u8) as u64;
            }
        }
        sum
    });
    let done = wait_until(Duration::from_secs(30), || t.is_finished());
    assert!(done, "faults were not served");
    t.join().unwrap();
    // SAFETY: the mappings are fully installed now.
    let (sa, sb) = unsafe {
        (
            std::slice::from_raw_parts(a.as_ptr(), len),
            std::slice::from_raw_parts(b.as_ptr(), len),
        )
    };
    assert!(sa == &data[len..], "region a differs from its store bytes");
    assert!(sb == &data[..len], "region b differs from its store bytes");
    let s = peer.stats();
    assert_eq!(s.faults, 2 * (len / 4096) as u64);
    let rec = peer.take_record();
    assert_eq!(rec.len(), 2 * len / 4096);
    assert_eq!(
        rec[0],
        (2 * len - 4096) as u64,
        "a's last page faulted first"
    );
    // The "peer" drops half of a: REMOVE, then zeros there.
    mem::madvise(a.addr(), len / 2, Advice::DontNeed).unwrap();
    let pa2 = a.addr() as usize;
    let t = std::thread::spawn(move || {
        // SAFETY: inside a live mapping.
        (0..len / 2)
            .step_by(4096)
            .all(|o| unsafe { std::ptr::read_volatile((pa2 + o) as *const u8) } == 0)
    });
    assert!(wait_until(Duration::from_secs(30), || t.is_finished()));
    assert!(t.join().unwrap(), "a removed range must read zeros");
    assert!(sa[len / 2..] == data[len + len / 2..]);
    assert!(sa[..len / 2].iter().all(|&x| x == 0));
    assert_eq!(peer.stats().removed_pages, (len / 2 / 4096) as u64);
    assert!(events.try_recv().is_err(), "no peer event expected");
    engine.remove(peer.id()).unwrap();
}

#[test]
fn prefetch_installs_the_set_before_any_fault() {
    let len = 4 << 20;
    let data = pattern(len);
    let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(data.clone()));
    let u = new_uffd(feature::EVENT_REMOVE);
    let a = Mapping::anon(len).unwrap();
    a.advise(0, len, Advice::NoHugePage).unwrap();
    u.register(a.addr(), len as u64, register_mode::MISSING)
        .unwrap();
    let (engine, events) = ForeignEngine::new(EngineKind::Workers, Default::default()).unwrap();
    let peer = ForeignPeer::new(
        "p",
        ForeignUffd::adopt(dup(&u)).unwrap(),
        &[spec(a.addr(), len, 0)],
        store,
        &Default::default(),
    )
    .unwrap();
    let set: Vec<u64> = (0..len as u64 / 2).step_by(4096).collect();
    assert_eq!(peer.prefetch(&set), set.len());
    let peer = engine.add(peer);
    match events.recv_timeout(Duration::from_secs(30)).unwrap() {
        PeerEvent::PrefetchDone { .. } => {}
        other => panic!("unexpected {other:?}"),
    }
    let s = peer.stats();
    assert_eq!(s.prefetched, set.len() as u64);
    assert_eq!(s.faults, 0);
    // Large runs: no more ioctls than pieces of a helper's hold.
    let pieces = (len / 2).div_ceil(faultline::foreign::GATE_PIECE) as u64;
    assert!(s.prefetch_ioctls <= pieces + 1, "{s:?}");
    // SAFETY: the prefetched half is installed: reading it cannot fault.
    let got = unsafe { std::slice::from_raw_parts(a.as_ptr(), len / 2) };
    assert!(got == &data[..len / 2]);
    assert_eq!(peer.stats().faults, 0);
}

/// Run-ahead populators on a peer's memory racing its balloon: the peer
/// streams through a region (so the populator installs windows ahead of
/// it) while another of its threads drops 32-page ranges just ahead of
/// the stream. Two guards make it pass, and this test caught each one
/// missing:
/// - each populator install (store read, copy, map update) holds the
///   peer's copy gate, which the handler takes around reading events;
///   without it a copy of store bytes landed after the drop (11 of 60
///   runs failed);
/// - a missing fault on a page the map calls present re-installs it
///   (EEXIST if it is there): a REMOVE is read before the kernel zaps its
///   range, so a page installed in between is recorded present and then
///   dropped; without the re-install the stream livelocked re-faulting on
///   such a page (1 of 40 runs, with the gate).
#[test]
fn run_ahead_racing_balloon_removes_keeps_dropped_ranges_zero() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let _deadline = faultline::testing::child::deadline(240);
    const PAGES: usize = 4096;
    const STEP: usize = 128;
    const DROP: usize = 32;
    let len = PAGES * 4096;
    let data = pattern(len);
    let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(data.clone()));
    let (engine, _events) = ForeignEngine::new(EngineKind::Poll, Default::default()).unwrap();
    let (mut populated, mut drops) = (0, 0);
    for round in 0..8 {
        let opts = ForeignOptions {
            readahead: ReadaheadConfig::adaptive(1, 16),
            run_ahead: Some(RunAheadConfig { budget_pages: 256 }),
            ..Default::default()
        };
        let (_u, a, peer) = anon_self_peer(&engine, &store, len, &opts);
        let base = a.addr() as usize;
        let progress = Arc::new(AtomicUsize::new(0));
        let reader = {
            let progress = progress.clone();
            std::thread::spawn(move || {
                for p in 0..PAGES {
                    // SAFETY: inside a live mapping (leaked if the stream
                    // stalls, see below).
                    unsafe { std::ptr::read_volatile((base + p * 4096) as *const u8) };
                    progress.store(p, SeqCst);
                }
            })
        };
        // Drop [k*STEP + STEP/2, +DROP) once the stream is within half a
        // chunk of it, where the populator is installing.
        let mut dropped = Vec::new();
        let mut stalled = false;
        for k in 0..PAGES / STEP {
            let at = k * STEP + STEP / 2;
            if !wait_until(Duration::from_secs(30), || {
                progress.load(SeqCst) + STEP / 2 >= at || reader.is_finished()
            }) {
                stalled = true;
                break;
            }
            if progress.load(SeqCst) >= at {
                continue; // the stream passed it already
            }
            mem::madvise(a.addr() + (at * 4096) as u64, DROP * 4096, Advice::DontNeed).unwrap();
            dropped.push(at..at + DROP);
        }
        if stalled || !wait_until(Duration::from_secs(30), || reader.is_finished()) {
            // The reader is stuck in a fault: keep its memory mapped.
            std::mem::forget(a);
            panic!(
                "round {round}: the stream stalled at page {}",
                progress.load(SeqCst)
            );
        }
        reader.join().unwrap();
        // SAFETY: the mapping is live; pages still missing fault in here.
        let got = unsafe { std::slice::from_raw_parts(a.as_ptr(), len) };
        check_dropped_zero(round, got, &data, &dropped);
        let s = peer.stats();
        assert!(s.removes as usize >= dropped.len());
        populated += s.run_ahead_pages;
        drops += dropped.len();
        engine.remove(peer.id()).unwrap();
    }
    assert!(populated > 0, "the run-ahead populators installed nothing");
    assert!(drops > 0, "nothing was dropped ahead of the stream");
}

/// Joins the `vcpus` of `round` within a minute and gives their memory
/// back; a vCPU stuck in a fault fails the test, its memory leaked.
fn join_vcpus(
    round: u64,
    vcpus: Vec<std::thread::JoinHandle<()>>,
    a: Mapping,
    peer: &ForeignPeer,
) -> Mapping {
    if !wait_until(Duration::from_secs(60), || {
        vcpus.iter().all(|v| v.is_finished())
    }) {
        std::mem::forget(a);
        panic!("round {round}: a vCPU stalled: {:?}", peer.stats());
    }
    for v in vcpus {
        v.join().unwrap();
    }
    a
}

/// A foreign engine of two workers (every thread reads every peer).
fn two_workers() -> (ForeignEngine, std::sync::mpsc::Receiver<PeerEvent>) {
    let cfg = ForeignEngineConfig {
        threads: 2,
        spread: true,
        ..Default::default()
    };
    ForeignEngine::new(EngineKind::Poll, cfg).unwrap()
}

/// `len` bytes of anonymous memory of this process registered MISSING
/// with a userfaultfd that reads REMOVE events, served by `engine` from
/// `store` as a peer ("self") with `opts`.
fn anon_self_peer(
    engine: &ForeignEngine,
    store: &Arc<dyn PageStore>,
    len: usize,
    opts: &ForeignOptions,
) -> (Uffd, Mapping, Arc<ForeignPeer>) {
    let u = new_uffd(feature::EVENT_REMOVE);
    let a = Mapping::anon(len).unwrap();
    a.advise(0, len, Advice::NoHugePage).unwrap();
    u.register(a.addr(), len as u64, register_mode::MISSING)
        .unwrap();
    let peer = engine.add(
        ForeignPeer::new(
            "self",
            ForeignUffd::adopt(dup(&u)).unwrap(),
            &[spec(a.addr(), len, 0)],
            store.clone(),
            opts,
        )
        .unwrap(),
    );
    (u, a, peer)
}

/// Every page of `got` holds the store's bytes (`data`), but for the
/// pages of the `dropped` ranges, which read zeros.
fn check_dropped_zero(round: u64, got: &[u8], data: &[u8], dropped: &[std::ops::Range<usize>]) {
    for p in 0..got.len() / 4096 {
        let page = &got[p * 4096..(p + 1) * 4096];
        if dropped.iter().any(|r| r.contains(&p)) {
            assert!(
                page.iter().all(|&x| x == 0),
                "round {round}: dropped page {p} holds store bytes"
            );
        } else {
            assert!(
                page == &data[p * 4096..(p + 1) * 4096],
                "round {round}: page {p} differs"
            );
        }
    }
}

/// A file in /dev/shm, removed on drop.
struct Shm(std::path::PathBuf);

impl Drop for Shm {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_shared_snapshot_is_served_with_continue_zero_copy() {
    let len = 1 << 20;
    let data = pattern(2 * len);
    let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(data.clone()));
    let path = Shm(format!("/dev/shm/faultline-lib-shared-{}", std::process::id()).into());
    let _ = std::fs::remove_file(&path.0);
    let (snap, done) = SharedSnapshot::create(&path.0, &*store, |_, _| {}).unwrap();
    assert_eq!((snap.len(), done.bytes), (2 * len as u64, 2 * len as u64));
    assert_eq!(std::fs::read(&path.0).unwrap(), data);
    // Written under a temporary name, linked whole: nothing else is left.
    let name = path.0.file_name().unwrap().to_string_lossy().into_owned();
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(&name) && *n != name)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // What it refuses: an existing path; reusing it for other bytes.
    let e = SharedSnapshot::create(&path.0, &*store, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("creating"), "{e}");
    let mut other = data.clone();
    other[2 * len - 1] ^= 1; // the last page is always sampled
    let e = SharedSnapshot::open(&path.0, &MemoryStore::new(other)).unwrap_err();
    assert!(e.to_string().contains("differs"), "{e}");
    let snap = Arc::new(SharedSnapshot::open(&path.0, &*store).unwrap());

    // The "peer" (this process) maps its second half MAP_PRIVATE and
    // registers it MISSING|MINOR.
    let file = std::fs::File::open(&path.0).unwrap();
    let m = Mapping::file_private(None, &file, len, len as u64).unwrap();
    let u = new_uffd(feature::EVENT_REMOVE | feature::MINOR_SHMEM | feature::MISSING_SHMEM);
    u.register(
        m.addr(),
        len as u64,
        register_mode::MISSING | register_mode::MINOR,
    )
    .unwrap();
    let pid = std::process::id() as i32;
    assert_eq!(
        snap.check_peer(pid, &[(m.addr(), len, len as u64)])
            .unwrap(),
        PeerBacking::Shared
    );
    let e = snap.check_peer(pid, &[(m.addr(), len, 0)]).unwrap_err();
    assert!(e.to_string().contains("file offset"), "{e}");
    let anon = Mapping::anon(len).unwrap();
    assert_eq!(
        snap.check_peer(pid, &[(anon.addr(), len, 0)]).unwrap(),
        PeerBacking::Anonymous
    );
    let specs = [spec(m.addr(), len, len as u64)];
    let shared = ForeignOptions {
        shared: Some(snap.clone()),
        ..Default::default()
    };
    // Shared mode needs the peer's minor faults.
    let plain = ForeignUffd::adopt(dup(&new_uffd(feature::EVENT_REMOVE))).unwrap();
    let e = ForeignPeer::new("t", plain, &specs, store.clone(), &shared).unwrap_err();
    assert!(e.to_string().contains("MINOR_SHMEM"), "{e}");
    let short: Arc<dyn PageStore> = Arc::new(MemoryStore::new(pattern(len)));
    let e = ForeignPeer::new(
        "t",
        ForeignUffd::adopt(dup(&u)).unwrap(),
        &[spec(m.addr(), len / 2, 0)],
        short,
        &shared,
    )
    .unwrap_err();
    assert!(matches!(e, ForeignError::SharedLength { .. }), "{e}");

    let (engine, events) = ForeignEngine::new(EngineKind::Poll, Default::default()).unwrap();
    let peer = ForeignPeer::new(
        "self",
        ForeignUffd::adopt(dup(&u)).unwrap(),
        &specs,
        store,
        &shared,
    )
    .unwrap();
    assert!(peer.is_shared());
    // Prefetch the first half (CONTINUE runs), then touch everything.
    let set: Vec<u64> = (len as u64..len as u64 + len as u64 / 2)
        .step_by(4096)
        .collect();
    peer.prefetch_prepared(&set);
    let peer = engine.add(peer);
    match events.recv_timeout(Duration::from_secs(30)).unwrap() {
        PeerEvent::PrefetchDone { .. } => {}
        other => panic!("unexpected {other:?}"),
    }
    let base = m.addr() as usize;
    let read_all = move || {
        let t = std::thread::spawn(move || {
            // SAFETY: inside a live mapping.
            (0..len)
                .map(|o| unsafe { std::ptr::read_volatile((base + o) as *const u8) })
                .collect::<Vec<u8>>()
        });
        assert!(wait_until(Duration::from_secs(30), || t.is_finished()));
        t.join().unwrap()
    };
    assert!(read_all() == data[len..], "the peer's bytes differ");
    let s = peer.stats();
    assert_eq!(s.prefetched, (len / 2 / 4096) as u64);
    assert_eq!(s.regions.installed, (len / 4096) as u64);
    assert_eq!(s.bytes_read, 0, "no page may be read from the store");
    // A write is private: the page is copied in the kernel, the file stays.
    // SAFETY: inside a live, writable mapping whose page is installed.
    unsafe { std::ptr::write_volatile(m.as_ptr(), !data[len]) };
    assert_eq!(std::fs::read(&path.0).unwrap(), data);
    // Dropped pages read zeros (a private page), not the snapshot's.
    mem::madvise(m.addr(), len / 2, Advice::DontNeed).unwrap();
    let after = read_all();
    assert!(
        after[..len / 2].iter().all(|&b| b == 0),
        "removed pages must read zeros"
    );
    assert!(after[len / 2..] == data[len + len / 2..]);
    assert_eq!(peer.stats().removed_pages, (len / 2 / 4096) as u64);
    assert!(events.try_recv().is_err(), "no peer event expected");
    engine.remove(peer.id()).unwrap();
}

/// Workers (`spread`: both handler threads read the one userfaultfd)
/// through REMOVE storms: every message the kernel hands out is read by
/// one thread and handled once. The peer's counters say so: `messages`
/// counts each `read(2)`'s messages before any is handled, the handled
/// ones (`faults + removes + other_events`) as each is handled. Read
/// handled first, then messages: handled is never more (no message
/// handled twice), and once the vCPUs are done and the handlers quiet
/// they are equal (none lost: the poll is bounded, as the last vCPU can
/// be woken by another fault's install while its own message is still
/// on its way through the other thread). Every byte is checked: pages a
/// storm dropped read zeros, the others the store's.
#[test]
fn workers_read_each_message_once_through_remove_storms() {
    let _deadline = faultline::testing::child::deadline(240);
    let (engine, _events) = two_workers();
    remove_storms(&engine);
}

/// The per-CPU engine (serve's `--engine per-cpu`): one handler thread
/// pinned on each CPU this process may use, each asleep in `poll(2)` and
/// reading one message at a time; the kernel has each thread where it
/// was asked to be, and the REMOVE storms below are served as by workers,
/// without a thread ever spinning on the userfaultfd.
#[test]
fn pinned_threads_one_per_cpu_read_each_message_once_through_remove_storms() {
    let _deadline = faultline::testing::child::deadline(240);
    let cpus = faultline_sys::thread::allowed_cpus().unwrap();
    let cfg = ForeignEngineConfig {
        threads: cpus.len(),
        spread: true,
        pin: true,
        wait: HandlerWait::Poll,
        batch: 1,
        ..Default::default()
    };
    let (engine, _events) = ForeignEngine::new(EngineKind::Poll, cfg).unwrap();
    let tids = engine.handler_tids();
    assert_eq!(tids.len(), cpus.len());
    let handlers = faultline::testing::threads(std::process::id(), "fl-handler-");
    for (i, tid) in tids.iter().enumerate() {
        let t = handlers
            .iter()
            .find(|t| t.tid == *tid)
            .expect("the handler thread");
        assert_eq!(t.cpus, cpus[i].to_string(), "thread {i} (tid {tid})");
        assert_eq!(t.name, format!("fl-handler-{i}"));
    }
    remove_storms(&engine);
    let h = engine.handler_stats();
    assert_eq!(h.empty_spins, 0, "a poll thread spun: {h:?}");
    assert!(h.sleeps > 0, "{h:?}");
}

/// Four rounds of four vCPU threads faulting scattered pages of a peer
/// served by `engine` while this thread drops ranges of it: every message
/// is handled once, every dropped page reads zeros, every other the
/// store's bytes.
fn remove_storms(engine: &ForeignEngine) {
    const PAGES: usize = 8192;
    const VCPUS: usize = 4;
    const DROP: usize = 24;
    let len = PAGES * 4096;
    let data = pattern(len);
    let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(data.clone()));
    let (mut removes, mut faults) = (0, 0);
    for round in 0..4u64 {
        // Windows overlap between the two threads: claims settle them.
        let opts = ForeignOptions {
            readahead: ReadaheadConfig::adaptive(4, 32),
            ..Default::default()
        };
        let (_u, a, peer) = anon_self_peer(engine, &store, len, &opts);
        let base = a.addr() as usize;
        let vcpus: Vec<_> = (0..VCPUS)
            .map(|t| {
                std::thread::spawn(move || {
                    // Scattered over the region, each vCPU its own pages.
                    for i in (t..PAGES).step_by(VCPUS) {
                        let p = i * 2654435761 % PAGES;
                        // SAFETY: inside a live mapping (leaked if a vCPU
                        // stalls, see below).
                        unsafe { std::ptr::read_volatile((base + p * 4096) as *const u8) };
                    }
                })
            })
            .collect();
        // The storm: drop ranges while the vCPUs fault, each madvise
        // waiting for its REMOVE to be read.
        let mut dropped = Vec::new();
        let mut k = round;
        while !vcpus.iter().all(|v| v.is_finished()) && dropped.len() < 400 {
            k = k
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (k >> 33) as usize % (PAGES - DROP);
            mem::madvise(a.addr() + (at * 4096) as u64, DROP * 4096, Advice::DontNeed).unwrap();
            dropped.push(at..at + DROP);
        }
        let a = join_vcpus(round, vcpus, a, &peer);
        let handled_and_read = || {
            let s = peer.stats();
            let handled = s.faults + s.removes + s.other_events;
            (handled, peer.stats().messages)
        };
        let mut counts = handled_and_read();
        let settled = wait_until(Duration::from_secs(30), || {
            counts = handled_and_read();
            assert!(
                counts.0 <= counts.1,
                "round {round}: {} messages handled of {} read: one handled twice",
                counts.0,
                counts.1
            );
            counts.0 == counts.1
        });
        assert!(
            settled,
            "round {round}: {} messages handled of {} read: one lost",
            counts.0, counts.1
        );
        // SAFETY: the mapping is live; pages still missing fault in here.
        let got = unsafe { std::slice::from_raw_parts(a.as_ptr(), len) };
        check_dropped_zero(round, got, &data, &dropped);
        let s = peer.stats();
        assert!(s.removes as usize >= dropped.len(), "{s:?}");
        removes += s.removes;
        faults += s.faults;
        engine.remove(peer.id()).unwrap();
    }
    eprintln!("{removes} REMOVE events, {faults} faults over 4 rounds");
    assert!(
        removes > 0 && faults > 0,
        "{removes} REMOVE, {faults} faults"
    );
}

/// Workers, and one handler thread with its helper as a crew, copy one
/// peer's sweeping windows at once, in pieces of the copy gate, through
/// its balloon: two vCPUs each sweep their half of a region (windows grow
/// to 512 pages, eight pieces of `GATE_PIECE`), from the second round on
/// while this thread drops ranges just ahead of them (where another thread
/// is copying a window piece by piece). Every dropped
/// page reads zeros, every other page the store's bytes; the first round
/// (no drops) shows the windows were cut: more ioctls than windows, none
/// installing more than a piece.
#[test]
fn sweeping_windows_go_in_pieces_on_several_threads_through_removes() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let _deadline = faultline::testing::child::deadline(240);
    const PAGES: usize = 16384;
    const DROP: usize = 16;
    let piece = faultline::foreign::GATE_PIECE / 4096;
    let len = PAGES * 4096;
    let data = pattern(len);
    let store: Arc<dyn PageStore> = Arc::new(MemoryStore::new(data.clone()));
    let mut drops = 0;
    // Workers, then one handler thread whose prefetch helper is its crew.
    let crew = ForeignEngineConfig {
        prefetch_helpers: 1,
        ..Default::default()
    };
    let engines = [
        (false, two_workers()),
        (true, ForeignEngine::new(EngineKind::Poll, crew).unwrap()),
    ];
    for (crewed, (engine, _events)) in engines {
        let mut helped = 0;
        for round in 0..4u64 {
            let opts = ForeignOptions {
                readahead: ReadaheadConfig::adaptive(16, 512),
                ..Default::default()
            };
            let (_u, a, peer) = anon_self_peer(&engine, &store, len, &opts);
            let base = a.addr() as usize;
            let progress: Arc<[AtomicUsize; 2]> =
                Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
            let vcpus: Vec<_> = (0..2)
                .map(|t| {
                    let progress = progress.clone();
                    std::thread::spawn(move || {
                        for p in t * PAGES / 2..(t + 1) * PAGES / 2 {
                            // SAFETY: inside a live mapping (leaked if a vCPU
                            // stalls, see below).
                            unsafe { std::ptr::read_volatile((base + p * 4096) as *const u8) };
                            progress[t].store(p, SeqCst);
                        }
                    })
                })
                .collect();
            let mut dropped = Vec::new();
            let mut k = round;
            while round > 0 && !vcpus.iter().all(|v| v.is_finished()) && dropped.len() < 200 {
                // A range 64-448 pages ahead of one vCPU: inside the window
                // being copied, or the next.
                k = k
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = (k >> 40) as usize % 2;
                let at =
                    progress[t].load(SeqCst).max(t * PAGES / 2) + 64 + (k >> 33) as usize % 384;
                if at + DROP <= (t + 1) * PAGES / 2 {
                    mem::madvise(a.addr() + (at * 4096) as u64, DROP * 4096, Advice::DontNeed)
                        .unwrap();
                    dropped.push(at..at + DROP);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            let a = join_vcpus(round, vcpus, a, &peer);
            let s = peer.stats();
            if round == 0 {
                let r = &s.regions;
                assert_eq!(r.installed, PAGES as u64, "{s:?}");
                assert!(r.ioctls * piece as u64 >= r.installed, "{s:?}");
                assert!(
                    s.faults * (piece as u64) < r.installed,
                    "windows no longer than a piece: {s:?}"
                );
            }
            // SAFETY: the mapping is live; pages still missing fault in here.
            let got = unsafe { std::slice::from_raw_parts(a.as_ptr(), len) };
            check_dropped_zero(round, got, &data, &dropped);
            drops += dropped.len();
            helped += s.regions.helped;
            engine.remove(peer.id()).unwrap();
        }
        // One handler thread: its helper took pieces of its windows. The
        // CPU the pieces cost is the helpers' (each engine has the default
        // one; published at its next wait): at least 10 us a piece of 256
        // KiB copied.
        assert!(!crewed || helped > 0, "the crew never helped");
        let floor = Duration::from_micros(10 * helped);
        let mut cpu = Duration::ZERO;
        let counted = wait_until(Duration::from_secs(5), || {
            cpu = engine.handler_stats().helpers_cpu;
            cpu >= floor
        });
        assert!(counted, "helpers' CPU {cpu:?} for {helped} pieces");
    }
    assert!(drops > 0, "nothing was dropped ahead of the vCPUs");
}
