//! `faultline`: the front door of the faultline user-space page-fault
//! runtime. `info` (what the kernel offers) and `store` (Redis page stores)
//! live here; `serve`/`peer` forward to the `faultline-serve` crate (cargo
//! feature `serve`) and `bench`/`graph`/`bfs`/`vpri` to `faultline-bench`
//! (feature `bench`), both on by default. The command tree and what each
//! command runs are the library, `faultline_cli`.

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
