//! Continued interpretation against the CPU: a harness runs the same
//! code natively on a register file, and every register, flag and byte
//! must match; budgets, idle limits, stops, self-modifying code.

use super::*;
use faultline_sys::mem::{Mapping, Prot};

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
    (0..instr.op_count()).any(|i| instr.op_kind(i) == OpKind::Register && rsp(instr.op_register(i)))
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
            Op::Arith { a, b, .. } => matches!(a, Src::Mem { .. }) || matches!(b, Src::Mem { .. }),
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
            code.extend_from_slice(&[0x44 | (reg << 3), (scale << 6) | (6 << 3) | 3, rng.gen()]);
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
