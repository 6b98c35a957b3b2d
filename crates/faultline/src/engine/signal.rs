//! Same-thread fault forwarding through `UFFD_FEATURE_SIGBUS`: the
//! software form of seed 000's user-interrupt page-fault forwarding.
//!
//! 1. Regions are registered on a uffd opened with `UFFD_FEATURE_SIGBUS`:
//!    a missing fault queues no message and puts no thread to sleep; the
//!    kernel sends SIGBUS (`BUS_ADRERR`, exact `si_addr`) to the faulting
//!    thread.
//! 2. The process-wide SIGBUS handler reads the error code
//!    (`uc_mcontext.gregs[REG_ERR]`: bit 1 = write), finds the region in the
//!    lock-free region table, and runs the shared resolve path right there.
//! 3. Returning from the handler restarts the faulting instruction, which
//!    now finds its page. No handler thread, no wake-up, no context switch.
//!
//! The handler is async-signal-safe: it never allocates or takes a lock.
//! Stores that need a buffer get one of 64 preallocated scratch slots
//! (claimed with one atomic); the handler saves and restores `errno`.
//! Addresses that are not ours (other SIGBUS sources: a file mapping past
//! EOF, truncated shmem) and poisoned pages go to the previously installed
//! SIGBUS handler; if there was none, the default action (terminate with a
//! core dump) runs.
//!
//! # Caveats
//! * A fault taken inside a system call (`read(2)` into the region,
//!   `O_DIRECT`, `io_uring`, `process_vm_readv`) is not a signal: the call
//!   fails with `EFAULT`. Call [`crate::Region::populate`] on the range first.
//! * The handler's stack and buffers must not lie in a registered range (a
//!   fault there inside the handler kills the process). The scratch slots
//!   are a private mapping; the handler runs on the faulting thread's stack,
//!   or, with [`EngineConfig::altstack_bytes`], on a dedicated alternate
//!   stack that [`SignalEngine::prepare_thread`] maps for each thread.
//! * Without `CONFIG_MEMORY_FAILURE` a poisoned page raises the same
//!   `BUS_ADRERR` as a missing one; the runtime remembers poisoned pages
//!   in the residency map so it does not retry them forever.

use std::cell::RefCell;
use std::fmt::Write;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{Counters, Engine, EngineConfig, EngineKind, EngineStats};
use crate::error::{Error, Result};
use crate::fault::report::{fail_closed, report};
use crate::fault::resolve::{resolve, Access, Origin, Resolution};
use crate::fault::table::enter;
use crate::page::PageSize;
use crate::residency::PageState;
use faultline_sys::mem::Mapping;
use faultline_sys::signal::{
    install_sigaction, SigAction, SigInfo, SignalContext, BUS_ADRERR, SIGBUS,
};
use faultline_sys::uffd::{feature, Uffd};
use faultline_sys::{errno, rdtsc, set_errno};

const SCRATCH_SLOTS: usize = 64;
/// How long a fault that finds another thread installing its page spins
/// for that thread's claim to clear before it retries the access.
const BUSY_WAIT: Duration = Duration::from_micros(100);

/// Same-thread SIGBUS delivery. See the module docs.
pub struct SignalEngine {
    uffd: Arc<Uffd>,
    config: EngineConfig,
}

/// Counters of all signal engines (the handler is process-wide).
static COUNTERS: OnceLock<Counters> = OnceLock::new();
/// The action that was installed before ours, for chaining.
static PREVIOUS: AtomicPtr<SigAction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Mutex<()> = Mutex::new(());

/// Scratch buffers the handler can claim without allocating.
struct ScratchPool {
    map: Mapping,
    slot_bytes: usize,
    free: AtomicU64,
}

static SCRATCH: OnceLock<ScratchPool> = OnceLock::new();

