//! Step 1 of a connection: receive the hand-off.
//!
//! 1. Wait (at most the handshake timeout) for the peer's one message.
//! 2. `recvmsg` it: up to 1 MiB of JSON and exactly one descriptor
//!    attached with `SCM_RIGHTS` (a stream read stops where the
//!    descriptor was attached, about 36 KiB in: a longer handshake is read
//!    on until its JSON is whole). With `--takeover` it is *peeked*
//!    (`MSG_PEEK`: Linux installs duplicates of the descriptors and leaves
//!    the message queued), deposited with the keeper, and only then read
//!    off ([`consume`]): a serve that dies before leaves it on the
//!    connection the keeper holds, for the next serve to read again.
//! 3. Parse the JSON ([`handshake`](crate::handshake)) and adopt the
//!    descriptor as a userfaultfd whose `UFFDIO_API` its sender did.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use faultline::{ForeignError, ForeignRegionSpec, ForeignUffd, PeerBacking};
use faultline_sys::poll::{self, events, PollFd};
use faultline_sys::sock;

use crate::handshake::{self, HandshakeError};
use crate::summary::Handoff;

/// The largest handshake read (Firecracker's is about 100 bytes a
/// region).
const MAX_HANDSHAKE: usize = 1 << 20;

/// What the first read of a hand-off takes (a stream read ends where the
/// descriptor was attached anyway: at most about 36 KiB of it; the rest
/// of a longer handshake is read after, see [`receive`]).
const FIRST_READ: usize = 1 << 16;

/// A hand-off received.
pub struct Received {
    /// The peer's regions.
    pub specs: Vec<ForeignRegionSpec>,
    /// The backing its handshake declares, if any.
    pub declared: Option<PeerBacking>,
    /// Its userfaultfd.
    pub uffd: ForeignUffd,
    /// When its handshake was read.
    pub at: Instant,
    /// The handshake as it came (for the keeper).
    pub raw: String,
}

/// Serve has (about) as many descriptors open as its `RLIMIT_NOFILE`
/// allows: a hand-off's userfaultfd cannot be received.
#[derive(Debug, thiserror::Error)]
#[error(
    "serve is out of file descriptors ({} open, limit {limit}; a VMM takes 3, 7 with --takeover): raise serve's limit (LimitNOFILE= of its unit, ulimit -Hn){}",
    open.map_or("all".to_string(), |n| n.to_string()),
    during.as_ref().map_or(String::new(), |d| format!(" ({d})"))
)]
pub struct OutOfFds {
    /// Descriptors open below the limit (`None`: all, not even
    /// `/proc/self/fd` could be opened).
    pub open: Option<u64>,
    /// The soft limit.
    pub limit: u64,
    /// The step that ran out, as its error said.
    pub during: Option<String>,
}

impl OutOfFds {
    /// Descriptors this close to the limit count as out of them (another
    /// thread may have closed one since the failure).
    const MARGIN: u64 = 4;

    /// `Some` when this process is out of descriptors now.
    pub fn now() -> Option<OutOfFds> {
        let limit = faultline_sys::process::fd_limit().ok()?.soft;
        let open = match faultline_sys::process::fds_free() {
            Ok(free) if free <= Self::MARGIN => Some(limit - free),
            Ok(_) => return None,
            Err(e) if faultline_sys::process::out_of_fds(&e) => None,
            Err(_) => return None,
        };
        Some(OutOfFds {
            open,
            limit,
            during: None,
        })
    }

    /// Out of descriptors, as a failure just said (`during`): the counts
    /// now.
    pub fn said(during: Option<String>) -> OutOfFds {
        let limit = faultline_sys::process::fd_limit().map_or(0, |l| l.soft);
        OutOfFds {
            during,
            ..OutOfFds::now().unwrap_or(OutOfFds {
                open: None,
                limit,
                during: None,
            })
        }
    }
}

/// Whether `e` was caused by this process's descriptors running out
/// (`EMFILE`, `ENFILE` anywhere in its chain of sources).
pub fn out_of_fds(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut e = Some(e);
    while let Some(x) = e {
        if x.downcast_ref::<std::io::Error>()
            .is_some_and(faultline_sys::process::out_of_fds)
        {
            return true;
        }
        e = x.source();
    }
    false
}

/// Why a hand-off could not be received (each a refusal of the peer).
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// Nothing arrived in time.
    #[error("no handshake within {:.1}s", .0.as_secs_f64())]
    Silent(Duration),
    /// `recvmsg` failed.
    #[error("recvmsg failed: {0}")]
    Recv(#[source] std::io::Error),
    /// The peer closed the connection without a message.
    #[error("it hung up without a handshake")]
    HungUp,
    /// The message did not fit.
    #[error("the handshake is longer than 1 MiB")]
    TooLong,
    /// More descriptors than the ancillary buffer holds.
    #[error("it attached more descriptors than one (some were lost)")]
    DescriptorsLost,
    /// Serve is out of descriptors: the kernel dropped the userfaultfd
    /// attached (or the connection was accepted with the one serve
    /// keeps in reserve, [`OutOfFds`]).
    #[error(transparent)]
    OutOfFds(OutOfFds),
    /// Not exactly one descriptor.
    #[error("expected exactly one descriptor (the userfaultfd) attached with SCM_RIGHTS, got {0}")]
    Descriptors(usize),
    /// The JSON is not a handshake.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The descriptor is not a userfaultfd ready to serve.
    #[error(transparent)]
    Adopt(ForeignError),
}

