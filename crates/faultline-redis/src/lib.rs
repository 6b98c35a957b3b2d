//! A faultline page store on Redis, Redis Cluster or Valkey.
//!
//! [`RedisStore`] implements [`faultline::PageStore`] over a Redis server:
//! the store's bytes are fixed-size chunks (default 64 KiB) of one
//! *generation*, under keys
//!
//! ```text
//! fl:{NAME:G}:gID:C   chunk C of generation ID (bytes C*chunk ..
//!                     (C+1)*chunk), G = C / group_chunks
//! fl:{NAME}:meta      a hash: len, chunk, group, checksum, gen (the
//!                     generation readers open; switched last by `put`)
//! fl:{NAME}:gens      a hash: uploads in progress, generations to remove
//! ```
//!
//! (`layout.rs` has the details; a store written before generations has
//! chunk keys `fl:{NAME:G}:C` and no `gen`: it opens, reads and is
//! replaced the same way, as generation 0.) The hash tag `{NAME:G}` keeps
//! a group of chunks (default 1 MiB) on one cluster shard, so a
//! read-ahead window is one request to one node.
//! The store is [`batched`](faultline::PageStore::batched): a window, with
//! all its holes, is one round trip: one pipeline with a `GET` per whole
//! chunk and a `GETRANGE` per part of one (a chunk may be larger than a
//! window or a page). On a single server the replies are read by this
//! crate straight into the faulting region's buffer (`resp.rs`: no
//! allocation or copy per key; why not the `redis` crate's reader is
//! written there); on a cluster the `redis` crate's cluster pipeline
//! sends one pipeline per node. Every reply must have exactly the length
//! asked for: a missing or short key inside the store's length is an
//! error. Write-back is one pipeline of `SET ... XX`s (whole chunks) and
//! guarded `SETRANGE`s (parts: a script that writes only into an
//! existing key), so any page size works with any chunk size and a
//! write-back never recreates a removed chunk; a `flush` batch
//! (`PageStore::write_back_batch`, up to 64 pages) is one pipeline, its
//! adjacent pages of one chunk one command (16 dirty 4 KiB pages of a
//! 64 KiB chunk: one `SET XX`).
//!
//! # Replacing a store
//!
//! [`RedisStore::put`] over an existing name never touches the generation
//! readers use: it uploads a new generation under new keys, switches the
//! metadata to it in one step (one script on the metadata's slot, atomic
//! on a cluster too), then removes the old generation's chunks. An upload
//! that fails or is interrupted leaves the old store as it was and
//! removes its own chunks; one that is killed leaves them recorded, and
//! [`RedisStore::gc`] (`faultline store gc URL`) or the next `put` of the
//! name removes them once its process has ended. `generation.rs` has
//! the steps.
//!
//! A [`RedisStore`] reads the generation it opened, and only that one:
//! no read returns bytes of another generation. When a `put` replaces
//! it, its chunks are removed right after the switch (no grace period:
//! a replaced store frees its memory at once), and a reader that still
//! has pages to fetch gets an error for them, never zeros or the new
//! store's bytes: the faulting page is poisoned with a message saying
//! that generation N was replaced by generation M and the store must be
//! opened again (a write-back fails the same way and stays dirty). A
//! long-running server (`faultline serve --store`) therefore serves a
//! snapshot until it is replaced; restart it, or put the new snapshot
//! under a new name, to switch.
//!
//! A sequential stream is read ahead on a single server
//! ([`RedisConfig::read_ahead`]): a fill that continues the previous one
//! sends the request for the next range in the same write, so the
//! server prepares it while the faulting window is installed; a
//! write-back of this store started since makes it stale (dropped and
//! read again).
//!
//! Chunk size: `faultline bench store --chunk 4096,16384,65536` measures
//! them side by side; 64 KiB is the default (see the workspace README);
//! `put` takes [`MIN_CHUNK`] to [`MAX_CHUNK`].
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

mod config;
mod conn;
mod error;
mod generation;
mod layout;
mod owner;
mod resp;
pub mod server;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use faultline::{FillRange, PageStore, StoreError, WriteRange};
use redis::{Cmd, RedisError, RedisResult, Value};

pub use config::{RedisConfig, DEFAULT_CHUNK, MAX_CHUNK, MAX_GROUP, MIN_CHUNK};
pub use error::RedisStoreError;
pub use generation::{GcReport, Removed, Replaced};
pub use layout::{checksum, StoreInfo, FNV_START};

