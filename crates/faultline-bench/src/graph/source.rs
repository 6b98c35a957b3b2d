//! Where the BFS reads the graph from: a [`GraphSource`] exposes the CSR
//! arrays as slices, however they are backed, plus counters for the report.
//!
//! [`MmapSource`] is the kernel baseline: the file mapped `MAP_PRIVATE`,
//! `PROT_READ`, faults resolved by the kernel from the page cache.
//! [`FaultlineSource`] maps the same file as a faultline region backed by a
//! `File` store: every first touch of a region page faults and one of the
//! five engines installs it from the file.
//!
//! Page-cache state is set up per run, independent of the source:
//! [`warm_file`] reads the file once; [`drop_file_cache`] asks the kernel
//! to forget its cached pages (`fdatasync` then `POSIX_FADV_DONTNEED`) and
//! checks with `mincore` how many stayed.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use anyhow::Context;
use faultline::{EngineConfig, EngineKind, FileAccess, FileStore, ReadaheadConfig, Region};
use faultline_sys::mem::Mapping;

use super::csr::CsrLayout;

/// Cumulative counters of a source; the report uses differences.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SourceStats {
    /// Page faults (minor + major for the kernel; handled faults for
    /// faultline).
    pub faults: u64,
    /// Of which major (needed I/O), when known.
    pub major_faults: u64,
    /// Bytes read from the file's storage, when known.
    pub bytes_read: Option<u64>,
    /// Time spent resolving faults. For the kernel: system CPU time of the
    /// process (almost all of it fault handling during a BFS), summed over
    /// threads.
    pub handler_seconds: f64,
}

impl SourceStats {
    /// Counters accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &SourceStats) -> SourceStats {
        SourceStats {
            faults: self.faults.saturating_sub(earlier.faults),
            major_faults: self.major_faults.saturating_sub(earlier.major_faults),
            bytes_read: match (self.bytes_read, earlier.bytes_read) {
                (Some(a), Some(b)) => Some(a.saturating_sub(b)),
                _ => None,
            },
            handler_seconds: (self.handler_seconds - earlier.handler_seconds).max(0.0),
        }
    }
}

/// A CSR graph exposed as slices, e.g. through a memory mapping.
pub trait GraphSource: Sync {
    /// The whole CSR file as little-endian words: `index` then `edges`.
    fn file_words(&self) -> &[u64];
    /// The file's layout.
    fn layout(&self) -> CsrLayout;
    /// `index`, `n + 1` entries.
    fn index(&self) -> &[u64] {
        &self.file_words()[..self.layout().vertices as usize + 1]
    }
    /// `edges`, `index[n]` entries.
    fn edges(&self) -> &[u64] {
        &self.file_words()[self.layout().vertices as usize + 1..]
    }
    /// Cumulative counters now.
    fn stats(&self) -> SourceStats;
    /// Effective page size in bytes.
    fn page_size(&self) -> u64;
    /// How a faultline region pages the file: its read-ahead and whether
    /// it maps the page cache without copies (`None` for the kernel).
    fn paging(&self) -> Option<(ReadaheadConfig, bool)> {
        None
    }
}

/// The kernel's page size.
pub fn kernel_page_size() -> u64 {
    faultline_sys::BASE_PAGE as u64
}

/// Process-wide fault and system-time counters from `getrusage`, plus
/// `read_bytes` from `/proc/self/io` (absent without task I/O accounting).
pub fn process_stats() -> SourceStats {
    let u = faultline_sys::process::usage().unwrap_or_default();
    SourceStats {
        faults: u.minor_faults + u.major_faults,
        major_faults: u.major_faults,
        bytes_read: proc_read_bytes(),
        handler_seconds: u.system_seconds,
    }
}

fn proc_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The first `count` little-endian words of the `len` bytes at `base`.
///
/// # Safety
/// `base..base+len` must stay mapped and readable, and not be written, for
/// `'a`; `base` must be 8-aligned. (Every bit pattern is a valid `u64`.)
unsafe fn words<'a>(base: *const u8, len: usize, count: usize) -> &'a [u64] {
    assert!(count * 8 <= len, "slice past the mapping");
    // SAFETY: in bounds (asserted); the caller guarantees the rest.
    unsafe { std::slice::from_raw_parts(base.cast::<u64>(), count) }
}

/// The kernel baseline: the CSR file mapped `MAP_PRIVATE | PROT_READ`.
pub struct MmapSource {
    map: Mapping,
    layout: CsrLayout,
}

impl MmapSource {
    /// Maps `path`, whose layout was already validated.
    pub fn open(path: &Path, layout: CsrLayout) -> anyhow::Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("stat {}", path.display()))?
            .len();
        anyhow::ensure!(
            len == layout.file_bytes(),
            "{} changed size: {len} bytes, expected {}",
            path.display(),
            layout.file_bytes()
        );
        let len = usize::try_from(len).context("file too large to map")?;
        let map = Mapping::file_private_readonly(&file, len)
            .with_context(|| format!("mmap {}", path.display()))?;
        Ok(Self { map, layout })
    }
}

