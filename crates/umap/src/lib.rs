//! # libumap: LLNL UMap's API over faultline
//!
//! The C functions of UMap's `umap/umap.h` (`umap`, `uunmap`, `umap_flush`,
//! `umap_prefetch`, `umap_fetch_and_pin`, `umap_has_write_support`, the
//! `umapcfg_get_*` queries) and, through the header's inline C++,
//! `Umap::umap_ex` with a `Umap::Store`, so UMap programs compile and run
//! unchanged against `libumap`. The `UMAP_*` environment variables keep
//! UMap's meanings and defaults ([`mod@config`] says how each maps onto
//! faultline).
//!
//! How a call maps:
//!
//! 1. `umap(addr, len, prot, flags, fd, offset)` checks the arguments as
//!    UMap documents them (`UMAP_PRIVATE` required, `UMAP_FIXED` allowed,
//!    `len` and `offset` multiples of `UMAP_PAGESIZE`, a readable `fd`),
//!    opens the file again with the descriptor's access mode (by default
//!    twice, buffered and `O_DIRECT`: [`cached::CachedOrDirect`]; see
//!    `file_store`) and
//!    builds a region of UMap's one buffer, a [`SharedBudget`] of
//!    `UMAP_BUFSIZE` pages for all regions together that no fault passes:
//!    from `UMAP_BUFSIZE * HIGH / 100` pages each region's evictors evict
//!    the region's pages until the total is down to `UMAP_BUFSIZE * LOW / 100`,
//!    and a fault that finds the buffer full evicts a batch itself (dirty
//!    pages are tracked, written back on eviction, `umap_flush` and
//!    `uunmap`).
//! 2. Faults are resolved by the signal engine (on the faulting thread)
//!    unless `UMAP_PAGE_FILLERS` is set or the store is a C++
//!    `Umap::Store` (not async-signal-safe): then by a workers engine with
//!    `UMAP_PAGE_FILLERS` handler threads.
//! 3. Failures return UMap's error value (`UMAP_FAILED`, or -1) with
//!    `errno` set, where UMap itself would print and abort.
//!
//! `libumap` and `libfaultline` share their Rust code through the
//! `faultline-ffi` crate, not through each other: each library exports
//! only its own functions.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(
    non_camel_case_types,
    reason = "UMap's C API names its types in C style (umap_..._t)"
)]

pub mod cached;
pub mod config;
pub mod direct;

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_long, c_void};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex, OnceLock};

use faultline::engine::{self, EngineConfig, EngineKind};
use faultline::policy::PolicyKind;
use faultline::store::{FileAccess, PageCacheFile, StoreError};
use faultline::{Engine, FileStore, PageStore, Region, SharedBudget};
use faultline_ffi::callback::{FillFn, WriteFn};
use faultline_ffi::{
    guard, guard_or, last_error, set_last_error, CError, CallbackStore, Callbacks,
};
use faultline_sys::{
    mem::{open_mode, O_DIRECT},
    set_errno, Errno,
};

use cached::CachedOrDirect;
use config::{config, log_at, FileIo, Level, SYSTEM_PAGE};
use direct::DirectFileStore;

/// `MAP_PRIVATE`, UMap's `UMAP_PRIVATE`.
const MAP_PRIVATE: c_int = 0x02;
/// `MAP_FIXED`, UMap's `UMAP_FIXED`.
const MAP_FIXED: c_int = 0x10;
/// `PROT_READ`.
const PROT_READ: c_int = 0x1;
/// `PROT_WRITE`.
const PROT_WRITE: c_int = 0x2;

/// UMap's `UMAP_FAILED`.
const UMAP_FAILED: *mut c_void = usize::MAX as *mut c_void;

/// The live regions, by start address.
static REGIONS: Mutex<BTreeMap<usize, Region>> = Mutex::new(BTreeMap::new());

fn regions() -> std::sync::MutexGuard<'static, BTreeMap<usize, Region>> {
    // A panic while holding the lock leaves the map consistent (every
    // operation is a single insert, remove or lookup).
    REGIONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `e` as the failure of `what`: `errno`, the thread's
/// `fl_last_error`, and the log.
fn fail(what: &str, e: CError) -> c_int {
    log_at(Level::Error, || format!("{what}: {}", e.message));
    set_last_error(&format!("{what}: {}", e.message));
    set_errno(e.errno);
    -1
}

