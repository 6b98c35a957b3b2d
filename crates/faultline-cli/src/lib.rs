//! The `faultline` command line: its clap tree ([`Cli`]) and what each
//! command runs ([`run`]). The binary (`src/main.rs`) takes the signals
//! first (`faultline_cli_support::cleanup::install`), parses, runs and
//! prints an error; the tests walk [`Cli`]'s tree to sweep every flag.
//!
//! ```text
//!   main.rs ─► cleanup::install ─► Cli::parse ─► run ─┬─ info, store (here)
//!                                                      ├─ bench, graph, bfs, vpri (faultline-bench)
//!                                                      └─ serve, peer, record (faultline-serve)
//! ```

mod info;
mod store;

use clap::{Parser, Subcommand};

/// `faultline`.
#[derive(Parser)]
#[command(
    name = "faultline",
    version,
    about = "User-space page-fault runtime: capabilities, snapshot-restore serving, remote stores and benchmarks"
)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// Print the kernel's userfaultfd capabilities and what each memory kind supports.
    Info,
    /// Fault latency and throughput benchmarks, side by side with the kernel's own fault path
    /// (without a command: the quick suite of latency, seq, scale, offload, watch and notify).
    #[cfg(feature = "bench")]
    Bench(faultline_bench::bench::BenchArgs),
    /// Graph files: generate (R-MAT) or import (edge list) a binary CSR graph.
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    Graph(faultline_bench::graph::GraphCmd),
    /// Breadth-first search over a CSR graph file mapped through the kernel or faultline.
    #[cfg(feature = "bench")]
    Bfs(faultline_bench::graph::BfsArgs),
    /// I/O page faults (seed 003, VPRI): `probe` measures what the kernel does
    /// when a system call touches a missing page of a region.
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    Vpri(faultline_bench::probe::VpriCmd),
    /// Serve the page faults of VMs restored from a snapshot (Firecracker's `Uffd` memory backend).
    #[cfg(feature = "serve")]
    Serve(faultline_serve::cli::ServeArgs),
    /// A VMM stand-in speaking Firecracker's hand-off (for tests and benchmarks).
    #[cfg(feature = "serve")]
    #[command(hide = true)]
    Peer(faultline_serve::peer::PeerArgs),
    /// Working-set records of `serve --record`: inspect one, merge several into a prefetch set.
    #[cfg(feature = "serve")]
    #[command(subcommand)]
    Record(faultline_serve::record_tool::RecordCmd),
    /// Remote page stores (Redis, Redis Cluster): upload a file, download it, describe it.
    #[command(subcommand)]
    Store(store::StoreCmd),
}

/// Blocks the signals `cli`'s command takes on a thread of its own: call
/// it before any thread starts (`faultline serve`: SIGUSR1, SIGUSR2).
pub fn block_signals(cli: &Cli) -> anyhow::Result<()> {
    match &cli.command {
        #[cfg(feature = "serve")]
        Command::Serve(_) => faultline_serve::cli::block_signals(),
        _ => Ok(()),
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info => info::run(),
        #[cfg(feature = "bench")]
        Command::Bench(args) => faultline_bench::bench::run(args),
        #[cfg(feature = "bench")]
        Command::Graph(cmd) => faultline_bench::graph::run_graph(cmd),
        #[cfg(feature = "bench")]
        Command::Bfs(args) => faultline_bench::graph::run_bfs(args),
        #[cfg(feature = "bench")]
        Command::Vpri(cmd) => faultline_bench::probe::run(cmd),
        #[cfg(feature = "serve")]
        Command::Serve(args) => faultline_serve::cli::run(args),
        #[cfg(feature = "serve")]
        Command::Peer(args) => faultline_serve::peer::run(args),
        #[cfg(feature = "serve")]
        Command::Record(cmd) => faultline_serve::record_tool::run(cmd),
        Command::Store(cmd) => store::run(cmd),
    }
}
