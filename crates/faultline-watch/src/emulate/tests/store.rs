//! Plain and vector stores: sizes, immediates, addressing forms (RIP,
//! SIB, `0x67`, `moffs`, FS/GS), alignment and vector state; refusals leave
//! everything unchanged; the write target of refused instructions.

use super::*;

#[test]
fn mov_reg_store_sizes() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = BASE + 0x10;
    cpu.gpr[RBX] = 0x1122_3344_5566_7788;
    mem.data[0x10..0x20].fill(0xee);
    ok(&[0x88, 0x18], &mut cpu, &mut mem); // mov [rax], bl
    assert_eq!(
        mem.at(BASE + 0x10, 9),
        &[0x88, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee]
    );
    ok(&[0x66, 0x89, 0x18], &mut cpu, &mut mem); // mov [rax], bx
    assert_eq!(mem.get(BASE + 0x10, 4), 0xeeee_7788);
    ok(&[0x89, 0x18], &mut cpu, &mut mem); // mov [rax], ebx
    assert_eq!(mem.get(BASE + 0x10, 8), 0xeeee_eeee_5566_7788);
    ok(&[0x48, 0x89, 0x18], &mut cpu, &mut mem); // mov [rax], rbx
    assert_eq!(mem.get(BASE + 0x10, 8), 0x1122_3344_5566_7788);
    assert_eq!(mem.data[0x18], 0xee);
    // mov [rax+8], r9b: 44 88 48 08
    cpu.gpr[9] = 0xabcd;
    ok(&[0x44, 0x88, 0x48, 0x08], &mut cpu, &mut mem);
    assert_eq!(mem.data[0x18], 0xcd);
    assert_eq!(cpu.rflags, 0x202);
}

#[test]
fn mov_high8_source() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = BASE + 0x20;
    cpu.gpr[RBX] = 0x1234;
    cpu.gpr[RCX] = 0xa5b6;
    ok(&[0x88, 0x60, 0x01], &mut cpu, &mut mem); // mov [rax+1], ah
    assert_eq!(mem.data[0x21], ((BASE + 0x20) >> 8) as u8);
    ok(&[0x88, 0x78, 0x02], &mut cpu, &mut mem); // mov [rax+2], bh
    assert_eq!(mem.data[0x22], 0x12);
    ok(&[0x88, 0x68, 0x03], &mut cpu, &mut mem); // mov [rax+3], ch
    assert_eq!(mem.data[0x23], 0xa5);
    // With a REX prefix the same encoding means SPL/BPL/SIL/DIL:
    // mov [rax+4], bpl: 40 88 68 04
    cpu.gpr[5] = 0x77;
    ok(&[0x40, 0x88, 0x68, 0x04], &mut cpu, &mut mem);
    assert_eq!(mem.data[0x24], 0x77);
}

#[test]
fn mov_immediates() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = BASE;
    ok(&[0xc6, 0x00, 0x80], &mut cpu, &mut mem); // mov byte [rax], 0x80
    assert_eq!(mem.get(BASE, 2), 0x0080);
    ok(&[0x66, 0xc7, 0x00, 0x34, 0x12], &mut cpu, &mut mem); // mov word [rax], 0x1234
    assert_eq!(mem.get(BASE, 4), 0x1234);
    ok(&[0xc7, 0x00, 0x78, 0x56, 0x34, 0x12], &mut cpu, &mut mem); // mov dword [rax], 0x12345678
    assert_eq!(mem.get(BASE, 8), 0x1234_5678);
    // mov qword [rax], -2: the imm32 is sign-extended to 64 bits.
    ok(
        &[0x48, 0xc7, 0x00, 0xfe, 0xff, 0xff, 0xff],
        &mut cpu,
        &mut mem,
    );
    assert_eq!(mem.get(BASE, 8), 0xffff_ffff_ffff_fffe);
    // mov qword [rax+8], 0x7fffffff: positive, upper half zero.
    mem.put(BASE + 8, 8, u64::MAX);
    ok(
        &[0x48, 0xc7, 0x40, 0x08, 0xff, 0xff, 0xff, 0x7f],
        &mut cpu,
        &mut mem,
    );
    assert_eq!(mem.get(BASE + 8, 8), 0x7fff_ffff);
}

