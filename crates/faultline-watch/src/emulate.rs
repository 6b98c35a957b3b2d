//! x86-64 store emulation for write watchpoints.
//!
//! # Mechanism
//!
//! A watchpoint write-protects the pages it watches. When a thread stores to
//! such a page the kernel delivers `SIGSEGV`/`SIGBUS` on that thread, with the
//! interrupted registers in the signal `ucontext`. The classic way to let the
//! store proceed is to unprotect the page, single-step the instruction and
//! protect the page again; in a virtual machine every trap of that dance is
//! expensive. Instead, the handler calls [`emulate`] with the instruction
//! bytes at `RIP`:
//!
//! 1. the instruction is decoded with `iced-x86` (no allocation once
//!    [`prepare`] has run);
//! 2. it is matched against a whitelist of store instructions (see below) and
//!    fully validated: operand sizes, vector-state availability, segment
//!    bases, alignment of the alignment-checking forms;
//! 3. the effective address is computed from the saved registers
//!    (`base + index * scale + disp`, RIP-relative, `0x67` 32-bit addressing,
//!    `FS`/`GS` bases);
//! 4. the access is performed through a [`Memory`] object, which in
//!    production writes through a writable alias of the protected page and
//!    records the before/after values;
//! 5. the registers and status flags are updated exactly as the CPU would,
//!    and `RIP` is advanced past the instruction.
//!
//! If anything is not supported, [`emulate`] returns
//! [`Outcome::NotEmulated`] *before* any write and without touching the
//! registers, so the caller can fall back to single-stepping; then
//! [`write_target`] tells which range the instruction is about to write.
//!
//! Arithmetic flags are never computed in software: read-modify-write
//! instructions run the same operation natively on register operands
//! (`core::arch::asm!`) and capture `RFLAGS` with `pushfq`, so `AF`, `PF` and
//! `OF` are bit-exact with what the real instruction would have produced.
//!
//! # What is emulated
//!
//! * `MOV m, r/imm` (8/16/32/64 bits, sign-extended `imm32`, `moffs`),
//!   `MOVNTI`, `MOVBE m, r`, `SETcc m8`;
//! * vector stores from XMM/YMM registers: `(V)MOVUPS/UPD/APS/APD/DQU/DQA`,
//!   `(V)MOVNTPS/NTPD/NTDQ`, `(V)MOVSS/SD m, xmm`, `(V)MOVD/MOVQ m, xmm`,
//!   `(V)MOVLPS/LPD/HPS/HPD m, xmm` (legacy SSE and VEX, 128 and 256 bits);
//! * `STOS{B,W,D,Q}` and `MOVS{B,W,D,Q}`, with or without `REP`, both
//!   directions, 64-bit addressing;
//! * `ADD OR ADC SBB AND SUB XOR` with a memory destination and a register
//!   or immediate source, `INC DEC NEG NOT` on memory, with or without `LOCK`;
//! * `XCHG m, r` (always atomic), `XADD m, r`, `CMPXCHG m, r`;
//! * `BTS BTR BTC m, r/imm8`.
//!
//! Everything else (EVEX/AVX-512, x87, `CMPXCHG8B/16B`, `PUSH`/`CALL`,
//! MMX, `PEXTR*`, masked and scatter stores, 32-bit-addressed string
//! instructions, ...) returns [`Outcome::NotEmulated`].
//!
//! # `REP` string instructions
//!
//! `REP STOS`/`REP MOVS` are processed in chunks of at most 256 bytes through
//! a stack buffer, and at most up to the end of the 4 KiB page holding the
//! first destination element. If elements remain after that, `RCX`, `RSI`
//! and `RDI` reflect the completed elements and `RIP` is left on the
//! instruction: this is exactly the architectural state of an interrupted
//! `REP` instruction, so resuming the thread continues natively (and faults
//! again only if the next page is protected too). The same happens if a
//! [`Memory`] access fails after some elements were done. The outcome is
//! [`Outcome::Emulated`] in both cases; callers that need to know whether
//! the instruction completed compare `RIP` before and after.
//!
//! # Continuing past the store
//!
//! Each fault costs a signal round trip (about 3 us in a VM), so a loop
//! storing to every byte of a watched page pays it per byte. [`run`]
//! emulates the faulting store like [`emulate`] and then keeps
//! *interpreting* the following instructions while they keep accessing hot
//! (write-protected) pages, so one signal covers many iterations: plain
//! register arithmetic, loads, compares, `CMOVcc`/`SETcc`, relative jumps
//! and every store above (stores still go through [`Memory`], so every
//! write to a watched byte is reported and the page never becomes
//! writable). It stops before anything else (calls, returns, stack
//! operations, system calls, indirect jumps, ...), on a memory fault,
//! after a budget of instructions or after too many instructions without a
//! hot access, always on an exact architectural state. Arithmetic flags
//! again come from native execution, with the incoming flags loaded with
//! `popfq`, so even "undefined" flags match the real instruction.
//!
//! # Signal safety
//!
//! Nothing here allocates, locks, formats or panics, with one exception:
//! `iced-x86` builds its decoder tables lazily (a `lazy_static` that
//! allocates) on the first decode. Call [`prepare`] once, outside signal
//! context, before installing the handler.

use iced_x86::{
    Code, Decoder, DecoderError, DecoderOptions, Instruction, Mnemonic, OpKind, Register,
};

/// A general-purpose register number in x86 encoding order: 0=RAX, 1=RCX,
/// 2=RDX, 3=RBX, 4=RSP, 5=RBP, 6=RSI, 7=RDI, 8..15=R8..R15.
pub type Gpr = usize;

/// The interrupted thread's registers (backed by the signal ucontext in
/// production, a plain struct in tests).
pub trait Cpu {
    /// Reads the full 64-bit value of general-purpose register `r` (0..16).
    fn gpr(&self, r: Gpr) -> u64;
    /// Writes the full 64-bit value of general-purpose register `r` (0..16).
    fn set_gpr(&mut self, r: Gpr, v: u64);
    /// The instruction pointer (address of the faulting instruction).
    fn rip(&self) -> u64;
    /// Sets the instruction pointer the thread resumes at.
    fn set_rip(&mut self, v: u64);
    /// The saved `RFLAGS`.
    fn rflags(&self) -> u64;
    /// Sets the `RFLAGS` the thread resumes with.
    fn set_rflags(&mut self, v: u64);
    /// Copies the low `out.len()` bytes (16 for XMM, 32 for YMM) of vector
    /// register `n` (0..16) into `out`; false if that state is unavailable
    /// (then the instruction is not emulated).
    fn vec(&self, n: usize, out: &mut [u8]) -> bool;
    /// FS base for segment-prefixed accesses; `None` = not emulated.
    fn fs_base(&self) -> Option<u64> {
        None
    }
    /// GS base for segment-prefixed accesses; `None` = not emulated.
    fn gs_base(&self) -> Option<u64> {
        None
    }
}

/// Where emulated accesses go. Addresses are the program's virtual
/// addresses.
///
/// Each call should be all-or-nothing: a failing `write` or `cas` must not
/// have modified memory, otherwise the "nothing written on `NotEmulated`"
/// guarantee of [`emulate`] cannot hold.
pub trait Memory {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault>;
    /// Writes `data` at `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault>;
    /// Atomic compare-and-swap of `size` (1, 2, 4, 8) bytes at `addr` (used
    /// for LOCK-prefixed / implicitly locked instructions); returns the value
    /// found (== `expected` on success). Values are little-endian, zero
    /// extended to 64 bits.
    fn cas(&mut self, addr: u64, size: usize, expected: u64, new: u64) -> Result<u64, MemFault>;
    /// Whether `addr` is on a page whose writes fault (worth interpreting
    /// for, see [`run`]). Default: false.
    fn hot(&self, addr: u64) -> bool {
        let _ = addr;
        false
    }
}

/// A [`Memory`] access failed (address not backed by the emulation target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemFault;

/// Result of [`emulate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The instruction's effects were applied: memory through [`Memory`],
    /// registers, flags and `RIP` through [`Cpu`] (see the module docs for
    /// partially completed `REP` instructions).
    Emulated,
    /// Nothing was written and the [`Cpu`] is unchanged.
    NotEmulated(Reason),
}

/// Why an instruction was not emulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The bytes do not decode to a valid instruction (invalid encoding, or
    /// truncated).
    Undecodable,
    /// A valid instruction this emulator does not handle.
    Unsupported,
    /// No explicit memory store to emulate: a handled instruction family
    /// with a register destination, a common load (`MOV r, m`, `ADD r, m`,
    /// `LEA`, ...) or a compare (`CMP`, `TEST`, `BT`).
    NoMemoryWrite,
    /// The source vector register state is unavailable ([`Cpu::vec`]
    /// returned false).
    VectorState,
    /// The access uses an FS/GS override whose base is unknown.
    Segment,
    /// A [`Memory`] access failed, the real instruction would fault
    /// (misaligned `MOVAPS`-style access), or a locked update did not
    /// succeed after many compare-and-swap retries.
    MemoryFault,
}

/// Longest x86 instruction.
const MAX_INSN_LEN: usize = 15;
/// Stack buffer used by string instructions.
const CHUNK: usize = 256;
/// `REP` string instructions stop at the end of this page (see module docs).
const REP_PAGE: u64 = 4096;
/// Upper bound on compare-and-swap retries of a locked update.
const CAS_RETRIES: u32 = 1 << 20;

const CF: u64 = 1 << 0;
const PF: u64 = 1 << 2;
const AF: u64 = 1 << 4;
const ZF: u64 = 1 << 6;
const SF: u64 = 1 << 7;
const DF: u64 = 1 << 10;
const OF: u64 = 1 << 11;
/// CF|PF|AF|ZF|SF|OF.
const STATUS: u64 = CF | PF | AF | ZF | SF | OF;

const RAX: Gpr = 0;
const RCX: Gpr = 1;
const RSI: Gpr = 6;
const RDI: Gpr = 7;

/// Builds iced-x86's lazily initialised decoder tables (this allocates).
///
/// Call once outside signal context before any [`emulate`] or
/// [`write_target`] call from a signal handler; afterwards decoding never
/// allocates. Cheap and idempotent.
pub fn prepare() {
    // `nop`: any decode forces the tables.
    let _ = decode(&[0x90], 0);
}

/// Decodes one 64-bit instruction at `ip`; `None` if invalid or truncated.
fn decode(code: &[u8], ip: u64) -> Option<Instruction> {
    let bytes = code.get(..code.len().min(MAX_INSN_LEN))?;
    let mut decoder = Decoder::try_with_ip(64, bytes, ip, DecoderOptions::NONE).ok()?;
    let mut instr = Instruction::default();
    decoder.decode_out(&mut instr);
    if instr.is_invalid() || decoder.last_error() != DecoderError::None {
        return None;
    }
    Some(instr)
}

// ---------------------------------------------------------------------------
// Registers
// ---------------------------------------------------------------------------

/// A general-purpose register operand: number, width in bytes, and whether
/// it is one of AH/CH/DH/BH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reg {
    /// [`Gpr`] number (0..16); a byte keeps decoded operands small.
    num: u8,
    /// Width in bytes (1, 2, 4, 8).
    size: u8,
    high: bool,
}

impl Reg {
    /// The accumulator (AL/AX/EAX/RAX) of `size` bytes.
    const fn acc(size: usize) -> Self {
        Reg {
            num: RAX as u8,
            size: size as u8,
            high: false,
        }
    }

    /// The register number as a [`Gpr`].
    const fn gpr(self) -> Gpr {
        self.num as Gpr
    }

    /// The width in bytes.
    const fn bytes(self) -> usize {
        self.size as usize
    }
}

/// `r - lo` if `lo <= r <= hi` (iced register enums are contiguous).
fn in_range(r: u32, lo: Register, hi: Register) -> Option<usize> {
    let (lo, hi) = (lo as u32, hi as u32);
    if r >= lo && r <= hi {
        Some((r - lo) as usize)
    } else {
        None
    }
}

/// Maps an iced general-purpose register to a [`Reg`].
fn gpr_of(r: Register) -> Option<Reg> {
    let n = r as u32;
    // Every index below is < 16, so the narrowing casts are exact.
    let reg = |num: usize, size: u8, high| {
        Some(Reg {
            num: num as u8,
            size,
            high,
        })
    };
    if let Some(i) = in_range(n, Register::AL, Register::BL) {
        return reg(i, 1, false);
    }
    if let Some(i) = in_range(n, Register::AH, Register::BH) {
        return reg(i, 1, true);
    }
    if let Some(i) = in_range(n, Register::SPL, Register::R15L) {
        return reg(4 + i, 1, false);
    }
    if let Some(i) = in_range(n, Register::AX, Register::R15W) {
        return reg(i, 2, false);
    }
    if let Some(i) = in_range(n, Register::EAX, Register::R15D) {
        return reg(i, 4, false);
    }
    if let Some(i) = in_range(n, Register::RAX, Register::R15) {
        return reg(i, 8, false);
    }
    None
}

/// Maps an XMM/YMM register to (number, is YMM); only 0..16 (no EVEX).
fn vec_of(r: Register) -> Option<(usize, bool)> {
    let n = r as u32;
    if let Some(i) = in_range(n, Register::XMM0, Register::XMM15) {
        return Some((i, false));
    }
    if let Some(i) = in_range(n, Register::YMM0, Register::YMM15) {
        return Some((i, true));
    }
    None
}

/// All-ones mask of `size` bytes.
const fn mask(size: usize) -> u64 {
    match size {
        1 => 0xff,
        2 => 0xffff,
        4 => 0xffff_ffff,
        _ => u64::MAX,
    }
}

/// Sign-extends the low `size` bytes of `v`.
const fn sext(v: u64, size: usize) -> i64 {
    match size {
        1 => v as u8 as i8 as i64,
        2 => v as u16 as i16 as i64,
        4 => v as u32 as i32 as i64,
        _ => v as i64,
    }
}

/// Value of `r`, zero-extended.
fn read_reg(cpu: &dyn Cpu, r: Reg) -> u64 {
    let full = cpu.gpr(r.gpr());
    if r.high {
        (full >> 8) & 0xff
    } else {
        full & mask(r.bytes())
    }
}

/// Writes `v` to `r` with x86-64 semantics: 8/16-bit writes merge, 32-bit
/// writes zero-extend to 64 bits.
fn write_reg(cpu: &mut dyn Cpu, r: Reg, v: u64) {
    let full = cpu.gpr(r.gpr());
    let new = match (r.size, r.high) {
        (1, true) => (full & !0xff00) | ((v & 0xff) << 8),
        (1, false) => (full & !0xff) | (v & 0xff),
        (2, _) => (full & !0xffff) | (v & 0xffff),
        (4, _) => v & 0xffff_ffff,
        _ => v,
    };
    cpu.set_gpr(r.gpr(), new);
}

/// Value of a register or immediate operand, truncated to `size` bytes.
fn operand_value(instr: &Instruction, op: u32, cpu: &dyn Cpu, size: usize) -> Result<u64, Reason> {
    match instr.op_kind(op) {
        OpKind::Register => {
            let r = gpr_of(instr.op_register(op)).ok_or(Reason::Unsupported)?;
            Ok(read_reg(cpu, r) & mask(size))
        }
        OpKind::Immediate8
        | OpKind::Immediate16
        | OpKind::Immediate32
        | OpKind::Immediate64
        | OpKind::Immediate8to16
        | OpKind::Immediate8to32
        | OpKind::Immediate8to64
        | OpKind::Immediate32to64 => {
            // `try_immediate` (not `immediate`, which debug-asserts) returns
            // the value already sign-extended to 64 bits for the `*to*` kinds.
            let v = instr.try_immediate(op).map_err(|_| Reason::Unsupported)?;
            Ok(v & mask(size))
        }
        _ => Err(Reason::Unsupported),
    }
}

/// Linear address of memory operand `op` (any memory `OpKind`).
///
/// `Instruction::virtual_address` applies the address size (0x67 truncates
/// to 32 bits), RIP-relative targets (iced stores them already resolved
/// against `next_ip`, so they must not be added to RIP again) and the
/// segment base.
fn address(instr: &Instruction, op: u32, cpu: &dyn Cpu) -> Result<u64, Reason> {
    let mut seg_missing = false;
    let va = instr.virtual_address(op, 0, |reg, _, _| match reg {
        // 64-bit mode: the base of ES, CS, SS and DS is 0.
        Register::ES | Register::CS | Register::SS | Register::DS => Some(0),
        Register::FS => {
            let b = cpu.fs_base();
            seg_missing |= b.is_none();
            b
        }
        Register::GS => {
            let b = cpu.gs_base();
            seg_missing |= b.is_none();
            b
        }
        _ => match gpr_of(reg) {
            Some(r) if !r.high => Some(read_reg(cpu, r)),
            _ => None,
        },
    });
    match va {
        Some(a) => Ok(a),
        None if seg_missing => Err(Reason::Segment),
        None => Err(Reason::Unsupported),
    }
}

/// [`address`] with a fast path for the common case: an `OpKind::Memory`
/// operand with a 64-bit base register (or RIP-relative), an optional
/// 64-bit index and no FS/GS override. Only for instructions whose index register
/// is an ordinary index (not MPX `BNDLDX`/`BNDSTX`, VSIB or AMX strides):
/// everything [`classify`] and `translate` accept.
fn address_fast(instr: &Instruction, op: u32, cpu: &dyn Cpu) -> Result<u64, Reason> {
    let reg64 = |r: Register| in_range(r as u32, Register::RAX, Register::R15);
    if instr.op_kind(op) == OpKind::Memory
        && !matches!(instr.memory_segment(), Register::FS | Register::GS)
    {
        let (base, index) = (instr.memory_base(), instr.memory_index());
        // RIP-relative displacements are already absolute.
        let base_val = match base {
            Register::RIP => Some(0),
            _ => reg64(base).map(|i| cpu.gpr(i)),
        };
        let index_val = match index {
            Register::None => Some(0),
            _ => reg64(index).map(|i| {
                cpu.gpr(i)
                    .wrapping_mul(u64::from(instr.memory_index_scale()))
            }),
        };
        // No base (absolute or index-only forms) takes the general path,
        // which knows the address-size subtleties of those encodings.
        if let (Some(b), Some(i)) = (base_val, index_val) {
            return Ok(instr
                .memory_displacement64()
                .wrapping_add(b)
                .wrapping_add(i));
        }
    }
    address(instr, op, cpu)
}

/// Size in bytes of the instruction's memory operand if it is 1, 2, 4 or 8.
fn int_size(instr: &Instruction) -> Result<usize, Reason> {
    match instr.memory_size().size() {
        s @ (1 | 2 | 4 | 8) => Ok(s),
        _ => Err(Reason::Unsupported),
    }
}

// ---------------------------------------------------------------------------
// Memory helpers
// ---------------------------------------------------------------------------

/// Reads a little-endian value of `size` (1..=8) bytes.
fn read_val(mem: &mut dyn Memory, addr: u64, size: usize) -> Result<u64, Reason> {
    let mut b = [0u8; 8];
    let s = b.get_mut(..size).ok_or(Reason::Unsupported)?;
    mem.read(addr, s).map_err(|_| Reason::MemoryFault)?;
    Ok(u64::from_le_bytes(b))
}

/// Writes the low `size` (1..=8) bytes of `v`, little-endian.
fn write_val(mem: &mut dyn Memory, addr: u64, v: u64, size: usize) -> Result<(), Reason> {
    let b = v.to_le_bytes();
    let s = b.get(..size).ok_or(Reason::Unsupported)?;
    mem.write(addr, s).map_err(|_| Reason::MemoryFault)
}

/// Replaces the `size`-byte value at `addr` by `f(old)` and returns `old`.
/// With `atomic`, uses a compare-and-swap loop; `f` may then run several
/// times and must be pure.
fn update(
    mem: &mut dyn Memory,
    addr: u64,
    size: usize,
    atomic: bool,
    f: &dyn Fn(u64) -> Option<u64>,
) -> Result<u64, Reason> {
    let mut old = read_val(mem, addr, size)?;
    if !atomic {
        let new = f(old).ok_or(Reason::Unsupported)?;
        write_val(mem, addr, new, size)?;
        return Ok(old);
    }
    for _ in 0..CAS_RETRIES {
        let new = f(old).ok_or(Reason::Unsupported)? & mask(size);
        let found = mem
            .cas(addr, size, old, new)
            .map_err(|_| Reason::MemoryFault)?
            & mask(size);
        if found == old {
            return Ok(old);
        }
        old = found;
    }
    Err(Reason::MemoryFault)
}

// ---------------------------------------------------------------------------
// Native arithmetic
// ---------------------------------------------------------------------------

/// Arithmetic operations whose flags come from native execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alu {
    Add,
    Or,
    Adc,
    Sbb,
    And,
    Sub,
    Xor,
    Cmp,
    Inc,
    Dec,
    Neg,
    Not,
}

impl Alu {
    /// The RFLAGS bits the instruction defines (and we therefore update).
    const fn flags(self) -> u64 {
        match self {
            Alu::Inc | Alu::Dec => STATUS & !CF,
            Alu::Not => 0,
            _ => STATUS,
        }
    }
}

/// Runs `op` natively on `size`-byte operands `dst`, `src` with the carry
/// flag preloaded to `cf`; returns (result truncated to `size`, RFLAGS).
#[cfg(target_arch = "x86_64")]
fn alu(op: Alu, size: usize, dst: u64, src: u64, cf: bool) -> Option<(u64, u64)> {
    macro_rules! bin {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl: u64;
            // SAFETY: pure register arithmetic; `pushfq`/`pop` use the stack,
            // which is allowed because `nostack` is not given (the compiler
            // keeps the red zone free), and leave RSP balanced.
            unsafe {
                core::arch::asm!(
                    "bt {cf}, 0",
                    $insn,
                    "pushfq",
                    "pop {fl}",
                    d = inout(reg) d,
                    s = in(reg) src,
                    cf = in(reg) u64::from(cf),
                    fl = lateout(reg) fl,
                );
            }
            (d, fl)
        }};
    }
    macro_rules! un {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl: u64;
            // SAFETY: as above: register arithmetic plus a balanced
            // `pushfq`/`pop` on the (non-`nostack`) stack.
            unsafe {
                core::arch::asm!(
                    "bt {cf}, 0",
                    $insn,
                    "pushfq",
                    "pop {fl}",
                    d = inout(reg) d,
                    cf = in(reg) u64::from(cf),
                    fl = lateout(reg) fl,
                );
            }
            (d, fl)
        }};
    }
    macro_rules! sized_bin {
        ($mn:literal) => {
            match size {
                1 => bin!(concat!($mn, " {d:l}, {s:l}")),
                2 => bin!(concat!($mn, " {d:x}, {s:x}")),
                4 => bin!(concat!($mn, " {d:e}, {s:e}")),
                8 => bin!(concat!($mn, " {d}, {s}")),
                _ => return None,
            }
        };
    }
    macro_rules! sized_un {
        ($mn:literal) => {
            match size {
                1 => un!(concat!($mn, " {d:l}")),
                2 => un!(concat!($mn, " {d:x}")),
                4 => un!(concat!($mn, " {d:e}")),
                8 => un!(concat!($mn, " {d}")),
                _ => return None,
            }
        };
    }
    let (r, fl) = match op {
        Alu::Add => sized_bin!("add"),
        Alu::Or => sized_bin!("or"),
        Alu::Adc => sized_bin!("adc"),
        Alu::Sbb => sized_bin!("sbb"),
        Alu::And => sized_bin!("and"),
        Alu::Sub => sized_bin!("sub"),
        Alu::Xor => sized_bin!("xor"),
        Alu::Cmp => sized_bin!("cmp"),
        Alu::Inc => sized_un!("inc"),
        Alu::Dec => sized_un!("dec"),
        Alu::Neg => sized_un!("neg"),
        Alu::Not => (!dst, 0),
    };
    Some((r & mask(size), fl))
}

