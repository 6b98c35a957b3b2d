//! The options of `faultline bench watch`.

/// Options of `faultline bench watch`.
#[derive(clap::Args, Clone, Debug)]
pub struct WatchArgs {
    /// Runs per configuration (tables show medians; 1 to 1000).
    #[arg(long, default_value_t = 3, value_parser = faultline_cli_support::flags::reps())]
    pub reps: usize,
    /// Memory the block lives in: `alias` (memfd mapped twice, exact),
    /// `heap` (anonymous, uffd write-protect), `exact` (anonymous, mprotect).
    #[arg(long, default_value = "alias", value_parser = ["alias", "heap", "exact"])]
    pub memory: String,
    /// Watched writes timed per tier for Table 4.1 (1 to 100,000,000).
    #[arg(long, default_value_t = 20_000, value_parser = faultline_cli_support::flags::range(1, 100_000_000))]
    pub events: usize,
    /// Bytes written under GDB software watchpoints (it single-steps every
    /// instruction: ~60 us each here), per configuration (1 to 1,048,576).
    #[arg(long, default_value_t = 2048, value_parser = faultline_cli_support::flags::range(1, 1 << 20))]
    pub gdb_bytes: usize,
    /// Skip the GDB columns (so --gdb-bytes is refused with it).
    #[arg(long, conflicts_with = "gdb_bytes")]
    pub no_gdb: bool,
    /// Watches set and cleared in the scale test (1 to 100,000,000).
    #[arg(long, default_value_t = 100_000, value_parser = faultline_cli_support::flags::range(1, 100_000_000))]
    pub scale: usize,
    /// Seed of the random watch addresses (any number to 2^64 - 1).
    #[arg(long, default_value_t = 1, value_parser = faultline_cli_support::flags::range_u64(0, u64::MAX))]
    pub seed: u64,
    /// One signal per store (no continued interpretation after the
    /// faulting store): the thesis's mechanism, one fault per write.
    #[arg(long)]
    pub no_interpret: bool,
    /// Only these tables (comma list of 4.1, 4.3, 4.4, 4.5, 4.6, scale).
    #[arg(long, value_delimiter = ',', value_parser = ["4.1", "4.3", "4.4", "4.5", "4.6", "scale"])]
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