impl GraphSource for MmapSource {
    fn file_words(&self) -> &[u64] {
        // SAFETY: a read-only, page-aligned mapping owned by `self`; the
        // benchmark owns the file for the run (truncating it would raise
        // SIGBUS, not undefined behaviour we could prevent).
        unsafe {
            words(
                self.map.as_ptr(),
                self.map.len(),
                (self.layout.file_bytes() / 8) as usize,
            )
        }
    }

    fn layout(&self) -> CsrLayout {
        self.layout
    }

    fn stats(&self) -> SourceStats {
        process_stats()
    }

    fn page_size(&self) -> u64 {
        kernel_page_size()
    }
}

/// How a [`FaultlineSource`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultlineOptions<'a> {
    /// Fault-delivery engine.
    pub engine: EngineKind,
    /// Region page size in bytes: a power of two from 4 KiB to 2 MiB.
    pub page_size: u64,
    /// Read-ahead (`None`: the library's adaptive default).
    pub readahead: Option<ReadaheadConfig>,
    /// How the `File` store reads the file.
    pub file_access: FileAccess,
    /// Whether the region maps the file's page cache (tmpfs) instead of
    /// copying: `None` lets the library decide (yes on tmpfs), `Some(true)`
    /// insists (an error elsewhere), `Some(false)` copies.
    pub zero_copy: Option<bool>,
    /// Resident budget in bytes (`None`: unlimited) and the eviction policy.
    pub budget: Option<(u64, faultline::policy::PolicyKind)>,
    /// A store URL (Redis) holding the file's bytes, read instead of the
    /// file (`None`: a `File` store on the file).
    pub store: Option<&'a str>,
}

/// The CSR file as a faultline region: private anonymous memory whose
/// pages are installed on first touch from a `File` store on the file.
///
/// The region covers the whole file, rounded up to the region page size
/// (the store reads zeros past the end of the file). Every engine is
/// process-wide, so the BFS worker threads fault on the region like any
/// other thread; nothing has to be set up per thread.
pub struct FaultlineSource {
    region: Region,
    layout: CsrLayout,
}

impl FaultlineSource {
    /// Maps `path`, whose layout was already validated, as a faultline
    /// region with an engine created for this source alone.
    pub fn open(
        path: &Path,
        layout: CsrLayout,
        opts: FaultlineOptions<'_>,
    ) -> anyhow::Result<Self> {
        let ps = opts.page_size;
        anyhow::ensure!(
            ps.is_multiple_of(4096) && (4096..=2 << 20).contains(&ps),
            "faultline page size {ps} must be a multiple of 4K from 4K to 2M"
        );
        let file_len = std::fs::metadata(path)
            .with_context(|| format!("stat {}", path.display()))?
            .len();
        anyhow::ensure!(
            file_len == layout.file_bytes(),
            "{} changed size: {file_len} bytes, expected {}",
            path.display(),
            layout.file_bytes()
        );
        let region_len = usize::try_from(file_len.next_multiple_of(ps))
            .context("graph file too large to map")?;
        // Calibrate the TSC now (about 60 ms, once per process) so that the
        // first `stats()` call does not land inside a timed run.
        let _ = crate::harness::tsc::tsc();
        let engine = faultline::engine::create(opts.engine, EngineConfig::default())
            .with_context(|| format!("creating the faultline {} engine", opts.engine.name()))?;
        let mut builder = Region::builder(region_len).page_size(ps as usize);
        if let Some(ra) = opts.readahead {
            builder = builder.readahead(ra);
        }
        match opts.zero_copy {
            _ if opts.store.is_some() => {
                let url = opts.store.expect("checked");
                anyhow::ensure!(
                    opts.zero_copy != Some(true),
                    "--file-access page-cache maps the file itself: it cannot read from --store"
                );
                let store = faultline_redis::RedisStore::open(url)
                    .with_context(|| format!("opening store {url}"))?;
                anyhow::ensure!(
                    store.info().len == file_len,
                    "store {url} holds {} bytes but {} has {file_len}: upload it with `faultline store put`",
                    store.info().len,
                    path.display()
                );
                builder = builder.store(store);
            }
            Some(true) => {
                anyhow::ensure!(
                    opts.budget.is_none(),
                    "--file-access page-cache maps the file itself: a budget does not apply"
                );
                anyhow::ensure!(
                    file_len.next_multiple_of(4096).is_multiple_of(ps),
                    "--file-access page-cache maps the file itself, and a mapping cannot extend past its end: \
                     use a page size that divides the file size ({file_len} bytes), e.g. 4K"
                );
                let file = File::open(path).with_context(|| {
                    format!("opening {} for --file-access page-cache", path.display())
                })?;
                builder = builder.page_cache_file(file);
            }
            zero_copy => {
                let store = FileStore::open_with(path, 0, opts.file_access).with_context(|| {
                    format!("opening {} as a faultline file store", path.display())
                })?;
                builder = builder.store(store).zero_copy(zero_copy.is_none());
            }
        }
        if let Some((bytes, policy)) = opts.budget {
            // Clean pages (the graph is only read) are dropped by the
            // evictor and read again from the file on the next fault.
            builder = builder.budget(faultline::EvictionConfig {
                budget_pages: (bytes / ps).max(1) as usize,
                policy,
            });
        }
        let region = builder.build_dyn(engine).with_context(|| {
            format!(
                "creating a {}-byte faultline region ({} engine, {ps}-byte pages) over {}",
                region_len,
                opts.engine.name(),
                path.display()
            )
        })?;
        Ok(Self { region, layout })
    }
}

