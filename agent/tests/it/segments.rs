//! Segmented pools: Acquires routed by user to a segment, reservation ids naming their
//! segment, moves between segments when the routed one is empty and the center is dry, and
//! a process killed between a move's take and its refill.

use std::time::Duration;

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{PoolKey, PoolStore};
use inventory_core::segments::route;
use inventory_proto::v1 as pb;
use inventory_test_support::{TestRedis, free_port, wait_until};

use crate::harness::{AgentProcess, Center, LocalAgent, StoreSpec, acquire_req, http_get, sample, stock};

pub(crate) const ITEM: &str = "hot";
pub(crate) const TOTAL: u64 = 16;
pub(crate) const SEGMENTS: u32 = 4;
/// The segment the tests empty.
pub(crate) const TARGET: u32 = 2;

/// An item of 16 units in 4 segments whose first batch takes the whole total, so the
/// center is dry once the agent stocked (4 units in each segment).
pub(crate) async fn segmented_item(center: &Center) {
    center.create_segmented_item(ITEM, TOTAL, 1, (8, 32, TOTAL), SEGMENTS).await;
}

/// Users whose Acquires go to `segment`.
pub(crate) fn users_of(segment: u32) -> impl Iterator<Item = String> {
    (0..).map(|i| format!("user-{i}")).filter(move |u| route(u, SEGMENTS) == segment)
}

pub(crate) async fn stocked(
    client: &mut pb::agent_client::AgentClient<tonic::transport::Channel>,
) -> pb::GetStockResponse {
    let ok = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move { stock(&mut client, ITEM).await.available == TOTAL }
    })
    .await;
    assert!(ok, "the agent never stocked the whole total");
    stock(client, ITEM).await
}

