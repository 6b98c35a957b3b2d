//! Takeover (`--takeover`): a keeper process holds what the kernel does not
//! keep for a serve that dies, so a new serve started with the same
//! command serves its peers on.
//!
//! ```text
//!  serve ──spawns──► keeper (same program, no arguments, FAULTLINE_SERVE_KEEPER=spec;
//!    │                      abstract socket "faultline-serve-keeper-<hash of --socket>")
//!    ├─ attach ─────► held open: the keeper knows a serve is there
//!    ├─ listen ─────► SCM_RIGHTS: serve's listening socket (connections queue
//!    │                 on it while no serve runs)
//!    │  accept()
//!    ├─ deposit ────► right after accept: the connection, its number, pid
//!    │  recvmsg(MSG_PEEK): the hand-off, left queued (Linux installs dups
//!    │                     of the descriptors of a peeked message)
//!    ├─ hand ───────► the hand-off (JSON); SCM_RIGHTS: its userfaultfd, its
//!    │                 journal (memfd, see `journal`)
//!    │  recvmsg: the hand-off read off the connection; the peer served
//!    └─ forget ─────► a peer serve is done with
//!  kill -9 serve
//!  serve (same command) ─ attach (→ the listener), then take ─► each peer:
//!    its connection; handed: its userfaultfd and journal too. Not handed:
//!    its hand-off is read again off the connection. Handed: it is built
//!    again (handshake parsed, backing chosen), its hand-off read off the
//!    connection if still there, its journal's ranges replayed (they read
//!    zeros), UFFDIO_WAKE over every region (the faults its predecessor
//!    read and never answered are raised again), and served on: pages
//!    already installed answer EEXIST.
//! ```
//!
//! Each request is one connection and one message each way (the replies
//! to `attach` and `take` carry the descriptors), so no framing is needed (a message is read until its JSON is whole: a stream read stops where descriptors were attached).
//! A message sent survives its sender: a serve killed after its `sendmsg`
//! still deposits. The keeper never touches a peer's memory, reads no
//! store, never accepts on serve's listener while a serve is attached, and
//! never blocks on a peer: it polls the peers' connections for a hang-up
//! (and drops those entries) and its serve's attach connection. It exits
//! when it has no peer, no serve and no connection queued on the listener;
//! when no serve attaches for `--keeper-wait` it kills its peers and the
//! VMMs queued on the listener (unless `--leave-peer-on-error`) and exits,
//! rather than leave them hung forever.
//!
//! The ordering rule: the listener is deposited before the first accept;
//! a connection right after its accept; a hand-off (peeked) before it is
//! read off and before the engine reads its userfaultfd; a REMOVE is
//! journaled by the handler thread that read it before its bookkeeping
//! and before any later event or fault of the peer is acted on. What
//! remains: a serve killed between `accept` returning a connection and its
//! deposit being sent loses that connection (its VMM hangs, as without
//! takeover); one killed between reading a REMOVE and journaling it (one
//! `read(2)` return to one store) leaves that range to be served from the
//! snapshot again instead of zeros. Both need a kill in a window of
//! microseconds. A keeper that dies is replaced, and while none can be
//! started serve keeps what it would deposit (see [`Linked`]).

pub mod fdstore;
pub mod journal;
mod taken;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use faultline_sys::poll::{self, PollFd};
use faultline_sys::thread::EventFd;
use faultline_sys::{process, sock};

pub use fdstore::FdStore;
pub use journal::Journal;
pub use taken::{Handed, Joined, KeeperError, Taken};

/// The environment variable that makes `faultline-serve` (and
/// `faultline`) run as a keeper, and says what it keeps ([`Spec`]).
pub const KEEPER_ENV: &str = "FAULTLINE_SERVE_KEEPER";

/// The keeper process's whole command line (`ps`, `pgrep -a` show it).
pub const KEEPER_ARG0: &str = "faultline-serve-keeper";

/// The keeper process's name (`/proc/PID/comm`: `ps`, `pgrep` and
/// `pkill` without `-f`); a name is at most 15 bytes, and the first 15 of
/// [`KEEPER_ARG0`] are serve's own name.
pub const KEEPER_COMM: &std::ffi::CStr = c"fl-serve-keeper";

/// What a keeper keeps, passed in [`KEEPER_ENV`] (not on its command line:
/// see [`Keeper::start`]) as `WAIT_MS:LEAVE:SOCKET` (`LEAVE` 0 or 1; the
/// socket's absolute path last, any bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The serve socket whose peers it keeps.
    pub socket: std::path::PathBuf,
    /// How long it waits for a serve before it gives its peers up.
    pub wait: Duration,
    /// Give them up by leaving them (`--leave-peer-on-error`), not by
    /// killing them.
    pub leave: bool,
}

impl Spec {
    /// The keeper of `socket` (made absolute: the keeper's name is the
    /// absolute path's hash) that waits `wait`, then `leave`s or kills.
    pub fn new(socket: &Path, wait: Duration, leave: bool) -> std::io::Result<Spec> {
        Ok(Spec {
            socket: std::path::absolute(socket)?,
            wait,
            leave,
        })
    }

    /// The value of [`KEEPER_ENV`] for this keeper.
    pub fn to_env(&self) -> std::ffi::OsString {
        // Whole milliseconds, rounded up: a wait is never shortened to 0.
        let mut v = std::ffi::OsString::from(format!(
            "{}:{}:",
            self.wait.as_nanos().div_ceil(1_000_000),
            u8::from(self.leave)
        ));
        v.push(&self.socket);
        v
    }

