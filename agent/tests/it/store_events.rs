//! The `PoolStore` contract, continued: the outbox (events written with each transition),
//! refund, extend and the reservation lookup. Run against every backend like
//! `store_contract`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use inventory_agent::store::memory::MemoryPoolStore;
use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{
    AcquireArgs, AcquireResult, ExtendResult, OutboxStats, PoolEvent, PoolKey, PoolStore, ReservationRef,
    ReservationState, Transition,
};
use inventory_test_support::TestRedis;

use super::store_contract::{
    Backend, LONG_TTL_MS, SHORT_TTL_MS, acquire_args, counters, hostile_strings, pool, reserve, reserve_with, snap,
    sweep_until_freed, wait_past,
};
use ReservationState::{Cancelled, Confirmed, Expired, Refunded, Reserved};

contract_suite!(
    every_transition_writes_one_event_without_gaps_and_replays_write_none,
    confirm_racing_expiry_gives_one_answer_and_one_event,
    events_page_from_a_sequence_and_trim_forgets_delivered_ones,
    the_outbox_bound_drops_the_oldest_and_counts_them,
    refund_returns_sold_units_and_the_allowance_once,
    extend_pushes_the_expiry_within_the_ttl_and_refuses_late_or_finished_ones,
    reservation_lookup_by_id_or_key,
    hostile_values_round_trip_through_events_refund_extend_and_lookup,
    concurrent_transitions_keep_event_numbering_without_gaps,
    replicas_selling_and_sweeping_one_pool_number_every_event_once,
);

impl Backend {
    async fn store_with_outbox_max(&self, max: u64) -> Arc<dyn PoolStore> {
        match self {
            Backend::Memory => Arc::new(MemoryPoolStore::new().with_outbox_max(max)),
            Backend::Redis(redis) => {
                Arc::new(RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap().with_outbox_max(max))
            }
        }
    }
}

async fn all_events(store: &dyn PoolStore, p: &PoolKey) -> Vec<PoolEvent> {
    store.events(p, 0, 1_000_000).await.expect("events").events
}

/// (reservation id, state, previous) per event, after checking the sequences run 1, 2, ...
fn transitions(events: &[PoolEvent]) -> Vec<(String, ReservationState, Option<ReservationState>)> {
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "sequences without gaps");
    events.iter().map(|e| (e.reservation_id.clone(), e.state, e.previous)).collect()
}

