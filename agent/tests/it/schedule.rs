//! Scheduled sales at the agent, on the memory store and on Redis: before the opening (by
//! the center's clock) Acquire answers NOT_STARTED from memory, with no store call, no
//! center call and nothing reserved, even on an agent whose clock runs 2 s ahead; the
//! item sells once open; a schedule moved before the opening moves the agents; at
//! closes_at the item closes by itself (or by an operator's CloseItem), its unsold units
//! return to the center and reservations made before still confirm.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inventory_agent::store::PoolStore;
use inventory_agent::store::redis::RedisPoolStore;
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TestRedis, wait_until};
use tonic::transport::Channel;

use crate::harness::{Center, LocalAgent, ObservedStore, StoreSpec, acquire_req, agent_config, stock};

const ITEM: &str = "launch";
const TTL_MS: u64 = 300_000;

fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

#[derive(Clone, Copy)]
enum Kind {
    Memory,
    Redis,
}

/// A counted store of `kind`, and what keeps its Redis keys apart.
async fn counted(kind: Kind) -> (StoreSpec, Arc<ObservedStore>, Option<TestRedis>) {
    match kind {
        Kind::Memory => (StoreSpec::Memory, Arc::new(ObservedStore::counting()), None),
        Kind::Redis => {
            let redis = TestRedis::create().await;
            let inner: Arc<dyn PoolStore> =
                Arc::new(RedisPoolStore::new(&redis.url, &redis.prefix).await.expect("redis"));
            let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
            (spec, Arc::new(ObservedStore::over(inner)), Some(redis))
        }
    }
}

async fn start_agent(center: &Center, kind: Kind, skew_ms: i64) -> (LocalAgent, Arc<ObservedStore>, Option<TestRedis>) {
    let (spec, store, redis) = counted(kind).await;
    let mut config = agent_config(&center.url, "app", &spec);
    config.test_clock_skew_ms = skew_ms;
    let agent = LocalAgent::start_with(config, Some(Arc::clone(&store) as Arc<dyn PoolStore>)).await;
    (agent, store, redis)
}

async fn create(center: &Center, opens_at: i64, closes_at: i64, lead_ms: u64) {
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 100,
            per_user_limit: 2,
            reservation_ttl_ms: TTL_MS,
            opens_at_unix_ms: opens_at,
            closes_at_unix_ms: closes_at,
            prestock_lead_ms: lead_ms,
            ..Default::default()
        })
        .await
        .expect("create item");
}

async fn buy(client: &mut AgentClient<Channel>, user: &str, key: &str) -> pb::AcquireResponse {
    client.acquire(acquire_req(ITEM, user, 1, key)).await.unwrap_or_else(|s| panic!("{key}: {s:?}")).into_inner()
}

/// When a reservation was made, by the store's clock (this machine's).
fn reserved_at(r: &pb::AcquireResponse) -> i64 {
    r.expires_at_unix_ms - i64::try_from(TTL_MS).unwrap()
}

/// Buys until one reserves (each call by a new user, 20 ms apart), at most `within`;
/// every answer before is NOT_STARTED. Returns the reserving answer and how many waited.
async fn buy_once_open(client: &mut AgentClient<Channel>, tag: &str, within: Duration) -> (pb::AcquireResponse, usize) {
    let deadline = tokio::time::Instant::now() + within;
    for n in 0.. {
        let r = buy(client, &format!("{tag}-u{n}"), &format!("{tag}-k{n}")).await;
        match r.outcome() {
            pb::AcquireOutcome::Reserved => return (r, n),
            pb::AcquireOutcome::NotStarted => {}
            other => panic!("{tag}: answer {n} was {other:?} before the opening"),
        }
        assert!(tokio::time::Instant::now() < deadline, "{tag}: never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!()
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Kind::Memory).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Kind::Redis).await;
                }
            )*
        }
    };
}

on_both_stores!(
    before_the_opening_acquire_answers_not_started_from_memory_then_sells,
    an_agent_clock_two_seconds_ahead_sells_nothing_early,
    rescheduling_before_the_opening_moves_the_agent_and_closes_at_stops_it,
    closes_at_closes_the_item_returns_unsold_units_and_confirmations_still_work,
    close_item_returns_unsold_units_as_closes_at_does,
    the_reserve_is_borrowed_only_once_the_shelf_runs_dry,
    pools_are_stocked_for_the_opening_during_the_lead_and_the_reserve_stays_at_the_center,
    an_item_scheduled_while_the_event_stream_was_down_is_stocked_before_its_opening,
);

