//! RedisStore against real `redis-server` processes (a unix socket in a
//! temporary directory, a 3-master cluster on loopback), started and
//! stopped by pid by each test. No signal handlers are installed in this
//! binary; scenarios that die of SIGBUS run in child processes.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultline::policy::PolicyKind;
use faultline::testing::child::deadline;
use faultline::{
    engine, Engine, EngineConfig, EngineKind, Error, EvictionConfig, Region, StoreError,
};
use faultline_redis::server::{pattern, RedisCluster, RedisServer};
use faultline_redis::{RedisConfig, RedisStore};

const PS: usize = 4096;

/// Failures within seconds for tests (a loaded CI machine still gets 1 s
/// per request and 3 s of retries before a page is poisoned).
fn quick() -> RedisConfig {
    RedisConfig {
        connect_timeout: Duration::from_secs(1),
        command_timeout: Duration::from_secs(1),
        deadline: Duration::from_secs(3),
        ..RedisConfig::default()
    }
}

/// The key holding store offset `off`.
fn key_at(store: &RedisStore, off: usize) -> String {
    store.chunk_key((off / store.info().chunk_bytes) as u64)
}

fn put(url: &str, data: &[u8], cfg: RedisConfig) {
    RedisStore::put(url, cfg, data, data.len() as u64, |_| {}).unwrap();
}

fn thread_engine(kind: EngineKind) -> Arc<dyn Engine> {
    engine::create(
        kind,
        EngineConfig {
            workers: 2,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn region_bytes(r: &Region) -> &[u8] {
    // SAFETY: the region is mapped for its whole length while `r` lives;
    // every page read faults in from the store.
    unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) }
}

#[test]
fn every_page_round_trips_through_both_thread_engines_and_get() {
    let _d = deadline(60);
    let server = RedisServer::start().unwrap();
    let url = server.store_url("rt");
    // Not a multiple of the chunk: the last chunk is short.
    let data = pattern(8 * 1024 * 1024 - 1000, 1);
    put(&url, &data, quick());
    for kind in [EngineKind::Poll, EngineKind::Workers] {
        let store = RedisStore::open_with(&url, quick()).unwrap();
        assert_eq!(store.info().len, data.len() as u64);
        let r = Region::builder(data.len().div_ceil(PS) * PS)
            .store(store)
            .fault_around(64)
            .build_dyn(thread_engine(kind))
            .unwrap();
        let got = region_bytes(&r);
        assert!(
            got[..data.len()] == data[..],
            "{kind:?}: every byte from Redis"
        );
        assert!(
            got[data.len()..].iter().all(|&b| b == 0),
            "tail past the data"
        );
        let st = r.stats();
        assert_eq!(st.installed as usize, r.pages(), "{kind:?}: {st:?}");
        assert!(
            st.faults as usize <= r.pages() / 32,
            "{kind:?}: windows, {st:?}"
        );
    }
    // `get` verifies the stored checksum.
    let store = RedisStore::open(&url).unwrap();
    let mut out = Vec::new();
    let sum = store.get(&mut out, |_| {}).unwrap();
    assert_eq!(out, data);
    assert_eq!(
        sum,
        faultline_redis::checksum(faultline_redis::FNV_START, &data)
    );
    // A changed chunk fails the checksum.
    let mut c = server.connection().unwrap();
    redis::cmd("SET")
        .arg(store.chunk_key(3))
        .arg(vec![0u8; store.info().chunk_bytes])
        .query::<()>(&mut c)
        .unwrap();
    let err = store.get(std::io::sink(), |_| {}).unwrap_err();
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
    // A short chunk inside the length is an error, never short data.
    redis::cmd("SET")
        .arg(store.chunk_key(3))
        .arg(vec![0u8; 100])
        .query::<()>(&mut c)
        .unwrap();
    let mut page = vec![0u8; PS];
    let off = 3 * store.info().chunk_bytes as u64 + PS as u64;
    let err = faultline::PageStore::fill(&store, off, &mut page).unwrap_err();
    assert!(err.to_string().contains("short or missing"), "{err}");
    assert_eq!(err.offset(), off);
}

#[test]
fn a_window_with_holes_is_one_round_trip() {
    let _d = deadline(60);
    let server = RedisServer::start().unwrap();
    let url = server.store_url("holes");
    let data = pattern(64 * PS, 2);
    put(&url, &data, quick());
    let r = Region::builder(64 * PS)
        .store(RedisStore::open_with(&url, quick()).unwrap())
        .fault_around(64)
        .build_dyn(thread_engine(EngineKind::Poll))
        .unwrap();
    for pg in [5, 20, 40] {
        r.populate(pg * PS, PS).unwrap();
    }
    // Read events the server processed (each INFO counts itself).
    let mut c = server.connection().unwrap();
    let reads = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .map(|l| l.trim().parse().unwrap())
            .unwrap()
    };
    let before = reads(&mut c);
    assert_eq!(region_bytes(&r)[30 * PS + 9], data[30 * PS + 9]);
    let end = Instant::now() + Duration::from_secs(5);
    while !r.is_resident(0, 64 * PS) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(r.is_resident(0, 64 * PS), "the whole window is installed");
    // The faulting run and its holes (61 absent pages, GETs and GETRANGEs
    // of 4 keys): one write, one read event on the server.
    assert_eq!(reads(&mut c) - before, 2, "one round trip for the window");
    assert!(*region_bytes(&r) == data[..]);
}

