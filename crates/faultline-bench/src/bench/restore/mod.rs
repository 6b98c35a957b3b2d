//! `faultline bench restore`: VM snapshot restore through Firecracker's
//! hand-off, every configuration in one run, `faultline peer` as the VMM.
//!
//! Configurations (each a fresh peer process; the handler a fresh
//! `faultline serve` process unless noted):
//! * `kernel`: the peer maps the memory file `MAP_PRIVATE` (Firecracker's
//!   `File` backend), no handler;
//! * `baseline`: a handler written like Firecracker's example (one thread
//!   in this process, one page per fault, `UFFDIO_COPY` from a mapping of
//!   the file);
//! * `on-demand`: `faultline serve` (its defaults: the adaptive engine,
//!   16-page fault-around growing to 512 on sequential streams);
//! * `prefetch`: `faultline serve --prefetch` of the set a `--record` run
//!   of the same working set wrote (recorded once, warm, before);
//! * `eager`: `faultline serve --prefetch` of every page of the file
//!   (installed from the handshake on, faults first);
//! * `kernel-tmpfs`: the peer maps the shared tmpfs copy of the file
//!   `MAP_PRIVATE` (the kernel on the same page cache as the shared modes);
//! * `on-demand-shared`, `prefetch-shared`: `faultline serve --shared` and a
//!   peer that maps the shared tmpfs copy `MAP_PRIVATE`, registered
//!   MISSING|MINOR: faults and prefetch are `UFFDIO_CONTINUE` (zero copy);
//! * `on-demand-huge`, `prefetch-huge` (only when asked for with
//!   `--configs`): the peer's memory is 2 MiB hugetlb pages (`--huge`),
//!   copied 2 MiB per fault or prefetch run; a pool of 2 MiB pages is
//!   reserved for the run (`vm.nr_hugepages` grown as root and given back);
//! * `kernel-hugetlbfs`, `on-demand-shared-huge`, `prefetch-shared-huge`,
//!   `on-demand-per-cpu-shared-huge` (only when asked for): the shared copy on a hugetlbfs mount the bench
//!   makes (2 MiB pages, root), mapped by the kernel, or served with
//!   `UFFDIO_CONTINUE` of 2 MiB pages; its population (warm) is reported.
//! * `on-demand-tracked`, `prefetch-tracked`, `on-demand-tracked-async`
//!   (only when asked for): `on-demand` and `prefetch` with `serve
//!   --track-dirty` (every install write-protected, a first write a
//!   write-protect fault through serve), and a peer whose userfaultfd has
//!   `UFFD_FEATURE_WP_ASYNC` (the kernel un-protects written pages; serve
//!   reads them from its page tables): the peer writes `--write-set`'s
//!   pages after its restore, the first-write table sets each beside its
//!   untracked twin (`tracked`).
//!
//! The shared tmpfs copy is written once per run, before the
//! configurations run; how long that takes (the one-time population of the
//! shared page cache) is measured separately, from a warm and from a cold
//! memory file, and reported beside the table. Cold runs drop the memory
//! file's page cache; the tmpfs copy stays in memory (it *is* the shared
//! cache; dropping it means populating it again, the cost reported).
//!
//! Working sets (`--working-set` percent, for each `--pattern`):
//! `clustered` (70% in seeded clusters of 8-64 pages, the rest scattered,
//! the vCPUs taking turns) and `sweep` (the first pages of memory in order,
//! each vCPU sweeping its share: a guest re-reading its memory).
//!
//! Reported: seconds from the handshake to the last working-set page
//! touched (the peer measures it), first-touch latency seen by the vCPU
//! threads (median, p99), demand faults and bytes read by the handler,
//! faults per working-set page and per `read(2)` of the userfaultfd,
//! serve's handler-thread CPU time (what its `--engine` wait costs), and
//! wasted pages (installed by a window, never touched: the peer's resident
//! pages beyond its set); medians over `--reps`. And for each served
//! configuration the phases of a demand fault as the vCPU sees it (message
//! read, batch, store read, copy, wake, return: `phases`). `on-demand-poll` (asked
//! for by name) is `on-demand` with serve's handler sleeping in `poll(2)`
//! between faults, the engine before the adaptive one; `on-demand-workers`
//! (asked for by name) is `on-demand` with `--engine workers --threads 2`:
//! both handler threads read the peer's userfaultfd, its copies run on
//! two CPUs; `on-demand-per-cpu` (asked for by name) is `on-demand` with
//! `--engine per-cpu`: a handler thread pinned and asleep on each CPU, so
//! the one on the faulting vCPU's CPU reads its fault without a wake-up
//! across CPUs (`on-demand-per-cpu-w4` and `on-demand-per-cpu-adaptive`
//! add `--fault-around-initial 4` or `--adaptive-window`);
//! `on-demand-wake-first` (asked for by name) is `on-demand`
//! with `--wake-first` (the faulting page copied and woken before the rest
//! of its window); `on-demand-single` (asked for by name) is `on-demand`
//! with `--fault-around-initial 1` (an isolated fault installs its page
//! alone; streams still grow); `on-demand-wN` (N 4, 8, 32) and
//! `on-demand-wN-shared` (N 16, 32, 64) are `on-demand` and
//! `on-demand-shared` with `--fault-around-initial N`;
//! `on-demand-adaptive`, `on-demand-adaptive-shared` and
//! `on-demand-workers-adaptive` add `--adaptive-window` (the isolated
//! window sized from where the faults land). Cold runs drop the file's page cache before each
//! run (`posix_fadvise(DONTNEED)`, plus `drop_caches` as root, after which
//! the faultline executable is read back: the snapshot is cold, not the
//! handler's code).
//!
//! How a run goes, and where each step lives:
//!
//! ```text
//!   run ─► write the memory file (memory), upload it (--store)
//!       ├─ --peers: peers::run (N peers at once per round) ──────────────┐
//!       ├─ memory::Copies::prepare: hugetlb pool, hugetlbfs and tmpfs copies
//!       └─ per working set: record it (launch), its floors (floor),       │
//!            per cache state: every configuration --reps times,          │
//!            interleaved (runs::one: launch + baseline), medians          │
//!            └─► results::Results::add (records, rows, timeline)         │
//!   results::Results::print: tables, timeline, floors, figure ◄──────────┘
//! ```
//!
//! | module | what |
//! |---|---|
//! | `args` | the options and the configurations' names |
//! | `memory` | the memory file, its shared copies, cache states |
//! | `launch` | the `faultline peer` and `faultline serve` processes of a run |
//! | `baseline` | the one-page-per-fault handler Firecracker's example is |
//! | `runs` | one run of a configuration, medians over the reps |
//! | `timeline` | the hand-off's steps, stamped by the peer and by serve |
//! | `floor` | what moving the working set's bytes costs at best |
//! | `peers` | `--peers`: N peers at once, the handler's resident memory |
//! | `phases` | where a demand fault's time goes: the peer's and serve's TSC stamps joined |
//! | `results` | records, tables and the figure |
//! | `takeover` | `--takeover`: a restore whose serve is killed and taken over |
//! | `tracked` | dirty-tracked configurations (`serve --track-dirty`), the first-write table |

