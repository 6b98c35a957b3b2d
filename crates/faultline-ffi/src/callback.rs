//! [`CallbackStore`]: a [`PageStore`] whose fill and write-back are C
//! function pointers with a user pointer.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use faultline::store::StoreError;
use faultline::PageStore;
use faultline_sys::Errno;

/// Fills `len` bytes at `offset` into `buf`: 0 or an errno.
pub type FillFn =
    unsafe extern "C" fn(user: *mut c_void, offset: u64, buf: *mut u8, len: usize) -> c_int;
/// Writes `len` bytes from `buf` at `offset`: 0 or an errno.
pub type WriteFn =
    unsafe extern "C" fn(user: *mut c_void, offset: u64, buf: *const u8, len: usize) -> c_int;
/// Releases `user`.
pub type DestroyFn = unsafe extern "C" fn(user: *mut c_void);

/// The callbacks of a [`CallbackStore`].
#[derive(Debug, Clone, Copy)]
pub struct Callbacks {
    /// Passed to every callback.
    pub user: *mut c_void,
    /// Bytes of data (`None`: no end). Past it, pages read as zeros.
    pub len: Option<u64>,
    /// The caller promises the callbacks are async-signal-safe.
    pub signal_safe: bool,
    /// Reads.
    pub fill: FillFn,
    /// Writes (`None`: the store is read-only).
    pub write_back: Option<WriteFn>,
    /// Called once when the store is dropped.
    pub destroy: Option<DestroyFn>,
}

/// A [`PageStore`] over C callbacks. An errno a callback returns (positive
/// or negative) becomes a [`StoreError::Io`] with that errno, which
/// poisons the faulting page.
pub struct CallbackStore {
    cb: Callbacks,
    what: Arc<str>,
}

// SAFETY: the C APIs require the callbacks and `user` to be usable from any
// thread (documented in both headers).
unsafe impl Send for CallbackStore {}
// SAFETY: as above; the callbacks may run concurrently.
unsafe impl Sync for CallbackStore {}

impl CallbackStore {
    /// A store over `cb`, described as `what` in messages.
    pub fn new(cb: Callbacks, what: &str) -> CallbackStore {
        CallbackStore {
            cb,
            what: what.into(),
        }
    }

    fn failed(&self, op: &'static str, offset: u64, rc: c_int) -> StoreError {
        StoreError::Io {
            what: self.what.clone(),
            op,
            offset,
            errno: Errno(if rc < 0 { rc.saturating_neg() } else { rc }),
        }
    }

    /// Bytes of `want` at `offset` that are inside the store.
    fn inside(&self, offset: u64, want: usize) -> usize {
        match self.cb.len {
            Some(len) => len.saturating_sub(offset).min(want as u64) as usize,
            None => want,
        }
    }
}

impl Drop for CallbackStore {
    fn drop(&mut self) {
        if let Some(destroy) = self.cb.destroy {
            // SAFETY: the C side gave us `destroy` for `user`; called once.
            unsafe { destroy(self.cb.user) }
        }
    }
}

impl PageStore for CallbackStore {
    fn describe(&self) -> &str {
        &self.what
    }

    fn len(&self) -> Option<u64> {
        self.cb.len
    }

    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = self.inside(offset, buf.len());
        buf[n..].fill(0);
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `buf` is valid for `n` bytes; the callback writes at most
        // `len` bytes.
        let rc = unsafe { (self.cb.fill)(self.cb.user, offset, buf.as_mut_ptr(), n) };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.failed("fill callback", offset, rc))
        }
    }

    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let Some(write) = self.cb.write_back else {
            return Err(StoreError::ReadOnly {
                what: self.what.clone(),
                offset,
            });
        };
        let n = self.inside(offset, data.len());
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `data` is valid for `n` bytes and only read.
        let rc = unsafe { write(self.cb.user, offset, data.as_ptr(), n) };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.failed("write_back callback", offset, rc))
        }
    }

    fn signal_safe(&self) -> bool {
        self.cb.signal_safe
    }
}
