//! The crate's only `libc` use: the iovec io_uring's buffer registration
//! takes, and the syscall backend's socket calls that must never wait
//! (`MSG_DONTWAIT` receives and sends, and the `poll` that waits for them
//! with a bound). The other kernel calls go through the `io-uring` crate
//! and `faultline::sys` (e.g. the CPU placement in [`crate::placement::KeepOff`]).

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

/// `recv(fd, buf, MSG_DONTWAIT)`: a receive that never waits for data
/// (`WouldBlock` when none is queued), whatever the socket's own mode.
pub(crate) fn recv_nowait(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length for the call.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `send(fd, buf, MSG_DONTWAIT | MSG_NOSIGNAL)`: a send that never waits
/// for buffer space (`WouldBlock` when the socket buffer is full).
pub(crate) fn send_nowait(fd: i32, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of its length for the call.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Readiness a waiting socket I/O needs.
pub(crate) const READABLE: i16 = libc::POLLIN;
/// See [`READABLE`].
pub(crate) const WRITABLE: i16 = libc::POLLOUT;

/// `poll()` on `(fd, events)` pairs for at most `timeout`; writes each
/// pair's revents into `revents` (EINTR counts as a timeout).
pub(crate) fn poll(
    fds: &[(i32, i16)],
    timeout: std::time::Duration,
    revents: &mut Vec<i16>,
) -> io::Result<()> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `p` holds `p.len()` initialised pollfds for the call.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    revents.clear();
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
        revents.resize(p.len(), 0);
        return Ok(());
    }
    revents.extend(p.iter().map(|x| x.revents));
    Ok(())
}
