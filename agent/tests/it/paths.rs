//! The agent's edge and hot-path behaviour against a real center (SQLite ledger).

use std::sync::Arc;
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::wait_until;
use tonic::Code;

use crate::harness::{Center, LocalAgent, ObservedStore, StoreSpec, acquire_req, agent_config, stock};

async fn counting_agent(center: &Center, channel: &str) -> (LocalAgent, Arc<ObservedStore>) {
    let store = Arc::new(ObservedStore::counting());
    let agent =
        LocalAgent::start_with(agent_config(&center.url, channel, &StoreSpec::Memory), Some(store.clone())).await;
    (agent, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sold_out_fast_path_answers_from_memory_until_restock() {
    let center = Center::start_sqlite().await;
    center.create_item("skin", 10, 10, (2, 8, 5)).await;
    let (agent, store) = counting_agent(&center, "app").await;
    let mut client = agent.client().await;
    let mut reserved = 0;
    let mut n = 0;
    while reserved < 10 {
        let r = client.acquire(acquire_req("skin", &format!("u{n}"), 1, &format!("k{n}"))).await.unwrap().into_inner();
        if r.outcome() == pb::AcquireOutcome::Reserved {
            reserved += 1;
        }
        n += 1;
        assert!(n < 1_000, "never sold the 10 units");
    }
    // Sold out everywhere: the next miss switches the fast path on.
    let r = client.acquire(acquire_req("skin", "late", 1, "late-0")).await.unwrap().into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::SoldOut);
    let item = Arc::clone(&agent.agent.items.get("skin").unwrap());
    assert!(wait_until(Duration::from_secs(5), || async { item.fast_sold_out("fresh") == Some(true) }).await);

    let before = store.acquire_calls();
    for i in 0..50 {
        let r = client.acquire(acquire_req("skin", &format!("late{i}"), 1, &format!("late-k{i}"))).await.unwrap();
        assert_eq!(r.into_inner().outcome(), pb::AcquireOutcome::SoldOut);
    }
    assert_eq!(store.acquire_calls(), before, "sold-out answers must not touch the store");

    // A replay of a key that reserved still gets its reservation.
    let replay = client.acquire(acquire_req("skin", "u0", 1, "k0")).await.unwrap().into_inner();
    assert_eq!(replay.outcome(), pb::AcquireOutcome::Reserved);
    assert!(replay.replayed);
    assert_eq!(store.acquire_calls(), before + 1);

    // A restock turns the fast path off and sales resume.
    center
        .admin()
        .await
        .add_stock(pb::AddStockRequest { item_id: "skin".into(), quantity: 5, request_id: "restock-1".into() })
        .await
        .unwrap();
    let mut i = 0;
    let sold_again = wait_until(Duration::from_secs(5), || {
        i += 1;
        let mut client = client.clone();
        let key = format!("after-{i}");
        async move {
            let r = client.acquire(acquire_req("skin", &key, 1, &key)).await.unwrap().into_inner();
            r.outcome() == pb::AcquireOutcome::Reserved
        }
    })
    .await;
    assert!(sold_again, "restock never reached the agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_argument_and_never_reaches_the_store() {
    let center = Center::start_sqlite().await;
    center.create_item("skin", 10, 2, (2, 8, 5)).await;
    let (agent, store) = counting_agent(&center, "app").await;
    let mut client = agent.client().await;
    let long = "x".repeat(10_000);
    let cases = [
        (acquire_req("bad item", "u", 1, "k"), "invalid item_id"),
        (acquire_req("", "u", 1, "k"), "invalid item_id \"\""),
        (acquire_req("skin", "has space", 1, "k"), "invalid user_id"),
        (acquire_req("skin", "", 1, "k"), "invalid user_id"),
        (acquire_req("skin", &long, 1, "k"), "invalid user_id"),
        (acquire_req("skin", "u\u{0}", 1, "k"), "invalid user_id"),
        (acquire_req("skin", "u", 1, ""), "invalid idempotency_key"),
        (acquire_req("skin", "u", 1, "k'; redis.call('flushall') --"), "invalid idempotency_key"),
        (acquire_req("skin", "u", u64::MAX, "k"), "invalid quantity 18446744073709551615"),
        (acquire_req("skin", "u", 3, "k"), "must be at most the per-user limit 2 of item skin"),
    ];
    for (req, needle) in cases {
        let status = client.acquire(req).await.expect_err("rejected");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(needle), "{:?} should contain {needle:?}", status.message());
    }
    let missing = client.acquire(acquire_req("nope", "u", 1, "k")).await.expect_err("unknown item");
    assert_eq!(missing.code(), Code::NotFound);
    assert!(missing.message().contains("nope"));
    let confirm = client.confirm(pb::ConfirmRequest { item_id: "skin".into(), reservation_id: "r r".into() }).await;
    assert_eq!(confirm.unwrap_err().code(), Code::InvalidArgument);
    let unknown = client.confirm(pb::ConfirmRequest { item_id: "skin".into(), reservation_id: "r1".into() }).await;
    assert_eq!(unknown.unwrap_err().code(), Code::NotFound);
    assert_eq!(store.acquire_calls(), 0, "no bad request reached the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_confirm_cancel_and_expire_through_the_agent() {
    let center = Center::start_sqlite().await;
    let mut admin = center.admin().await;
    admin
        .create_item(pb::CreateItemRequest {
            item_id: "t".into(),
            total: 5,
            per_user_limit: 1,
            reservation_ttl_ms: 200,
            watermarks: Some(pb::Watermarks { low: 1, high: 4, batch: 5 }),
            ..Default::default()
        })
        .await
        .unwrap();
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    let confirm = |id: &str| pb::ConfirmRequest { item_id: "t".into(), reservation_id: id.into() };
    let cancel = |id: &str| pb::CancelRequest { item_id: "t".into(), reservation_id: id.into() };

    let a = client.acquire(acquire_req("t", "alice", 1, "ka")).await.unwrap().into_inner();
    assert_eq!(a.outcome(), pb::AcquireOutcome::Reserved);
    let r = client.confirm(confirm(&a.reservation_id)).await.unwrap().into_inner();
    assert_eq!(r.state(), pb::ReservationState::Confirmed);
    let r = client.confirm(confirm(&a.reservation_id)).await.unwrap().into_inner();
    assert_eq!(r.state(), pb::ReservationState::Confirmed, "confirm is idempotent");
    let refused = client.cancel(cancel(&a.reservation_id)).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    // Alice holds her limit; a second purchase is refused as a business outcome.
    let again = client.acquire(acquire_req("t", "alice", 1, "ka2")).await.unwrap().into_inner();
    assert_eq!(again.outcome(), pb::AcquireOutcome::LimitExceeded);

    let b = client.acquire(acquire_req("t", "bob", 1, "kb")).await.unwrap().into_inner();
    let r = client.cancel(cancel(&b.reservation_id)).await.unwrap().into_inner();
    assert_eq!(r.state(), pb::ReservationState::Cancelled);
    assert_eq!(client.confirm(confirm(&b.reservation_id)).await.unwrap_err().code(), Code::FailedPrecondition);

    // Carol's reservation expires (200 ms); the sweeper puts the unit back and a late
    // payment is refused.
    let c = client.acquire(acquire_req("t", "carol", 1, "kc")).await.unwrap().into_inner();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let mut client = client.clone();
            async move { stock(&mut client, "t").await.reserved == 0 }
        })
        .await,
        "reservation never expired"
    );
    let late = client.confirm(confirm(&c.reservation_id)).await.unwrap_err();
    assert_eq!(late.code(), Code::FailedPrecondition);
    assert!(late.message().contains("expired"), "{late:?}");
    let s = stock(&mut client, "t").await;
    assert_eq!((s.reserved, s.sold), (0, 1));
    // Her allowance is free again.
    let c2 = client.acquire(acquire_req("t", "carol", 1, "kc2")).await.unwrap().into_inner();
    assert_eq!(c2.outcome(), pb::AcquireOutcome::Reserved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raised_low_watermark_makes_the_agent_borrow_within_a_second() {
    let center = Center::start_sqlite().await;
    center.create_item("w", 1_000, 1, (5, 20, 10)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    client.acquire(acquire_req("w", "u", 1, "k")).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let mut client = client.clone();
            async move { stock(&mut client, "w").await.available >= 5 }
        })
        .await
    );
    center
        .admin()
        .await
        .set_watermarks(pb::SetWatermarksRequest {
            item_id: "w".into(),
            channel: "app".into(),
            low: 100,
            high: 300,
            batch: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let reached = wait_until(Duration::from_secs(1), || {
        let mut client = client.clone();
        async move { stock(&mut client, "w").await.available >= 100 }
    })
    .await;
    assert!(reached, "agent did not act on the new low watermark within 1 s");
    assert!(started.elapsed() <= Duration::from_secs(1));
    assert_eq!(agent.agent.items.get("w").unwrap().policy().watermarks.low, 100);
}

/// A watch that fell further behind than the center keeps events for ends, and the agent
/// watches again and re-reads its items' settings: a watermark change lost among the
/// events the watch missed still reaches the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watermark_change_a_lagging_watch_missed_still_reaches_the_agent() {
    let center = Center::start_sqlite().await;
    center.create_item("w", 1_000, 1, (5, 20, 10)).await;
    center.create_item("other", 1_000, 1, (5, 20, 10)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    client.acquire(acquire_req("w", "u", 1, "k")).await.unwrap();
    let mut admin = center.admin().await;
    let watermarks = |low: u64| pb::SetWatermarksRequest {
        item_id: "w".into(),
        channel: "app".into(),
        low,
        high: 300,
        batch: 10,
        ..Default::default()
    };
    let low = || agent.agent.items.get("w").unwrap().policy().watermarks.low;
    // The agent's watch is open: a change reaches it.
    admin.set_watermarks(watermarks(6)).await.unwrap();
    assert!(wait_until(Duration::from_secs(10), || async { low() == 6 }).await, "the first change never arrived");

    // The watch stalls; the change goes out among more events than the center keeps.
    center.faults.stall_watches.send_replace(true);
    let restock = |n: usize| pb::AddStockRequest { item_id: "other".into(), quantity: 1, request_id: format!("r-{n}") };
    for n in 0..5 {
        admin.add_stock(restock(n)).await.unwrap();
    }
    admin.set_watermarks(watermarks(100)).await.unwrap();
    for n in 5..inventory_center::events::CAPACITY + 10 {
        admin.add_stock(restock(n)).await.unwrap();
    }
    assert_eq!(low(), 6, "the change arrived while the watch was stalled");
    center.faults.stall_watches.send_replace(false);
    let arrived = wait_until(Duration::from_secs(10), || async { low() == 100 }).await;
    assert!(arrived, "the change the lagging watch missed never reached the agent (low {})", low());
}

/// Unknown item ids are answered NOT_FOUND (the agent remembers the center's answer for a
/// short while instead of asking it again for each call), and an item created afterwards
/// sells once that memory runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_unknown_to_the_center_is_not_found_until_it_is_created() {
    let center = Center::start_sqlite().await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let client = agent.client().await;
    let answers = futures::future::join_all((0..200).map(|n| {
        let mut c = client.clone();
        async move { c.acquire(acquire_req("later", &format!("u{n}"), 1, &format!("k{n}"))).await }
    }))
    .await;
    for a in answers {
        assert_eq!(a.expect_err("unknown item").code(), Code::NotFound);
    }
    center.create_item("later", 5, 1, (1, 4, 2)).await;
    let sells = wait_until(Duration::from_secs(10), || {
        let mut c = client.clone();
        async move {
            matches!(c.acquire(acquire_req("later", "first", 1, "kf")).await,
                Ok(r) if r.get_ref().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(sells, "the item never sold after it was created");
}

/// An agent that cannot bind its port stops before it registers: the center is left with
/// no ghost channel, and the error names the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_bind_leaves_no_channel_at_the_center() {
    let center = Center::start_sqlite().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut cfg = agent_config(&center.url, "ghost", &StoreSpec::Memory);
    cfg.listen = addr;
    let err = match inventory_agent::Application::build(cfg).await {
        Ok(_) => panic!("an agent on a taken port must not start"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&addr.to_string()), "{err}");
    let channels =
        center.admin().await.list_channels(pb::ListChannelsRequest::default()).await.unwrap().into_inner().channels;
    assert!(channels.is_empty(), "registered before failing: {channels:?}");
}

/// A LIMIT_EXCEEDED answer says how many units the user may still take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_exceeded_says_how_many_units_the_user_may_still_take() {
    let center = Center::start_sqlite().await;
    center.create_item("lim", 100, 3, (5, 40, 20)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    let first = client.acquire(acquire_req("lim", "dora", 2, "d1")).await.unwrap().into_inner();
    assert_eq!(first.outcome(), pb::AcquireOutcome::Reserved);
    let more = client.acquire(acquire_req("lim", "dora", 2, "d2")).await.unwrap().into_inner();
    assert_eq!(more.outcome(), pb::AcquireOutcome::LimitExceeded);
    assert_eq!(more.limit_remaining, 1, "limit 3, holding 2");
    let one = client.acquire(acquire_req("lim", "dora", 1, "d3")).await.unwrap().into_inner();
    assert_eq!(one.outcome(), pb::AcquireOutcome::Reserved);
    let none = client.acquire(acquire_req("lim", "dora", 1, "d4")).await.unwrap().into_inner();
    assert_eq!((none.outcome(), none.limit_remaining), (pb::AcquireOutcome::LimitExceeded, 0));
}
