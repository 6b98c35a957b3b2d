//! What the running kernel offers, probed rather than assumed.
//!
//! 1. The fd is opened by trying `/dev/userfaultfd` (gated by the node's
//!    permissions), then `userfaultfd(2)` (needs `CAP_SYS_PTRACE` or
//!    `vm.unprivileged_userfaultfd=1` to trap kernel-mode faults), then
//!    `userfaultfd(2)` with `UFFD_USER_MODE_ONLY` (anyone; faults taken
//!    inside syscalls are not trapped). The first that works is used; the
//!    reasons the others failed are kept for `faultline info`.
//! 2. Features are read with `UFFDIO_API` on a throwaway fd (the handshake
//!    works once per fd).
//! 3. For each memory kind a small mapping is registered and the kernel's
//!    answer (the allowed ioctls) recorded.

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::page::MemoryKind;
use faultline_sys::mem::{self, Mapping};
use faultline_sys::uffd::{self, feature, ioctl_bit, register_mode, Uffd, UffdError};
use faultline_sys::Errno;

/// A way to create a userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreationPath {
    /// `open("/dev/userfaultfd")` + `USERFAULTFD_IOC_NEW`.
    DevNode,
    /// `userfaultfd(2)`.
    Syscall,
    /// `userfaultfd(2)` with `UFFD_USER_MODE_ONLY`.
    SyscallUserModeOnly,
}

impl CreationPath {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            CreationPath::DevNode => "/dev/userfaultfd",
            CreationPath::Syscall => "userfaultfd(2)",
            CreationPath::SyscallUserModeOnly => "userfaultfd(2) UFFD_USER_MODE_ONLY",
        }
    }
    const ALL: [CreationPath; 3] = [
        CreationPath::DevNode,
        CreationPath::Syscall,
        CreationPath::SyscallUserModeOnly,
    ];
    fn open(self, flags: i32) -> Result<Uffd, UffdError> {
        match self {
            CreationPath::DevNode => uffd::dev_userfaultfd(flags),
            CreationPath::Syscall => uffd::syscall_userfaultfd(flags),
            CreationPath::SyscallUserModeOnly => {
                uffd::syscall_userfaultfd(flags | uffd::UFFD_USER_MODE_ONLY)
            }
        }
    }
}

/// What one memory kind supports.
#[derive(Debug, Clone)]
pub struct KindCaps {
    /// The kind.
    pub kind: MemoryKind,
    /// `Ok(ioctls)` (bit set of [`ioctl_bit`]) granted by REGISTER, or why
    /// the kind is unusable. Which engines can serve the kind:
    /// [`EngineKind::usable_on`](crate::EngineKind::usable_on).
    pub ioctls: Result<u64, String>,
}

impl KindCaps {
    /// Whether REGISTER granted the ioctl `bit`.
    pub fn allows(&self, bit: u32) -> bool {
        matches!(self.ioctls, Ok(i) if i & (1 << bit) != 0)
    }
}

/// The probed capabilities of this kernel and process.
#[derive(Debug, Clone)]
pub struct Capabilities {
    /// `uname -r`.
    pub kernel: String,
    /// Each creation path tried, in order, with its result.
    pub creation: Vec<(CreationPath, Result<(), String>)>,
    /// The path used for new fds.
    pub path: Option<CreationPath>,
    /// Feature bits reported by `UFFDIO_API`.
    pub features: u64,
    /// Per memory kind.
    pub kinds: Vec<KindCaps>,
    /// Free 2 MiB pages in the hugetlb pool.
    pub hugetlb_free: u64,
}

impl Capabilities {
    /// Whether the kernel has all `bits` features.
    pub fn has(&self, bits: u64) -> bool {
        self.features & bits == bits
    }
    /// The entry for `kind`.
    pub fn kind(&self, kind: MemoryKind) -> &KindCaps {
        self.kinds
            .iter()
            .find(|k| k.kind == kind)
            .expect("every kind is probed")
    }
}

static CAPS: OnceLock<Capabilities> = OnceLock::new();

/// The capabilities, probed once per process.
pub fn capabilities() -> &'static Capabilities {
    CAPS.get_or_init(probe)
}

