//! A faultline page store on Redis, Redis Cluster or Valkey.
//!
//! [`RedisStore`] implements [`faultline::PageStore`] over a Redis server:
//! the store's bytes are fixed-size chunks (default 64 KiB) under keys
//!
//! ```text
//! fl:{NAME:G}:C      chunk C (bytes C*chunk .. (C+1)*chunk), G = C / group_chunks
//! fl:{NAME}:meta     a hash: len, chunk, group, checksum (written last by `put`)
//! ```
//!
//! The hash tag `{NAME:G}` keeps a group of chunks (default 1 MiB) on
//! one cluster shard, so a read-ahead window is one request to one node.
//! The store is [`batched`](faultline::PageStore::batched): a window, with
//! all its holes, is one round trip: one pipeline with a `GET` per whole
//! chunk and a `GETRANGE` per part of one (a chunk may be larger than a
//! window or a page). On a single server the replies are read by this
//! crate straight into the faulting region's buffer (`resp.rs`: no
//! allocation or copy per key; why not the `redis` crate's reader is
//! written there); on a cluster the `redis` crate's cluster pipeline
//! sends one pipeline per node. Every reply must have exactly the length
//! asked for: a missing or short key inside the store's length is an
//! error. Write-back is one pipeline of `SET`s (whole chunks) and
//! `SETRANGE`s (parts), so any page size works with any chunk size; a
//! `flush` batch (`PageStore::write_back_batch`, up to 64 pages) is one
//! pipeline.
//!
//! A sequential stream is read ahead on a single server
//! ([`RedisConfig::read_ahead`]): a fill that continues the previous one
//! sends the request for the next range in the same write, so the
//! server prepares it while the faulting window is installed; a
//! write-back of this store started since makes it stale (dropped and
//! read again).
//!
//! Chunk size: `faultline bench store --chunk 4096,16384,65536` measures
//! them side by side; 64 KiB is the default (see the workspace README).
//!
//! URLs (the store's `NAME` after `#`, default `faultline`):
//!
//! * `redis://HOST:PORT[/DB]#NAME` – TCP;
//! * `redis+unix:///PATH#NAME` or `unix:///PATH#NAME` – a unix socket;
//! * `redis-cluster://HOST:PORT,HOST:PORT,...#NAME` – Redis Cluster through
//!   the `redis` crate's cluster client (it follows `MOVED`/`ASK`).
//!
//! Each thread that calls the store uses its own connection (a map keyed by
//! thread id), connected with [`RedisConfig::connect_timeout`] and read
//! and written with [`RedisConfig::command_timeout`]. A failed request
//! drops its connection, waits (backoff from 10 ms, doubling to 500 ms)
//! and reconnects, until [`RedisConfig::deadline`]; then the request fails
//! with [`faultline::StoreError::Remote`], naming the key and the cause,
//! and the faulting page is poisoned: a failure never reads as zeros. A
//! key missing for a chunk inside the store's length is an error too.
//!
//! The store is not signal-safe (a network client allocates, locks and
//! blocks): the signal engine refuses it with
//! `faultline::Error::StoreNotSignalSafe`; the thread engines (poll, spin,
//! workers) serve it.
//!
//! [`server`] starts and stops real `redis-server` processes (a unix
//! socket in a temporary directory, or a 3-master cluster on loopback) for
//! tests and benchmarks.

mod resp;
pub mod server;

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use faultline::{FillRange, PageStore, StoreError, WriteRange};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Value};
use resp::{Bulk, RawConn};

/// Settings of a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Bytes per chunk (key) for [`RedisStore::put`]; opening a store
    /// takes the chunk size from its metadata. Default [`DEFAULT_CHUNK`].
    pub chunk_bytes: usize,
    /// Chunks per hash tag (on one cluster shard). Default 16 (1 MiB of
    /// 64 KiB chunks; [`RedisConfig::with_chunk`] keeps 1 MiB).
    pub group_chunks: u64,
    /// Connecting. Default 1 s.
    pub connect_timeout: Duration,
    /// One request's reply. Default 1 s.
    pub command_timeout: Duration,
    /// Retries with backoff end this long after the first try. Default 5 s.
    pub deadline: Duration,
    /// Stream read-ahead on a single server (default on): when a
    /// one-range fill starts where the previous one on the same
    /// connection (thread) ended, the request for the next range of the
    /// same length goes out in the same write, so the server prepares it
    /// while this one is installed; the next fill, if it is that range,
    /// only reads replies already on their way. A fill elsewhere first
    /// reads and drops them. A write-back started after (or running
    /// when) the range was sent makes it stale: it is dropped and read
    /// again, so a fill never returns bytes older than a finished
    /// write-back of this store.
    pub read_ahead: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            chunk_bytes: DEFAULT_CHUNK,
            group_chunks: (GROUP_BYTES / DEFAULT_CHUNK) as u64,
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_secs(1),
            deadline: Duration::from_secs(5),
            read_ahead: true,
        }
    }
}

