//! `faultline-serve record inspect|merge`: working-set records from the
//! shell (see [`crate::record`] for the format and the merge).
//!
//! ```text
//!   faultline-serve record inspect rec-1.txt              what it holds
//!   faultline-serve record merge -k 3 -o set.txt rec-*.txt   pages of >= 3 restores
//!   faultline-serve --prefetch set.txt ...                 installed on every restore
//!   faultline-serve record inspect dirty-1.txt            a dirty set (--track-dirty)
//! ```

use std::path::PathBuf;

use clap::{Args, Subcommand};
use faultline_cli_support::output::OutputPath;

use crate::dirty_set;
use crate::record::{self, Record};

/// `faultline-serve record ...`.
#[derive(Subcommand, Debug, Clone)]
pub enum RecordCmd {
    /// Say what records hold: version, memory file, recordings, pages,
    /// runs, the span of their first touches (of a dirty set, written by
    /// --track-dirty: memory file, pages, runs).
    Inspect(InspectArgs),
    /// Merge records of one memory file into one prefetch set: the pages
    /// touched in at least K of the N recordings, ordered by their median
    /// first-touch time.
    Merge(MergeArgs),
}

/// `record inspect`.
#[derive(Args, Debug, Clone)]
pub struct InspectArgs {
    /// Record files.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// One JSON object a file on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `record merge`.
#[derive(Args, Debug, Clone)]
pub struct MergeArgs {
    /// Record files (v2, of one memory file).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Keep the pages touched in at least K recordings (1: the union; N:
    /// the intersection). Default: a majority (N/2 + 1).
    #[arg(short, long)]
    pub k: Option<usize>,
    /// The merged record.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// What `inspect` says of one record.
#[derive(Debug, serde::Serialize)]
struct Summary {
    file: PathBuf,
    version: u32,
    memory_bytes: Option<u64>,
    fingerprint: Option<String>,
    recordings: u32,
    pages: usize,
    bytes: u64,
    runs: usize,
    first_touch_span_ms: f64,
}

fn summary(file: PathBuf, r: &Record) -> Summary {
    let mut sorted = r.offsets();
    sorted.sort_unstable();
    sorted.dedup();
    let runs =
        sorted.windows(2).filter(|w| w[1] != w[0] + 4096).count() + usize::from(!sorted.is_empty());
    let span = r.pages.iter().map(|p| p.first_touch_ns).max().unwrap_or(0);
    Summary {
        file,
        version: if r.identity.is_some() { 2 } else { 1 },
        memory_bytes: r.identity.map(|i| i.memory_bytes),
        fingerprint: r.identity.map(|i| format!("{:#018x}", i.fingerprint)),
        recordings: r.recordings,
        pages: r.pages.len(),
        bytes: r.pages.len() as u64 * 4096,
        runs,
        first_touch_span_ms: span as f64 / 1e6,
    }
}

/// What `inspect` says of one dirty set.
#[derive(Debug, serde::Serialize)]
struct DirtySummary {
    file: PathBuf,
    kind: &'static str,
    version: u32,
    memory_bytes: u64,
    fingerprint: String,
    pages: usize,
    bytes: u64,
    runs: usize,
}

/// `inspect` of a dirty set.
fn inspect_dirty(file: PathBuf, json: bool) -> anyhow::Result<()> {
    let d = dirty_set::read(&file)?;
    let s = DirtySummary {
        file,
        kind: "dirty-set",
        version: 1,
        memory_bytes: d.identity.memory_bytes,
        fingerprint: format!("{:#018x}", d.identity.fingerprint),
        pages: d.offsets.len(),
        bytes: d.offsets.len() as u64 * dirty_set::PAGE,
        runs: d.runs(),
    };
    if json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "{}: dirty set v{}, memory file of {} bytes, fingerprint {}, {} pages ({:.1} MiB) in {} runs",
            s.file.display(),
            s.version,
            s.memory_bytes,
            s.fingerprint,
            s.pages,
            s.bytes as f64 / (1 << 20) as f64,
            s.runs
        );
    }
    Ok(())
}

/// Runs `faultline-serve record CMD`.
pub fn run(cmd: RecordCmd) -> anyhow::Result<()> {
    match cmd {
        RecordCmd::Inspect(a) => {
            for f in a.files {
                if dirty_set::is_dirty_set(&f) {
                    inspect_dirty(f, a.json)?;
                    continue;
                }
                let r = record::read_record(&f)?;
                let s = summary(f, &r);
                if a.json {
                    println!("{}", serde_json::to_string(&s)?);
                    continue;
                }
                println!(
                    "{}: v{}, {}, {} recording(s), {} pages ({:.1} MiB) in {} runs, first touches over {:.1} ms",
                    s.file.display(),
                    s.version,
                    match (s.memory_bytes, &s.fingerprint) {
                        (Some(b), Some(fp)) => format!("memory file of {b} bytes, fingerprint {fp}"),
                        _ => "no memory file named (unchecked)".into(),
                    },
                    s.recordings,
                    s.pages,
                    s.bytes as f64 / (1 << 20) as f64,
                    s.runs,
                    s.first_touch_span_ms
                );
            }
            Ok(())
        }
        RecordCmd::Merge(a) => {
            let out = OutputPath::check(&a.output, "--output")?;
            // A record it replaces, yes (a set merged with what came
            // after it); any other file, never (a memory file named by
            // mistake).
            if !out.is_null() && out.target().exists() && !record::is_record(out.target()) {
                anyhow::bail!(
                    "--output {}: exists and is not a working-set record: not replaced; remove it first or give another path",
                    a.output.display()
                );
            }
            let records = a
                .files
                .iter()
                .map(|f| Ok((f.clone(), record::read_record(f)?)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let n: usize = records.iter().map(|(_, r)| r.recordings as usize).sum();
            let k = a.k.unwrap_or(n / 2 + 1);
            let merged = record::merge(&records, k)?;
            out.write(|w| record::encode(&merged, w))?;
            let union: std::collections::HashSet<u64> =
                records.iter().flat_map(|(_, r)| r.offsets()).collect();
            eprintln!(
                "record merge: {} pages touched in at least {k} of {n} recordings (of {} touched in any) -> {}",
                merged.pages.len(),
                union.len(),
                a.output.display()
            );
            Ok(())
        }
    }
}
