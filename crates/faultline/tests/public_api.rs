//! What user code written against `faultline::*` names still builds and
//! runs: the README's tour (`Region`, `SignalEngine`, `FileStore`), an
//! engine chosen at run time (`engine::create`, `EngineConfig`) with a
//! budget (`EvictionConfig`) over a store of the user's own (`PageStore`),
//! and the names of the foreign path (the VM snapshot hand-off) as a
//! daemon uses them. Its own test binary: the signal engine installs a
//! process-wide SIGBUS handler.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use faultline::policy::PolicyKind;
use faultline::{
    engine, prepare_store, EngineConfig, EngineKind, Error, EvictionConfig, FileStore,
    ForeignEngine, ForeignEngineConfig, ForeignError, ForeignOptions, ForeignPeer,
    ForeignRegionSpec, ForeignUffd, MemoryStore, PageStore, PeerBacking, PeerEvent, PeerStats,
    PeerTimes, PrefetchPlan, Region, SharedSnapshot, SignalEngine, SnapshotError, StoreError,
    Verify, ZeroStore,
};

/// A file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn with(name: &str, bytes: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::write(&path, bytes).expect("writing the test file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Byte `i` of the test data: the number of its 4 KiB page, plus one.
fn pattern(i: usize) -> u8 {
    (i / 4096) as u8 + 1
}

#[test]
fn the_readme_tour_builds_and_runs() -> Result<(), Box<dyn std::error::Error>> {
    let data: Vec<u8> = (0..64 << 10).map(pattern).collect();
    let file = TempFile::with("faultline-public-api-tour", &data);
    // As README.md's "A short tour" has it (a smaller region).
    let engine = SignalEngine::new()?;
    let region = Region::builder(1 << 20)
        .store(FileStore::open(&file.0)?)
        .page_size(16 << 10)
        .build(&engine)?;
    // SAFETY: the region is mapped and readable for its whole length.
    let first = unsafe { *region.as_ptr() };
    assert!(region.is_resident(0, 1));
    assert_eq!(first, 1);
    // SAFETY: as above; offset 40 KiB lies inside the region.
    let later = unsafe { *region.as_ptr().add(40 << 10) };
    assert_eq!(later, pattern(40 << 10));
    // SAFETY: as above; past the file's end the region reads zeros.
    let past = unsafe { *region.as_ptr().add((1 << 20) - 1) };
    assert_eq!(past, 0);
    Ok(())
}

/// A store of the user's own: memory that records what is written back.
struct Recording {
    bytes: Mutex<Vec<u8>>,
}

impl PageStore for Recording {
    fn describe(&self) -> &str {
        "recording"
    }
    fn len(&self) -> Option<u64> {
        Some(self.bytes.lock().unwrap().len() as u64)
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let bytes = self.bytes.lock().unwrap();
        let at = offset as usize;
        buf.copy_from_slice(&bytes[at..at + buf.len()]);
        Ok(())
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let at = offset as usize;
        self.bytes.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
}

#[test]
fn an_engine_made_at_run_time_serves_a_budget_over_a_users_store() {
    let pages = 64;
    let len = pages * 4096;
    let store = Arc::new(Recording {
        bytes: Mutex::new((0..len).map(pattern).collect()),
    });
    let config = EngineConfig {
        workers: 2,
        ..EngineConfig::default()
    };
    let engine = engine::create(EngineKind::Poll, config).expect("a poll engine");
    let built = Region::builder(len)
        .shared_store(store.clone())
        .budget(EvictionConfig {
            budget_pages: 8,
            policy: PolicyKind::Clock,
        })
        .build_dyn(engine);
    let region = match built {
        Ok(r) => r,
        Err(e @ Error::Unsupported { .. }) => {
            eprintln!("skipped: this kernel cannot serve a budget: {e}");
            return;
        }
        Err(e) => panic!("building the region: {e}"),
    };
    let base = region.as_ptr();
    for p in 0..pages {
        // SAFETY: page `p` lies inside the region, which is mapped and
        // writable; the poll engine resolves the fault on its thread.
        unsafe {
            assert_eq!(base.add(p * 4096).read_volatile(), pattern(p * 4096));
            base.add(p * 4096 + 1).write_volatile(0xa0 ^ p as u8);
        }
    }
    // A budget region tracks dirty pages: whatever the evictor has not
    // written back yet is written back when the region is dropped.
    assert!(region.eviction_stats().is_some(), "a budget region");
    drop(region);
    let bytes = store.bytes.lock().unwrap();
    for p in 0..pages {
        assert_eq!(bytes[p * 4096 + 1], 0xa0 ^ p as u8, "page {p} written back");
    }
}

#[test]
fn the_foreign_paths_names_are_where_users_find_them() {
    // The plan of a record, and the store made ready for it.
    let plan = PrefetchPlan::new(&[5 * 4096, 3 * 4096, 4 * 4096, 9 * 4096]);
    assert_eq!(plan.pages(), 4);
    assert_eq!(
        plan.runs().collect::<Vec<_>>(),
        vec![(3 * 4096, 3 * 4096), (9 * 4096, 4096)]
    );
    let store = MemoryStore::new(vec![1; 16 * 4096]);
    assert_eq!(prepare_store(&store, &[0, 4096, 3 * 4096], 4096), 3 * 4096);
    // The engine refuses the signal engine (the peer's threads never run
    // our handler) and starts with a thread engine.
    let refused = ForeignEngine::new(EngineKind::Signal, ForeignEngineConfig::default());
    assert!(matches!(refused, Err(ForeignError::Refused { .. })));
    let (engine, _events) =
        ForeignEngine::new(EngineKind::Poll, ForeignEngineConfig::default()).expect("engine");
    assert!(engine.peers().is_empty());
    // A shared snapshot needs a store that knows its length.
    let path = std::env::temp_dir().join(format!("faultline-public-api-{}", std::process::id()));
    let made = SharedSnapshot::create(&path, &ZeroStore, |_, _| {});
    assert!(matches!(made, Err(SnapshotError::StoreLength)));
    assert!(!path.exists(), "nothing is left behind");
    // The rest of the hand-off's vocabulary, by name.
    let _: Option<(ForeignUffd, ForeignPeer, ForeignRegionSpec, ForeignOptions)> = None;
    let _: Option<(PeerEvent, PeerStats, PeerTimes, PeerBacking)> = None;
    assert_eq!(Verify::default(), Verify::Sample);
}
