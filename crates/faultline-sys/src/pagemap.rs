//! `PAGEMAP_SCAN` (Linux 6.7): asking `/proc/PID/pagemap` which pages of a
//! range are in given categories (written since write-protected, present,
//! swapped, ...), as ranges, with one ioctl per batch of ranges.
//!
//! What dirty tracking with `UFFD_FEATURE_WP_ASYNC` reads: the kernel then
//! un-protects a written page itself (no fault message), and a present
//! page without its uffd-wp bit is `PAGE_IS_WRITTEN`.
//!
//! ```text
//!   Pagemap::open(pid) ── /proc/PID/pagemap (holds the mm it was opened on)
//!   scan(start, end, all_of, any_of)
//!     ioctl(PAGEMAP_SCAN, pm_scan_arg{vec: [page_region; 256]}) ──► n regions
//!     again from walk_end until end
//! ```

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::mem::MemError;

/// Page categories (`PAGE_IS_*` of `include/uapi/linux/fs.h`).
pub mod category {
    /// Write-protect may be set (an async-WP uffd vma).
    pub const WPALLOWED: u64 = 1 << 0;
    /// Written since it was last write-protected (no uffd-wp bit).
    pub const WRITTEN: u64 = 1 << 1;
    /// File-backed.
    pub const FILE: u64 = 1 << 2;
    /// Present.
    pub const PRESENT: u64 = 1 << 3;
    /// Swapped out.
    pub const SWAPPED: u64 = 1 << 4;
}

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Debug, Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);
const _: () = assert!(std::mem::size_of::<PageRegion>() == 24);

/// `PAGEMAP_SCAN`: `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;

/// Ranges a scan gathers per ioctl.
const BATCH: usize = 256;

/// An open `/proc/PID/pagemap`.
#[derive(Debug)]
pub struct Pagemap(OwnedFd);

impl Pagemap {
    /// Opens `/proc/PID/pagemap` (needs ptrace read access to the process:
    /// the same user, or root). The descriptor keeps reading the address
    /// space it was opened on.
    pub fn open(pid: i32) -> Result<Pagemap, MemError> {
        let f = std::fs::File::open(format!("/proc/{pid}/pagemap")).map_err(|source| MemError {
            op: "open(/proc/PID/pagemap)",
            source,
        })?;
        Ok(Pagemap(f.into()))
    }

    /// The ranges of `[start, end)` whose pages are in every category of
    /// `all_of` and in at least one of `any_of` (0: no such condition),
    /// in address order, adjacent ranges merged.
    pub fn scan(
        &self,
        start: u64,
        end: u64,
        all_of: u64,
        any_of: u64,
    ) -> Result<Vec<Range<u64>>, MemError> {
        let mut out: Vec<Range<u64>> = Vec::new();
        let mut buf = [PageRegion::default(); BATCH];
        let mut at = start;
        while at < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                start: at,
                end,
                vec: buf.as_mut_ptr() as u64,
                vec_len: BATCH as u64,
                category_mask: all_of,
                category_anyof_mask: any_of,
                return_mask: all_of | any_of,
                ..Default::default()
            };
            // SAFETY: `arg` is a `struct pm_scan_arg` (size asserted
            // above) whose `vec` points at `BATCH` writable `page_region`s;
            // the kernel writes only those and `arg.walk_end`.
            let n = unsafe {
                libc::ioctl(
                    self.0.as_raw_fd(),
                    PAGEMAP_SCAN as _,
                    &mut arg as *mut PmScanArg,
                )
            };
            if n < 0 {
                return Err(MemError {
                    op: "ioctl(PAGEMAP_SCAN)",
                    source: io::Error::last_os_error(),
                });
            }
            for r in &buf[..n as usize] {
                match out.last_mut() {
                    Some(last) if last.end == r.start => last.end = r.end,
                    _ => out.push(r.start..r.end),
                }
            }
            if arg.walk_end <= at {
                break;
            }
            at = arg.walk_end;
        }
        Ok(out)
    }
}
