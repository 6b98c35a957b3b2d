//! The crate's only `libc` use: the iovec io_uring's buffer registration
//! takes (the kernel calls themselves go through the `io-uring` crate and
//! `faultline::sys`).

use std::io;

/// Registers `[addr, addr+len)` as fixed buffer 0 of `ring`.
///
/// # Safety
///
/// The memory must stay mapped until the buffers are unregistered or the
/// ring is dropped (the kernel pins it long-term).
pub(crate) unsafe fn register_buffer(
    ring: &io_uring::IoUring,
    addr: *mut u8,
    len: usize,
) -> io::Result<()> {
    let iov = libc::iovec {
        iov_base: addr.cast(),
        iov_len: len,
    };
    // SAFETY: the caller keeps the memory mapped for the registration's
    // lifetime; the iovec is valid for the call.
    unsafe { ring.submitter().register_buffers(&[iov]) }
}
