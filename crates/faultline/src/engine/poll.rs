//! The classic design (seed 001): one handler thread blocks in `poll()`,
//! reads a batch of messages, resolves them; the kernel wakes each faulting
//! thread when its page is installed. Two wake-ups per fault.

use std::sync::Arc;

use super::handler::poll_timeout;
use super::{EngineConfig, EngineKind, ThreadCore, Threaded};
use crate::background::StopFlag;
use crate::error::Result;
use crate::fault::report::fail_closed;
use faultline_sys::poll::{self, poll_in};
use faultline_sys::thread::pin_within;

/// Handler thread blocking in `poll()` + `read()`. See the module docs.
pub struct PollEngine {
    core: ThreadCore,
}

impl PollEngine {
    /// With the default [`EngineConfig`].
    pub fn new() -> Result<Arc<PollEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config`.
    pub fn with_config(config: EngineConfig) -> Result<Arc<PollEngine>> {
        let core = ThreadCore::new(config)?;
        let mut slots = Vec::new();
        let mut h = core.handler(&mut slots);
        let wake = core.wake.clone();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*core.uffd);
        let pin = core.config.pin;
        let body = move |stop: &StopFlag| {
            if pin {
                // The handler's own CPU: the last one it may use, away from
                // CPU 0 where applications usually start.
                let _ = pin_within(|cpus| cpus.last().copied());
            }
            let mut rev = [0i16; 2];
            while !stop.is_set() {
                let Ok(next_due) = h.retry_deferred();
                let timeout = poll_timeout(next_due, 1000);
                if let Err(e) = poll_in(&[fd, wake.raw()], timeout, &mut rev) {
                    fail_closed(|w| {
                        use std::fmt::Write;
                        let _ = write!(w, "poll on the userfaultfd failed: {e}");
                    });
                }
                if poll::failed(rev[0]) {
                    fail_closed(|w| {
                        use std::fmt::Write;
                        let _ = w.write_str("the userfaultfd reported POLLERR");
                    });
                }
                while let Ok(1..) = h.read(&(), || ()) {}
            }
        };
        core.start("poll", vec![Box::new(body)], slots)?;
        Ok(Arc::new(PollEngine { core }))
    }
}

impl Threaded for PollEngine {
    const KIND: EngineKind = EngineKind::Poll;
    fn core(&self) -> &ThreadCore {
        &self.core
    }
}
