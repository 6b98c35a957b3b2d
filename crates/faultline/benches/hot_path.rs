//! Criterion benches of the fault path's building blocks: the region-table
//! lookup (seed 000 Algorithm 1), the residency map, and one resolve ioctl.
//! `cargo bench -p faultline --bench hot_path`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use faultline::interval::SnapshotTable;
use faultline::residency::{PageState, Residency};
use faultline_sys::mem::Mapping;
use faultline_sys::uffd::{mode, register_mode};

fn lookup(c: &mut Criterion) {
    for n in [1u64, 16, 256, 4096] {
        let t = SnapshotTable::<u64>::new();
        for i in 0..n {
            let s = 0x1000_0000 + i * 0x10_0000;
            t.insert(s, s + 0x8_0000, i).unwrap();
        }
        let probe = 0x1000_0000 + (n / 2) * 0x10_0000 + 0x1234;
        c.bench_function(&format!("table read+lookup, {n} regions"), |b| {
            b.iter(|| {
                let g = t.read();
                black_box(g.lookup(black_box(probe)).map(|i| i.value))
            })
        });
    }
}

fn residency(c: &mut Criterion) {
    let r = Residency::new(1 << 20);
    c.bench_function("residency get", |b| {
        b.iter(|| black_box(r.get(black_box(12345))))
    });
    c.bench_function("residency set", |b| {
        b.iter(|| r.set(black_box(12345), PageState::Writable))
    });
    c.bench_function("residency claim+release", |b| {
        b.iter(|| {
            let ok = r.try_claim(black_box(777));
            r.release(777..778);
            black_box(ok)
        })
    });
    r.set_range(0..4096, PageState::Writable);
    c.bench_function("residency is_resident 4096 pages", |b| {
        b.iter(|| black_box(r.is_resident(black_box(0..4096))))
    });
}

fn resolve_ioctl(c: &mut Criterion) {
    let Ok(uffd) = faultline::caps::open_uffd(true, 0) else {
        eprintln!("SKIP resolve ioctl benches: no userfaultfd");
        return;
    };
    let pages = 1 << 16;
    let map = Mapping::anon(pages * 4096).unwrap();
    map.advise(0, map.len(), faultline_sys::mem::Advice::NoHugePage)
        .unwrap();
    uffd.register(map.addr(), map.len() as u64, register_mode::MISSING)
        .unwrap();
    let src = Mapping::anon(4096).unwrap();
    // SAFETY: writing our own fresh page.
    unsafe { src.as_ptr().write_bytes(7, 4096) };
    let mut next = 0usize;
    let fresh = |next: &mut usize| {
        if *next == pages {
            // Drop everything (no fault is pending, no event is enabled).
            map.advise(0, map.len(), faultline_sys::mem::Advice::DontNeed)
                .unwrap();
            *next = 0;
        }
        *next += 1;
        map.addr() + ((*next - 1) * 4096) as u64
    };
    c.bench_function("UFFDIO_COPY 4 KiB", |b| {
        b.iter_batched(
            || fresh(&mut next),
            |dst| {
                // SAFETY: `src` is a readable 4 KiB page.
                let out = unsafe { uffd.copy(dst, src.as_ptr(), 4096, mode::COPY_DONTWAKE) };
                black_box(out.unwrap())
            },
            BatchSize::SmallInput,
        )
    });
    c.bench_function("UFFDIO_ZEROPAGE 4 KiB", |b| {
        b.iter_batched(
            || fresh(&mut next),
            |dst| black_box(uffd.zeropage(dst, 4096, mode::ZEROPAGE_DONTWAKE).unwrap()),
            BatchSize::SmallInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2));
    targets = lookup, residency, resolve_ioctl
}
criterion_main!(benches);
