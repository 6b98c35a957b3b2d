//! UMap's configuration: the `UMAP_*` environment variables, read once, at
//! the first call, with UMap's defaults.
//!
//! | variable | UMap's meaning | default | here |
//! |---|---|---|---|
//! | `UMAP_PAGESIZE` | bytes per UMap page (a multiple of the system page) | system page size | the region page size when a power of two; otherwise a UMap page is a group of region pages of the largest power of two dividing it, which faults install and the buffer counts together (eviction and write-back go by region page) |
//! | `UMAP_BUFSIZE` | UMap pages resident at once: faults past it wait for an eviction | 90% of free memory (`MemFree`) | one [`faultline::SharedBudget`] of `BUFSIZE` pages for every region of the process: a fault charges its page before it installs it, and makes room first when the buffer is full (evicts a batch itself, or waits for the evictors), so the resident pages of all regions never exceed it |
//! | `UMAP_PAGE_FILLERS` | threads reading pages from the store | hardware threads | handler threads of the workers engine; unset, file regions use the signal engine (faults resolved on the faulting thread, no fillers) |
//! | `UMAP_PAGE_EVICTORS` | threads evicting pages | hardware threads | evictor threads of each region (at most 8; one with filler threads, whose zaps go one page at a time), evicting that region's pages side by side; faults that find the buffer full evict for themselves too |
//! | `UMAP_EVICT_HIGH_WATER_THRESHOLD` | percent of the buffer at which the evictors start | 90 | the evictors wake when `BUFSIZE * HIGH / 100` pages are resident |
//! | `UMAP_EVICT_LOW_WATER_THRESHOLD` | percent at which the evictors stop | 70 | they evict down to `BUFSIZE * LOW / 100` pages (`LOW <= HIGH`) |
//! | `UMAP_READ_AHEAD` | pages read ahead of a fault (UMap 2.1; removed from UMap in 2021) | 0 | set: every fault installs the aligned window of `READ_AHEAD + 1` pages; unset: one UMap page per isolated fault, growing on sequential streams |
//! | `UMAP_MAX_FAULT_EVENTS` | uffd events read at once | 256 | messages per `read(2)` of the workers engine |
//! | `FAULTLINE_UMAP_FILE_IO` | (faultline's) | `cached` | how a descriptor's file is read and written: `cached`, ranges the page cache holds copied from it and, with UMap pages of 64 KiB or more, the others read with `O_DIRECT`, written back through the page cache; `buffered`, all through the page cache of a fresh open without `O_DIRECT`; `direct`, with `O_DIRECT` and aligned I/O (see the crate docs) |
//! | `UMAP_LOG_LEVEL` | log verbosity | `INFO` when built with logging, on stdout | `ERROR` (default), `WARNING`, `INFO`, `DEBUG` (or 0-3), on stderr; an unknown level is warned about and ignored, as UMap does |
//!
//! Numbers are read as UMap reads them (`std::stringstream >> uint64_t`):
//! leading blanks skipped, the leading digits taken, the rest ignored
//! (`65536k` is 65536), and a value with no leading digit (empty, `abc`)
//! reads 0; a variable that reads 0 counts as unset. Each of these is
//! warned about here. A number too large for 64 bits makes every
//! `umap()` fail with `EINVAL`, and so do thresholds with `LOW > HIGH`
//! (UMap would then never evict and its faults would wait for ever).

use std::sync::OnceLock;

use faultline::ReadaheadConfig;
use faultline_sys::thread::online_cpus;

/// Log levels, as UMap names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Failures.
    Error = 0,
    /// Things that will not behave as UMap would.
    Warning = 1,
    /// Region creation and removal, the configuration.
    Info = 2,
    /// Every call.
    Debug = 3,
}

/// How `umap()` reads and writes the file of a descriptor (a faultline
/// extension, `FAULTLINE_UMAP_FILE_IO`; see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileIo {
    /// `cached` (default): ranges the page cache holds are copied from it,
    /// the others read with `O_DIRECT` (UMap pages of 64 KiB or more;
    /// smaller ones are `buffered`); written back through the page cache
    /// ([`crate::cached::CachedOrDirect`]).
    Cached,
    /// `buffered`: the file opened again without `O_DIRECT`, read through
    /// its page cache.
    Buffered,
    /// `direct`: the file opened again with `O_DIRECT`, aligned I/O.
    Direct,
}

