//! The peer's guest memory: regions mapped as a VMM maps them.
//!
//! ```text
//!  uffd backend (anonymous, or 2 MiB hugetlb with --huge):
//!   | region 0 | gap | region 1 | gap |      file: | region 0 | region 1 |
//!   (placed in one probed hole, so the gaps stay unmapped)
//!
//!  file and shared backends: each region a MAP_PRIVATE mapping of the
//!  file at its offset, wherever the kernel puts it.
//! ```

use anyhow::bail;
use faultline_sys::mem::{self, Advice, Mapping};

/// The 4 KiB page the working set is drawn and checked in.
pub const PAGE: usize = 4096;

/// The mapped regions.
pub struct Layout {
    /// The mappings (kept alive for the peer's life).
    pub maps: Vec<Mapping>,
    /// (base, len, file offset)
    pub regions: Vec<(u64, usize, u64)>,
}

/// Anonymous regions of `sizes` with `gap` unmapped bytes after each (the
/// uffd backend).
pub fn map_anon(sizes: &[usize], gap: usize, huge: bool) -> anyhow::Result<Layout> {
    let total: usize = sizes.iter().sum::<usize>() + gap * sizes.len();
    for _attempt in 0..8 {
        // Find room for the whole layout, then map each region in it.
        let probe = Mapping::anon_aligned(total, 2 << 20)?;
        let start = probe.addr();
        drop(probe);
        let mut maps = Vec::new();
        let mut regions = Vec::new();
        let (mut at, mut off) = (start, 0u64);
        let mut ok = true;
        for &len in sizes {
            let m = if huge {
                mem::anon_huge_2m(Some(at), len)
            } else {
                mem::anon_at(at, len)
            };
            match m {
                Ok(m) => {
                    if !huge {
                        // One fault per 4 KiB page, as guest memory without THP.
                        let _ = m.advise(0, len, Advice::NoHugePage);
                    }
                    regions.push((at, len, off));
                    maps.push(m);
                }
                // Another thread mapped into the hole since the probe
                // (glibc makes a new thread's malloc arena with mmap):
                // probe again. Any other hugetlb failure (a short pool) is
                // final.
                Err(e) if huge && e.source.kind() != std::io::ErrorKind::AlreadyExists => {
                    bail!(
                        "mapping {len} bytes of 2 MiB hugetlb memory: {e} (the memory needs {} \
                         huge pages in all: grow vm.nr_hugepages; HugePages_Free less \
                         HugePages_Rsvd in /proc/meminfo is what is left)",
                        sizes.iter().sum::<usize>() >> 21
                    )
                }
                Err(_) => {
                    ok = false;
                    break;
                }
            }
            at += (len + gap) as u64;
            off += len as u64;
        }
        if ok {
            return Ok(Layout { maps, regions });
        }
    }
    bail!("could not place {} regions with gaps", sizes.len())
}

/// `file` mapped `MAP_PRIVATE`, one mapping per region of `sizes` (the
/// file and shared backends).
pub fn map_file(file: &std::fs::File, sizes: &[usize]) -> anyhow::Result<Layout> {
    let mut maps = Vec::new();
    let mut regions = Vec::new();
    let mut off = 0u64;
    for &len in sizes {
        let m = Mapping::file_private(None, file, len, off)?;
        regions.push((m.addr(), len, off));
        maps.push(m);
        off += len as u64;
    }
    Ok(Layout { maps, regions })
}