async fn every_transition_writes_one_event_without_gaps_and_replays_write_none(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-events");
    store.refill(&p, "g1", 20, 0).await.unwrap();
    assert!(all_events(&*store, &p).await.is_empty(), "a refill is no reservation transition");
    let args = acquire_args("ann", 2, "k-ann", 10, LONG_TTL_MS);
    let (confirmed, _) = reserve_with(&*store, &p, &args).await;
    // A replay answers the same reservation and writes nothing.
    let replay = AcquireArgs { new_reservation_id: "other".into(), ..args.clone() };
    assert!(matches!(store.acquire(&p, &replay).await.unwrap(), AcquireResult::Reserved { replayed: true, .. }));
    let cancelled = reserve(&*store, &p, "bob", 1).await;
    let late = reserve_with(&*store, &p, &acquire_args("cat", 1, "k-cat", 10, SHORT_TTL_MS)).await;
    let swept = reserve_with(&*store, &p, &acquire_args("dan", 1, "k-dan", 10, SHORT_TTL_MS)).await;
    // Refusals and sold-out answers write nothing either.
    let big = acquire_args("eve", 100, "k-eve", 1_000, LONG_TTL_MS);
    assert!(matches!(store.acquire(&p, &big).await.unwrap(), AcquireResult::SoldOut { .. }));

    assert_eq!(store.confirm(&p, &confirmed).await.unwrap(), Transition::Done(Confirmed));
    assert_eq!(store.confirm(&p, &confirmed).await.unwrap(), Transition::Done(Confirmed));
    assert_eq!(store.cancel(&p, &confirmed).await.unwrap(), Transition::Refused(Confirmed));
    assert_eq!(store.cancel(&p, &cancelled).await.unwrap(), Transition::Done(Cancelled));
    assert_eq!(store.cancel(&p, &cancelled).await.unwrap(), Transition::Done(Cancelled));
    wait_past(&store, &p, late.1.max(swept.1)).await;
    assert_eq!(store.confirm(&p, &late.0).await.unwrap(), Transition::Refused(Expired));
    assert_eq!(store.confirm(&p, &late.0).await.unwrap(), Transition::Refused(Expired));
    assert_eq!(sweep_until_freed(&store, &p, 1).await, 1);
    assert_eq!(store.refund(&p, &confirmed).await.unwrap(), Transition::Done(Refunded));
    assert_eq!(store.refund(&p, &confirmed).await.unwrap(), Transition::Done(Refunded));

    let events = all_events(&*store, &p).await;
    let expected = vec![
        (confirmed.clone(), Reserved, None),
        (cancelled.clone(), Reserved, None),
        (late.0.clone(), Reserved, None),
        (swept.0.clone(), Reserved, None),
        (confirmed.clone(), Confirmed, Some(Reserved)),
        (cancelled.clone(), Cancelled, Some(Reserved)),
        (late.0.clone(), Expired, Some(Reserved)),
        (swept.0.clone(), Expired, Some(Reserved)),
        (confirmed.clone(), Refunded, Some(Confirmed)),
    ];
    assert_eq!(transitions(&events), expected);
    let first = &events[0];
    assert_eq!((first.user_id.as_str(), first.idempotency_key.as_str(), first.quantity), ("ann", "k-ann", 2));
    let now = snap(&*store, &p).await.now_ms;
    assert!(events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "times in order");
    assert!(events.iter().all(|e| e.at_ms > now - 60_000 && e.at_ms <= now), "times by the store's clock");
    let page = store.events(&p, 0, 100).await.unwrap();
    assert_eq!((page.last_sequence, page.first_kept), (9, 1));
    assert_eq!(page.generation, snap(&*store, &p).await.generation);
}

/// A confirm and the sweeper after the expiry: one of them expires the reservation, the
/// other sees it expired; exactly one 'expired' event.
async fn confirm_racing_expiry_gives_one_answer_and_one_event(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-race");
    store.refill(&p, "g1", 50, 0).await.unwrap();
    let mut ids = Vec::new();
    let mut last_expiry = 0;
    for i in 0..20 {
        let (id, at) =
            reserve_with(&*store, &p, &acquire_args(&format!("u{i}"), 1, &format!("k{i}"), 5, SHORT_TTL_MS)).await;
        ids.push(id);
        last_expiry = last_expiry.max(at);
    }
    wait_past(&store, &p, last_expiry).await;
    let confirms: Vec<_> = ids
        .iter()
        .map(|id| {
            let (store, p, id) = (Arc::clone(&store), p.clone(), id.clone());
            tokio::spawn(async move { store.confirm(&p, &id).await.unwrap() })
        })
        .collect();
    let sweeper = {
        let (store, p) = (Arc::clone(&store), p.clone());
        tokio::spawn(async move { store.expire_due(&p, u64::MAX).await.unwrap() })
    };
    for c in confirms {
        assert_eq!(c.await.unwrap(), Transition::Refused(Expired), "a confirm after expiry is refused");
    }
    sweeper.await.unwrap();
    assert_eq!(counters(&*store, &p).await, (50, 0, 0));
    let events = all_events(&*store, &p).await;
    let log = transitions(&events);
    for id in &ids {
        let mine: Vec<_> = log.iter().filter(|(r, _, _)| r == id).map(|(_, s, _)| *s).collect();
        assert_eq!(mine, [Reserved, Expired], "{id}");
    }
}

