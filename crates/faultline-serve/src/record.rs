//! The working-set record: the store offsets of the pages restores
//! touched, each with when it was first touched, made for one memory file.
//!
//! ```text
//! # faultline working set v2
//! # memory-bytes 1073741824
//! # fingerprint 0x6a09e667f3bcc908
//! # recordings 5
//! 0x1a000 0 5          <- store offset, first touch (ns after the record's
//! 0x0 81250 4             first; merged: the median), recordings that touched it
//! ...
//! ```
//!
//! 1. **Recording.** `faultline-serve --record FILE` writes one when a
//!    peer that records hangs up: the pages in the order it first
//!    touched them. With `{peer}` in FILE every peer records, each to
//!    its own file (`rec-{peer}.txt` -> `rec-3.txt`); without, the first.
//! 2. **Checked.** A record names the memory file it was made for: its
//!    size and a fingerprint of its bytes ([`Identity`]: FNV-1a over the
//!    size and 64 pages spread over the file). `--prefetch` refuses a
//!    record made for another file; `merge` refuses to mix them. A v1 file
//!    (offsets only, no identity: written by [`write()`] for synthetic sets)
//!    is read unchecked.
//! 3. **Merging** ([`merge`]): of n records, the pages touched in at
//!    least k, ordered by their median first-touch time: one set for the
//!    restores to come, without the pages only one restore happened to
//!    touch. `faultline-serve record merge|inspect` runs it from the shell.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use faultline::PageStore;
use faultline_cli_support::OutputPath;

const HEADER_V1: &str = "# faultline working set v1";
const HEADER_V2: &str = "# faultline working set v2";

/// Pages sampled into a fingerprint.
const SAMPLES: u64 = 64;

/// Bytes of a sampled page.
const PAGE: u64 = 4096;

/// The memory file a record was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Its size.
    pub memory_bytes: u64,
    /// FNV-1a of its size and 64 pages spread over it.
    pub fingerprint: u64,
}

/// One page of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Its store offset.
    pub offset: u64,
    /// When it was first touched, ns after the record's first touch (a
    /// merged record: the median over the records that touched it).
    pub first_touch_ns: u64,
    /// How many recordings touched it.
    pub seen: u32,
}

/// A working-set record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The memory file it was made for (`None`: a v1 record).
    pub identity: Option<Identity>,
    /// The restores recorded in it (merged: n).
    pub recordings: u32,
    /// Its pages, in install order (first touch).
    pub pages: Vec<Page>,
}

impl Record {
    /// A record of one restore: `touches` are (store offset,
    /// `CLOCK_MONOTONIC` ns) in first-touch order.
    pub fn of_restore(identity: Identity, touches: &[(u64, u64)]) -> Record {
        let t0 = touches.iter().map(|t| t.1).min().unwrap_or(0);
        Record {
            identity: Some(identity),
            recordings: 1,
            pages: touches
                .iter()
                .map(|&(offset, ns)| Page {
                    offset,
                    first_touch_ns: ns - t0,
                    seen: 1,
                })
                .collect(),
        }
    }

    /// Its store offsets, in install order.
    pub fn offsets(&self) -> Vec<u64> {
        self.pages.iter().map(|p| p.offset).collect()
    }

    /// Refuses the record (read from `path`) unless it was made for the
    /// memory file `memory` is; a v1 record passes (it names none).
    /// Its pages must lie in the memory file, on page boundaries (a v1
    /// record is checked for that too).
    pub fn check(&self, path: &Path, memory: Identity) -> Result<(), RecordError> {
        if let Some(id) = self.identity.filter(|&id| id != memory) {
            return Err(RecordError::OtherMemory {
                path: path.into(),
                made_for: id,
                memory,
            });
        }
        let bad = |o: u64| !o.is_multiple_of(PAGE) || o >= memory.memory_bytes;
        match self
            .pages
            .iter()
            .map(|p| p.offset)
            .filter(|&o| bad(o))
            .collect::<Vec<_>>()[..]
        {
            [] => Ok(()),
            [first, ..] => Err(RecordError::Offsets {
                path: path.into(),
                bad: self.pages.iter().filter(|p| bad(p.offset)).count(),
                first,
                memory_bytes: memory.memory_bytes,
            }),
        }
    }
}

