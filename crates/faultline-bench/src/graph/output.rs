//! The output files of `faultline graph` and `faultline bfs --json`:
//! buffered, flushed and optionally synced, every failure naming the file.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use anyhow::Context;

/// A buffered output file at `path` (8 MiB buffer).
pub(super) fn create_output(path: &Path) -> anyhow::Result<BufWriter<File>> {
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    Ok(BufWriter::with_capacity(8 << 20, f))
}

/// Flushes `w` (and fsyncs it with `sync`), naming `path` on failure.
pub(super) fn finish_output(w: BufWriter<File>, path: &Path, sync: bool) -> anyhow::Result<()> {
    let f = w
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", path.display()))?;
    if sync {
        f.sync_all()
            .with_context(|| format!("fsync {}", path.display()))?;
    }
    Ok(())
}
