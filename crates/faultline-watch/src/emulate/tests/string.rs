//! `[REP] STOS`/`MOVS`: sizes, counts, both directions, page ends,
//! overlapping copies in element order.

use super::*;

/// Emulates until the instruction completes (REP may take several calls).
fn run_to_completion(code: &[u8], cpu: &mut FakeCpu, mem: &mut FakeMem) -> usize {
    let start = cpu.rip;
    for calls in 1..1000 {
        assert_eq!(emulate(code, cpu, mem), Outcome::Emulated);
        if cpu.rip != start {
            assert_eq!(cpu.rip, start + code.len() as u64);
            return calls;
        }
    }
    panic!("REP instruction never completed");
}

#[test]
fn rep_stosb_forward_and_backward() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = 0x1234_56ab;
    cpu.gpr[RDI] = BASE + 0x100;
    cpu.gpr[RCX] = 300;
    ok(&[0xf3, 0xaa], &mut cpu, &mut mem); // rep stosb
    assert!(mem.data[0x100..0x100 + 300].iter().all(|&b| b == 0xab));
    assert_eq!(mem.data[0xff], 0);
    assert_eq!(mem.data[0x100 + 300], 0);
    assert_eq!(cpu.gpr[RDI], BASE + 0x100 + 300);
    assert_eq!(cpu.gpr[RCX], 0);

    let (mut cpu, mut mem) = setup();
    cpu.rflags |= DF;
    cpu.gpr[RAX] = 0xcd;
    cpu.gpr[RDI] = BASE + 0x400;
    cpu.gpr[RCX] = 300;
    ok(&[0xf3, 0xaa], &mut cpu, &mut mem); // std; rep stosb
    let lo = 0x400 - 299;
    assert!(mem.data[lo..=0x400].iter().all(|&b| b == 0xcd));
    assert_eq!(mem.data[lo - 1], 0);
    assert_eq!(mem.data[0x401], 0);
    assert_eq!(cpu.gpr[RDI], BASE + 0x400 - 300);
    assert_eq!(cpu.gpr[RCX], 0);
    assert_eq!(cpu.rflags, 0x202 | DF);
}

#[test]
fn stos_sizes_counts_and_pages() {
    let (mut cpu, mut mem) = setup();
    cpu.gpr[RAX] = 0x0102_0304_0506_0708;
    cpu.gpr[RDI] = BASE + 0x10;
    cpu.gpr[RCX] = 5;
    ok(&[0xf3, 0x48, 0xab], &mut cpu, &mut mem); // rep stosq
    for i in 0..5 {
        assert_eq!(mem.get(BASE + 0x10 + 8 * i, 8), 0x0102_0304_0506_0708);
    }
    assert_eq!(cpu.gpr[RDI], BASE + 0x10 + 40);
    // rep stosw, DF=1, 3 elements
    cpu.rflags |= DF;
    cpu.gpr[RDI] = BASE + 0x100;
    cpu.gpr[RCX] = 3;
    ok(&[0x66, 0xf3, 0xab], &mut cpu, &mut mem);
    assert_eq!(mem.at(BASE + 0xfc, 6), &[8, 7, 8, 7, 8, 7]);
    assert_eq!(cpu.gpr[RDI], BASE + 0x100 - 6);
    cpu.rflags &= !DF;
    // stosd without REP ignores RCX.
    cpu.gpr[RDI] = BASE + 0x200;
    cpu.gpr[RCX] = 77;
    ok(&[0xab], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x200, 8), 0x0506_0708);
    assert_eq!(cpu.gpr[RDI], BASE + 0x204);
    assert_eq!(cpu.gpr[RCX], 77);
    // REPNE behaves as REP for STOS.
    cpu.gpr[RCX] = 2;
    ok(&[0xf2, 0xab], &mut cpu, &mut mem);
    assert_eq!(cpu.gpr[RCX], 0);
    assert_eq!(cpu.gpr[RDI], BASE + 0x20c);
    // RCX == 0: nothing written, RIP advanced.
    let before = mem.clone();
    cpu.gpr[RDI] = BASE + 0x300;
    ok(&[0xf3, 0xaa], &mut cpu, &mut mem);
    assert_eq!(mem, before);
    assert_eq!(cpu.gpr[RDI], BASE + 0x300);
    // Across a page boundary: completes over two calls.
    cpu.gpr[RDI] = BASE + 0x1000 - 10;
    cpu.gpr[RCX] = 100;
    let rip = cpu.rip;
    assert_eq!(
        emulate(&[0xf3, 0xaa], &mut cpu, &mut mem),
        Outcome::Emulated
    );
    assert_eq!(
        (cpu.rip, cpu.gpr[RCX], cpu.gpr[RDI]),
        (rip, 90, BASE + 0x1000)
    );
    assert_eq!(run_to_completion(&[0xf3, 0xaa], &mut cpu, &mut mem), 1);
    assert!(mem.data[0x1000 - 10..0x1000 + 90]
        .iter()
        .all(|&b| b == 0x08));
    assert_eq!(cpu.gpr[RCX], 0);
    // Fault on the first element: nothing happens.
    cpu.gpr[RDI] = BASE + MEM_LEN as u64;
    cpu.gpr[RCX] = 4;
    refused(&[0xf3, 0xaa], &mut cpu, &mut mem, Reason::MemoryFault);
    // Fault after some progress: partial, architecturally resumable.
    cpu.gpr[RDI] = BASE + MEM_LEN as u64 - 3;
    ok(&[0xaa], &mut cpu, &mut mem);
    let rip = cpu.rip;
    // FakeMem now ends 100 bytes before a page boundary; the second
    // 256-byte chunk straddles its end.
    mem.data.truncate(MEM_LEN - 100);
    cpu.gpr[RDI] = BASE + MEM_LEN as u64 - 400;
    cpu.gpr[RCX] = 1000;
    assert_eq!(
        emulate(&[0xf3, 0xaa], &mut cpu, &mut mem),
        Outcome::Emulated
    );
    assert_eq!(cpu.rip, rip);
    assert_eq!(cpu.gpr[RCX], 1000 - 256);
    assert_eq!(cpu.gpr[RDI], BASE + MEM_LEN as u64 - 400 + 256);
    // Resuming faults on the first element: NotEmulated, no change.
    refused(&[0xf3, 0xaa], &mut cpu, &mut mem, Reason::MemoryFault);
    // 32-bit addressing (67 f3 aa) is not emulated.
    refused(&[0x67, 0xf3, 0xaa], &mut cpu, &mut mem, Reason::Unsupported);
}

