//! The `PoolStore` contract, continued: partial acquires (`allow_partial`). Run against
//! every backend like `store_contract`.

use inventory_agent::store::{
    AcquireArgs, AcquireResult, PoolKey, PoolStore, ReservationRef, ReservationState, Transition,
};

use super::store_contract::{Backend, LONG_TTL_MS, ROUNDS_FOR_A_BATCH, acquire_args, counters, pool};
use inventory_agent::store::redis::RedisPoolStore;

contract_suite!(
    a_partial_acquire_reserves_what_is_left_and_its_replay_returns_it,
    a_partial_acquire_stops_at_the_users_allowance,
    a_partial_acquire_of_an_empty_pool_or_a_full_allowance_writes_nothing,
    partial_acquires_in_one_batch_answer_as_a_sequential_run,
);

fn partial(user: &str, quantity: u64, key: &str, limit: u64) -> AcquireArgs {
    AcquireArgs { allow_partial: true, ..acquire_args(user, quantity, key, limit, LONG_TTL_MS) }
}

async fn acquire(store: &dyn PoolStore, p: &PoolKey, args: &AcquireArgs) -> AcquireResult {
    store.acquire(p, args).await.expect("acquire")
}

/// (reservation id, quantity, replayed) of a reserved answer.
fn reserved(r: &AcquireResult) -> (String, u64, bool) {
    match r {
        AcquireResult::Reserved { reservation_id, quantity, replayed, .. } => {
            (reservation_id.clone(), *quantity, *replayed)
        }
        other => panic!("expected a reservation, got {other:?}"),
    }
}

async fn a_partial_acquire_reserves_what_is_left_and_its_replay_returns_it(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-partial");
    assert!(store.refill(&p, "grant", 3, 0).await.unwrap());
    // Without the flag, 5 of 3 is sold out and writes nothing.
    let whole = acquire_args("u1", 5, "whole", 10, LONG_TTL_MS);
    assert_eq!(acquire(&*store, &p, &whole).await, AcquireResult::SoldOut { available: 3 });
    assert_eq!(counters(&*store, &p).await, (3, 0, 0));

    let first = partial("u1", 5, "part", 10);
    let (id, quantity, replayed) = reserved(&acquire(&*store, &p, &first).await);
    assert_eq!((id.as_str(), quantity, replayed), (first.new_reservation_id.as_str(), 3, false));
    assert_eq!(counters(&*store, &p).await, (0, 3, 0));

    // A replay asks the same (user, requested quantity) and gets the 3 again, not a conflict.
    let retry = AcquireArgs { new_reservation_id: uuid::Uuid::new_v4().to_string(), ..first.clone() };
    assert_eq!(reserved(&acquire(&*store, &p, &retry).await), (id.clone(), 3, true));
    // So does a replay without the flag: the key names that reservation.
    let plain = AcquireArgs { allow_partial: false, ..retry.clone() };
    assert_eq!(reserved(&acquire(&*store, &p, &plain).await), (id.clone(), 3, true));
    // Another requested quantity (even the reserved one) is another payload.
    let other = AcquireArgs { quantity: 3, ..retry.clone() };
    assert_eq!(acquire(&*store, &p, &other).await, AcquireResult::KeyConflict);
    assert_eq!(counters(&*store, &p).await, (0, 3, 0));

    // The record and its event carry the reserved quantity.
    let (_, r) = store.reservation(&p, &ReservationRef::IdempotencyKey("part".into())).await.unwrap().unwrap();
    assert_eq!((r.quantity, r.requested_quantity(), r.state), (3, 5, ReservationState::Reserved));
    let page = store.events(&p, 0, 10).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.quantity).collect::<Vec<_>>(), vec![3]);

    // The reservation moves as any other, and a cancel keeps the requested quantity.
    assert_eq!(store.cancel(&p, &id).await.unwrap(), Transition::Done(ReservationState::Cancelled));
    assert_eq!(counters(&*store, &p).await, (3, 0, 0));
    assert_eq!(reserved(&acquire(&*store, &p, &retry).await), (id, 3, true));
}

async fn a_partial_acquire_stops_at_the_users_allowance(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-partial-limit");
    assert!(store.refill(&p, "grant", 10, 0).await.unwrap());
    reserved(&acquire(&*store, &p, &acquire_args("u1", 2, "k1", 3, LONG_TTL_MS)).await);
    // Limit 3, 2 held: a partial 4 reserves the 1 left of the allowance.
    let (_, quantity, _) = reserved(&acquire(&*store, &p, &partial("u1", 4, "k2", 3)).await);
    assert_eq!(quantity, 1);
    // Stock and allowance both short: the smaller wins.
    let (_, quantity, _) = reserved(&acquire(&*store, &p, &partial("u2", 3, "k3", 3)).await);
    assert_eq!(quantity, 3);
    assert_eq!(counters(&*store, &p).await, (4, 6, 0));
    let (_, quantity, _) = reserved(&acquire(&*store, &p, &partial("u3", 3, "k4", 2)).await);
    assert_eq!(quantity, 2);
    let (_, quantity, _) = reserved(&acquire(&*store, &p, &partial("u4", 5, "k5", 5)).await);
    assert_eq!(quantity, 2, "only 2 units were left");
    assert_eq!(counters(&*store, &p).await, (0, 10, 0));
}

