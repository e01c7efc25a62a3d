//! A small sale (on the memory store, and on Redis), consumed through the Agent's `StreamEvents`: every
//! transition (reserved, confirmed, cancelled, expired, refunded) arrives once, numbered
//! without gaps, each reservation's last event is its final state, and a stream resumed
//! from the middle carries on where asked. Also Refund, GetReservation and Extend at the
//! edge.

use std::collections::HashMap;
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TestRedis, wait_until};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, stock};

const TTL_MS: u64 = 2_000;
const NEXT: Duration = Duration::from_secs(10);

async fn next(stream: &mut Streaming<pb::ReservationEvent>) -> pb::ReservationEvent {
    tokio::time::timeout(NEXT, stream.message()).await.expect("an event within 10 s").expect("stream ok").expect("open")
}

async fn reserve(client: &mut AgentClient<Channel>, user: &str) -> String {
    let r = client.acquire(acquire_req("skin", user, 1, &format!("key-{user}"))).await.unwrap().into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "{user}");
    r.reservation_id
}

async fn get(client: &mut AgentClient<Channel>, id: &str) -> pb::Reservation {
    let req =
        pb::GetReservationRequest { item_id: "skin".into(), reservation_id: id.into(), idempotency_key: "".into() };
    client.get_reservation(req).await.unwrap().into_inner().reservation.expect("reservation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_on_the_memory_store_through_the_event_stream() {
    sale_through_the_event_stream(&StoreSpec::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_on_redis_through_the_event_stream() {
    let redis = TestRedis::create().await;
    sale_through_the_event_stream(&StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() }).await;
}

async fn sale_through_the_event_stream(store: &StoreSpec) {
    use pb::ReservationState::{Cancelled, Confirmed, Expired, Refunded, Reserved, Unspecified};
    let center = Center::start_sqlite().await;
    let admin_item = pb::CreateItemRequest {
        item_id: "skin".into(),
        total: 20,
        per_user_limit: 1,
        reservation_ttl_ms: TTL_MS,
        watermarks: Some(pb::Watermarks { low: 2, high: 15, batch: 10 }),
        rate_batching: None,
        segments: 1,
        ..Default::default()
    };
    center.admin().await.create_item(admin_item).await.unwrap();
    let agent = LocalAgent::start(&center.url, "app", store).await;
    let mut client = agent.client().await;
    // Every item, before the agent knows any: the stream picks the item up once loaded.
    let mut all = client.stream_events(pb::StreamEventsRequest::default()).await.unwrap().into_inner();

    let users = ["pay1", "pay2", "cancel1", "cancel2", "late1", "late2", "refund1", "refund2"];
    let mut ids = HashMap::new();
    for u in users {
        ids.insert(u, reserve(&mut client, u).await);
    }
    // A replay answers the same reservation and writes no event.
    assert_eq!(reserve(&mut client, "pay1").await, ids["pay1"]);
    // A payment in flight: pushed out, bounded by the TTL.
    let ext = pb::ExtendRequest { item_id: "skin".into(), reservation_id: ids["pay1"].clone(), extend_ms: 3_600_000 };
    let ext = client.extend(ext).await.unwrap().into_inner();
    assert_eq!(ext.state(), Reserved);
    assert!(ext.expires_at_unix_ms >= get(&mut client, &ids["pay1"]).await.expires_at_unix_ms);
    for u in ["pay1", "pay2", "refund1", "refund2"] {
        let c = pb::ConfirmRequest { item_id: "skin".into(), reservation_id: ids[u].clone() };
        assert_eq!(client.confirm(c).await.unwrap().into_inner().state(), Confirmed);
    }
    for u in ["cancel1", "cancel2"] {
        let c = pb::CancelRequest { item_id: "skin".into(), reservation_id: ids[u].clone() };
        assert_eq!(client.cancel(c).await.unwrap().into_inner().state(), Cancelled);
    }
    let refused = client.refund(pb::RefundRequest { item_id: "skin".into(), reservation_id: ids["late1"].clone() });
    let refused = refused.await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    for u in ["refund1", "refund2"] {
        let r = pb::RefundRequest { item_id: "skin".into(), reservation_id: ids[u].clone() };
        assert_eq!(client.refund(r.clone()).await.unwrap().into_inner().state(), Refunded);
        assert_eq!(client.refund(r).await.unwrap().into_inner().state(), Refunded, "idempotent");
    }
    // The late ones expire through the agent's sweeper.
    for u in ["late1", "late2"] {
        let id = ids[u].clone();
        let expired = wait_until(Duration::from_secs(10), || {
            let (mut client, id) = (client.clone(), id.clone());
            async move { get(&mut client, &id).await.state() == Expired }
        })
        .await;
        assert!(expired, "{u} never expired");
        let e = pb::ExtendRequest { item_id: "skin".into(), reservation_id: ids[u].clone(), extend_ms: 1_000 };
        assert_eq!(client.extend(e).await.unwrap_err().code(), Code::FailedPrecondition);
    }

    // 8 reserved, 4 confirmed, 2 cancelled, 2 expired, 2 refunded.
    const TRANSITIONS: usize = 18;
    let mut events = Vec::new();
    for _ in 0..TRANSITIONS {
        events.push(next(&mut all).await);
    }
    let s = stock(&mut client, "skin").await;
    assert_eq!(s.last_event_sequence, TRANSITIONS as u64);
    assert_eq!((s.reserved, s.sold), (0, 2), "2 paid and kept, 2 refunded");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.sequence, i as u64 + 1, "no gaps");
        assert_eq!((e.channel.as_str(), e.item_id.as_str(), e.segment), ("app", "skin", 0));
        assert_eq!(e.pool_generation, s.pool_generation);
        assert_eq!(e.event_id, format!("app:skin:0:{}:{}", s.pool_generation, e.sequence));
        assert_eq!(e.quantity, 1);
        assert_eq!(e.idempotency_key, format!("key-{}", e.user_id));
    }
    let mut last: HashMap<&str, &pb::ReservationEvent> = HashMap::new();
    for e in &events {
        if let Some(prev) = last.get(e.reservation_id.as_str()) {
            assert_eq!(e.previous_state(), prev.state(), "{e:?} follows {prev:?}");
        } else {
            assert_eq!((e.state(), e.previous_state()), (Reserved, Unspecified), "{e:?} is the first");
        }
        last.insert(&e.reservation_id, e);
    }
    let expected = [
        ("pay1", Confirmed),
        ("pay2", Confirmed),
        ("cancel1", Cancelled),
        ("cancel2", Cancelled),
        ("late1", Expired),
        ("late2", Expired),
        ("refund1", Refunded),
        ("refund2", Refunded),
    ];
    for (u, state) in expected {
        assert_eq!(last[ids[u].as_str()].state(), state, "{u}'s last event");
        assert_eq!(get(&mut client, &ids[u]).await.state(), state, "{u}'s final state");
    }
    // Exactly one event per transition: nothing more comes.
    assert!(tokio::time::timeout(Duration::from_millis(500), all.message()).await.is_err(), "an event too many");

    // Resumed from the middle, for this item only.
    let from = pb::StreamEventsRequest { from_sequence: 10, item_id: "skin".into() };
    let mut resumed = client.stream_events(from).await.unwrap().into_inner();
    for expected in &events[9..] {
        assert_eq!(&next(&mut resumed).await, expected);
    }
    // By idempotency key too, with the pool's generation.
    let by_key = pb::GetReservationRequest {
        item_id: "skin".into(),
        reservation_id: "".into(),
        idempotency_key: "key-refund1".into(),
    };
    let r = client.get_reservation(by_key).await.unwrap().into_inner().reservation.unwrap();
    assert_eq!(
        (r.reservation_id.as_str(), r.state(), r.pool_generation),
        (ids["refund1"].as_str(), Refunded, s.pool_generation)
    );
    let unknown =
        pb::GetReservationRequest { item_id: "skin".into(), reservation_id: "nope".into(), idempotency_key: "".into() };
    assert_eq!(client.get_reservation(unknown).await.unwrap_err().code(), Code::NotFound);

    // A graceful stop ends the open streams (they would otherwise hold the server up).
    tokio::time::timeout(Duration::from_secs(30), agent.stop()).await.expect("the agent stops with streams open");
    let ended = tokio::time::timeout(NEXT, all.message()).await.expect("the stream ends");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
}

