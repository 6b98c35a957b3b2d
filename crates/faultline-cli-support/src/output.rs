//! Files the user names: checked before any work, written whole or not at
//! all, and never anything but a file.
//!
//! How an output is written ([`OutputPath::check`], then
//! [`OutputPath::write`] or [`OutputPath::begin`] + [`PendingOutput::commit`]):
//!
//! 1. The path is resolved: a symlink is followed to its target, which is
//!    what gets written (the link stays a link).
//! 2. What is there decides: nothing or a regular file is written under a
//!    temporary name in the same directory (`.NAME.partial-PID`) and
//!    renamed over it only when the whole output is written, so a failed
//!    or interrupted run leaves the old file (or no file) behind, never a
//!    partial one; the replaced file's permission bits are kept.
//!    `/dev/null` is written in place (timing a generator without keeping
//!    its output is a natural use). A directory, another device, a FIFO or
//!    a socket is refused: replacing it by a file would destroy it, and
//!    writing into it is not what an output file is.
//! 3. The parent directory must exist (a typo must not create a tree, as
//!    root even at `/`) and take new files (probed at check time, so a
//!    long run never ends in "cannot write").
//! 4. The temporary is registered with [`crate::cleanup`]: removed when the
//!    writer is dropped without committing, and on SIGINT/SIGTERM when the
//!    command installed the handler; a later run into the same directory
//!    removes the leftovers of a killed one ([`crate::cleanup::sweep`]).

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::cleanup::{self, PARTIAL};

/// What writing an [`OutputPath`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A regular file or a new path: temporary, then rename.
    File,
    /// `/dev/null`: written in place.
    Null,
}

/// An output path that passed the checks of the module doc.
#[derive(Debug, Clone)]
pub struct OutputPath {
    /// As the user wrote it (for messages).
    shown: PathBuf,
    /// The option that named it (for messages).
    flag: String,
    /// What is written: the path with symlinks resolved.
    target: PathBuf,
    kind: Kind,
    /// Permission bits of the file it replaces.
    mode: Option<u32>,
}