/// UMap's buffer, one for every region of the process: their resident
/// pages never exceed `UMAP_BUFSIZE` pages together (a fault that finds
/// it full evicts, or waits for the evictors, before it installs); from
/// `UMAP_BUFSIZE * HIGH / 100` pages on each region's evictors evict that
/// region's pages until the total is down to `UMAP_BUFSIZE * LOW / 100`.
fn buffer() -> Arc<SharedBudget> {
    static BUFFER: OnceLock<Arc<SharedBudget>> = OnceLock::new();
    BUFFER
        .get_or_init(|| {
            let c = config();
            Arc::new(SharedBudget::with_marks(
                c.budget_pages(),
                c.high_water_pages(),
                c.low_water_pages(),
            ))
        })
        .clone()
}

/// The engine regions use: the signal engine when the store allows it and
/// no filler threads were asked for, else one workers engine with
/// `UMAP_PAGE_FILLERS` threads (both made once per process).
fn engine_for(store: &dyn PageStore) -> Result<Arc<dyn Engine>, CError> {
    static SIGNAL: OnceLock<Result<Arc<dyn Engine>, String>> = OnceLock::new();
    static WORKERS: OnceLock<Result<Arc<dyn Engine>, String>> = OnceLock::new();
    let c = config();
    let (cell, kind) = if store.signal_safe() && !c.fillers_set {
        (&SIGNAL, EngineKind::Signal)
    } else {
        (&WORKERS, EngineKind::Workers)
    };
    cell.get_or_init(|| {
        let cfg = EngineConfig {
            workers: c.fillers as usize,
            batch: c.max_fault_events as usize,
            // Room for the largest read-ahead window of one region page.
            scratch_bytes: (4 << 20usize).max(c.page_size as usize * 2),
            ..EngineConfig::default()
        };
        log_at(Level::Info, || {
            format!(
                "umap: starting the {} engine ({} fillers)",
                kind.name(),
                cfg.workers
            )
        });
        engine::create(kind, cfg).map_err(|e| e.to_string())
    })
    .clone()
    .map_err(|m| CError::new(Errno::EOPNOTSUPP, m))
}

/// A file store the region may not write back to (`fd` was opened
/// read-only): UMap's store would fail its `pwrite` with `EBADF`.
struct ReadOnly<S>(S);

impl<S: PageStore> PageStore for ReadOnly<S> {
    fn describe(&self) -> &str {
        self.0.describe()
    }
    fn len(&self) -> Option<u64> {
        self.0.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, _data: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Io {
            what: self.0.describe().into(),
            op: "write-back to a descriptor opened read-only",
            offset,
            errno: Errno::EBADF,
        })
    }
    fn view(&self, offset: u64, len: usize) -> Option<faultline::StoreView<'_>> {
        self.0.view(offset, len)
    }
    fn page_cache(&self) -> Option<PageCacheFile<'_>> {
        self.0.page_cache()
    }
    fn signal_safe(&self) -> bool {
        self.0.signal_safe()
    }
}

