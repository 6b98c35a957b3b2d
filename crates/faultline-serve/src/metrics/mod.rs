//! Live metrics: what serve is doing, as the OpenMetrics text a
//! Prometheus scrape reads (`--metrics ADDR`).
//!
//! ```text
//!  scrape (GET /metrics) ─► endpoint (a thread of its own; unix socket or loopback TCP)
//!                              │ Exposition::encode (prometheus-client's text encoder)
//!                              ▼
//!                           the server's sample: per peer being served its
//!                           PeerStats (the engine's own counters, read, not
//!                           counted twice), process-wide counters
//! ```
//!
//! 1. Nothing is counted for the metrics alone: a scrape reads the
//!    counters the engine keeps for each peer ([`faultline::PeerStats`],
//!    the same as `--json`'s summaries) and the server's own
//!    ([`ServerCounters`]: hand-offs refused by reason).
//! 2. Per-peer series carry the labels `peer` (connection number), `pid`
//!    and `snapshot` (the memory file or store); a peer's series end when
//!    it is done with (its summary has the final values).
//! 3. The exposition is built by `prometheus-client` (a [`Collector`]),
//!    so names, types, `_total` suffixes, histogram buckets and `# EOF`
//!    follow the OpenMetrics text format.
//!
//! | family | type | what |
//! |---|---|---|
//! | `faultline_peer_faults{kind}` | counter | fault messages: `read`, `write`, `minor`, `wp` |
//! | `faultline_peer_pages_installed{by}` | counter | pages installed `demand` (the faulting page), `fault_around`, `prefetch`, `run_ahead` |
//! | `faultline_peer_store_read_bytes` | counter | bytes read from the store |
//! | `faultline_peer_remove_events`, `faultline_peer_removed_pages` | counter | REMOVE events, the pages they dropped |
//! | `faultline_peer_eagain_retries`, `faultline_peer_deferred_faults` | counter | resolve ioctls that met EAGAIN; faults deferred by it |
//! | `faultline_peer_eexist` | counter | resolutions that found the page there |
//! | `faultline_peer_fault_service_seconds` | histogram | message read to wake (see `faultline`'s `ServiceTimes`) |
//! | `faultline_peer_vcpu_stall_seconds` | histogram | the stalls the peer's vCPUs reported (peers that report them: see the server's stall reports), same buckets |
//! | `faultline_peer_prefetch_queued_pages` | gauge | pages queued for prefetch (progress: `pages_installed{by="prefetch"}` of these) |
//! | `faultline_peer_prefetch_done_seconds` | gauge | handshake read to the last prefetch install (once done) |
//! | `faultline_peer_dirty_pages` | gauge | 4 KiB pages of its dirty set so far (`--track-dirty`, tracked peers: what the set written now would hold) |
//! | `faultline_peers_connected` | gauge | peers being served now |
//! | `faultline_peers_accepted`, `faultline_peers_finished` | counter | connections accepted; done with |
//! | `faultline_handoffs_refused{reason}` | counter | hand-offs refused, by the step that refused them |
//! | `faultline_handler_busy_seconds` | gauge | the longest a handler thread has been on its current fault (0: none): the alert for a store read or kernel call that does not return |
//! | `process_open_fds`, `process_max_fds` | gauge | descriptors open, and the limit (Prometheus's own process metrics): serve refuses VMMs at the limit |
//! | `faultline_handler_cpu_seconds`, `faultline_prefetch_helpers_cpu_seconds` | counter | CPU time of the handler threads (the price of `--engine`'s spinning) and of the prefetch helpers (prefetch, pieces of long windows), all peers |

mod endpoint;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use faultline::{PeerStats, ServiceTimes, SERVICE_BOUNDS_NS};

use crate::keeper::KeeperStatus;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub use endpoint::{scrape, Endpoint, EndpointError, MetricsAddr};

