//! Running a test in a child process, and bounding every test in time.
//!
//! A test that installs a process-wide signal handler, makes a thread die
//! of SIGBUS, or may hang must not run inside the test harness's own
//! process. [`run_child`] re-runs one test of the current test binary in a
//! child process (`<binary> NAME --exact`), with the environment variable
//! [`CHILD_ENV`] set to a scenario string the test reads back with
//! [`child_scenario`]; the child is killed at its timeout and the parent
//! gets its exit status, signal and output. [`deadline`] aborts a test
//! process that runs past its bound, so a runtime bug fails a run instead
//! of hanging it.
//!
//! ```no_run
//! use std::time::Duration;
//! use faultline::testing::child::{child_scenario, run_child};
//!
//! #[test]
//! fn store_failure_kills_the_thread() {
//!     if let Some(scenario) = child_scenario() {
//!         // In the child: do what must not happen in the harness.
//!         # let _ = scenario;
//!         return;
//!     }
//!     let r = run_child("store_failure_kills_the_thread", "sigbus", Duration::from_secs(30));
//!     assert!(!r.timed_out, "hung: {}", r.stderr);
//!     assert_eq!(r.signal(), Some(7)); // SIGBUS
//! }
//! ```

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The environment variable that carries the scenario to a child.
pub const CHILD_ENV: &str = "FAULTLINE_CHILD";

/// How a child process ended, and what it printed.
#[derive(Debug)]
pub struct ChildResult {
    /// It was killed at its timeout.
    pub timed_out: bool,
    /// Its exit status (`None` when it timed out).
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl ChildResult {
    /// The signal that killed it, if one did.
    pub fn signal(&self) -> Option<i32> {
        self.status.and_then(|s| s.signal())
    }

    /// It exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Re-runs this test binary's test `name` in a child process with
/// [`CHILD_ENV`]` = scenario`, killing it after `timeout`. Panics if the
/// child cannot be started or its output read (a broken test setup).
pub fn run_child(name: &str, scenario: &str, timeout: Duration) -> ChildResult {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the child test process");
    // Drain both pipes while it runs: a chatty child must not block on a
    // full pipe and be taken for a hung one.
    let drain = |mut p: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = p.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the child") {
            break Some(s);
        }
        if Instant::now() > deadline {
            timed_out = true;
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    ChildResult {
        timed_out,
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// The scenario this process should run, if it is a child of
/// [`run_child`].
pub fn child_scenario() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Prints a line to stdout at once, past the test harness's capture and
/// buffering (a child may die right after).
pub fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
    let _ = out.flush();
}

/// Waits (sleeping 1 ms between tries) until `f()` or `timeout`; returns
/// whether `f()` became true.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

/// Aborts the process with a message if it is still running `secs`
/// seconds after [`deadline`] unless this guard was dropped first.
#[must_use = "the deadline ends when the guard is dropped"]
pub struct Deadline(Arc<AtomicBool>);

/// Starts a watchdog thread that aborts the test process (naming the
/// calling test) if the returned guard lives longer than `secs` seconds:
/// a runtime bug must fail the run, never hang it.
pub fn deadline(secs: u64) -> Deadline {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let name = std::thread::current().name().unwrap_or("?").to_string();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            if d.load(SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("test {name} exceeded its {secs} s deadline: aborting the test process");
        std::process::abort();
    });
    Deadline(done)
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}
