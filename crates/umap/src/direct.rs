//! A file read and written with `O_DIRECT`: `FAULTLINE_UMAP_FILE_IO=direct`,
//! and the direct half of the default store ([`crate::cached`], which
//! reads with it what the page cache does not hold; all-direct was the
//! slower one here, see the crate docs and the README).
//!
//! Direct I/O wants the file offset, the length and the buffer address
//! aligned to the device's logical block size. Offsets and lengths always
//! are ([`ALIGN`], the largest logical block size in use, divides every
//! page size and `umap()` requires page-aligned offsets). The buffers
//! usually are: a fault fills the engine's page-aligned scratch buffer,
//! eviction writes back from the region's own pages. When one is not, the
//! bytes go through a bounce slot: a page-aligned buffer of a small pool,
//! taken with one atomic (no lock, no allocation: fills run inside the
//! SIGBUS handler).
//!
//! ```text
//!   fill(off, buf) ── buf aligned? ── yes ─▶ pread(O_DIRECT fd, buf)
//!                          │ no
//!                          ▼
//!                 bounce slot ◀─ pread ─┐  (chunks of SLOT_BYTES)
//!                     └── copy ─▶ buf  ─┘
//! ```

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Release},
};
use std::sync::Arc;

use faultline::store::StoreError;
use faultline::PageStore;
use faultline_sys::mem::{pread_full, pwrite_all, Mapping};
use faultline_sys::Errno;

/// Alignment of offsets, lengths and buffers (4 KiB covers 512-byte and
/// 4 KiB logical blocks).
pub const ALIGN: usize = 4096;

/// Bytes of one bounce slot.
const SLOT_BYTES: usize = 64 << 10;

/// Bounce slots.
const SLOTS: usize = 8;

/// A file (from byte `base`) read and written with `O_DIRECT`.
pub struct DirectFileStore {
    fd: OwnedFd,
    what: Arc<str>,
    base: u64,
    len: u64,
    bounce: Mapping,
    /// `busy[i]`: bounce slot `i` is in use.
    busy: [AtomicBool; SLOTS],
}

impl std::fmt::Debug for DirectFileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectFileStore")
            .field("what", &self.what)
            .field("base", &self.base)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

fn aligned(addr: usize, len: usize, offset: u64) -> bool {
    addr.is_multiple_of(ALIGN) && len.is_multiple_of(ALIGN) && offset.is_multiple_of(ALIGN as u64)
}

impl DirectFileStore {
    /// A store over `fd` (opened with `O_DIRECT`), named `what` in
    /// messages, whose offset 0 is the file's byte `base` (a multiple of
    /// [`ALIGN`]).
    pub fn new(fd: OwnedFd, what: &str, base: u64) -> std::io::Result<DirectFileStore> {
        if !base.is_multiple_of(ALIGN as u64) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("offset {base} is not a multiple of {ALIGN} (direct I/O)"),
            ));
        }
        let size = std::fs::File::from(fd.try_clone()?).metadata()?.len();
        let bounce = Mapping::anon(SLOT_BYTES * SLOTS).map_err(|e| e.source)?;
        Ok(DirectFileStore {
            fd,
            what: format!("file {what} (O_DIRECT)").into(),
            base,
            len: size.saturating_sub(base),
            bounce,
            busy: std::array::from_fn(|_| AtomicBool::new(false)),
        })
    }

    /// Runs `f` on a bounce slot, taken for the call (spinning, yielding,
    /// while all are in use). Async-signal-safe.
    fn with_slot<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let i = loop {
            if let Some(i) = self.busy.iter().position(|b| !b.swap(true, Acquire)) {
                break i;
            }
            std::thread::yield_now();
        };
        // SAFETY: slot `i` lies inside the bounce mapping, which lives as
        // long as `self`, and is ours alone until `busy[i]` is cleared
        // below (after `f`, which cannot keep the slice).
        let slot = unsafe {
            std::slice::from_raw_parts_mut(self.bounce.as_ptr().add(i * SLOT_BYTES), SLOT_BYTES)
        };
        let out = f(slot);
        self.busy[i].store(false, Release);
        out
    }

    fn io_error(&self, op: &'static str, offset: u64, errno: i32) -> StoreError {
        StoreError::Io {
            what: self.what.clone(),
            op,
            offset,
            errno: Errno(errno),
        }
    }

    /// `pread` of `buf.len()` bytes at store `offset` (aligned), zeros
    /// past the end of the file.
    fn read_aligned(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = pread_full(self.fd.as_raw_fd(), buf, self.base + offset)
            .map_err(|e| self.io_error("pread (O_DIRECT)", offset, e))?;
        buf[n..].fill(0);
        Ok(())
    }
}

impl PageStore for DirectFileStore {
    fn describe(&self) -> &str {
        &self.what
    }

    fn len(&self) -> Option<u64> {
        Some(self.len)
    }

    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if aligned(buf.as_ptr() as usize, buf.len(), offset) {
            return self.read_aligned(offset, buf);
        }
        self.with_slot(|slot| {
            let mut done = 0;
            while done < buf.len() {
                // The piece of the aligned block holding `offset + done`.
                let at = offset + done as u64;
                let start = at - at % ALIGN as u64;
                let skip = (at - start) as usize;
                let n = (buf.len() - done).min(SLOT_BYTES - skip);
                let read = (skip + n).next_multiple_of(ALIGN);
                self.read_aligned(start, &mut slot[..read])?;
                buf[done..done + n].copy_from_slice(&slot[skip..skip + n]);
                done += n;
            }
            Ok(())
        })
    }

    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let write = |off: u64, bytes: &[u8]| {
            pwrite_all(self.fd.as_raw_fd(), bytes, self.base + off)
                .map_err(|e| self.io_error("pwrite (O_DIRECT)", off, e))
        };
        if aligned(data.as_ptr() as usize, data.len(), offset) {
            return write(offset, data);
        }
        if !offset.is_multiple_of(ALIGN as u64) || !data.len().is_multiple_of(ALIGN) {
            // Region pages are whole pages at page offsets: never here.
            return Err(StoreError::Failed {
                offset,
                reason: "a direct-I/O write-back of a range not aligned to 4 KiB".into(),
            });
        }
        self.with_slot(|slot| {
            for (k, chunk) in data.chunks(SLOT_BYTES).enumerate() {
                slot[..chunk.len()].copy_from_slice(chunk);
                write(offset + (k * SLOT_BYTES) as u64, &slot[..chunk.len()])?;
            }
            Ok(())
        })
    }

    fn signal_safe(&self) -> bool {
        true
    }
}
