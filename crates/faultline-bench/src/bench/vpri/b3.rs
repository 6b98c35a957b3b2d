//! B3 (Figs 4-5, NIC): UDP datagrams over loopback received into a ring
//! of 2 KiB buffers in a region whose budget (a quarter of the ring) the
//! evictor keeps cycling, signal engine, at a fixed rate:
//!
//! * plain `recv`: a buffer page that is not there makes `recv` fail with
//!   EFAULT and the datagram is lost (the page is then brought in);
//! * the I/O API (`faultline_io`, ordered queue): the receive waits for
//!   its page instead, nothing is lost.
//!
//! Reported per mode: datagrams sent, received, lost, EFAULTs, I/O faults,
//! pages evicted; the receive rate over time as a figure.

use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::policy::PolicyKind;
use faultline::store::FileAccess;
use faultline::{EvictionConfig, FileStore, Region, SignalEngine};
use faultline_io::{Backend, DeviceConfig, IoDevice, Ordering, Target, Tenant, TenantConfig};
use faultline_sys::BASE_PAGE as PS;

use crate::harness::paper::line;
use crate::harness::plot;
use crate::harness::report::print_table;
use crate::harness::BenchCtx;

/// B3's settings (from `bench vpri`'s arguments).
pub(super) struct B3 {
    /// Datagrams per mode.
    pub packets: u32,
    /// Datagrams per second.
    pub pps: u32,
}

/// Runs B3.
pub(super) fn run(ctx: &mut BenchCtx, a: &B3) -> anyhow::Result<()> {
    println!("\n== B3: UDP receive into paged memory (Figs 4-5, NIC), signal engine ==");
    let engine = SignalEngine::new()?;
    let slots = 256;
    let slot = 2048;
    let pages = slots * slot / PS;
    let (dir, _dir) = super::temp_dir("b3")?;
    let store_path = dir.join("ring.store");
    std::fs::write(&store_path, vec![0u8; pages * PS])?;
    let mut rows = Vec::new();
    let mut drops = [0u64; 2];
    for (mi, mode) in ["plain recv", "I/O API"].into_iter().enumerate() {
        let region = Arc::new(
            Region::builder(pages * PS)
                .store(FileStore::open_with(&store_path, 0, FileAccess::Pread)?)
                .budget(EvictionConfig {
                    budget_pages: pages / 4,
                    policy: PolicyKind::Clock,
                })
                .fault_around(1)
                .build(&engine)?,
        );
        let rx = Arc::new(UdpSocket::bind("127.0.0.1:0")?);
        let tx = UdpSocket::bind("127.0.0.1:0")?;
        tx.connect(rx.local_addr()?)?;
        rx.set_read_timeout(Some(Duration::from_millis(200)))?;
        // Both modes get the same 8 MiB socket buffer (the NIC's ring):
        // what is lost below is lost to the receive path, not to a small
        // default buffer.
        set_rcvbuf(&rx, 8 << 20);
        let n = a.packets;
        let pps = a.pps.max(1);
        let sender = std::thread::spawn(move || -> std::io::Result<Duration> {
            let t0 = Instant::now();
            let d = [0u8; 1200];
            for i in 0..n {
                let due = t0 + Duration::from_secs_f64(f64::from(i) / f64::from(pps));
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
                tx.send(&d)?;
            }
            Ok(t0.elapsed())
        });
        let mut received = 0u64;
        let mut efaults = 0u64;
        let t0 = Instant::now();
        let mut timeline = vec![0u64; 1 + (f64::from(n) / f64::from(pps) * 100.0) as usize + 200];
        let mut s = 0usize;
        let (mut iopfs, mut efault_lost) = (0, 0);
        if mi == 0 {
            loop {
                // SAFETY: a ring slot inside the region.
                let buf =
                    unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(s * slot), slot) };
                match rx.recv(buf) {
                    Ok(_) => {
                        received += 1;
                        let bin = (t0.elapsed().as_millis() / 10) as usize;
                        if let Some(b) = timeline.get_mut(bin) {
                            *b += 1;
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(14) => {
                        // The datagram is gone; bring the page in and go on.
                        efaults += 1;
                        region.populate((s * slot) / PS * PS, PS)?;
                    }
                    Err(_) => break, // timeout: the sender is done
                }
                s = (s + 1) % slots;
            }
        } else {
            let tenant = Arc::new(Tenant::new(TenantConfig::default())?);
            let dev = IoDevice::new(
                region.clone(),
                &tenant,
                DeviceConfig {
                    ordering: Ordering::Ordered,
                    unit_pages: 1,
                    ..Default::default()
                },
            )?;
            let mut q = dev.queue(Backend::Syscall)?;
            let target = Target::Udp(rx.clone());
            let mut last = Instant::now();
            loop {
                while q.outstanding() < 8 {
                    q.recv(target.clone(), s * slot, slot, s as u64)?;
                    s = (s + 1) % slots;
                }
                match q.complete(Duration::from_millis(50)) {
                    Some(c) if c.result.is_ok() => {
                        received += 1;
                        last = Instant::now();
                        let bin = (t0.elapsed().as_millis() / 10) as usize;
                        if let Some(b) = timeline.get_mut(bin) {
                            *b += 1;
                        }
                    }
                    _ => {
                        if last.elapsed() > Duration::from_millis(300) {
                            break;
                        }
                    }
                }
            }
            let st = dev.stats();
            iopfs = st.iopfs;
            efault_lost = st.efault_lost;
            // Parked receives are dropped with the queue.
        }
        let took = sender
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))??;
        let lost = u64::from(n).saturating_sub(received);
        drops[mi] = lost;
        let es = region.eviction_stats().unwrap_or_default();
        rows.push(vec![
            mode.to_string(),
            n.to_string(),
            received.to_string(),
            lost.to_string(),
            efaults.to_string(),
            iopfs.to_string(),
            efault_lost.to_string(),
            es.evicted.to_string(),
            format!("{:.0}", f64::from(n) / took.as_secs_f64()),
        ]);
        let series: Vec<(f64, f64)> = timeline
            .iter()
            .enumerate()
            .take_while(|(i, _)| (*i as f64) * 10.0 < took.as_secs_f64() * 1000.0 + 100.0)
            .map(|(i, &c)| (i as f64 * 10.0, c as f64 * 100.0))
            .collect();
        let name = format!("vpri_b3_{}", if mi == 0 { "plain" } else { "api" });
        let title = format!("B3 UDP receive PPS, {mode} (10 ms bins)");
        ctx.figure(&name, |d, nm| {
            plot::line_chart(
                d,
                nm,
                &title,
                "ms",
                "datagrams/s",
                &[(mode.to_string(), series)],
                false,
            )
        })?;
    }
    print_table(
        &[
            "mode",
            "sent",
            "received",
            "lost",
            "EFAULT",
            "I/O faults",
            "EFAULT lost (API)",
            "evicted",
            "pps sent",
        ],
        &rows,
    );
    line(
        ctx,
        "b3.udp.drops_signal_plain_recv",
        drops[0] as f64,
        "",
        "> 0 (Fig 5: packets dropped during an IOPF)",
    );
    line(
        ctx,
        "b3.udp.drops_vpri_api",
        drops[1] as f64,
        "",
        "0 (target)",
    );
    Ok(())
}

/// `SO_RCVBUFFORCE` (root), else `SO_RCVBUF` (capped by `rmem_max`).
fn set_rcvbuf(s: &UdpSocket, bytes: i32) {
    // Best effort: the default buffer only makes the plain-recv row lose more.
    let _ = faultline_sys::sock::set_rcvbuf(s.as_fd(), bytes);
}
