//! What every table writes to: a block of memory the watcher watches (its
//! own memfd alias, or anonymous memory under uffd write-protect or
//! mprotect), and the measured loop (one volatile byte store per byte).

use anyhow::Context;
use faultline_watch::{WatchedMem, Watcher};

/// Page size of the blocks.
pub const PAGE: usize = 4096;

/// The block under test: watcher-allocated (alias) or anonymous memory.
pub enum Block<'w> {
    Alias(WatchedMem<'w>),
    Anon(faultline_sys::mem::Mapping),
}

impl Block<'_> {
    /// Its first byte.
    pub fn ptr(&self) -> *mut u8 {
        match self {
            Block::Alias(m) => m.as_ptr(),
            Block::Anon(m) => m.as_ptr(),
        }
    }
}

/// A watcher on `memory` (`exact`: mprotect) with these switches.
pub fn watcher(
    memory: &str,
    classify: bool,
    hardware: bool,
    trace: bool,
    interpret: bool,
) -> anyhow::Result<Watcher> {
    Watcher::builder()
        .interpret(interpret)
        .classify(classify)
        .hardware(hardware)
        .trace(trace)
        .exact(memory == "exact")
        .build()
        .context("creating the watcher")
}

/// A populated block of `len` bytes of `memory` (`alias`: the watcher's
/// own memfd mapping; `heap`, `exact`: anonymous).
pub fn block<'w>(w: &'w Watcher, memory: &str, len: usize) -> anyhow::Result<Block<'w>> {
    let b = match memory {
        "alias" => Block::Alias(w.alloc(len)?),
        "heap" | "exact" => {
            let m = faultline_sys::mem::Mapping::anon(len)?;
            m.advise(0, len, faultline_sys::mem::Advice::NoHugePage)?;
            Block::Anon(m)
        }
        other => anyhow::bail!("unknown --memory {other} (alias, heap, exact)"),
    };
    // Populate so the loop measures protection faults, not first touch.
    write_all(b.ptr(), len);
    Ok(b)
}

/// The measured loop: one volatile byte store per byte.
#[inline(never)]
pub fn write_all(p: *mut u8, len: usize) {
    for i in 0..len {
        // SAFETY: `p..p+len` is a live mapping owned by the caller.
        unsafe { std::ptr::write_volatile(p.add(i), i as u8) };
    }
}
