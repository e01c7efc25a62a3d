//! The generation rule: after Redis lost the pool (FLUSHALL) and an operator resolved the
//! units in doubt, a replay of a key that reserved carries the first answer's generation
//! and is refused; nothing is reserved a second time.

use std::time::Duration;

use inventory_client::{Acquired, AgentClient, Error, Options};
use inventory_proto::v1 as pb;
use inventory_test_support::{RedisServer, wait_until};

use crate::harness::{Center, LocalAgent, Store, agent_config, stock};

fn acquire(key: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        item_id: "skin".into(),
        user_id: format!("user-{key}"),
        quantity: 1,
        idempotency_key: key.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_flushall_and_resolve_is_refused_and_reserves_nothing() {
    let center = Center::start().await;
    center.create_item("skin", 20, 1, (2, 8, 4)).await;
    let redis = RedisServer::start().await;
    let store = Store::Redis { url: redis.url.clone(), prefix: "gen:".into() };
    let agent = LocalAgent::start(agent_config(&center.url, "app", &store)).await;
    let client =
        AgentClient::connect([agent.url()], Options::default().deadline(Duration::from_secs(5))).await.expect("client");

    let first = client.acquire("skin", "ann", 1, "order-1").await.expect("acquire");
    let Acquired::Reserved { generation, id, .. } = first else { panic!("not reserved: {first:?}") };
    let replay = client.acquire("skin", "ann", 1, "order-1").await.expect("replay in the same pool");
    assert!(matches!(replay, Acquired::Reserved { replayed: true, id: ref again, .. } if *again == id), "{replay:?}");
    center.await_quiescence().await;

    // Redis loses everything; the agent freezes the item and the center shows the units
    // in doubt.
    let conn = redis::Client::open(redis.url.as_str()).expect("redis url");
    let mut conn = conn.get_multiplexed_async_connection().await.expect("connect redis");
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.expect("FLUSHALL");
    let mut raw = agent.raw().await;
    let frozen =
        wait_until(Duration::from_secs(15), || {
            let mut raw = raw.clone();
            async move {
                matches!(raw.acquire(acquire("probe-frozen")).await, Err(s) if s.code() == tonic::Code::Unavailable)
            }
        })
        .await;
    assert!(frozen, "the agent kept selling from a lost pool");
    let in_doubt =
        wait_until(Duration::from_secs(15), || async { !center.reconcile().await.in_doubt.is_empty() }).await;
    assert!(in_doubt, "the center never showed the units in doubt");

    // The operator resolves (the one reservation counts as sold); the agent sells again.
    center
        .admin()
        .await
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "skin".into(), channel: "app".into(), sold: 1 })
        .await
        .expect("resolve");
    let resumed = wait_until(Duration::from_secs(15), || {
        let mut raw = raw.clone();
        async move {
            matches!(raw.acquire(acquire("probe-resumed")).await,
                Ok(r) if r.get_ref().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(resumed, "the agent never sold again after the resolution");

    // The replay carries the old generation: refused, final, nothing reserved.
    let before = stock(&mut raw, "skin").await;
    assert_ne!(before.pool_generation, generation, "the pool was created anew");
    let refused = client.acquire("skin", "ann", 1, "order-1").await.expect_err("a replay into a new pool");
    assert!(matches!(refused, Error::PoolGenerationChanged { expected, .. } if expected == generation), "{refused:?}");
    assert!(!refused.is_retry_safe());
    let after = stock(&mut raw, "skin").await;
    assert_eq!((after.reserved, after.sold, after.available), (before.reserved, before.sold, before.available));
}
