//! Background threads that stop when asked.
//!
//! Every long-lived helper thread of the runtime is a [`Background`]: an
//! engine's handler threads and stall watchdog, a region's run-ahead
//! populator and evictor, a frame pool's refiller. Stopping one
//!
//! 1. sets its [`StopFlag`] (several threads may share one flag, so an
//!    engine stops all its handlers at once),
//! 2. calls a waker that interrupts whatever the thread blocks on (an
//!    eventfd, a futex) — parked threads are unparked as well,
//! 3. joins it.
//!
//! Dropping a `Background` stops it with no waker, so a thread that only
//! parks with a timeout or polls the flag needs nothing else.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A stop request, shared by a thread and whoever stops it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// A flag that is not set.
    pub fn new() -> StopFlag {
        StopFlag::default()
    }
    /// Whether a stop was requested.
    #[inline]
    pub fn is_set(&self) -> bool {
        self.0.load(SeqCst)
    }
    /// Requests the stop.
    pub fn set(&self) {
        self.0.store(true, SeqCst);
    }
}

/// A named thread that is stopped and joined before it is dropped. See the
/// module docs.
#[derive(Debug)]
pub(crate) struct Background {
    flag: StopFlag,
    thread: Option<JoinHandle<()>>,
    /// The process that started the thread: a forked child has a copy of
    /// this handle but not the thread (see [`Background::stop`]).
    pid: u32,
}

impl Background {
    /// Runs `body` on a new thread named `name` with a flag of its own.
    pub fn spawn(
        name: impl Into<String>,
        body: impl FnOnce(&StopFlag) + Send + 'static,
    ) -> std::io::Result<Background> {
        Self::spawn_with(name, &StopFlag::new(), body)
    }

    /// Runs `body` on a new thread named `name`, stopped by `flag` (which
    /// other threads may share).
    pub fn spawn_with(
        name: impl Into<String>,
        flag: &StopFlag,
        body: impl FnOnce(&StopFlag) + Send + 'static,
    ) -> std::io::Result<Background> {
        let mine = flag.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&mine))?;
        Ok(Background {
            flag: flag.clone(),
            thread: Some(thread),
            pid: std::process::id(),
        })
    }

    /// Whether the thread has returned (for liveness checks).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Sets the flag, calls `wake` to interrupt whatever the thread waits
    /// on, unparks and joins it. Idempotent.
    ///
    /// In a forked child (a process other than the one that started the
    /// thread) the thread does not exist: the handle is a copy of the
    /// parent's, and glibc hands the dead thread's descriptor to the next
    /// thread the child starts, so joining (or detaching, as dropping the
    /// handle does) would act on that one (a join that never returns was
    /// seen). The handle is forgotten instead.
    pub fn stop(&mut self, wake: impl FnOnce()) {
        self.flag.set();
        if let Some(t) = self.thread.take() {
            if self.pid != std::process::id() {
                std::mem::forget(t);
                return;
            }
            wake();
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop(|| ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn stop_sets_the_flag_wakes_and_joins() {
        let rounds = Arc::new(AtomicUsize::new(0));
        let r = rounds.clone();
        let mut bg = Background::spawn("test-bg", move |stop| {
            while !stop.is_set() {
                r.fetch_add(1, SeqCst);
                std::thread::park_timeout(Duration::from_secs(60));
            }
        })
        .unwrap();
        while rounds.load(SeqCst) == 0 {
            std::thread::yield_now();
        }
        let woken = AtomicBool::new(false);
        // Unparking ends the 60 s park at once: this returns promptly.
        bg.stop(|| woken.store(true, SeqCst));
        assert!(woken.load(SeqCst));
        assert!(bg.is_finished());
        bg.stop(|| panic!("a second stop does nothing"));
    }

    #[test]
    fn a_shared_flag_stops_every_thread() {
        let flag = StopFlag::new();
        let threads: Vec<_> = (0..3)
            .map(|i| {
                Background::spawn_with(format!("test-bg-{i}"), &flag, |stop| {
                    while !stop.is_set() {
                        std::thread::park_timeout(Duration::from_millis(1));
                    }
                })
                .unwrap()
            })
            .collect();
        flag.set();
        drop(threads);
    }
}
