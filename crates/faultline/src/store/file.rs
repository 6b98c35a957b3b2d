use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::{PageCacheFile, PageStore, StoreError, StoreView, WriteRange};
use crate::page::PageSize;
use faultline_sys::mem::{
    file_len, is_tmpfs, pread_full, pwrite_all, pwritev_all, willneed, Advice, Mapping, PWRITEV_MAX,
};
use faultline_sys::Errno;

/// How a [`FileStore`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileAccess {
    /// A read-only shared mapping of the file: faults are resolved with
    /// `UFFDIO_COPY` straight from the page cache, no intermediate copy.
    /// Reading a mapping inside the SIGBUS handler is safe as long as the
    /// file is not truncated underneath (that would be a SIGBUS inside the
    /// handler and kill the process).
    #[default]
    Mmap,
    /// `pread(2)` into a scratch buffer, then copy.
    Pread,
}

/// A file (or a slice of one from `offset`). A file shorter than the
/// region reads as zeros past its end; errors carry the path and offset.
#[derive(Debug)]
pub struct FileStore {
    fd: OwnedFd,
    path: PathBuf,
    what: Arc<str>,
    base: u64,
    len: u64,
    map: Option<Mapping>,
    writable: bool,
    /// The file is on tmpfs and read through its page cache: regions may
    /// map it directly (see [`PageStore::page_cache`]).
    tmpfs: bool,
    /// The file's length at the last look (`fstat`), and when
    /// (`CLOCK_MONOTONIC` ns): see [`FileStore::holds`].
    seen: (AtomicU64, AtomicU64),
}

/// How long a look at the file's length stands for [`FileStore::holds`].
const LOOK_NS: u64 = 1_000_000;

impl FileStore {
    /// Opens `path` (read-write when permitted, else read-only), using the
    /// default [`FileAccess::Mmap`].
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<FileStore> {
        Self::open_with(path, 0, FileAccess::default())
    }

