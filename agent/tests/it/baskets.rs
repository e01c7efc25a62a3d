//! End to end on the Redis store: AcquireBasket reserves every line or none (lines of one
//! item summed), replays answer the first answer, ConfirmBasket/CancelBasket act on every
//! line, and a crash between two lines leaves nothing held after the sweeper's bound.

use std::collections::HashMap;
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TestRedis, free_port, wait_until};
use tonic::transport::Channel;

use crate::harness::{AgentProcess, Center, LocalAgent, StoreSpec, agent_config, http_get, retryable, sample, stock};

fn redis_store(redis: &TestRedis) -> StoreSpec {
    StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() }
}

fn basket(user: &str, key: &str, lines: &[(&str, u64)]) -> pb::AcquireBasketRequest {
    pb::AcquireBasketRequest {
        user_id: user.into(),
        idempotency_key: key.into(),
        lines: lines.iter().map(|(item, q)| pb::BasketLine { item_id: (*item).into(), quantity: *q }).collect(),
    }
}

/// The basket's answer, retried with the same key while the agent says to (UNAVAILABLE).
async fn acquire_settled(
    client: &mut AgentClient<Channel>,
    req: &pb::AcquireBasketRequest,
) -> pb::AcquireBasketResponse {
    for _ in 0..100 {
        match client.acquire_basket(req.clone()).await {
            Ok(r) => return r.into_inner(),
            Err(s) if retryable(s.code()) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => panic!("basket {}: {s}", req.idempotency_key),
        }
    }
    panic!("basket {} never settled", req.idempotency_key)
}

