//! # faultline-io: I/O into paged memory that never stalls or fails
//!
//! The kernel touching a faultline region on behalf of a system call is a
//! user-space pager's *I/O page fault* (seed 003, VPRI): with a thread
//! engine, `pread`/O_DIRECT/io_uring/`recv` into a missing page block for
//! the whole fault service time; with the signal engine they fail with
//! EFAULT, and a UDP datagram is silently lost (`faultline vpri probe`
//! measures it). This crate is a software VPRI:
//!
//! * **device queues** ([`IoDevice`], [`IoQueue`]) check the region's
//!   presence bitmap with the direction's rule before issuing an I/O
//!   ([`faultline::Region::io_ready`]); a miss posts the page to a
//!   **side-band fault queue** and parks the I/O (ordered or unordered);
//! * **fault workers per tenant** ([`Tenant`]) resolve posted pages
//!   through the region's resolve path and answer the waiting queues;
//! * **no eviction under an in-flight I/O**: per-page I/O references the
//!   evictor honours; io_uring fixed buffers over evictable memory are
//!   refused unless pinned;
//! * an **I/O page access log** per device ([`AccessLog`]), lossy, never
//!   blocking, drained into the pinning policy and the region's eviction
//!   policy (access hints);
//! * **adaptive pinning** ([`adp`]): ADP with its baselines.
//!
//! ```no_run
//! use std::sync::Arc;
//! use faultline::{Region, SignalEngine, MemoryStore};
//! use faultline_io::{Backend, DeviceConfig, IoDevice, Tenant, TenantConfig};
//! let engine = SignalEngine::new()?;
//! let region = Arc::new(Region::builder(1 << 20).store(MemoryStore::new(vec![1; 1 << 20])).build(&engine)?);
//! let tenant = Arc::new(Tenant::new(TenantConfig::default())?);
//! let dev = IoDevice::new(region, &tenant, DeviceConfig::default())?;
//! let mut q = dev.queue(Backend::Uring { depth: 64 })?;
//! let file = Arc::new(std::fs::File::open("/etc/hostname").unwrap());
//! q.read_at(&file, 0, 8192, 16, 7)?; // lands in a missing page: parked, not EFAULT
//! let c = q.complete(std::time::Duration::from_secs(5)).expect("done");
//! assert_eq!(c.tag, 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod adp;
pub mod device;
mod error;
pub mod log;
mod placement;
pub mod queue;
mod shared;
pub mod tenant;

pub use device::{DeviceConfig, DeviceStats, IoDevice, Ordering, PinMode};
pub use error::{Error, Result};
pub use log::{AccessEvent, AccessLog};
pub use queue::{Backend, Completion, Io, IoQueue, Op, Target, PREFETCH_AHEAD};
pub use tenant::{Tenant, TenantConfig, TenantStats, WorkerMode};
