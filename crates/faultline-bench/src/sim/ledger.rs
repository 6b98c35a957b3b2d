//! Where B5's pinned memory goes: every pinned unit-second by why the
//! unit was pinned ([`PinCause`]: ADP's age scan or active overflow, or on
//! access) and what its time went to ([`PinUse`]).
//!
//! ```text
//!   pin ──► Idle ── device access ──► Protected time; ADP: Hot ── demotion ──► Demotion time
//!            │                                         (access-pinning: Idle again)
//!            └─ unpin without an access ──► Unused time;  round ends ──► Open time
//! ```

use std::collections::HashMap;

use faultline_io::adp::PinCause;

/// What a pinned unit's pinned time was spent on (B5's per-mechanism
/// accounting). A pin's time runs from the pin to the unit's next device
/// access ([`PinUse::Protected`]: the pin was there when the device came
/// back) or to its unpin without one ([`PinUse::Unused`]); after a device
/// access ADP keeps the unit pinned until the delayed demotion
/// ([`PinUse::Demotion`]); a pin still waiting for an access when the
/// round ends is [`PinUse::Open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PinUse {
    Protected,
    Unused,
    Demotion,
    Open,
}

/// A unit's pin, as the ledger follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PinState {
    /// Not pinned.
    Not,
    /// Pinned at `since` (s), no device access since.
    Idle { since: u64, cause: PinCause },
    /// Accessed while pinned, waiting for ADP's demotion since `since`.
    Hot { since: u64, cause: PinCause },
}

/// Pinned unit-seconds by cause and use, and the events behind them.
#[derive(Clone, Debug, Default)]
pub(crate) struct PinLedger {
    pub secs: HashMap<(PinCause, PinUse), f64>,
    pub pins: HashMap<PinCause, u64>,
    /// Device accesses that found their unit pinned and idle (the pin
    /// protected them).
    pub protected: u64,
    /// Unpins of idle units (ADP: the inactive cap) and of accessed ones
    /// (ADP: demotions; LRU: its cap).
    pub unpinned_idle: u64,
    pub unpinned_hot: u64,
    /// Pins undone within the same tick (no pinned time).
    pub transient: u64,
}

impl PinLedger {
    pub(crate) fn add(&mut self, cause: PinCause, what: PinUse, secs: u64) {
        *self.secs.entry((cause, what)).or_default() += secs as f64;
    }
}
