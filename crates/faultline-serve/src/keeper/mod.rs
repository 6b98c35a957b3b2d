//! Takeover (`--takeover`): a keeper process holds what the kernel does not
//! keep for a serve that dies, so a new serve started with the same
//! command serves its peers on.
//!
//! ```text
//!  serve ──spawns──► keeper (same program and arguments, FAULTLINE_SERVE_KEEPER=1;
//!    │                      abstract socket "faultline-serve-keeper-<hash of --socket>")
//!    ├─ attach ─────► held open: the keeper knows a serve is there
//!    ├─ deposit ────► per peer, before it is served: its handshake (JSON), pid,
//!    │                 connection number; SCM_RIGHTS: its userfaultfd, its
//!    │                 connection, its REMOVE journal (memfd, see `journal`)
//!    └─ forget ─────► a peer serve is done with
//!  kill -9 serve
//!  serve (same command) ─ attach, then take ─► each peer: the same three
//!    descriptors; it is built again (handshake parsed, backing chosen), its
//!    journal's ranges replayed (they read zeros), UFFDIO_WAKE over every
//!    region (the faults its predecessor read and never answered are raised
//!    again), and served on: pages already installed answer EEXIST.
//! ```
//!
//! Each request is one connection and one message each way (the reply to
//! `take` carries the descriptors), so no framing is needed. The keeper
//! never touches a peer's memory, reads no store and never blocks on a
//! peer: it polls the peers' connections for a hang-up (and drops those
//! entries) and its serve's attach connection. It exits when it has no
//! peer and no serve; when no serve attaches for `--timeout` it kills its
//! peers (unless `--leave-peer-on-error`) and exits, rather than leave them
//! hung forever.
//!
//! The ordering rule: a peer is deposited before the engine reads its
//! userfaultfd, and a REMOVE is journaled by the handler thread that read
//! it before its bookkeeping and before any later event or fault of that
//! peer is acted on. What remains: a serve killed between reading a REMOVE
//! and journaling it (one `read(2)` return to one store, a few
//! instructions) leaves that range to be served from the snapshot again
//! instead of zeros; one killed between adopting a handshake and depositing
//! it leaves that peer hung (its pages never come). Both need a kill in a
//! window of microseconds.

pub mod journal;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use faultline_sys::poll::{self, PollFd};
use faultline_sys::{process, sock};

pub use journal::Journal;

/// The environment variable that makes `faultline-serve` (and `faultline
/// serve`) run as the keeper of its `--socket`.
pub const KEEPER_ENV: &str = "FAULTLINE_SERVE_KEEPER";

/// The largest message (a handshake is at most 64 KiB).
const MAX_MESSAGE: usize = 1 << 18;

/// How long a request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A request to the keeper.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    /// A serve is there (the connection stays open).
    Attach { pid: u32 },
    /// A peer to hold (descriptors: userfaultfd, connection, journal).
    Deposit {
        n: usize,
        pid: i32,
        handshake: String,
    },
    /// The first peer held whose id is at least `next`.
    Take { next: u64 },
    /// Peer `id` is done with.
    Forget { id: u64 },
}

/// The keeper's reply.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Reply {
    /// The request was served (`take`: a peer follows).
    ok: bool,
    /// The peer's id.
    id: u64,
    /// Its connection number.
    n: usize,
    /// Its pid.
    pid: i32,
    /// Its handshake.
    handshake: String,
}

/// A peer taken from the keeper.
pub struct Taken {
    /// Its id at the keeper.
    pub id: u64,
    /// Its connection number (with the serve that deposited it).
    pub n: usize,
    /// Its pid.
    pub pid: i32,
    /// Its handshake (JSON).
    pub handshake: String,
    /// Its userfaultfd.
    pub uffd: OwnedFd,
    /// Its connection.
    pub conn: OwnedFd,
    /// Its REMOVE journal.
    pub journal: OwnedFd,
}

