//! Control groups, as `/proc/PID/cgroup` and the mount table name them:
//! the directory of a process's group for one controller (cgroup v1,
//! where each controller has its own hierarchy, or v2's single one), and
//! the values the crates above read there (a memory limit, the OOM
//! kills so far, a task limit).
//!
//! A v1 line of `/proc/PID/cgroup` names its controllers
//! (`4:memory:/vm1`); v2's is `0::/vm1`. A controller bound to a v1
//! hierarchy is read there, else in v2's (where it may not be enabled
//! for the group: its files are then absent, and the values `None`).
//! Paths are relative to the reading process's cgroup namespace, as are
//! the mounts' roots, which are stripped from them.

use std::io;
use std::path::{Path, PathBuf};

/// One process's group for one controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Its path, as `/proc/PID/cgroup` gives it (`/vm1`).
    pub path: String,
    /// Its directory in the mounted hierarchy.
    pub dir: PathBuf,
    /// In the v2 hierarchy.
    pub v2: bool,
}

/// The group of process `pid` (0: this one) for `controller`
/// (`"memory"`, `"pids"`); `None` when no mounted hierarchy has it.
pub fn of(pid: i32, controller: &str) -> io::Result<Option<Group>> {
    of_in(pid, controller, &mount_table()?)
}

/// This process's mount table (`/proc/self/mountinfo`), for [`of_in`].
pub fn mount_table() -> io::Result<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
}

/// [`of`] with the mount table read before ([`mount_table`]): a caller
/// that looks up many processes reads it once.
pub fn of_in(pid: i32, controller: &str, mount_table: &str) -> io::Result<Option<Group>> {
    let who = match pid {
        0 => "self".to_string(),
        p => p.to_string(),
    };
    let cgroups = std::fs::read_to_string(format!("/proc/{who}/cgroup"))?;
    Ok(find(&cgroups, mount_table, controller))
}

/// [`of`] over the texts of `/proc/PID/cgroup` and `/proc/self/mountinfo`.
fn find(cgroups: &str, mountinfo: &str, controller: &str) -> Option<Group> {
    let mut v1 = None;
    let mut v2 = None;
    for l in cgroups.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if ctrls.is_empty() {
            v2 = Some(path);
        } else if ctrls.split(',').any(|c| c == controller) {
            v1 = Some(path);
        }
    }
    let (path, v2) = match (v1, v2) {
        (Some(p), _) => (p, false),
        (None, Some(p)) => (p, true),
        (None, None) => return None,
    };
    let (root, at) = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let (fstype, _, options) = (right.next()?, right.next()?, right.next()?);
        let ours = match v2 {
            true => fstype == "cgroup2",
            false => fstype == "cgroup" && options.split(',').any(|o| o == controller),
        };
        match ours {
            true => Some((*left.get(3)?, *left.get(4)?)),
            false => None,
        }
    })?;
    let inner = match root {
        "/" => path,
        root => path.strip_prefix(root)?,
    };
    Some(Group {
        path: path.to_string(),
        dir: Path::new(at).join(inner.trim_start_matches('/')),
        v2,
    })
}

impl Group {
    /// File `name` of the group, trimmed (`None`: absent or unreadable).
    pub fn read(&self, name: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.join(name)).ok()?;
        Some(text.trim().to_string())
    }

    /// File `name` as a number (`None` for v2's `max`: no limit).
    pub fn number(&self, name: &str) -> Option<u64> {
        self.read(name)?.parse().ok()
    }

    /// The value of `key` in the flat-keyed file `name` (`key value`
    /// lines: `memory.events`, `memory.oom_control`).
    pub fn keyed(&self, name: &str, key: &str) -> Option<u64> {
        self.read(name)?.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            match k == key {
                true => v.trim().parse().ok(),
                false => None,
            }
        })
    }

    /// The memory limit, bytes (`None`: none; v1 says "none" with a
    /// number near `i64::MAX`).
    pub fn memory_limit(&self) -> Option<u64> {
        match self.v2 {
            true => self.number("memory.max"),
            false => self
                .number("memory.limit_in_bytes")
                .filter(|&l| l < 1 << 60),
        }
    }

    /// Processes the group's OOM killer has killed so far (`None`: not
    /// said: v1 before Linux 4.13, or v2 without the memory controller).
    pub fn oom_kills(&self) -> Option<u64> {
        match self.v2 {
            true => self.keyed("memory.events", "oom_kill"),
            false => self.keyed("memory.oom_control", "oom_kill"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_controller_bound_to_v1_is_read_there_and_others_in_v2() {
        let cg = "8:pids:/\n4:memory:/vm/1\n0::/vm/1\n";
        let m = find(cg, HYBRID, "memory").unwrap();
        assert_eq!(m.dir, Path::new("/sys/fs/cgroup/memory/vm/1"));
        assert!(!m.v2);
        assert_eq!(m.path, "/vm/1");
        let io = find(cg, HYBRID, "io").unwrap();
        assert_eq!(io.dir, Path::new("/sys/fs/cgroup/unified/vm/1"));
        assert!(io.v2);
    }

    #[test]
    fn a_mounts_root_is_stripped_and_an_unmounted_controller_is_none() {
        let mounts = "50 40 0:40 /ns /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let g = find("0::/ns/vm\n", mounts, "memory").unwrap();
        assert_eq!(g.dir, Path::new("/sys/fs/cgroup/vm"));
        assert_eq!(find("4:memory:/vm\n", mounts, "memory"), None);
        assert_eq!(find("", HYBRID, "memory"), None);
    }

    #[test]
    fn this_process_has_a_memory_group_whose_files_read() {
        // Every Linux with a memory controller mounted (v1 or v2).
        let Some(g) = of(0, "memory").unwrap() else {
            return;
        };
        assert!(g.dir.is_dir(), "{g:?}");
        if g.v2 && g.read("memory.events").is_none() {
            return; // the controller is not enabled for this group
        }
        assert!(g.oom_kills().is_some(), "{g:?}");
    }
}
