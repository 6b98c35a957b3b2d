//! Replacing a store: generations against real `redis-server` processes
//! (a unix socket in a temporary directory, a 3-master cluster on
//! loopback), each started and stopped by pid by its test. A failed
//! upload leaves the old store byte for byte and no keys of its own; a
//! complete one switches in one step and frees the old generation; a
//! reader keeps its generation and fails (never mixes) once it is gone;
//! stores written before generations open, are cleaned by `gc` and
//! replaced the same way. `faultline store put` killed by a signal is
//! tested with the binary, in `faultline-cli`'s tests.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use faultline::testing::child::{deadline, wait_until};
use faultline::PageStore;
use faultline_redis::server::{pattern, Keys, RedisCluster, RedisServer};
use faultline_redis::{RedisConfig, RedisStore, RedisStoreError};

fn quick(chunk: usize) -> RedisConfig {
    RedisConfig {
        connect_timeout: Duration::from_secs(1),
        command_timeout: Duration::from_secs(2),
        deadline: Duration::from_secs(3),
        ..RedisConfig::with_chunk(chunk)
    }
}

/// A source that fails after `ok` bytes (a disk error, an interrupt).
struct FailsAfter<'a> {
    data: &'a [u8],
    at: usize,
    ok: usize,
}

impl Read for FailsAfter<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at >= self.ok {
            return Err(std::io::Error::other("the source failed on purpose"));
        }
        let n = buf.len().min(self.ok - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn get_all(url: &str) -> Vec<u8> {
    let mut out = Vec::new();
    RedisStore::open(url)
        .unwrap()
        .get(&mut out, |_| {})
        .unwrap();
    out
}

/// The store's keys (chunks, metadata, records).
fn store_keys(k: &impl Keys, name: &str) -> Vec<String> {
    k.keys(&format!("fl:{{{name}*")).unwrap()
}

/// Runs `scenario` against a server on a unix socket (90 s at most).
fn on_a_server(name: &str, scenario: fn(&RedisServer, &str, &str)) {
    let _d = deadline(90);
    let s = RedisServer::start().unwrap();
    scenario(&s, &s.store_url(name), name);
}

/// Runs `scenario` against a 3-master cluster on loopback (120 s at most).
fn on_a_cluster(name: &str, scenario: fn(&RedisCluster, &str, &str)) {
    let _d = deadline(120);
    let c = RedisCluster::start(3).unwrap();
    scenario(&c, &c.store_url(name), name);
}

/// put A; put B from a source that fails half way; A is what `info` and
/// `get` give, and B left no key.
fn a_failed_upload_leaves_the_old_store(k: &impl Keys, url: &str, name: &str) {
    let a = pattern(4 << 20, 1);
    let b = pattern(6 << 20, 2);
    let cfg = quick(16 * 1024);
    let info_a = RedisStore::put(url, cfg.clone(), &a[..], a.len() as u64, |_| {}).unwrap();
    assert_eq!(info_a.generation, 1);
    let keys_a = store_keys(k, name);
    // 256 chunks, the metadata, the records.
    assert_eq!(keys_a.len(), 256 + 2, "{keys_a:?}");
    let reader = RedisStore::open_with(url, cfg.clone()).unwrap();
    let mut seen = 0u64;
    let src = FailsAfter {
        data: &b,
        at: 0,
        ok: b.len() / 2,
    };
    let err = RedisStore::put(url, cfg.clone(), src, b.len() as u64, |d| seen = d).unwrap_err();
    assert!(seen > 0, "the upload had started");
    let msg = err.to_string();
    match &err {
        RedisStoreError::Abandoned { generation, .. } => assert_eq!(*generation, 2),
        e => panic!("expected an abandoned upload, got {e}"),
    }
    assert!(
        msg.contains("the store is unchanged")
            && msg.contains("chunk keys were removed")
            && msg.contains("the source failed on purpose"),
        "{msg}"
    );
    assert_eq!(store_keys(k, name), keys_a, "B left no key");
    assert_eq!(RedisStore::open(url).unwrap().info(), info_a);
    assert!(get_all(url) == a, "get gives A byte for byte");
    // A reader opened before reads A.
    let mut buf = vec![0u8; 1 << 20];
    reader.fill(1 << 20, &mut buf).unwrap();
    assert!(buf == a[1 << 20..2 << 20]);
}

/// put A (16 MiB); put B (800 KiB) over it: the old generation's keys
/// are gone and its memory freed; a reader of A fails with a message
/// naming the replacement (never B's bytes, never zeros); a write-back
/// through it fails and creates no key.
fn a_replacement_switches_and_frees_the_old_generation(k: &impl Keys, url: &str, name: &str) {
    let a = pattern(16 << 20, 3);
    let b = pattern(800 << 10, 4);
    let cfg = quick(64 * 1024);
    RedisStore::put(url, cfg.clone(), &a[..], a.len() as u64, |_| {}).unwrap();
    let mem_a = k.used_memory().unwrap();
    let reader = RedisStore::open_with(url, cfg.clone()).unwrap();
    let r = RedisStore::replace(url, cfg.clone(), &b[..], b.len() as u64, |_| {}).unwrap();
    assert_eq!((r.info.generation, r.previous), (2, Some(1)), "{r:?}");
    assert_eq!(r.removed.len(), 1, "{r:?}");
    assert_eq!(r.removed[0].generation, 1);
    assert_eq!(r.removed[0].keys, 256, "{r:?}");
    assert!(r.left.is_empty(), "{r:?}");
    let keys = store_keys(k, name);
    assert_eq!(keys.len() as u64, r.info.chunks() + 2, "{keys:?}");
    assert!(
        keys.iter()
            .all(|k| k.contains(":g2:") || k.ends_with(":meta") || k.ends_with(":gens")),
        "{keys:?}"
    );
    assert_eq!(k.dbsize().unwrap(), keys.len() as u64);
    let mem_b = k.used_memory().unwrap();
    assert!(
        mem_b + (12 << 20) < mem_a,
        "used_memory {mem_a} -> {mem_b}: the old generation's memory is freed"
    );
    assert!(get_all(url) == b);
    // The reader of generation 1.
    let mut buf = vec![0xEEu8; 64 * 1024];
    let err = reader.fill(3 << 20, &mut buf).unwrap_err().to_string();
    assert!(
        err.contains("generation 1 of the store")
            && err.contains("replaced by generation 2")
            && err.contains("open the store again"),
        "{err}"
    );
    let err = reader
        .write_back(5 << 20, &[7u8; 4096])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nothing was written") && err.contains("replaced by generation 2"),
        "{err}"
    );
    let err = reader
        .write_back(0, &a[..64 * 1024])
        .unwrap_err()
        .to_string();
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(store_keys(k, name), keys, "no write-back recreated a key");
}

