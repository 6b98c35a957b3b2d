//! UNIX sockets beyond what `std` offers: passing file descriptors
//! (`SCM_RIGHTS`), the peer's credentials (`SO_PEERCRED`) and process
//! (`SO_PEERPIDFD`), `poll` over any number of descriptors, and `kill`;
//! the service manager's side of systemd's protocol (`sd_notify`,
//! `sd_listen_fds`), written from `sd-daemon.c`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors one message may carry (more are closed by the kernel
/// and reported as truncated).
pub const MAX_FDS: usize = 8;

/// What one `recvmsg` returned.
#[derive(Debug)]
pub struct Received {
    /// Bytes of data.
    pub bytes: usize,
    /// Descriptors passed with `SCM_RIGHTS` (close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// The data did not fit the buffer (`MSG_TRUNC`).
    pub data_truncated: bool,
    /// The ancillary data did not fit (`MSG_CTRUNC`): descriptors were lost.
    pub control_truncated: bool,
}

const CMSG_SPACE: usize = {
    // CMSG_SPACE(MAX_FDS * sizeof(int)) on x86_64: header 16 + data, 8-aligned.
    16 + (MAX_FDS * 4).next_multiple_of(8)
};

#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_SPACE]);

/// `recvmsg(2)` on `fd` into `buf`, collecting `SCM_RIGHTS` descriptors.
/// `nonblocking`: `MSG_DONTWAIT`. EINTR is retried.
pub fn recv_with_fds(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    nonblocking: bool,
) -> io::Result<Received> {
    recvmsg_fds(fd, buf, nonblocking, false)
}

/// [`recv_with_fds`] with `MSG_PEEK`: the message stays queued, to be
/// read again. Linux installs *duplicates* of the descriptors it carries
/// (`unix_stream_read_generic` clones the message's file list with
/// `scm_fp_dup` when peeking), so the caller holds them while the message
/// still holds its own: a process that dies after a peek leaves the
/// message, descriptors and all, for the next reader of the socket.
pub fn peek_with_fds(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    nonblocking: bool,
) -> io::Result<Received> {
    recvmsg_fds(fd, buf, nonblocking, true)
}

fn recvmsg_fds(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    nonblocking: bool,
    peek: bool,
) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = CmsgBuf([0; CMSG_SPACE]);
    loop {
        // SAFETY: an all-zero msghdr is a valid "no name, no iov" header;
        // the fields we need are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = CMSG_SPACE;
        let mut flags = libc::MSG_CMSG_CLOEXEC;
        if nonblocking {
            flags |= libc::MSG_DONTWAIT;
        }
        if peek {
            flags |= libc::MSG_PEEK;
        }
        // SAFETY: `msg` points at a live iovec over `buf` and at `cbuf`,
        // both valid for the lengths given, for the call's duration.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        let mut fds = Vec::new();
        // SAFETY: `msg` was filled by the kernel; the CMSG_* macros walk
        // the control buffer within `msg_controllen`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let len = (*c).cmsg_len as usize - (data as usize - c as usize);
                    for i in 0..len / 4 {
                        let raw = std::ptr::read_unaligned(data.add(i * 4).cast::<RawFd>());
                        // The kernel installed this descriptor for us.
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        return Ok(Received {
            bytes: n as usize,
            fds,
            data_truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
            control_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
        });
    }
}

/// Sets `SO_PEEK_OFF` of `fd`: `Some(n)`: the next `MSG_PEEK` read starts
/// `n` bytes into the queue and each peek moves it on by what it read;
/// `None`: peeks start at the head (the default). A stream read stops at
/// the end of the data a descriptor was attached to, so a long message
/// sent with one is peeked in pieces this way.
pub fn set_peek_offset(fd: BorrowedFd<'_>, off: Option<usize>) -> io::Result<()> {
    let v: i32 = match off {
        Some(n) => i32::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        None => -1,
    };
    // SAFETY: setsockopt with a valid int option on a live fd; the value
    // pointer and length describe `v`.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEEK_OFF,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// `sendmsg(2)`: `data` with `fds` attached as `SCM_RIGHTS`.
pub fn send_with_fds(fd: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = CmsgBuf([0; CMSG_SPACE]);
    // SAFETY: see `recv_with_fds`; the control buffer is big enough for
    // `fds.len() <= MAX_FDS` descriptors.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let space = libc::CMSG_SPACE((fds.len() * 4) as u32) as usize;
            msg.msg_control = cbuf.0.as_mut_ptr().cast();
            msg.msg_controllen = space;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as usize;
            let data = libc::CMSG_DATA(c);
            for (i, f) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i * 4).cast::<RawFd>(), f.as_raw_fd());
            }
        }
        libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The credentials of a connected UNIX socket's peer (`SO_PEERCRED`), as
/// they were when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// `getsockopt(SO_PEERCRED)`.
pub fn peer_cred(fd: BorrowedFd<'_>) -> io::Result<PeerCred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are valid for writes of a `ucred`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: c.pid,
        uid: c.uid,
        gid: c.gid,
    })
}

/// `SO_PEERPIDFD` (Linux 6.5; not in libc yet): asm-generic's value.
const SO_PEERPIDFD: libc::c_int = 77;

/// The process at the other end of a connected UNIX socket, as a pidfd:
/// `getsockopt(SO_PEERPIDFD)` (the process that connected, race-free),
/// else (a kernel before 6.5) `pidfd_open` of `SO_PEERCRED`'s pid.
pub fn peer_pidfd(fd: BorrowedFd<'_>) -> io::Result<crate::process::Pidfd> {
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `pidfd` and `len` are valid for writes of an int.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 && pidfd >= 0 {
        // SAFETY: the kernel installed a new descriptor for us.
        let owned = unsafe { OwnedFd::from_raw_fd(pidfd) };
        return Ok(crate::process::Pidfd::from(owned));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOPROTOOPT) {
        return Err(e);
    }
    crate::process::Pidfd::open(peer_cred(fd)?.pid)
}