mod args;
mod baseline;
mod floor;
mod launch;
mod memory;
mod peers;
mod phases;
mod results;
mod runs;
mod takeover;
mod timeline;
mod tracked;

use std::cell::RefCell;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use faultline_cli_support::cleanup;

pub use args::RestoreArgs;
use args::{tracks_dirty, ws_label, CONFIGS, PATTERNS};
use floor::Floor;
use launch::Launcher;
use memory::{drop_cache, is_root, warm, write_mem, Copies, Evictor};
use results::Results;
use runs::{Inputs, Run};

use crate::harness::progress::Progress;
use crate::harness::BenchCtx;

/// Runs the bench.
pub fn run(ctx: &mut BenchCtx, a: &RestoreArgs) -> anyhow::Result<()> {
    if a.size < 8 << 20 || !a.size.is_multiple_of(4 << 20) {
        bail!("--size must be a multiple of 4 MiB, at least 8 MiB");
    }
    // The bench's files (the memory file, --size bytes; sockets, records,
    // logs) go in a directory of its own, made new in --dir (which must
    // exist: it chooses the file system) or in the system's temporary
    // directory: `faultline-restore-PID`, removed on return, on
    // SIGINT/SIGTERM/SIGHUP, and by a later run once PID is gone. Nothing
    // else in --dir is read, written or removed (it was the directory
    // itself: a user's `mem` or `all.txt` there was replaced). A killed
    // run's hugetlbfs mount is unmounted first, wherever it was.
    cleanup::sweep_mounts(memory::HugeMount::SWEEP);
    let parent = match &a.dir {
        Some(d) => {
            existing_dir(d)?;
            d.clone()
        }
        None => std::env::temp_dir(),
    };
    cleanup::sweep_pid_named(&parent, "faultline-restore-", "");
    let guard = cleanup::temp(&parent, "faultline-restore-", "");
    let dir = guard.path().to_path_buf();
    // create_dir, not create_dir_all: never into something already there.
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "restore: the bench's files in {} (removed at the end)",
        dir.display()
    );
    faultline_cli_support::flags::check_disk(
        &dir,
        a.size as u64,
        format_args!("bench restore --size {}: the memory file", a.size),
    )?;
    run_in(ctx, a, &dir)
}

