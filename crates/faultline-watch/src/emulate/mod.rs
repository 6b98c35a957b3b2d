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
//!
//! # Layout
//!
//! One file per part, each importing only files listed above it:
//!
//! | file | holds |
//! |---|---|
//! | `machine.rs` | [`Cpu`], [`Memory`], [`Reason`]: what the emulator works through |
//! | `alu.rs` | arithmetic and flags computed by the CPU, `RFLAGS` bits, condition codes |
//! | `decode.rs` | decoding ([`prepare`]), register numbers, operand values, addresses |
//! | `string.rs` | `[REP] STOS`/`MOVS` |
//! | `store.rs` | which stores are emulated, and [`emulate`] |
//! | `target.rs` | [`write_target`]: what a refused instruction is about to write |
//! | `interp.rs` | [`run`]: continued interpretation past the faulting store |
//! | `tests/` | the tests, against fakes and against the CPU |

mod alu;
mod decode;
mod interp;
mod machine;
mod store;
mod string;
mod target;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;

pub use decode::prepare;
pub use interp::{run, Stop};
pub use machine::{Cpu, Gpr, MemFault, Memory, Reason};
pub use store::{emulate, Outcome};
pub use target::write_target;
