//! What a command owns it removes: temporary files and directories are
//! registered here and removed when their guard drops, on SIGINT, SIGTERM
//! and SIGHUP, and (named with their PID) by a later run once that PID is
//! gone.
//!
//! How the signals are taken ([`install`], at the start of `main`, before
//! any thread starts):
//!
//! 1. SIGINT, SIGTERM and SIGHUP are blocked in the calling thread, so every
//!    thread started afterwards has them blocked too: no thread is ever
//!    interrupted by them, and no code runs in a signal handler.
//! 2. One thread, `faultline-signals`, waits for them (`sigtimedwait`).
//! 3. On the first signal it calls the command's stop hook if it set one
//!    ([`on_stop`]: a daemon stops accepting, writes its statistics and
//!    returns from `main` by itself); otherwise, and on a second signal, it
//!    removes every registered path and ends the process as the signal
//!    would have (exit status 128 + signal number).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use faultline_sys::signal::{self, SIGHUP, SIGINT, SIGTERM};

/// What names a temporary output: `.NAME.partial-PID` (see
/// [`crate::output`]).
pub const PARTIAL: &str = ".partial-";

/// The signals a command ends on.
const STOP_SIGNALS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// A command's stop hook ([`on_stop`]).
type StopHook = Box<dyn Fn(i32) + Send>;

struct Registry {
    paths: Mutex<Vec<(u64, PathBuf)>>,
    stop: Mutex<Option<StopHook>>,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        paths: Mutex::new(Vec::new()),
        stop: Mutex::new(None),
    })
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// Removes a registered path when dropped, unless [`Guard::disarm`]ed.
#[derive(Debug)]
pub struct Guard {
    id: u64,
    path: PathBuf,
}

/// Registers `path` (a file or a directory the caller is about to create)
/// for removal; the returned guard removes it when dropped.
pub fn register(path: &Path) -> Guard {
    let id = NEXT.fetch_add(1, Relaxed);
    registry()
        .paths
        .lock()
        .expect("cleanup registry")
        .push((id, path.to_path_buf()));
    Guard {
        id,
        path: path.to_path_buf(),
    }
}

impl Guard {
    /// The registered path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the path (it was renamed into place, or is wanted): forgets it.
    pub fn disarm(self) {
        unregister(self.id);
        std::mem::forget(self);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        unregister(self.id);
        remove(&self.path);
    }
}

fn unregister(id: u64) {
    registry()
        .paths
        .lock()
        .expect("cleanup registry")
        .retain(|(i, _)| *i != id);
}

fn remove(p: &Path) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(p);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(p);
        }
        Err(_) => {}
    }
}

/// Removes every registered path now (the process is about to end).
pub fn remove_all() {
    let paths = std::mem::take(&mut *registry().paths.lock().expect("cleanup registry"));
    for (_, p) in paths {
        remove(&p);
    }
}

/// Takes SIGINT, SIGTERM and SIGHUP on a thread of their own (see the
/// module doc). Call it first in `main`, before any thread is started
/// (threads started earlier keep the signals unblocked and may take them).
/// Calling it again does nothing.
pub fn install() -> std::io::Result<()> {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    signal::set_blocked_all(&STOP_SIGNALS, true)?;
    std::thread::Builder::new()
        .name("faultline-signals".into())
        .spawn(|| {
            let mut stopping = false;
            loop {
                let sig = match signal::wait_any(&STOP_SIGNALS, Duration::from_secs(3600)) {
                    Ok(Some(sig)) => sig,
                    Ok(None) => continue,
                    Err(_) => return,
                };
                let hook = registry().stop.lock().expect("stop hook");
                match (&*hook, stopping) {
                    (Some(stop), false) => {
                        stopping = true;
                        stop(sig);
                    }
                    _ => {
                        drop(hook);
                        remove_all();
                        signal::die_by(sig);
                    }
                }
            }
        })?;
    let _ = DONE.set(());
    Ok(())
}

/// Instead of ending the process on the first SIGINT/SIGTERM/SIGHUP, call
/// `stop` with the signal (from the signal thread); a second signal still
/// ends the process at once.
pub fn on_stop(stop: impl Fn(i32) + Send + 'static) {
    *registry().stop.lock().expect("stop hook") = Some(Box::new(stop));
}

/// Removes the leftovers of killed runs in `dir`: temporary outputs
/// `.NAME.partial-PID` whose PID no longer runs. Returns how many.
pub fn sweep(dir: &Path) -> usize {
    sweep_matching(dir, |name| {
        let rest = name.strip_prefix('.')?;
        let at = rest.rfind(PARTIAL)?;
        rest[at + PARTIAL.len()..].parse().ok()
    })
}