/// The configuration in effect.
#[derive(Debug, Clone)]
pub struct Config {
    /// `UMAP_PAGESIZE`, bytes.
    pub page_size: u64,
    /// `UMAP_BUFSIZE`, UMap pages.
    pub buf_pages: u64,
    /// `UMAP_PAGE_FILLERS`.
    pub fillers: u64,
    /// Whether `UMAP_PAGE_FILLERS` was set (then every region uses filler
    /// threads).
    pub fillers_set: bool,
    /// `UMAP_PAGE_EVICTORS`.
    pub evictors: u64,
    /// `UMAP_EVICT_HIGH_WATER_THRESHOLD`, percent.
    pub high_water: u64,
    /// `UMAP_EVICT_LOW_WATER_THRESHOLD`, percent.
    pub low_water: u64,
    /// `UMAP_READ_AHEAD`, pages (`None` when unset).
    pub read_ahead: Option<u64>,
    /// `UMAP_MAX_FAULT_EVENTS`.
    pub max_fault_events: u64,
    /// `UMAP_LOG_LEVEL`.
    pub log_level: Level,
    /// `FAULTLINE_UMAP_FILE_IO`.
    pub file_io: FileIo,
    /// Variables that were set but invalid, with why (reported by every
    /// `umap()`, which then fails with `EINVAL`).
    pub invalid: Vec<String>,
    /// Variables that were set but ignored, with why (logged once, at
    /// `WARNING`).
    pub warnings: Vec<String>,
}

/// The system page size.
pub const SYSTEM_PAGE: u64 = 4096;

/// Most evictor threads one region runs ([`Config::region_evictors`]).
pub const MAX_REGION_EVICTORS: usize = 8;

/// What was wrong with the environment: `invalid` makes `umap()` fail,
/// `warnings` are logged once.
#[derive(Default)]
struct Problems {
    invalid: Vec<String>,
    warnings: Vec<String>,
}

/// A numeric `UMAP_*` variable, read as UMap reads it (see the module
/// docs); one that reads 0 counts as unset.
fn var(name: &str, p: &mut Problems) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let t = v.trim_start();
    let digits = &t[..t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len()];
    if digits.is_empty() {
        p.warnings.push(format!(
            "{name}={v:?} is not a number: treated as unset, as UMap does"
        ));
        return None;
    }
    let Ok(n) = digits.parse::<u64>() else {
        p.invalid
            .push(format!("{name}={v:?} does not fit in 64 bits"));
        return None;
    };
    if n == 0 {
        p.warnings
            .push(format!("{name}={v:?} is treated as unset, as UMap does"));
        return None;
    }
    if digits.len() < t.trim_end().len() {
        p.warnings.push(format!(
            "{name}={v:?} is read as {n}, as UMap does (what follows the digits is ignored)"
        ));
    }
    Some(n)
}

/// Bytes of `MemFree` in `/proc/meminfo` (UMap sizes its default buffer
/// from it, not from `MemAvailable`).
fn free_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemFree:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(1 << 30, |kb| kb * 1024)
}

/// `UMAP_LOG_LEVEL`: an unknown level is warned about and ignored (UMap
/// prints the levels it knows and goes on).
fn log_level(p: &mut Problems) -> Level {
    let Ok(v) = std::env::var("UMAP_LOG_LEVEL") else {
        return Level::Error;
    };
    match v.trim().to_ascii_uppercase().as_str() {
        "ERROR" | "0" => Level::Error,
        "WARNING" | "WARN" | "1" => Level::Warning,
        "INFO" | "2" => Level::Info,
        "DEBUG" | "3" => Level::Debug,
        _ => {
            p.warnings.push(format!(
                "UMAP_LOG_LEVEL={v:?} is not one of ERROR, WARNING, INFO, DEBUG; using ERROR"
            ));
            Level::Error
        }
    }
}

impl Config {
    /// Reads the environment.
    pub fn from_env() -> Config {
        let mut p = Problems::default();
        let threads = online_cpus().max(1) as u64;
        let page_size = var("UMAP_PAGESIZE", &mut p).unwrap_or(SYSTEM_PAGE);
        if !page_size.is_multiple_of(SYSTEM_PAGE) {
            p.invalid.push(format!(
                "UMAP_PAGESIZE={page_size} must be a multiple of {SYSTEM_PAGE}"
            ));
        }
        let buf_pages = var("UMAP_BUFSIZE", &mut p)
            .unwrap_or_else(|| (free_memory() * 9 / 10 / page_size.max(SYSTEM_PAGE)).max(1));
        let fillers_var = var("UMAP_PAGE_FILLERS", &mut p);
        let evictors = var("UMAP_PAGE_EVICTORS", &mut p).unwrap_or(threads);
        let high_water = var("UMAP_EVICT_HIGH_WATER_THRESHOLD", &mut p).unwrap_or(90);
        let low_water = var("UMAP_EVICT_LOW_WATER_THRESHOLD", &mut p).unwrap_or(70);
        if high_water > 100 || low_water > high_water {
            p.invalid.push(format!(
                "the eviction thresholds must satisfy 0 < LOW ({low_water}) <= HIGH ({high_water}) <= 100"
            ));
        }
        let read_ahead = var("UMAP_READ_AHEAD", &mut p);
        let max_fault_events = var("UMAP_MAX_FAULT_EVENTS", &mut p).unwrap_or(256);
        let log_level = log_level(&mut p);
        let file_io = match std::env::var("FAULTLINE_UMAP_FILE_IO").as_deref() {
            Err(_) | Ok("cached") => FileIo::Cached,
            Ok("buffered") => FileIo::Buffered,
            Ok("direct") => FileIo::Direct,
            Ok(v) => {
                p.invalid.push(format!(
                    "FAULTLINE_UMAP_FILE_IO={v:?} is not \"cached\", \"buffered\" or \"direct\""
                ));
                FileIo::Cached
            }
        };
        let Problems { invalid, warnings } = p;
        Config {
            page_size,
            buf_pages,
            fillers: fillers_var.unwrap_or(threads),
            fillers_set: fillers_var.is_some(),
            evictors,
            high_water,
            low_water,
            read_ahead,
            max_fault_events,
            log_level,
            file_io,
            invalid,
            warnings,
        }
    }

