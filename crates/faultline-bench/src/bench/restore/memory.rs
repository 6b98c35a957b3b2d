//! The memory file, its shared copies, and the cache states a run starts
//! from.
//!
//! 1. [`write_mem`] writes the memory file (the VM's snapshot) once.
//! 2. [`Copies::prepare`] makes what the asked-for configurations map
//!    besides it: a hugetlb pool for 2 MiB pages, the shared copy on a
//!    hugetlbfs mount, the shared tmpfs copy (written from a cold and from
//!    a warm memory file, each timed: the one-time population of the
//!    shared page cache). A configuration whose copy cannot be made is
//!    dropped, with the reason printed.
//! 3. Before each run: [`warm`] or [`drop_cache`] for the memory file's
//!    page cache, [`Evictor::evict`] for the CPU caches.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use faultline_cli_support::cleanup::{self, Guard};
use faultline_sys::mem::{self, Mapping};

use super::args::{uses_huge_snapshot, uses_snapshot, RestoreArgs};

/// The shared copies of the memory file the configurations use, and the
/// hugetlb pool their 2 MiB pages come from; each given back on drop
/// (the copies, then the mount, then the pool).
pub struct Copies {
    /// The configurations that can run: those asked for, less the hugetlb
    /// ones without a pool or a mount.
    pub configs: Vec<String>,
    /// The shared tmpfs copy (written when a configuration maps it).
    pub snap: Snapshot,
    /// The shared copy on hugetlbfs (empty when none).
    pub hsnap: PathBuf,
    /// How long writing each copy took: (written from what, ms).
    pub populated: Vec<(&'static str, f64)>,
    _mount: Option<HugeMount>,
    _pool: Option<Pool>,
}

impl Copies {
    /// Makes what `a.configs` need, in `dir`, from the memory file `mem`.
    pub fn prepare(a: &RestoreArgs, dir: &Path, mem: &Path) -> anyhow::Result<Copies> {
        // Hugetlb rows: a pool for the peer's 2 MiB pages (grown as root and
        // given back afterwards), or the rows are skipped with the reason.
        let mut configs = a.configs.clone();
        let mut pool = None;
        let huge_pages = a.size as u64 / (2 << 20);
        // The shared copy on hugetlbfs stays in the pool, and a peer's
        // MAP_PRIVATE mapping of it reserves its size again.
        let need = if configs.iter().any(|c| uses_huge_snapshot(c)) {
            2 * huge_pages + 8
        } else {
            huge_pages + 4
        };
        if configs
            .iter()
            .any(|c| c.ends_with("-huge") || uses_huge_snapshot(c))
        {
            match Pool::get(need) {
                Ok(p) => pool = Some(p),
                Err(why) => {
                    println!("restore: hugetlb rows skipped: {why}");
                    configs.retain(|c| !c.ends_with("-huge") && !uses_huge_snapshot(c));
                }
            }
        }
        let mut mount = None;
        let mut populated = Vec::new();
        if configs.iter().any(|c| uses_huge_snapshot(c)) {
            let made = HugeMount::new(dir).and_then(|m| {
                warm(mem)?;
                let store =
                    faultline::FileStore::open_with(mem, 0, faultline::store::FileAccess::Mmap)?;
                let (_, done) = faultline::SharedSnapshot::create(&m.snap(), &store, |_, _| {})?;
                Ok((m, done))
            });
            match made {
                Ok((m, done)) => {
                    let ms = done.elapsed.as_secs_f64() * 1e3;
                    eprintln!(
                        "restore: shared hugetlbfs copy written from a warm memory file in {ms:.1} ms"
                    );
                    populated.push(("warm memory file, to hugetlbfs", ms));
                    mount = Some(m);
                }
                Err(why) => {
                    println!("restore: hugetlbfs shared rows skipped: {why:#}");
                    configs.retain(|c| !uses_huge_snapshot(c));
                }
            }
        }
        let hsnap = mount.as_ref().map_or_else(PathBuf::new, |m| m.snap());
        let snap = Snapshot::in_dev_shm();
        if configs.iter().any(|c| uses_snapshot(c)) {
            let store =
                faultline::FileStore::open_with(mem, 0, faultline::store::FileAccess::Mmap)?;
            for cache in ["cold", "warm"] {
                if cache == "cold" {
                    drop_cache(mem, is_root())?;
                } else {
                    warm(mem)?;
                }
                let _ = std::fs::remove_file(&snap.0);
                let (_, done) = faultline::SharedSnapshot::create(&snap.0, &store, |_, _| {})
                    .context("writing the shared tmpfs copy")?;
                eprintln!(
                    "restore: shared tmpfs copy written from a {cache} memory file in {:.1} ms",
                    done.elapsed.as_secs_f64() * 1e3
                );
                let label = if cache == "cold" {
                    "cold memory file"
                } else {
                    "warm memory file"
                };
                populated.push((label, done.elapsed.as_secs_f64() * 1e3));
            }
        }
        Ok(Copies {
            configs,
            snap,
            hsnap,
            populated,
            _mount: mount,
            _pool: pool,
        })
    }
}

/// The shared tmpfs copy of the memory file, removed on drop, on SIGINT,
/// SIGTERM and SIGHUP (registered with `faultline_cli_support::cleanup`),
/// and by a later run once this process is gone.
pub struct Snapshot(
    pub PathBuf,
    #[allow(dead_code, reason = "removes the copy when dropped")] Guard,
);

impl Snapshot {
    /// This process's tmpfs copy: `/dev/shm/faultline-restore-PID.mem`
    /// (after removing those of killed runs).
    pub fn in_dev_shm() -> Snapshot {
        let shm = Path::new("/dev/shm");
        cleanup::sweep_pid_named(shm, "faultline-restore-", ".mem");
        let guard = cleanup::temp(shm, "faultline-restore-", ".mem");
        Snapshot(guard.path().to_path_buf(), guard)
    }
}

/// Free 2 MiB hugetlb pages ([`faultline::testing::HugePool`]) whose
/// `vm.nr_hugepages` change is put back on drop and, registered with
/// `faultline_cli_support::cleanup`, on SIGINT, SIGTERM and SIGHUP too.
pub struct Pool {
    _pool: faultline::testing::HugePool,
    _on_signal: Option<cleanup::SignalGuard>,
}

impl Pool {
    /// At least `pages` free 2 MiB pages. `Err`: why there are none.
    pub fn get(pages: u64) -> Result<Pool, String> {
        let pool = faultline::testing::HugePool::get(pages)?;
        let on_signal = pool
            .changed()
            .map(|(path, old)| cleanup::changed_setting(Path::new(path), old));
        Ok(Pool {
            _pool: pool,
            _on_signal: on_signal,
        })
    }
}

/// A hugetlbfs mount (2 MiB pages) holding the shared copy, at
/// `DIR/faultline-hugetlbfs-PID`: unmounted on drop, on SIGINT, SIGTERM
/// and SIGHUP, and by a later run once this process is gone
/// ([`HugeMount::SWEEP`]).
pub struct HugeMount {
    at: PathBuf,
    _mounted: cleanup::MountGuard,
}

impl HugeMount {
    /// What names the mount point: `{SWEEP}PID`.
    pub const SWEEP: &'static str = "faultline-hugetlbfs-";