/// One peer being served, as a scrape sees it.
#[derive(Debug, Clone)]
pub struct PeerSample {
    /// Its connection number.
    pub peer: usize,
    /// Its pid (0: unknown).
    pub pid: i32,
    /// Its counters.
    pub stats: PeerStats,
    /// Seconds from its handshake to its prefetch's end (once it ended).
    pub prefetch_done_s: Option<f64>,
    /// Pages of its dirty set so far (`--track-dirty`; `None`: not
    /// tracked).
    pub dirty_pages: Option<u64>,
    /// The stalls its vCPUs reported so far (`None`: none reported).
    pub vcpu_stalls: Option<ServiceTimes>,
}

/// What a scrape reads: the peers being served and the process-wide
/// counters.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// The snapshot served (the memory file, or the store's URL).
    pub snapshot: String,
    /// The peers being served.
    pub peers: Vec<PeerSample>,
    /// Connections accepted.
    pub accepted: u64,
    /// Connections done with (refused, hung up, failed).
    pub finished: u64,
    /// Hand-offs refused, by reason.
    pub refused: BTreeMap<&'static str, u64>,
    /// CPU time of the handler threads so far, seconds.
    pub handler_cpu_s: f64,
    /// CPU time of the prefetch helpers so far, seconds.
    pub helpers_cpu_s: f64,
    /// Peers taken over from the keeper (a serve before this one died).
    pub taken_over: u64,
    /// The keeper (`--takeover`, `--fd-store`; `None` without one).
    pub keeper: Option<KeeperStatus>,
    /// Peers served that the keeper does not hold (their deposit failed;
    /// `None` without a keeper).
    pub unprotected: Option<u64>,
    /// Descriptors open and the soft limit (`None`: not read).
    pub fds: Option<(u64, u64)>,
    /// The longest a handler thread has been on the fault it resolves now,
    /// seconds (0: none is on one).
    pub longest_fault_s: f64,
}

/// The server's own counters (the engine keeps the peers').
#[derive(Debug, Default)]
pub struct ServerCounters {
    refused: Mutex<BTreeMap<&'static str, u64>>,
}

impl ServerCounters {
    /// Counts a hand-off refused for `reason`.
    pub fn refused(&self, reason: &'static str) {
        *self
            .refused
            .lock()
            .expect("refusals")
            .entry(reason)
            .or_default() += 1;
    }

    /// The refusals so far, by reason.
    pub fn refusals(&self) -> BTreeMap<&'static str, u64> {
        self.refused.lock().expect("refusals").clone()
    }
}

/// Reads a [`Sample`] at each scrape.
pub type Sampler = Box<dyn Fn() -> Sample + Send + Sync>;

/// The [`Collector`] of serve's metrics: encodes a fresh [`Sample`] at
/// each scrape.
pub struct Exposition {
    sample: Sampler,
    /// What a `POST` to a path does: (path, what it writes, the action,
    /// which gives how many it wrote). `POST /dirty` with
    /// `--track-dirty`, `POST /record` with `--record`.
    posts: Vec<(&'static str, &'static str, Action)>,
}

/// A `POST` request's action: how many files it wrote.
pub type Action = Box<dyn Fn() -> usize + Send + Sync>;

impl fmt::Debug for Exposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Exposition")
    }
}

impl Exposition {
    /// Exposes what `sample` reads.
    pub fn new(sample: Sampler) -> Exposition {
        Exposition {
            sample,
            posts: Vec::new(),
        }
    }

    /// Answers `POST path` with `action`, which writes files (`what`, for
    /// the answer: "dirty set(s)") and gives how many.
    pub fn with_post(
        mut self,
        path: &'static str,
        what: &'static str,
        action: Action,
    ) -> Exposition {
        self.posts.push((path, what, action));
        self
    }

    /// `POST path`: runs its action, the answer's text (`None`: no such
    /// action here).
    pub fn post(&self, path: &str) -> Option<String> {
        let (_, what, action) = self.posts.iter().find(|p| p.0 == path)?;
        Some(format!("wrote {} {what}\n", action()))
    }

    /// The OpenMetrics text of a fresh sample (ends with `# EOF`).
    pub fn text(self: &std::sync::Arc<Self>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String does not fail");
        out
    }
}

