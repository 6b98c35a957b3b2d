//! Memory mappings: anonymous, memfd-backed (shmem, hugetlb), file-backed;
//! their protection ([`Prot`]), paging advice, and reads of our own memory
//! that fail instead of faulting.

use std::io;
use std::ops::BitOr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::Errno;

/// Page protection: a set of `PROT_*` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Prot(i32);

impl Prot {
    /// `PROT_NONE`: no access.
    pub const NONE: Prot = Prot(libc::PROT_NONE);
    /// `PROT_READ`.
    pub const READ: Prot = Prot(libc::PROT_READ);
    /// `PROT_WRITE`.
    pub const WRITE: Prot = Prot(libc::PROT_WRITE);
    /// `PROT_EXEC`.
    pub const EXEC: Prot = Prot(libc::PROT_EXEC);
    /// `PROT_READ | PROT_WRITE`.
    pub const READ_WRITE: Prot = Prot(libc::PROT_READ | libc::PROT_WRITE);

    /// The `PROT_*` bits.
    pub const fn bits(self) -> i32 {
        self.0
    }
    /// From `PROT_*` bits (as [`Prot::bits`] gave them).
    pub const fn from_bits(bits: i32) -> Prot {
        Prot(bits)
    }
    /// `self` without the bits of `other`.
    pub const fn without(self, other: Prot) -> Prot {
        Prot(self.0 & !other.0)
    }
    /// Whether every bit of `other` is in `self`.
    pub const fn contains(self, other: Prot) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Prot {
    type Output = Prot;
    fn bitor(self, other: Prot) -> Prot {
        Prot(self.0 | other.0)
    }
}

impl From<i32> for Prot {
    /// Raw `PROT_*` bits (`libc::PROT_READ | ...`).
    fn from(bits: i32) -> Prot {
        Prot(bits)
    }
}

/// A failed memory-management call, keeping the errno.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct MemError {
    /// The call that failed.
    pub op: &'static str,
    /// The errno.
    #[source]
    pub source: io::Error,
}

fn last(op: &'static str) -> MemError {
    MemError {
        op,
        source: io::Error::last_os_error(),
    }
}

