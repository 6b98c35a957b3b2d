//! Stores: where a region's pages come from. The zero, memory and file
//! stores of the library, and [`CallbackStore`], a store made of C
//! function pointers and a user pointer.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use faultline::store::{FileAccess, StoreError};
use faultline::sys::Errno;
use faultline::{FileStore, MemoryStore, PageStore, ZeroStore};

use crate::error::{guard, guard_or, CError};

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

/// A [`PageStore`] over C callbacks.
pub struct CallbackStore {
    cb: fl_store_callbacks,
    what: Arc<str>,
}

// SAFETY: the C API requires the callbacks and `user` to be usable from
// any thread (documented on `fl_store_callbacks` and in the header).
unsafe impl Send for CallbackStore {}
// SAFETY: as above; the callbacks may run concurrently.
unsafe impl Sync for CallbackStore {}

impl CallbackStore {
    /// Wraps `cb`; fails if `fill` is missing.
    pub fn new(cb: fl_store_callbacks, what: &str) -> Result<CallbackStore, CError> {
        if cb.fill.is_none() {
            return Err(CError::invalid("the fill callback is NULL"));
        }
        if cb.flags & !FL_STORE_SIGNAL_SAFE != 0 {
            return Err(CError::invalid(format!(
                "unknown store flags {:#x}",
                cb.flags
            )));
        }
        Ok(CallbackStore {
            cb,
            what: what.into(),
        })
    }

    fn failed(&self, op: &'static str, offset: u64, rc: c_int) -> StoreError {
        StoreError::Io {
            what: self.what.clone(),
            op,
            offset,
            // A callback that returns a negative errno is understood too.
            errno: Errno(if rc < 0 { rc.saturating_neg() } else { rc }),
        }
    }
}

impl Drop for CallbackStore {
    fn drop(&mut self) {
        if let Some(destroy) = self.cb.destroy {
            // SAFETY: the C side gave us `destroy` for `user`; we call it once.
            unsafe { destroy(self.cb.user) }
        }
    }
}

impl PageStore for CallbackStore {
    fn describe(&self) -> &str {
        &self.what
    }

    fn len(&self) -> Option<u64> {
        (self.cb.len != FL_STORE_ENDLESS).then_some(self.cb.len)
    }

    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let fill = self.cb.fill.expect("checked in new");
        // Past the end: zeros, and the callback sees only its own bytes.
        let avail = match self.len() {
            Some(len) => len.saturating_sub(offset).min(buf.len() as u64) as usize,
            None => buf.len(),
        };
        buf[avail..].fill(0);
        if avail == 0 {
            return Ok(());
        }
        // SAFETY: `buf` is valid for `avail` bytes; the callback's contract
        // is to write at most `len` bytes.
        let rc = unsafe { fill(self.cb.user, offset, buf.as_mut_ptr(), avail) };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.failed("fill callback", offset, rc))
        }
    }

    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let Some(wb) = self.cb.write_back else {
            return Err(StoreError::ReadOnly {
                what: self.what.clone(),
                offset,
            });
        };
        let n = match self.len() {
            Some(len) => len.saturating_sub(offset).min(data.len() as u64) as usize,
            None => data.len(),
        };
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `data` is valid for `n` bytes and only read.
        let rc = unsafe { wb(self.cb.user, offset, data.as_ptr(), n) };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.failed("write_back callback", offset, rc))
        }
    }

    fn signal_safe(&self) -> bool {
        self.cb.flags & FL_STORE_SIGNAL_SAFE != 0
    }
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
        if path.is_null() {
            return Err(CError::invalid("path is NULL"));
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let p = unsafe { CStr::from_ptr(path) }
            .to_str()
            .map_err(|_| CError::invalid("path is not UTF-8"))?;
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
        put(out, Arc::new(CallbackStore::new(cb, "callback store")?))
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
