//! The failure matrix: every engine x every injected store failure x
//! {no budget, budget} x {fault-around 1, 16} x {1, 4 threads}, each cell
//! in a child process (this binary re-run with `FAULTLINE_CHILD=<cell>`)
//! under a deadline, a few at a time. Every cell checks: no hang; no zero
//! page and no stale page (every byte read is the store's or the last
//! one written, also after eviction); only pages whose own data failed
//! are poisoned; the message names region, offset, store and cause;
//! write-back failures are retried with bounded backoff and reported by
//! `flush` and the statistics; the budget holds or its overrun is
//! reported. Cells that cannot apply say why and check that. The table
//! (cell, outcome, time) is printed like the kernel's uffd unit tests.
//!
//! Then the scenarios, each its own test.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use faultline::policy::PolicyKind;
use faultline::testing::{Action, Fault, FaultyStore};
use faultline::*;

const PAGES: usize = 128;
const BUDGET: usize = 16;
/// The page whose own data fails in the fill cells.
const BAD: usize = 77;
const CELL_TIMEOUT: Duration = Duration::from_secs(40);
const PARALLEL: usize = 4;
/// Most write-back attempts a store failing for the whole cell may see:
/// the first failure, then one probe per backoff period (10 ms doubling to
/// 1 s) over a cell of a few seconds, plus `flush`.
const MAX_WRITE_BACK_ERRORS: u64 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    FillError,
    FillPanic,
    FillStall,
    WriteBackError,
    WriteBackStall,
    ErrorThenRecovery,
}

const FAULTS: [FaultKind; 6] = [
    FaultKind::FillError,
    FaultKind::FillPanic,
    FaultKind::FillStall,
    FaultKind::WriteBackError,
    FaultKind::WriteBackStall,
    FaultKind::ErrorThenRecovery,
];

const ENGINES: [EngineKind; 5] = [
    EngineKind::Signal,
    EngineKind::Poll,
    EngineKind::Spin,
    EngineKind::Workers,
    EngineKind::PerCpu,
];

#[derive(Debug, Clone, Copy)]
struct Cell {
    engine: EngineKind,
    fault: FaultKind,
    budget: bool,
    fa: usize,
    threads: usize,
}

impl Cell {
    fn all() -> Vec<Cell> {
        let mut v = Vec::new();
        for engine in ENGINES {
            for fault in FAULTS {
                for budget in [false, true] {
                    for fa in [1, 16] {
                        for threads in [1, 4] {
                            v.push(Cell {
                                engine,
                                fault,
                                budget,
                                fa,
                                threads,
                            });
                        }
                    }
                }
            }
        }
        v
    }

    fn name(&self) -> String {
        format!(
            "{}/{:?}/{}/fa{}/t{}",
            self.engine.name(),
            self.fault,
            if self.budget { "budget" } else { "nobudget" },
            self.fa,
            self.threads
        )
    }

    fn parse(s: &str) -> Cell {
        Cell::all()
            .into_iter()
            .find(|c| c.name() == s)
            .unwrap_or_else(|| panic!("no cell {s}"))
    }

    fn writes_back(&self) -> bool {
        matches!(
            self.fault,
            FaultKind::WriteBackError | FaultKind::WriteBackStall | FaultKind::ErrorThenRecovery
        )
    }

    /// Thread engines get a watchdog; a stalled fill must end with it.
    fn watchdog(&self) -> bool {
        self.engine != EngineKind::Signal
    }

    fn rule(&self) -> Fault {
        let bad = BAD as u64..BAD as u64 + 1;
        match self.fault {
            FaultKind::FillError => Fault::fill(Action::Fail).pages(bad),
            FaultKind::FillPanic => Fault::fill(Action::Panic).pages(bad),
            // Thread engines: longer than the watchdog, which must end it.
            // Signal engine: the stalled thread is the faulting thread
            // itself; the stall ends (failing) and the page is poisoned.
            FaultKind::FillStall if self.watchdog() => {
                Fault::fill(Action::Stall(Duration::from_secs(20))).pages(bad)
            }
            FaultKind::FillStall => {
                Fault::fill(Action::Stall(Duration::from_millis(200))).pages(bad)
            }
            FaultKind::WriteBackError => Fault::write_back(Action::Fail),
            FaultKind::WriteBackStall => {
                Fault::write_back(Action::Stall(Duration::from_millis(150))).times(2)
            }
            FaultKind::ErrorThenRecovery => Fault::write_back(Action::Fail).times(5),
        }
    }
}