/// Refuses `--dir` unless it is an existing directory (a typo must not
/// make a tree, as `bench random --dir` refuses it too).
fn existing_dir(d: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(d) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("--dir {}: not a directory", d.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "--dir {}: does not exist (create it first: the bench makes its own directory in it)",
            d.display()
        ),
        Err(e) => Err(e).with_context(|| format!("--dir {}", d.display())),
    }
}

/// The bench in `dir` (its own, new): its files, then `--peers` or the
/// configurations.
fn run_in(ctx: &mut BenchCtx, a: &RestoreArgs, dir: &Path) -> anyhow::Result<()> {
    check_names(a)?;
    let mem = dir.join("mem");
    let all = dir.join("all.txt");
    write_files(a, &mem, &all)?;
    let l = Launcher {
        dir,
        mem: &mem,
        vcpus: a.vcpus,
        pattern: a.pattern.first().map_or("clustered", String::as_str),
        store: a.store.as_deref(),
        prefetch_helpers: a.prefetch_helpers,
        prefetch_chunk: a.prefetch_chunk,
        prefetch_idle: a.prefetch_idle,
        serve_lead: Duration::from_millis(a.serve_lead_ms),
        compute_us: a.compute_us,
        kvm: a.kvm,
        stamps: if a.no_phases || a.kvm {
            0
        } else {
            phases::SAMPLES
        },
        write_set: a
            .write_set
            .or_else(|| a.configs.iter().any(|c| tracks_dirty(c)).then_some(2.0)),
    };
    if !a.peers.is_empty() {
        return peers::run(ctx, a, &l);
    }
    let copies = Copies::prepare(a, dir, &mem)?;
    let a = &RestoreArgs {
        configs: takeover::with_row(copies.configs.clone(), a.takeover),
        ..a.clone()
    };
    let root = is_root();
    print_setup(a, root);
    let steps =
        (a.pattern.len() * a.working_set.len() * a.cache.len() * a.configs.len() * a.reps) as u64;
    let mut progress = ctx.progress(steps, "restore");
    let mut session = Session {
        a,
        l,
        copies: &copies,
        all: &all,
        root,
        evictor: if a.keep_caches {
            Evictor::none()?
        } else {
            Evictor::new()?
        },
        gaps: RefCell::new(Vec::new()),
    };
    let mut results = Results::default();
    let mut floors = Vec::new();
    for pattern in &a.pattern {
        session.l.pattern = pattern;
        for &ws in &a.working_set {
            let set = (ws, pattern.as_str());
            let (floor, per_cache) = session.working_set(ws, &mut progress)?;
            floors.push((ws, ws_label(set), floor));
            let gaps = session.gaps.take();
            for (cache, medians) in a.cache.iter().zip(per_cache) {
                results.add(ctx, a, (set, cache), &medians, &floor);
                let mine: Vec<_> = gaps.iter().filter(|g| &g.0 == cache).map(|g| g.1).collect();
                if !mine.is_empty() {
                    results.add_takeover(ctx, a, (set, cache), &medians, &mine);
                }
            }
        }
    }
    progress.finish();
    results.print(ctx, a, &copies.populated, &floors)
}

