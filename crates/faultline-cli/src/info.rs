//! `faultline info`: what this kernel and process can do, probed.

use faultline::caps::{capabilities, feature_names, op_unusable};
use faultline::{EngineKind, MemoryKind};
use faultline_sys::uffd::{feature, ioctl_bit};

/// Prints the capability report.
pub fn run() -> anyhow::Result<()> {
    let c = capabilities();
    println!("kernel            {}", c.kernel);
    println!("userfaultfd creation paths (tried in order):");
    for (p, r) in &c.creation {
        match r {
            Ok(()) => println!("  {:<38} ok", p.name()),
            Err(e) => println!("  {:<38} FAILED: {e}", p.name()),
        }
    }
    match c.path {
        Some(p) => println!("using             {}", p.name()),
        None => {
            println!("using             none: userfaultfd is unavailable here (seccomp, gVisor, or a kernel without CONFIG_USERFAULTFD)");
            return Ok(());
        }
    }
    println!("features          {:#x}", c.features);
    for (bit, name) in feature::ALL {
        let yes = c.features & bit != 0;
        println!("  {:<22} {}", name, if yes { "yes" } else { "no" });
    }
    let unknown = c.features & !feature::ALL.iter().fold(0, |a, (b, _)| a | b);
    if unknown != 0 {
        println!("  (bits this build does not know: {unknown:#x})");
    }
    println!(
        "hugetlb pool      {} free 2 MiB pages{}",
        c.hugetlb_free,
        if c.hugetlb_free == 0 {
            " (as root: echo N > /proc/sys/vm/nr_hugepages)"
        } else {
            ""
        }
    );
    println!();
    for kind in [
        MemoryKind::PrivateAnon,
        MemoryKind::Shmem,
        MemoryKind::Hugetlb,
    ] {
        let k = c.kind(kind);
        match &k.ioctls {
            Ok(bits) => {
                let granted: Vec<&str> = ioctl_bit::RANGE
                    .iter()
                    .filter(|(b, _)| bits & (1 << b) != 0)
                    .map(|(_, n)| *n)
                    .collect();
                println!(
                    "memory kind {:<13} REGISTER grants: {}",
                    kind.name(),
                    granted.join(" ")
                );
            }
            Err(why) => {
                println!("memory kind {:<13} unusable: {why}", kind.name());
                continue;
            }
        }
        println!("  resolve ops:");
        for (bit, name, what) in [
            (
                ioctl_bit::COPY,
                "COPY",
                "install a copy of the store's bytes",
            ),
            (
                ioctl_bit::ZEROPAGE,
                "ZEROPAGE",
                "map the zero page on a read of a zero store",
            ),
            (
                ioctl_bit::MOVE,
                "MOVE",
                "move a pre-touched page in, zero-copy",
            ),
            (
                ioctl_bit::CONTINUE,
                "CONTINUE",
                "map a page already in the page cache (minor fault)",
            ),
            (
                ioctl_bit::POISON,
                "POISON",
                "fail a page closed after a store error",
            ),
            (
                ioctl_bit::WRITEPROTECT,
                "WRITEPROTECT",
                "write-protect for dirty tracking/watchpoints",
            ),
        ] {
            let verdict = match (bit, kind) {
                (ioctl_bit::CONTINUE, MemoryKind::PrivateAnon) => {
                    Some("minor faults exist only for shmem and hugetlb".to_string())
                }
                (ioctl_bit::ZEROPAGE, MemoryKind::Hugetlb) => Some("not for hugetlb".into()),
                // Granted only to ranges registered in WP mode, which regions
                // do not use yet; say what the kernel offers.
                (ioctl_bit::WRITEPROTECT, _) => {
                    let need = match kind {
                        MemoryKind::PrivateAnon => feature::PAGEFAULT_FLAG_WP,
                        _ => feature::WP_HUGETLBFS_SHMEM,
                    };
                    if c.features & need == need {
                        println!(
                            "    {:<13} yes  (with REGISTER_MODE_WP; {what})",
                            "WRITEPROTECT"
                        );
                        continue;
                    }
                    Some(format!("kernel lacks {}", feature_names(need).join(", ")))
                }
                _ => op_unusable(kind, bit),
            };
            match verdict {
                None => println!("    {name:<13} yes  ({what})"),
                Some(why) => println!("    {name:<13} no   ({why})"),
            }
        }
        println!("  engines:");
        for e in EngineKind::ALL {
            match e.usable_on(k.kind) {
                Ok(()) => println!("    {:<13} yes", e.name()),
                Err(why) => println!("    {:<13} no   ({why})", e.name()),
            }
        }
    }
    let missing = feature::ALL.iter().fold(0, |a, (b, _)| a | b) & !c.features;
    if missing != 0 {
        println!("\nmissing features: {}", feature_names(missing).join(", "));
    }
    Ok(())
}