fn marker(page: usize) -> u8 {
    (page as u8) ^ 0xA5
}

/// Checks a sample of `page`'s bytes: the store's data except the marker
/// at byte 8, which must be `marker` if the page was written.
fn check_page(p: *mut u8, page: usize, written: bool, what: &str) {
    let off = page * 4096;
    for k in [0usize, 100, 2047, 4095] {
        assert_eq!(
            read(p, off + k),
            pat(off + k),
            "{what}: page {page} byte {k}"
        );
    }
    let want = if written { marker(page) } else { pat(off + 8) };
    assert_eq!(
        read(p, off + 8),
        want,
        "{what}: page {page} marker (stale?)"
    );
}

/// The cell's program, in the child.
fn run_cell(cell: Cell) {
    let len = PAGES * 4096;
    let store = Arc::new(
        FaultyStore::builder(MemoryStore::new(pattern(len)))
            .rule(cell.rule())
            .build(),
    );
    let cfg = EngineConfig {
        workers: 2,
        stall_timeout: cell.watchdog().then_some(Duration::from_millis(300)),
        ..EngineConfig::default()
    };
    let engine = engine::create(cell.engine, cfg).unwrap();
    let mut b = Region::builder(len)
        .shared_store(store.clone())
        .fault_around(cell.fa);
    if cell.budget {
        b = b.budget(EvictionConfig {
            budget_pages: BUDGET,
            policy: PolicyKind::Clock,
        });
    }
    let region = b.build_dyn(engine).unwrap();
    say(&format!("REGION {}", region.id()));
    let base = region.as_ptr() as usize;
    let fill_fault = !cell.writes_back();
    // Threads write the pages they own (page % threads), read-checking
    // every page of theirs first; the fill cells skip the bad page.
    std::thread::scope(|s| {
        for t in 0..cell.threads {
            s.spawn(move || {
                let p = base as *mut u8;
                for page in (t..PAGES).step_by(cell.threads) {
                    if fill_fault && page == BAD {
                        continue;
                    }
                    check_page(p, page, false, "first read");
                    write(p, page * 4096 + 8, marker(page));
                }
            });
        }
    });
    // Everything again, after eviction: written pages come back with the
    // last write.
    for page in 0..PAGES {
        if fill_fault && page == BAD {
            continue;
        }
        check_page(region.as_ptr(), page, true, "second read");
    }
    let st = region.stats();
    assert_eq!(st.poisoned, 0, "no page poisoned by a neighbour: {st:?}");
    say(&format!("GOOD {st:?}"));
    if fill_fault {
        // Now the bad page itself: SIGBUS (error, stall on the signal
        // engine) or abort (panic, stall past the watchdog).
        let v = read(region.as_ptr(), BAD * 4096 + 3);
        say(&format!("READ {v:#x}"));
        return;
    }
    let es = region.eviction_stats();
    let inj = store.injected();
    say(&format!("EVICTION {es:?} {inj:?}"));
    if es.is_none() {
        // No budget: nothing is ever written back.
        assert_eq!(inj.write_back_calls, 0, "no write-back without a budget");
        assert_eq!(region.flush().unwrap(), 0);
        say("NA no budget: no write-back happens (checked: 0 calls)");
        return;
    }
    // Every injected failure is counted (a write-back may still be in
    // flight: the store counts it before it returns).
    assert!(
        wait_until(Duration::from_secs(5), || {
            region.eviction_stats().unwrap().write_back_errors
                == store.injected().write_back.errors()
        }),
        "every injected failure counted: {:?} {:?}",
        region.eviction_stats(),
        store.injected()
    );
    let es = region.eviction_stats().unwrap();
    match cell.fault {
        FaultKind::WriteBackError => {
            assert!(es.write_back_errors >= 1, "{es:?}");
            assert!(
                es.write_back_errors <= MAX_WRITE_BACK_ERRORS,
                "a retry storm: {es:?}"
            );
            assert!(es.unwritable > 0, "the overrun is reported: {es:?}");
            assert!(es.resident as usize > BUDGET, "{es:?}");
            let err = region.flush().unwrap_err().to_string();
            assert!(err.contains("injected failure"), "flush says why: {err}");
            // The store recovers: the held pages go out, nothing is lost.
            store.heal();
        }
        FaultKind::WriteBackStall | FaultKind::ErrorThenRecovery => {
            // Recovered: every held page is written back (retries), and
            // the evictor brings the region back to its budget.
            assert!(
                wait_until(Duration::from_secs(10), || {
                    let es = region.eviction_stats().unwrap();
                    es.unwritable == 0 && es.evicted > 0
                }),
                "held pages never written back: {:?}",
                region.eviction_stats()
            );
            region.flush().unwrap();
            let es = region.eviction_stats().unwrap();
            assert!(es.max_resident as usize <= PAGES, "sanity: {es:?}");
        }
        _ => unreachable!(),
    }
    drop(region);
    // Every last write reached the store.
    let snap = store.inner().snapshot();
    for page in 0..PAGES {
        assert_eq!(
            snap[page * 4096 + 8],
            marker(page),
            "page {page} lost its write"
        );
    }
    say("PASS");
}

