//! Durable writes on a Redis Cluster (`--redis-replica-acks`): the script call and its
//! `WAIT` go together to the master of the pool's slot, and only that connection's answer
//! counts. A private cluster of three masters with two replicas each; the pool's replicas
//! are frozen (SIGSTOP) so nothing can acknowledge its writes, while the other masters'
//! replicas could acknowledge anything sent to their masters.

use std::sync::Arc;
use std::time::Duration;

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{PoolStore, StoreError};
use inventory_test_support::cluster::RedisCluster;
use inventory_test_support::wait_until;

use super::store_contract::{WAIT, counters, pool};

/// A write is acknowledged by its own master's replicas or not at all: with them frozen
/// it answers UNAVAILABLE, also when its master is killed while its `WAIT` waits (a
/// `WAIT` sent anywhere else would be answered at once by another master's replicas).
/// Retried with the same ids after the failover, each write counts exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_write_is_acknowledged_by_its_own_masters_replicas_or_not_at_all() {
    let mut cluster = RedisCluster::start(3, 2).await;
    let p = pool("sku-wait");
    let slot_key = "{app:sku-wait}";
    let master = cluster.master_of(slot_key).await;
    let replicas = cluster.replicas_of(master).await;
    assert_eq!(replicas.len(), 2, "the pool's master has two replicas: {:?}", cluster.nodes_info().await);
    // The pool's master last among the seeds: the first write meets another node first,
    // which redirects it (MOVED).
    let mut seeds = cluster.seeds();
    seeds.sort_by_key(|s| s.ends_with(&format!(":{master}")));
    let store = Arc::new(
        RedisPoolStore::new_cluster(&seeds, "cd:").await.unwrap().with_replica_acks(1, Duration::from_secs(3)),
    );
    let plain = RedisPoolStore::new_cluster(&cluster.seeds(), "cd:").await.unwrap();

    assert!(store.refill(&p, "grant-1", 20, 0).await.unwrap(), "a redirected durable write");
    assert_eq!(counters(&plain, &p).await, (20, 0, 0));

    for r in &replicas {
        cluster.freeze(*r);
    }
    match store.refill(&p, "grant-2", 5, 0).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("acknowledged by 0 of 1"), "{m}"),
        other => panic!("a write its master's frozen replicas cannot acknowledge: {other:?}"),
    }

    // The master killed while the next write's WAIT waits on it.
    let write = tokio::spawn({
        let (store, p) = (Arc::clone(&store), p.clone());
        async move { store.refill(&p, "grant-3", 7, 0).await }
    });
    let waiting = wait_until(WAIT, || async {
        cluster.command(master, &["CLIENT", "LIST"]).await.is_some_and(|clients| clients.contains("cmd=wait"))
    })
    .await;
    assert!(waiting, "the write's WAIT never blocked on the pool's master");
    cluster.kill(master);
    match write.await.unwrap() {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("a write whose master died before a replica acknowledged it was answered: {other:?}"),
    }

    for r in &replicas {
        cluster.thaw(*r);
    }
    let promoted = cluster.await_failover(slot_key, master, 3).await;
    assert!(replicas.contains(&promoted), "one of the pool's replicas took over");
    // The retries the API asks for, same ids: whether or not the promoted replica got a
    // write before its master died, each counts once, and a replica of the new master
    // acknowledges it.
    for (grant, units) in [("grant-2", 5), ("grant-3", 7)] {
        let done = wait_until(Duration::from_secs(30), || {
            let (store, p) = (Arc::clone(&store), p.clone());
            async move { store.refill(&p, grant, units, 0).await.is_ok() }
        })
        .await;
        assert!(done, "{grant} never acknowledged after the failover");
    }
    let settled = wait_until(WAIT, || async {
        plain.snapshot(&p).await.is_ok_and(|s| (s.available, s.reserved, s.sold) == (32, 0, 0))
    })
    .await;
    assert!(settled, "every grant counts once: {:?}", plain.snapshot(&p).await);
}
