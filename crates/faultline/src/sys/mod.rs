//! The only module that talks to the kernel.
//!
//! Everything here is a thin, checked wrapper over one system call or
//! ioctl; policy lives elsewhere. Wrappers used from the SIGBUS handler are
//! async-signal-safe: no allocation, no locks.

pub mod mem;
pub mod perf;
pub mod thread;
pub mod uffd;

use std::fmt;

/// An errno value, kept as the kernel gave it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// Operation not permitted.
    pub const EPERM: Errno = Errno(libc::EPERM);
    /// No such file, or (resolve ioctls) the range is gone.
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// No such process.
    pub const ESRCH: Errno = Errno(libc::ESRCH);
    /// Try again: (resolve ioctls) an event is pending.
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    /// Permission denied.
    pub const EACCES: Errno = Errno(libc::EACCES);
    /// Bad address: (system calls) a fault the kernel could not resolve.
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    /// Resource busy: (MOVE) the source folio could not be taken.
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    /// Exists: (resolve ioctls) the page is already there.
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// No space: (perf) no free debug register.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// Not implemented (or blocked by seccomp).
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    /// Out of memory (or `vm.max_map_count` reached).
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    /// Timed out.
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);

    /// The errno of an `io::Error`, if it has one.
    pub fn of(e: &std::io::Error) -> Option<Errno> {
        e.raw_os_error().map(Errno)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({} {})", self.0, errno_name(self.0))
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Allocation-free (used from the SIGBUS handler): no strerror.
        write!(f, "{} (errno {})", errno_name(self.0), self.0)
    }
}

/// The calling thread's errno.
#[inline]
pub fn errno() -> i32 {
    // SAFETY: `__errno_location` always returns a valid pointer to the
    // calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno (signal handlers restore it on exit).
#[inline]
pub fn set_errno(v: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = v }
}

/// Short symbolic name of the errno values we meet; "E?" otherwise.
pub fn errno_name(e: i32) -> &'static str {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTTY => "ENOTTY",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "E?",
    }
}

/// The base page size of the machine (4 KiB on x86_64).
pub const BASE_PAGE: usize = 4096;

/// Kernel release string (`uname -r`).
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates the field.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Writes `msg` to stderr with one `write(2)`: async-signal-safe.
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: valid buffer; the result is deliberately ignored (nothing
    // useful can be done if stderr is gone).
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

/// Reads the TSC.
#[inline(always)]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let t = std::time::Instant::now();
        t.elapsed().as_nanos() as u64
    }
}