/// The default bytes per key: 64 KiB. Fewer, larger keys cost the
/// server less per window (one command per key); a page or a window
/// smaller than a key reads only its part (`GETRANGE`). Compare with
/// `faultline bench store --chunk 4096,16384,65536`: sequential first
/// touch, fault-around 64, measured at 1.84x (4 KiB), 1.61x (16 KiB),
/// 1.58x (32 KiB) and 1.48x (64 KiB) the file store in one run.
pub const DEFAULT_CHUNK: usize = 64 * 1024;

/// Bytes of a hash-tag group by default (one cluster shard).
const GROUP_BYTES: usize = 1 << 20;

impl RedisConfig {
    /// The defaults with `chunk_bytes` per key and 1 MiB per hash-tag
    /// group (at least one chunk).
    pub fn with_chunk(chunk_bytes: usize) -> RedisConfig {
        RedisConfig {
            chunk_bytes,
            group_chunks: (GROUP_BYTES / chunk_bytes.max(1)).max(1) as u64,
            ..RedisConfig::default()
        }
    }
}

/// What a store's metadata key says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreInfo {
    /// Bytes of data.
    pub len: u64,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// Chunks per hash tag.
    pub group_chunks: u64,
    /// FNV-1a 64 of the data ([`checksum`]).
    pub checksum: u64,
}

/// Where a single-server store's fill time went, summed over its
/// `fill_batch` calls ([`RedisStore::timing`]): writing the requests,
/// waiting for the first reply byte (the server's work and the wake-up),
/// and reading the replies into the buffers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FillTiming {
    /// `fill_batch` calls that sent requests.
    pub calls: u64,
    /// Bytes read into buffers.
    pub bytes: u64,
    /// Nanoseconds writing the pipeline.
    pub send_ns: u64,
    /// Nanoseconds from the write to the first reply byte.
    pub wait_ns: u64,
    /// Nanoseconds reading replies into the buffers.
    pub read_ns: u64,
    /// Fills whose replies had been requested ahead
    /// ([`RedisConfig::read_ahead`]).
    pub ahead_hits: u64,
    /// Fills requested ahead that were dropped unused (another range
    /// came, or a write-back made them stale).
    pub ahead_dropped: u64,
}

/// Failures outside the fault path (opening, `put`, `get`).
#[derive(Debug, thiserror::Error)]
pub enum RedisStoreError {
    /// The URL is not one of the forms in the crate docs.
    #[error("bad store URL {url}: {reason}")]
    Url { url: String, reason: String },
    /// Connecting or a request failed (after retries).
    #[error("{what}: {op} failed: {cause}")]
    Request {
        what: String,
        op: String,
        cause: String,
    },
    /// No metadata key: nothing was put under this name.
    #[error("{what}: no store named {name:?} (key {key} is missing; write one with `faultline store put`)")]
    NoStore {
        what: String,
        name: String,
        key: String,
    },
    /// The metadata key does not parse.
    #[error("{what}: bad metadata in {key}: {reason}")]
    BadMeta {
        what: String,
        key: String,
        reason: String,
    },
    /// `get` read other bytes than `put` wrote.
    #[error("{what}: checksum mismatch: stored {stored:016x}, read {read:016x}")]
    Checksum {
        what: String,
        stored: u64,
        read: u64,
    },
    /// Reading the source or writing the destination.
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        source: std::io::Error,
    },
}

