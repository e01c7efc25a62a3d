//! The Redis store's Acquire calls go out as `EVALSHA`: a server that lost its scripts
//! (restarted, `SCRIPT FLUSH`) is given them again and the call answers as if nothing
//! happened, alone and in a batch.

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{AcquireResult, PoolStore};
use inventory_test_support::RedisServer;

use crate::store_contract::{LONG_TTL_MS, acquire_args, counters, pool, reserve_with};

async fn flush_scripts(redis: &RedisServer) {
    let mut conn = redis::Client::open(redis.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_acquires_load_the_scripts_again_after_a_script_flush() {
    // A server of its own: SCRIPT FLUSH would reach every other test's scripts.
    let redis = RedisServer::start().await;
    let store = RedisPoolStore::new(&redis.url, "scripts:").await.unwrap();
    let p = pool("sku-scripts");
    assert!(store.refill(&p, "grant-1", 100, 0).await.unwrap());

    flush_scripts(&redis).await;
    let first = acquire_args("u0", 1, "k0", 5, LONG_TTL_MS);
    let (id, _) = reserve_with(&store, &p, &first).await;
    assert_eq!(counters(&store, &p).await, (99, 1, 0));

    // Twenty at once: the first goes alone, the others wait and go as acquire_batch.lua
    // calls, which find no script either.
    flush_scripts(&redis).await;
    let before = store.batch_stats();
    let args: Vec<_> = (1..=20).map(|i| acquire_args(&format!("u{i}"), 1, &format!("k{i}"), 5, LONG_TTL_MS)).collect();
    let answers = futures::future::join_all(args.iter().map(|a| reserve_with(&store, &p, a))).await;
    assert_eq!(answers.len(), 20, "every one reserved (reserve_with checks each answer)");
    assert!(store.batch_stats().calls > before.calls, "some of them went in a batch");
    assert_eq!(counters(&store, &p).await, (79, 21, 0));
    // A replay after the flush answers its reservation.
    match store.acquire(&p, &acquire_args("u0", 1, "k0", 5, LONG_TTL_MS)).await.unwrap() {
        AcquireResult::Reserved { reservation_id, replayed: true, .. } => assert_eq!(reservation_id, id),
        other => panic!("expected the replay of k0, got {other:?}"),
    }
}
