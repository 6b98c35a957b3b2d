//! A shared snapshot: one tmpfs file holding a store's bytes, which many
//! peers (VMs restored from one snapshot) map `MAP_PRIVATE` as their guest
//! memory, so their faults are served with `UFFDIO_CONTINUE` (zero copy)
//! and the page cache is shared by all of them.
//!
//! ```text
//!   store (memory file, Redis, ...)
//!     │  SharedSnapshot::create: written once (the one-time population cost)
//!     ▼
//!   /dev/shm/snap (tmpfs, mode 0444) ◄── mmap(MAP_PRIVATE) by every peer,
//!                                        registered MISSING|MINOR
//!   peer touches a page ─► MINOR fault (the page is in the page cache)
//!   handler: UFFDIO_CONTINUE ─► the page-cache page is mapped read-only into
//!            the peer (no allocation, no copy); a write copies it in the
//!            kernel (private COW), the file never changes
//! ```
//!
//! In a `MAP_PRIVATE` vma `UFFDIO_COPY`/`ZEROPAGE` install *anonymous*
//! pages (`mm/userfaultfd.c`: `mfill_atomic_pte` takes the anonymous path
//! for every vma without `VM_SHARED`), so a page the peer dropped
//! (`MADV_DONTNEED`, a REMOVE event; its next touch is a MINOR fault again,
//! the page cache still holds the page) is answered with a private page of
//! zeros, exactly as in copy mode; a page missing from the page cache (a
//! hole in the file) is a MISSING fault, answered by a copy from the store.
//! Probed on the project's kernel (6.18) before relying on it.
//!
//! # Trust
//! The handler cannot read what another process mapped, only where:
//! [`SharedSnapshot::check_peer`] looks the peer's vmas up (`PROCMAP_QUERY`
//! on `/proc/<pid>/maps`) and requires each region to be a private mapping
//! of *this* file (device and inode) at the region's store offset; the
//! MINOR registration is made sure of by
//! [`ForeignPeer::new`](super::ForeignPeer::new)
//! (`UFFDIO_REGISTER` through the peer's userfaultfd). That the file holds
//! the store's bytes is trusted: [`SharedSnapshot::create`] writes it (a
//! new file, mode 0444: only its owner or root can change it, and peers'
//! private mappings never write it back); [`SharedSnapshot::open`] reuses
//! an existing file when its size matches and a sample of pages matches the
//! store.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::page::PageSize;
use crate::residency::PageBits;
use crate::store::{PageStore, StoreError};
use faultline_sys::mem::{self, Mapping, MemError};

/// Why a shared snapshot could not be made, opened or used by a peer: one
/// variant per step (or check) that failed, keeping its cause.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Creating the file (it must not exist).
    #[error("creating {path}: {source}")]
    Create {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Sizing the new file to the store's length.
    #[error("sizing {path} to {len} bytes: {source}")]
    Size {
        /// The file.
        path: PathBuf,
        /// The length asked for.
        len: u64,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Writing the store's bytes into the new file.
    #[error("writing {path} at {offset:#x}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Opening an existing file.
    #[error("opening {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Reading the file's metadata.
    #[error("inspecting {path}: {source}")]
    Inspect {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Reading the file back to compare it with the store.
    #[error("reading {path} at {offset:#x}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Asking which file system holds the file (`fstatfs`).
    #[error("finding the file system of {path}: {source}")]
    FileSystem {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: MemError,
    },
    /// Mapping the file (to fill a hugetlbfs file, or to find its holes).
    #[error("mapping {path}: {source}")]
    Map {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: MemError,
    },
    /// Reading the store.
    #[error("reading the store at {offset:#x}: {source}")]
    ReadStore {
        /// Where.
        offset: u64,
        /// The error.
        #[source]
        source: StoreError,
    },
    /// The store does not report its length.
    #[error("the store does not report its length")]
    StoreLength,
    /// The file is not on tmpfs/shmem or hugetlbfs (CONTINUE needs their
    /// page cache).
    #[error(
        "{0} is not on tmpfs or hugetlbfs (UFFDIO_CONTINUE needs their page cache: use /dev/shm)"
    )]
    NotInMemory(PathBuf),
    /// A hugetlbfs snapshot whose length is not a multiple of 2 MiB.
    #[error("{path}: {len} bytes is not a multiple of the 2 MiB pages of hugetlbfs")]
    HugeLength {
        /// The file.
        path: PathBuf,
        /// The store's length.
        len: u64,
    },
    /// Comparing an existing file with the store: it does not hold the
    /// store's bytes.
    #[error("{path} exists but does not hold the store's bytes: {why}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        why: String,
    },
    /// Reading the peer's memory map (`/proc/<pid>/maps`: opening it,
    /// `PROCMAP_QUERY`, or its text): out of reach (another user, another
    /// pid namespace, a process that is gone).
    #[error("reading the peer's memory map {path}: {source}")]
    ReadPeerMap {
        /// The maps file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Checking the peer's regions: one is not a private mapping of this
    /// file at its store offset (or the regions mix kinds).
    #[error("region {index}: {why}")]
    CheckPeer {
        /// Region index (as the peer listed it).
        index: usize,
        /// What is wrong.
        why: String,
    },
}