use conn::{Ahead, Client, Conn};
use resp::{Bulk, RawConn};

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
    client: Client,
    info: StoreInfo,
    /// [`FillTiming`]'s fields, in order.
    timing: [AtomicU64; 7],
    /// Write-backs started and finished (ordered with the read-ahead:
    /// see [`RedisConfig::read_ahead`]).
    writes_started: AtomicU64,
    writes_finished: AtomicU64,
    /// Set once a failed read found the generation replaced: the note
    /// its errors carry.
    replaced: OnceLock<String>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("what", &self.client.what)
            .field("info", &self.info)
            .finish()
    }
}

impl RedisStore {
    /// Opens the store at `url` (see the crate docs) with default settings.
    pub fn open(url: &str) -> Result<RedisStore, RedisStoreError> {
        Self::open_with(url, RedisConfig::default())
    }

    /// Opens the store at `url`, reading its metadata key: the store
    /// reads that generation from then on (see the crate docs).
    pub fn open_with(url: &str, cfg: RedisConfig) -> Result<RedisStore, RedisStoreError> {
        let client = Client::open(url, cfg)?;
        let info = generation::read_meta(&client)?.ok_or_else(|| RedisStoreError::NoStore {
            what: client.what.to_string(),
            name: client.name.clone(),
            key: layout::meta_key(&client.name),
        })?;
        Ok(RedisStore {
            client,
            info,
            timing: Default::default(),
            writes_started: AtomicU64::new(0),
            writes_finished: AtomicU64::new(0),
            replaced: OnceLock::new(),
        })
    }