/// Why a record could not be written, read or merged.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Checking or writing the output failed (see [`OutputPath`]).
    #[error("{0:#}")]
    Output(anyhow::Error),
    /// Reading the file failed.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Pages outside the memory file or off page boundaries.
    #[error("{}: {bad} page offset(s) outside the memory file ({memory_bytes} bytes) or not on a 4 KiB boundary, the first {first:#x}", path.display())]
    Offsets {
        /// The file.
        path: PathBuf,
        /// How many.
        bad: usize,
        /// The first.
        first: u64,
        /// The memory file's size.
        memory_bytes: u64,
    },
    /// The first line is not a header this build reads.
    #[error("{} is not a faultline working-set record (v1 or v2)", path.display())]
    Header {
        /// The file.
        path: PathBuf,
    },
    /// A v2 header line is missing or malformed.
    #[error("{}: the header lacks a valid '# {field} ...' line", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
    },
    /// A line is not a page.
    #[error("{} line {line}: {text:?}: not a page (hex offset, ns, count)", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// Its line number (from 1).
        line: usize,
        /// The line.
        text: String,
    },
    /// The record was made for another memory file.
    #[error(
        "{} was recorded for another memory file ({} bytes, fingerprint {:#018x}; this one: {} bytes, {:#018x})",
        path.display(), made_for.memory_bytes, made_for.fingerprint, memory.memory_bytes, memory.fingerprint
    )]
    OtherMemory {
        /// The file.
        path: PathBuf,
        /// What it names.
        made_for: Identity,
        /// The memory file at hand.
        memory: Identity,
    },
    /// Records of different memory files (or a v1 record) given to merge.
    #[error("{}: made for another memory file than {} (merge records of one memory file, all v2)", path.display(), first.display())]
    Mixed {
        /// The odd one.
        path: PathBuf,
        /// The first record.
        first: PathBuf,
    },
    /// `k` is 0 or more than the recordings.
    #[error("pages touched in at least {k} of {n} recordings: k must be 1 to {n}")]
    Threshold {
        /// Asked.
        k: usize,
        /// Recordings.
        n: usize,
    },
    /// Reading the memory file's sampled pages failed.
    #[error("fingerprinting the memory file: {0}")]
    Fingerprint(#[source] faultline::StoreError),
}

/// The identity of the memory file `store` holds (its size and 64 pages
/// spread over it; a store that does not say its size counts 0 bytes).
pub fn identity(store: &dyn PageStore) -> Result<Identity, RecordError> {
    let len = store.len().unwrap_or(0);
    let mut h = Fnv::new();
    h.eat(&len.to_le_bytes());
    let pages = len / PAGE;
    let mut buf = vec![0u8; PAGE as usize];
    if pages > 0 {
        for i in 0..SAMPLES.min(pages) {
            let page = i * (pages - 1) / (SAMPLES - 1).max(1);
            store
                .fill(page * PAGE, &mut buf)
                .map_err(RecordError::Fingerprint)?;
            h.eat(&buf);
        }
    }
    Ok(Identity {
        memory_bytes: len,
        fingerprint: h.0,
    })
}

/// 64-bit FNV-1a.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn eat(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Writes `offsets` as a v1 record (no identity: read unchecked), for
/// synthetic sets (every page of a file, a test's set), as any output is
/// written ([`OutputPath`]: whole or not at all, links followed).
pub fn write(path: &Path, offsets: &[u64]) -> Result<(), RecordError> {
    output(path)?
        .write(|out| {
            writeln!(out, "{HEADER_V1}")?;
            for o in offsets {
                writeln!(out, "{o:#x}")?;
            }
            Ok(())
        })
        .map_err(RecordError::Output)
}

/// Writes `record` (v2; a record without identity as v1) as [`write()`]
/// does.
pub fn write_record(path: &Path, record: &Record) -> Result<(), RecordError> {
    output(path)?
        .write(|out| encode(record, out))
        .map_err(RecordError::Output)
}

fn output(path: &Path) -> Result<OutputPath, RecordError> {
    OutputPath::check(path, "the record").map_err(RecordError::Output)
}

/// The text of `record` (v2; a record without identity as v1).
pub fn encode(record: &Record, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let Some(id) = record.identity else {
        writeln!(out, "{HEADER_V1}")?;
        for p in &record.pages {
            writeln!(out, "{:#x}", p.offset)?;
        }
        return Ok(());
    };
    writeln!(out, "{HEADER_V2}")?;
    writeln!(out, "# memory-bytes {}", id.memory_bytes)?;
    writeln!(out, "# fingerprint {:#018x}", id.fingerprint)?;
    writeln!(out, "# recordings {}", record.recordings)?;
    for p in &record.pages {
        writeln!(out, "{:#x} {} {}", p.offset, p.first_touch_ns, p.seen)?;
    }
    Ok(())
}

/// Reads a record's offsets, in install order (v1 or v2, unchecked).
pub fn read(path: &Path) -> Result<Vec<u64>, RecordError> {
    Ok(read_record(path)?.offsets())
}

/// Whether the file at `path` begins as a record does (its first bytes
/// are a record's header; nothing else of it is read).
pub fn is_record(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 32];
    let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut head));
    let prefix = &HEADER_V1.as_bytes()[..HEADER_V1.len() - 1];
    n.is_ok_and(|n| head[..n].starts_with(prefix))
}

