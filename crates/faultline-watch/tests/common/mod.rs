//! Helpers of the watch tests: child processes and deadlines (the pieces
//! of `faultline`'s `tests/common` these tests use).

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Output of a child process run.
#[derive(Debug)]
pub struct ChildResult {
    pub stdout: String,
    pub stderr: String,
}

/// Re-runs this test binary's test `name` in a child process with
/// `FAULTLINE_CHILD=scenario`, killing it after `timeout`.
pub fn run_child(name: &str, scenario: &str, timeout: Duration) -> ChildResult {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("FAULTLINE_CHILD", scenario)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut stdout = String::new();
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    ChildResult { stdout, stderr }
}

/// The scenario this process should run, if it is a child.
pub fn child_scenario() -> Option<String> {
    std::env::var("FAULTLINE_CHILD").ok()
}

/// Aborts the test process with a message if the test is still running
/// after `secs` seconds: a runtime bug must fail the run, never hang it.
pub struct Deadline(Arc<AtomicBool>);

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