/// Not x86-64: no native flags, nothing arithmetic is emulated.
#[cfg(not(target_arch = "x86_64"))]
fn alu(_op: Alu, _size: usize, _dst: u64, _src: u64, _cf: bool) -> Option<(u64, u64)> {
    None
}

/// `(old & !defined) | (native & defined)`.
const fn merge_flags(old: u64, native: u64, defined: u64) -> u64 {
    (old & !defined) | (native & defined)
}

/// Evaluates condition `cc` (the x86 `tttn` encoding, 0=O .. 15=G).
const fn condition(cc: u8, fl: u64) -> bool {
    let of = fl & OF != 0;
    let cf = fl & CF != 0;
    let zf = fl & ZF != 0;
    let sf = fl & SF != 0;
    let pf = fl & PF != 0;
    let base = match cc >> 1 {
        0 => of,
        1 => cf,
        2 => zf,
        3 => cf || zf,
        4 => sf,
        5 => pf,
        6 => sf != of,
        _ => zf || (sf != of),
    };
    base ^ (cc & 1 != 0)
}

// ---------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------

/// The modification of `BTS`/`BTR`/`BTC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BitOp {
    Set,
    Reset,
    Complement,
}

/// What an emulated instruction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `MOV`/`MOVNTI`: store operand 1.
    Store,
    /// `MOVBE m, r`: store operand 1 byte-swapped.
    StoreSwapped,
    /// `SETcc m8` with condition `tttn`.
    Setcc(u8),
    /// Store bytes `offset..offset+len` of the vector register in operand 1;
    /// `aligned`: the access must be `len`-aligned.
    Vector {
        offset: usize,
        len: usize,
        aligned: bool,
    },
    /// Read-modify-write arithmetic.
    Alu(Alu),
    /// `XCHG m, r`.
    Xchg,
    /// `XADD m, r`.
    Xadd,
    /// `CMPXCHG m, r`.
    Cmpxchg,
    /// `BTS`/`BTR`/`BTC m, r/imm8`.
    Bit(BitOp),
    /// `[REP] STOS`.
    Stos,
    /// `[REP] MOVS`.
    Movs,
}

/// Maps the whitelisted instruction codes to what they do.
fn classify(code: Code) -> Option<Kind> {
    use Code as C;
    let v = |offset, len, aligned| {
        Some(Kind::Vector {
            offset,
            len,
            aligned,
        })
    };
    match code {
        C::Mov_rm8_r8
        | C::Mov_rm16_r16
        | C::Mov_rm32_r32
        | C::Mov_rm64_r64
        | C::Mov_rm8_imm8
        | C::Mov_rm16_imm16
        | C::Mov_rm32_imm32
        | C::Mov_rm64_imm32
        | C::Mov_moffs8_AL
        | C::Mov_moffs16_AX
        | C::Mov_moffs32_EAX
        | C::Mov_moffs64_RAX
        | C::Movnti_m32_r32
        | C::Movnti_m64_r64 => Some(Kind::Store),
        C::Movbe_m16_r16 | C::Movbe_m32_r32 | C::Movbe_m64_r64 => Some(Kind::StoreSwapped),
        C::Seto_rm8 => Some(Kind::Setcc(0)),
        C::Setno_rm8 => Some(Kind::Setcc(1)),
        C::Setb_rm8 => Some(Kind::Setcc(2)),
        C::Setae_rm8 => Some(Kind::Setcc(3)),
        C::Sete_rm8 => Some(Kind::Setcc(4)),
        C::Setne_rm8 => Some(Kind::Setcc(5)),
        C::Setbe_rm8 => Some(Kind::Setcc(6)),
        C::Seta_rm8 => Some(Kind::Setcc(7)),
        C::Sets_rm8 => Some(Kind::Setcc(8)),
        C::Setns_rm8 => Some(Kind::Setcc(9)),
        C::Setp_rm8 => Some(Kind::Setcc(10)),
        C::Setnp_rm8 => Some(Kind::Setcc(11)),
        C::Setl_rm8 => Some(Kind::Setcc(12)),
        C::Setge_rm8 => Some(Kind::Setcc(13)),
        C::Setle_rm8 => Some(Kind::Setcc(14)),
        C::Setg_rm8 => Some(Kind::Setcc(15)),

        // Vector stores, legacy SSE.
        C::Movups_xmmm128_xmm | C::Movupd_xmmm128_xmm | C::Movdqu_xmmm128_xmm => v(0, 16, false),
        C::Movaps_xmmm128_xmm
        | C::Movapd_xmmm128_xmm
        | C::Movdqa_xmmm128_xmm
        | C::Movntps_m128_xmm
        | C::Movntpd_m128_xmm
        | C::Movntdq_m128_xmm => v(0, 16, true),
        C::Movss_xmmm32_xmm | C::Movd_rm32_xmm => v(0, 4, false),
        C::Movsd_xmmm64_xmm
        | C::Movq_rm64_xmm
        | C::Movq_xmmm64_xmm
        | C::Movlps_m64_xmm
        | C::Movlpd_m64_xmm => v(0, 8, false),
        C::Movhps_m64_xmm | C::Movhpd_m64_xmm => v(8, 8, false),
        // Vector stores, VEX.
        C::VEX_Vmovups_xmmm128_xmm | C::VEX_Vmovupd_xmmm128_xmm | C::VEX_Vmovdqu_xmmm128_xmm => {
            v(0, 16, false)
        }
        C::VEX_Vmovaps_xmmm128_xmm
        | C::VEX_Vmovapd_xmmm128_xmm
        | C::VEX_Vmovdqa_xmmm128_xmm
        | C::VEX_Vmovntps_m128_xmm
        | C::VEX_Vmovntpd_m128_xmm
        | C::VEX_Vmovntdq_m128_xmm => v(0, 16, true),
        C::VEX_Vmovups_ymmm256_ymm | C::VEX_Vmovupd_ymmm256_ymm | C::VEX_Vmovdqu_ymmm256_ymm => {
            v(0, 32, false)
        }
        C::VEX_Vmovaps_ymmm256_ymm
        | C::VEX_Vmovapd_ymmm256_ymm
        | C::VEX_Vmovdqa_ymmm256_ymm
        | C::VEX_Vmovntps_m256_ymm
        | C::VEX_Vmovntpd_m256_ymm
        | C::VEX_Vmovntdq_m256_ymm => v(0, 32, true),
        C::VEX_Vmovss_m32_xmm | C::VEX_Vmovd_rm32_xmm => v(0, 4, false),
        C::VEX_Vmovsd_m64_xmm
        | C::VEX_Vmovq_rm64_xmm
        | C::VEX_Vmovq_xmmm64_xmm
        | C::VEX_Vmovlps_m64_xmm
        | C::VEX_Vmovlpd_m64_xmm => v(0, 8, false),
        C::VEX_Vmovhps_m64_xmm | C::VEX_Vmovhpd_m64_xmm => v(8, 8, false),

        C::Add_rm8_r8
        | C::Add_rm16_r16
        | C::Add_rm32_r32
        | C::Add_rm64_r64
        | C::Add_rm8_imm8
        | C::Add_rm16_imm16
        | C::Add_rm32_imm32
        | C::Add_rm64_imm32
        | C::Add_rm16_imm8
        | C::Add_rm32_imm8
        | C::Add_rm64_imm8 => Some(Kind::Alu(Alu::Add)),
        C::Or_rm8_r8
        | C::Or_rm16_r16
        | C::Or_rm32_r32
        | C::Or_rm64_r64
        | C::Or_rm8_imm8
        | C::Or_rm16_imm16
        | C::Or_rm32_imm32
        | C::Or_rm64_imm32
        | C::Or_rm16_imm8
        | C::Or_rm32_imm8
        | C::Or_rm64_imm8 => Some(Kind::Alu(Alu::Or)),
        C::Adc_rm8_r8
        | C::Adc_rm16_r16
        | C::Adc_rm32_r32
        | C::Adc_rm64_r64
        | C::Adc_rm8_imm8
        | C::Adc_rm16_imm16
        | C::Adc_rm32_imm32
        | C::Adc_rm64_imm32
        | C::Adc_rm16_imm8
        | C::Adc_rm32_imm8
        | C::Adc_rm64_imm8 => Some(Kind::Alu(Alu::Adc)),
        C::Sbb_rm8_r8
        | C::Sbb_rm16_r16
        | C::Sbb_rm32_r32
        | C::Sbb_rm64_r64
        | C::Sbb_rm8_imm8
        | C::Sbb_rm16_imm16
        | C::Sbb_rm32_imm32
        | C::Sbb_rm64_imm32
        | C::Sbb_rm16_imm8
        | C::Sbb_rm32_imm8
        | C::Sbb_rm64_imm8 => Some(Kind::Alu(Alu::Sbb)),
        C::And_rm8_r8
        | C::And_rm16_r16
        | C::And_rm32_r32
        | C::And_rm64_r64
        | C::And_rm8_imm8
        | C::And_rm16_imm16
        | C::And_rm32_imm32
        | C::And_rm64_imm32
        | C::And_rm16_imm8
        | C::And_rm32_imm8
        | C::And_rm64_imm8 => Some(Kind::Alu(Alu::And)),
        C::Sub_rm8_r8
        | C::Sub_rm16_r16
        | C::Sub_rm32_r32
        | C::Sub_rm64_r64
        | C::Sub_rm8_imm8
        | C::Sub_rm16_imm16
        | C::Sub_rm32_imm32
        | C::Sub_rm64_imm32
        | C::Sub_rm16_imm8
        | C::Sub_rm32_imm8
        | C::Sub_rm64_imm8 => Some(Kind::Alu(Alu::Sub)),
        C::Xor_rm8_r8
        | C::Xor_rm16_r16
        | C::Xor_rm32_r32
        | C::Xor_rm64_r64
        | C::Xor_rm8_imm8
        | C::Xor_rm16_imm16
        | C::Xor_rm32_imm32
        | C::Xor_rm64_imm32
        | C::Xor_rm16_imm8
        | C::Xor_rm32_imm8
        | C::Xor_rm64_imm8 => Some(Kind::Alu(Alu::Xor)),
        C::Inc_rm8 | C::Inc_rm16 | C::Inc_rm32 | C::Inc_rm64 => Some(Kind::Alu(Alu::Inc)),
        C::Dec_rm8 | C::Dec_rm16 | C::Dec_rm32 | C::Dec_rm64 => Some(Kind::Alu(Alu::Dec)),
        C::Neg_rm8 | C::Neg_rm16 | C::Neg_rm32 | C::Neg_rm64 => Some(Kind::Alu(Alu::Neg)),
        C::Not_rm8 | C::Not_rm16 | C::Not_rm32 | C::Not_rm64 => Some(Kind::Alu(Alu::Not)),

        C::Xchg_rm8_r8 | C::Xchg_rm16_r16 | C::Xchg_rm32_r32 | C::Xchg_rm64_r64 => Some(Kind::Xchg),
        C::Xadd_rm8_r8 | C::Xadd_rm16_r16 | C::Xadd_rm32_r32 | C::Xadd_rm64_r64 => Some(Kind::Xadd),
        C::Cmpxchg_rm8_r8 | C::Cmpxchg_rm16_r16 | C::Cmpxchg_rm32_r32 | C::Cmpxchg_rm64_r64 => {
            Some(Kind::Cmpxchg)
        }
        C::Bts_rm16_r16
        | C::Bts_rm32_r32
        | C::Bts_rm64_r64
        | C::Bts_rm16_imm8
        | C::Bts_rm32_imm8
        | C::Bts_rm64_imm8 => Some(Kind::Bit(BitOp::Set)),
        C::Btr_rm16_r16
        | C::Btr_rm32_r32
        | C::Btr_rm64_r64
        | C::Btr_rm16_imm8
        | C::Btr_rm32_imm8
        | C::Btr_rm64_imm8 => Some(Kind::Bit(BitOp::Reset)),
        C::Btc_rm16_r16
        | C::Btc_rm32_r32
        | C::Btc_rm64_r64
        | C::Btc_rm16_imm8
        | C::Btc_rm32_imm8
        | C::Btc_rm64_imm8 => Some(Kind::Bit(BitOp::Complement)),

        C::Stosb_m8_AL | C::Stosw_m16_AX | C::Stosd_m32_EAX | C::Stosq_m64_RAX => Some(Kind::Stos),
        C::Movsb_m8_m8 | C::Movsw_m16_m16 | C::Movsd_m32_m32 | C::Movsq_m64_m64 => Some(Kind::Movs),
        _ => None,
    }
}

/// Common instructions that, with a register destination, only read memory
/// (for a more precise [`Reason`]).
fn is_register_destination_family(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Mov
            | Mnemonic::Add
            | Mnemonic::Or
            | Mnemonic::Adc
            | Mnemonic::Sbb
            | Mnemonic::And
            | Mnemonic::Sub
            | Mnemonic::Xor
            | Mnemonic::Cmp
            | Mnemonic::Test
            | Mnemonic::Lea
            | Mnemonic::Movzx
            | Mnemonic::Movsx
            | Mnemonic::Movsxd
            | Mnemonic::Imul
    )
}

// ---------------------------------------------------------------------------
// Emulation
// ---------------------------------------------------------------------------

/// Decode the instruction in `code` (the bytes at `cpu.rip()`, up to 15) and
/// emulate it. On `Emulated`, all memory writes went through `mem` and
/// registers/flags/RIP are updated. On `NotEmulated`, NOTHING was written
/// and `cpu` is unchanged (so the caller can fall back to single-stepping).
///
/// See the module documentation for the supported instructions and for
/// `REP` instructions completed over several calls.
pub fn emulate(code: &[u8], cpu: &mut dyn Cpu, mem: &mut dyn Memory) -> Outcome {
    let Some(instr) = decode(code, cpu.rip()) else {
        return Outcome::NotEmulated(Reason::Undecodable);
    };
    match exec(&instr, cpu, mem) {
        Ok(()) => Outcome::Emulated,
        Err(r) => Outcome::NotEmulated(r),
    }
}

/// Emulates `instr`. Invariant: on `Err`, neither `cpu` nor memory was
/// modified.
fn exec(instr: &Instruction, cpu: &mut dyn Cpu, mem: &mut dyn Memory) -> Result<(), Reason> {
    let Some(kind) = classify(instr.code()) else {
        let m = instr.mnemonic();
        if matches!(m, Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Bt)
            || (instr.op_kind(0) == OpKind::Register && is_register_destination_family(m))
        {
            return Err(Reason::NoMemoryWrite);
        }
        return Err(Reason::Unsupported);
    };
    match kind {
        Kind::Stos => return stos(instr, cpu, mem),
        Kind::Movs => return movs(instr, cpu, mem),
        _ => {}
    }
    if instr.op_kind(0) != OpKind::Memory {
        return Err(Reason::NoMemoryWrite);
    }
    let addr = address_fast(instr, 0, cpu)?;
    let next = instr.next_ip();
    match kind {
        Kind::Store | Kind::StoreSwapped => {
            let size = int_size(instr)?;
            let v = operand_value(instr, 1, cpu, size)?;
            let v = if kind == Kind::StoreSwapped {
                v.swap_bytes() >> (64 - 8 * size as u32)
            } else {
                v
            };
            write_val(mem, addr, v, size)?;
        }
        Kind::Setcc(cc) => {
            write_val(mem, addr, u64::from(condition(cc, cpu.rflags())), 1)?;
        }
        Kind::Vector {
            offset,
            len,
            aligned,
        } => {
            let (n, ymm) = vec_of(instr.op_register(1)).ok_or(Reason::Unsupported)?;
            if aligned && addr % len as u64 != 0 {
                // The real instruction raises #GP: let it.
                return Err(Reason::MemoryFault);
            }
            let mut buf = [0u8; 32];
            let full = if ymm { 32 } else { 16 };
            let dst = buf.get_mut(..full).ok_or(Reason::Unsupported)?;
            if !cpu.vec(n, dst) {
                return Err(Reason::VectorState);
            }
            let data = buf.get(offset..offset + len).ok_or(Reason::Unsupported)?;
            mem.write(addr, data).map_err(|_| Reason::MemoryFault)?;
        }
        Kind::Alu(op) => {
            let size = int_size(instr)?;
            let src = match op {
                Alu::Inc | Alu::Dec | Alu::Neg | Alu::Not => 0,
                _ => operand_value(instr, 1, cpu, size)?,
            };
            let fl = cpu.rflags();
            let cf = fl & CF != 0;
            // Validate that the operation is available before writing.
            alu(op, size, 0, src, cf).ok_or(Reason::Unsupported)?;
            let f = |old: u64| alu(op, size, old, src, cf).map(|(r, _)| r);
            let old = update(mem, addr, size, instr.has_lock_prefix(), &f)?;
            let (_, native) = alu(op, size, old, src, cf).ok_or(Reason::Unsupported)?;
            cpu.set_rflags(merge_flags(fl, native, op.flags()));
        }
        Kind::Xchg => {
            let size = int_size(instr)?;
            let r = gpr_of(instr.op_register(1)).ok_or(Reason::Unsupported)?;
            let v = read_reg(cpu, r);
            let old = update(mem, addr, size, true, &|_| Some(v))?;
            write_reg(cpu, r, old);
        }
        Kind::Xadd => {
            let size = int_size(instr)?;
            let r = gpr_of(instr.op_register(1)).ok_or(Reason::Unsupported)?;
            let src = read_reg(cpu, r);
            alu(Alu::Add, size, 0, src, false).ok_or(Reason::Unsupported)?;
            let f = |old: u64| alu(Alu::Add, size, old, src, false).map(|(r, _)| r);
            let old = update(mem, addr, size, instr.has_lock_prefix(), &f)?;
            let (_, native) = alu(Alu::Add, size, old, src, false).ok_or(Reason::Unsupported)?;
            write_reg(cpu, r, old);
            let fl = cpu.rflags();
            cpu.set_rflags(merge_flags(fl, native, STATUS));
        }
        Kind::Cmpxchg => {
            let size = int_size(instr)?;
            let r = gpr_of(instr.op_register(1)).ok_or(Reason::Unsupported)?;
            let acc = Reg::acc(size);
            let expected = read_reg(cpu, acc);
            let new = read_reg(cpu, r);
            alu(Alu::Cmp, size, expected, 0, false).ok_or(Reason::Unsupported)?;
            // A compare-and-swap is exactly CMPXCHG; harmless without LOCK.
            let found = mem
                .cas(addr, size, expected, new)
                .map_err(|_| Reason::MemoryFault)?
                & mask(size);
            // Flags as `CMP accumulator, destination`.
            let (_, native) =
                alu(Alu::Cmp, size, expected, found, false).ok_or(Reason::Unsupported)?;
            if found != expected {
                write_reg(cpu, acc, found);
            }
            let fl = cpu.rflags();
            cpu.set_rflags(merge_flags(fl, native, STATUS));
        }
        Kind::Bit(op) => {
            let size = int_size(instr)?;
            if size < 2 {
                return Err(Reason::Unsupported);
            }
            let bits = 8 * size as u64;
            let (ea, bit) = match instr.op_kind(1) {
                OpKind::Register => {
                    // Register bit offsets are signed and address the whole
                    // bit string, not just the operand.
                    let r = gpr_of(instr.op_register(1)).ok_or(Reason::Unsupported)?;
                    let off = sext(read_reg(cpu, r), size);
                    let units = off >> bits.trailing_zeros();
                    let ea = addr.wrapping_add((units as u64).wrapping_mul(size as u64));
                    (ea, (off as u64) & (bits - 1))
                }
                _ => (addr, operand_value(instr, 1, cpu, 1)? & (bits - 1)),
            };
            let m = 1u64 << bit;
            let f = |old: u64| {
                Some(match op {
                    BitOp::Set => old | m,
                    BitOp::Reset => old & !m,
                    BitOp::Complement => old ^ m,
                })
            };
            let old = update(mem, ea, size, instr.has_lock_prefix(), &f)?;
            let fl = cpu.rflags();
            let cf = if old & m != 0 { CF } else { 0 };
            // OF, SF, AF, PF are undefined and ZF unaffected: only CF changes.
            cpu.set_rflags(merge_flags(fl, cf, CF));
        }
        Kind::Stos | Kind::Movs => return Err(Reason::Unsupported),
    }
    cpu.set_rip(next);
    Ok(())
}

/// Number of `size`-byte elements, starting with the one at `addr` and
/// going in direction `df`, that lie in `addr`'s [`REP_PAGE`] (at least 1).
fn elements_in_page(addr: u64, size: usize, df: bool) -> u64 {
    let in_page = addr & (REP_PAGE - 1);
    let bytes = if df {
        in_page + size as u64
    } else {
        REP_PAGE - in_page
    };
    (bytes / size as u64).max(1)
}

/// Shared front end of STOS/MOVS: (element size, repeated?, count, DF).
fn string_setup(instr: &Instruction, cpu: &dyn Cpu) -> Result<(usize, bool, u64, bool), Reason> {
    // 32-bit addressing (ESI/EDI/ECX) is not emulated.
    if instr.op_kind(0) != OpKind::MemoryESRDI {
        return Err(Reason::Unsupported);
    }
    let size = int_size(instr)?;
    // F2 and F3 both mean "repeat RCX times" for STOS and MOVS.
    let rep = instr.has_rep_prefix() || instr.has_repne_prefix();
    let count = if rep { cpu.gpr(RCX) } else { 1 };
    let df = cpu.rflags() & DF != 0;
    Ok((size, rep, count, df))
}

/// Commits RCX and RIP of a (possibly partial) string instruction.
fn string_commit(cpu: &mut dyn Cpu, instr: &Instruction, rep: bool, count: u64, done: u64) {
    if rep {
        cpu.set_gpr(RCX, count - done);
    }
    if done == count {
        cpu.set_rip(instr.next_ip());
    }
}

/// `[REP] STOS{B,W,D,Q}`.
fn stos(instr: &Instruction, cpu: &mut dyn Cpu, mem: &mut dyn Memory) -> Result<(), Reason> {
    let (size, rep, count, df) = string_setup(instr, cpu)?;
    if count == 0 {
        cpu.set_rip(instr.next_ip());
        return Ok(());
    }
    let value = read_reg(cpu, Reg::acc(size)).to_le_bytes();
    let mut buf = [0u8; CHUNK];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = value.get(i % size).copied().unwrap_or(0);
    }
    let mut rdi = cpu.gpr(RDI);
    let total = count.min(elements_in_page(rdi, size, df));
    let per_chunk = (CHUNK / size) as u64;
    let mut done = 0u64;
    while done < total {
        let n = (total - done).min(per_chunk);
        let bytes = n * size as u64;
        let start = if df {
            rdi.wrapping_sub(bytes - size as u64)
        } else {
            rdi
        };
        let data = buf.get(..bytes as usize).ok_or(Reason::Unsupported)?;
        if mem.write(start, data).is_err() {
            if done == 0 {
                return Err(Reason::MemoryFault);
            }
            break;
        }
        rdi = if df {
            rdi.wrapping_sub(bytes)
        } else {
            rdi.wrapping_add(bytes)
        };
        done += n;
    }
    cpu.set_gpr(RDI, rdi);
    string_commit(cpu, instr, rep, count, done);
    Ok(())
}

