//! A connection to one Redis server whose replies this crate reads itself,
//! so a chunk's bytes go from the socket straight into the faulting
//! region's buffer.
//!
//! Why not the `redis` crate's `Connection` on the fault path: its sync
//! reader parses every reply into an owned `redis::Value` (one `Vec` per
//! bulk string, then copied again into the page buffer) through
//! `combine`'s partial parser, which reads 8 KiB per `read(2)` and
//! re-enters the parser after each; its socket is private, so nothing can
//! be read beside it. Measured over a unix socket, 64 MiB read as 256 KiB
//! windows (`examples`-style probe, same run): the crate's pipeline cost
//! 2.7-6.3 us a page, reading the same replies here 1.9-3.6 us.
//!
//! What still comes from the crate: URL parsing (`redis::Client`'s
//! `ConnectionInfo`), error classification (an error reply's line is
//! handed to `redis::parse_redis_value`, so `-LOADING` is still a
//! `BusyLoadingError`), and every reply that is not a chunk (metadata,
//! `OK`s) is framed here and parsed by `redis::parse_redis_value`.
//! RESP2 only (no `HELLO 3` is sent); TLS is refused.
//!
//! How a read works:
//!
//! 1. the requests (`GET key` / `GETRANGE key from to`) are packed into one
//!    buffer and written with one `write(2)`: one round trip;
//! 2. each reply's header (`$N\r\n`) is read from a 64 KiB buffer; the
//!    bulk's bytes already buffered are copied, the rest is read with
//!    `read(2)` straight into the destination slice;
//! 3. a reply of another length than asked for (a missing key is `$-1`,
//!    or an empty `GETRANGE`) is read to its end and reported, so the
//!    connection stays in step with the server.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, Value};

/// Bytes of the read buffer (headers, small replies, the first bytes of a
/// bulk).
const RBUF: usize = 64 * 1024;

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.write_all(buf),
            Stream::Tcp(s) => s.write_all(buf),
        }
    }
}

/// What a chunk request's reply held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bulk {
    /// Exactly the destination's length, now in the destination.
    Filled,
    /// A nil reply: the key does not exist.
    Nil,
    /// A bulk of another length (read and dropped).
    Length(usize),
}

/// One server connection; see the module docs.
pub(crate) struct RawConn {
    stream: Stream,
    rbuf: Box<[u8]>,
    /// Unread bytes are `rbuf[pos..end]`.
    pos: usize,
    end: usize,
    /// The packed requests of the next round trip.
    pub(crate) wbuf: Vec<u8>,
}

/// A protocol violation (a reply this reader does not expect).
fn protocol(what: &str, got: &[u8]) -> RedisError {
    RedisError::from((
        ErrorKind::ResponseError,
        "unexpected reply",
        format!(
            "{what}: {:?}",
            String::from_utf8_lossy(&got[..got.len().min(64)])
        ),
    ))
}

