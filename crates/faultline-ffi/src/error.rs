//! Errors across the ABI: a negative errno as the return value, and a
//! thread-local message the libraries hand out (`fl_last_error`).
//!
//! Every entry point runs in [`guard`], which catches panics (a panic must
//! never unwind into C) and records the message of a failure.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use faultline::store::StoreError;
use faultline::Error;
use faultline_sys::Errno;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure to report to C: the errno and the message.
#[derive(Debug)]
pub struct CError {
    /// A positive errno value.
    pub errno: i32,
    /// What failed.
    pub message: String,
}

impl CError {
    /// A failure with errno `errno`.
    pub fn new(errno: Errno, message: impl Into<String>) -> CError {
        CError {
            errno: errno.0,
            message: message.into(),
        }
    }

    /// The same failure, its message prefixed with `what`.
    pub fn context(mut self, what: &str) -> CError {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// `EINVAL` with a message.
    pub fn invalid(message: impl Into<String>) -> CError {
        CError::new(Errno::EINVAL, message)
    }
}

/// The errno a [`faultline::Error`] stands for.
pub fn errno_of(e: &Error) -> i32 {
    let io = |e: &std::io::Error| e.raw_os_error().unwrap_or(Errno::EIO.0);
    match e {
        Error::Unaligned { .. }
        | Error::ZeroLength
        | Error::LengthNotPageMultiple { .. }
        | Error::BadPageSize { .. }
        | Error::BudgetTooSmall { .. }
        | Error::OutOfRange { .. }
        | Error::StoreTooShort { .. }
        | Error::StoreNotSignalSafe { .. } => Errno::EINVAL.0,
        Error::Overlap(_) => Errno::EEXIST.0,
        Error::Unsupported { .. } => Errno::EOPNOTSUPP.0,
        Error::Uffd(e) => io(&e.source),
        Error::Mem(e) => io(&e.source),
        Error::Io { source, .. } => io(source),
        Error::Store(e) => store_errno(e),
    }
}

/// The errno a [`StoreError`] stands for.
pub fn store_errno(e: &StoreError) -> i32 {
    match e {
        StoreError::Io { errno, .. } => errno.0,
        StoreError::ReadOnly { .. } => Errno::EACCES.0,
        StoreError::Remote { .. } | StoreError::Failed { .. } => Errno::EIO.0,
    }
}

impl From<Error> for CError {
    fn from(e: Error) -> CError {
        CError {
            errno: errno_of(&e),
            message: e.to_string(),
        }
    }
}

impl From<std::io::Error> for CError {
    fn from(e: std::io::Error) -> CError {
        CError {
            errno: e.raw_os_error().unwrap_or(Errno::EIO.0),
            message: e.to_string(),
        }
    }
}

/// Records `message` as the calling thread's last error.
pub fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).expect("NULs were replaced");
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Runs `f`, catching panics. `Ok(v)` returns `v`; a failure records its
/// message and returns `-errno`; a panic returns `-EIO`.
pub fn guard<T: From<i32>>(what: &str, f: impl FnOnce() -> Result<T, CError>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&format!("{what}: {}", e.message));
            T::from(-e.errno)
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{what}: internal panic: {msg}"));
            T::from(-Errno::EIO.0)
        }
    }
}

/// Runs `f` (which cannot fail) catching panics; on a panic records it and
/// returns `fallback`.
pub fn guard_or<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_last_error(&format!("{what}: internal panic"));
            fallback
        }
    }
}

/// The calling thread's last error message as a C string: valid until
/// the next failure recorded on this thread.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// The calling thread's last error message.
pub fn last_error() -> String {
    LAST_ERROR.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// Reads a C string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, CError> {
    if p.is_null() {
        return Err(CError::invalid(format!("{what} is NULL")));
    }
    // SAFETY: by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CError::invalid(format!("{what} is not UTF-8")))
}
