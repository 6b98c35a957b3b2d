//! The metrics endpoint: a plain HTTP/1.0 responder on a unix socket or
//! a loopback TCP port, on a thread of its own.
//!
//! 1. `--metrics` is a unix socket path (anything with a `/`), a port
//!    (`9100`: 127.0.0.1), or `HOST:PORT` with a loopback HOST
//!    (`127.0.0.1`, `[::1]`, `localhost`); any other host is refused: the
//!    counters say what VMs run here, and serve never listens beyond the
//!    machine.
//! 2. A stale socket at the path is replaced; anything else there is
//!    refused, never removed; the socket is removed when serve stops.
//! 3. Each connection gets one answer and is closed: `GET /metrics` (or
//!    `/`) the OpenMetrics text of a fresh sample, `POST /dirty` writes
//!    the tracked peers' dirty sets (`--track-dirty`), `POST /record` cuts
//!    the recording peers' records (`--record`), any other path 404. A
//!    client has one second to send its request; connections are served
//!    one at a time (a scrape takes well under a millisecond).
//!
//! ```text
//!   curl --unix-socket /run/faultline/metrics.sock http://x/metrics
//!   curl http://127.0.0.1:9100/metrics
//! ```

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use faultline_sys::poll::{self, events, PollFd};

use super::Exposition;
use crate::sockpath::{self, Taken};

/// Where `--metrics` listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAddr {
    /// A unix socket.
    Unix(PathBuf),
    /// A loopback TCP address.
    Tcp(SocketAddr),
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The address is neither a path, a port nor a loopback `HOST:PORT`.
    #[error(
        "--metrics {0:?}: give a unix socket path (with a '/'), a port, or a loopback HOST:PORT"
    )]
    Parse(String),
    /// The host is not a loopback address.
    #[error("--metrics {addr:?}: {ip} is not a loopback address (metrics are served on this machine only)")]
    NotLoopback {
        /// What was given.
        addr: String,
        /// The address it names.
        ip: IpAddr,
    },
    /// The path holds something that is not a socket.
    #[error("--metrics {}: exists and is not a socket (only a stale socket is replaced)", .0.display())]
    NotASocket(PathBuf),
    /// A process listens on the socket at the path (another serve's
    /// metrics or its VMMs' socket): it is not replaced.
    #[error("--metrics {}: a socket in use (pid {pid} listens on it); only a stale socket is replaced", .path.display())]
    InUse {
        /// The path.
        path: PathBuf,
        /// Who listens (0: not said).
        pid: i32,
    },
    /// Binding failed.
    #[error("--metrics: binding {what}")]
    Bind {
        /// The address.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The thread could not be started.
    #[error("--metrics: spawning its thread")]
    Spawn(#[source] std::io::Error),
}

impl std::str::FromStr for MetricsAddr {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<MetricsAddr, EndpointError> {
        if s.contains('/') {
            return Ok(MetricsAddr::Unix(s.into()));
        }
        if let Ok(port) = s.parse::<u16>() {
            return Ok(MetricsAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], port))));
        }
        let addr = s
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| EndpointError::Parse(s.into()))?;
        if !addr.ip().is_loopback() {
            return Err(EndpointError::NotLoopback {
                addr: s.into(),
                ip: addr.ip(),
            });
        }
        Ok(MetricsAddr::Tcp(addr))
    }
}

impl std::fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            MetricsAddr::Tcp(a) => write!(f, "http://{a}/metrics"),
        }
    }
}

enum Listener {
    /// Bound at the path, whose socket was (device, inode).
    Unix(UnixListener, PathBuf, (u64, u64)),
    Tcp(TcpListener),
}

/// How long a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How often the thread looks at its stop flag, ms.
const TICK_MS: i32 = 100;

/// The largest request read.
const MAX_REQUEST: usize = 8192;

/// The endpoint's thread; stopped (and its socket removed) on drop.
pub struct Endpoint {
    /// Where it listens (a TCP port 0 resolved to the port bound).
    pub addr: MetricsAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The unix socket's path and its (device, inode) when bound.
    path: Option<(PathBuf, (u64, u64))>,
}