async fn reserved_units(client: &mut AgentClient<Channel>, item: &str) -> u64 {
    stock(client, item).await.reserved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lines_of_one_item_over_the_stock_are_refused_and_hold_nothing() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    // 3 units in all, a limit of 10 per user: each line (2) alone would fit.
    center.create_item("console", 3, 10, (1, 3, 3)).await;
    center.create_item("pad", 100, 10, (5, 50, 20)).await;
    let agent = LocalAgent::start(&center.url, "app", &redis_store(&redis)).await;
    let mut client = agent.client().await;

    let over = acquire_settled(&mut client, &basket("u1", "k1", &[("pad", 1), ("console", 2), ("console", 2)])).await;
    assert_eq!(over.outcome(), pb::AcquireOutcome::SoldOut, "{over:?}");
    assert_eq!(over.short_item_id, "console");
    assert!(over.reservations.is_empty() && over.basket_id.is_empty(), "{over:?}");
    assert_eq!(reserved_units(&mut client, "console").await, 0);
    assert_eq!(reserved_units(&mut client, "pad").await, 0, "the line reserved before the short one was undone");
    // A replay of a basket that reserved nothing is evaluated again (as an Acquire's is).
    let again = acquire_settled(&mut client, &basket("u1", "k1", &[("pad", 1), ("console", 2), ("console", 2)])).await;
    assert_eq!(
        (again.outcome(), again.short_item_id.as_str(), again.replayed),
        (pb::AcquireOutcome::SoldOut, "console", false)
    );
    assert_eq!(reserved_units(&mut client, "pad").await, 0);

    // 2 + 1 fits: one reservation of 3 for both console lines, listed per line in order.
    let ok = acquire_settled(&mut client, &basket("u1", "k2", &[("console", 2), ("pad", 1), ("console", 1)])).await;
    assert_eq!(ok.outcome(), pb::AcquireOutcome::Reserved, "{ok:?}");
    let items: Vec<_> = ok.reservations.iter().map(|r| (r.item_id.as_str(), r.quantity)).collect();
    assert_eq!(items, [("console", 3), ("pad", 1), ("console", 3)]);
    assert_eq!(ok.reservations[0].reservation_id, ok.reservations[2].reservation_id);
    assert_eq!(reserved_units(&mut client, "console").await, 3);

    // Over the per-user limit in sum: never servable, refused before anything is recorded.
    let err = client.acquire_basket(basket("u2", "k3", &[("pad", 6), ("pad", 5)])).await.expect_err("over the limit");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("lines[1].quantity") && err.message().contains("sum to 11"), "{}", err.message());

    let metrics = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&metrics, r#"inventory_agent_baskets_reserved_total{channel="app"}"#), Some(1.0), "{metrics}");
    assert_eq!(sample(&metrics, r#"inventory_agent_baskets_failed_total{channel="app"}"#), Some(2.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_and_cancel_act_on_every_line_and_replay() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    for item in ["a", "b"] {
        center.create_item(item, 100, 5, (5, 50, 20)).await;
    }
    let agent = LocalAgent::start(&center.url, "app", &redis_store(&redis)).await;
    let mut client = agent.client().await;

    let req = basket("u1", "buy-1", &[("a", 1), ("b", 2)]);
    let first = acquire_settled(&mut client, &req).await;
    assert_eq!((first.outcome(), first.replayed), (pb::AcquireOutcome::Reserved, false), "{first:?}");
    let again = acquire_settled(&mut client, &req).await;
    assert_eq!(again, pb::AcquireBasketResponse { replayed: true, ..first.clone() });
    // The same key for other lines, or another user, is another payload.
    for other in [basket("u1", "buy-1", &[("a", 1), ("b", 1)]), basket("u2", "buy-1", &[("a", 1), ("b", 2)])] {
        let e = client.acquire_basket(other).await.expect_err("key reused");
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    }

    // The same new basket sent five times at once: the first to record the intent drives
    // it, the others wait for it and answer the same reservations.
    let req3 = basket("u3", "buy-3", &[("b", 1), ("a", 1)]);
    let same = futures::future::join_all((0..5).map(|_| {
        let (mut client, req) = (client.clone(), req3.clone());
        async move { acquire_settled(&mut client, &req).await }
    }))
    .await;
    assert_eq!(same.iter().filter(|r| !r.replayed).count(), 1, "{same:?}");
    for r in &same {
        assert_eq!(*r, pb::AcquireBasketResponse { replayed: r.replayed, ..same[0].clone() });
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    }
    assert_eq!((reserved_units(&mut client, "a").await, reserved_units(&mut client, "b").await), (2, 3));
    client.cancel_basket(pb::CancelBasketRequest { basket_id: same[0].basket_id.clone() }).await.expect("cancel");

    let id = first.basket_id.clone();
    for _ in 0..2 {
        let r = client.confirm_basket(pb::ConfirmBasketRequest { basket_id: id.clone() }).await.expect("confirm");
        assert_eq!(r.into_inner().state, pb::ReservationState::Confirmed as i32, "idempotent");
    }
    let e = client.cancel_basket(pb::CancelBasketRequest { basket_id: id.clone() }).await.expect_err("confirmed");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let (sa, sb) = (stock(&mut client, "a").await, stock(&mut client, "b").await);
    assert_eq!((sa.sold, sa.reserved, sb.sold, sb.reserved), (1, 0, 2, 0));
    // A replay of a confirmed basket's key still answers its reservations.
    assert_eq!(acquire_settled(&mut client, &req).await, again);

    let second = acquire_settled(&mut client, &basket("u2", "buy-2", &[("b", 1), ("a", 1)])).await;
    assert_eq!(second.outcome(), pb::AcquireOutcome::Reserved);
    assert_eq!((reserved_units(&mut client, "a").await, reserved_units(&mut client, "b").await), (1, 1));
    for _ in 0..2 {
        let r = client
            .cancel_basket(pb::CancelBasketRequest { basket_id: second.basket_id.clone() })
            .await
            .expect("cancel");
        assert_eq!(r.into_inner().state, pb::ReservationState::Cancelled as i32, "idempotent");
    }
    assert_eq!((reserved_units(&mut client, "a").await, reserved_units(&mut client, "b").await), (0, 0));
    let e = client
        .confirm_basket(pb::ConfirmBasketRequest { basket_id: second.basket_id.clone() })
        .await
        .expect_err("cancelled");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    for line in &second.reservations {
        let r = client
            .get_reservation(pb::GetReservationRequest {
                item_id: line.item_id.clone(),
                reservation_id: line.reservation_id.clone(),
                ..Default::default()
            })
            .await
            .expect("line's reservation")
            .into_inner();
        assert_eq!(r.reservation.unwrap().state, pb::ReservationState::Cancelled as i32);
    }

    let unknown = "0123456789abcdef0123456789abcdef".to_owned();
    let e = client.confirm_basket(pb::ConfirmBasketRequest { basket_id: unknown.clone() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = client.cancel_basket(pb::CancelBasketRequest { basket_id: unknown }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = client.cancel_basket(pb::CancelBasketRequest { basket_id: "bad id".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("basket_id"), "{}", e.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_baskets_of_scarce_items_are_all_or_nothing() {
    const USERS: usize = 120;
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    center.create_item("x", 40, 1, (5, 20, 10)).await;
    center.create_item("y", 25, 1, (5, 20, 10)).await;
    let mut config = agent_config(&center.url, "app", &redis_store(&redis));
    // The lines of one basket may wait for Borrows here; the bound is not what is tested.
    config.basket_pending_ms = 30_000;
    let agent = LocalAgent::start_with(config, None).await;
    let client = agent.client().await;

    let mut tasks = Vec::new();
    for u in 0..USERS {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            // Half order the lines the other way round: baskets cross.
            let lines: &[(&str, u64)] = if u % 2 == 0 { &[("x", 1), ("y", 1)] } else { &[("y", 1), ("x", 1)] };
            let req = basket(&format!("user-{u}"), &format!("key-{u}"), lines);
            let first = acquire_settled(&mut client, &req).await;
            let replay = acquire_settled(&mut client, &req).await;
            (first, replay)
        }));
    }
    let mut reserved = 0u64;
    let mut lines: HashMap<String, u64> = HashMap::new();
    for t in tasks {
        let (first, replay) = t.await.expect("buyer task");
        match first.outcome() {
            pb::AcquireOutcome::Reserved => {
                reserved += 1;
                assert_eq!(first.reservations.len(), 2, "{first:?}");
                for r in &first.reservations {
                    *lines.entry(r.item_id.clone()).or_default() += r.quantity;
                }
                assert_eq!(replay, pb::AcquireBasketResponse { replayed: true, ..first.clone() }, "the first answer");
            }
            pb::AcquireOutcome::SoldOut => {
                assert!(first.reservations.is_empty() && !first.short_item_id.is_empty(), "{first:?}");
                // Evaluated again: still nothing, or (stock came back) a whole basket.
                assert!(replay.outcome() != pb::AcquireOutcome::Reserved || replay.reservations.len() == 2);
                if replay.outcome() == pb::AcquireOutcome::Reserved {
                    reserved += 1;
                    for r in &replay.reservations {
                        *lines.entry(r.item_id.clone()).or_default() += r.quantity;
                    }
                }
            }
            other => panic!("unexpected outcome {other:?}: {first:?}"),
        }
    }
    assert!(reserved > 0 && reserved <= 25, "{reserved} baskets reserved of 25 y");
    let mut c = client.clone();
    let (sx, sy) = (stock(&mut c, "x").await, stock(&mut c, "y").await);
    // Every unit held belongs to a reserved basket: no failed basket left a line behind.
    assert_eq!((sx.reserved, sy.reserved), (reserved, reserved), "x {sx:?} y {sy:?}");
    assert_eq!((lines.get("x").copied(), lines.get("y").copied()), (Some(reserved), Some(reserved)));
    assert!(sx.reserved + sx.sold <= 40 && sy.reserved + sy.sold <= 25, "no oversell");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_two_lines_is_undone_after_the_bound_and_replays_agree() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    for item in ["a", "b"] {
        center.create_item(item, 100, 5, (5, 50, 20)).await;
    }
    let store = redis_store(&redis);
    let flags = ["--miss-wait-ms", "500", "--basket-pending-ms", "1000"];
    let mut fault = flags.to_vec();
    fault.extend(["--test-abort-between-basket-lines", "victim"]);
    let mut app = AgentProcess::spawn_with(&center.url, "app", &store, None, "app-b", &fault).await;
    let mut client = app.client().await;
    // Stock both pools first (a basket of another user is not aborted).
    let warm = acquire_settled(&mut client, &basket("warm", "warm-1", &[("a", 1), ("b", 1)])).await;
    assert_eq!(warm.outcome(), pb::AcquireOutcome::Reserved);

    let req = basket("victim", "v-1", &[("a", 2), ("b", 1)]);
    let died = client.acquire_basket(req.clone()).await.expect_err("the agent aborts between the lines");
    assert!(retryable(died.code()), "{died:?}");
    let status = app.child.wait().await.expect("reap");
    assert!(!status.success(), "the fault point aborts the process: {status:?}");

    let http: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let http_flag = http.to_string();
    let mut restart = flags.to_vec();
    restart.extend(["--http-listen", &http_flag]);
    let app = AgentProcess::spawn_with(&center.url, "app", &store, None, "app-b", &restart).await;
    let mut client = app.client().await;
    // The first line outlived its driver; the restarted agent's sweeper undoes it after
    // the bound (the victim's 2 units of a: only the warm basket's 1 stays).
    let undone = wait_until(Duration::from_secs(30), || {
        let mut client = client.clone();
        async move { reserved_units(&mut client, "a").await == 1 && reserved_units(&mut client, "b").await == 1 }
    })
    .await;
    assert!(undone, "a line of the interrupted basket stayed reserved: a {:?}", stock(&mut client, "a").await);

    // Replays of the crashed key: evaluated again once, then that answer every time.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(acquire_settled(&mut client, &req).await);
    }
    assert_eq!(answers[0].outcome(), pb::AcquireOutcome::Reserved, "{answers:?}");
    for a in &answers[1..] {
        assert_eq!(*a, pb::AcquireBasketResponse { replayed: true, ..answers[0].clone() });
    }
    // Held: the warm basket and the replayed one, nothing else.
    assert_eq!((reserved_units(&mut client, "a").await, reserved_units(&mut client, "b").await), (3, 2));
    let metrics = http_get(http, "/metrics").await;
    assert_eq!(sample(&metrics, r#"inventory_agent_baskets_compensated_total{channel="app"}"#), Some(1.0), "{metrics}");
    drop(app);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_basket_with_an_expired_line_is_not_confirmed_and_can_be_cancelled() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    center.create_item("long", 100, 5, (5, 50, 20)).await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: "short".into(),
            total: 100,
            per_user_limit: 5,
            reservation_ttl_ms: 200,
            watermarks: Some(pb::Watermarks { low: 5, high: 50, batch: 20 }),
            ..Default::default()
        })
        .await
        .expect("create item");
    let agent = LocalAgent::start(&center.url, "app", &redis_store(&redis)).await;
    let mut client = agent.client().await;
    let b = acquire_settled(&mut client, &basket("u1", "e-1", &[("long", 1), ("short", 1)])).await;
    assert_eq!(b.outcome(), pb::AcquireOutcome::Reserved, "{b:?}");
    let short = b.reservations[1].clone();
    let expired = wait_until(Duration::from_secs(10), || {
        let (mut client, id) = (client.clone(), short.reservation_id.clone());
        async move {
            let g = pb::GetReservationRequest { item_id: "short".into(), reservation_id: id, ..Default::default() };
            let r = client.get_reservation(g).await.expect("lookup").into_inner().reservation.unwrap();
            r.state == pb::ReservationState::Expired as i32
        }
    })
    .await;
    assert!(expired, "the short line never expired");

    let e = client
        .confirm_basket(pb::ConfirmBasketRequest { basket_id: b.basket_id.clone() })
        .await
        .expect_err("a line expired");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("item short") && e.message().contains("expired"), "{}", e.message());
    let long = stock(&mut client, "long").await;
    assert_eq!((long.reserved, long.sold), (1, 0), "nothing was confirmed");
    // The basket can still be cancelled: the live line is released, the expired one counts.
    let r = client.cancel_basket(pb::CancelBasketRequest { basket_id: b.basket_id.clone() }).await.expect("cancel");
    assert_eq!(r.into_inner().state, pb::ReservationState::Cancelled as i32);
    assert_eq!(reserved_units(&mut client, "long").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undone_line_of_a_global_item_frees_the_users_allowance() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: "g".into(),
            total: 10,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 2, high: 10, batch: 5 }),
            limit_scope: pb::LimitScope::Global.into(),
            ..Default::default()
        })
        .await
        .expect("create item");
    center.create_item("scarce", 1, 5, (1, 2, 1)).await;
    let mut config = agent_config(&center.url, "app", &redis_store(&redis));
    config.buyer_registry_url = Some(redis.url.clone());
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;
    let taken = acquire_settled(&mut client, &basket("other", "o-1", &[("scarce", 1)])).await;
    assert_eq!(taken.outcome(), pb::AcquireOutcome::Reserved);

    // The global line reserves (claiming the user's allowance), the scarce one is short:
    // the global line is undone and its claim released.
    let short = acquire_settled(&mut client, &basket("u1", "g-1", &[("g", 1), ("scarce", 1)])).await;
    assert_eq!((short.outcome(), short.short_item_id.as_str()), (pb::AcquireOutcome::SoldOut, "scarce"));
    assert_eq!(reserved_units(&mut client, "g").await, 0);
    let ok = acquire_settled(&mut client, &basket("u1", "g-2", &[("g", 1)])).await;
    assert_eq!(ok.outcome(), pb::AcquireOutcome::Reserved, "the allowance was freed: {ok:?}");
    let over = acquire_settled(&mut client, &basket("u1", "g-3", &[("g", 1)])).await;
    assert_eq!(
        (over.outcome(), over.short_item_id.as_str(), over.limit_remaining),
        (pb::AcquireOutcome::LimitExceeded, "g", 0)
    );
}
