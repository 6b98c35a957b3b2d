//! # faultline-serve: page faults of restored VMs, served from a snapshot
//!
//! A VMM (Firecracker's `Uffd` memory backend, or any VMM speaking its
//! hand-off) creates a userfaultfd, registers its guest memory and hands the
//! descriptor over a UNIX socket with a JSON description of its regions;
//! this crate serves the faults of that memory from a snapshot file or a
//! page store, through the `faultline` library's foreign regions.
//!
//! ```text
//!  faultline-serve (bin) ─┐                       ┌─ faultline-peer (bin)
//!  faultline serve ───────┴─► cli ─► ServeConfig    └─ faultline peer ─► peer
//!                                      │ check()
//!                                      ▼
//!                                    Server ─► handshake, record, summary
//!                                      │
//!                                      ▼
//!                  faultline (ForeignEngine, ForeignPeer, SharedSnapshot)
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`config`] | [`ServeConfig`]: what a server serves and how, checked by [`ServeConfig::check`] |
//! | [`Server`] | the daemon: start (flags and paths checked, store, snapshot, engine, socket), then each connection in four steps (receive the hand-off, choose the backing, build the peer, report); a refused or failed peer is killed; [`StopHandle`] stops it gracefully (socket removed, peers served for a grace period) |
//! | [`cli`] | the command line of `faultline-serve` and `faultline serve` (clap, mapped onto [`ServeConfig`]) |
//! | [`handshake`] | the hand-off message: parse every field variant, encode one (for test peers) |
//! | [`keeper`] | takeover (`--takeover`): the keeper process holding serve's listener, the peers' connections, userfaultfds and REMOVE journals for the next serve; `--fd-store`: systemd's file-descriptor store holding the same |
//! | [`record`] | the working-set record file: pages in first-touch order |
//! | [`metrics`] | live metrics (`--metrics`): the OpenMetrics exposition of the engine's counters, and its endpoint |
//! | [`record`] | the working-set record file (versioned, made for one memory file): pages in first-touch order, merged from several restores |
//! | [`record_tool`] | `faultline-serve record inspect|merge` |
//! | [`dirty_set`] | the dirty-set file (`--track-dirty`): the pages a restore wrote, bitmap and list, made for one memory file |
//! | [`summary`] | what serve reports of each peer (`--json`, read back by benchmarks) |
//! | [`peer`] | the test VMM (`faultline-peer`, `faultline peer`) |
//! | [`testing`] | fixtures for tests that run serve and peers as processes |
//!
//! ```no_run
//! use faultline_serve::{Server, ServeConfig, Source};
//!
//! let mut config = ServeConfig::new("/tmp/fc-uffd.sock", Source::Mem("snapshot.mem".into()));
//! config.peers = Some(1);
//! let summaries = Server::start(config)?.run()?;
//! println!("{} faults", summaries[0].faults);
//! # Ok::<(), faultline_serve::ServeError>(())
//! ```
//!
//! Cargo features: `redis` (off by default) serves `Source::Store`
//! (Redis and Redis Cluster, through `faultline-redis`); without it such a
//! config is refused by [`ServeConfig::check`].

pub mod cli;
pub mod config;
pub mod dirty_set;
pub mod handshake;
pub mod keeper;
mod log;
pub mod metrics;
pub mod peer;
pub mod record;
pub mod record_tool;
mod server;
mod sockpath;
pub mod summary;
pub mod testing;

pub use config::{ConfigError, LogFormat, ServeConfig, Source};
pub use server::{AbortHandle, RequestHandle, ServeError, Server, StopHandle};
pub use summary::{Handoff, PeerSummary};