/// A peer's value in a family (`None`: no sample).
type V<'a> = &'a dyn Fn(&PeerSample) -> Option<f64>;

/// One series of a family per peer: its extra label, its value.
type Row<'a> = (Option<(&'a str, &'a str)>, V<'a>);

impl Exposition {
    fn peer_labels<'a>(
        snapshot: &'a str,
        p: &PeerSample,
        extra: Option<(&'a str, &'a str)>,
    ) -> Vec<(&'a str, String)> {
        let mut l = vec![
            ("peer", p.peer.to_string()),
            ("pid", p.pid.to_string()),
            ("snapshot", snapshot.to_string()),
        ];
        if let Some((k, v)) = extra {
            l.push((k, v.to_string()));
        }
        l
    }

    /// Encodes one family over every peer (several label values of `extra`
    /// in one family: `rows`).
    fn family(
        enc: &mut DescriptorEncoder,
        s: &Sample,
        name: &str,
        help: &str,
        kind: MetricType,
        rows: &[Row<'_>],
    ) -> fmt::Result {
        if s.peers.is_empty() {
            return Ok(());
        }
        let mut m = enc.encode_descriptor(name, help, None, kind)?;
        for p in &s.peers {
            for (extra, value) in rows {
                let Some(v) = value(p) else { continue };
                let labels = Self::peer_labels(&s.snapshot, p, *extra);
                let fam = m.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => ConstCounter::new(v as u64).encode(fam)?,
                    _ => ConstGauge::new(v).encode(fam)?,
                }
            }
        }
        Ok(())
    }
}

