//! `--kvm`: the vCPUs are KVM vCPUs, so the guest's reads of its memory
//! fault in the kernel (an EPT violation, then KVM's `get_user_pages` on
//! the VMM's mapping, which waits in `handle_userfault`), as a real
//! VMM's guest does, instead of in the peer's own user-space loads.
//!
//! ```text
//!   guest physical                      the peer's address space
//!   0            region 0 ───────────── slot 0: region 0 (registered)
//!   size0        region 1 ───────────── slot 1: region 1 (registered)
//!   ...
//!   ctl (2 MiB aligned, above)  code + one table per vCPU ── slot N:
//!                                          anonymous, not registered
//! ```
//!
//! Each vCPU starts in 32-bit protected mode with flat segments (no GDT
//! in guest memory, no paging) at the code page, with `esi` at its table
//! of guest-physical page addresses (its share of the working set, in
//! order) and `ecx` the count. The code adds the first 32-bit word of
//! each page into `eax`, writes `eax` to an I/O port (an exit to the
//! peer) and halts. The peer compares each vCPU's sum with the same
//! words read from the memory file; the byte-for-byte check of the pages
//! (`verify`) follows, as for the user-space touches.

use std::os::unix::fs::FileExt;
use std::time::Instant;

use anyhow::{bail, Context};
use faultline_sys::mem::Mapping;
use kvm_bindings::{kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit};

use super::args::PeerArgs;
use super::layout::{Layout, PAGE};
use super::procfs;
use super::vcpu::{mine, Thread, Touched};

/// The port the guest writes its sum to.
const PORT: u16 = 0x3f0;

/// The guest's code (32-bit):
///
/// ```text
///   0: 8b 1e      loop: mov ebx, [esi]     ; next page's address
///   2: 03 03            add eax, [ebx]     ; its first word
///   4: 83 c6 04         add esi, 4
///   7: 49               dec ecx
///   8: 75 f6            jnz loop
///  10: ef               out dx, eax        ; the sum, to PORT
///  11: f4               hlt
/// ```
const CODE: [u8; 12] = [
    0x8b, 0x1e, 0x03, 0x03, 0x83, 0xc6, 0x04, 0x49, 0x75, 0xf6, 0xef, 0xf4,
];

/// Where KVM may put the TSS it needs on Intel hosts without unrestricted
/// guest support (three pages): above every slot.
const TSS: usize = 0xfffb_d000;

