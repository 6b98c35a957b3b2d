//! The signal handlers: SIGBUS (uffd write-protect faults), SIGSEGV
//! (mprotect faults) and SIGTRAP (single-step completion, debug-register
//! hits).
//!
//! ```text
//!  write to a protected page
//!    -> SIGBUS / SIGSEGV on the writing thread
//!       grace.enter; page entry = hash probe; not ours -> chain
//!       decode at RIP; emulate:      store goes to the alias, or
//!         un-protect/store/re-protect under the page lock, or
//!         /proc/self/mem (forced write, page stays read-only)
//!       report hits (watched bytes written), RIP += len, return
//!    -> not emulated: page lock, un-protect, set TF, return
//!       the instruction runs once -> SIGTRAP (TRAP_TRACE)
//!       re-protect, unlock, clear TF, report, return
//! ```
//!
//! Everything the handlers write is in arena or runtime memory (never
//! watchable). The runtime (grace counters, per-thread slots, the previous
//! signal actions) lives in one leaked `mmap` so it survives watchers.
//!
//! | file | holds |
//! |---|---|
//! | `runtime.rs` | the process-wide runtime: per-thread slots, previous actions, fork handling, delivery to the callback |
//! | `fault.rs` | the SIGBUS/SIGSEGV handler: fault entry, emulation and continued interpretation |
//! | `mem.rs` | [`WatchMem`](mem::WatchMem): where emulated loads and stores go, and their reports |
//! | `step.rs` | single-stepping and the SIGTRAP handler (single steps, debug-register hits) |
//!
//! `fault.rs` uses `step.rs`, both use `mem.rs`, all three use
//! `runtime.rs`; this file installs the handlers.

mod fault;
mod mem;
mod runtime;
mod step;

use faultline_sys::signal::{Handler, SIGBUS, SIGSEGV, SIGTRAP};

use crate::error::WatchError;
pub(crate) use runtime::{in_handler, runtime_overlaps, Runtime};

/// The runtime, created and the signal handlers installed on first call.
pub(crate) fn runtime() -> Result<&'static Runtime, WatchError> {
    runtime::get_or_init(&[
        (SIGBUS, fault::on_fault as Handler),
        (SIGSEGV, fault::on_fault),
        (SIGTRAP, step::on_trap),
    ])
}
