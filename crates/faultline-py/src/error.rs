//! faultline's errors as Python exceptions.
//!
//! A failure with an errno becomes `OSError(errno, message)` (Python picks
//! the subclass: `FileNotFoundError` for `ENOENT`, `PermissionError` for
//! `EACCES`, ...); a bad argument (an unaligned or zero length, a range
//! outside the region, a store too short or refused by the engine)
//! becomes `ValueError`. The errno of each `faultline::Error` is the one
//! the C libraries return ([`faultline_ffi::errno_of`]), so the three
//! front doors agree.

use faultline::store::StoreError;
use faultline::Error;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::PyErr;

/// The Python exception for a faultline error: `OSError` for a failure
/// of the system, the kernel's features or a store; `ValueError` for the
/// rest (a request the library refuses before asking the kernel).
pub fn region_error(e: Error) -> PyErr {
    let system = matches!(
        e,
        Error::Uffd(_)
            | Error::Mem(_)
            | Error::Io { .. }
            | Error::Store(_)
            | Error::Unsupported { .. }
            | Error::Overlap(_)
    );
    if system {
        os_error(faultline_ffi::errno_of(&e), e.to_string())
    } else {
        PyValueError::new_err(e.to_string())
    }
}

/// The Python exception for a store error.
pub fn store_error(e: StoreError) -> PyErr {
    os_error(faultline_ffi::store_errno(&e), e.to_string())
}

/// `OSError(errno, message)`.
pub fn os_error(errno: i32, message: String) -> PyErr {
    PyOSError::new_err((errno, message))
}

/// `OSError(errno, strerror, filename)` for an I/O error on `path`.
pub fn io_error(e: std::io::Error, path: &std::path::Path) -> PyErr {
    let errno = errno_in(&e).unwrap_or(faultline::error::Errno::EIO.0);
    PyOSError::new_err((errno, e.to_string(), path.display().to_string()))
}

/// The errno of `e` or of the first error in its chain that has one (an
/// `io::Error` wrapping a mapping's error keeps the kernel's errno there).
fn errno_in(e: &std::io::Error) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if let Some(n) = io.raw_os_error() {
                return Some(n);
            }
            if let Some(inner) = io.get_ref() {
                cur = Some(inner);
                continue;
            }
        }
        if let Some(m) = c.downcast_ref::<faultline::error::MemError>() {
            if let Some(n) = m.source.raw_os_error() {
                return Some(n);
            }
        }
        cur = c.source();
    }
    None
}