    /// Reads a value of [`KEEPER_ENV`].
    pub fn from_env(v: &std::ffi::OsStr) -> Result<Spec, KeeperError> {
        use std::os::unix::ffi::OsStrExt;
        let bad = || KeeperError::Start(format!("{KEEPER_ENV}={v:?}: not WAIT_MS:LEAVE:SOCKET"));
        let mut parts = v.as_bytes().splitn(3, |b| *b == b':');
        let mut field = || parts.next().ok_or_else(bad);
        let (wait, leave, socket) = (field()?, field()?, field()?);
        let wait: u64 = std::str::from_utf8(wait)
            .ok()
            .and_then(|w| w.parse().ok())
            .ok_or_else(bad)?;
        let leave = match leave {
            b"0" => false,
            b"1" => true,
            _ => return Err(bad()),
        };
        if socket.is_empty() {
            return Err(bad());
        }
        Ok(Spec {
            socket: std::ffi::OsStr::from_bytes(socket).into(),
            wait: Duration::from_millis(wait),
            leave,
        })
    }

    /// The keeper this process was started as ([`KEEPER_ENV`] set), or
    /// `None`.
    pub fn of_this_process() -> Option<Result<Spec, KeeperError>> {
        std::env::var_os(KEEPER_ENV).map(|v| Spec::from_env(&v))
    }
}

/// How often the keeper watcher looks again at the link (ms): a keeper's
/// death and the link's drop wake it at once.
const WATCH_MS: i32 = 500;

/// How long after a failed start of a keeper another is tried (by the
/// watcher, or a request if the watcher is not running); the wait doubles
/// after each failure, up to [`RETRY_MAX`] (each try starts a process).
const RETRY: Duration = Duration::from_secs(1);

/// The longest wait between two tries to start a keeper.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The largest message (a handshake is at most 1 MiB).
const MAX_MESSAGE: usize = 1 << 21;

/// How long a request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A request to the keeper.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    /// A serve is there (the connection stays open); refused while
    /// another serve is attached.
    Attach { pid: u32 },
    /// Hold serve's listening socket (descriptor: the listener), bound at a
    /// path whose (device, inode) are `dev`, `ino`.
    Listen { dev: u64, ino: u64 },
    /// A connection just accepted, numbered `n`, from `pid` (descriptor:
    /// the connection); its hand-off is still queued on it.
    Deposit { n: usize, pid: i32 },
    /// Connection `id`'s hand-off, read with `MSG_PEEK` (descriptors: its
    /// userfaultfd, its journal).
    Hand { id: u64, handshake: String },
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
    /// Its connection number (`attach`: the highest number deposited).
    n: usize,
    /// Its pid (`attach` refused: the pid of the serve attached).
    pid: i32,
    /// Its handshake (`take` of a peer whose hand-off was deposited).
    handshake: Option<String>,
    /// `attach`: the listener held (its descriptor follows), bound at the
    /// path whose (device, inode) these are.
    listener: Option<(u64, u64)>,
}

/// The keeper's abstract socket name for serve socket `socket` (`ss -xl`
/// lists it as `@faultline-serve-keeper-...`).
pub fn address(socket: &Path) -> std::io::Result<SocketAddr> {
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
    match recv_message(conn)? {
        Some(reply) => Ok(reply),
        // Closed without a reply: the keeper died mid-request.
        None => Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
    }
}

