//! [`RedisStoreError`]: failures outside the fault path (opening, `put`,
//! `get`, `gc`).

/// Failures outside the fault path (opening, `put`, `get`, `gc`).
#[derive(Debug, thiserror::Error)]
pub enum RedisStoreError {
    /// The URL is not one of the forms in the crate docs.
    #[error("bad store URL {url}: {reason}")]
    Url { url: String, reason: String },
    /// Settings `put` refuses (before any work).
    #[error("{what}: {reason}")]
    Config { what: String, reason: String },
    /// Connecting or a request failed (after retries).
    #[error("{what}: {op} failed: {cause}")]
    Request {
        what: String,
        op: String,
        cause: String,
        /// The errno behind it, when the cause is a system call's
        /// (`ECONNREFUSED`, `ETIMEDOUT`, ...).
        errno: Option<i32>,
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
    /// An upload's claim on its generation is gone: it was stalled past
    /// its lease and a `gc` (or another `put`) removed it.
    #[error("{what}: generation {generation} is no longer this upload's: {reason}")]
    Lost {
        what: String,
        generation: u64,
        reason: String,
    },
    /// An upload stopped before its switch (a failed request, a source
    /// that failed or was interrupted): the store still holds what it
    /// held; `cleanup` says what became of the partial generation.
    #[error("{what}: the upload of generation {generation} stopped, the store is unchanged; {cleanup}: {source}")]
    Abandoned {
        what: String,
        generation: u64,
        cleanup: String,
        source: Box<RedisStoreError>,
    },
}

/// The errno behind a Redis error: an `io::Error`'s in its chain, else
/// the one its kind names (a refused connection, a timeout).
pub fn errno_of(e: &redis::RedisError) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(n) = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.raw_os_error())
        {
            return Some(n);
        }
        cur = c.source();
    }
    if e.is_connection_refusal() {
        Some(faultline::error::Errno::ECONNREFUSED.0)
    } else if e.is_timeout() {
        Some(faultline::error::Errno::ETIMEDOUT.0)
    } else {
        None
    }
}