/// The store for `fd` from byte `offset`.
///
/// The caller's descriptor may be one the region cannot use as it is: UMap
/// programs open their files with `O_DIRECT`, and ext4 and xfs refuse a
/// direct read of a buffer, length or offset that is not aligned. The file
/// is opened again through `/proc/self/fd/N` with the caller's access mode
/// (read-only stays read-only; write-only fails with `EBADF`, as UMap's
/// reads would) and:
///
/// * [`FileIo::Cached`] (default): both, a buffered open and an
///   `O_DIRECT` one ([`CachedOrDirect`]): ranges the page cache holds are
///   copied from a shared mapping of it, the others read with `O_DIRECT`
///   (no page cache filled, no read-ahead, for data read once); written
///   back with `pwrite` through the page cache. For UMap pages under
///   [`cached::DIRECT_MIN`] (64 KiB), and on a file system without direct
///   I/O (tmpfs), this is buffered;
/// * [`FileIo::Buffered`] (`FAULTLINE_UMAP_FILE_IO=buffered`): without
///   `O_DIRECT`, read through a shared mapping of the page cache (faults
///   copy straight from it) and written back with `pwrite`;
/// * [`FileIo::Direct`] (`FAULTLINE_UMAP_FILE_IO=direct`): with `O_DIRECT`,
///   aligned reads and writes, through a bounce buffer when a buffer is not
///   aligned ([`DirectFileStore`]); on a file system without direct I/O
///   this falls back to buffered, with a warning.
fn file_store(fd: c_int, offset: u64) -> Result<Arc<dyn PageStore>, CError> {
    if fd < 0 {
        return Err(CError::new(
            Errno::EBADF,
            format!("bad file descriptor {fd}"),
        ));
    }
    // SAFETY: the descriptor is only borrowed for this call; a closed one
    // makes fcntl fail with EBADF, which is what we report.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let mode = open_mode(&borrowed).map_err(|e| CError::from(e.source).context("fd"))?;
    if !mode.read {
        // UMap's reads would fail with EBADF.
        return Err(CError::new(
            Errno::EBADF,
            format!("fd {fd} was opened write-only; umap() reads pages from it"),
        ));
    }
    let writable = mode.write;
    let proc_path = format!("/proc/self/fd/{fd}");
    // The file's own name for messages (the /proc link is only ours).
    let name = std::fs::read_link(&proc_path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| proc_path.clone());
    let reopen = |direct: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(if direct { O_DIRECT } else { 0 })
            .open(&proc_path)
    };
    let io = config().file_io;
    // The direct descriptor, when the mode wants one and the file system
    // does direct I/O (an offset direct I/O cannot start at is refused by
    // `map_region` with EINVAL, as UMap's rules say).
    let small = io == FileIo::Cached && config().page_size < cached::DIRECT_MIN;
    let direct = if io == FileIo::Buffered || small || !offset.is_multiple_of(direct::ALIGN as u64)
    {
        None
    } else {
        match reopen(true) {
            Ok(file) => Some(
                DirectFileStore::new(file.into(), &name, offset)
                    .map_err(|e| CError::from(e).context(&name))?,
            ),
            Err(e) if e.raw_os_error() == Some(Errno::EINVAL.0) => {
                if io == FileIo::Direct {
                    log_at(Level::Warning, || {
                        format!("umap: {name}: its file system does not do direct I/O; reading it buffered")
                    });
                }
                None
            }
            Err(e) => return Err(CError::from(e).context(&name)),
        }
    };
    // A read-only descriptor gets a store that refuses write-back.
    fn finish(store: impl PageStore + 'static, writable: bool) -> Arc<dyn PageStore> {
        if writable {
            Arc::new(store)
        } else {
            Arc::new(ReadOnly(store))
        }
    }
    let direct = match (io, direct) {
        (FileIo::Direct, Some(d)) => return Ok(finish(d, writable)),
        (_, d) => d,
    };
    let file = reopen(false).map_err(|e| CError::from(e).context(&name))?;
    let buffered = FileStore::from_file(file, &name, offset, FileAccess::Mmap, writable)
        .map_err(|e| CError::from(e).context(&name))?;
    Ok(match direct {
        Some(direct) => finish(CachedOrDirect::new(buffered, direct), writable),
        None => finish(buffered, writable),
    })
}