impl Exposition {
    /// Encodes a histogram family over the peers that have one.
    fn histogram(
        enc: &mut DescriptorEncoder,
        s: &Sample,
        name: &str,
        help: &str,
        of: &dyn Fn(&PeerSample) -> Option<&ServiceTimes>,
    ) -> fmt::Result {
        if !s.peers.iter().any(|p| of(p).is_some()) {
            return Ok(());
        }
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
        for p in &s.peers {
            let Some(t) = of(p) else { continue };
            let buckets: Vec<(f64, u64)> = SERVICE_BOUNDS_NS
                .iter()
                .map(|&b| b as f64 / 1e9)
                .chain([f64::INFINITY])
                .zip(t.counts)
                .collect();
            let labels = Self::peer_labels(&s.snapshot, p, None);
            m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                t.sum_ns as f64 / 1e9,
                t.count(),
                &buckets,
                None,
            )?;
        }
        Ok(())
    }
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = (self.sample)();
        let c = MetricType::Counter;
        let g = MetricType::Gauge;
        let st = |f: fn(&PeerStats) -> u64| move |p: &PeerSample| Some(f(&p.stats) as f64);
        let (read, write, minor, wp) = (
            st(|s| s.fault_kinds.read),
            st(|s| s.fault_kinds.write),
            st(|s| s.fault_kinds.minor),
            st(|s| s.fault_kinds.wp),
        );
        Self::family(
            &mut enc,
            &s,
            "faultline_peer_faults",
            "Fault messages read, by kind",
            c,
            &[
                (Some(("kind", "read")), &read as V),
                (Some(("kind", "write")), &write),
                (Some(("kind", "minor")), &minor),
                (Some(("kind", "wp")), &wp),
            ],
        )?;
        let demand = st(|s| s.demand_pages);
        let around = st(fault_around);
        let prefetch = st(|s| s.prefetched);
        let run_ahead = st(|s| s.run_ahead_pages);
        Self::family(
            &mut enc,
            &s,
            "faultline_peer_pages_installed",
            "Pages installed: on demand (the faulting page), by fault-around, by prefetch, by run-ahead",
            c,
            &[
                (Some(("by", "demand")), &demand as V),
                (Some(("by", "fault_around")), &around),
                (Some(("by", "prefetch")), &prefetch),
                (Some(("by", "run_ahead")), &run_ahead),
            ],
        )?;
        let singles: [(&str, &str, MetricType, V); 7] = [
            (
                "faultline_peer_store_read_bytes",
                "Bytes read from the store",
                c,
                &st(|s| s.bytes_read),
            ),
            (
                "faultline_peer_remove_events",
                "REMOVE events read",
                c,
                &st(|s| s.removes),
            ),
            (
                "faultline_peer_removed_pages",
                "Pages REMOVE events dropped",
                c,
                &st(|s| s.removed_pages),
            ),
            (
                "faultline_peer_eagain_retries",
                "Resolve ioctls that met EAGAIN (an event pending)",
                c,
                &st(|s| s.regions.retries),
            ),
            (
                "faultline_peer_deferred_faults",
                "Faults deferred after EAGAIN",
                c,
                &st(|s| s.deferred),
            ),
            (
                "faultline_peer_eexist",
                "Resolutions that found the page installed (EEXIST)",
                c,
                &st(|s| s.regions.exists),
            ),
            (
                "faultline_peer_prefetch_queued_pages",
                "Pages queued for prefetch",
                g,
                &st(|s| s.prefetch_queued),
            ),
        ];
        for (name, help, kind, v) in singles {
            Self::family(&mut enc, &s, name, help, kind, &[(None, v)])?;
        }
        let done = |p: &PeerSample| p.prefetch_done_s;
        Self::family(
            &mut enc,
            &s,
            "faultline_peer_prefetch_done_seconds",
            "Seconds from the handshake read to the last prefetch install",
            g,
            &[(None, &done)],
        )?;
        let dirty = |p: &PeerSample| p.dirty_pages.map(|n| n as f64);
        Self::family(
            &mut enc,
            &s,
            "faultline_peer_dirty_pages",
            "4 KiB pages of the peer's dirty set so far (written or removed since it was first served)",
            g,
            &[(None, &dirty)],
        )?;
        Self::histogram(
            &mut enc,
            &s,
            "faultline_peer_fault_service_seconds",
            "Fault service time: the message read to the wake",
            &|p| Some(&p.stats.service),
        )?;
        Self::histogram(
            &mut enc,
            &s,
            "faultline_peer_vcpu_stall_seconds",
            "vCPU stalls the peer reported: an access that waited for a missing page, to its retirement",
            &|p| p.vcpu_stalls.as_ref(),
        )?;
        let mut process: Vec<(&str, &str, MetricType, f64)> = vec![
            (
                "faultline_peers_connected",
                "Peers being served",
                g,
                s.peers.len() as f64,
            ),
            (
                "faultline_peers_accepted",
                "Connections accepted",
                c,
                s.accepted as f64,
            ),
            (
                "faultline_peers_finished",
                "Connections done with (refused, hung up, failed)",
                c,
                s.finished as f64,
            ),
        ];
        process.push((
            "faultline_peers_taken_over",
            "Peers taken over from the keeper (a serve before this one died)",
            c,
            s.taken_over as f64,
        ));
        process.push((
            "faultline_handler_busy_seconds",
            "The longest a handler thread has been on the fault it resolves now (0: none): above a second, its store read or the kernel is not returning, and the faults it would read next wait",
            g,
            s.longest_fault_s,
        ));
        if let Some((open, max)) = s.fds {
            // The names of Prometheus's own process collector, which
            // alerts on running out of descriptors already use.
            process.extend([
                (
                    "process_open_fds",
                    "Number of open file descriptors (a VMM served takes 3, 7 with --takeover)",
                    g,
                    open as f64,
                ),
                (
                    "process_max_fds",
                    "Maximum number of open file descriptors (RLIMIT_NOFILE, soft)",
                    g,
                    max as f64,
                ),
            ]);
        }
        if let Some(k) = s.keeper {
            process.extend([
                (
                    "faultline_keeper_down",
                    "1 while the keeper is gone and none could be started (retried): the peers are served on, but would hang should this serve die",
                    g,
                    f64::from(u8::from(k.down)),
                ),
                (
                    "faultline_keeper_peers",
                    "Peers deposited for takeover (held by the keeper, or waiting for the next one while it is down)",
                    g,
                    k.peers as f64,
                ),
                (
                    "faultline_keepers_replaced",
                    "Keepers started in place of dead ones",
                    c,
                    k.replaced as f64,
                ),
            ]);
            if let Some(room) = k.room {
                process.push((
                    "faultline_keeper_room_peers",
                    "Peers the keeper has room for at once (--fd-store: from FileDescriptorStoreMax=, 2 descriptors for serve and 4 a VMM); those past it are served without takeover",
                    g,
                    room as f64,
                ));
            }
        }
        if let Some(n) = s.unprotected {
            process.push((
                "faultline_peers_unprotected",
                "Peers served that the keeper does not hold (depositing them failed, said): should this serve die, they hang at their next missing page",
                g,
                n as f64,
            ));
        }
        for (name, help, kind, v) in process {
            let m = enc.encode_descriptor(name, help, None, kind)?;
            match kind {
                MetricType::Counter => ConstCounter::new(v as u64).encode(m)?,
                _ => ConstGauge::new(v).encode(m)?,
            }
        }
        let cpu = [
            (
                "faultline_handler_cpu_seconds",
                "CPU time of the handler threads (as of each one's last sleep or last 256 empty polls): what waiting for faults costs (--engine)",
                s.handler_cpu_s,
            ),
            (
                "faultline_prefetch_helpers_cpu_seconds",
                "CPU time of the prefetch helpers (as of each one's last wait or pass over the queues): prefetch, and pieces of long fault windows",
                s.helpers_cpu_s,
            ),
        ];
        for (name, help, v) in cpu {
            ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, c)?)?;
        }
        let mut m = enc.encode_descriptor(
            "faultline_handoffs_refused",
            "Hand-offs refused, by the step that refused them",
            None,
            c,
        )?;
        for (reason, n) in &s.refused {
            ConstCounter::new(*n).encode(m.encode_family(&[("reason", *reason)])?)?;
        }
        Ok(())
    }
}