/// Reads a record written by [`write()`] (v1) or [`write_record`] (v2).
pub fn read_record(path: &Path) -> Result<Record, RecordError> {
    let text = std::fs::read_to_string(path).map_err(|source| RecordError::Read {
        path: path.into(),
        source,
    })?;
    let mut lines = text.lines().enumerate().peekable();
    let v2 = match lines.next().map(|(_, l)| l) {
        Some(HEADER_V1) => false,
        Some(HEADER_V2) => true,
        _ => return Err(RecordError::Header { path: path.into() }),
    };
    let mut header = |field: &'static str| -> Result<u64, RecordError> {
        let bad = || RecordError::Field {
            path: path.into(),
            field,
        };
        let (_, l) = lines.next().ok_or_else(bad)?;
        let v = l
            .strip_prefix("# ")
            .and_then(|l| l.strip_prefix(field))
            .map(str::trim)
            .ok_or_else(bad)?;
        parse_u64(v).ok_or_else(bad)
    };
    let (identity, recordings) = if v2 {
        let memory_bytes = header("memory-bytes")?;
        let fingerprint = header("fingerprint")?;
        let recordings = u32::try_from(header("recordings")?).map_err(|_| RecordError::Field {
            path: path.into(),
            field: "recordings",
        })?;
        (
            Some(Identity {
                memory_bytes,
                fingerprint,
            }),
            recordings,
        )
    } else {
        (None, 1)
    };
    let mut pages = Vec::new();
    for (i, l) in lines {
        let t = l.trim();
        if t.is_empty() {
            continue;
        }
        let bad = || RecordError::Line {
            path: path.into(),
            line: i + 1,
            text: t.into(),
        };
        let mut w = t.split_whitespace();
        let offset = w.next().and_then(parse_u64).ok_or_else(bad)?;
        let (first_touch_ns, seen) = if v2 {
            let ns = w.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
            let seen = w.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
            (ns, seen)
        } else {
            (pages.len() as u64, 1)
        };
        if w.next().is_some() {
            return Err(bad());
        }
        pages.push(Page {
            offset,
            first_touch_ns,
            seen,
        });
    }
    Ok(Record {
        identity,
        recordings,
        pages,
    })
}