/// Checks UMap's argument rules and builds the region.
fn map_region(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    offset: i64,
    store: Arc<dyn PageStore>,
) -> Result<*mut c_void, CError> {
    let c = config();
    if let Some(why) = c.invalid.first() {
        return Err(CError::invalid(why.clone()));
    }
    let ps = c.page_size as usize;
    if flags & MAP_PRIVATE == 0 || flags & !(MAP_PRIVATE | MAP_FIXED) != 0 {
        return Err(CError::invalid(format!(
            "flags {flags:#x}: UMAP_PRIVATE is required and UMAP_FIXED the only other flag (UMap has no UMAP_SHARED)"
        )));
    }
    if prot & !(PROT_READ | PROT_WRITE) != 0 || prot & PROT_READ == 0 {
        return Err(CError::invalid(format!(
            "prot {prot:#x}: PROT_READ or PROT_READ|PROT_WRITE"
        )));
    }
    if length == 0 || !length.is_multiple_of(ps) {
        return Err(CError::invalid(format!(
            "length {length} is not a non-zero multiple of UMAP_PAGESIZE ({ps})"
        )));
    }
    if offset < 0 || !(offset as u64).is_multiple_of(SYSTEM_PAGE) {
        return Err(CError::invalid(format!(
            "offset {offset} is not a non-negative multiple of the system page size"
        )));
    }
    let engine = engine_for(store.as_ref())?;
    let mut b = Region::builder(length)
        .page_size(c.region_page_size() as usize)
        .shared_store(store)
        .shared_budget(buffer(), PolicyKind::Clock)
        .evictors(c.region_evictors())
        .readahead(c.readahead());
    if flags & MAP_FIXED != 0 {
        if !(addr as usize).is_multiple_of(ps) {
            return Err(CError::invalid(format!(
                "UMAP_FIXED address {addr:p} is not aligned to UMAP_PAGESIZE"
            )));
        }
        b = b.at(addr as u64);
    }
    let region = b.build_dyn(engine)?;
    let start = region.as_ptr() as usize;
    log_at(Level::Info, || {
        format!(
            "umap: region {start:#x}+{length:#x}, {} pages of {ps} bytes, buffer of {} pages shared by every region, engine {}",
            length / ps,
            c.budget_pages(),
            region.engine().kind().name()
        )
    });
    regions().insert(start, region);
    Ok(start as *mut c_void)
}

/// UMap's `umap()`: maps `length` bytes of the file `fd` from `offset`;
/// pages are read on first access. Returns the address, or `UMAP_FAILED`
/// with `errno` set (`EINVAL`: bad flags, prot, length, offset or
/// `UMAP_*` value; `EBADF`: bad `fd`; `EEXIST`: a `UMAP_FIXED` range
/// overlapping a region; `EOPNOTSUPP`: a kernel feature is missing).
///
/// # Safety
/// With `UMAP_FIXED`, `addr` is page aligned and nothing the program uses
/// is mapped in `[addr, addr + length)` (it is replaced, as with `mmap`).
#[no_mangle]
pub unsafe extern "C" fn umap(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: i64,
) -> *mut c_void {
    log_at(Level::Debug, || {
        format!("umap(addr {addr:p}, length {length}, prot {prot}, flags {flags}, fd {fd}, offset {offset})")
    });
    let r = guard("umap", || {
        let store = file_store(fd, offset.max(0) as u64)?;
        map_region(addr, length, prot, flags, offset, store).map(|p| p as i64)
    });
    mapped("umap", r)
}

/// What a mapping call returns for `guard`'s result `r` (an address or a
/// negative errno): the address, or `UMAP_FAILED` with `errno` set (UMap's
/// callers look at errno; `guard` recorded the message).
fn mapped(what: &str, r: i64) -> *mut c_void {
    if r < 0 {
        set_errno(-r as i32);
        log_at(Level::Error, || format!("{what} failed: {}", last_error()));
        UMAP_FAILED
    } else {
        r as *mut c_void
    }
}

/// Reads `nb` bytes at `off` into `buf`: 0, or a positive errno.
pub type umap_read_fn = Option<FillFn>;
/// Writes `nb` bytes from `buf` at `off`: 0, or a positive errno.
pub type umap_write_fn = Option<WriteFn>;

/// A store given as callbacks (what the header's inline `Umap::umap_ex`
/// builds from a `Umap::Store`); a faultline extension.
#[repr(C)]
pub struct umap_store_ops {
    /// Passed to the callbacks (the `Umap::Store*`).
    pub user: *mut c_void,
    /// Reads from the store; required.
    pub read: umap_read_fn,
    /// Writes to the store; NULL for a read-only store.
    pub write: umap_write_fn,
}