    /// Opens `path`; the store's offset 0 is the file's byte `base`.
    pub fn open_with(
        path: impl AsRef<Path>,
        base: u64,
        access: FileAccess,
    ) -> std::io::Result<FileStore> {
        let path = path.as_ref().to_path_buf();
        let (file, writable) = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => (f, true),
            Err(_) => (OpenOptions::new().read(true).open(&path)?, false),
        };
        Self::from_file(file, path, base, access, writable)
    }

    /// A store over `file`, already open (readable; written back to only
    /// when `writable`), named `path` in messages; the store's offset 0 is
    /// the file's byte `base`.
    pub fn from_file(
        file: std::fs::File,
        path: impl AsRef<Path>,
        base: u64,
        access: FileAccess,
        writable: bool,
    ) -> std::io::Result<FileStore> {
        let path = path.as_ref().to_path_buf();
        let meta = file.metadata()?;
        if meta.is_dir() {
            // Mapping it would say ENODEV ("No such device").
            return Err(std::io::Error::from_raw_os_error(
                faultline_sys::Errno::EISDIR.0,
            ));
        }
        let size = meta.len();
        let len = size.saturating_sub(base);
        let fd: OwnedFd = file.into();
        let map = match access {
            FileAccess::Mmap if len > 0 && PageSize::BASE.is_aligned(base) => Some(
                Mapping::file_readonly(&fd, len as usize, base).map_err(|e| {
                    let kind = e.source.kind();
                    std::io::Error::new(kind, OnPath(path.clone(), e))
                })?,
            ),
            _ => None,
        };
        let what: Arc<str> = format!("file {}", path.display()).into();
        let tmpfs = access == FileAccess::Mmap
            && PageSize::BASE.is_aligned(base)
            && is_tmpfs(&fd).unwrap_or(false);
        Ok(FileStore {
            fd,
            path,
            what,
            base,
            len,
            map,
            writable,
            tmpfs,
            seen: (
                AtomicU64::new(size),
                AtomicU64::new(faultline_sys::monotonic_ns()),
            ),
        })
    }

    /// Whether the file still holds its bytes up to `end` (relative to the
    /// file's start), as a look at its length (`fstat`) at most
    /// [`LOOK_NS`] old says: one system call a millisecond at most, not
    /// one a fill (a 4 KiB fill of a shmem region paid 1.15x for one each).
    /// Async-signal-safe.
    fn holds(&self, end: u64) -> bool {
        let now = faultline_sys::monotonic_ns();
        if now.saturating_sub(self.seen.1.load(Relaxed)) < LOOK_NS {
            return self.seen.0.load(Relaxed) >= end;
        }
        let len = file_len(self.fd.as_raw_fd()).unwrap_or(0);
        self.seen.0.store(len, Relaxed);
        self.seen.1.store(now, Relaxed);
        len >= end
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl PageStore for FileStore {
    fn writable(&self) -> bool {
        self.writable
    }

    fn describe(&self) -> &str {
        &self.what
    }
    fn len(&self) -> Option<u64> {
        Some(self.len)
    }
    /// Copies out of the mapping (1.1x faster than `pread(2)` for 2 MiB
    /// fills of a warm file) when the file still holds the bytes
    /// (`FileStore::holds`): a copy out of the mapping past the end of a
    /// file truncated since it was opened is a SIGBUS in this process
    /// (only a truncation less than a millisecond before the copy is one
    /// now). Else `pread`: bytes past the file's length when opened read
    /// as zeros; bytes before it that are gone now (the file truncated
    /// since) are an error, never zeros.
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if let Some(v) = self.view(offset, buf.len()) {
            if self.holds(self.base + offset + buf.len() as u64) {
                v.copy_to(buf);
                return Ok(());
            }
        }
        let n = pread_full(self.fd.as_raw_fd(), buf, self.base + offset).map_err(|e| {
            StoreError::Io {
                what: self.what.clone(),
                op: "pread",
                offset,
                errno: Errno(e),
            }
        })?;
        if offset + (n as u64) < self.len.min(offset + buf.len() as u64) {
            // No allocation: this may run in a SIGBUS handler.
            return Err(StoreError::Io {
                what: self.what.clone(),
                op: "pread (the file ends before the length it had when opened: truncated since)",
                offset: offset + n as u64,
                errno: Errno::EIO,
            });
        }
        buf[n..].fill(0);
        Ok(())
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        if !self.writable {
            return Err(StoreError::ReadOnly {
                what: self.what.clone(),
                offset,
            });
        }
        pwrite_all(self.fd.as_raw_fd(), data, self.base + offset).map_err(|e| StoreError::Io {
            what: self.what.clone(),
            op: "pwrite",
            offset,
            errno: Errno(e),
        })
    }
    /// Runs of ranges contiguous in the file go out with one `pwritev`
    /// each (a sequential eviction batch is one system call, and one
    /// extent update for the file system, instead of one per page); a run
    /// that fails fails for all its ranges.
    fn write_back_batch(&self, ranges: &[WriteRange<'_>], out: &mut [Result<(), StoreError>]) {
        let mut i = 0;
        while i < ranges.len() {
            let mut j = i + 1;
            while j < ranges.len()
                && j - i < PWRITEV_MAX
                && ranges[j].offset == ranges[j - 1].offset + ranges[j - 1].data.len() as u64
            {
                j += 1;
            }
            let res = if !self.writable {
                Err(StoreError::ReadOnly {
                    what: self.what.clone(),
                    offset: ranges[i].offset,
                })
            } else {
                let mut bufs: [&[u8]; PWRITEV_MAX] = [&[]; PWRITEV_MAX];
                for (b, r) in bufs.iter_mut().zip(&ranges[i..j]) {
                    *b = r.data;
                }
                pwritev_all(
                    self.fd.as_raw_fd(),
                    &bufs[..j - i],
                    self.base + ranges[i].offset,
                )
                .map_err(|e| StoreError::Io {
                    what: self.what.clone(),
                    op: "pwritev",
                    offset: ranges[i].offset,
                    errno: Errno(e),
                })
            };
            out[i..j].iter_mut().for_each(|o| *o = res.clone());
            i = j;
        }
    }

    fn view(&self, offset: u64, len: usize) -> Option<StoreView<'_>> {
        let m = self.map.as_ref()?;
        if offset.checked_add(len as u64)? > self.len {
            return None;
        }
        // SAFETY: in bounds of a live read-only mapping owned by `self`
        // (whose file others may write: a view allows that).
        unsafe { StoreView::new(m.as_ptr().add(offset as usize), len) }
    }
    fn will_need(&self, offset: u64, len: usize) {
        let Some(m) = self.map.as_ref() else { return };
        let start = PageSize::BASE.align_down(offset.min(self.len));
        let end = offset.saturating_add(len as u64).min(self.len);
        if end > start {
            let _ = willneed(m.addr() + start, (end - start) as usize);
        }
    }

    fn populate(&self, offset: u64, len: usize) {
        let Some(m) = self.map.as_ref() else { return };
        let start = PageSize::BASE.align_down(offset.min(self.len));
        let end = offset.saturating_add(len as u64).min(self.len);
        if end > start {
            let _ = m.advise(start as usize, (end - start) as usize, Advice::PopulateRead);
        }
    }
    fn page_cache(&self) -> Option<PageCacheFile<'_>> {
        self.tmpfs.then(|| PageCacheFile {
            fd: self.fd.as_fd(),
            offset: self.base,
            len: self.len,
        })
    }
    fn signal_safe(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes past the file's length when opened read as zeros; bytes it
    /// had then and lost to a truncation since (more than a millisecond
    /// ago) are an error (never zeros, never a SIGBUS out of the mapping).
    #[test]
    fn a_file_truncated_after_it_was_opened_fails_its_lost_bytes() {
        let path = std::env::temp_dir().join(format!("fl-trunc-{}", std::process::id()));
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &data).unwrap();
        let store = FileStore::open(&path).unwrap();
        let mut buf = vec![0u8; 4096];
        store.fill(8192, &mut buf).unwrap();
        assert_eq!(buf, data[8192..12288]);
        // Past the end it had: zeros.
        store.fill(64 * 1024, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(16 * 1024))
            .unwrap();
        // Past the look at the length that stands a millisecond.
        std::thread::sleep(std::time::Duration::from_nanos(2 * LOOK_NS));
        store.fill(8192, &mut buf).unwrap();
        assert_eq!(buf, data[8192..12288]);
        let e = store.fill(32 * 1024, &mut buf).unwrap_err();
        assert!(e.to_string().contains("truncated since"), "{e}");
        assert_eq!(e.offset(), 32 * 1024);
        // A read across the new end: its lost part is the error.
        let mut two = vec![0u8; 8192];
        let e = store.fill(12 * 1024, &mut two).unwrap_err();
        assert_eq!(e.offset(), 16 * 1024);
        std::fs::remove_file(&path).unwrap();
    }
}

/// An error of the mapping of `.0`: said with the path, its errno kept in
/// its source (the `MemError`).
#[derive(Debug)]
struct OnPath(PathBuf, crate::error::MemError);

impl std::fmt::Display for OnPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.display(), self.1)
    }
}

impl std::error::Error for OnPath {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.1)
    }
}
