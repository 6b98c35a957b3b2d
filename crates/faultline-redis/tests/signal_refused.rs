//! The signal engine refuses a RedisStore (its own binary: creating a
//! signal engine installs the process-wide SIGBUS handler).

use faultline::{engine, EngineConfig, EngineKind, Error, Region};
use faultline_redis::server::RedisServer;
use faultline_redis::RedisStore;

#[test]
fn the_signal_engine_refuses_a_redis_store_and_says_why() {
    let server = RedisServer::start().unwrap();
    let url = server.store_url("sig");
    let data = vec![7u8; 16 * 4096];
    RedisStore::put(
        &url,
        Default::default(),
        &data[..],
        data.len() as u64,
        |_| {},
    )
    .unwrap();
    let e = engine::create(EngineKind::Signal, EngineConfig::default()).unwrap();
    let err = Region::builder(data.len())
        .store(RedisStore::open(&url).unwrap())
        .build_dyn(e)
        .unwrap_err();
    assert!(matches!(err, Error::StoreNotSignalSafe { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("redis redis+unix://"), "{msg}");
    assert!(
        msg.contains("a network client is not async-signal-safe"),
        "{msg}"
    );
    // The same store with a thread engine works.
    let e = engine::create(EngineKind::Poll, EngineConfig::default()).unwrap();
    let r = Region::builder(data.len())
        .store(RedisStore::open(&url).unwrap())
        .build_dyn(e)
        .unwrap();
    // SAFETY: inside the region.
    assert_eq!(unsafe { *r.as_ptr().add(5 * 4096 + 3) }, 7);
}
