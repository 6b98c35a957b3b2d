//! The dirty-set file: the pages a tracked restore wrote (or dropped)
//! since serve began serving it, a sibling kind of the working-set record
//! ([`crate::record`]): same header style, the same memory-file identity,
//! its own kind and version, checked on read.
//!
//! ```text
//! # faultline dirty set v1
//! # memory-bytes 1073741824
//! # fingerprint 0x6a09e667f3bcc908
//! # page-bytes 4096
//! # pages 3
//! # bitmap 0500000000000000...   <- one bit a page of the memory file,
//! 0x0                                 page 8i+j = bit j of byte i (hex)
//! 0x2000                          <- the same pages as store offsets,
//! 0x3f000                            ascending
//! ```
//!
//! 1. **Written** by `faultline-serve --track-dirty FILE` when a tracked
//!    peer hangs up, and on request (SIGUSR1, or `POST /dirty` on the
//!    metrics endpoint) for every tracked peer while it runs.
//! 2. **Both forms**: the bitmap (what a diff-snapshot writer walks) and
//!    the list (what a person or a script reads); a reader checks they
//!    agree, that every offset is a page of the memory file, and the
//!    count.
//! 3. **Identity**: the memory file the restore was served from (as a
//!    record names it), so a diff is applied to the base it was made
//!    against.

use std::path::{Path, PathBuf};

use crate::record::{parse_u64, Identity, RecordError};

/// The first line of a dirty-set file.
pub const HEADER: &str = "# faultline dirty set v1";

/// The page size of a dirty set: the memory file's 4 KiB pages.
pub const PAGE: u64 = faultline::DIRTY_PAGE;

/// A dirty set: the memory file's pages a restore wrote or dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtySet {
    /// The memory file the restore was served from.
    pub identity: Identity,
    /// Store offsets of the dirty pages ([`PAGE`] bytes each), ascending.
    pub offsets: Vec<u64>,
}

/// Why a dirty-set file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DirtySetError {
    /// Reading the file failed, or a header line is missing or malformed
    /// (as for a record: [`RecordError::Read`], [`RecordError::Field`]).
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The first line is not a dirty-set header this build reads.
    #[error("{} is not a faultline dirty set (v1)", path.display())]
    Header {
        /// The file.
        path: PathBuf,
    },
    /// A line is not a page offset.
    #[error("{} line {line}: {text:?}: not a page offset", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// Its line number (from 1).
        line: usize,
        /// The line.
        text: String,
    },
    /// The parts of the file disagree.
    #[error("{}: {why}", path.display())]
    Inconsistent {
        /// The file.
        path: PathBuf,
        /// What disagrees.
        why: String,
    },
}

impl DirtySet {
    /// Pages of the memory file (the bitmap's bits).
    fn file_pages(&self) -> u64 {
        self.identity.memory_bytes.div_ceil(PAGE)
    }

    /// The bitmap: bit `j` of byte `i` is page `8i + j` of the memory file.
    pub fn bitmap(&self) -> Vec<u8> {
        let mut bits = vec![0u8; self.file_pages().div_ceil(8) as usize];
        for &o in &self.offsets {
            let p = (o / PAGE) as usize;
            if let Some(b) = bits.get_mut(p / 8) {
                *b |= 1 << (p % 8);
            }
        }
        bits
    }

    /// Runs of consecutive pages.
    pub fn runs(&self) -> usize {
        self.offsets
            .windows(2)
            .filter(|w| w[1] != w[0] + PAGE)
            .count()
            + usize::from(!self.offsets.is_empty())
    }

    /// Writes the file's text (see the module docs).
    pub fn encode(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        writeln!(out, "{HEADER}")?;
        writeln!(out, "# memory-bytes {}", self.identity.memory_bytes)?;
        writeln!(out, "# fingerprint {:#018x}", self.identity.fingerprint)?;
        writeln!(out, "# page-bytes {PAGE}")?;
        writeln!(out, "# pages {}", self.offsets.len())?;
        write!(out, "# bitmap ")?;
        for b in self.bitmap() {
            write!(out, "{b:02x}")?;
        }
        writeln!(out)?;
        for o in &self.offsets {
            writeln!(out, "{o:#x}")?;
        }
        Ok(())
    }
}

/// Whether `path` starts with a dirty-set header (any version).
pub fn is_dirty_set(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .map(|t| t.starts_with("# faultline dirty set"))
        .unwrap_or(false)
}