/// An owned mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is a plain address range; all access goes through raw
// pointers whose synchronisation is the user's (or the runtime's) business.
unsafe impl Send for Mapping {}
// SAFETY: as above: &Mapping only exposes the address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Private anonymous mapping, read-write.
    pub fn anon(len: usize) -> Result<Mapping, MemError> {
        Self::map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    }

    /// Shared read-write mapping of `fd` at `offset`.
    pub fn shared(fd: &impl AsRawFd, len: usize, offset: u64) -> Result<Mapping, MemError> {
        Self::map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    }

    /// Read-only shared mapping of a file (for zero-copy COPY sources).
    pub fn file_readonly(fd: &impl AsRawFd, len: usize, offset: u64) -> Result<Mapping, MemError> {
        Self::map(
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    }

    /// Read-only private mapping of a file from its start (what an
    /// application's `mmap` of a data file does: the kernel baseline).
    pub fn file_private_readonly(fd: &impl AsRawFd, len: usize) -> Result<Mapping, MemError> {
        Self::map(len, libc::PROT_READ, libc::MAP_PRIVATE, fd.as_raw_fd(), 0)
    }

    /// Pages of the mapping that are resident (`mincore`; for file
    /// mappings: in the page cache).
    pub fn resident_pages(&self) -> Result<usize, MemError> {
        let mut vec = vec![0u8; self.len.div_ceil(crate::BASE_PAGE)];
        // SAFETY: the range is exactly our mapping; `vec` has one byte per
        // base page.
        if unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.len, vec.as_mut_ptr()) } != 0 {
            return Err(last("mincore"));
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count())
    }

    /// Per base page of the mapping, whether it is resident (`mincore`;
    /// for file mappings: in the page cache).
    pub fn resident_map(&self) -> Result<Vec<bool>, MemError> {
        let mut vec = vec![0u8; self.len.div_ceil(crate::BASE_PAGE)];
        // SAFETY: as in `resident_pages`.
        if unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.len, vec.as_mut_ptr()) } != 0 {
            return Err(last("mincore"));
        }
        Ok(vec.iter().map(|&b| b & 1 != 0).collect())
    }

    fn map(
        len: usize,
        prot: i32,
        flags: i32,
        fd: i32,
        off: libc::off_t,
    ) -> Result<Mapping, MemError> {
        // SAFETY: asking the kernel for a fresh mapping at an address of its
        // choice cannot alias existing Rust objects.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(last("mmap"));
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned NULL"),
            len,
        })
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Start address as an integer.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the mapping is empty (never, for a successful map).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `madvise` over a sub-range.
    pub fn advise(&self, offset: usize, len: usize, advice: Advice) -> Result<(), MemError> {
        madvise(self.addr() + offset as u64, len, advice)
    }

    /// `mprotect` the whole mapping (a [`Prot`], or raw `PROT_*` bits).
    pub fn protect(&self, prot: impl Into<Prot>) -> Result<(), MemError> {
        let prot = prot.into().bits();
        // SAFETY: the range is exactly our own mapping; changing its
        // protection cannot invalidate a Rust reference (none points into
        // it: all access is through raw pointers).
        if unsafe { libc::mprotect(self.ptr.as_ptr().cast(), self.len, prot) } != 0 {
            return Err(last("mprotect"));
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping; nothing refers to it past drop.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// `madvise(addr, len, advice)`. Async-signal-safe.
pub fn madvise(addr: u64, len: usize, advice: Advice) -> Result<(), MemError> {
    // SAFETY: madvise only changes paging state of the given range; callers
    // pass ranges they own (and the advice values used here never free
    // memory that Rust objects live in: DONTNEED/REMOVE are only applied to
    // region pages and pool frames, which are raw memory).
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, advice.raw()) } != 0 {
        return Err(last(advice.name()));
    }
    Ok(())
}

/// `mprotect(addr, len, prot)`. Async-signal-safe; returns the errno.
pub fn mprotect(addr: u64, len: usize, prot: Prot) -> Result<(), Errno> {
    // SAFETY: mprotect changes only the protection of the range; callers
    // pass page-aligned ranges of mappings they manage.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot.bits()) } != 0 {
        return Err(Errno(crate::errno()));
    }
    Ok(())
}

/// Reads `out.len()` bytes at `addr` of process `pid` (our own pid, to
/// read our own memory) with `process_vm_readv`: an unmapped or
/// unreadable address makes it fail (EFAULT) or stop short where a load
/// would raise a signal. Returns the bytes read. Async-signal-safe.
pub fn process_vm_read(pid: i32, addr: u64, out: &mut [u8]) -> Result<usize, Errno> {
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: out.len(),
    };
    // SAFETY: the kernel writes at most `out.len()` bytes into `out` and
    // validates the remote range itself.
    let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if got < 0 {
        return Err(Errno(crate::errno()));
    }
    Ok(got as usize)
}

/// Whether `fd` is a file on tmpfs/shmem (`fstatfs` magic `TMPFS_MAGIC`).
pub fn is_tmpfs(fd: &impl AsRawFd) -> Result<bool, MemError> {
    Ok(fs_magic(fd)? == 0x0102_1994)
}

/// Whether `fd` is a file on hugetlbfs (`fstatfs` magic `HUGETLBFS_MAGIC`).
pub fn is_hugetlbfs(fd: &impl AsRawFd) -> Result<bool, MemError> {
    Ok(fs_magic(fd)? == 0x9584_58f6)
}

fn fs_magic(fd: &impl AsRawFd) -> Result<i64, MemError> {
    // SAFETY: statfs is plain data filled by the kernel.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; the fd is open.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(last("fstatfs"));
    }
    Ok(st.f_type as i64)
}

