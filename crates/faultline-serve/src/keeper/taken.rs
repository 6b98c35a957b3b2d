//! What a keeper (the keeper process or systemd's store) gives back: the
//! peers a dead serve left, its listener, and why it could not.

use std::os::fd::OwnedFd;

/// A peer taken from the keeper.
pub struct Taken {
    /// Its id at the keeper.
    pub id: u64,
    /// Its connection number (with the serve that accepted it).
    pub n: usize,
    /// Its pid.
    pub pid: i32,
    /// Its connection.
    pub conn: OwnedFd,
    /// Its hand-off, when it was deposited (else it is still queued on
    /// the connection, to be read again).
    pub handed: Option<Handed>,
}

/// A hand-off the keeper holds.
pub struct Handed {
    /// Its handshake (JSON).
    pub handshake: String,
    /// Its userfaultfd.
    pub uffd: OwnedFd,
    /// Its journal.
    pub journal: OwnedFd,
}

/// What attaching to a keeper gives a serve.
pub struct Joined {
    /// The peers a dead serve left (empty for a new keeper).
    pub taken: Vec<Taken>,
    /// The listening socket a dead serve left, and the (device, inode) of
    /// the path it was bound at.
    pub listener: Option<(OwnedFd, (u64, u64))>,
    /// The highest connection number deposited so far (new connections
    /// are numbered on from it).
    pub last_n: usize,
}

/// Why the keeper could not be reached or asked.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// Connecting, sending or receiving failed.
    #[error("talking to the keeper: {0}")]
    Io(#[from] std::io::Error),
    /// Sending to the service manager (`--fd-store`) failed.
    #[error("sending to the service manager at $NOTIFY_SOCKET ({socket}): {source}")]
    Notify {
        /// `$NOTIFY_SOCKET`.
        socket: String,
        /// What the send said.
        source: std::io::Error,
    },
    /// Its reply was not one.
    #[error("the keeper's reply: {0}")]
    Reply(#[from] serde_json::Error),
    /// It refused the request.
    #[error("the keeper refused the request")]
    Refused,
    /// Another serve is attached to it.
    #[error("another serve (pid {0}) is attached to the keeper")]
    InUse(i32),
    /// Starting it failed, or it never answered.
    #[error("starting the keeper: {0}")]
    Start(String),
    /// The keeper is gone and none could be started in its place (why):
    /// what serve deposits waits for the next one.
    #[error("no keeper ({0})")]
    Down(String),
    /// systemd's store has no room for another peer's descriptors.
    #[error("the service manager's store is full: FileDescriptorStoreMax={max} holds {peers} VMM(s) at once (serve keeps {own} descriptors there, each VMM {per}); raise it")]
    Full {
        /// `FileDescriptorStoreMax=` (`$FDSTORE`).
        max: usize,
        /// The peers it holds.
        peers: usize,
        /// The descriptors serve keeps there itself.
        own: usize,
        /// The descriptors a peer takes there.
        per: usize,
    },
}