/// How a peer's memory is backed, read from its memory map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerBacking {
    /// Anonymous (or hugetlb) memory: copy mode.
    Anonymous,
    /// Every region is a private mapping of the shared snapshot at its
    /// store offset, registered for minor faults: shared (zero-copy) mode.
    Shared,
}

/// One vma of the peer (`PROCMAP_QUERY`, or a `/proc/<pid>/maps` line).
#[derive(Debug, Clone)]
struct Vma {
    start: u64,
    end: u64,
    private: bool,
    offset: u64,
    dev: (u32, u32),
    inode: u64,
    path: String,
}

/// A tmpfs file holding a store's bytes. See the module docs.
#[derive(Debug)]
pub struct SharedSnapshot {
    path: PathBuf,
    len: u64,
    dev: (u32, u32),
    inode: u64,
    /// Its page size: 4 KiB on tmpfs, 2 MiB on hugetlbfs.
    page: PageSize,
    /// Pages the page cache lacks (holes), from `mincore` of a read-only
    /// view when the file was opened; `None`: every page is allocated
    /// (`st_blocks` covers the length), no `mincore` needed.
    holes: Option<Vec<bool>>,
    _file: File,
}

/// How much of an existing snapshot's content [`SharedSnapshot::open_verified`]
/// compares with the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// 64 pages spread over it (fast; a change elsewhere goes unseen).
    #[default]
    Sample,
    /// Every byte.
    Full,
}

