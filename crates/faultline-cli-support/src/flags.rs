//! Numeric flags: every one has a range, checked by clap before any work,
//! and the sizes derived from several flags are checked against what the
//! machine has before any work too.
//!
//! How a numeric flag is checked:
//!
//! 1. Its value parser ([`range`], [`range_u64`], [`range_u32`],
//!    [`float`], [`threads`], [`fits_memory`]) reads the text: a negative
//!    number, a fraction, `NaN`, an infinity, an empty string or a number
//!    past `u64::MAX` are each refused with what is wrong, never with
//!    Rust's parse error.
//! 2. It checks the range and says it, always in the same words: `must be
//!    from LO to HI` (the range printed in full, so a script or a test can
//!    read it back), then why in parentheses where the bound is the
//!    machine's: the threads it can still start ([`thread_headroom`]),
//!    the memory it has ([`crate::mem_available`]).
//! 3. Sizes that several flags make together (a region rounded up to a
//!    window, N threads times their share) are checked by the command with
//!    [`check_memory`], [`check_threads`] and [`check_disk`] before it
//!    starts: each says what it would take against what there is.
//!
//! ```text
//!   "--threads 100000" ─► clap ─► threads() ─► 1..=thread_headroom() ─► Ok(n) / Err("must be from 1 to 32557 (...)")
//!   flags together     ─► command's plan ─► check_memory / check_threads / check_disk ─► work
//! ```

use std::fmt::Display;
use std::path::Path;

use anyhow::bail;

/// Most repetitions of a measurement (`--reps`): medians of more say
/// nothing new, and a typo of a few zeros must not run for days.
pub const MAX_REPS: usize = 1000;

/// Most pages a fault resolves at once (`--fault-around`, `--depths`):
/// 512 pages of 4 KiB, a 2 MiB huge page.
pub const MAX_FAULT_AROUND: usize = 512;

/// Threads kept back from [`thread_headroom`]: the command's own helpers
/// (progress, signals, engines' handler threads) and some room for the
/// rest of the machine.
const THREAD_RESERVE: u64 = 64;

/// Why a range's upper bound is what it is, printed after it.
const WHY_THREADS: &str =
    "the threads this machine can still start: pid_max, threads-max, RLIMIT_NPROC, \
     the cgroup's pids.max and vm.max_map_count, less those running";

/// The text of a range refusal: `must be from LO to HI` and, if given,
/// why in parentheses. Every numeric flag says its range this way.
pub fn range_error(lo: impl Display, hi: impl Display, why: &str) -> String {
    if why.is_empty() {
        format!("must be from {lo} to {hi}")
    } else {
        format!("must be from {lo} to {hi} ({why})")
    }
}

/// Reads a whole number, saying what is wrong with anything else.
pub fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    if t.is_empty() {
        return Err("empty: give a whole number".into());
    }
    if t.starts_with('-') {
        return Err(format!(
            "{s:?} is negative: give a whole number of at least 0"
        ));
    }
    let digits = t.strip_prefix('+').unwrap_or(&t);
    if !digits.bytes().all(|b| b.is_ascii_digit()) || digits.is_empty() {
        let lower = digits.to_ascii_lowercase();
        let why = if lower.contains("nan") || lower.contains("inf") {
            "not a number"
        } else if digits.parse::<f64>().is_ok() {
            "not a whole number"
        } else {
            "not a number"
        };
        return Err(format!("{s:?} is {why}: give a whole number"));
    }
    digits
        .parse::<u64>()
        .map_err(|_| format!("{s:?} is past {} (the largest number)", u64::MAX))
}

/// Reads a byte count: a whole number, optionally followed by a binary
/// unit (`K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`, any case: `64M`,
/// `1GiB`). `KB`/`MB`/`GB`/`TB` are refused with what to write instead
/// (whether they mean 1000 or 1024 differs between tools).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic())
        .filter(|_| {
            !t.to_ascii_lowercase().contains("inf") && !t.to_ascii_lowercase().contains("nan")
        })
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        "kb" | "mb" | "gb" | "tb" => {
            return Err(format!(
                "{s:?}: write {num}{}iB (binary) or the number of bytes",
                &unit[..1].to_ascii_uppercase()
            ))
        }
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (give bytes, or K, M, G, T: KiB, MiB, GiB, TiB)"
            ))
        }
    };
    let v = parse_u64(num).map_err(|e| {
        if unit.is_empty() {
            e
        } else {
            format!("{s:?}: {e}")
        }
    })?;
    v.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is past {} bytes (the largest number)", u64::MAX))
}