/// `[REP] MOVS{B,W,D,Q}`.
fn movs(instr: &Instruction, cpu: &mut dyn Cpu, mem: &mut dyn Memory) -> Result<(), Reason> {
    let (size, rep, count, df) = string_setup(instr, cpu)?;
    if instr.op_kind(1) != OpKind::MemorySegRSI {
        return Err(Reason::Unsupported);
    }
    // Source segment base (FS/GS override possible); destination is ES (0).
    let mut rsi = cpu.gpr(RSI);
    let src_base = address(instr, 1, cpu)?.wrapping_sub(rsi);
    if count == 0 {
        cpu.set_rip(instr.next_ip());
        return Ok(());
    }
    let mut rdi = cpu.gpr(RDI);
    let total = count.min(elements_in_page(rdi, size, df));
    // Chunked copying (read a chunk, then write it) equals the element by
    // element order unless an element written early in a chunk is read
    // later in the same chunk. That needs the destination to be "ahead" of
    // the source (in the copy direction) by less than the chunk length, so
    // limit chunks to that distance (one element at minimum).
    let src0 = src_base.wrapping_add(rsi);
    let ahead = if df {
        src0.wrapping_sub(rdi)
    } else {
        rdi.wrapping_sub(src0)
    };
    let safe_bytes = if ahead == 0 {
        CHUNK as u64
    } else {
        ahead.min(CHUNK as u64)
    };
    let per_chunk = (safe_bytes / size as u64).max(1);
    let mut buf = [0u8; CHUNK];
    let mut done = 0u64;
    while done < total {
        let n = (total - done).min(per_chunk);
        let bytes = n * size as u64;
        let back = if df { bytes - size as u64 } else { 0 };
        let src = src_base.wrapping_add(rsi).wrapping_sub(back);
        let dst = rdi.wrapping_sub(back);
        let chunk = buf.get_mut(..bytes as usize).ok_or(Reason::Unsupported)?;
        if mem.read(src, chunk).is_err() || mem.write(dst, chunk).is_err() {
            if done == 0 {
                return Err(Reason::MemoryFault);
            }
            break;
        }
        if df {
            rsi = rsi.wrapping_sub(bytes);
            rdi = rdi.wrapping_sub(bytes);
        } else {
            rsi = rsi.wrapping_add(bytes);
            rdi = rdi.wrapping_add(bytes);
        }
        done += n;
    }
    cpu.set_gpr(RSI, rsi);
    cpu.set_gpr(RDI, rdi);
    string_commit(cpu, instr, rep, count, done);
    Ok(())
}

// ---------------------------------------------------------------------------
// Write target
// ---------------------------------------------------------------------------

/// Instructions whose explicit memory operand 0 is only read (or whose
/// memory write is implicit, like `PUSH m`/`CALL m` to the stack).
fn op0_not_written(m: Mnemonic) -> bool {
    use Mnemonic as M;
    matches!(
        m,
        M::Cmp
            | M::Test
            | M::Bt
            | M::Push
            | M::Call
            | M::Jmp
            | M::Jmpe
            | M::Nop
            | M::Prefetch
            | M::Prefetchnta
            | M::Prefetcht0
            | M::Prefetcht1
            | M::Prefetcht2
            | M::Prefetchw
            | M::Prefetchwt1
            | M::Prefetchit0
            | M::Prefetchit1
            | M::Clflush
            | M::Clflushopt
            | M::Clwb
            | M::Cldemote
            | M::Fld
            | M::Fild
            | M::Fbld
            | M::Fcom
            | M::Fcomp
            | M::Ficom
            | M::Ficomp
            | M::Fadd
            | M::Fiadd
            | M::Fmul
            | M::Fimul
            | M::Fsub
            | M::Fisub
            | M::Fsubr
            | M::Fisubr
            | M::Fdiv
            | M::Fidiv
            | M::Fdivr
            | M::Fidivr
            | M::Fldcw
            | M::Fldenv
            | M::Frstor
            | M::Fxrstor
            | M::Fxrstor64
            | M::Xrstor
            | M::Xrstor64
            | M::Xrstors
            | M::Xrstors64
            | M::Ldmxcsr
            | M::Vldmxcsr
            | M::Lgdt
            | M::Lidt
            | M::Lldt
            | M::Ltr
            | M::Lmsw
            | M::Invlpg
            | M::Verr
            | M::Verw
            | M::Ptwrite
            | M::Bndcl
            | M::Bndcu
            | M::Bndcn
            | M::Bndldx
            | M::Bndmk
            | M::Bound
            | M::Cmpsb
            | M::Cmpsw
            | M::Cmpsd
            | M::Cmpsq
            | M::Monitor
            | M::Monitorx
            | M::Umonitor
            | M::Invpcid
    )
}

/// For instructions we do not emulate: the memory range the instruction
/// would write, if it writes memory through an explicit memory operand
/// (address computed from `cpu`), plus the range length in bytes. Used to
/// report a hit after single-stepping.
///
/// The operand access is inferred without iced's (allocating)
/// `InstructionInfoFactory`: operand 0 is taken as the written operand
/// unless the mnemonic is known to only read it. `REP STOS/MOVS/INS`
/// report the whole range of the remaining iterations; `MOVDIR64B` and
/// `ENQCMD[S]` report the 64 bytes at the address in their register
/// operand. Returns `None` for instructions without an explicit written
/// operand (including `PUSH m`), scatter stores, unknown sizes and unknown
/// FS/GS bases.
pub fn write_target(code: &[u8], cpu: &dyn Cpu) -> Option<(u64, usize)> {
    let instr = decode(code, cpu.rip())?;
    let m = instr.mnemonic();
    if matches!(
        m,
        Mnemonic::Movdir64b | Mnemonic::Enqcmd | Mnemonic::Enqcmds
    ) {
        if instr.op_kind(0) != OpKind::Register {
            return None;
        }
        let r = gpr_of(instr.op_register(0))?;
        return Some((read_reg(cpu, r), 64));
    }
    if op0_not_written(m) || instr.is_vsib() {
        return None;
    }
    let kind = instr.op_kind(0);
    let string = matches!(
        kind,
        OpKind::MemoryESRDI | OpKind::MemoryESEDI | OpKind::MemoryESDI
    );
    if !string
        && !matches!(
            kind,
            OpKind::Memory | OpKind::MemorySegRDI | OpKind::MemorySegEDI | OpKind::MemorySegDI
        )
    {
        return None;
    }
    let elem = instr.memory_size().size();
    if elem == 0 {
        return None;
    }
    let mut addr = address(&instr, 0, cpu).ok()?;
    if m == Mnemonic::Pop && matches!(instr.memory_base(), Register::RSP | Register::ESP) {
        // `POP m` computes an RSP-based address after incrementing RSP.
        addr = addr.wrapping_add(elem as u64);
    }
    if string && (instr.has_rep_prefix() || instr.has_repne_prefix()) {
        let count = match kind {
            OpKind::MemoryESRDI => cpu.gpr(RCX),
            OpKind::MemoryESEDI => cpu.gpr(RCX) & 0xffff_ffff,
            _ => cpu.gpr(RCX) & 0xffff,
        };
        if count == 0 {
            return None;
        }
        let total = count.checked_mul(elem as u64)?;
        let start = if cpu.rflags() & DF != 0 {
            addr.wrapping_sub(total - elem as u64)
        } else {
            addr
        };
        return Some((start, usize::try_from(total).ok()?));
    }
    Some((addr, elem))
}

// ---------------------------------------------------------------------------
// Continuation: interpreting past the faulting store
// ---------------------------------------------------------------------------

/// Why [`run`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The next instruction is not in the interpreted set, does not decode,
    /// or `fetch` returned too few bytes for it. `RIP` points at it.
    Unsupported,
    /// `budget` instructions ran.
    Budget,
    /// `idle_limit` consecutive instructions ran without accessing a hot
    /// address.
    Idle,
    /// A memory access of the next instruction failed (or it would raise
    /// `#GP`, like a misaligned `MOVAPS`): it was not executed and `RIP`
    /// points at it.
    Fault,
    /// The first instruction was not emulated: nothing changed.
    NotEmulated(Reason),
}

const TF: u64 = 1 << 8;
const RSP: Gpr = 4;
/// Decode cache entries, direct-mapped on the low bits of the IP (a loop
/// body shorter than this many bytes never collides with itself).
const CACHE_SLOTS: usize = 64;

/// Register-destination arithmetic, executed natively with the incoming
/// status flags loaded (so unchanged and "undefined" flags come out as the
/// CPU produces them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arith {
    Add,
    Or,
    Adc,
    Sbb,
    And,
    Sub,
    Xor,
    Cmp,
    Test,
    Inc,
    Dec,
    Neg,
    Not,
    Shl,
    Shr,
    Sar,
    Rol,
    Ror,
    Imul,
}

impl Arith {
    /// Whether the result is written back (everything but CMP/TEST).
    const fn writes(self) -> bool {
        !matches!(self, Arith::Cmp | Arith::Test)
    }
}

/// Runs `op` natively on `size`-byte register operands `dst`, `src` (`src`
/// is the count for shifts and rotates, and the multiplier for IMUL), with
/// the status flags of `flags` loaded first; returns (result truncated to
/// `size`, RFLAGS after). `None` for IMUL on bytes (no such form).
#[cfg(target_arch = "x86_64")]
fn native(op: Arith, size: usize, dst: u64, src: u64, flags: u64) -> Option<(u64, u64)> {
    // These define every status flag from the operands and CF (INC/DEC
    // keep CF, which `alu` preloads): the cheaper CF-only preload is exact.
    let cf_only = match op {
        Arith::Add => Some(Alu::Add),
        Arith::Adc => Some(Alu::Adc),
        Arith::Sbb => Some(Alu::Sbb),
        Arith::Sub => Some(Alu::Sub),
        Arith::Cmp => Some(Alu::Cmp),
        Arith::Inc => Some(Alu::Inc),
        Arith::Dec => Some(Alu::Dec),
        Arith::Neg => Some(Alu::Neg),
        _ => None,
    };
    if let Some(a) = cf_only {
        return alu(a, size, dst, src, flags & CF != 0);
    }
    let fin = flags & STATUS;
    // Each block: RFLAGS <- (RFLAGS & !STATUS) | fin; the operation;
    // capture RFLAGS.
    macro_rules! bin {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl: u64;
            // SAFETY: register arithmetic between balanced pushfq/popfq and
            // pushfq/pop pairs on the stack (allowed: `nostack` is not
            // given). Only the status flags are replaced, so DF stays clear
            // and TF/AC keep their values.
            unsafe {
                core::arch::asm!(
                    "pushfq",
                    "pop {fl}",
                    "and {fl}, {keep}",
                    "or {fl}, {fin}",
                    "push {fl}",
                    "popfq",
                    $insn,
                    "pushfq",
                    "pop {fl}",
                    d = inout(reg) d,
                    s = in(reg) src,
                    fin = in(reg) fin,
                    keep = in(reg) !STATUS,
                    fl = out(reg) fl,
                );
            }
            (d, fl)
        }};
    }
    macro_rules! un {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl: u64;
            // SAFETY: as in `bin!`, without a source operand.
            unsafe {
                core::arch::asm!(
                    "pushfq",
                    "pop {fl}",
                    "and {fl}, {keep}",
                    "or {fl}, {fin}",
                    "push {fl}",
                    "popfq",
                    $insn,
                    "pushfq",
                    "pop {fl}",
                    d = inout(reg) d,
                    fin = in(reg) fin,
                    keep = in(reg) !STATUS,
                    fl = out(reg) fl,
                );
            }
            (d, fl)
        }};
    }
    macro_rules! sh {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl: u64;
            // SAFETY: as in `bin!`, with the count in CL.
            unsafe {
                core::arch::asm!(
                    "pushfq",
                    "pop {fl}",
                    "and {fl}, {keep}",
                    "or {fl}, {fin}",
                    "push {fl}",
                    "popfq",
                    $insn,
                    "pushfq",
                    "pop {fl}",
                    d = inout(reg) d,
                    fin = in(reg) fin,
                    keep = in(reg) !STATUS,
                    fl = out(reg) fl,
                    in("rcx") src,
                );
            }
            (d, fl)
        }};
    }
    macro_rules! sized_bin {
        ($mn:literal) => {
            match size {
                1 => bin!(concat!($mn, " {d:l}, {s:l}")),
                2 => bin!(concat!($mn, " {d:x}, {s:x}")),
                4 => bin!(concat!($mn, " {d:e}, {s:e}")),
                8 => bin!(concat!($mn, " {d}, {s}")),
                _ => return None,
            }
        };
    }
    macro_rules! sized_un {
        ($mn:literal) => {
            match size {
                1 => un!(concat!($mn, " {d:l}")),
                2 => un!(concat!($mn, " {d:x}")),
                4 => un!(concat!($mn, " {d:e}")),
                8 => un!(concat!($mn, " {d}")),
                _ => return None,
            }
        };
    }
    macro_rules! sized_sh {
        ($mn:literal) => {
            match size {
                1 => sh!(concat!($mn, " {d:l}, cl")),
                2 => sh!(concat!($mn, " {d:x}, cl")),
                4 => sh!(concat!($mn, " {d:e}, cl")),
                8 => sh!(concat!($mn, " {d}, cl")),
                _ => return None,
            }
        };
    }
    let (r, fl) = match op {
        Arith::Add => sized_bin!("add"),
        Arith::Or => sized_bin!("or"),
        Arith::Adc => sized_bin!("adc"),
        Arith::Sbb => sized_bin!("sbb"),
        Arith::And => sized_bin!("and"),
        Arith::Sub => sized_bin!("sub"),
        Arith::Xor => sized_bin!("xor"),
        Arith::Cmp => sized_bin!("cmp"),
        Arith::Test => sized_bin!("test"),
        Arith::Inc => sized_un!("inc"),
        Arith::Dec => sized_un!("dec"),
        Arith::Neg => sized_un!("neg"),
        Arith::Not => sized_un!("not"),
        Arith::Shl => sized_sh!("shl"),
        Arith::Shr => sized_sh!("shr"),
        Arith::Sar => sized_sh!("sar"),
        Arith::Rol => sized_sh!("rol"),
        Arith::Ror => sized_sh!("ror"),
        Arith::Imul => match size {
            2 => bin!("imul {d:x}, {s:x}"),
            4 => bin!("imul {d:e}, {s:e}"),
            8 => bin!("imul {d}, {s}"),
            _ => return None,
        },
    };
    Some((r & mask(size), fl))
}

/// Not x86-64: nothing is computed natively, so nothing is interpreted.
#[cfg(not(target_arch = "x86_64"))]
fn native(_op: Arith, _size: usize, _dst: u64, _src: u64, _flags: u64) -> Option<(u64, u64)> {
    None
}

/// A source operand of an interpreted instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Src {
    Reg(Reg),
    /// An immediate, sign-extended to 64 bits where the encoding says so.
    Imm(u64),
    /// Memory operand number `op` of `size` bytes, read through [`Memory`].
    Mem {
        op: u8,
        size: u8,
    },
}

/// How [`run`] executes a decoded instruction (decided once per decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Not interpreted: stop before it.
    Stop,
    /// A store: [`emulate`]'s code path.
    Store,
    /// NOP, multi-byte NOP, ENDBR64.
    Nop,
    /// MOV/MOVZX (`sign` false) or MOVSX/MOVSXD (`sign` true) to a register.
    Mov { dst: Reg, src: Src, sign: bool },
    /// LEA.
    Lea { dst: Reg },
    /// `a op b` natively on `size` bytes; the result goes to `dst` (if
    /// any), the status flags come from the native execution.
    Arith {
        op: Arith,
        size: u8,
        dst: Option<Reg>,
        a: Src,
        b: Src,
    },
    /// CMOVcc (condition `tttn`).
    Cmov { cc: u8, dst: Reg, src: Src },
    /// SETcc r8.
    Setcc { cc: u8, dst: Reg },
    /// BSWAP r32/r64.
    Bswap { dst: Reg },
    /// XCHG r, r.
    Xchg { a: Reg, b: Reg },
    /// JMP rel8/rel32.
    Jmp { target: u64 },
    /// Jcc rel8/rel32.
    Jcc { cc: u8, target: u64 },
    /// JRCXZ (`mask` all ones) / JECXZ (`mask` 32 bits).
    Jrcxz { target: u64, mask: u64 },
    /// LOOP (`zf` None), LOOPE (`Some(true)`), LOOPNE (`Some(false)`).
    Loop { target: u64, zf: Option<bool> },
}

/// A register or immediate or memory source operand.
fn src_of(instr: &Instruction, op: u32) -> Option<Src> {
    match instr.op_kind(op) {
        OpKind::Register => gpr_of(instr.op_register(op)).map(Src::Reg),
        OpKind::Memory => match instr.memory_size().size() {
            // `op` < 5 and `s` <= 8: the casts are exact.
            s @ (1 | 2 | 4 | 8) => Some(Src::Mem {
                op: op as u8,
                size: s as u8,
            }),
            _ => None,
        },
        OpKind::Immediate8
        | OpKind::Immediate16
        | OpKind::Immediate32
        | OpKind::Immediate64
        | OpKind::Immediate8to16
        | OpKind::Immediate8to32
        | OpKind::Immediate8to64
        | OpKind::Immediate32to64 => instr.try_immediate(op).ok().map(Src::Imm),
        _ => None,
    }
}

/// Operand `op` as a writable general-purpose register. RSP is refused:
/// moving it could let the interpreted code's stack overlap the signal
/// handler's own frame.
fn written_reg(instr: &Instruction, op: u32) -> Option<Reg> {
    if instr.op_kind(op) != OpKind::Register {
        return None;
    }
    gpr_of(instr.op_register(op)).filter(|r| r.gpr() != RSP)
}

/// The `tttn` condition of a Jcc/CMOVcc/SETcc.
fn cc_of(instr: &Instruction) -> Option<u8> {
    // iced numbers conditions 1 (O) ..= 16 (G), 0 = none.
    (instr.condition_code() as u8).checked_sub(1)
}

/// Whether the prefixes at the start of `bytes` include `0x66` (a near
/// branch with it truncates RIP to 16 bits on AMD, and is ignored on Intel).
fn operand_size_prefix(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .take_while(|&&b| {
            matches!(
                b,
                0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3 | 0x40
                    ..=0x4f
            )
        })
        .any(|&b| b == 0x66)
}

/// Whether `a` is a canonical 48-bit address.
const fn canonical(a: u64) -> bool {
    (((a << 16) as i64) >> 16) as u64 == a
}

/// Target of a 64-bit near relative branch without a `0x66` prefix.
fn branch_target(instr: &Instruction, bytes: &[u8]) -> Option<u64> {
    if instr.op_kind(0) != OpKind::NearBranch64 || operand_size_prefix(bytes) {
        return None;
    }
    let t = instr.near_branch64();
    // A jump to a non-canonical address faults on the jump itself.
    canonical(t).then_some(t)
}

/// `op a, b` with `a` the first operand (written back unless CMP/TEST).
fn two(op: Arith, a: Src, b: Src) -> Option<Op> {
    let size = match a {
        Src::Reg(r) => r.size,
        Src::Mem { size, .. } => size,
        Src::Imm(_) => return None,
    };
    if matches!((a, b), (Src::Mem { .. }, Src::Mem { .. })) {
        return None;
    }
    let dst = if op.writes() {
        match a {
            Src::Reg(r) if r.gpr() != RSP => Some(r),
            _ => return None,
        }
    } else {
        None
    };
    Some(Op::Arith {
        op,
        size,
        dst,
        a,
        b,
    })
}

/// Decides how [`run`] executes `instr`, whose encoding starts `bytes`.
fn translate(instr: &Instruction, bytes: &[u8]) -> Op {
    translate_inner(instr, bytes).unwrap_or(Op::Stop)
}

