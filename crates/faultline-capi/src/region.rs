//! Regions: memory whose page faults faultline resolves from a store.

use std::ffi::{c_int, c_void};

use faultline::policy::PolicyKind;
use faultline::{EvictionConfig, PageState, ReadaheadConfig, Region, RegionBuilder};

use crate::engine::fl_engine;
use crate::error::{guard, guard_or, CError};
use crate::store::fl_store;

/// A region (opaque): `len` bytes of memory at [`fl_region_addr`].
pub struct fl_region {
    pub(crate) region: Region,
}

/// Evict the page installed first.
pub const FL_POLICY_FIFO: u32 = 0;
/// CLOCK (second chance).
pub const FL_POLICY_CLOCK: u32 = 1;
/// Refault-aware 2Q.
pub const FL_POLICY_2Q: u32 = 2;

/// `fl_region_options.flags`: never install the store's page-cache pages
/// without a copy (by default a file store on tmpfs is mapped privately and
/// its pages installed with `UFFDIO_CONTINUE`).
pub const FL_REGION_NO_ZERO_COPY: u32 = 1;

/// Region settings; fill with [`fl_region_options_default`] first. A zero
/// field means "the library's default".
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fl_region_options {
    /// `sizeof(struct fl_region_options)` as the caller compiled it.
    pub size: usize,
    /// Region page size: a power of two, at least 4096 (0: 4096).
    pub page_size: usize,
    /// Pages installed per isolated fault (the aligned fault-around
    /// window; 1 = only the faulting page). 0: adaptive (1 for a zero
    /// store, 16 for a store with data, 64 for zero copy).
    pub fault_around: usize,
    /// Largest window a sequential stream grows to, in pages (0: with
    /// `fault_around` set, the same as it; else the library's adaptive
    /// maximum).
    pub readahead_max: usize,
    /// Most pages resident at once (0: no budget). With a budget, writes
    /// are tracked and dirty pages written back to the store before they
    /// are dropped, on [`fl_region_flush`] and on [`fl_region_free`].
    pub budget_pages: usize,
    /// `FL_POLICY_*`: which page a budget evicts.
    pub policy: u32,
    /// `FL_REGION_*` flags.
    pub flags: u32,
    /// Map at this address (page aligned, the range must be free); 0:
    /// anywhere.
    pub addr: u64,
}

/// Counters of a region ([`fl_region_get_stats`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fl_region_stats {
    /// Faults delivered to the runtime for this region.
    pub faults: u64,
    /// Region pages installed (fault-around counts every page).
    pub installed: u64,
    /// Resolve ioctls that installed something.
    pub ioctls: u64,
    /// Pages read through the store's fill.
    pub store_fills: u64,
    /// Pages copied straight from the store's memory.
    pub zero_copy_fills: u64,
    /// Resolutions that found the page already there.
    pub exists: u64,
    /// Pages poisoned after store errors.
    pub poisoned: u64,
    /// Pages resident now.
    pub resident: u64,
    /// Pages evicted (budget regions).
    pub evicted: u64,
    /// Dirty pages written back (budget regions).
    pub written_back: u64,
    /// Write-backs that failed (budget regions).
    pub write_back_errors: u64,
    /// Most pages resident at once (budget regions).
    pub max_resident: u64,
}

/// `fl_region_page_state` results.
pub const FL_PAGE_ABSENT: c_int = 0;
/// Mapped read-only (or clean, for budget regions).
pub const FL_PAGE_READ_ONLY: c_int = 1;
/// Mapped writable (dirty, for budget regions).
pub const FL_PAGE_WRITABLE: c_int = 2;
/// Poisoned after a store error: accesses get SIGBUS.
pub const FL_PAGE_POISONED: c_int = 3;

fn default_options() -> fl_region_options {
    fl_region_options {
        size: std::mem::size_of::<fl_region_options>(),
        page_size: 0,
        fault_around: 0,
        readahead_max: 0,
        budget_pages: 0,
        policy: FL_POLICY_CLOCK,
        flags: 0,
        addr: 0,
    }
}

/// Fills `opts` with the defaults (all zero: 4 KiB pages, adaptive
/// read-ahead, no budget, CLOCK, zero copy allowed, any address).
///
/// # Safety
/// `opts` points to writable memory for a `struct fl_region_options`.
#[no_mangle]
pub unsafe extern "C" fn fl_region_options_default(opts: *mut fl_region_options) {
    guard_or("fl_region_options_default", (), || {
        if !opts.is_null() {
            // SAFETY: the caller passes a writable struct.
            unsafe { opts.write(default_options()) }
        }
    })
}

