//! Foreign regions through the library API: a userfaultfd adopted as if it
//! came from another process (here: our own, so a thread of this test is
//! the "peer"; the out-of-process protocol is tested by faultline-cli's
//! `tests/serve.rs`). Every wait is bounded.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, wait_until};
use faultline::sys::mem::{self, Advice, Mapping};
use faultline::sys::uffd::{self, feature, register_mode, Uffd};
use faultline::*;

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
    let pieces = (len / 2).div_ceil(faultline::foreign::PREFETCH_HELPER_PIECE) as u64;
    assert!(s.prefetch_ioctls <= pieces + 1, "{s:?}");
    // SAFETY: the prefetched half is installed: reading it cannot fault.
    let got = unsafe { std::slice::from_raw_parts(a.as_ptr(), len / 2) };
    assert!(got == &data[..len / 2]);
    assert_eq!(peer.stats().faults, 0);
}
