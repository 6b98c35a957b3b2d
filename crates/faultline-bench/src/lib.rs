//! # faultline-bench: the lab
//!
//! Every benchmark of the faultline workspace, the seed reproductions and
//! their simulations, graph files and the BFS benchmark, and the VPRI
//! kernel probe. The `faultline` binary (crate `faultline-cli`, cargo
//! feature `bench`, on by default) is the front door: `faultline bench`,
//! `faultline graph`, `faultline bfs` and `faultline vpri` parse their
//! arguments with the types here and call the matching `run`.
//!
//! The layout, from the top down: each module imports only modules below
//! it, and nothing imports the three commands at the top.
//!
//! ```text
//!  bench/mod.rs: BenchArgs, run          graph: GraphCmd, BfsArgs      probe: VpriCmd
//!   │                                      │ gen_cmd, bfs_cmd
//!   ├─ kernel ◄─ engines, offload          │
//!   ├─ notify  random  watch/              │
//!   ├─ store ──────────────────────────────┼──► graph's formats and search:
//!   ├─ restore/ (launch, runs, floor, peers, timeline, ...)   csr, rmat, bfs, source
//!   └─ vpri/ (B1, B2, B3, B4, B8) ─► sim/ (trace, round, psi, B5, B7, B9)
//!   │                                 │                    │
//!   ▼                                 ▼                    ▼
//!  harness/: BenchCtx, report, paper, plot, stats, tsc, progress
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`bench`](mod@bench) | `faultline bench`: the dispatcher over every sub-bench |
//! | [`graph`] | `faultline graph gen/import`, `faultline bfs`: CSR graph files and the BFS benchmark |
//! | [`probe`] | `faultline vpri probe`: what the kernel does when a system call touches a missing page |
//! | `harness` | what the benches share: context, report, the paper's figures beside ours, plot, stats, TSC, progress |
//! | `sim` | seed 003's fleet simulated in the paper's own time (B5, B7, B9, B8's simulated half) |
//!
//! `faultline bench restore` runs `faultline serve` and `faultline peer` as
//! processes (the binary it runs in, `std::env::current_exe`): it is meant
//! to run inside the `faultline` binary.

pub mod bench;
pub mod graph;
mod harness;
pub mod probe;
mod sim;
