//! What a command owns it gives back: temporary files and directories,
//! mounts and child processes are registered here and removed, unmounted
//! or killed when their guard drops, on SIGINT, SIGTERM and SIGHUP, and
//! (named with their PID) by a later run once that PID is gone. A child
//! started with [`spawn`] also dies with the thread that started it
//! (`PR_SET_PDEATHSIG`), so even a SIGKILL of the command leaves none
//! running.
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
//!    calls the command's last words if it set them ([`on_abort`]: a
//!    daemon ends what would hang without it), removes every registered
//!    path and ends the process as the signal would have (exit status
//!    128 + signal number).

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
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

/// What a command gives back when it ends.
#[derive(Debug, PartialEq)]
enum Owned {
    /// A file or a directory: removed.
    Path(PathBuf),
    /// A mount point: unmounted (lazily, so a busy one goes too).
    Mount(PathBuf),
    /// A child process: killed (SIGKILL).
    Child(u32),
    /// A system setting (a file under `/proc/sys`): its old value written
    /// back.
    Setting(PathBuf, String),
}

struct Registry {
    owned: Mutex<Vec<(u64, Owned)>>,
    stop: Mutex<Option<StopHook>>,
    abort: Mutex<Option<StopHook>>,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        owned: Mutex::new(Vec::new()),
        stop: Mutex::new(None),
        abort: Mutex::new(None),
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
    Guard {
        id: own(Owned::Path(path.to_path_buf())),
        path: path.to_path_buf(),
    }
}

fn own(what: Owned) -> u64 {
    let id = NEXT.fetch_add(1, Relaxed);
    registry()
        .owned
        .lock()
        .expect("cleanup registry")
        .push((id, what));
    id
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
        .owned
        .lock()
        .expect("cleanup registry")
        .retain(|(i, _)| *i != id);
}

/// A mount this command made: unmounted when dropped, on SIGINT, SIGTERM
/// and SIGHUP, and (when its last path component is `{prefix}PID`) by
/// [`sweep_mounts`] in a later run once this process is gone.
#[derive(Debug)]
pub struct MountGuard {
    id: u64,
    at: PathBuf,
}

/// Registers the mount at `at` (which the caller has just mounted).
pub fn mounted(at: &Path) -> MountGuard {
    MountGuard {
        id: own(Owned::Mount(at.to_path_buf())),
        at: at.to_path_buf(),
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        unregister(self.id);
        unmount(&self.at);
    }
}

fn unmount(at: &Path) {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(at)
        .stderr(std::process::Stdio::null())
        .status();
}

/// Unmounts the mounts of this machine whose mount point's last component
/// is `{prefix}PID` with a PID that no longer runs (what a killed run
/// left), and removes their directories when empty. Returns how many.
pub fn sweep_mounts(prefix: &str) -> usize {
    let mut n = 0;
    for Mount { at, .. } in mounts() {
        let pid = at
            .file_name()
            .and_then(|n| n.to_str()?.strip_prefix(prefix)?.parse::<i32>().ok());
        if let Some(pid) = pid {
            if pid > 0 && pid != std::process::id() as i32 && !faultline_sys::process::alive(pid) {
                unmount(&at);
                let _ = std::fs::remove_dir(&at);
                n += 1;
            }
        }
    }
    n
}

/// A mount of this machine, as `/proc/self/mountinfo` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Its mount point.
    pub at: PathBuf,
    /// Its file system type (`tmpfs`, `ext4`, ...).
    pub fstype: String,
    /// Its file system's options (`size=4m,huge=always`).
    pub options: String,
}

/// The mounts of this machine in `/proc/self/mountinfo`'s order (a mount
/// over another at the same point comes after it); empty when it cannot
/// be read.
pub fn mounts() -> Vec<Mount> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let (head, tail) = line.split_once(" - ")?;
            // Field 5 is the mount point, with space, tab, newline and
            // backslash written as octal escapes; after the separator the
            // type, the source and the file system's options.
            let at = PathBuf::from(unescape_mount_point(head.split(' ').nth(4)?));
            let mut t = tail.split(' ');
            let fstype = t.next()?.to_string();
            let options = t.nth(1).unwrap_or("").to_string();
            Some(Mount {
                at,
                fstype,
                options,
            })
        })
        .collect()
}

fn unescape_mount_point(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Something given back only if a signal ends the command: whoever made
/// it gives it back on the normal path, so dropping this guard only
/// forgets it. See [`changed_setting`], [`kill_on_signal`],
/// [`remove_on_signal`].
#[derive(Debug)]
pub struct SignalGuard(u64);

/// Registers `old`, the value `path` (a file under `/proc/sys`) had before
/// this command changed it, to be written back if a signal ends the
/// command.
pub fn changed_setting(path: &Path, old: &str) -> SignalGuard {
    SignalGuard(own(Owned::Setting(path.to_path_buf(), old.to_string())))
}

/// Registers a child process started elsewhere (by a library that stops
/// it on drop, say) to be killed if a signal ends the command.
pub fn kill_on_signal(pid: u32) -> SignalGuard {
    SignalGuard(own(Owned::Child(pid)))
}

/// Registers a file or directory made elsewhere (by a library that
/// removes it on drop, say) to be removed if a signal ends the command.
pub fn remove_on_signal(path: &Path) -> SignalGuard {
    SignalGuard(own(Owned::Path(path.to_path_buf())))
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        unregister(self.0);
    }
}