/// Receives the hand-off on `conn`, waiting at most `wait` (`peek`: leaves
/// it queued, see the module docs); stamps `handoff.received_ns` and
/// `handoff.adopted_ns`.
pub fn receive(
    conn: &UnixStream,
    wait: Duration,
    handoff: &mut Handoff,
    peek: bool,
) -> Result<Received, ReceiveError> {
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    if !readable_within(conn, ms) {
        return Err(ReceiveError::Silent(wait));
    }
    let deadline = Instant::now() + wait;
    let mut buf = vec![0u8; FIRST_READ];
    // Peeks move on through the message (see `more`).
    let _peeking = match peek {
        true => Some(PeekFrom::start(conn).map_err(ReceiveError::Recv)?),
        false => None,
    };
    let got = read(conn, &mut buf, peek).map_err(ReceiveError::Recv)?;
    let at = Instant::now();
    handoff.received_ns = faultline_sys::monotonic_ns();
    if got.bytes == 0 && got.fds.is_empty() {
        return Err(ReceiveError::HungUp);
    }
    if got.data_truncated {
        return Err(ReceiveError::TooLong);
    }
    if got.control_truncated {
        // The kernel also truncates when it cannot install the
        // descriptors: serve at its limit.
        return Err(match OutOfFds::now() {
            Some(o) => ReceiveError::OutOfFds(o),
            None => ReceiveError::DescriptorsLost,
        });
    }
    let fd: OwnedFd = match <[OwnedFd; 1]>::try_from(got.fds) {
        Ok([fd]) => fd,
        Err(fds) => return Err(ReceiveError::Descriptors(fds.len())),
    };
    let mut len = got.bytes;
    // A handshake longer than the first read: the rest follows (a stream
    // read stops where the descriptor was attached).
    let hs = loop {
        match handshake::parse_handshake(&buf[..len]) {
            Err(e @ HandshakeError::Incomplete(_)) if len < MAX_HANDSHAKE => {
                let left = deadline.saturating_duration_since(Instant::now());
                let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
                if !readable_within(conn, ms) {
                    return Err(ReceiveError::Silent(wait));
                }
                if buf.len() == len {
                    buf.resize((2 * len).min(MAX_HANDSHAKE), 0);
                }
                let more = read(conn, &mut buf[len..], peek).map_err(ReceiveError::Recv)?;
                if !more.fds.is_empty() {
                    return Err(ReceiveError::Descriptors(1 + more.fds.len()));
                }
                if more.bytes == 0 {
                    // Hung up part way.
                    return Err(e.into());
                }
                len += more.bytes;
            }
            Err(HandshakeError::Incomplete(_)) => return Err(ReceiveError::TooLong),
            done => break done?,
        }
    };
    let uffd = ForeignUffd::adopt(fd).map_err(ReceiveError::Adopt)?;
    handoff.adopted_ns = faultline_sys::monotonic_ns();
    Ok(Received {
        specs: hs.regions,
        declared: hs.backing,
        uffd,
        at,
        raw: String::from_utf8_lossy(&buf[..len]).into_owned(),
    })
}

/// One read of a hand-off (`peek`: left queued) into `buf`, not waiting.
fn read(conn: &UnixStream, buf: &mut [u8], peek: bool) -> std::io::Result<sock::Received> {
    match peek {
        true => sock::peek_with_fds(conn.as_fd(), buf, true),
        false => sock::recv_with_fds(conn.as_fd(), buf, true),
    }
}

/// Peeks of a connection that move on through its queue (`SO_PEEK_OFF`
/// from 0), while it lives: a message longer than one read is peeked in
/// pieces; dropped, peeks start at the head again.
struct PeekFrom<'a>(&'a UnixStream);

impl<'a> PeekFrom<'a> {
    fn start(conn: &'a UnixStream) -> std::io::Result<PeekFrom<'a>> {
        sock::set_peek_offset(conn.as_fd(), Some(0))?;
        Ok(PeekFrom(conn))
    }
}

impl Drop for PeekFrom<'_> {
    fn drop(&mut self) {
        let _ = sock::set_peek_offset(self.0.as_fd(), None);
    }
}

/// Reads the hand-off peeked (`bytes` of it) off `conn`, closing the
/// descriptors this read installs (in as many reads as it takes).
pub fn consume(conn: &UnixStream, bytes: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; bytes];
    let mut done = 0;
    while done < bytes {
        let n = sock::recv_with_fds(conn.as_fd(), &mut buf[done..], true)?.bytes;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        done += n;
    }
    Ok(())
}

/// Reads `handshake` off `conn` if it is what is queued there (a hand-off
/// deposited by a serve that died before reading it off); anything else
/// is left.
pub fn consume_if(conn: &UnixStream, handshake: &[u8]) -> std::io::Result<()> {
    let mut buf = vec![0u8; handshake.len()];
    let peeking = PeekFrom::start(conn)?;
    let mut len = 0;
    while len < buf.len() {
        match sock::peek_with_fds(conn.as_fd(), &mut buf[len..], true) {
            Ok(got) if got.bytes > 0 => len += got.bytes,
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    drop(peeking);
    match len == handshake.len() && buf == handshake {
        true => consume(conn, handshake.len()),
        false => Ok(()),
    }
}

/// Whether `conn` has something to read (or hung up) within `ms`.
pub fn readable_within(conn: &UnixStream, ms: i32) -> bool {
    let mut fds = [PollFd {
        fd: conn.as_raw_fd(),
        events: events::IN,
        revents: 0,
    }];
    poll::poll(&mut fds, ms).is_ok_and(|r| r == 1)
}