#[test]
fn rip_relative() {
    let (mut cpu, mut mem) = setup();
    cpu.rip = BASE + 0x10;
    cpu.gpr[RCX] = 0xdead_beef;
    // mov [rip+0x100], ecx: target = next_ip (rip+6) + 0x100
    ok(&[0x89, 0x0d, 0x00, 0x01, 0x00, 0x00], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x10 + 6 + 0x100, 4), 0xdead_beef);
    // Negative displacement: mov [rip-0x10], cl
    cpu.rip = BASE + 0x200;
    ok(&[0x88, 0x0d, 0xf0, 0xff, 0xff, 0xff], &mut cpu, &mut mem);
    assert_eq!(mem.data[0x200 + 6 - 0x10], 0xef);
}

#[test]
fn sib_index_scale_and_rsp_base() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RBX] = BASE + 0x100;
    cpu.gpr[RCX] = 3;
    cpu.gpr[RDX] = 0xcafe_f00d;
    // mov [rbx+rcx*4+0x10], edx
    ok(&[0x89, 0x54, 0x8b, 0x10], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x100 + 12 + 0x10, 4), 0xcafe_f00d);
    // mov [rbx+rcx*8-8], rdx with a negative index value
    cpu.gpr[RCX] = (-2i64) as u64;
    ok(&[0x48, 0x89, 0x54, 0xcb, 0xf8], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x100 - 16 - 8, 8), 0xcafe_f00d);
    // mov [rsp+0x20], edx
    cpu.gpr[4] = BASE + 0x800;
    ok(&[0x89, 0x54, 0x24, 0x20], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x820, 4), 0xcafe_f00d);
    // mov [r12+r13*2], dl: 43 88 14 6c
    cpu.gpr[12] = BASE + 0x900;
    cpu.gpr[13] = 5;
    ok(&[0x43, 0x88, 0x14, 0x6c], &mut cpu, &mut mem);
    assert_eq!(mem.data[0x90a], 0x0d);
}

#[test]
fn address_size_override() {
    let (mut cpu, mut mem) = setup();
    // mov [eax], ecx: only the low 32 bits of RAX form the address.
    cpu.gpr[RAX] = 0xdead_0000_0000_0000 | (BASE + 0x40);
    cpu.gpr[RCX] = 0x0102_0304;
    ok(&[0x67, 0x89, 0x08], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x40, 4), 0x0102_0304);
    // mov [eax+ecx*2+0x10], dl wraps modulo 2^32.
    cpu.gpr[RAX] = 0xffff_fff0;
    cpu.gpr[RCX] = (BASE + 0x50) / 2;
    cpu.gpr[RDX] = 0x99;
    ok(&[0x67, 0x88, 0x54, 0x48, 0x10], &mut cpu, &mut mem);
    assert_eq!(mem.data[0x50], 0x99);
    // Absolute disp32: mov [abs BASE+0x60], ecx, with and without 0x67.
    let d = ((BASE + 0x60) as u32).to_le_bytes();
    ok(
        &[0x89, 0x0c, 0x25, d[0], d[1], d[2], d[3]],
        &mut cpu,
        &mut mem,
    );
    assert_eq!(mem.get(BASE + 0x60, 4), cpu.gpr[RCX] & 0xffff_ffff);
    cpu.gpr[RCX] = 0x5555;
    ok(
        &[0x67, 0x89, 0x0c, 0x25, d[0], d[1], d[2], d[3]],
        &mut cpu,
        &mut mem,
    );
    assert_eq!(mem.get(BASE + 0x60, 4), 0x5555);
}

#[test]
fn moffs_forms() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = 0x8877_6655_4433_2211;
    let a = (BASE + 0x30).to_le_bytes();
    // mov [moffs64], rax: 48 a3 <imm64>
    let mut code = vec![0x48, 0xa3];
    code.extend_from_slice(&a);
    ok(&code, &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x30, 8), 0x8877_6655_4433_2211);
    // mov [moffs64], al: a2 <imm64>
    let a = (BASE + 0x40).to_le_bytes();
    let mut code = vec![0xa2];
    code.extend_from_slice(&a);
    ok(&code, &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x40, 2), 0x11);
}

