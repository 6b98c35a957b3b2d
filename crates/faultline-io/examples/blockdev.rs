//! A block-device-style server over lazily restored memory.
//!
//! The setting of VMM snapshot restore: "guest memory" is a faultline
//! region whose pages stream in from a snapshot file on first touch, and a
//! virtio-blk-like backend serves the guest's read requests from a disk
//! image straight into guest buffers. Without the I/O API every request
//! that lands on a not-yet-restored page fails with EFAULT (signal engine)
//! or stalls the backend for the whole fault (thread engines).
//!
//! Here a client sends `(block, buffer slot)` requests over loopback TCP;
//! the server reads the block from the disk image into the guest buffer
//! (`read_at`: the device writes guest memory) and sends the buffer back
//! (`send`: the device reads guest memory), both through one device queue.
//! The client checks every byte against the image.
//!
//! `cargo run --release -p faultline-io --example blockdev [requests]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::{FileStore, Region, SignalEngine};
use faultline_io::{Backend, DeviceConfig, IoDevice, Ordering, Target, Tenant, TenantConfig};

const BLOCK: usize = 4096;
const GUEST_PAGES: usize = 4096; // 16 MiB of guest memory
const DISK_BLOCKS: usize = 8192; // 32 MiB disk image

fn block_byte(blk: usize, i: usize) -> u8 {
    (blk.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let requests: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let dir = std::env::temp_dir().join(format!("faultline-blockdev-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let snapshot = dir.join("guest-memory.snap");
    let image = dir.join("disk.img");
    std::fs::write(&snapshot, vec![0xeeu8; GUEST_PAGES * BLOCK])?;
    let disk: Vec<u8> = (0..DISK_BLOCKS * BLOCK)
        .map(|o| block_byte(o / BLOCK, o % BLOCK))
        .collect();
    std::fs::write(&image, &disk)?;

    // Guest memory, restored lazily from the snapshot.
    let engine = SignalEngine::new()?;
    let guest = Arc::new(
        Region::builder(GUEST_PAGES * BLOCK)
            .store(FileStore::open(&snapshot)?)
            .fault_around(1)
            .build(&engine)?,
    );
    let tenant = Arc::new(Tenant::new(TenantConfig::default())?);
    let dev = IoDevice::new(
        guest.clone(),
        &tenant,
        DeviceConfig {
            name: "virtio-blk0".into(),
            ordering: Ordering::Ordered,
            ..Default::default()
        },
    )?;
    let disk_file = Arc::new(std::fs::File::open(&image)?);

    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let client = std::thread::spawn(move || -> std::io::Result<(usize, Duration)> {
        let mut s = TcpStream::connect(addr)?;
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut buf = vec![0u8; BLOCK];
        let mut bad = 0;
        let t = Instant::now();
        for _ in 0..requests {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let blk = (rng % DISK_BLOCKS as u64) as u32;
            let slot = ((rng >> 32) % GUEST_PAGES as u64) as u32;
            let mut req = [0u8; 8];
            req[..4].copy_from_slice(&blk.to_le_bytes());
            req[4..].copy_from_slice(&slot.to_le_bytes());
            s.write_all(&req)?;
            s.read_exact(&mut buf)?;
            if (0..BLOCK).any(|i| buf[i] != block_byte(blk as usize, i)) {
                bad += 1;
            }
        }
        Ok((bad, t.elapsed()))
    });

    let (conn, _) = listener.accept()?;
    let conn = Arc::new(conn);
    let mut q = dev.queue(Backend::Uring { depth: 64 })?;
    let mut req = [0u8; 8];
    for _ in 0..requests {
        (&*conn).read_exact(&mut req)?;
        let blk = u32::from_le_bytes(req[..4].try_into()?) as usize;
        let slot = u32::from_le_bytes(req[4..].try_into()?) as usize;
        // Disk → guest buffer (a miss parks the request until the page is
        // restored), then guest buffer → the wire; the ordered queue keeps
        // the send behind its read.
        q.read_at(&disk_file, (blk * BLOCK) as u64, slot * BLOCK, BLOCK, 0)?;
        q.send(Target::Tcp(conn.clone()), slot * BLOCK, BLOCK, 1)?;
        for _ in 0..2 {
            let c = q
                .complete(Duration::from_secs(30))
                .ok_or("a request did not complete in 30 s")?;
            let n = c.result?;
            if n != BLOCK {
                return Err(format!("short transfer: {n} bytes").into());
            }
        }
    }
    let (bad, took) = client.join().map_err(|_| "client panicked")??;
    let s = dev.stats();
    let t = tenant.stats();
    println!(
        "{requests} requests in {:.2} s ({:.0}/s): {bad} corrupted, {} I/O page faults, \
         {} pages restored by the fault workers (mean service {:.1} us), 0 EFAULT returned \
         (caught and retried: {}); guest pages resident {}/{}",
        took.as_secs_f64(),
        requests as f64 / took.as_secs_f64(),
        s.iopfs,
        t.resolved,
        t.service_ns_total as f64 / t.resolved.max(1) as f64 / 1e3,
        s.efault_caught,
        guest.resident_pages(),
        GUEST_PAGES
    );
    drop(q);
    drop(dev);
    let _ = std::fs::remove_dir_all(&dir);
    if bad > 0 {
        return Err(format!("{bad} responses did not match the disk image").into());
    }
    Ok(())
}
