//! What the peer measured (its `--json`, read back by `faultline bench
//! restore`), and its progress lines.

/// What the peer measured.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Default)]
pub struct PeerReport {
    /// Seconds from the handshake (or mapping, for the file backend) to
    /// the last working-set page touched.
    pub seconds: f64,
    /// Working-set pages touched.
    pub pages: usize,
    /// Median first-touch latency, ns.
    pub median_ns: u64,
    /// 99th percentile first-touch latency, ns.
    pub p99_ns: u64,
    /// The longest first-touch latency, ns: the longest a vCPU stalled on
    /// one page (a restart of serve under `--takeover` shows here).
    #[serde(default)]
    pub max_ns: u64,
    /// Bytes compared with the file.
    pub verified_bytes: u64,
    /// `--stall-ns`: the first touches slower than it (the stalls reported
    /// to the handler), and their durations summed, ns.
    #[serde(default)]
    pub stalls: u64,
    #[serde(default)]
    pub stall_sum_ns: u64,
    /// Base pages of its regions resident once the working set was
    /// touched, before any check (`mincore`; uffd backend only, else 0):
    /// beyond the working set's pages, what the handler installed that no
    /// vCPU touched (its windows' waste).
    #[serde(default)]
    pub resident_pages: u64,
    /// The peer's private anonymous memory after the working set (KiB,
    /// `RssAnon`): copy mode's copies, shared mode's written pages.
    #[serde(default)]
    pub rss_anon_kib: u64,
    /// Its mapped shared-memory pages (KiB, `RssShmem`): shared mode's
    /// mapped page-cache pages, shared with every other peer.
    #[serde(default)]
    pub rss_shmem_kib: u64,
    /// Its mapped file pages (KiB, `RssFile`): the kernel baseline's.
    #[serde(default)]
    pub rss_file_kib: u64,
    /// Its private hugetlb pages (KiB, `Private_Hugetlb` of smaps_rollup;
    /// not in `RssAnon`).
    #[serde(default)]
    pub hugetlb_kib: u64,
    /// Page faults the kernel counted for this process while the vCPUs
    /// touched the working set (`minflt` of /proc/self/stat): for the file
    /// backend, how many faults the kernel took (fault-around and large
    /// folios map several pages per fault).
    #[serde(default)]
    pub minor_faults: u64,
    /// `CLOCK_MONOTONIC` ns (serve's clock too) of the start of `seconds`:
    /// just before the handshake was sent (file backend: after mapping).
    #[serde(default)]
    pub sent_ns: u64,
    /// ... when the working set was drawn and the vCPU threads about to
    /// start.
    #[serde(default)]
    pub vcpus_ns: u64,
    /// ... when the first vCPU touch began.
    #[serde(default)]
    pub first_touch_ns: u64,
    /// ... when the last working-set touch ended.
    #[serde(default)]
    pub last_touch_ns: u64,
    /// Times the vCPU threads were preempted while touching (their
    /// `nonvoluntary_ctxt_switches`, summed): other threads wanted their
    /// CPUs.
    #[serde(default)]
    pub vcpu_preempted: u64,
    /// Times they slept (`voluntary_ctxt_switches`): waits for a fault to
    /// be resolved.
    #[serde(default)]
    pub vcpu_slept: u64,
    /// `--stamps`: each vCPU thread's last slow touches, as (page address,
    /// TSC before, TSC after), the threads' one after the other.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub touch_stamps: Vec<(u64, u64, u64)>,
    /// `--write-set`: the file offsets of the 4 KiB pages written, sorted.
    #[serde(default)]
    pub written_offsets: Vec<u64>,
    /// ... the file offsets of the pages dropped (`--balloon`, `--storm`):
    /// they read zeros, not the snapshot's bytes.
    #[serde(default)]
    pub dropped_offsets: Vec<u64>,
    /// ... median first-write latency over all the written pages, ns.
    #[serde(default)]
    pub write_median_ns: u64,
    /// ... median first-write latency over the written pages of the
    /// working set (present when written: no missing-page fault; a
    /// write-protect fault when the handler tracks writes), ns.
    #[serde(default)]
    pub write_present_median_ns: u64,
}

/// A progress line on stderr, `faultline peer PID: ...`.
pub fn say(msg: std::fmt::Arguments<'_>) {
    eprintln!("faultline peer {}: {msg}", std::process::id());
}
