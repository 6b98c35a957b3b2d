//! Working sets from many restores: every peer records (`{peer}` in
//! `--record`), `faultline-serve record merge` keeps the pages of k of n
//! restores, and the merged set covers a restore it was not made from;
//! a record made for another memory file is refused; a record cut on
//! request (SIGUSR2, `POST /record`) holds what was touched before.

use std::collections::HashSet;
use std::process::Command;

use faultline_serve::record::{self, Record};
use faultline_serve::testing::{self, assert_ok, Dir};

const SERVE: &[&str] = &[env!("CARGO_BIN_EXE_faultline-serve")];
const PEER: &[&str] = &[env!("CARGO_BIN_EXE_faultline-peer")];
const MIB: usize = 1 << 20;

/// A restore of the seed-4 working set, varied by `run` (3% of its pages
/// swapped for others, the order shuffled locally), on `extra`'s vCPUs
/// (default 2).
fn restore(dir: &Dir, run: u64, extra: &[&str]) {
    let run_seed = run.to_string();
    let mut args = vec![
        "--working-set",
        "20",
        "--seed",
        "4",
        "--jitter",
        "3",
        "--run-seed",
        &run_seed,
    ];
    args.extend_from_slice(extra);
    let mut p = testing::peer(dir, PEER, &format!("run{run}"), &args);
    assert_ok(&mut p, dir);
}

fn tool(args: &[&str]) -> std::process::Output {
    Command::new(SERVE[0])
        .arg("record")
        .args(args)
        .output()
        .expect("running faultline-serve record")
}

