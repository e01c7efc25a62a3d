//! The Redis store's writes that wait for replicas (`with_replica_acks`, the agent's
//! `--redis-replica-acks`) on one server: the script call and its `WAIT` are pipelined on a
//! connection of their own, so a write waiting for replicas holds up no other caller.
//! Private `redis-server`s: a master and, where a replica is needed, its replica.

use std::sync::Arc;
use std::time::Duration;

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{AcquireResult, PoolStore, StoreError};
use inventory_test_support::{RedisServer, TestRedis, wait_until};

use super::store_contract::{LONG_TTL_MS, WAIT, acquire_args, counters, pool};

/// Asked to wait for a replica that does not exist, a write answers UNAVAILABLE; the
/// write did happen on the server, so the retry the API asks for (same ids) counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_no_replica_acknowledged_is_unavailable_and_its_retry_counts_once() {
    let redis = TestRedis::create().await;
    let waiting =
        RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap().with_replica_acks(1, Duration::from_millis(50));
    let p = pool("sku-acks");
    match waiting.refill(&p, "grant-1", 10, 0).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("acknowledged by 0 of 1 replicas"), "{m}"),
        other => panic!("refill without a replica: {other:?}"),
    }
    let plain = RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap();
    assert!(!plain.refill(&p, "grant-1", 10, 0).await.unwrap(), "the retry is a replay");
    assert_eq!(counters(&plain, &p).await, (10, 0, 0));
    // Reads do not wait.
    assert_eq!(counters(&waiting, &p).await, (10, 0, 0));
}

/// With one shared connection in the store and no replica attached, a durable write waits
/// out its whole `WAIT` (5 s). Meanwhile its write is on the server, the store answers
/// reads, and a second durable write reaches Redis: none of them queue behind the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waiting_for_replicas_holds_up_no_other_caller() {
    let redis = TestRedis::create().await;
    let plain = RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap();
    let (a, b) = (pool("sku-wait-a"), pool("sku-wait-b"));
    assert!(plain.refill(&b, "grant-b", 5, 0).await.unwrap());
    let waiting = Arc::new(
        RedisPoolStore::with_connections(&redis.url, &redis.prefix, 1)
            .await
            .unwrap()
            .with_replica_acks(1, Duration::from_secs(5)),
    );
    let first = tokio::spawn({
        let (waiting, a) = (Arc::clone(&waiting), a.clone());
        async move { waiting.refill(&a, "grant-a", 10, 0).await }
    });
    let written = wait_until(WAIT, || async { counters(&plain, &a).await == (10, 0, 0) }).await;
    assert!(written, "the first write never reached Redis");
    // A read on the store's only shared connection, and a second durable write.
    assert_eq!(counters(&*waiting, &b).await, (5, 0, 0));
    let second = tokio::spawn({
        let (waiting, b) = (Arc::clone(&waiting), b.clone());
        async move { waiting.refill(&b, "grant-b2", 3, 0).await }
    });
    let written = wait_until(WAIT, || async { counters(&plain, &b).await == (8, 0, 0) }).await;
    assert!(written, "the second write never reached Redis");
    assert!(!first.is_finished(), "the read and the second write waited for the first write's WAIT to end");
    for answer in [first.await.unwrap(), second.await.unwrap()] {
        match answer {
            Err(StoreError::Unavailable(m)) => assert!(m.contains("acknowledged by 0 of 1 replicas"), "{m}"),
            other => panic!("a write no replica acknowledged: {other:?}"),
        }
    }
}

/// With a replica attached, durable writes answer once it has them: a refill, an acquire
/// and a confirm (whose scripts the fresh master loads on the first NOSCRIPT) all answer,
/// and the replica holds what they wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_writes_answer_once_a_replica_has_them() {
    let master = RedisServer::start().await;
    let replica = RedisServer::start().await;
    let client = ::redis::Client::open(replica.url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master.port).query_async(&mut conn).await.unwrap();
    let attached = wait_until(WAIT, || {
        let mut conn = conn.clone();
        async move {
            let info: String = ::redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap();
            info.contains("master_link_status:up")
        }
    })
    .await;
    assert!(attached, "the replica never attached to its master");

    let store = RedisPoolStore::new(&master.url, "inv:").await.unwrap().with_replica_acks(1, Duration::from_secs(5));
    let p = pool("sku-durable");
    assert!(store.refill(&p, "grant-1", 10, 0).await.unwrap());
    let args = acquire_args("ann", 2, "key-durable", 10, LONG_TTL_MS);
    let id = match store.acquire(&p, &args).await.unwrap() {
        AcquireResult::Reserved { reservation_id, replayed: false, .. } => reservation_id,
        other => panic!("a durable acquire: {other:?}"),
    };
    store.confirm(&p, &id).await.unwrap();
    // Read from the replica: WAIT answered only once it had every write.
    let on_replica = RedisPoolStore::new(&replica.url, "inv:").await.unwrap();
    assert_eq!(counters(&on_replica, &p).await, (8, 0, 2));
}
