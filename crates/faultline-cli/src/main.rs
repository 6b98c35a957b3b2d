//! `faultline`: capability report, benchmarks and demo workloads for the
//! faultline user-space page-fault runtime (the commands: `faultline_cli`).

use clap::Parser;

fn main() {
    // First, before any thread starts: SIGINT, SIGTERM and SIGHUP remove
    // what the command registered (temporaries, partial outputs) before
    // the process ends as the signal would.
    if let Err(e) = faultline_cli_support::cleanup::install() {
        eprintln!("warning: taking SIGINT, SIGTERM and SIGHUP: {e}");
    }
    let cli = faultline_cli::Cli::parse();
    if let Err(e) = faultline_cli::run(cli) {
        // Each cause once (see `faultline_cli_support::print_error`).
        faultline_cli_support::print_error(&e);
        std::process::exit(1);
    }
}
