//! Engines: how a fault reaches the runtime.

use std::ffi::c_int;
use std::sync::Arc;

use faultline::engine::{self, EngineConfig, EngineKind};
use faultline::Engine;

use crate::error::{guard, guard_or, CError};

/// Resolve faults on the faulting thread, in a SIGBUS handler (fastest;
/// stores must be signal-safe).
pub const FL_ENGINE_SIGNAL: u32 = 0;
/// One handler thread blocked in `poll()`.
pub const FL_ENGINE_POLL: u32 = 1;
/// One handler thread busy-polling.
pub const FL_ENGINE_SPIN: u32 = 2;
/// N handler threads (`fl_engine_options.workers`), faults sharded by page
/// window.
pub const FL_ENGINE_WORKERS: u32 = 3;
/// A handler thread pinned on each CPU the caller may use, each resolving
/// the faults it reads: the one on the faulting thread's CPU answers
/// without a wake-up across CPUs. Every fault wakes every thread.
pub const FL_ENGINE_PER_CPU: u32 = 4;

/// An engine (opaque). Create with [`fl_engine_new`], free with
/// [`fl_engine_free`]; regions keep their engine alive.
pub struct fl_engine {
    pub(crate) engine: Arc<dyn Engine>,
}

/// Engine settings; fill with [`fl_engine_options_default`] first. Fields
/// may be added at the end in later versions (the struct is passed by
/// pointer and `size` says how much of it the caller knows).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fl_engine_options {
    /// `sizeof(struct fl_engine_options)` as the caller compiled it.
    pub size: usize,
    /// One of `FL_ENGINE_*`.
    pub kind: u32,
    /// Handler threads of the workers engine (0: one per CPU).
    pub workers: u32,
    /// uffd messages read per `read(2)` (thread engines; 0: 64).
    pub batch: u32,
    /// Pin handler threads to CPUs (non-zero: yes; default yes).
    pub pin: u32,
    /// Scratch bytes per handler; bounds the read-ahead window of stores
    /// without a zero-copy view (0: 4 MiB).
    pub scratch_bytes: usize,
}

/// Fills `opts` with the defaults: the signal engine, one worker per CPU,
/// batches of 64, pinned handlers, 4 MiB scratch.
///
/// # Safety
/// `opts` must point to writable memory for a `struct fl_engine_options`.
#[no_mangle]
pub unsafe extern "C" fn fl_engine_options_default(opts: *mut fl_engine_options) {
    guard_or("fl_engine_options_default", (), || {
        if opts.is_null() {
            return;
        }
        // SAFETY: the caller passes a writable, aligned struct.
        unsafe {
            opts.write(fl_engine_options {
                size: std::mem::size_of::<fl_engine_options>(),
                kind: FL_ENGINE_SIGNAL,
                workers: 0,
                batch: 0,
                pin: 1,
                scratch_bytes: 0,
            })
        }
    })
}

/// The [`EngineKind`] of an `FL_ENGINE_*` value.
pub fn engine_kind(kind: u32) -> Result<EngineKind, CError> {
    Ok(match kind {
        FL_ENGINE_SIGNAL => EngineKind::Signal,
        FL_ENGINE_POLL => EngineKind::Poll,
        FL_ENGINE_SPIN => EngineKind::Spin,
        FL_ENGINE_WORKERS => EngineKind::Workers,
        FL_ENGINE_PER_CPU => EngineKind::PerCpu,
        k => return Err(CError::invalid(format!("unknown engine kind {k}"))),
    })
}

/// Builds the Rust engine `opts` describes.
pub fn build_engine(opts: &fl_engine_options) -> Result<Arc<dyn Engine>, CError> {
    let kind = engine_kind(opts.kind)?;
    let mut cfg = EngineConfig::default();
    if opts.workers > 0 {
        cfg.workers = opts.workers as usize;
    }
    if opts.batch > 0 {
        cfg.batch = opts.batch as usize;
    }
    cfg.pin = opts.pin != 0;
    if opts.scratch_bytes > 0 {
        cfg.scratch_bytes = opts.scratch_bytes;
    }
    Ok(engine::create(kind, cfg)?)
}

/// Creates an engine. `opts` may be NULL for the defaults. On success
/// stores the handle in `*out` and returns 0; otherwise a negative errno
/// (`-EINVAL` for bad options, `-EOPNOTSUPP` when the kernel lacks a
/// feature, the kernel's errno when userfaultfd cannot be opened).
///
/// # Safety
/// `opts` is NULL or points to a `struct fl_engine_options` whose `size`
/// field is set; `out` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn fl_engine_new(
    opts: *const fl_engine_options,
    out: *mut *mut fl_engine,
) -> c_int {
    guard("fl_engine_new", || {
        if out.is_null() {
            return Err(CError::invalid("out is NULL"));
        }
        let mut o = fl_engine_options {
            size: 0,
            kind: FL_ENGINE_SIGNAL,
            workers: 0,
            batch: 0,
            pin: 1,
            scratch_bytes: 0,
        };
        if !opts.is_null() {
            // SAFETY: the caller passes a readable struct.
            let given = unsafe { &*opts };
            if given.size < std::mem::size_of::<fl_engine_options>() {
                return Err(CError::invalid(
                    "opts->size is smaller than this library's struct fl_engine_options (call fl_engine_options_default first)",
                ));
            }
            o = *given;
        }
        let engine = build_engine(&o)?;
        // SAFETY: `out` is writable (checked non-NULL above).
        unsafe { out.write(Box::into_raw(Box::new(fl_engine { engine }))) };
        Ok(0)
    })
}

/// Frees an engine handle (NULL is ignored). Regions built on it keep the
/// engine running until they are freed.
///
/// # Safety
/// `engine` is NULL or a handle from [`fl_engine_new`] not freed yet.
#[no_mangle]
pub unsafe extern "C" fn fl_engine_free(engine: *mut fl_engine) {
    guard_or("fl_engine_free", (), || {
        if !engine.is_null() {
            // SAFETY: the caller gives back a handle from `fl_engine_new`.
            drop(unsafe { Box::from_raw(engine) });
        }
    })
}
