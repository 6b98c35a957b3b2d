//! Signals: installing `SA_SIGINFO` handlers, passing a signal on to the
//! action installed before ours, alternate signal stacks, signal masks, and
//! [`SignalContext`], the one reader and writer of what the kernel hands a
//! handler.
//!
//! # How a handler sees the interrupted thread
//!
//! 1. [`install_sigaction`] installs an `extern "C"` function of type
//!    [`Handler`]; the kernel calls it with the signal number, a
//!    `siginfo_t` (why: `si_code`, `si_addr`, perf data) and a
//!    `ucontext_t` (the interrupted registers, saved on the signal stack).
//! 2. The handler's first line wraps the three arguments in a
//!    [`SignalContext`] with the one `unsafe` call,
//!    [`SignalContext::from_raw`]. From there on every access is a safe,
//!    typed method: signal number, `si_code`, fault address, the page-fault
//!    error code, general registers by their x86 encoding number, `RIP`,
//!    `RFLAGS`, the saved XMM/YMM registers, the perf fields of a
//!    breakpoint `SIGTRAP`.
//! 3. Registers written through the context are what the thread resumes
//!    with: the kernel restores the whole `ucontext_t` on `sigreturn`.
//! 4. A signal that is not the handler's business goes to the previous
//!    action with [`SignalContext::chain`] (its handler, or the default
//!    action).
//!
//! The saved registers, as the kernel lays them out on x86_64:
//!
//! ```text
//!  ucontext_t
//!  +-- uc_mcontext.gregs[23]   R8..R15 RDI RSI RBP RBX RDX RAX RCX RSP RIP
//!  |                           EFL CSGSFS ERR TRAPNO OLDMASK CR2
//!  +-- uc_mcontext.fpregs --> fxsave area (512 bytes)
//!                               160 + 16n: XMMn (n < 16)
//!                               464: sw_reserved.magic1 = FP_XSTATE_MAGIC1
//!                                    when an xsave header follows
//!                             xsave header at 512: xstate_bv (bit 2 = AVX)
//!                             576 + 16n: upper half of YMMn
//! ```
//!
//! Everything here is async-signal-safe: no allocation, no locks.

use std::ffi::c_void;
use std::io;
use std::time::Duration;

/// `SIGBUS`.
pub const SIGBUS: i32 = libc::SIGBUS;
/// `SIGSEGV`.
pub const SIGSEGV: i32 = libc::SIGSEGV;
/// `SIGTRAP`.
pub const SIGTRAP: i32 = libc::SIGTRAP;
/// `SIGINT` (Ctrl-C).
pub const SIGINT: i32 = libc::SIGINT;
/// `SIGTERM`.
pub const SIGTERM: i32 = libc::SIGTERM;
/// `SIGHUP`.
pub const SIGHUP: i32 = libc::SIGHUP;
/// `SIGUSR1`.
pub const SIGUSR1: i32 = libc::SIGUSR1;
/// `SIGUSR2`.
pub const SIGUSR2: i32 = libc::SIGUSR2;

/// `si_code` of a `SIGBUS` for an address with no backing (and of a
/// userfaultfd fault in `UFFD_FEATURE_SIGBUS` mode).
pub const BUS_ADRERR: i32 = libc::BUS_ADRERR;
/// `si_code` of a `SIGSEGV` for a mapped address the access is not
/// allowed to (a protection fault).
pub const SEGV_ACCERR: i32 = 2;
/// `si_code` of the `SIGTRAP` that follows an instruction run with the trap
/// flag set.
pub const TRAP_TRACE: i32 = 2;
/// `si_code` of a `SIGTRAP` raised by a perf event with `sigtrap = 1`.
pub const TRAP_PERF: i32 = 6;

/// The trap flag, bit 8 of `RFLAGS`: single-steps one instruction.
pub const EFLAGS_TF: u64 = 1 << 8;

/// The kernel's `siginfo_t`, as an `SA_SIGINFO` handler receives it. Only
/// [`SignalContext`] looks inside.
pub type SigInfo = libc::siginfo_t;

/// The signature of an `SA_SIGINFO` handler: signal number, `siginfo_t`,
/// `ucontext_t` (as `void *`).
pub type Handler = extern "C" fn(i32, *mut SigInfo, *mut c_void);

/// A saved `sigaction`, for chaining and restoring.
pub type SigAction = libc::sigaction;