#[test]
fn movnti_movbe_setcc() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = BASE;
    cpu.gpr[RCX] = 0x0102_0304_0506_0708;
    ok(&[0x48, 0x0f, 0xc3, 0x08], &mut cpu, &mut mem); // movnti [rax], rcx
    assert_eq!(mem.get(BASE, 8), 0x0102_0304_0506_0708);
    ok(&[0x0f, 0x38, 0xf1, 0x48, 0x10], &mut cpu, &mut mem); // movbe [rax+0x10], ecx
    assert_eq!(mem.at(BASE + 0x10, 4), &[0x05, 0x06, 0x07, 0x08]);
    ok(&[0x66, 0x0f, 0x38, 0xf1, 0x48, 0x20], &mut cpu, &mut mem); // movbe [rax+0x20], cx
    assert_eq!(mem.at(BASE + 0x20, 2), &[0x07, 0x08]);
    ok(&[0x48, 0x0f, 0x38, 0xf1, 0x48, 0x30], &mut cpu, &mut mem); // movbe [rax+0x30], rcx
    assert_eq!(mem.at(BASE + 0x30, 8), &[1, 2, 3, 4, 5, 6, 7, 8]);

    // sete [rax+0x40] / setl [rax+0x41] / setg [rax+0x42] / setb [rax+0x43]
    let sets = |cpu: &mut FakeCpu, mem: &mut FakeMem| {
        ok(&[0x0f, 0x94, 0x40, 0x40], cpu, mem);
        ok(&[0x0f, 0x9c, 0x40, 0x41], cpu, mem);
        ok(&[0x0f, 0x9f, 0x40, 0x42], cpu, mem);
        ok(&[0x0f, 0x92, 0x40, 0x43], cpu, mem);
        (mem.get(BASE + 0x40, 4) as u32).to_le_bytes()
    };
    cpu.rflags = 0x202 | ZF | SF; // equal, SF != OF -> less
    assert_eq!(sets(&mut cpu, &mut mem), [1, 1, 0, 0]);
    cpu.rflags = 0x202 | SF | OF | CF; // not equal, greater, below
    assert_eq!(sets(&mut cpu, &mut mem), [0, 0, 1, 1]);
    // All 16 conditions against a reference (tttn table).
    for fl in 0..64u64 {
        let flags = [CF, PF, ZF, SF, OF, AF]
            .iter()
            .enumerate()
            .filter(|(i, _)| fl >> i & 1 != 0)
            .fold(0x202, |a, (_, f)| a | f);
        let (cf, zf, sf, of, pf) = (
            flags & CF != 0,
            flags & ZF != 0,
            flags & SF != 0,
            flags & OF != 0,
            flags & PF != 0,
        );
        let expect = [
            of,
            !of,
            cf,
            !cf,
            zf,
            !zf,
            cf || zf,
            !(cf || zf),
            sf,
            !sf,
            pf,
            !pf,
            sf != of,
            sf == of,
            zf || sf != of,
            !(zf || sf != of),
        ];
        for (cc, e) in expect.iter().enumerate() {
            cpu.rflags = flags;
            ok(&[0x0f, 0x90 + cc as u8, 0x00], &mut cpu, &mut mem);
            assert_eq!(mem.data[0], u8::from(*e), "cc {cc} flags {flags:#x}");
            assert_eq!(cpu.rflags, flags);
        }
    }
}

#[test]
fn segment_prefixes() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = 0x10;
    cpu.gpr[RCX] = 0x4242;
    // mov fs:[rax], ecx without a known FS base
    refused(&[0x64, 0x89, 0x08], &mut cpu, &mut mem, Reason::Segment);
    cpu.fs = Some(BASE + 0x100);
    ok(&[0x64, 0x89, 0x08], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x110, 4), 0x4242);
    cpu.gs = Some(BASE + 0x200);
    ok(&[0x65, 0x66, 0x89, 0x08], &mut cpu, &mut mem); // mov gs:[rax], cx
    assert_eq!(mem.get(BASE + 0x210, 4), 0x4242);
    // DS/ES/SS/CS overrides are no-ops in 64-bit mode: mov ds:[rcx], al
    cpu.gpr[RCX] = BASE + 0x300;
    cpu.gpr[RAX] = 0x5a;
    ok(&[0x3e, 0x88, 0x01], &mut cpu, &mut mem);
    assert_eq!(mem.data[0x300], 0x5a);
}

// ---- vector stores -------------------------------------------------

fn vec_cpu() -> (FakeCpu, FakeMem) {
    let (mut cpu, mem) = setup();
    for (n, v) in cpu.vec.iter_mut().enumerate() {
        for (i, b) in v.iter_mut().enumerate() {
            *b = (n * 32 + i) as u8;
        }
    }
    cpu.gpr[RAX] = BASE + 0x100;
    (cpu, mem)
}