    /// The region page size: the largest power of two that divides
    /// `UMAP_PAGESIZE` (all of it when it is a power of two). faultline's
    /// page size is a shift in the fault path, so a UMap page of, say,
    /// 12 KiB is a group of three 4 KiB region pages.
    pub fn region_page_size(&self) -> u64 {
        1 << self.page_size.max(1).trailing_zeros()
    }

    /// Region pages per UMap page: 1 unless `UMAP_PAGESIZE` is not a power
    /// of two.
    pub fn group(&self) -> usize {
        (self.page_size / self.region_page_size()).max(1) as usize
    }

    /// The buffer, for all regions together: `BUFSIZE` UMap pages (at
    /// least 1), in region pages. Resident pages never exceed it.
    pub fn budget_pages(&self) -> usize {
        (self.buf_pages.clamp(1, usize::MAX as u64) as usize).saturating_mul(self.group())
    }

    /// `percent` of the buffer, in region pages (UMap's
    /// `apply_int_percentage`: 100% is all of it).
    fn percent_pages(&self, percent: u64) -> usize {
        let umap_pages = (self.buf_pages.saturating_mul(percent) / 100).min(usize::MAX as u64);
        (umap_pages as usize)
            .saturating_mul(self.group())
            .min(self.budget_pages())
    }

    /// Where the evictors start: `BUFSIZE * HIGH / 100` UMap pages (at
    /// least 1), in region pages.
    pub fn high_water_pages(&self) -> usize {
        self.percent_pages(self.high_water).max(1)
    }

    /// Where the evictors stop: `BUFSIZE * LOW / 100` UMap pages (at most
    /// the high-water mark), in region pages.
    pub fn low_water_pages(&self) -> usize {
        self.percent_pages(self.low_water)
            .min(self.high_water_pages())
    }

    /// Evictor threads per region: `UMAP_PAGE_EVICTORS`, at most
    /// [`MAX_REGION_EVICTORS`] (UMap's evictors serve every region; here
    /// each region has its own, so a process of many regions on a large
    /// machine does not start thousands).
    pub fn region_evictors(&self) -> usize {
        (self.evictors as usize).clamp(1, MAX_REGION_EVICTORS)
    }

    /// How many region pages a fault installs: the aligned window of
    /// `READ_AHEAD + 1` UMap pages when set; unset, one UMap page for an
    /// isolated fault, as UMap (every page more is one more to evict under
    /// a small buffer), growing on a thread's sequential stream to at
    /// least 64 region pages (256 KiB of 4 KiB pages), in whole UMap pages.
    pub fn readahead(&self) -> ReadaheadConfig {
        let g = self.group();
        match self.read_ahead {
            Some(n) => ReadaheadConfig::fixed((n as usize).saturating_add(1).saturating_mul(g)),
            None => ReadaheadConfig::adaptive(g, g * 64usize.div_ceil(g)),
        }
    }
}

/// The process's configuration (read at the first call).
pub fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let c = Config::from_env();
        for w in &c.warnings {
            log(Level::Warning, w, c.log_level.max(Level::Warning));
        }
        log(
            Level::Info,
            &format!(
                "umap config: page size {} bytes, buffer {} pages, fillers {}{}, evictors {}, high water {}%, low water {}%, read ahead {}, max fault events {}",
                c.page_size,
                c.buf_pages,
                c.fillers,
                if c.fillers_set { "" } else { " (unset: signal engine for file regions)" },
                c.evictors,
                c.high_water,
                c.low_water,
                c.read_ahead.map_or("adaptive (unset)".to_string(), |n| n.to_string()),
                c.max_fault_events
            ),
            c.log_level,
        );
        c
    })
}

/// Writes `msg` to stderr if `level` is enabled under `threshold`.
pub fn log(level: Level, msg: &str, threshold: Level) {
    if level <= threshold {
        let name = match level {
            Level::Error => "ERROR",
            Level::Warning => "WARNING",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
        };
        eprintln!("[umap {name}] {msg}");
    }
}

/// Logs at `level` under the process configuration.
pub fn log_at(level: Level, msg: impl FnOnce() -> String) {
    let threshold = config().log_level;
    if level <= threshold {
        log(level, &msg(), threshold);
    }
}
