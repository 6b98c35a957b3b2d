//! [`RedisConfig`]: chunk and hash-tag sizes, timeouts, read-ahead, and
//! the ranges `put` accepts (checked before any work).

use std::time::Duration;

/// Settings of a [`RedisStore`](crate::RedisStore).
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Bytes per chunk (key) for [`RedisStore::put`](crate::RedisStore::put),
    /// [`MIN_CHUNK`] to [`MAX_CHUNK`]; opening a store takes the chunk
    /// size from its metadata. Default [`DEFAULT_CHUNK`].
    pub chunk_bytes: usize,
    /// Chunks per hash tag (on one cluster shard), 1 to [`MAX_GROUP`].
    /// Default 16 (1 MiB of 64 KiB chunks; [`RedisConfig::with_chunk`]
    /// keeps 1 MiB).
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

/// The smallest chunk `put` writes: 512 bytes.
pub const MIN_CHUNK: usize = 512;

/// The largest chunk `put` writes: 512 MiB, Redis's largest string
/// (`proto-max-bulk-len`'s default; a server configured lower refuses
/// the first `SET`, and the upload stops with the old store intact).
pub const MAX_CHUNK: usize = 512 << 20;

/// The most chunks per hash tag: 2^20 (a tag then covers up to 1 GiB of
/// 1 KiB chunks; more would put a whole store on one shard anyway).
pub const MAX_GROUP: u64 = 1 << 20;

/// Bytes of a hash-tag group by default (one cluster shard).
const GROUP_BYTES: usize = 1 << 20;

/// Bytes of source `put` reads and sends per pipeline (at least one
/// chunk): 4 MiB.
const BATCH_BYTES: usize = 4 << 20;

/// Chunks per `put` pipeline: 4 MiB worth, 1 to 64.
pub(crate) fn batch_chunks(chunk_bytes: usize) -> usize {
    (BATCH_BYTES / chunk_bytes.max(1)).clamp(1, 64)
}

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

    /// Whether `put` takes these sizes: `chunk_bytes` from [`MIN_CHUNK`]
    /// to [`MAX_CHUNK`], `group_chunks` from 1 to [`MAX_GROUP`]. The
    /// error says which is out of range.
    pub fn check_put(&self) -> Result<(), String> {
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk_bytes) {
            return Err(format!(
                "chunk size {} is outside {MIN_CHUNK}..={MAX_CHUNK} bytes (512 B to 512 MiB)",
                self.chunk_bytes
            ));
        }
        if !(1..=MAX_GROUP).contains(&self.group_chunks) {
            return Err(format!(
                "{} chunks per hash tag is outside 1..={MAX_GROUP}",
                self.group_chunks
            ));
        }
        Ok(())
    }

    /// Bytes of memory `put` needs at most with these settings: the
    /// source bytes of one pipeline, the commands holding a copy, and the
    /// packed request: three copies of a pipeline's chunks (4 MiB worth,
    /// at least one chunk, at most 64). A
    /// command compares it with what the machine has before it starts.
    pub fn put_memory(&self) -> u64 {
        3 * (batch_chunks(self.chunk_bytes) as u64) * self.chunk_bytes as u64
    }
}