#[test]
fn a_set_merged_from_five_restores_covers_a_sixth() {
    let dir = Dir::new("merge", 16 * MIB);
    let pattern = dir.path("rec-{peer}.txt");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &["--peers", "6", "--record", pattern.to_str().unwrap()],
    );
    for run in 1..=6 {
        restore(&dir, run, &["--threads", "2"]);
    }
    assert_ok(&mut s, &dir);
    let recs: Vec<Record> = (1..=6)
        .map(|n| {
            record::read_record(&dir.path(&format!("rec-{n}.txt"))).expect("every peer's record")
        })
        .collect();
    assert!(recs
        .iter()
        .all(|r| r.identity.is_some() && r.identity == recs[0].identity));
    let merged = dir.path("merged.txt");
    let files: Vec<String> = (1..=5)
        .map(|n| {
            dir.path(&format!("rec-{n}.txt"))
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut args = vec!["merge", "-k", "3", "-o", merged.to_str().unwrap()];
    args.extend(files.iter().map(String::as_str));
    let out = tool(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Merged again over itself (a record it may replace), but never over
    // a file that is not a record (the memory file named by mistake).
    let mem = dir.path("mem");
    let before = std::fs::read(&mem).unwrap();
    let mut again = vec!["merge", "-k", "1", "-o", mem.to_str().unwrap()];
    again.extend(files.iter().map(String::as_str));
    let out = tool(&again);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is not a working-set record"),
        "{err}"
    );
    assert_eq!(std::fs::read(&mem).unwrap(), before);
    let m = record::read_record(&merged).unwrap();
    assert_eq!(m.recordings, 5);
    assert_eq!(m.identity, recs[0].identity);
    // The pages one restore alone touched are left out: fewer than the union.
    let union: HashSet<u64> = recs[..5].iter().flat_map(Record::offsets).collect();
    assert!(
        m.pages.len() < union.len(),
        "{} of {}",
        m.pages.len(),
        union.len()
    );
    let set: HashSet<u64> = m.offsets().into_iter().collect();
    let sixth = recs[5].offsets();
    let covered = sixth.iter().filter(|o| set.contains(o)).count();
    let coverage = covered as f64 / sixth.len() as f64;
    eprintln!(
        "merged set: {} pages (union of 5: {}); covers {covered} of the 6th restore's {} pages ({:.1}%): {} pages left to demand faults",
        m.pages.len(),
        union.len(),
        sixth.len(),
        coverage * 100.0,
        sixth.len() - covered
    );
    assert!(coverage >= 0.95, "coverage {coverage}");
    // inspect says the same.
    let out = tool(&["inspect", "--json", merged.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pages"].as_u64(), Some(m.pages.len() as u64));
    assert_eq!(v["recordings"].as_u64(), Some(5));
    // Prefetching it, the 6th restore again, its one vCPU paused until
    // the prefetch is long done: what faults is what the set lacks (one
    // page a fault: a fault-around window would install a missing page's
    // missing neighbour with it).
    let json = dir.path("serve.json");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &[
            "--peers",
            "1",
            "--fault-around",
            "1",
            "--prefetch",
            merged.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
    restore(
        &dir,
        6,
        &["--threads", "1", "--pause-at", "0", "--pause-ms", "1000"],
    );
    assert_ok(&mut s, &dir);
    let sums: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let faults = sums[0]["faults"].as_u64().unwrap();
    let prefetched = sums[0]["prefetched"].as_u64().unwrap();
    eprintln!(
        "prefetching the merged set: {faults} demand faults remain for the 6th restore's {} pages ({prefetched} prefetched)",
        sixth.len()
    );
    assert_eq!(prefetched, m.pages.len() as u64, "{:?}", sums[0]);
    assert_eq!(faults, (sixth.len() - covered) as u64, "{:?}", sums[0]);
    // A record made for another memory file is refused at start.
    let other = Dir::new("merge-other", 8 * MIB);
    let args = testing::command(&other, &["--prefetch", merged.to_str().unwrap()]);
    let out = Command::new(SERVE[0]).args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("recorded for another memory file"), "{err}");
}

/// The last cycle: SIGUSR2 (or `POST /record`) cuts every recording
/// peer's record, written then: the pages it touched before, and nothing
/// after (its hang-up does not write it again). Three restores of one
/// working set, one vCPU each (the record's order is the touch order):
/// the first cut by SIGUSR2 and the second by `POST /record`, each while
/// paused halfway; the third runs through. Each cut record is the third's
/// first pages, exactly as many as were touched before the pause.
#[test]
fn a_record_cut_on_request_holds_what_was_touched_before() {
    let dir = Dir::new("cut", 16 * MIB);
    let pattern = dir.path("rec-{peer}.txt");
    let metrics = dir.path("metrics.sock");
    let mut s = testing::serve(
        &dir,
        SERVE,
        &[
            "--peers",
            "3",
            "--record",
            pattern.to_str().unwrap(),
            "--metrics",
            metrics.to_str().unwrap(),
        ],
    );
    let args = [
        "--working-set",
        "20",
        "--seed",
        "4",
        "--threads",
        "1",
        "--pause-at",
        "50",
        "--pause-ms",
        "4000",
    ];
    let mut paused = Vec::new();
    for n in 1..=2 {
        let name = format!("p{n}");
        let mut p = testing::peer(&dir, PEER, &name, &args);
        dir.wait_for(&format!("{name}.err"), "paused after");
        let before = testing::number_after(&dir.text(&format!("{name}.err")), "paused after ");
        if n == 1 {
            faultline_sys::process::kill(s.pid() as i32, faultline_sys::signal::SIGUSR2).unwrap();
        } else {
            let answer = testing::post(&metrics, "/record");
            assert!(answer.ends_with("wrote 1 record(s)\n"), "{answer}");
        }
        dir.wait_for("serve.err", &format!("peer {n}: recorded {before} pages"));
        assert_ok(&mut p, &dir);
        dir.wait_for("serve.err", &format!("peer {n}: its record was cut"));
        paused.push(before);
    }
    // The pause is the peer's sleep: long enough for the cut to land in
    // it on a loaded machine.
    let mut p = testing::peer(&dir, PEER, "p3", &args[..6]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
    let full = record::read_record(&dir.path("rec-3.txt"))
        .unwrap()
        .offsets();
    for (n, before) in (1..=2).zip(paused) {
        let cut = record::read_record(&dir.path(&format!("rec-{n}.txt")))
            .unwrap()
            .offsets();
        assert!(
            before > 0 && before < full.len(),
            "{before} of {}",
            full.len()
        );
        assert_eq!(cut, full[..before], "peer {n}'s cut record");
    }
}

/// SIGUSR1 and SIGUSR2 without `--track-dirty` / `--record` are said to
/// do nothing, and do not end serve (their default action would, and
/// every restore with it): a restore after them is served.
#[test]
fn request_signals_without_their_flags_do_not_end_serve() {
    let dir = Dir::new("no-requests", 8 * MIB);
    let mut s = testing::serve(&dir, SERVE, &["--peers", "1"]);
    for (sig, said) in [
        (faultline_sys::signal::SIGUSR1, "dirty tracking is off"),
        (faultline_sys::signal::SIGUSR2, "recording is off"),
    ] {
        faultline_sys::process::kill(s.pid() as i32, sig).unwrap();
        dir.wait_for("serve.err", said);
    }
    assert!(s.running(), "a request signal ended serve");
    let mut p = testing::peer(&dir, PEER, "p1", &["--verify-all"]);
    assert_ok(&mut p, &dir);
    assert_ok(&mut s, &dir);
}
