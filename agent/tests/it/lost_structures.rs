//! A Redis pool that lost one of its structures (evicted, deleted by hand) while its hash
//! survived is a lost pool, never one quietly re-created empty: every script answers as
//! for a pool that is gone and writes nothing; replays of keys that reserved do not
//! reserve anew; the agent freezes the item and the center puts its units in doubt.

use std::collections::BTreeMap;
use std::time::Duration;

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{AcquireResult, PoolKey, PoolStore, ReservationRef, StoreError};
use inventory_proto::v1 as pb;
use inventory_test_support::{TestRedis, wait_until};
use tonic::Code;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, http_get, sample, stock};
use crate::store_contract::{LONG_TTL_MS, acquire_args, counters, pool, reserve_with, snap};

/// The pool's structures as the store names them (`<prefix>{app:item}:<name>`).
const STRUCTURES: [&str; 8] = ["res", "due", "held", "idem", "gc", "grants", "takes", "outbox"];

async fn conn(redis: &TestRedis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// Every key of the pool with its contents, to see that nothing was written.
async fn dump(redis: &TestRedis, p: &PoolKey) -> BTreeMap<String, Vec<u8>> {
    let mut conn = conn(redis).await;
    let pattern = format!("{}{}:*", redis.prefix, p.hash_tag());
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(&mut conn).await.unwrap();
    let mut out = BTreeMap::new();
    for key in keys {
        let value: Vec<u8> = redis::cmd("DUMP").arg(&key).query_async(&mut conn).await.unwrap();
        out.insert(key, value);
    }
    out
}

async fn delete(redis: &TestRedis, p: &PoolKey, name: &str) {
    let key = format!("{}{}:{name}", redis.prefix, p.hash_tag());
    let deleted: u64 = redis::cmd("DEL").arg(&key).query_async(&mut conn(redis).await).await.unwrap();
    assert_eq!(deleted, 1, "{key} existed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_pool_missing_any_structure_is_lost_and_nothing_is_written() {
    let redis = TestRedis::create().await;
    let store = RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap();
    for name in STRUCTURES {
        let p = pool(&format!("sku-{name}"));
        assert!(store.refill(&p, "grant-1", 10, 0).await.unwrap());
        let mut ids = Vec::new();
        for i in 0..3 {
            let args = acquire_args(&format!("u{i}"), 1, &format!("k{i}"), 5, LONG_TTL_MS);
            ids.push(reserve_with(&store, &p, &args).await.0);
        }
        store.confirm(&p, &ids[0]).await.unwrap();
        assert_eq!(store.take_for_return(&p, "take-1", 2, 0).await.unwrap(), 2);
        let generation = snap(&store, &p).await.generation;
        assert_ne!(generation, 0);

        delete(&redis, &p, name).await;
        let before = dump(&redis, &p).await;

        // Read as a pool that is gone: generation 0, nothing held.
        let s = snap(&store, &p).await;
        assert_eq!((s.generation, s.available, s.reserved, s.sold), (0, 0, 0, 0), "{name}");
        // A replay of a key that reserved does not reserve anew; nor does a new key.
        let replay = acquire_args("u1", 1, "k1", 5, LONG_TTL_MS);
        assert_eq!(store.acquire(&p, &replay).await.unwrap(), AcquireResult::SoldOut { available: 0 }, "{name}");
        let fresh = acquire_args("u9", 1, "k9", 5, LONG_TTL_MS);
        assert_eq!(store.acquire(&p, &fresh).await.unwrap(), AcquireResult::SoldOut { available: 0 }, "{name}");
        let expecting = inventory_agent::store::AcquireArgs { expect_generation: Some(generation), ..replay };
        match store.acquire(&p, &expecting).await {
            Err(StoreError::GenerationChanged { actual: 0, .. }) => {}
            other => panic!("{name}: a replay expecting generation {generation}: {other:?}"),
        }
        // Every change answers "pool lost".
        let lost = |what: &str, r: Result<(), StoreError>| match r {
            Err(StoreError::PoolMissing(_)) => {}
            other => panic!("{name}: {what} on a partly lost pool: {other:?}"),
        };
        lost("confirm", store.confirm(&p, &ids[1]).await.map(drop));
        lost("cancel", store.cancel(&p, &ids[2]).await.map(drop));
        lost("refund", store.refund(&p, &ids[0]).await.map(drop));
        lost("extend", store.extend(&p, &ids[1], 1_000, LONG_TTL_MS).await.map(drop));
        lost("take_for_return", store.take_for_return(&p, "take-2", 1, 0).await.map(drop));
        lost("refill_existing", store.refill_existing(&p, "grant-2", 5, 0).await.map(drop));
        lost("reservation", store.reservation(&p, &ReservationRef::Id(ids[1].clone())).await.map(drop));
        lost("reservation_state", store.reservation_state(&p, &ids[1]).await.map(drop));
        assert_eq!(store.untake(&p, "take-1", 0).await.unwrap(), 0, "{name}: nothing put back");
        assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0, "{name}");
        assert_eq!(dump(&redis, &p).await, before, "{name}: nothing of the pool was written");

        // Opened again (after an operator settled its units): a new, empty generation
        // with every structure, whose keys are new.
        assert!(store.refill(&p, "open-1", 0, 0).await.unwrap());
        let anew = snap(&store, &p).await;
        assert!(anew.generation != 0 && anew.generation != generation, "{name}");
        assert_eq!(counters(&store, &p).await, (0, 0, 0), "{name}: nothing of the lost generation");
        assert!(store.refill(&p, "grant-3", 1, 0).await.unwrap());
        let again = acquire_args("u1", 1, "k1", 5, LONG_TTL_MS);
        assert!(matches!(
            store.acquire(&p, &again).await.unwrap(),
            AcquireResult::Reserved { replayed: false, generation: g, .. } if g == anew.generation
        ));
        let events = store.events(&p, 0, 10).await.unwrap();
        assert_eq!(events.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [1], "{name}: numbered anew");
    }

    // The pool hash gone, its records left: a confirm or cancel writes nothing (it used to
    // write, then fail on the outbox) and answers "pool lost".
    let p = pool("sku-hash");
    assert!(store.refill(&p, "grant-1", 10, 0).await.unwrap());
    let id = reserve_with(&store, &p, &acquire_args("u1", 1, "k1", 5, LONG_TTL_MS)).await.0;
    delete(&redis, &p, "pool").await;
    let before = dump(&redis, &p).await;
    assert!(matches!(store.confirm(&p, &id).await, Err(StoreError::PoolMissing(_))));
    assert!(matches!(store.cancel(&p, &id).await, Err(StoreError::PoolMissing(_))));
    assert!(matches!(store.extend(&p, &id, 1_000, LONG_TTL_MS).await, Err(StoreError::PoolMissing(_))));
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0);
    assert_eq!(dump(&redis, &p).await, before, "nothing written");
    assert_eq!(snap(&store, &p).await.generation, 0);
}