/// Readers of A, some opened before the replacement and some during it,
/// read windows while B (same length, other bytes) is put over A: every
/// window that succeeds is A's bytes, every one that fails says the
/// generation was replaced; readers opened after read B.
fn readers_never_mix_generations(_k: &impl Keys, url: &str, _name: &str) {
    let len = 8 << 20;
    let a = Arc::new(pattern(len, 5));
    let b = pattern(len, 6);
    let cfg = quick(16 * 1024);
    RedisStore::put(url, cfg.clone(), &a[..], len as u64, |_| {}).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (good, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (url, cfg, a) = (url.to_string(), cfg.clone(), a.clone());
            let (stop, good, failed) = (stop.clone(), good.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut store = RedisStore::open_with(&url, cfg.clone()).unwrap();
                let mut buf = vec![0u8; 40 * 1024];
                let mut x = t + 1;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (x >> 20) as usize % (len - buf.len());
                    match store.fill(off as u64, &mut buf) {
                        Ok(()) => {
                            assert!(
                                buf[..] == a[off..off + buf.len()],
                                "a window at {off:#x} is not generation {}'s bytes",
                                store.info().generation
                            );
                            good.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            let e = e.to_string();
                            assert!(e.contains("replaced by generation 2"), "{e}");
                            failed.fetch_add(1, Ordering::Relaxed);
                            // Open again: generation 2 now, or 1 still
                            // during the upload (the loop reads A).
                            let again = RedisStore::open_with(&url, cfg.clone()).unwrap();
                            if again.info().generation == 2 {
                                return n;
                            }
                            store = again;
                        }
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    // Some reads of A first.
    wait_until(Duration::from_secs(20), || {
        good.load(Ordering::Relaxed) >= 20
    });
    RedisStore::put(url, cfg.clone(), &b[..], len as u64, |_| {}).unwrap();
    // Each reader still on generation 1 meets the removal.
    wait_until(Duration::from_secs(20), || {
        failed.load(Ordering::Relaxed) >= 2
    });
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert!(good.load(Ordering::Relaxed) >= 20);
    assert_eq!(
        failed.load(Ordering::Relaxed),
        2,
        "each reader saw the replacement"
    );
    assert!(get_all(url) == b);
}

/// A store as the code before generations wrote it (no `gen`, keys
/// `fl:{NAME:G}:C`), with surplus keys past its end that an earlier,
/// larger put left: it opens and reads; `gc` removes the surplus; `put`
/// over it replaces it and removes its keys.
fn a_store_from_before_generations(k: &impl Keys, url: &str, name: &str) {
    let chunk = 16 * 1024;
    let group = 64;
    let a = pattern(1 << 20, 7); // 64 chunks
    for (c, data) in a.chunks(chunk).enumerate() {
        k.set(&format!("fl:{{{name}:{}}}:{c}", c / group), data)
            .unwrap();
    }
    // What a 200-chunk store put before left past this one's end.
    for c in 64..200 {
        k.set(&format!("fl:{{{name}:{}}}:{c}", c / group), &[1u8; 100])
            .unwrap();
    }
    let sum = faultline_redis::checksum(faultline_redis::FNV_START, &a);
    k.with_key(&format!("fl:{{{name}}}:meta"), |c| {
        redis::cmd("HSET")
            .arg(format!("fl:{{{name}}}:meta"))
            .arg("len")
            .arg(a.len())
            .arg("chunk")
            .arg(chunk)
            .arg("group")
            .arg(group)
            .arg("checksum")
            .arg(format!("{sum:016x}"))
            .query::<()>(c)
    })
    .unwrap();
    let store = RedisStore::open(url).unwrap();
    assert_eq!(store.info().generation, 0);
    assert_eq!(store.chunk_key(70), format!("fl:{{{name}:1}}:70"));
    assert!(get_all(url) == a);
    let r = RedisStore::gc(url, quick(chunk)).unwrap();
    assert_eq!(r.current, Some(0));
    let removed: u64 = r.removed.iter().map(|r| r.keys).sum();
    assert_eq!(removed, 136, "{r:?}");
    assert!(r.removed[0].reason.contains("past the end"), "{r:?}");
    assert_eq!(store_keys(k, name).len(), 64 + 1, "chunks and the metadata");
    assert!(get_all(url) == a, "gc kept every chunk of the store");
    // A second gc finds nothing.
    assert!(RedisStore::gc(url, quick(chunk))
        .unwrap()
        .removed
        .is_empty());
    // Replaced like any other.
    let b = pattern(300 << 10, 8);
    let r = RedisStore::replace(url, quick(chunk), &b[..], b.len() as u64, |_| {}).unwrap();
    assert_eq!((r.info.generation, r.previous), (1, Some(0)), "{r:?}");
    assert_eq!(r.removed.iter().map(|r| r.keys).sum::<u64>(), 64, "{r:?}");
    assert_eq!(
        store_keys(k, name).len() as u64,
        r.info.chunks() + 2,
        "only generation 1, the metadata and the records"
    );
    assert!(get_all(url) == b);
    let err = store.fill(0, &mut [0u8; 4096]).unwrap_err().to_string();
    assert!(err.contains("generation 0 of the store"), "{err}");
}

/// A source that hands out `data` and stops half way until `go` says so.
struct Paused<'a> {
    data: &'a [u8],
    at: usize,
    reached: std::sync::mpsc::Sender<()>,
    go: std::sync::mpsc::Receiver<()>,
}

impl Read for Paused<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.data.len() / 2 {
            let _ = self.reached.send(());
            self.go
                .recv_timeout(Duration::from_secs(30))
                .map_err(std::io::Error::other)?;
        }
        let end = if self.at < self.data.len() / 2 {
            self.data.len() / 2
        } else {
            self.data.len()
        };
        let n = buf.len().min(end - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// `gc` and another `put` during an upload: the upload's keys stay, it
/// is listed as in progress, and it completes.
#[test]
fn gc_and_a_put_keep_an_upload_in_progress() {
    let _d = deadline(60);
    let s = RedisServer::start().unwrap();
    let url = s.store_url("busy");
    let a = pattern(1 << 20, 12);
    let b = pattern(8 << 20, 13);
    let cfg = quick(64 * 1024);
    RedisStore::put(&url, cfg.clone(), &a[..], a.len() as u64, |_| {}).unwrap();
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let (url2, cfg2, b2) = (url.clone(), cfg.clone(), b.clone());
    let upload = std::thread::spawn(move || {
        let src = Paused {
            data: &b2,
            at: 0,
            reached: reached_tx,
            go: go_rx,
        };
        RedisStore::replace(&url2, cfg2, src, b2.len() as u64, |_| {})
    });
    reached.recv_timeout(Duration::from_secs(30)).unwrap();
    let before = store_keys(&s, "busy");
    assert!(before.iter().filter(|k| k.contains(":g2:")).count() >= 64);
    let r = RedisStore::gc(&url, cfg.clone()).unwrap();
    assert!(r.removed.is_empty(), "{r:?}");
    assert_eq!(r.uploading.len(), 1, "{r:?}");
    assert_eq!(r.uploading[0].0, 2);
    assert!(
        r.uploading[0]
            .1
            .starts_with(&format!("pid {} on host ", std::process::id())),
        "{r:?}"
    );
    // Another put of the name keeps it too (and replaces generation 1).
    let c = pattern(100 << 10, 14);
    let rc = RedisStore::replace(&url, cfg.clone(), &c[..], c.len() as u64, |_| {}).unwrap();
    assert_eq!((rc.info.generation, rc.previous), (3, Some(1)), "{rc:?}");
    let g2 = |keys: &[String]| keys.iter().filter(|k| k.contains(":g2:")).count();
    assert_eq!(g2(&store_keys(&s, "busy")), g2(&before));
    go.send(()).unwrap();
    let rb = upload.join().unwrap().unwrap();
    assert_eq!((rb.info.generation, rb.previous), (2, Some(3)), "{rb:?}");
    assert!(get_all(&url) == b);
    assert_eq!(store_keys(&s, "busy").len(), 128 + 2);
}

#[test]
fn sizes_out_of_range_are_refused_before_any_work() {
    let _d = deadline(30);
    let s = RedisServer::start().unwrap();
    let url = s.store_url("sizes");
    let data = pattern(1 << 20, 9);
    for (cfg, what) in [
        (RedisConfig::with_chunk(1 << 40), "outside 512..="),
        (RedisConfig::with_chunk(100), "outside 512..="),
        (RedisConfig::with_chunk(0), "outside 512..="),
        (
            RedisConfig {
                group_chunks: 0,
                ..RedisConfig::default()
            },
            "chunks per hash tag",
        ),
    ] {
        let err = RedisStore::put(&url, cfg, &data[..], data.len() as u64, |_| {}).unwrap_err();
        assert!(matches!(err, RedisStoreError::Config { .. }), "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    assert_eq!(s.dbsize().unwrap(), 0, "nothing was written");
    // The largest chunk is accepted, and costs three copies of itself.
    let max = RedisConfig::with_chunk(faultline_redis::MAX_CHUNK);
    assert_eq!(max.check_put(), Ok(()));
    assert_eq!(max.put_memory(), 3 * faultline_redis::MAX_CHUNK as u64);
    assert_eq!(RedisConfig::default().put_memory(), 3 * (4 << 20));
}

/// The server runs out of memory half way through B: the upload stops,
/// removes its chunks (unlinking needs no memory), and A stays.
#[test]
fn a_server_out_of_memory_mid_upload_keeps_the_old_store() {
    let _d = deadline(60);
    let s = RedisServer::start().unwrap();
    let url = s.store_url("oom");
    let a = pattern(4 << 20, 10);
    let b = pattern(16 << 20, 11);
    let cfg = quick(64 * 1024);
    let info_a = RedisStore::put(&url, cfg.clone(), &a[..], a.len() as u64, |_| {}).unwrap();
    let keys_a = store_keys(&s, "oom");
    let limit = s.used_memory().unwrap() + (8 << 20);
    s.with_key("x", |c| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(limit)
            .query::<()>(c)
    })
    .unwrap();
    let err = RedisStore::put(&url, cfg, &b[..], b.len() as u64, |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("OOM") && msg.contains("chunk keys were removed"),
        "{msg}"
    );
    assert_eq!(store_keys(&s, "oom"), keys_a);
    assert_eq!(RedisStore::open(&url).unwrap().info(), info_a);
    assert!(get_all(&url) == a);
}

#[test]
fn a_failed_upload_leaves_the_old_store_on_a_server() {
    on_a_server("fail", a_failed_upload_leaves_the_old_store);
}

#[test]
fn a_failed_upload_leaves_the_old_store_on_a_cluster() {
    on_a_cluster("fail", a_failed_upload_leaves_the_old_store);
}

#[test]
fn a_replacement_switches_and_frees_the_old_generation_on_a_server() {
    on_a_server("swap", a_replacement_switches_and_frees_the_old_generation);
}

#[test]
fn a_replacement_switches_and_frees_the_old_generation_on_a_cluster() {
    on_a_cluster("swap", a_replacement_switches_and_frees_the_old_generation);
}

#[test]
fn readers_never_mix_generations_on_a_server() {
    on_a_server("mix", readers_never_mix_generations);
}

#[test]
fn readers_never_mix_generations_on_a_cluster() {
    on_a_cluster("mix", readers_never_mix_generations);
}

#[test]
fn a_store_from_before_generations_on_a_server() {
    on_a_server("old", a_store_from_before_generations);
}

#[test]
fn a_store_from_before_generations_on_a_cluster() {
    on_a_cluster("old", a_store_from_before_generations);
}
