//! # faultline for Python: regions as NumPy arrays, over any store
//!
//! The extension module `faultline._native` of the `faultline` Python
//! package (`python/faultline/`). A [`Region`](region::Region) is a
//! faultline region whose memory Python sees through the buffer
//! protocol, so `numpy.frombuffer(region, dtype)` and
//! `memoryview(region)` are views of the paged memory itself, not copies:
//! the first touch of each page faults, and the page comes from the
//! region's store (a file, bytes, zeros, Redis, or an object written in
//! Python).
//!
//! ```text
//!   numpy / memoryview ──buffer protocol──► Region (region.rs) ──► faultline::Region
//!                                              │ store                 │ engine (engine.rs:
//!                                              ▼                       ▼  one per kind, shared)
//!                        Store (store.rs): File, Memory, Zero, Redis   kernel ─► handler
//!                        _HostStore (host.rs) ──socket + shm──► store process running
//!                                                               the Python object's fill()
//! ```
//!
//! The map:
//!
//! ```text
//!   region   the Region class: the buffer export and the mapping's lifetime
//!   store    the Store base class and the built-in stores
//!   host     a store written in Python, served by a store process (why: the GIL)
//!   engine   engines shared by the process's regions; the default engine; info()
//!   error    faultline's errors as OSError (with errno) or ValueError
//! ```
//!
//! # The GIL and the fault path
//!
//! Nothing on the fault path takes the GIL. A thread that faults on a
//! region page may hold it (NumPy summing or indexing an array does), and
//! it holds it until its page is installed; a resolver that waited for
//! the GIL would wait for ever. Local stores (file, memory, zero) and
//! Redis are Rust code and never need it. A store written in Python runs
//! in a store process of its own, whose GIL the handler threads never
//! need ([`host`] explains it and draws it); the signal engine, which
//! would run the store inside a SIGBUS handler on the faulting thread, is
//! refused for Python stores with that reason.
//!
//! # Building and testing
//!
//! `maturin build --release` (or `pip install crates/faultline-py`)
//! builds the wheel: an abi3 extension for CPython 3.11 and later (the
//! buffer protocol entered the stable ABI in 3.11), with the `redis`
//! feature on (`pyproject.toml`). maturin sets
//! `PYO3_BUILD_EXTENSION_MODULE`, so the module does not link libpython,
//! as an extension module must not; PyO3's deprecated `extension-module`
//! cargo feature is not used, so `cargo build`, `cargo clippy` and
//! `cargo doc --workspace` build this crate like any other. The crate
//! has no Rust test target (`test = false`): such a binary would have to
//! embed an interpreter and find libpython at run time. Its tests are
//! Python's (`tests/`, pytest over the installed wheel), run by `.ci/run`
//! after `cargo test --workspace`.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod engine;
pub mod error;
pub mod host;
pub mod region;
pub mod store;

use pyo3::prelude::*;

/// The extension module `faultline._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<region::Region>()?;
    m.add_class::<store::Store>()?;
    m.add_class::<store::FileStore>()?;
    m.add_class::<store::MemoryStore>()?;
    m.add_class::<store::ZeroStore>()?;
    #[cfg(feature = "redis")]
    m.add_class::<store::RedisStore>()?;
    m.add_class::<host::HostStorePy>()?;
    m.add("_SIGNAL_REFUSAL", host::SIGNAL_REFUSAL)?;
    m.add_function(wrap_pyfunction!(engine::info, m)?)?;
    m.add_function(wrap_pyfunction!(region::_close_all, m)?)?;
    Ok(())
}
