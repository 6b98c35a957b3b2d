//! The userfaultfd ABI, hard-coded, and thin wrappers around each ioctl.
//!
//! The installed uapi headers on our machines are older than the kernel (they
//! lack `UFFDIO_MOVE`, `UFFDIO_POISON`, `WP_ASYNC`), so the ABI is written out
//! here from `include/uapi/linux/userfaultfd.h` and every struct layout is
//! asserted at compile time. Features are probed at run time
//! (`faultline::caps` in the library), never assumed.
//!
//! # Return conventions
//!
//! Every resolve ioctl reports through its output field (`copy`, `zeropage`,
//! `mapped`, `move`, `updated`), which is *signed*: `len` on success, a
//! positive byte count on a short operation (with `-1/EAGAIN` from `ioctl`),
//! or `-errno`. [`Outcome`] keeps that meaning instead of flattening it into
//! an `io::Error`:
//!
//! | kernel says | `Outcome` |
//! |---|---|
//! | 0, field = len | `Done(len)` |
//! | EAGAIN, field > 0 | `Partial { done, errno: EAGAIN }` |
//! | EEXIST | `Exists` (someone else resolved it: WAKE and move on) |
//! | EAGAIN, field = -EAGAIN | `Retry` (an event is pending: defer, retry) |
//! | ENOENT, ESRCH | `Gone(errno)` (range or process went away) |
//! | anything else | `Err(UffdError)` |

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::Errno;

/// `UFFD_API`.
pub const UFFD_API: u64 = 0xAA;
const UFFDIO: u64 = 0xAA;

const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const fn iowr<T>(nr: u64) -> u64 {
    ioc(IOC_READ | IOC_WRITE, nr, std::mem::size_of::<T>())
}
const fn ior<T>(nr: u64) -> u64 {
    ioc(IOC_READ, nr, std::mem::size_of::<T>())
}

