//! # libfaultline: faultline's C ABI
//!
//! The functions and types of `faultline/faultline.h` (generated from this
//! crate by cbindgen; the checked-in copy is `include/faultline/faultline.h`
//! and a test keeps it current). Built as `libfaultline.so` (SONAME
//! `libfaultline.so.0`) and `libfaultline.a`, with a `faultline.pc` for
//! pkg-config: `cargo cinstall -p faultline-capi` with cargo-c, or
//! `scripts/c-install.sh PREFIX`.
//!
//! # The map
//!
//! ```text
//!   error    negative errno + thread-local message; the panic guard every
//!            entry point runs in
//!   engine   fl_engine_new / fl_engine_free (signal, poll, spin, workers, per-cpu)
//!   store    fl_store_zero / _memory / _file / _from_callbacks, fl_store_free
//!   region   fl_region_new and its queries (stats, residency, flush, populate)
//! ```
//!
//! # Rules (repeated in the header and in DESIGN.md)
//!
//! * **Errors.** Functions returning `int` (or `int64_t`) return 0 (or a
//!   count) on success and a negative errno on failure; the calling
//!   thread's [`fl_last_error`] then describes it. No panic crosses the ABI:
//!   every entry point runs inside `catch_unwind`, and a panic becomes
//!   `-EIO` with the panic message.
//! * **Ownership.** Every `fl_*_new`/`fl_store_*` returns a handle the
//!   caller owns and frees exactly once with the matching `*_free`.
//!   Engines and stores are reference counted inside: a region keeps its
//!   engine and store alive, so they may be freed as soon as the region is
//!   built. A region must be freed before the process exits if its dirty
//!   pages must reach the store.
//! * **Threads.** Engines, stores and regions may be used from any thread
//!   and concurrently, except that `fl_region_free` must not race with any
//!   other call on the same region or with accesses to its memory.
//!   Callback stores are called from whichever thread resolves the fault
//!   (the faulting thread for the signal engine, a handler thread
//!   otherwise), possibly concurrently.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(
    non_camel_case_types,
    reason = "the C ABI keeps C's type names (fl_region, fl_store, ...), which the header declares"
)]

pub mod engine;
pub mod error;
pub mod region;
pub mod store;

pub use engine::*;
pub use error::*;
pub use region::*;
pub use store::*;