#[test]
fn write_flush_and_read_back_through_a_new_region() {
    let _d = deadline(60);
    let server = RedisServer::start().unwrap();
    let url = server.store_url("wb");
    let data = pattern(2 * 1024 * 1024, 3);
    put(&url, &data, quick());
    let new = pattern(data.len(), 4);
    {
        let r = Region::builder(data.len())
            .store(RedisStore::open_with(&url, quick()).unwrap())
            .budget(EvictionConfig {
                budget_pages: data.len() / PS,
                policy: PolicyKind::Clock,
            })
            .build_dyn(thread_engine(EngineKind::Workers))
            .unwrap();
        // SAFETY: the region is mapped and writable for its length.
        unsafe { std::ptr::copy_nonoverlapping(new.as_ptr(), r.as_ptr(), new.len()) };
        assert_eq!(
            r.flush().unwrap(),
            data.len() / PS,
            "every page written back"
        );
        assert_eq!(r.flush().unwrap(), 0, "clean after a flush");
    }
    let r = Region::builder(data.len())
        .store(RedisStore::open_with(&url, quick()).unwrap())
        .build_dyn(thread_engine(EngineKind::Poll))
        .unwrap();
    assert!(
        *region_bytes(&r) == new[..],
        "the new region reads the writes"
    );
}

#[test]
fn eviction_writes_back_to_redis_under_a_budget() {
    let _d = deadline(90);
    let server = RedisServer::start().unwrap();
    let url = server.store_url("evict");
    let pages = 1024;
    let data = pattern(pages * PS, 5);
    put(&url, &data, quick());
    let mut expect = data.clone();
    {
        let r = Region::builder(pages * PS)
            .store(RedisStore::open_with(&url, quick()).unwrap())
            // Small windows: faults wait for the evictor past budget plus
            // four windows (the default read-ahead's 256-page windows
            // would let the whole region in before any fault waits).
            .fault_around(4)
            .budget(EvictionConfig {
                budget_pages: 64,
                policy: PolicyKind::Clock,
            })
            .build_dyn(thread_engine(EngineKind::Workers))
            .unwrap();
        let p = r.as_ptr();
        for round in 0..2u8 {
            for pg in 0..pages {
                let off = pg * PS + (pg * 7 + round as usize) % PS;
                // SAFETY: inside the region.
                unsafe {
                    assert_eq!(*p.add(off), expect[off], "page {pg} round {round}");
                    *p.add(off) = round.wrapping_add(pg as u8) ^ 0x5a;
                }
                expect[off] = round.wrapping_add(pg as u8) ^ 0x5a;
            }
        }
        let ev = r.eviction_stats().unwrap();
        assert!(ev.evicted > 0 && ev.written_back > 0, "{ev:?}");
        assert_eq!(ev.write_back_errors, 0, "{ev:?}");
        // Budget plus the evictor's slack, well under the region.
        assert!(ev.max_resident as usize <= pages / 4, "{ev:?}");
        assert!(*region_bytes(&r) == expect[..], "every write read back");
    }
    // Dropping the region wrote back the rest.
    let store = RedisStore::open(&url).unwrap();
    let mut got = vec![0u8; pages * PS];
    faultline::PageStore::fill(&store, 0, &mut got).unwrap();
    assert!(got == expect, "Redis holds every last write");
}

