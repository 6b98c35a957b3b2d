//! A handler thread that never sleeps: it reads the non-blocking uffd in a
//! loop. Removes the handler's wake-up (the faulting thread still sleeps
//! and is woken by the resolve ioctl) at the price of a whole CPU.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::{Engine, EngineConfig, EngineKind, EngineStats, ThreadCore};
use crate::sys::uffd::Uffd;

/// Busy-polling handler thread. See the module docs.
pub struct SpinEngine {
    core: ThreadCore,
}

impl SpinEngine {
    /// With the default [`EngineConfig`].
    pub fn new() -> crate::Result<Arc<SpinEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config`.
    pub fn with_config(config: EngineConfig) -> crate::Result<Arc<SpinEngine>> {
        let core = ThreadCore::new(config, true)?;
        let mut slots = Vec::new();
        let mut h = core.handler(&mut slots);
        let shutdown = core.shutdown.clone();
        let pin = core.config.pin;
        let body = move || {
            if pin {
                let _ = crate::sys::thread::pin_to_cpu(crate::sys::thread::online_cpus() - 1);
            }
            let mut idle = 0u32;
            while !shutdown.load(Relaxed) {
                if h.read_batch(|h, m| h.on_msg(m)) > 0 {
                    idle = 0;
                    continue;
                }
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(1024) {
                    h.retry_deferred();
                }
                std::hint::spin_loop();
            }
        };
        core.start("spin", vec![Box::new(body)], slots)?;
        Ok(Arc::new(SpinEngine { core }))
    }
}

impl Engine for SpinEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Spin
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