/// FNV-1a 64 of `data`, continuing from `h` (start with [`FNV_START`]).
pub fn checksum(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The FNV-1a 64 offset basis.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Where the store lives.
enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

enum Conn {
    Single(Box<Single>),
    Cluster(Box<ClusterConnection>),
}

/// A single-server connection and its stream read-ahead (see
/// [`RedisConfig::read_ahead`]).
struct Single {
    raw: RawConn,
    /// Where the last one-range fill ended: a fill starting there
    /// continues a stream.
    last_end: Option<u64>,
    /// Fills sent ahead whose replies are still unread, oldest first (at
    /// most one).
    ahead: VecDeque<Ahead>,
}

/// A fill sent ahead of its fault.
struct Ahead {
    offset: u64,
    len: usize,
    /// Replies it owes (one per piece).
    replies: usize,
    /// [`RedisStore`]'s write-backs started when it was sent.
    writes: u64,
}

impl Single {
    /// Reads and drops every reply still owed to fills sent ahead.
    fn drain(&mut self) -> RedisResult<()> {
        while let Some(a) = self.ahead.pop_front() {
            for _ in 0..a.replies {
                self.raw.skip_reply()?;
            }
        }
        Ok(())
    }
}

/// One chunk's part of a fill: `len` bytes at `from` in chunk `chunk`,
/// for `ranges[range].buf[at..at + len]`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    range: usize,
    chunk: u64,
    from: u64,
    at: usize,
    len: usize,
    /// The whole chunk: `GET` rather than `GETRANGE`.
    whole: bool,
}

/// What one piece's reply was: [`Bulk`], or a server error for this key
/// alone (`WRONGTYPE`).
type PieceReply = Result<Bulk, String>;

/// A page store on Redis. See the crate docs.
pub struct RedisStore {
    what: Arc<str>,
    name: String,
    target: Target,
    cfg: RedisConfig,
    info: StoreInfo,
    conns: Mutex<HashMap<ThreadId, Conn>>,
    /// [`FillTiming`]'s fields, in order.
    timing: [AtomicU64; 7],
    /// Write-backs started and finished (ordered with the read-ahead:
    /// see [`RedisConfig::read_ahead`]).
    writes_started: AtomicU64,
    writes_finished: AtomicU64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("what", &self.what)
            .field("info", &self.info)
            .finish()
    }
}

/// Splits `URL#NAME` and builds the client.
fn parse(url: &str, cfg: &RedisConfig) -> Result<(Target, String, String), RedisStoreError> {
    let bad = |reason: String| RedisStoreError::Url {
        url: url.to_string(),
        reason,
    };
    let (base, name) = match url.split_once('#') {
        Some((b, n)) if !n.is_empty() => (b, n.to_string()),
        Some(_) => return Err(bad("empty store name after '#'".into())),
        None => (url, "faultline".to_string()),
    };
    if name.contains(['{', '}']) {
        return Err(bad("the store name may not contain '{' or '}'".into()));
    }
    let target = if let Some(nodes) = base.strip_prefix("redis-cluster://") {
        let nodes: Vec<String> = nodes
            .split(',')
            .filter(|n| !n.is_empty())
            .map(|n| format!("redis://{n}"))
            .collect();
        if nodes.is_empty() {
            return Err(bad("no cluster nodes".into()));
        }
        let client = ClusterClient::builder(nodes)
            .connection_timeout(cfg.connect_timeout)
            .response_timeout(cfg.command_timeout)
            .retries(3)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Target::Cluster(client)
    } else if ["redis://", "redis+unix://", "unix://"]
        .iter()
        .any(|p| base.starts_with(p))
    {
        Target::Single(redis::Client::open(base).map_err(|e| bad(e.to_string()))?)
    } else {
        return Err(bad(
            "expected redis://HOST:PORT, redis+unix:///PATH, unix:///PATH or redis-cluster://HOST:PORT,...".into(),
        ));
    };
    Ok((target, name, format!("redis {base}#")))
}

/// A failed request: the key it was about and why.
struct Failure {
    key: String,
    cause: String,
}

impl RedisStore {
    /// Opens the store at `url` (see the crate docs) with default settings.
    pub fn open(url: &str) -> Result<RedisStore, RedisStoreError> {
        Self::open_with(url, RedisConfig::default())
    }

    /// Opens the store at `url`, reading its metadata key.
    pub fn open_with(url: &str, cfg: RedisConfig) -> Result<RedisStore, RedisStoreError> {
        let (target, name, what) = parse(url, &cfg)?;
        let mut store = RedisStore {
            what: format!("{what}{name}").into(),
            name,
            target,
            cfg,
            info: StoreInfo {
                len: 0,
                chunk_bytes: 0,
                group_chunks: 1,
                checksum: 0,
            },
            conns: Mutex::new(HashMap::new()),
            timing: Default::default(),
            writes_started: AtomicU64::new(0),
            writes_finished: AtomicU64::new(0),
        };
        store.info = store.read_meta()?;
        Ok(store)
    }

