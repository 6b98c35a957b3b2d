//! The working-set record: the store offsets of the pages a restore
//! touched, in the order it first touched them.
//!
//! ```text
//! # faultline working set v1
//! 0x1a000
//! 0x0
//! ...
//! ```

use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};

const HEADER: &str = "# faultline working set v1";

/// Writes `offsets` to `path` (atomically: a temporary file, renamed).
pub fn write(path: &Path, offsets: &[u64]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?,
    );
    writeln!(out, "{HEADER}")?;
    for o in offsets {
        writeln!(out, "{o:#x}")?;
    }
    out.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Reads a record written by [`write`].
pub fn read(path: &Path) -> anyhow::Result<Vec<u64>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        bail!("{} is not a faultline working-set record", path.display());
    }
    lines
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let t = l.trim();
            u64::from_str_radix(t.trim_start_matches("0x"), 16)
                .with_context(|| format!("{} line {}: {t:?}", path.display(), i + 2))
        })
        .collect()
}
