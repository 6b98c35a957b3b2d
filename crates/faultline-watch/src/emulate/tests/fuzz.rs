//! Random instruction bytes: the emulator and the interpreter never
//! panic, and a refusal leaves registers and memory unchanged.

use super::*;

#[test]
fn fuzz_random_bytes() {
    prepare();
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    // Bias the first bytes towards interesting opcodes and prefixes.
    const HOT: &[u8] = &[
        0x88, 0x89, 0xc6, 0xc7, 0x80, 0x81, 0x83, 0x00, 0x01, 0x08, 0x09, 0x10, 0x11, 0x18, 0x19,
        0x20, 0x21, 0x28, 0x29, 0x30, 0x31, 0x0f, 0xf6, 0xf7, 0xfe, 0xff, 0x86, 0x87, 0xaa, 0xab,
        0xa4, 0xa5, 0xa2, 0xa3, 0xf0, 0xf2, 0xf3, 0x66, 0x67, 0x48, 0x4c, 0x41, 0x64, 0x65, 0xc4,
        0xc5, 0x62,
    ];
    const HOT_0F: &[u8] = &[
        0x11, 0x13, 0x17, 0x29, 0x2b, 0x7e, 0x7f, 0xd6, 0xe7, 0xc3, 0xc0, 0xc1, 0xb0, 0xb1, 0xab,
        0xb3, 0xbb, 0xba, 0x94, 0x9c, 0x38, 0xc7,
    ];
    // Interpreted instructions (rel8/imm8 operands appended at random).
    const SNIPPETS: &[&[u8]] = &[
        &[0x48, 0xff, 0xc1],       // inc rcx
        &[0x48, 0x39, 0xf1],       // cmp rcx, rsi
        &[0x72],                   // jb rel8
        &[0x75],                   // jne rel8
        &[0xeb],                   // jmp rel8
        &[0xe2],                   // loop rel8
        &[0xe3],                   // jrcxz rel8
        &[0x88, 0x0c, 0x0f],       // mov [rdi+rcx], cl
        &[0x89, 0x04, 0x8f],       // mov [rdi+rcx*4], eax
        &[0x01, 0xc8],             // add eax, ecx
        &[0x8b, 0x07],             // mov eax, [rdi]
        &[0x0f, 0xb6, 0x04, 0x0e], // movzx eax, byte [rsi+rcx]
        &[0x48, 0xc1, 0xe0],       // shl rax, imm8
        &[0xd3, 0xf8],             // sar eax, cl
        &[0x0f, 0xaf, 0xc1],       // imul eax, ecx
        &[0x0f, 0x44, 0x07],       // cmove eax, [rdi]
        &[0x0f, 0x9c, 0xc4],       // setl ah
        &[0x80, 0x3f],             // cmp byte [rdi], imm8
        &[0xf3, 0xaa],             // rep stosb
        &[0x48, 0x0f, 0xc8],       // bswap rax
        &[0x87, 0xd1],             // xchg ecx, edx
        &[0x90],                   // nop
        &[0x0f, 0x1f, 0x40, 0x00], // nop dword [rax]
        &[0xf0, 0x48, 0x01, 0x07], // lock add [rdi], rax
        &[0x48, 0x8d, 0x7f, 0x01], // lea rdi, [rdi+1]
    ];
    let mut emulated = 0;
    let mut continued = 0;
    for _ in 0..10_000 {
        let mut code = [0u8; 15];
        rng.fill(&mut code[..]);
        let mut i = 0;
        while i < 4 && rng.gen_bool(0.7) {
            code[i] = HOT[rng.gen_range(0..HOT.len())];
            if code[i] == 0x0f && i + 1 < 15 {
                code[i + 1] = HOT_0F[rng.gen_range(0..HOT_0F.len())];
                i += 1;
            }
            i += 1;
        }
        let len = if rng.gen_bool(0.1) {
            rng.gen_range(0..15)
        } else {
            15
        };
        let code = &code[..len];

        let mut cpu = FakeCpu::new();
        for r in cpu.gpr.iter_mut() {
            *r = match rng.gen_range(0..4) {
                0 => rng.gen(),
                1 => rng.gen_range(0..64),
                _ => BASE + rng.gen_range(0..MEM_LEN as u64),
            };
        }
        cpu.gpr[RCX] = if rng.gen_bool(0.5) {
            rng.gen_range(0..2000)
        } else {
            cpu.gpr[RCX]
        };
        cpu.rip = if rng.gen_bool(0.5) {
            BASE + rng.gen_range(0..MEM_LEN as u64)
        } else {
            rng.gen()
        };
        cpu.rflags = 0x202 | (rng.gen::<u64>() & (STATUS | DF));
        for v in cpu.vec.iter_mut() {
            rng.fill(&mut v[..]);
        }
        cpu.vec_ok = rng.gen_bool(0.9);
        cpu.fs = rng
            .gen_bool(0.5)
            .then(|| BASE + rng.gen_range(0..MEM_LEN as u64));
        cpu.gs = rng.gen_bool(0.5).then(|| rng.gen());
        let mut mem = FakeMem::new();
        rng.fill(&mut mem.data[..]);

        let (c0, m0) = (cpu.clone(), mem.clone());
        let _ = write_target(code, &cpu);

        // The continuation: the same first instruction, then code mixing
        // interpreted snippets and random bytes.
        let first_len = decode(code, cpu.rip).map_or(code.len(), |i| i.len());
        let mut region = code[..first_len].to_vec();
        while region.len() < 160 {
            if rng.gen_bool(0.8) {
                let s = SNIPPETS[rng.gen_range(0..SNIPPETS.len())];
                region.extend_from_slice(s);
                if s.len() == 1 || matches!(s.last(), Some(0x80..)) {
                    // A rel8/imm8 for branch and shift snippets.
                    region.push(rng.gen());
                }
            } else {
                region.push(rng.gen());
            }
        }
        let (mut c1, mut m1) = (c0.clone(), m0.clone());
        m1.hot = rng.gen_bool(0.7);
        let budget = rng.gen_range(0..200);
        let idle = rng.gen_range(0..20);
        let expect = emulate(code, &mut c0.clone(), &mut m0.clone());
        let first = code;
        let at = c1.rip;
        let mut fetch = |ip: u64, buf: &mut [u8; 15]| {
            let Some(off) = ip.checked_sub(at).filter(|&o| o < region.len() as u64) else {
                return 0;
            };
            let src = &region[off as usize..];
            let n = src.len().min(15);
            buf[..n].copy_from_slice(&src[..n]);
            n
        };
        match run(first, &mut fetch, &mut c1, &mut m1, budget, idle) {
            (n, Stop::NotEmulated(r)) => {
                assert_eq!(n, 0);
                assert_eq!(Outcome::NotEmulated(r), expect, "{code:02x?}");
                assert_eq!(c1, c0, "{code:02x?} {r:?}");
                assert!(m1.data == m0.data, "{code:02x?} {r:?}");
            }
            (n, why) => {
                assert_eq!(expect, Outcome::Emulated, "{code:02x?}");
                assert!(n >= 1 && n <= budget.max(1), "{n} {why:?}");
                assert!(why != Stop::Budget || n == budget.max(1));
                assert!(why != Stop::Idle || n >= idle);
                assert_eq!(c1.vec, c0.vec);
                if n > 1 {
                    continued += 1;
                }
            }
        }

        match emulate(code, &mut cpu, &mut mem) {
            Outcome::NotEmulated(r) => {
                assert_eq!(cpu, c0, "{code:02x?} {r:?}");
                assert!(mem == m0, "{code:02x?} {r:?}");
            }
            Outcome::Emulated => {
                emulated += 1;
                // Either completed or a partial REP (RIP unchanged).
                let len = decode(code, c0.rip).unwrap().len() as u64;
                assert!(
                    cpu.rip == c0.rip.wrapping_add(len) || cpu.rip == c0.rip,
                    "{code:02x?}"
                );
                assert_eq!(cpu.vec, c0.vec);
            }
        }
    }
    assert!(
        emulated > 500,
        "only {emulated} emulated: the fuzzer is not reaching stores"
    );
    assert!(
        continued > 300,
        "only {continued} runs went past the first instruction"
    );
}