/// The policy of an `FL_POLICY_*` value.
pub fn policy_kind(p: u32) -> Result<PolicyKind, CError> {
    Ok(match p {
        FL_POLICY_FIFO => PolicyKind::Fifo,
        FL_POLICY_CLOCK => PolicyKind::Clock,
        FL_POLICY_2Q => PolicyKind::RefaultAware,
        p => return Err(CError::invalid(format!("unknown eviction policy {p}"))),
    })
}

/// Applies `o` to a region builder.
pub fn apply_options(mut b: RegionBuilder, o: &fl_region_options) -> Result<RegionBuilder, CError> {
    if o.flags & !FL_REGION_NO_ZERO_COPY != 0 {
        return Err(CError::invalid(format!(
            "unknown region flags {:#x}",
            o.flags
        )));
    }
    if o.page_size != 0 {
        b = b.page_size(o.page_size);
    }
    match (o.fault_around, o.readahead_max) {
        (0, 0) => {}
        (0, max) => b = b.readahead(ReadaheadConfig::adaptive(1, max)),
        (n, 0) => b = b.fault_around(n),
        (n, max) => b = b.readahead(ReadaheadConfig::adaptive(n, max)),
    }
    if o.budget_pages != 0 {
        b = b.budget(EvictionConfig {
            budget_pages: o.budget_pages,
            policy: policy_kind(o.policy)?,
        });
    }
    if o.flags & FL_REGION_NO_ZERO_COPY != 0 {
        b = b.zero_copy(false);
    }
    if o.addr != 0 {
        b = b.at(o.addr);
    }
    Ok(b)
}

/// Maps a region of `len` bytes (a multiple of the page size) whose pages
/// come from `store` (NULL: zeros), served by `engine`; `opts` may be NULL
/// for the defaults. On success `*out` holds the region and 0 is returned;
/// otherwise a negative errno: `-EINVAL` (zero or unaligned length, bad
/// page size, a store the signal engine cannot call, bad options),
/// `-EEXIST` (the fixed address overlaps a region), `-EOPNOTSUPP` (a kernel
/// feature is missing), or the kernel's errno.
///
/// # Safety
/// `engine` is a live engine handle; `store` is NULL or a live store
/// handle; `opts` is NULL or points to a `struct fl_region_options` with
/// `size` set; `out` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn fl_region_new(
    engine: *const fl_engine,
    len: usize,
    store: *const fl_store,
    opts: *const fl_region_options,
    out: *mut *mut fl_region,
) -> c_int {
    guard("fl_region_new", || {
        if engine.is_null() || out.is_null() {
            return Err(CError::invalid("engine or out is NULL"));
        }
        let o = if opts.is_null() {
            default_options()
        } else {
            // SAFETY: the caller passes a readable struct.
            let given = unsafe { &*opts };
            if given.size < std::mem::size_of::<fl_region_options>() {
                return Err(CError::invalid(
                    "opts->size is smaller than this library's struct fl_region_options (call fl_region_options_default first)",
                ));
            }
            *given
        };
        let mut b = Region::builder(len);
        if !store.is_null() {
            // SAFETY: a live store handle.
            b = b.shared_store(unsafe { &*store }.store.clone());
        }
        let b = apply_options(b, &o)?;
        // SAFETY: a live engine handle.
        let engine = unsafe { &*engine }.engine.clone();
        let region = b.build_dyn(engine)?;
        // SAFETY: `out` is writable.
        unsafe { out.write(Box::into_raw(Box::new(fl_region { region }))) };
        Ok(0)
    })
}

/// Unmaps the region after writing its dirty pages back (budget regions),
/// and frees the handle (NULL is ignored). Returns 0, or, if dirty pages
/// could not be written back, the negative errno of the store's failure
/// (a callback's own, e.g. `-ENOSPC`; `-EIO` where there is none); the
/// message names the pages, and the region is freed anyway. No thread may access the region's memory or call
/// another function on it meanwhile or afterwards.
///
/// # Safety
/// `region` is NULL or a handle from [`fl_region_new`] not freed yet.
#[no_mangle]
pub unsafe extern "C" fn fl_region_free(region: *mut fl_region) -> c_int {
    guard("fl_region_free", || {
        if region.is_null() {
            return Ok(0);
        }
        // SAFETY: the caller gives back a handle we made.
        let r = unsafe { Box::from_raw(region) };
        let flushed = r.region.flush();
        drop(r);
        flushed.map(|_| 0).map_err(CError::from)
    })
}

/// Borrows a live region handle.
///
/// # Safety
/// `r` is a live handle (or NULL, which fails).
unsafe fn live<'a>(r: *const fl_region) -> Result<&'a Region, CError> {
    if r.is_null() {
        return Err(CError::invalid("region is NULL"));
    }
    // SAFETY: by the caller's contract.
    Ok(&unsafe { &*r }.region)
}