    /// What the metadata key says.
    pub fn info(&self) -> StoreInfo {
        self.info
    }

    /// Where the fill time went so far (single server; zeros on a
    /// cluster).
    pub fn timing(&self) -> FillTiming {
        let t = |i: usize| self.timing[i].load(Ordering::Relaxed);
        FillTiming {
            calls: t(0),
            bytes: t(1),
            send_ns: t(2),
            wait_ns: t(3),
            read_ns: t(4),
            ahead_hits: t(5),
            ahead_dropped: t(6),
        }
    }

    /// CPU seconds the server has used (`INFO cpu`: `used_cpu_sys` +
    /// `used_cpu_user`; a cluster answers for one node), for benchmarks
    /// that report the server's CPU share.
    pub fn server_cpu_seconds(&self) -> Result<f64, RedisStoreError> {
        let key = self.meta_key();
        let mut cmd = redis::cmd("INFO");
        cmd.arg("cpu");
        let info: String = self
            .with_conn(&key, |c| c.query(&cmd))
            .map_err(|f| self.request_error("INFO cpu", f))?;
        Ok(info
            .lines()
            .filter_map(|l| {
                l.strip_prefix("used_cpu_sys:")
                    .or_else(|| l.strip_prefix("used_cpu_user:"))
            })
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum())
    }

