//! The Redis pool's record encoding: a pool written with JSON records (the layout before
//! `lua/codec.lua`) answers as before, and the sweeper rewrites its records compact
//! without changing any answer.

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{AcquireArgs, AcquireResult, PoolKey, PoolStore, Reservation, ReservationRef, Transition};
use inventory_test_support::TestRedis;

use super::store_contract::{LONG_TTL_MS, acquire_args, pool, reserve_with};

/// Every reservation of `p`, by id and by key, as the store answers.
async fn lookups(store: &RedisPoolStore, p: &PoolKey, made: &[AcquireArgs]) -> Vec<(String, Reservation)> {
    let mut out = Vec::new();
    for args in made {
        let by_id = store.reservation(p, &ReservationRef::Id(args.new_reservation_id.clone())).await.unwrap();
        let by_key = store.reservation(p, &ReservationRef::IdempotencyKey(args.idempotency_key.clone())).await.unwrap();
        assert_eq!(by_id, by_key);
        out.push(by_id.expect("known reservation"));
    }
    out
}

/// The record as the JSON layout stored it: `{s, q, e, u, k}`, `r` when fewer were
/// reserved than asked.
fn json_record(r: &Reservation) -> String {
    let mut rec = serde_json::json!({
        "s": r.state.as_str(),
        "q": r.quantity,
        "e": r.expires_at_ms,
        "u": r.user_id,
        "k": r.idempotency_key,
    });
    if r.requested != 0 {
        rec["r"] = serde_json::json!(r.requested);
    }
    rec.to_string()
}

async fn records(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query_async(conn).await.unwrap();
    // The structure's marker (lua/intact.lua) is not a record.
    all.retain(|(field, _)| !field.starts_with(' '));
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_pool_with_json_records_answers_as_before_and_the_sweeper_makes_them_compact() {
    let redis = TestRedis::create().await;
    let store = RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap();
    let p = pool("sku-layout");
    store.refill(&p, "grant-1", 10, 0).await.unwrap();
    let mut partial = acquire_args(r#"pipe|user"quote"#, 5, "key-partial", 100, LONG_TTL_MS);
    partial.allow_partial = true;
    partial.per_user_limit = 2;
    let made = vec![
        acquire_args("ann", 1, "key-ann", 100, LONG_TTL_MS),
        acquire_args("bob", 3, "key-bob", 100, LONG_TTL_MS),
        acquire_args("cy", 1, "key|with|pipes", 100, LONG_TTL_MS),
        partial,
    ];
    for args in &made[..3] {
        reserve_with(&store, &p, args).await;
    }
    assert!(matches!(store.acquire(&p, &made[3]).await.unwrap(), AcquireResult::Reserved { quantity: 2, .. }));
    assert!(matches!(store.confirm(&p, &made[1].new_reservation_id).await.unwrap(), Transition::Done(_)));
    let before = lookups(&store, &p, &made).await;
    let snapshot = store.snapshot(&p).await.unwrap();

    // The pool as the JSON layout wrote it: every record JSON, the pool hash without the
    // conversion's marks.
    let client = redis::Client::open(redis.url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let base = format!("{}{}", redis.prefix, p.hash_tag());
    let res = format!("{base}:res");
    for (id, r) in &before {
        let _: () = redis::cmd("HSET").arg(&res).arg(id).arg(json_record(r)).query_async(&mut conn).await.unwrap();
    }
    let _: () = redis::cmd("HDEL")
        .arg(format!("{base}:pool"))
        .arg("records")
        .arg("records_cursor")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(records(&mut conn, &res).await.iter().all(|(_, v)| v.starts_with('{')));

    // Read as before, and a replay still finds its reservation.
    assert_eq!(lookups(&store, &p, &made).await, before);
    match store.acquire(&p, &made[0]).await.unwrap() {
        AcquireResult::Reserved { reservation_id, replayed: true, .. } => {
            assert_eq!(reservation_id, made[0].new_reservation_id);
        }
        other => panic!("expected a replay, got {other:?}"),
    }

    // The sweeper converts them (nothing is due: it expires nothing).
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0);
    let pool_hash: Option<String> =
        redis::cmd("HGET").arg(format!("{base}:pool")).arg("records").query_async(&mut conn).await.unwrap();
    assert_eq!(pool_hash.as_deref(), Some("compact"));
    let converted = records(&mut conn, &res).await;
    assert_eq!(converted.len(), made.len());
    for (id, value) in &converted {
        // A key holding '|' stays JSON; every other record is compact.
        let pipes = id == &made[2].new_reservation_id;
        assert_eq!(value.starts_with('{'), pipes, "{id}: {value}");
    }
    assert_eq!(lookups(&store, &p, &made).await, before);
    assert_eq!(store.snapshot(&p).await.unwrap().available, snapshot.available);

    // And they change state as before.
    assert!(matches!(store.cancel(&p, &made[0].new_reservation_id).await.unwrap(), Transition::Done(_)));
    assert!(matches!(store.confirm(&p, &made[3].new_reservation_id).await.unwrap(), Transition::Done(_)));
    let after = store.snapshot(&p).await.unwrap();
    assert_eq!((after.available, after.reserved, after.sold), (snapshot.available + 1, 1, 5));
}