/// Runs `ws` on `args.threads` KVM vCPUs over `layout` and checks each
/// vCPU's sum against `file`.
pub fn touch(
    args: &PeerArgs,
    file: &std::fs::File,
    layout: &Layout,
    ws: &[(usize, usize)],
) -> anyhow::Result<Touched> {
    // Guest-physical addresses: the regions back to back from 0 (each a
    // multiple of the page size: 2 MiB aligned with --huge, so KVM can
    // map the guest's huge pages whole).
    let mut gpa = Vec::with_capacity(layout.regions.len());
    let mut total = 0u64;
    for &(_, len, _) in &layout.regions {
        gpa.push(total);
        total += len as u64;
    }
    let n = args.threads.max(1);
    let shares: Vec<Vec<(usize, usize)>> = (0..n)
        .map(|t| {
            ws.iter()
                .enumerate()
                .filter(|&(i, _)| mine(args.pattern, i, t, n, ws.len()))
                .map(|(_, &p)| p)
                .collect()
        })
        .collect();
    let ctl_gpa = total.next_multiple_of(2 << 20);
    let ctl_len = (PAGE + 4 * ws.len()).next_multiple_of(PAGE);
    if ctl_gpa as usize + ctl_len > TSS {
        bail!("--kvm: the guest's memory ({total} bytes) and its tables must fit under {TSS:#x}");
    }
    let ctl = Mapping::anon(ctl_len).context("mapping the guest's code page")?;
    // SAFETY: `ctl` is a fresh private mapping of `ctl_len` bytes that
    // nothing else refers to yet; the slice ends before the VM exists.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ctl.as_ptr(), ctl_len) };
    bytes[..CODE.len()].copy_from_slice(&CODE);
    // Each vCPU's table. (The sums the file says the guest must read are
    // read once it ran: the restore is timed from the hand-off, and a
    // read of the file per page before the guest started counted in every
    // row, the kernel's too.)
    let mut tables = Vec::with_capacity(n);
    let mut at = PAGE;
    for share in &shares {
        tables.push((ctl_gpa + at as u64, share.len()));
        for &(r, p) in share {
            let page_gpa = gpa[r] + (p * PAGE) as u64;
            bytes[at..at + 4].copy_from_slice(&(page_gpa as u32).to_le_bytes());
            at += 4;
        }
    }

    let kvm = Kvm::new().context("opening /dev/kvm")?;
    let vm = kvm.create_vm().context("KVM_CREATE_VM")?;
    vm.set_tss_address(TSS).context("KVM_SET_TSS_ADDR")?;
    let slots = layout
        .regions
        .iter()
        .zip(&gpa)
        .map(|(&(base, len, _), &g)| (g, len, base))
        .chain(std::iter::once((ctl_gpa, ctl_len, ctl.addr())));
    for (slot, (guest_phys_addr, len, userspace_addr)) in slots.enumerate() {
        let region = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr,
            memory_size: len as u64,
            userspace_addr,
        };
        // SAFETY: the host range is one of the peer's own mappings
        // (`layout.maps`, `ctl`), which outlive the VM (dropped at the end
        // of this function, before them).
        unsafe { vm.set_user_memory_region(region) }.context("KVM_SET_USER_MEMORY_REGION")?;
    }
    let code = kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: 0x8,
        type_: 0xb,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    let data = kvm_segment {
        selector: 0x10,
        type_: 0x3,
        ..code
    };
    let mut vcpus = Vec::new();
    for (t, &(table, count)) in tables.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let vcpu = vm
            .create_vcpu(t as u64)
            .with_context(|| format!("KVM_CREATE_VCPU {t}"))?;
        let mut s = vcpu.get_sregs()?;
        (s.cs, s.ds, s.es, s.fs, s.gs, s.ss) = (code, data, data, data, data, data);
        s.cr0 |= 1; // protected mode, no paging
        vcpu.set_sregs(&s)?;
        let mut r = vcpu.get_regs()?;
        r.rip = ctl_gpa;
        r.rsi = table;
        r.rcx = count as u64;
        r.rdx = PORT as u64;
        r.rax = 0;
        r.rflags = 2;
        vcpu.set_regs(&r)?;
        vcpus.push((t, vcpu));
    }
    let vcpus_ns = faultline_sys::monotonic_ns();
    let handles: Vec<_> = vcpus
        .into_iter()
        .map(|(t, mut vcpu)| {
            std::thread::Builder::new()
                .name(format!("fl-peer-kvm-{t}"))
                .spawn(move || -> anyhow::Result<_> {
                    let switches = procfs::thread_switches();
                    let first_ns = faultline_sys::monotonic_ns();
                    let mut sum = None;
                    loop {
                        match vcpu.run().with_context(|| format!("KVM_RUN on vCPU {t}"))? {
                            VcpuExit::IoOut(PORT, d) if d.len() == 4 => {
                                sum = Some(u32::from_le_bytes(d.try_into().expect("4 bytes")));
                            }
                            VcpuExit::Hlt => break,
                            other => bail!("vCPU {t} exited with {other:?}"),
                        }
                    }
                    let (end, end_ns) = (Instant::now(), faultline_sys::monotonic_ns());
                    let after = procfs::thread_switches();
                    let sum = sum.with_context(|| format!("vCPU {t} halted without its sum"))?;
                    let thread = Thread {
                        end,
                        span_ns: (first_ns, end_ns),
                        switches: (after.0 - switches.0, after.1 - switches.1),
                        latencies: Vec::new(),
                        stamps: Vec::new(),
                    };
                    Ok((t, sum, thread))
                })
        })
        .collect::<Result<_, _>>()?;
    let mut threads = Vec::with_capacity(handles.len());
    let mut sums = Vec::with_capacity(handles.len());
    for h in handles {
        let (t, sum, thread) = h.join().expect("vCPU thread")?;
        sums.push((t, sum));
        threads.push(thread);
    }
    let touched = Touched::of(vcpus_ns, threads);
    for (t, sum) in sums {
        let mut want = 0u32;
        for &(r, p) in &shares[t] {
            let mut word = [0u8; 4];
            file.read_exact_at(&mut word, layout.regions[r].2 + (p * PAGE) as u64)
                .with_context(|| format!("reading {}", args.mem.display()))?;
            want = want.wrapping_add(u32::from_le_bytes(word));
        }
        if sum != want {
            bail!(
                "vCPU {t} read pages whose first words sum to {sum:#x}; in {} they sum to {want:#x}",
                args.mem.display()
            );
        }
    }
    drop(vm);
    drop(ctl);
    Ok(touched)
}