impl OutputPath {
    /// Checks `path` (named by option `flag` in messages) as the module
    /// doc says, before any work; writes nothing.
    pub fn check(path: &Path, flag: &str) -> anyhow::Result<OutputPath> {
        let shown = path.to_path_buf();
        let say = |what: &str| format!("{flag} {}: {what}", shown.display());
        if path.as_os_str().is_empty() {
            bail!("{flag}: an empty path");
        }
        let target = resolve(path).with_context(|| say("cannot follow the symbolic link"))?;
        let mut mode = None;
        match std::fs::metadata(&target) {
            Ok(m) => {
                let t = m.file_type();
                if t.is_dir() {
                    bail!("{}", say("is a directory, not a file"));
                }
                if t.is_char_device() && target == Path::new("/dev/null") {
                    return Ok(OutputPath {
                        shown,
                        flag: flag.into(),
                        target,
                        kind: Kind::Null,
                        mode: None,
                    });
                }
                let refused = if t.is_char_device() {
                    Some("a character device")
                } else if t.is_block_device() {
                    Some("a block device")
                } else if t.is_fifo() {
                    Some("a FIFO")
                } else if t.is_socket() {
                    Some("a socket")
                } else {
                    None
                };
                if let Some(what) = refused {
                    bail!(
                        "{}",
                        say(&format!(
                            "is {what}; outputs are written to regular files only \
                             (a new path, an existing file, or /dev/null to discard)"
                        ))
                    );
                }
                OpenOptions::new()
                    .append(true)
                    .open(&target)
                    .with_context(|| say("not writable"))?;
                mode = Some(m.permissions().mode() & 0o7777);
            }
            // ENOTDIR: a path component is a file; the parent check says so.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(faultline_sys::Errno::ENOTDIR.0) => {}
            Err(e) => return Err(e).with_context(|| say("cannot read what is there")),
        }
        // Nothing there yet (or a file below a file): a name that can
        // only be a directory's is not a file to write.
        if names_a_directory(path) {
            bail!(
                "{}",
                say("names a directory (it ends in '/', '.' or '..'), not a file")
            );
        }
        let dir = parent(&target);
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!("{}", say(&format!("{} is not a directory", dir.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
                "{}",
                say(&format!(
                    "directory {} does not exist (create it first)",
                    dir.display()
                ))
            ),
            Err(e) => return Err(e).with_context(|| say(&format!("{}", dir.display()))),
        }
        probe(&dir).with_context(|| say(&format!("cannot create files in {}", dir.display())))?;
        cleanup::sweep(&dir);
        Ok(OutputPath {
            shown,
            flag: flag.into(),
            target,
            kind: Kind::File,
            mode,
        })
    }

    /// The path as the user wrote it.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// The path that is written (symlinks resolved).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Refuses this output when it is `other` (what option `flag` names:
    /// a file the command reads, or another of its outputs): the same
    /// file however it is named (a symbolic or hard link, another
    /// spelling of the path), so writing it never replaces what the
    /// command was pointed at. `/dev/null` is never refused.
    pub fn refuse_same_as(&self, other: &Path, flag: &str) -> anyhow::Result<()> {
        if self.kind == Kind::File && same_file(&self.target, other) {
            bail!(
                "{} {}: the same file as {flag} {}: writing it would replace that",
                self.flag,
                self.shown.display(),
                other.display()
            );
        }
        Ok(())
    }

    /// Whether the output is `/dev/null` (written in place, nothing kept).
    pub fn is_null(&self) -> bool {
        self.kind == Kind::Null
    }

    /// Starts writing: a temporary file to fill and [`PendingOutput::commit`].
    pub fn begin(&self) -> anyhow::Result<PendingOutput> {
        if self.kind == Kind::Null {
            let file = OpenOptions::new()
                .write(true)
                .open(&self.target)
                .with_context(|| format!("opening {}", self.shown.display()))?;
            return Ok(PendingOutput {
                file: Some(file),
                tmp: None,
                out: self.clone(),
            });
        }
        let tmp = temp_sibling(&self.target);
        let guard = cleanup::register(&tmp);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(self.mode.unwrap_or(0o666))
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        if let Some(mode) = self.mode {
            // The umask applied at create: give the replaced file's bits back.
            file.set_permissions(Permissions::from_mode(mode))
                .with_context(|| format!("setting the mode of {}", tmp.display()))?;
        }
        Ok(PendingOutput {
            file: Some(file),
            tmp: Some((tmp, guard)),
            out: self.clone(),
        })
    }

    /// Writes the whole output with `fill` (buffered) and puts it in place.
    pub fn write(
        &self,
        fill: impl FnOnce(&mut BufWriter<&mut File>) -> io::Result<()>,
    ) -> anyhow::Result<()> {
        let mut p = self.begin()?;
        {
            let mut w = BufWriter::new(p.file());
            fill(&mut w).with_context(|| format!("writing {}", self.shown.display()))?;
            w.flush()
                .with_context(|| format!("writing {}", self.shown.display()))?;
        }
        p.commit()
    }

    /// Writes `bytes` as the whole output.
    pub fn write_bytes(&self, bytes: &[u8]) -> anyhow::Result<()> {
        self.write(|w| w.write_all(bytes))
    }

    /// Writes the whole output with `fill`, which opens and writes the path
    /// it is given itself (a library that takes a file name: a plotting
    /// backend); the path is the temporary, renamed over the output once
    /// `fill` succeeded (`/dev/null` itself for `/dev/null`).
    pub fn write_path(&self, fill: impl FnOnce(&Path) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let p = self.begin()?;
        let at = p.temp_path().unwrap_or(&self.target).to_path_buf();
        fill(&at).with_context(|| format!("writing {}", self.shown.display()))?;
        p.commit()
    }
}

/// An output being written: dropped without [`PendingOutput::commit`], its
/// temporary is removed and the destination is untouched.
#[derive(Debug)]
pub struct PendingOutput {
    file: Option<File>,
    tmp: Option<(PathBuf, cleanup::Guard)>,
    out: OutputPath,
}

impl PendingOutput {
    /// The file to write.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("present until commit")
    }

    /// The temporary's path (`None` for `/dev/null`).
    pub fn temp_path(&self) -> Option<&Path> {
        self.tmp.as_ref().map(|(p, _)| p.as_path())
    }

    /// Flushes the file to disk and renames it over the destination.
    pub fn commit(self) -> anyhow::Result<()> {
        self.finish(true)
    }