impl RawConn {
    /// Connects to `info`'s address, sets the timeouts, authenticates and
    /// selects its database.
    pub(crate) fn connect(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> RedisResult<RawConn> {
        let stream = match &info.addr {
            ConnectionAddr::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(Some(command_timeout))?;
                s.set_write_timeout(Some(command_timeout))?;
                Stream::Unix(s)
            }
            ConnectionAddr::Tcp(host, port) => {
                let mut last = None;
                let mut found = None;
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, connect_timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = match (found, last) {
                    (Some(s), _) => s,
                    (None, Some(e)) => return Err(e.into()),
                    (None, None) => {
                        return Err(RedisError::from((
                            ErrorKind::InvalidClientConfig,
                            "no address",
                            format!("{host}:{port} resolves to nothing"),
                        )))
                    }
                };
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(command_timeout))?;
                s.set_write_timeout(Some(command_timeout))?;
                Stream::Tcp(s)
            }
            other => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "unsupported address",
                    format!("{other} (TLS is not supported by this store)"),
                )))
            }
        };
        let mut c = RawConn {
            stream,
            rbuf: vec![0u8; RBUF].into_boxed_slice(),
            pos: 0,
            end: 0,
            wbuf: Vec::with_capacity(4096),
        };
        let r = &info.redis;
        if let Some(pass) = &r.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &r.username {
                args.push(user.as_bytes());
            }
            args.push(pass.as_bytes());
            c.query(&args)?;
        }
        if r.db != 0 {
            c.query(&[b"SELECT", r.db.to_string().as_bytes()])?;
        }
        Ok(c)
    }

    /// Appends one request (`args`, a RESP array of bulk strings) to
    /// [`wbuf`](Self::wbuf).
    pub(crate) fn pack(&mut self, args: &[&[u8]]) {
        pack(&mut self.wbuf, args);
    }

    /// Writes the packed requests and empties the buffer.
    pub(crate) fn send(&mut self) -> RedisResult<()> {
        let res = self.stream.write_all(&self.wbuf);
        self.wbuf.clear();
        Ok(res?)
    }

    /// Sends one request and reads its reply (an error reply is an `Err`).
    pub(crate) fn query(&mut self, args: &[&[u8]]) -> RedisResult<Value> {
        self.wbuf.clear();
        self.pack(args);
        self.send()?;
        self.read_value()?.extract_error()
    }

    /// Waits until a reply byte is buffered.
    pub(crate) fn await_reply(&mut self) -> RedisResult<()> {
        if self.pos == self.end {
            self.fill_buf()?;
        }
        Ok(())
    }

    /// Reads more bytes into the buffer (moving the unread ones to its
    /// front first if needed); an end of file is an error.
    fn fill_buf(&mut self) -> RedisResult<()> {
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
        } else if self.end == self.rbuf.len() {
            self.rbuf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        let n = self.stream.read(&mut self.rbuf[self.end..])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )
            .into());
        }
        self.end += n;
        Ok(())
    }

    /// The next line without its `\r\n`, as a range of the buffer (valid
    /// until the next read).
    fn line(&mut self) -> RedisResult<std::ops::Range<usize>> {
        let mut from = self.pos;
        loop {
            if let Some(i) = self.rbuf[from..self.end]
                .windows(2)
                .position(|w| w == b"\r\n")
            {
                let l = self.pos..from + i;
                self.pos = from + i + 2;
                return Ok(l);
            }
            if self.end - self.pos == self.rbuf.len() {
                return Err(protocol("a line longer than the buffer", &self.rbuf[..64]));
            }
            // A `\r` at the end may pair with the next read's `\n`.
            let scanned = (self.end - self.pos).saturating_sub(1);
            self.fill_buf()?;
            from = self.pos + scanned;
        }
    }

    /// Reads exactly `dst.len()` bytes: buffered ones first, the rest
    /// straight from the socket.
    fn read_exact(&mut self, dst: &mut [u8]) -> RedisResult<()> {
        let have = (self.end - self.pos).min(dst.len());
        dst[..have].copy_from_slice(&self.rbuf[self.pos..self.pos + have]);
        self.pos += have;
        let mut at = have;
        while at < dst.len() {
            // A short remainder goes through the buffer (fewer reads for
            // the headers that follow); a long one straight to `dst`.
            if dst.len() - at < 4096 {
                self.fill_buf()?;
                let n = (self.end - self.pos).min(dst.len() - at);
                dst[at..at + n].copy_from_slice(&self.rbuf[self.pos..self.pos + n]);
                self.pos += n;
                at += n;
            } else {
                let n = self.stream.read(&mut dst[at..])?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )
                    .into());
                }
                at += n;
            }
        }
        Ok(())
    }

    /// Skips `n` bytes.
    fn skip(&mut self, mut n: usize) -> RedisResult<()> {
        while n > 0 {
            if self.pos == self.end {
                self.fill_buf()?;
            }
            let k = (self.end - self.pos).min(n);
            self.pos += k;
            n -= k;
        }
        Ok(())
    }

    /// Reads `\r\n`.
    fn crlf(&mut self) -> RedisResult<()> {
        let l = self.line()?;
        if !l.is_empty() {
            return Err(protocol("expected CRLF after a bulk", &self.rbuf[l]));
        }
        Ok(())
    }

    /// Reads one bulk-string reply into `dst` (see [`Bulk`]). An error
    /// reply is an `Err` of the kind the `redis` crate gives it.
    pub(crate) fn read_bulk_into(&mut self, dst: &mut [u8]) -> RedisResult<Bulk> {
        let l = self.line()?;
        let head = &self.rbuf[l.clone()];
        match head.first() {
            Some(b'$') => {}
            Some(b'-') => {
                let mut line = head.to_vec();
                line.extend_from_slice(b"\r\n");
                redis::parse_redis_value(&line)?.extract_error()?;
                return Err(protocol("a malformed error reply", &line));
            }
            _ => return Err(protocol("expected a bulk string", head)),
        }
        let n: i64 = std::str::from_utf8(&head[1..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol("bad bulk length", head))?;
        if n < 0 {
            return Ok(Bulk::Nil);
        }
        let n = n as usize;
        if n != dst.len() {
            self.skip(n)?;
            self.crlf()?;
            return Ok(Bulk::Length(n));
        }
        self.read_exact(dst)?;
        self.crlf()?;
        Ok(Bulk::Filled)
    }

    /// Reads one whole reply and drops it.
    pub(crate) fn skip_reply(&mut self) -> RedisResult<()> {
        self.frame(&mut Vec::new())
    }

    /// Reads one reply of any kind: its bytes are framed here and parsed
    /// by the `redis` crate. An error reply is a `Value::ServerError`.
    pub(crate) fn read_value(&mut self) -> RedisResult<Value> {
        let mut raw = Vec::new();
        self.frame(&mut raw)?;
        redis::parse_redis_value(&raw)
    }

    /// Appends one whole RESP2 reply to `raw`.
    fn frame(&mut self, raw: &mut Vec<u8>) -> RedisResult<()> {
        let l = self.line()?;
        let head = self.rbuf[l].to_vec();
        raw.extend_from_slice(&head);
        raw.extend_from_slice(b"\r\n");
        let count = || -> RedisResult<i64> {
            std::str::from_utf8(&head[1..])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol("bad length", &head))
        };
        match head.first() {
            Some(b'+' | b'-' | b':') => Ok(()),
            Some(b'$') => {
                let n = count()?;
                if n >= 0 {
                    let at = raw.len();
                    raw.resize(at + n as usize + 2, 0);
                    self.read_exact(&mut raw[at..])?;
                }
                Ok(())
            }
            Some(b'*') => {
                for _ in 0..count()?.max(0) {
                    self.frame(raw)?;
                }
                Ok(())
            }
            _ => Err(protocol("unknown reply type", &head)),
        }
    }
}

/// Appends `args` to `buf` as a RESP array of bulk strings.
pub(crate) fn pack(buf: &mut Vec<u8>, args: &[&[u8]]) {
    use std::io::Write as _;
    let _ = write!(buf, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(buf, "${}\r\n", a.len());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}