/// `memfd_create`, optionally hugetlb-backed (2 MiB pages).
pub fn memfd(name: &str, hugetlb: bool) -> Result<OwnedFd, MemError> {
    let cname = std::ffi::CString::new(name).unwrap_or_else(|_| c"faultline".into());
    let mut flags = libc::MFD_CLOEXEC;
    if hugetlb {
        flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
    }
    // SAFETY: valid C string; returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(last("memfd_create"));
    }
    // SAFETY: fresh fd owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ftruncate`.
pub fn ftruncate(fd: &OwnedFd, len: u64) -> Result<(), MemError> {
    // SAFETY: plain syscall on an fd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(last("ftruncate"));
    }
    Ok(())
}

/// The length of the file open at `fd` now (`fstat`). Async-signal-safe.
pub fn file_len(fd: i32) -> Result<u64, i32> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is valid for writes of one `stat`; fstat touches nothing
    // else of ours.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() }.st_size as u64)
}

/// `pread` until `buf` is full or EOF; returns the bytes read. Async-signal-safe.
pub fn pread_full(fd: i32, buf: &mut [u8], mut offset: u64) -> Result<usize, i32> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writing into the unfilled tail of `buf`.
        let n = unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = crate::errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
        offset += n as u64;
    }
    Ok(done)
}

/// `pwrite` all of `buf`.
pub fn pwrite_all(fd: i32, buf: &[u8], mut offset: u64) -> Result<(), i32> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: reading from the unwritten tail of `buf`.
        let n = unsafe {
            libc::pwrite(
                fd,
                buf[done..].as_ptr().cast(),
                buf.len() - done,
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = crate::errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(libc::EIO);
        }
        done += n as usize;
        offset += n as u64;
    }
    Ok(())
}

/// Most buffers one [`pwritev_all`] call takes.
pub const PWRITEV_MAX: usize = 64;

/// `pwritev(2)` of `bufs` (at most [`PWRITEV_MAX`]), one after the other
/// from `offset`, until every byte is written: one system call for a run
/// of pages that are contiguous in the file but not known to be in memory.
/// EINTR is retried. Returns the errno. Async-signal-safe (an iovec array
/// on the stack).
pub fn pwritev_all(fd: i32, bufs: &[&[u8]], mut offset: u64) -> Result<(), i32> {
    assert!(bufs.len() <= PWRITEV_MAX, "at most PWRITEV_MAX buffers");
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; PWRITEV_MAX];
    for (v, b) in iov.iter_mut().zip(bufs) {
        v.iov_base = b.as_ptr() as *mut libc::c_void;
        v.iov_len = b.len();
    }
    let (mut first, mut n) = (0, bufs.len());
    while n > 0 {
        // SAFETY: `iov[first..first + n]` describe readable buffers (the
        // slices of `bufs`, the first one advanced past what was written).
        let w = unsafe {
            libc::pwritev(
                fd,
                iov[first..].as_ptr(),
                n as libc::c_int,
                offset as libc::off_t,
            )
        };
        if w < 0 {
            let e = crate::errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if w == 0 {
            return Err(libc::EIO);
        }
        let mut w = w as usize;
        offset += w as u64;
        while n > 0 && w >= iov[first].iov_len {
            w -= iov[first].iov_len;
            first += 1;
            n -= 1;
        }
        if n > 0 {
            // SAFETY: still inside the same buffer (w < its length).
            iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(w) }.cast();
            iov[first].iov_len -= w;
        }
    }
    Ok(())
}

/// Free 2 MiB pages in the hugetlb pool (`/proc/meminfo` HugePages_Free).
pub fn hugetlb_free_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("HugePages_Free:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Whether every base page of `[addr, addr+len)` is mapped (`mincore`).
/// Async-signal-safe: the result vector lives on the stack (up to 2 MiB).
pub fn is_mapped(addr: u64, len: usize) -> bool {
    let pages = len.div_ceil(4096).min(512);
    let mut vec = [0u8; 512];
    // SAFETY: `vec` has room for `pages` entries; mincore only reads the
    // page tables of the range.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, pages * 4096, vec.as_mut_ptr()) };
    r == 0 && vec[..pages].iter().all(|v| v & 1 == 1)
}

/// How many base pages of `[addr, addr+len)` are resident (`mincore`;
/// for anonymous memory: mapped in this process).
pub fn resident_pages_at(addr: u64, len: usize) -> Result<usize, MemError> {
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `vec` has one entry per base page of the range; mincore only
    // reads the page tables of the range and writes `vec`.
    if unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) } != 0 {
        return Err(last("mincore"));
    }
    Ok(vec.iter().filter(|v| *v & 1 == 1).count())
}