/// Reads a finite number, saying what is wrong with anything else.
pub fn parse_f64(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty: give a number".into());
    }
    let v: f64 = t.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_nan() {
        return Err(format!("{s:?} is not a number"));
    }
    if v.is_infinite() {
        return Err(format!("{s:?} is infinite: give a finite number"));
    }
    Ok(v)
}

fn check(v: u64, lo: u64, hi: u64, why: &str) -> Result<u64, String> {
    if v < lo || v > hi {
        return Err(range_error(lo, hi, why));
    }
    Ok(v)
}

/// `--reps`: 1 to [`MAX_REPS`].
pub fn reps() -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    range(1, MAX_REPS)
}

/// A size in MiB, from 1 to what `MemAvailable` holds.
pub fn mib() -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    fits_memory(1, 1 << 20, "MiB")
}

/// A count of 4 KiB pages, from 1 to what `MemAvailable` holds.
pub fn pages() -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    fits_memory(1, 4096, "pages of 4 KiB")
}

/// Pages per fault: 1 to [`MAX_FAULT_AROUND`].
pub fn fault_around() -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| {
        let v = parse_u64(s)?;
        Ok(check(
            v,
            1,
            MAX_FAULT_AROUND as u64,
            "pages of 4 KiB per fault: 512 are a 2 MiB huge page",
        )? as usize)
    }
}

/// A power of two from `lo` to `hi` (both powers of two).
pub fn power_of_two(
    lo: usize,
    hi: usize,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| {
        let v = check(parse_u64(s)?, lo as u64, hi as u64, "a power of two")?;
        if !v.is_power_of_two() {
            return Err(format!(
                "{v} is not a power of two ({})",
                range_error(lo, hi, "")
            ));
        }
        Ok(v as usize)
    }
}

/// A byte size ([`parse_bytes`]: `256K`, `2M`) from `lo` to `hi` bytes, a
/// multiple of `unit`.
pub fn byte_size(
    lo: u64,
    hi: u64,
    unit: u64,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| {
        let v = parse_bytes(s)?;
        if v < lo || v > hi || v % unit != 0 {
            let why = format!(
                "bytes, a multiple of {unit}: {} to {}",
                fmt_bytes(lo),
                fmt_bytes(hi)
            );
            return Err(format!("{s:?}: {}", range_error(lo, hi, &why)));
        }
        Ok(v as usize)
    }
}

/// A value parser of a count from `lo` to `hi`.
pub fn range(lo: usize, hi: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| Ok(check(parse_u64(s)?, lo as u64, hi as u64, "")? as usize)
}

/// [`range`] as a `u64`.
pub fn range_u64(lo: u64, hi: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync {
    move |s| check(parse_u64(s)?, lo, hi, "")
}

/// [`range`] as a `u32`.
pub fn range_u32(lo: u32, hi: u32) -> impl Fn(&str) -> Result<u32, String> + Clone + Send + Sync {
    move |s| Ok(check(parse_u64(s)?, lo.into(), hi.into(), "")? as u32)
}

/// A value parser of a finite number from `lo` to `hi` (`lo` itself
/// excluded when `open_lo`: a rate or a duration that must be positive).
pub fn float(
    lo: f64,
    hi: f64,
    open_lo: bool,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |s| {
        let v = parse_f64(s)?;
        let low = if open_lo { v <= lo } else { v < lo };
        if low || v > hi {
            let lo_text = if open_lo {
                format!("more than {lo}")
            } else {
                lo.to_string()
            };
            return Err(format!("must be from {lo_text} to {hi}"));
        }
        Ok(v)
    }
}

/// A value parser of a thread count from `lo` to [`thread_headroom`] (read
/// when the flag is parsed).
pub fn threads(lo: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| {
        let v = parse_u64(s)?;
        let hi = thread_headroom().max(lo);
        Ok(check(v, lo as u64, hi as u64, WHY_THREADS)? as usize)
    }
}

/// A value parser of a count of things that each take `unit` bytes of
/// memory, from `lo` to as many as `MemAvailable` holds (read when the
/// flag is parsed; `what` names a unit in the message: "pages of 4 KiB,
/// about 16 KiB each").
pub fn fits_memory(
    lo: u64,
    unit: u64,
    what: &'static str,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s| {
        let v = parse_u64(s)?;
        let avail = crate::mem_available().unwrap_or(u64::MAX);
        let hi = (avail / unit.max(1)).clamp(lo, usize::MAX as u64);
        let why = format!("{what}; MemAvailable is {}", fmt_bytes(avail));
        Ok(check(v, lo, hi, &why)? as usize)
    }
}