async fn events_page_from_a_sequence_and_trim_forgets_delivered_ones(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-pages");
    let empty = store.events(&p, 0, 10).await.unwrap();
    assert_eq!((empty.generation, empty.last_sequence, empty.first_kept, empty.events.len()), (0, 0, 1, 0));
    store.refill(&p, "g1", 20, 0).await.unwrap();
    for i in 0..6 {
        reserve(&*store, &p, &format!("u{i}"), 1).await;
    }
    let seqs = |evs: Vec<PoolEvent>| evs.into_iter().map(|e| e.sequence).collect::<Vec<_>>();
    assert_eq!(seqs(store.events(&p, 3, 2).await.unwrap().events), [3, 4]);
    assert_eq!(seqs(store.events(&p, 5, 100).await.unwrap().events), [5, 6]);
    assert!(store.events(&p, 7, 100).await.unwrap().events.is_empty());
    assert!(store.events(&p, u64::MAX, 100).await.unwrap().events.is_empty());
    assert!(store.events(&p, 1, 0).await.unwrap().events.is_empty());

    let generation = store.events(&p, 0, 0).await.unwrap().generation;
    assert_eq!(
        store.trim_events(&p, generation + 1, 4).await.unwrap(),
        0,
        "a trim acknowledged for another generation of the pool removes nothing"
    );
    assert_eq!(store.events(&p, 0, 100).await.unwrap().first_kept, 1);
    assert_eq!(store.trim_events(&p, generation, 4).await.unwrap(), 4);
    assert_eq!(store.trim_events(&p, generation, 4).await.unwrap(), 0, "a replayed trim removes nothing");
    let page = store.events(&p, 0, 100).await.unwrap();
    assert_eq!((page.first_kept, page.last_sequence), (5, 6));
    assert_eq!(seqs(page.events), [5, 6], "a read below the oldest kept starts there");
    assert_eq!(store.outbox_stats(&p).await.unwrap(), OutboxStats { kept: 2, dropped: 0, last_sequence: 6 });
    assert_eq!(store.trim_events(&p, generation, u64::MAX).await.unwrap(), 2);
    let page = store.events(&p, 0, 100).await.unwrap();
    assert_eq!((page.first_kept, page.last_sequence, page.events.len()), (7, 6, 0));
    // Numbering goes on after the outbox was emptied.
    reserve(&*store, &p, "late", 1).await;
    assert_eq!(seqs(store.events(&p, 0, 100).await.unwrap().events), [7]);
}

async fn the_outbox_bound_drops_the_oldest_and_counts_them(backend: &Backend) {
    let store = backend.store_with_outbox_max(4).await;
    let p = pool("sku-bound");
    store.refill(&p, "g1", 20, 0).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(reserve(&*store, &p, &format!("u{i}"), 1).await);
    }
    // The sale never fails on the outbox: every acquire reserved.
    assert_eq!(counters(&*store, &p).await, (10, 10, 0));
    let page = store.events(&p, 0, 100).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [7, 8, 9, 10]);
    assert_eq!((page.first_kept, page.last_sequence), (7, 10));
    assert_eq!(store.outbox_stats(&p).await.unwrap(), OutboxStats { kept: 4, dropped: 6, last_sequence: 10 });
    store.confirm(&p, &ids[0]).await.unwrap();
    assert_eq!(store.outbox_stats(&p).await.unwrap(), OutboxStats { kept: 4, dropped: 7, last_sequence: 11 });
    // Eight at once (on Redis all but the first go as one batch, which trims once): the
    // same bound, the newest kept.
    let args: Vec<_> = (0..8)
        .map(|i| {
            let key = format!("together-{i}");
            acquire_args(&format!("t{i}"), 1, &key, 100, LONG_TTL_MS)
        })
        .collect();
    for answer in futures::future::join_all(args.iter().map(|a| store.acquire(&p, a))).await {
        assert!(matches!(answer.unwrap(), AcquireResult::Reserved { replayed: false, .. }));
    }
    assert_eq!(store.outbox_stats(&p).await.unwrap(), OutboxStats { kept: 4, dropped: 15, last_sequence: 19 });
    let page = store.events(&p, 0, 100).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [16, 17, 18, 19]);
    let keys: Vec<&str> = page.events.iter().map(|e| e.idempotency_key.as_str()).collect();
    assert_eq!(keys, ["together-4", "together-5", "together-6", "together-7"]);
}

