//! `faultline-serve`: serve the page faults of VMs restored from a
//! snapshot (Firecracker's `Uffd` memory backend). See `faultline_serve`.

use clap::Parser;
use faultline_serve::cli::{self, ServeArgs};

/// Serve the page faults of VMs restored from a snapshot (Firecracker's `Uffd` memory backend).
#[derive(Parser)]
#[command(name = "faultline-serve", version)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

fn main() {
    if let Err(e) = cli::run(Cli::parse().args) {
        faultline_cli_support::print_error(&e);
        std::process::exit(1);
    }
}