    /// What the metadata key said when the store was opened.
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
        let key = layout::meta_key(&self.client.name);
        let mut cmd = redis::cmd("INFO");
        cmd.arg("cpu");
        let info: String = self.client.query("INFO cpu", &key, &cmd)?;
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
        &self.client.name
    }

    /// The key of chunk `c` (of the generation this store reads).
    pub fn chunk_key(&self, c: u64) -> String {
        layout::chunk_key(
            &self.client.name,
            self.info.group_chunks,
            self.info.generation,
            c,
        )
    }

    /// Uploads `len` bytes from `src` as the store at `url`, replacing one
    /// of the same name in one step (see [`RedisStore::replace`]).
    pub fn put(
        url: &str,
        cfg: RedisConfig,
        src: impl Read,
        len: u64,
        progress: impl FnMut(u64),
    ) -> Result<StoreInfo, RedisStoreError> {
        Self::replace(url, cfg, src, len, progress).map(|r| r.info)
    }

    /// Uploads `len` bytes from `src` as a new generation of the store at
    /// `url` (4 MiB of chunks per pipeline), then switches the metadata
    /// to it and removes the generation it replaced (crate docs,
    /// "Replacing a store"). `cfg`'s chunk and tag sizes are checked
    /// first ([`RedisConfig::check_put`]). `progress` is called with the
    /// bytes written so far. Any error before the switch (a request, or
    /// `src` failing: a reader that fails when the user interrupts stops
    /// the upload the same way) leaves the store as it was and is
    /// [`RedisStoreError::Abandoned`], saying whether the partial
    /// generation was removed.
    pub fn replace(
        url: &str,
        cfg: RedisConfig,
        src: impl Read,
        len: u64,
        progress: impl FnMut(u64),
    ) -> Result<Replaced, RedisStoreError> {
        let client = Client::open(url, cfg)?;
        generation::put(&client, src, len, progress)
    }

    /// Removes what no metadata names under the store's name at `url`:
    /// generations replaced but not yet removed, uploads whose process
    /// ended (or whose lease ran out), and any chunk key that is neither
    /// of the current generation (inside its length) nor of an upload in
    /// progress (`SCAN` on every master). Says what it removed and kept.
    pub fn gc(url: &str, cfg: RedisConfig) -> Result<GcReport, RedisStoreError> {
        let client = Client::open(url, cfg)?;
        generation::gc(&client)
    }

    /// Downloads the store into `dst`, checking the checksum; returns it.
    /// `dst` gets bytes before they are checked: write to a temporary
    /// file and keep it only on success (`faultline store get` does).
    pub fn get(
        &self,
        mut dst: impl Write,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, RedisStoreError> {
        const STEP: usize = 1 << 20;
        let mut buf = vec![0u8; STEP.min(self.info.len as usize)];
        let mut h = FNV_START;
        let mut done = 0u64;
        while done < self.info.len {
            let n = ((self.info.len - done) as usize).min(STEP);
            self.fill(done, &mut buf[..n])
                .map_err(|e| RedisStoreError::Request {
                    what: self.client.what.to_string(),
                    op: "reading chunks".into(),
                    cause: e.to_string(),
                    errno: None,
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
                what: self.client.what.to_string(),
                stored: self.info.checksum,
                read: h,
            });
        }
        Ok(h)
    }

    /// Why a chunk of this store's generation may be missing: a note for
    /// errors if the metadata names another generation now (a `put`
    /// replaced it) or nothing, `""` otherwise. Asked only when a key was
    /// missing or short.
    fn replaced_note(&self) -> String {
        if let Some(n) = self.replaced.get() {
            return n.clone();
        }
        let note = match generation::read_meta(&self.client) {
            Ok(Some(now)) if now.generation == self.info.generation => return String::new(),
            Ok(Some(now)) => format!(
                "; generation {} of the store, which this reader opened, was replaced by generation {} and its chunks are being removed: open the store again to read the new one",
                self.info.generation, now.generation
            ),
            Ok(None) => format!(
                "; generation {} of the store, which this reader opened, was removed with its metadata",
                self.info.generation
            ),
            Err(_) => return String::new(),
        };
        self.replaced.get_or_init(|| note).clone()
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
            what: self.client.what.clone(),
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
                    layout::write_chunk_key(
                        &mut key,
                        &self.client.name,
                        self.info.group_chunks,
                        self.info.generation,
                        p.chunk,
                    );
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
                    if self.client.cfg.read_ahead
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
                        Err(e) if conn::retryable(&e) => {
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

impl PageStore for RedisStore {
    fn describe(&self) -> &str {
        &self.client.what
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
        let res = self.client.with_conn(&self.chunk_key(first.chunk), |c| {
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
                    "the key is missing, inside the store's length {:#x}{}",
                    self.info.len,
                    self.replaced_note()
                ),
                Ok(Bulk::Length(n)) => format!(
                    "read {n} bytes at {:#x} of the key where {} were expected: the key is short or missing, inside the store's length {:#x}{}",
                    p.from,
                    p.len,
                    self.info.len,
                    self.replaced_note()
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
        // Pieces that follow each other in one chunk (adjacent pages of a
        // flush) go as one write. One pipeline: a whole chunk is a SET XX,
        // part of one a SETRANGE in a script; neither creates a missing
        // key (a replaced generation's: see the crate docs).
        let mut writes: Vec<(Piece, std::borrow::Cow<'_, [u8]>, std::ops::Range<usize>)> =
            Vec::new();
        for (k, p) in pieces.iter().enumerate() {
            let data = &ranges[p.range].data[p.at..p.at + p.len];
            match writes.last_mut() {
                Some((w, bytes, of)) if w.chunk == p.chunk && w.from + w.len as u64 == p.from => {
                    bytes.to_mut().extend_from_slice(data);
                    w.len += p.len;
                    w.whole = w.from == 0 && w.len as u64 == self.chunk_len(w.chunk);
                    of.end = k + 1;
                }
                _ => writes.push((*p, data.into(), k..k + 1)),
            }
        }
        let cmds: Vec<Cmd> = writes
            .iter()
            .map(|(w, data, _)| {
                let key = self.chunk_key(w.chunk);
                if w.whole {
                    let mut cmd = redis::cmd("SET");
                    cmd.arg(key).arg(&data[..]).arg("XX");
                    cmd
                } else {
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(generation::SETRANGE_IF_EXISTS)
                        .arg(1)
                        .arg(key)
                        .arg(w.from)
                        .arg(&data[..]);
                    cmd
                }
            })
            .collect();
        self.writes_started.fetch_add(1, Ordering::SeqCst);
        let res = self
            .client
            .with_conn(&self.chunk_key(first.chunk), |c| c.pipeline(&cmds));
        self.writes_finished.fetch_add(1, Ordering::SeqCst);
        match res {
            Ok(replies) => {
                let missing = writes
                    .iter()
                    .zip(replies)
                    .filter(|(_, v)| *v == Value::Nil)
                    .flat_map(|((_, _, of), _)| pieces[of.clone()].iter());
                for p in missing {
                    if out[p.range].is_ok() {
                        let cause = format!(
                            "the key is missing, inside the store's length {:#x}: nothing was written{}",
                            self.info.len,
                            self.replaced_note()
                        );
                        out[p.range] =
                            Err(self.remote(p.chunk, ranges[p.range].offset + p.at as u64, cause));
                    }
                }
            }
            Err(f) => {
                // Which write failed is not known: every range written
                // here stays dirty.
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
}