async fn refund_returns_sold_units_and_the_allowance_once(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-refund");
    store.refill(&p, "g1", 10, 0).await.unwrap();
    let args = acquire_args("ann", 3, "k1", 3, LONG_TTL_MS);
    let (id, _) = reserve_with(&*store, &p, &args).await;
    assert_eq!(store.refund(&p, &id).await.unwrap(), Transition::Refused(Reserved));
    store.confirm(&p, &id).await.unwrap();
    // At her limit while the units are sold to her.
    let more = acquire_args("ann", 1, "k2", 3, LONG_TTL_MS);
    assert!(matches!(store.acquire(&p, &more).await.unwrap(), AcquireResult::LimitExceeded { held: 3 }));
    assert_eq!(counters(&*store, &p).await, (7, 0, 3));
    assert_eq!(store.refund(&p, &id).await.unwrap(), Transition::Done(Refunded));
    assert_eq!(counters(&*store, &p).await, (10, 0, 0));
    assert_eq!(store.refund(&p, &id).await.unwrap(), Transition::Done(Refunded), "idempotent");
    assert_eq!(counters(&*store, &p).await, (10, 0, 0), "counted once");
    assert_eq!(store.confirm(&p, &id).await.unwrap(), Transition::Refused(Refunded));
    assert_eq!(store.cancel(&p, &id).await.unwrap(), Transition::Refused(Refunded));
    assert_eq!(store.reservation_state(&p, &id).await.unwrap(), Some(Refunded));
    // The allowance is free again; a replay of the old key still answers the old reservation.
    reserve_with(&*store, &p, &more).await;
    let replay = AcquireArgs { new_reservation_id: "x".into(), ..args };
    assert!(matches!(
        store.acquire(&p, &replay).await.unwrap(),
        AcquireResult::Reserved { replayed: true, ref reservation_id, .. } if *reservation_id == id
    ));
    let cancelled = reserve(&*store, &p, "bob", 1).await;
    store.cancel(&p, &cancelled).await.unwrap();
    assert_eq!(store.refund(&p, &cancelled).await.unwrap(), Transition::Refused(Cancelled));
    assert_eq!(store.refund(&p, "no-such-reservation").await.unwrap(), Transition::NotFound);
    assert_eq!(store.refund(&pool("sku-nowhere"), &id).await.unwrap(), Transition::NotFound);
    let refunds = all_events(&*store, &p).await.into_iter().filter(|e| e.state == Refunded).count();
    assert_eq!(refunds, 1);
}

async fn extend_pushes_the_expiry_within_the_ttl_and_refuses_late_or_finished_ones(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-extend");
    store.refill(&p, "g1", 10, 0).await.unwrap();
    let (id, expires) = reserve_with(&*store, &p, &acquire_args("ann", 1, "k1", 5, LONG_TTL_MS)).await;
    let events_before = store.outbox_stats(&p).await.unwrap().last_sequence;
    // Bounded by the TTL: asking for an hour grants at most ttl from now.
    let ExtendResult::Extended { expires_at_ms: e1 } = store.extend(&p, &id, 3_600_000, 120_000).await.unwrap() else {
        panic!("not extended")
    };
    let now = snap(&*store, &p).await.now_ms;
    assert!(e1 > expires && e1 <= now + 120_000, "{e1} within the ttl of {now}");
    // Never earlier than it is.
    assert_eq!(store.extend(&p, &id, 1, 120_000).await.unwrap(), ExtendResult::Extended { expires_at_ms: e1 });
    assert_eq!(store.outbox_stats(&p).await.unwrap().last_sequence, events_before, "an extend is no transition");
    let found = store.reservation(&p, &ReservationRef::Id(id.clone())).await.unwrap().unwrap();
    assert_eq!(found.1.expires_at_ms, e1);
    assert_eq!(store.confirm(&p, &id).await.unwrap(), Transition::Done(Confirmed));
    assert_eq!(store.extend(&p, &id, 1_000, 120_000).await.unwrap(), ExtendResult::Refused(Confirmed));

    // Past its expiry: expired on the spot (units back, one event) and refused.
    let (late, at) = reserve_with(&*store, &p, &acquire_args("bob", 2, "k2", 5, SHORT_TTL_MS)).await;
    wait_past(&store, &p, at).await;
    let before = store.outbox_stats(&p).await.unwrap().last_sequence;
    assert_eq!(store.extend(&p, &late, 60_000, 120_000).await.unwrap(), ExtendResult::Refused(Expired));
    assert_eq!(store.extend(&p, &late, 60_000, 120_000).await.unwrap(), ExtendResult::Refused(Expired));
    assert_eq!(counters(&*store, &p).await, (9, 0, 1));
    let events = store.events(&p, before + 1, 10).await.unwrap().events;
    assert_eq!(transitions_from(&events), [(late.clone(), Expired, Some(Reserved))]);
    assert_eq!(store.confirm(&p, &late).await.unwrap(), Transition::Refused(Expired));
    assert_eq!(store.extend(&p, "no-such", 1_000, 120_000).await.unwrap(), ExtendResult::NotFound);

    // The sweeper follows the pushed expiry.
    let (short, _) = reserve_with(&*store, &p, &acquire_args("cat", 1, "k3", 5, SHORT_TTL_MS)).await;
    let ExtendResult::Extended { expires_at_ms } = store.extend(&p, &short, 60_000, 60_000).await.unwrap() else {
        panic!("not extended")
    };
    wait_past(&store, &p, expires_at_ms - 59_000).await;
    assert_eq!(store.expire_due(&p, u64::MAX).await.unwrap(), 0);
    assert_eq!(store.reservation_state(&p, &short).await.unwrap(), Some(Reserved));
}

