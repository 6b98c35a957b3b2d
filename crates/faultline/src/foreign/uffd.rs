//! The adopted userfaultfd: a descriptor another process created, did the
//! handshake of, and handed over (Firecracker's `Uffd` memory backend
//! sends it over a UNIX socket with `SCM_RIGHTS`).
//!
//! `UFFDIO_API` can be done once per userfaultfd, and the peer did it, so
//! its features cannot be asked for, only read back:
//!
//! 1. [`ForeignUffd::adopt`] reads `/proc/self/fdinfo/<fd>`
//!    (`API:\t<api>:<features>:<ioctls>`, bit 31 set once the handshake is
//!    done) and refuses a descriptor that is not a userfaultfd whose
//!    handshake is done.
//! 2. What the peer enabled decides what serving it can do:
//!    `EVENT_REMOVE` (its `MADV_DONTNEED` reaches us: removed pages read
//!    zeros), `MINOR_SHMEM`/`MINOR_HUGETLBFS` (shared mode).
//! 3. Shared mode needs minor faults, and the peer's registration does not
//!    show in its memory map: [`ForeignUffd::register_minor`] registers the
//!    regions MISSING|MINOR through the peer's descriptor (the ioctl acts
//!    on the mm the descriptor was created in, whoever calls it).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use super::config::ForeignRegionSpec;
use super::error::ForeignError;
use faultline_sys::uffd::{feature, ioctl_bit, register_mode, Uffd};

/// A userfaultfd received from another process. See the module docs.
#[derive(Debug, Clone)]
pub struct ForeignUffd {
    pub(super) uffd: Arc<Uffd>,
    features: u64,
}

impl std::os::fd::AsFd for ForeignUffd {
    /// The userfaultfd (to hand a dup of it on, e.g. to a keeper process).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.uffd.as_fd()
    }
}

impl ForeignUffd {
    /// Adopts `fd`, which must be a userfaultfd whose handshake its creator
    /// has done.
    pub fn adopt(fd: OwnedFd) -> Result<ForeignUffd, ForeignError> {
        let uffd = Uffd::adopt(fd);
        let features = uffd
            .fdinfo_features()
            .map_err(ForeignError::Inspect)?
            .ok_or(ForeignError::NotUserfaultfd)?;
        Ok(ForeignUffd {
            uffd: Arc::new(uffd),
            features,
        })
    }

    /// The features the peer enabled with `UFFDIO_API`.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether the peer's `MADV_DONTNEED`/`MADV_REMOVE` reach us as REMOVE
    /// events (`UFFD_FEATURE_EVENT_REMOVE`).
    pub fn reports_removes(&self) -> bool {
        self.features & feature::EVENT_REMOVE != 0
    }

    /// The enabled features by name ("EVENT_REMOVE").
    pub fn feature_names(&self) -> Vec<&'static str> {
        feature::ALL
            .iter()
            .filter(|(bit, _)| self.features & bit != 0)
            .map(|&(_, name)| name)
            .collect()
    }

    /// `UFFDIO_WAKE` over `[start, start + len)` of the peer: its threads
    /// blocked on a fault there run again and fault anew (a handler taking
    /// the peer over wakes the faults its predecessor read and never
    /// answered).
    pub fn wake(&self, start: u64, len: u64) -> Result<(), ForeignError> {
        self.uffd.wake(start, len).map_err(ForeignError::Wake)
    }

    /// The descriptor number (for messages).
    pub fn raw_fd(&self) -> i32 {
        self.uffd.as_raw_fd()
    }

    /// Shared mode needs the peer's minor faults, and its registration does
    /// not show in its memory map (only in smaps' `ui` flag, which costs a
    /// page-table walk of every vma of the peer): the regions are registered
    /// MISSING|MINOR here, through the peer's userfaultfd (the ioctl acts on
    /// the peer's mm). For a VMM that registered them so (as shared mode asks)
    /// that changes nothing; one that registered MISSING only gets the
    /// registration that makes its dropped pages read zeros. A registration
    /// replaces the range's modes, so a peer that enabled write-protection
    /// (which it may have registered) is refused instead. The kernel must
    /// allow CONTINUE on the range.
    pub(super) fn register_minor(&self, specs: &[ForeignRegionSpec]) -> Result<(), ForeignError> {
        const WP: u64 = feature::PAGEFAULT_FLAG_WP
            | feature::WP_HUGETLBFS_SHMEM
            | feature::WP_UNPOPULATED
            | feature::WP_ASYNC;
        if self.features & WP != 0 {
            return Err(ForeignError::Refused {
                what: "shared (zero-copy) mode",
                why: "the peer enabled write-protect features: registering its regions MISSING|MINOR would drop a WP registration",
            });
        }
        for (index, s) in specs.iter().enumerate() {
            let ioctls = self
                .uffd
                .register(
                    s.base,
                    s.len as u64,
                    register_mode::MISSING | register_mode::MINOR,
                )
                .map_err(|source| ForeignError::Register { index, source })?;
            if ioctls & (1 << ioctl_bit::CONTINUE) == 0 {
                return Err(ForeignError::Refused {
                    what: "shared (zero-copy) mode",
                    why: "the kernel does not allow UFFDIO_CONTINUE on the peer's regions",
                });
            }
        }
        Ok(())
    }
}