/// A child process this command owns (started with [`spawn`]): killed
/// and reaped when dropped if it still runs, killed on SIGINT, SIGTERM
/// and SIGHUP, and by the kernel when the thread that started it ends.
/// Derefs to the [`Child`].
#[derive(Debug)]
pub struct OwnedChild {
    id: u64,
    /// `None` only once [`OwnedChild::wait_with_output`] took it.
    child: Option<Child>,
}

/// Starts `cmd` as a child this command owns (see [`OwnedChild`]). Start
/// it from the thread that waits for it: the child gets SIGKILL when that
/// thread ends (`PR_SET_PDEATHSIG`), which is what makes a SIGKILL of the
/// command take its children along.
pub fn spawn(cmd: &mut Command) -> std::io::Result<OwnedChild> {
    use std::os::unix::process::CommandExt as _;
    let parent = std::process::id() as i32;
    // SAFETY: the closure runs in the child between fork and exec and
    // makes only async-signal-safe calls (prctl, getppid, getpid, kill).
    unsafe {
        cmd.pre_exec(move || {
            faultline_sys::process::die_with_parent(faultline_sys::process::SIGKILL, parent)
        });
    }
    let child = cmd.spawn()?;
    Ok(OwnedChild {
        id: own(Owned::Child(child.id())),
        child: Some(child),
    })
}

/// [`Command::output`] for a child this command owns: `cmd` started with
/// [`spawn`] (stdout and stderr piped), waited for, its output collected.
pub fn output(cmd: &mut Command) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    spawn(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )?
    .wait_with_output()
}

impl OwnedChild {
    /// [`Child::wait_with_output`]: waits for the child, collecting what it
    /// wrote to its piped stdout and stderr.
    pub fn wait_with_output(mut self) -> std::io::Result<std::process::Output> {
        let child = self.child.take().expect("the child is taken only here");
        let out = child.wait_with_output();
        // Reaped: from here its PID may name another process.
        unregister(self.id);
        out
    }
}

impl Deref for OwnedChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.child
            .as_ref()
            .expect("the child is taken only by value")
    }
}

impl DerefMut for OwnedChild {
    fn deref_mut(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .expect("the child is taken only by value")
    }
}

impl Drop for OwnedChild {
    fn drop(&mut self) {
        unregister(self.id);
        if let Some(child) = &mut self.child {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Kills a registered child unless it is no longer ours: once reaped
/// (its guard not yet dropped) its PID may name another process, so only
/// a process whose parent is this one is killed.
fn kill_child(pid: u32) {
    let ours = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // pid (comm) state ppid ...; comm may hold spaces and parens.
            let after = &s[s.rfind(')')? + 1..];
            after.split_whitespace().nth(1)?.parse::<u32>().ok()
        })
        == Some(std::process::id());
    if ours {
        let _ = faultline_sys::process::kill(pid as i32, faultline_sys::process::SIGKILL);
    }
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

/// Gives back everything registered now (the process is about to end):
/// children killed first, then mounts unmounted, paths removed, and
/// settings put back.
pub fn remove_all() {
    let mut owned = std::mem::take(&mut *registry().owned.lock().expect("cleanup registry"));
    owned.sort_by_key(|(_, o)| match o {
        Owned::Child(_) => 0,
        Owned::Mount(_) => 1,
        Owned::Path(_) => 2,
        Owned::Setting(..) => 3,
    });
    for (_, o) in owned {
        match o {
            Owned::Child(pid) => kill_child(pid),
            Owned::Mount(at) => unmount(&at),
            Owned::Path(p) => remove(&p),
            Owned::Setting(p, old) => {
                let _ = std::fs::write(p, old);
            }
        }
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
        .name("fl-signals".into())
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
                        if let Some(last) = &*registry().abort.lock().expect("abort hook") {
                            last(sig);
                        }
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

/// Before a second SIGINT/SIGTERM/SIGHUP (or the first, without a stop
/// hook) ends the process, call `last` with the signal (from the signal
/// thread): what must not outlive the process unattended (a daemon's
/// clients that would wait for it forever) is ended there.
pub fn on_abort(last: impl Fn(i32) + Send + 'static) {
    *registry().abort.lock().expect("abort hook") = Some(Box::new(last));
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
        .owned
        .lock()
        .expect("cleanup registry")
        .iter()
        .any(|(_, q)| *q == Owned::Path(p.to_path_buf()))
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
    fn mount_points_are_read_with_their_escapes_undone() {
        assert_eq!(unescape_mount_point(r"/tmp/a\040b\011c"), "/tmp/a b\tc");
        assert_eq!(unescape_mount_point(r"/x\134y"), r"/x\y");
        // Not an escape: kept as written.
        assert_eq!(unescape_mount_point(r"/x\9"), r"/x\9");
    }

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