impl ScratchPool {
    fn acquire(&self) -> Option<(usize, *mut u8)> {
        let mut spins = 0u32;
        loop {
            let cur = self.free.load(SeqCst);
            if cur == 0 {
                spins += 1;
                if spins > 1_000_000 {
                    return None;
                }
                std::hint::spin_loop();
                continue;
            }
            let i = cur.trailing_zeros() as usize;
            if self
                .free
                .compare_exchange_weak(cur, cur & !(1 << i), SeqCst, Relaxed)
                .is_ok()
            {
                // SAFETY: `i < 64` slots of `slot_bytes` lie inside `map`.
                return Some((i, unsafe { self.map.as_ptr().add(i * self.slot_bytes) }));
            }
        }
    }
    fn release(&self, i: usize) {
        self.free.fetch_or(1 << i, SeqCst);
    }
}

impl SignalEngine {
    /// With the default [`EngineConfig`].
    pub fn new() -> Result<Arc<SignalEngine>> {
        Self::with_config(EngineConfig::default())
    }

    /// With `config` (only `scratch_bytes` applies; the first signal
    /// engine of the process sizes the shared scratch pool).
    pub fn with_config(config: EngineConfig) -> Result<Arc<SignalEngine>> {
        let caps = crate::caps::capabilities();
        if !caps.has(feature::SIGBUS) {
            return Err(Error::Unsupported {
                what: "signal engine",
                reason: "kernel lacks UFFD_FEATURE_SIGBUS".into(),
            });
        }
        let uffd = crate::caps::open_uffd(true, feature::SIGBUS | super::common_features())?;
        install_handler(config.scratch_bytes, config.altstack_bytes.is_some())?;
        Ok(Arc::new(SignalEngine {
            uffd: Arc::new(uffd),
            config,
        }))
    }

    /// Gives the calling thread a dedicated alternate signal stack of
    /// [`EngineConfig::altstack_bytes`] (default 256 KiB), outside every
    /// region, kept until the thread exits. Needed on every thread that may
    /// fault when the engine was created with `altstack_bytes`.
    pub fn prepare_thread(&self) -> Result<()> {
        let bytes = self
            .config
            .altstack_bytes
            .unwrap_or(256 << 10)
            .max(64 << 10);
        thread_local! {
            static ALTSTACK: RefCell<Option<AltStack>> = const { RefCell::new(None) };
        }
        struct AltStack(#[allow(dead_code, reason = "keeps the stack mapped")] Mapping);
        impl Drop for AltStack {
            fn drop(&mut self) {
                faultline_sys::signal::remove_altstack();
            }
        }
        ALTSTACK.with(|a| {
            if a.borrow().is_none() {
                let m = faultline_sys::signal::install_altstack(bytes).map_err(|e| Error::Io {
                    op: "sigaltstack",
                    source: e,
                })?;
                *a.borrow_mut() = Some(AltStack(m));
            }
            Ok(())
        })
    }
}

fn install_handler(scratch_bytes: usize, onstack: bool) -> Result<()> {
    let _g = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    COUNTERS.get_or_init(Counters::default);
    if SCRATCH.get().is_none() {
        let base = PageSize::BASE.bytes();
        let slot_bytes = scratch_bytes.max(base).next_multiple_of(base);
        let map = Mapping::anon(slot_bytes * SCRATCH_SLOTS)?;
        let _ = SCRATCH.set(ScratchPool {
            map,
            slot_bytes,
            free: AtomicU64::new(u64::MAX),
        });
    }
    if PREVIOUS.load(SeqCst).is_null() {
        let prev = install_sigaction(SIGBUS, on_sigbus, onstack).map_err(|e| Error::Io {
            op: "sigaction(SIGBUS)",
            source: e,
        })?;
        PREVIOUS.store(Box::into_raw(Box::new(prev)), SeqCst);
    }
    Ok(())
}

impl Engine for SignalEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Signal
    }
    fn uffd(&self) -> &Arc<Uffd> {
        &self.uffd
    }
    fn scratch_bytes(&self) -> usize {
        SCRATCH
            .get()
            .map(|s| s.slot_bytes)
            .unwrap_or(self.config.scratch_bytes)
    }
    fn stats(&self) -> EngineStats {
        COUNTERS.get().map(Counters::snapshot).unwrap_or_default()
    }
}

/// The x86 page-fault error code of a fault-generated SIGBUS, as
/// (write, protection): bit 1 = the access was a write, bit 0 = the page
/// was present (a userfaultfd write-protect fault).
fn access_of(sc: &SignalContext) -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // Meaningful because the caller checked this is a fault-generated
        // SIGBUS (si_code BUS_ADRERR).
        let err = sc.error_code();
        (err.write(), err.present())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = sc;
        (true, false)
    }
}