/// Anonymous mapping at a fixed address that must be free
/// (`MAP_FIXED_NOREPLACE`).
pub fn anon_at(addr: u64, len: usize) -> Result<Mapping, MemError> {
    Mapping::map_at(
        addr,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
        -1,
        0,
    )
}

/// Shared mapping of `fd` at a fixed address that must be free.
pub fn shared_at(addr: u64, fd: &OwnedFd, len: usize) -> Result<Mapping, MemError> {
    Mapping::map_at(
        addr,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
        fd.as_raw_fd(),
        0,
    )
}

impl Mapping {
    fn map_at(
        addr: u64,
        len: usize,
        prot: i32,
        flags: i32,
        fd: i32,
        off: libc::off_t,
    ) -> Result<Mapping, MemError> {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so
        // no live Rust object can be clobbered.
        let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(last("mmap(MAP_FIXED_NOREPLACE)"));
        }
        if p as u64 != addr {
            // Old kernels ignore the flag and treat the address as a hint.
            // SAFETY: unmapping what we just mapped.
            unsafe { libc::munmap(p, len) };
            return Err(MemError {
                op: "mmap(MAP_FIXED_NOREPLACE)",
                source: io::Error::from_raw_os_error(libc::EEXIST),
            });
        }
        let Some(ptr) = NonNull::new(p.cast()) else {
            // Address 0 (root may map it): not a mapping a pointer can hold.
            // SAFETY: unmapping what we just mapped.
            unsafe { libc::munmap(p, len) };
            return Err(MemError {
                op: "mmap(MAP_FIXED_NOREPLACE)",
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        };
        Ok(Mapping { ptr, len })
    }
}

impl Mapping {
    /// Private anonymous read-write mapping whose start is a multiple of
    /// `align` (a power of two): map `len + align`, trim both ends.
    pub fn anon_aligned(len: usize, align: usize) -> Result<Mapping, MemError> {
        assert!(align.is_power_of_two());
        let big = Mapping::anon(len + align)?;
        let start = (big.addr() as usize).next_multiple_of(align);
        let head = start - big.addr() as usize;
        let tail = big.len() - head - len;
        let whole = std::mem::ManuallyDrop::new(big);
        // SAFETY: the head and tail lie inside the mapping we just made and
        // own; after trimming, `[start, start+len)` is all that is left, and
        // it becomes the new Mapping (the old one is never dropped).
        unsafe {
            if head > 0 {
                libc::munmap(whole.as_ptr().cast(), head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
        }
        Ok(Mapping {
            ptr: NonNull::new(start as *mut u8).expect("non-null"),
            len,
        })
    }
}

/// `madvise` advice values the runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `MADV_DONTNEED`: drop the pages (private anonymous memory reads as
    /// missing again; userfaultfd sees the next access).
    DontNeed,
    /// `MADV_REMOVE`: free the backing store of a shared range.
    Remove,
    /// `MADV_HUGEPAGE`: back the range with transparent huge pages.
    HugePage,
    /// `MADV_NOHUGEPAGE`: never back the range with transparent huge
    /// pages (a huge folio would hide the faults of its other subpages).
    NoHugePage,
    /// `MADV_DONTFORK`: a forked child does not inherit the range.
    DontFork,
    /// `MADV_POPULATE_READ` (5.14+): fault the range in for reading.
    PopulateRead,
    /// `MADV_POPULATE_WRITE` (5.14+): fault the range in for writing
    /// (allocates and zeroes the pages).
    PopulateWrite,
}

impl Advice {
    fn raw(self) -> i32 {
        match self {
            Advice::DontNeed => libc::MADV_DONTNEED,
            Advice::Remove => libc::MADV_REMOVE,
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::DontFork => libc::MADV_DONTFORK,
            Advice::PopulateRead => 22,
            Advice::PopulateWrite => 23,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Advice::DontNeed => "madvise(MADV_DONTNEED)",
            Advice::Remove => "madvise(MADV_REMOVE)",
            Advice::HugePage => "madvise(MADV_HUGEPAGE)",
            Advice::NoHugePage => "madvise(MADV_NOHUGEPAGE)",
            Advice::DontFork => "madvise(MADV_DONTFORK)",
            Advice::PopulateRead => "madvise(MADV_POPULATE_READ)",
            Advice::PopulateWrite => "madvise(MADV_POPULATE_WRITE)",
        }
    }
}

impl Mapping {
    /// Private read-write mapping of `len` bytes of `fd` from `offset`, at
    /// `addr` (which must be free) or where the kernel chooses: the
    /// application's view of a file whose writes stay private (copy on
    /// write), as `mmap(MAP_PRIVATE)` gives it.
    pub fn file_private(
        addr: Option<u64>,
        fd: &impl AsRawFd,
        len: usize,
        offset: u64,
    ) -> Result<Mapping, MemError> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        match addr {
            Some(a) => Self::map_at(
                a,
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_FIXED_NOREPLACE,
                fd.as_raw_fd(),
                offset as libc::off_t,
            ),
            None => Self::map(
                len,
                prot,
                libc::MAP_PRIVATE,
                fd.as_raw_fd(),
                offset as libc::off_t,
            ),
        }
    }

