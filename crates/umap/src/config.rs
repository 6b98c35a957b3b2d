//! UMap's configuration: the `UMAP_*` environment variables, read once, at
//! the first call, with UMap's defaults.
//!
//! | variable | UMap's meaning | default | here |
//! |---|---|---|---|
//! | `UMAP_PAGESIZE` | bytes per UMap page (a multiple of the system page) | system page size | the region page size when a power of two; otherwise a UMap page is a group of region pages of the largest power of two dividing it, which faults install and the buffer counts together (eviction and write-back go by region page) |
//! | `UMAP_BUFSIZE` | UMap pages resident at once | 90% of available memory | one [`faultline::SharedBudget`] for every region of the process, times the high-water mark |
//! | `UMAP_PAGE_FILLERS` | threads reading pages from the store | hardware threads | handler threads of the workers engine; unset, file regions use the signal engine (faults resolved on the faulting thread, no fillers) |
//! | `UMAP_PAGE_EVICTORS` | threads evicting pages | hardware threads | reported; each region has one evictor thread (it evicts that region's pages while the buffer is over) |
//! | `UMAP_EVICT_HIGH_WATER_THRESHOLD` | percent of the buffer at which eviction starts | 90 | the budget is `BUFSIZE * HIGH / 100` pages |
//! | `UMAP_EVICT_LOW_WATER_THRESHOLD` | percent at which eviction stops | 70 | once past the budget, the evictor evicts down to `BUFSIZE * LOW / 100` pages (`LOW <= HIGH`) |
//! | `UMAP_READ_AHEAD` | pages read ahead of a fault | 0 | set: every fault installs the aligned window of `READ_AHEAD + 1` pages; unset: faultline's adaptive read-ahead |
//! | `UMAP_MAX_FAULT_EVENTS` | uffd events read at once | 256 | messages per `read(2)` of the workers engine |
//! | `UMAP_LOG_LEVEL` | log verbosity | errors only | `ERROR`, `WARNING`, `INFO`, `DEBUG` (or 0-3) on stderr |

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
    /// Variables that were set but invalid, with why (reported by every
    /// `umap()`, which then fails with `EINVAL`).
    pub invalid: Vec<String>,
}

/// The system page size.
pub const SYSTEM_PAGE: u64 = 4096;

fn var(name: &str, invalid: &mut Vec<String>) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse::<u64>() {
        Ok(n) => Some(n),
        Err(_) => {
            invalid.push(format!("{name}={v:?} is not a number"));
            None
        }
    }
}

/// Bytes of `MemAvailable` in `/proc/meminfo`.
fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(1 << 30, |kb| kb * 1024)
}

fn log_level(invalid: &mut Vec<String>) -> Level {
    let Ok(v) = std::env::var("UMAP_LOG_LEVEL") else {
        return Level::Error;
    };
    match v.trim().to_ascii_uppercase().as_str() {
        "ERROR" | "0" => Level::Error,
        "WARNING" | "WARN" | "1" => Level::Warning,
        "INFO" | "2" => Level::Info,
        "DEBUG" | "3" => Level::Debug,
        _ => {
            invalid.push(format!(
                "UMAP_LOG_LEVEL={v:?} is not ERROR, WARNING, INFO or DEBUG"
            ));
            Level::Error
        }
    }
}

impl Config {
    /// Reads the environment.
    pub fn from_env() -> Config {
        let mut invalid = Vec::new();
        let threads = online_cpus().max(1) as u64;
        let page_size = var("UMAP_PAGESIZE", &mut invalid).unwrap_or(SYSTEM_PAGE);
        if page_size < SYSTEM_PAGE || !page_size.is_multiple_of(SYSTEM_PAGE) {
            invalid.push(format!(
                "UMAP_PAGESIZE={page_size} must be a non-zero multiple of {SYSTEM_PAGE}"
            ));
        }
        let buf_pages = var("UMAP_BUFSIZE", &mut invalid)
            .unwrap_or_else(|| available_memory() * 9 / 10 / page_size.max(SYSTEM_PAGE));
        let fillers_var = var("UMAP_PAGE_FILLERS", &mut invalid);
        let evictors = var("UMAP_PAGE_EVICTORS", &mut invalid).unwrap_or(threads);
        let high_water = var("UMAP_EVICT_HIGH_WATER_THRESHOLD", &mut invalid).unwrap_or(90);
        let low_water = var("UMAP_EVICT_LOW_WATER_THRESHOLD", &mut invalid).unwrap_or(70);
        if buf_pages == 0 {
            invalid.push("UMAP_BUFSIZE must be at least 1".into());
        }
        if fillers_var == Some(0) {
            invalid.push("UMAP_PAGE_FILLERS must be at least 1".into());
        }
        if evictors == 0 {
            invalid.push("UMAP_PAGE_EVICTORS must be at least 1".into());
        }
        if high_water == 0 || high_water > 100 || low_water > high_water {
            invalid.push(format!(
                "the eviction thresholds must satisfy 0 <= LOW ({low_water}) <= HIGH ({high_water}) <= 100, HIGH > 0"
            ));
        }
        let read_ahead = var("UMAP_READ_AHEAD", &mut invalid);
        let max_fault_events = var("UMAP_MAX_FAULT_EVENTS", &mut invalid).unwrap_or(256);
        if max_fault_events == 0 {
            invalid.push("UMAP_MAX_FAULT_EVENTS must be at least 1".into());
        }
        let log_level = log_level(&mut invalid);
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
            invalid,
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

    /// The buffer's budget, for all regions together: `BUFSIZE * HIGH /
    /// 100` UMap pages (at least 1), in region pages.
    pub fn budget_pages(&self) -> usize {
        let umap_pages =
            (self.buf_pages.saturating_mul(self.high_water) / 100).clamp(1, usize::MAX as u64);
        (umap_pages as usize).saturating_mul(self.group())
    }

    /// Where eviction stops once it started: `BUFSIZE * LOW / 100` UMap
    /// pages (at most the budget), in region pages.
    pub fn low_water_pages(&self) -> usize {
        let umap_pages =
            (self.buf_pages.saturating_mul(self.low_water) / 100).min(usize::MAX as u64);
        (umap_pages as usize)
            .saturating_mul(self.group())
            .min(self.budget_pages())
    }

    /// How many region pages a fault installs: the aligned window of
    /// `READ_AHEAD + 1` UMap pages when set; unset, faultline's adaptive
    /// read-ahead (`None`: the region's default), in whole UMap pages when
    /// a UMap page is a group (fault-around of one UMap page, growing to
    /// at least 32 region pages on sequential streams).
    pub fn readahead(&self) -> Option<ReadaheadConfig> {
        let g = self.group();
        match self.read_ahead {
            Some(n) => Some(ReadaheadConfig::fixed(
                (n as usize).saturating_add(1).saturating_mul(g),
            )),
            None if g == 1 => None,
            None => Some(ReadaheadConfig::adaptive(g, g * 32usize.div_ceil(g))),
        }
    }
}

/// The process's configuration (read at the first call).
pub fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let c = Config::from_env();
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