/// The x86 page-fault error code the kernel saved for a fault-generated
/// signal (`uc_mcontext.gregs[REG_ERR]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageFaultCode(u64);

impl PageFaultCode {
    /// Bit 0: the page was present (a protection fault, e.g. a
    /// write-protected page), not missing.
    pub const fn present(self) -> bool {
        self.0 & 1 != 0
    }
    /// Bit 1: the access was a write.
    pub const fn write(self) -> bool {
        self.0 & 2 != 0
    }
    /// Bit 2: the access came from user mode.
    pub const fn user(self) -> bool {
        self.0 & 4 != 0
    }
    /// The raw error code.
    pub const fn bits(self) -> u64 {
        self.0
    }
}

/// `gregs` indices of the general registers in x86 encoding order: RAX,
/// RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8..R15.
#[cfg(target_arch = "x86_64")]
const GPR_INDEX: [usize; 16] = [
    libc::REG_RAX as usize,
    libc::REG_RCX as usize,
    libc::REG_RDX as usize,
    libc::REG_RBX as usize,
    libc::REG_RSP as usize,
    libc::REG_RBP as usize,
    libc::REG_RSI as usize,
    libc::REG_RDI as usize,
    libc::REG_R8 as usize,
    libc::REG_R9 as usize,
    libc::REG_R10 as usize,
    libc::REG_R11 as usize,
    libc::REG_R12 as usize,
    libc::REG_R13 as usize,
    libc::REG_R14 as usize,
    libc::REG_R15 as usize,
];

/// `sw_reserved.magic1` of an fxsave area followed by an xsave header.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;

// x86_64 (and every 64-bit Linux) siginfo layout, from
// include/uapi/asm-generic/siginfo.h: si_signo 0, si_errno 4, si_code 8,
// then the union (8-aligned) at 16: _sigfault._addr at 16, and
// _sigfault._perf { unsigned long _data; u32 _type; u32 _flags } at 24.
#[cfg(target_pointer_width = "64")]
const SI_PERF_DATA_OFFSET: usize = 24;
#[cfg(target_pointer_width = "64")]
const SI_PERF_TYPE_OFFSET: usize = 32;
#[cfg(target_pointer_width = "64")]
const SI_PERF_FLAGS_OFFSET: usize = 36;

/// What the kernel passed a running `SA_SIGINFO` handler: the signal, its
/// `siginfo_t` and the interrupted thread's saved registers.
///
/// Modelled on Wasmtime's `get_trap_registers`: this type is the only
/// code that reads or writes `siginfo_t` and `ucontext_t`. It is a handle
/// over the kernel's buffers, like a pair of raw pointers: a clone refers
/// to the same saved state, and a register written through either is what
/// the thread resumes with. It is neither `Send` nor `Sync`, and lives
/// only as long as the handler invocation that created it.
#[derive(Clone, Debug)]
pub struct SignalContext {
    sig: i32,
    info: *mut libc::siginfo_t,
    uc: *mut libc::ucontext_t,
}

impl SignalContext {
    /// Wraps a handler's arguments.
    ///
    /// # Safety
    /// `sig`, `info` and `ctx` must be the arguments of a running
    /// `SA_SIGINFO` handler (or point to a valid `siginfo_t` and
    /// `ucontext_t` in the same way), and the returned value (and its
    /// clones) must not be used after that handler returns. While it is
    /// used, nothing else may hold a Rust reference into the two buffers.
    pub unsafe fn from_raw(sig: i32, info: *mut SigInfo, ctx: *mut c_void) -> SignalContext {
        SignalContext {
            sig,
            info,
            uc: ctx.cast(),
        }
    }

    /// The signal number.
    pub fn signal(&self) -> i32 {
        self.sig
    }

    /// `si_code`: why the signal was sent (e.g. [`BUS_ADRERR`],
    /// [`SEGV_ACCERR`], [`TRAP_TRACE`], [`TRAP_PERF`]).
    pub fn code(&self) -> i32 {
        // SAFETY: `info` is the handler's valid siginfo (`from_raw`).
        unsafe { (*self.info).si_code }
    }

    /// `si_addr`: the faulting address of a `SIGSEGV`/`SIGBUS` (for a perf
    /// breakpoint `SIGTRAP`, the breakpoint's `bp_addr`).
    pub fn fault_addr(&self) -> u64 {
        // SAFETY: as in `code`; `si_addr` is read at its fixed offset.
        unsafe { (*self.info).si_addr() as u64 }
    }

