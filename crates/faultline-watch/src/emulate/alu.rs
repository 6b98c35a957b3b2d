//! Arithmetic and flags, computed by the CPU itself. An emulated
//! read-modify-write store ([`alu`]) or an interpreted register instruction
//! ([`native`]) runs the same operation natively on register operands
//! (`core::arch::asm!`) and captures `RFLAGS` with `pushfq`, so every
//! status flag, "undefined" ones included, is what the real instruction
//! produces:
//!
//! 1. load the incoming flags: only CF for [`alu`] (its operations define
//!    every other status flag), every status flag with `popfq` for
//!    [`native`];
//! 2. run the operation on the operand values, in registers;
//! 3. `pushfq`, and merge the flags the instruction defines into the
//!    thread's `RFLAGS` ([`merge_flags`]).
//!
//! Also here: the `RFLAGS` bits, operand widths ([`mask`], [`sext`]) and
//! condition codes ([`condition`]).

pub(super) const CF: u64 = 1 << 0;
pub(super) const PF: u64 = 1 << 2;
pub(super) const AF: u64 = 1 << 4;
pub(super) const ZF: u64 = 1 << 6;
pub(super) const SF: u64 = 1 << 7;
/// The trap flag.
pub(super) const TF: u64 = 1 << 8;
pub(super) const DF: u64 = 1 << 10;
pub(super) const OF: u64 = 1 << 11;
/// CF|PF|AF|ZF|SF|OF.
pub(super) const STATUS: u64 = CF | PF | AF | ZF | SF | OF;

/// All-ones mask of `size` bytes.
pub(super) const fn mask(size: usize) -> u64 {
    match size {
        1 => 0xff,
        2 => 0xffff,
        4 => 0xffff_ffff,
        _ => u64::MAX,
    }
}

/// Sign-extends the low `size` bytes of `v`.
pub(super) const fn sext(v: u64, size: usize) -> i64 {
    match size {
        1 => v as u8 as i8 as i64,
        2 => v as u16 as i16 as i64,
        4 => v as u32 as i32 as i64,
        _ => v as i64,
    }
}

/// Arithmetic operations whose flags come from native execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alu {
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
    pub(super) const fn flags(self) -> u64 {
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
pub(super) fn alu(op: Alu, size: usize, dst: u64, src: u64, cf: bool) -> Option<(u64, u64)> {
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
pub(super) fn alu(_op: Alu, _size: usize, _dst: u64, _src: u64, _cf: bool) -> Option<(u64, u64)> {
    None
}

/// `(old & !defined) | (native & defined)`.
pub(super) const fn merge_flags(old: u64, native: u64, defined: u64) -> u64 {
    (old & !defined) | (native & defined)
}

/// Evaluates condition `cc` (the x86 `tttn` encoding, 0=O .. 15=G).
pub(super) const fn condition(cc: u8, fl: u64) -> bool {
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

/// Register-destination arithmetic, executed natively with the incoming
/// status flags loaded (so unchanged and "undefined" flags come out as the
/// CPU produces them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arith {
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
    pub(super) const fn writes(self) -> bool {
        !matches!(self, Arith::Cmp | Arith::Test)
    }
}

/// Runs `op` natively on `size`-byte register operands `dst`, `src` (`src`
/// is the count for shifts and rotates, and the multiplier for IMUL), with
/// the status flags of `flags` loaded first; returns (result truncated to
/// `size`, RFLAGS after). `None` for IMUL on bytes (no such form).
#[cfg(target_arch = "x86_64")]
pub(super) fn native(op: Arith, size: usize, dst: u64, src: u64, flags: u64) -> Option<(u64, u64)> {
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
pub(super) fn native(
    _op: Arith,
    _size: usize,
    _dst: u64,
    _src: u64,
    _flags: u64,
) -> Option<(u64, u64)> {
    None
}
