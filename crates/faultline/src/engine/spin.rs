//! A handler thread that never sleeps: it reads the non-blocking uffd in a
//! loop. Removes the handler's wake-up (the faulting thread still sleeps
//! and is woken by the resolve ioctl) at the price of a whole CPU.

use std::sync::Arc;

use super::{EngineConfig, EngineKind, ThreadCore, Threaded};
use crate::background::StopFlag;
use crate::error::Result;
use faultline_sys::thread::pin_within;

/// Busy-polling handler thread. See the module docs.
pub struct SpinEngine {
    core: ThreadCore,
}

impl SpinEngine {
    /// With the default [`EngineConfig`].
    pub fn new() -> Result<Arc<SpinEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config`.
    pub fn with_config(config: EngineConfig) -> Result<Arc<SpinEngine>> {
        let core = ThreadCore::new(config)?;
        let mut slots = Vec::new();
        let mut h = core.handler(&mut slots);
        let pin = core.config.pin;
        let body = move |stop: &StopFlag| {
            if pin {
                let _ = pin_within(|cpus| cpus.last().copied());
            }
            let mut idle = 0u32;
            while !stop.is_set() {
                if let Ok(1..) = h.read(&(), || ()) {
                    idle = 0;
                    continue;
                }
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(1024) {
                    let Ok(_) = h.retry_deferred();
                }
                std::hint::spin_loop();
            }
        };
        core.start("spin", vec![Box::new(body)], slots)?;
        Ok(Arc::new(SpinEngine { core }))
    }
}

impl Threaded for SpinEngine {
    const KIND: EngineKind = EngineKind::Spin;
    fn core(&self) -> &ThreadCore {
        &self.core
    }
}
