//! The server's lines on stderr, `faultline serve: ...` (what operators
//! and `faultline bench restore` read).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// How serve's lines on stderr are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `faultline serve: MESSAGE`.
    #[default]
    Text,
    /// One JSON object a line: `{"time":SECONDS,"source":"faultline serve","msg":MESSAGE}`
    /// (`time`: seconds since the epoch).
    Json,
}

/// Lines are JSON objects (`--log-format json`).
static JSON: AtomicBool = AtomicBool::new(false);

/// Sets how lines are written from now on (the process's one server).
pub fn set_format(f: LogFormat) {
    JSON.store(f == LogFormat::Json, Relaxed);
}

/// The environment variable that passes the format to the keeper serve
/// starts (`json` when lines are JSON).
pub const ENV: &str = "FAULTLINE_SERVE_LOG_FORMAT";

/// Whether lines are JSON objects.
pub fn is_json() -> bool {
    JSON.load(Relaxed)
}

/// Takes the format from [`ENV`] (the keeper: it writes to serve's
/// stderr as serve does).
pub fn format_from_env() {
    if std::env::var_os(ENV).is_some_and(|v| v == "json") {
        JSON.store(true, Relaxed);
    }
}

/// Writes one line (a failed write to stderr is not an error of serving).
pub fn say(msg: std::fmt::Arguments<'_>) {
    say_as("faultline serve", None, msg);
}

/// Writes one line as `source` says it, at `level` (`None`: an
/// information; `"error"` for the one that ends the process).
pub fn say_as(source: &str, level: Option<&str>, msg: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    if JSON.load(Relaxed) {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut line = serde_json::json!({
            "time": time,
            "source": source,
            "msg": msg.to_string(),
        });
        if let Some(level) = level {
            line["level"] = level.into();
        }
        let _ = writeln!(e, "{line}");
    } else {
        match level {
            Some(level) => writeln!(e, "{level}: {msg}"),
            None => writeln!(e, "{source}: {msg}"),
        }
        .unwrap_or(());
    }
}