#[test]
fn sse_stores() {
    let cases: &[(&[u8], usize, usize)] = &[
        (&[0x0f, 0x11, 0x08], 0, 16),            // movups [rax], xmm1
        (&[0x66, 0x0f, 0x11, 0x08], 0, 16),      // movupd [rax], xmm1
        (&[0xf3, 0x0f, 0x7f, 0x08], 0, 16),      // movdqu [rax], xmm1
        (&[0x0f, 0x29, 0x08], 0, 16),            // movaps [rax], xmm1
        (&[0x66, 0x0f, 0x7f, 0x08], 0, 16),      // movdqa [rax], xmm1
        (&[0x66, 0x0f, 0xe7, 0x08], 0, 16),      // movntdq [rax], xmm1
        (&[0x0f, 0x2b, 0x08], 0, 16),            // movntps [rax], xmm1
        (&[0xf3, 0x0f, 0x11, 0x08], 0, 4),       // movss [rax], xmm1
        (&[0xf2, 0x0f, 0x11, 0x08], 0, 8),       // movsd [rax], xmm1
        (&[0x66, 0x0f, 0xd6, 0x08], 0, 8),       // movq [rax], xmm1
        (&[0x66, 0x48, 0x0f, 0x7e, 0x08], 0, 8), // movq [rax], xmm1 (REX.W 7E)
        (&[0x66, 0x0f, 0x7e, 0x08], 0, 4),       // movd [rax], xmm1
        (&[0x0f, 0x13, 0x08], 0, 8),             // movlps [rax], xmm1
        (&[0x66, 0x0f, 0x13, 0x08], 0, 8),       // movlpd [rax], xmm1
        (&[0x0f, 0x17, 0x08], 8, 8),             // movhps [rax], xmm1
        (&[0x66, 0x0f, 0x17, 0x08], 8, 8),       // movhpd [rax], xmm1
        (&[0xc5, 0xf8, 0x11, 0x08], 0, 16),      // vmovups [rax], xmm1
        (&[0xc5, 0xfa, 0x7f, 0x08], 0, 16),      // vmovdqu [rax], xmm1
        (&[0xc5, 0xfc, 0x11, 0x08], 0, 32),      // vmovups [rax], ymm1
        (&[0xc5, 0xfe, 0x7f, 0x08], 0, 32),      // vmovdqu [rax], ymm1
        (&[0xc5, 0xfd, 0x7f, 0x08], 0, 32),      // vmovdqa [rax], ymm1
        (&[0xc5, 0xfd, 0xe7, 0x08], 0, 32),      // vmovntdq [rax], ymm1
        (&[0xc5, 0xfa, 0x11, 0x08], 0, 4),       // vmovss [rax], xmm1
        (&[0xc5, 0xfb, 0x11, 0x08], 0, 8),       // vmovsd [rax], xmm1
        (&[0xc5, 0xf9, 0xd6, 0x08], 0, 8),       // vmovq [rax], xmm1
        (&[0xc5, 0xf9, 0x7e, 0x08], 0, 4),       // vmovd [rax], xmm1
        (&[0xc5, 0xf8, 0x17, 0x08], 8, 8),       // vmovhps [rax], xmm1
        (&[0xc4, 0xe1, 0xf9, 0x7e, 0x08], 0, 8), // vmovq [rax], xmm1 (VEX.W 7E)
    ];
    for &(code, off, len) in cases {
        let (mut cpu, mut mem) = vec_cpu();
        mem.data[0x100..0x140].fill(0xee);
        ok(code, &mut cpu, &mut mem);
        assert_eq!(
            mem.at(BASE + 0x100, len),
            &cpu.vec[1][off..off + len],
            "{code:02x?}"
        );
        assert!(
            mem.data[0x100 + len..0x140].iter().all(|&b| b == 0xee),
            "{code:02x?}"
        );
    }
    // Upper registers through REX.R / VEX.R: movups [rax], xmm9 / vmovups [rax], ymm12
    let (mut cpu, mut mem) = vec_cpu();
    ok(&[0x44, 0x0f, 0x11, 0x08], &mut cpu, &mut mem);
    assert_eq!(mem.at(BASE + 0x100, 16), &cpu.vec[9][..16]);
    ok(&[0xc5, 0x7c, 0x11, 0x20], &mut cpu, &mut mem);
    assert_eq!(mem.at(BASE + 0x100, 32), &cpu.vec[12][..]);
}