/// The child of `server_killed_mid_run_*`: opens the store at
/// `FAULTLINE_REDIS_URL`, reads page 0, kills the server (pid
/// `FAULTLINE_REDIS_PID`), then touches page 100. It must die of SIGBUS;
/// printing "READ" means a page read as something.
#[test]
fn child_fault_after_server_killed() {
    let (Ok(url), Ok(pid)) = (
        std::env::var("FAULTLINE_REDIS_URL"),
        std::env::var("FAULTLINE_REDIS_PID"),
    ) else {
        return; // only meaningful as the child of the test below
    };
    let r = Region::builder(256 * PS)
        .store(RedisStore::open_with(&url, quick()).unwrap())
        .fault_around(16)
        .build_dyn(thread_engine(EngineKind::Poll))
        .unwrap();
    let first = region_bytes(&r)[0];
    println!("FIRST {first}");
    if pid != "none" {
        let ok = Command::new("kill").args(["-KILL", &pid]).status().unwrap();
        assert!(ok.success());
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = region_bytes(&r)[100 * PS + 3];
    println!("READ {v}");
}

fn run_child(url: &str, pid: &str) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "child_fault_after_server_killed",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FAULTLINE_REDIS_URL", url)
        .env("FAULTLINE_REDIS_PID", pid)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("child timed out");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn server_killed_mid_run_poisons_the_page_and_flush_reports_lost_writes_then_restart_works() {
    use std::os::unix::process::ExitStatusExt;
    let _d = deadline(90);
    let mut server = RedisServer::start().unwrap();
    let url = server.store_url("kill");
    let data = pattern(256 * PS, 6);
    put(&url, &data, quick());
    let key = format!(
        "key {}",
        RedisStore::open(&url)
            .unwrap()
            .chunk_key((100 * PS / faultline_redis::DEFAULT_CHUNK) as u64)
    );
    assert!(key.starts_with("key fl:{kill:0}:g1:"), "{key}");

    // A fault after the server died: SIGBUS with the region, offset, key
    // and cause; never a zero page.
    let pid = server.pid().unwrap().to_string();
    let out = run_child(&url, &pid);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains(&format!("FIRST {}", data[0])),
        "{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("READ"),
        "a page read after the server died: {stdout}"
    );
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{stderr}");
    assert!(stderr.contains("store error at region"), "{stderr}");
    assert!(
        stderr.contains("offset 0x64000"),
        "names the offset: {stderr}"
    );
    assert!(stderr.contains(&key), "names the key: {stderr}");
    assert!(
        stderr.contains("tries over"),
        "names the cause and retries: {stderr}"
    );

    // Dirty pages whose write-back fails stay dirty; flush reports them.
    server.restart().unwrap();
    put(&url, &data, quick());
    // Each lost write-back gives up after half a second.
    let short = RedisConfig {
        deadline: Duration::from_millis(500),
        ..quick()
    };
    let r = Region::builder(256 * PS)
        .store(RedisStore::open_with(&url, short).unwrap())
        .budget(EvictionConfig {
            budget_pages: 256,
            policy: PolicyKind::Fifo,
        })
        .build_dyn(thread_engine(EngineKind::Poll))
        .unwrap();
    let p = r.as_ptr();
    for pg in 0..8 {
        // SAFETY: inside the region.
        unsafe { *p.add(pg * PS) = 0xAB };
    }
    server.stop();
    let err = r.flush().unwrap_err();
    match &err {
        Error::Store(StoreError::Remote { key, cause, .. }) => {
            assert!(key.starts_with("fl:{kill:0}:"), "{err}");
            assert!(cause.contains("tries over"), "{err}");
        }
        e => panic!("expected a remote store error, got {e}"),
    }
    let ev = r.eviction_stats().unwrap();
    assert_eq!(ev.write_back_errors, 8, "{ev:?}");
    assert_eq!(ev.written_back, 0, "{ev:?}");

    // Restarted (empty: nothing persisted) and loaded again: new faults
    // succeed, and the pages still dirty are written back now.
    server.restart().unwrap();
    put(&url, &data, quick());
    assert_eq!(region_bytes(&r)[200 * PS + 1], data[200 * PS + 1]);
    assert_eq!(r.flush().unwrap(), 8, "the lost write-backs are retried");
    let store = RedisStore::open(&url).unwrap();
    let mut page = vec![0u8; PS];
    faultline::PageStore::fill(&store, 3 * PS as u64, &mut page).unwrap();
    assert_eq!(page[0], 0xAB);
    assert_eq!(page[1..], data[3 * PS + 1..4 * PS]);

    // A key missing inside the store's length is an error, not zeros.
    let mut c = server.connection().unwrap();
    redis::cmd("DEL")
        .arg(key_at(&store, 100 * PS))
        .query::<()>(&mut c)
        .unwrap();
    let out = run_child(&url, "none");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{stderr}");
    assert!(
        stderr.contains(&key) && stderr.contains("missing"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("READ"));
}

#[test]
fn a_slow_server_fails_past_the_deadline_then_recovers() {
    let _d = deadline(60);
    let server = RedisServer::start().unwrap();
    let url = server.store_url("slow");
    let data = pattern(64 * PS, 7);
    put(&url, &data, quick());
    let cfg = RedisConfig {
        connect_timeout: Duration::from_millis(100),
        command_timeout: Duration::from_millis(100),
        deadline: Duration::from_millis(500),
        ..quick()
    };
    let store = RedisStore::open_with(&url, cfg).unwrap();
    let mut buf = vec![0u8; 16 * PS];
    faultline::PageStore::fill(&store, 0, &mut buf).unwrap();
    let mut c = server.connection().unwrap();
    let sleeper = std::thread::spawn(move || {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(2)
            .query::<()>(&mut c)
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let err = faultline::PageStore::fill(&store, 16 * PS as u64, &mut buf).unwrap_err();
    let took = t.elapsed();
    match &err {
        StoreError::Remote { key, offset, .. } => {
            assert_eq!(key.as_ref(), key_at(&store, 16 * PS));
            assert_eq!(*offset, 16 * PS as u64);
        }
        e => panic!("expected a remote error, got {e}"),
    }
    assert!(err.to_string().contains("tries over"), "{err}");
    assert!(
        took < Duration::from_millis(1900),
        "gave up at the deadline, not the sleep: {took:?}"
    );
    sleeper.join().unwrap();
    faultline::PageStore::fill(&store, 16 * PS as u64, &mut buf).unwrap();
    assert!(buf == data[16 * PS..32 * PS], "reconnected after the sleep");
}

#[test]
fn a_three_master_cluster_holds_keys_on_every_node() {
    let _d = deadline(90);
    let cluster = RedisCluster::start(3).unwrap();
    let url = cluster.store_url("cl");
    let data = pattern(4 * 1024 * 1024, 8);
    // 16 KiB keys, one per hash tag: 256 tags spread over the slots.
    let cfg = RedisConfig {
        group_chunks: 1,
        ..RedisConfig::with_chunk(16 * 1024)
    };
    put(&url, &data, cfg);
    for &port in cluster.ports() {
        let mut c = cluster.node(port).unwrap();
        let n: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        assert!(n > 16, "node {port} holds {n} keys");
    }
    let r = Region::builder(data.len())
        .store(RedisStore::open_with(&url, quick()).unwrap())
        .fault_around(64)
        .budget(EvictionConfig {
            budget_pages: data.len() / PS,
            policy: PolicyKind::Clock,
        })
        .build_dyn(thread_engine(EngineKind::Workers))
        .unwrap();
    assert!(*region_bytes(&r) == data[..], "every page from the cluster");
    // SAFETY: inside the region.
    unsafe { *r.as_ptr().add(777 * PS) = !data[777 * PS] };
    assert_eq!(r.flush().unwrap(), 1);
    let store = RedisStore::open(&url).unwrap();
    let mut page = vec![0u8; PS];
    faultline::PageStore::fill(&store, 777 * PS as u64, &mut page).unwrap();
    assert_eq!(page[0], !data[777 * PS]);
}

#[test]
fn a_stream_is_read_ahead_and_a_write_back_makes_it_stale() {
    use faultline::PageStore;
    let _d = deadline(60);
    let server = RedisServer::start().unwrap();
    let url = server.store_url("ahead");
    let data = pattern(1 << 20, 9);
    put(&url, &data, quick());
    let store = Arc::new(RedisStore::open_with(&url, quick()).unwrap());
    let w = 64 * 1024;
    let mut buf = vec![0u8; w];
    let mut read = |store: &RedisStore, k: usize| {
        store.fill((k * w) as u64, &mut buf).unwrap();
        buf.clone()
    };
    // A stream: from the second window on, the next one goes out with
    // each request; the third to the eighth were sent ahead.
    for k in 0..8 {
        assert!(read(&store, k) == data[k * w..(k + 1) * w], "window {k}");
    }
    let t = store.timing();
    assert_eq!((t.calls, t.ahead_hits, t.ahead_dropped), (8, 6, 0), "{t:?}");
    // The ninth is on its way; another thread (connection) writes a page
    // of it back: what was read ahead is stale, dropped and read again.
    let new = pattern(PS, 10);
    let (s2, n2) = (store.clone(), new.clone());
    std::thread::spawn(move || s2.write_back((8 * w + PS) as u64, &n2))
        .join()
        .unwrap()
        .unwrap();
    let got = read(&store, 8);
    assert!(
        got[PS..2 * PS] == new[..],
        "the write-back, not the stale read-ahead"
    );
    assert!(got[..PS] == data[8 * w..8 * w + PS] && got[2 * PS..] == data[8 * w + 2 * PS..9 * w]);
    let t = store.timing();
    assert_eq!((t.ahead_hits, t.ahead_dropped), (6, 1), "{t:?}");
    // The stream goes on; a jump elsewhere drops what was sent ahead.
    assert!(read(&store, 9) == data[9 * w..10 * w]);
    assert!(read(&store, 2) == data[2 * w..3 * w]);
    let t = store.timing();
    assert_eq!((t.ahead_hits, t.ahead_dropped), (7, 2), "{t:?}");
    // Off: nothing is sent ahead.
    let off = RedisStore::open_with(
        &url,
        RedisConfig {
            read_ahead: false,
            ..quick()
        },
    )
    .unwrap();
    for k in 0..4 {
        assert!(read(&off, k)[..] == data[k * w..(k + 1) * w]);
    }
    assert_eq!(off.timing().ahead_hits, 0);
}

#[test]
fn tcp_and_unix_url_forms_read_and_write_back() {
    let _d = deadline(60);
    let tcp = RedisServer::start_tcp().unwrap();
    let unix = RedisServer::start().unwrap();
    let urls = [
        format!("{}#tcp", tcp.url()),
        format!("unix://{}#unix", unix.socket().unwrap().display()),
    ];
    assert!(urls[0].starts_with("redis://127.0.0.1:"), "{}", urls[0]);
    assert!(urls[1].starts_with("unix:///"), "{}", urls[1]);
    let data = pattern(1 << 20, 11);
    for url in &urls {
        put(url, &data, quick());
        let r = Region::builder(data.len())
            .store(RedisStore::open_with(url, quick()).unwrap())
            .fault_around(64)
            .budget(EvictionConfig {
                budget_pages: data.len() / PS,
                policy: PolicyKind::Clock,
            })
            .build_dyn(thread_engine(EngineKind::Poll))
            .unwrap();
        assert!(*region_bytes(&r) == data[..], "{url}: every byte");
        // SAFETY: inside the region.
        unsafe { *r.as_ptr().add(100 * PS + 7) = !data[100 * PS + 7] };
        assert_eq!(r.flush().unwrap(), 1, "{url}");
        let store = RedisStore::open(url).unwrap();
        let mut page = vec![0u8; PS];
        faultline::PageStore::fill(&store, 100 * PS as u64, &mut page).unwrap();
        assert_eq!(page[7], !data[100 * PS + 7], "{url}: the write-back");
        assert_eq!(page[..7], data[100 * PS..100 * PS + 7]);
    }
    // Nothing reached the other server: each URL named its own (its
    // chunks, the metadata and the generation records).
    let mut c = tcp.connection().unwrap();
    let n: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 2 + (data.len() / faultline_redis::DEFAULT_CHUNK) as u64);
}

#[test]
fn a_flush_writes_adjacent_pages_of_a_chunk_as_one_command() {
    let _d = deadline(60);
    let server = RedisServer::start().unwrap();
    let url = server.store_url("coalesce");
    let data = pattern(64 * PS, 12);
    put(&url, &data, quick());
    let r = Region::builder(64 * PS)
        .store(RedisStore::open_with(&url, quick()).unwrap())
        .budget(EvictionConfig {
            budget_pages: 64,
            policy: PolicyKind::Clock,
        })
        .build_dyn(thread_engine(EngineKind::Poll))
        .unwrap();
    let mut c = server.connection().unwrap();
    // Calls of `cmd` since the last reset.
    let calls = |c: &mut redis::Connection, cmd: &str| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .map_or(0, |l| l.split(',').next().unwrap().parse().unwrap())
    };
    let reset = |c: &mut redis::Connection| {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query::<()>(c)
            .unwrap()
    };
    let p = r.as_ptr();
    let mut expect = data.clone();
    // Every page dirty: 4 whole chunks of 16 pages, 4 SET XX.
    for pg in 0..64 {
        // SAFETY: inside the region.
        unsafe { *p.add(pg * PS + 1) = !data[pg * PS + 1] };
        expect[pg * PS + 1] = !data[pg * PS + 1];
    }
    reset(&mut c);
    assert_eq!(r.flush().unwrap(), 64);
    assert_eq!((calls(&mut c, "set"), calls(&mut c, "eval")), (4, 0));
    // Pages 3, 4, 5 and 40: two partial writes.
    for pg in [3, 4, 5, 40] {
        // SAFETY: inside the region.
        unsafe { *p.add(pg * PS + 2) = 0xC3 };
        expect[pg * PS + 2] = 0xC3;
    }
    reset(&mut c);
    assert_eq!(r.flush().unwrap(), 4);
    assert_eq!((calls(&mut c, "set"), calls(&mut c, "eval")), (0, 2));
    drop(r);
    let mut got = vec![0u8; 64 * PS];
    faultline::PageStore::fill(&RedisStore::open(&url).unwrap(), 0, &mut got).unwrap();
    assert!(got == expect, "every write arrived");
}
