//! The `sys` layer against the real kernel: each resolve ioctl's outcome
//! keeps the kernel's meaning (done, partial, already there, gone). No
//! thread waits on these faults, so nothing here can block.

use faultline_sys::mem::{self, Mapping};
use faultline_sys::uffd::{feature, ioctl_bit, mode, register_mode, Msg, Outcome, Uffd, UffdMsg};

const P: u64 = 4096;

fn uffd(features: u64) -> Uffd {
    faultline::caps::open_uffd(true, features).expect("userfaultfd")
}

fn anon(pages: u64, fd: &Uffd, rmode: u64) -> Mapping {
    let m = Mapping::anon((pages * P) as usize).unwrap();
    m.advise(0, m.len(), faultline_sys::mem::Advice::NoHugePage)
        .unwrap();
    let granted = fd.register(m.addr(), m.len() as u64, rmode).unwrap();
    assert!(granted & (1 << ioctl_bit::COPY) != 0);
    m
}

fn byte(m: &Mapping, off: u64) -> u8 {
    // SAFETY: `off` is inside `m` and the page is populated by the caller.
    unsafe { m.as_ptr().add(off as usize).read_volatile() }
}

#[test]
fn copy_done_exists_and_partial() {
    let fd = uffd(0);
    let m = anon(8, &fd, register_mode::MISSING);
    let src = vec![0xABu8; 4 * P as usize];
    // SAFETY: `src` is readable for the lengths used.
    let out = unsafe { fd.copy(m.addr() + P, src.as_ptr(), P, mode::COPY_DONTWAKE) }.unwrap();
    assert_eq!(out, Outcome::Done(P as usize));
    assert_eq!(byte(&m, P + 5), 0xAB);
    // SAFETY: as above.
    let out = unsafe { fd.copy(m.addr() + P, src.as_ptr(), P, 0) }.unwrap();
    assert_eq!(out, Outcome::Exists);
    // Pages 0..4 with page 1 present: the kernel copies page 0, stops.
    // SAFETY: as above.
    let out = unsafe { fd.copy(m.addr(), src.as_ptr(), 4 * P, 0) }.unwrap();
    assert!(
        matches!(out, Outcome::Partial { done, .. } if done == P as usize),
        "{out:?}"
    );
    // Unaligned destination: an error with the errno kept.
    // SAFETY: as above.
    let err = unsafe { fd.copy(m.addr() + 1, src.as_ptr(), P, 0) }.unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    assert!(err.to_string().contains("UFFDIO_COPY"));
}

#[test]
fn copy_mode_wp_and_writeprotect() {
    let fd = uffd(feature::PAGEFAULT_FLAG_WP);
    let m = anon(4, &fd, register_mode::MISSING | register_mode::WP);
    let src = vec![1u8; P as usize];
    // SAFETY: readable source.
    let out = unsafe { fd.copy(m.addr(), src.as_ptr(), P, mode::COPY_WP) }.unwrap();
    assert_eq!(out, Outcome::Done(P as usize));
    assert_eq!(byte(&m, 0), 1);
    fd.writeprotect(m.addr(), P, false, false).unwrap();
    // SAFETY: the page is present and no longer write-protected.
    unsafe { m.as_ptr().write_volatile(2) };
    assert_eq!(byte(&m, 0), 2);
    fd.writeprotect(m.addr(), P, true, false).unwrap();
    let err = fd.writeprotect(m.addr() + 1, P, true, false).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
}

#[test]
fn zeropage_wake_and_unregister() {
    let fd = uffd(0);
    let m = anon(4, &fd, register_mode::MISSING);
    assert_eq!(
        fd.zeropage(m.addr(), 2 * P, 0).unwrap(),
        Outcome::Done(2 * P as usize)
    );
    assert_eq!(byte(&m, P + 7), 0);
    assert_eq!(fd.zeropage(m.addr(), P, 0).unwrap(), Outcome::Exists);
    fd.wake(m.addr(), 4 * P).unwrap();
    fd.unregister(m.addr(), 4 * P).unwrap();
    // Unregistered: the range is gone for resolve ioctls.
    assert!(matches!(
        fd.zeropage(m.addr() + 2 * P, P, 0),
        Ok(Outcome::Gone(_)) | Err(_)
    ));
}

