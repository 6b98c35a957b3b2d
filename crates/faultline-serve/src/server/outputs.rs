//! What serve's outputs (`--json`, `--record`, `--track-dirty`) must never
//! be: a file serve reads (the memory file, its shared copy, the recorded
//! set), a socket path it binds, or another output, by whatever name (a
//! symbolic or hard link is the same file). Checked at start, the `{peer}`
//! templates as the paths they can become, and again for each path a
//! template becomes when it is written (a link made meanwhile).

use std::path::{Path, PathBuf};

use faultline_cli_support::OutputPath;

use crate::config::{ServeConfig, Source};
use crate::metrics::MetricsAddr;

/// The paths serve's outputs must not be, each with the flag naming it.
#[derive(Debug, Default)]
pub struct Protected(Vec<(PathBuf, &'static str)>);

impl Protected {
    /// What `config` reads and binds, and its `--json`.
    pub fn of(config: &ServeConfig) -> Protected {
        let mut v = vec![(config.socket.clone(), "--socket")];
        if let Source::Mem(p) = &config.source {
            v.push((p.clone(), "--mem"));
        }
        if let Some(p) = &config.shared {
            v.push((p.clone(), "--shared"));
        }
        if let Some(MetricsAddr::Unix(p)) = &config.metrics {
            v.push((p.clone(), "--metrics"));
        }
        if let Some(p) = &config.prefetch {
            v.push((p.clone(), "--prefetch"));
        }
        if let Some(p) = &config.json {
            v.push((p.clone(), "--json"));
        }
        Protected(v)
    }

    /// What output `flag` must not be: all of it but itself, and for
    /// `--record` not the `--prefetch` set (a restore may replace the set
    /// it was given with its own).
    pub fn against<'a>(&'a self, flag: &'a str) -> impl Iterator<Item = (&'a Path, &'a str)> {
        self.0
            .iter()
            .filter(move |(_, what)| {
                *what != flag && !(flag == "--record" && *what == "--prefetch")
            })
            .map(|(p, what)| (p.as_path(), *what))
    }

    /// `path` (what output `flag`'s template became) checked as at start,
    /// to be written.
    pub fn check(&self, path: &Path, flag: &str) -> anyhow::Result<OutputPath> {
        let out = OutputPath::check(path, flag)?;
        for (other, what) in self.against(flag) {
            out.refuse_same_as(other, what)?;
        }
        Ok(out)
    }
}

/// Whether `template`, a path with `{peer}` in it, becomes `other` for
/// some peer number (compared as absolute paths, `other` also with its
/// links resolved).
pub fn template_matches(template: &Path, other: &Path) -> bool {
    if !template.to_string_lossy().contains("{peer}") {
        return false;
    }
    let t = resolved(template).to_string_lossy().into_owned();
    let mut forms = vec![resolved(other)];
    forms.extend(std::fs::canonicalize(other));
    forms.iter().any(|o| becomes(&t, &o.to_string_lossy()))
}

/// `p` made absolute, its longest existing ancestor without `{peer}`
/// resolved (`..`, links).
fn resolved(p: &Path) -> PathBuf {
    let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    p.ancestors()
        .filter(|a| !a.to_string_lossy().contains("{peer}"))
        .find_map(|a| Some(std::fs::canonicalize(a).ok()?.join(p.strip_prefix(a).ok()?)))
        .unwrap_or(p.clone())
}

/// Whether `template` with each `{peer}` replaced by one number is `s`
/// (any leading run of the digits there may be the number: `m{peer}1`
/// becomes `m11`).
fn becomes(template: &str, s: &str) -> bool {
    let (first, _) = template.split_once("{peer}").expect("a template");
    let Some(rest) = s.strip_prefix(first) else {
        return false;
    };
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    (1..=digits).any(|d| template.replace("{peer}", &rest[..d]) == s)
}

/// Whether two `{peer}` templates become the same path for one peer
/// number (the record and the dirty set of a peer written to one file):
/// tried for the first numbers, where the digits can line up.
pub fn templates_meet(a: &Path, b: &Path) -> bool {
    let (a, b) = (a.to_string_lossy(), b.to_string_lossy());
    a.contains("{peer}")
        && b.contains("{peer}")
        && (1..=100_000u32).any(|n| {
            let n = n.to_string();
            a.replace("{peer}", &n) == b.replace("{peer}", &n)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_becomes_the_paths_of_every_peer_number_and_no_other() {
        assert!(becomes("/d/m{peer}.bin", "/d/m1.bin"));
        assert!(becomes("/d/m{peer}.bin", "/d/m42.bin"));
        assert!(becomes("/d/{peer}/r-{peer}", "/d/7/r-7"));
        assert!(!becomes("/d/{peer}/r-{peer}", "/d/7/r-8"));
        assert!(!becomes("/d/m{peer}.bin", "/d/m.bin"));
        assert!(!becomes("/d/m{peer}.bin", "/d/mx.bin"));
        assert!(!becomes("/d/m{peer}.bin", "/e/m1.bin"));
        assert!(becomes("/d/m{peer}1", "/d/m11"));
        assert!(templates_meet(Path::new("o{peer}1"), Path::new("o1{peer}")));
        assert!(!templates_meet(Path::new("r{peer}"), Path::new("d{peer}")));
        assert!(!template_matches(
            Path::new("/d/m.bin"),
            Path::new("/d/m.bin")
        ));
        assert!(template_matches(
            Path::new("/tmp/../tmp/m{peer}.bin"),
            Path::new("/tmp/m3.bin")
        ));
    }
}