/// Reads a dirty-set file, checking its parts agree (module docs, 2).
pub fn read(path: &Path) -> Result<DirtySet, DirtySetError> {
    let text = std::fs::read_to_string(path).map_err(|source| RecordError::Read {
        path: path.into(),
        source,
    })?;
    let mut lines = text.lines().enumerate();
    if lines.next().map(|(_, l)| l) != Some(HEADER) {
        return Err(DirtySetError::Header { path: path.into() });
    }
    let mut header = |field: &'static str| -> Result<&str, RecordError> {
        let bad = || RecordError::Field {
            path: path.into(),
            field,
        };
        let (_, l) = lines.next().ok_or_else(bad)?;
        l.strip_prefix("# ")
            .and_then(|l| l.strip_prefix(field))
            .and_then(|l| l.strip_prefix(' '))
            .map(str::trim)
            .ok_or_else(bad)
    };
    let number = |field: &'static str, v: &str| {
        parse_u64(v).ok_or_else(|| RecordError::Field {
            path: path.into(),
            field,
        })
    };
    let memory_bytes = number("memory-bytes", header("memory-bytes")?)?;
    let fingerprint = number("fingerprint", header("fingerprint")?)?;
    let page_bytes = number("page-bytes", header("page-bytes")?)?;
    let pages = number("pages", header("pages")?)?;
    let bitmap_hex = header("bitmap")?.to_owned();
    let inconsistent = |why: String| DirtySetError::Inconsistent {
        path: path.into(),
        why,
    };
    if page_bytes != PAGE {
        return Err(inconsistent(format!(
            "page-bytes {page_bytes}: this build reads dirty sets of {PAGE}-byte pages"
        )));
    }
    let mut offsets = Vec::new();
    for (i, l) in lines {
        let t = l.trim();
        if t.is_empty() {
            continue;
        }
        let o = parse_u64(t).ok_or_else(|| DirtySetError::Line {
            path: path.into(),
            line: i + 1,
            text: t.into(),
        })?;
        if o % PAGE != 0 || o >= memory_bytes {
            return Err(inconsistent(format!(
                "line {}: {o:#x} is not a page of a {memory_bytes}-byte memory file",
                i + 1
            )));
        }
        if offsets.last().is_some_and(|&last| last >= o) {
            return Err(inconsistent(format!(
                "line {}: {o:#x} is out of order (offsets ascend, once each)",
                i + 1
            )));
        }
        offsets.push(o);
    }
    if offsets.len() as u64 != pages {
        return Err(inconsistent(format!(
            "the header says {pages} pages, the list holds {}",
            offsets.len()
        )));
    }
    let set = DirtySet {
        identity: Identity {
            memory_bytes,
            fingerprint,
        },
        offsets,
    };
    let want: String = set.bitmap().iter().map(|b| format!("{b:02x}")).collect();
    if bitmap_hex != want {
        return Err(inconsistent(
            "the bitmap and the page list disagree".to_string(),
        ));
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fl-dirty-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn set(offsets: Vec<u64>) -> DirtySet {
        DirtySet {
            identity: Identity {
                memory_bytes: 64 * PAGE + 100,
                fingerprint: 0x1234,
            },
            offsets,
        }
    }

    #[test]
    fn a_dirty_set_reads_back_and_its_bitmap_is_its_list() {
        let d = dir("roundtrip");
        let s = set(vec![0, 2 * PAGE, 3 * PAGE, 64 * PAGE]);
        let mut text = Vec::new();
        s.encode(&mut text).unwrap();
        let p = d.join("d.txt");
        std::fs::write(&p, &text).unwrap();
        assert!(is_dirty_set(&p));
        assert_eq!(read(&p).unwrap(), s);
        assert_eq!(s.runs(), 3);
        // 65 pages (the last one partial): 9 bytes; pages 0, 2, 3 and 64.
        assert_eq!(s.bitmap(), vec![0b1101, 0, 0, 0, 0, 0, 0, 0, 1]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_damaged_dirty_set_is_refused_with_what_is_wrong() {
        let d = dir("damaged");
        let s = set(vec![PAGE, 5 * PAGE]);
        let mut text = Vec::new();
        s.encode(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let p = d.join("d.txt");
        let cases = [
            (text.replace("0x5000\n", ""), "holds 1"),
            (text.replace("0x1000\n", "0x1001\n"), "not a page"),
            (text.replace("# pages 2", "# pages x"), "'# pages"),
            (text.replace("# bitmap 22", "# bitmap 21"), "disagree"),
            (
                text.replace("dirty set v1", "dirty set v9"),
                "not a faultline dirty set",
            ),
            (
                text.replace("0x1000\n0x5000", "0x5000\n0x1000"),
                "out of order",
            ),
        ];
        for (bad, says) in cases {
            std::fs::write(&p, bad).unwrap();
            let e = read(&p).unwrap_err().to_string();
            assert!(e.contains(says), "{e:?} should say {says:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