/// A byte count for people: `512 B`, `4.0 KiB`, `1.5 GiB`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

/// How many more threads this process can start now: the smallest of
/// the kernel's and the cgroup's limits less what runs, less a reserve
/// (at least 1).
///
/// * `kernel.pid_max` and `kernel.threads-max` less the threads of the
///   whole machine (`/proc/loadavg`'s fourth field);
/// * `RLIMIT_NPROC` (`/proc/self/limits`) less the same (an upper bound
///   of the user's own);
/// * the cgroup's `pids.max` less its `pids.current` (v2, or v1's `pids`
///   controller);
/// * `vm.max_map_count` less this process's mappings, halved: a thread's
///   stack is a mapping and its guard page another.
pub fn thread_headroom() -> usize {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let num = |p: &str| read(p).and_then(|s| s.trim().parse::<u64>().ok());
    let running: u64 = read("/proc/loadavg")
        .and_then(|s| {
            let f = s.split_whitespace().nth(3)?;
            f.split('/').nth(1)?.parse().ok()
        })
        .unwrap_or(0);
    let mut room = u64::MAX;
    for limit in [
        num("/proc/sys/kernel/pid_max"),
        num("/proc/sys/kernel/threads-max"),
        nproc_limit(),
    ]
    .into_iter()
    .flatten()
    {
        room = room.min(limit.saturating_sub(running));
    }
    if let Some(left) = cgroup_pids_left() {
        room = room.min(left);
    }
    if let Some(max_maps) = num("/proc/sys/vm/max_map_count") {
        let maps = read("/proc/self/maps").map_or(0, |s| s.lines().count() as u64);
        room = room.min(max_maps.saturating_sub(maps) / 2);
    }
    room.saturating_sub(THREAD_RESERVE)
        .clamp(1, usize::MAX as u64) as usize
}

