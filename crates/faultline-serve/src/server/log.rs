//! The server's lines on stderr, `faultline serve: ...` (what operators
//! and `faultline bench restore` read).

use std::io::Write as _;

/// Writes one line (a failed write to stderr is not an error of serving).
pub fn say(msg: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "faultline serve: {msg}");
}
