//! `faultline-peer`: a VMM stand-in speaking Firecracker's hand-off, for
//! tests and benchmarks of `faultline-serve` (see `faultline_serve::peer`).

use clap::Parser;
use faultline_serve::peer::{self, PeerArgs};

/// A VMM stand-in speaking Firecracker's hand-off (for tests and benchmarks).
#[derive(Parser)]
#[command(name = "faultline-peer", version)]
struct Cli {
    #[command(flatten)]
    args: PeerArgs,
}

fn main() {
    if let Err(e) = peer::run(Cli::parse().args) {
        faultline_cli_support::print_error(&e);
        std::process::exit(1);
    }
}
