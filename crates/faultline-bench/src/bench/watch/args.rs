//! The options of `faultline bench watch`.

/// Options of `faultline bench watch`.
#[derive(clap::Args, Clone, Debug)]
pub struct WatchArgs {
    /// Runs per configuration (tables show medians).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::at_least_one)]
    pub reps: usize,
    /// Memory the block lives in: `alias` (memfd mapped twice, exact),
    /// `heap` (anonymous, uffd write-protect), `exact` (anonymous, mprotect).
    #[arg(long, default_value = "alias")]
    pub memory: String,
    /// Watched writes timed per tier for Table 4.1.
    #[arg(long, default_value_t = 20_000, value_parser = faultline_cli_support::at_least_one)]
    pub events: usize,
    /// Bytes written under GDB software watchpoints (it single-steps every
    /// instruction: ~60 us each here), per configuration.
    #[arg(long, default_value_t = 2048, value_parser = faultline_cli_support::at_least_one)]
    pub gdb_bytes: usize,
    /// Skip the GDB columns.
    #[arg(long)]
    pub no_gdb: bool,
    /// Watches set and cleared in the scale test.
    #[arg(long, default_value_t = 100_000, value_parser = faultline_cli_support::at_least_one)]
    pub scale: usize,
    /// Seed of the random watch addresses.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// One signal per store (no continued interpretation after the
    /// faulting store): the thesis's mechanism, one fault per write.
    #[arg(long)]
    pub no_interpret: bool,
    /// Only these tables (comma list of 4.1, 4.3, 4.4, 4.5, 4.6, scale).
    #[arg(long, value_delimiter = ',')]
    pub tables: Vec<String>,
}

impl WatchArgs {
    /// Small defaults for the all-benches run.
    pub fn quick() -> WatchArgs {
        WatchArgs {
            reps: 1,
            memory: "alias".into(),
            events: 5000,
            gdb_bytes: 512,
            no_gdb: false,
            scale: 100_000,
            seed: 1,
            no_interpret: false,
            tables: Vec::new(),
        }
    }

    /// Whether table `t` is selected (`--tables`; all by default).
    pub fn wants(&self, t: &str) -> bool {
        self.tables.is_empty() || self.tables.iter().any(|x| x == t)
    }
}
