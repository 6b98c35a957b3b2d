//! The memory cgroup of each peer served. The kernel charges each page
//! serve installs to the peer's memory cgroup (the `mm` the userfaultfd
//! belongs to), and a charge past the group's limit runs its OOM killer
//! as the peer's own fault would: a VM whose memory outgrows its cgroup
//! (a jailer's limit below the snapshot's working set) is killed during
//! its restore, and serve sees only a hang-up. So serve reads the group's
//! OOM kill count when it starts serving a peer and again at its end, and
//! says when it grew; a charge that fails with nothing killed (a cgroup v1
//! `oom_kill_disable`, an empty huge page pool) is `ENOMEM` from the
//! ioctl, said with the fault.

use std::sync::OnceLock;

use faultline_sys::cgroup::{self, Group};

/// A peer's memory cgroup and its OOM kills when serving it began.
pub struct OomWatch {
    group: Group,
    kills: u64,
}

impl OomWatch {
    /// Process `pid`'s memory cgroup, when it has one that counts OOM
    /// kills.
    pub fn of(pid: i32) -> Option<OomWatch> {
        if pid <= 0 {
            return None;
        }
        // Read once: the hierarchies are mounted before serve starts.
        static MOUNTS: OnceLock<Option<String>> = OnceLock::new();
        let mounts = MOUNTS
            .get_or_init(|| cgroup::mount_table().ok())
            .as_deref()?;
        let group = cgroup::of_in(pid, "memory", mounts).ok()??;
        let kills = group.oom_kills()?;
        Some(OomWatch { group, kills })
    }

    /// What to add to the peer's outcome when its group's OOM killer
    /// killed since serving it began (`None`: it did not).
    pub fn since(&self) -> Option<String> {
        let now = self.group.oom_kills()?;
        let killed = now.checked_sub(self.kills).filter(|&k| k > 0)?;
        let limit = match self.group.memory_limit() {
            Some(l) => format!("limit {} MiB", l >> 20),
            None => "no limit of its own".into(),
        };
        Some(format!(
            "its memory cgroup {}, {limit}, OOM-killed {killed} process(es) while serve served it: the pages installed are charged to the VM's cgroup, and a VM whose memory outgrows it is killed there as on the kernel's own faults",
            self.group.path
        ))
    }
}