/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`: `_IO(0xAA, 0x00)`.
pub const USERFAULTFD_IOC_NEW: u64 = UFFDIO << 8;
/// `UFFD_USER_MODE_ONLY` flag of `userfaultfd(2)`.
pub const UFFD_USER_MODE_ONLY: i32 = 1;

/// Feature bits of `uffdio_api.features`.
pub mod feature {
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const EVENT_FORK: u64 = 1 << 1;
    pub const EVENT_REMAP: u64 = 1 << 2;
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    pub const MISSING_SHMEM: u64 = 1 << 5;
    pub const EVENT_UNMAP: u64 = 1 << 6;
    pub const SIGBUS: u64 = 1 << 7;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    pub const MINOR_SHMEM: u64 = 1 << 10;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const POISON: u64 = 1 << 14;
    pub const WP_ASYNC: u64 = 1 << 15;
    pub const MOVE: u64 = 1 << 16;

    /// Every feature bit with its kernel name, in bit order.
    pub const ALL: &[(u64, &str)] = &[
        (PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"),
        (EVENT_FORK, "EVENT_FORK"),
        (EVENT_REMAP, "EVENT_REMAP"),
        (EVENT_REMOVE, "EVENT_REMOVE"),
        (MISSING_HUGETLBFS, "MISSING_HUGETLBFS"),
        (MISSING_SHMEM, "MISSING_SHMEM"),
        (EVENT_UNMAP, "EVENT_UNMAP"),
        (SIGBUS, "SIGBUS"),
        (THREAD_ID, "THREAD_ID"),
        (MINOR_HUGETLBFS, "MINOR_HUGETLBFS"),
        (MINOR_SHMEM, "MINOR_SHMEM"),
        (EXACT_ADDRESS, "EXACT_ADDRESS"),
        (WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM"),
        (WP_UNPOPULATED, "WP_UNPOPULATED"),
        (POISON, "POISON"),
        (WP_ASYNC, "WP_ASYNC"),
        (MOVE, "MOVE"),
    ];
}

/// Registration modes (`UFFDIO_REGISTER_MODE_*`).
pub mod register_mode {
    pub const MISSING: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
    pub const MINOR: u64 = 1 << 2;
}

/// Bit numbers of the ioctls in `uffdio_register.ioctls` / `uffdio_api.ioctls`.
pub mod ioctl_bit {
    pub const REGISTER: u32 = 0x00;
    pub const UNREGISTER: u32 = 0x01;
    pub const WAKE: u32 = 0x02;
    pub const COPY: u32 = 0x03;
    pub const ZEROPAGE: u32 = 0x04;
    pub const MOVE: u32 = 0x05;
    pub const WRITEPROTECT: u32 = 0x06;
    pub const CONTINUE: u32 = 0x07;
    pub const POISON: u32 = 0x08;
    pub const API: u32 = 0x3F;

    /// Resolve ioctls with their names, for reports.
    pub const RANGE: &[(u32, &str)] = &[
        (WAKE, "WAKE"),
        (COPY, "COPY"),
        (ZEROPAGE, "ZEROPAGE"),
        (MOVE, "MOVE"),
        (WRITEPROTECT, "WRITEPROTECT"),
        (CONTINUE, "CONTINUE"),
        (POISON, "POISON"),
    ];
}

/// Mode bits of the resolve ioctls.
pub mod mode {
    pub const COPY_DONTWAKE: u64 = 1 << 0;
    pub const COPY_WP: u64 = 1 << 1;
    pub const ZEROPAGE_DONTWAKE: u64 = 1 << 0;
    pub const WRITEPROTECT_WP: u64 = 1 << 0;
    pub const WRITEPROTECT_DONTWAKE: u64 = 1 << 1;
    pub const CONTINUE_DONTWAKE: u64 = 1 << 0;
    pub const CONTINUE_WP: u64 = 1 << 1;
    pub const MOVE_DONTWAKE: u64 = 1 << 0;
    pub const MOVE_ALLOW_SRC_HOLES: u64 = 1 << 1;
    pub const POISON_DONTWAKE: u64 = 1 << 0;
}

/// Event codes of `uffd_msg.event`.
pub mod event {
    pub const PAGEFAULT: u8 = 0x12;
    pub const FORK: u8 = 0x13;
    pub const REMAP: u8 = 0x14;
    pub const REMOVE: u8 = 0x15;
    pub const UNMAP: u8 = 0x16;
}

/// `uffd_msg.arg.pagefault.flags`.
pub mod pagefault_flag {
    pub const WRITE: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
    pub const MINOR: u64 = 1 << 2;
}

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioCopy {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub mode: u64,
    pub copy: i64,
}

/// `struct uffdio_zeropage`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioZeropage {
    pub range: UffdioRange,
    pub mode: u64,
    pub zeropage: i64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioWriteprotect {
    pub range: UffdioRange,
    pub mode: u64,
}

/// `struct uffdio_continue`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioContinue {
    pub range: UffdioRange,
    pub mode: u64,
    pub mapped: i64,
}

/// `struct uffdio_poison`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioPoison {
    pub range: UffdioRange,
    pub mode: u64,
    pub updated: i64,
}

/// `struct uffdio_move`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioMove {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub mode: u64,
    pub moved: i64,
}

/// `struct uffd_msg`: 32 bytes, a tag and a 24-byte union. Only the
/// fields we use are decoded, through [`UffdMsg::decode`].
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct UffdMsg {
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    arg: [u64; 3],
}

const _: () = {
    assert!(std::mem::size_of::<UffdMsg>() == 32);
    assert!(std::mem::size_of::<UffdioApi>() == 24);
    assert!(std::mem::size_of::<UffdioRange>() == 16);
    assert!(std::mem::size_of::<UffdioRegister>() == 32);
    assert!(std::mem::size_of::<UffdioCopy>() == 40);
    assert!(std::mem::size_of::<UffdioZeropage>() == 32);
    assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);
    assert!(std::mem::size_of::<UffdioContinue>() == 32);
    assert!(std::mem::size_of::<UffdioPoison>() == 32);
    assert!(std::mem::size_of::<UffdioMove>() == 40);
    // Spot-check the encoding against the values the C headers produce.
    assert!(iowr::<UffdioApi>(0x3F) == 0xc018_aa3f);
    assert!(iowr::<UffdioRegister>(0x00) == 0xc020_aa00);
    assert!(iowr::<UffdioCopy>(0x03) == 0xc028_aa03);
};

/// `UFFDIO_API`.
pub const UFFDIO_API: u64 = iowr::<UffdioApi>(ioctl_bit::API as u64);
/// `UFFDIO_REGISTER`.
pub const UFFDIO_REGISTER: u64 = iowr::<UffdioRegister>(ioctl_bit::REGISTER as u64);
/// `UFFDIO_UNREGISTER`.
pub const UFFDIO_UNREGISTER: u64 = ior::<UffdioRange>(ioctl_bit::UNREGISTER as u64);
/// `UFFDIO_WAKE`.
pub const UFFDIO_WAKE: u64 = ior::<UffdioRange>(ioctl_bit::WAKE as u64);
/// `UFFDIO_COPY`.
pub const UFFDIO_COPY: u64 = iowr::<UffdioCopy>(ioctl_bit::COPY as u64);
/// `UFFDIO_ZEROPAGE`.
pub const UFFDIO_ZEROPAGE: u64 = iowr::<UffdioZeropage>(ioctl_bit::ZEROPAGE as u64);
/// `UFFDIO_MOVE`.
pub const UFFDIO_MOVE: u64 = iowr::<UffdioMove>(ioctl_bit::MOVE as u64);
/// `UFFDIO_WRITEPROTECT`.
pub const UFFDIO_WRITEPROTECT: u64 = iowr::<UffdioWriteprotect>(ioctl_bit::WRITEPROTECT as u64);
/// `UFFDIO_CONTINUE`.
pub const UFFDIO_CONTINUE: u64 = iowr::<UffdioContinue>(ioctl_bit::CONTINUE as u64);
/// `UFFDIO_POISON`.
pub const UFFDIO_POISON: u64 = iowr::<UffdioPoison>(ioctl_bit::POISON as u64);

/// A decoded `uffd_msg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// A page fault: address (page-aligned unless `EXACT_ADDRESS`), flags
    /// (`pagefault_flag::*`), faulting thread id (0 without `THREAD_ID`).
    PageFault { addr: u64, flags: u64, tid: u32 },
    /// `MADV_DONTNEED`/`MADV_REMOVE` dropped `[start, end)`.
    Remove { start: u64, end: u64 },
    /// `munmap` of `[start, end)`.
    Unmap { start: u64, end: u64 },
    /// `mremap` moved `from` to `to`, `len` bytes.
    Remap { from: u64, to: u64, len: u64 },
    /// `fork`: the child's new uffd.
    Fork { ufd: u32 },
    /// An event code this layer does not know.
    Unknown(u8),
}

