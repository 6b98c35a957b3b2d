//! Failpoints: named points where a process kills itself with `SIGKILL`
//! (as `kill -9` from outside would) when the environment asks, so tests
//! can stop a process at an exact step instead of at a timed guess.
//!
//! 1. `FAULTLINE_FAILPOINT=NAME` (or `NAME:N`) is read once, at the first
//!    [`hit`] of any point.
//! 2. Each [`hit`] of the point named `NAME` counts one (every thread of
//!    the process counts into one counter); the `N`th (default the first)
//!    says `failpoint NAME: SIGKILL at T ns (CLOCK_MONOTONIC)` on stderr
//!    (`T`: when it fired, for measurements of what follows) and sends
//!    `SIGKILL` to its own process. Nothing after that line runs: no
//!    destructor, no exit handler, no buffered output.
//! 3. Without the variable, a hit is one relaxed atomic load (the state
//!    is cached after the first read), so the points stay compiled in
//!    release builds.
//! 4. `NAME!panic` (or `NAME:N!panic`) panics at that hit instead, on the
//!    thread that hit it: a bug's panic, for tests of what a process does
//!    when one of its threads dies. `NAME!sleep=MS` blocks that thread for
//!    MS milliseconds: a read that does not return (a hung disk, a store
//!    that stopped answering), for tests of what is said meanwhile.
//!
//! ```text
//!  FAULTLINE_FAILPOINT=fault-read:200
//!    hit("handoff-deposited") ── other name: nothing
//!    hit("fault-read") x199   ── counted
//!    hit("fault-read")        ── the 200th: SIGKILL to getpid()
//! ```

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

/// The variable that arms a failpoint.
pub const ENV: &str = "FAULTLINE_FAILPOINT";

/// 0: not read yet; 1: no failpoint armed; 2: one is (see [`ARMED`]).
static STATE: AtomicU8 = AtomicU8::new(0);
/// The armed point's name, the hit that fires, and what it does.
static ARMED: OnceLock<Option<(String, u64, Action)>> = OnceLock::new();
/// Hits of the armed point so far.
static HITS: AtomicU64 = AtomicU64::new(0);

/// What an armed point does at the hit that fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// `SIGKILL` to its own process.
    Kill,
    /// A panic on the thread that hit it (`!panic`).
    Panic,
    /// That thread sleeps this many milliseconds (`!sleep=MS`).
    Sleep(u64),
}

/// Parses `NAME` or `NAME:N` (N at least 1), either followed by `!panic`
/// or `!sleep=MS`.
fn parse(v: &str) -> Option<(String, u64, Action)> {
    let (v, action) = match v.split_once('!') {
        None => (v, Action::Kill),
        Some((v, "panic")) => (v, Action::Panic),
        Some((v, a)) => (v, Action::Sleep(a.strip_prefix("sleep=")?.parse().ok()?)),
    };
    let (name, n) = parse_count(v)?;
    Some((name, n, action))
}

/// Parses `NAME` or `NAME:N` (N at least 1).
fn parse_count(v: &str) -> Option<(String, u64)> {
    match v.rsplit_once(':') {
        Some((name, n)) => {
            let n: u64 = n.parse().ok().filter(|&n| n >= 1)?;
            Some((name.to_string(), n)).filter(|(name, _)| !name.is_empty())
        }
        None => Some((v.to_string(), 1)).filter(|(name, _)| !name.is_empty()),
    }
}

fn armed() -> Option<&'static (String, u64, Action)> {
    let a = ARMED.get_or_init(|| {
        let v = std::env::var(ENV).ok()?;
        let parsed = parse(&v);
        if parsed.is_none() {
            eprintln!("{ENV}={v:?}: not NAME or NAME:N (N >= 1), then nothing, !panic or !sleep=MS; no failpoint armed");
        }
        parsed
    });
    STATE.store(if a.is_some() { 2 } else { 1 }, Relaxed);
    a.as_ref()
}

/// Failpoint `name` (see the module docs): kills this process with
/// `SIGKILL` (or panics, or sleeps) when it is the armed point and this
/// is its `N`th hit.
#[inline]
pub fn hit(name: &str) {
    if STATE.load(Relaxed) == 1 {
        return;
    }
    fire(name);
}

#[cold]
fn fire(name: &str) {
    let Some((armed, at, action)) = armed() else {
        return;
    };
    if armed != name || HITS.fetch_add(1, Relaxed) + 1 != *at {
        return;
    }
    match *action {
        Action::Kill => {}
        Action::Panic => panic!("failpoint {name}: a panic, as asked ({ENV})"),
        Action::Sleep(ms) => {
            eprintln!("failpoint {name}: this thread sleeps {ms} ms");
            std::thread::sleep(std::time::Duration::from_millis(ms));
            return;
        }
    }
    eprintln!(
        "failpoint {name}: SIGKILL at {} ns (CLOCK_MONOTONIC)",
        crate::monotonic_ns()
    );
    // SAFETY: plain syscalls with integer arguments; SIGKILL to our own
    // pid ends the process here.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    // SIGKILL is delivered before kill(2) returns to a process that sends
    // it to itself; nothing runs after it.
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_counts_parse_and_nonsense_is_refused() {
        let fr = |n, a| Some(("fault-read".to_string(), n, a));
        assert_eq!(parse("fault-read"), fr(1, Action::Kill));
        assert_eq!(parse("fault-read:200"), fr(200, Action::Kill));
        assert_eq!(parse("fault-read:7!panic"), fr(7, Action::Panic));
        assert_eq!(parse("fault-read!panic"), fr(1, Action::Panic));
        assert_eq!(parse("fault-read:3!sleep=2500"), fr(3, Action::Sleep(2500)));
        assert_eq!(parse("fault-read!sleep"), None);
        assert_eq!(parse("fault-read!stop"), None);
        assert_eq!(parse("!panic"), None);
        assert_eq!(parse("fault-read:0"), None);
        assert_eq!(parse("fault-read:x"), None);
        assert_eq!(parse(":3"), None);
        assert_eq!(parse(""), None);
    }
}