/// Removes the entries of `dir` named `{prefix}PID{suffix}` (files or
/// directories) whose PID no longer runs. Returns how many.
pub fn sweep_pid_named(dir: &Path, prefix: &str, suffix: &str) -> usize {
    sweep_matching(dir, |name| {
        name.strip_prefix(prefix)?
            .strip_suffix(suffix)?
            .parse()
            .ok()
    })
}

/// Removes the entries of `dir` named `{prefix}PID` followed by nothing or
/// by anything but a digit (`faultline-random-PID.bin`,
/// `faultline-bench-PID-3.dat`: what [`temp`] names) whose PID no longer
/// runs. Returns how many.
pub fn sweep_prefixed(dir: &Path, prefix: &str) -> usize {
    sweep_matching(dir, |name| {
        let rest = name.strip_prefix(prefix)?;
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    })
}

/// A temporary of this process: `dir/{prefix}PID{suffix}` for the first
/// one asked for with that prefix and suffix in `dir`, then
/// `{prefix}PID-N{suffix}`; registered (the guard removes it when
/// dropped, a signal removes it, and [`sweep_prefixed`]`(dir, prefix)`
/// removes it in a later run once this process is gone). The caller
/// creates the file or directory.
pub fn temp(dir: &Path, prefix: &str, suffix: &str) -> Guard {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let mut path = dir.join(format!("{prefix}{pid}{suffix}"));
    if std::fs::symlink_metadata(&path).is_ok() || in_registry(&path) {
        let n = SEQ.fetch_add(1, Relaxed) + 1;
        path = dir.join(format!("{prefix}{pid}-{n}{suffix}"));
    }
    register(&path)
}

fn in_registry(p: &Path) -> bool {
    registry()
        .paths
        .lock()
        .expect("cleanup registry")
        .iter()
        .any(|(_, q)| q == p)
}

fn sweep_matching(dir: &Path, pid_of: impl Fn(&str) -> Option<i32>) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(&pid_of) else {
            continue;
        };
        if pid > 0 && pid != std::process::id() as i32 && !faultline_sys::process::alive(pid) {
            remove(&e.path());
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_remove_what_they_registered_unless_disarmed() {
        let d = std::env::temp_dir().join(format!("faultline-cleanup-{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/f"), b"x").unwrap();
        std::fs::write(d.join("kept"), b"x").unwrap();
        let g = register(&d.join("sub"));
        register(&d.join("kept")).disarm();
        drop(g);
        assert!(!d.join("sub").exists());
        assert!(d.join("kept").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn sweep_removes_only_dead_pids_leftovers() {
        let d = std::env::temp_dir().join(format!("faultline-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // A PID that is not running: a child that has exited and been reaped.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let dead = c.id();
        c.wait().unwrap();
        let me = std::process::id();
        for n in [
            format!(".g.bin{PARTIAL}{dead}"),
            format!(".g.bin{PARTIAL}{me}"),
            format!("faultline-restore-{dead}.mem"),
            "g.bin".to_string(),
        ] {
            std::fs::write(d.join(n), b"x").unwrap();
        }
        std::fs::write(d.join(format!("faultline-random-{dead}.bin")), b"x").unwrap();
        std::fs::create_dir(d.join(format!("faultline-bench-{dead}-2"))).unwrap();
        std::fs::write(d.join(format!("faultline-random-{me}.bin")), b"x").unwrap();
        std::fs::write(d.join("faultline-random-x.bin"), b"x").unwrap();
        assert_eq!(sweep_prefixed(&d, "faultline-random-"), 1);
        assert_eq!(sweep_prefixed(&d, "faultline-bench-"), 1);
        assert!(d.join(format!("faultline-random-{me}.bin")).exists());
        assert!(d.join("faultline-random-x.bin").exists());
        assert_eq!(sweep(&d), 1);
        assert_eq!(sweep_pid_named(&d, "faultline-restore-", ".mem"), 1);
        assert!(
            d.join(format!(".g.bin{PARTIAL}{me}")).exists(),
            "ours stays"
        );
        assert!(d.join("g.bin").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn temporaries_get_distinct_names_and_go_with_their_guard() {
        let d = std::env::temp_dir().join(format!("faultline-temps-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let a = temp(&d, "faultline-t-", ".bin");
        let b = temp(&d, "faultline-t-", ".bin");
        assert_ne!(a.path(), b.path());
        assert_eq!(
            a.path().file_name().unwrap().to_str().unwrap(),
            format!("faultline-t-{}.bin", std::process::id())
        );
        std::fs::write(a.path(), b"x").unwrap();
        std::fs::create_dir(b.path()).unwrap();
        drop((a, b));
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