impl UffdMsg {
    /// An all-zero message, to initialise read buffers.
    pub const ZERO: UffdMsg = UffdMsg {
        event: 0,
        reserved1: 0,
        reserved2: 0,
        reserved3: 0,
        arg: [0; 3],
    };

    /// Decodes the union according to the event tag.
    pub fn decode(&self) -> Msg {
        let arg = self.arg;
        match self.event {
            event::PAGEFAULT => Msg::PageFault {
                flags: arg[0],
                addr: arg[1],
                tid: arg[2] as u32,
            },
            event::REMOVE => Msg::Remove {
                start: arg[0],
                end: arg[1],
            },
            event::UNMAP => Msg::Unmap {
                start: arg[0],
                end: arg[1],
            },
            event::REMAP => Msg::Remap {
                from: arg[0],
                to: arg[1],
                len: arg[2],
            },
            event::FORK => Msg::Fork { ufd: arg[0] as u32 },
            other => Msg::Unknown(other),
        }
    }
}

/// What a resolve ioctl did, in the kernel's own terms. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// All `len` bytes were resolved.
    Done(usize),
    /// `done` bytes (> 0) were resolved before the kernel stopped with `errno`.
    Partial { done: usize, errno: Errno },
    /// The page was already there (EEXIST): another resolver won.
    Exists,
    /// An event is pending (EAGAIN with nothing done): defer and retry.
    Retry,
    /// The range or the process is gone (ENOENT, ESRCH).
    Gone(Errno),
}