/// How long [`SharedSnapshot::create`] took and what it wrote.
#[derive(Debug, Clone, Copy)]
pub struct Populated {
    /// Bytes written.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Bytes copied (or compared) at a time.
const CHUNK: usize = 2 << 20;

/// The unit of `st_blocks`.
const ST_BLOCK: u64 = 512;

impl SharedSnapshot {
    /// Writes every byte of `store` to a new file at `path` (which must be
    /// on tmpfs, or hugetlbfs with 2 MiB pages and a free pool as large as
    /// the store, and must not exist), mode 0444. `progress(done, total)` is
    /// called after each 2 MiB chunk. This is the one-time population cost
    /// of the shared page cache. The file is written as `.NAME.partial-PID`
    /// beside `path` and linked at `path` only once whole, so `path` never
    /// names a partial copy (a process killed while writing leaves the
    /// temporary, which `faultline_cli_support::cleanup::sweep` removes
    /// once the PID is gone).
    pub fn create(
        path: &Path,
        store: &dyn PageStore,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<(SharedSnapshot, Populated), SnapshotError> {
        let t = Instant::now();
        let len = store.len().ok_or(SnapshotError::StoreLength)?;
        let exists = |source| SnapshotError::Create {
            path: path.to_owned(),
            source,
        };
        if path.symlink_metadata().is_ok() {
            return Err(exists(std::io::ErrorKind::AlreadyExists.into()));
        }
        let tmp = path.with_file_name(format!(
            ".{}.partial-{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&tmp)
            .map_err(exists)?;
        let made = (|| {
            let map_err = |source| SnapshotError::Map {
                path: path.to_owned(),
                source,
            };
            let huge = in_memory_fs(&file, path)?;
            if huge && !PageSize::HUGE_2M.is_aligned(len) {
                return Err(SnapshotError::HugeLength {
                    path: path.to_owned(),
                    len,
                });
            }
            file.set_len(len).map_err(|source| SnapshotError::Size {
                path: path.to_owned(),
                len,
                source,
            })?;
            // hugetlbfs has no write(2): its pages are filled through a
            // shared mapping (its pages are reserved when it is made).
            let dst = if huge {
                Some(Mapping::shared(&file, len as usize, 0).map_err(map_err)?)
            } else {
                None
            };
            let mut buf = vec![0u8; CHUNK];
            let mut off = 0u64;
            while off < len {
                let n = CHUNK.min((len - off) as usize);
                let src = store_bytes(store, off, &mut buf[..n])?;
                match &dst {
                    // SAFETY: `off..off+n` lies inside the shared mapping of
                    // the file, which nothing else references yet.
                    Some(m) => unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), m.as_ptr().add(off as usize), n)
                    },
                    None => file
                        .write_all_at(src, off)
                        .map_err(|source| SnapshotError::Write {
                            path: path.to_owned(),
                            offset: off,
                            source,
                        })?,
                }
                off += n as u64;
                progress(off, len);
            }
            Ok(())
        })();
        // Whole: linked at `path`, which fails if another made it meanwhile.
        let made = made.and_then(|()| std::fs::hard_link(&tmp, path).map_err(exists));
        let _ = std::fs::remove_file(&tmp);
        made?;
        drop(file);
        let snap = Self::map(path)?;
        Ok((
            snap,
            Populated {
                bytes: len,
                elapsed: t.elapsed(),
            },
        ))
    }

    /// Reuses the file at `path` (made by [`SharedSnapshot::create`]): it
    /// must be on tmpfs, as long as `store`, and 64 pages spread over it
    /// must equal the store's ([`Verify::Sample`]).
    pub fn open(path: &Path, store: &dyn PageStore) -> Result<SharedSnapshot, SnapshotError> {
        Self::open_verified(path, store, Verify::Sample)
    }

    /// [`SharedSnapshot::open`], checking the file's content as `verify`
    /// says: 64 sampled pages, or every byte (reads both in full: about
    /// the cost of writing it again, but nothing is written).
    pub fn open_verified(
        path: &Path,
        store: &dyn PageStore,
        verify: Verify,
    ) -> Result<SharedSnapshot, SnapshotError> {
        let snap = Self::map(path)?;
        let len = store.len().ok_or(SnapshotError::StoreLength)?;
        let mismatch = |why: String| SnapshotError::Mismatch {
            path: path.to_owned(),
            why,
        };
        if snap.len != len {
            return Err(mismatch(format!(
                "{} bytes, the store holds {len}",
                snap.len
            )));
        }
        if verify == Verify::Full {
            snap.compare_all(store)?;
            return Ok(snap);
        }
        // Base pages spread evenly over the file, the first and the last
        // among them.
        let page = PageSize::BASE;
        let pages = page.index_of(len);
        let (mut a, mut b) = (vec![0u8; page.bytes()], vec![0u8; page.bytes()]);
        let samples = 64u64.min(pages);
        for k in 0..samples {
            let off = page.offset_of((pages - 1) * k / (samples - 1).max(1));
            let want = store_bytes(store, off, &mut a)?;
            snap._file
                .read_exact_at(&mut b, off)
                .map_err(|source| SnapshotError::Read {
                    path: path.to_owned(),
                    offset: off,
                    source,
                })?;
            if want != b {
                return Err(mismatch(format!("the page at {off:#x} differs")));
            }
        }
        Ok(snap)
    }

