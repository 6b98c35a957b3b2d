//! Processes: signals to other processes and process groups, resource
//! usage of this process and of the calling thread, its descriptor limit
//! ([`raise_fd_limit`]), and [`Pidfd`]: a
//! process held by a descriptor, so a signal never reaches another
//! process that was given its pid after it exited.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `SIGKILL`.
pub const SIGKILL: i32 = libc::SIGKILL;
/// `SIGTERM`.
pub const SIGTERM: i32 = libc::SIGTERM;
/// `SIGINT`.
pub const SIGINT: i32 = libc::SIGINT;
/// `SIGSTOP`: stops a process (tests freeze a server with it).
pub const SIGSTOP: i32 = libc::SIGSTOP;
/// `SIGCONT`: lets a stopped process go on.
pub const SIGCONT: i32 = libc::SIGCONT;

/// `kill(2)`: sends `sig` to process `pid` (which must be positive: never
/// a process group, never every process).
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: plain syscall with integer arguments.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `kill(-pgid, sig)`: sends `sig` to every process of the process group
/// `pgid` (which must be positive: a group we made, e.g. with
/// `CommandExt::process_group(0)`).
pub fn kill_group(pgid: i32, sig: i32) -> io::Result<()> {
    if pgid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: plain syscall with integer arguments.
    if unsafe { libc::kill(-pgid, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A process held by a pidfd (`pidfd_open(2)`, Linux 5.3+): signals sent
/// through it reach that very process, or fail with `ESRCH` once it has
/// exited (even if its pid was reused since); it is readable (`poll`)
/// once the process has exited.
///
/// ```text
///  Pidfd::open(pid) ── pid names the process now ──► the descriptor
///     (it exits, its pid goes to another process)
///  send_signal(SIGKILL) ──► ESRCH: the other process is never hit
/// ```
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// `pidfd_open(pid, 0)`: the process `pid` names now (positive only).
    pub fn open(pid: i32) -> io::Result<Pidfd> {
        if pid <= 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: plain syscall with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pidfd_open returned a new descriptor that nothing else
        // owns.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// `pidfd_send_signal(fd, sig, NULL, 0)`: `ESRCH` if the process has
    /// exited.
    pub fn send_signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: plain syscall on a descriptor we own; a null siginfo
        // makes the kernel fill it as kill(2) would.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits at most `timeout_ms` (negative: forever) for the process to
    /// exit; whether it has.
    pub fn wait_exit(&self, timeout_ms: i32) -> io::Result<bool> {
        let mut fds = [crate::poll::PollFd {
            fd: self.0.as_raw_fd(),
            events: crate::poll::events::IN,
            revents: 0,
        }];
        loop {
            match crate::poll::poll(&mut fds, timeout_ms) {
                Ok(n) => return Ok(n > 0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl From<OwnedFd> for Pidfd {
    /// A pidfd received or made elsewhere (`SO_PEERPIDFD`).
    fn from(fd: OwnedFd) -> Pidfd {
        Pidfd(fd)
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// The CPUs any thread of process `pid` may run on: the union of its
/// threads' affinities (`/proc/PID/task`, `sched_getaffinity`), sorted. A
/// thread that ends while they are read is left out.
pub fn allowed_cpus(pid: i32) -> io::Result<Vec<usize>> {
    let mut cpus = std::collections::BTreeSet::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = t?.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Ok(c) = crate::thread::allowed_cpus_of(tid) {
            cpus.extend(c);
        }
    }
    Ok(cpus.into_iter().collect())
}

/// Whether process `pid` exists (`kill(pid, 0)`; a process we may not
/// signal exists too).
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// Whether process `pid` holds a userfaultfd (one of its descriptors is
/// `anon_inode:[userfaultfd]` in `/proc/PID/fd`): a process that holds
/// none has no page a fault could wait on for a handler.
pub fn holds_userfaultfd(pid: i32) -> io::Result<bool> {
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // A descriptor closed since the listing is skipped.
        if let Ok(target) = std::fs::read_link(e?.path()) {
            if target.as_os_str() == "anon_inode:[userfaultfd]" {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// What `getrusage(2)` says of this process or thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Minor (no I/O) page faults.
    pub minor_faults: u64,
    /// Major page faults (the page was read from disk).
    pub major_faults: u64,
    /// System CPU time, in seconds.
    pub system_seconds: f64,
    /// User CPU time, in seconds.
    pub user_seconds: f64,
}

impl Usage {
    /// User + system CPU time, in whole microseconds.
    pub fn cpu_us(&self) -> u64 {
        ((self.user_seconds + self.system_seconds) * 1e6) as u64
    }
}

/// `getrusage(RUSAGE_SELF)` of the whole process.
pub fn usage() -> io::Result<Usage> {
    rusage(libc::RUSAGE_SELF)
}

/// `getrusage(RUSAGE_THREAD)`: the calling thread only.
pub fn thread_usage() -> io::Result<Usage> {
    rusage(libc::RUSAGE_THREAD)
}

fn rusage(who: libc::c_int) -> io::Result<Usage> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is valid for writes of one `rusage`; `who` is one of
    // the two values above.
    if unsafe { libc::getrusage(who, ru.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getrusage succeeded, so it initialised `ru`.
    let ru = unsafe { ru.assume_init() };
    Ok(Usage {
        minor_faults: ru.ru_minflt as u64,
        major_faults: ru.ru_majflt as u64,
        system_seconds: ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 * 1e-6,
        user_seconds: ru.ru_utime.tv_sec as f64 + ru.ru_utime.tv_usec as f64 * 1e-6,
    })
}

/// This process's limit on open descriptors (`RLIMIT_NOFILE`): soft
/// (what `open`, `accept` and `recvmsg` run into) and hard (how far the
/// soft one may be raised without privilege).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit: the lowest descriptor number that cannot be used.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// `getrlimit(RLIMIT_NOFILE)`.
pub fn fd_limit() -> io::Result<FdLimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is valid for writes of one `rlimit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FdLimit {
        soft: l.rlim_cur,
        hard: l.rlim_max,
    })
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one, as a daemon holding
/// descriptors per client should (service managers start processes with
/// a soft limit of 1024 for `select(2)`'s sake, and a much higher hard
/// one; nothing here uses `select`). Gives the limit before and after.
pub fn raise_fd_limit() -> io::Result<(FdLimit, FdLimit)> {
    let before = fd_limit()?;
    if before.soft >= before.hard {
        return Ok((before, before));
    }
    set_fd_limit(FdLimit {
        soft: before.hard,
        hard: before.hard,
    })?;
    Ok((before, fd_limit()?))
}

/// `setrlimit(RLIMIT_NOFILE)`. Async-signal-safe (one system call), so a
/// child may set its limit between `fork` and `exec`
/// (`CommandExt::pre_exec`).
pub fn set_fd_limit(limit: FdLimit) -> io::Result<()> {
    let l = libc::rlimit {
        rlim_cur: limit.soft,
        rlim_max: limit.hard,
    };
    // SAFETY: `l` is a valid `rlimit`, only read.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `e` says a process (`EMFILE`) or the system (`ENFILE`) has
/// no descriptor left to give.
pub fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// How many descriptors this process has open (the entries of
/// `/proc/self/fd`, less the one reading it).
pub fn open_fds() -> io::Result<u64> {
    Ok(std::fs::read_dir("/proc/self/fd")?
        .count()
        .saturating_sub(1) as u64)
}

/// How many descriptor numbers below the soft limit are free: what
/// `open`, `accept` and `recvmsg` can still be given (descriptors above
/// the limit, inherited before it was lowered, take none of them).
pub fn fds_free() -> io::Result<u64> {
    let limit = fd_limit()?.soft;
    let dir = std::fs::read_dir("/proc/self/fd")?;
    let below = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter(|&fd| fd < limit)
        .count() as u64;
    // Less the one reading the directory.
    Ok((limit + 1).saturating_sub(below))
}

/// Makes the calling process receive `sig` when the thread that started it
/// ends (`prctl(PR_SET_PDEATHSIG)`), and sends it at once if that parent,
/// `parent`, is already gone (this process was re-parented before the
/// `prctl`). Meant for a child between `fork` and `exec`
/// (`CommandExt::pre_exec`): it makes only async-signal-safe calls.
pub fn die_with_parent(sig: i32, parent: i32) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no
    // memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid, getpid and kill take and return integers only.
    unsafe {
        if libc::getppid() != parent {
            libc::kill(libc::getpid(), sig);
        }
    }
    Ok(())
}

/// Names the calling thread `name` (`prctl(PR_SET_NAME)`; at most 15
/// bytes are kept). On the main thread this is the process's name as
/// `/proc/PID/comm`, `ps -o comm`, `pgrep` and `pkill` without `-f` see it.
pub fn set_name(name: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes from the pointer; `name` is NUL-terminated and outlives the
    // call (the kernel copies at most 16 bytes and stops at the NUL).
    if unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Has `cmd` start with `fds` at descriptors 3, 4, ... (as a service
/// manager passes them, `sd_listen_fds(3)`): each is duplicated above the
/// targets now (close-on-exec), and `dup2`ed onto its target between fork
/// and exec. The duplicates returned must live until `cmd` is spawned.
pub fn pass_fds(
    cmd: &mut std::process::Command,
    fds: &[BorrowedFd<'_>],
) -> io::Result<Vec<OwnedFd>> {
    use std::os::unix::process::CommandExt;
    let above = 3 + fds.len() as i32;
    let high = fds
        .iter()
        .map(|f| {
            // SAFETY: F_DUPFD_CLOEXEC on a live descriptor gives a new
            // one at `above` or higher, owned by us.
            let fd = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, above) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` was just made and nothing else owns it.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .collect::<io::Result<Vec<OwnedFd>>>()?;
    let raw: Vec<i32> = high.iter().map(|f| f.as_raw_fd()).collect();
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only dup2 (async-signal-safe) on descriptors the child inherited; it
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for (i, &fd) in raw.iter().enumerate() {
                if libc::dup2(fd, 3 + i as i32) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(high)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_process_holding_a_userfaultfd_is_told_from_one_that_does_not() {
        // A child that holds none (this test process may hold others'),
        // then this process with one of its own.
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let none = super::holds_userfaultfd(child.id() as i32);
        let _ = child.kill();
        let _ = child.wait();
        assert!(!none.unwrap());
        let flags = crate::uffd::open_flags(true);
        let _uffd = crate::uffd::dev_userfaultfd(flags)
            .or_else(|_| crate::uffd::syscall_userfaultfd(flags))
            .unwrap();
        assert!(super::holds_userfaultfd(std::process::id() as i32).unwrap());
        assert!(super::holds_userfaultfd(i32::MAX).is_err());
    }

    use super::*;

    #[test]
    fn a_pidfd_signals_its_process_sees_it_exit_and_never_reaches_past_it() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("starting sleep");
        let pidfd = Pidfd::open(child.id() as i32).expect("pidfd_open");
        assert!(!pidfd.wait_exit(0).unwrap(), "sleep is running");
        pidfd.send_signal(SIGKILL).expect("pidfd_send_signal");
        assert!(pidfd.wait_exit(10_000).unwrap(), "killed within 10 s");
        let st = child.wait().expect("waitpid");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(SIGKILL)
        );
        // Reaped: its pid may belong to anyone now; the pidfd refuses.
        let e = pidfd.send_signal(SIGKILL).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
        assert!(Pidfd::open(0).is_err() && Pidfd::open(-1).is_err());
    }
}
