//! What faultline's C libraries share (`libfaultline` in
//! `faultline-capi`, `libumap` in `umap`): errors across the ABI and a
//! store made of C callbacks.
//!
//! It is a crate of its own so that each C library links it without
//! linking the other: a `cdylib` depending on another `cdylib` crate would
//! re-export its symbols and inherit its build script's SONAME.
//!
//! ```text
//!   error      negative errno + thread-local message; the panic guard
//!   callback   CallbackStore: a PageStore over C function pointers
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

pub mod callback;
pub mod error;

pub use callback::{CallbackStore, Callbacks};
pub use error::{
    errno_of, guard, guard_or, last_error, last_error_ptr, set_last_error, store_errno, CError,
};
