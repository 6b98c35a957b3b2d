//! Who runs an upload, and whether it still runs: a record of an upload
//! in progress names its process as `HOST/BOOT/PID/START` (host name,
//! kernel boot id, pid, the process's start time in clock ticks after
//! boot, all from `/proc`). On the same host and boot, a pid whose start
//! time differs (or that is gone, or a zombie) is a process that ended:
//! its upload is dead now, not when its lease runs out. An upload on
//! another host is judged by its lease alone. (Containers that share a
//! kernel and a host name but not a pid namespace would misjudge each
//! other's uploads as ended: the worst that does is stop such an upload
//! with [`RedisStoreError::Lost`](crate::RedisStoreError::Lost), the
//! store unchanged; give them distinct host names.)

use std::sync::OnceLock;

/// This process, as a record names it.
pub(crate) fn me() -> &'static str {
    static ME: OnceLock<String> = OnceLock::new();
    ME.get_or_init(|| {
        let pid = std::process::id();
        let start = start_time(pid).unwrap_or(0);
        format!("{}/{}/{pid}/{start}", host(), boot())
    })
}

fn host() -> String {
    read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into())
}

fn boot() -> String {
    read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_else(|| "unknown".into())
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty() && !s.contains(['/', ' '])).then(|| s.to_string())
}

/// `/proc/PID/stat`: the start time (field 22), `None` if the process is
/// gone or a zombie.
fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // Fields 4.. follow the state (field 3); the start time is field 22.
    f.nth(22 - 4)?.parse().ok()
}

/// What is known about a record's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// This host: the process runs.
    Running,
    /// This host: the process ended.
    Ended,
    /// Another host (or a name this code did not write): only the lease
    /// tells.
    Elsewhere,
}

/// Whether `owner` (as [`me`] writes it) still runs.
pub(crate) fn liveness(owner: &str) -> Liveness {
    let parts: Vec<&str> = owner.split('/').collect();
    let [h, b, pid, start] = parts[..] else {
        return Liveness::Elsewhere;
    };
    if h != host() || b != boot() {
        return Liveness::Elsewhere;
    }
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return Liveness::Elsewhere;
    };
    match start_time(pid) {
        Some(s) if s == start => Liveness::Running,
        _ => Liveness::Ended,
    }
}

/// `owner` for people: `pid 123 on host h`.
pub(crate) fn describe(owner: &str) -> String {
    match owner.split('/').collect::<Vec<_>>()[..] {
        [h, _, pid, _] => format!("pid {pid} on host {h}"),
        _ => format!("owner {owner:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_an_ended_one_does_not() {
        assert_eq!(liveness(me()), Liveness::Running, "{}", me());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = start_time(pid);
        child.wait().unwrap();
        let gone = format!("{}/{}/{pid}/{}", host(), boot(), start.unwrap_or(1));
        assert_eq!(liveness(&gone), Liveness::Ended, "{gone}");
        // Our pid with another start time: a reused pid, not us.
        let reused = format!("{}/{}/{}/1", host(), boot(), std::process::id());
        assert_eq!(liveness(&reused), Liveness::Ended);
        assert_eq!(
            liveness(&format!("otherhost/{}/1/1", boot())),
            Liveness::Elsewhere
        );
        assert_eq!(liveness("garbage"), Liveness::Elsewhere);
        assert!(describe(me()).starts_with(&format!("pid {} on host ", std::process::id())));
    }
}
