//! Messages from places that must not allocate: signal handlers, dying
//! handler threads, the fail-closed exit.
//!
//! A message is formatted into a fixed 1 KiB buffer on the stack
//! ([`StackWriter`], truncated if longer) and written to stderr with one
//! `write(2)`, so it is async-signal-safe and never interleaves with
//! another thread's message.

use std::fmt::Write;

/// A fixed-size, allocation-free `fmt::Write` target for messages written
/// from signal handlers and dying threads.
pub struct StackWriter {
    buf: [u8; 1024],
    len: usize,
}

impl Default for StackWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl StackWriter {
    /// Empty.
    pub const fn new() -> Self {
        StackWriter {
            buf: [0; 1024],
            len: 0,
        }
    }
    /// The bytes written (truncated at 1 KiB).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Write for StackWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes `faultline: <what>` plus a newline to stderr, allocation-free.
pub(crate) fn report(f: impl FnOnce(&mut StackWriter)) {
    let mut w = StackWriter::new();
    let _ = w.write_str("faultline: ");
    f(&mut w);
    let _ = w.write_str("\n");
    faultline_sys::write_stderr(w.as_bytes());
}

/// Prints a message and aborts: the fail-closed exit. A handler that
/// cannot go on must not leave faulting threads blocked forever, nor let
/// them run into zero pages.
pub(crate) fn fail_closed(f: impl FnOnce(&mut StackWriter)) -> ! {
    report(|w| {
        f(w);
        let _ = w.write_str("; failing closed (abort)");
    });
    std::process::abort()
}
