//! The working-set record: the store offsets of the pages a restore
//! touched, in the order it first touched them.
//!
//! ```text
//! # faultline working set v1
//! 0x1a000
//! 0x0
//! ...
//! ```
//!
//! `faultline-serve --record FILE` writes one when its first peer hangs up;
//! `--prefetch FILE` reads it back and installs those pages on every
//! restore, in that order.

use std::io::Write as _;
use std::path::{Path, PathBuf};

const HEADER: &str = "# faultline working set v1";

/// Why a record could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Creating or writing the temporary file failed.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The temporary file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Renaming the temporary file into place failed.
    #[error("renaming to {}: {source}", path.display())]
    Rename {
        /// The record's path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Reading the file failed.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The first line is not the header.
    #[error("{} is not a faultline working-set record", path.display())]
    Header {
        /// The file.
        path: PathBuf,
    },
    /// A line is not a hexadecimal offset.
    #[error("{} line {line}: {text:?}: {source}", path.display())]
    Offset {
        /// The file.
        path: PathBuf,
        /// Its line number (from 1).
        line: usize,
        /// The line.
        text: String,
        /// Why it does not parse.
        #[source]
        source: std::num::ParseIntError,
    },
}

/// Writes `offsets` to `path` (atomically: a temporary file, renamed).
pub fn write(path: &Path, offsets: &[u64]) -> Result<(), RecordError> {
    let tmp = path.with_extension("tmp");
    let written = (|| {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        writeln!(out, "{HEADER}")?;
        for o in offsets {
            writeln!(out, "{o:#x}")?;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    written.map_err(|source| RecordError::Write {
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| RecordError::Rename {
        path: path.into(),
        source,
    })
}

/// Reads a record written by [`write()`].
pub fn read(path: &Path) -> Result<Vec<u64>, RecordError> {
    let text = std::fs::read_to_string(path).map_err(|source| RecordError::Read {
        path: path.into(),
        source,
    })?;
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(RecordError::Header { path: path.into() });
    }
    lines
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let t = l.trim();
            u64::from_str_radix(t.trim_start_matches("0x"), 16).map_err(|source| {
                RecordError::Offset {
                    path: path.into(),
                    line: i + 2,
                    text: t.into(),
                    source,
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_in_order_and_bad_files_say_where() {
        let dir = std::env::temp_dir().join(format!("faultline-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ws.txt");
        let offs = [0x1a000, 0, u64::MAX - 0xfff, 0x2000];
        write(&path, &offs).unwrap();
        assert_eq!(read(&path).unwrap(), offs);
        assert!(!path.with_extension("tmp").exists());
        std::fs::write(&path, "0x1000\n").unwrap();
        assert!(matches!(read(&path), Err(RecordError::Header { .. })));
        std::fs::write(&path, format!("{HEADER}\n0x1000\n\n0xzz\n")).unwrap();
        assert!(matches!(
            read(&path),
            Err(RecordError::Offset { line: 4, .. })
        ));
        assert!(matches!(
            read(&dir.join("absent")),
            Err(RecordError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
