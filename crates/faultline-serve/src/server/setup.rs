//! What a server opens before any peer connects: the store, the shared
//! snapshot, the recorded set read and mapped.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use faultline::store::FileAccess;
use faultline::{FileStore, PageStore, SharedSnapshot, Verify};

use super::error::ServeError;
use crate::config::Source;
use crate::log::say;

/// Opens the pages' source; gives it with its name for messages.
pub fn open_store(source: &Source) -> Result<(Arc<dyn PageStore>, String), ServeError> {
    match source {
        Source::Mem(mem) => {
            let refused = |what: &str| ServeError::OpenMem {
                path: mem.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string()),
            };
            // Looked at before it is opened: opening a FIFO would wait for a
            // writer forever.
            let m = std::fs::metadata(mem).map_err(|source| ServeError::OpenMem {
                path: mem.clone(),
                source,
            })?;
            use std::os::unix::fs::FileTypeExt;
            let block = m.file_type().is_block_device();
            if !m.is_file() && !block {
                return Err(refused(
                    "not a regular file nor a block device (a directory, a FIFO, a character device is not a snapshot's memory)",
                ));
            }
            if m.len() == 0 && !block {
                return Err(refused("empty: there is nothing to serve"));
            }
            if m.len() < 4096 && !block {
                return Err(refused(&format!(
                    "{} bytes: smaller than one page (a snapshot's memory is whole pages)",
                    m.len()
                )));
            }
            // Read-only: serve never writes the snapshot it serves.
            let store = std::fs::File::open(mem)
                .and_then(|f| FileStore::from_file(f, mem, 0, FileAccess::Mmap, false))
                .map_err(|source| ServeError::OpenMem {
                    path: mem.clone(),
                    source,
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
        .name("fl-prepare".into())
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
    // The partial copies a killed serve left beside it (tmpfs memory).
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        faultline_cli_support::cleanup::sweep(dir);
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

/// Why the shared copy at `path` is mapped in 4 KiB pages (`None`: it is
/// not, or it cannot be told): a tmpfs mounted without `huge=always` or
/// `huge=within_size` (and shmem THPs not forced machine-wide). Read from
/// `/proc/self/mountinfo`: the last mount (the top of a stack) at the
/// longest mount point above `path`.
pub fn small_pages(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let forced = shmem_thp_forced();
    // The longest mount point above it; of equals the last (the top).
    let m = faultline_cli_support::cleanup::mounts()
        .into_iter()
        .filter(|m| path.starts_with(&m.at))
        .max_by_key(|m| m.at.as_os_str().len())?;
    let huge = m
        .options
        .split(',')
        .any(|o| o == "huge=always" || o == "huge=within_size");
    (m.fstype == "tmpfs" && !huge && !forced).then(|| {
        format!(
            "is on a tmpfs ({}) mounted without huge=always",
            m.at.display()
        )
    })
}

/// Whether shmem huge pages are forced machine-wide (`shmem_enabled`
/// `[force]`): every tmpfs then maps 2 MiB pages whatever its options.
fn shmem_thp_forced() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .is_ok_and(|s| s.contains("[force]"))
}

/// The memory file as serve opened it: to tell, when serving fails, that
/// it was truncated or replaced since.
pub struct MemFile {
    path: std::path::PathBuf,
    id: (u64, u64),
    /// Its modification time, ns.
    mtime: u64,
    len: u64,
    said: std::sync::atomic::AtomicBool,
}

impl MemFile {
    /// `path` as it is now (serve has just opened it).
    pub fn of(path: &std::path::Path) -> Option<MemFile> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(MemFile {
            path: path.into(),
            id: (m.dev(), m.ino()),
            mtime: (m.mtime() as u64).wrapping_mul(1_000_000_000) + m.mtime_nsec() as u64,
            len: m.len(),
            said: Default::default(),
        })
    }

    /// The file as a peer's journal names it: device, inode, modification
    /// time (see `keeper::journal::Served`).
    pub fn identity(&self) -> [u64; 3] {
        [self.id.0, self.id.1, self.mtime]
    }

    /// Why a new VMM is not served, when the path names another file than
    /// the one serve opened (a new snapshot renamed over it): VMMs
    /// restored from that one would be served this one's bytes.
    pub fn replaced(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&self.path).ok()?;
        ((m.dev(), m.ino()) != self.id).then(|| {
            format!(
                "the memory file {} is another file now (replaced while serve ran): a VMM restored from it would be served the bytes of the one serve opened; start a serve on it for new VMMs (the VMMs served already are served on)",
                self.path.display()
            )
        })
    }

    /// Says (once) what changed in the file since serve opened it, if
    /// anything did: a truncation makes the pages past its new end
    /// unreadable (the `UFFDIO_COPY` from them fails, `EFAULT`), which
    /// alone would read as serve's fault.
    pub fn say_if_changed(&self) {
        use std::os::unix::fs::MetadataExt;
        let why = match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) != self.id => {
                "is another file now (replaced while serve ran): serve reads the one it opened; VMs restored from the new one need a serve started on it".to_string()
            }
            Ok(m) if m.len() < self.len => format!(
                "is {} bytes now, {} when serve started: truncated (or being rewritten in place) while serve ran, so the pages past its end are gone; serve reads it as it is, and the VMs whose pages are gone fail",
                m.len(),
                self.len
            ),
            Ok(_) => return,
            Err(e) => format!("cannot be looked at now ({e})"),
        };
        if !self.said.swap(true, std::sync::atomic::Ordering::Relaxed) {
            say(format_args!(
                "the memory file {} {why}",
                self.path.display()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Two tmpfs mounted by the test, without and with `huge=always`: the
    /// first is said to map 4 KiB pages, the second not; a file under
    /// /proc (not tmpfs) neither. Skipped where mounting is not allowed.
    #[test]
    fn small_pages_tells_a_tmpfs_without_huge_pages() {
        let base =
            std::env::temp_dir().join(format!("faultline-small-pages-{}", std::process::id()));
        let mut mounted = Vec::new();
        for (name, opts) in [("small", "size=4m"), ("huge", "size=4m,huge=always")] {
            let at = base.join(name);
            std::fs::create_dir_all(&at).unwrap();
            let ok = Command::new("mount")
                .args(["-t", "tmpfs", "-o", opts, "none"])
                .arg(&at)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("skipped: cannot mount a tmpfs here");
                break;
            }
            std::fs::write(at.join("copy"), b"x").unwrap();
            mounted.push(at);
        }
        if mounted.len() == 2 {
            let small = small_pages(&mounted[0].join("copy"));
            assert_eq!(small.is_some(), !shmem_thp_forced(), "{small:?}");
            assert_eq!(small_pages(&mounted[1].join("copy")), None);
        }
        assert_eq!(small_pages(Path::new("/proc/self/status")), None);
        for at in &mounted {
            let _ = Command::new("umount").arg(at).status();
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