async fn an_empty_segment_takes_stock_from_its_siblings(store: StoreSpec) {
    let center = Center::start_postgres().await;
    segmented_item(&center).await;
    let agent = LocalAgent::start(&center.url, "app", &store).await;
    let mut client = agent.client().await;
    // Nothing is sold before stock arrives: one Acquire makes the agent load the item.
    let _ = client.get_stock(pb::GetStockRequest { item_id: ITEM.into() }).await;
    let s = stocked(&mut client).await;
    assert_eq!(s.segments.len(), SEGMENTS as usize);
    assert!(s.segments.iter().all(|g| g.available == TOTAL / u64::from(SEGMENTS)), "{s:?}");
    assert_eq!(center.ledger(ITEM).await.item.unwrap().available, 0, "the center is dry");

    let mut users = users_of(TARGET);
    let mut ids = Vec::new();
    for _ in 0..4 {
        let u = users.next().unwrap();
        let r = client.acquire(acquire_req(ITEM, &u, 1, &u)).await.unwrap().into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
        assert!(r.reservation_id.starts_with(&format!("s{TARGET}.")), "{}", r.reservation_id);
        ids.push(r.reservation_id);
    }
    assert_eq!(stock(&mut client, ITEM).await.segments[TARGET as usize].available, 0);
    // The target segment is empty, its siblings hold 12, the center none: the next buyer
    // of that segment is served by a move.
    let u = users.next().unwrap();
    let r = client.acquire(acquire_req(ITEM, &u, 1, &u)).await.unwrap().into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "a move instead of SOLD_OUT");
    let s = stock(&mut client, ITEM).await;
    assert_eq!((s.available, s.reserved), (TOTAL - 5, 5));
    assert_eq!(s.segments.iter().map(|g| g.available + g.reserved + g.sold).sum::<u64>(), TOTAL);
    let metrics = http_get(agent.http_addr, "/metrics").await;
    assert!(sample(&metrics, r#"inventory_agent_segment_moves_total{channel="app"}"#) >= Some(1.0), "{metrics}");
    let per_segment = metrics.lines().filter(|l| l.starts_with("inventory_agent_segment_available_units{")).count();
    assert_eq!(per_segment, SEGMENTS as usize, "{metrics}");

    // The per-user limit lives in the user's segment.
    let again = client.acquire(acquire_req(ITEM, &u, 1, "second-key")).await.unwrap().into_inner();
    assert_eq!(again.outcome(), pb::AcquireOutcome::LimitExceeded);
    // Calls by reservation id find the segment by the id's prefix; by key, by asking.
    let c = pb::ConfirmRequest { item_id: ITEM.into(), reservation_id: ids[0].clone() };
    assert_eq!(client.confirm(c).await.unwrap().into_inner().state(), pb::ReservationState::Confirmed);
    let by_key = pb::GetReservationRequest { item_id: ITEM.into(), idempotency_key: u.clone(), ..Default::default() };
    let found = client.get_reservation(by_key).await.unwrap().into_inner().reservation.unwrap();
    assert_eq!(found.reservation_id, r.reservation_id);
    let c = pb::CancelRequest { item_id: ITEM.into(), reservation_id: format!("s{SEGMENTS}.nope") };
    assert_eq!(client.cancel(c).await.unwrap_err().code(), tonic::Code::NotFound);

    // Buyers of the one segment buy everything: each unit once, then SOLD_OUT.
    let mut reserved = 5;
    loop {
        let u = users.next().unwrap();
        let r = client.acquire(acquire_req(ITEM, &u, 1, &u)).await.unwrap().into_inner();
        match r.outcome() {
            pb::AcquireOutcome::Reserved => reserved += 1,
            pb::AcquireOutcome::SoldOut => break,
            other => panic!("unexpected {other:?}"),
        }
        assert!(reserved <= TOTAL, "oversold");
    }
    assert_eq!(reserved, TOTAL);
    let s = stock(&mut client, ITEM).await;
    assert_eq!((s.available, s.reserved + s.sold), (0, TOTAL));
    assert!(s.segments.iter().all(|g| g.available == 0), "{s:?}");
    let r = center.await_quiescence().await;
    assert!(r.ok && r.violations.is_empty(), "{r:?}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_an_empty_segment_takes_stock_from_its_siblings() {
    an_empty_segment_takes_stock_from_its_siblings(StoreSpec::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_empty_segment_takes_stock_from_its_siblings() {
    let redis = TestRedis::create().await;
    an_empty_segment_takes_stock_from_its_siblings(StoreSpec::Redis {
        url: redis.url.clone(),
        prefix: redis.prefix.clone(),
    })
    .await;
}

/// Units in every segment of the item, by a store of the test's own.
async fn units_in_segments(store: &RedisPoolStore) -> u64 {
    let mut sum = 0;
    for s in 0..SEGMENTS {
        let snap = store.snapshot(&PoolKey::segment("app", ITEM, s)).await.unwrap();
        sum += snap.available + snap.reserved + snap.sold;
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_a_moves_take_and_refill_loses_and_doubles_nothing() {
    let center = Center::start_postgres().await;
    segmented_item(&center).await;
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let port = free_port();
    let mut agent =
        AgentProcess::spawn_with(&center.url, "app", &spec, Some(port), "app-proc", &["--test-abort-after-move-take"])
            .await;
    let mut client = agent.client().await;
    let _ = client.get_stock(pb::GetStockRequest { item_id: ITEM.into() }).await;
    stocked(&mut client).await;
    let mut users = users_of(TARGET);
    let mut sold = std::collections::HashMap::new();
    for _ in 0..4 {
        let u = users.next().unwrap();
        let r = client.acquire(acquire_req(ITEM, &u, 1, &u)).await.unwrap().into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
        sold.insert(u, r.reservation_id);
    }
    // The next buyer of the empty segment starts a move: the process dies after its take.
    let crasher = users.next().unwrap();
    assert!(client.acquire(acquire_req(ITEM, &crasher, 1, &crasher)).await.is_err(), "the agent died mid-move");
    let _ = agent.child.wait().await;
    let store = RedisPoolStore::new(&redis.url, &redis.prefix).await.unwrap();
    let pending = store.pending_moves(&PoolKey::new("app", ITEM)).await.unwrap();
    assert_eq!(pending.len(), 1, "the move's intent outlived the process");
    let in_flight = TOTAL - units_in_segments(&store).await;
    assert!(in_flight > 0, "the take happened: its units are in no segment");

    // The restarted agent finishes the move before it resyncs: the units are whole again.
    let mut agent = AgentProcess::spawn(&center.url, "app", &spec, Some(port)).await;
    let mut client = agent.client().await;
    let _ = client.get_stock(pb::GetStockRequest { item_id: ITEM.into() }).await;
    let whole = wait_until(Duration::from_secs(20), || {
        let store = &store;
        async move {
            store.pending_moves(&PoolKey::new("app", ITEM)).await.unwrap().is_empty()
                && units_in_segments(store).await == TOTAL
        }
    })
    .await;
    assert!(whole, "the interrupted move was not finished (units in segments: {})", units_in_segments(&store).await);

    // The crasher's replay and every other buyer: each unit sold exactly once.
    let r = client.acquire(acquire_req(ITEM, &crasher, 1, &crasher)).await.unwrap().into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    sold.insert(crasher, r.reservation_id);
    let mut others = (0..).map(|i| format!("other-{i}"));
    while (sold.len() as u64) < TOTAL + 1 {
        let u = others.next().unwrap();
        let r = client.acquire(acquire_req(ITEM, &u, 1, &u)).await.unwrap().into_inner();
        match r.outcome() {
            pb::AcquireOutcome::Reserved => {
                sold.insert(u, r.reservation_id);
            }
            pb::AcquireOutcome::SoldOut => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(sold.len() as u64, TOTAL, "every unit sold once, none twice");
    let s = stock(&mut client, ITEM).await;
    assert_eq!((s.available, s.reserved + s.sold), (0, TOTAL));
    let r = center.await_quiescence().await;
    assert!(r.ok && r.violations.is_empty(), "{r:?}");
    assert_eq!(center.ledger(ITEM).await.item.unwrap().available, 0);
    agent.kill9().await;
}