/// `umap()` over a store given as callbacks (`Umap::umap_ex` in C++). The
/// callbacks run on filler threads (the workers engine), several at once.
/// Errors as for `umap()`.
///
/// # Safety
/// `ops` points to a readable `umap_store_ops` whose callbacks stay valid
/// until `uunmap`; `addr` as for `umap()`.
#[no_mangle]
pub unsafe extern "C" fn umap_store(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    offset: i64,
    ops: *const umap_store_ops,
) -> *mut c_void {
    let r = guard("umap_ex", || {
        if ops.is_null() {
            return Err(CError::invalid("store is NULL"));
        }
        // SAFETY: the caller passes a readable struct.
        let ops = unsafe { &*ops };
        let Some(read) = ops.read else {
            return Err(CError::invalid("the store's read callback is NULL"));
        };
        let cb = Callbacks {
            user: ops.user,
            len: None,
            // A Umap::Store runs C++ (locks, allocation): never inside the
            // SIGBUS handler.
            signal_safe: false,
            fill: read,
            write_back: ops.write,
            destroy: None,
        };
        let store = Arc::new(CallbackStore::new(cb, "Umap::Store"));
        map_region(addr, length, prot, flags, offset, store).map(|p| p as i64)
    });
    mapped("umap_ex", r)
}

/// UMap's `uunmap()`: writes the region's dirty pages back to its store and
/// unmaps it. Returns 0, or -1 with `errno`: `EINVAL` when `addr` is not
/// the start of a region made by `umap()`, `EIO` when dirty pages could not
/// be written back (the region is unmapped anyway).
///
/// # Safety
/// No thread accesses the region during or after the call.
#[no_mangle]
pub unsafe extern "C" fn uunmap(addr: *mut c_void, length: usize) -> c_int {
    log_at(Level::Debug, || {
        format!("uunmap(addr {addr:p}, length {length})")
    });
    let r = guard("uunmap", || {
        let Some(region) = regions().remove(&(addr as usize)) else {
            return Err(CError::invalid(format!(
                "{addr:p} is not a region made by umap()"
            )));
        };
        let flushed = region.flush();
        log_at(Level::Info, || {
            format!(
                "umap: uunmap of region {addr:p}: {:?}, {:?}",
                region.stats(),
                region.eviction_stats()
            )
        });
        drop(region);
        flushed.map(|_| 0).map_err(CError::from)
    });
    if r < 0 {
        set_errno(-r);
        -1
    } else {
        0
    }
}

/// UMap's `umap_flush()`: writes the dirty pages of every region back to
/// their stores (they stay resident). Returns 0, or -1 with `errno` (the
/// first store error; the other pages are still written).
#[no_mangle]
pub extern "C" fn umap_flush() -> c_int {
    log_at(Level::Debug, || "umap_flush()".into());
    let r = guard("umap_flush", || {
        let map = regions();
        let mut first: Option<CError> = None;
        let mut written = 0;
        for region in map.values() {
            match region.flush() {
                Ok(n) => written += n,
                Err(e) => {
                    first.get_or_insert(e.into());
                }
            }
        }
        log_at(Level::Debug, || {
            format!("umap_flush: {written} pages written back")
        });
        first.map_or(Ok(0), Err)
    });
    if r < 0 {
        set_errno(-r);
        -1
    } else {
        0
    }
}

/// One page to prefetch (UMap's `struct umap_prefetch_item`).
#[repr(C)]
pub struct umap_prefetch_item {
    /// Any address in the page.
    pub page_base_addr: *mut c_void,
}