/// Sets a socket's receive buffer to `bytes`: `SO_RCVBUFFORCE` (needs
/// `CAP_NET_ADMIN`; exceeds `net.core.rmem_max`), else `SO_RCVBUF` (capped
/// by `rmem_max`). Returns the error of the last attempt.
pub fn set_rcvbuf(fd: BorrowedFd<'_>, bytes: i32) -> io::Result<()> {
    let mut last = io::Error::from_raw_os_error(libc::EINVAL);
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid int option on a live fd; the
        // value pointer and length describe `bytes`.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
        last = io::Error::last_os_error();
    }
    Err(last)
}

/// `recv(fd, buf, MSG_DONTWAIT)`: a receive that never waits for data
/// (`WouldBlock` when none is queued), whatever the socket's own mode.
pub fn recv_nowait(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length for the call.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `send(fd, buf, MSG_DONTWAIT | MSG_NOSIGNAL)`: a send that never waits
/// for buffer space (`WouldBlock` when the socket buffer is full) and never
/// raises `SIGPIPE`.
pub fn send_nowait(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of its length for the call.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
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

/// The first descriptor a service manager passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// `sd_pid_notify_with_fds(3)`, as `sd-daemon.c` does it, without
/// libsystemd: one datagram with `state` (newline-separated assignments,
/// e.g. `FDSTORE=1\nFDNAME=x`) and `fds` (`SCM_RIGHTS`) to the service
/// manager's socket `notify_socket` (`$NOTIFY_SOCKET`: a path, or `@name`
/// for the abstract namespace).
pub fn notify(notify_socket: &str, state: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use std::os::fd::AsFd;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let sock = UnixDatagram::unbound()?;
    match notify_socket.strip_prefix('@') {
        Some(name) => sock.connect_addr(&SocketAddr::from_abstract_name(name)?)?,
        None if notify_socket.starts_with('/') => sock.connect(notify_socket)?,
        None => return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
    }
    let sent = send_with_fds(sock.as_fd(), state.as_bytes(), fds)?;
    if sent != state.len() {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    }
    Ok(())
}

/// `sd_listen_fds_with_names(3)`, as `sd-daemon.c` does it: the
/// descriptors a service manager passed this process (`$LISTEN_PID` is
/// this process, `$LISTEN_FDS` of them from fd 3 on, named by the
/// colon-separated `$LISTEN_FDNAMES`, "unknown" when it has fewer names),
/// each made close-on-exec; the three variables are removed from the
/// environment. Empty when none were passed to this process. Takes the
/// descriptors once: a second call finds the variables gone.
pub fn listen_fds() -> io::Result<Vec<(String, OwnedFd)>> {
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let var = |k: &str| std::env::var(k).ok();
    let (Some(pid), Some(n)) = (var("LISTEN_PID"), var("LISTEN_FDS")) else {
        return Ok(Vec::new());
    };
    let names = var("LISTEN_FDNAMES").unwrap_or_default();
    for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
    let pid: u32 = pid.parse().map_err(|_| invalid())?;
    if pid != std::process::id() {
        return Ok(Vec::new());
    }
    let n: RawFd = n.parse().map_err(|_| invalid())?;
    if !(0..=4096).contains(&n) || TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Err(invalid());
    }
    let mut names = names.split(':');
    let mut out = Vec::new();
    for fd in LISTEN_FDS_START..LISTEN_FDS_START + n {
        // SAFETY: fcntl on a descriptor number; a closed one gives EBADF.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        // SAFETY: as above; sets only FD_CLOEXEC.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the service manager passed `fd` to this process
        // ($LISTEN_PID) and nothing else owns it: `TAKEN` makes this the
        // one place that takes it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = names.next().filter(|s| !s.is_empty()).unwrap_or("unknown");
        out.push((name.to_string(), owned));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;

    /// The inode a descriptor names.
    fn ino(fd: &OwnedFd) -> u64 {
        std::fs::File::from(fd.try_clone().unwrap())
            .metadata()
            .unwrap()
            .ino()
    }

    #[test]
    fn a_peek_installs_duplicates_and_leaves_the_message_with_its_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = crate::mem::memfd("peek-test", false).unwrap();
        send_with_fds(a.as_fd(), b"hello", &[file.as_fd()]).unwrap();
        let want = ino(&file);
        drop(file);
        let mut buf = [0u8; 16];
        let peeked = peek_with_fds(b.as_fd(), &mut buf, true).unwrap();
        assert_eq!(&buf[..peeked.bytes], b"hello");
        assert_eq!(peeked.fds.len(), 1, "the peek installs a descriptor");
        assert_eq!(ino(&peeked.fds[0]), want);
        // Closing what the peek gave leaves the message's own reference.
        drop(peeked);
        let again = peek_with_fds(b.as_fd(), &mut buf, true).unwrap();
        let got = recv_with_fds(b.as_fd(), &mut buf, true).unwrap();
        assert_eq!(&buf[..got.bytes], b"hello");
        assert_eq!(got.fds.len(), 1);
        assert_eq!(ino(&got.fds[0]), want);
        assert_ne!(
            again.fds[0].as_raw_fd(),
            got.fds[0].as_raw_fd(),
            "two installs, two descriptors"
        );
        let e = recv_with_fds(b.as_fd(), &mut buf, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "read once");
    }
}
