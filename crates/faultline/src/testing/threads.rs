//! A process's threads as `/proc` shows them: name and the CPUs each may
//! run on, for tests that check where a runtime put its threads.

/// One thread of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcThread {
    /// Its id.
    pub tid: i32,
    /// Its name (`comm`: at most 15 bytes).
    pub name: String,
    /// The CPUs it may run on (`Cpus_allowed_list`: `3`, `0-1`, ...).
    pub cpus: String,
}

/// The threads of process `pid` whose names start with `prefix` (a
/// thread that ends while they are read is left out).
pub fn threads(pid: u32, prefix: &str) -> Vec<ProcThread> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| {
            let t = t.ok()?.path();
            let tid = t.file_name()?.to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(t.join("comm")).ok()?;
            let name = name.trim();
            if !name.starts_with(prefix) {
                return None;
            }
            let status = std::fs::read_to_string(t.join("status")).ok()?;
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
            Some(ProcThread {
                tid,
                name: name.to_string(),
                cpus: cpus.trim().to_string(),
            })
        })
        .collect()
}