/// The pool hash's counters, read straight from Redis.
async fn raw_counters(redis: &TestRedis, p: &PoolKey) -> Vec<Option<String>> {
    let key = format!("{}{}:pool", redis.prefix, p.hash_tag());
    redis::cmd("HMGET")
        .arg(&key)
        .arg("available")
        .arg("reserved")
        .arg("sold")
        .query_async(&mut conn(redis).await)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_agent_whose_pool_lost_its_idempotency_index_freezes_and_the_center_holds_its_units_in_doubt() {
    let center = Center::start_sqlite().await;
    center.create_item("lost", 100, 1, (10, 40, 20)).await;
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let agent = LocalAgent::start(&center.url, "app", &spec).await;
    let mut client = agent.client().await;
    let mut reserved = Vec::new();
    for i in 0..5 {
        let r = client.acquire(acquire_req("lost", &format!("u{i}"), 1, &format!("k{i}"))).await.unwrap();
        let r = r.into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
        reserved.push(r);
    }
    for r in &reserved[..2] {
        let c = pb::ConfirmRequest { item_id: "lost".into(), reservation_id: r.reservation_id.clone() };
        assert_eq!(client.confirm(c).await.unwrap().into_inner().state(), pb::ReservationState::Confirmed);
    }
    center.await_quiescence().await;
    let held = center.ledger("lost").await.channels[0].held;
    let generation = reserved[0].pool_generation;
    let p = PoolKey::new("app", "lost");
    let counters_before = raw_counters(&redis, &p).await;

    // The idempotency index goes, the pool hash stays (as an evicting Redis did).
    delete(&redis, &p, "idem").await;

    // No replay reserves anew, whether the agent has noticed yet or not.
    for (i, first) in reserved.iter().enumerate() {
        match client.acquire(acquire_req("lost", &format!("u{i}"), 1, &format!("k{i}"))).await {
            Ok(r) => {
                let r = r.into_inner();
                assert!(
                    r.outcome() != pb::AcquireOutcome::Reserved || r.reservation_id == first.reservation_id,
                    "k{i} reserved anew: {r:?}"
                );
            }
            Err(s) => assert_eq!(s.code(), Code::Unavailable, "k{i}: {s:?}"),
        }
    }
    // The item freezes: every Acquire, replay or new, is UNAVAILABLE.
    let frozen = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req("lost", "late", 1, "k-late")).await, Err(s) if s.code() == Code::Unavailable)
        }
    })
    .await;
    assert!(frozen, "the agent kept selling from a partly lost pool");
    let replay = client.acquire(acquire_req("lost", "u2", 1, "k2")).await.expect_err("frozen");
    assert_eq!(replay.code(), Code::Unavailable);
    // A confirm of a reservation whose pool is lost: UNAVAILABLE (never NOT_FOUND, never
    // INTERNAL), and nothing written.
    let c = pb::ConfirmRequest { item_id: "lost".into(), reservation_id: reserved[2].reservation_id.clone() };
    let refused = client.confirm(c).await.expect_err("pool lost");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    // Read as lost: GetStock, the agent's metrics, the center's units in doubt.
    let s = stock(&mut client, "lost").await;
    assert_eq!((s.pool_generation, s.available, s.reserved, s.sold), (0, 0, 0, 0), "{s:?}");
    let metrics = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&metrics, "inventory_agent_pool_frozen{channel=\"app\",item=\"lost\"}"), Some(1.0), "{metrics}");
    let in_doubt = wait_until(Duration::from_secs(10), || async {
        let view = center.ledger("lost").await;
        view.channels[0].in_doubt == held
    })
    .await;
    assert!(in_doubt, "the center never held the channel's units in doubt: {:?}", center.ledger("lost").await);
    let rec = center.reconcile().await;
    assert!(rec.in_doubt.iter().any(|v| v.detail.contains(&format!("{held} units in doubt"))), "{rec:?}");
    assert_eq!(raw_counters(&redis, &p).await, counters_before, "nothing of the lost pool was sold or moved");

    // The operator settles from the orders: 2 sold. The pool opens again as a new
    // generation; a replay that names the old one is refused, not reserved anew.
    center
        .admin()
        .await
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "lost".into(), channel: "app".into(), sold: 2 })
        .await
        .unwrap();
    let selling = wait_until(Duration::from_secs(20), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req("lost", "new", 1, "k-new")).await,
                Ok(r) if r.get_ref().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(selling, "the item never sold again after the resolution");
    let s = stock(&mut client, "lost").await;
    assert!(s.pool_generation != 0 && s.pool_generation != generation, "{s:?}");
    let mut replay = acquire_req("lost", "u3", 1, "k3");
    replay.expect_pool_generation = generation;
    let refused = client.acquire(replay).await.expect_err("the old generation's key");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    center.await_quiescence().await;
}
