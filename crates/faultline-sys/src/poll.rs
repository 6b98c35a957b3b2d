//! `poll(2)`: the one wrapper every crate waits on descriptors with.

use std::io;

/// Poll events.
pub mod events {
    /// Room to write.
    pub const OUT: i16 = libc::POLLOUT;
    /// Data to read.
    pub const IN: i16 = libc::POLLIN;
    /// The peer closed its end (or shut down writing).
    pub const RDHUP: i16 = libc::POLLRDHUP;
    /// Hang-up.
    pub const HUP: i16 = libc::POLLHUP;
    /// Error.
    pub const ERR: i16 = libc::POLLERR;
    /// Not an open descriptor.
    pub const NVAL: i16 = libc::POLLNVAL;
}

/// One entry of [`poll`]: laid out as the kernel's `struct pollfd`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PollFd {
    /// The descriptor (negative: ignored).
    pub fd: i32,
    /// Events asked for ([`events`]).
    pub events: i16,
    /// Events returned.
    pub revents: i16,
}

/// `poll(2)` over any number of descriptors; `timeout_ms` < 0 waits
/// forever. EINTR counts as a timeout (every `revents` is 0).
pub fn poll(fds: &mut [PollFd], timeout_ms: i32) -> io::Result<usize> {
    const _: () = assert!(std::mem::size_of::<PollFd>() == std::mem::size_of::<libc::pollfd>());
    // SAFETY: `PollFd` has the layout of `pollfd` (asserted above); the
    // kernel writes only `revents` of the `fds.len()` entries.
    let n = unsafe {
        libc::poll(
            fds.as_mut_ptr().cast(),
            fds.len() as libc::nfds_t,
            timeout_ms,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            fds.iter_mut().for_each(|f| f.revents = 0);
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// `poll()` on up to four descriptors, all for [`events::IN`], with a
/// timeout in ms; writes each one's revents into `revents`. EINTR counts
/// as a timeout.
pub fn poll_in(fds: &[i32], timeout_ms: i32, revents: &mut [i16]) -> io::Result<usize> {
    let mut p = [PollFd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 4];
    assert!(fds.len() <= p.len(), "poll_in takes at most 4 descriptors");
    for (slot, &fd) in p.iter_mut().zip(fds) {
        slot.fd = fd;
        slot.events = events::IN;
    }
    let n = poll(&mut p[..fds.len()], timeout_ms)?;
    for (r, slot) in revents.iter_mut().zip(p.iter()) {
        *r = slot.revents;
    }
    Ok(n)
}

/// Whether a `revents` value reports an error or a hang-up (`POLLERR`,
/// `POLLHUP`) rather than readiness.
pub fn failed(revents: i16) -> bool {
    revents & (events::ERR | events::HUP) != 0
}