/// The region's first byte (NULL for a NULL handle).
///
/// # Safety
/// `region` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn fl_region_addr(region: *const fl_region) -> *mut c_void {
    guard_or("fl_region_addr", std::ptr::null_mut(), || {
        // SAFETY: by the caller's contract.
        unsafe { live(region) }.map_or(std::ptr::null_mut(), |r| r.as_ptr().cast())
    })
}

/// The region's length in bytes (0 for a NULL handle).
///
/// # Safety
/// `region` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn fl_region_len(region: *const fl_region) -> usize {
    guard_or("fl_region_len", 0, || {
        // SAFETY: by the caller's contract.
        unsafe { live(region) }.map_or(0, |r| r.len())
    })
}

/// The region's page size in bytes (0 for a NULL handle).
///
/// # Safety
/// `region` is NULL or a live region handle.
#[no_mangle]
pub unsafe extern "C" fn fl_region_page_size(region: *const fl_region) -> usize {
    guard_or("fl_region_page_size", 0, || {
        // SAFETY: by the caller's contract.
        unsafe { live(region) }.map_or(0, |r| r.page_size())
    })
}

/// Copies the region's counters into `*out`. Returns 0 or `-EINVAL`.
///
/// # Safety
/// `region` is a live region handle; `out` points to a writable `struct
/// fl_region_stats`.
#[no_mangle]
pub unsafe extern "C" fn fl_region_get_stats(
    region: *const fl_region,
    out: *mut fl_region_stats,
) -> c_int {
    guard("fl_region_get_stats", || {
        // SAFETY: by the caller's contract.
        let r = unsafe { live(region) }?;
        if out.is_null() {
            return Err(CError::invalid("out is NULL"));
        }
        let s = r.stats();
        let mut c = fl_region_stats {
            faults: s.faults,
            installed: s.installed,
            ioctls: s.ioctls,
            store_fills: s.store_fills,
            zero_copy_fills: s.zero_copy_fills,
            exists: s.exists,
            poisoned: s.poisoned,
            resident: r.resident_pages() as u64,
            ..Default::default()
        };
        if let Some(e) = r.eviction_stats() {
            c.evicted = e.evicted;
            c.written_back = e.written_back;
            c.write_back_errors = e.write_back_errors;
            c.max_resident = e.max_resident;
        }
        // SAFETY: `out` is writable.
        unsafe { out.write(c) };
        Ok(0)
    })
}

/// The state of region page `page` (`FL_PAGE_*`), or `-EINVAL` for a page
/// outside the region.
///
/// # Safety
/// `region` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn fl_region_page_state(region: *const fl_region, page: usize) -> c_int {
    guard("fl_region_page_state", || {
        // SAFETY: by the caller's contract.
        let r = unsafe { live(region) }?;
        if page >= r.pages() {
            return Err(CError::invalid(format!(
                "page {page} is outside the region's {} pages",
                r.pages()
            )));
        }
        Ok(match r.page_state(page) {
            PageState::Absent => FL_PAGE_ABSENT,
            PageState::ReadOnly => FL_PAGE_READ_ONLY,
            PageState::Writable => FL_PAGE_WRITABLE,
            PageState::Poisoned => FL_PAGE_POISONED,
        })
    })
}

/// 1 if every page overlapping `[offset, offset + len)` is resident, 0 if
/// not (or the range is not inside the region).
///
/// # Safety
/// `region` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn fl_region_is_resident(
    region: *const fl_region,
    offset: usize,
    len: usize,
) -> c_int {
    guard("fl_region_is_resident", || {
        // SAFETY: by the caller's contract.
        let r = unsafe { live(region) }?;
        Ok(c_int::from(r.is_resident(offset, len)))
    })
}

/// Writes every dirty page back to the store (budget regions; other
/// regions track no dirtiness and return 0). Returns the pages written or
/// a negative errno (the store's, or `-EIO`).
///
/// # Safety
/// `region` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn fl_region_flush(region: *const fl_region) -> i64 {
    guard("fl_region_flush", || {
        // SAFETY: by the caller's contract.
        let r = unsafe { live(region) }?;
        Ok(r.flush()? as i64)
    })
}

/// Installs every absent page of `[offset, offset + len)` (offset page
/// aligned) from the calling thread without faulting. Needed before
/// handing unpopulated region memory to a system call under the signal
/// engine (the kernel returns `EFAULT` instead of raising SIGBUS there).
/// Returns 0 or a negative errno.
///
/// # Safety
/// `region` is a live region handle.
#[no_mangle]
pub unsafe extern "C" fn fl_region_populate(
    region: *const fl_region,
    offset: usize,
    len: usize,
) -> c_int {
    guard("fl_region_populate", || {
        // SAFETY: by the caller's contract.
        let r = unsafe { live(region) }?;
        r.populate(offset, len)?;
        Ok(0)
    })
}
