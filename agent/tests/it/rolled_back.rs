//! A Redis that went back in time: restarted from a snapshot older than its last writes,
//! the pool keeps its generation and every structure, with older contents. Its write
//! sequence is below what the agent saw acknowledged, so it is a lost pool: frozen, its
//! units in doubt at the center, nothing resold, replays of the old generation refused,
//! reopened with a new generation once an operator settled it, then sold to the end.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::{RedisServer, wait_until};
use tonic::Code;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, buy_one, stock};

async fn redis_cmd<T: redis::FromRedisValue>(redis: &RedisServer, cmd: &mut redis::Cmd) -> T {
    let mut conn = redis::Client::open(redis.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    cmd.query_async(&mut conn).await.unwrap()
}

/// The pool hash's counters, read straight from Redis.
async fn raw_counters(redis: &RedisServer) -> Vec<Option<String>> {
    redis_cmd(redis, redis::cmd("HMGET").arg("inv:{app:rb}:pool").arg("available").arg("reserved").arg("sold")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_from_an_older_snapshot_is_a_lost_pool_never_resold() {
    const TOTAL: u64 = 100;
    let center = Center::start_sqlite().await;
    center.create_item("rb", TOTAL, 1, (10, 40, 20)).await;
    let mut redis = RedisServer::start().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let agent = LocalAgent::start(&center.url, "app", &spec).await;
    let mut client = agent.client().await;
    let mut confirmed: u64 = 0;
    let shared = client.clone();
    let acquire = move |user: String| {
        let mut client = shared.clone();
        async move {
            let r = client.acquire(acquire_req("rb", &user, 1, &format!("k-{user}"))).await.unwrap().into_inner();
            assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "{user}");
            r
        }
    };
    let shared = client.clone();
    let confirm = move |id: String| {
        let mut client = shared.clone();
        async move {
            let c = pb::ConfirmRequest { item_id: "rb".into(), reservation_id: id };
            assert_eq!(client.confirm(c).await.unwrap().into_inner().state(), pb::ReservationState::Confirmed);
        }
    };
    for i in 0..5 {
        let r = acquire(format!("u{i}")).await;
        if i < 2 {
            confirm(r.reservation_id).await;
            confirmed += 1;
        }
    }
    center.await_quiescence().await;
    let held_at_snapshot = center.ledger("rb").await.channels[0].held;

    // The snapshot; then a refill and reservations, all acknowledged, that it lacks.
    let saved: String = redis_cmd(&redis, &mut redis::cmd("SAVE")).await;
    assert_eq!(saved, "OK");
    let mut later = Vec::new();
    for i in 5..35 {
        let r = acquire(format!("u{i}")).await;
        if i < 15 {
            confirm(r.reservation_id.clone()).await;
            confirmed += 1;
        }
        later.push(r);
    }
    center.await_quiescence().await;
    let held = center.ledger("rb").await.channels[0].held;
    assert!(held > held_at_snapshot, "a refill after the snapshot: held {held_at_snapshot} then {held}");
    let generation = later[0].pool_generation;
    assert!(generation != 0 && later.iter().all(|r| r.pool_generation == generation));

    // kill -9, restarted on the same directory: the pool as the snapshot had it, with the
    // same generation.
    redis.restart().await;
    let restored = raw_counters(&redis).await;

    // A replay of a reservation the snapshot lacks, naming the generation its answer
    // carried, never reserves anew.
    let last = later.last().unwrap();
    let mut replay = acquire_req("rb", "u34", 1, "k-u34");
    replay.expect_pool_generation = generation;
    match client.acquire(replay.clone()).await {
        Ok(r) => panic!("a replay into the rolled-back pool answered {:?} (first {:?})", r.into_inner(), last),
        Err(s) => assert!(matches!(s.code(), Code::Unavailable | Code::FailedPrecondition), "{s:?}"),
    }
    // The item freezes.
    let frozen = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req("rb", "late", 1, "k-late")).await, Err(s) if s.code() == Code::Unavailable)
        }
    })
    .await;
    assert!(frozen, "the agent kept selling from a pool that went back in time");
    // The center holds everything the channel holds in doubt; reconcile names it.
    let in_doubt = wait_until(Duration::from_secs(10), || async {
        let view = center.ledger("rb").await;
        view.channels[0].in_doubt == held
    })
    .await;
    assert!(in_doubt, "the center never held the channel's units in doubt: {:?}", center.ledger("rb").await);
    let rec = center.reconcile().await;
    assert!(rec.in_doubt.iter().any(|v| v.detail.contains(&format!("{held} units in doubt"))), "{rec:?}");
    let s = stock(&mut client, "rb").await;
    assert_eq!((s.pool_generation, s.available, s.reserved, s.sold), (0, 0, 0, 0), "read as lost: {s:?}");
    let refused = client.acquire(replay.clone()).await.expect_err("frozen");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(raw_counters(&redis).await, restored, "nothing of the rolled-back pool was sold or moved");
    assert!(!center.reconcile().await.in_doubt.is_empty(), "reconcile names it until it is resolved");

    // The operator settles from the orders; the pool opens again as a new generation.
    let resolved = center
        .admin()
        .await
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "rb".into(), channel: "app".into(), sold: confirmed })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.written_off, confirmed);
    let selling = wait_until(Duration::from_secs(20), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req("rb", "probe", 1, "k-probe")).await,
                Ok(r) if r.get_ref().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(selling, "the item never sold again after the resolution");
    let s = stock(&mut client, "rb").await;
    assert!(s.pool_generation != 0 && s.pool_generation != generation, "a new generation: {s:?}");
    let refused = client.acquire(replay).await.expect_err("a replay naming the old generation");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");

    // Sold to the end: every unit not written off, once.
    let probe = client.acquire(acquire_req("rb", "probe", 1, "k-probe")).await.unwrap().into_inner();
    confirm(probe.reservation_id).await;
    let mut sold_again = 1;
    let mut n = 0;
    loop {
        n += 1;
        assert!(n < 400, "the sale never ended: {} sold again", sold_again);
        if buy_one(&mut client, "rb", &format!("v{n}"), 50).await.is_some() {
            sold_again += 1;
            continue;
        }
        let view = center.ledger("rb").await;
        if view.item.as_ref().unwrap().available == 0 && stock(&mut client, "rb").await.available == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sold_again, TOTAL - confirmed, "sold to the end, nothing twice");
    let rec = center.await_quiescence().await;
    assert!(rec.in_doubt.is_empty(), "{rec:?}");
}
