//! The signal handlers: SIGBUS (uffd write-protect faults), SIGSEGV
//! (mprotect faults) and SIGTRAP (single-step completion, debug-register
//! hits).
//!
//! ```text
//!  write to a protected page
//!    -> SIGBUS / SIGSEGV on the writing thread
//!       grace.enter; page entry = hash probe; not ours -> chain
//!       decode at RIP; emulate:      store goes to the alias, or
//!         un-protect/store/re-protect under the page lock, or
//!         /proc/self/mem (forced write, page stays read-only)
//!       report hits (watched bytes written), RIP += len, return
//!    -> not emulated: page lock, un-protect, set TF, return
//!       the instruction runs once -> SIGTRAP (TRAP_TRACE)
//!       re-protect, unlock, clear TF, report, return
//! ```
//!
//! Everything the handlers write is in arena or runtime memory (never
//! watchable). The runtime (grace counters, per-thread slots, the previous
//! signal actions) lives in one leaked `mmap` so it survives watchers.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

use crate::emulate::{self, Cpu, MemFault, Memory, Stop};
use crate::table::{page_of, thread_key, PageEntry, Tier, PAGE};
use crate::{Hit, HitPath, Inner};
use faultline::interval::Grace;
use faultline::sys::mem::{mprotect, process_vm_read, Prot};
use faultline::sys::signal::{
    install_sigaction, Handler, SigAction, SigInfo, SignalContext, BUS_ADRERR, EFLAGS_TF,
    SEGV_ACCERR, SIGBUS, SIGSEGV, SIGTRAP, TRAP_TRACE,
};
use faultline::sys::thread::{at_fork_in_child, getpid};
use faultline::sys::{errno, rdtsc, set_errno};

const SLOTS: usize = 128;
/// Most instructions interpreted after a faulting store before returning
/// to native execution.
const RUN_BUDGET: u32 = 1 << 16;
/// Return to native execution after this many consecutive instructions
/// that touch no protected page (the loop has left the watched pages).
const RUN_IDLE: u32 = 64;

/// Per-thread state while a thread is inside a handler or single-stepping.
pub(crate) struct Slot {
    /// The thread's TCB pointer (`fs:0`), 0 when free.
    key: AtomicU64,
    tid: AtomicU32,
    /// Nesting depth of handlers on this thread.
    depth: AtomicU32,
    in_callback: AtomicU32,
    /// Pages opened for a single step (entry pointers), 0 = none.
    step: [AtomicUsize; 2],
    step_tf_was_set: AtomicU32,
    step_ip: AtomicU64,
    step_addr: AtomicU64,
    step_len: AtomicU64,
    step_before: [AtomicU64; 8],
}

/// Process-wide state of the handlers, in a leaked private mapping.
pub(crate) struct Runtime {
    pub grace: Grace,
    pub active: AtomicPtr<Inner>,
    slots: [Slot; SLOTS],
    prev: [AtomicPtr<SigAction>; 3],
    /// Our pid, for `process_vm_readv` (updated in a forked child).
    pid: AtomicI32,
    base: u64,
    len: u64,
}

static RUNTIME: OnceLock<&'static Runtime> = OnceLock::new();

/// The runtime, created and the handlers installed on first call.
pub(crate) fn runtime() -> Result<&'static Runtime, crate::WatchError> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let r = create_runtime()?;
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