#[test]
fn vector_alignment_state_and_register_destinations() {
    let (mut cpu, mut mem) = vec_cpu();
    cpu.gpr[RAX] = BASE + 0x108;
    refused(&[0x0f, 0x29, 0x08], &mut cpu, &mut mem, Reason::MemoryFault); // movaps misaligned
    ok(&[0x0f, 0x11, 0x08], &mut cpu, &mut mem); // movups is fine
    cpu.gpr[RAX] = BASE + 0x110; // 16- but not 32-aligned
    ok(&[0x0f, 0x29, 0x08], &mut cpu, &mut mem);
    refused(
        &[0xc5, 0xfc, 0x29, 0x08],
        &mut cpu,
        &mut mem,
        Reason::MemoryFault,
    ); // vmovaps ymm
    refused(
        &[0xc5, 0xfd, 0xe7, 0x08],
        &mut cpu,
        &mut mem,
        Reason::MemoryFault,
    ); // vmovntdq ymm
    cpu.vec_ok = false;
    refused(&[0x0f, 0x11, 0x08], &mut cpu, &mut mem, Reason::VectorState);
    cpu.vec_ok = true;
    // Register destinations: movups xmm1, xmm2 (0f 11 d1) / movd eax, xmm1
    refused(
        &[0x0f, 0x11, 0xd1],
        &mut cpu,
        &mut mem,
        Reason::NoMemoryWrite,
    );
    refused(
        &[0x66, 0x0f, 0x7e, 0xc8],
        &mut cpu,
        &mut mem,
        Reason::NoMemoryWrite,
    );
    // EVEX vmovups [rax], zmm1 and MMX movq [rax], mm1 are not emulated.
    refused(
        &[0x62, 0xf1, 0x7c, 0x48, 0x11, 0x08],
        &mut cpu,
        &mut mem,
        Reason::Unsupported,
    );
    refused(&[0x0f, 0x7f, 0x08], &mut cpu, &mut mem, Reason::Unsupported);
    // Loads are not stores: movups xmm1, [rax]
    refused(&[0x0f, 0x10, 0x08], &mut cpu, &mut mem, Reason::Unsupported);
}

// ---- refusals --------------------------------------------------------

#[test]
fn unsupported_leaves_everything_unchanged() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = BASE + 0x10;
    cpu.gpr[4] = BASE + 0x800;
    mem.data
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    for code in [
        &[0x48, 0x0f, 0xc7, 0x08][..],         // cmpxchg16b [rax]
        &[0x0f, 0xc7, 0x08],                   // cmpxchg8b [rax]
        &[0xff, 0x30],                         // push qword [rax]
        &[0x50],                               // push rax
        &[0xdd, 0x18],                         // fstp qword [rax]
        &[0x0f, 0xae, 0x00],                   // fxsave [rax]
        &[0x0f, 0x0b],                         // ud2
        &[0x8c, 0x18],                         // mov [rax], ds
        &[0x66, 0x0f, 0x3a, 0x16, 0x00, 0x01], // pextrd [rax], xmm0, 1
        &[0xc4, 0xe2, 0x79, 0x8e, 0x00],       // vpmaskmovd [rax], xmm0, xmm0
    ] {
        refused(code, &mut cpu, &mut mem, Reason::Unsupported);
    }
    for code in [
        &[0x89, 0xd8][..],   // mov eax, ebx
        &[0x03, 0x08],       // add ecx, [rax]
        &[0x8b, 0x08],       // mov ecx, [rax]
        &[0x39, 0x08],       // cmp [rax], ecx
        &[0x01, 0xc8],       // add eax, ecx
        &[0x0f, 0xb1, 0xc8], // cmpxchg eax, ecx
        &[0x0f, 0x94, 0xc0], // sete al
        &[0x87, 0xc8],       // xchg eax, ecx
    ] {
        refused(code, &mut cpu, &mut mem, Reason::NoMemoryWrite);
    }
    // Memory faults: target outside FakeMem.
    cpu.gpr[RAX] = 0x10;
    for code in [
        &[0x89, 0x08][..],   // mov [rax], ecx
        &[0xf0, 0x01, 0x08], // lock add [rax], ecx
        &[0x01, 0x08],       // add [rax], ecx
        &[0x0f, 0xb1, 0x08], // cmpxchg [rax], ecx
        &[0x87, 0x08],       // xchg [rax], ecx
        &[0x0f, 0x11, 0x08], // movups [rax], xmm1
    ] {
        refused(code, &mut cpu, &mut mem, Reason::MemoryFault);
    }
    // Straddling the end of FakeMem: all-or-nothing.
    cpu.gpr[RAX] = BASE + MEM_LEN as u64 - 2;
    refused(&[0x89, 0x08], &mut cpu, &mut mem, Reason::MemoryFault);
}

