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
//! The operation runs in the same form as the real instruction where the
//! form matters: a rotate by an immediate runs as `rol r, imm8`
//! ([`native_rotate_imm`]), since some CPUs set its undefined OF unlike the
//! CL form's.
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

/// `$run!` of mnemonic `$mn` with the operand text of a `$size`-byte
/// operation (1, 2, 4 or 8 bytes) in one of three forms: `binary` (`{d}`,
/// `{s}`), `unary` (`{d}`) or `by_cl` (`{d}`, `cl`); returns `None` from the
/// enclosing function for any other size.
#[cfg(target_arch = "x86_64")]
macro_rules! sized {
    ($run:ident, $size:expr, $mn:literal, binary) => {
        sized!(@ $run, $size, $mn, " {d:l}, {s:l}", " {d:x}, {s:x}", " {d:e}, {s:e}", " {d}, {s}")
    };
    ($run:ident, $size:expr, $mn:literal, unary) => {
        sized!(@ $run, $size, $mn, " {d:l}", " {d:x}", " {d:e}", " {d}")
    };
    ($run:ident, $size:expr, $mn:literal, by_cl) => {
        sized!(@ $run, $size, $mn, " {d:l}, cl", " {d:x}, cl", " {d:e}, cl", " {d}, cl")
    };
    (@ $run:ident, $size:expr, $mn:literal, $b:literal, $w:literal, $l:literal, $q:literal) => {
        match $size {
            1 => $run!(concat!($mn, $b)),
            2 => $run!(concat!($mn, $w)),
            4 => $run!(concat!($mn, $l)),
            8 => $run!(concat!($mn, $q)),
            _ => return None,
        }
    };
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
            sized!(bin, size, $mn, binary)
        };
    }
    macro_rules! sized_un {
        ($mn:literal) => {
            sized!(un, size, $mn, unary)
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

/// Runs `$insn` on the `u64` variable `$d` (operand `{d}`) with the status
/// flags replaced by `$fin` first, plus the extra asm operands given;
/// evaluates to `RFLAGS` after it: `RFLAGS <- (RFLAGS & !STATUS) | fin`, the
/// instruction, `pushfq`.
#[cfg(target_arch = "x86_64")]
macro_rules! with_status_flags {
    ($insn:expr, $d:ident, $fin:expr $(, $($operands:tt)*)?) => {{
        let fl: u64;
        // SAFETY: register arithmetic between balanced pushfq/popfq and
        // pushfq/pop pairs on the stack (allowed: `nostack` is not given).
        // Only the status flags are replaced, so DF stays clear and TF/AC
        // keep their values.
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
                d = inout(reg) $d,
                fin = in(reg) $fin,
                keep = in(reg) !STATUS,
                fl = out(reg) fl,
                $($($operands)*)?
            );
        }
        fl
    }};
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
    macro_rules! bin {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl = with_status_flags!($insn, d, fin, s = in(reg) src);
            (d, fl)
        }};
    }
    macro_rules! un {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl = with_status_flags!($insn, d, fin);
            (d, fl)
        }};
    }
    macro_rules! sh {
        ($insn:expr) => {{
            let mut d: u64 = dst;
            let fl = with_status_flags!($insn, d, fin, in("rcx") src);
            (d, fl)
        }};
    }
    macro_rules! sized_bin {
        ($mn:literal) => {
            sized!(bin, size, $mn, binary)
        };
    }
    macro_rules! sized_un {
        ($mn:literal) => {
            sized!(un, size, $mn, unary)
        };
    }
    macro_rules! sized_sh {
        ($mn:literal) => {
            sized!(sh, size, $mn, by_cl)
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

/// `ROL`/`ROR` of `size`-byte `dst` by the immediate `count`, run in the
/// immediate form (`rol r, imm8`) with the status flags of `flags` loaded
/// first; returns (result, RFLAGS after). `None` for other operations.
///
/// [`native`] runs shifts and rotates in their CL form, which is exact for
/// the CL form and, for the defined flags, for every form. The "undefined"
/// OF of a rotate by more than one bit is not: on some CPUs (the Intel Xeon
/// of the project's machines) the `imm8` and CL forms set it differently,
/// so an instruction decoded with an immediate count runs with one. The
/// count is masked as the CPU masks it (5 bits, 6 for 64-bit operands) and
/// picks one of the pre-assembled forms.
#[cfg(target_arch = "x86_64")]
pub(super) fn native_rotate_imm(
    op: Arith,
    size: usize,
    dst: u64,
    count: u8,
    flags: u64,
) -> Option<(u64, u64)> {
    let n = usize::from(count) & if size == 8 { 63 } else { 31 };
    let f = match (op, size) {
        (Arith::Rol, 1) => ROL8[n],
        (Arith::Rol, 2) => ROL16[n],
        (Arith::Rol, 4) => ROL32[n],
        (Arith::Rol, 8) => ROL64[n],
        (Arith::Ror, 1) => ROR8[n],
        (Arith::Ror, 2) => ROR16[n],
        (Arith::Ror, 4) => ROR32[n],
        (Arith::Ror, 8) => ROR64[n],
        _ => return None,
    };
    let (r, fl) = f(dst, flags & STATUS);
    Some((r & mask(size), fl))
}

/// Not x86-64: nothing is computed natively.
#[cfg(not(target_arch = "x86_64"))]
pub(super) fn native_rotate_imm(
    _op: Arith,
    _size: usize,
    _dst: u64,
    _count: u8,
    _flags: u64,
) -> Option<(u64, u64)> {
    None
}

/// One rotate form: (operand, incoming status flags) -> (result, RFLAGS).
#[cfg(target_arch = "x86_64")]
type RotateForm = fn(u64, u64) -> (u64, u64);

/// Defines `$name::<N>`: the rotate `$insn` by the immediate `N`.
#[cfg(target_arch = "x86_64")]
macro_rules! rotate_form {
    ($name:ident, $insn:literal) => {
        fn $name<const N: u8>(dst: u64, fin: u64) -> (u64, u64) {
            let mut d: u64 = dst;
            let fl = with_status_flags!(concat!($insn, ", {n}"), d, fin, n = const N);
            (d, fl)
        }
    };
}

/// The forms of `$f` for the immediates listed.
#[cfg(target_arch = "x86_64")]
macro_rules! forms {
    ($f:ident; $($n:literal)*) => {
        [$($f::<$n> as RotateForm),*]
    };
}

#[cfg(target_arch = "x86_64")]
rotate_form!(rol8, "rol {d:l}");
#[cfg(target_arch = "x86_64")]
rotate_form!(rol16, "rol {d:x}");
#[cfg(target_arch = "x86_64")]
rotate_form!(rol32, "rol {d:e}");
#[cfg(target_arch = "x86_64")]
rotate_form!(rol64, "rol {d}");
#[cfg(target_arch = "x86_64")]
rotate_form!(ror8, "ror {d:l}");
#[cfg(target_arch = "x86_64")]
rotate_form!(ror16, "ror {d:x}");
#[cfg(target_arch = "x86_64")]
rotate_form!(ror32, "ror {d:e}");
#[cfg(target_arch = "x86_64")]
rotate_form!(ror64, "ror {d}");

#[cfg(target_arch = "x86_64")]
const ROL8: [RotateForm; 32] = forms!(rol8; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
#[cfg(target_arch = "x86_64")]
const ROL16: [RotateForm; 32] = forms!(rol16; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
#[cfg(target_arch = "x86_64")]
const ROL32: [RotateForm; 32] = forms!(rol32; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
#[cfg(target_arch = "x86_64")]
const ROL64: [RotateForm; 64] = forms!(rol64; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63);
#[cfg(target_arch = "x86_64")]
const ROR8: [RotateForm; 32] = forms!(ror8; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
#[cfg(target_arch = "x86_64")]
const ROR16: [RotateForm; 32] = forms!(ror16; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
#[cfg(target_arch = "x86_64")]
const ROR32: [RotateForm; 32] = forms!(ror32; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
#[cfg(target_arch = "x86_64")]
const ROR64: [RotateForm; 64] = forms!(ror64; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63);