fn create_runtime() -> Result<&'static Runtime, crate::WatchError> {
    // The decoder builds its tables on first use (allocating): never let
    // that happen inside a handler.
    emulate::prepare();
    let len = std::mem::size_of::<Runtime>().div_ceil(PAGE as usize) * PAGE as usize;
    let m = faultline::sys::mem::Mapping::anon(len).map_err(|e| crate::WatchError::Sys {
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
    at_fork_in_child(after_fork_in_child).map_err(|e| crate::WatchError::Sys {
        op: "pthread_atfork",
        addr: 0,
        source: e,
    })?;
    for (i, (sig, h)) in [
        (SIGBUS, on_fault as Handler),
        (SIGSEGV, on_fault),
        (SIGTRAP, on_trap),
    ]
    .into_iter()
    .enumerate()
    {
        let old = install_sigaction(sig, h, false).map_err(|e| crate::WatchError::Sys {
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
    fn enter(&self) -> Option<&Slot> {
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

    fn find_slot(&self) -> Option<&Slot> {
        let key = thread_key();
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SLOTS;
        (0..SLOTS)
            .map(|i| &self.slots[(start + i) % SLOTS])
            .find(|s| s.key.load(Acquire) == key)
    }

    /// The thread id of the slot's thread (looked up once per handler).
    fn tid(s: &Slot) -> i32 {
        let t = s.tid.load(Relaxed);
        if t != 0 {
            return t as i32;
        }
        let t = faultline::sys::thread::gettid();
        s.tid.store(t as u32, Relaxed);
        t
    }

    fn leave(&self, s: &Slot) {
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
fn chain(rt: &Runtime, which: usize, sc: &SignalContext) {
    let prev = rt.prev[which].load(SeqCst);
    // SAFETY: `prev` entries are null or set once from `Box::into_raw` and
    // never freed.
    sc.chain(unsafe { prev.as_ref() })
}

extern "C" fn on_fault(sig: i32, info: *mut SigInfo, ctx: *mut c_void) {
    let t0 = rdtsc();
    let saved = errno();
    // SAFETY: the arguments of this running SA_SIGINFO handler; `sc` and
    // its clones are dropped before it returns.
    let mut sc = unsafe { SignalContext::from_raw(sig, info, ctx) };
    let which = if sig == SIGBUS { 0 } else { 1 };
    let Some(rt) = RUNTIME.get() else {
        return;
    };
    let (code, addr) = (sc.code(), sc.fault_addr());
    let expected = if sig == SIGBUS {
        BUS_ADRERR
    } else {
        SEGV_ACCERR
    };
    let parity = rt.grace.enter();
    let mut handled = false;
    if code == expected {
        // A fault-generated signal (si_code checked): the error code is
        // the page fault's.
        let write = sc.error_code().write();
        let inner = rt.active.load(Acquire);
        if write && !inner.is_null() {
            // SAFETY: unpublished and freed only after a grace period, and
            // we are inside a read section.
            let inner = unsafe { &*inner };
            if let Some(e) = inner.pages.get(page_of(addr)) {
                let tier = e.tier();
                let ours = match tier {
                    // Disarmed while the fault was in flight: retry.
                    Tier::Off => true,
                    Tier::Mprotect => sig == SIGSEGV,
                    // SIGSEGV on a uffd page: another thread is storing to
                    // it behind a write fence (see `raw_store`).
                    Tier::Uffd => true,
                    Tier::Alias => sig == SIGBUS,
                };
                if ours {
                    handled = true;
                    if tier == Tier::Uffd && sig == SIGSEGV && !e.held_by_me() {
                        // Another thread has the page open behind its
                        // write fence: wait for it, then retry the write
                        // (it faults again, as SIGBUS, and is handled).
                        e.lock();
                        e.unlock();
                    } else if tier != Tier::Off {
                        // (A fenced page of our own interrupted frame, e.g.
                        // a write from the callback, is emulated here: its
                        // store goes through /proc/self/mem.)
                        handle_write(rt, inner, e, addr, &mut sc, t0);
                    }
                }
            }
        }
    }
    rt.grace.exit(parity);
    if !handled {
        chain(rt, which, &sc);
    }
    set_errno(saved);
}

fn abort_with(msg: &[u8]) -> ! {
    faultline::sys::write_stderr(b"faultline watch: ");
    faultline::sys::write_stderr(msg);
    faultline::sys::write_stderr(b"\n");
    std::process::abort();
}

fn handle_write(
    rt: &Runtime,
    inner: &Inner,
    e: &PageEntry,
    addr: u64,
    sc: &mut SignalContext,
    t0: u64,
) {
    let sh = inner.shared;
    sh.faults.fetch_add(1, Relaxed);
    if inner.trace {
        for t in &sh.trace {
            t.store(t0, Relaxed);
        }
    }
    let Some(slot) = rt.enter() else {
        abort_with(b"more than 128 threads in watch handlers at once");
    };
    let ip = sc.rip();
    let mut code = [0u8; 15];
    let n = read_code(ip, &mut code, true);
    let mut mem = WatchMem::new(inner, slot, sc.clone());
    // Code on the faulting instruction's page is known to be mapped; other
    // pages (branch targets of interpreted code) are read checked.
    let mut fetch = |at: u64, buf: &mut [u8; 15]| read_code(at, buf, page_of(at) == page_of(ip));
    let (budget, idle) = if inner.interpret {
        (RUN_BUDGET, RUN_IDLE)
    } else {
        (1, 1)
    };
    let outcome = emulate::run(&code[..n], &mut fetch, sc, &mut mem, budget, idle);
    mem.close_all();
    match outcome {
        (_, Stop::NotEmulated(_)) => {
            sh.single_stepped.fetch_add(1, Relaxed);
            begin_step(inner, slot, e, &code[..n], sc, addr);
        }
        (done, _) => {
            sh.emulated.fetch_add(1, Relaxed);
            sh.interpreted
                .fetch_add(u64::from(done.saturating_sub(1)), Relaxed);
        }
    }
    rt.leave(slot);
    let t1 = rdtsc();
    if inner.trace {
        sh.trace[3].store(t1, Relaxed);
    }
    sh.handler_cycles.fetch_add(t1.wrapping_sub(t0), Relaxed);
}

/// Copies up to 15 instruction bytes at `ip` into `out`; returns how many
/// were readable. The part on `ip`'s own page is copied directly when
/// `trusted` (the CPU was executing there, so it is mapped and readable:
/// x86 has no execute-only pages without protection keys); everything else
/// is read with [`checked_read`], so an unmapped page cannot fault here.
fn read_code(ip: u64, out: &mut [u8; 15], trusted: bool) -> usize {
    let first = ((page_of(ip) + PAGE - ip) as usize).min(15);
    if trusted {
        // SAFETY: see above.
        unsafe { std::ptr::copy_nonoverlapping(ip as *const u8, out.as_mut_ptr(), first) };
    } else if !checked_read(ip, &mut out[..first]) {
        return 0;
    }
    if first < 15 && checked_read(ip + first as u64, &mut out[first..]) {
        15
    } else {
        first
    }
}

/// Copies `data` to `dst` with one access of the native width when it is a
/// naturally aligned 1/2/4/8-byte store (so racing readers never see it
/// torn), bytewise otherwise.
///
/// # Safety
/// `dst..dst+data.len()` must be writable.
unsafe fn copy_native(dst: u64, data: &[u8]) {
    // SAFETY: the caller guarantees the destination; each arm writes
    // exactly `data.len()` bytes at an address aligned for its type.
    unsafe {
        match data.len() {
            1 => std::ptr::write_volatile(dst as *mut u8, data[0]),
            2 if dst.is_multiple_of(2) => {
                std::ptr::write_volatile(dst as *mut u16, u16::from_le_bytes([data[0], data[1]]))
            }
            4 if dst.is_multiple_of(4) => std::ptr::write_volatile(
                dst as *mut u32,
                u32::from_le_bytes(data.try_into().expect("4 bytes")),
            ),
            8 if dst.is_multiple_of(8) => std::ptr::write_volatile(
                dst as *mut u64,
                u64::from_le_bytes(data.try_into().expect("8 bytes")),
            ),
            _ => std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()),
        }
    }
}

/// Reads `out.len()` bytes at `src`, with one native-width access for an
/// aligned 1/2/4/8-byte read when `whole` (the chunk is the whole access).
///
/// # Safety
/// `src..src+out.len()` must be readable.
unsafe fn load_native(src: u64, out: &mut [u8], whole: bool) {
    // SAFETY: as in `copy_native`, reading.
    unsafe {
        match out.len() {
            2 if whole && src.is_multiple_of(2) => {
                out.copy_from_slice(&std::ptr::read_volatile(src as *const u16).to_le_bytes())
            }
            4 if whole && src.is_multiple_of(4) => {
                out.copy_from_slice(&std::ptr::read_volatile(src as *const u32).to_le_bytes())
            }
            8 if whole && src.is_multiple_of(8) => {
                out.copy_from_slice(&std::ptr::read_volatile(src as *const u64).to_le_bytes())
            }
            _ => std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), out.len()),
        }
    }
}

/// Reads our own memory without risking a fault: `process_vm_readv` fails
/// with EFAULT where a load would raise a signal.
fn checked_read(src: u64, out: &mut [u8]) -> bool {
    let pid = RUNTIME.get().map_or(0, |r| r.pid.load(Relaxed));
    process_vm_read(pid, src, out) == Ok(out.len())
}

/// The interrupted thread's saved registers are the emulator's CPU.
impl Cpu for SignalContext {
    fn gpr(&self, r: emulate::Gpr) -> u64 {
        SignalContext::gpr(self, r)
    }
    fn set_gpr(&mut self, r: emulate::Gpr, v: u64) {
        SignalContext::set_gpr(self, r, v)
    }
    fn rip(&self) -> u64 {
        SignalContext::rip(self)
    }
    fn set_rip(&mut self, v: u64) {
        SignalContext::set_rip(self, v)
    }
    fn rflags(&self) -> u64 {
        SignalContext::rflags(self)
    }
    fn set_rflags(&mut self, v: u64) {
        SignalContext::set_rflags(self, v)
    }
    fn vec(&self, n: usize, out: &mut [u8]) -> bool {
        SignalContext::vec(self, n, out)
    }
    fn fs_base(&self) -> Option<u64> {
        // The handler runs on the interrupted thread: same FS base.
        Some(thread_key())
    }
}

/// Where emulated accesses go: the alias, a briefly opened page, the
/// kernel's forced write, or (unwatched pages) straight to memory.
struct WatchMem<'a> {
    inner: &'a Inner,
    slot: &'a Slot,
    /// The interrupted context, for the IP of each reported store.
    ctx: SignalContext,
    /// Unprotected pages read successfully during this handler.
    validated: [u64; 4],
    nvalid: usize,
    /// uffd pages opened for stores (entry addresses), closed on return.
    open: [usize; 4],
    nopen: usize,
    /// Contiguous stores to an open page not yet written (`flush`).
    pend: [u8; 64],
    pend_addr: u64,
    pend_len: usize,
}

/// Watched runs of one store, with their bytes before it.
struct Runs {
    items: [(u64, u64, [u8; 32]); 4],
    n: usize,
}

impl<'a> WatchMem<'a> {
    fn new(inner: &'a Inner, slot: &'a Slot, ctx: SignalContext) -> Self {
        WatchMem {
            inner,
            slot,
            ctx,
            validated: [0; 4],
            nvalid: 0,
            open: [0; 4],
            nopen: 0,
            pend: [0; 64],
            pend_addr: 0,
            pend_len: 0,
        }
    }
}

impl WatchMem<'_> {
    /// The watched runs of `[a, a+n)` (within one page), or None if there
    /// are more than fit (the caller then stores byte by byte).
    fn collect_runs(&self, e: Option<&PageEntry>, a: u64, n: usize) -> Option<Runs> {
        let mut runs = Runs {
            items: [(0, 0, [0; 32]); 4],
            n: 0,
        };
        let Some(e) = e else { return Some(runs) };
        if !self.inner.classify {
            return Some(runs);
        }
        let set = e.ranges.load(Acquire);
        if set.is_null() {
            return Some(runs);
        }
        // SAFETY: range sets are freed only after a grace period; every
        // caller holds a read section.
        let set = unsafe { &*set };
        for (s, t) in set.intersect(a, a + n as u64) {
            if runs.n == runs.items.len() {
                return None;
            }
            let k = ((t - s) as usize).min(32);
            let r = &mut runs.items[runs.n];
            // SAFETY: watched bytes stay readable on every tier.
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, r.2.as_mut_ptr(), k) };
            r.0 = s;
            r.1 = t;
            runs.n += 1;
        }
        Some(runs)
    }

    /// Stores `data` at `addr` (within one page) through the page's tier.
    /// For the Uffd and Mprotect tiers the caller holds the page lock.
    fn raw_store(&self, e: Option<&PageEntry>, addr: u64, data: &[u8]) -> Result<(), MemFault> {
        let tier = e.map_or(Tier::Off, |e| e.tier());
        match (tier, e) {
            (Tier::Alias, Some(e)) => {
                let dst = addr.wrapping_add(e.alias_delta.load(Relaxed));
                // SAFETY: the alias maps the same memfd pages writable.
                unsafe { copy_native(dst, data) };
                Ok(())
            }
            (Tier::Uffd, Some(_)) => {
                // The caller opened the page (`open_page`): the kernel's
                // forced write now goes through.
                faultline::sys::mem::pwrite_all(self.inner.mem_raw(), data, addr)
                    .map_err(|_| MemFault)
            }
            (Tier::Mprotect, Some(_)) => {
                faultline::sys::mem::pwrite_all(self.inner.mem_raw(), data, addr)
                    .map_err(|_| MemFault)
            }
            _ => {
                // Not a protected page: leave the store to native execution
                // (it may be unmapped, read-only or the application's own
                // guard page; faulting on it here would be in our frame).
                Err(MemFault)
            }
        }
    }

    fn needs_lock(e: Option<&PageEntry>) -> Option<&PageEntry> {
        e.filter(|e| e.tier() == Tier::Mprotect)
    }

    /// Opens a uffd-armed page for stores until [`WatchMem::close_all`]:
    /// private anonymous memory has no second mapping and the kernel's
    /// forced write refuses uffd-write-protected pages, so the page is
    /// fenced read-only with `mprotect` (other threads' writes now fault and
    /// wait for the page lock), its uffd protection lifted, and stores go
    /// through `/proc/self/mem`. The page is never writable for another
    /// thread. The fence splits the VMA only until `close_all` restores
    /// the protection (then it merges back).
    fn open_page(&mut self, e: &'static PageEntry) -> Result<(), MemFault> {
        let p = e as *const PageEntry as usize;
        if self.open[..self.nopen].contains(&p) || e.held_by_me() {
            // Ours, or opened by the handler frame this one interrupted.
            return Ok(());
        }
        if self.nopen == self.open.len() {
            self.close_all();
        }
        // Never block on a page lock while holding another: if it is taken,
        // close (and unlock) our open pages first. Two threads running
        // loops over the same pages in opposite orders cannot deadlock.
        if !e.try_lock() {
            self.close_all();
            e.lock();
        }
        let prot = e.prot();
        if mprotect(e.page, PAGE as usize, prot.without(Prot::WRITE)).is_err() {
            e.unlock();
            return Err(MemFault);
        }
        if self
            .inner
            .uffd
            .writeprotect(e.page, PAGE, false, true)
            .is_err()
        {
            let _ = mprotect(e.page, PAGE as usize, prot);
            e.unlock();
            return Err(MemFault);
        }
        self.open[self.nopen] = p;
        self.nopen += 1;
        Ok(())
    }

    /// Re-protects and un-fences every page this handler opened.
    /// Performs the coalesced stores (see `write`).
    fn flush(&mut self) -> Result<(), MemFault> {
        if self.pend_len == 0 {
            return Ok(());
        }
        let r = faultline::sys::mem::pwrite_all(
            self.inner.mem_raw(),
            &self.pend[..self.pend_len],
            self.pend_addr,
        );
        self.pend_len = 0;
        r.map_err(|_| MemFault)
    }

    fn close_all(&mut self) {
        if self.flush().is_err() {
            abort_with(b"a store to a watched page failed after it was emulated");
        }
        for &p in &self.open[..self.nopen] {
            // SAFETY: entries are arena objects alive while the watcher is.
            let e: &PageEntry = unsafe { &*(p as *const PageEntry) };
            if self
                .inner
                .uffd
                .writeprotect(e.page, PAGE, true, false)
                .is_err()
            {
                abort_with(b"cannot re-protect a watched page");
            }
            if mprotect(e.page, PAGE as usize, e.prot()).is_err() {
                abort_with(b"cannot lift the write fence of a watched page");
            }
            e.unlock();
        }
        self.nopen = 0;
    }

    /// Reports the runs of a store of `data` at `write.0`.
    fn report_runs(
        &mut self,
        e: Option<&PageEntry>,
        runs: &Runs,
        write: (u64, usize),
        data: &[u8],
    ) {
        let Some(e) = e else { return };
        if runs.n == 0 && self.inner.classify && e.tier() != Tier::Off {
            // A store to a protected page that touched no watched byte: a
            // false positive (counted per store, so stores performed by
            // continued interpretation count as the faults they replace).
            self.inner.shared.false_positives.fetch_add(1, Relaxed);
            e.false_positives.fetch_add(1, Relaxed);
        }
        for r in &runs.items[..runs.n] {
            self.report(e, r.0, r.1, write, &r.2, data);
        }
    }

    fn report(
        &mut self,
        e: &PageEntry,
        start: u64,
        end: u64,
        write: (u64, usize),
        before: &[u8; 32],
        data: &[u8],
    ) {
        // `after` is what this store wrote (memory may already hold another
        // thread's later write).
        let mut after = [0u8; 32];
        let n = ((end - start) as usize).min(32);
        let k = (start - write.0) as usize;
        after[..n].copy_from_slice(&data[k..k + n]);
        let hit = Hit {
            addr: start,
            len: (end - start) as usize,
            write_addr: write.0,
            write_len: write.1,
            before: *before,
            after,
            tid: Runtime::tid(self.slot),
            // The instruction being performed (continued interpretation
            // moves RIP past the faulting one).
            ip: self.ctx.rip(),
            path: HitPath::Emulated,
        };
        // A callback sees memory as the program would: pending stores
        // first.
        if self.inner.callback.is_some() && self.flush().is_err() {
            abort_with(b"a store to a watched page failed after it was emulated");
        }
        deliver(self.inner, self.slot, Some(e), &hit);
    }

    fn load(&self, addr: u64, size: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: readable (see `read`).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), size.min(8)) };
        u64::from_le_bytes(b)
    }
}