impl Endpoint {
    /// Binds `addr` and answers scrapes with `exposition`'s text.
    pub fn start(
        addr: &MetricsAddr,
        exposition: Arc<Exposition>,
    ) -> Result<Endpoint, EndpointError> {
        let bind_err = |what: String| move |source| EndpointError::Bind { what, source };
        let (listener, addr) = match addr {
            MetricsAddr::Unix(path) => {
                // Only a stale socket (nothing answers on it) is replaced.
                match sockpath::probe(path) {
                    Ok(true) => {
                        let _ = std::fs::remove_file(path);
                    }
                    Ok(false) => {}
                    Err(Taken::NotASocket) => return Err(EndpointError::NotASocket(path.clone())),
                    Err(Taken::InUse(pid)) => {
                        let path = path.clone();
                        return Err(EndpointError::InUse { path, pid });
                    }
                    Err(Taken::Probe(e)) => return Err(bind_err(path.display().to_string())(e)),
                }
                let l = UnixListener::bind(path).map_err(bind_err(path.display().to_string()))?;
                l.set_nonblocking(true)
                    .map_err(bind_err(path.display().to_string()))?;
                let id = sockpath::identity(path).map_err(bind_err(path.display().to_string()))?;
                (Listener::Unix(l, path.clone(), id), addr.clone())
            }
            MetricsAddr::Tcp(a) => {
                let l = TcpListener::bind(a).map_err(bind_err(a.to_string()))?;
                l.set_nonblocking(true).map_err(bind_err(a.to_string()))?;
                let bound = l.local_addr().map_err(bind_err(a.to_string()))?;
                (Listener::Tcp(l), MetricsAddr::Tcp(bound))
            }
        };
        let path = match &listener {
            Listener::Unix(_, p, id) => Some((p.clone(), *id)),
            Listener::Tcp(_) => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("fl-metrics".into())
            .spawn(move || serve(&listener, &exposition, &s))
            .map_err(EndpointError::Spawn)?;
        Ok(Endpoint {
            addr,
            stop,
            thread: Some(thread),
            path,
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Only if the path still names the socket bound (not one bound
        // there since by another process).
        if let Some((p, id)) = &self.path {
            let _ = sockpath::remove_if_ours(p, *id);
        }
    }
}

/// The endpoint's loop: accept, answer, close, until `stop`.
fn serve(listener: &Listener, exposition: &Arc<Exposition>, stop: &AtomicBool) {
    let fd = match listener {
        Listener::Unix(l, ..) => l.as_raw_fd(),
        Listener::Tcp(l) => l.as_raw_fd(),
    };
    while !stop.load(Relaxed) {
        let mut fds = [PollFd {
            fd,
            events: events::IN,
            revents: 0,
        }];
        if !poll::poll(&mut fds, TICK_MS).is_ok_and(|n| n > 0) {
            continue;
        }
        let accepted = match listener {
            Listener::Unix(l, ..) => l.accept().map(|(c, _)| answer_unix(c, exposition)),
            Listener::Tcp(l) => l.accept().map(|(c, _)| answer_tcp(c, exposition)),
        };
        // Out of descriptors (EMFILE) the scrape stays queued and the
        // listener readable: tried again a tick later, not at once.
        if accepted.is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock) {
            std::thread::sleep(std::time::Duration::from_millis(TICK_MS as u64));
        }
    }
}

fn answer_unix(c: UnixStream, exposition: &Arc<Exposition>) {
    if c.set_nonblocking(false).is_ok() && c.set_read_timeout(Some(REQUEST_TIMEOUT)).is_ok() {
        answer(c, exposition);
    }
}

fn answer_tcp(c: TcpStream, exposition: &Arc<Exposition>) {
    if c.set_nonblocking(false).is_ok() && c.set_read_timeout(Some(REQUEST_TIMEOUT)).is_ok() {
        answer(c, exposition);
    }
}

/// Reads one request from `c` and answers it (errors: the client went).
fn answer(mut c: impl Read + Write, exposition: &Arc<Exposition>) {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
        if req.len() > MAX_REQUEST {
            break;
        }
    }
    let line = String::from_utf8_lossy(&req);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            exposition.text(),
        ),
        ("POST", _) => match exposition.post(path) {
            Some(answer) => ("200 OK", "text/plain", answer),
            None => (
                "404 Not Found",
                "text/plain",
                match path {
                    "/dirty" => "dirty tracking is off (--track-dirty)\n".into(),
                    "/record" => "recording is off (--record)\n".into(),
                    _ => "not found: POST /dirty or /record\n".into(),
                },
            ),
        },
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = c.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = c.write_all(body.as_bytes());
    }
    let _ = c.flush();
}

/// Scrapes `addr` once (`GET /metrics`): the body of a 200 answer.
/// What tests and `bench restore` read the endpoint with.
pub fn scrape(addr: &MetricsAddr) -> std::io::Result<String> {
    let req = b"GET /metrics HTTP/1.0\r\n\r\n";
    let mut text = String::new();
    match addr {
        MetricsAddr::Unix(p) => {
            let mut c = UnixStream::connect(p)?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            c.write_all(req)?;
            c.read_to_string(&mut text)?;
        }
        MetricsAddr::Tcp(a) => {
            let mut c = TcpStream::connect_timeout(a, Duration::from_secs(5))?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            c.write_all(req)?;
            c.read_to_string(&mut text)?;
        }
    }
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header in the answer"))?;
    if !head.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!(
            "the endpoint answered {}",
            head.lines().next().unwrap_or("")
        )));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_paths_ports_or_loopback_and_nothing_else() {
        assert_eq!(
            "/run/m.sock".parse::<MetricsAddr>().unwrap(),
            MetricsAddr::Unix("/run/m.sock".into())
        );
        assert_eq!(
            "9100".parse::<MetricsAddr>().unwrap(),
            MetricsAddr::Tcp("127.0.0.1:9100".parse().unwrap())
        );
        assert_eq!(
            "[::1]:9".parse::<MetricsAddr>().unwrap(),
            MetricsAddr::Tcp("[::1]:9".parse().unwrap())
        );
        assert!(matches!(
            "0.0.0.0:9100".parse::<MetricsAddr>(),
            Err(EndpointError::NotLoopback { .. })
        ));
        assert!(matches!(
            "10.1.2.3:80".parse::<MetricsAddr>(),
            Err(EndpointError::NotLoopback { .. })
        ));
        assert!(matches!(
            "metrics".parse::<MetricsAddr>(),
            Err(EndpointError::Parse(_))
        ));
        assert!(matches!(
            "99999".parse::<MetricsAddr>(),
            Err(EndpointError::Parse(_))
        ));
    }
}
