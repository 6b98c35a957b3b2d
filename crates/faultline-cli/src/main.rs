//! `faultline`: the front door of the faultline user-space page-fault
//! runtime. `info` (what the kernel offers) and `store` (Redis page stores)
//! live here; `serve`/`peer` forward to the `faultline-serve` crate (cargo
//! feature `serve`) and `bench`/`graph`/`bfs`/`vpri` to `faultline-bench`
//! (feature `bench`), both on by default. The command tree and what each
//! command runs are the library, `faultline_cli`.

use clap::Parser;

fn main() {
    // A keeper started by `faultline serve --takeover` runs and exits here
    // (it has no arguments to parse).
    #[cfg(feature = "serve")]
    faultline_serve::cli::main_if_keeper();
    // Parsing starts no thread. Then, before any thread starts: the
    // signals the command takes on a thread of its own are blocked (serve
    // --track-dirty: SIGUSR1; the signal thread below would otherwise take
    // it, and its default action ends the process), and SIGINT, SIGTERM
    // and SIGHUP remove what the command registered (temporaries, partial
    // outputs) before the process ends as the signal would.
    #[cfg(feature = "bench")]
    {
        let args: Vec<_> = std::env::args_os().collect();
        if args.get(1).is_some_and(|a| a == "bench") {
            if let Err(e) = faultline_bench::bench::refuse_repeated_outputs(&args[2..]) {
                faultline_cli_support::print_error(&e);
                std::process::exit(2);
            }
        }
    }
    let cli = faultline_cli::Cli::parse();
    // Before any work, and before --plot's directory is made: --json is
    // not --plot's directory, nor a file in it (where the figures go, under
    // names the bench picks: one would replace the other after the run).
    #[cfg(feature = "bench")]
    if let faultline_cli::Command::Bench(b) = &cli.command {
        if let (Some(json), Some(plot)) = (&b.json, &b.plot) {
            if let Err(e) =
                faultline_cli_support::refuse_file_in_dir(json, "--json", plot, "--plot")
            {
                faultline_cli_support::print_error(&e);
                std::process::exit(2);
            }
        }
    }
    if let Err(e) = faultline_cli::block_signals(&cli) {
        faultline_cli_support::print_error(&e);
        std::process::exit(1);
    }
    if let Err(e) = faultline_cli_support::cleanup::install() {
        eprintln!("warning: taking SIGINT, SIGTERM and SIGHUP: {e}");
    }
    if let Err(e) = faultline_cli::run(cli) {
        // Each cause once (see `faultline_cli_support::print_error`).
        faultline_cli_support::print_error(&e);
        std::process::exit(1);
    }
}
