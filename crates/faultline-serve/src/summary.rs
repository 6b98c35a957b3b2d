//! What serve reports of each peer: the schema of its `--json` and of the
//! summaries `faultline bench restore` reads back.

/// One peer's summary (stderr and `--json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Default)]
pub struct PeerSummary {
    /// Connection number.
    pub peer: usize,
    /// Its pid (SO_PEERCRED).
    pub pid: i32,
    /// How it ended.
    pub outcome: String,
    /// Regions.
    pub regions: usize,
    /// How it was served: "copy", "shared" (zero copy) or "handed back"
    /// (`--hand-back`: the kernel served its faults).
    #[serde(default)]
    pub mode: String,
    /// Features the peer enabled with UFFDIO_API.
    pub features: Vec<String>,
    /// Fault messages.
    pub faults: u64,
    /// `read(2)`s of its userfaultfd that returned messages (fault
    /// messages per read: `faults / reads`).
    #[serde(default)]
    pub reads: u64,
    /// CPU time of serve's handler threads (all peers') when this peer
    /// ended, ms: what waiting for faults cost (see `--engine`).
    #[serde(default)]
    pub handler_cpu_ms: f64,
    /// CPU time of serve's prefetch helpers (shared by all peers) when
    /// this peer ended, ms: prefetch, and the pieces of long fault windows
    /// they copy beside the handler threads.
    #[serde(default)]
    pub helpers_cpu_ms: f64,
    /// Pages installed (faults, fault-around, prefetch).
    pub installed: u64,
    /// Of those, pages a fault installed beside its own (fault-around and
    /// read-ahead windows): the most the windows can have wasted (serve
    /// cannot see which of them the peer touched; `bench restore`, which
    /// knows the peer's working set, counts the wasted ones exactly).
    #[serde(default)]
    pub around: u64,
    /// `--adaptive-window`: the isolated window of the peer's largest
    /// region when it ended, pages (absent: not adaptive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated_window: Option<usize>,
    /// `--adaptive-window`: times its regions' isolated windows doubled
    /// and halved (absent: not adaptive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_changes: Option<[u64; 2]>,
    /// Bytes read from the memory file (pages installed from it).
    pub bytes_read: u64,
    /// REMOVE events.
    pub removes: u64,
    /// Pages they dropped.
    pub removed_pages: u64,
    /// Faults deferred after EAGAIN.
    pub deferred: u64,
    /// EEXIST outcomes.
    pub exists: u64,
    /// Pages installed by prefetch.
    pub prefetched: u64,
    /// Pages installed by its run-ahead populators (`--run-ahead`).
    #[serde(default)]
    pub run_ahead: u64,
    /// Bytes of the handler's bookkeeping for this peer (residency map,
    /// removed bits, record log, prefetch queue).
    #[serde(default)]
    pub bookkeeping_bytes: u64,
    /// Seconds from the handshake to its end.
    pub seconds: f64,
    /// When the hand-off reached its milestones.
    #[serde(default)]
    pub handoff: Handoff,
    /// Its last faults' TSC stamps (`--phase-samples`), oldest first,
    /// each [`faultline::FaultPhases::fields`]: address, read, start,
    /// filled, resolved, woken, done, pages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<[u64; 8]>,
    /// The stalls its vCPUs reported (absent: it reported none; see
    /// `faultline_serve::server`'s stall reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_stalls: Option<StallSummary>,
}

/// The stalls a peer's vCPUs reported: accesses that waited for a missing
/// page, as the VMM timed them.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, Default, PartialEq)]
pub struct StallSummary {
    /// Stalls reported.
    pub count: u64,
    /// Their durations summed, ms.
    pub sum_ms: f64,
}

/// When serve reached each step of a peer's hand-off, `CLOCK_MONOTONIC`
/// nanoseconds (the peer's clock too: `bench restore` lays them beside the
/// peer's own); 0: the step did not happen.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, Default)]
pub struct Handoff {
    /// The listener accepted the connection.
    pub accepted_ns: u64,
    /// Handling the handshake started (on the listener's thread when it
    /// arrived within 2 ms of the connection, else on a thread of its own).
    pub thread_ns: u64,
    /// `recvmsg` returned the handshake.
    pub received_ns: u64,
    /// The handshake was parsed and the userfaultfd adopted.
    pub adopted_ns: u64,
    /// The mode check (shared snapshot or anonymous memory) ended.
    pub checked_ns: u64,
    /// The peer's regions were set up.
    pub built_ns: u64,
    /// Its prefetch was queued.
    pub queued_ns: u64,
    /// It was listed as served and said so, and is handed to the handler
    /// threads next.
    pub serving_ns: u64,
    /// The first fault message was read.
    pub first_fault_ns: u64,
    /// The first prefetch ioctl finished.
    pub first_prefetch_ns: u64,
    /// The last prefetch ioctl finished.
    pub prefetch_done_ns: u64,
}