/// Counts a hit and calls the callback, or, when the write came from the
/// callback itself (a nested handler), counts it as suppressed.
fn deliver(inner: &Inner, slot: &Slot, e: Option<&PageEntry>, hit: &Hit) {
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

impl Memory for WatchMem<'_> {
    fn hot(&self, addr: u64) -> bool {
        self.inner
            .pages
            .get(page_of(addr))
            .is_some_and(|e| e.tier() != Tier::Off)
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        if self.pend_len > 0
            && addr < self.pend_addr + self.pend_len as u64
            && self.pend_addr < addr + buf.len() as u64
        {
            self.flush()?;
        }
        let mut off = 0usize;
        while off < buf.len() {
            let a = addr + off as u64;
            let n = ((page_of(a) + PAGE - a) as usize).min(buf.len() - off);
            let page = page_of(a);
            if self.hot(a) || self.validated[..self.nvalid].contains(&page) {
                // Protected pages stay readable on every tier; validated
                // pages were read safely earlier in this handler.
                let one = n == buf.len();
                // SAFETY: readable (see above).
                unsafe { load_native(a, &mut buf[off..off + n], one) };
            } else {
                // Any other page may be unmapped, PROT_NONE or a page of
                // another userfaultfd: read it with a call that fails
                // instead of faulting in this frame.
                if !checked_read(a, &mut buf[off..off + n]) {
                    return Err(MemFault);
                }
                let i = self.nvalid % self.validated.len();
                self.validated[i] = page;
                self.nvalid = (self.nvalid + 1).min(self.validated.len());
            }
            off += n;
        }
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault> {
        let mut off = 0usize;
        while off < data.len() {
            let a = addr + off as u64;
            let n = ((page_of(a) + PAGE - a) as usize).min(data.len() - off);
            let chunk = &data[off..off + n];
            let e = self.inner.pages.get(page_of(a));
            if self.pend_len > 0
                && a < self.pend_addr + self.pend_len as u64
                && self.pend_addr < a + n as u64
            {
                // Rewriting pending bytes: their `before` must be current.
                self.flush()?;
            }
            let Some(runs) = self.collect_runs(e, a, n) else {
                // More watched runs than fit: store byte by byte so every
                // run is reported.
                for i in 0..n {
                    self.write(a + i as u64, &chunk[i..i + 1])?;
                }
                off += n;
                continue;
            };
            if self.inner.trace {
                self.inner.shared.trace[1].store(rdtsc(), Relaxed);
            }
            if let Some(u) = e.filter(|e| e.tier() == Tier::Uffd) {
                self.open_page(u)?;
                // Coalesce contiguous stores into one forced write (a byte
                // loop: one pwrite per 64 bytes instead of per byte). The
                // page is fenced and locked, so nobody else writes it.
                if self.pend_len > 0
                    && (self.pend_addr + self.pend_len as u64 != a
                        || self.pend_len + n > self.pend.len())
                {
                    self.flush()?;
                }
                if n <= self.pend.len() {
                    if self.pend_len == 0 {
                        self.pend_addr = a;
                    }
                    self.pend[self.pend_len..self.pend_len + n].copy_from_slice(chunk);
                    self.pend_len += n;
                    if self.inner.trace {
                        self.inner.shared.trace[2].store(rdtsc(), Relaxed);
                    }
                    self.report_runs(e, &runs, (a, n), chunk);
                    off += n;
                    continue;
                }
            }
            let lock = Self::needs_lock(e);
            if let Some(l) = lock {
                l.lock();
            }
            let r = self.raw_store(e, a, chunk);
            if let Some(l) = lock {
                l.unlock();
            }
            r?;
            if self.inner.trace {
                self.inner.shared.trace[2].store(rdtsc(), Relaxed);
            }
            self.report_runs(e, &runs, (a, n), chunk);
            off += n;
        }
        Ok(())
    }

    fn cas(&mut self, addr: u64, size: usize, expected: u64, new: u64) -> Result<u64, MemFault> {
        if size == 0 || size > 8 || page_of(addr) != page_of(addr + size as u64 - 1) {
            // A split-lock atomic: not emulated.
            return Err(MemFault);
        }
        self.flush()?;
        let e = self.inner.pages.get(page_of(addr));
        let runs = self.collect_runs(e, addr, size).ok_or(MemFault)?;
        let tier = e.map_or(Tier::Off, |e| e.tier());
        if tier == Tier::Off {
            // Not protected: native execution does it.
            return Err(MemFault);
        }
        let found = if tier == Tier::Alias {
            let dst = addr.wrapping_add(e.map_or(0, |e| e.alias_delta.load(Relaxed)));
            // SAFETY: a page-contained atomic on the writable alias.
            unsafe { atomic_cas(dst, size, expected, new) }
        } else {
            // All writers to this page go through a handler holding the
            // page lock, so load-compare-store under it is atomic.
            let l = e.expect("tier implies entry");
            let uffd = tier == Tier::Uffd;
            if uffd {
                // Held until the handler returns.
                self.open_page(l)?;
            } else {
                l.lock();
            }
            let cur = self.load(addr, size);
            let r = if cur == expected {
                self.raw_store(e, addr, &new.to_le_bytes()[..size])
                    .map(|_| cur)
            } else {
                Ok(cur)
            };
            if !uffd {
                l.unlock();
            }
            r?
        };
        if found == expected {
            let mut runs = runs;
            // `before` was read outside the atomic: use the value replaced.
            let old = expected.to_le_bytes();
            for r in &mut runs.items[..runs.n] {
                let k = (r.0 - addr) as usize;
                let m = (r.1 - r.0) as usize;
                r.2[..m].copy_from_slice(&old[k..k + m]);
            }
            self.report_runs(e, &runs, (addr, size), &new.to_le_bytes()[..size]);
        }
        Ok(found)
    }
}

/// # Safety
/// `addr` must be valid for an atomic access of `size` bytes.
unsafe fn atomic_cas(addr: u64, size: usize, expected: u64, new: u64) -> u64 {
    use std::sync::atomic::{AtomicU16, AtomicU8};
    // SAFETY: the caller guarantees validity; x86 tolerates misaligned
    // locked accesses (they are slow, not wrong), so the casts are sound on
    // this architecture for accesses that do not cross a page.
    unsafe {
        let r = match size {
            1 => (*(addr as *const AtomicU8))
                .compare_exchange(expected as u8, new as u8, SeqCst, SeqCst)
                .map(u64::from)
                .map_err(u64::from),
            2 => (*(addr as *const AtomicU16))
                .compare_exchange(expected as u16, new as u16, SeqCst, SeqCst)
                .map(u64::from)
                .map_err(u64::from),
            4 => (*(addr as *const AtomicU32))
                .compare_exchange(expected as u32, new as u32, SeqCst, SeqCst)
                .map(u64::from)
                .map_err(u64::from),
            _ => (*(addr as *const AtomicU64)).compare_exchange(expected, new, SeqCst, SeqCst),
        };
        match r {
            Ok(v) | Err(v) => v,
        }
    }
}

/// Opens the page for one single-stepped instruction.
fn begin_step(
    inner: &Inner,
    slot: &Slot,
    e: &PageEntry,
    code: &[u8],
    cpu: &mut SignalContext,
    fault_addr: u64,
) {
    let idx = if slot.step[0].load(Relaxed) == 0 {
        0
    } else if slot.step[1].load(Relaxed) == 0 {
        1
    } else {
        abort_with(b"a single-stepped instruction faulted on a third watched page");
    };
    if idx == 0 {
        let (a, l) = emulate::write_target(code, &*cpu).unwrap_or((fault_addr, 1));
        let l = l.min(64);
        slot.step_addr.store(a, Relaxed);
        slot.step_len.store(l as u64, Relaxed);
        let mut before = [0u8; 64];
        let _ = WatchMem::new(inner, slot, cpu.clone()).read(a, &mut before[..l]);
        for (i, w) in slot.step_before.iter().enumerate() {
            let word: [u8; 8] = before[8 * i..8 * i + 8].try_into().expect("8 bytes");
            w.store(u64::from_le_bytes(word), Relaxed);
        }
        slot.step_ip.store(cpu.rip(), Relaxed);
    }
    e.lock();
    let r = inner.protect(e, e.tier(), false).is_ok();
    if !r {
        abort_with(b"cannot un-protect a watched page for a single step");
    }
    slot.step[idx].store(e as *const PageEntry as usize, Relaxed);
    // The kernel restores RFLAGS (TF included) on sigreturn, so the
    // instruction runs once and traps.
    let fl = cpu.rflags();
    if idx == 0 {
        let was = fl & EFLAGS_TF != 0;
        slot.step_tf_was_set.store(was as u32, Relaxed);
    }
    cpu.set_rflags(fl | EFLAGS_TF);
}

extern "C" fn on_trap(sig: i32, info: *mut SigInfo, ctx: *mut c_void) {
    let saved = errno();
    // SAFETY: the arguments of this running SA_SIGINFO handler; `sc` is
    // dropped before it returns.
    let mut sc = unsafe { SignalContext::from_raw(sig, info, ctx) };
    let Some(rt) = RUNTIME.get() else {
        return;
    };
    let code = sc.code();
    let parity = rt.grace.enter();
    let inner = rt.active.load(Acquire);
    let mut handled = false;
    if code == TRAP_TRACE {
        if let Some(slot) = rt.find_slot() {
            if slot.step[0].load(Relaxed) != 0 {
                handled = true;
                // SAFETY: the watcher cannot be freed while a page lock is
                // held (drop disarms every page under its lock first).
                finish_step(rt, unsafe { &*inner }, slot, &mut sc);
            }
        }
    } else if let Some(tag) = sc.perf().map(|t| t.data) {
        if !inner.is_null() {
            // SAFETY: inside a read section; see `on_fault`.
            let inner = unsafe { &*inner };
            if let Some(h) = inner.shared.hw.get(tag as usize) {
                if h.active.load(Acquire) {
                    handled = true;
                    hw_hit(rt, inner, h, &sc);
                }
            }
        }
    }
    rt.grace.exit(parity);
    if !handled {
        chain(rt, 2, &sc);
    }
    set_errno(saved);
}

fn finish_step(rt: &Runtime, inner: &Inner, slot: &Slot, sc: &mut SignalContext) {
    slot.depth.fetch_add(1, SeqCst);
    let mut first: Option<&PageEntry> = None;
    for s in &slot.step {
        let p = s.swap(0, Relaxed);
        if p == 0 {
            continue;
        }
        // SAFETY: entries are arena objects alive while the watcher is.
        let e: &PageEntry = unsafe { &*(p as *const PageEntry) };
        let _ = inner.protect(e, e.tier(), true);
        e.unlock();
        first.get_or_insert(e);
    }
    if slot.step_tf_was_set.load(Relaxed) == 0 {
        let fl = sc.rflags();
        sc.set_rflags(fl & !EFLAGS_TF);
    }
    // Report the watched bytes of the written range.
    let a = slot.step_addr.load(Relaxed);
    let l = slot.step_len.load(Relaxed) as usize;
    let mut before = [0u8; 64];
    for i in 0..8 {
        before[8 * i..8 * i + 8].copy_from_slice(&slot.step_before[i].load(Relaxed).to_le_bytes());
    }
    let mut touched = false;
    if inner.classify {
        let mut p = page_of(a);
        while p < a + l as u64 {
            if let Some(e) = inner.pages.get(p) {
                let set = e.ranges.load(Acquire);
                if !set.is_null() {
                    // SAFETY: inside the trap handler's read section.
                    let set = unsafe { &*set };
                    for (s, t) in set.intersect(a.max(p), (a + l as u64).min(p + PAGE)) {
                        touched = true;
                        let mut b = [0u8; 32];
                        let k = (s - a) as usize;
                        let m = ((t - s) as usize).min(32);
                        b[..m].copy_from_slice(&before[k..k + m]);
                        let mut after = [0u8; 32];
                        // SAFETY: readable watched bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(s as *const u8, after.as_mut_ptr(), m)
                        };
                        let hit = Hit {
                            addr: s,
                            len: (t - s) as usize,
                            write_addr: a,
                            write_len: l,
                            before: b,
                            after,
                            tid: Runtime::tid(slot),
                            ip: slot.step_ip.load(Relaxed),
                            path: HitPath::SingleStep,
                        };
                        deliver(inner, slot, Some(e), &hit);
                    }
                }
            }
            p += PAGE;
        }
    }
    if inner.classify && !touched {
        if let Some(e) = first {
            inner.shared.false_positives.fetch_add(1, Relaxed);
            e.false_positives.fetch_add(1, Relaxed);
        }
    }
    rt.leave(slot);
}

fn hw_hit(rt: &Runtime, inner: &Inner, h: &crate::HwWatch, sc: &SignalContext) {
    inner.shared.hw_hits.fetch_add(1, Relaxed);
    let Some(slot) = rt.enter() else {
        abort_with(b"more than 128 threads in watch handlers at once");
    };
    let addr = h.addr.load(Relaxed);
    let len = h.len.load(Relaxed) as usize;
    // SAFETY: the watched bytes are mapped (the CPU just wrote them).
    let now = unsafe { crate::read_small(addr, len) };
    let old = h.shadow.swap(now, Relaxed);
    let mut before = [0u8; 32];
    let mut after = [0u8; 32];
    before[..8].copy_from_slice(&old.to_le_bytes());
    after[..8].copy_from_slice(&now.to_le_bytes());
    let hit = Hit {
        addr,
        len,
        write_addr: addr,
        write_len: len,
        before,
        after,
        tid: Runtime::tid(slot),
        ip: sc.rip(),
        path: HitPath::Hardware,
    };
    deliver(inner, slot, None, &hit);
    rt.leave(slot);
}