/// Pages the faults' read-ahead windows installed beside the faulting
/// pages: installed less demand, prefetch and run-ahead pages.
fn fault_around(s: &PeerStats) -> u64 {
    s.regions
        .installed
        .saturating_sub(s.demand_pages + s.prefetched + s.run_ahead_pages)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use faultline::{FaultKinds, ServiceTimes};
    use prometheus_parse::{Scrape, Value};

    #[test]
    fn the_exposition_is_openmetrics_a_parser_reads_back() {
        let mut stats = PeerStats {
            fault_kinds: FaultKinds {
                read: 3,
                write: 4,
                minor: 0,
                wp: 0,
            },
            demand_pages: 7,
            prefetched: 10,
            prefetch_queued: 20,
            bytes_read: 4096 * 30,
            service: ServiceTimes::default(),
            ..Default::default()
        };
        stats.regions.installed = 30;
        stats.service.counts[0] = 5;
        stats.service.counts[3] = 2;
        stats.service.sum_ns = 15_000;
        let mut stalls = ServiceTimes::default();
        [30_000, 40_000, 2_000_000]
            .iter()
            .for_each(|&ns| stalls.record(ns));
        let counters = ServerCounters::default();
        counters.refused("handshake");
        counters.refused("handshake");
        let refused = counters.refusals();
        let e = Arc::new(Exposition::new(Box::new(move || Sample {
            snapshot: "/snap \"a\".mem".into(),
            peers: vec![PeerSample {
                peer: 3,
                pid: 77,
                stats,
                prefetch_done_s: Some(0.25),
                dirty_pages: Some(5),
                vcpu_stalls: Some(stalls),
            }],
            accepted: 4,
            finished: 3,
            refused: refused.clone(),
            handler_cpu_s: 0.25,
            helpers_cpu_s: 1.5,
            taken_over: 2,
            keeper: Some(KeeperStatus {
                down: true,
                replaced: 1,
                peers: 6,
                room: Some(9),
            }),
            unprotected: Some(1),
            fds: Some((40, 1024)),
            longest_fault_s: 2.5,
        })));
        let text = e.text();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let m = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        let get = |name: &str, k: Option<(&str, &str)>| -> &Value {
            &m.samples
                .iter()
                .find(|s| {
                    s.metric == name
                        && s.labels.get("peer").is_none_or(|p| p == "3")
                        && k.is_none_or(|(k, v)| s.labels.get(k) == Some(v))
                })
                .unwrap_or_else(|| panic!("no {name} {k:?} in\n{text}"))
                .value
        };
        let num = |v: &Value| match v {
            Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => *x,
            _ => panic!("{v:?}"),
        };
        assert_eq!(
            num(get("faultline_peer_faults_total", Some(("kind", "write")))),
            4.0
        );
        assert_eq!(
            num(get(
                "faultline_peer_pages_installed_total",
                Some(("by", "fault_around"))
            )),
            13.0,
            "30 installed less 7 demand and 10 prefetched"
        );
        assert_eq!(num(get("faultline_peer_prefetch_queued_pages", None)), 20.0);
        assert_eq!(num(get("faultline_peer_prefetch_done_seconds", None)), 0.25);
        assert_eq!(num(get("faultline_peer_dirty_pages", None)), 5.0);
        assert_eq!(num(get("faultline_peers_connected", None)), 1.0);
        assert_eq!(num(get("faultline_peers_taken_over_total", None)), 2.0);
        assert_eq!(num(get("faultline_keeper_down", None)), 1.0);
        assert_eq!(num(get("process_open_fds", None)), 40.0);
        assert_eq!(num(get("faultline_handler_busy_seconds", None)), 2.5);
        assert_eq!(num(get("process_max_fds", None)), 1024.0);
        assert_eq!(num(get("faultline_keeper_peers", None)), 6.0);
        assert_eq!(num(get("faultline_keeper_room_peers", None)), 9.0);
        assert_eq!(num(get("faultline_peers_unprotected", None)), 1.0);
        assert_eq!(num(get("faultline_keepers_replaced_total", None)), 1.0);
        assert_eq!(num(get("faultline_handler_cpu_seconds_total", None)), 0.25);
        assert_eq!(
            num(get("faultline_prefetch_helpers_cpu_seconds_total", None)),
            1.5
        );
        assert_eq!(
            num(get(
                "faultline_handoffs_refused_total",
                Some(("reason", "handshake"))
            )),
            2.0
        );
        let Value::Histogram(b) = get("faultline_peer_fault_service_seconds", None) else {
            panic!("not a histogram:\n{text}")
        };
        // Cumulative: 5 at 1 µs, 7 from 8 µs on, 7 at +Inf.
        assert_eq!(b.len(), SERVICE_BOUNDS_NS.len() + 1);
        assert_eq!((b[0].less_than, b[0].count), (1e-6, 5.0));
        assert_eq!(b[2].count, 5.0);
        assert_eq!(b[3].count, 7.0);
        assert!(b.last().unwrap().less_than.is_infinite());
        assert_eq!(b.last().unwrap().count, 7.0);
        assert_eq!(
            num(get("faultline_peer_fault_service_seconds_count", None)),
            7.0
        );
        let Value::Histogram(b) = get("faultline_peer_vcpu_stall_seconds", None) else {
            panic!("no stall histogram:\n{text}")
        };
        // Cumulative: 30 µs at most 32 µs (bucket 5), 40 µs at most 64,
        // 2 ms at most 2.05 ms (bucket 11).
        let counts: Vec<f64> = [4, 5, 6, 10, 11].iter().map(|&i| b[i].count).collect();
        assert_eq!(counts, [0.0, 1.0, 2.0, 2.0, 3.0]);
        assert_eq!(
            num(get("faultline_peer_vcpu_stall_seconds_count", None)),
            3.0
        );
        let s = m
            .samples
            .iter()
            .find(|s| s.metric == "faultline_peer_store_read_bytes_total")
            .unwrap();
        assert_eq!(s.labels.get("pid"), Some("77"));
        assert_eq!(s.labels.get("snapshot"), Some("/snap \\\"a\\\".mem"));
    }
}