/// A decimal or `0x` hexadecimal number (v1 offsets are hexadecimal
/// with or without the prefix).
pub(crate) fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Merges `records` (each read from its path): the pages touched in at
/// least `k` of their recordings, ordered by their median first-touch
/// time (ties by offset). All must be v2 records of one memory file.
pub fn merge(records: &[(PathBuf, Record)], k: usize) -> Result<Record, RecordError> {
    let n: usize = records.iter().map(|(_, r)| r.recordings as usize).sum();
    if k == 0 || k > n {
        return Err(RecordError::Threshold { k, n });
    }
    let Some((first_path, first)) = records.first() else {
        return Err(RecordError::Threshold { k, n });
    };
    for (path, r) in records {
        if r.identity.is_none() || r.identity != first.identity {
            return Err(RecordError::Mixed {
                path: path.clone(),
                first: first_path.clone(),
            });
        }
    }
    // offset -> (recordings that touched it, their first-touch times).
    let mut pages: HashMap<u64, (u32, Vec<u64>)> = HashMap::new();
    for (_, r) in records {
        for p in &r.pages {
            let e = pages.entry(p.offset).or_default();
            e.0 += p.seen;
            // A merged input's median stands for its `seen` recordings.
            e.1.extend(std::iter::repeat_n(p.first_touch_ns, p.seen as usize));
        }
    }
    let mut kept: Vec<Page> = pages
        .into_iter()
        .filter(|(_, (seen, _))| *seen as usize >= k)
        .map(|(offset, (seen, mut times))| {
            times.sort_unstable();
            Page {
                offset,
                first_touch_ns: times[(times.len() - 1) / 2],
                seen,
            }
        })
        .collect();
    kept.sort_by_key(|p| (p.first_touch_ns, p.offset));
    Ok(Record {
        identity: first.identity,
        recordings: n as u32,
        pages: kept,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultline::MemoryStore;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("faultline-record-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_record_reads_back_in_order_and_bad_files_say_where() {
        let dir = dir("v1");
        let path = dir.join("ws.txt");
        let offs = [0x1a000, 0, u64::MAX - 0xfff, 0x2000];
        write(&path, &offs).unwrap();
        assert_eq!(read(&path).unwrap(), offs);
        assert_eq!(read_record(&path).unwrap().identity, None);
        assert!(!path.with_extension("tmp").exists());
        std::fs::write(&path, "0x1000\n").unwrap();
        assert!(matches!(read(&path), Err(RecordError::Header { .. })));
        std::fs::write(&path, format!("{HEADER_V1}\n0x1000\n\n0xzz\n")).unwrap();
        assert!(matches!(
            read(&path),
            Err(RecordError::Line { line: 4, .. })
        ));
        std::fs::write(
            &path,
            format!("{HEADER_V2}\n# memory-bytes 8192\n0x0 0 1\n"),
        )
        .unwrap();
        assert!(matches!(
            read(&path),
            Err(RecordError::Field {
                field: "fingerprint",
                ..
            })
        ));
        assert!(matches!(
            read(&dir.join("absent")),
            Err(RecordError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_record_names_its_memory_file_and_is_refused_for_another() {
        let dir = dir("v2");
        let bytes: Vec<u8> = (0..64 * 4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let id = identity(&MemoryStore::new(bytes.clone())).unwrap();
        let mut changed = bytes.clone();
        changed[63 * 4096 + 5] ^= 1;
        let other = identity(&MemoryStore::new(changed)).unwrap();
        assert_ne!(id, other, "a changed sampled page changes the fingerprint");
        let shorter = identity(&MemoryStore::new(bytes[..32 * 4096].to_vec())).unwrap();
        assert_ne!(id.memory_bytes, shorter.memory_bytes);
        let rec = Record::of_restore(id, &[(0x3000, 1_000_500), (0x0, 1_000_000)]);
        assert_eq!(rec.pages[0].first_touch_ns, 500);
        let path = dir.join("ws.txt");
        write_record(&path, &rec).unwrap();
        let back = read_record(&path).unwrap();
        assert_eq!(back, rec);
        back.check(&path, id).unwrap();
        assert!(matches!(
            back.check(&path, other),
            Err(RecordError::OtherMemory { .. })
        ));
        // A v1 record's pages past the file or off page boundaries (an
        // offset near 2^64 once aborted serve allocating its bitmap).
        let v1 = dir.join("v1.txt");
        write(&v1, &[0x1000, 0xffff_ffff_ffff_f000, 0x1001, 63 * 4096]).unwrap();
        assert!(is_record(&v1) && is_record(&path));
        assert!(!is_record(&dir.join("nothing")));
        std::fs::write(dir.join("mem"), &bytes).unwrap();
        assert!(!is_record(&dir.join("mem")));
        let e = read_record(&v1).unwrap().check(&v1, id).unwrap_err();
        assert!(
            matches!(
                e,
                RecordError::Offsets {
                    bad: 2,
                    first: 0xffff_ffff_ffff_f000,
                    ..
                }
            ),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn merge_keeps_pages_of_k_recordings_in_median_first_touch_order() {
        let id = Identity {
            memory_bytes: 1 << 20,
            fingerprint: 7,
        };
        let rec = |touches: &[(u64, u64)]| Record::of_restore(id, touches);
        let recs = vec![
            ("a".into(), rec(&[(0, 0), (1, 10), (2, 20), (9, 30)])),
            ("b".into(), rec(&[(1, 0), (0, 5), (2, 40)])),
            ("c".into(), rec(&[(2, 0), (0, 50), (1, 60), (8, 70)])),
        ];
        let m = merge(&recs, 2).unwrap();
        assert_eq!(m.recordings, 3);
        // 0: times 0, 5, 50 -> 5; 1: 10, 0, 60 -> 10; 2: 20, 40, 0 -> 20.
        let got: Vec<(u64, u64, u32)> = m
            .pages
            .iter()
            .map(|p| (p.offset, p.first_touch_ns, p.seen))
            .collect();
        assert_eq!(got, vec![(0, 5, 3), (1, 10, 3), (2, 20, 3)]);
        assert_eq!(merge(&recs, 1).unwrap().pages.len(), 5, "k = 1: the union");
        assert_eq!(merge(&recs, 3).unwrap().pages.len(), 3);
        assert!(matches!(
            merge(&recs, 4),
            Err(RecordError::Threshold { .. })
        ));
        assert!(matches!(
            merge(&recs, 0),
            Err(RecordError::Threshold { .. })
        ));
        // A merged record merges again, standing for its recordings.
        let again = merge(
            &[("m".into(), m.clone()), ("a".into(), recs[0].1.clone())],
            4,
        )
        .unwrap();
        assert_eq!(again.recordings, 4);
        assert_eq!(again.pages.len(), 3);
        let mut other = recs[2].1.clone();
        other.identity = Some(Identity {
            memory_bytes: 1 << 20,
            fingerprint: 8,
        });
        let mixed = vec![recs[0].clone(), ("c".into(), other)];
        assert!(matches!(merge(&mixed, 1), Err(RecordError::Mixed { .. })));
    }
}