/// Judges a finished child: the outcome line, or why the cell failed.
fn judge(cell: Cell, r: &ChildResult) -> Result<String, String> {
    if r.timed_out {
        return Err("HANG (killed at the deadline)".into());
    }
    let good = r.stdout.contains("GOOD ");
    let err = &r.stderr;
    let names_page = |cause: &str| {
        err.contains("region #")
            && err.contains(&format!("offset {:#x}", BAD * 4096))
            && err.contains("store faulty memory")
            && err.contains(cause)
    };
    let sig = r.signal();
    match cell.fault {
        FaultKind::FillError | FaultKind::FillStall
            if cell.fault == FaultKind::FillError || !cell.watchdog() =>
        {
            let cause = if cell.fault == FaultKind::FillError {
                "injected failure"
            } else {
                "injected stall"
            };
            if sig != Some(libc::SIGBUS) || !good || r.stdout.contains("READ") {
                return Err(format!(
                    "expected SIGBUS on page {BAD} only, got {:?}",
                    r.status
                ));
            }
            if !names_page(cause) {
                return Err("message does not name region, offset, store, cause".into());
            }
            Ok(format!("SIGBUS on page {BAD} only"))
        }
        FaultKind::FillStall => {
            if sig != Some(libc::SIGABRT)
                || !err.contains("has taken more than")
                || !err.contains("store faulty memory")
            {
                return Err(format!("watchdog did not end the stall: {:?}", r.status));
            }
            Ok("watchdog abort".into())
        }
        FaultKind::FillPanic => {
            if sig != Some(libc::SIGABRT)
                || !err.contains("panicked")
                || !err.contains("failing closed")
                || r.stdout.contains("READ")
            {
                return Err(format!("expected fail-closed abort, got {:?}", r.status));
            }
            Ok(format!(
                "fail-closed abort{}",
                if good {
                    ""
                } else {
                    " (in a window reaching the page)"
                }
            ))
        }
        _ => {
            if r.status.map(|s| s.success()) != Some(true) {
                return Err(format!("child failed: {:?}", r.status));
            }
            if let Some(na) = tagged(&r.stdout, "NA ") {
                return Ok(format!("n/a: {}", &na[3..]));
            }
            if !r.stdout.contains("PASS") {
                return Err("no PASS".into());
            }
            let reports = err.matches("write-back failed at region #").count();
            if reports != 1 {
                return Err(format!("{reports} write-back messages (want one)"));
            }
            if reports == 1 && !(err.contains("store faulty memory") && err.contains("injected")) {
                return Err("write-back message lacks store or cause".into());
            }
            let line = tagged(&r.stdout, "EVICTION ").unwrap_or("");
            let errors = field(line, "write_back_errors");
            Ok(format!("ok, {errors} write-back errors, reported once"))
        }
    }
}