fn translate_inner(instr: &Instruction, bytes: &[u8]) -> Option<Op> {
    use Code as C;
    use Mnemonic as M;
    if instr.is_invalid() {
        return None;
    }
    let code = instr.code();
    if let Some(kind) = classify(code) {
        match kind {
            Kind::Stos | Kind::Movs => return Some(Op::Store),
            _ if instr.op_kind(0) == OpKind::Memory => {
                // XCHG/XADD also write their register operand.
                if matches!(kind, Kind::Xchg | Kind::Xadd) {
                    written_reg(instr, 1)?;
                }
                return Some(Op::Store);
            }
            Kind::Setcc(cc) => {
                return Some(Op::Setcc {
                    cc,
                    dst: written_reg(instr, 0)?,
                })
            }
            // Register destination: below.
            _ => {}
        }
    }
    if instr.has_lock_prefix() {
        return None;
    }
    let m = instr.mnemonic();
    let unary = |op| two(op, Src::Reg(written_reg(instr, 0)?), Src::Imm(0));
    let binary = |op| two(op, src_of(instr, 0)?, src_of(instr, 1)?);
    let shift = |op| match src_of(instr, 1)? {
        b @ (Src::Reg(_) | Src::Imm(_)) => two(op, Src::Reg(written_reg(instr, 0)?), b),
        Src::Mem { .. } => None,
    };
    let op = match m {
        M::Nop => matches!(
            code,
            C::Nopw | C::Nopd | C::Nopq | C::Nop_rm16 | C::Nop_rm32 | C::Nop_rm64
        )
        .then_some(Op::Nop)?,
        M::Endbr64 => Op::Nop,
        M::Mov | M::Movzx | M::Movsx | M::Movsxd => {
            // MOVSXD r16 differs between vendors.
            if code == C::Movsxd_r16_rm16 {
                return None;
            }
            Op::Mov {
                dst: written_reg(instr, 0)?,
                src: src_of(instr, 1)?,
                sign: matches!(m, M::Movsx | M::Movsxd),
            }
        }
        M::Lea if instr.op_kind(1) == OpKind::Memory => Op::Lea {
            dst: written_reg(instr, 0)?,
        },
        M::Add => binary(Arith::Add)?,
        M::Or => binary(Arith::Or)?,
        M::Adc => binary(Arith::Adc)?,
        M::Sbb => binary(Arith::Sbb)?,
        M::And => binary(Arith::And)?,
        M::Sub => binary(Arith::Sub)?,
        M::Xor => binary(Arith::Xor)?,
        M::Cmp => binary(Arith::Cmp)?,
        M::Test => binary(Arith::Test)?,
        M::Inc => unary(Arith::Inc)?,
        M::Dec => unary(Arith::Dec)?,
        M::Neg => unary(Arith::Neg)?,
        M::Not => unary(Arith::Not)?,
        // SAL is SHL (0xD0-D3 /6 is an undocumented alias).
        M::Shl | M::Sal => shift(Arith::Shl)?,
        M::Shr => shift(Arith::Shr)?,
        M::Sar => shift(Arith::Sar)?,
        M::Rol => shift(Arith::Rol)?,
        M::Ror => shift(Arith::Ror)?,
        M::Imul => {
            let dst = written_reg(instr, 0)?;
            if dst.size < 2 {
                return None;
            }
            match instr.op_count() {
                2 => two(Arith::Imul, Src::Reg(dst), src_of(instr, 1)?)?,
                // r = r/m * imm: the same product (and flags) as the
                // two-operand form with the immediate in the destination.
                3 => match (src_of(instr, 1)?, src_of(instr, 2)?) {
                    (a @ (Src::Reg(_) | Src::Mem { .. }), b @ Src::Imm(_)) => Op::Arith {
                        op: Arith::Imul,
                        size: dst.size,
                        dst: Some(dst),
                        a,
                        b,
                    },
                    _ => return None,
                },
                _ => return None,
            }
        }
        M::Cmovo
        | M::Cmovno
        | M::Cmovb
        | M::Cmovae
        | M::Cmove
        | M::Cmovne
        | M::Cmovbe
        | M::Cmova
        | M::Cmovs
        | M::Cmovns
        | M::Cmovp
        | M::Cmovnp
        | M::Cmovl
        | M::Cmovge
        | M::Cmovle
        | M::Cmovg => Op::Cmov {
            cc: cc_of(instr)?,
            dst: written_reg(instr, 0)?,
            src: src_of(instr, 1)?,
        },
        M::Bswap if matches!(code, C::Bswap_r32 | C::Bswap_r64) => Op::Bswap {
            dst: written_reg(instr, 0)?,
        },
        M::Xchg => Op::Xchg {
            a: written_reg(instr, 0)?,
            b: written_reg(instr, 1)?,
        },
        M::Jmp if matches!(code, C::Jmp_rel8_64 | C::Jmp_rel32_64) => Op::Jmp {
            target: branch_target(instr, bytes)?,
        },
        M::Jrcxz if code == C::Jrcxz_rel8_64 => Op::Jrcxz {
            target: branch_target(instr, bytes)?,
            mask: u64::MAX,
        },
        M::Jecxz if code == C::Jecxz_rel8_64 => Op::Jrcxz {
            target: branch_target(instr, bytes)?,
            mask: 0xffff_ffff,
        },
        M::Loop if code == C::Loop_rel8_64_RCX => Op::Loop {
            target: branch_target(instr, bytes)?,
            zf: None,
        },
        M::Loope if code == C::Loope_rel8_64_RCX => Op::Loop {
            target: branch_target(instr, bytes)?,
            zf: Some(true),
        },
        M::Loopne if code == C::Loopne_rel8_64_RCX => Op::Loop {
            target: branch_target(instr, bytes)?,
            zf: Some(false),
        },
        _ if instr.is_jcc_short_or_near() => Op::Jcc {
            cc: cc_of(instr)?,
            target: branch_target(instr, bytes)?,
        },
        _ => return None,
    };
    Some(op)
}

/// Reads source `src`: (value zero-extended from its size, its size);
/// immediates are `imm_size` bytes.
fn value(
    instr: &Instruction,
    src: Src,
    imm_size: usize,
    cpu: &dyn Cpu,
    mem: &mut dyn Memory,
) -> Result<(u64, usize), Reason> {
    match src {
        Src::Reg(r) => Ok((read_reg(cpu, r), r.bytes())),
        Src::Imm(v) => Ok((v & mask(imm_size), imm_size)),
        Src::Mem { op, size } => {
            let size = usize::from(size);
            let addr = address_fast(instr, u32::from(op), cpu)?;
            Ok((read_val(mem, addr, size)?, size))
        }
    }
}

/// Executes one translated instruction. Invariant (as for [`exec`]): on
/// `Err`, neither `cpu` nor memory was modified.
fn step(
    instr: &Instruction,
    op: Op,
    cpu: &mut dyn Cpu,
    mem: &mut dyn Memory,
) -> Result<(), Reason> {
    let mut next = instr.next_ip();
    match op {
        Op::Stop => return Err(Reason::Unsupported),
        Op::Store => return exec(instr, cpu, mem),
        Op::Nop => {}
        Op::Mov { dst, src, sign } => {
            let (v, size) = value(instr, src, dst.bytes(), cpu, mem)?;
            let v = if sign { sext(v, size) as u64 } else { v };
            write_reg(cpu, dst, v);
        }
        Op::Lea { dst } => {
            // LEA ignores segment overrides; `address` knows (iced's
            // `ignores_segment`), and applies the address size.
            let a = address(instr, 1, cpu)?;
            write_reg(cpu, dst, a);
        }
        Op::Arith {
            op,
            size,
            dst,
            a,
            b,
        } => {
            let size = usize::from(size);
            // Reads first: a fault leaves everything unchanged.
            let (x, _) = value(instr, a, size, cpu, mem)?;
            let (y, _) = value(instr, b, size, cpu, mem)?;
            let fl = cpu.rflags();
            let (r, native_fl) = native(op, size, x, y, fl).ok_or(Reason::Unsupported)?;
            if let Some(d) = dst {
                write_reg(cpu, d, r);
            }
            cpu.set_rflags(merge_flags(fl, native_fl, STATUS));
        }
        Op::Cmov { cc, dst, src } => {
            // The source is read (and may fault) whatever the condition.
            let (v, _) = value(instr, src, dst.bytes(), cpu, mem)?;
            if condition(cc, cpu.rflags()) {
                write_reg(cpu, dst, v);
            } else if dst.size == 4 {
                // A 32-bit CMOV zero-extends even when it does not move.
                let v = read_reg(cpu, dst);
                write_reg(cpu, dst, v);
            }
        }
        Op::Setcc { cc, dst } => {
            let v = u64::from(condition(cc, cpu.rflags()));
            write_reg(cpu, dst, v);
        }
        Op::Bswap { dst } => {
            let v = read_reg(cpu, dst);
            let v = if dst.size == 4 {
                u64::from((v as u32).swap_bytes())
            } else {
                v.swap_bytes()
            };
            write_reg(cpu, dst, v);
        }
        Op::Xchg { a, b } => {
            // Sequential writes are right when `a` and `b` share a register
            // (XCHG AL, AH).
            let (x, y) = (read_reg(cpu, a), read_reg(cpu, b));
            write_reg(cpu, a, y);
            write_reg(cpu, b, x);
        }
        Op::Jmp { target } => next = target,
        Op::Jcc { cc, target } => {
            if condition(cc, cpu.rflags()) {
                next = target;
            }
        }
        Op::Jrcxz { target, mask } => {
            if cpu.gpr(RCX) & mask == 0 {
                next = target;
            }
        }
        Op::Loop { target, zf } => {
            let c = cpu.gpr(RCX).wrapping_sub(1);
            cpu.set_gpr(RCX, c);
            let z = cpu.rflags() & ZF != 0;
            if c != 0 && zf.is_none_or(|want| want == z) {
                next = target;
            }
        }
    }
    cpu.set_rip(next);
    Ok(())
}

/// [`Memory`] wrapper for [`run`]: notes accesses to hot addresses and
/// writes over decoded code.
struct Track<'a> {
    mem: &'a mut dyn Memory,
    /// The current instruction accessed a hot address.
    hot: bool,
    /// Bytes `[lo, hi)` hold cached decoded instructions.
    lo: u64,
    hi: u64,
    /// A write hit `[lo, hi)`: the decode cache is stale.
    code_written: bool,
}

impl Track<'_> {
    fn touch(&mut self, addr: u64, len: usize) {
        if self.hot || len == 0 {
            return;
        }
        let last = addr.wrapping_add(len as u64 - 1);
        self.hot = self.mem.hot(addr) || ((last ^ addr) >> 12 != 0 && self.mem.hot(last));
    }

    fn wrote(&mut self, addr: u64, len: usize) {
        if addr < self.hi && addr.saturating_add(len as u64) > self.lo {
            self.code_written = true;
        }
    }

    fn cover(&mut self, ip: u64, len: usize) {
        self.lo = self.lo.min(ip);
        self.hi = self.hi.max(ip.saturating_add(len as u64));
    }
}

impl Memory for Track<'_> {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        self.touch(addr, buf.len());
        self.mem.read(addr, buf)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault> {
        self.touch(addr, data.len());
        self.wrote(addr, data.len());
        self.mem.write(addr, data)
    }

    fn cas(&mut self, addr: u64, size: usize, expected: u64, new: u64) -> Result<u64, MemFault> {
        self.touch(addr, size);
        self.wrote(addr, size);
        self.mem.cas(addr, size, expected, new)
    }

    fn hot(&self, addr: u64) -> bool {
        self.mem.hot(addr)
    }
}

/// One decode-cache entry.
#[derive(Clone, Copy)]
struct Slot {
    ip: u64,
    instr: Instruction,
    op: Op,
}

