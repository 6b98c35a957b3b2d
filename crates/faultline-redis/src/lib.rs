//! A faultline page store on Redis, Redis Cluster or Valkey.
//!
//! [`RedisStore`] implements [`faultline::PageStore`] over a Redis server:
//! the store's bytes are fixed-size chunks (default 4 KiB) under keys
//!
//! ```text
//! fl:{NAME:G}:C      chunk C (bytes C*chunk .. (C+1)*chunk), G = C / group_chunks
//! fl:{NAME}:meta     a hash: len, chunk, group, checksum (written last by `put`)
//! ```
//!
//! The hash tag `{NAME:G}` keeps a group of chunks (default 256, 1 MiB) on
//! one cluster shard, so a read-ahead window is one request to one node.
//! The store is [`batched`](faultline::PageStore::batched): a window, with
//! all its holes, is one round trip: one pipeline of `MGET`s (at most 16
//! keys each, one or more per
//! group) on a single server, one cluster pipeline of `GET`s on a cluster
//! (the client sends one pipeline per node; `MGET` cannot be pipelined
//! there). Write-back is a pipeline of `SET`s.
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

pub mod server;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use faultline::{FillRange, PageStore, StoreError};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Cmd, RedisError, RedisResult};

/// Settings of a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Bytes per chunk (key) for [`RedisStore::put`]; opening a store
    /// takes the chunk size from its metadata. Default 4096.
    pub chunk_bytes: usize,
    /// Chunks per hash tag (on one cluster shard). Default 256.
    pub group_chunks: u64,
    /// Connecting. Default 1 s.
    pub connect_timeout: Duration,
    /// One request's reply. Default 1 s.
    pub command_timeout: Duration,
    /// Retries with backoff end this long after the first try. Default 5 s.
    pub deadline: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            chunk_bytes: 4096,
            group_chunks: 256,
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_secs(1),
            deadline: Duration::from_secs(5),
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

/// Most keys in one MGET: the client reads a window faster as several
/// replies of at most 16 chunks than as one large one (`faultline bench
/// store`, fault-around 64: 14.3 us a page with one 64-key MGET, 4.0 us
/// with four of 16); they still go in one pipeline, one round trip.
const MGET_KEYS: usize = 16;

/// The FNV-1a 64 offset basis.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Where the store lives.
enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

enum Conn {
    Single(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

/// A page store on Redis. See the crate docs.
pub struct RedisStore {
    what: Arc<str>,
    name: String,
    target: Target,
    cfg: RedisConfig,
    info: StoreInfo,
    conns: Mutex<HashMap<ThreadId, Conn>>,
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
        };
        store.info = store.read_meta()?;
        Ok(store)
    }

    /// What the metadata key says.
    pub fn info(&self) -> StoreInfo {
        self.info
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
            .with_conn(&key, |c| query(c, &cmd))
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
        };
        let meta = store.meta_key();
        let mut del = redis::cmd("DEL");
        del.arg(&meta);
        store
            .with_conn(&meta, |c| query::<()>(c, &del))
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
                .with_conn(&key, |c| pipeline::<Vec<redis::Value>>(c, &cmds))
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
            .with_conn(&meta, |c| query::<()>(c, &hset))
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
            Target::Single(client) => {
                let c = client.get_connection_with_timeout(self.cfg.connect_timeout)?;
                c.set_read_timeout(Some(self.cfg.command_timeout))?;
                c.set_write_timeout(Some(self.cfg.command_timeout))?;
                Ok(Conn::Single(c))
            }
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

    /// The requests for `chunks` (in order): on a single server one MGET
    /// per run of keys in the same hash-tag group, on a cluster one GET
    /// per key (MGET cannot be pipelined there).
    fn read_cmds(&self, chunks: impl Iterator<Item = u64>) -> Vec<Cmd> {
        let g = self.info.group_chunks;
        let mut cmds: Vec<Cmd> = Vec::new();
        let mut group = None;
        let mut keys = 0;
        for c in chunks {
            match self.target {
                Target::Single(_) if group == Some(c / g) && keys < MGET_KEYS => {
                    cmds.last_mut().expect("open MGET").arg(self.chunk_key(c));
                    keys += 1;
                }
                Target::Single(_) => {
                    let mut cmd = redis::cmd("MGET");
                    cmd.arg(self.chunk_key(c));
                    cmds.push(cmd);
                    group = Some(c / g);
                    keys = 1;
                }
                Target::Cluster(_) => {
                    let mut cmd = redis::cmd("GET");
                    cmd.arg(self.chunk_key(c));
                    cmds.push(cmd);
                }
            }
        }
        cmds
    }