/// Why the keeper could not be reached or asked.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// Connecting, sending or receiving failed.
    #[error("talking to the keeper: {0}")]
    Io(#[from] std::io::Error),
    /// Its reply was not one.
    #[error("the keeper's reply: {0}")]
    Reply(#[from] serde_json::Error),
    /// It refused the request.
    #[error("the keeper refused the request")]
    Refused,
    /// Starting it failed, or it never answered.
    #[error("starting the keeper: {0}")]
    Start(String),
}

/// The keeper's abstract socket name for serve socket `socket`.
fn name(socket: &Path) -> std::io::Result<SocketAddr> {
    let abs = std::path::absolute(socket)?;
    // FNV-1a of the absolute path: abstract names are short.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in abs.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    SocketAddr::from_abstract_name(format!("faultline-serve-keeper-{h:016x}"))
}

/// Sends `req` with `fds` on `conn` and reads the reply (with descriptors).
fn exchange(
    conn: &UnixStream,
    req: &Request,
    fds: &[BorrowedFd<'_>],
) -> Result<(Reply, Vec<OwnedFd>), KeeperError> {
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let text = serde_json::to_vec(req)?;
    sock::send_with_fds(conn.as_fd(), &text, fds)?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let got = sock::recv_with_fds(conn.as_fd(), &mut buf, false)?;
    let reply: Reply = serde_json::from_slice(&buf[..got.bytes])?;
    Ok((reply, got.fds))
}

/// A serve's side of its keeper: its attach connection, and requests.
pub struct Keeper {
    addr: SocketAddr,
    _attached: UnixStream,
}

impl Keeper {
    /// Attaches to the keeper of `socket`, starting one (this program,
    /// these arguments, [`KEEPER_ENV`]) if none answers. Gives the peers
    /// it held (a serve before this one died): empty for a new keeper.
    pub fn join_or_start(socket: &Path) -> Result<(Keeper, Vec<Taken>), KeeperError> {
        let addr = name(socket)?;
        if let Some(k) = Keeper::attach(&addr)? {
            let taken = k.take_all()?;
            return Ok((k, taken));
        }
        let exe = std::env::current_exe()?;
        std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(KEEPER_ENV, "1")
            .env_remove(faultline_sys::failpoint::ENV)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| KeeperError::Start(e.to_string()))?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if let Some(k) = Keeper::attach(&addr)? {
                return Ok((k, Vec::new()));
            }
            if Instant::now() > deadline {
                return Err(KeeperError::Start(format!(
                    "no answer within {}s",
                    REQUEST_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn attach(addr: &SocketAddr) -> Result<Option<Keeper>, KeeperError> {
        let conn = match UnixStream::connect_addr(addr) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (reply, _) = exchange(
            &conn,
            &Request::Attach {
                pid: std::process::id(),
            },
            &[],
        )?;
        if !reply.ok {
            return Err(KeeperError::Refused);
        }
        Ok(Some(Keeper {
            addr: addr.clone(),
            _attached: conn,
        }))
    }

    fn request(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), KeeperError> {
        let conn = UnixStream::connect_addr(&self.addr)?;
        exchange(&conn, req, fds)
    }

    /// Deposits peer `n` (pid `pid`, `handshake`) with its userfaultfd,
    /// connection and journal; gives its id.
    pub fn deposit(
        &self,
        n: usize,
        pid: i32,
        handshake: &str,
        fds: [BorrowedFd<'_>; 3],
    ) -> Result<u64, KeeperError> {
        let req = Request::Deposit {
            n,
            pid,
            handshake: handshake.into(),
        };
        match self.request(&req, &fds)? {
            (Reply { ok: true, id, .. }, _) => Ok(id),
            _ => Err(KeeperError::Refused),
        }
    }

    /// Tells the keeper peer `id` is done with.
    pub fn forget(&self, id: u64) -> Result<(), KeeperError> {
        self.request(&Request::Forget { id }, &[]).map(drop)
    }

    /// Every peer it holds.
    fn take_all(&self) -> Result<Vec<Taken>, KeeperError> {
        let mut out = Vec::new();
        let mut next = 0;
        loop {
            let (r, fds) = self.request(&Request::Take { next }, &[])?;
            if !r.ok {
                return Ok(out);
            }
            let [uffd, conn, journal] =
                <[OwnedFd; 3]>::try_from(fds).map_err(|_| KeeperError::Refused)?;
            next = r.id + 1;
            out.push(Taken {
                id: r.id,
                n: r.n,
                pid: r.pid,
                handshake: r.handshake,
                uffd,
                conn,
                journal,
            });
        }
    }
}

/// The keeper's lines on stderr.
fn say(msg: std::fmt::Arguments<'_>) {
    eprintln!("faultline serve keeper: {msg}");
}

/// A peer the keeper holds.
struct Held {
    id: u64,
    n: usize,
    pid: i32,
    handshake: String,
    fds: [OwnedFd; 3],
    /// The process at the other end of its connection (`SO_PEERPIDFD`):
    /// the kill goes through it, never to a process that got its pid
    /// later.
    pidfd: Option<process::Pidfd>,
}

/// Runs the keeper of `socket` (see the module docs) until it has no peer
/// and no serve, or no serve attached for `wait` (then its peers are
/// killed unless `leave`).
pub fn run(socket: &Path, wait: Duration, leave: bool) -> Result<(), KeeperError> {
    let addr = name(socket)?;
    let listener = match UnixListener::bind_addr(&addr) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            say(format_args!("another keeper holds {}", socket.display()));
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    listener.set_nonblocking(true)?;
    say(format_args!(
        "pid {} keeps the peers of {}",
        std::process::id(),
        socket.display()
    ));
    let mut held: Vec<Held> = Vec::new();
    let mut serve: Option<(UnixStream, u32)> = None;
    let mut alone_since = Instant::now();
    let mut next_id = 1u64;
    loop {
        let mut fds = vec![PollFd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
            events: poll::events::IN,
            revents: 0,
        }];
        let watch = |fd: i32| PollFd {
            fd,
            events: poll::events::RDHUP,
            revents: 0,
        };
        fds.extend(
            serve
                .iter()
                .map(|(c, _)| watch(std::os::fd::AsRawFd::as_raw_fd(c))),
        );
        fds.extend(
            held.iter()
                .map(|h| watch(std::os::fd::AsRawFd::as_raw_fd(&h.fds[1]))),
        );
        let _ = poll::poll(&mut fds, 200);
        let gone = |r: i16| r & (poll::events::RDHUP | poll::events::HUP | poll::events::ERR) != 0;
        let mut i = 1;
        if let Some((_, pid)) = &serve {
            if gone(fds[i].revents) {
                say(format_args!(
                    "serve pid {pid} is gone; holding {} peer(s) for the next serve of {}",
                    held.len(),
                    socket.display()
                ));
                serve = None;
                alone_since = Instant::now();
            }
            i += 1;
        }
        let mut k = 0;
        held.retain(|h| {
            let keep = !gone(fds[i + k].revents);
            k += 1;
            if !keep {
                say(format_args!("peer {} (pid {}) hung up", h.n, h.pid));
            }
            keep
        });
        while let Ok((conn, _)) = listener.accept() {
            if let Err(e) = serve_request(conn, &mut held, &mut serve, &mut next_id) {
                say(format_args!("a request failed: {e}"));
            }
        }
        if serve.is_none() && held.is_empty() {
            say(format_args!("no peer and no serve: exiting"));
            return Ok(());
        }
        if serve.is_none() && alone_since.elapsed() > wait {
            say(format_args!(
                "no serve for {:.1}s: {} its {} peer(s) and exiting",
                wait.as_secs_f64(),
                if leave { "leaving" } else { "killing" },
                held.len()
            ));
            for h in held.iter().filter(|_| !leave) {
                let _ = match &h.pidfd {
                    Some(p) => p.send_signal(process::SIGKILL),
                    None => process::kill(h.pid, process::SIGKILL),
                };
            }
            return Ok(());
        }
    }
}

/// Serves one request on `conn`.
fn serve_request(
    conn: UnixStream,
    held: &mut Vec<Held>,
    serve: &mut Option<(UnixStream, u32)>,
    next_id: &mut u64,
) -> Result<(), KeeperError> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let got = sock::recv_with_fds(conn.as_fd(), &mut buf, false)?;
    let req: Request = serde_json::from_slice(&buf[..got.bytes])?;
    let mut reply = Reply {
        ok: true,
        ..Default::default()
    };
    let mut send: Vec<BorrowedFd<'_>> = Vec::new();
    match req {
        Request::Attach { pid } => {
            send_reply(&conn, &reply, &[])?;
            say(format_args!("serve pid {pid} attached"));
            *serve = Some((conn, pid));
            return Ok(());
        }
        Request::Deposit { n, pid, handshake } => {
            let fds = <[OwnedFd; 3]>::try_from(got.fds).map_err(|_| KeeperError::Refused)?;
            reply.id = *next_id;
            *next_id += 1;
            let pidfd = sock::peer_pidfd(fds[1].as_fd()).ok();
            held.push(Held {
                id: reply.id,
                n,
                pid,
                handshake,
                fds,
                pidfd,
            });
        }
        Request::Forget { id } => held.retain(|h| h.id != id),
        Request::Take { next } => match held.iter().find(|h| h.id >= next) {
            Some(h) => {
                reply.id = h.id;
                reply.n = h.n;
                reply.pid = h.pid;
                reply.handshake = h.handshake.clone();
                send = h.fds.iter().map(|f| f.as_fd()).collect();
            }
            None => reply.ok = false,
        },
    }
    send_reply(&conn, &reply, &send)
}

fn send_reply(conn: &UnixStream, reply: &Reply, fds: &[BorrowedFd<'_>]) -> Result<(), KeeperError> {
    sock::send_with_fds(conn.as_fd(), &serde_json::to_vec(reply)?, fds)?;
    Ok(())
}
