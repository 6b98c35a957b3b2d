//! What the kernel says of the peer process and its threads (`/proc`).

/// This thread's (voluntary, nonvoluntary) context switches.
pub fn thread_switches() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        get("voluntary_ctxt_switches:"),
        get("nonvoluntary_ctxt_switches:"),
    )
}

/// `minflt` of /proc/self/stat (field 10).
pub fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces: count after its ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(7)?.parse().ok())
        .unwrap_or(0)
}

/// `RssAnon`, `RssShmem`, `RssFile` and private hugetlb memory of this
/// process, KiB.
pub fn rss_kib() -> (u64, u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    // Private hugetlb pages only (HugetlbPages counts mapped shared
    // page-cache pages of a hugetlbfs file too).
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let private_hugetlb = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Private_Hugetlb:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (
        get("RssAnon:"),
        get("RssShmem:"),
        get("RssFile:"),
        private_hugetlb,
    )
}
