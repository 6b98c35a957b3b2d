//! Stores: where a region's pages come from. The zero, memory and file
//! stores of the library, and a store made of C function pointers and a
//! user pointer (`faultline_ffi::CallbackStore`).

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use faultline::store::FileAccess;
use faultline::{FileStore, MemoryStore, PageStore, ZeroStore};
use faultline_ffi::{CallbackStore, Callbacks};

use crate::error::{guard, guard_or, str_arg, CError};

/// A store handle (opaque). The store itself is reference counted: regions
/// built from it keep it alive after [`fl_store_free`].
pub struct fl_store {
    pub(crate) store: Arc<dyn PageStore>,
}

/// `fl_store_callbacks.flags`: the callbacks are async-signal-safe (they
/// allocate nothing, take no lock an application thread may hold, and
/// call only async-signal-safe functions), so the signal engine may call
/// them inside its SIGBUS handler. Without it the signal engine refuses
/// the store (`-EINVAL`).
pub const FL_STORE_SIGNAL_SAFE: u32 = 1;

/// `fl_store_callbacks.len` of a store without an end.
pub const FL_STORE_ENDLESS: u64 = u64::MAX;

/// Fills `len` bytes at store offset `offset` into `buf`. Returns 0, or a
/// positive errno on failure (the faulting page is then poisoned: the
/// accessing thread gets SIGBUS, never a zero page).
pub type fl_fill_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, offset: u64, buf: *mut u8, len: usize) -> c_int>;

/// Writes `len` bytes from `buf` back at store offset `offset`. Returns 0
/// or a positive errno.
pub type fl_write_back_fn = Option<
    unsafe extern "C" fn(user: *mut c_void, offset: u64, buf: *const u8, len: usize) -> c_int,
>;

/// Called once when the last reference to the store goes away.
pub type fl_destroy_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// A store made of callbacks (see [`fl_store_callbacks`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fl_store_callbacks {
    /// Passed to every callback.
    pub user: *mut c_void,
    /// Bytes of data (regions longer than this read zeros past it);
    /// `FL_STORE_ENDLESS` for no end.
    pub len: u64,
    /// `FL_STORE_*` flags.
    pub flags: u32,
    /// Required.
    pub fill: fl_fill_fn,
    /// NULL: the store is read-only (write-back fails with `EACCES`).
    pub write_back: fl_write_back_fn,
    /// NULL: nothing to do.
    pub destroy: fl_destroy_fn,
}

fn put(out: *mut *mut fl_store, store: Arc<dyn PageStore>) -> Result<c_int, CError> {
    if out.is_null() {
        return Err(CError::invalid("out is NULL"));
    }
    // SAFETY: `out` is non-NULL and, by the caller's contract, writable.
    unsafe { out.write(Box::into_raw(Box::new(fl_store { store }))) };
    Ok(0)
}

/// A store of zeros (regions resolve with `UFFDIO_ZEROPAGE`).
///
/// # Safety
/// `out` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn fl_store_zero(out: *mut *mut fl_store) -> c_int {
    guard("fl_store_zero", || put(out, Arc::new(ZeroStore)))
}

/// A store holding a copy of `len` bytes at `data` (the caller keeps its
/// buffer). Write-back goes to the copy.
///
/// # Safety
/// `data` is readable for `len` bytes (or NULL with `len == 0`); `out`
/// points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn fl_store_memory(
    data: *const c_void,
    len: usize,
    out: *mut *mut fl_store,
) -> c_int {
    guard("fl_store_memory", || {
        let bytes = if len == 0 {
            Vec::new()
        } else if data.is_null() {
            return Err(CError::invalid("data is NULL"));
        } else {
            // SAFETY: the caller guarantees `len` readable bytes at `data`.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec()
        };
        put(out, Arc::new(MemoryStore::new(bytes)))
    })
}

/// A file store: `path` from byte `offset` (a multiple of 4096 for the
/// zero-copy paths). Opened read-write if permitted, else read-only. Bytes
/// past the end of the file read as zeros. A file on tmpfs (`/dev/shm`) is
/// installed without a copy by regions that allow it.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` points to writable storage for
/// a pointer.
#[no_mangle]
pub unsafe extern "C" fn fl_store_file(
    path: *const c_char,
    offset: u64,
    out: *mut *mut fl_store,
) -> c_int {
    guard("fl_store_file", || {
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let p = unsafe { str_arg(path, "path") }?;
        let store = FileStore::open_with(p, offset, FileAccess::Mmap)
            .map_err(|e| CError::from(e).context(p))?;
        put(out, Arc::new(store))
    })
}

/// A store made of callbacks (copied from `*cb`). `cb->fill` is required.
/// The callbacks run on whatever thread resolves a fault, possibly several
/// at once, so they and `cb->user` must be thread-safe. They must not
/// touch memory of a region that uses this store (that fault would wait
/// for itself). `cb->destroy` runs once, when the last region using the
/// store and the handle are gone. Unless `cb->flags` has
/// `FL_STORE_SIGNAL_SAFE`, regions on the signal engine refuse the store
/// (`-EINVAL`): use a thread engine.
///
/// # Safety
/// `cb` points to a readable `struct fl_store_callbacks`; `out` points to
/// writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn fl_store_from_callbacks(
    cb: *const fl_store_callbacks,
    out: *mut *mut fl_store,
) -> c_int {
    guard("fl_store_from_callbacks", || {
        if cb.is_null() {
            return Err(CError::invalid("cb is NULL"));
        }
        // SAFETY: the caller passes a readable struct.
        let cb = unsafe { *cb };
        let Some(fill) = cb.fill else {
            return Err(CError::invalid("the fill callback is NULL"));
        };
        if cb.flags & !FL_STORE_SIGNAL_SAFE != 0 {
            return Err(CError::invalid(format!(
                "unknown store flags {:#x}",
                cb.flags
            )));
        }
        let store = CallbackStore::new(
            Callbacks {
                user: cb.user,
                len: (cb.len != FL_STORE_ENDLESS).then_some(cb.len),
                signal_safe: cb.flags & FL_STORE_SIGNAL_SAFE != 0,
                fill,
                write_back: cb.write_back,
                destroy: cb.destroy,
            },
            "callback store",
        );
        put(out, Arc::new(store))
    })
}

/// Frees a store handle (NULL is ignored). Regions built from the store
/// keep it alive.
///
/// # Safety
/// `store` is NULL or a handle from an `fl_store_*` function not freed yet.
#[no_mangle]
pub unsafe extern "C" fn fl_store_free(store: *mut fl_store) {
    guard_or("fl_store_free", (), || {
        if !store.is_null() {
            // SAFETY: the caller gives back a handle we made.
            drop(unsafe { Box::from_raw(store) });
        }
    })
}