    /// The x86 page-fault error code. Meaningful only for a
    /// fault-generated `SIGSEGV`/`SIGBUS` (check [`SignalContext::signal`]
    /// and [`SignalContext::code`] first): for other signals the saved
    /// value is stale.
    #[cfg(target_arch = "x86_64")]
    pub fn error_code(&self) -> PageFaultCode {
        PageFaultCode(self.greg(libc::REG_ERR as usize))
    }

    /// General register `n` in x86 encoding order (0 = RAX, 1 = RCX, 2 =
    /// RDX, 3 = RBX, 4 = RSP, 5 = RBP, 6 = RSI, 7 = RDI, 8..15 = R8..R15);
    /// only the low four bits of `n` are used.
    #[cfg(target_arch = "x86_64")]
    pub fn gpr(&self, n: usize) -> u64 {
        self.greg(GPR_INDEX[n & 15])
    }

    /// Sets general register `n` (as [`SignalContext::gpr`]) for the
    /// thread's return.
    #[cfg(target_arch = "x86_64")]
    pub fn set_gpr(&mut self, n: usize, v: u64) {
        self.set_greg(GPR_INDEX[n & 15], v)
    }

    /// The saved instruction pointer (for a fault: the faulting
    /// instruction; for a trap: the next one).
    #[cfg(target_arch = "x86_64")]
    pub fn rip(&self) -> u64 {
        self.greg(libc::REG_RIP as usize)
    }

    /// Sets the instruction pointer the thread resumes at.
    #[cfg(target_arch = "x86_64")]
    pub fn set_rip(&mut self, v: u64) {
        self.set_greg(libc::REG_RIP as usize, v)
    }

    /// The saved `RFLAGS`.
    #[cfg(target_arch = "x86_64")]
    pub fn rflags(&self) -> u64 {
        self.greg(libc::REG_EFL as usize)
    }

    /// Sets the `RFLAGS` the thread resumes with (the kernel keeps the
    /// privileged bits; the trap flag [`EFLAGS_TF`] is honoured).
    #[cfg(target_arch = "x86_64")]
    pub fn set_rflags(&mut self, v: u64) {
        self.set_greg(libc::REG_EFL as usize, v)
    }

    /// Copies the low `out.len()` bytes (16: XMM, 32: YMM) of the saved
    /// vector register `n` (0..16) into `out`. False, with `out` unchanged
    /// or partly written, if that state is not in the signal frame (no FPU
    /// state, no xsave header for a YMM read) or the request is malformed.
    /// A YMM register whose upper half is in its initial state (AVX bit
    /// clear in `xstate_bv`) reads as zeros there.
    #[cfg(target_arch = "x86_64")]
    pub fn vec(&self, n: usize, out: &mut [u8]) -> bool {
        if n >= 16 || (out.len() != 16 && out.len() != 32) {
            return false;
        }
        // SAFETY: `uc` is the handler's valid ucontext (`from_raw`);
        // `fpregs` is null or points at the saved FPU state in the signal
        // frame: the 512-byte fxsave area, extended by an xsave header and
        // the AVX state when the sw_reserved magic says so (see the module
        // diagram). Every offset read lies within the area its check
        // established.
        unsafe {
            let fp = (*self.uc).uc_mcontext.fpregs as *const u8;
            if fp.is_null() {
                return false;
            }
            std::ptr::copy_nonoverlapping(fp.add(160 + 16 * n), out.as_mut_ptr(), 16);
            if out.len() == 32 {
                let magic = fp.add(464).cast::<u32>().read_unaligned();
                if magic != FP_XSTATE_MAGIC1 {
                    return false;
                }
                let xstate_bv = fp.add(512).cast::<u64>().read_unaligned();
                if xstate_bv & 4 != 0 {
                    std::ptr::copy_nonoverlapping(fp.add(576 + 16 * n), out[16..].as_mut_ptr(), 16);
                } else {
                    out[16..].fill(0);
                }
            }
        }
        true
    }

