//! Read-modify-write stores against native execution of the same
//! instruction on memory: results and every status flag; locked forms,
//! `XCHG`, `XADD`, `CMPXCHG`, `BTS/BTR/BTC`.

use super::*;

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
                    let fl_in = 0x202 | u64::from(cf) | (rng.gen::<u64>() & (STATUS | DF) & !CF);
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
                    let what =
                        format!("{op:?} size {size} {form:?} dst {dst:#x} src {src:#x} cf {cf}");
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
