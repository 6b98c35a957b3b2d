//! Processes: signals to other processes and process groups, resource
//! usage of this process and of the calling thread.

use std::io;

/// `SIGKILL`.
pub const SIGKILL: i32 = libc::SIGKILL;
/// `SIGTERM`.
pub const SIGTERM: i32 = libc::SIGTERM;
/// `SIGINT`.
pub const SIGINT: i32 = libc::SIGINT;

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

/// Whether process `pid` exists (`kill(pid, 0)`; a process we may not
/// signal exists too).
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
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
