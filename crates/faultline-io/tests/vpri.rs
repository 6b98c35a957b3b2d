//! The I/O API against the real kernel (digest checks 2-10): signal and
//! poll engines, real files (buffered and O_DIRECT), io_uring, UDP over
//! loopback, budget regions with a live evictor.
//!
//! The signal engine installs a process-wide SIGBUS handler: these tests
//! live in their own binary.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::UdpSocket;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::policy::PolicyKind;
use faultline::store::FileAccess;
use faultline::testing::child::deadline;
use faultline::{
    EvictionConfig, FileStore, MemoryStore, PageState, PageStore, PollEngine, Region, SignalEngine,
    StoreError,
};
use faultline_io::{
    adp, Backend, DeviceConfig, IoDevice, IoQueue, Ordering, PinMode, Target, Tenant, TenantConfig,
};
use rand::{Rng, SeedableRng};

const PS: usize = 4096;
const WAIT: Duration = Duration::from_secs(20);

fn pat(seed: u64, off: usize) -> u8 {
    ((off as u64 ^ seed).wrapping_mul(2654435761) >> 13) as u8
}

struct Temp(PathBuf);
impl Temp {
    fn new(tag: &str, data: &[u8]) -> Temp {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "faultline-io-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, SeqCst)
        ));
        File::create(&p).unwrap().write_all(data).unwrap();
        Temp(p)
    }
}
impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A store whose fills wait for a gate (so a test controls exactly when a
/// fault is served, without timing), counting fills.
struct GateStore {
    data: MemoryStore,
    open: AtomicBool,
    fills: AtomicUsize,
}
impl GateStore {
    fn new(len: usize) -> Arc<GateStore> {
        Arc::new(GateStore {
            data: MemoryStore::new((0..len).map(|o| pat(1, o)).collect()),
            open: AtomicBool::new(false),
            fills: AtomicUsize::new(0),
        })
    }
}
impl PageStore for GateStore {
    fn describe(&self) -> &str {
        "gate"
    }
    fn len(&self) -> Option<u64> {
        self.data.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.fills.fetch_add(1, SeqCst);
        let end = Instant::now() + WAIT;
        while !self.open.load(SeqCst) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.data.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.data.write_back(offset, data)
    }
    fn signal_safe(&self) -> bool {
        true
    }
}

/// Forwards to a shared store (the test keeps a handle on it).
struct Shared<S>(Arc<S>);
impl<S: PageStore> PageStore for Shared<S> {
    fn describe(&self) -> &str {
        self.0.describe()
    }
    fn len(&self) -> Option<u64> {
        self.0.len()
    }
    fn fill(&self, o: u64, b: &mut [u8]) -> Result<(), StoreError> {
        self.0.fill(o, b)
    }
    fn write_back(&self, o: u64, d: &[u8]) -> Result<(), StoreError> {
        self.0.write_back(o, d)
    }
    fn signal_safe(&self) -> bool {
        self.0.signal_safe()
    }
}

/// A region of `len` bytes over `store`, every page missing, faults
/// resolved one page at a time (no fault-around), so an I/O into a page
/// not touched before is an I/O page fault of that page alone.
fn lazy_region<E: faultline::Engine>(
    len: usize,
    store: impl PageStore,
    engine: &Arc<E>,
) -> Arc<Region> {
    let region = Region::builder(len).store(store).fault_around(1);
    Arc::new(region.build(engine).unwrap())
}

/// A region of `len` bytes of zeros, every page resident.
fn resident_region<E: faultline::Engine>(len: usize, engine: &Arc<E>) -> Arc<Region> {
    let region = Region::builder(len).store(MemoryStore::new(vec![0u8; len]));
    let region = Arc::new(region.build(engine).unwrap());
    region.populate(0, len).unwrap();
    region
}

fn tenant() -> Arc<Tenant> {
    Arc::new(Tenant::new(TenantConfig::default()).unwrap())
}

fn device(region: Arc<Region>, t: &Arc<Tenant>, ordering: Ordering) -> IoDevice {
    IoDevice::new(
        region,
        t,
        DeviceConfig {
            ordering,
            unit_pages: 16,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Check 2: random 4 KiB reads into missing pages of a signal-engine region
/// (buffered pread, io_uring buffered, io_uring O_DIRECT) never return
/// EFAULT and every byte lands; the same read without the API does fail.
#[test]
fn io_read_into_missing_pages_signal_engine() {
    let engine = SignalEngine::new().unwrap();
    let pages = 1024;
    let file_data: Vec<u8> = (0..pages * PS).map(|o| pat(7, o)).collect();
    let tmp = Temp::new("read", &file_data);
    let buffered = Arc::new(File::open(&tmp.0).unwrap());
    let direct = Arc::new(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&tmp.0)
            .unwrap(),
    );
    // Control: without the API the kernel gives EFAULT.
    {
        let r = Region::builder(pages * PS)
            .store(MemoryStore::new(vec![0; pages * PS]))
            .build(&engine)
            .unwrap();
        // SAFETY: the region is mapped for its length.
        let buf = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), PS) };
        let e = buffered.read_at(buf, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    }
    let t = tenant();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    for (backend, file) in [
        (Backend::Syscall, &buffered),
        (Backend::Uring { depth: 32 }, &buffered),
        (Backend::Uring { depth: 32 }, &direct),
    ] {
        let region = lazy_region(
            pages * PS,
            MemoryStore::new((0..pages * PS).map(|o| pat(1, o)).collect()),
            &engine,
        );
        let dev = device(region.clone(), &t, Ordering::Unordered);
        let mut q = dev.queue(backend).unwrap();
        // Each region page receives one read (no two in flight on a page).
        let mut order: Vec<usize> = (0..pages).collect();
        for i in (1..pages).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        let mut src = vec![0usize; pages];
        for (i, &dst) in order.iter().enumerate() {
            let blk = rng.gen_range(0..pages);
            src[dst] = blk;
            q.read_at(file, (blk * PS) as u64, dst * PS, PS, dst as u64)
                .unwrap();
            if i % 16 == 15 {
                while let Some(c) = q.drain_completions().pop() {
                    let _ = c;
                }
            }
        }
        let mut done = dev.stats().completed as usize;
        let end = Instant::now() + WAIT;
        while done < pages && Instant::now() < end {
            if let Some(c) = q.complete(Duration::from_millis(100)) {
                assert_eq!(c.result.as_ref().ok(), Some(&PS), "tag {}", c.tag);
            }
            done = dev.stats().completed as usize;
        }
        let s = dev.stats();
        assert_eq!(s.completed as usize, pages, "{s:?}");
        assert_eq!(s.efault_lost, 0);
        assert!(s.iopfs > 0, "the reads met missing pages: {s:?}");
        for (dst, &blk) in src.iter().enumerate() {
            // SAFETY: resident after the read; in bounds.
            let got = unsafe { std::slice::from_raw_parts(region.as_ptr().add(dst * PS), PS) };
            assert!(got == &file_data[blk * PS..(blk + 1) * PS], "page {dst}");
        }
    }
}

/// Check 3: UDP datagrams received into a ring of buffers over pages a
/// budget keeps evicting, signal engine: none lost (plain `recv` loses
/// the datagram on EFAULT, shown first). The receiver keeps 8 receives
/// outstanding, so at the end some wait for datagrams that never come:
/// `complete` must still return within its timeout (it once blocked in a
/// receive issued from inside it: the syscall backend now receives with
/// `MSG_DONTWAIT` and waits for the socket in `complete`).
#[test]
fn udp_rx_signal_engine_no_drops() {
    let _guard = deadline(120);
    let engine = SignalEngine::new().unwrap();
    let rx = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    // Control: plain recv into a missing page loses the datagram.
    {
        let r = Region::builder(16 * PS).build(&engine).unwrap();
        tx.send(&[1u8; 100]).unwrap();
        // SAFETY: mapped for its length.
        let buf = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), PS) };
        assert_eq!(rx.recv(buf).unwrap_err().raw_os_error(), Some(libc::EFAULT));
        rx.set_nonblocking(true).unwrap();
        let mut b = [0u8; 200];
        assert!(rx.recv(&mut b).is_err(), "the datagram is gone");
        rx.set_nonblocking(false).unwrap();
    }
    let slots = 256;
    let slot = 2048;
    let pages = slots * slot / PS;
    let tmp = Temp::new("udp-store", &vec![0u8; pages * PS]);
    let region = Arc::new(
        Region::builder(pages * PS)
            .store(FileStore::open_with(&tmp.0, 0, FileAccess::Pread).unwrap())
            .budget(EvictionConfig {
                budget_pages: pages / 4,
                policy: PolicyKind::Clock,
            })
            .fault_around(1)
            .build(&engine)
            .unwrap(),
    );
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Ordered);
    let mut q = dev.queue(Backend::Syscall).unwrap();
    let n: u32 = 20_000;
    let received = Arc::new(AtomicUsize::new(0));
    let r2 = received.clone();
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            // Flow control keeps the socket buffer from overflowing: every
            // loss below would be the API's.
            while i as usize > r2.load(SeqCst) + 64 {
                std::thread::yield_now();
            }
            let mut d = [0u8; 1200];
            d[..4].copy_from_slice(&i.to_le_bytes());
            tx.send(&d).unwrap();
        }
    });
    let target = Target::Udp(rx.clone());
    let mut next_slot = 0;
    let mut seen = vec![false; n as usize];
    let end = Instant::now() + Duration::from_secs(60);
    while received.load(SeqCst) < n as usize && Instant::now() < end {
        while q.outstanding() < 8 {
            q.recv(target.clone(), next_slot * slot, slot, next_slot as u64)
                .unwrap();
            next_slot = (next_slot + 1) % slots;
        }
        if let Some(c) = q.complete(Duration::from_millis(100)) {
            assert_eq!(
                c.result.as_ref().ok(),
                Some(&1200),
                "received {}: {:?}",
                received.load(SeqCst),
                dev.stats()
            );
            let off = c.tag as usize * slot;
            // Copy the sequence number out (the page may be evicted and
            // refaulted later: it was written back).
            let mut b = [0u8; 4];
            // SAFETY: inside the region; the signal engine resolves a
            // fault if the page was evicted since.
            unsafe { std::ptr::copy_nonoverlapping(region.as_ptr().add(off), b.as_mut_ptr(), 4) };
            seen[u32::from_le_bytes(b) as usize] = true;
            received.fetch_add(1, SeqCst);
        }
    }
    sender.join().unwrap();
    let s = dev.stats();
    assert_eq!(received.load(SeqCst), n as usize, "{s:?}");
    assert!(seen.iter().all(|&x| x), "every datagram arrived once");
    assert_eq!(s.efault_lost, 0, "{s:?}");
    assert!(s.iopfs > 0, "the ring met evicted pages: {s:?}");
    drop(q);
    drop(dev);
}

