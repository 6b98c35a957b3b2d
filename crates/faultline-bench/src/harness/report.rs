//! Benchmark results: JSON records, the machine description, and text tables.
//!
//! Every sub-bench turns its measurements into [`Record`]s and pushes them onto the
//! shared [`Report`]; `faultline bench --json FILE` writes
//! `{"machine": {...}, "records": [...]}`. Bench-specific figures (pages per fault,
//! threads, phase cycles...) go into [`Record::extra`], which is flattened into the
//! record's JSON object.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::stats::Summary;
use super::tsc::Tsc;

/// Mechanism name of the reference every `ratio_to_kernel` is taken against.
pub const KERNEL_REFERENCE: &str = "kernel-anon-write";

/// One measured configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Sub-bench name: `kernel`, `notify`, `seq`, `scale`, `latency`, ...
    pub bench: String,
    /// Engine (`poll`, `spin`, `signal`, `workers`) or kernel path
    /// (`kernel-anon-write`, `kernel-file-warm`, ...) or notification mechanism.
    pub mechanism: String,
    /// Resolve operation (`COPY`, `ZEROPAGE`, `MOVE`, `CONTINUE`), `-` if none.
    pub op: String,
    /// `read` or `write` (`-` if not an access).
    pub access: String,
    /// Number of samples.
    pub n: usize,
    /// Mean, ns. This and the other figures below are NaN where nothing
    /// was measured (the record's summary has no such figure): `null` in
    /// the JSON, `-` in tables.
    #[serde(deserialize_with = "nan_if_null")]
    pub mean_ns: f64,
    /// Median, ns.
    #[serde(deserialize_with = "nan_if_null")]
    pub median_ns: f64,
    /// 99th percentile, ns.
    #[serde(deserialize_with = "nan_if_null")]
    pub p99_ns: f64,
    /// 99.9th percentile, ns.
    #[serde(deserialize_with = "nan_if_null")]
    pub p999_ns: f64,
    /// Maximum, ns.
    #[serde(deserialize_with = "nan_if_null")]
    pub max_ns: f64,
    /// Minimum, ns.
    #[serde(deserialize_with = "nan_if_null")]
    pub min_ns: f64,
    /// Sample standard deviation, ns.
    #[serde(deserialize_with = "nan_if_null")]
    pub std_ns: f64,
    /// `median_ns` / median of the `kernel-anon-write` record of the same report.
    pub ratio_to_kernel: Option<f64>,
    /// Bench-specific figures, flattened into the JSON object.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A figure of a record: `null` (what serde_json writes for NaN) reads
/// back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl Record {
    /// A record from a latency summary; `ratio_to_kernel` is filled in later by
    /// [`Report::apply_kernel_ratios`].
    pub fn new(bench: &str, mechanism: &str, op: &str, access: &str, s: &Summary) -> Record {
        Record {
            bench: bench.into(),
            mechanism: mechanism.into(),
            op: op.into(),
            access: access.into(),
            n: s.n,
            mean_ns: s.mean,
            median_ns: s.median,
            p99_ns: s.p99,
            p999_ns: s.p999,
            max_ns: s.max,
            min_ns: s.min,
            std_ns: s.std,
            ratio_to_kernel: None,
            extra: Map::new(),
        }
    }

    /// Add a bench-specific figure (builder style).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Record {
        self.extra.insert(key.into(), value.into());
        self
    }

    /// A bench-specific figure as f64, if present and numeric.
    pub fn extra_f64(&self, key: &str) -> Option<f64> {
        self.extra.get(key).and_then(Value::as_f64)
    }
}

/// Description of the machine a report was measured on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// `model name` from /proc/cpuinfo.
    pub cpu: String,
    /// CPUs this process may run on.
    pub nproc: usize,
    /// Calibrated TSC frequency.
    pub tsc_ghz: f64,
    /// Cost of an empty `rdtsc` pair, cycles (included in every timed access).
    pub tsc_overhead_cycles: u64,
    /// UTC date and time of the run, ISO 8601.
    pub date: String,
    /// Whether this guest reports freed memory to its host (a
    /// virtio-balloon device with free page reporting): the host drops
    /// that memory, and the next process to allocate it pays a host fault
    /// per page, seen as its own system time. None: no balloon device.
    #[serde(default)]
    pub free_page_reporting: Option<bool>,
    /// CPUs online (the load averages count runnable threads against
    /// these; `nproc` is those this process may run on).
    #[serde(default)]
    pub online_cpus: Option<usize>,
    /// The 1, 5 and 15-minute load averages when the run started
    /// (`/proc/loadavg`): other work on the machine, sharing its CPUs
    /// with the bench.
    #[serde(default)]
    pub loadavg_start: Option<[f64; 3]>,
    /// ... and when it ended (set by `BenchCtx::finish`).
    #[serde(default)]
    pub loadavg_end: Option<[f64; 3]>,
}