/// Reads one message from `conn` (blocking, within its read timeout):
/// its descriptors come with its first bytes, and a message longer than
/// one read (a stream read stops where descriptors were attached, about
/// 36 KiB in) is read on until its JSON is whole. `None`: closed first.
fn recv_message<T: serde::de::DeserializeOwned>(
    conn: &UnixStream,
) -> Result<Option<(T, Vec<OwnedFd>)>, KeeperError> {
    let mut buf = vec![0u8; 1 << 16];
    let first = sock::recv_with_fds(conn.as_fd(), &mut buf, false)?;
    if first.bytes == 0 {
        return Ok(None);
    }
    let mut len = first.bytes;
    loop {
        match serde_json::from_slice(&buf[..len]) {
            Ok(m) => return Ok(Some((m, first.fds))),
            Err(e) if e.is_eof() && len < MAX_MESSAGE => {
                if buf.len() == len {
                    buf.resize((2 * len).min(MAX_MESSAGE), 0);
                }
                let more = sock::recv_with_fds(conn.as_fd(), &mut buf[len..], false)?;
                if more.bytes == 0 {
                    return Err(e.into());
                }
                len += more.bytes;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A serve's side of its keeper: the keeper process or systemd's
/// file-descriptor store.
pub enum Keeper {
    /// The keeper process (replaced if it dies: see [`Linked`]).
    Process(Arc<Linked>),
    /// systemd's file-descriptor store (`--fd-store`).
    FdStore(FdStore),
}

/// The keeper as serve sees it (a metrics scrape).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeeperStatus {
    /// It is gone and none could be started in its place: the peers are
    /// served on, but would hang should this serve die.
    pub down: bool,
    /// Keepers started in place of dead ones.
    pub replaced: u64,
    /// Peers deposited (held by the keeper, or by the link while down).
    pub peers: usize,
    /// The peers it has room for (systemd's store, when `$FDSTORE` says;
    /// `None`: no limit known).
    pub room: Option<usize>,
}

/// Serve's link to its keeper process. A keeper that dies while serve
/// runs (an operator's `kill`, the OOM killer) is replaced as soon as a
/// watcher thread sees its end of the attach connection close, or by the
/// first request that finds it gone: another keeper is started and attached,
/// and given again what the dead one held for this serve (the listener,
/// every peer's connection and hand-off: the link keeps a duplicate of
/// each descriptor it deposited), then the request goes to it. The ids
/// the link gives serve are its own, so they stay valid across
/// replacements; the link maps each to the current keeper's. Every
/// request runs under the link's lock, a replacement included, so none
/// is sent to a keeper the replacement has not given everything to.
///
/// When no keeper can be started in a dead one's place (its name taken,
/// `fork` failing), the link is *down*: requests are not sent, peers are
/// still deposited and handed with the link (their descriptors kept, their
/// REMOVEs journaled), and the watcher tries another keeper after 1 s,
/// then at doubling intervals up to 5 s; the first that starts is given
/// everything, so a VMM that
/// connected meanwhile is protected from then on, not left served without
/// takeover for good.
pub struct Linked {
    addr: SocketAddr,
    spec: Spec,
    notice: fn(std::fmt::Arguments<'_>),
    link: Mutex<Link>,
    /// What [`Keeper::status`] last read of the link.
    last_status: Mutex<KeeperStatus>,
    /// Ends the watcher thread when the link is dropped (so the attach
    /// connection it polls closes with the link).
    stop: Arc<EventFd>,
}

impl Drop for Linked {
    fn drop(&mut self) {
        self.stop.notify();
    }
}

/// The keeper process serve is attached to now, and what it holds for
/// this serve.
struct Link {
    /// Held open: "a serve is there".
    _attached: UnixStream,
    /// The keeper process when this serve started it (reaped once dead).
    child: Option<std::process::Child>,
    /// The listener the keeper holds (a duplicate), and its path's
    /// identity.
    listener: Option<(OwnedFd, (u64, u64))>,
    /// The peers it holds, by the link's id.
    deposited: BTreeMap<u64, Deposited>,
    /// The next link id.
    next: u64,
    /// Keepers replaced so far.
    replaced: u64,
    /// The keeper is gone and starting another failed: why, when it was
    /// last tried, and the wait before the next try. What `deposited`
    /// holds waits for the next keeper.
    down: Option<(String, Instant, Duration)>,
}

/// A peer the keeper holds for this serve, as deposited (duplicates of
/// the descriptors).
struct Deposited {
    /// Its id at the current keeper (none while the link is down).
    local: u64,
    n: usize,
    pid: i32,
    conn: OwnedFd,
    /// Its handshake, userfaultfd and journal, once handed.
    handed: Option<(String, [OwnedFd; 2])>,
}

impl Linked {
    fn new(
        addr: SocketAddr,
        spec: Spec,
        notice: fn(std::fmt::Arguments<'_>),
        (attached, child): (UnixStream, Option<std::process::Child>),
    ) -> Result<Linked, KeeperError> {
        Ok(Linked {
            addr,
            spec,
            notice,
            stop: Arc::new(EventFd::new()?),
            last_status: Mutex::default(),
            link: Mutex::new(Link {
                _attached: attached,
                child,
                listener: None,
                deposited: BTreeMap::new(),
                next: 1,
                replaced: 0,
                down: None,
            }),
        })
    }

    /// Shares `linked` with a watcher thread that replaces the keeper as
    /// soon as it dies (its end of the attach connection closes), so the
    /// peers it held are protected again without waiting for a request,
    /// and that tries again while the link is down (after [`RETRY`], the
    /// wait doubling up to [`RETRY_MAX`]). The thread ends when the link
    /// is dropped.
    fn watched(linked: Linked) -> Arc<Linked> {
        let linked = Arc::new(linked);
        let weak = Arc::downgrade(&linked);
        let stop = linked.stop.clone();
        let watch = move || loop {
            // Up: the keeper's end of the attach connection is watched;
            // down: only the stop, until the next try is due.
            let Some((attached, seen, wait)) = weak.upgrade().map(|l| {
                let link = l.link.lock().expect("keeper link");
                match &link.down {
                    None => (Some(link._attached.try_clone()), link.replaced, WATCH_MS),
                    Some((_, at, wait)) => {
                        let left = wait.saturating_sub(at.elapsed()).as_millis();
                        (None, link.replaced, left.clamp(1, i32::MAX as u128) as i32)
                    }
                }
            }) else {
                return;
            };
            let mut fds = [
                PollFd {
                    fd: stop.raw(),
                    events: poll::events::IN,
                    revents: 0,
                },
                PollFd {
                    fd: match &attached {
                        Some(Ok(a)) => std::os::fd::AsRawFd::as_raw_fd(a),
                        _ => -1,
                    },
                    events: poll::events::RDHUP,
                    revents: 0,
                },
            ];
            if poll::poll(&mut fds, wait).is_err() || fds[0].revents != 0 {
                return;
            }
            if attached.is_some() && fds[1].revents == 0 {
                continue;
            }
            let Some(l) = weak.upgrade() else { return };
            let mut link = l.link.lock().expect("keeper link");
            // A request may have replaced it already.
            if link.replaced == seen && l.due(&link) {
                let _ = l.replace(&mut link);
            }
        };
        // Without the thread, a request still replaces a dead keeper.
        let _ = std::thread::Builder::new()
            .name("fl-keeper-watch".into())
            .spawn(watch);
        linked
    }

    /// Whether another keeper should be tried now: the link is up (the
    /// keeper just found dead), or its wait since the last try is over.
    fn due(&self, link: &Link) -> bool {
        link.down
            .as_ref()
            .is_none_or(|(_, at, wait)| at.elapsed() >= *wait)
    }

    /// Sends the request `req` builds (from the link: ids may change with
    /// a replacement) with `fds` to the keeper, replacing a dead one
    /// first; its reply.
    fn request(
        &self,
        link: &mut Link,
        req: impl Fn(&Link) -> Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Reply, KeeperError> {
        if let Some((why, ..)) = &link.down {
            if !self.due(link) {
                return Err(KeeperError::Down(why.clone()));
            }
            self.replace(link)?;
            return self.send(&req(link), fds);
        }
        match self.send(&req(link), fds) {
            // Nothing listens on the keeper's name, or it died during the
            // request (its attach connection closed with it): it is gone.
            // A request it took before dying goes again to the one started
            // in its place, with everything it held.
            Err(KeeperError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                self.replace(link)?;
                self.send(&req(link), fds)
            }
            Err(KeeperError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::UnexpectedEof
                ) && hung_up(link._attached.as_fd()) =>
            {
                self.replace(link)?;
                self.send(&req(link), fds)
            }
            done => done,
        }
    }

    /// One request to the keeper attached now (no replacement).
    fn send(&self, req: &Request, fds: &[BorrowedFd<'_>]) -> Result<Reply, KeeperError> {
        let conn = UnixStream::connect_addr(&self.addr)?;
        match exchange(&conn, req, fds)? {
            (Reply { ok: false, .. }, _) => Err(KeeperError::Refused),
            (reply, _) => Ok(reply),
        }
    }

    /// Starts and attaches another keeper and gives it what the dead one
    /// held for this serve (and what was deposited while the link was
    /// down); on failure the link is down (said once) and the error is
    /// [`KeeperError::Down`].
    fn replace(&self, link: &mut Link) -> Result<(), KeeperError> {
        let socket = self.spec.socket.display();
        match self.start_another(link) {
            Ok(pid) => {
                match link.down.take() {
                    None => (self.notice)(format_args!(
                        "the keeper of {socket} is gone (killed?): started another, pid {pid}, and deposited with it the {} peer(s) the dead one held",
                        link.deposited.len()
                    )),
                    Some(_) => (self.notice)(format_args!(
                        "started a keeper of {socket} at last, pid {pid}, and deposited with it the {} peer(s) served meanwhile: a kill of this serve leaves them to the next again",
                        link.deposited.len()
                    )),
                }
                Ok(())
            }
            Err(e) => {
                let why = e.to_string();
                let wait = match &link.down {
                    Some((.., wait)) => (*wait * 2).min(RETRY_MAX),
                    None => {
                        (self.notice)(format_args!(
                            "replacing the keeper of {socket} failed: {why}; trying again after {}s, then at longer intervals up to {}s; until one starts, VMMs are served on, but should this serve die they hang",
                            RETRY.as_secs(),
                            RETRY_MAX.as_secs()
                        ));
                        RETRY
                    }
                };
                link.down = Some((why.clone(), Instant::now(), wait));
                Err(KeeperError::Down(why))
            }
        }
    }

    /// Starts and attaches another keeper and gives it everything the link
    /// holds; its pid. One that fails half way is killed (it holds
    /// nothing the link does not, and would keep the name from the next).
    fn start_another(&self, link: &mut Link) -> Result<u32, KeeperError> {
        if let Some(dead) = link.child.as_mut() {
            // Reaped: no zombie left behind.
            let _ = dead.try_wait();
        }
        let mut child = spawn(&self.spec)?;
        let pid = child.id();
        let given = attach_within(&self.addr).and_then(|(attached, _, _)| {
            link._attached = attached;
            self.give_all(link)
        });
        if let Err(e) = given {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        link.child = Some(child);
        link.replaced += 1;
        Ok(pid)
    }

    /// Gives the keeper just attached the listener and every peer the link
    /// holds.
    fn give_all(&self, link: &mut Link) -> Result<(), KeeperError> {
        if let Some((fd, (dev, ino))) = &link.listener {
            self.send(
                &Request::Listen {
                    dev: *dev,
                    ino: *ino,
                },
                &[fd.as_fd()],
            )?;
        }
        for d in link.deposited.values_mut() {
            let (n, pid) = (d.n, d.pid);
            d.local = self
                .send(&Request::Deposit { n, pid }, &[d.conn.as_fd()])?
                .id;
            if let Some((handshake, [uffd, journal])) = &d.handed {
                let req = Request::Hand {
                    id: d.local,
                    handshake: handshake.clone(),
                };
                self.send(&req, &[uffd.as_fd(), journal.as_fd()])?;
            }
        }
        Ok(())
    }

    /// Registers a peer the keeper holds under keeper id `local`; its link
    /// id.
    fn register(link: &mut Link, local: u64, n: usize, pid: i32, conn: OwnedFd) -> u64 {
        let id = link.next;
        link.next += 1;
        link.deposited.insert(
            id,
            Deposited {
                local,
                n,
                pid,
                conn,
                handed: None,
            },
        );
        id
    }
}

/// Starts a keeper process for `spec`.
fn spawn(spec: &Spec) -> Result<std::process::Child, KeeperError> {
    std::process::Command::new(own_exe()?)
        .arg0(KEEPER_ARG0)
        .env(KEEPER_ENV, spec.to_env())
        .env(
            crate::log::ENV,
            if crate::log::is_json() {
                "json"
            } else {
                "text"
            },
        )
        .env_remove(faultline_sys::failpoint::ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| KeeperError::Start(e.to_string()))
}

/// The executable a keeper runs: this process's own, through
/// `/proc/self/exe`, which names the running binary even once an upgrade
/// has replaced or deleted the file serve was started from (a keeper must
/// speak this serve's protocol, and the path may hold another version or
/// nothing); the path where /proc is not mounted.
fn own_exe() -> std::io::Result<std::path::PathBuf> {
    let running = Path::new("/proc/self/exe");
    if running.exists() {
        return Ok(running.into());
    }
    std::env::current_exe()
}

/// Attaches to the keeper at `addr`, waiting up to [`REQUEST_TIMEOUT`]
/// for one just started to listen.
fn attach_within(addr: &SocketAddr) -> Result<(UnixStream, Reply, Vec<OwnedFd>), KeeperError> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    loop {
        if let Some(attached) = attach(addr)? {
            return Ok(attached);
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

/// Attaches to the keeper at `addr`: its attach connection (held open:
/// "a serve is there"), its reply and descriptors. `None`: no keeper.
fn attach(addr: &SocketAddr) -> Result<Option<(UnixStream, Reply, Vec<OwnedFd>)>, KeeperError> {
    let conn = match UnixStream::connect_addr(addr) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let (reply, fds) = exchange(
        &conn,
        &Request::Attach {
            pid: std::process::id(),
        },
        &[],
    )?;
    if !reply.ok {
        return Err(KeeperError::InUse(reply.pid));
    }
    Ok(Some((conn, reply, fds)))
}

impl Keeper {
    /// Attaches to the keeper of `spec.socket` if one answers: what a dead
    /// serve left with it. `None`: no keeper. `notice` says what serve
    /// should say when the keeper is replaced (see [`Linked`]).
    pub fn join(
        spec: &Spec,
        notice: fn(std::fmt::Arguments<'_>),
    ) -> Result<Option<(Keeper, Joined)>, KeeperError> {
        let addr = address(&spec.socket)?;
        let Some((attached, reply, mut fds)) = attach(&addr)? else {
            return Ok(None);
        };
        let linked = Linked::new(addr, spec.clone(), notice, (attached, None))?;
        let listener = match (reply.listener, fds.pop()) {
            (Some(id), Some(fd)) => {
                linked.link.lock().expect("keeper link").listener = Some((fd.try_clone()?, id));
                Some((fd, id))
            }
            _ => None,
        };
        let taken = linked.take_all()?;
        let keeper = Keeper::Process(Linked::watched(linked));
        let joined = Joined {
            taken,
            listener,
            last_n: reply.n,
        };
        Ok(Some((keeper, joined)))
    }

    /// systemd's file-descriptor store as the keeper of `socket`, and what
    /// it passed this process (see [`fdstore`]).
    pub fn fd_store(socket: &Path) -> Result<(Keeper, Joined), KeeperError> {
        let (store, joined) = FdStore::join(socket)?;
        Ok((Keeper::FdStore(store), joined))
    }

    /// Tells a service manager serve is ready (`--fd-store`; nothing for
    /// the keeper process).
    pub fn ready(&self) -> Result<(), KeeperError> {
        match self {
            Keeper::FdStore(s) => s.ready(),
            Keeper::Process(_) => Ok(()),
        }
    }

    /// Starts a keeper for `spec` (this program, [`KEEPER_ENV`] saying
    /// what to keep) and attaches to it. Its command line is
    /// [`KEEPER_ARG0`] alone and its name (`comm`) [`KEEPER_COMM`]: what
    /// an operator matches serve with (`pkill -f 'serve --socket
    /// /run/vm1.sock'`, `pkill -f vm1.sock`, `pkill faultline-serve`)
    /// matches no keeper, whose death would leave its VMMs to nobody (and
    /// one that dies anyway is replaced: see [`Linked`], `notice`).
    pub fn start(
        spec: &Spec,
        notice: fn(std::fmt::Arguments<'_>),
    ) -> Result<(Keeper, Joined), KeeperError> {
        let addr = address(&spec.socket)?;
        let child = spawn(spec)?;
        let (attached, reply, _) = attach_within(&addr)?;
        let joined = Joined {
            taken: Vec::new(),
            listener: None,
            last_n: reply.n,
        };
        let keeper = Keeper::Process(Linked::watched(Linked::new(
            addr,
            spec.clone(),
            notice,
            (attached, Some(child)),
        )?));
        Ok((keeper, joined))
    }

    /// Has the keeper hold `listener`, bound at the path whose (device,
    /// inode) are `id`: connections queued on it outlive this serve.
    pub fn listen(&self, listener: BorrowedFd<'_>, id: (u64, u64)) -> Result<(), KeeperError> {
        let l = match self {
            Keeper::FdStore(s) => return s.listen(listener, id),
            Keeper::Process(l) => l,
        };
        let mut link = l.link.lock().expect("keeper link");
        let (dev, ino) = id;
        l.request(&mut link, |_| Request::Listen { dev, ino }, &[listener])?;
        link.listener = Some((listener.try_clone_to_owned()?, id));
        Ok(())
    }

    /// Deposits connection `n` (from pid `pid`), just accepted; gives its
    /// id.
    pub fn deposit(&self, n: usize, pid: i32, conn: BorrowedFd<'_>) -> Result<u64, KeeperError> {
        let l = match self {
            Keeper::FdStore(s) => return s.deposit(n, conn),
            Keeper::Process(l) => l,
        };
        let mut link = l.link.lock().expect("keeper link");
        let dup = conn.try_clone_to_owned()?;
        let local = match l.request(&mut link, |_| Request::Deposit { n, pid }, &[conn]) {
            Ok(r) => r.id,
            Err(KeeperError::Down(why)) => {
                (l.notice)(format_args!(
                    "peer {n} (pid {pid}): no keeper to deposit it with ({why}): it goes to the next one started; should this serve die before, it hangs at its next missing page"
                ));
                0
            }
            Err(e) => return Err(e),
        };
        Ok(Linked::register(&mut link, local, n, pid, dup))
    }

    /// Deposits the hand-off of connection `id`: its `handshake`, its
    /// userfaultfd and its journal.
    pub fn hand(
        &self,
        id: u64,
        handshake: &str,
        fds: [BorrowedFd<'_>; 2],
    ) -> Result<(), KeeperError> {
        let l = match self {
            Keeper::FdStore(s) => return s.hand(id, handshake, fds),
            Keeper::Process(l) => l,
        };
        let mut link = l.link.lock().expect("keeper link");
        let dups = [fds[0].try_clone_to_owned()?, fds[1].try_clone_to_owned()?];
        if !link.deposited.contains_key(&id) {
            return Err(KeeperError::Refused);
        }
        // The id at the keeper as of the request (a replacement it
        // triggers deposits the connection again under a new one).
        let req = |link: &Link| Request::Hand {
            id: link.deposited.get(&id).map_or(0, |d| d.local),
            handshake: handshake.into(),
        };
        match l.request(&mut link, req, &fds) {
            // Given to the next keeper with the connection.
            Ok(_) | Err(KeeperError::Down(_)) => {}
            Err(e) => return Err(e),
        }
        if let Some(d) = link.deposited.get_mut(&id) {
            d.handed = Some((handshake.into(), dups));
        }
        Ok(())
    }

    /// What serve knows of the keeper now (systemd's store has no process
    /// to lose: never down, never replaced).
    pub fn status(&self) -> KeeperStatus {
        match self {
            Keeper::FdStore(s) => KeeperStatus {
                peers: s.peers(),
                room: s.room(),
                ..Default::default()
            },
            Keeper::Process(l) => {
                // A request holds the link for as long as the keeper takes
                // to answer (a stopped keeper: its timeout): a scrape
                // reads what the link was when last free, not waiting.
                let mut last = l.last_status.lock().expect("keeper status");
                if let Ok(link) = l.link.try_lock() {
                    *last = KeeperStatus {
                        down: link.down.is_some(),
                        replaced: link.replaced,
                        peers: link.deposited.len(),
                        room: None,
                    };
                }
                *last
            }
        }
    }

    /// Tells the keeper peer `id` is done with.
    pub fn forget(&self, id: u64) -> Result<(), KeeperError> {
        let l = match self {
            Keeper::FdStore(s) => return s.forget(id),
            Keeper::Process(l) => l,
        };
        let mut link = l.link.lock().expect("keeper link");
        if !link.deposited.contains_key(&id) {
            return Err(KeeperError::Refused);
        }
        // Still registered while the request runs: a replacement it
        // triggers deposits it again, and the forget goes to the new id.
        let local = |link: &Link| link.deposited.get(&id).map_or(0, |d| d.local);
        let done = l.request(&mut link, |link| Request::Forget { id: local(link) }, &[]);
        link.deposited.remove(&id);
        match done {
            // No keeper holds it.
            Ok(_) | Err(KeeperError::Down(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Linked {
    /// Every peer the keeper holds (a dead serve's), registered with the
    /// link: their ids are the link's.
    fn take_all(&self) -> Result<Vec<Taken>, KeeperError> {
        let mut out = Vec::new();
        let mut next = 0;
        let mut link = self.link.lock().expect("keeper link");
        loop {
            let conn = UnixStream::connect_addr(&self.addr)?;
            let (r, fds) = exchange(&conn, &Request::Take { next }, &[])?;
            if !r.ok {
                return Ok(out);
            }
            let mut fds = fds.into_iter();
            let conn = fds.next().ok_or(KeeperError::Refused)?;
            let handed = match (r.handshake, fds.next(), fds.next()) {
                (Some(handshake), Some(uffd), Some(journal)) => Some(Handed {
                    handshake,
                    uffd,
                    journal,
                }),
                (None, None, None) => None,
                _ => return Err(KeeperError::Refused),
            };
            next = r.id + 1;
            let id = Linked::register(&mut link, r.id, r.n, r.pid, conn.try_clone()?);
            if let (Some(h), Some(d)) = (&handed, link.deposited.get_mut(&id)) {
                let fds = [h.uffd.try_clone()?, h.journal.try_clone()?];
                d.handed = Some((h.handshake.clone(), fds));
            }
            out.push(Taken {
                id,
                n: r.n,
                pid: r.pid,
                conn,
                handed,
            });
        }
    }
}

/// The keeper's lines on stderr.
fn say(msg: std::fmt::Arguments<'_>) {
    crate::log::say_as("faultline serve keeper", None, msg);
}

/// A peer the keeper holds.
struct Held {
    id: u64,
    n: usize,
    pid: i32,
    conn: OwnedFd,
    /// Its handshake, userfaultfd and journal, once deposited.
    handed: Option<(String, [OwnedFd; 2])>,
    /// The process at the other end of its connection (`SO_PEERPIDFD`):
    /// the kill goes through it, never to a process that got its pid
    /// later.
    pidfd: Option<process::Pidfd>,
}

/// What the keeper holds.
#[derive(Default)]
struct Kept {
    held: Vec<Held>,
    /// The serve attached: its connection and pid.
    serve: Option<(UnixStream, u32)>,
    /// Serve's listening socket, and the (device, inode) of its path.
    listener: Option<(UnixListener, (u64, u64))>,
    next_id: u64,
    /// The highest connection number deposited.
    last_n: usize,
}

/// Whether poll's `revents` say the other end is gone.
fn gone(revents: i16) -> bool {
    revents & (poll::events::RDHUP | poll::events::HUP | poll::events::ERR) != 0
}

/// Whether `fd`'s other end hung up (a look, no wait).
fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        events: poll::events::RDHUP,
        revents: 0,
    }];
    poll::poll(&mut fds, 0).is_ok_and(|n| n == 1 && gone(fds[0].revents))
}

/// Whether a connection is queued on `listener` (a look, no wait).
fn queued(listener: &UnixListener) -> bool {
    let mut fds = [PollFd {
        fd: std::os::fd::AsRawFd::as_raw_fd(listener),
        events: poll::events::IN,
        revents: 0,
    }];
    poll::poll(&mut fds, 0).is_ok_and(|n| n == 1)
}

/// Runs the keeper of `spec.socket` (see the module docs) until it has no
/// peer, no serve and no connection queued on the listener it holds, or
/// no serve attached for `spec.wait` (then its peers, and the connections
/// queued, are killed unless `spec.leave`). Names the process
/// [`KEEPER_COMM`].
pub fn run(spec: &Spec) -> Result<(), KeeperError> {
    let (socket, wait, leave) = (spec.socket.as_path(), spec.wait, spec.leave);
    process::set_name(KEEPER_COMM)?;
    // It holds 4 descriptors a VMM (serve raised its own limit already,
    // which this process inherits, unless an older serve started it).
    let _ = process::raise_fd_limit();
    let addr = address(socket)?;
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
    let mut k = Kept {
        next_id: 1,
        ..Default::default()
    };
    let mut alone_since = Instant::now();
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
            k.serve
                .iter()
                .map(|(c, _)| watch(std::os::fd::AsRawFd::as_raw_fd(c))),
        );
        fds.extend(
            k.held
                .iter()
                .map(|h| watch(std::os::fd::AsRawFd::as_raw_fd(&h.conn))),
        );
        let _ = poll::poll(&mut fds, 200);
        let mut i = 1;
        if let Some((_, pid)) = &k.serve {
            if gone(fds[i].revents) {
                say(format_args!(
                    "serve pid {pid} is gone; holding {} peer(s) for the next serve of {}",
                    k.held.len(),
                    socket.display()
                ));
                k.serve = None;
                alone_since = Instant::now();
            }
            i += 1;
        }
        let mut j = 0;
        k.held.retain(|h| {
            let keep = !gone(fds[i + j].revents);
            j += 1;
            if !keep {
                say(format_args!("peer {} (pid {}) hung up", h.n, h.pid));
            }
            keep
        });
        loop {
            match listener.accept() {
                Ok((conn, _)) => {
                    if let Err(e) = serve_request(conn, &mut k) {
                        say(format_args!("a request failed: {e}"));
                    }
                }
                // Out of descriptors the request stays queued and the
                // listener readable: tried again a while later, not in a
                // loop around poll (serve's request times out meanwhile,
                // and serve says so).
                Err(e) if process::out_of_fds(&e) => {
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
                Err(_) => break,
            }
        }
        let waiting = k.listener.as_ref().is_some_and(|(l, _)| queued(l));
        if k.serve.is_none() && k.held.is_empty() && !waiting {
            say(format_args!("no peer and no serve: exiting"));
            remove_socket(spec, &k);
            return Ok(());
        }
        if k.serve.is_none() && alone_since.elapsed() > wait {
            let fate = if leave { "leaving" } else { "killing" };
            say(format_args!(
                "no serve for {:.1}s: {fate} its {} peer(s) and the connections queued, and exiting",
                wait.as_secs_f64(),
                k.held.len(),
            ));
            for h in k.held.iter().filter(|_| !leave) {
                let _ = match &h.pidfd {
                    Some(p) => p.send_signal(process::SIGKILL),
                    None => process::kill(h.pid, process::SIGKILL),
                };
            }
            if let Some((l, _)) = &k.listener {
                drain(l, leave);
            }
            remove_socket(spec, &k);
            return Ok(());
        }
    }
}

/// Removes serve's socket path, as the serve that bound it would have, if
/// it still names the listener the keeper holds (no serve listens on it
/// once the keeper is gone; a path bound again since is another's).
fn remove_socket(spec: &Spec, k: &Kept) {
    if let Some((_, id)) = &k.listener {
        let _ = crate::sockpath::remove_if_ours(&spec.socket, *id);
    }
}

/// Accepts the connections queued on `listener` (no serve will): each
/// VMM that connected (and did not hang up) waits for pages that will
/// never come, so it is killed, unless `leave`.
fn drain(listener: &UnixListener, leave: bool) {
    let _ = listener.set_nonblocking(true);
    while let Ok((conn, _)) = listener.accept() {
        let cred = sock::peer_cred(conn.as_fd()).map_or(0, |c| c.pid);
        // One that hung up having sent nothing waits for nothing (another
        // serve checking whether the socket is in use does this).
        let mut byte = [0u8; 1];
        let sent = sock::peek_with_fds(conn.as_fd(), &mut byte, true);
        if sent.is_ok_and(|r| r.bytes == 0 && r.fds.is_empty()) {
            continue;
        }
        if leave {
            say(format_args!("a connection queued (pid {cred}): left"));
            continue;
        }
        let killed = match sock::peer_pidfd(conn.as_fd()) {
            Ok(p) => p.send_signal(process::SIGKILL),
            Err(_) if cred > 0 => process::kill(cred, process::SIGKILL),
            Err(e) => Err(e),
        };
        match killed {
            Ok(()) => say(format_args!("a connection queued: killed pid {cred}")),
            Err(e) => say(format_args!(
                "a connection queued (pid {cred}): not killed: {e}"
            )),
        }
    }
}

/// Serves one request on `conn`.
fn serve_request(conn: UnixStream, k: &mut Kept) -> Result<(), KeeperError> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let Some((req, fds)) = recv_message::<Request>(&conn)? else {
        return Ok(());
    };
    let mut reply = Reply {
        ok: true,
        ..Default::default()
    };
    let mut send: Vec<BorrowedFd<'_>> = Vec::new();
    let mut fds = fds.into_iter();
    match req {
        Request::Attach { pid } => {
            if let Some((c, old)) = &k.serve {
                if !hung_up(c.as_fd()) {
                    reply.ok = false;
                    reply.pid = *old as i32;
                    return send_reply(&conn, &reply, &[]);
                }
            }
            reply.n = k.last_n;
            if let Some((l, id)) = &k.listener {
                reply.listener = Some(*id);
                send.push(l.as_fd());
            }
            send_reply(&conn, &reply, &send)?;
            say(format_args!("serve pid {pid} attached"));
            k.serve = Some((conn, pid));
            return Ok(());
        }
        Request::Listen { dev, ino } => {
            let fd = fds.next().ok_or(KeeperError::Refused)?;
            k.listener = Some((UnixListener::from(fd), (dev, ino)));
        }
        Request::Deposit { n, pid } => {
            let conn_fd = fds.next().ok_or(KeeperError::Refused)?;
            reply.id = k.next_id;
            k.next_id += 1;
            k.last_n = k.last_n.max(n);
            let pidfd = sock::peer_pidfd(conn_fd.as_fd()).ok();
            // A connection deposited again (its first deposit timed out
            // at serve, which deposits it anew) replaces the first.
            k.held.retain(|h| h.n != n);
            k.held.push(Held {
                id: reply.id,
                n,
                pid,
                conn: conn_fd,
                handed: None,
                pidfd,
            });
        }
        Request::Hand { id, handshake } => {
            let (Some(uffd), Some(journal)) = (fds.next(), fds.next()) else {
                return Err(KeeperError::Refused);
            };
            match k.held.iter_mut().find(|h| h.id == id) {
                Some(h) => h.handed = Some((handshake, [uffd, journal])),
                None => reply.ok = false,
            }
        }
        Request::Forget { id } => k.held.retain(|h| h.id != id),
        Request::Take { next } => match k.held.iter().find(|h| h.id >= next) {
            Some(h) => {
                reply.id = h.id;
                reply.n = h.n;
                reply.pid = h.pid;
                send.push(h.conn.as_fd());
                if let Some((hs, [uffd, journal])) = &h.handed {
                    reply.handshake = Some(hs.clone());
                    send.push(uffd.as_fd());
                    send.push(journal.as_fd());
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn a_spec_goes_through_the_environment_whole() {
        for spec in [
            Spec {
                socket: "/run/vm1.sock".into(),
                wait: Duration::from_millis(30_000),
                leave: false,
            },
            // Colons and bytes that are not UTF-8 in the path.
            Spec {
                socket: OsStr::from_bytes(b"/tmp/a:b/\xff.sock").into(),
                wait: Duration::from_millis(1),
                leave: true,
            },
        ] {
            assert_eq!(Spec::from_env(&spec.to_env()).unwrap(), spec);
        }
        // Less than a millisecond is a millisecond, not no wait at all.
        let short = Spec {
            wait: Duration::from_micros(10),
            ..Spec::from_env(OsStr::new("5:0:/s")).unwrap()
        };
        assert_eq!(
            Spec::from_env(&short.to_env()).unwrap().wait,
            Duration::from_millis(1)
        );
        for bad in ["1", "1:0", "1:0:", "x:0:/s", "1:2:/s", "-1:0:/s", ":0:/s"] {
            let e = Spec::from_env(OsStr::new(bad)).unwrap_err();
            assert!(e.to_string().contains("WAIT_MS:LEAVE:SOCKET"), "{bad}: {e}");
        }
    }
}