    /// Renames the file over the destination without waiting for the disk
    /// (a generator timing itself without the disk): a crash soon after
    /// may leave the destination empty, never partial under its name
    /// while the process runs.
    pub fn commit_unsynced(self) -> anyhow::Result<()> {
        self.finish(false)
    }

    fn finish(mut self, sync: bool) -> anyhow::Result<()> {
        let file = self.file.take().expect("present until commit");
        let Some((tmp, guard)) = self.tmp.take() else {
            return Ok(());
        };
        if sync {
            file.sync_all()
                .with_context(|| format!("writing {}", tmp.display()))?;
        }
        drop(file);
        std::fs::rename(&tmp, &self.out.target).with_context(|| {
            format!(
                "renaming {} to {}",
                tmp.display(),
                self.out.target.display()
            )
        })?;
        guard.disarm();
        Ok(())
    }
}

/// Whether `path` as written can only name a directory: it ends in `/`,
/// or its last component is `.` or `..` (`Path` drops a trailing `/` and
/// `.`, so `x.json/` would otherwise pass as the file `x.json` and fail
/// only at the rename, after the work).
fn names_a_directory(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = path.as_os_str().as_bytes();
    let last = b.rsplit(|&c| c == b'/').next().unwrap_or(b);
    b.ends_with(b"/") || last == b"." || last == b".."
}

/// Refuses output file `file` (named by option `file_flag`) where output
/// directory `dir` (option `dir_flag`, e.g. `--plot`) writes: `dir`
/// itself, or a file directly in it (where the directory's own files go,
/// under names the command chooses, so one may replace it, or it one of
/// them). Any spelling counts: links are followed, relative paths made
/// absolute; neither needs to exist yet. Check before any work (and
/// before `dir` is created).
pub fn refuse_file_in_dir(
    file: &Path,
    file_flag: &str,
    dir: &Path,
    dir_flag: &str,
) -> anyhow::Result<()> {
    let say = |what: &str| {
        format!(
            "{file_flag} {}: {what} {dir_flag} {}",
            file.display(),
            dir.display()
        )
    };
    if same_file(file, dir) || full_path(file) == full_path(dir) {
        bail!("{}", say("the same path as"));
    }
    let target = resolve(file).unwrap_or_else(|_| file.to_path_buf());
    let holder = parent(&target);
    if same_file(&holder, dir) || full_path(&holder) == full_path(dir) {
        bail!(
            "{}; put it outside that directory",
            say("is in the directory of")
        );
    }
    Ok(())
}

/// `path` absolute with links followed as far as it exists: the
/// canonical path of what exists, the rest appended as written.
fn full_path(path: &Path) -> PathBuf {
    let p = resolve(path).unwrap_or_else(|_| path.to_path_buf());
    if let Ok(c) = std::fs::canonicalize(&p) {
        return c;
    }
    match p.file_name() {
        Some(name) => full_path(&parent(&p)).join(name),
        None => std::path::absolute(&p).unwrap_or(p),
    }
}

/// Follows `path` through symbolic links (a dangling link resolves to the
/// path it names, which is then created).
fn resolve(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let next = std::fs::read_link(&p)?;
                p = if next.is_absolute() {
                    next
                } else {
                    parent(&p).join(next)
                };
            }
            _ => return Ok(p),
        }
    }
    Err(io::Error::from_raw_os_error(faultline_sys::Errno::ELOOP.0))
}

/// The directory holding `path` (`.` for a bare name).
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether `a` and `b` name one file: the same device and inode when both
/// exist (links followed), the same absolute path when neither does (two
/// outputs not yet written).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        (Err(_), Err(_)) => {
            // Links followed, dangling ones too: what would be written.
            let full = |p: &Path| {
                let p = resolve(p).unwrap_or_else(|_| p.to_path_buf());
                let name = p.file_name().map(PathBuf::from).unwrap_or_default();
                std::fs::canonicalize(parent(&p))
                    .map(|d| d.join(name))
                    .unwrap_or_else(|_| p.to_path_buf())
            };
            full(a) == full(b)
        }
        _ => false,
    }
}

