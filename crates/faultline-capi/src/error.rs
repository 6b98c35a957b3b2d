//! `fl_last_error` and `fl_version`; the errno/message machinery and the
//! panic guard are `faultline_ffi::error`, shared with libumap.

use std::ffi::c_char;

pub use faultline_ffi::error::*;

/// The calling thread's last error message: what the most recent failing
/// `fl_*` call on this thread said ("" if none failed yet). The pointer
/// stays valid until the next failing `fl_*` call on the same thread; copy
/// the string to keep it.
#[no_mangle]
pub extern "C" fn fl_last_error() -> *const c_char {
    guard_or("fl_last_error", std::ptr::null(), last_error_ptr)
}

/// The library's version, e.g. "0.1.0" (static storage).
#[no_mangle]
pub extern "C" fn fl_version() -> *const c_char {
    static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast()
}