    /// The store's name (after `#` in the URL).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn meta_key(&self) -> String {
        format!("fl:{{{}}}:meta", self.name)
    }

    /// The key of chunk `c`.
    pub fn chunk_key(&self, c: u64) -> String {
        chunk_key(&self.name, self.info.group_chunks, c)
    }

    fn request_error(&self, op: &str, f: Failure) -> RedisStoreError {
        RedisStoreError::Request {
            what: self.what.to_string(),
            op: format!("{op} ({})", f.key),
            cause: f.cause,
        }
    }

    fn read_meta(&self) -> Result<StoreInfo, RedisStoreError> {
        let key = self.meta_key();
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&key);
        let map: HashMap<String, String> = self
            .with_conn(&key, |c| c.query(&cmd))
            .map_err(|f| self.request_error("reading metadata", f))?;
        if map.is_empty() {
            return Err(RedisStoreError::NoStore {
                what: self.what.to_string(),
                name: self.name.clone(),
                key,
            });
        }
        let field = |k: &str| -> Result<u64, RedisStoreError> {
            map.get(k)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| RedisStoreError::BadMeta {
                    what: self.what.to_string(),
                    key: key.clone(),
                    reason: format!("field {k} missing or not a number"),
                })
        };
        let checksum = map
            .get("checksum")
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .ok_or_else(|| RedisStoreError::BadMeta {
                what: self.what.to_string(),
                key: key.clone(),
                reason: "field checksum missing or not hex".into(),
            })?;
        let info = StoreInfo {
            len: field("len")?,
            chunk_bytes: field("chunk")? as usize,
            group_chunks: field("group")?,
            checksum,
        };
        if info.chunk_bytes == 0 || info.group_chunks == 0 {
            return Err(RedisStoreError::BadMeta {
                what: self.what.to_string(),
                key,
                reason: "zero chunk or group size".into(),
            });
        }
        Ok(info)
    }

    /// Uploads `len` bytes from `src` as the store at `url` (replacing one
    /// of the same name): the chunks in pipelines of 64, then the metadata
    /// key with the checksum. `progress` is called with the bytes written
    /// so far.
    pub fn put(
        url: &str,
        cfg: RedisConfig,
        mut src: impl Read,
        len: u64,
        mut progress: impl FnMut(u64),
    ) -> Result<StoreInfo, RedisStoreError> {
        const BATCH: usize = 64;
        let (target, name, what) = parse(url, &cfg)?;
        if cfg.chunk_bytes == 0 || cfg.group_chunks == 0 {
            return Err(RedisStoreError::Url {
                url: url.into(),
                reason: "chunk and group sizes must be positive".into(),
            });
        }
        let mut store = RedisStore {
            what: format!("{what}{name}").into(),
            name,
            target,
            info: StoreInfo {
                len,
                chunk_bytes: cfg.chunk_bytes,
                group_chunks: cfg.group_chunks,
                checksum: 0,
            },
            cfg,
            conns: Mutex::new(HashMap::new()),
            timing: Default::default(),
            writes_started: AtomicU64::new(0),
            writes_finished: AtomicU64::new(0),
        };
        let meta = store.meta_key();
        let mut del = redis::cmd("DEL");
        del.arg(&meta);
        store
            .with_conn(&meta, |c| c.query::<()>(&del))
            .map_err(|f| store.request_error("removing the old metadata", f))?;
        let chunk = store.info.chunk_bytes;
        let mut buf = vec![0u8; chunk * BATCH];
        let mut h = FNV_START;
        let mut done = 0u64;
        while done < len {
            let n = ((len - done) as usize).min(buf.len());
            src.read_exact(&mut buf[..n])
                .map_err(|source| RedisStoreError::Io {
                    op: "reading the source",
                    source,
                })?;
            h = checksum(h, &buf[..n]);
            let first = done / chunk as u64;
            let cmds: Vec<Cmd> = buf[..n]
                .chunks(chunk)
                .enumerate()
                .map(|(i, data)| {
                    let mut c = redis::cmd("SET");
                    c.arg(store.chunk_key(first + i as u64)).arg(data);
                    c
                })
                .collect();
            let key = store.chunk_key(first);
            store
                .with_conn(&key, |c| c.pipeline(&cmds))
                .map_err(|f| store.request_error("writing chunks", f))?;
            done += n as u64;
            progress(done);
        }
        store.info.checksum = h;
        let mut hset = redis::cmd("HSET");
        hset.arg(&meta)
            .arg("len")
            .arg(len)
            .arg("chunk")
            .arg(chunk)
            .arg("group")
            .arg(store.info.group_chunks)
            .arg("checksum")
            .arg(format!("{h:016x}"));
        store
            .with_conn(&meta, |c| c.query::<()>(&hset))
            .map_err(|f| store.request_error("writing metadata", f))?;
        Ok(store.info)
    }

    /// Downloads the store into `dst`, checking the checksum; returns it.
    pub fn get(
        &self,
        mut dst: impl Write,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, RedisStoreError> {
        const STEP: usize = 1 << 20;
        let mut buf = vec![0u8; STEP];
        let mut h = FNV_START;
        let mut done = 0u64;
        while done < self.info.len {
            let n = ((self.info.len - done) as usize).min(STEP);
            self.fill(done, &mut buf[..n])
                .map_err(|e| RedisStoreError::Request {
                    what: self.what.to_string(),
                    op: "reading chunks".into(),
                    cause: e.to_string(),
                })?;
            h = checksum(h, &buf[..n]);
            dst.write_all(&buf[..n])
                .map_err(|source| RedisStoreError::Io {
                    op: "writing the destination",
                    source,
                })?;
            done += n as u64;
            progress(done);
        }
        if h != self.info.checksum {
            return Err(RedisStoreError::Checksum {
                what: self.what.to_string(),
                stored: self.info.checksum,
                read: h,
            });
        }
        Ok(h)
    }

    /// Runs `f` on this thread's connection, reconnecting and retrying
    /// with backoff until the deadline. `key` names the request in errors.
    fn with_conn<T>(
        &self,
        key: &str,
        mut f: impl FnMut(&mut Conn) -> RedisResult<T>,
    ) -> Result<T, Failure> {
        let start = Instant::now();
        let me = std::thread::current().id();
        let mut backoff = Duration::from_millis(10);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let taken = self.conns.lock().expect("conns").remove(&me);
            let res = match taken {
                Some(c) => Ok(c),
                None => self.connect(),
            }
            .and_then(|mut c| f(&mut c).map(|v| (v, c)));
            let err = match res {
                Ok((v, c)) => {
                    self.conns.lock().expect("conns").insert(me, c);
                    return Ok(v);
                }
                Err(e) => e,
            };
            // The connection is dropped: after a timeout it may still owe
            // a reply.
            let elapsed = start.elapsed();
            if !retryable(&err) || elapsed + backoff > self.cfg.deadline {
                return Err(Failure {
                    key: key.to_string(),
                    cause: format!("{err} ({tries} tries over {:.1} s)", elapsed.as_secs_f64()),
                });
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    fn connect(&self) -> RedisResult<Conn> {
        match &self.target {
            Target::Single(client) => Ok(Conn::Single(Box::new(Single {
                raw: RawConn::connect(
                    client.get_connection_info(),
                    self.cfg.connect_timeout,
                    self.cfg.command_timeout,
                )?,
                last_end: None,
                ahead: VecDeque::new(),
            }))),
            Target::Cluster(client) => Ok(Conn::Cluster(Box::new(client.get_connection()?))),
        }
    }

    /// Chunks covering `[offset, offset + len)` inside the store's length.
    fn chunks(&self, offset: u64, len: usize) -> std::ops::Range<u64> {
        let c = self.info.chunk_bytes as u64;
        let end = (offset + len as u64).min(self.info.len);
        if offset >= end {
            return 0..0;
        }
        offset / c..end.div_ceil(c)
    }

    /// Bytes chunk `c` holds (the last one may be short).
    fn chunk_len(&self, c: u64) -> u64 {
        let cb = self.info.chunk_bytes as u64;
        cb.min(self.info.len - c * cb)
    }

    /// The chunk pieces of `[offset, offset + len)` inside the store's
    /// length, `at` counted from `offset`, tagged with `range`.
    fn pieces_of(&self, range: usize, offset: u64, len: usize, out: &mut Vec<Piece>) {
        let cb = self.info.chunk_bytes as u64;
        let end = (offset + len as u64).min(self.info.len);
        for c in self.chunks(offset, len) {
            let (lo, hi) = (offset.max(c * cb), end.min((c + 1) * cb));
            out.push(Piece {
                range,
                chunk: c,
                from: lo - c * cb,
                at: (lo - offset) as usize,
                len: (hi - lo) as usize,
                whole: lo == c * cb && hi - lo == self.chunk_len(c),
            });
        }
    }

    fn remote(
        &self,
        chunk: u64,
        offset: u64,
        cause: impl Into<std::borrow::Cow<'static, str>>,
    ) -> StoreError {
        StoreError::Remote {
            what: self.what.clone(),
            key: self.chunk_key(chunk).into(),
            offset,
            cause: cause.into(),
        }
    }

    /// Reads every piece into its range's buffer in one round trip: one
    /// `GET` (whole chunk) or `GETRANGE` (part of one) per piece, in one
    /// pipeline; on a single server each bulk is read straight into the
    /// buffer (`resp.rs`). One reply per piece.
    fn read_pieces(
        &self,
        c: &mut Conn,
        pieces: &[Piece],
        ranges: &mut [FillRange<'_>],
    ) -> RedisResult<Vec<PieceReply>> {
        let mut replies = Vec::with_capacity(pieces.len());
        match c {
            Conn::Single(sc) => {
                let one = (ranges.len() == 1).then(|| (ranges[0].offset, ranges[0].buf.len()));
                let started = self.writes_started.load(Ordering::SeqCst);
                // This very fill may have been sent ahead.
                let hit = match (one, sc.ahead.front()) {
                    (Some((o, l)), Some(a)) => a.offset == o && a.len == l && a.writes == started,
                    _ => false,
                };
                if hit {
                    sc.ahead.pop_front();
                    self.timing[5].fetch_add(1, Ordering::Relaxed);
                } else if !sc.ahead.is_empty() {
                    self.timing[6].fetch_add(sc.ahead.len() as u64, Ordering::Relaxed);
                    sc.drain()?;
                }
                let mut key = String::new();
                let mut pack = |raw: &mut RawConn, p: &Piece| {
                    key.clear();
                    write_chunk_key(&mut key, &self.name, self.info.group_chunks, p.chunk);
                    if p.whole {
                        raw.pack(&[b"GET", key.as_bytes()]);
                    } else {
                        let (a, b) = (p.from.to_string(), (p.from + p.len as u64 - 1).to_string());
                        raw.pack(&[b"GETRANGE", key.as_bytes(), a.as_bytes(), b.as_bytes()]);
                    }
                };
                let rc = &mut sc.raw;
                rc.wbuf.clear();
                if !hit {
                    pieces.iter().for_each(|p| pack(rc, p));
                }
                // A stream: the next range goes out now. Not while a
                // write-back runs (its SET may land after these GETs).
                if let Some((o, l)) = one.filter(|&(o, _)| hit || sc.last_end == Some(o)) {
                    let next = o + l as u64;
                    if self.cfg.read_ahead
                        && next < self.info.len
                        && started == self.writes_finished.load(Ordering::SeqCst)
                    {
                        let mut ahead = Vec::new();
                        self.pieces_of(0, next, l, &mut ahead);
                        ahead.iter().for_each(|p| pack(rc, p));
                        sc.ahead.push_back(Ahead {
                            offset: next,
                            len: l,
                            replies: ahead.len(),
                            writes: started,
                        });
                    }
                }
                sc.last_end = one.map(|(o, l)| o + l as u64);
                let t0 = Instant::now();
                if !rc.wbuf.is_empty() {
                    rc.send()?;
                }
                let t1 = Instant::now();
                rc.await_reply()?;
                let t2 = Instant::now();
                // Every reply is read, so the connection stays in step; a
                // retryable error reply (`LOADING`) fails the whole batch
                // (it is retried), another fails its piece.
                let mut retry = None;
                for p in pieces {
                    let dst = &mut ranges[p.range].buf[p.at..p.at + p.len];
                    match rc.read_bulk_into(dst) {
                        Ok(b) => replies.push(Ok(b)),
                        Err(e) if e.is_io_error() || e.is_timeout() => return Err(e),
                        Err(e) if retryable(&e) => {
                            retry.get_or_insert(e);
                            replies.push(Ok(Bulk::Nil));
                        }
                        Err(e) => replies.push(Err(e.to_string())),
                    }
                }
                if let Some(e) = retry {
                    return Err(e);
                }
                let t3 = Instant::now();
                let bytes: usize = pieces.iter().map(|p| p.len).sum();
                for (i, v) in [
                    1,
                    bytes as u64,
                    (t1 - t0).as_nanos() as u64,
                    (t2 - t1).as_nanos() as u64,
                    (t3 - t2).as_nanos() as u64,
                ]
                .into_iter()
                .enumerate()
                {
                    self.timing[i].fetch_add(v, Ordering::Relaxed);
                }
            }
            Conn::Cluster(cc) => {
                let mut pipe = redis::cluster::cluster_pipe();
                for p in pieces {
                    let key = self.chunk_key(p.chunk);
                    if p.whole {
                        pipe.cmd("GET").arg(key);
                    } else {
                        pipe.cmd("GETRANGE")
                            .arg(key)
                            .arg(p.from)
                            .arg(p.from + p.len as u64 - 1);
                    }
                }
                let values: Vec<Value> = pipe.query(cc.as_mut())?;
                for (p, v) in pieces.iter().zip(values) {
                    replies.push(match v {
                        Value::Nil => Ok(Bulk::Nil),
                        Value::BulkString(b) if b.len() == p.len => {
                            ranges[p.range].buf[p.at..p.at + p.len].copy_from_slice(&b);
                            Ok(Bulk::Filled)
                        }
                        Value::BulkString(b) => Ok(Bulk::Length(b.len())),
                        Value::ServerError(e) => Err(RedisError::from(e).to_string()),
                        other => Err(format!("unexpected reply {other:?}")),
                    });
                }
            }
        }
        Ok(replies)
    }
}

fn chunk_key(name: &str, group: u64, c: u64) -> String {
    let mut k = String::new();
    write_chunk_key(&mut k, name, group, c);
    k
}

fn write_chunk_key(k: &mut String, name: &str, group: u64, c: u64) {
    use std::fmt::Write as _;
    let _ = write!(k, "fl:{{{name}:{}}}:{c}", c / group);
}

/// Errors worth a reconnect and a retry: the server is down, slow,
/// loading, or the cluster is re-sharding.
fn retryable(e: &RedisError) -> bool {
    use redis::ErrorKind::*;
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            BusyLoadingError
                | TryAgain
                | ClusterDown
                | MasterDown
                | IoError
                | ClusterConnectionNotFound
        )
}

impl Conn {
    /// One request and its reply.
    fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(sc) => {
                sc.drain()?;
                let c = &mut sc.raw;
                c.wbuf.clear();
                cmd.write_packed_command(&mut c.wbuf);
                c.send()?;
                T::from_owned_redis_value(c.read_value()?.extract_error()?)
            }
            Conn::Cluster(c) => cmd.query(c.as_mut()),
        }
    }

    /// Requests whose replies are only checked for errors (writes), in
    /// one pipeline.
    fn pipeline(&mut self, cmds: &[Cmd]) -> RedisResult<()> {
        match self {
            Conn::Single(sc) => {
                sc.drain()?;
                let c = &mut sc.raw;
                c.wbuf.clear();
                cmds.iter()
                    .for_each(|cmd| cmd.write_packed_command(&mut c.wbuf));
                c.send()?;
                let mut first = None;
                for _ in cmds {
                    if let Err(e) = c.read_value()?.extract_error() {
                        first.get_or_insert(e);
                    }
                }
                first.map_or(Ok(()), Err)
            }
            Conn::Cluster(c) => {
                let mut p = redis::cluster::cluster_pipe();
                cmds.iter().for_each(|cmd| {
                    p.add_command(cmd.clone());
                });
                p.query::<Vec<Value>>(c.as_mut()).map(|_| ())
            }
        }
    }
}

