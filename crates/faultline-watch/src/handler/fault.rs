//! Fault entry: the SIGBUS (uffd write-protect) and SIGSEGV (mprotect)
//! handler.
//!
//! 1. Enter a grace read section; the fault must be a write to a page of
//!    the page table, on the tier that raises this signal; anything else
//!    goes to the previous action.
//! 2. Fetch the instruction bytes at `RIP` (the faulting page is known to
//!    be readable; anything else is read with `process_vm_readv`).
//! 3. Emulate the store through [`WatchMem`] and keep
//!    interpreting while the code keeps touching protected pages
//!    ([`emulate::run`]); the interrupted registers are the emulator's
//!    [`Cpu`].
//! 4. An instruction the emulator refuses is single-stepped instead
//!    ([`begin_step`]).

use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

use faultline_sys::signal::{SigInfo, SignalContext, BUS_ADRERR, SEGV_ACCERR, SIGBUS, SIGSEGV};
use faultline_sys::{errno, rdtsc, set_errno};

use super::mem::{checked_read, WatchMem};
use super::runtime::{abort_with, chain, Runtime, RUNTIME};
use super::step::begin_step;
use crate::emulate::{self, Cpu, Stop};
use crate::state::Inner;
use crate::table::{page_of, thread_key, PageEntry, Tier, PAGE};

/// Most instructions interpreted after a faulting store before returning
/// to native execution.
const RUN_BUDGET: u32 = 1 << 16;
/// Return to native execution after this many consecutive instructions
/// that touch no protected page (the loop has left the watched pages).
const RUN_IDLE: u32 = 64;

pub(super) extern "C" fn on_fault(sig: i32, info: *mut SigInfo, ctx: *mut c_void) {
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
