//! What a server opens before any peer connects: the store, the shared
//! snapshot, the recorded set read and mapped.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use faultline::store::FileAccess;
use faultline::{FileStore, PageStore, SharedSnapshot, Verify};

use super::error::ServeError;
use super::log::say;
use crate::config::Source;

/// Opens the pages' source; gives it with its name for messages.
pub fn open_store(source: &Source) -> Result<(Arc<dyn PageStore>, String), ServeError> {
    match source {
        Source::Mem(mem) => {
            let store = FileStore::open_with(mem, 0, FileAccess::Mmap).map_err(|source| {
                ServeError::OpenMem {
                    path: mem.clone(),
                    source,
                }
            })?;
            Ok((Arc::new(store), mem.display().to_string()))
        }
        Source::Store(url) => open_remote(url),
    }
}

#[cfg(feature = "redis")]
fn open_remote(url: &str) -> Result<(Arc<dyn PageStore>, String), ServeError> {
    let store = faultline_redis::RedisStore::open(url).map_err(|source| ServeError::OpenStore {
        url: url.into(),
        source,
    })?;
    Ok((Arc::new(store), url.into()))
}

#[cfg(not(feature = "redis"))]
fn open_remote(url: &str) -> Result<(Arc<dyn PageStore>, String), ServeError> {
    Err(crate::config::ConfigError::StoreNeedsFeature { url: url.into() }.into())
}

/// Reads and maps the recorded set of the memory file on a thread of its
/// own, so copies into peers never wait for the disk; the mapping stops
/// once `served` (a peer is being served: see
/// `faultline::prepare_store_until`).
pub fn prepare(
    store: &Arc<dyn PageStore>,
    offs: &[u64],
    served: &Arc<AtomicBool>,
) -> std::io::Result<()> {
    let (store, offs, served) = (store.clone(), offs.to_vec(), served.clone());
    std::thread::Builder::new()
        .name("faultline-prepare".into())
        .spawn(move || {
            let t = Instant::now();
            // Mapping stops once a peer is served: its copies map what
            // they read from then on.
            let bytes =
                faultline::prepare_store_until(&*store, &offs, 4096, &|| served.load(Relaxed));
            say(format_args!(
                "prepared the recorded set: read asked for, {} MiB of the memory file mapped (until a peer was served) in {:.1} ms",
                bytes >> 20,
                t.elapsed().as_secs_f64() * 1e3
            ));
        })?;
    Ok(())
}

/// Opens (or writes) the shared snapshot at `path`; says how long
/// writing it took.
pub fn shared_snapshot(
    path: &Path,
    store: &dyn PageStore,
    verify: Verify,
) -> Result<SharedSnapshot, ServeError> {
    if path.exists() {
        let t = Instant::now();
        let what = match verify {
            Verify::Sample => "64 sampled pages",
            Verify::Full => "every byte",
        };
        let snap = SharedSnapshot::open_verified(path, store, verify).map_err(|source| {
            ServeError::ReuseSnapshot {
                path: path.into(),
                source,
            }
        })?;
        say(format_args!(
            "shared snapshot {}: reused ({} bytes; size and {what} match) in {:.1} ms",
            path.display(),
            snap.len(),
            t.elapsed().as_secs_f64() * 1e3
        ));
        return Ok(snap);
    }
    let mut next = 0u64;
    let (snap, done) = SharedSnapshot::create(path, store, |d, total| {
        if d >= next || d == total {
            say(format_args!(
                "shared snapshot {}: written {} / {} MiB",
                path.display(),
                d >> 20,
                total >> 20
            ));
            next = d + (256 << 20);
        }
    })
    .map_err(|source| ServeError::WriteSnapshot {
        path: path.into(),
        source,
    })?;
    say(format_args!(
        "shared snapshot {}: populated {} MiB in {:.1} ms (the one-time cost of the shared page cache)",
        path.display(),
        done.bytes >> 20,
        done.elapsed.as_secs_f64() * 1e3
    ));
    Ok(snap)
}
