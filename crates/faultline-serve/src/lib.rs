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
//! | [`peer_report`] | what the test peer reports of itself (its `--json`, read back by benchmarks) |

pub mod handshake;
pub mod peer_report;
pub mod record;
pub mod summary;

pub use peer_report::PeerReport;
pub use summary::{Handoff, PeerSummary};