impl Machine {
    /// Describe this machine.
    pub fn detect(tsc: &Tsc) -> Machine {
        Machine {
            kernel: faultline_sys::kernel_release(),
            cpu: cpu_model(),
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            tsc_ghz: tsc.ghz(),
            tsc_overhead_cycles: tsc.overhead_cycles,
            date: utc_iso8601(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            ),
            free_page_reporting: free_page_reporting(),
            online_cpus: Some(faultline_sys::thread::online_cpus()),
            loadavg_start: loadavg(),
            loadavg_end: None,
        }
    }

    /// The line that says how loaded the machine was: the load averages
    /// at the start and the end of the run, against its CPUs.
    pub fn load_line(&self) -> String {
        let show = |l: Option<[f64; 3]>| {
            l.map_or("unknown".into(), |[a, b, c]| {
                format!("{a:.2} {b:.2} {c:.2}")
            })
        };
        format!(
            "load average (1/5/15 min): {} at the start, {} at the end; {} CPUs online",
            show(self.loadavg_start),
            show(self.loadavg_end),
            self.online_cpus
                .map_or_else(|| "?".to_string(), |n| n.to_string())
        )
    }
}

/// The 1, 5 and 15-minute load averages of this machine, if
/// `/proc/loadavg` reads.
pub fn loadavg() -> Option<[f64; 3]> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

/// The three load averages of a `/proc/loadavg` line
/// (`0.52 0.58 0.59 1/467 12345`).
fn parse_loadavg(s: &str) -> Option<[f64; 3]> {
    let mut it = s.split_whitespace().map(str::parse::<f64>);
    let mut v = [0.0; 3];
    for x in &mut v {
        *x = it.next()?.ok().filter(|x| x.is_finite() && *x >= 0.0)?;
    }
    Some(v)
}

/// `VIRTIO_BALLOON_F_REPORTING` of this machine's virtio-balloon devices
/// (sysfs `features`: one character per feature bit); None without one.
pub fn free_page_reporting() -> Option<bool> {
    const F_REPORTING: usize = 5;
    let dir = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon").ok()?;
    let mut found = None;
    for e in dir.flatten() {
        if let Ok(bits) = std::fs::read_to_string(e.path().join("features")) {
            let on = bits.as_bytes().get(F_REPORTING) == Some(&b'1');
            found = Some(found.unwrap_or(false) || on);
        }
    }
    found
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Format seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_iso8601(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// All records of one `faultline bench` run plus the machine they came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Where the numbers were measured.
    pub machine: Machine,
    /// Every measured configuration, in run order.
    pub records: Vec<Record>,
}

impl Report {
    /// An empty report for this machine.
    pub fn new(tsc: &Tsc) -> Report {
        Report {
            machine: Machine::detect(tsc),
            records: Vec::new(),
        }
    }

    /// Append a record.
    pub fn push(&mut self, r: Record) {
        self.records.push(r);
    }

    /// Median of the first `kernel-anon-write` record, if one was measured.
    pub fn kernel_median(&self) -> Option<f64> {
        self.records
            .iter()
            .find(|r| r.mechanism == KERNEL_REFERENCE)
            .map(|r| r.median_ns)
    }

    /// Set `ratio_to_kernel` on every record whose bench is in `benches` (fault
    /// latency benches; ratios make no sense for e.g. `notify`). No-op without a
    /// kernel reference.
    pub fn apply_kernel_ratios(&mut self, benches: &[&str]) {
        let Some(k) = self.kernel_median().filter(|&k| k > 0.0) else {
            return;
        };
        for r in &mut self.records {
            if benches.contains(&r.bench.as_str()) {
                r.ratio_to_kernel = Some(r.median_ns / k);
            }
        }
    }

    /// Write the report as pretty JSON to `path` (`--json`: through
    /// `OutputPath`, a temporary renamed over it once whole; its directory
    /// must exist).
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        faultline_cli_support::OutputPath::check(path, "--json")?.write(|w| {
            serde_json::to_writer_pretty(&mut *w, self)?;
            w.write_all(b"\n")
        })
    }
}

/// Format a duration in ns: `850 ns`, `3.05 us`, `61.2 us`, `1.25 ms`, `2.00 s`.
pub fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        return "-".into();
    }
    let a = ns.abs();
    if a < 1_000.0 {
        format!("{ns:.0} ns")
    } else if a < 100_000.0 {
        format!("{:.2} us", ns / 1e3)
    } else if a < 1_000_000.0 {
        format!("{:.1} us", ns / 1e3)
    } else if a < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Format a count with thousands separators: `100000` -> `100,000`.