#[test]
fn garbage_and_truncated_bytes() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = BASE;
    for code in [
        &[][..],
        &[0x89],             // truncated modrm
        &[0xc7, 0x00, 0x78], // truncated imm32
        &[0x48],             // lone REX
        &[0xf0, 0x89, 0x18], // lock mov: #UD
        &[0xf0, 0x01, 0xc8], // lock add eax, ecx: #UD
        &[0x06],             // push es: invalid in 64-bit mode
        &[0x66; 15],         // prefixes only
        &[0xc5],             // truncated VEX
    ] {
        refused(code, &mut cpu, &mut mem, Reason::Undecodable);
        assert_eq!(write_target(code, &cpu), None);
    }
    // Longer slices are fine: only the first instruction counts.
    cpu.gpr[RCX] = 7;
    let long = [0xffu8; 17];
    let long = [&[0x89, 0x08][..], &long[..]].concat();
    assert_eq!(emulate(&long, &mut cpu, &mut mem), Outcome::Emulated); // mov [rax], ecx
    assert_eq!(cpu.rip, CODE + 2);
    assert_eq!(mem.get(BASE, 4), 7);
}

#[test]
fn write_targets() {
    let (mut cpu, _) = setup();
    cpu.gpr[RAX] = BASE + 0x40;
    cpu.gpr[RCX] = 10;
    cpu.gpr[RDI] = BASE + 0x100;
    assert_eq!(write_target(&[0x89, 0x08], &cpu), Some((BASE + 0x40, 4)));
    assert_eq!(
        write_target(&[0x48, 0x0f, 0xc7, 0x08], &cpu),
        Some((BASE + 0x40, 16))
    );
    assert_eq!(write_target(&[0xdd, 0x18], &cpu), Some((BASE + 0x40, 8)));
    assert_eq!(
        write_target(&[0xc5, 0xfe, 0x7f, 0x08], &cpu),
        Some((BASE + 0x40, 32))
    );
    assert_eq!(
        write_target(&[0x0f, 0xae, 0x00], &cpu),
        Some((BASE + 0x40, 512))
    );
    assert_eq!(
        write_target(&[0xf3, 0x48, 0xab], &cpu),
        Some((BASE + 0x100, 80))
    );
    assert_eq!(write_target(&[0x48, 0xab], &cpu), Some((BASE + 0x100, 8)));
    cpu.rflags |= DF;
    assert_eq!(
        write_target(&[0xf3, 0x48, 0xab], &cpu),
        Some((BASE + 0x100 - 72, 80))
    );
    assert_eq!(
        write_target(&[0xf3, 0xa4], &cpu),
        Some((BASE + 0x100 - 9, 10))
    );
    cpu.gpr[RCX] = 0;
    assert_eq!(write_target(&[0xf3, 0xa4], &cpu), None);
    assert_eq!(write_target(&[0x39, 0x08], &cpu), None); // cmp [rax], ecx
    assert_eq!(write_target(&[0xff, 0x30], &cpu), None); // push qword [rax]
    assert_eq!(write_target(&[0x8b, 0x08], &cpu), None); // mov ecx, [rax]
    assert_eq!(write_target(&[0x0f, 0x18, 0x08], &cpu), None); // prefetcht0 [rax]
    assert_eq!(write_target(&[0x64, 0x89, 0x08], &cpu), None); // unknown FS base
    cpu.fs = Some(0x1000);
    assert_eq!(
        write_target(&[0x64, 0x89, 0x08], &cpu),
        Some((BASE + 0x1040, 4))
    );
    // movdir64b rax, [rcx]: 66 0f 38 f8 01 -> 64 bytes at RAX
    assert_eq!(
        write_target(&[0x66, 0x0f, 0x38, 0xf8, 0x01], &cpu),
        Some((BASE + 0x40, 64))
    );
    // pop qword [rsp+8]: address uses RSP after the pop
    cpu.gpr[4] = BASE + 0x200;
    assert_eq!(
        write_target(&[0x8f, 0x44, 0x24, 0x08], &cpu),
        Some((BASE + 0x210, 8))
    );
}
