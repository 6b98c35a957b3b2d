//! Why a watch request failed: [`WatchError`], one variant per step, and
//! failed system calls keep their errno.

use faultline_sys::Errno;

/// Why a watch request failed.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("watch length must be non-zero")]
    ZeroLength,
    #[error("range [{addr:#x}, +{len}) wraps around the address space")]
    Wraps { addr: u64, len: u64 },
    #[error("{addr:#x} is not mapped")]
    NotMapped { addr: u64 },
    #[error("{addr:#x} is in a read-only mapping ({path}): it cannot be written, so there is nothing to watch")]
    NotWritable { addr: u64, path: String },
    #[error("{addr:#x} cannot be watched: {reason}")]
    Unsupported { addr: u64, reason: String },
    #[error("another Watcher is active in this process")]
    AlreadyActive,
    #[error("watch/unwatch called from inside the watch callback")]
    Reentrant,
    #[error("{op} failed at {addr:#x}: {source}")]
    Sys {
        op: &'static str,
        addr: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Runtime(#[from] faultline::Error),
}

pub(crate) fn sys_err(op: &'static str, addr: u64, errno: Errno) -> WatchError {
    WatchError::Sys {
        op,
        addr,
        source: errno.into(),
    }
}