/// A failed userfaultfd operation, keeping the errno.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct UffdError {
    /// Which ioctl or call failed.
    pub op: &'static str,
    /// The errno, as an `io::Error`.
    #[source]
    pub source: io::Error,
}

impl UffdError {
    pub(crate) fn new(op: &'static str, errno: i32) -> Self {
        UffdError {
            op,
            source: io::Error::from_raw_os_error(errno),
        }
    }
    /// The raw errno.
    pub fn errno(&self) -> i32 {
        self.source.raw_os_error().unwrap_or(0)
    }
    /// Whether the call failed with `e`.
    pub fn is(&self, e: Errno) -> bool {
        self.errno() == e.0
    }
    /// A range that is gone (ENOENT), reported by `op`.
    pub fn gone(op: &'static str) -> Self {
        Self::new(op, libc::ENOENT)
    }
}

fn classify(op: &'static str, ret: i32, field: i64, len: u64) -> Result<Outcome, UffdError> {
    if ret == 0 {
        // A kernel that reports success reports `len` in the field; be
        // defensive anyway and trust the field when it is positive.
        let done = if field > 0 {
            field as usize
        } else {
            len as usize
        };
        return Ok(Outcome::Done(done));
    }
    let errno = crate::errno();
    if field > 0 {
        return Ok(Outcome::Partial {
            done: field as usize,
            errno: Errno(errno),
        });
    }
    match errno {
        libc::EEXIST => Ok(Outcome::Exists),
        libc::EAGAIN => Ok(Outcome::Retry),
        libc::ENOENT | libc::ESRCH => Ok(Outcome::Gone(Errno(errno))),
        e => Err(UffdError::new(op, e)),
    }
}

/// An open userfaultfd. All methods take `&self`: the kernel serialises
/// what needs serialising, and resolve ioctls may run from many threads and
/// from signal handlers (they are plain syscalls, async-signal-safe).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    /// The process this wrapper was made in (see [`Uffd::inherited`]).
    pid: u32,
}

impl std::os::fd::AsFd for Uffd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Uffd {
    /// Wraps an fd created by one of [`crate::caps`]'s creation paths.
    pub(crate) fn from_owned(fd: OwnedFd) -> Self {
        Uffd {
            fd,
            pid: std::process::id(),
        }
    }

    /// Adopts a userfaultfd created elsewhere (received from another
    /// process): its handshake (`UFFDIO_API`) was done by its creator and
    /// cannot be repeated; [`fdinfo_features`](Self::fdinfo_features)
    /// tells what it chose.
    pub fn adopt(fd: OwnedFd) -> Self {
        Uffd {
            fd,
            pid: std::process::id(),
        }
    }

    /// Whether this process got the userfaultfd by `fork` from the one
    /// that opened it (the wrapper is a copy of the parent's). A
    /// userfaultfd serves the memory of the process that opened it: a
    /// region of this process cannot be registered with it (`EINVAL`).
    pub fn inherited(&self) -> bool {
        self.pid != std::process::id()
    }