impl GraphSource for FaultlineSource {
    fn file_words(&self) -> &[u64] {
        // SAFETY: the region is mapped readable for its whole length while
        // `self.region` lives, its base is page-aligned, and nothing writes
        // it. Pages not yet installed fault on first read and the engine
        // installs the file's bytes (zeros past its end) before the read
        // completes, so every read sees the file's contents.
        unsafe {
            words(
                self.region.as_ptr(),
                self.region.len(),
                (self.layout.file_bytes() / 8) as usize,
            )
        }
    }

    fn layout(&self) -> CsrLayout {
        self.layout
    }

    /// `faults` are the faults the runtime handled on this region;
    /// `bytes_read` the region pages filled from the store times the page
    /// size; `handler_seconds` the TSC time spent in the resolve path: on
    /// the faulting threads (SIGBUS handler) for the `signal` engine, on
    /// the handler threads for the others. `major_faults` is the process's
    /// (kernel faults on the store's own mapping of the file, if any).
    fn stats(&self) -> SourceStats {
        let s = self.region.stats();
        let ps = self.region.page_size() as u64;
        SourceStats {
            faults: s.faults,
            major_faults: process_stats().major_faults,
            bytes_read: Some((s.store_fills + s.zero_copy_fills) * ps),
            handler_seconds: crate::harness::tsc::tsc().cycles_to_ns(s.handler_cycles) * 1e-9,
        }
    }

    fn page_size(&self) -> u64 {
        self.region.page_size() as u64
    }
    fn paging(&self) -> Option<(ReadaheadConfig, bool)> {
        Some((self.region.readahead(), self.region.is_zero_copy()))
    }
}

/// Reads the whole file once so its pages are in the page cache.
pub fn warm_file(path: &Path) -> anyhow::Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

/// Result of [`drop_file_cache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheDrop {
    /// Pages of the file.
    pub pages: u64,
    /// Pages still cached afterwards (`None` if `mincore` failed).
    pub still_cached: Option<u64>,
}

impl CacheDrop {
    /// Whether the file left the cache (all but at most 1 % of its pages).
    pub fn worked(&self) -> bool {
        self.still_cached.is_some_and(|c| c * 100 <= self.pages)
    }
}

/// Drops the file's pages from the page cache: `fdatasync` (dirty pages
/// cannot be dropped), `posix_fadvise(POSIX_FADV_DONTNEED)`, then counts the
/// pages still cached with `mincore`. Pages mapped by any process stay.
pub fn drop_file_cache(path: &Path) -> anyhow::Result<CacheDrop> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.sync_data()
        .with_context(|| format!("fdatasync {}", path.display()))?;
    faultline_sys::mem::fadvise_dontneed(&file)
        .with_context(|| format!("dropping the page cache of {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?
        .len();
    let pages = len.div_ceil(kernel_page_size());
    let len = usize::try_from(len).context("file too large to map")?;
    let map = Mapping::file_private_readonly(&file, len)
        .with_context(|| format!("mmap {}", path.display()))?;
    Ok(CacheDrop {
        pages,
        still_cached: map.resident_pages().ok().map(|n| n as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::super::csr::{from_edges, write_csr};
    use super::*;

    #[test]
    fn mmap_source_reads_the_file() {
        let g = from_edges(3, &[(0, 1), (1, 0), (1, 2), (2, 1)]);
        let path = std::env::temp_dir().join(format!("faultline-src-{}", std::process::id()));
        write_csr(&mut File::create(&path).unwrap(), &g).unwrap();
        let src = MmapSource::open(&path, g.layout()).unwrap();
        assert_eq!(src.index(), &g.index[..]);
        assert_eq!(src.edges(), &g.edges[..]);
        let before = src.stats();
        assert!(src.stats().since(&before).faults < 1_000_000);
        drop(src);
        let d = drop_file_cache(&path).unwrap();
        assert_eq!(d.pages, 1);
        warm_file(&path).unwrap();
        std::fs::remove_file(path).unwrap();
    }
}
