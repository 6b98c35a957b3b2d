//! Continued interpretation ([`run`]): after the faulting store, keep
//! executing the following instructions inside the handler while they keep
//! touching write-protected ("hot") pages, so one signal covers many
//! iterations of a loop.
//!
//! 1. An instruction is decoded once and translated ([`translate`]) into an
//!    [`Op`]: a store (the [`emulate`] path), a register operation, a
//!    branch, or `Stop`. Decoded instructions stay in an on-stack,
//!    direct-mapped cache keyed by IP.
//! 2. [`step`] executes it: reads first (a failing read leaves everything
//!    unchanged), arithmetic flags from the CPU ([`native`]), writes last.
//! 3. [`Track`] notes whether the instruction touched a hot page and
//!    whether it wrote over cached code (which flushes the cache).
//! 4. The run stops before any instruction it cannot execute exactly, on a
//!    memory fault, after `budget` instructions, or after `idle_limit`
//!    instructions without a hot access: always on an exact architectural
//!    state.

use iced_x86::{Code, Instruction, Mnemonic, OpKind};

use super::alu::{
    condition, mask, merge_flags, native, native_rotate_imm, sext, Arith, STATUS, TF, ZF,
};
use super::decode::{
    address, address_fast, decode, gpr_of, is_immediate, read_reg, write_reg, Reg, MAX_INSN_LEN,
    RCX, RSP,
};
use super::machine::{Cpu, MemFault, Memory, Reason};
use super::store::{classify, emulate, exec, read_val, Kind, Outcome};

/// Decode cache entries, direct-mapped on the low bits of the IP (a loop
/// body shorter than this many bytes never collides with itself).
const CACHE_SLOTS: usize = 64;

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

/// A source operand of an interpreted instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Src {
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
pub(super) enum Op {
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
        k if is_immediate(k) => instr.try_immediate(op).ok().map(Src::Imm),
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
pub(super) fn translate(instr: &Instruction, bytes: &[u8]) -> Op {
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
pub(super) fn step(
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
            let (r, native_fl) = match (op, b) {
                // Their undefined OF depends on the form (see
                // `native_rotate_imm`); immediates are at most 8 bits.
                (Arith::Rol | Arith::Ror, Src::Imm(_)) => {
                    native_rotate_imm(op, size, x, y as u8, fl)
                }
                _ => native(op, size, x, y, fl),
            }
            .ok_or(Reason::Unsupported)?;
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
/// it. No allocation, no panics (after [`prepare`](super::prepare)).
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