    /// Copies chunk values into `buf` (at store `offset`); a missing key is
    /// an error.
    fn scatter(
        &self,
        offset: u64,
        buf: &mut [u8],
        values: &mut impl Iterator<Item = Option<Vec<u8>>>,
    ) -> Result<(), StoreError> {
        let cb = self.info.chunk_bytes as u64;
        buf.fill(0);
        for c in self.chunks(offset, buf.len()) {
            let key_off = c * cb;
            let Some(v) = values.next().flatten() else {
                return Err(self.remote(
                    c,
                    offset.max(key_off),
                    format!(
                        "the key is missing, inside the store's length {:#x}",
                        self.info.len
                    ),
                ));
            };
            // The overlap of the chunk [key_off, key_off + v.len()) with
            // the buffer [offset, offset + buf.len()).
            let from = key_off.max(offset);
            let to = (key_off + v.len() as u64).min(offset + buf.len() as u64);
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&v[(from - key_off) as usize..(to - key_off) as usize]);
            }
        }
        Ok(())
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

    /// Runs read commands and flattens the replies to one value per chunk.
    fn read(&self, cmds: &[Cmd], first_key: &str) -> Result<Vec<Option<Vec<u8>>>, Failure> {
        self.with_conn(first_key, |c| match c {
            Conn::Single(_) => Ok(pipeline::<Vec<Vec<Option<Vec<u8>>>>>(c, cmds)?
                .into_iter()
                .flatten()
                .collect()),
            Conn::Cluster(_) => pipeline::<Vec<Option<Vec<u8>>>>(c, cmds),
        })
    }
}

fn chunk_key(name: &str, group: u64, c: u64) -> String {
    format!("fl:{{{name}:{}}}:{c}", c / group)
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

fn query<T: redis::FromRedisValue>(c: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
    match c {
        Conn::Single(c) => cmd.query(c),
        Conn::Cluster(c) => cmd.query(c.as_mut()),
    }
}

fn pipeline<T: redis::FromRedisValue>(c: &mut Conn, cmds: &[Cmd]) -> RedisResult<T> {
    match c {
        Conn::Single(c) => {
            let mut p = redis::pipe();
            cmds.iter().for_each(|cmd| {
                p.add_command(cmd.clone());
            });
            p.query(c)
        }
        Conn::Cluster(c) => {
            let mut p = redis::cluster::cluster_pipe();
            cmds.iter().for_each(|cmd| {
                p.add_command(cmd.clone());
            });
            p.query(c.as_mut())
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
        let cmds = self.read_cmds(
            ranges
                .iter()
                .flat_map(|r| self.chunks(r.offset, r.buf.len())),
        );
        let first = ranges
            .iter()
            .map(|r| self.chunks(r.offset, r.buf.len()))
            .find(|c| !c.is_empty());
        let Some(first) = first else {
            // Everything is past the end: zeros.
            ranges.iter_mut().for_each(|r| r.buf.fill(0));
            out.iter_mut().for_each(|o| *o = Ok(()));
            return;
        };
        match self.read(&cmds, &self.chunk_key(first.start)) {
            Ok(values) => {
                let mut values = values.into_iter();
                for (r, o) in ranges.iter_mut().zip(out.iter_mut()) {
                    let n = self.chunks(r.offset, r.buf.len()).count();
                    let mine: Vec<_> = values.by_ref().take(n).collect();
                    *o = self.scatter(r.offset, r.buf, &mut mine.into_iter());
                }
            }
            Err(f) => {
                for (r, o) in ranges.iter().zip(out.iter_mut()) {
                    let chunks = self.chunks(r.offset, r.buf.len());
                    *o = Err(self.remote(chunks.start, r.offset, f.cause.clone()));
                }
            }
        }
    }

    fn batched(&self) -> bool {
        true
    }

    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let cb = self.info.chunk_bytes as u64;
        let last = self.info.len.div_ceil(cb);
        let first = offset / cb;
        let end = offset + data.len() as u64;
        if !offset.is_multiple_of(cb) || (!end.is_multiple_of(cb) && end < self.info.len) {
            return Err(self.remote(
                first,
                offset,
                format!(
                    "write-back of {} bytes at {offset:#x} is not chunk-aligned ({cb} bytes)",
                    data.len()
                ),
            ));
        }
        let mut cmds = Vec::new();
        for (i, piece) in data.chunks(cb as usize).enumerate() {
            let c = first + i as u64;
            if c >= last {
                if piece.iter().any(|&b| b != 0) {
                    return Err(self.remote(
                        c,
                        c * cb,
                        format!("write past the store's end {:#x}", self.info.len),
                    ));
                }
                continue;
            }
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.chunk_key(c)).arg(piece);
            cmds.push(cmd);
        }
        if cmds.is_empty() {
            return Ok(());
        }
        self.with_conn(&self.chunk_key(first), |c| {
            pipeline::<Vec<redis::Value>>(c, &cmds)
        })
        .map(|_| ())
        .map_err(|f| self.remote(first, offset, f.cause))
    }
}
