//! Threads: ids, CPU affinity, scheduling class, futexes, eventfd, fork
//! hooks. Signals are in [`crate::signal`], processes in [`crate::process`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The calling thread's kernel tid.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The process id (of the calling process: after `fork`, the child's).
pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Gives up the CPU (`sched_yield`). Async-signal-safe.
pub fn sched_yield() {
    // SAFETY: sched_yield has no preconditions (and cannot fail on Linux).
    unsafe {
        libc::sched_yield();
    }
}

/// Registers `f` to run in the child process after every `fork`
/// (`pthread_atfork` with only a child hook). `f` runs in the child
/// before `fork` returns there, while the child is single-threaded; it
/// must be async-signal-safe.
pub fn at_fork_in_child(f: extern "C" fn()) -> io::Result<()> {
    // SAFETY: registers a plain function with no captured state; the
    // caller's contract covers what it does in the child.
    let r = unsafe { libc::pthread_atfork(None, None, Some(f as unsafe extern "C" fn())) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// The CPUs the calling thread may run on (`sched_getaffinity`).
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    allowed_cpus_of(0)
}

/// The CPUs thread `tid` (of any process; 0: the caller) may run on.
pub fn allowed_cpus_of(tid: i32) -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
        != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, inside the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pins the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    set_affinity(&[cpu])
}

/// Pins the calling thread to the CPU `pick` chooses among those it may
/// run on now (its inherited mask: a `taskset` or a caller's own
/// affinity), so it stays inside them; left as it is if `pick` chooses
/// none.
pub fn pin_within(pick: impl FnOnce(&[usize]) -> Option<usize>) -> io::Result<()> {
    match pick(&allowed_cpus()?) {
        Some(cpu) => pin_to_cpu(cpu),
        None => Ok(()),
    }
}

/// Lets the calling thread run only on `cpus` (`sched_setaffinity`; CPUs
/// at or past `CPU_SETSIZE` are ignored). The kernel moves the thread at
/// once if it runs elsewhere; an empty set fails with `EINVAL`.
pub fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE, inside the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 = this thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPU the calling thread runs on now (`sched_getcpu`, a vDSO call),
/// `None` if the kernel cannot say.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments; returns a CPU number or -1.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

/// Runs the calling thread under `SCHED_FIFO` at `priority` (1-99), with
/// `SCHED_RESET_ON_FORK` so threads it starts get the normal policy
/// back. Needs `CAP_SYS_NICE` (or an RLIMIT_RTPRIO allowance): `EPERM`
/// otherwise.
pub fn set_fifo(priority: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a valid sched_param for the calling thread (0).
    let r =
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &p) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `SCHED_IDLE`, as [`policy`] reports it.
pub const SCHED_IDLE: i32 = libc::SCHED_IDLE;

/// Runs the calling thread under `SCHED_IDLE`, with `SCHED_RESET_ON_FORK`:
/// it runs when no normal thread wants its CPU (under load the kernel
/// still gives it a sliver: weight 3 against a nice-0 thread's 1024).
/// Needs no privilege.
pub fn set_idle() -> io::Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param for the calling thread (0).
    let r =
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE | libc::SCHED_RESET_ON_FORK, &p) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The scheduling policy of thread `tid` (0: the caller), without the
/// `SCHED_RESET_ON_FORK` flag (`sched_getscheduler`): `SCHED_OTHER` 0,
/// `SCHED_FIFO` 1, `SCHED_RR` 2, `SCHED_BATCH` 3, [`SCHED_IDLE`] 5.
pub fn policy(tid: i32) -> io::Result<i32> {
    // SAFETY: sched_getscheduler reads the policy of a thread id; no memory
    // is passed.
    let r = unsafe { libc::sched_getscheduler(tid) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r & !libc::SCHED_RESET_ON_FORK)
}

/// Puts the calling thread back under the normal policy (`SCHED_OTHER`).
pub fn set_normal() -> io::Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param for the calling thread (0).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Clock ticks per second (`USER_HZ`), the unit of `/proc/stat` and
/// `/proc/PID/stat` CPU times.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf reads a constant; no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).unwrap_or(100).max(1)
}

/// Number of CPUs this process may run on.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// An eventfd, used to wake handler threads out of `poll()` for shutdown
/// and cross-worker hand-offs.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking, close-on-exec eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd owned here.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    /// Adds 1 to the counter (wakes pollers). Failure (counter overflow)
    /// still leaves the fd readable, which is all a waker needs.
    pub fn notify(&self) {
        let _ = self.add(1);
    }
    /// Resets the counter (nothing to do when it is zero already).
    pub fn drain(&self) {
        let _ = self.take();
    }
    /// Adds `v` to the counter: one 8-byte `write`.
    pub fn add(&self, v: u64) -> io::Result<()> {
        // SAFETY: writing 8 bytes from a valid u64.
        let n = unsafe { libc::write(self.0.as_raw_fd(), (&v as *const u64).cast(), 8) };
        if n != 8 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    /// Reads and resets the counter: one 8-byte `read`. `WouldBlock`
    /// (EAGAIN) when it is zero.
    pub fn take(&self) -> io::Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a valid u64.
        let n = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n != 8 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    }
    /// The raw fd, for `poll`.
    pub fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }
}

/// `FUTEX_WAIT` on `word` while it equals `val`, for at most `timeout`.
/// Returns on wake, timeout, value change or signal.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, val: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the call's duration; the
    // timeout is a valid timespec. Errors (EAGAIN, ETIMEDOUT, EINTR) are
    // all "go and look again".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            val,
            &ts as *const libc::timespec,
        );
    }
}

/// `FUTEX_WAKE` every waiter on `word`. Async-signal-safe (one syscall).
pub fn futex_wake_all(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// `FUTEX_WAKE` one waiter on `word`. Async-signal-safe (one syscall).
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_thread_reports_sched_idle_and_others_keep_theirs() {
        let before = policy(0).unwrap();
        let idle = std::thread::spawn(|| {
            set_idle().unwrap();
            policy(0).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(idle, SCHED_IDLE);
        assert_ne!(before, SCHED_IDLE);
        assert_eq!(policy(0).unwrap(), before, "only the thread that asked");
    }
}