    /// A read-only private anonymous mapping that is never written: every
    /// page reads as the shared zero page, and no memory is allocated.
    pub fn zeros(len: usize) -> Result<Mapping, MemError> {
        Self::map(
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    }
}

/// How a descriptor was opened: its access mode and `O_DIRECT`
/// ([`open_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenMode {
    /// Opened for reading (`O_RDONLY` or `O_RDWR`).
    pub read: bool,
    /// Opened for writing (`O_WRONLY` or `O_RDWR`).
    pub write: bool,
    /// Opened with `O_DIRECT`: reads and writes must be aligned (offset,
    /// length and buffer address to the device's logical block size).
    pub direct: bool,
}

/// How `fd` was opened (`fcntl(F_GETFL)`).
pub fn open_mode(fd: &impl AsRawFd) -> Result<OpenMode, MemError> {
    // SAFETY: F_GETFL only reads the descriptor's status flags.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if fl < 0 {
        return Err(last("fcntl(F_GETFL)"));
    }
    let acc = fl & libc::O_ACCMODE;
    Ok(OpenMode {
        read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
        write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
        direct: fl & libc::O_DIRECT != 0,
    })
}

/// Whether `fd` was opened for reading and writing (`fcntl(F_GETFL)`).
pub fn is_read_write(fd: &impl AsRawFd) -> Result<bool, MemError> {
    open_mode(fd).map(|m| m.read && m.write)
}

/// `posix_fallocate(fd, 0, len)`: allocates the file's blocks (unwritten,
/// reading as zeros) up to `len` bytes, as UMap's test programs prepare
/// their files. Returns the error it reports.
pub fn fallocate(fd: &impl AsRawFd, len: u64) -> std::io::Result<()> {
    // SAFETY: the descriptor is valid for the call; posix_fallocate only
    // reserves blocks of the file.
    let r = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t) };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Bytes an unprivileged writer may still allocate on the file system
