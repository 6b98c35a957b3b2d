//! Work on several threads at once, timed so no work is missed.
//!
//! Each thread stamps its own start (released by a barrier, right before
//! its first access) and its own end (right after its last); the elapsed
//! time is the latest end less the earliest start. A clock started by a
//! coordinating thread after the barrier missed whatever the workers did
//! before the coordinator was scheduled again: on a loaded machine most
//! or all of it, and first-touch rates came out in the billions per
//! second.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Runs `work(t)` for `t` in `0..threads`, each on a thread of its own,
/// all released together; returns the time from the first thread's start
/// to the last one's end (the span that holds all the work).
pub fn timed(threads: usize, work: impl Fn(usize) + Sync) -> Duration {
    let barrier = Barrier::new(threads.max(1));
    let stamps: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    work(t);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    span(&stamps)
}

/// The latest end less the earliest start of `(start, end)` stamps
/// (zero for none).
pub fn span(stamps: &[(Instant, Instant)]) -> Duration {
    let first = stamps.iter().map(|s| s.0).min();
    let last = stamps.iter().map(|s| s.1).max();
    match (first, last) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_holds_every_threads_work() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(span(&[]), Duration::ZERO);
        assert_eq!(
            span(&[(t0 + ms(5), t0 + ms(9)), (t0, t0 + ms(3))]),
            ms(9),
            "from the earliest start to the latest end"
        );
        // The slowest thread's work is inside, whatever the order.
        for slow in 0..3 {
            let d = timed(3, |t| {
                if t == slow {
                    std::thread::sleep(ms(30));
                }
            });
            assert!(d >= ms(30), "thread {slow}: {d:?}");
        }
    }

    /// However the threads are scheduled, the span is never shorter than
    /// one thread's own work: 3 threads on this machine's CPUs, each
    /// spinning for 5 ms of its own clock.
    #[test]
    fn no_work_is_missed_under_contention() {
        for _ in 0..20 {
            let d = timed(3, |_| {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(5) {
                    std::hint::spin_loop();
                }
            });
            assert!(d >= Duration::from_millis(5), "{d:?}");
        }
    }
}