/// `RLIMIT_NPROC`'s soft limit (`None`: unlimited or unknown).
fn nproc_limit() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = s.lines().find(|l| l.starts_with("Max processes"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Tasks the process's cgroup may still start (`None`: no limit found).
fn cgroup_pids_left() -> Option<u64> {
    let g = faultline_sys::cgroup::of(0, "pids").ok()??;
    // "max": no limit.
    let max = g.number("pids.max")?;
    Some(max.saturating_sub(g.number("pids.current")?))
}

/// Refuses `need` bytes of memory past `MemAvailable`, saying what needs
/// it (`what`, e.g. "bench offload: 4 regions of 16 MiB").
pub fn check_memory(need: u64, what: impl Display) -> anyhow::Result<()> {
    if let Some(avail) = crate::mem_available() {
        if need > avail {
            bail!(
                "{what}: needs about {} of memory, MemAvailable is {}",
                fmt_bytes(need),
                fmt_bytes(avail)
            );
        }
    }
    Ok(())
}

/// Refuses `n` threads past [`thread_headroom`], saying what starts them.
pub fn check_threads(n: u64, what: impl Display) -> anyhow::Result<()> {
    let room = thread_headroom() as u64;
    if n > room {
        bail!("{what}: starts {n} threads, this machine can start {room} more ({WHY_THREADS})");
    }
    Ok(())
}

/// The most of the thread counts a flag lists (1 if none), refused past
/// [`thread_headroom`] as `{command} --threads N` (see [`check_threads`]).
pub fn most_threads(counts: &[usize], command: &str) -> anyhow::Result<usize> {
    let most = counts.iter().copied().max().unwrap_or(1);
    check_threads(most as u64, format_args!("{command} --threads {most}"))?;
    Ok(most)
}

/// Refuses `need` bytes on the file system of `path` past its free space.
pub fn check_disk(path: &Path, need: u64, what: impl Display) -> anyhow::Result<()> {
    if let Some(free) = crate::disk_free(path) {
        if need > free {
            bail!(
                "{what}: needs about {} on the file system of {}, {} free",
                fmt_bytes(need),
                path.display(),
                fmt_bytes(free)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_binary_units_and_refuse_ambiguous_ones() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes(" 1GiB "), Ok(1 << 30));
        assert_eq!(parse_bytes("2k"), Ok(2048));
        assert_eq!(parse_bytes("3tib"), Ok(3 << 40));
        for (s, want) in [
            ("64MB", "64MiB"),
            ("1x", "unknown unit"),
            ("9.9M", "not a whole number"),
            ("-1G", "negative"),
            ("M", "empty"),
            ("inf", "not a number"),
            ("NaN", "not a number"),
            ("", "empty"),
            ("17179869184G", "past"),
        ] {
            let e = parse_bytes(s).unwrap_err();
            assert!(e.contains(want), "{s:?}: {e}");
        }
    }

    #[test]
    fn byte_sizes_are_bounded_and_whole_units() {
        let p = byte_size(4096, 64 << 20, 4096);
        assert_eq!(p("256K"), Ok(256 << 10));
        assert_eq!(p("2M"), Ok(2 << 20));
        let e = p("1K").unwrap_err();
        assert!(
            e.contains(
                "must be from 4096 to 67108864 (bytes, a multiple of 4096: 4.0 KiB to 64.0 MiB)"
            ),
            "{e}"
        );
        assert!(p("128M").is_err());
        assert!(p("6000").unwrap_err().contains("a multiple of 4096"));
        assert!(p("2MB").unwrap_err().contains("2MiB"));
    }

    #[test]
    fn whole_numbers_say_what_is_wrong() {
        assert_eq!(parse_u64(" 42 "), Ok(42));
        assert_eq!(parse_u64("1_000"), Ok(1000));
        for (s, want) in [
            ("", "empty"),
            ("-1", "negative"),
            ("9.9", "not a whole number"),
            ("1e12", "not a whole number"),
            ("NaN", "not a number"),
            ("inf", "not a number"),
            ("x", "not a number"),
            ("18446744073709551616", "past 18446744073709551615"),
        ] {
            let e = parse_u64(s).unwrap_err();
            assert!(e.contains(want), "{s:?}: {e}");
        }
        assert_eq!(parse_u64("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn ranges_print_both_bounds() {
        let p = range(1, 64);
        assert_eq!(p("64"), Ok(64));
        assert_eq!(p("0").unwrap_err(), "must be from 1 to 64");
        assert_eq!(p("65").unwrap_err(), "must be from 1 to 64");
        let f = float(0.0, 100.0, true);
        assert_eq!(f("100"), Ok(100.0));
        assert!(f("0").unwrap_err().contains("from more than 0 to 100"));
        assert!(f("NaN").unwrap_err().contains("not a number"));
        assert!(f("-inf").unwrap_err().contains("infinite"));
    }

    #[test]
    fn machine_bounds_are_read_when_parsed() {
        // The headroom moves while other tests start and end threads: a
        // value well inside it is accepted, one far past it refused with
        // the bound read at that moment.
        let room = thread_headroom();
        assert!(room >= 1);
        let t = threads(1);
        assert_eq!(t("1"), Ok(1));
        let far = room.saturating_mul(4).saturating_add(100_000);
        let e = t(&far.to_string()).unwrap_err();
        let bound: usize = e
            .strip_prefix("must be from 1 to ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no bound in {e:?}"));
        assert!(bound >= 1 && bound < far, "{e}");
        let half = (bound / 2).max(1);
        assert_eq!(t(&half.to_string()), Ok(half), "{e}");
        let avail = crate::mem_available().unwrap();
        let m = fits_memory(1, 1 << 20, "MiB");
        let e = m(&u64::MAX.to_string()).unwrap_err();
        assert!(e.contains("MemAvailable"), "{e}");
        assert!(m("1").is_ok());
        assert!(check_memory(avail.saturating_mul(2), "x").is_err());
        // Far past the headroom (it moves with the machine's other
        // threads, so one past it may fit a moment later).
        assert!(check_threads(far as u64, "x").is_err());
    }

    #[test]
    fn bytes_for_people() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(4096), "4.0 KiB");
        assert_eq!(fmt_bytes(3 << 29), "1.5 GiB");
    }
}
