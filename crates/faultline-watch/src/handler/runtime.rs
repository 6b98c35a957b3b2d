//! The handlers' process-wide runtime, in one leaked private mapping so it
//! outlives watchers and can never be watched: the grace counters that let
//! a watcher be freed safely, the published watcher, the actions installed
//! before ours, our pid, and 128 per-thread slots.
//!
//! A slot holds what a thread needs while it is inside a handler or
//! single-stepping: its handler nesting depth, whether it is running the
//! callback (writes it makes are performed but not reported), the pages
//! opened for a single step and the bytes before it. A slot is keyed by the
//! thread's TCB address and recycled when all are taken and one is idle.
//!
//! Also here: fork handling (a forked child turns the watcher off and
//! gives mprotect-armed pages their protection back), chaining to the
//! previous action, and [`deliver`], which counts a hit and calls the
//! callback.

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

use faultline::interval::Grace;
use faultline_sys::mem::{mprotect, Mapping};
use faultline_sys::signal::{install_sigaction, Handler, SigAction, SignalContext};
use faultline_sys::thread::{at_fork_in_child, getpid, gettid};

use crate::emulate;
use crate::error::WatchError;
use crate::hit::Hit;
use crate::state::Inner;
use crate::table::{thread_key, PageEntry, Tier, PAGE};

const SLOTS: usize = 128;

/// Per-thread state while a thread is inside a handler or single-stepping.
pub(crate) struct Slot {
    /// The thread's TCB pointer (`fs:0`), 0 when free.
    key: AtomicU64,
    tid: AtomicU32,
    /// Nesting depth of handlers on this thread.
    pub(super) depth: AtomicU32,
    in_callback: AtomicU32,
    /// Pages opened for a single step (entry pointers), 0 = none.
    pub(super) step: [AtomicUsize; 2],
    pub(super) step_tf_was_set: AtomicU32,
    pub(super) step_ip: AtomicU64,
    pub(super) step_addr: AtomicU64,
    pub(super) step_len: AtomicU64,
    pub(super) step_before: [AtomicU64; 8],
}

/// Process-wide state of the handlers, in a leaked private mapping.
pub(crate) struct Runtime {
    pub grace: Grace,
    pub active: AtomicPtr<Inner>,
    slots: [Slot; SLOTS],
    prev: [AtomicPtr<SigAction>; 3],
    /// Our pid, for `process_vm_readv` (updated in a forked child).
    pub(super) pid: AtomicI32,
    base: u64,
    len: u64,
}

pub(super) static RUNTIME: OnceLock<&'static Runtime> = OnceLock::new();

/// The runtime, created and `handlers` installed on first call (in this
/// order: SIGBUS, SIGSEGV, SIGTRAP; [`chain`] indexes the previous actions
/// so).
pub(super) fn get_or_init(handlers: &[(i32, Handler); 3]) -> Result<&'static Runtime, WatchError> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let r = create(handlers)?;
    let _ = RUNTIME.set(r);
    Ok(r)
}

fn placeholder() -> Runtime {
    Runtime {
        grace: Grace::new(),
        active: AtomicPtr::new(std::ptr::null_mut()),
        slots: std::array::from_fn(|_| new_slot()),
        prev: Default::default(),
        pid: AtomicI32::new(getpid()),
        base: 0,
        len: 0,
    }
}

fn new_slot() -> Slot {
    Slot {
        key: AtomicU64::new(0),
        tid: AtomicU32::new(0),
        depth: AtomicU32::new(0),
        in_callback: AtomicU32::new(0),
        step: Default::default(),
        step_tf_was_set: AtomicU32::new(0),
        step_ip: AtomicU64::new(0),
        step_addr: AtomicU64::new(0),
        step_len: AtomicU64::new(0),
        step_before: Default::default(),
    }
}

fn create(handlers: &[(i32, Handler); 3]) -> Result<&'static Runtime, WatchError> {
    // The decoder builds its tables on first use (allocating): never let
    // that happen inside a handler.
    emulate::prepare();
    let len = std::mem::size_of::<Runtime>().div_ceil(PAGE as usize) * PAGE as usize;
    let m = Mapping::anon(len).map_err(|e| WatchError::Sys {
        op: "mmap",
        addr: 0,
        source: e.source,
    })?;
    let p = m.as_ptr() as *mut Runtime;
    let mut rt = placeholder();
    rt.base = m.addr();
    rt.len = len as u64;
    // SAFETY: `p` is a fresh, page-aligned private mapping of at least
    // size_of::<Runtime>() bytes; we leak it so the reference is 'static.
    unsafe { p.write(rt) };
    std::mem::forget(m);
    // SAFETY: initialised above and never unmapped.
    let rt: &'static Runtime = unsafe { &*p };
    // Before the handlers: a child forked once they run must find its hook.
    at_fork_in_child(after_fork_in_child).map_err(|e| WatchError::Sys {
        op: "pthread_atfork",
        addr: 0,
        source: e,
    })?;
    for (i, &(sig, h)) in handlers.iter().enumerate() {
        let old = install_sigaction(sig, h, false).map_err(|e| WatchError::Sys {
            op: "sigaction",
            addr: 0,
            source: e,
        })?;
        rt.prev[i].store(Box::into_raw(Box::new(old)), SeqCst);
    }
    Ok(rt)
}

