//! `faultline`: the front door of the faultline user-space page-fault
//! runtime. `info` (what the kernel offers) and `store` (Redis page stores)
//! live here; `serve`/`peer` forward to the `faultline-serve` crate (cargo
//! feature `serve`) and `bench`/`graph`/`bfs`/`vpri` to `faultline-bench`
//! (feature `bench`), both on by default.

mod info;
mod store;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "faultline",
    version,
    about = "User-space page-fault runtime: capabilities, snapshot-restore serving, remote stores and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the kernel's userfaultfd capabilities and what each memory kind supports.
    Info,
    /// Fault latency and throughput benchmarks, side by side with the kernel's own fault path.
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
    /// Remote page stores (Redis, Redis Cluster): upload a file, download it, describe it.
    #[command(subcommand)]
    Store(store::StoreCmd),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.command {
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
        Command::Store(cmd) => store::run(cmd),
    };
    if let Err(e) = res {
        // Each cause once (see `faultline_cli_support::print_error`).
        faultline_cli_support::print_error(&e);
        std::process::exit(1);
    }
}