/// Refuses unknown configurations, patterns and cache states, and any
/// of them named twice (two rows of one name: which one would a ratio
/// use?), before any work.
fn check_names(a: &RestoreArgs) -> anyhow::Result<()> {
    for p in &a.pattern {
        if !PATTERNS.contains(&p.as_str()) {
            bail!("unknown pattern {p:?} (known: {})", PATTERNS.join(", "));
        }
    }
    for c in &a.configs {
        if !CONFIGS.contains(&c.as_str()) {
            bail!(
                "unknown configuration {c:?} (known: {})",
                CONFIGS.join(", ")
            );
        }
    }
    for c in &a.cache {
        if c != "warm" && c != "cold" {
            bail!("unknown cache state {c:?} (warm, cold)");
        }
    }
    for (flag, names) in [
        ("--pattern", &a.pattern),
        ("--configs", &a.configs),
        ("--cache", &a.cache),
    ] {
        for (i, n) in names.iter().enumerate() {
            if let Some(first) = names[..i].iter().position(|m| m == n) {
                bail!(
                    "{flag}: {n:?} is named twice (entries {} and {})",
                    first + 1,
                    i + 1
                );
            }
        }
    }
    Ok(())
}

/// Writes the memory file `mem` and the list of all its pages `all`
/// (eager's prefetch), and uploads the memory file to `--store`.
fn write_files(a: &RestoreArgs, mem: &Path, all: &Path) -> anyhow::Result<()> {
    eprintln!("restore: writing a {} MiB memory file", a.size >> 20);
    write_mem(mem, a.size)?;
    let offs: Vec<u64> = (0..a.size as u64).step_by(4096).collect();
    faultline_serve::record::write(all, &offs)?;
    if let Some(url) = &a.store {
        eprintln!("restore: uploading the memory file to {url}");
        let f = std::fs::File::open(mem)?;
        let t = Instant::now();
        faultline_redis::RedisStore::put(
            url,
            faultline_redis::RedisConfig::default(),
            std::io::BufReader::new(f),
            a.size as u64,
            |_| {},
        )
        .with_context(|| format!("uploading the memory file to {url}"))?;
        eprintln!("restore: uploaded in {:.2} s", t.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The line that says how the runs are made.
fn print_setup(a: &RestoreArgs, root: bool) {
    println!(
        "\nrestore: {} MiB memory file, {} vCPU threads, {} reps (medians, interleaved); cold cache: posix_fadvise(DONTNEED){}; CPU caches {}",
        a.size >> 20,
        a.vcpus,
        a.reps,
        if root {
            " + drop_caches, the faultline executable read back"
        } else {
            " (not root: drop_caches skipped)"
        },
        if a.keep_caches {
            "kept between runs (--keep-caches)"
        } else {
            "evicted before each run"
        }
    );
    if let Some(url) = &a.store {
        println!("restore: faultline's configurations are served from {url} (kernel and baseline read the file)");
    }
    if crate::harness::report::free_page_reporting() == Some(true) {
        println!("restore: this guest reports freed memory to its host (virtio-balloon free page reporting): a run that allocates what an earlier run freed may pay a host fault per page, as system time (RESULTS.md, the Redis rows)");
    }
    if a.serve_lead_ms > 0 {
        println!(
            "restore: each served peer starts {} ms after its serve (--serve-lead-ms; not timed: the restore is timed from the hand-off)",
            a.serve_lead_ms
        );
    }
}

/// Each configuration's medians, in `--configs` order.
type Medians = Vec<(String, Run)>;

/// What every run of one `bench restore` shares.
struct Session<'a> {
    a: &'a RestoreArgs,
    l: Launcher<'a>,
    copies: &'a Copies,
    /// Every page of the memory file (eager's prefetch list).
    all: &'a Path,
    root: bool,
    evictor: Evictor,
    /// `--takeover`: each kill's gap, by cache state (taken per working
    /// set).
    gaps: RefCell<Vec<(String, takeover::Gap)>>,
}

impl Session<'_> {
    /// Records working set `ws` (percent of the memory), measures its
    /// floors, then its medians per cache state (in `--cache` order).
    fn working_set(
        &self,
        ws: f64,
        progress: &mut Progress,
    ) -> anyhow::Result<(Floor, Vec<Medians>)> {
        let (a, mem) = (self.a, self.l.mem);
        let rec = self.l.dir.join(format!("ws{ws}-{}.txt", self.l.pattern));
        warm(mem)?;
        let ws_bytes = ((a.size as f64 * ws / 100.0) as usize).max(2 << 20);
        let snap = self.copies.snap.0.as_path();
        let shared = snap.exists().then_some(snap);
        self.l.record(ws, &rec)?;
        let hsnap = self.copies.hsnap.as_path();
        let hshared = (!hsnap.as_os_str().is_empty()).then_some(hsnap);
        let floor = progress.suspend(|| {
            let cold = a.cache.iter().any(|c| c == "cold").then_some(self.root);
            floor::of_set(mem, shared, hshared, ws_bytes, &rec, cold)
        })?;
        let inputs = Inputs {
            rec: &rec,
            all: self.all,
            snap,
            hsnap,
        };
        let mut per_cache = Vec::new();
        for cache in &a.cache {
            per_cache.push(self.medians(ws, cache, &inputs, progress)?);
        }
        Ok((floor, per_cache))
    }

    /// Every configuration `--reps` times in cache state `cache`, reps
    /// interleaved (every configuration once, then again), so a slow spell
    /// of the machine hits all of them alike; the medians.
    fn medians(
        &self,
        ws: f64,
        cache: &str,
        inputs: &Inputs<'_>,
        progress: &mut Progress,
    ) -> anyhow::Result<Medians> {
        let (a, mem) = (self.a, self.l.mem);
        let cold = cache == "cold";
        let mut all_runs: Vec<Vec<Run>> = a.configs.iter().map(|_| Vec::new()).collect();
        // The fault the takeover row's serve dies at: half of this rep's
        // on-demand run's.
        let mut kill_at = 1;
        for rep in 0..a.reps.max(1) {
            for (cfg, runs) in a.configs.iter().zip(&mut all_runs) {
                let set = ws_label((ws, self.l.pattern));
                progress.step(&format!("ws {set} {cache} {cfg} {rep}"));
                if cold {
                    drop_cache(mem, self.root)?;
                } else {
                    warm(mem)?;
                }
                if !a.keep_caches {
                    self.evictor.evict();
                }
                if cfg == takeover::CONFIG {
                    let (run, gap) = takeover::one(&self.l, ws, kill_at)?;
                    self.gaps.borrow_mut().push((cache.to_string(), gap));
                    runs.push(run);
                    continue;
                }
                let run = if tracks_dirty(cfg) {
                    tracked::one(&self.l, ws, cfg, inputs.rec)?
                } else {
                    runs::one(&self.l, ws, cfg, inputs)?
                };
                if cfg == "on-demand" {
                    kill_at = (run.faults / 2).max(1);
                }
                runs.push(run);
            }
        }
        Ok(a.configs
            .iter()
            .zip(all_runs)
            .map(|(cfg, runs)| (cfg.to_string(), Run::median(&runs)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        a: super::RestoreArgs,
    }

    fn check(args: &[&str]) -> anyhow::Result<()> {
        let cmd = Cmd::try_parse_from(std::iter::once("restore").chain(args.iter().copied()))?;
        super::check_names(&cmd.a)
    }

    #[test]
    fn names_unknown_or_given_twice_are_refused() {
        check(&["--configs", "kernel,on-demand-per-cpu-shared-huge"]).unwrap();
        for (args, why) in [
            (
                &["--configs", "kernel,nope"][..],
                "unknown configuration \"nope\"",
            ),
            (
                &["--configs", "kernel,on-demand,kernel"][..],
                "--configs: \"kernel\" is named twice (entries 1 and 3)",
            ),
            (
                &["--cache", "warm,warm"][..],
                "--cache: \"warm\" is named twice",
            ),
            (
                &["--pattern", "sweep,sweep"][..],
                "--pattern: \"sweep\" is named twice",
            ),
        ] {
            let e = check(args).unwrap_err().to_string();
            assert!(e.contains(why), "{args:?}: {e}");
        }
    }
}
