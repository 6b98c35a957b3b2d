//! Threads, signals, eventfd, CPU affinity.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The calling thread's kernel tid.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Pins the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
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
    /// Adds 1 to the counter (wakes pollers).
    pub fn notify(&self) {
        let v: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64. Failure (counter
        // overflow) still leaves the fd readable, which is all we need.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&v as *const u64).cast(), 8);
        }
    }
    /// Resets the counter.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a valid u64; EAGAIN when empty is fine.
        unsafe {
            libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }
    /// The raw fd, for `poll`.
    pub fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }
}

/// `poll()` on `fds` (all for POLLIN) with a timeout in ms; returns the
/// revents of each. EINTR counts as a timeout.
pub fn poll_in(fds: &[i32], timeout_ms: i32, revents: &mut [i16]) -> io::Result<usize> {
    let mut p = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 4];
    assert!(fds.len() <= p.len());
    for (slot, &fd) in p.iter_mut().zip(fds) {
        slot.fd = fd;
        slot.events = libc::POLLIN;
    }
    // SAFETY: `p` holds `fds.len()` initialised pollfds.
    let n = unsafe { libc::poll(p.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            revents.iter_mut().for_each(|r| *r = 0);
            return Ok(0);
        }
        return Err(e);
    }
    for (r, slot) in revents.iter_mut().zip(p.iter()) {
        *r = slot.revents;
    }
    Ok(n as usize)
}

/// A saved `sigaction`, for chaining and restoring.
pub type SigAction = libc::sigaction;

/// Installs `handler` (an `SA_SIGINFO` handler) for `sig` with
/// `SA_NODEFER` (and `SA_ONSTACK` if `onstack`), returning the previous
/// action.
pub fn install_sigaction(
    sig: i32,
    handler: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void),
    onstack: bool,
) -> io::Result<SigAction> {
    // SAFETY: sigaction structs are plain data; we fill every field we use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
        if onstack {
            sa.sa_flags |= libc::SA_ONSTACK;
        }
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &sa, &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(old)
    }
}

/// Passes a signal on to the action that was installed before ours
/// (`prev`, null if none): calls its handler, ignores it if it was ignored
/// (except a fault-generated signal, which would only repeat), or performs
/// the default action. Async-signal-safe.
///
/// # Safety
/// `prev` is null or points to a valid `sigaction` for `sig`; `info` and
/// `ctx` are what the kernel passed to the calling handler.
pub unsafe fn chain_to(
    prev: *const SigAction,
    sig: i32,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    if !prev.is_null() {
        // SAFETY: the caller guarantees `prev`.
        let prev = unsafe { &*prev };
        let h = prev.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: installed by its owner as an SA_SIGINFO handler;
                // called with the arguments the kernel gave us.
                let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain `void (*)(int)` handler.
                let f: extern "C" fn(i32) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
        if h == libc::SIG_IGN && sig != libc::SIGBUS && sig != libc::SIGSEGV {
            return;
        }
    }
    // Default action: re-raise with the default disposition (for a
    // fault-generated signal the retried access would raise it anyway).
    reset_to_default(sig);
    // SAFETY: raise is async-signal-safe.
    unsafe {
        libc::raise(sig);
    }
}

/// Restores the default action of `sig`. Async-signal-safe.
pub fn reset_to_default(sig: i32) {
    // SAFETY: sigaction is async-signal-safe; the struct is fully zeroed
    // (SIG_DFL == 0).
    unsafe {
        let sa: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// Installs an alternate signal stack of `size` bytes for the calling
/// thread (fresh anonymous memory, outside every region). Returns the
/// mapping, which must outlive the thread's use of it.
pub fn install_altstack(size: usize) -> io::Result<super::mem::Mapping> {
    let m = super::mem::Mapping::anon(size).map_err(|e| e.source)?;
    let st = libc::stack_t {
        ss_sp: m.as_ptr().cast(),
        ss_flags: 0,
        ss_size: size,
    };
    // SAFETY: `st` describes memory we own and keep alive in `m`.
    if unsafe { libc::sigaltstack(&st, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(m)
}

/// Disables the calling thread's alternate signal stack.
pub fn remove_altstack() {
    let st = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: libc::SS_DISABLE,
        ss_size: 0,
    };
    // SAFETY: disabling is always valid (fails with EPERM only while on the
    // stack, which cannot be the case here).
    unsafe {
        libc::sigaltstack(&st, std::ptr::null_mut());
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

/// Whether a `revents` value from [`poll_in`] reports an error or a
/// hang-up (`POLLERR`, `POLLHUP`) rather than readiness.
pub fn poll_failed(revents: i16) -> bool {
    revents & (libc::POLLERR | libc::POLLHUP) != 0
}