fn transitions_from(events: &[PoolEvent]) -> Vec<(String, ReservationState, Option<ReservationState>)> {
    events.iter().map(|e| (e.reservation_id.clone(), e.state, e.previous)).collect()
}

async fn reservation_lookup_by_id_or_key(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-lookup");
    store.refill(&p, "g1", 10, 0).await.unwrap();
    let (id, expires) = reserve_with(&*store, &p, &acquire_args("ann", 2, "key-1", 5, LONG_TTL_MS)).await;
    let by_id = store.reservation(&p, &ReservationRef::Id(id.clone())).await.unwrap().expect("by id");
    let by_key = store.reservation(&p, &ReservationRef::IdempotencyKey("key-1".into())).await.unwrap().expect("by key");
    assert_eq!(by_id, by_key);
    assert_eq!(by_id.0, id);
    let r = by_id.1;
    assert_eq!(
        (r.state, r.quantity, r.expires_at_ms, r.user_id.as_str(), r.idempotency_key.as_str()),
        (Reserved, 2, expires, "ann", "key-1")
    );
    store.confirm(&p, &id).await.unwrap();
    let r = store.reservation(&p, &ReservationRef::Id(id.clone())).await.unwrap().unwrap().1;
    assert_eq!(r.state, Confirmed);
    // An id is not a key and a key is not an id.
    assert_eq!(store.reservation(&p, &ReservationRef::Id("key-1".into())).await.unwrap(), None);
    assert_eq!(store.reservation(&p, &ReservationRef::IdempotencyKey(id.clone())).await.unwrap(), None);
    assert_eq!(store.reservation(&pool("sku-nowhere"), &ReservationRef::Id(id)).await.unwrap(), None);
}