impl PageStore for RedisStore {
    fn describe(&self) -> &str {
        &self.what
    }

    fn len(&self) -> Option<u64> {
        Some(self.info.len)
    }

    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let mut one = [FillRange { offset, buf }];
        let mut out = [Ok(())];
        self.fill_batch(&mut one, &mut out);
        let [res] = out;
        res
    }

    fn fill_batch(&self, ranges: &mut [FillRange<'_>], out: &mut [Result<(), StoreError>]) {
        let mut pieces = Vec::new();
        for (i, r) in ranges.iter_mut().enumerate() {
            // Past the store's end: zeros.
            let inside = self
                .info
                .len
                .saturating_sub(r.offset)
                .min(r.buf.len() as u64);
            r.buf[inside as usize..].fill(0);
            self.pieces_of(i, r.offset, r.buf.len(), &mut pieces);
        }
        out.iter_mut().for_each(|o| *o = Ok(()));
        let Some(first) = pieces.first() else {
            return;
        };
        let res = self.with_conn(&self.chunk_key(first.chunk), |c| {
            self.read_pieces(c, &pieces, ranges)
        });
        let replies: Vec<PieceReply> = match res {
            Ok(replies) => replies,
            Err(f) => vec![Err(f.cause); pieces.len()],
        };
        for (p, reply) in pieces.iter().zip(replies) {
            let cause = match reply {
                Ok(Bulk::Filled) => continue,
                Ok(Bulk::Nil) => format!(
                    "the key is missing, inside the store's length {:#x}",
                    self.info.len
                ),
                Ok(Bulk::Length(n)) => format!(
                    "read {n} bytes at {:#x} of the key where {} were expected: the key is short or missing, inside the store's length {:#x}",
                    p.from, p.len, self.info.len
                ),
                Err(e) => e,
            };
            let o = &mut out[p.range];
            if o.is_ok() {
                *o = Err(self.remote(p.chunk, ranges[p.range].offset + p.at as u64, cause));
            }
        }
    }

    fn batched(&self) -> bool {
        true
    }

    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let mut out = [Ok(())];
        self.write_back_batch(&[WriteRange { offset, data }], &mut out);
        let [res] = out;
        res
    }

    fn write_back_batch(&self, ranges: &[WriteRange<'_>], out: &mut [Result<(), StoreError>]) {
        // Bytes past the store's end must be zeros (the region's tail); a
        // range that breaks this fails alone.
        let mut pieces = Vec::new();
        for (i, (r, o)) in ranges.iter().zip(out.iter_mut()).enumerate() {
            let inside = self
                .info
                .len
                .saturating_sub(r.offset)
                .min(r.data.len() as u64) as usize;
            *o = match r.data[inside..].iter().position(|&b| b != 0) {
                Some(k) => {
                    let at = r.offset + (inside + k) as u64;
                    Err(self.remote(
                        at / self.info.chunk_bytes as u64,
                        at,
                        format!("write past the store's end {:#x}", self.info.len),
                    ))
                }
                None => {
                    self.pieces_of(i, r.offset, inside, &mut pieces);
                    Ok(())
                }
            };
        }
        let Some(first) = pieces.first() else {
            return;
        };
        // One pipeline: a whole chunk is a SET, part of one a SETRANGE.
        let cmds: Vec<Cmd> = pieces
            .iter()
            .map(|p| {
                let mut cmd = redis::cmd(if p.whole { "SET" } else { "SETRANGE" });
                cmd.arg(self.chunk_key(p.chunk));
                if !p.whole {
                    cmd.arg(p.from);
                }
                cmd.arg(&ranges[p.range].data[p.at..p.at + p.len]);
                cmd
            })
            .collect();
        self.writes_started.fetch_add(1, Ordering::SeqCst);
        let res = self.with_conn(&self.chunk_key(first.chunk), |c| c.pipeline(&cmds));
        self.writes_finished.fetch_add(1, Ordering::SeqCst);
        if let Err(f) = res {
            // Which SET failed is not known: every range written here
            // stays dirty.
            for p in &pieces {
                if out[p.range].is_ok() {
                    out[p.range] = Err(self.remote(
                        p.chunk,
                        ranges[p.range].offset + p.at as u64,
                        f.cause.clone(),
                    ));
                }
            }
        }
    }
}
