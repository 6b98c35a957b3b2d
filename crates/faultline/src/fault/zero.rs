//! A source of zeros for `UFFDIO_COPY` from a zero store: one read-only
//! anonymous mapping that is never written, so every page of it is the
//! kernel's shared zero page and it costs no memory. Runs copied from it
//! are capped at its size ([`BYTES`]).

use std::sync::OnceLock;

use crate::error::Result;
use faultline_sys::mem::Mapping;

/// Bytes of zeros available.
pub(crate) const BYTES: usize = 4 << 20;

static SOURCE: OnceLock<Mapping> = OnceLock::new();

/// Maps the source, once per process (called by every region build, before
/// a fault can need it).
pub(crate) fn init() -> Result<()> {
    if SOURCE.get().is_none() {
        let _ = SOURCE.set(Mapping::zeros(BYTES)?);
    }
    Ok(())
}

/// A pointer to at least `bytes` zero bytes (`bytes <= BYTES`).
/// Async-signal-safe.
pub(crate) fn source(bytes: usize) -> *const u8 {
    debug_assert!(bytes <= BYTES);
    SOURCE.get().expect("initialised by init()").as_ptr()
}
