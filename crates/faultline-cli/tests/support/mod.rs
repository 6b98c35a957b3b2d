//! What the CLI tests share: the `faultline` binary run as a user would
//! (stdin closed, stdout and stderr piped, under a deadline, killed by its
//! pid when it passes), and scratch directories removed on drop.

#![allow(dead_code, reason = "each test binary uses a part")]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use faultline::testing::child::wait_until;

/// How a run ended and what it said.
pub struct Out {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The `error:` lines of stderr.
    pub fn errors(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("error:"))
            .collect()
    }
}

/// The binary under test. FAULTLINE_BIN: run the checks against another
/// build (an older one, to see them fail).
pub fn bin() -> String {
    std::env::var("FAULTLINE_BIN").unwrap_or(env!("CARGO_BIN_EXE_faultline").into())
}

/// Starts `faultline args...` in `dir` with `env` added.
pub fn spawn_with(dir: &Path, env: &[(&str, &Path)], args: &[&str]) -> Child {
    let mut c = Command::new(bin());
    c.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// Starts `faultline args...` in `dir`.
pub fn spawn(dir: &Path, args: &[&str]) -> Child {
    spawn_with(dir, &[], args)
}

/// Waits for `child` (killing it by its pid after `timeout`) and collects
/// its output; a panic (101) or an abort (134, SIGABRT) fails the test.
pub fn finish(mut child: Child, timeout: Duration, what: &str) -> Out {
    if !wait_until(timeout, || child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what}: still running after {timeout:?}");
    }
    let out = child.wait_with_output().unwrap();
    let o = Out {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !o.stderr.contains("panicked")
            && !matches!(o.code, Some(101) | Some(134))
            && o.signal != Some(6),
        "{what}: crashed ({:?}, signal {:?}): {}",
        o.code,
        o.signal,
        o.stderr
    );
    o
}

/// Sends `sig` to `child` by its pid (the `kill` command).
pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {}", child.id());
}

/// A scratch directory, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("faultline-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn s(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// The names in `sub` (`""`: the directory itself), sorted.
    pub fn names(&self, sub: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.0.join(sub))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        v.sort();
        v
    }

    /// Names starting with `.` (temporaries).
    pub fn hidden(&self) -> Vec<String> {
        let mut v = self.names("");
        v.retain(|n| n.starts_with('.'));
        v
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A pid that no process has now: a child that ran and was reaped.
pub fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// The children of `pid` (from each process's `stat`).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        if after.split_whitespace().nth(1) == Some(&pid.to_string()) {
            kids.push(p);
        }
    }
    kids
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let after = &s[s.rfind(')').unwrap() + 1..];
        after.split_whitespace().next() != Some("Z")
    })
}

/// SIGKILLs the processes still running among its pids when dropped (by
/// pid: a test may fail with them running).
pub struct KillOnDrop(pub Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &p in self.0.iter().filter(|&&p| running(p)) {
            let _ = Command::new("kill")
                .args(["-KILL", &p.to_string()])
                .status();
        }
    }
}

/// `faultline args...` in `d`, with TMPDIR its `tmp/` (so the temporaries
/// a bench makes land where the test looks).
pub fn start(d: &Dir, args: &[&str]) -> Child {
    let tmp = d.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    spawn_with(&d.0, &[("TMPDIR", &tmp)], args)
}

/// [`start`], waited for at most `secs`.
pub fn run_for(d: &Dir, secs: u64, args: &[&str]) -> Out {
    finish(
        start(d, args),
        Duration::from_secs(secs),
        &format!("{args:?}"),
    )
}

/// Runs `args`, which must fail with `code` and say `want` in one
/// `error:` line, having done no work (nothing on stdout).
pub fn refused(d: &Dir, args: &[&str], code: i32, want: &str) {
    let o = run_for(d, 30, args);
    assert_eq!(o.code, Some(code), "{args:?}: {}", o.stderr);
    assert_eq!(o.errors().len(), 1, "{args:?}: {}", o.stderr);
    assert!(o.stderr.contains(want), "{args:?}: {}", o.stderr);
    assert!(
        o.stdout.is_empty(),
        "{args:?} started working: {}",
        o.stdout
    );
}
