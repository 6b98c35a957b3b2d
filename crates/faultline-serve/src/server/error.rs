//! Why a [`Server`](super::Server) could not start, or stopped.

use std::path::PathBuf;
use std::time::Duration;

use faultline::{ForeignError, SnapshotError};

use crate::config::ConfigError;
use crate::record::RecordError;

/// Why a server could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration cannot run.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `--takeover`/`--fd-store`: the keeper holds VMs served from another
    /// memory file (what and which).
    #[error("--takeover: {0}")]
    OtherSnapshot(String),
    /// Opening the memory file failed.
    #[error("opening the memory file {}", path.display())]
    OpenMem {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Opening the remote store failed.
    #[cfg(feature = "redis")]
    #[error("opening the store {url}")]
    OpenStore {
        /// The store.
        url: String,
        /// The error.
        #[source]
        source: faultline_redis::RedisStoreError,
    },
    /// Reading the recorded set to prefetch failed.
    #[error(transparent)]
    Prefetch(#[from] RecordError),
    /// An existing shared snapshot could not be reused.
    #[error("reusing the shared snapshot {}", path.display())]
    ReuseSnapshot {
        /// The snapshot file.
        path: PathBuf,
        /// The error.
        #[source]
        source: SnapshotError,
    },
    /// Writing the shared snapshot failed.
    #[error("writing the shared snapshot {}", path.display())]
    WriteSnapshot {
        /// The snapshot file.
        path: PathBuf,
        /// The error.
        #[source]
        source: SnapshotError,
    },
    /// Starting the handler threads failed.
    #[error("starting the handler threads")]
    Engine(#[source] ForeignError),
    /// The socket path holds something that is not a socket.
    #[error("{}: exists and is not a socket (only a stale socket is replaced)", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A server answers on the socket path.
    #[error("{}: in use by {}; stop it or choose another --socket", path.display(), in_use_by(*pid))]
    InUse {
        /// The path.
        path: PathBuf,
        /// The server's pid (`SO_PEERCRED`; 0 when out of this pid
        /// namespace).
        pid: i32,
    },
    /// Whether a server answers on the socket path could not be told.
    #[error("{}: checking whether a server answers on this socket", path.display())]
    Probe {
        /// The path.
        path: PathBuf,
        /// The error of `connect`.
        #[source]
        source: std::io::Error,
    },
    /// An output path (`--json`, `--record`) cannot be written.
    #[error("{0:#}")]
    CheckOutput(anyhow::Error),
    /// The keeper (`--takeover`) could not be joined or started.
    #[error("--takeover: {0}")]
    Keeper(#[source] crate::keeper::KeeperError),
    /// The service manager's store (`--fd-store`) could not be joined or
    /// used.
    #[error("--fd-store: {0}")]
    FdStore(#[source] crate::keeper::KeeperError),
    /// Binding or setting up the listening socket failed.
    #[error("binding {}", path.display())]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("spawning {what}")]
    Spawn {
        /// Which thread.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::EndpointError),
    /// No peer was connected for the configured timeout.
    #[error("no peer connected for {:.1}s (timeout); exiting", .0.as_secs_f64())]
    Timeout(Duration),
    /// Writing the peers' summaries failed.
    #[error("writing the summaries (--json): {0:#}")]
    WriteJson(anyhow::Error),
}

/// Who answers on a socket whose listener was bound by `pid`
/// (`SO_PEERCRED` of a connection to it: the process that called
/// `listen`, which may be gone while another holds the listener).
fn in_use_by(pid: i32) -> String {
    match pid {
        0 => "a process in another pid namespace (a server answers on it)".into(),
        p if faultline_sys::process::alive(p) => format!("pid {p} (a server answers on it)"),
        p => format!(
            "a process that holds the listener pid {p} bound and is gone: a keeper of a serve started with --takeover (start serve with --takeover on the same --socket to take its VMMs over), or a child it passed the listener to"
        ),
    }
}
