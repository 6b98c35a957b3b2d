//! `faultline-serve`: serve the page faults of VMs restored from a
//! snapshot (Firecracker's `Uffd` memory backend). See `faultline_serve`.
//! `faultline-serve record inspect|merge` works on working-set records.

use clap::Parser;
use faultline_serve::cli::{self, ServeArgs};
use faultline_serve::record_tool::{self, RecordCmd};

/// Serve the page faults of VMs restored from a snapshot (Firecracker's `Uffd` memory backend).
///
/// `faultline-serve record inspect|merge ...` works on working-set records
/// (see `faultline-serve record --help`).
#[derive(Parser)]
#[command(name = "faultline-serve", version)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

/// Working-set records: inspect, merge.
#[derive(Parser)]
#[command(name = "faultline-serve record", version)]
struct RecordCli {
    #[command(subcommand)]
    cmd: RecordCmd,
}

fn main() {
    // A keeper started by a serve with --takeover runs and exits here.
    cli::main_if_keeper();
    // The daemon's flags are top-level (`faultline-serve --socket ...`),
    // so the one tool is recognised by its first word.
    let done = if std::env::args_os().nth(1).is_some_and(|a| a == "record") {
        let args = std::env::args_os().skip(1);
        record_tool::run(RecordCli::parse_from(args).cmd)
    } else {
        cli::run(Cli::parse().args)
    };
    if let Err(e) = done {
        faultline_cli_support::print_error(&e);
        std::process::exit(1);
    }
}