async fn hostile_values_round_trip_through_events_refund_extend_and_lookup(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-hostile-events");
    let hostile = hostile_strings();
    store.refill(&p, "g1", 100, 0).await.unwrap();
    for s in &hostile {
        let args = AcquireArgs { new_reservation_id: s.clone(), ..acquire_args(s, 1, s, 1, LONG_TTL_MS) };
        reserve_with(&*store, &p, &args).await;
        assert!(matches!(store.extend(&p, s, 1_000, 60_000).await.unwrap(), ExtendResult::Extended { .. }));
        store.confirm(&p, s).await.unwrap();
        assert_eq!(store.refund(&p, s).await.unwrap(), Transition::Done(Refunded));
        let (id, r) = store.reservation(&p, &ReservationRef::IdempotencyKey(s.clone())).await.unwrap().unwrap();
        assert_eq!((&id, &r.user_id, &r.idempotency_key, r.state), (s, s, s, Refunded));
    }
    let events = all_events(&*store, &p).await;
    assert_eq!(events.len(), 3 * hostile.len());
    for (i, s) in hostile.iter().enumerate() {
        for e in &events[3 * i..3 * i + 3] {
            assert_eq!((&e.reservation_id, &e.user_id, &e.idempotency_key), (s, s, s));
        }
    }
    assert_eq!(counters(&*store, &p).await, (100, 0, 0));
    // Hostile sequences and lookups are data too.
    assert!(store.events(&p, u64::MAX - 1, u64::MAX).await.unwrap().events.is_empty());
    assert_eq!(store.trim_events(&p, u64::MAX, 0).await.unwrap(), 0);
    assert_eq!(store.extend(&p, &hostile[1], u64::MAX, u64::MAX).await.unwrap(), ExtendResult::Refused(Refunded));
    assert_eq!(store.extend(&p, "not-a-reservation", u64::MAX, u64::MAX).await.unwrap(), ExtendResult::NotFound);
    // The largest extend is bounded the same way in both stores, and reads back exactly.
    let (open, _) = reserve_with(&*store, &p, &acquire_args("big", 1, "k-big", 1, LONG_TTL_MS)).await;
    let ExtendResult::Extended { expires_at_ms } = store.extend(&p, &open, u64::MAX, u64::MAX).await.unwrap() else {
        panic!("not extended")
    };
    let now = snap(&*store, &p).await.now_ms;
    assert!((now + 9_999_999_000_000..=now + 10_000_000_000_000).contains(&expires_at_ms), "{expires_at_ms}");
    let r = store.reservation(&p, &ReservationRef::Id(open)).await.unwrap().unwrap().1;
    assert_eq!(r.expires_at_ms, expires_at_ms);
}

/// Many buyers acquiring (in batches with Redis), confirming and cancelling on one pool at
/// once: every transition has its event, numbered 1..n without a gap or a duplicate.
async fn concurrent_transitions_keep_event_numbering_without_gaps(backend: &Backend) {
    const BUYERS: usize = 64;
    let store = backend.store().await;
    let p = pool("sku-gapless");
    store.refill(&p, "g1", BUYERS as u64, 0).await.unwrap();
    let tasks: Vec<_> = (0..BUYERS)
        .map(|i| {
            let (store, p) = (Arc::clone(&store), p.clone());
            tokio::spawn(async move {
                let args = acquire_args(&format!("u{i}"), 1, &format!("k{i}"), 1, LONG_TTL_MS);
                let AcquireResult::Reserved { reservation_id: id, .. } = store.acquire(&p, &args).await.unwrap() else {
                    panic!("buyer {i} got no reservation")
                };
                // A retry of the same request at the same time writes no event.
                store.acquire(&p, &args).await.unwrap();
                let t = match i % 3 {
                    0 => store.confirm(&p, &id).await.unwrap(),
                    1 => store.cancel(&p, &id).await.unwrap(),
                    _ => {
                        store.confirm(&p, &id).await.unwrap();
                        store.refund(&p, &id).await.unwrap()
                    }
                };
                (id, t)
            })
        })
        .collect();
    let mut finals = HashMap::new();
    for t in tasks {
        let (id, t) = tokio::time::timeout(Duration::from_secs(30), t).await.expect("bounded").unwrap();
        let Transition::Done(s) = t else { panic!("{id}: {t:?}") };
        finals.insert(id, s);
    }
    let events = all_events(&*store, &p).await;
    transitions(&events);
    // Reserved and one end each, plus the refund after the confirm of every third buyer.
    let refunds = (0..BUYERS).filter(|i| i % 3 == 2).count();
    assert_eq!(events.len(), 2 * BUYERS + refunds);
    let mut last: HashMap<&str, ReservationState> = HashMap::new();
    for e in &events {
        last.insert(&e.reservation_id, e.state);
    }
    for (id, s) in &finals {
        assert_eq!(last.get(id.as_str()), Some(s), "the last event of {id} is its final state");
    }
}

