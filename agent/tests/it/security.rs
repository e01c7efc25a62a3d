//! The agent's gates: backend tokens, per-user rate limits under a flood, load shedding,
//! and hostile bytes at the edge.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use inventory_agent::security::UserLimits;
use inventory_agent::selling::AcquireRequest;
use inventory_agent::service::{parse_acquire, parse_basket};
use inventory_proto::v1 as pb;
use proptest::prelude::*;
use prost::Message;
use tonic::Code;

use crate::harness::{Center, LocalAgent, ObservedStore, StoreSpec, acquire_req, agent_config, stock};

const BACKEND: &str = "backend-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_token_is_required_and_refusals_touch_nothing() {
    let center = Center::start_sqlite().await;
    center.create_item("s", 10, 5, (2, 8, 5)).await;
    let mut cfg = agent_config(&center.url, "app", &StoreSpec::Memory);
    cfg.backend_tokens = Some(BACKEND.into());
    let agent = LocalAgent::start_with(cfg, None).await;
    let mut client = agent.client().await;
    let with = |token: &str| {
        let mut r = tonic::Request::new(acquire_req("s", "u", 1, "k"));
        r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        r
    };
    let none = client.acquire(acquire_req("s", "u", 1, "k")).await.unwrap_err();
    assert_eq!(none.code(), Code::Unauthenticated);
    assert!(none.message().contains("missing backend token"), "{none:?}");
    assert_eq!(client.acquire(with("backend-token-0123456780")).await.unwrap_err().code(), Code::Unauthenticated);
    assert!(agent.agent.items.is_empty(), "refused calls never reached the agent's logic");
    let ok = client.acquire(with(BACKEND)).await.unwrap().into_inner();
    assert_eq!(ok.outcome(), pb::AcquireOutcome::Reserved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_user_is_limited_while_others_are_served() {
    let center = Center::start_sqlite().await;
    center.create_item("f", 1_000, 1_000, (50, 200, 100)).await;
    let mut cfg = agent_config(&center.url, "app", &StoreSpec::Memory);
    cfg.user_rate_per_sec = 5;
    cfg.user_burst = 10;
    let agent = LocalAgent::start_with(cfg, None).await;
    let client = agent.client().await;

    // The flooder: 3,000 calls, 128 in flight at a time over 4 connections (bounded count).
    let mut connections = Vec::new();
    for _ in 0..4 {
        connections.push(agent.client().await);
    }
    let started = Instant::now();
    let flood = futures::stream::iter(0..3_000)
        .map(|i| {
            let mut c = connections[i % 4].clone();
            async move { c.acquire(acquire_req("f", "scalper", 1, &format!("flood-{i}"))).await }
        })
        .buffer_unordered(128)
        .collect::<Vec<_>>();
    // Meanwhile 50 ordinary buyers, one request each.
    let buyers = join_all((0..50).map(|i| {
        let mut c = client.clone();
        async move { c.acquire(acquire_req("f", &format!("buyer-{i}"), 1, &format!("buyer-{i}"))).await }
    }));
    let (flood, buyers) = tokio::join!(flood, buyers);
    let elapsed = started.elapsed();
    let rate = 3_000.0 / elapsed.as_secs_f64();
    let reserved =
        flood.iter().filter(|r| matches!(r, Ok(a) if a.get_ref().outcome() == pb::AcquireOutcome::Reserved)).count();
    let limited = flood.iter().filter(|r| matches!(r, Err(s) if s.code() == Code::ResourceExhausted)).count();
    eprintln!("flood: 3000 calls in {elapsed:?} ({rate:.0}/s): {reserved} reserved, {limited} rate-limited");
    let other: Vec<_> =
        flood.iter().filter_map(|r| r.as_ref().err()).filter(|s| s.code() != Code::ResourceExhausted).take(3).collect();
    assert_eq!(reserved + limited, 3_000, "every flood call was either served or limited; others: {other:?}");
    // Burst 10 plus 5/s for the flood's duration.
    let allowed = 10 + usize::try_from(5 * elapsed.as_millis() / 1_000).unwrap() + 2;
    assert!(reserved <= allowed, "{reserved} flood calls got through, at most {allowed} allowed");
    assert!(limited >= 3_000 - allowed);
    for (i, b) in buyers.iter().enumerate() {
        let b = b.as_ref().unwrap_or_else(|s| panic!("buyer {i} not served: {s:?}"));
        assert_eq!(b.get_ref().outcome(), pb::AcquireOutcome::Reserved, "buyer {i}");
    }
    assert_eq!(agent.agent.selling.rate_limited.load(Ordering::Relaxed), limited as u64);
    // The limiter tracks only recently active users.
    assert!(agent.agent.selling.limits.tracked() <= 51, "{} users tracked", agent.agent.selling.limits.tracked());
    let s = stock(&mut client.clone(), "f").await;
    assert_eq!(s.reserved, (reserved + 50) as u64);
}

#[test]
fn rate_limiter_memory_follows_the_active_users() {
    // 200,000 distinct users, then all idle: the state is dropped again.
    let limits = UserLimits::new(1_000, 1);
    let rss = || {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
    };
    let before = rss();
    for i in 0..200_000 {
        assert!(limits.allow(&format!("user-{i}")));
    }
    let tracked = limits.tracked();
    let during = rss();
    assert_eq!(tracked, 200_000);
    // At 1,000/s with burst 1 each user's allowance is full again after 1 ms.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(limits.forget_idle(), 0, "idle users are forgotten");
    eprintln!(
        "rate limiter: 200000 users tracked, resident memory grew by about {} bytes per user",
        during.saturating_sub(before) / 200_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_shed_at_once_instead_of_queueing() {
    let center = Center::start_sqlite().await;
    center.create_item("o", 100, 10, (5, 50, 20)).await;
    let store = Arc::new(ObservedStore::gated());
    let mut cfg = agent_config(&center.url, "app", &StoreSpec::Memory);
    cfg.max_concurrent_requests = 2;
    let agent = LocalAgent::start_with(cfg, Some(store.clone())).await;
    let client = agent.client().await;
    // Two calls occupy both slots (they wait inside the store).
    let stuck: Vec<_> = (0..2)
        .map(|i| {
            let mut c = client.clone();
            tokio::spawn(async move { c.acquire(acquire_req("o", &format!("u{i}"), 1, &format!("k{i}"))).await })
        })
        .collect();
    assert!(inventory_test_support::wait_until(Duration::from_secs(5), || async { store.acquire_calls() >= 2 }).await);
    let started = Instant::now();
    let shed = client.clone().acquire(acquire_req("o", "late", 1, "late")).await.unwrap_err();
    assert_eq!(shed.code(), Code::ResourceExhausted, "{shed:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "shed at once, not after a queue");
    store.open_gate();
    for s in stuck {
        let r = s.await.unwrap().expect("in-progress calls complete");
        assert_eq!(r.into_inner().outcome(), pb::AcquireOutcome::Reserved);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// Any bytes at the edge: decoding either fails or yields a request that parses into
    /// valid domain values or is refused naming a field. Nothing panics.
    #[test]
    fn raw_bytes_never_get_past_validation(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(req) = pb::AcquireRequest::decode(bytes.as_slice()) {
            match parse_acquire(&req) {
                Ok(AcquireRequest { item, user, quantity, idempotency_key, .. }) => {
                    prop_assert!(item.as_str().bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)));
                    prop_assert!(user.as_str().bytes().all(|b| (0x21..=0x7e).contains(&b)));
                    prop_assert!((1..=1_000_000_000).contains(&quantity));
                    prop_assert!(!idempotency_key.is_empty() && idempotency_key.len() <= 64);
                }
                Err(e) => {
                    let message = tonic::Status::from(e).message().to_owned();
                    prop_assert!(message.starts_with("invalid "), "{}", message);
                }
            }
        }
    }

    /// Structured hostile strings: every field refuses what it must.
    #[test]
    fn hostile_strings_are_refused_by_field(s in "\\PC{0,80}|[\\x00-\\x20'\";{}\\[\\]\\\\]{1,20}") {
        let req = pb::AcquireRequest { item_id: s.clone(), user_id: "u".into(), quantity: 1, idempotency_key: "k".into(), ..Default::default() };
        let valid = !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
        prop_assert_eq!(parse_acquire(&req).is_ok(), valid);
        let req = pb::AcquireRequest { item_id: "i".into(), user_id: s.clone(), quantity: 1, idempotency_key: "k".into(), ..Default::default() };
        let valid = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| (0x21..=0x7e).contains(&b));
        prop_assert_eq!(parse_acquire(&req).is_ok(), valid);
        // A basket's line item ids and user the same way, the field named by its line.
        let line = |item: &str| pb::BasketLine { item_id: item.into(), quantity: 1 };
        let b = pb::AcquireBasketRequest { user_id: "u".into(), idempotency_key: "k".into(), lines: vec![line("i"), line(&s)] };
        let item_valid = !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
        match parse_basket(&b) {
            Ok(_) => prop_assert!(item_valid),
            Err(e) => prop_assert!(!item_valid && e.to_string().contains("lines[1].item_id"), "{}", e),
        }
        let b = pb::AcquireBasketRequest { user_id: s.clone(), idempotency_key: "k".into(), lines: vec![line("i")] };
        prop_assert_eq!(parse_basket(&b).is_ok(), valid);
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawFirstField {
    #[prost(bytes = "vec", tag = "1")]
    first: Vec<u8>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_in_every_agent_rpc_are_refused_before_the_store() {
    let center = Center::start_sqlite().await;
    center.create_item("h", 10, 2, (2, 8, 5)).await;
    let store = Arc::new(ObservedStore::gated());
    store.open_gate();
    let agent = LocalAgent::start_with(agent_config(&center.url, "app", &StoreSpec::Memory), Some(store.clone())).await;
    let mut client = agent.client().await;
    let long = "x".repeat(10 * 1024);
    let hostile =
        ["", long.as_str(), "a\0b", "a b", "r'; DROP TABLE t; --", "k') redis.call('FLUSHALL') --", "{app:h}"];
    for v in hostile {
        let c = pb::ConfirmRequest { item_id: v.into(), reservation_id: "r".into() };
        assert_eq!(client.confirm(c).await.unwrap_err().code(), Code::InvalidArgument, "confirm item_id {v:?}");
        let c = pb::ConfirmRequest { item_id: "h".into(), reservation_id: v.into() };
        assert_eq!(client.confirm(c).await.unwrap_err().code(), Code::InvalidArgument, "confirm reservation_id {v:?}");
        let c = pb::CancelRequest { item_id: v.into(), reservation_id: "r".into() };
        assert_eq!(client.cancel(c).await.unwrap_err().code(), Code::InvalidArgument, "cancel item_id {v:?}");
        let c = pb::CancelRequest { item_id: "h".into(), reservation_id: v.into() };
        assert_eq!(client.cancel(c).await.unwrap_err().code(), Code::InvalidArgument, "cancel reservation_id {v:?}");
        let g = pb::GetStockRequest { item_id: v.into() };
        assert_eq!(client.get_stock(g).await.unwrap_err().code(), Code::InvalidArgument, "get_stock item_id {v:?}");
        for (field, req) in [("item_id", acquire_req(v, "u", 1, "k")), ("idempotency_key", acquire_req("h", "u", 1, v))]
        {
            let s = client.acquire(req).await.unwrap_err();
            assert_eq!(s.code(), Code::InvalidArgument, "acquire {field} {v:?}");
            assert!(s.message().contains(field), "{s:?}");
        }
        let invalid = |what: &str, field: &str, s: tonic::Status| {
            assert_eq!(s.code(), Code::InvalidArgument, "{what} {field} {v:?}: {s:?}");
            assert!(s.message().contains(field), "{what}: {s:?}");
        };
        let r = pb::RefundRequest { item_id: v.into(), reservation_id: "r".into() };
        invalid("refund", "item_id", client.refund(r).await.unwrap_err());
        let r = pb::RefundRequest { item_id: "h".into(), reservation_id: v.into() };
        invalid("refund", "reservation_id", client.refund(r).await.unwrap_err());
        let e = pb::ExtendRequest { item_id: v.into(), reservation_id: "r".into(), extend_ms: 1_000 };
        invalid("extend", "item_id", client.extend(e).await.unwrap_err());
        let e = pb::ExtendRequest { item_id: "h".into(), reservation_id: v.into(), extend_ms: 1_000 };
        invalid("extend", "reservation_id", client.extend(e).await.unwrap_err());
        let g = pb::GetReservationRequest { item_id: v.into(), reservation_id: "r".into(), idempotency_key: "".into() };
        invalid("get_reservation", "item_id", client.get_reservation(g).await.unwrap_err());
        let g = pb::GetReservationRequest { item_id: "h".into(), reservation_id: v.into(), idempotency_key: "".into() };
        invalid("get_reservation", "reservation_id", client.get_reservation(g).await.unwrap_err());
        let g = pb::GetReservationRequest { item_id: "h".into(), reservation_id: "".into(), idempotency_key: v.into() };
        let field = if v.is_empty() { "reservation_id" } else { "idempotency_key" };
        invalid("get_reservation", field, client.get_reservation(g).await.unwrap_err());
        let line = |item: &str| pb::BasketLine { item_id: item.into(), quantity: 1 };
        let b = pb::AcquireBasketRequest {
            user_id: "u".into(),
            idempotency_key: "k".into(),
            lines: vec![line("h"), line(v)],
        };
        invalid("acquire_basket", "lines[1].item_id", client.acquire_basket(b).await.unwrap_err());
        let b = pb::AcquireBasketRequest { user_id: "u".into(), idempotency_key: v.into(), lines: vec![line("h")] };
        invalid("acquire_basket", "idempotency_key", client.acquire_basket(b).await.unwrap_err());
        let c = pb::ConfirmBasketRequest { basket_id: v.into() };
        invalid("confirm_basket", "basket_id", client.confirm_basket(c).await.unwrap_err());
        let c = pb::CancelBasketRequest { basket_id: v.into() };
        invalid("cancel_basket", "basket_id", client.cancel_basket(c).await.unwrap_err());
        if !v.is_empty() {
            let s = pb::StreamEventsRequest { item_id: v.into(), from_sequence: 0 };
            invalid("stream_events", "item_id", client.stream_events(s).await.unwrap_err());
        }
    }
    // Out-of-range numbers and field combinations name what is wrong.
    for extend_ms in [0, 1_000_000_001, u64::MAX] {
        let e = pb::ExtendRequest { item_id: "h".into(), reservation_id: "r".into(), extend_ms };
        let s = client.extend(e).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("extend_ms") && s.message().contains(&extend_ms.to_string()), "{s:?}");
    }
    let both =
        pb::GetReservationRequest { item_id: "h".into(), reservation_id: "r".into(), idempotency_key: "k".into() };
    let s = client.get_reservation(both).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("reservation_id") && s.message().contains("idempotency_key"), "{s:?}");
    // allow_partial does not soften the checks on the other fields: an impossible
    // quantity or a hostile key is refused by name before the store.
    for (field, value, req) in [
        ("quantity", u64::MAX.to_string(), acquire_req("h", "u", u64::MAX, "k")),
        (
            "idempotency_key",
            "k') redis.call('FLUSHALL') --".to_owned(),
            acquire_req("h", "u", 2, "k') redis.call('FLUSHALL') --"),
        ),
    ] {
        let s = client.acquire(pb::AcquireRequest { allow_partial: true, ..req }).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "partial acquire {field} {value:?}: {s:?}");
        assert!(s.message().contains(field), "{s:?}");
    }
    // Baskets: no lines, too many, a quantity or a sum past the bound, named with the value.
    let lines = |n: usize, q: u64| (0..n).map(|_| pb::BasketLine { item_id: "h".into(), quantity: q }).collect();
    for (field, value, lines) in [
        ("lines", "[]", lines(0, 1)),
        ("lines", "33 lines", lines(33, 1)),
        ("lines[0].quantity", "18446744073709551615", lines(1, u64::MAX)),
        ("lines[1].quantity", "1000000000", lines(2, 1_000_000_000)),
    ] {
        let b = pb::AcquireBasketRequest { user_id: "u".into(), idempotency_key: "k".into(), lines };
        let s = client.acquire_basket(b).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "acquire_basket {field}: {s:?}");
        assert!(s.message().contains(field) && s.message().contains(value), "{s:?}");
    }
    // Invalid UTF-8 at the byte level, in the first string field of every Agent RPC.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", agent.addr)).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    for path in [
        "/inventory.v1.Agent/Acquire",
        "/inventory.v1.Agent/Confirm",
        "/inventory.v1.Agent/Cancel",
        "/inventory.v1.Agent/GetStock",
        "/inventory.v1.Agent/Refund",
        "/inventory.v1.Agent/GetReservation",
        "/inventory.v1.Agent/Extend",
        "/inventory.v1.Agent/AcquireBasket",
        "/inventory.v1.Agent/ConfirmBasket",
        "/inventory.v1.Agent/CancelBasket",
    ] {
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<RawFirstField, RawFirstField>::default();
        let raw = RawFirstField { first: vec![0xc3, 0x28] };
        let s = grpc
            .unary(tonic::Request::new(raw), tonic::codegen::http::uri::PathAndQuery::from_static(path), codec)
            .await
            .expect_err(path);
        assert_eq!(s.code(), Code::InvalidArgument, "{path}: {s:?}");
    }
    assert_eq!(store.acquire_calls(), 0, "no hostile request reached the store");
    let calls = store.calls();
    for op in ["refund", "extend", "reservation", "events", "basket", "put_basket"] {
        assert_eq!(calls.get(op), None, "no hostile {op} reached the store");
    }
    assert!(agent.agent.items.is_empty());
}