    /// Compares every byte with the store, 2 MiB at a time.
    fn compare_all(&self, store: &dyn PageStore) -> Result<(), SnapshotError> {
        let (mut a, mut b) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
        let mut off = 0u64;
        while off < self.len {
            let n = CHUNK.min((self.len - off) as usize);
            let want = store_bytes(store, off, &mut a[..n])?;
            self._file
                .read_exact_at(&mut b[..n], off)
                .map_err(|source| SnapshotError::Read {
                    path: self.path.clone(),
                    offset: off,
                    source,
                })?;
            if want != &b[..n] {
                let i = want.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(0);
                return Err(SnapshotError::Mismatch {
                    path: self.path.clone(),
                    why: format!(
                        "the page at {:#x} differs (byte {:#x})",
                        self.page.align_down(off + i as u64),
                        off + i as u64
                    ),
                });
            }
            off += n as u64;
        }
        Ok(())
    }

    fn map(path: &Path) -> Result<SharedSnapshot, SnapshotError> {
        let file = File::open(path).map_err(|source| SnapshotError::Open {
            path: path.to_owned(),
            source,
        })?;
        let meta = file.metadata().map_err(|source| SnapshotError::Inspect {
            path: path.to_owned(),
            source,
        })?;
        let map_err = |source| SnapshotError::Map {
            path: path.to_owned(),
            source,
        };
        let huge = in_memory_fs(&file, path)?;
        let len = meta.len();
        // tmpfs counts allocated pages in st_blocks: a file written in full
        // has no holes and needs no page-by-page look. A hugetlbfs file is
        // taken as full (`create` fills every page; a hole would fault
        // MISSING and be copied from the store).
        let page = if huge {
            PageSize::HUGE_2M
        } else {
            PageSize::BASE
        };
        let holes = if huge || meta.blocks() * ST_BLOCK >= page.align_up(len) {
            None
        } else {
            let map = Mapping::file_readonly(&file, len.max(1) as usize, 0).map_err(map_err)?;
            Some(
                map.resident_map()
                    .map_err(map_err)?
                    .iter()
                    .map(|&r| !r)
                    .collect(),
            )
        };
        Ok(SharedSnapshot {
            path: path.to_owned(),
            len,
            dev: dev_numbers(meta.dev()),
            inode: meta.ino(),
            page,
            holes,
            _file: file,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Its page size: 4 KiB (tmpfs) or 2 MiB (hugetlbfs); the peer's
    /// regions must use it.
    pub fn page_size(&self) -> PageSize {
        self.page
    }

    /// [`SharedSnapshot::page_size`] in bytes.
    pub fn page_bytes(&self) -> u64 {
        self.page.bytes() as u64
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One bit per page (of [`SharedSnapshot::page_size`]) of `pages`
    /// pages from `offset`: whether the page cache holds it (pages past
    /// the end: no).
    pub(crate) fn cached_bits(&self, offset: u64, pages: usize) -> PageBits {
        let first = self.page.index_of(offset) as usize;
        let in_file = self.page.index_of(self.page.align_up(self.len)) as usize;
        let have = in_file.saturating_sub(first).min(pages);
        match &self.holes {
            None if have == pages => PageBits::full(pages),
            _ => {
                let bits = PageBits::new(pages);
                for p in 0..have {
                    if self.holes.as_ref().is_none_or(|h| !h[first + p]) {
                        bits.set(p);
                    }
                }
                bits
            }
        }
    }

    /// How peer `pid` backs its regions, given as `(base, len,
    /// store_offset)` in the peer's address space (see the module docs):
    /// anonymous memory (copy mode), or private mappings of this file at
    /// each region's store offset (shared mode). Anything else (another
    /// file, another offset, a shared mapping, a hole, a mix) is refused
    /// with why. The vmas are looked up with `PROCMAP_QUERY` on
    /// `/proc/<pid>/maps` (Linux 6.11+: a few µs, no page-table walk), or
    /// read from that file's text on older kernels; either needs the right
    /// to read the peer's memory map (same user, or root) and its pid in
    /// our pid namespace. That the regions are registered for minor faults
    /// is not visible there: [`ForeignPeer::new`](super::ForeignPeer::new)
    /// makes sure of it in shared mode.
    pub fn check_peer(
        &self,
        pid: i32,
        regions: &[(u64, usize, u64)],
    ) -> Result<PeerBacking, SnapshotError> {
        let path = PathBuf::from(format!("/proc/{pid}/maps"));
        let io = |source| SnapshotError::ReadPeerMap {
            path: path.clone(),
            source,
        };
        let maps = File::open(&path).map_err(io)?;
        let mut text: Option<Vec<Vma>> = None;
        let mut kinds = Vec::new();
        for (index, &(base, len, store_offset)) in regions.iter().enumerate() {
            let bad = |why: String| SnapshotError::CheckPeer { index, why };
            let (start, end) = (base, base + len as u64);
            let covering = match &text {
                None => match query_vmas(&maps, start, end) {
                    Ok(v) => v,
                    // Before Linux 6.11: the maps text.
                    Err(e) if mem::procmap_query_unsupported(&e) => {
                        let mut buf = String::new();
                        (&maps).read_to_string(&mut buf).map_err(io)?;
                        let all = parse_maps(&buf);
                        let v = overlapping(&all, start, end);
                        text = Some(all);
                        v
                    }
                    Err(e) => return Err(io(e.source)),
                },
                Some(all) => overlapping(all, start, end),
            };
            let covered: u64 = covering
                .iter()
                .map(|v| v.end.min(end) - v.start.max(start))
                .sum();
            if covered != len as u64 {
                return Err(bad(format!(
                    "[{start:#x}, {end:#x}) is not entirely mapped in process {pid}"
                )));
            }
            let anon = covering.iter().all(|v| v.inode == 0);
            kinds.push(anon);
            if anon {
                continue;
            }
            for v in covering {
                let at = v.start.max(start);
                let file_off = v.offset + (at - v.start);
                let want = store_offset + (at - start);
                if v.inode != self.inode || v.dev != self.dev {
                    return Err(bad(format!(
                        "it maps {} (device {}:{}, inode {}), not the shared snapshot {} (device {}:{}, inode {})",
                        if v.path.is_empty() { "another file" } else { &v.path },
                        v.dev.0, v.dev.1, v.inode,
                        self.path.display(), self.dev.0, self.dev.1, self.inode
                    )));
                }
                if file_off != want {
                    return Err(bad(format!(
                        "it maps the snapshot at file offset {file_off:#x} where the handshake says {want:#x}"
                    )));
                }
                if !v.private {
                    return Err(bad(
                        "it maps the snapshot MAP_SHARED: its writes would change every clone; map it MAP_PRIVATE".into(),
                    ));
                }
            }
        }
        match (kinds.iter().all(|&a| a), kinds.iter().all(|&a| !a)) {
            (true, _) => Ok(PeerBacking::Anonymous),
            (_, true) => Ok(PeerBacking::Shared),
            _ => Err(SnapshotError::CheckPeer {
                index: kinds.iter().position(|&a| !a).unwrap_or(0),
                why: "some regions map the snapshot and others are anonymous; use one kind".into(),
            }),
        }
    }
}

/// The vmas overlapping `[start, end)`, by `PROCMAP_QUERY` (stops at the
/// first gap: the caller finds the range not entirely mapped).
fn query_vmas(maps: &File, start: u64, end: u64) -> Result<Vec<Vma>, MemError> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        match mem::procmap_query(maps, at)? {
            Some(v) if v.start <= at => {
                out.push(Vma {
                    start: v.start,
                    end: v.end,
                    private: !v.shared,
                    offset: v.offset,
                    dev: v.dev,
                    inode: v.inode,
                    path: String::new(),
                });
                at = v.end;
            }
            _ => break,
        }
    }
    Ok(out)
}

fn overlapping(all: &[Vma], start: u64, end: u64) -> Vec<Vma> {
    all.iter()
        .filter(|v| v.start < end && v.end > start)
        .cloned()
        .collect()
}

/// The store's bytes at `off..off + buf.len()`: its zero-copy view when it
/// has one, else read into `buf`.
fn store_bytes<'a>(
    store: &'a dyn PageStore,
    off: u64,
    buf: &'a mut [u8],
) -> Result<&'a [u8], SnapshotError> {
    if let Some(v) = store.view(off, buf.len()) {
        // SAFETY: serve's memory file, which nothing writes while serve
        // copies or compares it (a snapshot is not written under a
        // restore; one changed meanwhile is caught by the comparisons).
        return Ok(unsafe { v.as_slice() });
    }
    store
        .fill(off, buf)
        .map_err(|source| SnapshotError::ReadStore {
            offset: off,
            source,
        })?;
    Ok(buf)
}

/// Whether `file` (at `path`) is on hugetlbfs (`true`) or tmpfs
/// (`false`); anything else is refused.
fn in_memory_fs(file: &File, path: &Path) -> Result<bool, SnapshotError> {
    let fs_err = |source| SnapshotError::FileSystem {
        path: path.to_owned(),
        source,
    };
    let huge = mem::is_hugetlbfs(file).map_err(fs_err)?;
    if !huge && !mem::is_tmpfs(file).map_err(fs_err)? {
        return Err(SnapshotError::NotInMemory(path.to_owned()));
    }
    Ok(huge)
}

/// `st_dev` as the (major, minor) that `/proc/<pid>/maps` prints.
fn dev_numbers(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// The vmas of a `/proc/<pid>/maps` text (smaps' header lines are the
/// same; its other lines are skipped).
fn parse_maps(text: &str) -> Vec<Vma> {
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(range) = it.next() else { continue };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let (Some(perms), Some(off), Some(dev), Some(inode)) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let Some((ma, mi)) = dev.split_once(':') else {
            continue;
        };
        out.push(Vma {
            start,
            end,
            private: perms.ends_with('p'),
            offset: u64::from_str_radix(off, 16).unwrap_or(u64::MAX),
            dev: (
                u32::from_str_radix(ma, 16).unwrap_or(u32::MAX),
                u32::from_str_radix(mi, 16).unwrap_or(u32::MAX),
            ),
            inode: inode.parse().unwrap_or(0),
            path: it.collect::<Vec<_>>().join(" "),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_are_parsed() {
        let text = "\
7f0000000000-7f0000200000 rw-p 00200000 00:1a 4242                       /dev/shm/snap
Size:               2048 kB
VmFlags: rd wr mr mw me ac ui um
7f0000400000-7f0000600000 rw-p 00000000 00:00 0 
VmFlags: rd wr mr mw me ac um
";
        let v = parse_maps(text);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].start, v[0].end, v[0].offset),
            (0x7f00_0000_0000, 0x7f00_0020_0000, 0x20_0000)
        );
        assert_eq!(
            (v[0].dev, v[0].inode, v[0].path.as_str()),
            ((0, 0x1a), 4242, "/dev/shm/snap")
        );
        assert!(v[0].private);
        assert_eq!(v[1].inode, 0);
    }

    #[test]
    fn device_numbers_split_as_the_kernel_prints_them() {
        // makedev(0, 0x1a) and makedev(259, 3).
        assert_eq!(dev_numbers(0x1a), (0, 0x1a));
        assert_eq!(dev_numbers((259 << 8) | 3), (259, 3));
    }
}
