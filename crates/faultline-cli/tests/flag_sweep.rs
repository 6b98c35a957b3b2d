//! Every numeric flag of every command (but `serve` and `peer`, whose
//! flags their own tests sweep) against the values a user or a script
//! gets wrong: 0, 1, the range's ends and their neighbours, `u64::MAX`,
//! a negative number, a fraction, NaN and the infinities, an empty string.
//!
//! How the sweep runs:
//!
//! 1. The `faultline` command tree ([`faultline_cli::Cli`]) is walked; a
//!    flag is numeric when its value parser yields an integer or a float.
//!    Required arguments of the command are filled with placeholders.
//! 2. Every value is parsed in process (`try_parse_from`): nothing runs,
//!    so an accepted value costs nothing (accepted values are parsed
//!    only, never executed). A refusal must be a validation error of
//!    exactly one `error:` line.
//! 3. The refusal of `u64::MAX` gives the range (`must be from LO to HI`,
//!    the words every numeric flag uses); LO, HI and their neighbours are
//!    then checked against it. Where HI is the machine's (threads it can
//!    start, `MemAvailable`) and may move while the test runs, HI / 4 is
//!    checked instead of HI - 1 and HI.
//! 4. Each flag's `u64::MAX` is also given to the real binary, which must
//!    exit 2 at once with one `error:` line and no panic.

mod support;

use std::any::TypeId;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use faultline_cli::Cli;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Num {
    Int,
    Float,
}

fn numeric(a: &clap::Arg) -> Option<Num> {
    let t = a.get_value_parser().type_id();
    if [
        TypeId::of::<usize>(),
        TypeId::of::<u64>(),
        TypeId::of::<u32>(),
        TypeId::of::<u16>(),
        TypeId::of::<i64>(),
        TypeId::of::<i32>(),
    ]
    .iter()
    .any(|id| t == *id)
    {
        Some(Num::Int)
    } else if t == TypeId::of::<f64>() || t == TypeId::of::<f32>() {
        Some(Num::Float)
    } else {
        None
    }
}

/// A numeric flag of a command: the argv before and after its value.
struct Case {
    what: String,
    before: Vec<String>,
    after: Vec<String>,
    num: Num,
}

impl Case {
    fn argv(&self, v: &str) -> Vec<String> {
        let mut a = self.before.clone();
        a.last_mut().expect("the flag").push_str(v);
        a.extend(self.after.iter().cloned());
        a
    }
}

/// Every numeric flag of `cmd` and its sub-commands (`path`: the words
/// leading to it).
fn collect(cmd: &clap::Command, path: &[String], out: &mut Vec<Case>) {
    for sub in cmd.get_subcommands() {
        let name = sub.get_name();
        if path.is_empty() && matches!(name, "serve" | "peer") {
            continue; // Issue 24's: serve sweeps its own flags.
        }
        let mut p = path.to_vec();
        p.push(name.to_string());
        collect(sub, &p, out);
    }
    // Required arguments of this command, filled with placeholders.
    let mut required = Vec::new();
    let mut positionals = Vec::new();
    for a in cmd.get_arguments() {
        if !a.is_required_set() {
            continue;
        }
        if a.is_positional() {
            positionals.push("placeholder".to_string());
        } else if let Some(l) = a.get_long() {
            required.push(format!("--{l}"));
            required.push("placeholder".into());
        }
    }
    for a in cmd.get_arguments() {
        let Some(num) = numeric(a) else { continue };
        let Some(long) = a.get_long() else { continue };
        let mut before = vec!["faultline".to_string()];
        before.extend(path.iter().cloned());
        before.extend(required.iter().cloned());
        // `--flag=VALUE`: a value starting with '-' is the value, not a flag.
        before.push(format!("--{long}="));
        let mut after = Vec::new();
        if !positionals.is_empty() {
            after.push("--".to_string());
            after.extend(positionals.iter().cloned());
        }
        out.push(Case {
            what: format!("faultline {} --{long}", path.join(" ")),
            before,
            after,
            num,
        });
    }
}

enum Parsed {
    Accepted,
    /// The one `error:` line.
    Refused(String),
}

fn parse(c: &Case, v: &str) -> Parsed {
    match Cli::try_parse_from(c.argv(v)) {
        Ok(_) => Parsed::Accepted,
        Err(e) => {
            assert!(
                matches!(
                    e.kind(),
                    clap::error::ErrorKind::ValueValidation | clap::error::ErrorKind::InvalidValue
                ),
                "{} {v:?}: refused as {:?}, not as a bad value: {e}",
                c.what,
                e.kind()
            );
            let text = e.to_string();
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("error:")).collect();
            assert_eq!(lines.len(), 1, "{} {v:?}: {text}", c.what);
            assert!(
                !text.contains("panicked") && !text.contains("ParseIntError"),
                "{} {v:?}: {text}",
                c.what
            );
            Parsed::Refused(lines[0].to_string())
        }
    }
}