/// Emulates the instruction at `cpu.rip()` (bytes `first_code`) exactly like
/// [`emulate`], then keeps interpreting the following instructions inside
/// the caller (typically the fault signal handler), so one signal covers
/// many iterations of a loop that stores to write-protected pages.
///
/// If the first instruction is not emulated, returns
/// `(0, Stop::NotEmulated(reason))` with nothing changed. Otherwise it
/// continues with the instruction at the new `RIP`, fetched with
/// `fetch(ip, &mut buf)` (which copies up to 15 code bytes at `ip` into
/// `buf` and returns how many it copied; fewer than the instruction needs
/// stops the run), while:
///
/// * the instruction is in the interpreted set (below),
/// * fewer than `budget` instructions ran (the first one included; it
///   always runs), and
/// * fewer than `idle_limit` consecutive instructions ran without a
///   memory access (read or write) to an address for which
///   [`Memory::hot`] is true.
///
/// It stops *before* any instruction it cannot execute exactly, leaving
/// the registers, flags and memory exactly as native execution would have
/// them before that instruction; every store still goes through `mem`, so
/// every write to a watched byte is still reported. Returns (instructions
/// executed, why it stopped).
///
/// # Interpreted set
///
/// * every store [`emulate`] handles (same code path; a `REP` string
///   instruction interrupted at a page end is simply executed again);
/// * with a register destination and a register, immediate or memory
///   source: `MOV MOVZX MOVSX MOVSXD LEA`, `ADD OR ADC SBB AND SUB XOR CMP
///   TEST`, `INC DEC NEG NOT`, `SHL/SAL SHR SAR ROL ROR` (imm8, 1, CL),
///   `IMUL r, r/m` and `IMUL r, r/m, imm`, `CMOVcc`, `SETcc r8`, `BSWAP
///   r32/r64`, `XCHG r, r`; also `CMP`/`TEST` with a memory first operand;
///   arithmetic flags come from executing the same operation natively on
///   registers with the incoming flags loaded;
/// * `NOP`, multi-byte `NOP`, `ENDBR64`;
/// * `JMP rel8/rel32`, `Jcc rel8/rel32`, `JRCXZ`, `JECXZ`, `LOOP`,
///   `LOOPE`, `LOOPNE` (64-bit addressing; not with a `0x66` prefix).
///
/// Everything else stops the run (`CALL`, `RET`, `PUSH`, `POP`, indirect
/// jumps, `SYSCALL`, ...), as do instructions writing `RSP` (the handler's
/// frame may sit just below the interrupted stack pointer). With `TF` set
/// in `RFLAGS` only the first instruction runs. Memory operands are read
/// through `mem` (RIP-relative, SIB, `0x67`, FS/GS through the [`Cpu`]
/// bases); a failing read or write stops with [`Stop::Fault`] before the
/// instruction (reads happen before any write, and stores are validated
/// before writing).
///
/// Decoded instructions are kept in an on-stack direct-mapped cache, so a
/// loop body is decoded once per call; a store over cached code flushes
/// it. No allocation, no panics (after [`prepare`]).
pub fn run(
    first_code: &[u8],
    fetch: &mut dyn FnMut(u64, &mut [u8; MAX_INSN_LEN]) -> usize,
    cpu: &mut dyn Cpu,
    mem: &mut dyn Memory,
    budget: u32,
    idle_limit: u32,
) -> (u32, Stop) {
    let mut t = Track {
        mem,
        hot: false,
        lo: u64::MAX,
        hi: 0,
        code_written: false,
    };
    if let Outcome::NotEmulated(r) = emulate(first_code, cpu, &mut t) {
        return (0, Stop::NotEmulated(r));
    }
    let mut done: u32 = 1;
    let mut idle: u32 = u32::from(!t.hot);
    if cpu.rflags() & TF != 0 {
        // Being single-stepped: every instruction must trap.
        return (done, Stop::Unsupported);
    }
    let empty = Slot {
        ip: u64::MAX,
        instr: Instruction::default(),
        op: Op::Stop,
    };
    let mut cache = [empty; CACHE_SLOTS];
    loop {
        if done >= budget {
            return (done, Stop::Budget);
        }
        if idle >= idle_limit {
            return (done, Stop::Idle);
        }
        let ip = cpu.rip();
        let slot = &mut cache[ip as usize % CACHE_SLOTS];
        if slot.ip != ip {
            let mut buf = [0u8; MAX_INSN_LEN];
            let n = fetch(ip, &mut buf).min(MAX_INSN_LEN);
            let bytes = buf.get(..n).unwrap_or(&[]);
            let (instr, op) = match decode(bytes, ip) {
                Some(i) => (i, translate(&i, bytes)),
                None => (Instruction::default(), Op::Stop),
            };
            *slot = Slot { ip, instr, op };
            t.cover(ip, instr.len());
        }
        if matches!(slot.op, Op::Stop) {
            return (done, Stop::Unsupported);
        }
        t.hot = false;
        if let Err(r) = step(&slot.instr, slot.op, cpu, &mut t) {
            let why = if r == Reason::MemoryFault {
                Stop::Fault
            } else {
                Stop::Unsupported
            };
            return (done, why);
        }
        done += 1;
        idle = if t.hot { 0 } else { idle.saturating_add(1) };
        if t.code_written {
            for s in cache.iter_mut() {
                s.ip = u64::MAX;
            }
            t.lo = u64::MAX;
            t.hi = 0;
            t.code_written = false;
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use faultline::sys::mem::{Mapping, Prot};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// Page-aligned, below 2^31 (so 32-bit addressing can reach it).
    const BASE: u64 = 0x1000_0000;
    const MEM_LEN: usize = 0x4000;
    const CODE: u64 = 0x40_0000;
    const RBX: Gpr = 3;
    const RDX: Gpr = 2;

    #[derive(Clone, Debug, PartialEq, Eq)]
    struct FakeCpu {
        gpr: [u64; 16],
        rip: u64,
        rflags: u64,
        vec: [[u8; 32]; 16],
        vec_ok: bool,
        fs: Option<u64>,
        gs: Option<u64>,
    }

    impl FakeCpu {
        fn new() -> Self {
            FakeCpu {
                gpr: [0; 16],
                rip: CODE,
                rflags: 0x202,
                vec: [[0; 32]; 16],
                vec_ok: true,
                fs: None,
                gs: None,
            }
        }
    }

    impl Cpu for FakeCpu {
        fn gpr(&self, r: Gpr) -> u64 {
            self.gpr[r]
        }
        fn set_gpr(&mut self, r: Gpr, v: u64) {
            self.gpr[r] = v;
        }
        fn rip(&self) -> u64 {
            self.rip
        }
        fn set_rip(&mut self, v: u64) {
            self.rip = v;
        }
        fn rflags(&self) -> u64 {
            self.rflags
        }
        fn set_rflags(&mut self, v: u64) {
            self.rflags = v;
        }
        fn vec(&self, n: usize, out: &mut [u8]) -> bool {
            if !self.vec_ok || n >= 16 || out.len() > 32 {
                return false;
            }
            out.copy_from_slice(&self.vec[n][..out.len()]);
            true
        }
        fn fs_base(&self) -> Option<u64> {
            self.fs
        }
        fn gs_base(&self) -> Option<u64> {
            self.gs
        }
    }

    #[derive(Clone, Debug, PartialEq, Eq)]
    struct FakeMem {
        base: u64,
        data: Vec<u8>,
        /// What [`Memory::hot`] answers for every address.
        hot: bool,
    }

    impl FakeMem {
        fn new() -> Self {
            FakeMem {
                base: BASE,
                data: vec![0; MEM_LEN],
                hot: false,
            }
        }
        fn range(&self, addr: u64, len: usize) -> Result<core::ops::Range<usize>, MemFault> {
            let off = addr.checked_sub(self.base).ok_or(MemFault)?;
            let off = usize::try_from(off).map_err(|_| MemFault)?;
            let end = off.checked_add(len).ok_or(MemFault)?;
            if end > self.data.len() {
                return Err(MemFault);
            }
            Ok(off..end)
        }
        fn at(&self, addr: u64, len: usize) -> &[u8] {
            &self.data[self.range(addr, len).unwrap()]
        }
        fn get(&self, addr: u64, size: usize) -> u64 {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(self.at(addr, size));
            u64::from_le_bytes(b)
        }
        fn put(&mut self, addr: u64, size: usize, v: u64) {
            let r = self.range(addr, size).unwrap();
            self.data[r].copy_from_slice(&v.to_le_bytes()[..size]);
        }
    }

    impl Memory for FakeMem {
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault> {
            let r = self.range(addr, buf.len())?;
            buf.copy_from_slice(&self.data[r]);
            Ok(())
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault> {
            let r = self.range(addr, data.len())?;
            self.data[r].copy_from_slice(data);
            Ok(())
        }
        fn cas(
            &mut self,
            addr: u64,
            size: usize,
            expected: u64,
            new: u64,
        ) -> Result<u64, MemFault> {
            if !matches!(size, 1 | 2 | 4 | 8) {
                return Err(MemFault);
            }
            self.range(addr, size)?;
            let found = self.get(addr, size);
            if found == expected {
                self.put(addr, size, new);
            }
            Ok(found)
        }
        fn hot(&self, _addr: u64) -> bool {
            self.hot
        }
    }

    fn setup() -> (FakeCpu, FakeMem) {
        prepare();
        (FakeCpu::new(), FakeMem::new())
    }

    /// Emulates `code` and asserts it completed (RIP advanced past it).
    #[track_caller]
    fn ok(code: &[u8], cpu: &mut FakeCpu, mem: &mut FakeMem) {
        let rip = cpu.rip;
        assert_eq!(emulate(code, cpu, mem), Outcome::Emulated, "{code:02x?}");
        assert_eq!(cpu.rip, rip + code.len() as u64, "{code:02x?}");
    }

    /// Emulates `code`, asserts `NotEmulated(reason)` and no side effect.
    #[track_caller]
    fn refused(code: &[u8], cpu: &mut FakeCpu, mem: &mut FakeMem, reason: Reason) {
        let (c, m) = (cpu.clone(), mem.clone());
        assert_eq!(
            emulate(code, cpu, mem),
            Outcome::NotEmulated(reason),
            "{code:02x?}"
        );
        assert_eq!(*cpu, c);
        assert_eq!(*mem, m);
    }

    // ---- plain stores --------------------------------------------------

    #[test]
    fn mov_reg_store_sizes() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE + 0x10;
        cpu.gpr[RBX] = 0x1122_3344_5566_7788;
        mem.data[0x10..0x20].fill(0xee);
        ok(&[0x88, 0x18], &mut cpu, &mut mem); // mov [rax], bl
        assert_eq!(
            mem.at(BASE + 0x10, 9),
            &[0x88, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee]
        );
        ok(&[0x66, 0x89, 0x18], &mut cpu, &mut mem); // mov [rax], bx
        assert_eq!(mem.get(BASE + 0x10, 4), 0xeeee_7788);
        ok(&[0x89, 0x18], &mut cpu, &mut mem); // mov [rax], ebx
        assert_eq!(mem.get(BASE + 0x10, 8), 0xeeee_eeee_5566_7788);
        ok(&[0x48, 0x89, 0x18], &mut cpu, &mut mem); // mov [rax], rbx
        assert_eq!(mem.get(BASE + 0x10, 8), 0x1122_3344_5566_7788);
        assert_eq!(mem.data[0x18], 0xee);
        // mov [rax+8], r9b: 44 88 48 08
        cpu.gpr[9] = 0xabcd;
        ok(&[0x44, 0x88, 0x48, 0x08], &mut cpu, &mut mem);
        assert_eq!(mem.data[0x18], 0xcd);
        assert_eq!(cpu.rflags, 0x202);
    }

    #[test]
    fn mov_high8_source() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE + 0x20;
        cpu.gpr[RBX] = 0x1234;
        cpu.gpr[RCX] = 0xa5b6;
        ok(&[0x88, 0x60, 0x01], &mut cpu, &mut mem); // mov [rax+1], ah
        assert_eq!(mem.data[0x21], ((BASE + 0x20) >> 8) as u8);
        ok(&[0x88, 0x78, 0x02], &mut cpu, &mut mem); // mov [rax+2], bh
        assert_eq!(mem.data[0x22], 0x12);
        ok(&[0x88, 0x68, 0x03], &mut cpu, &mut mem); // mov [rax+3], ch
        assert_eq!(mem.data[0x23], 0xa5);
        // With a REX prefix the same encoding means SPL/BPL/SIL/DIL:
        // mov [rax+4], bpl: 40 88 68 04
        cpu.gpr[5] = 0x77;
        ok(&[0x40, 0x88, 0x68, 0x04], &mut cpu, &mut mem);
        assert_eq!(mem.data[0x24], 0x77);
    }

    #[test]
    fn mov_immediates() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE;
        ok(&[0xc6, 0x00, 0x80], &mut cpu, &mut mem); // mov byte [rax], 0x80
        assert_eq!(mem.get(BASE, 2), 0x0080);
        ok(&[0x66, 0xc7, 0x00, 0x34, 0x12], &mut cpu, &mut mem); // mov word [rax], 0x1234
        assert_eq!(mem.get(BASE, 4), 0x1234);
        ok(&[0xc7, 0x00, 0x78, 0x56, 0x34, 0x12], &mut cpu, &mut mem); // mov dword [rax], 0x12345678
        assert_eq!(mem.get(BASE, 8), 0x1234_5678);
        // mov qword [rax], -2: the imm32 is sign-extended to 64 bits.
        ok(
            &[0x48, 0xc7, 0x00, 0xfe, 0xff, 0xff, 0xff],
            &mut cpu,
            &mut mem,
        );
        assert_eq!(mem.get(BASE, 8), 0xffff_ffff_ffff_fffe);
        // mov qword [rax+8], 0x7fffffff: positive, upper half zero.
        mem.put(BASE + 8, 8, u64::MAX);
        ok(
            &[0x48, 0xc7, 0x40, 0x08, 0xff, 0xff, 0xff, 0x7f],
            &mut cpu,
            &mut mem,
        );
        assert_eq!(mem.get(BASE + 8, 8), 0x7fff_ffff);
    }

    #[test]
    fn rip_relative() {
        let (mut cpu, mut mem) = setup();
        cpu.rip = BASE + 0x10;
        cpu.gpr[RCX] = 0xdead_beef;
        // mov [rip+0x100], ecx: target = next_ip (rip+6) + 0x100
        ok(&[0x89, 0x0d, 0x00, 0x01, 0x00, 0x00], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x10 + 6 + 0x100, 4), 0xdead_beef);
        // Negative displacement: mov [rip-0x10], cl
        cpu.rip = BASE + 0x200;
        ok(&[0x88, 0x0d, 0xf0, 0xff, 0xff, 0xff], &mut cpu, &mut mem);
        assert_eq!(mem.data[0x200 + 6 - 0x10], 0xef);
    }

    #[test]
    fn sib_index_scale_and_rsp_base() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RBX] = BASE + 0x100;
        cpu.gpr[RCX] = 3;
        cpu.gpr[RDX] = 0xcafe_f00d;
        // mov [rbx+rcx*4+0x10], edx
        ok(&[0x89, 0x54, 0x8b, 0x10], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x100 + 12 + 0x10, 4), 0xcafe_f00d);
        // mov [rbx+rcx*8-8], rdx with a negative index value
        cpu.gpr[RCX] = (-2i64) as u64;
        ok(&[0x48, 0x89, 0x54, 0xcb, 0xf8], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x100 - 16 - 8, 8), 0xcafe_f00d);
        // mov [rsp+0x20], edx
        cpu.gpr[4] = BASE + 0x800;
        ok(&[0x89, 0x54, 0x24, 0x20], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x820, 4), 0xcafe_f00d);
        // mov [r12+r13*2], dl: 43 88 14 6c
        cpu.gpr[12] = BASE + 0x900;
        cpu.gpr[13] = 5;
        ok(&[0x43, 0x88, 0x14, 0x6c], &mut cpu, &mut mem);
        assert_eq!(mem.data[0x90a], 0x0d);
    }

    #[test]
    fn address_size_override() {
        let (mut cpu, mut mem) = setup();
        // mov [eax], ecx: only the low 32 bits of RAX form the address.
        cpu.gpr[RAX] = 0xdead_0000_0000_0000 | (BASE + 0x40);
        cpu.gpr[RCX] = 0x0102_0304;
        ok(&[0x67, 0x89, 0x08], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x40, 4), 0x0102_0304);
        // mov [eax+ecx*2+0x10], dl wraps modulo 2^32.
        cpu.gpr[RAX] = 0xffff_fff0;
        cpu.gpr[RCX] = (BASE + 0x50) / 2;
        cpu.gpr[RDX] = 0x99;
        ok(&[0x67, 0x88, 0x54, 0x48, 0x10], &mut cpu, &mut mem);
        assert_eq!(mem.data[0x50], 0x99);
        // Absolute disp32: mov [abs BASE+0x60], ecx, with and without 0x67.
        let d = ((BASE + 0x60) as u32).to_le_bytes();
        ok(
            &[0x89, 0x0c, 0x25, d[0], d[1], d[2], d[3]],
            &mut cpu,
            &mut mem,
        );
        assert_eq!(mem.get(BASE + 0x60, 4), cpu.gpr[RCX] & 0xffff_ffff);
        cpu.gpr[RCX] = 0x5555;
        ok(
            &[0x67, 0x89, 0x0c, 0x25, d[0], d[1], d[2], d[3]],
            &mut cpu,
            &mut mem,
        );
        assert_eq!(mem.get(BASE + 0x60, 4), 0x5555);
    }

    #[test]
    fn moffs_forms() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = 0x8877_6655_4433_2211;
        let a = (BASE + 0x30).to_le_bytes();
        // mov [moffs64], rax: 48 a3 <imm64>
        let mut code = vec![0x48, 0xa3];
        code.extend_from_slice(&a);
        ok(&code, &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x30, 8), 0x8877_6655_4433_2211);
        // mov [moffs64], al: a2 <imm64>
        let a = (BASE + 0x40).to_le_bytes();
        let mut code = vec![0xa2];
        code.extend_from_slice(&a);
        ok(&code, &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x40, 2), 0x11);
    }

    #[test]
    fn movnti_movbe_setcc() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE;
        cpu.gpr[RCX] = 0x0102_0304_0506_0708;
        ok(&[0x48, 0x0f, 0xc3, 0x08], &mut cpu, &mut mem); // movnti [rax], rcx
        assert_eq!(mem.get(BASE, 8), 0x0102_0304_0506_0708);
        ok(&[0x0f, 0x38, 0xf1, 0x48, 0x10], &mut cpu, &mut mem); // movbe [rax+0x10], ecx
        assert_eq!(mem.at(BASE + 0x10, 4), &[0x05, 0x06, 0x07, 0x08]);
        ok(&[0x66, 0x0f, 0x38, 0xf1, 0x48, 0x20], &mut cpu, &mut mem); // movbe [rax+0x20], cx
        assert_eq!(mem.at(BASE + 0x20, 2), &[0x07, 0x08]);
        ok(&[0x48, 0x0f, 0x38, 0xf1, 0x48, 0x30], &mut cpu, &mut mem); // movbe [rax+0x30], rcx
        assert_eq!(mem.at(BASE + 0x30, 8), &[1, 2, 3, 4, 5, 6, 7, 8]);

        // sete [rax+0x40] / setl [rax+0x41] / setg [rax+0x42] / setb [rax+0x43]
        let sets = |cpu: &mut FakeCpu, mem: &mut FakeMem| {
            ok(&[0x0f, 0x94, 0x40, 0x40], cpu, mem);
            ok(&[0x0f, 0x9c, 0x40, 0x41], cpu, mem);
            ok(&[0x0f, 0x9f, 0x40, 0x42], cpu, mem);
            ok(&[0x0f, 0x92, 0x40, 0x43], cpu, mem);
            (mem.get(BASE + 0x40, 4) as u32).to_le_bytes()
        };
        cpu.rflags = 0x202 | ZF | SF; // equal, SF != OF -> less
        assert_eq!(sets(&mut cpu, &mut mem), [1, 1, 0, 0]);
        cpu.rflags = 0x202 | SF | OF | CF; // not equal, greater, below
        assert_eq!(sets(&mut cpu, &mut mem), [0, 0, 1, 1]);
        // All 16 conditions against a reference (tttn table).
        for fl in 0..64u64 {
            let flags = [CF, PF, ZF, SF, OF, AF]
                .iter()
                .enumerate()
                .filter(|(i, _)| fl >> i & 1 != 0)
                .fold(0x202, |a, (_, f)| a | f);
            let (cf, zf, sf, of, pf) = (
                flags & CF != 0,
                flags & ZF != 0,
                flags & SF != 0,
                flags & OF != 0,
                flags & PF != 0,
            );
            let expect = [
                of,
                !of,
                cf,
                !cf,
                zf,
                !zf,
                cf || zf,
                !(cf || zf),
                sf,
                !sf,
                pf,
                !pf,
                sf != of,
                sf == of,
                zf || sf != of,
                !(zf || sf != of),
            ];
            for (cc, e) in expect.iter().enumerate() {
                cpu.rflags = flags;
                ok(&[0x0f, 0x90 + cc as u8, 0x00], &mut cpu, &mut mem);
                assert_eq!(mem.data[0], u8::from(*e), "cc {cc} flags {flags:#x}");
                assert_eq!(cpu.rflags, flags);
            }
        }
    }

    #[test]
    fn segment_prefixes() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = 0x10;
        cpu.gpr[RCX] = 0x4242;
        // mov fs:[rax], ecx without a known FS base
        refused(&[0x64, 0x89, 0x08], &mut cpu, &mut mem, Reason::Segment);
        cpu.fs = Some(BASE + 0x100);
        ok(&[0x64, 0x89, 0x08], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x110, 4), 0x4242);
        cpu.gs = Some(BASE + 0x200);
        ok(&[0x65, 0x66, 0x89, 0x08], &mut cpu, &mut mem); // mov gs:[rax], cx
        assert_eq!(mem.get(BASE + 0x210, 4), 0x4242);
        // DS/ES/SS/CS overrides are no-ops in 64-bit mode: mov ds:[rcx], al
        cpu.gpr[RCX] = BASE + 0x300;
        cpu.gpr[RAX] = 0x5a;
        ok(&[0x3e, 0x88, 0x01], &mut cpu, &mut mem);
        assert_eq!(mem.data[0x300], 0x5a);
    }

    // ---- vector stores -------------------------------------------------

    fn vec_cpu() -> (FakeCpu, FakeMem) {
        let (mut cpu, mem) = setup();
        for (n, v) in cpu.vec.iter_mut().enumerate() {
            for (i, b) in v.iter_mut().enumerate() {
                *b = (n * 32 + i) as u8;
            }
        }
        cpu.gpr[RAX] = BASE + 0x100;
        (cpu, mem)
    }

    #[test]
    fn sse_stores() {
        let cases: &[(&[u8], usize, usize)] = &[
            (&[0x0f, 0x11, 0x08], 0, 16),            // movups [rax], xmm1
            (&[0x66, 0x0f, 0x11, 0x08], 0, 16),      // movupd [rax], xmm1
            (&[0xf3, 0x0f, 0x7f, 0x08], 0, 16),      // movdqu [rax], xmm1
            (&[0x0f, 0x29, 0x08], 0, 16),            // movaps [rax], xmm1
            (&[0x66, 0x0f, 0x7f, 0x08], 0, 16),      // movdqa [rax], xmm1
            (&[0x66, 0x0f, 0xe7, 0x08], 0, 16),      // movntdq [rax], xmm1
            (&[0x0f, 0x2b, 0x08], 0, 16),            // movntps [rax], xmm1
            (&[0xf3, 0x0f, 0x11, 0x08], 0, 4),       // movss [rax], xmm1
            (&[0xf2, 0x0f, 0x11, 0x08], 0, 8),       // movsd [rax], xmm1
            (&[0x66, 0x0f, 0xd6, 0x08], 0, 8),       // movq [rax], xmm1
            (&[0x66, 0x48, 0x0f, 0x7e, 0x08], 0, 8), // movq [rax], xmm1 (REX.W 7E)
            (&[0x66, 0x0f, 0x7e, 0x08], 0, 4),       // movd [rax], xmm1
            (&[0x0f, 0x13, 0x08], 0, 8),             // movlps [rax], xmm1
            (&[0x66, 0x0f, 0x13, 0x08], 0, 8),       // movlpd [rax], xmm1
            (&[0x0f, 0x17, 0x08], 8, 8),             // movhps [rax], xmm1
            (&[0x66, 0x0f, 0x17, 0x08], 8, 8),       // movhpd [rax], xmm1
            (&[0xc5, 0xf8, 0x11, 0x08], 0, 16),      // vmovups [rax], xmm1
            (&[0xc5, 0xfa, 0x7f, 0x08], 0, 16),      // vmovdqu [rax], xmm1
            (&[0xc5, 0xfc, 0x11, 0x08], 0, 32),      // vmovups [rax], ymm1
            (&[0xc5, 0xfe, 0x7f, 0x08], 0, 32),      // vmovdqu [rax], ymm1
            (&[0xc5, 0xfd, 0x7f, 0x08], 0, 32),      // vmovdqa [rax], ymm1
            (&[0xc5, 0xfd, 0xe7, 0x08], 0, 32),      // vmovntdq [rax], ymm1
            (&[0xc5, 0xfa, 0x11, 0x08], 0, 4),       // vmovss [rax], xmm1
            (&[0xc5, 0xfb, 0x11, 0x08], 0, 8),       // vmovsd [rax], xmm1
            (&[0xc5, 0xf9, 0xd6, 0x08], 0, 8),       // vmovq [rax], xmm1
            (&[0xc5, 0xf9, 0x7e, 0x08], 0, 4),       // vmovd [rax], xmm1
            (&[0xc5, 0xf8, 0x17, 0x08], 8, 8),       // vmovhps [rax], xmm1
            (&[0xc4, 0xe1, 0xf9, 0x7e, 0x08], 0, 8), // vmovq [rax], xmm1 (VEX.W 7E)
        ];
        for &(code, off, len) in cases {
            let (mut cpu, mut mem) = vec_cpu();
            mem.data[0x100..0x140].fill(0xee);
            ok(code, &mut cpu, &mut mem);
            assert_eq!(
                mem.at(BASE + 0x100, len),
                &cpu.vec[1][off..off + len],
                "{code:02x?}"
            );
            assert!(
                mem.data[0x100 + len..0x140].iter().all(|&b| b == 0xee),
                "{code:02x?}"
            );
        }
        // Upper registers through REX.R / VEX.R: movups [rax], xmm9 / vmovups [rax], ymm12
        let (mut cpu, mut mem) = vec_cpu();
        ok(&[0x44, 0x0f, 0x11, 0x08], &mut cpu, &mut mem);
        assert_eq!(mem.at(BASE + 0x100, 16), &cpu.vec[9][..16]);
        ok(&[0xc5, 0x7c, 0x11, 0x20], &mut cpu, &mut mem);
        assert_eq!(mem.at(BASE + 0x100, 32), &cpu.vec[12][..]);
    }

    #[test]
    fn vector_alignment_state_and_register_destinations() {
        let (mut cpu, mut mem) = vec_cpu();
        cpu.gpr[RAX] = BASE + 0x108;
        refused(&[0x0f, 0x29, 0x08], &mut cpu, &mut mem, Reason::MemoryFault); // movaps misaligned
        ok(&[0x0f, 0x11, 0x08], &mut cpu, &mut mem); // movups is fine
        cpu.gpr[RAX] = BASE + 0x110; // 16- but not 32-aligned
        ok(&[0x0f, 0x29, 0x08], &mut cpu, &mut mem);
        refused(
            &[0xc5, 0xfc, 0x29, 0x08],
            &mut cpu,
            &mut mem,
            Reason::MemoryFault,
        ); // vmovaps ymm
        refused(
            &[0xc5, 0xfd, 0xe7, 0x08],
            &mut cpu,
            &mut mem,
            Reason::MemoryFault,
        ); // vmovntdq ymm
        cpu.vec_ok = false;
        refused(&[0x0f, 0x11, 0x08], &mut cpu, &mut mem, Reason::VectorState);
        cpu.vec_ok = true;
        // Register destinations: movups xmm1, xmm2 (0f 11 d1) / movd eax, xmm1
        refused(
            &[0x0f, 0x11, 0xd1],
            &mut cpu,
            &mut mem,
            Reason::NoMemoryWrite,
        );
        refused(
            &[0x66, 0x0f, 0x7e, 0xc8],
            &mut cpu,
            &mut mem,
            Reason::NoMemoryWrite,
        );
        // EVEX vmovups [rax], zmm1 and MMX movq [rax], mm1 are not emulated.
        refused(
            &[0x62, 0xf1, 0x7c, 0x48, 0x11, 0x08],
            &mut cpu,
            &mut mem,
            Reason::Unsupported,
        );
        refused(&[0x0f, 0x7f, 0x08], &mut cpu, &mut mem, Reason::Unsupported);
        // Loads are not stores: movups xmm1, [rax]
        refused(&[0x0f, 0x10, 0x08], &mut cpu, &mut mem, Reason::Unsupported);
    }

    // ---- string instructions -------------------------------------------

    /// Emulates until the instruction completes (REP may take several calls).
    fn run_to_completion(code: &[u8], cpu: &mut FakeCpu, mem: &mut FakeMem) -> usize {
        let start = cpu.rip;
        for calls in 1..1000 {
            assert_eq!(emulate(code, cpu, mem), Outcome::Emulated);
            if cpu.rip != start {
                assert_eq!(cpu.rip, start + code.len() as u64);
                return calls;
            }
        }
        panic!("REP instruction never completed");
    }

    #[test]
    fn rep_stosb_forward_and_backward() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = 0x1234_56ab;
        cpu.gpr[RDI] = BASE + 0x100;
        cpu.gpr[RCX] = 300;
        ok(&[0xf3, 0xaa], &mut cpu, &mut mem); // rep stosb
        assert!(mem.data[0x100..0x100 + 300].iter().all(|&b| b == 0xab));
        assert_eq!(mem.data[0xff], 0);
        assert_eq!(mem.data[0x100 + 300], 0);
        assert_eq!(cpu.gpr[RDI], BASE + 0x100 + 300);
        assert_eq!(cpu.gpr[RCX], 0);

        let (mut cpu, mut mem) = setup();
        cpu.rflags |= DF;
        cpu.gpr[RAX] = 0xcd;
        cpu.gpr[RDI] = BASE + 0x400;
        cpu.gpr[RCX] = 300;
        ok(&[0xf3, 0xaa], &mut cpu, &mut mem); // std; rep stosb
        let lo = 0x400 - 299;
        assert!(mem.data[lo..=0x400].iter().all(|&b| b == 0xcd));
        assert_eq!(mem.data[lo - 1], 0);
        assert_eq!(mem.data[0x401], 0);
        assert_eq!(cpu.gpr[RDI], BASE + 0x400 - 300);
        assert_eq!(cpu.gpr[RCX], 0);
        assert_eq!(cpu.rflags, 0x202 | DF);
    }

    #[test]
    fn stos_sizes_counts_and_pages() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = 0x0102_0304_0506_0708;
        cpu.gpr[RDI] = BASE + 0x10;
        cpu.gpr[RCX] = 5;
        ok(&[0xf3, 0x48, 0xab], &mut cpu, &mut mem); // rep stosq
        for i in 0..5 {
            assert_eq!(mem.get(BASE + 0x10 + 8 * i, 8), 0x0102_0304_0506_0708);
        }
        assert_eq!(cpu.gpr[RDI], BASE + 0x10 + 40);
        // rep stosw, DF=1, 3 elements
        cpu.rflags |= DF;
        cpu.gpr[RDI] = BASE + 0x100;
        cpu.gpr[RCX] = 3;
        ok(&[0x66, 0xf3, 0xab], &mut cpu, &mut mem);
        assert_eq!(mem.at(BASE + 0xfc, 6), &[8, 7, 8, 7, 8, 7]);
        assert_eq!(cpu.gpr[RDI], BASE + 0x100 - 6);
        cpu.rflags &= !DF;
        // stosd without REP ignores RCX.
        cpu.gpr[RDI] = BASE + 0x200;
        cpu.gpr[RCX] = 77;
        ok(&[0xab], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x200, 8), 0x0506_0708);
        assert_eq!(cpu.gpr[RDI], BASE + 0x204);
        assert_eq!(cpu.gpr[RCX], 77);
        // REPNE behaves as REP for STOS.
        cpu.gpr[RCX] = 2;
        ok(&[0xf2, 0xab], &mut cpu, &mut mem);
        assert_eq!(cpu.gpr[RCX], 0);
        assert_eq!(cpu.gpr[RDI], BASE + 0x20c);
        // RCX == 0: nothing written, RIP advanced.
        let before = mem.clone();
        cpu.gpr[RDI] = BASE + 0x300;
        ok(&[0xf3, 0xaa], &mut cpu, &mut mem);
        assert_eq!(mem, before);
        assert_eq!(cpu.gpr[RDI], BASE + 0x300);
        // Across a page boundary: completes over two calls.
        cpu.gpr[RDI] = BASE + 0x1000 - 10;
        cpu.gpr[RCX] = 100;
        let rip = cpu.rip;
        assert_eq!(
            emulate(&[0xf3, 0xaa], &mut cpu, &mut mem),
            Outcome::Emulated
        );
        assert_eq!(
            (cpu.rip, cpu.gpr[RCX], cpu.gpr[RDI]),
            (rip, 90, BASE + 0x1000)
        );
        assert_eq!(run_to_completion(&[0xf3, 0xaa], &mut cpu, &mut mem), 1);
        assert!(mem.data[0x1000 - 10..0x1000 + 90]
            .iter()
            .all(|&b| b == 0x08));
        assert_eq!(cpu.gpr[RCX], 0);
        // Fault on the first element: nothing happens.
        cpu.gpr[RDI] = BASE + MEM_LEN as u64;
        cpu.gpr[RCX] = 4;
        refused(&[0xf3, 0xaa], &mut cpu, &mut mem, Reason::MemoryFault);
        // Fault after some progress: partial, architecturally resumable.
        cpu.gpr[RDI] = BASE + MEM_LEN as u64 - 3;
        ok(&[0xaa], &mut cpu, &mut mem);
        let rip = cpu.rip;
        // FakeMem now ends 100 bytes before a page boundary; the second
        // 256-byte chunk straddles its end.
        mem.data.truncate(MEM_LEN - 100);
        cpu.gpr[RDI] = BASE + MEM_LEN as u64 - 400;
        cpu.gpr[RCX] = 1000;
        assert_eq!(
            emulate(&[0xf3, 0xaa], &mut cpu, &mut mem),
            Outcome::Emulated
        );
        assert_eq!(cpu.rip, rip);
        assert_eq!(cpu.gpr[RCX], 1000 - 256);
        assert_eq!(cpu.gpr[RDI], BASE + MEM_LEN as u64 - 400 + 256);
        // Resuming faults on the first element: NotEmulated, no change.
        refused(&[0xf3, 0xaa], &mut cpu, &mut mem, Reason::MemoryFault);
        // 32-bit addressing (67 f3 aa) is not emulated.
        refused(&[0x67, 0xf3, 0xaa], &mut cpu, &mut mem, Reason::Unsupported);
    }

    /// Element-by-element reference for MOVS.
    fn movs_reference(mem: &mut [u8], src: usize, dst: usize, size: usize, count: usize, df: bool) {
        for i in 0..count {
            let (s, d) = if df {
                (src - i * size, dst - i * size)
            } else {
                (src + i * size, dst + i * size)
            };
            let e = mem[s..s + size].to_vec();
            mem[d..d + size].copy_from_slice(&e);
        }
    }

    #[test]
    fn rep_movsb_basic() {
        let (mut cpu, mut mem) = setup();
        for (i, b) in mem.data.iter_mut().enumerate() {
            *b = i as u8 ^ 0x5a;
        }
        let expect: Vec<u8> = mem.data[0x100..0x100 + 600].to_vec();
        cpu.gpr[RSI] = BASE + 0x100;
        cpu.gpr[RDI] = BASE + 0x800;
        cpu.gpr[RCX] = 600;
        ok(&[0xf3, 0xa4], &mut cpu, &mut mem); // rep movsb
        assert_eq!(&mem.data[0x800..0x800 + 600], &expect[..]);
        assert_eq!(
            (cpu.gpr[RSI], cpu.gpr[RDI], cpu.gpr[RCX]),
            (BASE + 0x358, BASE + 0xa58, 0)
        );
        // Overlapping forward copy (dst = src + 1) replicates the first byte.
        cpu.gpr[RSI] = BASE + 0x200;
        cpu.gpr[RDI] = BASE + 0x201;
        cpu.gpr[RCX] = 50;
        let first = mem.data[0x200];
        ok(&[0xf3, 0xa4], &mut cpu, &mut mem);
        assert!(mem.data[0x200..0x200 + 51].iter().all(|&b| b == first));
        // movsq without REP, with an FS source override.
        cpu.fs = Some(BASE);
        cpu.gpr[RSI] = 0x300;
        cpu.gpr[RDI] = BASE + 0x3000;
        let v = mem.get(BASE + 0x300, 8);
        ok(&[0x64, 0x48, 0xa5], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x3000, 8), v);
        assert_eq!((cpu.gpr[RSI], cpu.gpr[RDI]), (0x308, BASE + 0x3008));
        cpu.fs = None;
        refused(&[0x64, 0x48, 0xa5], &mut cpu, &mut mem, Reason::Segment);
    }

    #[test]
    fn movs_matches_element_order() {
        let mut rng = SmallRng::seed_from_u64(7);
        let codes: [(&[u8], usize); 4] = [
            (&[0xf3, 0xa4], 1),
            (&[0xf3, 0x66, 0xa5], 2),
            (&[0xf3, 0xa5], 4),
            (&[0xf3, 0x48, 0xa5], 8),
        ];
        for _ in 0..2000 {
            let (code, size) = codes[rng.gen_range(0..4)];
            let df = rng.gen_bool(0.5);
            let count = rng.gen_range(0..700usize);
            let span = count * size;
            let (lo, hi) = if df {
                (span, MEM_LEN - size)
            } else {
                (0, MEM_LEN - span - size)
            };
            if lo > hi {
                continue;
            }
            let src = rng.gen_range(lo..=hi);
            let near = rng.gen_range(-40i64..40) as isize;
            let dst = if rng.gen_bool(0.5) {
                src.checked_add_signed(near)
                    .filter(|d| (lo..=hi).contains(d))
                    .unwrap_or(src)
            } else {
                rng.gen_range(lo..=hi)
            };
            let (mut cpu, mut mem) = setup();
            rng.fill(&mut mem.data[..]);
            let mut expect = mem.data.clone();
            movs_reference(&mut expect, src, dst, size, count, df);
            cpu.gpr[RSI] = BASE + src as u64;
            cpu.gpr[RDI] = BASE + dst as u64;
            cpu.gpr[RCX] = count as u64;
            if df {
                cpu.rflags |= DF;
            }
            run_to_completion(code, &mut cpu, &mut mem);
            assert!(
                mem.data == expect,
                "size {size} df {df} count {count} src {src:#x} dst {dst:#x}"
            );
            let delta = |a: usize| {
                if df {
                    BASE + a as u64 - span as u64
                } else {
                    BASE + (a + span) as u64
                }
            };
            assert_eq!(
                (cpu.gpr[RSI], cpu.gpr[RDI], cpu.gpr[RCX]),
                (delta(src), delta(dst), 0)
            );
        }
    }

    // ---- arithmetic ----------------------------------------------------

    const BIN_OPS: [Alu; 7] = [
        Alu::Add,
        Alu::Or,
        Alu::Adc,
        Alu::Sbb,
        Alu::And,
        Alu::Sub,
        Alu::Xor,
    ];
    const UN_OPS: [Alu; 4] = [Alu::Inc, Alu::Dec, Alu::Neg, Alu::Not];

    /// Runs `op` natively with a *memory* destination on a stack cell;
    /// returns (cell after, rflags).
    fn native_rmw(op: Alu, size: usize, init: u64, src: u64, cf: bool) -> (u64, u64) {
        let mut cell: u64 = init;
        let p: *mut u64 = &mut cell;
        macro_rules! bin {
            ($t:expr) => {{
                let fl: u64;
                // SAFETY: `p` points to a live, aligned u64 on our stack; the
                // pushfq/pop pair is balanced and the block is not `nostack`.
                unsafe {
                    core::arch::asm!("bt {cf}, 0", $t, "pushfq", "pop {fl}",
                        p = in(reg) p, s = in(reg) src, cf = in(reg) u64::from(cf), fl = lateout(reg) fl);
                }
                fl
            }};
        }
        macro_rules! un {
            ($t:expr) => {{
                let fl: u64;
                // SAFETY: as in `bin!`.
                unsafe {
                    core::arch::asm!("bt {cf}, 0", $t, "pushfq", "pop {fl}",
                        p = in(reg) p, cf = in(reg) u64::from(cf), fl = lateout(reg) fl);
                }
                fl
            }};
        }
        macro_rules! b {
            ($mn:literal) => {
                match size {
                    1 => bin!(concat!($mn, " byte ptr [{p}], {s:l}")),
                    2 => bin!(concat!($mn, " word ptr [{p}], {s:x}")),
                    4 => bin!(concat!($mn, " dword ptr [{p}], {s:e}")),
                    _ => bin!(concat!($mn, " qword ptr [{p}], {s}")),
                }
            };
        }
        macro_rules! u {
            ($mn:literal) => {
                match size {
                    1 => un!(concat!($mn, " byte ptr [{p}]")),
                    2 => un!(concat!($mn, " word ptr [{p}]")),
                    4 => un!(concat!($mn, " dword ptr [{p}]")),
                    _ => un!(concat!($mn, " qword ptr [{p}]")),
                }
            };
        }
        let fl = match op {
            Alu::Add => b!("add"),
            Alu::Or => b!("or"),
            Alu::Adc => b!("adc"),
            Alu::Sbb => b!("sbb"),
            Alu::And => b!("and"),
            Alu::Sub => b!("sub"),
            Alu::Xor => b!("xor"),
            Alu::Cmp => b!("cmp"),
            Alu::Inc => u!("inc"),
            Alu::Dec => u!("dec"),
            Alu::Neg => u!("neg"),
            Alu::Not => u!("not"),
        };
        (cell, fl)
    }

    #[derive(Clone, Copy, Debug)]
    enum Form {
        Reg,
        Imm8,
        Imm,
    }

    /// Encodes `[lock] op <size> [rax], cl/cx/ecx/rcx | imm`; returns the
    /// bytes and the effective source value.
    fn encode(op: Alu, size: usize, form: Form, lock: bool, imm: u64) -> (Vec<u8>, Option<u64>) {
        let mut v = Vec::new();
        if lock {
            v.push(0xf0);
        }
        match size {
            2 => v.push(0x66),
            8 => v.push(0x48),
            _ => {}
        }
        let wide = u8::from(size != 1);
        let un = |digit: u8, v: &mut Vec<u8>, base: u8| {
            v.push(base + wide);
            v.push(digit << 3);
        };
        match op {
            Alu::Not => un(2, &mut v, 0xf6),
            Alu::Neg => un(3, &mut v, 0xf6),
            Alu::Inc => un(0, &mut v, 0xfe),
            Alu::Dec => un(1, &mut v, 0xfe),
            _ => {
                let idx = BIN_OPS.iter().position(|&o| o == op).unwrap() as u8;
                // add or adc sbb and sub xor cmp: digits 0 1 2 3 4 5 6 7.
                let digit = [0u8, 1, 2, 3, 4, 5, 6][idx as usize];
                match form {
                    Form::Reg => {
                        v.push(digit * 8 + wide);
                        v.push(0x08);
                        return (v, None);
                    }
                    Form::Imm8 if size != 1 => {
                        v.extend_from_slice(&[0x83, digit << 3, imm as u8]);
                        return (v, Some(sext(imm, 1) as u64 & mask(size)));
                    }
                    _ => {
                        v.push(if size == 1 { 0x80 } else { 0x81 });
                        v.push(digit << 3);
                        let n = size.min(4);
                        v.extend_from_slice(&imm.to_le_bytes()[..n]);
                        return (v, Some(sext(imm, n) as u64 & mask(size)));
                    }
                }
            }
        }
        (v, None)
    }

    fn interesting(rng: &mut SmallRng, size: usize) -> u64 {
        let m = mask(size);
        let half = m >> 1;
        match rng.gen_range(0..8) {
            0 => 0,
            1 => 1,
            2 => m,
            3 => half,
            4 => half + 1,
            5 => rng.gen_range(0..16),
            6 => m - rng.gen_range(0..16),
            _ => rng.gen::<u64>() & m,
        }
    }

    #[test]
    fn rmw_matches_native_execution() {
        let (mut cpu, mut mem) = setup();
        let mut rng = SmallRng::seed_from_u64(1);
        for op in BIN_OPS.iter().chain(UN_OPS.iter()).copied() {
            for size in [1usize, 2, 4, 8] {
                for form in [Form::Reg, Form::Imm8, Form::Imm] {
                    for _ in 0..200 {
                        let lock = rng.gen_bool(0.5);
                        let dst = interesting(&mut rng, size);
                        let imm = interesting(&mut rng, size);
                        let (code, imm_src) = encode(op, size, form, lock, imm);
                        let reg_src = interesting(&mut rng, size);
                        let src = imm_src.unwrap_or(reg_src);
                        let cf = rng.gen_bool(0.5);
                        let fl_in =
                            0x202 | u64::from(cf) | (rng.gen::<u64>() & (STATUS | DF) & !CF);
                        let addr = BASE + rng.gen_range(0..0x100);
                        let garbage = rng.gen::<u64>();
                        mem.put(addr, 8, garbage);
                        mem.put(addr, size, dst);
                        cpu.gpr[RAX] = addr;
                        cpu.gpr[RCX] = (rng.gen::<u64>() & !mask(size)) | reg_src;
                        cpu.rflags = fl_in;
                        let before = cpu.clone();
                        ok(&code, &mut cpu, &mut mem);

                        let (native, native_fl) = native_rmw(op, size, dst, src, cf);
                        let what = format!(
                            "{op:?} size {size} {form:?} dst {dst:#x} src {src:#x} cf {cf}"
                        );
                        assert_eq!(mem.get(addr, size), native & mask(size), "{what}");
                        let rest = garbage & !mask(size);
                        assert_eq!(mem.get(addr, 8) & !mask(size), rest, "{what}");
                        let defined = op.flags();
                        assert_eq!(cpu.rflags & defined, native_fl & defined, "{what}");
                        assert_eq!(cpu.rflags & !defined, fl_in & !defined, "{what}");
                        assert_eq!(cpu.gpr, before.gpr, "{what}");
                        if matches!(op, Alu::Inc | Alu::Dec | Alu::Neg | Alu::Not) {
                            break;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn documented_flag_values() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE;
        let mut add8 = |init: u8, src: u8, cpu: &mut FakeCpu| {
            mem.data[0] = init;
            cpu.gpr[RCX] = u64::from(src);
            ok(&[0x00, 0x08], cpu, &mut mem); // add [rax], cl
            (mem.data[0], cpu.rflags & STATUS)
        };
        assert_eq!(add8(0x7f, 1, &mut cpu), (0x80, OF | SF | AF)); // 0x80 has odd parity
        assert_eq!(add8(0xff, 1, &mut cpu), (0x00, CF | ZF | AF | PF));
        assert_eq!(add8(0x01, 0x02, &mut cpu), (0x03, PF));
        assert_eq!(add8(0x80, 0x80, &mut cpu), (0x00, CF | OF | ZF | PF));
        // sub dword [rax], 1 on 0 -> borrow
        mem.put(BASE, 4, 0);
        ok(&[0x83, 0x28, 0x01], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE, 4), 0xffff_ffff);
        assert_eq!(cpu.rflags & STATUS, CF | SF | AF | PF);
        // inc keeps CF; dec to zero sets ZF
        cpu.rflags = 0x202 | CF;
        mem.put(BASE, 8, 1);
        ok(&[0x48, 0xff, 0x08], &mut cpu, &mut mem); // dec qword [rax]
        assert_eq!(mem.get(BASE, 8), 0);
        assert_eq!(cpu.rflags & STATUS, CF | ZF | PF);
        // not leaves flags alone
        cpu.rflags = 0x202 | OF | SF;
        ok(&[0xf7, 0x10], &mut cpu, &mut mem); // not dword [rax]
        assert_eq!(mem.get(BASE, 8), 0xffff_ffff);
        assert_eq!(cpu.rflags, 0x202 | OF | SF);
        // 8-bit high register source: add [rax], ah
        mem.data[8] = 1;
        cpu.gpr[RAX] = BASE + 8;
        let ah = ((BASE + 8) >> 8) as u8;
        ok(&[0x00, 0x20], &mut cpu, &mut mem);
        assert_eq!(mem.data[8], ah.wrapping_add(1));
    }

    #[test]
    fn lock_add_and_xadd() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE + 0x40;
        cpu.gpr[RCX] = 0xffff_ffff_0000_0005;
        mem.put(BASE + 0x40, 4, 0xffff_fffe);
        ok(&[0xf0, 0x01, 0x08], &mut cpu, &mut mem); // lock add [rax], ecx
        assert_eq!(mem.get(BASE + 0x40, 8), 3);
        assert_eq!(cpu.rflags & STATUS, CF | PF | AF);
        // lock xadd [rax], ecx: ecx <- old (zero-extended), mem <- old + ecx
        cpu.gpr[RCX] = 0xffff_ffff_0000_0010;
        ok(&[0xf0, 0x0f, 0xc1, 0x08], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x40, 8), 0x13);
        assert_eq!(cpu.gpr[RCX], 3);
        assert_eq!(cpu.rflags & STATUS, 0);
        // xadd [rax], dh (no lock): only DH changes in RDX
        mem.data[0x40] = 0x70;
        cpu.gpr[RDX] = 0x1111_2222_3333_1044; // DH = 0x10
        ok(&[0x0f, 0xc0, 0x30], &mut cpu, &mut mem); // xadd [rax], dh
        assert_eq!(mem.data[0x40], 0x80);
        assert_eq!(cpu.gpr[RDX], 0x1111_2222_3333_7044);
        assert_eq!(cpu.rflags & STATUS, OF | SF);
        // xadd qword
        mem.put(BASE + 0x40, 8, u64::MAX);
        cpu.gpr[RCX] = 1;
        ok(&[0xf0, 0x48, 0x0f, 0xc1, 0x08], &mut cpu, &mut mem);
        assert_eq!((mem.get(BASE + 0x40, 8), cpu.gpr[RCX]), (0, u64::MAX));
        assert_eq!(cpu.rflags & STATUS, CF | ZF | PF | AF);
    }

    #[test]
    fn cmpxchg_success_and_failure() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RBX] = BASE + 0x80;
        mem.put(BASE + 0x80, 8, 0xaaaa_bbbb_0000_0042);
        // lock cmpxchg [rbx], ecx with EAX == [rbx]: store, ZF=1, RAX kept
        cpu.gpr[RAX] = 0x7777_0000_0000_0042;
        cpu.gpr[RCX] = 0x99;
        ok(&[0xf0, 0x0f, 0xb1, 0x0b], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x80, 8), 0xaaaa_bbbb_0000_0099);
        assert_eq!(cpu.gpr[RAX], 0x7777_0000_0000_0042);
        assert_eq!(cpu.rflags & STATUS, ZF | PF);
        // failure: EAX <- [rbx] zero-extended, ZF=0, memory unchanged
        ok(&[0xf0, 0x0f, 0xb1, 0x0b], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x80, 8), 0xaaaa_bbbb_0000_0099);
        assert_eq!(cpu.gpr[RAX], 0x99);
        let (_, cmp_fl) = native_rmw(Alu::Cmp, 4, 0x42, 0x99, false);
        assert_eq!(cpu.rflags & STATUS, cmp_fl & STATUS);
        assert_eq!(cpu.rflags & ZF, 0);
        // 8-bit without LOCK: cmpxchg [rbx], dl with AL
        cpu.gpr[RAX] = 0x1234_5699;
        cpu.gpr[RDX] = 0x55;
        ok(&[0x0f, 0xb0, 0x13], &mut cpu, &mut mem);
        assert_eq!(mem.data[0x80], 0x55);
        assert_eq!(cpu.gpr[RAX], 0x1234_5699);
        ok(&[0x0f, 0xb0, 0x13], &mut cpu, &mut mem); // fails: AL <- 0x55
        assert_eq!(cpu.gpr[RAX], 0x1234_5655);
        // 64-bit
        cpu.gpr[RAX] = 0xaaaa_bbbb_0000_0055;
        cpu.gpr[RCX] = u64::MAX;
        ok(&[0xf0, 0x48, 0x0f, 0xb1, 0x0b], &mut cpu, &mut mem);
        assert_eq!(mem.get(BASE + 0x80, 8), u64::MAX);
        assert_ne!(cpu.rflags & ZF, 0);
    }

    #[test]
    fn xchg_memory() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE + 0x10;
        cpu.gpr[RCX] = 0x1111_2222_3333_4444;
        mem.put(BASE + 0x10, 8, 0x5555_6666_7777_8888);
        let fl = cpu.rflags;
        ok(&[0x48, 0x87, 0x08], &mut cpu, &mut mem); // xchg [rax], rcx
        assert_eq!(mem.get(BASE + 0x10, 8), 0x1111_2222_3333_4444);
        assert_eq!(cpu.gpr[RCX], 0x5555_6666_7777_8888);
        ok(&[0x87, 0x08], &mut cpu, &mut mem); // xchg [rax], ecx: zero-extends
        assert_eq!(cpu.gpr[RCX], 0x3333_4444);
        assert_eq!(mem.get(BASE + 0x10, 8), 0x1111_2222_7777_8888);
        cpu.gpr[RBX] = 0xab00;
        ok(&[0x86, 0x38], &mut cpu, &mut mem); // xchg [rax], bh
        assert_eq!(cpu.gpr[RBX], 0x8800);
        assert_eq!(mem.data[0x10], 0xab);
        assert_eq!(cpu.rflags, fl);
    }

    #[test]
    fn bit_test_and_modify() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE + 0x100;
        cpu.gpr[RCX] = 35;
        ok(&[0x0f, 0xab, 0x08], &mut cpu, &mut mem); // bts dword [rax], ecx
        assert_eq!(mem.get(BASE + 0x104, 4), 1 << 3);
        assert_eq!(cpu.rflags & CF, 0);
        ok(&[0x0f, 0xab, 0x08], &mut cpu, &mut mem);
        assert_eq!(cpu.rflags & CF, CF);
        cpu.gpr[RCX] = u64::MAX; // -1: bit 31 of the dword below
        ok(&[0x0f, 0xbb, 0x08], &mut cpu, &mut mem); // btc dword [rax], ecx
        assert_eq!(mem.get(BASE + 0xfc, 4), 0x8000_0000);
        assert_eq!(cpu.rflags & CF, 0);
        mem.put(BASE + 0x100, 8, u64::MAX);
        ok(&[0xf0, 0x48, 0x0f, 0xba, 0x30, 0x45], &mut cpu, &mut mem); // lock btr qword [rax], 0x45
        assert_eq!(mem.get(BASE + 0x100, 8), !(1u64 << 5));
        assert_eq!(cpu.rflags & CF, CF);
    }

    // ---- refusals --------------------------------------------------------

    #[test]
    fn unsupported_leaves_everything_unchanged() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE + 0x10;
        cpu.gpr[4] = BASE + 0x800;
        mem.data
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        for code in [
            &[0x48, 0x0f, 0xc7, 0x08][..],         // cmpxchg16b [rax]
            &[0x0f, 0xc7, 0x08],                   // cmpxchg8b [rax]
            &[0xff, 0x30],                         // push qword [rax]
            &[0x50],                               // push rax
            &[0xdd, 0x18],                         // fstp qword [rax]
            &[0x0f, 0xae, 0x00],                   // fxsave [rax]
            &[0x0f, 0x0b],                         // ud2
            &[0x8c, 0x18],                         // mov [rax], ds
            &[0x66, 0x0f, 0x3a, 0x16, 0x00, 0x01], // pextrd [rax], xmm0, 1
            &[0xc4, 0xe2, 0x79, 0x8e, 0x00],       // vpmaskmovd [rax], xmm0, xmm0
        ] {
            refused(code, &mut cpu, &mut mem, Reason::Unsupported);
        }
        for code in [
            &[0x89, 0xd8][..],   // mov eax, ebx
            &[0x03, 0x08],       // add ecx, [rax]
            &[0x8b, 0x08],       // mov ecx, [rax]
            &[0x39, 0x08],       // cmp [rax], ecx
            &[0x01, 0xc8],       // add eax, ecx
            &[0x0f, 0xb1, 0xc8], // cmpxchg eax, ecx
            &[0x0f, 0x94, 0xc0], // sete al
            &[0x87, 0xc8],       // xchg eax, ecx
        ] {
            refused(code, &mut cpu, &mut mem, Reason::NoMemoryWrite);
        }
        // Memory faults: target outside FakeMem.
        cpu.gpr[RAX] = 0x10;
        for code in [
            &[0x89, 0x08][..],   // mov [rax], ecx
            &[0xf0, 0x01, 0x08], // lock add [rax], ecx
            &[0x01, 0x08],       // add [rax], ecx
            &[0x0f, 0xb1, 0x08], // cmpxchg [rax], ecx
            &[0x87, 0x08],       // xchg [rax], ecx
            &[0x0f, 0x11, 0x08], // movups [rax], xmm1
        ] {
            refused(code, &mut cpu, &mut mem, Reason::MemoryFault);
        }
        // Straddling the end of FakeMem: all-or-nothing.
        cpu.gpr[RAX] = BASE + MEM_LEN as u64 - 2;
        refused(&[0x89, 0x08], &mut cpu, &mut mem, Reason::MemoryFault);
    }

    #[test]
    fn garbage_and_truncated_bytes() {
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE;
        for code in [
            &[][..],
            &[0x89],             // truncated modrm
            &[0xc7, 0x00, 0x78], // truncated imm32
            &[0x48],             // lone REX
            &[0xf0, 0x89, 0x18], // lock mov: #UD
            &[0xf0, 0x01, 0xc8], // lock add eax, ecx: #UD
            &[0x06],             // push es: invalid in 64-bit mode
            &[0x66; 15],         // prefixes only
            &[0xc5],             // truncated VEX
        ] {
            refused(code, &mut cpu, &mut mem, Reason::Undecodable);
            assert_eq!(write_target(code, &cpu), None);
        }
        // Longer slices are fine: only the first instruction counts.
        cpu.gpr[RCX] = 7;
        let long = [0xffu8; 17];
        let long = [&[0x89, 0x08][..], &long[..]].concat();
        assert_eq!(emulate(&long, &mut cpu, &mut mem), Outcome::Emulated); // mov [rax], ecx
        assert_eq!(cpu.rip, CODE + 2);
        assert_eq!(mem.get(BASE, 4), 7);
    }

    #[test]
    fn write_targets() {
        let (mut cpu, _) = setup();
        cpu.gpr[RAX] = BASE + 0x40;
        cpu.gpr[RCX] = 10;
        cpu.gpr[RDI] = BASE + 0x100;
        assert_eq!(write_target(&[0x89, 0x08], &cpu), Some((BASE + 0x40, 4)));
        assert_eq!(
            write_target(&[0x48, 0x0f, 0xc7, 0x08], &cpu),
            Some((BASE + 0x40, 16))
        );
        assert_eq!(write_target(&[0xdd, 0x18], &cpu), Some((BASE + 0x40, 8)));
        assert_eq!(
            write_target(&[0xc5, 0xfe, 0x7f, 0x08], &cpu),
            Some((BASE + 0x40, 32))
        );
        assert_eq!(
            write_target(&[0x0f, 0xae, 0x00], &cpu),
            Some((BASE + 0x40, 512))
        );
        assert_eq!(
            write_target(&[0xf3, 0x48, 0xab], &cpu),
            Some((BASE + 0x100, 80))
        );
        assert_eq!(write_target(&[0x48, 0xab], &cpu), Some((BASE + 0x100, 8)));
        cpu.rflags |= DF;
        assert_eq!(
            write_target(&[0xf3, 0x48, 0xab], &cpu),
            Some((BASE + 0x100 - 72, 80))
        );
        assert_eq!(
            write_target(&[0xf3, 0xa4], &cpu),
            Some((BASE + 0x100 - 9, 10))
        );
        cpu.gpr[RCX] = 0;
        assert_eq!(write_target(&[0xf3, 0xa4], &cpu), None);
        assert_eq!(write_target(&[0x39, 0x08], &cpu), None); // cmp [rax], ecx
        assert_eq!(write_target(&[0xff, 0x30], &cpu), None); // push qword [rax]
        assert_eq!(write_target(&[0x8b, 0x08], &cpu), None); // mov ecx, [rax]
        assert_eq!(write_target(&[0x0f, 0x18, 0x08], &cpu), None); // prefetcht0 [rax]
        assert_eq!(write_target(&[0x64, 0x89, 0x08], &cpu), None); // unknown FS base
        cpu.fs = Some(0x1000);
        assert_eq!(
            write_target(&[0x64, 0x89, 0x08], &cpu),
            Some((BASE + 0x1040, 4))
        );
        // movdir64b rax, [rcx]: 66 0f 38 f8 01 -> 64 bytes at RAX
        assert_eq!(
            write_target(&[0x66, 0x0f, 0x38, 0xf8, 0x01], &cpu),
            Some((BASE + 0x40, 64))
        );
        // pop qword [rsp+8]: address uses RSP after the pop
        cpu.gpr[4] = BASE + 0x200;
        assert_eq!(
            write_target(&[0x8f, 0x44, 0x24, 0x08], &cpu),
            Some((BASE + 0x210, 8))
        );
    }

    // ---- fuzz ------------------------------------------------------------

    #[test]
    fn fuzz_random_bytes() {
        prepare();
        let mut rng = SmallRng::seed_from_u64(0x5eed);
        // Bias the first bytes towards interesting opcodes and prefixes.
        const HOT: &[u8] = &[
            0x88, 0x89, 0xc6, 0xc7, 0x80, 0x81, 0x83, 0x00, 0x01, 0x08, 0x09, 0x10, 0x11, 0x18,
            0x19, 0x20, 0x21, 0x28, 0x29, 0x30, 0x31, 0x0f, 0xf6, 0xf7, 0xfe, 0xff, 0x86, 0x87,
            0xaa, 0xab, 0xa4, 0xa5, 0xa2, 0xa3, 0xf0, 0xf2, 0xf3, 0x66, 0x67, 0x48, 0x4c, 0x41,
            0x64, 0x65, 0xc4, 0xc5, 0x62,
        ];
        const HOT_0F: &[u8] = &[
            0x11, 0x13, 0x17, 0x29, 0x2b, 0x7e, 0x7f, 0xd6, 0xe7, 0xc3, 0xc0, 0xc1, 0xb0, 0xb1,
            0xab, 0xb3, 0xbb, 0xba, 0x94, 0x9c, 0x38, 0xc7,
        ];
        // Interpreted instructions (rel8/imm8 operands appended at random).
        const SNIPPETS: &[&[u8]] = &[
            &[0x48, 0xff, 0xc1],       // inc rcx
            &[0x48, 0x39, 0xf1],       // cmp rcx, rsi
            &[0x72],                   // jb rel8
            &[0x75],                   // jne rel8
            &[0xeb],                   // jmp rel8
            &[0xe2],                   // loop rel8
            &[0xe3],                   // jrcxz rel8
            &[0x88, 0x0c, 0x0f],       // mov [rdi+rcx], cl
            &[0x89, 0x04, 0x8f],       // mov [rdi+rcx*4], eax
            &[0x01, 0xc8],             // add eax, ecx
            &[0x8b, 0x07],             // mov eax, [rdi]
            &[0x0f, 0xb6, 0x04, 0x0e], // movzx eax, byte [rsi+rcx]
            &[0x48, 0xc1, 0xe0],       // shl rax, imm8
            &[0xd3, 0xf8],             // sar eax, cl
            &[0x0f, 0xaf, 0xc1],       // imul eax, ecx
            &[0x0f, 0x44, 0x07],       // cmove eax, [rdi]
            &[0x0f, 0x9c, 0xc4],       // setl ah
            &[0x80, 0x3f],             // cmp byte [rdi], imm8
            &[0xf3, 0xaa],             // rep stosb
            &[0x48, 0x0f, 0xc8],       // bswap rax
            &[0x87, 0xd1],             // xchg ecx, edx
            &[0x90],                   // nop
            &[0x0f, 0x1f, 0x40, 0x00], // nop dword [rax]
            &[0xf0, 0x48, 0x01, 0x07], // lock add [rdi], rax
            &[0x48, 0x8d, 0x7f, 0x01], // lea rdi, [rdi+1]
        ];
        let mut emulated = 0;
        let mut continued = 0;
        for _ in 0..10_000 {
            let mut code = [0u8; 15];
            rng.fill(&mut code[..]);
            let mut i = 0;
            while i < 4 && rng.gen_bool(0.7) {
                code[i] = HOT[rng.gen_range(0..HOT.len())];
                if code[i] == 0x0f && i + 1 < 15 {
                    code[i + 1] = HOT_0F[rng.gen_range(0..HOT_0F.len())];
                    i += 1;
                }
                i += 1;
            }
            let len = if rng.gen_bool(0.1) {
                rng.gen_range(0..15)
            } else {
                15
            };
            let code = &code[..len];

            let mut cpu = FakeCpu::new();
            for r in cpu.gpr.iter_mut() {
                *r = match rng.gen_range(0..4) {
                    0 => rng.gen(),
                    1 => rng.gen_range(0..64),
                    _ => BASE + rng.gen_range(0..MEM_LEN as u64),
                };
            }
            cpu.gpr[RCX] = if rng.gen_bool(0.5) {
                rng.gen_range(0..2000)
            } else {
                cpu.gpr[RCX]
            };
            cpu.rip = if rng.gen_bool(0.5) {
                BASE + rng.gen_range(0..MEM_LEN as u64)
            } else {
                rng.gen()
            };
            cpu.rflags = 0x202 | (rng.gen::<u64>() & (STATUS | DF));
            for v in cpu.vec.iter_mut() {
                rng.fill(&mut v[..]);
            }
            cpu.vec_ok = rng.gen_bool(0.9);
            cpu.fs = rng
                .gen_bool(0.5)
                .then(|| BASE + rng.gen_range(0..MEM_LEN as u64));
            cpu.gs = rng.gen_bool(0.5).then(|| rng.gen());
            let mut mem = FakeMem::new();
            rng.fill(&mut mem.data[..]);

            let (c0, m0) = (cpu.clone(), mem.clone());
            let _ = write_target(code, &cpu);

            // The continuation: the same first instruction, then code mixing
            // interpreted snippets and random bytes.
            let first_len = decode(code, cpu.rip).map_or(code.len(), |i| i.len());
            let mut region = code[..first_len].to_vec();
            while region.len() < 160 {
                if rng.gen_bool(0.8) {
                    let s = SNIPPETS[rng.gen_range(0..SNIPPETS.len())];
                    region.extend_from_slice(s);
                    if s.len() == 1 || matches!(s.last(), Some(0x80..)) {
                        // A rel8/imm8 for branch and shift snippets.
                        region.push(rng.gen());
                    }
                } else {
                    region.push(rng.gen());
                }
            }
            let (mut c1, mut m1) = (c0.clone(), m0.clone());
            m1.hot = rng.gen_bool(0.7);
            let budget = rng.gen_range(0..200);
            let idle = rng.gen_range(0..20);
            let expect = emulate(code, &mut c0.clone(), &mut m0.clone());
            let first = code;
            let at = c1.rip;
            let mut fetch = |ip: u64, buf: &mut [u8; 15]| {
                let Some(off) = ip.checked_sub(at).filter(|&o| o < region.len() as u64) else {
                    return 0;
                };
                let src = &region[off as usize..];
                let n = src.len().min(15);
                buf[..n].copy_from_slice(&src[..n]);
                n
            };
            match run(first, &mut fetch, &mut c1, &mut m1, budget, idle) {
                (n, Stop::NotEmulated(r)) => {
                    assert_eq!(n, 0);
                    assert_eq!(Outcome::NotEmulated(r), expect, "{code:02x?}");
                    assert_eq!(c1, c0, "{code:02x?} {r:?}");
                    assert!(m1.data == m0.data, "{code:02x?} {r:?}");
                }
                (n, why) => {
                    assert_eq!(expect, Outcome::Emulated, "{code:02x?}");
                    assert!(n >= 1 && n <= budget.max(1), "{n} {why:?}");
                    assert!(why != Stop::Budget || n == budget.max(1));
                    assert!(why != Stop::Idle || n >= idle);
                    assert_eq!(c1.vec, c0.vec);
                    if n > 1 {
                        continued += 1;
                    }
                }
            }

            match emulate(code, &mut cpu, &mut mem) {
                Outcome::NotEmulated(r) => {
                    assert_eq!(cpu, c0, "{code:02x?} {r:?}");
                    assert!(mem == m0, "{code:02x?} {r:?}");
                }
                Outcome::Emulated => {
                    emulated += 1;
                    // Either completed or a partial REP (RIP unchanged).
                    let len = decode(code, c0.rip).unwrap().len() as u64;
                    assert!(
                        cpu.rip == c0.rip.wrapping_add(len) || cpu.rip == c0.rip,
                        "{code:02x?}"
                    );
                    assert_eq!(cpu.vec, c0.vec);
                }
            }
        }
        assert!(
            emulated > 500,
            "only {emulated} emulated: the fuzzer is not reaching stores"
        );
        assert!(
            continued > 300,
            "only {continued} runs went past the first instruction"
        );
    }

    // ---- continuation (`run`) ------------------------------------------

    /// A register file for [`Harness`]: RAX..R15 (RSP unused) and RFLAGS.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct RegFile {
        gpr: [u64; 16],
        flags: u64,
    }

    /// Runs machine code natively on a [`RegFile`]: an executable page
    /// holding "load flags and registers; <code>; store them; ret".
    struct Harness {
        map: Mapping,
    }

    const HARNESS_LEN: usize = 4096;

    impl Harness {
        fn new() -> Self {
            let map = Mapping::anon(HARNESS_LEN).expect("mmap");
            map.protect(Prot::READ | Prot::WRITE | Prot::EXEC)
                .expect("mprotect RWX");
            Harness { map }
        }

        /// `mov reg, [rdi+off]` (opcode 0x8b) or `mov [rdi+off], reg` (0x89).
        fn rdi_rel(op: u8, reg: usize, off: usize) -> [u8; 4] {
            let rex = 0x48 | if reg >= 8 { 0x04 } else { 0 };
            [rex, op, 0x40 | ((reg as u8 & 7) << 3) | 7, off as u8]
        }

        fn prologue() -> Vec<u8> {
            // push rbx rbp r12 r13 r14 r15 rdi; push qword [rdi+0x80]; popfq
            let mut v = vec![
                0x53, 0x55, 0x41, 0x54, 0x41, 0x55, 0x41, 0x56, 0x41, 0x57, 0x57,
            ];
            v.extend_from_slice(&[0xff, 0xb7, 0x80, 0x00, 0x00, 0x00, 0x9d]);
            for r in (0..16).filter(|&r| r != 4 && r != 7) {
                v.extend_from_slice(&Self::rdi_rel(0x8b, r, r * 8));
            }
            v.extend_from_slice(&Self::rdi_rel(0x8b, 7, 7 * 8)); // rdi last
            v
        }

        fn epilogue() -> Vec<u8> {
            // pushfq; xchg rdi, [rsp+8]
            let mut v = vec![0x9c, 0x48, 0x87, 0x7c, 0x24, 0x08];
            for r in (0..16).filter(|&r| r != 4 && r != 7) {
                v.extend_from_slice(&Self::rdi_rel(0x89, r, r * 8));
            }
            // pop rax; mov [rdi+0x80], rax; pop rax; mov [rdi+0x38], rax
            v.extend_from_slice(&[0x58, 0x48, 0x89, 0x87, 0x80, 0x00, 0x00, 0x00]);
            v.extend_from_slice(&[0x58, 0x48, 0x89, 0x47, 0x38]);
            // pop r15 r14 r13 r12 rbp rbx; ret
            v.extend_from_slice(&[
                0x41, 0x5f, 0x41, 0x5e, 0x41, 0x5d, 0x41, 0x5c, 0x5d, 0x5b, 0xc3,
            ]);
            v
        }

        /// Where the code under test starts.
        fn code_addr(&self) -> u64 {
            self.map.addr() + Self::prologue().len() as u64
        }

        /// Runs `code` natively on `regs` (RSP is neither loaded nor
        /// stored; `code` must not touch the stack).
        fn run(&self, code: &[u8], regs: &mut RegFile) {
            let mut v = Self::prologue();
            v.extend_from_slice(code);
            v.extend_from_slice(&Self::epilogue());
            assert!(v.len() <= HARNESS_LEN);
            // SAFETY: the page is ours and large enough (asserted).
            unsafe { core::ptr::copy_nonoverlapping(v.as_ptr(), self.map.as_ptr(), v.len()) };
            // SAFETY: the page now holds a complete sysv64 function taking a
            // `*mut RegFile`, which preserves the callee-saved registers.
            let f: extern "sysv64" fn(*mut RegFile) =
                unsafe { core::mem::transmute(self.map.as_ptr()) };
            f(regs);
        }
    }

    /// Decodes `code` at `cpu.rip`, translates and executes it with the
    /// continuation interpreter.
    fn interpret(code: &[u8], cpu: &mut FakeCpu, mem: &mut FakeMem) -> Result<Op, Reason> {
        let instr = decode(code, cpu.rip).ok_or(Reason::Undecodable)?;
        let op = translate(&instr, code);
        step(&instr, op, cpu, mem)?;
        Ok(op)
    }

    /// Random register file: interesting values, random status flags.
    fn random_regs(rng: &mut SmallRng) -> RegFile {
        let mut r = RegFile::default();
        for v in r.gpr.iter_mut() {
            let size = [1, 2, 4, 8][rng.gen_range(0..4)];
            *v = match rng.gen_range(0..3) {
                0 => interesting(rng, size) | (rng.gen::<u64>() & !mask(size)),
                1 => interesting(rng, 8),
                _ => rng.gen(),
            };
        }
        r.flags = 0x202 | (rng.gen::<u64>() & STATUS);
        r
    }

    fn cpu_from(regs: &RegFile, rip: u64) -> FakeCpu {
        let mut cpu = FakeCpu::new();
        cpu.gpr = regs.gpr;
        cpu.rflags = regs.flags;
        cpu.rip = rip;
        cpu
    }

    /// Whether `instr` names RSP (any width) in a register operand or as a
    /// memory base/index: its native value in the harness is meaningless.
    fn uses_rsp(instr: &Instruction) -> bool {
        let rsp = |r: Register| gpr_of(r).is_some_and(|g| g.gpr() == RSP && !g.high);
        (0..instr.op_count())
            .any(|i| instr.op_kind(i) == OpKind::Register && rsp(instr.op_register(i)))
            || rsp(instr.memory_base())
            || rsp(instr.memory_index())
    }

    /// Emulated vs native: all registers but RSP, the status flags, RIP.
    #[track_caller]
    fn compare(code: &[u8], h: &Harness, regs: &RegFile, mem: &mut FakeMem) -> Op {
        let mut cpu = cpu_from(regs, h.code_addr());
        let op = interpret(code, &mut cpu, mem).unwrap_or_else(|r| panic!("{code:02x?}: {r:?}"));
        let mut native = *regs;
        h.run(code, &mut native);
        let what = format!("{code:02x?} {op:?} in {regs:x?}");
        for r in (0..16).filter(|&r| r != RSP) {
            assert_eq!(cpu.gpr[r], native.gpr[r], "gpr {r}: {what}");
        }
        assert_eq!(cpu.rflags & STATUS, native.flags & STATUS, "flags: {what}");
        assert_eq!(cpu.rflags & !STATUS, regs.flags & !STATUS, "{what}");
        assert_eq!(cpu.rip, h.code_addr() + code.len() as u64, "{what}");
        op
    }

    /// Random register-form encoding from the interpreted families (and
    /// some neighbours it must refuse), followed by random bytes that
    /// serve as immediates/SIB/displacement; cut to the decoded length.
    fn random_register_form(rng: &mut SmallRng) -> Vec<u8> {
        let mut v = Vec::new();
        if rng.gen_bool(0.3) {
            v.push(0x66);
        }
        if rng.gen_bool(0.1) {
            v.push(0x67); // matters for LEA only
        }
        if rng.gen_bool(0.6) {
            v.push(0x40 | rng.gen_range(0..16u8));
        }
        let modrm = 0xc0 | (rng.gen::<u8>() & 0x3f);
        let pick = |rng: &mut SmallRng, xs: &[u8]| xs[rng.gen_range(0..xs.len())];
        match rng.gen_range(0..21) {
            0 => {
                let k = rng.gen_range(0..8u8);
                v.extend_from_slice(&[(k << 3) | rng.gen_range(0..4), modrm]);
            }
            1 => v.push((rng.gen_range(0..8u8) << 3) | rng.gen_range(4..6)),
            2 => v.extend_from_slice(&[pick(rng, &[0x80, 0x81, 0x83]), modrm]),
            3 => v.extend_from_slice(&[rng.gen_range(0x84..0x8c), modrm]),
            4 => v.push(rng.gen_range(0x90..0x98)),
            5 => v.push(rng.gen_range(0xa8..0xaa)),
            6 => v.push(rng.gen_range(0xb0..0xc0)),
            7 => v.extend_from_slice(&[pick(rng, &[0xc6, 0xc7]), modrm & 0xc7]),
            8 => v.extend_from_slice(&[0x0f, pick(rng, &[0xb6, 0xb7, 0xbe, 0xbf]), modrm]),
            9 => v.extend_from_slice(&[0x63, modrm]),
            10 => v.extend_from_slice(&[0x8d, (rng.gen_range(0..3u8) << 6) | (modrm & 0x3f)]),
            11 => v.extend_from_slice(&[pick(rng, &[0xc0, 0xc1, 0xd0, 0xd1, 0xd2, 0xd3]), modrm]),
            12 => v.extend_from_slice(&[pick(rng, &[0xf6, 0xf7]), modrm]),
            13 => v.extend_from_slice(&[pick(rng, &[0xfe, 0xff]), modrm & 0xcf]),
            14 => v.extend_from_slice(&[0x0f, 0xaf, modrm]),
            15 => v.extend_from_slice(&[pick(rng, &[0x69, 0x6b]), modrm]),
            16 => v.extend_from_slice(&[0x0f, 0x40 + rng.gen_range(0..16), modrm]),
            17 => v.extend_from_slice(&[0x0f, 0x90 + rng.gen_range(0..16), modrm]),
            18 => v.extend_from_slice(&[0x0f, 0xc8 + rng.gen_range(0..8)]),
            19 => v = vec![0xf3, 0x0f, 0x1e, 0xfa],
            _ => v.extend_from_slice(&[0x0f, 0x1f, rng.gen::<u8>() & 0xc7]),
        }
        for _ in 0..10 {
            v.push(rng.gen());
        }
        v
    }

    #[test]
    fn register_forms_match_native() {
        prepare();
        let h = Harness::new();
        let mut rng = SmallRng::seed_from_u64(0xd1ff);
        let mut mem = FakeMem::new();
        let mut seen = std::collections::HashMap::<Mnemonic, usize>::new();
        let mut refused = 0;
        while seen.values().sum::<usize>() < 60_000 {
            let mut code = random_register_form(&mut rng);
            let Some(instr) = decode(&code, h.code_addr()) else {
                continue;
            };
            code.truncate(instr.len());
            let op = translate(&instr, &code);
            let memory = match op {
                Op::Mov { src, .. } | Op::Cmov { src, .. } => matches!(src, Src::Mem { .. }),
                Op::Arith { a, b, .. } => {
                    matches!(a, Src::Mem { .. }) || matches!(b, Src::Mem { .. })
                }
                _ => false,
            };
            if op == Op::Stop || op == Op::Store || memory || uses_rsp(&instr) {
                refused += 1;
                continue;
            }
            assert!(
                !matches!(op, Op::Jmp { .. } | Op::Jcc { .. } | Op::Loop { .. }),
                "{code:02x?}"
            );
            let regs = random_regs(&mut rng);
            compare(&code, &h, &regs, &mut mem);
            *seen.entry(instr.mnemonic()).or_default() += 1;
        }
        use Mnemonic as M;
        for m in [
            M::Mov,
            M::Movzx,
            M::Movsx,
            M::Movsxd,
            M::Lea,
            M::Add,
            M::Or,
            M::Adc,
            M::Sbb,
            M::And,
            M::Sub,
            M::Xor,
            M::Cmp,
            M::Test,
            M::Inc,
            M::Dec,
            M::Neg,
            M::Not,
            M::Shl,
            M::Sal,
            M::Shr,
            M::Sar,
            M::Rol,
            M::Ror,
            M::Imul,
            M::Cmove,
            M::Cmovl,
            M::Cmovp,
            M::Cmovo,
            M::Seta,
            M::Setle,
            M::Setnp,
            M::Bswap,
            M::Xchg,
            M::Nop,
            M::Endbr64,
        ] {
            assert!(seen.get(&m).copied().unwrap_or(0) > 30, "{m:?}: {seen:?}");
        }
        assert!(refused > 1000, "the generator never hits refused forms");
    }

    #[test]
    fn shifts_match_native_for_edge_counts() {
        prepare();
        let h = Harness::new();
        let mut rng = SmallRng::seed_from_u64(0x5417);
        let mut mem = FakeMem::new();
        for size in [1usize, 2, 4, 8] {
            let bits = 8 * size as u64;
            let counts = [0, 1, bits - 1, bits, bits + 1, 31, 32, 33, 63, 64, 65, 255];
            // /0 rol, /1 ror, /4 shl, /5 shr, /6 sal, /7 sar
            for digit in [0u8, 1, 4, 5, 6, 7] {
                for &count in &counts {
                    for form in 0..3 {
                        for _ in 0..20 {
                            let mut code = Vec::new();
                            match size {
                                2 => code.push(0x66),
                                8 => code.push(0x48),
                                _ => {}
                            }
                            let wide = u8::from(size != 1);
                            // RSP-family excluded (rm 4 is AH for bytes).
                            let rm = [0u8, 1, 2, 3, 5, 6, 7, 4]
                                [rng.gen_range(0..7 + usize::from(size == 1))];
                            let modrm = 0xc0 | (digit << 3) | rm;
                            let mut regs = random_regs(&mut rng);
                            match form {
                                0 => code.extend_from_slice(&[0xc0 | wide, modrm, count as u8]),
                                1 => {
                                    code.extend_from_slice(&[0xd2 | wide, modrm]);
                                    regs.gpr[RCX] = (regs.gpr[RCX] & !0xff) | (count & 0xff);
                                }
                                _ => {
                                    if count != 1 {
                                        continue;
                                    }
                                    code.extend_from_slice(&[0xd0 | wide, modrm]);
                                }
                            }
                            let op = compare(&code, &h, &regs, &mut mem);
                            assert!(matches!(op, Op::Arith { .. }), "{code:02x?} {op:?}");
                        }
                    }
                }
            }
        }
    }

    /// Memory-source forms `op r, [rbx(+rsi*s)+disp8]` read through
    /// `Memory`; the harness reads the same bytes natively.
    #[test]
    fn memory_sources_match_native() {
        prepare();
        let h = Harness::new();
        let mut rng = SmallRng::seed_from_u64(0x3e3);
        let mut buf = vec![0u8; 512];
        rng.fill(&mut buf[..]);
        let base = buf.as_ptr() as u64;
        let mut mem = FakeMem {
            base,
            data: buf.clone(),
            hot: false,
        };
        let mut ops: Vec<Vec<u8>> = Vec::new();
        for k in 0..8u8 {
            ops.push(vec![(k << 3) | 2]);
            ops.push(vec![(k << 3) | 3]);
        }
        for o in [
            &[0x38u8][..],
            &[0x39],
            &[0x84],
            &[0x85],
            &[0x8a],
            &[0x8b],
            &[0x63],
            &[0x0f, 0xb6],
            &[0x0f, 0xb7],
            &[0x0f, 0xbe],
            &[0x0f, 0xbf],
            &[0x0f, 0xaf],
            &[0x69],
            &[0x6b],
            &[0x80],
            &[0x81],
            &[0x83],
            &[0xf6],
            &[0xf7],
        ] {
            ops.push(o.to_vec());
        }
        for cc in 0..16u8 {
            ops.push(vec![0x0f, 0x40 + cc]);
        }
        let mut ran = 0;
        while ran < 20_000 {
            let mut code = Vec::new();
            if rng.gen_bool(0.3) {
                code.push(0x66);
            }
            if rng.gen_bool(0.6) {
                code.push(0x40 | rng.gen_range(0..16u8));
            }
            let op = &ops[rng.gen_range(0..ops.len())];
            code.extend_from_slice(op);
            let reg = rng.gen_range(0..8u8);
            // cmp/test with an immediate: /7 and /0.
            let reg = match op[0] {
                0x80 | 0x81 | 0x83 => 7,
                0xf6 | 0xf7 => 0,
                _ => reg,
            };
            if rng.gen_bool(0.5) {
                code.extend_from_slice(&[0x40 | (reg << 3) | 3, rng.gen()]); // [rbx+d8]
            } else {
                let scale = rng.gen_range(0..4u8);
                // [rbx+rsi*s+d8]
                code.extend_from_slice(&[
                    0x44 | (reg << 3),
                    (scale << 6) | (6 << 3) | 3,
                    rng.gen(),
                ]);
            }
            for _ in 0..8 {
                code.push(rng.gen());
            }
            let Some(instr) = decode(&code, h.code_addr()) else {
                continue;
            };
            code.truncate(instr.len());
            let op = translate(&instr, &code);
            if op == Op::Stop || uses_rsp(&instr) {
                continue;
            }
            let mut regs = random_regs(&mut rng);
            for r in [RBX, 11] {
                regs.gpr[r] = base + 128;
            }
            let idx = rng.gen_range(0..8);
            for r in [RSI, 14] {
                regs.gpr[r] = idx;
            }
            compare(&code, &h, &regs, &mut mem);
            ran += 1;
        }
        assert_eq!(mem.data, buf);
    }

    #[test]
    fn branches_match_native() {
        prepare();
        let h = Harness::new();
        let mut rng = SmallRng::seed_from_u64(0xb4);
        let mut mem = FakeMem::new();
        // Each branch skips `inc rax` (48 ff c0) when taken.
        let mut codes: Vec<Vec<u8>> = vec![vec![0xeb, 0x03], vec![0xe9, 3, 0, 0, 0]];
        for cc in 0..16u8 {
            codes.push(vec![0x70 | cc, 0x03]);
            codes.push(vec![0x0f, 0x80 | cc, 3, 0, 0, 0]);
        }
        codes.extend([
            vec![0xe3, 0x03],       // jrcxz
            vec![0x67, 0xe3, 0x03], // jecxz
            vec![0xe2, 0x03],       // loop
            vec![0xe1, 0x03],       // loope
            vec![0xe0, 0x03],       // loopne
            vec![0x3e, 0x74, 0x03], // ds (branch hint) je
            vec![0xf2, 0xeb, 0x03], // bnd jmp
        ]);
        for code in &codes {
            for _ in 0..200 {
                let mut regs = random_regs(&mut rng);
                regs.gpr[RAX] = 0;
                regs.gpr[RCX] = [0, 1, 2, 1 << 32, (1 << 32) + 1, rng.gen()][rng.gen_range(0..6)];
                let mut cpu = cpu_from(&regs, h.code_addr());
                let op = interpret(code, &mut cpu, &mut mem).unwrap();
                let mut full = code.clone();
                full.extend_from_slice(&[0x48, 0xff, 0xc0]);
                let mut native = regs;
                h.run(&full, &mut native);
                let taken = native.gpr[RAX] == 0;
                let next = h.code_addr() + code.len() as u64;
                assert_eq!(
                    cpu.rip,
                    if taken { next + 3 } else { next },
                    "{code:02x?} {op:?}"
                );
                assert_eq!(cpu.gpr[RCX], native.gpr[RCX], "{code:02x?}");
                assert_eq!(cpu.rflags, regs.flags, "{code:02x?}");
            }
        }
        // 0x66-prefixed branches (16-bit RIP on AMD), LOOP with ECX, and
        // indirect or stack-using control flow are refused.
        for code in [
            &[0x66, 0xeb, 0x03][..],
            &[0x66, 0x74, 0x03],
            &[0x66, 0x0f, 0x84, 3, 0, 0, 0],
            &[0x67, 0xe2, 0x03],
            &[0xe8, 0, 0, 0, 0],
            &[0xc3],
            &[0xff, 0xe0],
            &[0xff, 0x20],
            &[0x50],
            &[0x58],
            &[0x0f, 0x05],
            &[0xcd, 0x80],
            &[0xf3, 0x90], // pause
            &[0x0f, 0x0b],
            &[0x48, 0x83, 0xc4, 0x08],       // add rsp, 8
            &[0x48, 0x89, 0xc4],             // mov rsp, rax
            &[0x48, 0x8d, 0x64, 0x24, 0x08], // lea rsp, [rsp+8]
            &[0x48, 0x87, 0xe0],             // xchg rax, rsp
            &[0x48, 0x87, 0x20],             // xchg [rax], rsp
            &[0xf7, 0xe1],                   // mul ecx
            &[0xf7, 0xf9],                   // idiv ecx
            &[0xf7, 0xe9],                   // imul ecx (one operand)
            &[0xd1, 0xd0],                   // rcl eax, 1
            &[0x0f, 0xa3, 0xc8],             // bt eax, ecx
            &[0xf3, 0x0f, 0xb8, 0xc1],       // popcnt eax, ecx
            &[0x0f, 0xbc, 0xc1],             // bsf eax, ecx
            &[0x66, 0x0f, 0xc8],             // bswap ax
            &[0x66, 0x63, 0xc1],             // movsxd ax, cx
            &[0xa6],                         // cmpsb
            &[0xac],                         // lodsb
            &[0x0f, 0x18, 0x08],             // prefetcht0 [rax]
            &[0x0f, 0x0d, 0x08],             // prefetchw [rax]
            &[0x8c, 0xd8],                   // mov eax, ds
            &[0x0f, 0x10, 0x00],             // movups xmm0, [rax]
        ] {
            let instr = decode(code, CODE).unwrap();
            assert_eq!(translate(&instr, code), Op::Stop, "{code:02x?}");
        }
    }

    #[test]
    fn memory_source_addressing() {
        let (mut cpu, mut mem) = setup();
        rng_fill(&mut mem);
        let q = |mem: &FakeMem, a: u64| mem.get(a, 8);
        // mov al, [moffs64]
        let mut code = vec![0xa0];
        code.extend_from_slice(&(BASE + 0x33).to_le_bytes());
        cpu.gpr[RAX] = 0x1111_1111_1111_1111;
        interpret(&code, &mut cpu, &mut mem).unwrap();
        assert_eq!(
            cpu.gpr[RAX],
            0x1111_1111_1111_1100 | u64::from(mem.data[0x33])
        );
        // mov rax, fs:[0x28]: needs the FS base.
        let code = [0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0];
        assert_eq!(interpret(&code, &mut cpu, &mut mem), Err(Reason::Segment));
        cpu.fs = Some(BASE + 0x100);
        interpret(&code, &mut cpu, &mut mem).unwrap();
        assert_eq!(cpu.gpr[RAX], q(&mem, BASE + 0x128));
        // mov rdx, gs:[rax] without a GS base.
        assert_eq!(
            interpret(&[0x65, 0x48, 0x8b, 0x10], &mut cpu, &mut mem),
            Err(Reason::Segment)
        );
        // lea rax, fs:[rcx+0x10]: LEA ignores the segment.
        cpu.gpr[RCX] = 5;
        interpret(&[0x64, 0x48, 0x8d, 0x41, 0x10], &mut cpu, &mut mem).unwrap();
        assert_eq!(cpu.gpr[RAX], 0x15);
        // mov rcx, [rip+0x20]
        cpu.rip = BASE + 0x200;
        interpret(&[0x48, 0x8b, 0x0d, 0x20, 0, 0, 0], &mut cpu, &mut mem).unwrap();
        assert_eq!(cpu.gpr[RCX], q(&mem, BASE + 0x200 + 7 + 0x20));
        // mov ecx, [eax]: 32-bit addressing truncates.
        cpu.gpr[RAX] = 0xdead_0000_0000_0000 | (BASE + 0x40);
        interpret(&[0x67, 0x8b, 0x08], &mut cpu, &mut mem).unwrap();
        assert_eq!(cpu.gpr[RCX], q(&mem, BASE + 0x40) & 0xffff_ffff);
        // movsx rdx, word [rax+rcx*8-8] with a negative index.
        cpu.gpr[RAX] = BASE + 0x400;
        cpu.gpr[RCX] = (-3i64) as u64;
        interpret(&[0x48, 0x0f, 0xbf, 0x54, 0xc8, 0xf8], &mut cpu, &mut mem).unwrap();
        assert_eq!(cpu.gpr[RDX], sext(mem.get(BASE + 0x400 - 32, 2), 2) as u64);
        // cmp byte [rax], 0x7f (memory first operand, read only)
        let before = mem.clone();
        interpret(&[0x80, 0x38, 0x7f], &mut cpu, &mut mem).unwrap();
        let (_, fl) = alu(Alu::Cmp, 1, mem.get(BASE + 0x400, 1), 0x7f, false).unwrap();
        assert_eq!(cpu.rflags & STATUS, fl & STATUS);
        assert_eq!(mem, before);
        // A load straddling the end of memory faults, changing nothing.
        cpu.gpr[RAX] = BASE + MEM_LEN as u64 - 4;
        let c = cpu.clone();
        assert_eq!(
            interpret(&[0x48, 0x8b, 0x10], &mut cpu, &mut mem),
            Err(Reason::MemoryFault)
        );
        assert_eq!(cpu, c);
    }

    fn rng_fill(mem: &mut FakeMem) {
        SmallRng::seed_from_u64(3).fill(&mut mem.data[..]);
    }

    /// The byte loop of the brief: `mov [rdi+rcx], cl; inc rcx;
    /// cmp rcx, rsi; jb loop`, then `nop; push rax`.
    const LOOP: [u8; 13] = [
        0x88, 0x0c, 0x0f, // mov [rdi+rcx], cl
        0x48, 0xff, 0xc1, // inc rcx
        0x48, 0x39, 0xf1, // cmp rcx, rsi
        0x72, 0xf5, // jb -11
        0x90, // nop
        0x50, // push rax
    ];

    /// `run` on `code` placed at `cpu.rip`.
    fn run_code(
        code: &[u8],
        cpu: &mut FakeCpu,
        mem: &mut FakeMem,
        budget: u32,
        idle: u32,
    ) -> (u32, Stop) {
        let at = cpu.rip;
        let first = &code[(cpu.rip - at) as usize..];
        let mut fetch = |ip: u64, buf: &mut [u8; 15]| {
            let Some(off) = ip.checked_sub(at).filter(|&o| o < code.len() as u64) else {
                return 0;
            };
            let src = &code[off as usize..];
            let n = src.len().min(15);
            buf[..n].copy_from_slice(&src[..n]);
            n
        };
        run(first, &mut fetch, cpu, mem, budget, idle)
    }

    #[test]
    fn byte_loop_runs_to_completion_like_native() {
        prepare();
        let h = Harness::new();
        for (count, init_flags) in [(300u64, 0x202), (1, 0x202 | STATUS), (4096, 0x202 | CF)] {
            // Native, on a real buffer at the address FakeMem pretends to be.
            let mut native_buf = vec![0xeeu8; 8192];
            let base = native_buf.as_mut_ptr() as u64;
            let mut regs = RegFile::default();
            regs.gpr[RDI] = base + 16;
            regs.gpr[RSI] = count;
            regs.flags = init_flags;
            let code = &LOOP[..LOOP.len() - 1]; // through the nop
            let mut native = regs;
            h.run(code, &mut native);

            let mut mem = FakeMem {
                base,
                data: vec![0xee; 8192],
                hot: true,
            };
            let mut cpu = cpu_from(&regs, CODE);
            let (n, why) = run_code(&LOOP, &mut cpu, &mut mem, u32::MAX, 8);
            // 4 instructions per byte, then the nop; stops at push.
            assert_eq!((n, why), (4 * count as u32 + 1, Stop::Unsupported));
            assert_eq!(cpu.rip, CODE + 12);
            assert!(mem.data == native_buf);
            for r in (0..16).filter(|&r| r != RSP) {
                assert_eq!(cpu.gpr[r], native.gpr[r], "gpr {r}");
            }
            assert_eq!(cpu.gpr[RCX], count);
            assert_eq!(cpu.rflags & STATUS, native.flags & STATUS);
            assert_eq!(cpu.rflags & !STATUS, init_flags & !STATUS);
        }
    }

    #[test]
    fn run_budget_idle_and_stops() {
        prepare();
        let setup_loop = |hot: bool| {
            let (mut cpu, mut mem) = setup();
            mem.hot = hot;
            cpu.gpr[RDI] = BASE;
            cpu.gpr[RSI] = 100;
            (cpu, mem)
        };
        // Budget: store inc cmp jb store inc cmp jb store inc.
        let (mut cpu, mut mem) = setup_loop(true);
        assert_eq!(
            run_code(&LOOP, &mut cpu, &mut mem, 10, 4),
            (10, Stop::Budget)
        );
        assert_eq!((cpu.gpr[RCX], cpu.rip), (3, CODE + 6));
        assert_eq!(mem.at(BASE, 4), &[0, 1, 2, 0]);
        // A budget of 0 or 1 still runs the faulting instruction.
        for budget in [0, 1] {
            let (mut cpu, mut mem) = setup_loop(true);
            assert_eq!(
                run_code(&LOOP, &mut cpu, &mut mem, budget, 4),
                (1, Stop::Budget)
            );
            assert_eq!(cpu.rip, CODE + 3);
        }
        // Nothing hot: stops after `idle_limit` instructions.
        for idle in [1, 2, 5, 9] {
            let (mut cpu, mut mem) = setup_loop(false);
            assert_eq!(
                run_code(&LOOP, &mut cpu, &mut mem, 1000, idle),
                (idle, Stop::Idle)
            );
        }
        // Hot: the store every 4 instructions resets the idle count (the
        // exit path, inc cmp jb nop, is 4 idle instructions)...
        let (mut cpu, mut mem) = setup_loop(true);
        assert_eq!(
            run_code(&LOOP, &mut cpu, &mut mem, 1000, 5),
            (401, Stop::Unsupported)
        );
        let (mut cpu, mut mem) = setup_loop(true);
        assert_eq!(
            run_code(&LOOP, &mut cpu, &mut mem, 1000, 4),
            (401, Stop::Idle)
        );
        assert_eq!(cpu.rip, CODE + 12);
        // ...unless the limit is below the distance between stores.
        let (mut cpu, mut mem) = setup_loop(true);
        assert_eq!(
            run_code(&LOOP, &mut cpu, &mut mem, 1000, 3),
            (4, Stop::Idle)
        );
        assert_eq!(cpu.rip, CODE); // before the second store

        // Stops before unsupported instructions with exact state.
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE + 8;
        cpu.gpr[RCX] = 0x1_0000_0041;
        let code = [
            0x89, 0x08, // mov [rax], ecx
            0x83, 0xc1, 0x01, // add ecx, 1
            0x8b, 0x50, 0xfc, // mov edx, [rax-4]
            0x50, // push rax
        ];
        mem.put(BASE + 4, 4, 0x1234_5678);
        assert_eq!(
            run_code(&code, &mut cpu, &mut mem, 100, 100),
            (3, Stop::Unsupported)
        );
        assert_eq!(cpu.rip, CODE + 8);
        assert_eq!((cpu.gpr[RCX], cpu.gpr[RDX]), (0x42, 0x1234_5678));
        assert_eq!(mem.get(BASE + 8, 4), 0x41);
        assert_eq!(cpu.rflags & STATUS, PF); // 0x42: even parity
                                             // Running off the fetched bytes stops too.
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE;
        assert_eq!(
            run_code(&code[..4], &mut cpu, &mut mem, 100, 100),
            (1, Stop::Unsupported)
        );
        assert_eq!(cpu.rip, CODE + 2);

        // A faulting store: stops before it, nothing half-done.
        let (mut cpu, mut mem) = setup_loop(true);
        cpu.gpr[RDI] = BASE + MEM_LEN as u64 - 5;
        assert_eq!(
            run_code(&LOOP, &mut cpu, &mut mem, 1000, 4),
            (20, Stop::Fault)
        );
        assert_eq!((cpu.rip, cpu.gpr[RCX]), (CODE, 5));
        // A faulting load, likewise.
        let (mut cpu, mut mem) = setup();
        cpu.gpr[RAX] = BASE;
        let code = [0x89, 0x08, 0x8b, 0x50, 0xf0]; // mov [rax], ecx; mov edx, [rax-16]
        cpu.gpr[RDX] = 7;
        assert_eq!(
            run_code(&code, &mut cpu, &mut mem, 100, 100),
            (1, Stop::Fault)
        );
        assert_eq!((cpu.rip, cpu.gpr[RDX]), (CODE + 2, 7));

        // The first instruction not emulated: nothing changes.
        let (mut cpu, mut mem) = setup();
        let (c, m) = (cpu.clone(), mem.clone());
        assert_eq!(
            run_code(&[0x01, 0xc8, 0x90], &mut cpu, &mut mem, 100, 100),
            (0, Stop::NotEmulated(Reason::NoMemoryWrite))
        );
        assert_eq!((cpu, mem), (c, m));

        // Single-stepping: only the first instruction.
        let (mut cpu, mut mem) = setup_loop(true);
        cpu.rflags |= TF;
        assert_eq!(
            run_code(&LOOP, &mut cpu, &mut mem, 100, 100),
            (1, Stop::Unsupported)
        );
    }

    #[test]
    fn run_rep_stos_across_pages_and_self_modifying_code() {
        prepare();
        // rep stosb over 3 pages then nop nop push: the REP resumes.
        let (mut cpu, mut mem) = setup();
        mem.hot = true;
        cpu.gpr[RDI] = BASE + 0x800;
        cpu.gpr[RCX] = 0x2000;
        cpu.gpr[RAX] = 0x5a;
        let code = [0xf3, 0xaa, 0x90, 0x90, 0x50];
        assert_eq!(
            run_code(&code, &mut cpu, &mut mem, 100, 100),
            (5, Stop::Unsupported)
        );
        assert_eq!((cpu.rip, cpu.gpr[RCX]), (CODE + 4, 0));
        assert!(mem.data[0x800..0x2800].iter().all(|&b| b == 0x5a));

        // Code in memory: a store rewriting an already-decoded
        // instruction is seen on the next pass (the cache is flushed).
        let (mut cpu, mut mem) = setup();
        mem.hot = true;
        let at = BASE + 0x100;
        let code = [
            0x88, 0x0f, // 0: mov [rdi], cl
            0x48, 0xff, 0xc1, // 2: inc rcx (becomes "inc rdx" = 48 ff c2)
            0x48, 0xff, 0xc3, // 5: inc rbx
            0x48, 0x83, 0xfb, 0x02, // 8: cmp rbx, 2
            0x72, 0xf2, // 12: jb 0
            0x50, // 14: push rax
        ];
        mem.data[0x100..0x100 + code.len()].copy_from_slice(&code);
        cpu.rip = at;
        cpu.gpr[RDI] = at + 4; // the modrm byte of `inc`
        cpu.gpr[RCX] = 0xc1;
        let shared = Shared(std::rc::Rc::new(std::cell::RefCell::new(mem)));
        let view = shared.0.clone();
        let mut fetch = |ip: u64, buf: &mut [u8; 15]| {
            let m = view.borrow();
            let off = (ip - BASE) as usize;
            buf.copy_from_slice(&m.data[off..off + 15]);
            15
        };
        let mut mem = shared;
        assert_eq!(
            run(&code, &mut fetch, &mut cpu, &mut mem, 100, 100),
            (10, Stop::Unsupported)
        );
        assert_eq!(cpu.rip, at + 14);
        assert_eq!((cpu.gpr[RCX], cpu.gpr[RDX], cpu.gpr[RBX]), (0xc2, 1, 2));
    }

    /// A [`FakeMem`] that `fetch` can read while `run` holds the `Memory`.
    struct Shared(std::rc::Rc<std::cell::RefCell<FakeMem>>);

    impl Memory for Shared {
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault> {
            self.0.borrow_mut().read(addr, buf)
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault> {
            self.0.borrow_mut().write(addr, data)
        }
        fn cas(&mut self, addr: u64, size: usize, e: u64, n: u64) -> Result<u64, MemFault> {
            self.0.borrow_mut().cas(addr, size, e, n)
        }
        fn hot(&self, addr: u64) -> bool {
            self.0.borrow().hot(addr)
        }
    }

    /// Cycles per interpreted instruction for the byte loop (printed; run
    /// with `--release --nocapture` for meaningful numbers).
    #[test]
    fn byte_loop_cycles_per_instruction() {
        prepare();
        let mut samples = Vec::new();
        let mut n = 0;
        for _ in 0..15 {
            let (mut cpu, mut mem) = setup();
            mem.hot = true;
            cpu.gpr[RDI] = BASE;
            cpu.gpr[RSI] = 4096;
            // SAFETY: RDTSC has no preconditions.
            let t0 = unsafe { core::arch::x86_64::_rdtsc() };
            let (done, why) = run_code(&LOOP, &mut cpu, &mut mem, u32::MAX, 16);
            // SAFETY: as above.
            let t1 = unsafe { core::arch::x86_64::_rdtsc() };
            assert_eq!(why, Stop::Unsupported);
            n = done;
            samples.push((t1 - t0) as f64 / f64::from(done));
        }
        samples.sort_by(f64::total_cmp);
        eprintln!(
            "run: byte loop, {n} instructions per call, median {:.1} cycles/instruction \
             (min {:.1}, max {:.1})",
            samples[samples.len() / 2],
            samples[0],
            samples[samples.len() - 1]
        );
    }
}
