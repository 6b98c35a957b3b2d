//! # faultline-serve: page faults of restored VMs, served from a snapshot
//!
//! A VMM (Firecracker's `Uffd` memory backend, or any VMM speaking its
//! hand-off) creates a userfaultfd, registers its guest memory and hands the
//! descriptor over a UNIX socket with a JSON description of its regions;
//! this crate serves the faults of that memory from a snapshot file or a
//! page store, through the `faultline` library's foreign regions.
//!
//! | module | what |
//! |---|---|
//! | [`handshake`] | the hand-off message: parse every field variant, encode one (for test peers) |
//! | [`record`] | the working-set record file: pages in first-touch order |
//! | [`summary`] | what serve reports of each peer (`--json`, read back by benchmarks) |
//! | [`peer`] | the test VMM (`faultline-peer`, `faultline peer`) |

pub mod handshake;
pub mod peer;
pub mod record;
pub mod summary;

pub use summary::{Handoff, PeerSummary};