/// How long prefetching waits for pages other threads are resolving.
const POPULATE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Installs the pages of `[addr, addr + size)` (clipped to the region
/// holding `addr`) on the calling thread; with `pin`, pins them first, so
/// the evictor leaves them resident until `uunmap`.
fn populate(addr: usize, size: usize, pin: bool) -> Result<(), CError> {
    let map = regions();
    let Some((&start, region)) = map.range(..=addr).next_back() else {
        return Err(CError::invalid(format!(
            "{addr:#x} is not in a umap region"
        )));
    };
    let off = addr - start;
    if off >= region.len() {
        return Err(CError::invalid(format!(
            "{addr:#x} is not in a umap region"
        )));
    }
    // Whole UMap pages (a group of region pages when UMAP_PAGESIZE is not
    // a power of two; the region's length is a multiple of it).
    let (ups, ps) = (config().page_size as usize, region.page_size());
    let first = off / ups * ups;
    let end = (off + size.max(1)).next_multiple_of(ups).min(region.len());
    let pages = first / ps..end.div_ceil(ps);
    if pin {
        // Pinned before they are installed: the evictor never sees them
        // unpinned, even for a moment.
        region.pin(pages.clone());
    }
    // Installed as a read would install them: clean, so only pages the
    // program then writes are written back (`Region::populate` installs
    // as a write, dirty, and a read-only `fd` would fail the write-back).
    region.resolve_pages(pages, false, POPULATE_WAIT)?;
    Ok(())
}

/// UMap's `umap_prefetch()`: installs the `npages` pages named in
/// `page_array` now, on the calling thread. Pages outside every region set
/// `errno` to `EINVAL` (UMap's function returns nothing).
///
/// # Safety
/// `page_array` points to `npages` readable items.
#[no_mangle]
pub unsafe extern "C" fn umap_prefetch(npages: c_int, page_array: *mut umap_prefetch_item) {
    let r = guard("umap_prefetch", || {
        if npages <= 0 {
            return Ok(0);
        }
        if page_array.is_null() {
            return Err(CError::invalid("page_array is NULL"));
        }
        // SAFETY: the caller passes `npages` readable items.
        let items = unsafe { std::slice::from_raw_parts(page_array, npages as usize) };
        let mut first = None;
        for item in items {
            if let Err(e) = populate(item.page_base_addr as usize, 1, false) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(0), Err)
    });
    if r < 0 {
        fail(
            "umap_prefetch",
            CError {
                errno: -r,
                message: last_error(),
            },
        );
    }
}

/// UMap's `umap_fetch_and_pin()`: pins the pages of `[paddr, paddr +
/// size)` and installs them now. Pinned pages stay resident (the evictor
/// skips them, and they count against the budget) until `uunmap`; UMap
/// has no unpin call. Errors set `errno` to `EINVAL` (outside every
/// region) or the store's error (UMap's function returns nothing).
///
/// # Safety
/// None beyond UMap's: `paddr` is inside a region.
#[no_mangle]
pub unsafe extern "C" fn umap_fetch_and_pin(paddr: *mut c_char, size: u64) {
    log_at(Level::Debug, || {
        format!("umap_fetch_and_pin(paddr {paddr:p}, size {size})")
    });
    let r = guard("umap_fetch_and_pin", || {
        populate(paddr as usize, size as usize, true).map(|()| 0)
    });
    if r < 0 {
        fail(
            "umap_fetch_and_pin",
            CError {
                errno: -r,
                message: last_error(),
            },
        );
    }
}

/// UMap's `umap_has_write_support()`: 1 (dirty pages are written back).
#[no_mangle]
pub extern "C" fn umap_has_write_support() -> c_int {
    1
}

macro_rules! cfg_getter {
    ($(#[$doc:meta])* $name:ident -> $t:ty, |$c:ident| $e:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub extern "C" fn $name() -> $t {
            guard_or(stringify!($name), 0 as $t, || {
                let $c = config();
                $e as $t
            })
        }
    };
}

cfg_getter!(
    /// `UMAP_PAGESIZE` in bytes.
    umapcfg_get_umap_page_size -> u64, |c| c.page_size);
cfg_getter!(
    /// `UMAP_MAX_FAULT_EVENTS`.
    umapcfg_get_max_fault_events -> u64, |c| c.max_fault_events);
cfg_getter!(
    /// `UMAP_PAGE_FILLERS`.
    umapcfg_get_num_fillers -> u64, |c| c.fillers);
cfg_getter!(
    /// `UMAP_PAGE_EVICTORS`.
    umapcfg_get_num_evictors -> u64, |c| c.evictors);
cfg_getter!(
    /// `UMAP_BUFSIZE` in UMap pages.
    umapcfg_get_max_pages_in_buffer -> u64, |c| c.buf_pages);
cfg_getter!(
    /// `UMAP_READ_AHEAD` in pages (0 when unset).
    umapcfg_get_read_ahead -> u64, |c| c.read_ahead.unwrap_or(0));
cfg_getter!(
    /// `UMAP_EVICT_LOW_WATER_THRESHOLD`, percent.
    umapcfg_get_evict_low_water_threshold -> c_int, |c| c.low_water);
cfg_getter!(
    /// `UMAP_EVICT_HIGH_WATER_THRESHOLD`, percent.
    umapcfg_get_evict_high_water_threshold -> c_int, |c| c.high_water);
cfg_getter!(
    /// The system page size.
    umapcfg_get_system_page_size -> c_long, |_c| SYSTEM_PAGE);