/// Creates and removes a probe file in `dir`, of a name no other probe
/// uses at the same time: two threads checking one directory at once
/// (serve writing a record cut and a dirty set on two signals) each
/// removed the other's probe and failed with `ENOENT`.
fn probe(dir: &Path) -> io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Relaxed);
    let p = dir.join(format!(".faultline-probe-{}-{n}", std::process::id()));
    File::options().write(true).create_new(true).open(&p)?;
    std::fs::remove_file(&p)
}

/// A sibling of `path` to write into and rename over `path` on success:
/// `.NAME.partial-PID` (found and removed by [`cleanup::sweep`] once PID is
/// gone).
pub fn temp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    path.with_file_name(format!(".{name}{PARTIAL}{}", std::process::id()))
}

/// Checks that `dir` (an output directory, e.g. `--plot`) can take files:
/// created if missing when its parent exists (never a whole tree), and
/// probed.
pub fn output_dir(dir: &Path, flag: &str) -> anyhow::Result<()> {
    let say = |what: &str| format!("{flag} {}: {what}", dir.display());
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{}", say("exists and is not a directory")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let up = parent(dir);
            if !up.is_dir() {
                bail!(
                    "{}",
                    say(&format!(
                        "directory {} does not exist (create it first)",
                        up.display()
                    ))
                );
            }
            std::fs::create_dir(dir).with_context(|| say("cannot create it"))?;
        }
        Err(e) => return Err(e).with_context(|| say("cannot read it")),
    }
    probe(dir).with_context(|| say("not writable"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("faultline-out-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Threads checking one directory at once (serve's signal threads
    /// writing a record cut and a dirty set) never fail each other.
    #[test]
    fn probes_of_one_directory_from_many_threads_at_once_all_pass() {
        let d = dir("probes");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..500 {
                        probe(&d).unwrap();
                    }
                });
            }
        });
        assert!(entries(&d).is_empty(), "{:?}", entries(&d));
    }

    #[test]
    fn an_output_that_is_an_input_by_any_name_is_refused() {
        let d = dir("same");
        let mem = d.join("snapshot.mem");
        std::fs::write(&mem, b"snapshot").unwrap();
        symlink(&mem, d.join("link")).unwrap();
        std::fs::hard_link(&mem, d.join("hard")).unwrap();
        let other = d.join("other.json");
        std::fs::write(&other, b"{}").unwrap();
        for name in ["snapshot.mem", "link", "hard", "./snapshot.mem"] {
            let p = match name.strip_prefix("./") {
                Some(rest) => d.join(".").join(rest),
                None => d.join(name),
            };
            let out = OutputPath::check(&p, "--json").unwrap();
            let e = out.refuse_same_as(&mem, "--mem").unwrap_err().to_string();
            assert!(
                e.starts_with("--json ") && e.contains("the same file as --mem"),
                "{name}: {e}"
            );
        }
        let out = OutputPath::check(&other, "--json").unwrap();
        out.refuse_same_as(&mem, "--mem").unwrap();
        // Two outputs not yet written, spelled apart.
        let new = OutputPath::check(&d.join("x/../new.txt"), "--json");
        assert!(new.is_err(), "x does not exist");
        let new = OutputPath::check(&d.join("new.txt"), "--json").unwrap();
        let e = new.refuse_same_as(&d.join(".").join("new.txt"), "--record");
        assert!(e.is_err());
        new.refuse_same_as(&d.join("new2.txt"), "--record").unwrap();
        // A dangling link names what it would create.
        symlink(d.join("new.txt"), d.join("dangling")).unwrap();
        let e = new.refuse_same_as(&d.join("dangling"), "--json");
        assert!(e.is_err(), "a dangling link to it");
        // /dev/null is where anything may go.
        let null = OutputPath::check(Path::new("/dev/null"), "--json").unwrap();
        null.refuse_same_as(Path::new("/dev/null"), "--record")
            .unwrap();
        assert_eq!(std::fs::read(&mem).unwrap(), b"snapshot");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_new_file_appears_only_when_committed() {
        let d = dir("new");
        let out = OutputPath::check(&d.join("a.json"), "--json").unwrap();
        assert!(entries(&d).is_empty(), "checking creates nothing");
        let mut p = out.begin().unwrap();
        p.file().write_all(b"half").unwrap();
        assert!(!d.join("a.json").exists());
        drop(p);
        assert!(entries(&d).is_empty(), "an abandoned write leaves nothing");
        out.write_bytes(b"whole").unwrap();
        assert_eq!(std::fs::read(d.join("a.json")).unwrap(), b"whole");
        assert_eq!(entries(&d), ["a.json"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_its_mode() {
        let d = dir("old");
        let f = d.join("keep.bin");
        std::fs::write(&f, b"old bytes").unwrap();
        std::fs::set_permissions(&f, Permissions::from_mode(0o640)).unwrap();
        let out = OutputPath::check(&f, "-o").unwrap();
        let e = out
            .write(|w| {
                w.write_all(b"new")?;
                Err(io::Error::other("generator failed"))
            })
            .unwrap_err();
        assert!(format!("{e:#}").contains("generator failed"), "{e:#}");
        assert_eq!(std::fs::read(&f).unwrap(), b"old bytes");
        assert_eq!(entries(&d), ["keep.bin"]);
        out.write_bytes(b"new bytes").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new bytes");
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "the replaced file's mode is kept");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlink_is_followed_not_replaced() {
        let d = dir("link");
        std::fs::write(d.join("real"), b"x").unwrap();
        symlink("real", d.join("link")).unwrap();
        let out = OutputPath::check(&d.join("link"), "-o").unwrap();
        out.write_bytes(b"through the link").unwrap();
        assert!(std::fs::symlink_metadata(d.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(d.join("real")).unwrap(), b"through the link");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn devices_fifos_directories_and_missing_parents_are_refused() {
        let d = dir("refuse");
        let e = OutputPath::check(Path::new("/dev/full"), "-o").unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let fifo = d.join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let e = OutputPath::check(&fifo, "-o").unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = OutputPath::check(&d, "--json").unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let e = OutputPath::check(&d.join("no/such/x.json"), "--json").unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!d.join("no").exists(), "no directory is created");
        let null = OutputPath::check(Path::new("/dev/null"), "-o").unwrap();
        assert!(null.is_null());
        null.write_bytes(b"discarded").unwrap();
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_path_ending_as_a_directory_is_refused_before_any_work() {
        let d = dir("slash");
        for name in ["x.json/", "x.json/.", "x.json/.."] {
            let e = OutputPath::check(&d.join(name), "--json").unwrap_err();
            assert!(e.to_string().contains("names a directory"), "{name}: {e}");
        }
        assert!(entries(&d).is_empty(), "{:?}", entries(&d));
        OutputPath::check(&d.join("x.json"), "--json").unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_in_or_at_an_output_directory_is_refused() {
        let d = dir("indir");
        let plots = d.join("plots");
        // Neither exists yet: by their absolute spelling.
        for (file, why) in [
            (plots.clone(), "the same path as --plot"),
            (d.join("plots/."), "the same path as --plot"),
            (
                plots.join("notify_latency.png"),
                "is in the directory of --plot",
            ),
            (d.join("./plots/x.json"), "is in the directory of --plot"),
        ] {
            let e = refuse_file_in_dir(&file, "--json", &plots, "--plot").unwrap_err();
            assert!(e.to_string().contains(why), "{}: {e}", file.display());
        }
        // Once they exist, through a link too.
        std::fs::create_dir(&plots).unwrap();
        symlink(&plots, d.join("link")).unwrap();
        for file in [d.join("link/a.json"), plots.join("a.png")] {
            let e = refuse_file_in_dir(&file, "--json", &d.join("plots"), "--plot").unwrap_err();
            assert!(e.to_string().contains("in the directory of"), "{e}");
        }
        let e = refuse_file_in_dir(&d.join("link"), "--json", &plots, "--plot").unwrap_err();
        assert!(e.to_string().contains("the same path"), "{e}");
        // Beside it, or below it, is not where its files go.
        refuse_file_in_dir(&d.join("a.json"), "--json", &plots, "--plot").unwrap();
        refuse_file_in_dir(&d.join("plots2/a.json"), "--json", &plots, "--plot").unwrap();
        std::fs::create_dir(plots.join("sub")).unwrap();
        refuse_file_in_dir(&plots.join("sub/a.json"), "--json", &plots, "--plot").unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn output_dirs_are_made_one_level_only() {
        let d = dir("plots");
        output_dir(&d.join("plots"), "--plot").unwrap();
        assert!(d.join("plots").is_dir());
        let e = output_dir(&d.join("a/b"), "--plot").unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
