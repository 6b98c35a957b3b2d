//! `[REP] STOS{B,W,D,Q}` and `[REP] MOVS{B,W,D,Q}` (64-bit addressing,
//! both directions).
//!
//! Elements are processed in chunks of at most [`CHUNK`] bytes through a
//! stack buffer, and only up to the end of the 4 KiB page ([`REP_PAGE`])
//! holding the first destination element. If elements remain after that,
//! `RCX`, `RSI` and `RDI` reflect the completed elements and `RIP` stays on
//! the instruction: exactly the architectural state of an interrupted
//! `REP` instruction, so the thread resumes it natively (and faults again
//! only if the next page is protected too). The same happens when a
//! [`Memory`] access fails after some elements were done. `MOVS` chunks
//! are also limited so that chunked copying gives the element-by-element
//! result when source and destination overlap.

use iced_x86::{Instruction, OpKind};

use super::alu::DF;
use super::decode::{address, int_size, read_reg, Reg, RCX, RDI, RSI};
use super::machine::{Cpu, Memory, Reason};

/// Stack buffer used by string instructions.
const CHUNK: usize = 256;
/// `REP` string instructions stop at the end of this page.
const REP_PAGE: u64 = 4096;

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
pub(super) fn stos(
    instr: &Instruction,
    cpu: &mut dyn Cpu,
    mem: &mut dyn Memory,
) -> Result<(), Reason> {
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
pub(super) fn movs(
    instr: &Instruction,
    cpu: &mut dyn Cpu,
    mem: &mut dyn Memory,
) -> Result<(), Reason> {
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