async fn a_partial_acquire_of_an_empty_pool_or_a_full_allowance_writes_nothing(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-partial-none");
    assert!(store.refill(&p, "grant", 2, 0).await.unwrap());
    reserved(&acquire(&*store, &p, &acquire_args("u1", 2, "k1", 2, LONG_TTL_MS)).await);
    // The allowance is full: over the limit, whatever is in stock.
    assert_eq!(acquire(&*store, &p, &partial("u1", 1, "k2", 2)).await, AcquireResult::LimitExceeded { held: 2 });
    // Room in the allowance, nothing in stock: sold out.
    assert_eq!(acquire(&*store, &p, &partial("u2", 2, "k3", 2)).await, AcquireResult::SoldOut { available: 0 });
    assert_eq!(counters(&*store, &p).await, (0, 2, 0));
    assert_eq!(store.events(&p, 0, 10).await.unwrap().events.len(), 1, "the refused calls wrote no event");
    // Neither key was taken: once stock is back, they reserve.
    assert!(store.refill(&p, "grant-2", 1, 0).await.unwrap());
    let (_, quantity, replayed) = reserved(&acquire(&*store, &p, &partial("u2", 2, "k3", 2)).await);
    assert_eq!((quantity, replayed), (1, false));
}

async fn partial_acquires_in_one_batch_answer_as_a_sequential_run(backend: &Backend) {
    // 7 units, 6 callers asking 2 each with the flag, then replays of the first three:
    // 2, 2, 2, 1, sold out, sold out; the replays return the first reservations. Whether
    // the concurrent calls meet in a batch depends on the scheduler: a few rounds on fresh
    // pools, each checked in full, until one formed a batch.
    let (store, redis) = backend.grouping_store().await;
    for round in 0..ROUNDS_FOR_A_BATCH {
        if partial_round(&*store, redis.as_deref(), round).await {
            return;
        }
    }
    panic!("no real batch formed in {ROUNDS_FOR_A_BATCH} rounds");
}

/// One round of [`partial_acquires_in_one_batch_answer_as_a_sequential_run`]: whether a
/// batch formed (always true without a Redis store to ask).
async fn partial_round(store: &dyn PoolStore, redis: Option<&RedisPoolStore>, round: usize) -> bool {
    let (seq, batched) = (pool(&format!("sku-partial-seq-{round}")), pool(&format!("sku-partial-batched-{round}")));
    assert!(store.refill(&seq, "grant", 7, 0).await.unwrap());
    assert!(store.refill(&batched, "grant", 7, 0).await.unwrap());
    let mut requests: Vec<AcquireArgs> = (0..6).map(|i| partial(&format!("u{i}"), 2, &format!("k{i}"), 5)).collect();
    for i in [3, 0, 4] {
        requests.push(AcquireArgs { new_reservation_id: uuid::Uuid::new_v4().to_string(), ..requests[i].clone() });
    }
    let summary = |r: &AcquireResult| match r {
        AcquireResult::Reserved { quantity, replayed, .. } => format!("{quantity}{}", if *replayed { "r" } else { "" }),
        AcquireResult::SoldOut { available } => format!("sold_out({available})"),
        other => format!("{other:?}"),
    };
    let mut sequential = Vec::new();
    for a in &requests {
        sequential.push(summary(&acquire(store, &seq, a).await));
    }
    let before = redis.map(|r| r.batch_stats());
    let together: Vec<String> = futures::future::join_all(requests.iter().map(|a| store.acquire(&batched, a)))
        .await
        .iter()
        .map(|r| summary(r.as_ref().expect("batched acquire")))
        .collect();
    assert_eq!(sequential, ["2", "2", "2", "1", "sold_out(0)", "sold_out(0)", "1r", "2r", "sold_out(0)"]);
    assert_eq!(together, sequential);
    assert_eq!(counters(store, &batched).await, (0, 7, 0));
    // The first call goes alone; the later ones wait for it and go in batches.
    match (redis, before) {
        (Some(redis), Some(before)) => redis.batch_stats().requests - before.requests >= 2,
        _ => true,
    }
}