/// Receives for datagrams that never come wait in the queue, not in the
/// kernel on the caller's thread: `complete` returns at its timeout, a
/// later datagram completes them in order, and dropping the queue with
/// receives still outstanding returns (io_uring's are cancelled). Both
/// backends, both disciplines; the deadline guard turns a hang into a
/// failure.
#[test]
fn receives_without_data_never_block() {
    let _guard = deadline(60);
    let engine = SignalEngine::new().unwrap();
    let region = resident_region(16 * PS, &engine);
    let t = tenant();
    for ordering in [Ordering::Ordered, Ordering::Unordered] {
        let dev = device(region.clone(), &t, ordering);
        for backend in [Backend::Syscall, Backend::Uring { depth: 4 }] {
            let rx = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.connect(rx.local_addr().unwrap()).unwrap();
            let mut q = dev.queue(backend).unwrap();
            // More receives than the ring has slots: the rest wait in the
            // queue too.
            for i in 0..6u64 {
                q.recv(Target::Udp(rx.clone()), i as usize * PS, PS, i)
                    .unwrap();
            }
            assert_eq!(q.outstanding(), 6, "{ordering:?} {backend:?}");
            assert!(q.complete(Duration::from_millis(50)).is_none());
            for i in 0..3u8 {
                tx.send(&[i + 1; 100]).unwrap();
            }
            for i in 0..3u64 {
                let c = q.complete(WAIT).expect("a datagram completes a receive");
                assert_eq!(c.result.unwrap(), 100, "{ordering:?} {backend:?}");
                if ordering == Ordering::Ordered {
                    assert_eq!(c.tag, i, "in order");
                    // SAFETY: resident, and the receive completed.
                    let b = unsafe { *region.as_ptr().add(i as usize * PS) };
                    assert_eq!(b, i as u8 + 1, "datagram i in buffer i: {backend:?}");
                }
            }
            assert_eq!(q.outstanding(), 3);
            assert!(q.complete(Duration::from_millis(20)).is_none());
            drop(q);
        }
    }
}