pub fn fmt_count(v: u64) -> String {
    let s = v.to_string();
    // Leading group of 1-3 digits, then groups of exactly 3.
    let first = match s.len() % 3 {
        0 => 3,
        r => r,
    }
    .min(s.len());
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    out.push_str(&s[..first]);
    for group in s.as_bytes()[first..].chunks(3) {
        out.push(',');
        out.extend(group.iter().map(|&b| char::from(b)));
    }
    out
}

/// Format a ratio: `0.52x`, `12.3x`, `1,234x`.
pub fn fmt_ratio(r: f64) -> String {
    if r < 10.0 {
        format!("{r:.2}x")
    } else if r < 100.0 {
        format!("{r:.1}x")
    } else {
        format!("{}x", fmt_count(r.round() as u64))
    }
}

/// The thread count a scaling table's speedups are taken against: one
/// thread when it was measured, else the fewest threads measured (named
/// in the column and the JSON key, so a speedup never claims a base it
/// does not have). Not the first count listed: `--threads 2,1` made the
/// 2-thread row "1.00x vs 1 thread".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeedupBase(pub usize);

impl SpeedupBase {
    /// The base of thread counts `counts` (None: no counts).
    pub fn of(counts: &[usize]) -> Option<SpeedupBase> {
        counts.iter().copied().min().map(SpeedupBase)
    }

    /// `1 thread`, `2 threads`.
    fn threads(self) -> String {
        match self.0 {
            1 => "1 thread".into(),
            n => format!("{n} threads"),
        }
    }

    /// The table column: `vs 1 thread`, `vs 2 threads`.
    pub fn column(self) -> String {
        format!("vs {}", self.threads())
    }

    /// The JSON key: `speedup_vs_1_thread`, `speedup_vs_2_threads`.
    pub fn json_key(self) -> String {
        format!("speedup_vs_{}", self.threads().replace(' ', "_"))
    }

    /// The rate measured at the base count in `(threads, rate)` points
    /// (the first, if a count was measured twice).
    pub fn rate(self, points: &[(usize, f64)]) -> Option<f64> {
        points.iter().find(|p| p.0 == self.0).map(|p| p.1)
    }
}

/// Render an aligned table: first column left-aligned, the others right-aligned.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cols = headers.len();
    let mut width: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate().take(cols) {
            let pad = width[i].saturating_sub(c.chars().count());
            if i > 0 {
                s.push_str("  ");
            }
            if i == 0 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(&mut headers.iter().copied());
    let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
    out.push_str(&"-".repeat(total));
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// Print an aligned table to stdout.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", render_table(headers, rows));
}

/// Columns of [`print_latency_table`].
pub const LATENCY_HEADERS: [&str; 11] = [
    "mechanism",
    "op",
    "access",
    "n",
    "mean",
    "median",
    "p99",
    "p99.9",
    "max",
    "std",
    "vs kernel",
];

/// One row of [`print_latency_table`].
pub fn latency_row(r: &Record) -> Vec<String> {
    vec![
        r.mechanism.clone(),
        r.op.clone(),
        r.access.clone(),
        fmt_count(r.n as u64),
        fmt_ns(r.mean_ns),
        fmt_ns(r.median_ns),
        fmt_ns(r.p99_ns),
        fmt_ns(r.p999_ns),
        fmt_ns(r.max_ns),
        fmt_ns(r.std_ns),
        r.ratio_to_kernel.map_or_else(|| "-".into(), fmt_ratio),
    ]
}