    /// The perf fields if this is a perf-event `SIGTRAP` (`si_code ==
    /// TRAP_PERF`, a `perf_event_open` breakpoint, the `perf` feature), else
    /// `None`.
    pub fn perf(&self) -> Option<PerfTrap> {
        // SAFETY: `info` is the handler's valid siginfo (`from_raw`).
        unsafe { perf_trap(self.info) }
    }

    /// Passes the signal on to `prev`, the action that was installed before
    /// ours (`None`: there was none): calls its handler with this context,
    /// ignores the signal if it was ignored (except a fault-generated
    /// signal, which would only repeat), or performs the default action.
    pub fn chain(&self, prev: Option<&SigAction>) {
        let prev = prev.map_or(std::ptr::null(), |p| p as *const SigAction);
        // SAFETY: `prev` is null or a valid sigaction (it comes from a
        // reference); `info` and `uc` are this handler's arguments.
        unsafe { chain_to(prev, self.sig, self.info, self.uc.cast()) }
    }

    #[cfg(target_arch = "x86_64")]
    fn greg(&self, i: usize) -> u64 {
        // SAFETY: `uc` is the handler's valid ucontext (`from_raw`) and
        // every caller passes an index below 23 (a REG_* constant); no
        // reference into it outlives this read.
        unsafe { (*self.uc).uc_mcontext.gregs[i] as u64 }
    }

    #[cfg(target_arch = "x86_64")]
    fn set_greg(&mut self, i: usize, v: u64) {
        // SAFETY: as in `greg`; the kernel restores gregs on sigreturn.
        unsafe { (*self.uc).uc_mcontext.gregs[i] = v as i64 }
    }
}

/// The perf fields of a `TRAP_PERF` siginfo (read by
/// [`SignalContext::perf`](crate::signal::SignalContext::perf)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfTrap {
    /// `si_perf_data`: the event's `sig_data`.
    pub data: u64,
    /// `si_addr`: for a breakpoint, its `bp_addr` (the start of the watched
    /// range, not the byte written).
    pub addr: u64,
    /// `si_perf_type`: the event's `type` (`PERF_TYPE_BREAKPOINT`).
    pub perf_type: u32,
    /// `si_perf_flags` (`TRAP_PERF_FLAG_ASYNC` = 1 if not synchronous).
    pub flags: u32,
}

/// All perf fields of `info` if it is a perf-event `SIGTRAP`, else `None`.
///
/// # Safety
/// `info` is null or points to a valid siginfo.
unsafe fn perf_trap(info: *const libc::siginfo_t) -> Option<PerfTrap> {
    if info.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a valid siginfo; the fields read lie
    // within its 128 bytes at the uapi offsets above.
    unsafe {
        if (*info).si_signo != libc::SIGTRAP || (*info).si_code != TRAP_PERF {
            return None;
        }
        let base = info.cast::<u8>();
        Some(PerfTrap {
            data: base.add(SI_PERF_DATA_OFFSET).cast::<u64>().read_unaligned(),
            addr: (*info).si_addr() as u64,
            perf_type: base.add(SI_PERF_TYPE_OFFSET).cast::<u32>().read_unaligned(),
            flags: base
                .add(SI_PERF_FLAGS_OFFSET)
                .cast::<u32>()
                .read_unaligned(),
        })
    }
}

/// Installs `handler` (an `SA_SIGINFO` handler) for `sig` with
/// `SA_NODEFER | SA_RESTART` (and `SA_ONSTACK` if `onstack`), returning
/// the previous action.
pub fn install_sigaction(sig: i32, handler: Handler, onstack: bool) -> io::Result<SigAction> {
    // SAFETY: sigaction structs are plain data; we fill every field we use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
        if onstack {
            sa.sa_flags |= libc::SA_ONSTACK;
        }
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &sa, &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(old)
    }
}

