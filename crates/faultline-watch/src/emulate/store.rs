//! The emulated stores: which instructions are emulated ([`classify`], a
//! whitelist of instruction codes) and how ([`emulate`]):
//!
//! 1. decode the bytes at `RIP`;
//! 2. classify the instruction and validate it fully (operand sizes,
//!    vector state, segment bases, alignment of the alignment-checking
//!    forms) before anything is written;
//! 3. compute the effective address from the saved registers;
//! 4. perform the access through [`Memory`]: plain stores, read-modify-write
//!    with flags from the CPU (a compare-and-swap loop when the
//!    instruction is locked), exchanges, bit operations, string
//!    instructions (`string.rs`);
//! 5. update registers and flags and advance `RIP`.
//!
//! On a refusal nothing was written and the [`Cpu`] is unchanged.

use iced_x86::{Code, Instruction, Mnemonic, OpKind};

use super::alu::{alu, condition, mask, merge_flags, sext, Alu, CF, STATUS};
use super::decode::{
    address_fast, decode, gpr_of, int_size, operand_value, read_reg, vec_of, write_reg, Reg,
};
use super::machine::{Cpu, Memory, Reason};
use super::string::{movs, stos};

/// Upper bound on compare-and-swap retries of a locked update.
const CAS_RETRIES: u32 = 1 << 20;

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

/// Reads a little-endian value of `size` (1..=8) bytes.
pub(super) fn read_val(mem: &mut dyn Memory, addr: u64, size: usize) -> Result<u64, Reason> {
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

/// The modification of `BTS`/`BTR`/`BTC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BitOp {
    Set,
    Reset,
    Complement,
}

/// What an emulated instruction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
pub(super) fn classify(code: Code) -> Option<Kind> {
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
pub(super) fn exec(
    instr: &Instruction,
    cpu: &mut dyn Cpu,
    mem: &mut dyn Memory,
) -> Result<(), Reason> {
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
