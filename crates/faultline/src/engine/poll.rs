//! The classic design (seed 001): one handler thread blocks in `poll()`,
//! reads a batch of messages, resolves them; the kernel wakes each faulting
//! thread when its page is installed. Two wake-ups per fault.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use super::{Engine, EngineConfig, EngineKind, EngineStats, ThreadCore};
use crate::sys::thread::poll_in;
use crate::sys::uffd::Uffd;

/// Handler thread blocking in `poll()` + `read()`. See the module docs.
pub struct PollEngine {
    core: ThreadCore,
}

impl PollEngine {
    /// With the default [`EngineConfig`].
    pub fn new() -> crate::Result<Arc<PollEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config`.
    pub fn with_config(config: EngineConfig) -> crate::Result<Arc<PollEngine>> {
        // poll() on a blocking uffd reports POLLERR: the fd must be
        // non-blocking.
        let core = ThreadCore::new(config, true)?;
        let mut slots = Vec::new();
        let mut h = core.handler(&mut slots);
        let (shutdown, wake) = (core.shutdown.clone(), core.wake.clone());
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*core.uffd);
        let pin = core.config.pin;
        let body = move || {
            if pin {
                // The handler's own CPU: the last one, away from CPU 0 where
                // applications usually start.
                let _ = crate::sys::thread::pin_to_cpu(crate::sys::thread::online_cpus() - 1);
            }
            let mut rev = [0i16; 2];
            while !shutdown.load(SeqCst) {
                let timeout = h.timeout_ms(1000);
                if let Err(e) = poll_in(&[fd, wake.raw()], timeout, &mut rev) {
                    super::fail_closed(|w| {
                        use std::fmt::Write;
                        let _ = write!(w, "poll on the userfaultfd failed: {e}");
                    });
                }
                if rev[0] & (libc::POLLERR | libc::POLLHUP) != 0 {
                    super::fail_closed(|w| {
                        use std::fmt::Write;
                        let _ = w.write_str("the userfaultfd reported POLLERR");
                    });
                }
                while h.read_batch(|h, m| h.on_msg(m)) > 0 {}
            }
        };
        core.start("poll", vec![Box::new(body)], slots)?;
        Ok(Arc::new(PollEngine { core }))
    }
}

impl Engine for PollEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Poll
    }
    fn uffd(&self) -> &Arc<Uffd> {
        &self.core.uffd
    }
    fn scratch_bytes(&self) -> usize {
        self.core.config.scratch_bytes
    }
    fn stats(&self) -> EngineStats {
        self.core.counters.snapshot()
    }
    fn check_alive(&self) -> crate::Result<()> {
        self.core.check_alive()
    }
}
