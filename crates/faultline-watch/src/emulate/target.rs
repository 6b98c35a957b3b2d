//! [`write_target`]: for an instruction the emulator does not perform, the
//! memory it is about to write, so that the hit can be reported after the
//! instruction was single-stepped. Operand accesses are inferred without
//! iced's (allocating) `InstructionInfoFactory`.

use iced_x86::{Mnemonic, OpKind, Register};

use super::alu::DF;
use super::decode::{address, decode, gpr_of, read_reg, RCX};
use super::machine::Cpu;

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