/// A token the center binds to another channel is a configuration error, not an outage:
/// the agent says so and stops at start-up instead of retrying as if the center were down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_token_the_center_refuses_stops_at_start_up_and_says_why() {
    let center =
        crate::harness::Center::start(crate::harness::Db::Lite(inventory_test_support::TestSqlite::create()), |c| {
            c.insecure = false;
            c.operator_token = Some("operator-token-0123456789".into());
            c.agent_tokens = Some("web:web-token-0123456789".into());
        })
        .await;
    let mut cfg = crate::harness::agent_config(&center.url, "app", &crate::harness::StoreSpec::Memory);
    cfg.center_token = Some("web-token-0123456789".into());
    let err = match inventory_agent::Application::build(cfg).await {
        Ok(_) => panic!("an agent the center refuses must not start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("refuses this agent's credentials"), "{err}");
}

/// A flood of random item ids costs the center a bounded number of lookups, not one per
/// request; an item created after it was asked for becomes sellable soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_item_ids_makes_a_bounded_number_of_center_lookups() {
    let center = crate::harness::Center::start_sqlite().await;
    let mut cfg = crate::harness::agent_config(&center.url, "app", &crate::harness::StoreSpec::Memory);
    let per_sec = 100;
    cfg.item_lookups_per_sec = per_sec;
    let agent = crate::harness::LocalAgent::start_with(cfg, None).await;
    let mut client = agent.client().await;
    let flood = 1_000;
    let started = std::time::Instant::now();
    let codes: Vec<Code> = futures::stream::iter(0..flood)
        .map(|i| {
            let mut client = client.clone();
            async move {
                client.acquire(acquire_req(&format!("nosuch-{i}"), "u", 1, &format!("k{i}"))).await.unwrap_err().code()
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let refused = codes.iter().filter(|c| **c == Code::Unavailable).count();
    assert!(codes.iter().all(|c| matches!(c, Code::NotFound | Code::Unavailable)), "{codes:?}");
    let lookups = agent.agent.items.lookups_made();
    // The budget: a burst of one second's worth, then refills at that rate.
    let budget = u64::from(per_sec) * (2 + elapsed.as_secs());
    assert!(lookups <= budget, "{lookups} center lookups for {flood} unknown ids in {elapsed:?} (budget {budget})");
    assert_eq!(agent.agent.items.lookups_refused(), u64::try_from(refused).unwrap());
    if elapsed.as_secs() == 0 {
        assert!(refused > 0, "a flood within a second never reached the bound");
    }

    // A buyer asks for an item before it exists; it is created; it sells soon after.
    let early = client.acquire(acquire_req("late-item", "u", 1, "late-1")).await.unwrap_err().code();
    assert!(matches!(early, Code::NotFound | Code::Unavailable), "{early:?}");
    center.create_item("late-item", 5, 1, (1, 4, 2)).await;
    let sellable = inventory_test_support::wait_until(std::time::Duration::from_secs(5), || {
        let mut client = client.clone();
        async move {
            client
                .acquire(acquire_req("late-item", "u", 1, "late-1"))
                .await
                .is_ok_and(|r| r.into_inner().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(sellable, "a newly created item never became sellable");
}