extern "C" fn on_sigbus(sig: i32, info: *mut SigInfo, ctx: *mut std::ffi::c_void) {
    let t0 = rdtsc();
    let saved = errno();
    // SAFETY: the arguments of this running SA_SIGINFO handler; `sc` is
    // dropped before it returns.
    let sc = unsafe { SignalContext::from_raw(sig, info, ctx) };
    let (code, addr) = (sc.code(), sc.fault_addr());
    if code == BUS_ADRERR {
        if let Some(r) = enter(addr) {
            let page = r.pages.index(addr);
            if r.delivery.on_faulting_thread {
                r.fault_seen(page, t0);
                let counters = COUNTERS.get().expect("installed with the handler");
                counters.faults.fetch_add(1, Relaxed);
                let pool = SCRATCH.get().expect("installed with the handler");
                let mut slot = None;
                let scratch: &mut [u8] = if r.needs_scratch() {
                    match pool.acquire() {
                        Some((i, p)) => {
                            slot = Some(i);
                            // SAFETY: slot `i` is exclusively ours until
                            // released below; slots do not overlap.
                            unsafe { std::slice::from_raw_parts_mut(p, pool.slot_bytes) }
                        }
                        None => fail_closed(|w| {
                            let _ = w.write_str("no free scratch slot for the SIGBUS handler");
                        }),
                    }
                } else {
                    &mut []
                };
                let (write, wp) = access_of(&sc);
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    resolve(&r, page, Access { write, wp }, &Origin::Fault, scratch)
                }));
                if let Some(i) = slot {
                    pool.release(i);
                }
                let dt = rdtsc().wrapping_sub(t0);
                r.add_cycles(dt);
                counters.handler_cycles.fetch_add(dt, Relaxed);
                match res {
                    Ok(Resolution::Resolved | Resolution::Retry | Resolution::Gone) => {
                        set_errno(saved);
                        return;
                    }
                    Ok(Resolution::Busy) => {
                        // Another thread is installing the page: wait for its
                        // claim to clear (bounded) rather than re-fault and
                        // take another signal per retry.
                        r.stats.busy.fetch_add(1, Relaxed);
                        let deadline = Instant::now() + BUSY_WAIT;
                        while r.residency.is_claimed(page) && Instant::now() < deadline {
                            std::hint::spin_loop();
                        }
                        set_errno(saved);
                        return;
                    }
                    Ok(Resolution::StoreFailed(e)) => report(|w| {
                        let _ = w.write_str("store error at ");
                        r.describe_page(page, w);
                        let _ = write!(w, ": {e}; the page is poisoned, delivering SIGBUS");
                    }),
                    Ok(Resolution::Poisoned) => report(|w| {
                        let _ =
                            w.write_str("access to a page poisoned by an earlier store error at ");
                        r.describe_page(page, w);
                    }),
                    Ok(Resolution::Failed(e)) => fail_closed(|w| {
                        let _ = write!(w, "resolving a fault failed ({e}) at ");
                        r.describe_page(page, w);
                    }),
                    Err(_) => fail_closed(|w| {
                        let _ = w.write_str("the fault handler panicked at ");
                        r.describe_page(page, w);
                    }),
                }
            } else if r.residency.get(page) == PageState::Poisoned {
                // A thread-engine region: SIGBUS here is a poisoned page.
                report(|w| {
                    let _ = w.write_str("access to a page poisoned by a store error at ");
                    r.describe_page(page, w);
                });
            }
        }
    }
    chain(sig, info, ctx);
    set_errno(saved);
}

/// Passes the signal to the previously installed handler, or performs the
/// default action.
fn chain(sig: i32, info: *mut SigInfo, ctx: *mut std::ffi::c_void) {
    // SAFETY: PREVIOUS is set once from a Box and never freed; the rest is
    // what the kernel passed us.
    unsafe { faultline_sys::signal::chain_to(PREVIOUS.load(SeqCst), sig, info, ctx) }
}
