//! The processes of one restore: `faultline peer` (the VMM) and
//! `faultline serve` (the handler), both the binary this bench runs in.
//!
//! ```text
//!   Launcher::served(ws, extra, mode)
//!     1. start `serve --socket S --mem FILE|--store URL --json J --peers 1 [extra]`
//!     2. Launcher::peer(ws, backing): `peer --mem FILE --json P --threads N
//!        --working-set WS [--socket S] [--backend ...]`, bounded at 600 s
//!     3. wait for serve to exit (60 s), read both JSON reports and the
//!        prepare time serve logged on stderr
//! ```
//!
//! The kernel and baseline configurations run the peer alone
//! ([`Launcher::peer`], the file backend or this process's own handler).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline_cli_support::cleanup;
use faultline_serve::peer::PeerReport;
use faultline_serve::PeerSummary;

/// The binary this bench runs in: it runs `serve` and `peer` too.
pub fn exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("locating the faultline binary")
}

/// How the peer's memory is backed.
pub enum Backing<'a> {
    /// Anonymous memory handed over to the handler at `socket`.
    Uffd(&'a Path),
    /// `MAP_PRIVATE` of a file (the kernel baseline), no handler.
    File(&'a Path),
    /// `MAP_PRIVATE` of the shared snapshot, handed over (shared mode).
    Shared(&'a Path, &'a Path),
    /// 2 MiB hugetlb memory handed over (copy mode).
    Huge(&'a Path),
    /// `MAP_PRIVATE` of a file on hugetlbfs (2 MiB pages), no handler.
    FileHuge(&'a Path),
    /// `MAP_PRIVATE` of the shared copy on hugetlbfs, handed over.
    SharedHuge(&'a Path, &'a Path),
}

/// How `faultline serve` serves the peer of a configuration.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// Anonymous 4 KiB memory, copied.
    Copy,
    /// The shared snapshot (`--shared`), `UFFDIO_CONTINUE`.
    Shared(&'a Path),
    /// 2 MiB hugetlb memory, copied.
    Huge,
    /// The shared copy on hugetlbfs, `UFFDIO_CONTINUE` of 2 MiB pages.
    SharedHuge(&'a Path),
}

impl<'a> Mode<'a> {
    /// The mode of configuration `cfg` (its name's suffix), with the
    /// shared copies on tmpfs (`snap`) and hugetlbfs (`hsnap`).
    pub fn of(cfg: &str, snap: &'a Path, hsnap: &'a Path) -> Mode<'a> {
        if cfg.ends_with("-shared") {
            Mode::Shared(snap)
        } else if cfg.ends_with("-shared-huge") {
            Mode::SharedHuge(hsnap)
        } else if cfg.ends_with("-huge") {
            Mode::Huge
        } else {
            Mode::Copy
        }
    }
}

/// What every process of a bench run shares: where its files are, the
/// memory file, the peer's vCPUs and working-set pattern, and how serve
/// reads the memory.
#[derive(Clone, Copy)]
pub struct Launcher<'a> {
    /// Sockets, JSON reports and logs go here.
    pub dir: &'a Path,
    /// The memory file (the peer checks every byte against it).
    pub mem: &'a Path,
    /// The peer's vCPU threads.
    pub vcpus: usize,
    /// The peer's working-set pattern (`peer --pattern`).
    pub pattern: &'a str,
    /// serve reads this Redis store instead of the memory file.
    pub store: Option<&'a str>,
    /// `serve --prefetch-helpers N`.
    pub prefetch_helpers: Option<usize>,
    /// `serve --prefetch-chunk BYTES`.
    pub prefetch_chunk: Option<usize>,
    /// `serve --prefetch-idle`.
    pub prefetch_idle: bool,
    /// How long after serve each peer starts (`--serve-lead-ms`).
    pub serve_lead: Duration,
    /// `peer --compute-us N`.
    pub compute_us: u64,
    /// `peer --kvm` (then no --compute-us, no --stamps).
    pub kvm: bool,
    /// `peer --stamps N` and `serve --phase-samples N` (0: off).
    pub stamps: usize,
    /// `peer --write-set PCT` (`--write-set`; not while recording).
    pub write_set: Option<f64>,
}

/// What the peer does once its report is written.
pub enum Then<'h> {
    /// Exits.
    Exit,
    /// Holds (`--wp-async --hold-ms`: its userfaultfd asks for
    /// `UFFD_FEATURE_WP_ASYNC`, and its page tables stay for serve to
    /// read) while this runs with serve's pid; then it is killed.
    Hold(&'h dyn Fn(i32) -> anyhow::Result<()>),
}

impl Launcher<'_> {
    /// Runs the peer (against `socket`, or the file backend), returns its report.
    pub fn peer(&self, ws: f64, backing: Backing<'_>) -> anyhow::Result<PeerReport> {
        self.peer_then(ws, backing, (0, &Then::Exit))
    }

    /// [`Launcher::peer`], then `then` (with `serve`'s pid).
    fn peer_then(
        &self,
        ws: f64,
        backing: Backing<'_>,
        (serve, then): (i32, &Then<'_>),
    ) -> anyhow::Result<PeerReport> {
        let out = self.dir.join("peer.json");
        let _ = std::fs::remove_file(&out);
        let mut cmd = Command::new(exe()?);
        cmd.arg("peer")
            .arg("--mem")
            .arg(self.mem)
            .arg("--json")
            .arg(&out);
        cmd.args([
            "--threads",
            &self.vcpus.to_string(),
            "--working-set",
            &ws.to_string(),
            "--pattern",
            self.pattern,
        ]);
        if self.kvm {
            cmd.arg("--kvm");
        } else {
            cmd.args(["--compute-us", &self.compute_us.to_string()]);
        }
        if self.stamps > 0
            && !self.kvm
            && !matches!(backing, Backing::File(_) | Backing::FileHuge(_))
        {
            cmd.args(["--stamps", &self.stamps.to_string()]);
        }
        if let Some(pct) = self.write_set {
            cmd.args(["--write-set", &pct.to_string()]);
        }
        match backing {
            Backing::Uffd(s) => cmd.arg("--socket").arg(s),
            Backing::File(f) => cmd.args(["--backend", "file"]).arg("--map-file").arg(f),
            Backing::Shared(s, f) => cmd
                .arg("--socket")
                .arg(s)
                .args(["--backend", "shared"])
                .arg("--map-file")
                .arg(f),
            Backing::Huge(s) => cmd.arg("--socket").arg(s).arg("--huge"),
            Backing::FileHuge(f) => cmd
                .args(["--backend", "file", "--huge", "--map-file"])
                .arg(f),
            Backing::SharedHuge(s, f) => cmd
                .arg("--socket")
                .arg(s)
                .args(["--backend", "shared", "--huge", "--map-file"])
                .arg(f),
        };
        if let Then::Hold(action) = then {
            cmd.args(["--wp-async", "--hold-ms", "600000"]);
            return hold_bounded(cmd, &out, || action(serve), Duration::from_secs(600));
        }
        let st = run_bounded(cmd, Duration::from_secs(600))?;
        if !st {
            bail!("the peer failed (see its messages above)");
        }
        Ok(serde_json::from_str(&std::fs::read_to_string(&out)?)?)
    }

    /// Starts `faultline serve` with `extra`, runs one peer, returns both
    /// sides and the ms serve took to prepare its recorded set (NaN: none).
    pub fn served(
        &self,
        ws: f64,
        extra: &[&str],
        mode: Mode<'_>,
    ) -> anyhow::Result<(PeerReport, PeerSummary, f64)> {
        self.served_then(ws, extra, mode, &Then::Exit)
    }

    /// [`Launcher::served`], the peer doing `then` once its report is
    /// written.
    pub fn served_then(
        &self,
        ws: f64,
        extra: &[&str],
        mode: Mode<'_>,
        then: &Then<'_>,
    ) -> anyhow::Result<(PeerReport, PeerSummary, f64)> {
        let sock = self.dir.join("serve.sock");
        let json = self.dir.join("serve.json");
        let _ = std::fs::remove_file(&sock);
        let err = self.dir.join("serve.err");
        let mut child = self
            .serve_command(&sock, &json, extra, &mode)?
            .spawn_logged(&err)?;
        if !self.serve_lead.is_zero() {
            std::thread::sleep(self.serve_lead);
        }
        let backing = match mode {
            Mode::Shared(snap) => Backing::Shared(&sock, snap),
            Mode::Huge => Backing::Huge(&sock),
            Mode::SharedHuge(snap) => Backing::SharedHuge(&sock, snap),
            Mode::Copy => Backing::Uffd(&sock),
        };
        let rep = self.peer_then(ws, backing, (child.id() as i32, then));
        let st = wait_bounded(&mut child, Duration::from_secs(60));
        let rep = rep?;
        let st = st?;
        if !st.success() {
            bail!("faultline serve failed");
        }
        let sums: Vec<PeerSummary> = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
        let s = sums.into_iter().next().context("serve reported no peer")?;
        Ok((rep, s, prepared_ms(&std::fs::read_to_string(&err)?)))
    }

    /// `faultline serve --socket SOCK --mem FILE|--store URL --json JSON
    /// --peers 1 --timeout 60 EXTRA` and the options every served run
    /// shares.
    pub fn serve_command(
        &self,
        sock: &Path,
        json: &Path,
        extra: &[&str],
        mode: &Mode<'_>,
    ) -> anyhow::Result<Command> {
        let mut cmd = Command::new(exe()?);
        cmd.arg("serve").arg("--socket").arg(sock);
        match self.store {
            Some(url) => cmd.arg("--store").arg(url),
            None => cmd.arg("--mem").arg(self.mem),
        };
        cmd.arg("--json")
            .arg(json)
            .args(["--peers", "1", "--timeout", "60"]);
        cmd.args(extra);
        if let Some(n) = self.prefetch_helpers {
            cmd.args(["--prefetch-helpers", &n.to_string()]);
        }
        if let Some(c) = self.prefetch_chunk {
            cmd.args(["--prefetch-chunk", &c.to_string()]);
        }
        if self.prefetch_idle {
            cmd.arg("--prefetch-idle");
        }
        if self.stamps > 0 {
            cmd.args(["--phase-samples", &self.stamps.to_string()]);
        }
        if let Mode::Shared(snap) | Mode::SharedHuge(snap) = mode {
            cmd.arg("--shared").arg(snap);
        }
        Ok(cmd)
    }

    /// Records the working set `ws` into `rec` (`serve --record`, copy mode).
    pub fn record(&self, ws: f64, rec: &Path) -> anyhow::Result<()> {
        // The working set only: a write set's pages would join the record.
        let l = Launcher {
            write_set: None,
            serve_lead: Duration::ZERO,
            ..*self
        };
        l.served(ws, &["--record", rec.to_str().context("path")?], Mode::Copy)?;
        Ok(())
    }
}

/// Starting a serve with its stderr in a file.
pub trait SpawnLogged {
    /// Spawns it, stdin and stdout null, stderr to `err`, as a child this
    /// bench owns (`cleanup::spawn`: killed on a signal, and when the bench
    /// dies).
    fn spawn_logged(&mut self, err: &Path) -> anyhow::Result<cleanup::OwnedChild>;
}

impl SpawnLogged for Command {
    fn spawn_logged(&mut self, err: &Path) -> anyhow::Result<cleanup::OwnedChild> {
        Ok(cleanup::spawn(
            self.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(err)?),
        )?)
    }
}

/// Waits for `child` to exit (asleep in `poll` on its pidfd: woken the
/// moment it exits, no CPU taken from the restore meanwhile); kills it
/// (by its pid) after `limit`.
pub fn wait_bounded(
    child: &mut std::process::Child,
    limit: Duration,
) -> anyhow::Result<std::process::ExitStatus> {
    let pidfd = faultline_sys::process::Pidfd::open(child.id() as i32)?;
    if !pidfd.wait_exit(limit.as_millis().min(i32::MAX as u128) as i32)? {
        let _ = child.kill();
        let _ = child.wait();
        bail!("faultline serve did not exit within {limit:?}");
    }
    Ok(child.wait()?)
}

/// Runs `cmd` to its end, killed after `limit`; whether it succeeded.
fn run_bounded(mut cmd: Command, limit: Duration) -> anyhow::Result<bool> {
    let mut child = cleanup::spawn(cmd.stdin(Stdio::null()).stdout(Stdio::null()))?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s.success());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `cmd` (a peer that holds after writing its report `out`) until
/// the report reads whole, runs `action`, then kills it (by its pid); the
/// report. Bounded by `limit` for the report, and fails if the peer exits
/// before it.
fn hold_bounded(
    mut cmd: Command,
    out: &Path,
    action: impl FnOnce() -> anyhow::Result<()>,
    limit: Duration,
) -> anyhow::Result<PeerReport> {
    let mut child = cleanup::spawn(cmd.stdin(Stdio::null()).stdout(Stdio::null()))?;
    let deadline = Instant::now() + limit;
    // Written with write(2) before the hold: whole once it parses.
    let report = loop {
        if let Ok(r) = std::fs::read_to_string(out)
            .map_err(anyhow::Error::from)
            .and_then(|t| Ok(serde_json::from_str::<PeerReport>(&t)?))
        {
            break r;
        }
        if let Some(s) = child.try_wait()? {
            bail!("the peer exited ({s}) before its report (see its messages above)");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the peer wrote no report within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let done = action();
    let _ = child.kill();
    let _ = child.wait();
    done.map(|()| report)
}

/// The ms `serve` said reading and mapping its recorded set took (from its
/// start, concurrent with the peer's start and restore).
fn prepared_ms(log: &str) -> f64 {
    log.lines()
        .find(|l| l.contains("prepared the recorded set"))
        .and_then(|l| l.rsplit(" in ").next())
        .and_then(|t| t.trim_end_matches(" ms").parse().ok())
        .unwrap_or(f64::NAN)
}