/// Four replicas' handles on one store (with Redis: four connections, each with its own
/// group commit) selling one pool while sweepers expire short reservations: the outbox
/// still numbers every transition once, without a gap.
async fn replicas_selling_and_sweeping_one_pool_number_every_event_once(backend: &Backend) {
    const BUYERS: usize = 400;
    let stores = backend.shared_stores(4).await;
    let p = pool("sku-replicas-gapless");
    stores[0].refill(&p, "g1", BUYERS as u64, 0).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweepers: Vec<_> = stores
        .iter()
        .map(|store| {
            let (store, p, stop) = (Arc::clone(store), p.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                // Bounded: at most 10,000 sweeps, each a store call.
                for _ in 0..10_000 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    store.expire_due(&p, 5).await.unwrap();
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let buyers = futures::stream::iter(0..BUYERS)
        .map(|i| {
            let (store, p) = (Arc::clone(&stores[i % stores.len()]), p.clone());
            async move {
                let ttl = if i % 4 == 3 { SHORT_TTL_MS } else { LONG_TTL_MS };
                let args = acquire_args(&format!("u{i}"), 1, &format!("k{i}"), 1, ttl);
                let AcquireResult::Reserved { reservation_id: id, expires_at_ms, .. } =
                    store.acquire(&p, &args).await.unwrap()
                else {
                    panic!("buyer {i} got no reservation")
                };
                match i % 4 {
                    0 => {
                        store.confirm(&p, &id).await.unwrap();
                    }
                    1 => {
                        store.cancel(&p, &id).await.unwrap();
                    }
                    2 => {
                        store.confirm(&p, &id).await.unwrap();
                        store.refund(&p, &id).await.unwrap();
                    }
                    // Past its expiry: a sweeper or this confirm expires it, whichever comes first.
                    _ => {
                        wait_past(&store, &p, expires_at_ms).await;
                        assert_eq!(store.confirm(&p, &id).await.unwrap(), Transition::Refused(Expired));
                    }
                }
                id
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>();
    let ids = tokio::time::timeout(Duration::from_secs(60), buyers).await.expect("bounded");
    // The short ones: wait until every one is finished, by the sweepers or the confirms.
    let store = Arc::clone(&stores[0]);
    let settled = inventory_test_support::wait_until(Duration::from_secs(20), || {
        let (store, p) = (Arc::clone(&store), p.clone());
        async move { store.snapshot(&p).await.unwrap().reserved == 0 }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for s in sweepers {
        s.await.unwrap();
    }
    assert!(settled, "reservations left open");
    let events = all_events(&*store, &p).await;
    transitions(&events);
    let mut per_reservation: HashMap<&str, Vec<ReservationState>> = HashMap::new();
    for e in &events {
        per_reservation.entry(&e.reservation_id).or_default().push(e.state);
    }
    assert_eq!(per_reservation.len(), BUYERS);
    for id in &ids {
        let states = &per_reservation[id.as_str()];
        let final_state = store.reservation_state(&p, id).await.unwrap().unwrap();
        assert_eq!(states.last(), Some(&final_state), "{id}: {states:?}");
        assert_eq!(states[0], Reserved, "{id}: {states:?}");
        let expected_len = if final_state == Refunded { 3 } else { 2 };
        assert_eq!(states.len(), expected_len, "{id}: one event per transition, {states:?}");
    }
    let (available, reserved, sold) = counters(&*store, &p).await;
    assert_eq!((available + reserved + sold, reserved), (BUYERS as u64, 0), "units conserved");
}

/// Only the Redis store can lose part of a pool: a stale outbox left behind when the pool
/// hash went is dropped when the pool is created anew, and numbering starts at 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_pool_created_anew_numbers_its_events_from_one() {
    let redis = TestRedis::create().await;
    let store = RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap();
    let p = pool("sku-anew");
    store.refill(&p, "g1", 5, 0).await.unwrap();
    for i in 0..3 {
        reserve(&store, &p, &format!("u{i}"), 1).await;
    }
    let client = ::redis::Client::open(redis.url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let base = format!("{}{{app:sku-anew}}:", redis.prefix);
    for name in ["pool", "res", "idem", "held", "due", "grants"] {
        ::redis::cmd("DEL").arg(format!("{base}{name}")).query_async::<()>(&mut conn).await.unwrap();
    }
    store.refill(&p, "g1", 5, 0).await.unwrap();
    reserve(&store, &p, "after", 1).await;
    let page = store.events(&p, 0, 10).await.unwrap();
    assert_eq!(page.events.iter().map(|e| (e.sequence, e.user_id.as_str())).collect::<Vec<_>>(), [(1, "after")]);
}