/// The rest of the first output line holding `tag`, from the tag on (the
/// test harness may print its own text before it).
fn tagged<'a>(out: &'a str, tag: &str) -> Option<&'a str> {
    out.lines().find_map(|l| l.find(tag).map(|i| &l[i..]))
}

/// `name: N` out of a Debug line.
fn field(line: &str, name: &str) -> u64 {
    line.split(&format!("{name}: "))
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}

#[test]
fn cell() {
    if let Some(s) = child_scenario() {
        if let Some(c) = s.strip_prefix("cell:") {
            run_cell(Cell::parse(c));
        }
    }
}

/// A finished cell: index, name, outcome, time, the child's output.
type Row = (usize, String, Result<String, String>, Duration, String);

#[test]
fn failure_matrix() {
    if child_scenario().is_some() {
        return;
    }
    let cells = Cell::all();
    let next = AtomicUsize::new(0);
    let rows: Mutex<Vec<Row>> = Mutex::new(Vec::new());
    let t_all = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| loop {
                let i = next.fetch_add(1, SeqCst);
                let Some(&c) = cells.get(i) else { break };
                let t0 = Instant::now();
                let r = run_child("cell", &format!("cell:{}", c.name()), CELL_TIMEOUT);
                let out = judge(c, &r);
                let logs = format!("--- stdout\n{}--- stderr\n{}", r.stdout, r.stderr);
                rows.lock()
                    .unwrap()
                    .push((i, c.name(), out, t0.elapsed(), logs));
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by_key(|r| r.0);
    let mut failed = Vec::new();
    // Straight to stdout (past the harness's capture), like the kernel's
    // uffd unit tests print their table.
    say(&format!("\nfailure matrix: {} cells", rows.len()));
    for (_, name, out, dt, logs) in &rows {
        let (tag, what) = match out {
            Ok(o) if o.starts_with("n/a") => ("SKIP", o.as_str()),
            Ok(o) => ("PASS", o.as_str()),
            Err(e) => ("FAIL", e.as_str()),
        };
        say(&format!(
            "{tag} {name:<40} {:>6} ms  {what}",
            dt.as_millis()
        ));
        if out.is_err() {
            failed.push(format!("{name}: {what}\n{logs}"));
        }
    }
    say(&format!(
        "{} passed, {} n/a, {} failed in {:?}",
        rows.iter()
            .filter(|r| matches!(&r.2, Ok(o) if !o.starts_with("n/a")))
            .count(),
        rows.iter()
            .filter(|r| matches!(&r.2, Ok(o) if o.starts_with("n/a")))
            .count(),
        failed.len(),
        t_all.elapsed()
    ));
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// ------------------------------------------------------------ the scenarios

/// Scenario 1 (issue 15): a budget region (8 pages, CLOCK) whose store
/// refuses every write-back, 256 pages written in order. Before the fix
/// the thread engines hung at page 13 with the evictor retrying in a loop
/// and no message; the signal engine finished but stormed (~138k
/// write-back errors in 4 s, ~15 ms per fault) and kept 256 pages against
/// a budget of 8 without saying so.
fn refused_write_back_child() {
    let pages = 256;
    let len = pages * 4096;
    let store = Arc::new(
        FaultyStore::builder(MemoryStore::new(vec![0; len]))
            .rule(Fault::write_back(Action::Fail))
            .build(),
    );
    let kind = match child_scenario().as_deref() {
        Some(s) => EngineKind::from_name(s.rsplit(':').next().unwrap()).unwrap(),
        None => unreachable!(),
    };
    let region = Region::builder(len)
        .shared_store(store.clone())
        .budget(EvictionConfig {
            budget_pages: 8,
            policy: PolicyKind::Clock,
        })
        .build_dyn(engine_of(kind))
        .unwrap();
    for page in 0..pages {
        write(region.as_ptr(), page * 4096 + 1, page as u8 | 1);
    }
    for page in 0..pages {
        assert_eq!(read(region.as_ptr(), page * 4096 + 1), page as u8 | 1);
    }
    // The evictor is asynchronous (on a loaded machine it may not have run
    // yet, or only met the refusing store once): give it a bounded while
    // to meet it and to hold the pages it cannot write (the overrun).
    wait_until(Duration::from_secs(5), || {
        let es = region.eviction_stats().unwrap();
        es.write_back_errors > 0 && es.unwritable > 8
    });
    let es = region.eviction_stats().unwrap();
    say(&format!("DONE {es:?}"));
    let err = region.flush().unwrap_err();
    say(&format!("FLUSH {err}"));
    // Recovered: the drop writes every page back.
    store.heal();
    drop(region);
    let snap = store.inner().snapshot();
    assert!((0..pages).all(|p| snap[p * 4096 + 1] == p as u8 | 1));
    say("WRITTEN");
}

/// One scenario child at a time (the matrix already keeps the CPUs busy).
static SERIAL: Mutex<()> = Mutex::new(());

fn check_refused_write_back(kind: EngineKind) {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let r = run_child(
        "scenario_refused_write_back",
        &format!("refused:{}", kind.name()),
        Duration::from_secs(30),
    );
    let kind = kind.name();
    assert!(!r.timed_out, "{kind}: hung\n{}\n{}", r.stdout, r.stderr);
    assert!(
        r.status.is_some_and(|s| s.success()),
        "{kind}: {:?}\n{}\n{}",
        r.status,
        r.stdout,
        r.stderr
    );
    let done = tagged(&r.stdout, "DONE ")
        .unwrap_or_else(|| panic!("{kind}: no DONE\n{}\n{}", r.stdout, r.stderr));
    let errors = field(done, "write_back_errors");
    assert!(
        (1..=MAX_WRITE_BACK_ERRORS).contains(&errors),
        "{kind}: a retry storm: {done}"
    );
    assert!(
        field(done, "unwritable") > 8,
        "{kind}: overrun not reported: {done}"
    );
    assert_eq!(
        r.stderr.matches("write-back failed at region #").count(),
        1,
        "{kind}: said once:\n{}",
        r.stderr
    );
    assert!(r.stdout.contains("FLUSH") && r.stdout.contains("injected failure"));
    assert!(r.stdout.contains("WRITTEN"), "{kind}: {}", r.stdout);
}

#[test]
fn scenario_refused_write_back() {
    if let Some(s) = child_scenario() {
        if s.starts_with("refused:") {
            refused_write_back_child();
        }
    }
}

#[test]
fn scenario_refused_write_back_poll_does_not_hang() {
    if child_scenario().is_none() {
        check_refused_write_back(EngineKind::Poll);
    }
}
#[test]
fn scenario_refused_write_back_spin_does_not_hang() {
    if child_scenario().is_none() {
        check_refused_write_back(EngineKind::Spin);
    }
}
/// Run many times: with several handler threads, the handler that read
/// the evictor's REMOVE event could handle it after a fault re-installed
/// the page, marking a mapped (dirty) page absent: its next WP fault then
/// livelocked, or its data was never written back. Looped under load this
/// hung or lost data in about one run of 15 before the fix.
#[test]
fn scenario_refused_write_back_workers_does_not_hang() {
    if child_scenario().is_none() {
        for _ in 0..12 {
            check_refused_write_back(EngineKind::Workers);
        }
    }
}
#[test]
fn scenario_refused_write_back_signal_no_storm() {
    if child_scenario().is_none() {
        check_refused_write_back(EngineKind::Signal);
    }
}