    /// Mounts hugetlbfs (2 MiB pages) in `dir` (root).
    pub fn new(dir: &Path) -> anyhow::Result<HugeMount> {
        cleanup::sweep_mounts(Self::SWEEP);
        let at = dir.join(format!("{}{}", Self::SWEEP, std::process::id()));
        std::fs::create_dir_all(&at)?;
        let st = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M", "none"])
            .arg(&at)
            .stderr(Stdio::null())
            .status()?;
        anyhow::ensure!(st.success(), "mount -t hugetlbfs failed ({st}; needs root)");
        Ok(HugeMount {
            _mounted: cleanup::mounted(&at),
            at,
        })
    }
    /// Where the shared copy lives on it.
    pub fn snap(&self) -> PathBuf {
        self.at.join("snap.mem")
    }
}

impl Drop for HugeMount {
    fn drop(&mut self) {
        // The copy goes back to the pool before the mount guard unmounts.
        let _ = std::fs::remove_file(self.snap());
    }
}

/// Whether this process runs as root (cold runs then drop the page cache
/// with `drop_caches` too).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|v| v.split_whitespace().next() == Some("0"))
            })
        })
        .unwrap_or(false)
}

/// Writes the memory file: `size` bytes of xorshift noise (no page
/// repeats, so a wrong page is always seen), synced.
pub fn write_mem(path: &Path, size: usize) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..size >> 20 {
        for w in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&chunk)?;
    }
    f.into_inner()?.sync_all()?;
    Ok(())
}

/// Pushes the working set's cache lines out of the CPU caches before each
/// run: every configuration's vCPUs start from memory, not from lines an
/// earlier run (or `warm`, for the memory file) left in a last-level cache
/// that here is hundreds of MiB.
pub struct Evictor(Mapping);

impl Evictor {
    /// A buffer twice the last-level cache, populated.
    pub fn new() -> anyhow::Result<Evictor> {
        // Twice the last-level cache (sysfs; 64 MiB when unknown), at most
        // 2 GiB.
        let llc = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
            .ok()
            .and_then(|s| s.trim().strip_suffix('K')?.parse::<usize>().ok())
            .map_or(32 << 20, |k| k << 10);
        let len = (2 * llc).clamp(64 << 20, 2 << 30);
        let m = Mapping::anon(len)?;
        m.advise(0, len, mem::Advice::PopulateWrite)?;
        Ok(Evictor(m))
    }

    /// A page of its own: what `--keep-caches` runs carry (never read).
    pub fn none() -> anyhow::Result<Evictor> {
        Ok(Evictor(Mapping::anon(4096)?))
    }

    /// Reads the buffer, a cache line at a time.
    pub fn evict(&self) {
        let mut sum = 0u64;
        for off in (0..self.0.len()).step_by(64) {
            // SAFETY: inside a live, populated anonymous mapping.
            sum = sum
                .wrapping_add(unsafe { std::ptr::read_volatile(self.0.as_ptr().add(off)) } as u64);
        }
        std::hint::black_box(sum);
    }
}

/// Reads every page of the file through a mapping (its page cache warm).
pub fn warm(path: &Path) -> anyhow::Result<()> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len() as usize;
    let m = Mapping::file_readonly(&f, len, 0)?;
    let mut sum = 0u64;
    for off in (0..len).step_by(4096) {
        // SAFETY: inside a live read-only mapping of the file.
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(m.as_ptr().add(off)) } as u64);
    }
    std::hint::black_box(sum);
    Ok(())
}

/// Drops the file's page cache (`posix_fadvise(DONTNEED)`, and
/// `drop_caches` as root). `drop_caches` drops every file's cache, the
/// faultline executable's too: it is read back at once, so the serve and
/// peer a run starts do not page their code in from a disk busy with the
/// memory file's reads (a cold snapshot, not a cold handler binary: with
/// the binary cold, serve's handshake waited up to 390 ms behind a
/// prefetch's reads).
pub fn drop_cache(path: &Path, root: bool) -> anyhow::Result<()> {
    let f = std::fs::File::open(path)?;
    mem::fadvise_dontneed(&f)?;
    if root {
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
        warm(&super::launch::exe()?)?;
    }
    Ok(())
}