/// Opens a new userfaultfd through the first creation path that works and
/// performs the API handshake with `features`.
pub fn open_uffd(nonblocking: bool, features: u64) -> Result<Uffd> {
    let caps = capabilities();
    let path = caps.path.ok_or_else(|| Error::Unsupported {
        what: "userfaultfd",
        reason: caps
            .creation
            .iter()
            .map(|(p, r)| {
                format!(
                    "{}: {}",
                    p.name(),
                    r.as_ref().err().map(String::as_str).unwrap_or("ok")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    })?;
    let missing = features & !caps.features;
    if missing != 0 {
        return Err(Error::Unsupported {
            what: "userfaultfd feature",
            reason: format!("kernel lacks {}", feature_names(missing).join(", ")),
        });
    }
    let fd = path.open(uffd::open_flags(nonblocking))?;
    fd.api(features)?;
    Ok(fd)
}

/// Names of the feature bits set in `bits`.
pub fn feature_names(bits: u64) -> Vec<&'static str> {
    feature::ALL
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect()
}

fn why(e: &UffdError) -> String {
    let hint = match Errno(e.errno()) {
        Errno::EPERM | Errno::EACCES => " (permission: needs root or CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd=1)",
        Errno::ENOENT => " (no such device node: kernel < 6.1 or no devtmpfs)",
        Errno::ENOSYS => " (kernel built without CONFIG_USERFAULTFD, or a seccomp filter such as Docker's default blocks it)",
        _ => "",
    };
    format!("{e}{hint}")
}

fn probe() -> Capabilities {
    let kernel = faultline_sys::kernel_release();
    let mut creation = Vec::new();
    let mut path = None;
    let mut features = 0;
    for p in CreationPath::ALL {
        let r = p.open(uffd::open_flags(true)).and_then(|fd| fd.api(0));
        match r {
            Ok(api) => {
                if path.is_none() {
                    path = Some(p);
                    features = api.features;
                }
                creation.push((p, Ok(())));
            }
            Err(e) => creation.push((p, Err(why(&e)))),
        }
    }
    let hugetlb_free = mem::hugetlb_free_pages();
    let mut caps = Capabilities {
        kernel,
        creation,
        path,
        features,
        kinds: Vec::new(),
        hugetlb_free,
    };
    for kind in MemoryKind::ALL {
        let ioctls = probe_kind(&caps, kind);
        caps.kinds.push(KindCaps { kind, ioctls });
    }
    caps
}

fn probe_kind(caps: &Capabilities, kind: MemoryKind) -> Result<u64, String> {
    let path = caps.path.ok_or("no userfaultfd")?;
    let (need, mode) = match kind {
        MemoryKind::PrivateAnon => (0, register_mode::MISSING),
        MemoryKind::Shmem => (
            feature::MISSING_SHMEM | feature::MINOR_SHMEM,
            register_mode::MISSING | register_mode::MINOR,
        ),
        MemoryKind::Hugetlb => (
            feature::MISSING_HUGETLBFS | feature::MINOR_HUGETLBFS,
            register_mode::MISSING | register_mode::MINOR,
        ),
    };
    if caps.features & need != need {
        return Err(format!(
            "kernel lacks {}",
            feature_names(need & !caps.features).join(", ")
        ));
    }
    let len = kind.min_page_size().bytes();
    let (map, _fd) = match kind {
        MemoryKind::PrivateAnon => (Mapping::anon(len).map_err(|e| e.to_string())?, None),
        MemoryKind::Shmem | MemoryKind::Hugetlb => {
            let huge = kind == MemoryKind::Hugetlb;
            if huge && caps.hugetlb_free == 0 {
                return Err(
                    "hugetlb pool is empty (echo N > /proc/sys/vm/nr_hugepages as root)".into(),
                );
            }
            let fd = mem::memfd("faultline-probe", huge).map_err(|e| e.to_string())?;
            mem::ftruncate(&fd, len as u64).map_err(|e| e.to_string())?;
            (
                Mapping::shared(&fd, len, 0).map_err(|e| e.to_string())?,
                Some(fd),
            )
        }
    };
    let fd = path
        .open(uffd::open_flags(true))
        .map_err(|e| e.to_string())?;
    fd.api(need).map_err(|e| e.to_string())?;
    let ioctls = fd
        .register(map.addr(), len as u64, mode)
        .map_err(|e| e.to_string())?;
    let _ = fd.unregister(map.addr(), len as u64);
    Ok(ioctls)
}

/// Why `op` (an [`ioctl_bit`]) cannot resolve faults on `kind`, or `None`
/// when it can.
pub fn op_unusable(kind: MemoryKind, op: u32) -> Option<String> {
    let k = capabilities().kind(kind);
    if let Err(e) = &k.ioctls {
        return Some(e.clone());
    }
    if op == ioctl_bit::MOVE && kind != MemoryKind::PrivateAnon {
        return Some("UFFDIO_MOVE works on private anonymous memory only (shmem advertises it but returns EINVAL)".into());
    }
    if op == ioctl_bit::MOVE && !capabilities().has(feature::MOVE) {
        return Some("kernel lacks UFFD_FEATURE_MOVE".into());
    }
    if !k.allows(op) {
        return Some("REGISTER did not grant it for this memory kind".into());
    }
    None
}