/// Print the latency columns of `records` (ratio is the median over the
/// `kernel-anon-write` median).
pub fn print_latency_table(records: &[Record]) {
    let rows: Vec<Vec<String>> = records.iter().map(latency_row).collect();
    print_table(&LATENCY_HEADERS, &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(median: f64) -> Summary {
        Summary {
            n: 10,
            mean: median,
            median,
            p99: median,
            p999: median,
            max: median,
            min: median,
            std: 0.0,
        }
    }

    #[test]
    fn dates() {
        assert_eq!(utc_iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_iso8601(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn load_averages_are_read_and_shown() {
        assert_eq!(
            parse_loadavg("0.52 0.58 1.59 1/467 12345\n"),
            Some([0.52, 0.58, 1.59])
        );
        assert_eq!(parse_loadavg("0.52 x 1.59"), None);
        assert_eq!(parse_loadavg(""), None);
        let l = loadavg().expect("/proc/loadavg reads");
        assert!(l.iter().all(|x| *x >= 0.0), "{l:?}");
        let mut m = Machine::detect(&Tsc::from_ghz(2.0));
        assert!(m.loadavg_start.is_some() && m.online_cpus.unwrap() >= 1);
        m.loadavg_start = Some([1.0, 2.5, 3.25]);
        m.loadavg_end = Some([2.0, 2.0, 3.0]);
        m.online_cpus = Some(2);
        assert_eq!(
            m.load_line(),
            "load average (1/5/15 min): 1.00 2.50 3.25 at the start, 2.00 2.00 3.00 at the end; 2 CPUs online"
        );
    }

    #[test]
    fn speedups_are_against_one_thread_or_say_what_they_are_against() {
        let b = SpeedupBase::of(&[2, 1, 4]).unwrap();
        assert_eq!(b, SpeedupBase(1));
        assert_eq!(b.column(), "vs 1 thread");
        assert_eq!(b.json_key(), "speedup_vs_1_thread");
        assert_eq!(b.rate(&[(2, 300.0), (1, 100.0), (4, 500.0)]), Some(100.0));
        let b = SpeedupBase::of(&[4, 2, 8]).unwrap();
        assert_eq!(b.column(), "vs 2 threads");
        assert_eq!(b.json_key(), "speedup_vs_2_threads");
        assert_eq!(b.rate(&[(4, 3.0)]), None);
        assert_eq!(SpeedupBase::of(&[]), None);
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_ns(850.4), "850 ns");
        assert_eq!(fmt_ns(3050.0), "3.05 us");
        assert_eq!(fmt_ns(185_000.0), "185.0 us");
        assert_eq!(fmt_ns(1_250_000.0), "1.25 ms");
        assert_eq!(fmt_count(100_000), "100,000");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(1_234_567), "1,234,567");
        assert_eq!(fmt_ratio(0.5), "0.50x");
        assert_eq!(fmt_ratio(1234.4), "1,234x");
    }

    #[test]
    fn table_is_aligned() {
        let t = render_table(
            &["a", "bb"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["q".into(), "22222".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "a       bb");
        assert_eq!(lines[1], "----------");
        assert_eq!(lines[2], "xyz      1");
        assert_eq!(lines[3], "q    22222");
    }

    #[test]
    fn json_flattens_extra_and_ratios() {
        let tsc = Tsc::from_ghz(2.0);
        let mut rep = Report::new(&tsc);
        rep.push(Record::new(
            "kernel",
            KERNEL_REFERENCE,
            "-",
            "write",
            &summary(1000.0),
        ));
        rep.push(
            Record::new("latency", "spin", "COPY", "write", &summary(3000.0)).with("threads", 1),
        );
        rep.push(Record::new("notify", "futex", "-", "-", &summary(5000.0)));
        rep.apply_kernel_ratios(&["kernel", "latency"]);
        assert_eq!(rep.records[0].ratio_to_kernel, Some(1.0));
        assert_eq!(rep.records[1].ratio_to_kernel, Some(3.0));
        assert_eq!(rep.records[2].ratio_to_kernel, None);
        let v = serde_json::to_value(&rep).unwrap();
        assert_eq!(v["records"][1]["threads"], 1);
        assert_eq!(v["records"][1]["op"], "COPY");
        assert!(v["machine"]["tsc_ghz"].as_f64().unwrap() == 2.0);
        let mut v = v;
        // Reports written before the field existed still read.
        for field in [
            "free_page_reporting",
            "online_cpus",
            "loadavg_start",
            "loadavg_end",
        ] {
            v["machine"].as_object_mut().unwrap().remove(field);
        }
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back.records[1].extra_f64("threads"), Some(1.0));
        assert_eq!(back.machine.free_page_reporting, None);
    }

    /// Figures that were not measured are NaN in a record: `null` in the
    /// JSON (never a number standing for nothing), read back as NaN, `-`
    /// in a table.
    #[test]
    fn unmeasured_figures_are_null() {
        let s = Summary {
            n: 5,
            median: 100.0,
            p99: 900.0,
            ..Summary::NONE
        };
        let mut rep = Report::new(&Tsc::from_ghz(2.0));
        rep.push(Record::new("restore", "kernel", "kernel", "read", &s));
        let text = serde_json::to_string(&rep).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let r = &v["records"][0];
        assert_eq!(r["median_ns"], 100.0);
        assert_eq!(r["p99_ns"], 900.0);
        for f in ["mean_ns", "p999_ns", "max_ns", "min_ns", "std_ns"] {
            assert!(r[f].is_null(), "{f}: {r}");
        }
        let back: Report = serde_json::from_str(&text).unwrap();
        assert!(back.records[0].max_ns.is_nan());
        assert_eq!(back.records[0].p99_ns, 900.0);
        let row = latency_row(&back.records[0]);
        assert_eq!(row[8], "-", "max: {row:?}");
    }
}
