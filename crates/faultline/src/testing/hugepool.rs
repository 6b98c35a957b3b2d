//! A pool of free 2 MiB hugetlb pages for a test or a benchmark.

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// A field of `/proc/meminfo` (its number; 0 if absent).
fn meminfo(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Free 2 MiB hugetlb pages: the existing pool when it has enough, else
/// (as root) a pool reserved by growing `vm.nr_hugepages`, given back on
/// drop.
#[derive(Debug)]
pub struct HugePool {
    restore: Option<String>,
}

impl HugePool {
    /// At least `pages` free 2 MiB pages. `Err`: why there are none.
    pub fn get(pages: u64) -> Result<HugePool, String> {
        let free = meminfo("HugePages_Free:");
        if free >= pages {
            return Ok(HugePool { restore: None });
        }
        let old = std::fs::read_to_string(NR_HUGEPAGES).map_err(|e| e.to_string())?;
        let want = old.trim().parse::<u64>().map_err(|e| e.to_string())? + pages - free;
        if let Err(e) = std::fs::write(NR_HUGEPAGES, want.to_string()) {
            return Err(format!(
                "the pool has {free} free 2 MiB pages and growing vm.nr_hugepages failed ({e}; needs root)"
            ));
        }
        let pool = HugePool {
            restore: Some(old.trim().to_string()),
        };
        let now = meminfo("HugePages_Free:");
        if now < pages {
            return Err(format!(
                "vm.nr_hugepages raised to {want}, but only {now} 2 MiB pages are free (fragmented memory)"
            ));
        }
        Ok(pool)
    }
}

impl HugePool {
    /// The setting this pool changed and the value it puts back on drop
    /// (`None`: the existing pool was enough).
    pub fn changed(&self) -> Option<(&'static str, &str)> {
        self.restore.as_deref().map(|old| (NR_HUGEPAGES, old))
    }
}

impl Drop for HugePool {
    fn drop(&mut self) {
        if let Some(old) = &self.restore {
            let _ = std::fs::write(NR_HUGEPAGES, old);
        }
    }
}
