//! The buyer registry's script (`lua/buyer.lua`) answers as the model
//! (`inventory_core::buyers::Buyer`) on one Redis, and claims racing from several
//! channels never give a user more than the limit.

use std::collections::HashMap;

use futures::future::join_all;
use inventory_agent::buyers::BuyerRegistry;
use inventory_core::buyers::{Buyer, ClaimResult, Found, Settled};
use inventory_core::pool::ReservationState;
use inventory_test_support::TestRedis;

async fn registry(redis: &TestRedis) -> BuyerRegistry {
    BuyerRegistry::connect(&redis.url, &redis.prefix).await.expect("connect the buyer registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_answers_as_the_model() {
    let redis = TestRedis::create().await;
    let reg = registry(&redis).await;
    let mut model = Buyer::new();
    // Far in the future for both clocks: nothing pending is due.
    const LONG: u64 = 3_600_000;
    let claims = [
        ("k1", "app", 1, 2),
        ("k1", "app", 1, 2),
        ("k1", "web", 1, 2),
        ("k2", "web", 1, 2),
        ("k3", "partner", 1, 2),
        ("k2", "web", 2, 2),
    ];
    for (key, channel, quantity, limit) in claims {
        let got = reg.claim("i", "u", key, channel, quantity, limit, LONG).await.unwrap();
        assert_eq!(got, model.claim(key, channel, quantity, limit, 0, LONG), "claim {key} {channel} {quantity}");
    }
    assert_eq!(model.held(), 2);
    assert_eq!(reg.bind("i", "u", "k1", "r1", 1, i64::MAX / 2).await.unwrap(), model.bind("k1", "r1", 1, i64::MAX / 2));
    assert_eq!(reg.bind("i", "u", "k1", "r9", 1, 1).await.unwrap(), model.bind("k1", "r9", 1, 1));
    assert_eq!(reg.bind("i", "u", "gone", "r9", 1, 1).await.unwrap(), model.bind("gone", "r9", 1, 1));
    assert_eq!(reg.confirm("i", "u", "k1", "r1").await.unwrap(), model.confirm("k1", "r1"));
    assert!(reg.due("i", "u", "").await.unwrap().is_empty());
    assert_eq!(reg.release("i", "u", "k2").await.unwrap(), model.release("k2"));
    assert_eq!(reg.release("i", "u", "k2").await.unwrap(), 0);
    // The freed unit is claimable again, on any channel.
    let again = reg.claim("i", "u", "k4", "partner", 1, 2, LONG).await.unwrap();
    assert_eq!(again, model.claim("k4", "partner", 1, 2, 0, LONG));
    assert_eq!(again, ClaimResult::Claimed { replayed: false });
    assert_eq!(reg.claim("i", "u", "k5", "app", 1, 2, LONG).await.unwrap(), ClaimResult::LimitExceeded { held: 2 });
    // Another user of the item, and the same user of another item, are other entries.
    assert_eq!(reg.claim("i", "v", "k1", "app", 2, 2, LONG).await.unwrap(), ClaimResult::Claimed { replayed: false });
    assert_eq!(reg.claim("j", "u", "k1", "app", 2, 2, LONG).await.unwrap(), ClaimResult::Claimed { replayed: false });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_left_by_a_crash_are_settled_from_the_pool() {
    let redis = TestRedis::create().await;
    let reg = registry(&redis).await;
    // Pending bound 0: due at once (as after an agent crash past the bound).
    for key in ["none", "open", "paid", "gone"] {
        assert_eq!(reg.claim("i", "u", key, "app", 1, 5, 0).await.unwrap(), ClaimResult::Claimed { replayed: false });
    }
    let mut due = reg.due("i", "u", "").await.unwrap();
    due.sort();
    assert_eq!(due, ["gone", "none", "open", "paid"]);
    let found = |state, expires_at_ms| Found { reservation_id: "r1".into(), state, quantity: 1, expires_at_ms };
    let future = i64::MAX / 2;
    assert_eq!(reg.settle("i", "u", "none", None).await.unwrap(), Settled::Released { quantity: 1 });
    assert_eq!(reg.settle("i", "u", "none", None).await.unwrap(), Settled::Untouched, "released once");
    let open = found(ReservationState::Reserved, future);
    assert_eq!(reg.settle("i", "u", "open", Some(&open)).await.unwrap(), Settled::Held);
    let paid = found(ReservationState::Confirmed, future);
    assert_eq!(reg.settle("i", "u", "paid", Some(&paid)).await.unwrap(), Settled::Confirmed);
    // Past its expiry but still reserved in the pool: counted until the pool expires it.
    let late = found(ReservationState::Reserved, 1);
    assert_eq!(reg.settle("i", "u", "gone", Some(&late)).await.unwrap(), Settled::Waiting);
    let expired = found(ReservationState::Expired, 1);
    assert_eq!(reg.settle("i", "u", "gone", Some(&expired)).await.unwrap(), Settled::Released { quantity: 1 });
    assert!(reg.due("i", "u", "").await.unwrap().is_empty(), "held until a future expiry, confirmed: none due");
    // 2 units still held of 5.
    assert_eq!(reg.claim("i", "u", "more", "web", 4, 5, 0).await.unwrap(), ClaimResult::LimitExceeded { held: 2 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn users_racing_on_three_channels_with_replays_get_the_limit_once() {
    const USERS: usize = 500;
    const CHANNELS: [&str; 3] = ["app", "web", "partner"];
    let redis = TestRedis::create().await;
    let reg = registry(&redis).await;
    // Each user sends the purchase on all three channels at once (a key per channel), and
    // each call twice (a replay).
    let calls = (0..USERS).flat_map(|u| CHANNELS.iter().flat_map(move |c| [(u, *c), (u, *c)]));
    let answers = join_all(calls.map(|(u, c)| {
        let reg = reg.clone();
        async move {
            let (user, key) = (format!("user-{u}"), format!("order-{u}-{c}"));
            let got = reg.claim("drop", &user, &key, c, 1, 1, 60_000).await.expect("claim");
            (u, key, got)
        }
    }))
    .await;
    let mut won: HashMap<usize, Vec<String>> = HashMap::new();
    for (u, key, got) in &answers {
        match got {
            ClaimResult::Claimed { .. } => won.entry(*u).or_default().push(key.clone()),
            ClaimResult::LimitExceeded { held: 1 } => {}
            other => panic!("user {u} key {key}: {other:?}"),
        }
    }
    assert_eq!(won.len(), USERS, "every user got one claim");
    for (u, keys) in &won {
        // The claim and its replay, of one key: one unit per user over all channels.
        assert_eq!(keys.len(), 2, "user {u}: {keys:?}");
        assert_eq!(keys[0], keys[1], "user {u}: {keys:?}");
    }
    // A released allowance (the reservation was cancelled) lets the user buy again.
    let key = &won[&0][0];
    assert_eq!(reg.release("drop", "user-0", key).await.unwrap(), 1);
    let again = reg.claim("drop", "user-0", "order-0-again", "web", 1, 1, 60_000).await.unwrap();
    assert_eq!(again, ClaimResult::Claimed { replayed: false });
}

/// The agent died between claiming and deducting (k2), or the reservation ended without
/// the claim being released (k3 cancelled, k4 expired): after the pending bound the
/// sweeper, asking the Redis pool by each claim's key, releases exactly those and keeps
/// the claim whose reservation is open (k1); the freed allowance is claimable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_settles_claims_from_the_pool_after_a_crash() {
    use inventory_agent::buyers::{SweepStats, sweep};
    use inventory_agent::store::redis::RedisPoolStore;
    use inventory_agent::store::{AcquireArgs, AcquireResult, PoolKey, PoolStore};

    let redis = TestRedis::create().await;
    let reg = registry(&redis).await;
    let store = RedisPoolStore::new(&redis.url, &redis.prefix).await.expect("redis store");
    let pool = PoolKey::new("app", "drop");
    assert!(store.refill(&pool, "grant", 10, 0).await.unwrap());
    let acquire = |key: &str, ttl: u64| AcquireArgs {
        user_id: "u".into(),
        quantity: 1,
        idempotency_key: key.into(),
        new_reservation_id: format!("r-{key}"),
        per_user_limit: 5,
        reservation_ttl_ms: ttl,
        expect_generation: None,
        allow_partial: false,
    };
    // Pending bound 0: every claim is due at once, as after a crash past the bound.
    for (key, reserve) in [("k1", true), ("k2", false), ("k3", true), ("k4", true)] {
        reg.note("drop", "app", "u", 0).await.unwrap();
        assert_eq!(
            reg.claim("drop", "u", key, "app", 1, 4, 0).await.unwrap(),
            ClaimResult::Claimed { replayed: false }
        );
        if reserve {
            let ttl = if key == "k4" { 1 } else { 3_600_000 };
            let got = store.acquire(&pool, &acquire(key, ttl)).await.unwrap();
            assert!(matches!(got, AcquireResult::Reserved { .. }), "{got:?}");
        }
    }
    assert!(matches!(store.cancel(&pool, "r-k3").await.unwrap(), inventory_agent::store::Transition::Done(_)));
    // k4's reservation expires in the pool (its sweeper), then the registry's settles it.
    let shared: std::sync::Arc<dyn PoolStore> = std::sync::Arc::new(store);
    assert_eq!(super::store_contract::sweep_until_freed(&shared, &pool, 1).await, 1);
    // The user holds the limit (4) until the sweep.
    assert_eq!(
        reg.claim("drop", "u", "k5", "app", 1, 4, 60_000).await.unwrap(),
        ClaimResult::LimitExceeded { held: 4 }
    );

    let stats = sweep(&reg, &*shared, std::slice::from_ref(&pool), 1, 60_000, 100).await.unwrap();
    assert_eq!(stats, SweepStats { buyers: 1, released: 3, held: 1, confirmed: 0, waiting: 0 });
    // A second sweep finds nothing due (k1 held until its expiry; the buyer re-noted later).
    let again = sweep(&reg, &*shared, std::slice::from_ref(&pool), 2, 60_000, 100).await.unwrap();
    assert_eq!(again, SweepStats::default());
    // Three units of the allowance are free again; k1's replay is still the same claim.
    assert_eq!(
        reg.claim("drop", "u", "k5", "app", 3, 4, 60_000).await.unwrap(),
        ClaimResult::Claimed { replayed: false }
    );
    assert_eq!(
        reg.claim("drop", "u", "k1", "app", 1, 4, 60_000).await.unwrap(),
        ClaimResult::Claimed { replayed: true }
    );
}