/// Puts back `old`, an action [`install_sigaction`] returned, for `sig`.
pub fn restore_sigaction(sig: i32, old: &SigAction) -> io::Result<()> {
    // SAFETY: `old` is a valid sigaction (saved by the kernel for `sig`).
    if unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Passes a signal on to the action that was installed before ours
/// (`prev`, null if none): calls its handler, ignores it if it was ignored
/// (except a fault-generated signal, which would only repeat), or performs
/// the default action. Async-signal-safe. [`SignalContext::chain`] is the
/// safe form.
///
/// # Safety
/// `prev` is null or points to a valid `sigaction` for `sig`; `info` and
/// `ctx` are what the kernel passed to the calling handler.
pub unsafe fn chain_to(prev: *const SigAction, sig: i32, info: *mut SigInfo, ctx: *mut c_void) {
    if !prev.is_null() {
        // SAFETY: the caller guarantees `prev`.
        let prev = unsafe { &*prev };
        let h = prev.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: installed by its owner as an SA_SIGINFO handler;
                // called with the arguments the kernel gave us.
                let f: Handler = unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain `void (*)(int)` handler.
                let f: extern "C" fn(i32) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
        if h == libc::SIG_IGN && sig != libc::SIGBUS && sig != libc::SIGSEGV {
            return;
        }
    }
    // Default action: re-raise with the default disposition (for a
    // fault-generated signal the retried access would raise it anyway).
    reset_to_default(sig);
    // SAFETY: raise is async-signal-safe.
    unsafe {
        libc::raise(sig);
    }
}

/// Restores the default action of `sig`. Async-signal-safe.
pub fn reset_to_default(sig: i32) {
    // SAFETY: sigaction is async-signal-safe; the struct is fully zeroed
    // (SIG_DFL == 0).
    unsafe {
        let sa: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// Installs an alternate signal stack of `size` bytes for the calling
/// thread (fresh anonymous memory, outside every region). Returns the
/// mapping, which must outlive the thread's use of it.
pub fn install_altstack(size: usize) -> io::Result<crate::mem::Mapping> {
    let m = crate::mem::Mapping::anon(size).map_err(|e| e.source)?;
    let st = libc::stack_t {
        ss_sp: m.as_ptr().cast(),
        ss_flags: 0,
        ss_size: size,
    };
    // SAFETY: `st` describes memory we own and keep alive in `m`.
    if unsafe { libc::sigaltstack(&st, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(m)
}

/// Disables the calling thread's alternate signal stack.
pub fn remove_altstack() {
    let st = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: libc::SS_DISABLE,
        ss_size: 0,
    };
    // SAFETY: disabling is always valid (fails with EPERM only while on the
    // stack, which cannot be the case here).
    unsafe {
        libc::sigaltstack(&st, std::ptr::null_mut());
    }
}

/// The signal set holding `sigs`.
fn sigset_of_all(sigs: &[i32]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it fully and
    // sigaddset only fails for an invalid signal number (then that one is
    // left out).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in sigs {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// The signal set holding only `sig`.
fn sigset_of(sig: i32) -> libc::sigset_t {
    sigset_of_all(&[sig])
}

/// Blocks (`true`) or unblocks `sig` in the calling thread's signal mask.
pub fn set_blocked(sig: i32, blocked: bool) -> io::Result<()> {
    set_blocked_all(&[sig], blocked)
}

/// Blocks (`true`) or unblocks every signal of `sigs` in the calling
/// thread's signal mask (threads started afterwards inherit it).
pub fn set_blocked_all(sigs: &[i32], blocked: bool) -> io::Result<()> {
    let set = sigset_of_all(sigs);
    let how = if blocked {
        libc::SIG_BLOCK
    } else {
        libc::SIG_UNBLOCK
    };
    // SAFETY: `set` is a valid sigset; only the calling thread's mask
    // changes.
    let r = unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Waits at most `timeout` for `sig` (which the calling thread must have
/// blocked) and accepts it (`sigtimedwait`): true if it arrived, false on
/// timeout or when another signal interrupted the wait.
pub fn wait_for(sig: i32, timeout: Duration) -> io::Result<bool> {
    let set = sigset_of(sig);
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: siginfo_t is plain data the kernel fills; `set`, `info` and
    // `ts` are valid for the call.
    let r = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::sigtimedwait(&set, &mut info, &ts)
    };
    if r == sig {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(false),
        _ => Err(e),
    }
}

/// Waits at most `timeout` for any signal of `sigs` (which every thread
/// must have blocked, or another thread may take it) and accepts it
/// (`sigtimedwait`): `Some(sig)` if one arrived, `None` on timeout or
/// when another signal interrupted the wait.
pub fn wait_any(sigs: &[i32], timeout: Duration) -> io::Result<Option<i32>> {
    let set = sigset_of_all(sigs);
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: siginfo_t is plain data the kernel fills; `set`, `info` and
    // `ts` are valid for the call.
    let r = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::sigtimedwait(&set, &mut info, &ts)
    };
    if r > 0 {
        return Ok(Some(r));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
        _ => Err(e),
    }
}

/// Ends the process as signal `sig` would by default (so a parent sees
/// "killed by SIGTERM", exit status 128 + sig in a shell): restores the
/// default action, unblocks `sig` and raises it; exits with 128 + sig if
/// the signal did not end the process.
pub fn die_by(sig: i32) -> ! {
    reset_to_default(sig);
    let _ = set_blocked(sig, false);
    // SAFETY: raise has no memory-safety preconditions.
    unsafe {
        libc::raise(sig);
    }
    std::process::exit(128 + sig)
}

/// Sends `sig` to thread `tid` of this process (`tgkill`).
pub fn tgkill(tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscall with integer arguments; the thread group is our
    // own, so no other process can be signalled.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, crate::thread::getpid(), tid, sig) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    /// `PERF_TYPE_BREAKPOINT` (`crate::perf` is behind the `perf` feature).
    const PERF_TYPE_BREAKPOINT: u32 = 5;

    #[test]
    fn siginfo_offsets() {
        // SAFETY: siginfo_t is plain data.
        let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
        si.si_signo = libc::SIGTRAP;
        si.si_code = TRAP_PERF;
        let p = (&mut si as *mut libc::siginfo_t).cast::<u8>();
        // SAFETY: offsets within the 128-byte siginfo.
        unsafe {
            p.add(16).cast::<u64>().write_unaligned(0x1000);
            p.add(24).cast::<u64>().write_unaligned(0xfeed);
            p.add(32)
                .cast::<u32>()
                .write_unaligned(PERF_TYPE_BREAKPOINT);
        }
        // SAFETY: a valid siginfo.
        let t = unsafe { perf_trap(&si) }.unwrap();
        assert_eq!(
            t,
            PerfTrap {
                data: 0xfeed,
                addr: 0x1000,
                perf_type: PERF_TYPE_BREAKPOINT,
                flags: 0
            }
        );
        si.si_code = 1; // TRAP_BRKPT
                        // SAFETY: as above.
        assert_eq!(unsafe { perf_trap(&si) }.map(|t| t.data), None);
        // SAFETY: null is allowed.
        assert_eq!(unsafe { perf_trap(std::ptr::null()) }.map(|t| t.data), None);
    }

    /// The context reads and writes the buffers it was made from.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn context_registers_and_fault_fields() {
        // SAFETY: both are plain data; all-zero is valid.
        let (mut si, mut uc): (libc::siginfo_t, libc::ucontext_t) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        si.si_signo = libc::SIGBUS;
        si.si_code = BUS_ADRERR;
        // SAFETY: `_sigfault._addr` is at offset 16 (see `perf_trap`).
        unsafe {
            (&mut si as *mut libc::siginfo_t)
                .cast::<u8>()
                .add(16)
                .cast::<u64>()
                .write_unaligned(0x7000_1234)
        };
        uc.uc_mcontext.gregs[libc::REG_ERR as usize] = 0x6;
        uc.uc_mcontext.gregs[libc::REG_RDX as usize] = 42;
        {
            // SAFETY: valid buffers, used only through `ctx` in this block.
            let mut ctx = unsafe {
                SignalContext::from_raw(
                    libc::SIGBUS,
                    &mut si,
                    (&mut uc as *mut libc::ucontext_t).cast(),
                )
            };
            assert_eq!((ctx.signal(), ctx.code()), (SIGBUS, BUS_ADRERR));
            assert_eq!(ctx.fault_addr(), 0x7000_1234);
            let e = ctx.error_code();
            assert!(e.write() && e.user() && !e.present());
            assert_eq!(ctx.gpr(2), 42);
            ctx.set_gpr(13, 7);
            ctx.set_rip(0x40_0000);
            ctx.set_rflags(0x202 | EFLAGS_TF);
            assert!(ctx.perf().is_none());
            let mut x = [0u8; 16];
            assert!(!ctx.vec(0, &mut x), "no FPU state in this frame");
        }
        assert_eq!(uc.uc_mcontext.gregs[libc::REG_R13 as usize], 7);
        assert_eq!(uc.uc_mcontext.gregs[libc::REG_RIP as usize], 0x40_0000);
        assert_eq!(uc.uc_mcontext.gregs[libc::REG_EFL as usize], 0x302);
    }
}
