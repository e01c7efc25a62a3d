//! A pool store at its memory limit (Redis `maxmemory` with `noeviction`) refuses writes.
//! The agent must not drain the center meanwhile: units it borrows but cannot shelve go
//! back, and it borrows nothing while the store refuses. Once memory is freed the sale
//! ends with every unit sold.

use std::time::{Duration, Instant};

use inventory_proto::v1 as pb;
use inventory_test_support::{RedisServer, wait_until};

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, agent_config, buy_one, config_set, stock};

const TOTAL: u64 = 200;
const BATCH: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_does_not_drain_the_center_and_the_sale_ends_once_memory_is_freed() {
    let redis = RedisServer::start().await;
    let center = Center::start_postgres().await;
    // Low watermark 0: the pool borrows only when a buyer finds it empty.
    center.create_item("full", TOTAL, 1, (0, 2 * BATCH, BATCH)).await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: "full:".into() };
    let agent = LocalAgent::start_with(agent_config(&center.url, "app", &spec), None).await;
    let mut client = agent.client().await;
    let mut sold = 0;
    while sold < BATCH {
        assert!(buy_one(&mut client, "full", &format!("early{sold}"), 100).await.is_some(), "stock before the limit");
        sold += 1;
    }
    let s = stock(&mut client, "full").await;
    assert_eq!((s.available, s.sold), (0, BATCH), "the first batch is sold: {s:?}");

    // Redis reaches its memory limit: every write is refused from now on.
    config_set(&redis, "maxmemory-policy", "noeviction").await;
    config_set(&redis, "maxmemory", "1").await;
    let until = Instant::now() + Duration::from_secs(4);
    let mut refused = 0;
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let r = client.acquire(acquire_req("full", &format!("full{n}"), 1, &format!("kf{n}"))).await;
        match r {
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                assert!(s.message().contains("memory"), "the answer names the memory limit: {s:?}");
                refused += 1;
            }
            Ok(r) => assert_ne!(r.into_inner().outcome(), pb::AcquireOutcome::Reserved, "nothing can be reserved"),
        }
        // What the center counts with the channel, then what its pool holds: never more
        // than one batch apart (the one being given back).
        let held = center.ledger("full").await.channels.first().map_or(0, |c| c.held);
        let s = stock(&mut client, "full").await;
        let pool = s.available + s.reserved + s.sold;
        assert!(held <= pool + BATCH, "the channel holds {held} at the center while its pool holds {pool}");
    }
    assert!(refused > 0, "no buyer was told the store is full");

    // Memory is freed: the sale runs to the end, every unit sold once.
    config_set(&redis, "maxmemory", "0").await;
    let mut misses = 0;
    for k in 0..TOTAL * 2 {
        match buy_one(&mut client, "full", &format!("late{k}"), 200).await {
            Some(_) => sold += 1,
            None if sold == TOTAL => break,
            None => misses += 1,
        }
    }
    assert_eq!(sold, TOTAL, "every unit sold once memory was freed ({misses} sold-out answers on the way)");
    assert!(
        wait_until(Duration::from_secs(20), || async {
            let r = center.reconcile().await;
            r.ok && r.drifts.is_empty()
        })
        .await,
        "the ledger never settled: {:?}",
        center.reconcile().await
    );
    agent.stop().await;
}