/// A follower replica (sharing the leader's Redis) streams the events the leader's sales
/// write: streams only read the shared outbox, and a poll picks up what another replica wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_replica_streams_what_the_leader_sells() {
    let center = Center::start_sqlite().await;
    center.create_item("skin", 20, 1, (2, 15, 10)).await;
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let mut leader_cfg = crate::harness::agent_config(&center.url, "app", &spec);
    leader_cfg.agent_id = Some("app-1".into());
    let leader = LocalAgent::start_with(leader_cfg, None).await;
    let mut follower_cfg = crate::harness::agent_config(&center.url, "app", &spec);
    follower_cfg.agent_id = Some("app-2".into());
    let follower = LocalAgent::start_with(follower_cfg, None).await;
    assert!(leader.agent.is_leading() && !follower.agent.is_leading());

    let mut from_follower = follower.client().await;
    let req = pb::StreamEventsRequest { from_sequence: 0, item_id: "skin".into() };
    let mut stream = from_follower.stream_events(req).await.unwrap().into_inner();
    let mut client = leader.client().await;
    let id = reserve(&mut client, "ann").await;
    let c = pb::ConfirmRequest { item_id: "skin".into(), reservation_id: id.clone() };
    client.confirm(c).await.unwrap();
    let first = next(&mut stream).await;
    let second = next(&mut stream).await;
    assert_eq!(
        (first.sequence, first.state(), first.reservation_id.as_str()),
        (1, pb::ReservationState::Reserved, id.as_str())
    );
    assert_eq!((second.sequence, second.state()), (2, pb::ReservationState::Confirmed));
    // The follower answers lookups from the shared pool too.
    assert_eq!(get(&mut from_follower, &id).await.state(), pb::ReservationState::Confirmed);
    follower.stop().await;
    leader.stop().await;
}