async fn before_the_opening_acquire_answers_not_started_from_memory_then_sells(kind: Kind) {
    let center = Center::start_postgres().await;
    let (agent, store, _redis) = start_agent(&center, kind, 0).await;
    let mut client = agent.client().await;
    // Created while the agent runs: it hears of it (WatchChannel) and loads it at once.
    let opens_at = now_ms() + 6_000;
    create(&center, opens_at, 0, 500).await;
    let loaded = wait_until(Duration::from_secs(10), || async { agent.agent.items.get(ITEM).is_some() }).await;
    assert!(loaded, "the agent loaded the scheduled item before any buyer asked");
    let lookups = agent.agent.items.lookups_made();
    let center_calls = (agent.agent.link.borrow_calls(), agent.agent.link.borrow_many_calls());

    let mut answers = Vec::new();
    for n in 0..50 {
        answers.push(buy(&mut client, &format!("early-{n}"), &format!("early-k{n}")).await);
    }
    // Read before the lead starts (the pool may stock from then on).
    let view = center.ledger(ITEM).await;
    let s = stock(&mut client, ITEM).await;
    assert!(now_ms() < opens_at - 500, "the burst ran before the opening and its lead (test too slow)");
    for a in &answers {
        assert_eq!(
            (a.outcome(), a.opens_at_unix_ms, a.reservation_id.as_str()),
            (pb::AcquireOutcome::NotStarted, opens_at, "")
        );
    }
    // From memory: not one Acquire reached the store, no item lookup, no Borrow; the
    // pool and the center are as they were.
    assert_eq!(store.acquire_calls(), 0, "{:?}", store.calls());
    assert_eq!(agent.agent.items.lookups_made(), lookups, "no DescribeItem on the buyer's path");
    assert_eq!((agent.agent.link.borrow_calls(), agent.agent.link.borrow_many_calls()), center_calls);
    assert_eq!((s.available, s.reserved, s.sold, s.not_started, s.opens_at_unix_ms), (0, 0, 0, true, opens_at));
    assert_eq!(view.item.as_ref().unwrap().available, 100, "nothing left the center: {view:?}");
    assert!(view.channels.iter().all(|c| c.granted == 0), "{view:?}");
    // A basket line of the item waits too, naming it.
    let basket = client
        .acquire_basket(pb::AcquireBasketRequest {
            user_id: "basket-user".into(),
            idempotency_key: "basket-k".into(),
            lines: vec![pb::BasketLine { item_id: ITEM.into(), quantity: 1 }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (basket.outcome(), basket.short_item_id.as_str(), basket.opens_at_unix_ms),
        (pb::AcquireOutcome::NotStarted, ITEM, opens_at)
    );

    // Once open it sells, never before the opening.
    let (first, waited) = buy_once_open(&mut client, "open", Duration::from_secs(15)).await;
    assert!(reserved_at(&first) >= opens_at, "reserved at {} before the opening {opens_at}", reserved_at(&first));
    assert!(waited > 0, "the first tries came before the opening");
    assert!(!stock(&mut client, ITEM).await.not_started);
    let metrics = crate::harness::http_get(agent.http_addr, "/metrics").await;
    let not_started =
        crate::harness::sample(&metrics, r#"inventory_agent_acquires_total{channel="app",outcome="not_started"}"#);
    assert!(not_started.is_some_and(|n| n >= 50.0), "{not_started:?}");
}

async fn an_agent_clock_two_seconds_ahead_sells_nothing_early(kind: Kind) {
    let center = Center::start_postgres().await;
    // Created before the agent starts: its registration lists it.
    let opens_at = now_ms() + 4_000;
    create(&center, opens_at, 0, 500).await;
    let (agent, store, _redis) = start_agent(&center, kind, 2_000).await;
    assert!(agent.agent.items.get(ITEM).is_some(), "loaded at registration");
    let clock = agent.agent.link.center_clock().expect("the center's clock measured");
    assert!(clock.offset_ms <= -2_000 + 50 && clock.offset_ms >= -2_000 - 1_000, "offset {clock:?}");
    let mut client = agent.client().await;
    // Until the opening every answer is NOT_STARTED, also in the two seconds in which this
    // agent's own clock says the sale is open.
    let mut late_refusals = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    let first = loop {
        n += 1;
        let sent = now_ms();
        let r = buy(&mut client, &format!("u{n}"), &format!("k{n}")).await;
        match r.outcome() {
            pb::AcquireOutcome::NotStarted => {
                if sent > opens_at - 1_900 {
                    late_refusals += 1;
                }
            }
            pb::AcquireOutcome::Reserved => break r,
            other => panic!("answer {n}: {other:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(reserved_at(&first) >= opens_at, "sold at {} before the opening {opens_at}", reserved_at(&first));
    assert!(late_refusals > 10, "the skewed agent was asked while its own clock said open: {late_refusals}");
    let s = stock(&mut client, ITEM).await;
    assert!(s.reserved >= 1 && !s.not_started);
    assert!(store.acquire_calls() >= 1);
}

async fn rescheduling_before_the_opening_moves_the_agent_and_closes_at_stops_it(kind: Kind) {
    let center = Center::start_postgres().await;
    let (agent, _store, _redis) = start_agent(&center, kind, 0).await;
    let mut client = agent.client().await;
    let far = now_ms() + 3_600_000;
    create(&center, far, 0, 500).await;
    let first = buy(&mut client, "u0", "k0").await;
    assert_eq!((first.outcome(), first.opens_at_unix_ms), (pb::AcquireOutcome::NotStarted, far));

    // Moved earlier: the agent hears of it and sells from the new opening on.
    let mut admin = center.admin().await;
    let opens_at = now_ms() + 2_000;
    let set = |opens, closes| pb::SetScheduleRequest {
        item_id: ITEM.into(),
        opens_at_unix_ms: opens,
        closes_at_unix_ms: closes,
    };
    admin.set_schedule(set(opens_at, 0)).await.unwrap();
    let moved = wait_until(Duration::from_secs(5), || {
        let mut client = client.clone();
        async move { buy(&mut client, "u1", "k1").await.opens_at_unix_ms == opens_at }
    })
    .await;
    assert!(moved, "the agent answers with the new opening");
    let (r, _) = buy_once_open(&mut client, "moved", Duration::from_secs(15)).await;
    assert!(reserved_at(&r) >= opens_at && reserved_at(&r) < far);

    // After the opening the opening stays; the end moves, and the agent stops at it.
    let refused = admin.set_schedule(set(far, 0)).await.expect_err("the opening is past");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    let closes_at = now_ms() + 1_500;
    admin.set_schedule(set(0, closes_at)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    loop {
        n += 1;
        let sent = now_ms();
        let r = buy(&mut client, &format!("c{n}"), &format!("ck{n}")).await;
        match r.outcome() {
            pb::AcquireOutcome::Reserved => {
                assert!(reserved_at(&r) < closes_at, "sold at {} after closes_at {closes_at}", reserved_at(&r));
            }
            pb::AcquireOutcome::SoldOut => {
                // Closed by the latest the center's clock may read: early by at most the
                // round trip of the agent's last measurement of it.
                let rtt = agent.agent.link.center_clock().expect("measured").round_trip_ms;
                assert!(
                    sent >= closes_at - rtt - 50,
                    "closed early: asked at {sent}, closes at {closes_at}, rtt {rtt}"
                );
                break;
            }
            other => panic!("{other:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn closes_at_closes_the_item_returns_unsold_units_and_confirmations_still_work(kind: Kind) {
    let center = Center::start_postgres().await;
    let (agent, _store, _redis) = start_agent(&center, kind, 0).await;
    let mut client = agent.client().await;
    let closes_at = now_ms() + 3_000;
    create(&center, 0, closes_at, 0).await;
    let mut held = Vec::new();
    for n in 0..3 {
        let r = buy(&mut client, &format!("u{n}"), &format!("k{n}")).await;
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "open at once");
        held.push(r.reservation_id);
    }
    let before = center.ledger(ITEM).await;
    assert!(before.channels[0].held > 3, "the pool holds more than it sold: {before:?}");

    // At closes_at: closed at the agent (buyers until then still reserve, never after)...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    loop {
        n += 1;
        let r = buy(&mut client, &format!("p{n}"), &format!("pk{n}")).await;
        match r.outcome() {
            pb::AcquireOutcome::Reserved => {
                assert!(reserved_at(&r) < closes_at, "sold at {} after closes_at {closes_at}", reserved_at(&r));
                held.push(r.reservation_id);
            }
            pb::AcquireOutcome::SoldOut => break,
            other => panic!("{other:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "never closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Closed by the latest the center's clock may read: at most a round trip early.
    let rtt = agent.agent.link.center_clock().expect("measured").round_trip_ms;
    assert!(now_ms() >= closes_at - rtt - 50, "closed early (rtt {rtt})");
    // ... and at the center, every unsold unit back.
    let reserved = u64::try_from(held.len()).unwrap();
    let returned = wait_until(Duration::from_secs(10), || async {
        let view = center.ledger(ITEM).await;
        view.item.unwrap().closed && view.channels[0].held == reserved
    })
    .await;
    assert!(returned, "only the {reserved} reserved units stay with the channel: {:?}", center.ledger(ITEM).await);
    assert_eq!(center.ledger(ITEM).await.item.unwrap().available, 100 - reserved);

    // Reservations made before still confirm and cancel.
    let confirm = |id: &str| pb::ConfirmRequest { item_id: ITEM.into(), reservation_id: id.into() };
    let state = client.confirm(confirm(&held[0])).await.unwrap().into_inner().state();
    assert_eq!(state, pb::ReservationState::Confirmed);
    let state = client
        .cancel(pb::CancelRequest { item_id: ITEM.into(), reservation_id: held[1].clone() })
        .await
        .unwrap()
        .into_inner()
        .state();
    assert_eq!(state, pb::ReservationState::Cancelled);
    assert_eq!(buy(&mut client, "after", "after-k").await.outcome(), pb::AcquireOutcome::SoldOut);
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");
}

/// An operator's CloseItem ends the sale as `closes_at` does: the agent stops selling, its
/// unsold units come back to the center, reservations made before still confirm.
async fn close_item_returns_unsold_units_as_closes_at_does(kind: Kind) {
    let center = Center::start_postgres().await;
    let (agent, _store, _redis) = start_agent(&center, kind, 0).await;
    let mut client = agent.client().await;
    create(&center, 0, 0, 0).await;
    let mut held = Vec::new();
    for n in 0..3 {
        let r = buy(&mut client, &format!("u{n}"), &format!("k{n}")).await;
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
        held.push(r.reservation_id);
    }
    let before = center.ledger(ITEM).await;
    assert!(before.channels[0].held > 3, "the pool holds more than it sold: {before:?}");

    let close = pb::CloseItemRequest { item_id: ITEM.into(), closed: true };
    center.admin().await.close_item(close).await.expect("close item");
    let returned =
        wait_until(Duration::from_secs(10), || async { center.ledger(ITEM).await.channels[0].held == 3 }).await;
    assert!(returned, "only the 3 reserved units stay with the channel: {:?}", center.ledger(ITEM).await);
    assert_eq!(center.ledger(ITEM).await.item.unwrap().available, 97);
    assert_eq!(buy(&mut client, "after", "after-k").await.outcome(), pb::AcquireOutcome::SoldOut);
    let confirm = pb::ConfirmRequest { item_id: ITEM.into(), reservation_id: held[0].clone() };
    assert_eq!(client.confirm(confirm).await.unwrap().into_inner().state(), pb::ReservationState::Confirmed);
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");
}

async fn pools_are_stocked_for_the_opening_during_the_lead_and_the_reserve_stays_at_the_center(kind: Kind) {
    let center = Center::start_postgres().await;
    let mut agents = Vec::new();
    let mut redis = Vec::new();
    for channel in ["app", "eu-west", "web"] {
        let (spec, store, r) = counted(kind).await;
        let config = agent_config(&center.url, channel, &spec);
        agents.push((LocalAgent::start_with(config, Some(Arc::clone(&store) as Arc<dyn PoolStore>)).await, store));
        redis.extend(r);
    }
    // Six seconds before the lead: loading the item in three agents fits on a busy machine.
    let opens_at = now_ms() + 10_000;
    let lead_ms = 4_000;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 1_000,
            per_user_limit: 2,
            reservation_ttl_ms: TTL_MS,
            opens_at_unix_ms: opens_at,
            prestock_lead_ms: lead_ms,
            center_reserve: Some(100),
            ..Default::default()
        })
        .await
        .expect("create item");
    let mut clients = Vec::new();
    for (a, _) in &agents {
        clients.push(a.client().await);
    }
    // Before the lead nothing leaves the center. The agents may take until just before the
    // lead to load the item (a busy machine).
    let until_lead = u64::try_from(opens_at - 4_000 - 300 - now_ms()).unwrap_or(0);
    let all_loaded = wait_until(Duration::from_millis(until_lead), || async {
        agents.iter().all(|(a, _)| a.agent.items.get(ITEM).is_some())
    })
    .await;
    assert!(all_loaded, "every agent loaded the item before the lead");
    let view = center.ledger(ITEM).await;
    assert!(now_ms() < opens_at - 4_000 - 200, "checked before the lead (test too slow)");
    assert!(view.channels.iter().all(|c| c.granted == 0), "{view:?}");

    // During the lead each pool takes its share of the total less the reserve, in one go.
    let stocked = wait_until(Duration::from_secs(10), || {
        let clients = clients.clone();
        async move {
            let mut all = true;
            for mut c in clients {
                all &= stock(&mut c, ITEM).await.available == 300;
            }
            all
        }
    })
    .await;
    let stocked_at = now_ms();
    assert!(stocked, "every pool stocked: {:?}", center.ledger(ITEM).await);
    assert!(stocked_at < opens_at, "stocked before the opening ({} ms late)", stocked_at - opens_at);
    let view = center.ledger(ITEM).await;
    assert_eq!(view.item.as_ref().unwrap().available, 100, "the reserve stays at the center: {view:?}");
    let grants: Vec<(u64, u64)> = view.channels.iter().map(|c| (c.held, c.granted)).collect();
    assert_eq!(grants, [(300, 300); 3], "one Borrow of 300 each: {view:?}");
    // Nothing sold before the opening.
    for (n, c) in clients.iter_mut().enumerate() {
        let r = buy(c, &format!("early{n}"), &format!("early-k{n}")).await;
        assert_eq!(r.outcome(), pb::AcquireOutcome::NotStarted);
    }
    for (a, store) in &agents {
        assert_eq!(store.acquire_calls(), 0, "{}", a.addr);
    }
    // Open: every channel sells from its shelf at once.
    for (n, c) in clients.iter_mut().enumerate() {
        let (r, _) = buy_once_open(c, &format!("c{n}"), Duration::from_secs(15)).await;
        assert!(reserved_at(&r) >= opens_at);
    }
    let view = center.ledger(ITEM).await;
    assert_eq!(view.item.as_ref().unwrap().available, 100, "the first buyers took no center call: {view:?}");
}

/// A scheduled item created while the agent's event stream is down (the center refuses
/// WatchChannel, as one the agent cannot reach for it) is told when the stream opens: the
/// agent loads it and stocks its pool for the opening with no buyer asking.
async fn an_item_scheduled_while_the_event_stream_was_down_is_stocked_before_its_opening(kind: Kind) {
    use std::sync::atomic::Ordering::SeqCst;
    let center = Center::start_postgres().await;
    center.faults.refuse_watches.store(true, SeqCst);
    let (agent, store, _redis) = start_agent(&center, kind, 0).await;
    let refused = || center.faults.watches_refused.load(SeqCst);
    assert!(wait_until(Duration::from_secs(10), || async { refused() >= 1 }).await, "the agent asked for its stream");
    // The lead has begun: the pool is due its opening stock as soon as the agent knows.
    let opens_at = now_ms() + 15_000;
    create(&center, opens_at, 0, 20_000).await;
    let seen = refused();
    assert!(wait_until(Duration::from_secs(10), || async { refused() >= seen + 2 }).await, "the agent kept asking");
    assert!(agent.agent.items.get(ITEM).is_none(), "nothing told the agent of the item while its stream was refused");

    center.faults.refuse_watches.store(false, SeqCst);
    // Watched from the center's side: asking the agent for the item's stock would load it.
    let stocked = wait_until(Duration::from_millis(u64::try_from(opens_at - now_ms()).unwrap_or(0)), || async {
        center.ledger(ITEM).await.channels.iter().any(|c| c.granted > 0)
    })
    .await;
    assert!(stocked, "the pool was stocked before the opening: {:?}", center.ledger(ITEM).await);
    assert!(now_ms() < opens_at, "stocked before the opening");
    assert_eq!(store.acquire_calls(), 0, "no buyer asked");
    let mut client = agent.client().await;
    let on_shelf = stock(&mut client, ITEM).await.available;
    let view = center.ledger(ITEM).await;
    assert_eq!(
        view.channels.iter().map(|c| c.granted).sum::<u64>(),
        on_shelf,
        "what the center granted is on the shelf: {view:?}"
    );
}

/// Buys from `callers` concurrent callers, one unit per call and user, until `target`
/// units are reserved in all or the shelf answers SOLD_OUT (at most 20 s, 5,000 calls).
async fn buy_many(client: &AgentClient<Channel>, tag: &str, callers: usize, target: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (reserved, calls) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut tasks = Vec::new();
    for t in 0..callers {
        let (mut client, reserved, calls, tag) =
            (client.clone(), Arc::clone(&reserved), Arc::clone(&calls), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            while reserved.load(Ordering::SeqCst) < target && tokio::time::Instant::now() < deadline {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                assert!(n < 5_000, "{tag}: too many calls");
                if reserved.fetch_add(1, Ordering::SeqCst) >= target {
                    reserved.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
                let r = buy(&mut client, &format!("{tag}-{t}-{n}"), &format!("{tag}-k{t}-{n}")).await;
                match r.outcome() {
                    pb::AcquireOutcome::Reserved => {}
                    pb::AcquireOutcome::SoldOut => {
                        reserved.fetch_sub(1, Ordering::SeqCst);
                        break;
                    }
                    other => panic!("{tag}: {other:?}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("caller");
    }
    reserved.load(Ordering::SeqCst)
}

/// The center's reserve is for the channel that runs dry: after a scheduled opening a
/// pool selling fast (its rate-following low watermark far above what is left on its
/// shelf) borrows nothing from the reserve until a buyer misses, then sells it.
async fn the_reserve_is_borrowed_only_once_the_shelf_runs_dry(kind: Kind) {
    let center = Center::start_postgres().await;
    let (agent, _store, _redis) = start_agent(&center, kind, 0).await;
    let client = agent.client().await;
    let opens_at = now_ms() + 2_500;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 1_000,
            per_user_limit: 1,
            reservation_ttl_ms: TTL_MS,
            opens_at_unix_ms: opens_at,
            prestock_lead_ms: 2_000,
            center_reserve: Some(200),
            ..Default::default()
        })
        .await
        .expect("create item");
    let (_, waited) = buy_once_open(&mut client.clone(), "open", Duration::from_secs(15)).await;
    let view = center.ledger(ITEM).await;
    assert_eq!(view.channels[0].granted, 800, "stocked for the opening, the reserve kept: {view:?} ({waited} waited)");

    // 789 more: 10 left on the shelf, well under the low watermark a few hundred sales a
    // second give (one second of sales, at most 100).
    assert_eq!(buy_many(&client, "fast", 20, 789).await, 789);
    let rate = agent.agent.items.get(ITEM).expect("loaded").with(|c| c.sell_rate_milli(now_ms()));
    assert!(rate > 20_000, "a fast pool: {rate} milli-units/s");
    let borrowed =
        wait_until(Duration::from_secs(1), || async { center.ledger(ITEM).await.channels[0].granted > 800 }).await;
    assert!(!borrowed, "no refill from the reserve while the shelf serves: {:?}", center.ledger(ITEM).await);

    // The shelf runs dry: a miss borrows from the reserve, and everything sells.
    assert_eq!(buy_many(&client, "dry", 20, 210).await, 210, "{:?}", center.ledger(ITEM).await);
    let view = center.ledger(ITEM).await;
    assert_eq!((view.item.as_ref().unwrap().available, view.channels[0].held), (0, 1_000), "{view:?}");
    assert_eq!(buy(&mut client.clone(), "last", "last-k").await.outcome(), pb::AcquireOutcome::SoldOut);
}
