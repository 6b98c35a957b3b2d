//! Single-stepping, for instructions the emulator refuses, and the SIGTRAP
//! handler:
//!
//! 1. [`begin_step`] (from the fault handler) records what the instruction
//!    is about to write and its bytes, takes the page lock, lifts the
//!    page's protection and sets the trap flag;
//! 2. the instruction runs once natively and the CPU raises SIGTRAP
//!    (`TRAP_TRACE`);
//! 3. [`finish_step`] re-protects and unlocks the page(s), restores the trap
//!    flag and reports the watched bytes the instruction wrote.
//!
//! The same handler takes the debug-register hits (`TRAP_PERF`,
//! [`hw_hit`]): the write has already happened; the report compares the
//! watched bytes with their shadow copy.

use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

use faultline_sys::signal::{SigInfo, SignalContext, EFLAGS_TF, TRAP_TRACE};
use faultline_sys::{errno, set_errno};

use super::mem::WatchMem;
use super::runtime::{abort_with, chain, deliver, Runtime, Slot, RUNTIME};
use crate::emulate::{self, Memory};
use crate::hit::{Hit, HitPath};
use crate::state::{read_small, HwWatch, Inner};
use crate::table::{page_of, PageEntry, PAGE};

/// Opens the page for one single-stepped instruction.
pub(super) fn begin_step(
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

pub(super) extern "C" fn on_trap(sig: i32, info: *mut SigInfo, ctx: *mut c_void) {
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

fn hw_hit(rt: &Runtime, inner: &Inner, h: &HwWatch, sc: &SignalContext) {
    inner.shared.hw_hits.fetch_add(1, Relaxed);
    let Some(slot) = rt.enter() else {
        abort_with(b"more than 128 threads in watch handlers at once");
    };
    let addr = h.addr.load(Relaxed);
    let len = h.len.load(Relaxed) as usize;
    // SAFETY: the watched bytes are mapped (the CPU just wrote them).
    let now = unsafe { read_small(addr, len) };
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
