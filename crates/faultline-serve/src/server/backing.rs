//! Step 2 of a connection: choose how the peer is served.
//!
//! ```text
//!  serve --shared?  its memory map (PROCMAP_QUERY)   its handshake says   served by
//!  no               -                                nothing, anonymous   copy
//!  no               -                                shared               refused
//!  yes              the snapshot, MAP_PRIVATE        nothing, shared      shared (CONTINUE)
//!  yes              anonymous memory                 nothing, anonymous   copy
//!  yes              one thing                        the other            refused
//!  yes              out of reach (pid namespace)     shared / anonymous   as it says
//!  yes              out of reach                     nothing              copy (said once)
//!  yes              another file, ...                -                    refused
//! ```
//!
//! A peer whose memory map is out of reach (a jailer, a proxy, another pid
//! namespace) and that declares nothing is served as serve without
//! `--shared` serves every peer: by copy (Firecracker's `Uffd` backend is
//! anonymous memory). Refusing it would leave a VMM that did nothing wrong
//! without its pages.

use std::sync::Arc;

use faultline::{ForeignRegionSpec, PeerBacking, SharedSnapshot, SnapshotError};

/// How a peer is served.
pub struct Chosen {
    /// Its backing.
    pub backing: PeerBacking,
    /// The snapshot its faults are served from without a copy (shared
    /// mode), or `None` (copy mode).
    pub snapshot: Option<Arc<SharedSnapshot>>,
    /// Why its memory map could not be checked, when its declaration was
    /// trusted instead (or, with `fallback`, copy mode chosen).
    pub unchecked: Option<String>,
    /// Shared mode could not be used for it (its memory map is out of
    /// reach and it declared nothing): it is served by copy.
    pub fallback: bool,
}

impl Chosen {
    /// `"shared"` or `"copy"`.
    pub fn mode(&self) -> &'static str {
        if self.snapshot.is_some() {
            "shared"
        } else {
            "copy"
        }
    }
}

/// Why a peer's backing is refused.
#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    /// Its declaration and its memory map disagree.
    #[error("shared mode: its handshake declares {said:?} memory, its memory map shows {seen:?}")]
    Mismatch {
        /// What its handshake declares.
        said: PeerBacking,
        /// What its memory map shows.
        seen: PeerBacking,
    },
    /// Its memory map is not what shared mode serves, or cannot be read
    /// and it declared nothing.
    #[error("shared mode: {0}")]
    Check(#[source] SnapshotError),
    /// It declares a shared backing and the server has no snapshot.
    #[error("its handshake declares a shared backing, and serve has no --shared snapshot")]
    NoSnapshot,
}

/// Chooses the backing of peer `pid` with `specs`, which declared
/// `declared`, against the server's `snapshot` (see the module docs).
pub fn choose(
    snapshot: Option<&Arc<SharedSnapshot>>,
    pid: i32,
    specs: &[ForeignRegionSpec],
    declared: Option<PeerBacking>,
) -> Result<Chosen, BackingError> {
    let Some(snap) = snapshot else {
        return match declared {
            Some(PeerBacking::Shared) => Err(BackingError::NoSnapshot),
            _ => Ok(Chosen {
                backing: PeerBacking::Anonymous,
                snapshot: None,
                unchecked: None,
                fallback: false,
            }),
        };
    };
    let regions: Vec<(u64, usize, u64)> = specs
        .iter()
        .map(|s| (s.base, s.len, s.store_offset))
        .collect();
    let (backing, unchecked, fallback) = match (snap.check_peer(pid, &regions), declared) {
        (Ok(seen), Some(said)) if seen != said => {
            return Err(BackingError::Mismatch { said, seen })
        }
        (Ok(seen), _) => (seen, None, false),
        (Err(SnapshotError::ReadPeerMap { source, path }), said) => (
            said.clone().unwrap_or(PeerBacking::Anonymous),
            Some(format!("{}: {source}", path.display())),
            said.is_none(),
        ),
        (Err(e), _) => return Err(BackingError::Check(e)),
    };
    Ok(Chosen {
        snapshot: (backing == PeerBacking::Shared).then(|| snap.clone()),
        backing,
        unchecked,
        fallback,
    })
}
