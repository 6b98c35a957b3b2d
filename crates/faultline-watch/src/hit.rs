//! What a watcher reports: a [`Hit`] for each run of watched bytes a write
//! touched, how the write was caught ([`HitPath`]), and the counters
//! ([`Stats`], [`PageStat`]).

/// What a [`Watcher`](crate::Watcher) reports on a write to watched bytes.
#[derive(Debug, Clone, Copy)]
pub struct Hit {
    /// First watched byte written.
    pub addr: u64,
    /// Number of watched bytes written from `addr` (one contiguous run).
    pub len: usize,
    /// The whole write that touched them (for a `rep stos`/`movs`, one
    /// chunk of it).
    pub write_addr: u64,
    /// Length of that write.
    pub write_len: usize,
    pub(crate) before: [u8; 32],
    pub(crate) after: [u8; 32],
    /// Thread id of the writer.
    pub tid: i32,
    /// Address of the writing instruction (for hardware watchpoints, the
    /// instruction after it: the CPU traps after the write).
    pub ip: u64,
    /// How the write was caught.
    pub path: HitPath,
}

impl Hit {
    /// The watched bytes before the write (at most the first 32).
    pub fn before(&self) -> &[u8] {
        &self.before[..self.len.min(32)]
    }
    /// The watched bytes after the write (at most the first 32).
    pub fn after(&self) -> &[u8] {
        &self.after[..self.len.min(32)]
    }
    /// `before` as a little-endian integer (first 8 bytes).
    pub fn before_u64(&self) -> u64 {
        le(self.before())
    }
    /// `after` as a little-endian integer (first 8 bytes).
    pub fn after_u64(&self) -> u64 {
        le(self.after())
    }
}

fn le(b: &[u8]) -> u64 {
    b.iter()
        .take(8)
        .enumerate()
        .fold(0, |a, (i, &x)| a | (x as u64) << (8 * i))
}

/// How a hit was caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitPath {
    /// Page protection + the store emulated in the handler.
    Emulated,
    /// Page protection + single-step with the trap flag.
    SingleStep,
    /// A CPU debug register.
    Hardware,
}

/// Counters since the watcher was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Protection faults taken on watched pages.
    pub faults: u64,
    /// Reports delivered to the callback.
    pub hits: u64,
    /// Faults whose write touched no watched byte.
    pub false_positives: u64,
    /// Faulting instructions performed by the emulator.
    pub emulated: u64,
    /// Faulting instructions single-stepped (not emulated).
    pub single_stepped: u64,
    /// Instructions interpreted after a faulting store (continued
    /// emulation: each store to a protected page they made would otherwise
    /// have been a fault of its own).
    pub interpreted: u64,
    /// Debug-register hits.
    pub hw_hits: u64,
    /// Writes to watched bytes made by the callback itself (performed, not
    /// reported).
    pub suppressed: u64,
    /// TSC cycles spent in the fault handlers (entry to return).
    pub handler_cycles: u64,
    /// Pages currently protected.
    pub pages_armed: u64,
    /// Disjoint watched ranges (after merging), debug-register ones
    /// included.
    pub ranges: u64,
    /// Watches on debug registers.
    pub hw_watches: u64,
}

/// Per-page counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageStat {
    pub page: u64,
    pub armed: bool,
    pub hits: u64,
    pub false_positives: u64,
}

/// The callback type.
pub type Callback = Box<dyn Fn(&Hit) + Send + Sync>;