/// The server cuts unary calls off after 10 s; an event stream is no call in progress and
/// outlives that deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_outlives_the_servers_call_timeout() {
    let center = Center::start_sqlite().await;
    center.create_item("skin", 20, 1, (2, 15, 10)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    let req = pb::StreamEventsRequest { from_sequence: 0, item_id: "skin".into() };
    let mut stream = client.stream_events(req).await.unwrap().into_inner();
    // Nothing to wait for but time itself: the deadline is the server's clock.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let id = reserve(&mut client, "ann").await;
    let e = next(&mut stream).await;
    assert_eq!((e.sequence, e.reservation_id.as_str()), (1, id.as_str()));
}

/// Past the outbox bound the oldest events are gone: a stream from the start begins at the
/// oldest kept one, and its sequence shows the gap; the sale itself never failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_from_below_the_oldest_kept_event_starts_there() {
    let center = Center::start_sqlite().await;
    center.create_item("skin", 20, 1, (2, 15, 10)).await;
    let mut cfg = crate::harness::agent_config(&center.url, "app", &StoreSpec::Memory);
    cfg.outbox_max_events = 3;
    let agent = LocalAgent::start_with(cfg, None).await;
    let mut client = agent.client().await;
    for u in ["a", "b", "c", "d", "e"] {
        reserve(&mut client, u).await;
    }
    let req = pb::StreamEventsRequest { from_sequence: 1, item_id: "skin".into() };
    let mut stream = client.stream_events(req).await.unwrap().into_inner();
    for expected in [3, 4, 5] {
        assert_eq!(next(&mut stream).await.sequence, expected);
    }
}

/// An idle stream costs the store a bounded rate of reads: the backstop poll, every
/// 200 ms for one pool, and nothing in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_reads_the_store_at_the_backstop_rate() {
    let center = Center::start_sqlite().await;
    center.create_item("skin", 20, 1, (2, 15, 10)).await;
    let store = std::sync::Arc::new(crate::harness::ObservedStore::counting());
    let cfg = crate::harness::agent_config(&center.url, "app", &StoreSpec::Memory);
    let agent = LocalAgent::start_with(cfg, Some(store.clone())).await;
    let mut client = agent.client().await;
    reserve(&mut client, "ann").await;
    let mut stream = client.stream_events(pb::StreamEventsRequest::default()).await.unwrap().into_inner();
    next(&mut stream).await;
    let reads = || store.calls().get("events").copied().unwrap_or(0);
    let before = reads();
    // A rate: nothing to await but the window itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let polled = reads() - before;
    assert!((5..=15).contains(&polled), "{polled} reads of one idle pool in 2 s (a poll every 200 ms)");
}