    /// The features the fd's creator enabled with `UFFDIO_API`, read from
    /// `/proc/self/fdinfo` (the kernel prints `API:\t<api>:<features>:<ioctls>`
    /// for every userfaultfd). `Ok(None)`: the fd is not a userfaultfd, or
    /// its handshake was never done.
    pub fn fdinfo_features(&self) -> io::Result<Option<u64>> {
        let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.as_raw_fd()))?;
        Ok(parse_fdinfo_features(&text))
    }

    /// `UFFDIO_API`: the handshake, once per fd. Returns the features and
    /// ioctls the kernel granted.
    pub fn api(&self, features: u64) -> Result<UffdioApi, UffdError> {
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        self.raw_ioctl("UFFDIO_API", UFFDIO_API, &mut api)?;
        Ok(api)
    }

    /// `UFFDIO_REGISTER`: returns the bit set of ioctls allowed on the range
    /// (see [`ioctl_bit`]).
    pub fn register(&self, start: u64, len: u64, mode: u64) -> Result<u64, UffdError> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode,
            ioctls: 0,
        };
        self.raw_ioctl("UFFDIO_REGISTER", UFFDIO_REGISTER, &mut reg)?;
        Ok(reg.ioctls)
    }

    /// `UFFDIO_UNREGISTER`. Wakes every thread blocked on the range: they
    /// retry without userfaultfd and would get zero pages, so callers make
    /// the range inaccessible first (see `Region`'s drop).
    pub fn unregister(&self, start: u64, len: u64) -> Result<(), UffdError> {
        let mut range = UffdioRange { start, len };
        self.raw_ioctl("UFFDIO_UNREGISTER", UFFDIO_UNREGISTER, &mut range)
    }

    /// `UFFDIO_WAKE`: wake threads blocked on faults in the range.
    pub fn wake(&self, start: u64, len: u64) -> Result<(), UffdError> {
        let mut range = UffdioRange { start, len };
        self.raw_ioctl("UFFDIO_WAKE", UFFDIO_WAKE, &mut range)
    }

    /// `UFFDIO_COPY` `len` bytes from `src` to the registered `dst`.
    ///
    /// # Safety
    /// `src..src+len` must be readable memory of this process.
    pub unsafe fn copy(
        &self,
        dst: u64,
        src: *const u8,
        len: u64,
        mode: u64,
    ) -> Result<Outcome, UffdError> {
        let mut c = UffdioCopy {
            dst,
            src: src as u64,
            len,
            mode,
            copy: 0,
        };
        let ret = self.ioctl_ret(UFFDIO_COPY, &mut c);
        classify("UFFDIO_COPY", ret, c.copy, len)
    }

    /// `UFFDIO_ZEROPAGE`.
    pub fn zeropage(&self, start: u64, len: u64, mode: u64) -> Result<Outcome, UffdError> {
        let mut z = UffdioZeropage {
            range: UffdioRange { start, len },
            mode,
            zeropage: 0,
        };
        let ret = self.ioctl_ret(UFFDIO_ZEROPAGE, &mut z);
        classify("UFFDIO_ZEROPAGE", ret, z.zeropage, len)
    }

    /// `UFFDIO_CONTINUE`: map the page-cache pages already present behind a
    /// minor fault.
    pub fn continue_(&self, start: u64, len: u64, mode: u64) -> Result<Outcome, UffdError> {
        let mut c = UffdioContinue {
            range: UffdioRange { start, len },
            mode,
            mapped: 0,
        };
        let ret = self.ioctl_ret(UFFDIO_CONTINUE, &mut c);
        classify("UFFDIO_CONTINUE", ret, c.mapped, len)
    }

    /// `UFFDIO_POISON`: later accesses to the range get SIGBUS.
    pub fn poison(&self, start: u64, len: u64, mode: u64) -> Result<Outcome, UffdError> {
        let mut p = UffdioPoison {
            range: UffdioRange { start, len },
            mode,
            updated: 0,
        };
        let ret = self.ioctl_ret(UFFDIO_POISON, &mut p);
        classify("UFFDIO_POISON", ret, p.updated, len)
    }

    /// `UFFDIO_MOVE`: zero-copy move of private anonymous pages from `src`
    /// (same process) to the registered `dst`.
    ///
    /// # Safety
    /// The pages at `src..src+len` are removed from the caller's address
    /// space: nothing may hold references into them.
    pub unsafe fn move_pages(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        mode: u64,
    ) -> Result<Outcome, UffdError> {
        let mut m = UffdioMove {
            dst,
            src,
            len,
            mode,
            moved: 0,
        };
        let ret = self.ioctl_ret(UFFDIO_MOVE, &mut m);
        classify("UFFDIO_MOVE", ret, m.moved, len)
    }

    /// `UFFDIO_WRITEPROTECT`: set (`protect = true`) or clear write
    /// protection on a range. Clearing wakes blocked writers unless
    /// `dontwake`.
    pub fn writeprotect(
        &self,
        start: u64,
        len: u64,
        protect: bool,
        dontwake: bool,
    ) -> Result<(), UffdError> {
        let mut mode = 0;
        if protect {
            mode |= mode::WRITEPROTECT_WP;
        }
        if dontwake {
            mode |= mode::WRITEPROTECT_DONTWAKE;
        }
        let mut w = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode,
        };
        self.raw_ioctl("UFFDIO_WRITEPROTECT", UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Reads up to `buf.len()` messages with one `read(2)`. Returns the
    /// number read; `Ok(0)` when the fd is non-blocking and empty (EAGAIN).
    /// EINTR is reported as `Ok(0)` too: callers loop anyway.
    pub fn read_msgs(&self, buf: &mut [UffdMsg]) -> Result<usize, UffdError> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is a valid, writable slice of `bytes` bytes and
        // `UffdMsg` is plain old data (any bit pattern is valid).
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), bytes) };
        if n < 0 {
            return match crate::errno() {
                libc::EAGAIN | libc::EINTR => Ok(0),
                e => Err(UffdError::new("read(uffd)", e)),
            };
        }
        Ok(n as usize / std::mem::size_of::<UffdMsg>())
    }

    fn ioctl_ret<T>(&self, req: u64, arg: &mut T) -> i32 {
        // SAFETY: `arg` is the exact struct the request encodes (size is in
        // the request number and asserted above); the kernel reads and writes
        // only within it.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) }
    }

    fn raw_ioctl<T>(&self, op: &'static str, req: u64, arg: &mut T) -> Result<(), UffdError> {
        if self.ioctl_ret(req, arg) == 0 {
            Ok(())
        } else {
            Err(UffdError::new(op, crate::errno()))
        }
    }
}

