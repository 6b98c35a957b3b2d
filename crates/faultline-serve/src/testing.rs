//! Fixtures for tests that run serve and its peers as real processes
//! (`faultline-serve`'s own tests, the `faultline` front door's): a temp
//! dir with a memory file of seeded bytes, children stopped by their pid
//! on drop, and waits that end at a deadline.
//!
//! A command is given as its program and leading arguments, so the same
//! test runs `faultline-serve ARGS` or `faultline serve ARGS`:
//!
//! ```no_run
//! use faultline_serve::testing::{self, Dir, WAIT};
//!
//! let dir = Dir::new("example", 8 << 20);
//! let mut s = testing::serve(&dir, &["faultline-serve"], &["--peers", "1"]);
//! let mut p = testing::peer(&dir, &["faultline-peer"], "p", &["--verify-all"]);
//! testing::assert_ok(&mut p, &dir);
//! testing::assert_ok(&mut s, &dir);
//! ```

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long any wait of a test may last.
pub const WAIT: Duration = Duration::from_secs(60);

/// A temp dir with a memory file (`mem`) of seeded bytes, removed on drop.
pub struct Dir(PathBuf);

impl Dir {
    /// `faultline-serve-NAME-PID` in the temp dir, with `mem_bytes` of
    /// xorshift bytes in `mem`.
    pub fn new(name: &str, mem_bytes: usize) -> Dir {
        let d = std::env::temp_dir().join(format!("faultline-serve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("creating the test dir");
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ mem_bytes as u64;
        let mut buf = Vec::with_capacity(mem_bytes + 8);
        while buf.len() < mem_bytes {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.extend_from_slice(&x.to_le_bytes());
        }
        let mut f = std::fs::File::create(d.join("mem")).expect("creating the memory file");
        f.write_all(&buf[..mem_bytes])
            .expect("writing the memory file");
        Dir(d)
    }

    /// `f` in the dir.
    pub fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }

    /// The socket serve binds.
    pub fn sock(&self) -> PathBuf {
        self.path("sock")
    }

    /// The text of `f` (empty if absent).
    pub fn text(&self, f: &str) -> String {
        std::fs::read_to_string(self.path(f)).unwrap_or_default()
    }

    /// Waits until `f` contains `needle`.
    pub fn wait_for(&self, f: &str, needle: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.text(f).contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{f} never said {needle:?}:\n{}",
                self.text(f)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes `all.txt`, a working-set record of every page of the first
    /// `mem_bytes` of the memory file.
    pub fn record_all(&self, mem_bytes: usize) -> PathBuf {
        let path = self.path("all.txt");
        let offsets: Vec<u64> = (0..mem_bytes as u64).step_by(4096).collect();
        crate::record::write(&path, &offsets).expect("writing the record");
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed (by its pid) and reaped on drop.
pub struct Proc {
    /// The child.
    pub child: Child,
    /// Its name in messages (its stderr is `NAME.err` of the dir).
    pub name: String,
}

impl Proc {
    /// Runs `cmd` (program, then leading arguments) with `args`, its stderr
    /// to `stderr`.
    pub fn start(name: &str, cmd: &[&str], args: &[&str], stderr: &std::path::Path) -> Proc {
        Proc::start_with_env(name, cmd, args, &[], stderr)
    }

    /// [`Proc::start`] with `env` added to its environment.
    pub fn start_with_env(
        name: &str,
        cmd: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        stderr: &std::path::Path,
    ) -> Proc {
        Proc::spawn(
            name,
            Command::new(cmd[0]).envs(env.iter().copied()),
            cmd,
            args,
            stderr,
        )
    }

    /// [`Proc::start`] with its descriptor limit set to `limit`.
    pub fn start_with_fd_limit(
        name: &str,
        cmd: &[&str],
        args: &[&str],
        limit: faultline_sys::process::FdLimit,
        stderr: &std::path::Path,
    ) -> Proc {
        let mut c = Command::new(cmd[0]);
        // SAFETY: the closure makes one system call (setrlimit) and
        // allocates nothing: async-signal-safe between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
                faultline_sys::process::set_fd_limit(limit)
            })
        };
        Proc::spawn(name, &mut c, cmd, args, stderr)
    }

    fn spawn(
        name: &str,
        c: &mut Command,
        cmd: &[&str],
        args: &[&str],
        stderr: &std::path::Path,
    ) -> Proc {
        let child = c
            .args(&cmd[1..])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(stderr).expect("creating the stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", cmd[0]));
        Proc {
            child,
            name: name.into(),
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for it to exit; fails the test after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("waitpid") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("waitpid").is_none()
    }

    /// Kills it (SIGKILL to its pid) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits for `p` to exit and fails the test, with its stderr and serve's,
/// unless it succeeded.
pub fn assert_ok(p: &mut Proc, dir: &Dir) {
    let s = p.wait(WAIT);
    assert!(
        s.success(),
        "{} failed ({s}):\n{}\nserve:\n{}",
        p.name,
        dir.text(&format!("{}.err", p.name)),
        dir.text("serve.err")
    );
}

/// `--socket SOCK --mem MEM EXTRA...` of `dir`.
pub fn command(dir: &Dir, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["--socket".into()];
    args.push(dir.sock().to_str().expect("a UTF-8 path").into());
    args.push("--mem".into());
    args.push(dir.path("mem").to_str().expect("a UTF-8 path").into());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Starts `cmd` of `dir` as `name` (`command` arguments).
pub fn start(dir: &Dir, name: &str, cmd: &[&str], extra: &[&str]) -> Proc {
    let args = command(dir, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::start(name, cmd, &args, &dir.path(&format!("{name}.err")))
}

/// Starts serve (`cmd`) on `dir` with `--timeout 20 EXTRA` (`EXTRA`
/// alone when it gives its own `--timeout`) as `serve`; returns once its
/// socket is bound.
pub fn serve(dir: &Dir, cmd: &[&str], extra: &[&str]) -> Proc {
    bound(dir, start(dir, "serve", cmd, &with_timeout(extra)))
}

/// `--timeout 20 EXTRA`, or `EXTRA` when it has a `--timeout` of its own.
fn with_timeout<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let own = extra.contains(&"--timeout");
    let default: &[&str] = if own { &[] } else { &["--timeout", "20"] };
    [default, extra].concat()
}

/// [`serve`] started with `env` added to its environment (a failpoint,
/// say).
pub fn serve_with_env(dir: &Dir, cmd: &[&str], extra: &[&str], env: &[(&str, &str)]) -> Proc {
    let args = command(dir, &with_timeout(extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = Proc::start_with_env("serve", cmd, &args, env, &dir.path("serve.err"));
    bound(dir, p)
}

/// [`serve`] started with its descriptor limit set to `limit`.
pub fn serve_with_fd_limit(
    dir: &Dir,
    cmd: &[&str],
    extra: &[&str],
    limit: faultline_sys::process::FdLimit,
) -> Proc {
    let args = command(dir, &with_timeout(extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let p = Proc::start_with_fd_limit("serve", cmd, &args, limit, &dir.path("serve.err"));
    bound(dir, p)
}

/// `p`, once `dir`'s serve socket is bound.
fn bound(dir: &Dir, mut p: Proc) -> Proc {
    let deadline = Instant::now() + WAIT;
    while !dir.sock().exists() {
        assert!(
            Instant::now() < deadline && p.running(),
            "serve never bound its socket: {}",
            dir.text("serve.err")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    p
}

/// Starts a peer (`cmd`) of `dir` as `name` with `extra`.
pub fn peer(dir: &Dir, cmd: &[&str], name: &str, extra: &[&str]) -> Proc {
    start(dir, name, cmd, extra)
}

/// After `dir`'s serve (`--takeover`, started with `args`) died: waits
/// until its keeper holds `held` peers for the next serve, then starts
/// the same command again (`cmd`, as `again`).
pub fn serve_again(dir: &Dir, cmd: &[&str], args: &[&str], held: usize) -> Proc {
    dir.wait_for(
        "serve.err",
        &format!("holding {held} peer(s) for the next serve"),
    );
    start(dir, "again", cmd, &with_timeout(args))
}

/// The pid of the keeper of `dir`'s serve (`--takeover`), from serve's
/// stderr (which the keeper shares).
pub fn keeper_pid(dir: &Dir) -> i32 {
    dir.wait_for("serve.err", "keeps the peers of");
    let log = dir.text("serve.err");
    let line = log
        .lines()
        .find(|l| l.contains("keeps the peers of"))
        .expect("the keeper's line");
    line.split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

/// The arguments of process `pid` (`/proc/PID/cmdline`; `None` once it
/// is gone).
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// What `pkill -KILL -f PATTERN` does with a fixed-string `pattern`:
/// SIGKILLs every other process whose command line (arguments joined by
/// spaces) contains it, and gives their pids.
pub fn pkill_f(pattern: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut killed = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc") {
        let Some(pid) = e
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        else {
            continue;
        };
        let Some(args) = cmdline(pid) else { continue };
        if pid != me && args.join(" ").contains(pattern) {
            let _ = faultline_sys::process::kill(pid, faultline_sys::process::SIGKILL);
            killed.push(pid);
        }
    }
    killed
}

/// The kernel functions the threads of process `pid` sleep in
/// (`/proc/PID/task/TID/wchan`): `handle_userfault` for a vCPU blocked on
/// a missing page.
pub fn wchans(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("wchan")).ok())
        .collect()
}

/// Waits (at most [`WAIT`]) until process `pid` (`what`, in the message)
/// is gone.
pub fn wait_exited(pid: i32, what: &str) {
    let deadline = Instant::now() + WAIT;
    while faultline_sys::process::alive(pid) {
        assert!(Instant::now() < deadline, "{what} {pid} is still there");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The number `log` says right after `after` (panics, with the log, when
/// it says none).
pub fn number_after(log: &str, after: &str) -> usize {
    log.split(after)
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {after:?}: {log}"))
}

/// `POST path` to serve's metrics endpoint on the unix socket `sock`;
/// the whole answer (status line, head, body), which must be `200`.
pub fn post(sock: &std::path::Path, path: &str) -> String {
    use std::io::Read as _;
    let mut c =
        std::os::unix::net::UnixStream::connect(sock).expect("connecting to the metrics socket");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "POST {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.0 200"), "POST {path}: {text}");
    text
}
