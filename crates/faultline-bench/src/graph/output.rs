//! The output files of `faultline graph`: a buffered writer over an output
//! being written through `faultline_cli_support::OutputPath` (a temporary
//! in the output's directory, renamed over it on success), every failure
//! naming the file.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use anyhow::Context;
use faultline_cli_support::PendingOutput;

/// A buffered writer (8 MiB buffer) over the file of `p`.
pub(super) fn buffered(p: &mut PendingOutput) -> BufWriter<&mut File> {
    BufWriter::with_capacity(8 << 20, p.file())
}

/// Flushes `w`, naming `path` on failure.
pub(super) fn flush(w: BufWriter<&mut File>, path: &Path) -> anyhow::Result<()> {
    w.into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
