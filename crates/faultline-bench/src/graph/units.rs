//! Byte sizes on the command line: `4096`, `4K`, `64KiB`, `2M`, `1G`, and
//! memory budgets that may also be a percentage of the file (`25%`).

use std::fmt;
use std::str::FromStr;

/// Parses a byte count with an optional binary suffix (K, M, G, T; optional
/// `iB`/`B`; case-insensitive).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (num, suffix) = lower.split_at(digits_end);
    if num.is_empty() {
        return Err(format!(
            "invalid size {s:?}: expected a number with optional K/M/G/T suffix"
        ));
    }
    let value: u64 = num
        .parse()
        .map_err(|e| format!("invalid size {s:?}: {e}"))?;
    let shift = match suffix.trim_start() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("invalid size {s:?}: unknown suffix {other:?}")),
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid size {s:?}: too large"))
}

/// Formats a byte count with a binary suffix (`64K`, `2M`, `1.5G`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (name, unit) in UNITS {
        if bytes >= unit {
            return if bytes & (unit - 1) == 0 {
                format!("{}{name}", bytes / unit)
            } else {
                format!("{:.1}{name}", bytes as f64 / unit as f64)
            };
        }
    }
    format!("{bytes}B")
}

/// The smallest absolute budget: one 4 KiB page.
const MIN_BUDGET: u64 = 4096;

/// A memory budget: absolute, or a share of the graph file size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// A number of bytes.
    Bytes(u64),
    /// A percentage (0 < p <= 100) of the file size.
    Percent(f64),
}

impl Budget {
    /// The budget in bytes for a file of `file_bytes` bytes.
    pub fn resolve(self, file_bytes: u64) -> u64 {
        match self {
            Budget::Bytes(b) => b,
            Budget::Percent(p) => ((file_bytes as f64) * p / 100.0).ceil() as u64,
        }
    }
}

impl FromStr for Budget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().strip_suffix('%') {
            Some(p) => {
                let p: f64 = p
                    .trim()
                    .parse()
                    .map_err(|e| format!("invalid budget {s:?}: {e}"))?;
                if p > 0.0 && p <= 100.0 {
                    Ok(Budget::Percent(p))
                } else {
                    Err(format!(
                        "invalid budget {s:?}: percentage must be in (0, 100]"
                    ))
                }
            }
            None if s.trim().chars().all(|c| c.is_ascii_digit()) => Err(format!(
                "invalid budget {s:?}: give a unit (512M, 2G) or a share of the file \
                 (25%); a bare number would be bytes"
            )),
            None => match parse_size(s)? {
                b if b < MIN_BUDGET => Err(format!(
                    "invalid budget {s:?}: below the minimum of one 4K page"
                )),
                b => Ok(Budget::Bytes(b)),
            },
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Bytes(b) => f.write_str(&format_size(*b)),
            Budget::Percent(p) => write!(f, "{p}%"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64kib"), Ok(65536));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert!(parse_size("K").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(format_size(65536), "64K");
        assert_eq!(format_size(3 << 29), "1.5G");
        assert_eq!(format_size(100), "100B");
    }

    #[test]
    fn budgets() {
        assert_eq!("25%".parse(), Ok(Budget::Percent(25.0)));
        assert_eq!("1G".parse(), Ok(Budget::Bytes(1 << 30)));
        assert!("0".parse::<Budget>().is_err());
        // A bare number would be bytes: refused, as is less than a page.
        assert!("1".parse::<Budget>().unwrap_err().contains("give a unit"));
        assert!("1K".parse::<Budget>().unwrap_err().contains("minimum"));
        assert_eq!("4K".parse(), Ok(Budget::Bytes(4096)));
        assert!("150%".parse::<Budget>().is_err());
        assert_eq!(Budget::Percent(25.0).resolve(1000), 250);
    }
}