#[test]
fn move_and_allow_src_holes() {
    let caps = faultline::capabilities();
    if !caps.has(feature::MOVE) {
        eprintln!("SKIP: kernel lacks UFFD_FEATURE_MOVE");
        return;
    }
    let fd = uffd(feature::MOVE);
    let m = anon(4, &fd, register_mode::MISSING);
    let src = Mapping::anon(4 * P as usize).unwrap();
    src.advise(0, src.len(), faultline_sys::mem::Advice::NoHugePage)
        .unwrap();
    // SAFETY: our own fresh mapping.
    unsafe { src.as_ptr().write_bytes(0x5C, P as usize) };
    // SAFETY: the source page is ours and referenced by nothing.
    let out = unsafe { fd.move_pages(m.addr(), src.addr(), P, 0) }.unwrap();
    assert_eq!(out, Outcome::Done(P as usize));
    assert_eq!(byte(&m, 100), 0x5C);
    // The source is a hole now: ENOENT, reported as Gone...
    // SAFETY: as above.
    let out = unsafe { fd.move_pages(m.addr() + P, src.addr(), P, 0) }.unwrap();
    assert!(
        matches!(out, Outcome::Gone(e) if e.0 == libc::ENOENT),
        "{out:?}"
    );
    // ...unless holes are allowed (nothing moved, nothing failed).
    // SAFETY: as above.
    let out = unsafe { fd.move_pages(m.addr() + P, src.addr(), P, mode::MOVE_ALLOW_SRC_HOLES) };
    assert!(matches!(out, Ok(Outcome::Done(_))), "{out:?}");
}

#[test]
fn continue_on_shmem_and_poison() {
    let fd = uffd(feature::MISSING_SHMEM | feature::MINOR_SHMEM | feature::POISON);
    let memfd = mem::memfd("sys-test", false).unwrap();
    mem::ftruncate(&memfd, 4 * P).unwrap();
    let view = Mapping::shared(&memfd, 4 * P as usize, 0).unwrap();
    let alias = Mapping::shared(&memfd, 4 * P as usize, 0).unwrap();
    let granted = fd
        .register(
            view.addr(),
            4 * P,
            register_mode::MISSING | register_mode::MINOR,
        )
        .unwrap();
    assert!(granted & (1 << ioctl_bit::CONTINUE) != 0);
    // Fill the page cache through the unregistered alias, then map it.
    // SAFETY: the alias is ours and unregistered.
    unsafe { alias.as_ptr().write_bytes(0x42, P as usize) };
    assert_eq!(
        fd.continue_(view.addr(), P, 0).unwrap(),
        Outcome::Done(P as usize)
    );
    assert_eq!(byte(&view, 10), 0x42);
    assert_eq!(fd.continue_(view.addr(), P, 0).unwrap(), Outcome::Exists);
    // CONTINUE without a page-cache page fails; the errno is kept.
    assert!(fd.continue_(view.addr() + P, P, 0).is_err());
    assert_eq!(
        fd.poison(view.addr() + 2 * P, P, 0).unwrap(),
        Outcome::Done(P as usize)
    );
}

#[test]
fn batched_reads_decode_pagefault_messages() {
    // A thread below blocks in a fault: never let a bug hang the run.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        if !d.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("batched_reads_decode_pagefault_messages: deadline exceeded");
            std::process::abort();
        }
    });
    // A fault taken inside a syscall on a uffd without SIGBUS queues a
    // message; reading it from a non-blocking fd must not block.
    let fd = uffd(feature::THREAD_ID);
    let m = anon(2, &fd, register_mode::MISSING);
    let mut buf = [UffdMsg::ZERO; 8];
    assert_eq!(fd.read_msgs(&mut buf).unwrap(), 0, "nothing pending");
    let addr = m.addr();
    let t = std::thread::spawn(move || {
        // SAFETY: the region is mapped; this read faults and waits for us.
        unsafe { (addr as *const u8).add(4096 + 9).read_volatile() }
    });
    let mut n = 0;
    for _ in 0..5000 {
        n = fd.read_msgs(&mut buf).unwrap();
        if n > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(n, 1);
    match buf[0].decode() {
        Msg::PageFault {
            addr: a,
            flags,
            tid,
        } => {
            assert_eq!(a, m.addr() + P);
            assert_eq!(flags & 1, 0, "a read");
            assert_ne!(tid, 0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fd.zeropage(m.addr() + P, P, 0).unwrap(),
        Outcome::Done(P as usize)
    );
    assert_eq!(t.join().unwrap(), 0);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
}