/// Check 4: with a thread engine, an I/O into a missing page whose store
/// has not answered yet is parked: `submit` returns while the store is
/// still blocked (no timing: the store waits for a gate the test opens
/// only after `submit` returned).
#[test]
fn thread_engine_io_is_parked_not_blocked() {
    let engine = PollEngine::new().unwrap();
    let store = GateStore::new(64 * PS);
    let region = lazy_region(64 * PS, Shared(store.clone()), &engine);
    let tmp = Temp::new("park", &vec![9u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    for backend in [Backend::Syscall, Backend::Uring { depth: 8 }] {
        store.open.store(false, SeqCst);
        let page = if backend == Backend::Syscall { 3 } else { 5 };
        let mut q = dev.queue(backend).unwrap();
        q.read_at(&f, 0, page * PS, PS, 1).unwrap();
        // Submit returned: the fill is (or will be) waiting at the gate.
        assert_eq!(q.parked(), 1);
        assert!(q.complete(Duration::from_millis(50)).is_none());
        store.open.store(true, SeqCst);
        let c = q.complete(WAIT).expect("completes once the store answers");
        assert_eq!(c.result.unwrap(), PS);
        assert!(c.iopf);
        // SAFETY: resident now.
        assert_eq!(unsafe { *region.as_ptr().add(page * PS + 100) }, 9);
    }
}

/// A page poisoned by a store error is never "resolved": `populate`
/// says so for it (it returned Ok when asked for that page alone), and an
/// I/O into it completes with the error (it was reissued forever: the
/// presence check missed, the fault path called the page resolved).
#[test]
fn io_into_a_poisoned_page_completes_with_the_error() {
    use faultline::testing::{Action, Fault, FaultyStore};
    let engine = PollEngine::new().unwrap();
    let store = FaultyStore::builder(MemoryStore::new(vec![3u8; 16 * PS]))
        .rule(Fault::fill(Action::Fail).pages(9..10))
        .build();
    let region = lazy_region(16 * PS, store, &engine);
    assert!(region.populate(0, 16 * PS).is_err());
    assert_eq!(region.page_state(9), faultline::PageState::Poisoned);
    let again = region.populate(9 * PS, PS);
    assert!(again.is_err(), "{again:?}");
    let tmp = Temp::new("poisoned", &vec![9u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    for backend in [Backend::Syscall, Backend::Uring { depth: 8 }] {
        let mut q = dev.queue(backend).unwrap();
        q.read_at(&f, 0, 9 * PS + 100, 16, 1).unwrap();
        let c = q.complete(WAIT).expect("completes: the page is poisoned");
        assert!(c.result.is_err(), "{backend:?}: {:?}", c.result);
    }
}

fn resident_and_gated(engine: &Arc<SignalEngine>) -> (Arc<Region>, Arc<GateStore>) {
    let store = GateStore::new(64 * PS);
    let region = lazy_region(64 * PS, Shared(store.clone()), engine);
    store.open.store(true, SeqCst);
    region.populate(0, 32 * PS).unwrap();
    store.open.store(false, SeqCst);
    (region, store)
}

/// Check 5 (unordered): 1,000 hits queued behind one miss all complete
/// while the miss waits for its page; the miss completes after the gate.
#[test]
fn unordered_queue_progress() {
    let engine = SignalEngine::new().unwrap();
    let (region, store) = resident_and_gated(&engine);
    let tmp = Temp::new("unord", &vec![5u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region, &t, Ordering::Unordered);
    let mut q = dev.queue(Backend::Uring { depth: 64 }).unwrap();
    q.read_at(&f, 0, 40 * PS, 64, 0).unwrap(); // page 40: missing
    for i in 1..=1000u64 {
        q.read_at(&f, 0, (i as usize % 32) * PS + 128, 64, i)
            .unwrap();
    }
    let mut hits = 0;
    while hits < 1000 {
        let c = q
            .complete(WAIT)
            .expect("hits complete while the miss waits");
        assert_ne!(c.tag, 0, "the miss completed before its page arrived");
        assert_eq!(c.result.unwrap(), 64);
        hits += 1;
    }
    store.open.store(true, SeqCst);
    let c = q.complete(WAIT).expect("the miss completes");
    assert_eq!((c.tag, c.iopf), (0, true));
}

/// Check 5 (ordered): the queue pauses behind the miss; completions come
/// in submission order.
#[test]
fn ordered_queue_fifo() {
    let engine = SignalEngine::new().unwrap();
    let (region, store) = resident_and_gated(&engine);
    let tmp = Temp::new("ord", &vec![5u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region, &t, Ordering::Ordered);
    for backend in [Backend::Syscall, Backend::Uring { depth: 16 }] {
        store.open.store(false, SeqCst);
        let mut q = dev.queue(backend).unwrap();
        q.read_at(&f, 0, PS, 64, 0).unwrap(); // resident: completes
        let miss = if backend == Backend::Syscall { 40 } else { 41 };
        q.read_at(&f, 0, miss * PS, 64, 1).unwrap();
        for i in 2..200u64 {
            q.read_at(&f, 0, (i as usize % 32) * PS + 256, 64, i)
                .unwrap();
        }
        assert_eq!(q.complete(WAIT).unwrap().tag, 0);
        assert!(
            q.complete(Duration::from_millis(50)).is_none(),
            "nothing passes the paused head"
        );
        store.open.store(true, SeqCst);
        for want in 1..200u64 {
            let c = q.complete(WAIT).expect("completes");
            assert_eq!(c.tag, want, "submission order");
        }
    }
}

/// Check 6: 64 I/Os (over 4 queues) missing on one page post it once and
/// the store fills it once; all 64 complete.
#[test]
fn fault_posts_are_deduplicated() {
    let engine = SignalEngine::new().unwrap();
    let (region, store) = resident_and_gated(&engine);
    let tmp = Temp::new("dedup", &vec![5u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region, &t, Ordering::Unordered);
    let fills = store.fills.load(SeqCst);
    let mut qs: Vec<IoQueue> = (0..4)
        .map(|_| dev.queue(Backend::Uring { depth: 32 }).unwrap())
        .collect();
    for i in 0..64u64 {
        qs[i as usize % 4]
            .read_at(&f, 0, 50 * PS + i as usize * 64, 64, i)
            .unwrap();
    }
    store.open.store(true, SeqCst);
    let mut n = 0;
    for q in &mut qs {
        for _ in 0..16 {
            let c = q.complete(WAIT).expect("completes");
            assert_eq!(c.result.unwrap(), 64);
            n += 1;
        }
    }
    assert_eq!(n, 64);
    assert_eq!(store.fills.load(SeqCst) - fills, 1, "one store fill");
    assert_eq!(t.stats().posts, 1, "{:?}", t.stats());
    assert_eq!(dev.stats().posted, 1);
}

/// Check 7: O_DIRECT reads through io_uring into a budget region (25%)
/// with a CLOCK evictor: every block read is intact afterwards, and the
/// evictor skipped pages under in-flight I/O.
#[test]
fn no_evict_under_inflight_io() {
    let engine = SignalEngine::new().unwrap();
    let pages = 256;
    let blocks = 512;
    let file_data: Vec<u8> = (0..blocks * PS)
        .map(|o| pat((o / PS) as u64, o % PS))
        .collect();
    let tmp = Temp::new("evict-file", &file_data);
    let direct = Arc::new(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&tmp.0)
            .unwrap(),
    );
    let store = Temp::new("evict-store", &vec![0u8; pages * PS]);
    let region = Arc::new(
        Region::builder(pages * PS)
            .store(FileStore::open_with(&store.0, 0, FileAccess::Pread).unwrap())
            .budget(EvictionConfig {
                budget_pages: pages / 4,
                policy: PolicyKind::Clock,
            })
            .fault_around(1)
            .build(&engine)
            .unwrap(),
    );
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    let mut q = dev.queue(Backend::Uring { depth: 32 }).unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
    let mut want: Vec<Option<usize>> = vec![None; pages]; // block each page holds
    let mut busy = vec![false; pages];
    let mut mismatches = 0;
    let mut done = 0u64;
    let end = Instant::now() + Duration::from_secs(30);
    let mut tag_blk = std::collections::HashMap::new();
    while (done < 4000 || region.eviction_stats().unwrap().skipped_io_busy == 0)
        && Instant::now() < end
    {
        while q.outstanding() < 32 {
            let p = rng.gen_range(0..pages);
            if busy[p] {
                continue;
            }
            let b = rng.gen_range(0..blocks);
            busy[p] = true;
            tag_blk.insert(p, b);
            q.read_at(&direct, (b * PS) as u64, p * PS, PS, p as u64)
                .unwrap();
        }
        if let Some(c) = q.complete(WAIT) {
            assert_eq!(c.result.unwrap(), PS);
            let p = c.tag as usize;
            busy[p] = false;
            want[p] = tag_blk.remove(&p);
            done += 1;
            // Verify a random finished page now (it may have been evicted
            // and written back meanwhile: the CPU access refaults it).
            let v = rng.gen_range(0..pages);
            if let (Some(b), false) = (want[v], busy[v]) {
                let mut got = vec![0u8; PS];
                // SAFETY: in bounds; the signal engine resolves the fault.
                unsafe {
                    std::ptr::copy_nonoverlapping(region.as_ptr().add(v * PS), got.as_mut_ptr(), PS)
                };
                if got[..] != file_data[b * PS..(b + 1) * PS] {
                    mismatches += 1;
                }
            }
        }
    }
    while q.outstanding() > 0 {
        let c = q.complete(WAIT).expect("drains");
        let p = c.tag as usize;
        want[p] = tag_blk.remove(&p);
    }
    for (p, b) in want.iter().enumerate() {
        if let Some(b) = b {
            let mut got = vec![0u8; PS];
            // SAFETY: as above.
            unsafe {
                std::ptr::copy_nonoverlapping(region.as_ptr().add(p * PS), got.as_mut_ptr(), PS)
            };
            if got[..] != file_data[b * PS..(b + 1) * PS] {
                mismatches += 1;
            }
        }
    }
    let es = region.eviction_stats().unwrap();
    assert_eq!(mismatches, 0, "{es:?}");
    assert!(es.evicted > 0 && es.skipped_io_busy > 0, "{es:?}");
    assert!(
        es.max_resident as usize <= pages / 4 + pages / 8 + 64,
        "{es:?}"
    );
}

/// Check 8: a device write into a clean (write-protected) page of a budget
/// region is a miss; the worker dirties the page, the read lands, and the
/// flush writes the I/O's bytes back to the store.
#[test]
fn device_write_into_clean_page_upgrades() {
    let engine = SignalEngine::new().unwrap();
    let pages = 16;
    let store = Temp::new("clean-store", &vec![3u8; pages * PS]);
    let region = Arc::new(
        Region::builder(pages * PS)
            .store(FileStore::open_with(&store.0, 0, FileAccess::Pread).unwrap())
            .budget(EvictionConfig {
                budget_pages: pages,
                policy: PolicyKind::Clock,
            })
            .fault_around(1)
            .build(&engine)
            .unwrap(),
    );
    // SAFETY: in bounds: a CPU read installs page 2 clean.
    assert_eq!(unsafe { *region.as_ptr().add(2 * PS) }, 3);
    assert_eq!(region.page_state(2), PageState::ReadOnly);
    // Without the API, the kernel's write into the clean page fails.
    let tmp = Temp::new("clean-src", &vec![0xabu8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    {
        // SAFETY: in bounds.
        let buf = unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(2 * PS), PS) };
        assert_eq!(
            f.read_at(buf, 0).unwrap_err().raw_os_error(),
            Some(libc::EFAULT)
        );
    }
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    let mut q = dev.queue(Backend::Syscall).unwrap();
    q.read_at(&f, 0, 2 * PS, PS, 1).unwrap();
    let c = q.complete(WAIT).expect("completes");
    assert_eq!(c.result.unwrap(), PS);
    assert!(c.iopf, "a device write into a clean page is a miss");
    assert_eq!(region.page_state(2), PageState::Writable);
    assert_eq!(region.flush().unwrap(), 1);
    let on_disk = std::fs::read(&store.0).unwrap();
    assert!(on_disk[2 * PS..3 * PS].iter().all(|&b| b == 0xab));
    assert!(on_disk[3 * PS..4 * PS].iter().all(|&b| b == 3));
}

/// Check 9: io_uring fixed buffers over an evictable region are refused
/// unless the device pins all of it; pinned, they work.
#[test]
fn fixed_buffers_refused_on_evictable_region() {
    let engine = SignalEngine::new().unwrap();
    let pages = 32;
    let store = Temp::new("fixed-store", &vec![1u8; pages * PS]);
    let region = Arc::new(
        Region::builder(pages * PS)
            .store(FileStore::open_with(&store.0, 0, FileAccess::Pread).unwrap())
            .budget(EvictionConfig {
                budget_pages: pages / 2,
                policy: PolicyKind::Clock,
            })
            .build(&engine)
            .unwrap(),
    );
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    let mut q = dev.queue(Backend::Uring { depth: 8 }).unwrap();
    assert!(matches!(
        q.register_region_buffers(),
        Err(faultline_io::Error::Unsupported { .. })
    ));
    drop(q);
    drop(dev);
    let pinned = IoDevice::new(
        region.clone(),
        &t,
        DeviceConfig {
            pin: PinMode::All,
            unit_pages: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert!((0..pages).all(|p| region.is_pinned(p)));
    let mut q = pinned.queue(Backend::Uring { depth: 8 }).unwrap();
    q.register_region_buffers().unwrap();
    let tmp = Temp::new("fixed-src", &vec![0x77u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    q.read_at(&f, 0, 5 * PS, PS, 1).unwrap();
    assert_eq!(q.complete(WAIT).unwrap().result.unwrap(), PS);
    // SAFETY: resident and pinned.
    assert_eq!(unsafe { *region.as_ptr().add(5 * PS + 9) }, 0x77);
    drop(q);
    drop(pinned);
    assert!(!region.is_pinned(0), "pins end with the device");
}

/// Check 10: the access log drops rather than blocks: with nobody draining
/// a 64-slot log, 20,000 I/Os all complete and the rest are counted drops.
#[test]
fn access_log_is_lossy_not_blocking() {
    let engine = SignalEngine::new().unwrap();
    let region = Arc::new(Region::builder(16 * PS).build(&engine).unwrap());
    region.populate(0, 16 * PS).unwrap();
    let tmp = Temp::new("pal", &vec![1u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = IoDevice::new(
        region,
        &t,
        DeviceConfig {
            log_slots: 64,
            drain_log: false,
            ..Default::default()
        },
    )
    .unwrap();
    let mut q = dev.queue(Backend::Syscall).unwrap();
    for i in 0..20_000u64 {
        q.read_at(&f, 0, (i as usize % 16) * PS, 64, i).unwrap();
        assert!(q.complete(WAIT).is_some());
    }
    let s = dev.stats();
    assert_eq!(s.completed, 20_000);
    assert_eq!((s.log_logged, s.log_dropped), (64, 20_000 - 64));
    let mut n = 0;
    dev.access_log().drain(usize::MAX, |e| {
        assert_eq!(e.pages, 1);
        n += 1;
    });
    assert_eq!(n, 64);
}

/// B8's slow consumer: the device's consumer (`drain_now`, what its
/// drainer thread runs) drains the 64-slot log only every 1,000 I/Os, so
/// the log overflows between drains: every I/O still completes, each
/// drain makes room for one more ringful, and every other event is counted
/// as dropped. With `log_slots: 0` nothing is logged or dropped.
#[test]
fn slow_log_consumer_drops_and_log_off_logs_nothing() {
    let engine = SignalEngine::new().unwrap();
    let tmp = Temp::new("pal-slow", &vec![1u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let n = 5_000u64;
    for slots in [64usize, 0] {
        let region = Arc::new(Region::builder(16 * PS).build(&engine).unwrap());
        region.populate(0, 16 * PS).unwrap();
        let dev = IoDevice::new(
            region,
            &t,
            DeviceConfig {
                log_slots: slots,
                drain_log: false,
                pin: PinMode::Adp(None),
                unit_pages: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let mut q = dev.queue(Backend::Uring { depth: 8 }).unwrap();
        for i in 0..n {
            if i > 0 && i % 1000 == 0 {
                dev.drain_now();
            }
            q.read_at(&f, 0, (i as usize % 16) * PS, 64, i).unwrap();
            assert!(q.complete(WAIT).is_some());
        }
        let s = dev.stats();
        assert_eq!(s.completed, n);
        if slots == 0 {
            assert_eq!((s.log_logged, s.log_dropped), (0, 0));
            assert_eq!(dev.pin_sizes(), (0, 0), "the policy saw no access");
        } else {
            assert_eq!((s.log_logged, s.log_dropped), (5 * 64, n - 5 * 64));
            assert_ne!(dev.pin_sizes(), (0, 0), "the policy saw the logged ones");
        }
    }
}

/// A signal-engine region of `pages` pages over a file of 2s, with a
/// CLOCK evictor at `budget` pages (the engine and the file go with it).
fn clock_region(tag: &str, pages: usize, budget: usize) -> (Arc<SignalEngine>, Temp, Arc<Region>) {
    let engine = SignalEngine::new().unwrap();
    let store = Temp::new(tag, &vec![2u8; pages * PS]);
    let region = Arc::new(
        Region::builder(pages * PS)
            .store(FileStore::open_with(&store.0, 0, FileAccess::Pread).unwrap())
            .budget(EvictionConfig {
                budget_pages: budget,
                policy: PolicyKind::Clock,
            })
            .fault_around(1)
            .build(&engine)
            .unwrap(),
    );
    (engine, store, region)
}

/// ADP pins what it promotes, the evictor honours the pins, and the
/// access log feeds the region's eviction policy (hints).
#[test]
fn adp_pins_are_honoured_by_the_evictor() {
    let pages = 128;
    let (_engine, _store, region) = clock_region("adp-store", pages, 32);
    let t = tenant();
    let cfg = adp::AdpConfig {
        active_cap: 2,
        inactive_cap: 4,
        scan_period_ns: 1_000_000,
        threshold_ns: 1_000_000_000_000,
        demote_delay_ns: 1_000_000_000_000,
    };
    let dev = IoDevice::new(
        region.clone(),
        &t,
        DeviceConfig {
            pin: PinMode::Adp(Some(cfg)),
            unit_pages: 1,
            drain_log: false,
            ..Default::default()
        },
    )
    .unwrap();
    let tmp = Temp::new("adp-src", &vec![4u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let mut q = dev.queue(Backend::Syscall).unwrap();
    // Pages 0..3 accessed by I/O: the active cap (2) promotes 0 (pinned).
    for p in 0..3 {
        q.read_at(&f, 0, p * PS, 64, p as u64).unwrap();
        assert!(q.complete(WAIT).unwrap().result.is_ok());
    }
    dev.drain_now();
    assert!(region.is_pinned(0) && !region.is_pinned(1) && !region.is_pinned(2));
    assert_eq!(dev.pin_sizes(), (2, 1));
    // CPU pressure on the rest of the region: page 0 stays resident.
    for p in 3..pages {
        // SAFETY: in bounds.
        assert_eq!(unsafe { *region.as_ptr().add(p * PS) }, 2);
    }
    let es = region.eviction_stats().unwrap();
    assert!(es.evicted > 0, "{es:?}");
    assert_ne!(region.page_state(0), PageState::Absent, "{es:?}");
    assert!(es.access_hints >= 3, "{es:?}");
}

/// The evictor reports what it takes and ADP derives its threshold from
/// it at runtime: a `PinMode::AdpDerived` device whose pages the evictor
/// takes under pressure receives their reclaim ages (since the device
/// last touched them), and its threshold moves from the configured
/// 1,000 s to one of those ages, which are bounded by the test's length.
#[test]
fn evictor_reclaim_ages_reach_adp() {
    let pages = 128;
    let (_engine, _store, region) = clock_region("derive-store", pages, 32);
    let t = tenant();
    let configured = 1_000_000_000_000; // 1,000 s
    let cfg = adp::AdpConfig {
        active_cap: pages,
        inactive_cap: 4,
        scan_period_ns: 1_000_000,
        threshold_ns: configured,
        demote_delay_ns: configured,
    };
    let started = Instant::now();
    let dev = IoDevice::new(
        region.clone(),
        &t,
        DeviceConfig {
            pin: PinMode::AdpDerived {
                config: Some(cfg),
                quantile: 0.5,
            },
            unit_pages: 1,
            drain_log: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(dev.threshold_ns(), Some(configured));
    let tmp = Temp::new("derive-src", &vec![4u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let mut q = dev.queue(Backend::Syscall).unwrap();
    for p in 0..64 {
        q.read_at(&f, 0, p * PS, 64, p as u64).unwrap();
        assert!(q.complete(WAIT).unwrap().result.is_ok());
    }
    dev.drain_now();
    // CPU pressure on the other half: the evictor takes the device's pages.
    for p in 64..pages {
        // SAFETY: in bounds.
        assert_eq!(unsafe { *region.as_ptr().add(p * PS) }, 2);
    }
    let give_up = Instant::now() + Duration::from_secs(10);
    while dev.stats().reclaim_ages < 16 && Instant::now() < give_up {
        dev.drain_now();
        std::thread::sleep(Duration::from_millis(5));
    }
    dev.drain_now();
    let s = dev.stats();
    let es = region.eviction_stats().unwrap();
    assert!(s.reclaim_ages >= 16, "{s:?} {es:?}");
    let derived = dev.threshold_ns().unwrap();
    assert!(
        derived <= started.elapsed().as_nanos() as u64,
        "threshold {derived} ns: an age longer than the test"
    );
}

/// Devices with a home CPU: each page request goes to the tenant's worker
/// pinned there, or (after 1 ms, that worker busy) to another; every
/// request is served, and each is counted as one or the other.
#[test]
fn page_requests_go_to_the_home_cpu_worker() {
    let engine = SignalEngine::new().unwrap();
    let t = Arc::new(
        Tenant::new(TenantConfig {
            cpus: vec![0, 1],
            ..Default::default()
        })
        .unwrap(),
    );
    let tmp = Temp::new("home-src", &vec![5u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let pages = 64;
    let mut devs = Vec::new();
    for home in [0, 1] {
        let region = lazy_region(pages * PS, MemoryStore::new(vec![0u8; pages * PS]), &engine);
        devs.push(
            IoDevice::new(
                region,
                &t,
                DeviceConfig {
                    home_cpu: Some(home),
                    ..Default::default()
                },
            )
            .unwrap(),
        );
    }
    let mut qs: Vec<IoQueue> = devs
        .iter()
        .map(|d| d.queue(Backend::Syscall).unwrap())
        .collect();
    for p in 0..pages {
        for q in &mut qs {
            q.read_at(&f, 0, p * PS, 64, p as u64).unwrap();
        }
    }
    for q in &mut qs {
        for _ in 0..pages {
            assert!(q.complete(WAIT).unwrap().result.is_ok());
        }
    }
    let s = t.stats();
    // A page can be posted again after its response (a queue checked it
    // just before the worker resolved it): a no-op resolve, still served.
    assert!(s.posts >= 2 * pages as u64, "{s:?}");
    assert_eq!((s.resolved, s.failed), (s.posts, 0), "{s:?}");
    assert_eq!(s.served_at_home + s.stolen, s.posts, "{s:?}");
    assert!(s.served_at_home > 0, "{s:?}");
}

/// An ordered queue keeps I/Os that depend on each other in order, though
/// io_uring runs what it holds in any order: O_DIRECT reads of distinct
/// blocks into one buffer, each followed by a (cached, inline) write of
/// that buffer to a second file, copy every block; a later read never
/// overwrites the buffer before the write before it has sent it.
#[test]
fn ordered_queue_keeps_dependent_ios_in_order() {
    let engine = SignalEngine::new().unwrap();
    let blocks = 64usize;
    let src: Vec<u8> = (0..blocks).flat_map(|i| vec![i as u8 + 1; PS]).collect();
    let a = Temp::new("dep-src", &src);
    let b = Temp::new("dep-dst", &vec![0u8; blocks * PS]);
    // The source's blocks leave the page cache: the direct reads go to
    // the disk (asynchronously) while the writes complete at once.
    let fa = Arc::new(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&a.0)
            .unwrap(),
    );
    let fb = Arc::new(OpenOptions::new().write(true).open(&b.0).unwrap());
    let region = resident_region(4 * PS, &engine);
    let t = tenant();
    let dev = device(region, &t, Ordering::Ordered);
    let mut q = dev.queue(Backend::Uring { depth: 32 }).unwrap();
    for i in 0..blocks {
        q.read_at(&fa, (i * PS) as u64, 0, PS, 2 * i as u64)
            .unwrap();
        q.write_at(&fb, (i * PS) as u64, 0, PS, 2 * i as u64 + 1)
            .unwrap();
    }
    for tag in 0..2 * blocks as u64 {
        let c = q.complete(WAIT).expect("completes");
        assert_eq!((c.tag, c.result.ok()), (tag, Some(PS)));
    }
    let got = std::fs::read(&b.0).unwrap();
    let bad: Vec<usize> = (0..blocks)
        .filter(|&i| got[i * PS..(i + 1) * PS] != src[i * PS..(i + 1) * PS])
        .collect();
    assert!(bad.is_empty(), "blocks copied out of order: {bad:?}");
}

/// `submit_batch` (pipelined presence checks) does what `submit` does, I/O
/// by I/O: reads into resident and missing pages all land, each I/O into
/// a missing page is one I/O fault, and a bad I/O stops the batch with its
/// error after the ones before it were submitted.
#[test]
fn submit_batch_is_submit_with_prefetch() {
    let engine = SignalEngine::new().unwrap();
    let pages = 256;
    let file_data: Vec<u8> = (0..pages * PS).map(|o| pat(11, o)).collect();
    let tmp = Temp::new("batch", &file_data);
    let file = Arc::new(File::open(&tmp.0).unwrap());
    let region = lazy_region(pages * PS, MemoryStore::new(vec![0; pages * PS]), &engine);
    // Every other run of 8 pages resident.
    for r in (0..pages).step_by(16) {
        region.populate(r * PS, 8 * PS).unwrap();
    }
    let missing = (0..pages).filter(|p| p % 16 >= 8).count() as u64;
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    let mut q = dev.queue(Backend::Uring { depth: 64 }).unwrap();
    let io = |dst: usize| faultline_io::Io {
        op: faultline_io::Op::ReadAt(((pages - 1 - dst) * PS) as u64),
        target: Target::File(file.clone()),
        region_off: dst * PS,
        len: PS,
        tag: dst as u64,
    };
    q.submit_batch((0..pages).map(io)).unwrap();
    for _ in 0..pages {
        let c = q.complete(WAIT).expect("every read completes");
        assert_eq!(c.result.as_ref().ok(), Some(&PS), "tag {}", c.tag);
    }
    // SAFETY: the region is mapped for its length; no I/O is in flight.
    let mem = unsafe { std::slice::from_raw_parts(region.as_ptr(), pages * PS) };
    for dst in 0..pages {
        let src = pages - 1 - dst;
        assert!(
            mem[dst * PS..(dst + 1) * PS] == file_data[src * PS..(src + 1) * PS],
            "page {dst}"
        );
    }
    assert_eq!(dev.stats().iopfs, missing, "{:?}", dev.stats());
    // A bad I/O (past the region) in the middle: the two before it go in.
    let mut bad = io(0);
    bad.region_off = pages * PS;
    let err = q
        .submit_batch([io(1), io(2), bad, io(3)])
        .expect_err("past the region");
    assert!(
        matches!(err, faultline_io::Error::OutOfRange { .. }),
        "{err:?}"
    );
    for _ in 0..2 {
        assert!(q.complete(WAIT).is_some());
    }
    assert_eq!(q.outstanding(), 0);
}

/// A memory store that records the CPU each fill ran on.
struct CpuStore {
    data: MemoryStore,
    cpus: std::sync::Mutex<Vec<i32>>,
}
impl PageStore for CpuStore {
    fn describe(&self) -> &str {
        "cpu-recording"
    }
    fn len(&self) -> Option<u64> {
        self.data.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let cpu = faultline_sys::thread::current_cpu().map_or(-1, |c| c as i32);
        self.cpus.lock().unwrap().push(cpu);
        self.data.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.data.write_back(offset, data)
    }
}

/// The first CPU the calling thread may use, if it may use a second one
/// (for anything to keep off the first).
fn two_cpus() -> Option<usize> {
    let cpus = faultline_sys::thread::allowed_cpus().unwrap();
    if cpus.len() < 2 {
        eprintln!("skipped: needs 2 allowed CPUs, has {cpus:?}");
        return None;
    }
    Some(cpus[0])
}

/// An unpinned tenant's fault workers serve a request off the CPU of the
/// thread that posted it: every fill of pages missed by I/Os submitted
/// from a thread pinned to one CPU runs on another, and each request is
/// counted as served off the poster's CPU.
#[test]
fn fault_workers_keep_off_the_posting_cpu() {
    let Some(mine) = two_cpus() else { return };
    let engine = PollEngine::new().unwrap();
    let pages = 32;
    let store = Arc::new(CpuStore {
        data: MemoryStore::new((0..pages * PS).map(|o| pat(3, o)).collect()),
        cpus: Default::default(),
    });
    let region = lazy_region(pages * PS, Shared(store.clone()), &engine);
    let tmp = Temp::new("keepoff", &vec![9u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    let mut q = dev.queue(Backend::Uring { depth: 64 }).unwrap();
    // The submitter on one CPU (the workers started before, with all).
    faultline_sys::thread::pin_to_cpu(mine).unwrap();
    for p in 0..pages {
        q.read_at(&f, 0, p * PS + 8, 64, p as u64).unwrap();
    }
    for _ in 0..pages {
        let c = q.complete(WAIT).expect("every read completes");
        assert_eq!(c.result.unwrap(), 64);
    }
    let cpus = store.cpus.lock().unwrap().clone();
    let s = t.stats();
    assert!(!cpus.is_empty() && s.posts > 0, "{s:?}");
    assert!(
        cpus.iter().all(|&c| c != mine as i32),
        "a fill ran on the poster's CPU {mine}: {cpus:?}"
    );
    assert_eq!(s.off_poster_cpu, s.posts, "{s:?}");
    for p in 0..pages {
        // SAFETY: the reads completed; the region is mapped.
        let b = unsafe { *region.as_ptr().add(p * PS + 8) };
        assert_eq!(b, 9, "page {p}");
    }
}

/// The device's access-log drain thread keeps off the CPU its queue last
/// waited on: once a queue on a thread pinned to one CPU has waited, the
/// drainer's allowed CPUs leave that one out.
#[test]
fn log_drainer_keeps_off_the_queue_cpu() {
    let Some(mine) = two_cpus() else { return };
    let engine = SignalEngine::new().unwrap();
    let region = resident_region(16 * PS, &engine);
    let t = tenant();
    let dev = IoDevice::new(
        region,
        &t,
        DeviceConfig {
            name: "koff".into(),
            drain_period: Duration::from_millis(1),
            ..Default::default()
        },
    )
    .unwrap();
    let tmp = Temp::new("drainoff", &vec![1u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let mut q = dev.queue(Backend::Uring { depth: 8 }).unwrap();
    // The queue's thread on one CPU (the drainer started before, with all).
    faultline_sys::thread::pin_to_cpu(mine).unwrap();
    // A completion nobody has yet makes the queue wait (for 1 ms).
    assert!(q.complete(Duration::from_millis(1)).is_none());
    q.read_at(&f, 0, 0, 64, 0).unwrap();
    assert!(q.complete(WAIT).unwrap().result.is_ok());
    // The drain thread names itself when it starts running (the name is
    // set from inside the new thread), and applies the placement at its
    // next drain (every 1 ms): both within a bounded wait.
    let drainer = || {
        faultline::testing::threads(std::process::id(), "fl-io-pal-koff")
            .pop()
            .map(|t| parse_cpu_list(&t.cpus))
    };
    let end = Instant::now() + WAIT;
    let list = loop {
        let cpus = drainer();
        match cpus {
            Some(cpus) if !cpus.contains(&mine) => break cpus,
            _ if Instant::now() > end => panic!("drain thread's CPUs: {cpus:?}"),
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    assert!(
        !list.contains(&mine) && !list.is_empty(),
        "drainer allowed {list:?}, queue on {mine}"
    );
}

/// "0-3,5" -> [0, 1, 2, 3, 5].
fn parse_cpu_list(s: &str) -> Vec<usize> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .flat_map(|r| match r.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<usize>>(),
            None => vec![r.parse().unwrap()],
        })
        .collect()
}

/// A store whose fills of one page wait for a gate; other pages fill at once.
struct OnePageGate {
    data: MemoryStore,
    page: u64,
    open: AtomicBool,
}
impl PageStore for OnePageGate {
    fn describe(&self) -> &str {
        "one-page-gate"
    }
    fn len(&self) -> Option<u64> {
        self.data.len()
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let end = Instant::now() + WAIT;
        while offset / PS as u64 == self.page && !self.open.load(SeqCst) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.data.fill(offset, buf)
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.data.write_back(offset, data)
    }
}

/// A page response rechecks only the parked I/Os on that page: an I/O
/// still waiting for another page is not checked again, so its page is
/// not requested twice (before, every response re-posted every parked
/// miss: O(parked) mutex round trips per response). Both I/Os complete.
#[test]
fn a_response_rechecks_only_the_io_on_its_page() {
    if two_cpus().is_none() {
        return; // one worker would serve the gated page first
    }
    let engine = PollEngine::new().unwrap();
    let (gated, free) = (2usize, 5usize);
    let store = Arc::new(OnePageGate {
        data: MemoryStore::new((0..8 * PS).map(|o| pat(4, o)).collect()),
        page: gated as u64,
        open: AtomicBool::new(false),
    });
    let region = lazy_region(8 * PS, Shared(store.clone()), &engine);
    let tmp = Temp::new("recheck", &vec![7u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Unordered);
    let mut q = dev.queue(Backend::Uring { depth: 8 }).unwrap();
    q.read_at(&f, 0, gated * PS, PS, 1).unwrap();
    q.read_at(&f, 0, free * PS, PS, 2).unwrap();
    assert_eq!(q.parked(), 2);
    // The free page's response comes while the gated one is still held.
    let c = q
        .complete(WAIT)
        .expect("the read into the free page completes");
    assert_eq!((c.tag, c.result.unwrap()), (2, PS));
    let s = t.stats();
    assert_eq!((s.posts, s.deduplicated), (2, 0), "{s:?}");
    assert_eq!(q.parked(), 1);
    store.open.store(true, SeqCst);
    let c = q
        .complete(WAIT)
        .expect("the read into the gated page completes");
    assert_eq!((c.tag, c.result.unwrap()), (1, PS));
    let s = t.stats();
    assert_eq!((s.posts, s.deduplicated), (2, 0), "{s:?}");
    for page in [gated, free] {
        // SAFETY: resident now; the reads completed.
        let b = unsafe { *region.as_ptr().add(page * PS + 9) };
        assert_eq!(b, 7, "page {page}");
    }
}

/// An ordered queue's requests are served wherever the kernel puts the
/// worker, its poster's CPU included: the queue is paused behind the page,
/// so its thread only waits (keeping off its CPU cost B3 most of its
/// datagrams). Every read still lands.
#[test]
fn ordered_queue_requests_are_not_kept_off_the_poster_cpu() {
    let Some(mine) = two_cpus() else { return };
    let engine = PollEngine::new().unwrap();
    let pages = 8;
    let data = MemoryStore::new((0..pages * PS).map(|o| pat(5, o)).collect());
    let region = lazy_region(pages * PS, data, &engine);
    let tmp = Temp::new("ordered-on", &vec![6u8; PS]);
    let f = Arc::new(File::open(&tmp.0).unwrap());
    let t = tenant();
    let dev = device(region.clone(), &t, Ordering::Ordered);
    let mut q = dev.queue(Backend::Uring { depth: 16 }).unwrap();
    faultline_sys::thread::pin_to_cpu(mine).unwrap();
    for p in 0..pages {
        q.read_at(&f, 0, p * PS + 8, 64, p as u64).unwrap();
    }
    for p in 0..pages as u64 {
        let c = q.complete(WAIT).expect("every read completes");
        assert_eq!((c.tag, c.result.unwrap()), (p, 64));
    }
    let s = t.stats();
    assert!(s.posts > 0, "{s:?}");
    assert_eq!(s.off_poster_cpu, 0, "{s:?}");
    for p in 0..pages {
        // SAFETY: the reads completed; the region is mapped.
        let b = unsafe { *region.as_ptr().add(p * PS + 8) };
        assert_eq!(b, 6, "page {p}");
    }
}