/// holding `path` (`statvfs`: `f_bavail * f_frsize`).
pub fn free_disk_bytes(path: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: all-zero is a valid `statvfs` (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable
    // `statvfs` that outlives the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Private anonymous read-write mapping backed by 2 MiB hugetlb pages
/// (`MAP_HUGETLB | MAP_HUGE_2MB`, what a VMM maps guest memory with when
/// its snapshot uses huge pages), at `addr` (which must be free) or where
/// the kernel chooses.
pub fn anon_huge_2m(addr: Option<u64>, len: usize) -> Result<Mapping, MemError> {
    const MAP_HUGE_2MB: i32 = 21 << libc::MAP_HUGE_SHIFT;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | MAP_HUGE_2MB;
    match addr {
        Some(a) => Mapping::map_at(a, len, prot, flags | libc::MAP_FIXED_NOREPLACE, -1, 0),
        None => Mapping::map(len, prot, flags, -1, 0),
    }
}

/// `posix_fadvise(POSIX_FADV_DONTNEED)` over a whole file: drops its clean
/// pages from the page cache (a cold cache for one file, without root).
pub fn fadvise_dontneed(fd: &impl AsRawFd) -> Result<(), MemError> {
    // SAFETY: plain syscall on a descriptor we borrow; no memory is passed.
    let r = unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(MemError {
            op: "posix_fadvise(DONTNEED)",
            source: io::Error::from_raw_os_error(r),
        });
    }
    Ok(())
}

/// `MADV_WILLNEED` on `[addr, addr + len)` of a file mapping: the kernel
/// starts reading the range into the page cache (large, asynchronous,
/// sequential reads) and returns.
pub fn willneed(addr: u64, len: usize) -> Result<(), MemError> {
    // SAFETY: advice only; the kernel validates the range.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_WILLNEED) };
    if r != 0 {
        return Err(last("madvise(MADV_WILLNEED)"));
    }
    Ok(())
}

/// One vma of a process, as `PROCMAP_QUERY` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmaInfo {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `MAP_SHARED` (else private).
    pub shared: bool,
    /// Offset in the mapped file.
    pub offset: u64,
    /// The mapped file's inode (0: anonymous memory).
    pub inode: u64,
    /// The mapped file's device, (major, minor).
    pub dev: (u32, u32),
    /// Its page size (2 MiB for hugetlb memory of that size).
    pub page_size: u64,
}

/// `struct procmap_query` (`include/uapi/linux/fs.h`, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY` = `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 =
    (3 << 30) | ((std::mem::size_of::<ProcmapQuery>() as u64) << 16) | ((b'f' as u64) << 8) | 17;
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;

/// The vma of the process whose `/proc/<pid>/maps` is open as `maps`
/// that covers `addr`, or else the next one above it (`Ok(None)`: none).
/// One `ioctl(PROCMAP_QUERY)` (Linux 6.11+): a lookup in the process's vma
/// tree, no page-table walk and no text (unlike `/proc/<pid>/smaps`).
/// Older kernels fail with `ENOTTY`.
pub fn procmap_query(maps: &impl AsRawFd, addr: u64) -> Result<Option<VmaInfo>, MemError> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA,
        query_addr: addr,
        ..Default::default()
    };
    // SAFETY: `q` is a valid, writable procmap_query of the size it
    // declares; no name or build-id buffers are asked for (sizes 0).
    let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
    if rc != 0 {
        let e = last("ioctl(PROCMAP_QUERY)");
        if e.source.raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(VmaInfo {
        start: q.vma_start,
        end: q.vma_end,
        shared: q.vma_flags & PROCMAP_QUERY_VMA_SHARED != 0,
        offset: q.vma_offset,
        inode: q.inode,
        dev: (q.dev_major, q.dev_minor),
        page_size: q.vma_page_size,
    }))
}

/// Whether `procmap_query` failed because the kernel lacks
/// `PROCMAP_QUERY` (before Linux 6.11: `ENOTTY`; `EINVAL` for a struct it
/// does not know).
pub fn procmap_query_unsupported(e: &MemError) -> bool {
    matches!(e.source.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL))
}

/// An `iovec` as the kernel and the `io-uring` crate's buffer registration
/// take it.
pub type IoVec = libc::iovec;

