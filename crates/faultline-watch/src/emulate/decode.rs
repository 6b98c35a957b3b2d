//! Decoding and operands: one instruction decoded from its bytes with
//! iced-x86, iced registers mapped to the x86 register numbers of
//! [`Cpu`], register reads and writes with the x86-64 width rules (8- and
//! 16-bit writes merge, 32-bit writes zero-extend), immediate operands, and
//! effective addresses (`base + index * scale + disp`, RIP-relative,
//! `0x67` 32-bit addressing, FS/GS bases).
//!
//! iced-x86 builds its decoder tables lazily, allocating, on the first
//! decode: [`prepare`] forces that outside signal context.

use iced_x86::{Decoder, DecoderError, DecoderOptions, Instruction, OpKind, Register};

use super::alu::mask;
use super::machine::{Cpu, Gpr, Reason};

/// Longest x86 instruction.
pub(super) const MAX_INSN_LEN: usize = 15;

pub(super) const RAX: Gpr = 0;
pub(super) const RCX: Gpr = 1;
pub(super) const RSP: Gpr = 4;
pub(super) const RSI: Gpr = 6;
pub(super) const RDI: Gpr = 7;

/// Builds iced-x86's lazily initialised decoder tables (this allocates).
///
/// Call once outside signal context before any [`emulate`](super::emulate) or
/// [`write_target`](super::write_target) call from a signal handler; afterwards decoding never
/// allocates. Cheap and idempotent.
pub fn prepare() {
    // `nop`: any decode forces the tables.
    let _ = decode(&[0x90], 0);
}

/// Decodes one 64-bit instruction at `ip`; `None` if invalid or truncated.
pub(super) fn decode(code: &[u8], ip: u64) -> Option<Instruction> {
    let bytes = code.get(..code.len().min(MAX_INSN_LEN))?;
    let mut decoder = Decoder::try_with_ip(64, bytes, ip, DecoderOptions::NONE).ok()?;
    let mut instr = Instruction::default();
    decoder.decode_out(&mut instr);
    if instr.is_invalid() || decoder.last_error() != DecoderError::None {
        return None;
    }
    Some(instr)
}

/// A general-purpose register operand: number, width in bytes, and whether
/// it is one of AH/CH/DH/BH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reg {
    /// [`Gpr`] number (0..16); a byte keeps decoded operands small.
    num: u8,
    /// Width in bytes (1, 2, 4, 8).
    pub(super) size: u8,
    /// AH, CH, DH or BH.
    pub(super) high: bool,
}

impl Reg {
    /// The accumulator (AL/AX/EAX/RAX) of `size` bytes.
    pub(super) const fn acc(size: usize) -> Self {
        Reg {
            num: RAX as u8,
            size: size as u8,
            high: false,
        }
    }

    /// The register number as a [`Gpr`].
    pub(super) const fn gpr(self) -> Gpr {
        self.num as Gpr
    }

    /// The width in bytes.
    pub(super) const fn bytes(self) -> usize {
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
pub(super) fn gpr_of(r: Register) -> Option<Reg> {
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
pub(super) fn vec_of(r: Register) -> Option<(usize, bool)> {
    let n = r as u32;
    if let Some(i) = in_range(n, Register::XMM0, Register::XMM15) {
        return Some((i, false));
    }
    if let Some(i) = in_range(n, Register::YMM0, Register::YMM15) {
        return Some((i, true));
    }
    None
}

/// Value of `r`, zero-extended.
pub(super) fn read_reg(cpu: &dyn Cpu, r: Reg) -> u64 {
    let full = cpu.gpr(r.gpr());
    if r.high {
        (full >> 8) & 0xff
    } else {
        full & mask(r.bytes())
    }
}

/// Writes `v` to `r` with x86-64 semantics: 8/16-bit writes merge, 32-bit
/// writes zero-extend to 64 bits.
pub(super) fn write_reg(cpu: &mut dyn Cpu, r: Reg, v: u64) {
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

/// Whether an operand of kind `k` is an immediate (of any width or
/// sign extension).
pub(super) const fn is_immediate(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    )
}

/// Value of a register or immediate operand, truncated to `size` bytes.
pub(super) fn operand_value(
    instr: &Instruction,
    op: u32,
    cpu: &dyn Cpu,
    size: usize,
) -> Result<u64, Reason> {
    match instr.op_kind(op) {
        OpKind::Register => {
            let r = gpr_of(instr.op_register(op)).ok_or(Reason::Unsupported)?;
            Ok(read_reg(cpu, r) & mask(size))
        }
        k if is_immediate(k) => {
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
pub(super) fn address(instr: &Instruction, op: u32, cpu: &dyn Cpu) -> Result<u64, Reason> {
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
/// everything [`classify`](super::store::classify) and `translate` accept.
pub(super) fn address_fast(instr: &Instruction, op: u32, cpu: &dyn Cpu) -> Result<u64, Reason> {
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
pub(super) fn int_size(instr: &Instruction) -> Result<usize, Reason> {
    match instr.memory_size().size() {
        s @ (1 | 2 | 4 | 8) => Ok(s),
        _ => Err(Reason::Unsupported),
    }
}