/// The range a refusal states: `must be from LO to HI` (floats: `from
/// more than LO to HI`), whether HI is the machine's, and the step the
/// values take (`a power of two`: 0; `a multiple of N`: N; else 1).
fn stated_range(line: &str) -> Option<(String, String, bool, u64)> {
    let at = line.find("must be from ")?;
    let rest = &line[at + "must be from ".len()..];
    let rest = rest.strip_prefix("more than ").unwrap_or(rest);
    let (lo, rest) = rest.split_once(" to ")?;
    let hi: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '-')
        .collect();
    let machine = rest.contains("MemAvailable") || rest.contains("threads this machine");
    let step = if line.contains("power of two") {
        0
    } else if let Some((_, m)) = line.split_once("a multiple of ") {
        let n: String = m.chars().take_while(char::is_ascii_digit).collect();
        n.parse().ok()?
    } else {
        1
    };
    Some((lo.to_string(), hi, machine, step))
}

fn accepted(c: &Case, v: &str) {
    if let Parsed::Refused(e) = parse(c, v) {
        panic!("{} {v}: refused inside its range: {e}", c.what);
    }
}

fn refused(c: &Case, v: &str) {
    if let Parsed::Accepted = parse(c, v) {
        panic!("{} {v:?}: accepted", c.what);
    }
}

#[test]
fn every_numeric_flag_has_a_stated_range_and_refuses_nonsense_in_one_line() {
    let mut cases = Vec::new();
    collect(&Cli::command(), &[], &mut cases);
    assert!(
        cases.len() >= 60,
        "only {} numeric flags found",
        cases.len()
    );
    let mut checked = 0usize;
    for c in &cases {
        // Never a number: refused by every numeric flag.
        for v in ["", "-1", "NaN", "inf", "-inf", "x", "18446744073709551616"] {
            refused(c, v);
            checked += 1;
        }
        if c.num == Num::Int {
            refused(c, "1.5");
            checked += 1;
        }
        for v in ["0", "1"] {
            let _ = parse(c, v); // Either way, one line (asserted in parse).
            checked += 1;
        }
        let max = u64::MAX.to_string();
        checked += 1;
        // The range: from the refusal of u64::MAX, or (any number up to
        // u64::MAX accepted) of 0, or all of u64.
        let (lo, hi, machine, step) = match (parse(c, &max), parse(c, "0")) {
            (Parsed::Refused(e), _) => {
                stated_range(&e).unwrap_or_else(|| panic!("{} {max}: no stated range: {e}", c.what))
            }
            (Parsed::Accepted, Parsed::Refused(e)) => {
                stated_range(&e).unwrap_or_else(|| panic!("{} 0: no stated range: {e}", c.what))
            }
            (Parsed::Accepted, Parsed::Accepted) => {
                assert_eq!(c.num, Num::Int, "{}: a float past 1e19 accepted", c.what);
                ("0".into(), max.clone(), false, 1)
            }
        };
        match c.num {
            Num::Int => {
                let lo: u64 = lo.parse().unwrap();
                let hi: u64 = hi.parse().unwrap();
                assert!(lo <= hi, "{}: range {lo} to {hi}", c.what);
                accepted(c, &lo.to_string());
                if lo > 0 {
                    refused(c, &(lo - 1).to_string());
                }
                if machine {
                    let quarter = match step {
                        0 => (hi / 4).next_power_of_two(),
                        n => hi / 4 / n * n,
                    };
                    accepted(c, &lo.max(quarter).to_string());
                    checked += 1;
                } else {
                    accepted(c, &hi.to_string());
                    if step == 0 {
                        refused(c, &(hi - 1).to_string());
                        accepted(c, &(hi / 2).max(lo).to_string());
                    } else if step > 1 && hi > lo {
                        // Whole steps only.
                        refused(c, &(hi - 1).to_string());
                        accepted(c, &(hi - step).to_string());
                    } else if hi > lo {
                        accepted(c, &(hi - 1).to_string());
                    }
                    if hi < u64::MAX {
                        refused(c, &(hi + 1).to_string());
                    }
                    checked += 2;
                }
                checked += 2;
            }
            Num::Float => {
                let hi: f64 = hi.parse().unwrap();
                accepted(c, &hi.to_string());
                refused(c, &(hi * 2.0 + 1.0).to_string());
                accepted(c, &(hi / 2.0).to_string());
                checked += 3;
            }
        }
    }
    eprintln!(
        "flag sweep: {} numeric flags, {checked} values parsed",
        cases.len()
    );
}

#[test]
fn the_binary_refuses_every_flags_largest_number_at_once() {
    let mut cases = Vec::new();
    collect(&Cli::command(), &[], &mut cases);
    for c in &cases {
        let argv = c.argv(&u64::MAX.to_string());
        if matches!(parse(c, &u64::MAX.to_string()), Parsed::Accepted) {
            continue; // A seed or a vertex number: any u64 is one.
        }
        let out = support::finish(
            support::spawn(
                &std::env::temp_dir(),
                &argv[1..].iter().map(String::as_str).collect::<Vec<_>>(),
            ),
            Duration::from_secs(20),
            &format!("{argv:?}"),
        );
        assert_eq!(out.code, Some(2), "{argv:?}: {}", out.stderr);
        assert_eq!(out.errors().len(), 1, "{argv:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{argv:?}: no work before the check");
    }
}