/// Element-by-element reference for MOVS.
fn movs_reference(mem: &mut [u8], src: usize, dst: usize, size: usize, count: usize, df: bool) {
    for i in 0..count {
        let (s, d) = if df {
            (src - i * size, dst - i * size)
        } else {
            (src + i * size, dst + i * size)
        };
        let e = mem[s..s + size].to_vec();
        mem[d..d + size].copy_from_slice(&e);
    }
}

#[test]
fn rep_movsb_basic() {
    let (mut cpu, mut mem) = setup();
    for (i, b) in mem.data.iter_mut().enumerate() {
        *b = i as u8 ^ 0x5a;
    }
    let expect: Vec<u8> = mem.data[0x100..0x100 + 600].to_vec();
    cpu.gpr[RSI] = BASE + 0x100;
    cpu.gpr[RDI] = BASE + 0x800;
    cpu.gpr[RCX] = 600;
    ok(&[0xf3, 0xa4], &mut cpu, &mut mem); // rep movsb
    assert_eq!(&mem.data[0x800..0x800 + 600], &expect[..]);
    assert_eq!(
        (cpu.gpr[RSI], cpu.gpr[RDI], cpu.gpr[RCX]),
        (BASE + 0x358, BASE + 0xa58, 0)
    );
    // Overlapping forward copy (dst = src + 1) replicates the first byte.
    cpu.gpr[RSI] = BASE + 0x200;
    cpu.gpr[RDI] = BASE + 0x201;
    cpu.gpr[RCX] = 50;
    let first = mem.data[0x200];
    ok(&[0xf3, 0xa4], &mut cpu, &mut mem);
    assert!(mem.data[0x200..0x200 + 51].iter().all(|&b| b == first));
    // movsq without REP, with an FS source override.
    cpu.fs = Some(BASE);
    cpu.gpr[RSI] = 0x300;
    cpu.gpr[RDI] = BASE + 0x3000;
    let v = mem.get(BASE + 0x300, 8);
    ok(&[0x64, 0x48, 0xa5], &mut cpu, &mut mem);
    assert_eq!(mem.get(BASE + 0x3000, 8), v);
    assert_eq!((cpu.gpr[RSI], cpu.gpr[RDI]), (0x308, BASE + 0x3008));
    cpu.fs = None;
    refused(&[0x64, 0x48, 0xa5], &mut cpu, &mut mem, Reason::Segment);
}

#[test]
fn movs_matches_element_order() {
    let mut rng = SmallRng::seed_from_u64(7);
    let codes: [(&[u8], usize); 4] = [
        (&[0xf3, 0xa4], 1),
        (&[0xf3, 0x66, 0xa5], 2),
        (&[0xf3, 0xa5], 4),
        (&[0xf3, 0x48, 0xa5], 8),
    ];
    for _ in 0..2000 {
        let (code, size) = codes[rng.gen_range(0..4)];
        let df = rng.gen_bool(0.5);
        let count = rng.gen_range(0..700usize);
        let span = count * size;
        let (lo, hi) = if df {
            (span, MEM_LEN - size)
        } else {
            (0, MEM_LEN - span - size)
        };
        if lo > hi {
            continue;
        }
        let src = rng.gen_range(lo..=hi);
        let near = rng.gen_range(-40i64..40) as isize;
        let dst = if rng.gen_bool(0.5) {
            src.checked_add_signed(near)
                .filter(|d| (lo..=hi).contains(d))
                .unwrap_or(src)
        } else {
            rng.gen_range(lo..=hi)
        };
        let (mut cpu, mut mem) = setup();
        rng.fill(&mut mem.data[..]);
        let mut expect = mem.data.clone();
        movs_reference(&mut expect, src, dst, size, count, df);
        cpu.gpr[RSI] = BASE + src as u64;
        cpu.gpr[RDI] = BASE + dst as u64;
        cpu.gpr[RCX] = count as u64;
        if df {
            cpu.rflags |= DF;
        }
        run_to_completion(code, &mut cpu, &mut mem);
        assert!(
            mem.data == expect,
            "size {size} df {df} count {count} src {src:#x} dst {dst:#x}"
        );
        let delta = |a: usize| {
            if df {
                BASE + a as u64 - span as u64
            } else {
                BASE + (a + span) as u64
            }
        };
        assert_eq!(
            (cpu.gpr[RSI], cpu.gpr[RDI], cpu.gpr[RCX]),
            (delta(src), delta(dst), 0)
        );
    }
}
