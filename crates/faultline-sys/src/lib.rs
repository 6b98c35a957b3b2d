//! The kernel interface of the faultline crates: the only code in the
//! workspace that calls libc, issues a system call or an ioctl, or touches
//! a signal context.
//!
//! Everything here is a thin, checked wrapper over one system call or
//! ioctl; policy lives in the crates above. Wrappers used from signal
//! handlers are async-signal-safe: no allocation, no locks. Errors keep
//! the errno and name the operation that failed ([`Errno`],
//! [`mem::MemError`], [`uffd::UffdError`], `io::Error` from the raw OS
//! error).
//!
//! Every crate of the workspace that talks to the kernel depends on this
//! one (`faultline`, `faultline-watch`, `faultline-io`, `faultline-serve`,
//! `faultline-bench`, the C libraries); the library `faultline` re-exports
//! the error types its own API carries. The API follows what those crates
//! need and is not yet stable.
//!
//! | module | what |
//! |---|---|
//! | [`cgroup`] | a process's control group for one controller (v1 or v2): its memory limit, OOM kills, any value |
//! | [`failpoint`] | named points where a test makes the process `SIGKILL` itself (`FAULTLINE_FAILPOINT`) |
//! | [`mem`] | mappings, protection ([`mem::Prot`]), `madvise`, memfd, file I/O, `vmsplice`, `PROCMAP_QUERY`, reading our own memory without faulting |
//! | [`pagemap`] | `PAGEMAP_SCAN` of `/proc/PID/pagemap`: which pages of a range are written, present, swapped |
//! | [`uffd`] | the userfaultfd ABI (struct sizes asserted at compile time), its creation paths and one wrapper per ioctl |
//! | `perf` (feature `perf`) | `perf_event_open` hardware breakpoints |
//! | [`signal`] | handlers, chaining, alternate stacks, masks, [`signal::SignalContext`] |
//! | [`poll`] | `poll(2)`: the one wrapper every crate waits with |
//! | [`process`] | `kill` of a process or a group, `getrusage` of the process or the thread |
//! | [`sock`] | descriptor passing (`SCM_RIGHTS`), `SO_PEERCRED`, receive buffers, non-blocking send/receive |
//! | [`thread`] | ids, affinity, scheduling class, futex, eventfd, fork hooks |

pub mod cgroup;
pub mod failpoint;
pub mod mem;
pub mod pagemap;
#[cfg(feature = "perf")]
pub mod perf;
pub mod poll;
pub mod process;
pub mod signal;
pub mod sock;
pub mod thread;
pub mod uffd;

use std::fmt;

/// An errno value, kept as the kernel gave it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// `EPERM`.
    pub const EPERM: Errno = Errno(libc::EPERM);
    /// `ENOENT`.
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// `ESRCH`.
    pub const ESRCH: Errno = Errno(libc::ESRCH);
    /// `EINTR`.
    pub const EINTR: Errno = Errno(libc::EINTR);
    /// `EIO`.
    pub const EIO: Errno = Errno(libc::EIO);
    /// `EBADF`.
    pub const EBADF: Errno = Errno(libc::EBADF);
    /// `EAGAIN`.
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    /// `ENOMEM`.
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    /// `EACCES`.
    pub const EACCES: Errno = Errno(libc::EACCES);
    /// `EFAULT`.
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    /// `EBUSY`.
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    /// `EEXIST`.
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    /// `ENODEV`.
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    /// `EISDIR`.
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    /// `EINVAL`.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// `ENOSPC`.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// `ENOSYS`.
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    /// `ENOTDIR`.
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    /// `ENOTTY`.
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    /// `EOPNOTSUPP`.
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    /// `ELOOP`.
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    /// `ETIMEDOUT`.
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);
    /// `ECONNREFUSED`.
    pub const ECONNREFUSED: Errno = Errno(libc::ECONNREFUSED);

    /// The errno behind an `io::Error`, if it came from the kernel.
    pub fn of(e: &std::io::Error) -> Option<Errno> {
        e.raw_os_error().map(Errno)
    }

    /// Whether this is `other`.
    pub fn is(self, other: Errno) -> bool {
        self == other
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
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

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `std::time::Instant` reads
/// on Linux, and the same in every process of the machine (timelines
/// measured across processes compare these).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