/// The `iovec` of `[addr, addr + len)`.
pub fn iovec(addr: *mut u8, len: usize) -> IoVec {
    IoVec {
        iov_base: addr.cast(),
        iov_len: len,
    }
}

/// `PIDFD_SELF_THREAD_GROUP` (Linux 6.14): "this process" for the pidfd
/// system calls, without opening a pidfd (and still right after `fork`).
const PIDFD_SELF_PROCESS: i32 = -10001;

/// Most ranges one [`madvise_ranges`] call hands the kernel.
pub const MADVISE_BATCH: usize = 64;

/// `madvise(advice)` of every `(addr, len)` of `ranges` (at most
/// [`MADVISE_BATCH`]) with one `process_madvise(2)` on this process: the
/// kernel walks them in one call and, for `MADV_DONTNEED`, flushes the TLB
/// once for the batch instead of once per range (Linux 6.16). Where the
/// kernel refuses it (before 6.13 `process_madvise` took only `COLD`,
/// `PAGEOUT`, `WILLNEED` and `COLLAPSE`; before 6.14 there was no
/// `PIDFD_SELF`), falls back to one `madvise(2)` per range. Returns the
/// first error, naming `madvise`. Async-signal-safe: system calls and
/// an iovec array on the stack.
pub fn madvise_ranges(ranges: &[(u64, usize)], advice: Advice) -> Result<(), MemError> {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    /// 0: not tried yet, 1: works, 2: refused (use madvise).
    static BATCH: AtomicU8 = AtomicU8::new(0);
    assert!(
        ranges.len() <= MADVISE_BATCH,
        "at most MADVISE_BATCH ranges"
    );
    if ranges.is_empty() {
        return Ok(());
    }
    if BATCH.load(Relaxed) != 2 {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MADVISE_BATCH];
        let mut total = 0usize;
        for (v, &(addr, len)) in iov.iter_mut().zip(ranges) {
            v.iov_base = addr as *mut libc::c_void;
            v.iov_len = len;
            total += len;
        }
        // SAFETY: `iov` holds `ranges.len()` valid iovecs describing
        // address ranges of this process; process_madvise only reads the
        // array, and the advice applies to our own mappings.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                PIDFD_SELF_PROCESS,
                iov.as_ptr(),
                ranges.len(),
                advice.raw(),
                0,
            )
        };
        if r >= 0 && r as usize == total {
            BATCH.store(1, Relaxed);
            return Ok(());
        }
        // Refused by a kernel that cannot do it: never ask again. A partial
        // batch or another error: the per-range calls below say which.
        let refused = matches!(
            crate::errno(),
            libc::EINVAL | libc::ENOSYS | libc::EBADF | libc::EPERM
        );
        if r < 0 && refused && BATCH.load(Relaxed) == 0 {
            BATCH.store(2, Relaxed);
        }
    }
    for &(addr, len) in ranges {
        madvise(addr, len, advice)?;
    }
    Ok(())
}

/// `O_DIRECT`, for `OpenOptionsExt::custom_flags`.
pub const O_DIRECT: i32 = libc::O_DIRECT;

/// `vmsplice(2)` of `[addr, addr + len)` into a fresh pipe (closed again):
/// a kernel-side read of user memory through `get_user_pages`, as a
/// zero-copy send does. Returns the bytes spliced, or the errno.
pub fn vmsplice_into_pipe(addr: *mut u8, len: usize) -> Result<usize, Errno> {
    let mut p = [0i32; 2];
    // SAFETY: `p` has room for the two descriptors pipe(2) writes.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Errno(crate::errno()));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    let iov = iovec(addr, len);
    // SAFETY: the iovec describes memory the caller names; the kernel
    // reads it (or fails with EFAULT), it never writes it.
    let n = unsafe { libc::vmsplice(w.as_raw_fd(), &iov, 1, 0) };
    let e = crate::errno();
    drop((r, w));
    if n < 0 {
        Err(Errno(e))
    } else {
        Ok(n as usize)
    }
}