/// The features of a userfaultfd's `/proc/<pid>/fdinfo` text (see
/// [`Uffd::fdinfo_features`]). A userfaultfd whose handshake is not done
/// reports `None` on recent
/// kernels (it lacks the kernel's internal `UFFD_FEATURE_INITIALIZED`,
/// bit 31, which is masked off otherwise).
pub fn parse_fdinfo_features(text: &str) -> Option<u64> {
    const INITIALIZED: u64 = 1 << 31;
    let line = text.lines().find_map(|l| l.strip_prefix("API:"))?;
    let mut it = line.trim().split(':');
    let api = u64::from_str_radix(it.next()?, 16).ok()?;
    let features = u64::from_str_radix(it.next()?, 16).ok()?;
    (api == UFFD_API && features & INITIALIZED != 0).then_some(features & !INITIALIZED)
}

/// Creates a userfaultfd through the `userfaultfd(2)` syscall.
pub fn syscall_userfaultfd(flags: i32) -> Result<Uffd, UffdError> {
    // SAFETY: plain syscall with integer flags; returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(UffdError::new("userfaultfd(2)", crate::errno()));
    }
    // SAFETY: the kernel just returned this fd to us; nobody else owns it.
    Ok(Uffd::from_owned(unsafe {
        OwnedFd::from_raw_fd(fd as RawFd)
    }))
}

/// The creation flags of a userfaultfd: close-on-exec, and non-blocking
/// when asked (what `poll()`-based handlers need).
pub fn open_flags(nonblocking: bool) -> i32 {
    if nonblocking {
        libc::O_CLOEXEC | libc::O_NONBLOCK
    } else {
        libc::O_CLOEXEC
    }
}

/// Creates a userfaultfd through `/dev/userfaultfd` and `USERFAULTFD_IOC_NEW`.
pub fn dev_userfaultfd(flags: i32) -> Result<Uffd, UffdError> {
    let path = c"/dev/userfaultfd";
    // SAFETY: valid NUL-terminated path; returns a new fd or -1.
    let dev = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(UffdError::new("open(/dev/userfaultfd)", crate::errno()));
    }
    // SAFETY: `dev` was just opened and is owned here.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its integer argument.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if fd < 0 {
        return Err(UffdError::new("USERFAULTFD_IOC_NEW", crate::errno()));
    }
    // SAFETY: the ioctl returned a fresh fd that we now own.
    Ok(Uffd::from_owned(unsafe { OwnedFd::from_raw_fd(fd) }))
}
