//! The server's lines on stderr, `faultline serve: ...` (what operators
//! and `faultline bench restore` read).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::config::LogFormat;

/// Lines are JSON objects (`--log-format json`).
static JSON: AtomicBool = AtomicBool::new(false);

/// Sets how lines are written from now on (the process's one server).
pub fn set_format(f: LogFormat) {
    JSON.store(f == LogFormat::Json, Relaxed);
}

/// Writes one line (a failed write to stderr is not an error of serving).
pub fn say(msg: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    if JSON.load(Relaxed) {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let line = serde_json::json!({
            "time": time,
            "source": "faultline serve",
            "msg": msg.to_string(),
        });
        let _ = writeln!(e, "{line}");
    } else {
        let _ = writeln!(e, "faultline serve: {msg}");
    }
}
