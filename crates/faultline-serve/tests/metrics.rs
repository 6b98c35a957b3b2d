//! `--metrics` during a real restore (serve and `faultline-peer` as
//! processes): the counters a scrape reads equal what the peer reports of
//! its restore and what serve's summary says at its end, and the vCPU
//! stalls the peer sent serve show mid-restore and in the end equal the
//! ones it measured; the exposition
//! parses with a Prometheus text parser; `--log-format json` lines parse.

use faultline_serve::metrics::{scrape, MetricsAddr};
use faultline_serve::peer::report::PeerReport;
use faultline_serve::testing::{self, assert_ok, Dir};
use prometheus_parse::{Scrape, Value};

const SERVE: &[&str] = &[env!("CARGO_BIN_EXE_faultline-serve")];
const PEER: &[&str] = &[env!("CARGO_BIN_EXE_faultline-peer")];
const MIB: usize = 1 << 20;

/// The value of `name` with `labels` (a counter's `_total`, a gauge, or
/// a histogram's count) in `s`.
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let hit = s
        .samples
        .iter()
        .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no {name} {labels:?} in the scrape"));
    match &hit.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        Value::Histogram(b) => b.last().map_or(0.0, |c| c.count),
        Value::Summary(_) => panic!("{name} is a summary"),
    }
}

