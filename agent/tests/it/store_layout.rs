//! The Redis pool's layout: a pool written with JSON records (the layout before
//! `lua/codec.lua`) answers as before, and the sweeper rewrites its records compact
//! without changing any answer; the due list of `lua/due.lua` expires reservations in
//! order and on time, and a pool whose `due` is the sorted set of the layout before it
//! answers as before and is converted by the sweeper; records addressed by their
//! idempotency key (`lua/ids.lua`), and a pool whose records are addressed by id with an
//! `idem` entry each (the layout before) answering as before until the sweeper has
//! forgotten them.

use std::sync::Arc;
use std::time::Duration;

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{
    AcquireArgs, AcquireResult, ExtendResult, PoolKey, PoolStore, Reservation, ReservationRef, ReservationState,
    Transition,
};
use inventory_test_support::TestRedis;

use super::store_contract::{LONG_TTL_MS, SHORT_TTL_MS, acquire_args, counters, pool, reserve_with, snap, wait_past};

/// Every reservation of `p`, by id and by key, as the store answers.
async fn lookups(store: &dyn PoolStore, p: &PoolKey, made: &[AcquireArgs]) -> Vec<(String, Reservation)> {
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

async fn state(store: &dyn PoolStore, p: &PoolKey, id: &str) -> Option<ReservationState> {
    store.reservation_state(p, id).await.unwrap()
}

/// The due list as stored: the marker of `lua/intact.lua` first, then the ids.
async fn due_list(conn: &mut redis::aio::MultiplexedConnection, base: &str) -> Vec<String> {
    redis::cmd("LRANGE").arg(format!("{base}:due")).arg(0).arg(-1).query_async(conn).await.unwrap()
}

/// The score of reservation `id` among the expiry exceptions in `gc` (the expiry negated).
async fn exception(conn: &mut redis::aio::MultiplexedConnection, base: &str, id: &str) -> Option<f64> {
    redis::cmd("ZSCORE").arg(format!("{base}:gc")).arg(format!("d:{id}")).query_async(conn).await.unwrap()
}

async fn key_type(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_the_due_list_expires_in_order_drops_finished_heads_and_keeps_its_marker() {
    let redis = TestRedis::create().await;
    let store: Arc<dyn PoolStore> = Arc::new(RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap());
    let p = pool("sku-due-list");
    store.refill(&p, "grant-1", 10, 0).await.unwrap();
    let mut conn = redis::Client::open(redis.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let base = format!("{}{}", redis.prefix, p.hash_tag());
    let marker = format!(" gen:{}", snap(&*store, &p).await.generation);

    // Long enough to confirm and extend before it runs out.
    let short = |user: &str| acquire_args(user, 1, &format!("k-{user}"), 100, 2_000);
    let confirmed = reserve_with(&*store, &p, &short("confirmed")).await;
    let extended = reserve_with(&*store, &p, &short("extended")).await;
    let due = reserve_with(&*store, &p, &short("due")).await;
    let long = reserve_with(&*store, &p, &acquire_args("long", 1, "k-long", 100, LONG_TTL_MS)).await;
    // Made after `long` with an earlier expiry: out of the list's order, an exception.
    let early = reserve_with(&*store, &p, &short("early")).await;
    assert_eq!(
        due_list(&mut conn, &base).await,
        [marker.as_str(), confirmed.0.as_str(), extended.0.as_str(), due.0.as_str(), long.0.as_str()]
    );
    assert_eq!(exception(&mut conn, &base, &early.0).await, Some(-(early.1 as f64)));

    assert!(matches!(store.confirm(&p, &confirmed.0).await.unwrap(), Transition::Done(_)));
    let ExtendResult::Extended { expires_at_ms } =
        store.extend(&p, &extended.0, LONG_TTL_MS, LONG_TTL_MS).await.unwrap()
    else {
        panic!("extend refused");
    };
    // An extended reservation is an exception too; it stays in the list until the sweeper.
    assert_eq!(exception(&mut conn, &base, &extended.0).await, Some(-(expires_at_ms as f64)));
    assert_eq!(due_list(&mut conn, &base).await.len(), 5);

    wait_past(&store, &p, due.1.max(early.1)).await;
    // The batch limit holds: the exception due first, one reservation.
    assert_eq!(store.expire_due(&p, 1).await.unwrap(), 1);
    assert_eq!(state(&*store, &p, &early.0).await, Some(ReservationState::Expired));
    assert_eq!(state(&*store, &p, &due.0).await, Some(ReservationState::Reserved));
    // Then the list from its head: the confirmed and the extended heads are dropped, the
    // due one expires, the long one is not due and stays, behind the marker.
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 1);
    assert_eq!(state(&*store, &p, &due.0).await, Some(ReservationState::Expired));
    assert_eq!(state(&*store, &p, &extended.0).await, Some(ReservationState::Reserved));
    assert_eq!(state(&*store, &p, &confirmed.0).await, Some(ReservationState::Confirmed));
    assert_eq!(due_list(&mut conn, &base).await, [marker.as_str(), long.0.as_str()]);
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0);
    assert_eq!(counters(&*store, &p).await, (7, 2, 1));
    assert_eq!(snap(&*store, &p).await.generation.to_string(), marker[5..], "the pool reads intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_pool_with_the_old_due_set_expires_confirms_and_cancels_as_before_and_is_converted() {
    let redis = TestRedis::create().await;
    let store: Arc<dyn PoolStore> = Arc::new(RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap());
    let p = pool("sku-old-due");
    store.refill(&p, "grant-1", 10, 0).await.unwrap();
    let mut conn = redis::Client::open(redis.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let base = format!("{}{}", redis.prefix, p.hash_tag());
    let due_key = format!("{base}:due");
    let generation = snap(&*store, &p).await.generation;
    let marker = format!(" gen:{generation}");

    let long = |user: &str| acquire_args(user, 1, &format!("k-{user}"), 100, LONG_TTL_MS);
    let confirmed = reserve_with(&*store, &p, &long("confirmed")).await;
    let cancelled = reserve_with(&*store, &p, &long("cancelled")).await;
    let later = reserve_with(&*store, &p, &long("later")).await;
    let short = reserve_with(&*store, &p, &acquire_args("short", 2, "k-short", 100, SHORT_TTL_MS)).await;

    // `due` as the layout before the due list wrote it: a sorted set of the reserved ids
    // scored by expiry, with its marker; no exceptions; the pool hash without `due`.
    let _: () = redis::cmd("DEL").arg(&due_key).query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("ZADD").arg(&due_key).arg("inf").arg(&marker).query_async(&mut conn).await.unwrap();
    for (id, expires_at) in [&confirmed, &cancelled, &later, &short] {
        let _: () = redis::cmd("ZADD").arg(&due_key).arg(expires_at).arg(id).query_async(&mut conn).await.unwrap();
    }
    let _: () = redis::cmd("ZREMRANGEBYSCORE")
        .arg(format!("{base}:gc"))
        .arg("-inf")
        .arg("(0")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () =
        redis::cmd("HDEL").arg(format!("{base}:pool")).arg("due").arg("due_tail").query_async(&mut conn).await.unwrap();
    assert_eq!(snap(&*store, &p).await.generation, generation, "the old set's marker keeps the pool intact");

    // Confirm and cancel take their reservations out of the old set, as before.
    assert!(matches!(store.confirm(&p, &confirmed.0).await.unwrap(), Transition::Done(_)));
    assert!(matches!(store.cancel(&p, &cancelled.0).await.unwrap(), Transition::Done(_)));
    let members: Vec<String> = redis::cmd("ZRANGE").arg(&due_key).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    // By expiry: the short one first.
    assert_eq!(members, [short.0.as_str(), later.0.as_str(), marker.as_str()]);
    // A reservation made meanwhile is an exception: the old set only shrinks.
    let meanwhile = reserve_with(&*store, &p, &long("meanwhile")).await;
    assert_eq!(exception(&mut conn, &base, &meanwhile.0).await, Some(-(meanwhile.1 as f64)));
    assert_eq!(key_type(&mut conn, &due_key).await, "zset");

    // The short one expires from the old set on time; the same sweep converts the pool.
    wait_past(&store, &p, short.1).await;
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 2);
    assert_eq!(state(&*store, &p, &short.0).await, Some(ReservationState::Expired));
    let flag: Option<String> =
        redis::cmd("HGET").arg(format!("{base}:pool")).arg("due").query_async(&mut conn).await.unwrap();
    assert_eq!(flag.as_deref(), Some("list"));
    assert_eq!(key_type(&mut conn, &due_key).await, "list");
    assert_eq!(due_list(&mut conn, &base).await, [marker.as_str()]);
    // What the old set held is an exception now, due at the same time.
    assert_eq!(exception(&mut conn, &base, &later.0).await, Some(-(later.1 as f64)));
    assert_eq!(snap(&*store, &p).await.generation, generation, "the list's marker keeps the pool intact");

    // After the conversion: new reservations go to the list, and the old ones change state
    // as before.
    let after = reserve_with(&*store, &p, &long("after")).await;
    assert_eq!(due_list(&mut conn, &base).await, [marker.as_str(), after.0.as_str()]);
    assert!(matches!(store.cancel(&p, &later.0).await.unwrap(), Transition::Done(_)));
    assert!(matches!(store.confirm(&p, &meanwhile.0).await.unwrap(), Transition::Done(_)));
    assert_eq!(exception(&mut conn, &base, &later.0).await, None);
    assert_eq!(exception(&mut conn, &base, &meanwhile.0).await, None);
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0);
    assert_eq!(counters(&*store, &p).await, (7, 1, 2));
}

type Conn = redis::aio::MultiplexedConnection;

/// How long finished records are remembered in the tests of records by key.
const RETENTION_MS: u64 = 200;

async fn hget(conn: &mut Conn, key: &str, field: &str) -> Option<String> {
    redis::cmd("HGET").arg(key).arg(field).query_async(conn).await.unwrap()
}

/// The fields of hash `key`, sorted.
async fn fields(conn: &mut Conn, key: &str) -> Vec<String> {
    let mut all: Vec<String> = redis::cmd("HKEYS").arg(key).query_async(conn).await.unwrap();
    all.sort();
    all
}

/// h of `key` as `lua/ids.lua` derives it: SHA-1 by Redis, its first 24 hex digits.
async fn key_hash(conn: &mut Conn, key: &str) -> String {
    let hex: String =
        redis::cmd("EVAL").arg("return redis.sha1hex(ARGV[1])").arg(0).arg(key).query_async(conn).await.unwrap();
    hex[..24].to_owned()
}

/// An Acquire as the agent makes it on the Redis store: the store's id prefix.
fn keyed_args(store: &dyn PoolStore, segment: u32, user: &str, key: &str) -> AcquireArgs {
    AcquireArgs {
        new_reservation_id: store.new_reservation_id(segment),
        ..acquire_args(user, 1, key, 100, LONG_TTL_MS)
    }
}

/// Acquires `args`, which must reserve anew; returns the reservation id.
async fn reserve_keyed(store: &dyn PoolStore, p: &PoolKey, args: &AcquireArgs) -> String {
    match store.acquire(p, args).await.unwrap() {
        AcquireResult::Reserved { reservation_id, replayed: false, .. } => reservation_id,
        other => panic!("expected a fresh reservation for {args:?}, got {other:?}"),
    }
}

async fn replayed_id(store: &dyn PoolStore, p: &PoolKey, args: &AcquireArgs) -> String {
    match store.acquire(p, args).await.unwrap() {
        AcquireResult::Reserved { reservation_id, replayed: true, .. } => reservation_id,
        other => panic!("expected a replay of {args:?}, got {other:?}"),
    }
}

async fn by_key(store: &dyn PoolStore, p: &PoolKey, key: &str) -> Option<(String, Reservation)> {
    store.reservation(p, &ReservationRef::IdempotencyKey(key.to_owned())).await.unwrap()
}

async fn by_id(store: &dyn PoolStore, p: &PoolKey, id: &str) -> Option<(String, Reservation)> {
    store.reservation(p, &ReservationRef::Id(id.to_owned())).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_new_reservation_is_addressed_by_its_key_and_a_forged_id_names_none() {
    let redis = TestRedis::create().await;
    let retention = Duration::from_millis(RETENTION_MS);
    let store: Arc<dyn PoolStore> =
        Arc::new(RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap().with_record_retention(retention));
    let p = PoolKey { segment: 3, ..pool("sku-keyed") };
    store.refill(&p, "grant-1", 10, 0).await.unwrap();
    let mut conn = redis::Client::open(redis.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let base = format!("{}{}", redis.prefix, p.hash_tag());
    let marker = format!(" gen:{}", snap(&*store, &p).await.generation);
    assert_eq!(hget(&mut conn, &format!("{base}:pool"), "keys").await.as_deref(), Some("derived"), "a new pool");

    let args = keyed_args(&*store, 3, "ann", "order-17");
    assert!(args.new_reservation_id.starts_with("s3.k"), "{}", args.new_reservation_id);
    let id = reserve_keyed(&*store, &p, &args).await;
    let h = key_hash(&mut conn, "order-17").await;
    assert_eq!(id, format!("{}{h}", args.new_reservation_id));
    // The record's field is '=' .. h; no idem entry; the due list holds the field.
    let field = format!("={h}");
    assert_eq!(fields(&mut conn, &format!("{base}:res")).await, [" gen".to_owned(), field.clone()]);
    assert_eq!(fields(&mut conn, &format!("{base}:idem")).await, [" gen"]);
    assert_eq!(due_list(&mut conn, &base).await, [marker.clone(), field.clone()]);

    // Found by id and by key; a replay answers the id; the id's tag still names the segment.
    let found = by_id(&*store, &p, &id).await.expect("by id");
    assert_eq!(found.0, id);
    assert_eq!(by_key(&*store, &p, "order-17").await, Some(found));
    let again = keyed_args(&*store, 3, "ann", "order-17");
    assert_eq!(replayed_id(&*store, &p, &again).await, id);
    assert_eq!(inventory_core::segments::split_reservation_id(&id, 4).map(|(s, _)| s), Some(3));
    assert_eq!(store.idempotency_keys(&p).await.unwrap(), ["order-17"]);

    // The right h with another nonce names no reservation.
    let forged = format!("s3.k{}{h}", if &id[4..12] == "00000000" { "11111111" } else { "00000000" });
    assert_eq!(store.confirm(&p, &forged).await.unwrap(), Transition::NotFound);
    assert_eq!(store.cancel(&p, &forged).await.unwrap(), Transition::NotFound);
    assert_eq!(store.reservation_state(&p, &forged).await.unwrap(), None);
    assert_eq!(by_id(&*store, &p, &forged).await, None);
    assert_eq!(state(&*store, &p, &id).await, Some(ReservationState::Reserved));

    // Once its record is forgotten, the key reserves anew under another id (order sinks
    // dedupe by id), at the same field.
    assert_eq!(store.cancel(&p, &id).await.unwrap(), Transition::Done(ReservationState::Cancelled));
    let now = snap(&*store, &p).await.now_ms;
    wait_past(&store, &p, now.saturating_add_unsigned(RETENTION_MS)).await;
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0);
    assert_eq!(by_key(&*store, &p, "order-17").await, None);
    assert_eq!(state(&*store, &p, &id).await, None);
    let reused = reserve_keyed(&*store, &p, &again).await;
    assert_ne!(reused, id);
    assert!(reused.ends_with(&h));
    assert_eq!(state(&*store, &p, &reused).await, Some(ReservationState::Reserved));
    assert_eq!(state(&*store, &p, &id).await, None, "the old id names no reservation");
    assert_eq!(counters(&*store, &p).await, (9, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_pool_with_records_by_id_answers_as_before_and_drains_to_keyed_records() {
    let redis = TestRedis::create().await;
    let retention = Duration::from_millis(RETENTION_MS);
    let store: Arc<dyn PoolStore> =
        Arc::new(RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap().with_record_retention(retention));
    let p = pool("sku-by-id");
    store.refill(&p, "grant-1", 10, 0).await.unwrap();
    let mut conn = redis::Client::open(redis.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let base = format!("{}{}", redis.prefix, p.hash_tag());
    let (pool_key, res, idem) = (format!("{base}:pool"), format!("{base}:res"), format!("{base}:idem"));

    // The layout before: ids of the caller's own (uuids), each record under its id and an
    // idem entry key -> id, the pool hash without `keys`.
    let old: Vec<AcquireArgs> =
        ["ann", "bob", "cy"].map(|u| acquire_args(u, 1, &format!("key-{u}"), 100, LONG_TTL_MS)).into();
    for args in &old {
        reserve_with(&*store, &p, args).await;
    }
    assert_eq!(hget(&mut conn, &pool_key, "keys").await, None);
    for args in &old {
        assert_eq!(hget(&mut conn, &idem, &args.idempotency_key).await.as_ref(), Some(&args.new_reservation_id));
        let record = hget(&mut conn, &res, &args.new_reservation_id).await.expect("record by id");
        assert!(record.starts_with("r1|"), "{record}");
    }

    // Answered by old id and by key, replayed with the old id.
    let before = lookups(&*store, &p, &old).await;
    let replay = AcquireArgs { new_reservation_id: store.new_reservation_id(0), ..old[0].clone() };
    assert_eq!(replayed_id(&*store, &p, &replay).await, old[0].new_reservation_id);
    assert_eq!(lookups(&*store, &p, &old).await, before);

    // New reservations in it go keyed: no idem entry.
    let new = keyed_args(&*store, 0, "dan", "key-dan");
    let new_id = reserve_keyed(&*store, &p, &new).await;
    let h = key_hash(&mut conn, "key-dan").await;
    assert!(hget(&mut conn, &res, &format!("={h}")).await.is_some());
    assert_eq!(hget(&mut conn, &idem, "key-dan").await, None);
    assert_eq!(by_key(&*store, &p, "key-dan").await.map(|(id, _)| id), Some(new_id.clone()));
    let mut keys = store.idempotency_keys(&p).await.unwrap();
    keys.sort();
    assert_eq!(keys, ["key-ann", "key-bob", "key-cy", "key-dan"]);

    // Old records change state as before.
    assert_eq!(
        store.confirm(&p, &old[1].new_reservation_id).await.unwrap(),
        Transition::Done(ReservationState::Confirmed)
    );
    assert_eq!(
        store.cancel(&p, &old[2].new_reservation_id).await.unwrap(),
        Transition::Done(ReservationState::Cancelled)
    );
    assert_eq!(
        store.cancel(&p, &old[0].new_reservation_id).await.unwrap(),
        Transition::Done(ReservationState::Cancelled)
    );
    assert_eq!(by_key(&*store, &p, "key-bob").await.map(|(_, r)| r.state), Some(ReservationState::Confirmed));
    // A sweep before their retention ran out keeps looking keys up in idem.
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0);
    assert_eq!(hget(&mut conn, &pool_key, "keys").await, None);

    // Once they are forgotten no idem entry is left, and the sweeper sets the flag.
    let now = snap(&*store, &p).await.now_ms;
    wait_past(&store, &p, now.saturating_add_unsigned(RETENTION_MS)).await;
    assert_eq!(store.expire_due(&p, 10).await.unwrap(), 0);
    assert_eq!(fields(&mut conn, &idem).await, [" gen"]);
    assert_eq!(hget(&mut conn, &pool_key, "keys").await.as_deref(), Some("derived"));
    for args in &old {
        assert_eq!(by_id(&*store, &p, &args.new_reservation_id).await, None);
    }
    // The keyed one answers as before; a forgotten key reserves anew, keyed.
    assert_eq!(replayed_id(&*store, &p, &keyed_args(&*store, 0, "dan", "key-dan")).await, new_id);
    let reused = reserve_keyed(&*store, &p, &keyed_args(&*store, 0, "ann", "key-ann")).await;
    assert_ne!(reused, old[0].new_reservation_id);
    assert_eq!(fields(&mut conn, &idem).await, [" gen"]);
    assert_eq!(counters(&*store, &p).await, (7, 2, 1));
}