/// A forked child does not inherit the watch: its uffd registrations and
/// debug registers are gone, and the forced writes would go through the
/// parent's `/proc/self/mem`. So the child turns the watcher off and gives
/// its mprotect-armed pages their protection back.
extern "C" fn after_fork_in_child() {
    let Some(rt) = RUNTIME.get() else { return };
    rt.pid.store(getpid(), SeqCst);
    let inner = rt.active.swap(std::ptr::null_mut(), SeqCst);
    if inner.is_null() {
        return;
    }
    // SAFETY: the child is single-threaded: no handler and no writer runs,
    // and the parent's watcher memory was copied with the child.
    let inner = unsafe { &*inner };
    inner.pages.for_each(|e| {
        if e.tier() == Tier::Mprotect {
            let _ = mprotect(e.page, PAGE as usize, e.prot());
        }
        e.tier.store(Tier::Off as u32, SeqCst);
    });
}

/// Whether `[start, end)` overlaps the runtime's memory.
pub(crate) fn runtime_overlaps(start: u64, end: u64) -> bool {
    RUNTIME
        .get()
        .is_some_and(|r| start < r.base + r.len && r.base < end)
}

impl Runtime {
    /// The calling thread's slot with its depth raised (pair with
    /// [`Runtime::leave`]). A slot stays assigned to its thread; when all
    /// are taken, an idle one (no handler, no step) is recycled.
    pub(super) fn enter(&self) -> Option<&Slot> {
        let key = thread_key();
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SLOTS;
        loop {
            let s = self.probe(key, start).or_else(|| self.recycle(key))?;
            if s.depth.fetch_add(1, SeqCst) == 0 {
                // The key (TCB address) may belong to a new thread since the
                // last use: learn the tid again when a hit needs it.
                s.tid.store(0, Relaxed);
            }
            if s.key.load(SeqCst) == key {
                return Some(s);
            }
            // Recycled under us: try again.
            s.depth.fetch_sub(1, SeqCst);
        }
    }

    fn probe(&self, key: u64, start: usize) -> Option<&Slot> {
        for i in 0..SLOTS {
            let s = &self.slots[(start + i) % SLOTS];
            let k = s.key.load(Acquire);
            if k == key {
                return Some(s);
            }
            if k == 0 && s.key.compare_exchange(0, key, AcqRel, Acquire).is_ok() {
                return Some(s);
            }
        }
        None
    }

    fn recycle(&self, key: u64) -> Option<&Slot> {
        for s in &self.slots {
            let old = s.key.load(SeqCst);
            if s.depth.load(SeqCst) == 0
                && s.step[0].load(SeqCst) == 0
                && s.key.compare_exchange(old, key, SeqCst, SeqCst).is_ok()
            {
                if s.depth.load(SeqCst) == 0 && s.step[0].load(SeqCst) == 0 {
                    return Some(s);
                }
                let _ = s.key.compare_exchange(key, old, SeqCst, SeqCst);
            }
        }
        None
    }

    pub(super) fn find_slot(&self) -> Option<&Slot> {
        let key = thread_key();
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SLOTS;
        (0..SLOTS)
            .map(|i| &self.slots[(start + i) % SLOTS])
            .find(|s| s.key.load(Acquire) == key)
    }

    /// The thread id of the slot's thread (looked up once per handler).
    pub(super) fn tid(s: &Slot) -> i32 {
        let t = s.tid.load(Relaxed);
        if t != 0 {
            return t as i32;
        }
        let t = gettid();
        s.tid.store(t as u32, Relaxed);
        t
    }

    pub(super) fn leave(&self, s: &Slot) {
        s.depth.fetch_sub(1, SeqCst);
    }
}

/// Whether the calling thread is inside one of our handlers.
pub(crate) fn in_handler() -> bool {
    RUNTIME
        .get()
        .and_then(|r| r.find_slot())
        .is_some_and(|s| s.depth.load(Relaxed) > 0)
}

/// Passes the signal to the action installed before ours (`which`: 0
/// SIGBUS, 1 SIGSEGV, 2 SIGTRAP).
pub(super) fn chain(rt: &Runtime, which: usize, sc: &SignalContext) {
    let prev = rt.prev[which].load(SeqCst);
    // SAFETY: `prev` entries are null or set once from `Box::into_raw` and
    // never freed.
    sc.chain(unsafe { prev.as_ref() })
}

pub(super) fn abort_with(msg: &[u8]) -> ! {
    faultline_sys::write_stderr(b"faultline watch: ");
    faultline_sys::write_stderr(msg);
    faultline_sys::write_stderr(b"\n");
    std::process::abort();
}

/// Counts a hit and calls the callback, or, when the write came from the
/// callback itself (a nested handler), counts it as suppressed.
pub(super) fn deliver(inner: &Inner, slot: &Slot, e: Option<&PageEntry>, hit: &Hit) {
    if slot.in_callback.load(Relaxed) != 0 {
        inner.shared.suppressed.fetch_add(1, Relaxed);
        return;
    }
    inner.shared.hits.fetch_add(1, Relaxed);
    if let Some(e) = e {
        e.hits.fetch_add(1, Relaxed);
    }
    if let Some(cb) = &inner.callback {
        slot.in_callback.fetch_add(1, Relaxed);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(hit)));
        slot.in_callback.fetch_sub(1, Relaxed);
        if r.is_err() {
            abort_with(b"the watch callback panicked");
        }
    }
}