#[test]
fn a_scrape_mid_restore_matches_the_peers_report_and_parses() {
    let dir = Dir::new("metrics", 16 * MIB);
    let msock = dir.path("metrics.sock");
    let json = dir.path("serve.json");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &[
            "--peers",
            "2",
            "--fault-around",
            "0",
            "--metrics",
            msock.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
            "--log-format",
            "json",
        ],
    );
    // A refused hand-off first (malformed JSON): serve kills that peer.
    let mut bad = testing::peer(&dir, PEER, "bad", &["--bad", "json"]);
    {
        use std::os::unix::process::ExitStatusExt;
        let st = bad.wait(testing::WAIT);
        assert_eq!(st.signal(), Some(9), "{st}: {}", dir.text("serve.err"));
    }
    let report_path = dir.path("peer.json");
    let mut p = testing::peer(
        &dir,
        PEER,
        "peer",
        &[
            "--working-set",
            "20",
            "--threads",
            "1",
            "--pause-at",
            "50",
            "--pause-ms",
            "3000",
            "--hold-ms",
            "4000",
            "--stall-ns",
            "1000",
            "--json",
            report_path.to_str().unwrap(),
        ],
    );
    // Mid-restore (the vCPU paused half-way): its stalls so far are in.
    dir.wait_for("peer.err", "paused after");
    let stalls_now = || {
        let text = scrape(&MetricsAddr::Unix(msock.clone())).expect("scraping --metrics");
        let m = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parsing");
        m.samples.iter().find_map(|x| match x.value {
            Value::Untyped(n) | Value::Counter(n)
                if x.metric == "faultline_peer_vcpu_stall_seconds_count" =>
            {
                Some(n as u64)
            }
            _ => None,
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mid = loop {
        match stalls_now() {
            Some(n) if n > 0 => break n,
            _ if std::time::Instant::now() > deadline => {
                panic!("no stalls while the vCPU paused: {}", dir.text("serve.err"))
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    };
    dir.wait_for("peer.err", "holding for");
    let report: PeerReport =
        serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    let pid = p.pid().to_string();
    let me = [("peer", "2"), ("pid", pid.as_str())];
    // The stall report was written before "holding for"; serve reads it
    // on its own time: scrape until it is in.
    let deadline = std::time::Instant::now() + testing::WAIT;
    let (text, m) = loop {
        let text = scrape(&MetricsAddr::Unix(msock.clone())).expect("scraping --metrics");
        assert!(text.ends_with("# EOF\n"), "not OpenMetrics text:\n{text}");
        let m = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parsing the scrape");
        let in_ = m.samples.iter().any(|x| {
            x.metric == "faultline_peer_vcpu_stall_seconds_count"
                && matches!(x.value, Value::Untyped(n) | Value::Counter(n) if n as u64 == report.stalls)
        });
        if in_ {
            break (text, m);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the peer's {} stalls never showed:\n{text}\n{}",
            report.stalls,
            dir.text("serve.err")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        mid < report.stalls,
        "{mid} stalls mid-restore, {} in all",
        report.stalls
    );
    // With one page per fault every first touch waits for serve.
    assert!(
        report.stalls as usize > report.pages * 9 / 10,
        "{} stalls for {} pages",
        report.stalls,
        report.pages
    );
    let stall_sum = value(&m, "faultline_peer_vcpu_stall_seconds_sum", &me);
    assert!(
        (stall_sum - report.stall_sum_ns as f64 / 1e9).abs() < 1e-6,
        "{stall_sum} s against the peer's {} ns",
        report.stall_sum_ns
    );
    let with = |k: &'static str, v: &'static str| [me[0], me[1], (k, v)];
    let pages = report.pages as f64;
    assert!(pages > 500.0, "{report:?}");
    let faults: f64 = ["read", "write", "minor", "wp"]
        .iter()
        .map(|k| value(&m, "faultline_peer_faults_total", &with("kind", k)))
        .sum();
    // One fault per working-set page (one page per fault: --fault-around 0),
    // each page installed on demand and read from the memory file once.
    assert_eq!(faults, pages, "{text}");
    assert_eq!(
        value(
            &m,
            "faultline_peer_pages_installed_total",
            &with("by", "demand")
        ),
        pages
    );
    for by in ["fault_around", "prefetch", "run_ahead"] {
        assert_eq!(
            value(&m, "faultline_peer_pages_installed_total", &with("by", by)),
            0.0,
            "{by}"
        );
    }
    assert_eq!(
        value(&m, "faultline_peer_store_read_bytes_total", &me),
        pages * 4096.0
    );
    assert_eq!(
        value(&m, "faultline_peer_fault_service_seconds", &me),
        faults,
        "every fault's service is in the histogram"
    );
    assert_eq!(value(&m, "faultline_peer_remove_events_total", &me), 0.0);
    assert_eq!(value(&m, "faultline_peers_connected", &[]), 1.0);
    assert_eq!(value(&m, "faultline_peers_accepted_total", &[]), 2.0);
    // The handler thread served every fault (its CPU published when it
    // slept, the vCPU holding); the helpers' counter is there beside it.
    let handler_cpu = value(&m, "faultline_handler_cpu_seconds_total", &[]);
    assert!(handler_cpu > 0.0, "{text}");
    assert!(value(&m, "faultline_prefetch_helpers_cpu_seconds_total", &[]) >= 0.0);
    assert_eq!(
        value(
            &m,
            "faultline_handoffs_refused_total",
            &[("reason", "handshake")]
        ),
        1.0
    );
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    // Serve's own summary at the peer's end says the same.
    let sums: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sum = sums
        .iter()
        .find(|x| x["peer"] == 2)
        .expect("peer 2's summary");
    assert_eq!(sum["faults"].as_f64(), Some(faults));
    assert_eq!(sum["installed"].as_f64(), Some(pages));
    assert_eq!(sum["bytes_read"].as_f64(), Some(pages * 4096.0));
    assert_eq!(sum["vcpu_stalls"]["count"].as_u64(), Some(report.stalls));
    // CPU time only grows: the summary's is at least the scrape's.
    assert!(
        sum["handler_cpu_ms"].as_f64().unwrap() / 1e3 >= handler_cpu - 1e-9,
        "{sum} against {handler_cpu} s scraped"
    );
    // Every line serve printed is a JSON object with a message; the
    // socket is gone.
    let log = dir.text("serve.err");
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        assert!(v["msg"].is_string() && v["time"].is_f64(), "{line}");
    }
    assert!(log.contains("metrics on unix:"), "{log}");
    assert!(!msock.exists(), "the metrics socket outlived serve");
    // The line that ends serve is one too (an error object), and with
    // --takeover the keeper's lines, on the same stderr.
    let mut s = testing::start(
        &dir,
        "ends",
        SERVE,
        &[
            "--timeout",
            "1",
            "--takeover",
            "--keeper-wait",
            "1",
            "--log-format",
            "json",
        ],
    );
    assert!(!s.wait(testing::WAIT).success());
    dir.wait_for("ends.err", "no peer and no serve: exiting");
    let log = dir.text("ends.err");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|v| v["level"] == "error"
                && v["msg"].as_str().unwrap().contains("no peer connected")),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["source"] == "faultline serve keeper"),
        "{log}"
    );
}

/// A handler thread held on one fault (its store read not returning: a
/// failpoint sleeps 2.5 s in it): serve says so once it has been a
/// second, `faultline_handler_busy_seconds` shows it meanwhile, serve
/// says when the thread is back, and the peer finishes with every byte
/// right.
#[test]
fn a_handler_thread_held_on_one_fault_is_said_and_shown() {
    let dir = Dir::new("stuck", 16 * MIB);
    let msock = dir.path("metrics.sock");
    let extra = ["--timeout", "20", "--peers", "1", "--metrics"];
    let args = testing::command(&dir, &[&extra[..], &[msock.to_str().unwrap()]].concat());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [(faultline_sys::failpoint::ENV, "fault-read:20!sleep=2500")];
    let mut s = testing::Proc::start_with_env("serve", SERVE, &args, &env, &dir.path("serve.err"));
    dir.wait_for("serve.err", "listening on");
    let mut p = testing::peer(&dir, PEER, "p", &["--threads", "2", "--verify-all"]);
    dir.wait_for("serve.err", "has been on one fault of peer 1");
    let text = scrape(&MetricsAddr::Unix(msock.clone())).expect("scraping --metrics");
    let m = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parsing the scrape");
    let busy = value(&m, "faultline_handler_busy_seconds", &[]);
    assert!((1.0..2.5).contains(&busy), "{busy}\n{text}");
    dir.wait_for("serve.err", "handler thread 0 is back, after 2.");
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let log = dir.text("serve.err");
    assert_eq!(log.matches("has been on one fault").count(), 1, "{log}");
}
