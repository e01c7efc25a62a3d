//! One segment of a segmented pool lost in the store: only its units freeze. Its buyers
//! wait (UNAVAILABLE), the other segments sell on, the center puts exactly the lost
//! segment's units in doubt, and after the operator's resolution the segment comes back
//! empty and the item sells to its last unit, each unit once.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::{TestRedis, wait_until};
use tonic::Code;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, http_get, stock};
use crate::segments::{ITEM, SEGMENTS, TARGET, TOTAL, segmented_item, stocked, users_of};

type Client = pb::agent_client::AgentClient<tonic::transport::Channel>;

async fn reserve(client: &mut Client, user: &str) -> pb::AcquireResponse {
    client.acquire(acquire_req(ITEM, user, 1, user)).await.expect("acquire").into_inner()
}

/// Deletes every key of segment `segment` of the item, as a Redis node losing them would.
async fn lose_segment(redis: &TestRedis, segment: u32) {
    let client = redis::Client::open(redis.url.as_str()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let pattern = format!("{}*{{app:{ITEM}#{segment}}}*", redis.prefix);
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(&mut conn).await.expect("keys");
    assert!(keys.len() >= 2, "the segment's keys ({pattern}): {keys:?}");
    let () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await.expect("del");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_lost_segment_freezes_only_its_units() {
    let center = Center::start_postgres().await;
    segmented_item(&center).await;
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let agent = LocalAgent::start(&center.url, "app", &spec).await;
    let mut client = agent.client().await;
    let _ = client.get_stock(pb::GetStockRequest { item_id: ITEM.into() }).await;
    stocked(&mut client).await;
    let share = TOTAL / u64::from(SEGMENTS);

    // In the target segment one buyer confirms and one holds a reservation; one buyer of
    // segment 0 too. Then the ledger is quiet.
    let mut target_users = users_of(TARGET);
    let confirmed = target_users.next().unwrap();
    let r = reserve(&mut client, &confirmed).await;
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    let c = pb::ConfirmRequest { item_id: ITEM.into(), reservation_id: r.reservation_id };
    assert_eq!(client.confirm(c).await.unwrap().into_inner().state(), pb::ReservationState::Confirmed);
    assert_eq!(reserve(&mut client, &target_users.next().unwrap()).await.outcome(), pb::AcquireOutcome::Reserved);
    let mut zero_users = users_of(0);
    assert_eq!(reserve(&mut client, &zero_users.next().unwrap()).await.outcome(), pb::AcquireOutcome::Reserved);
    center.await_quiescence().await;
    assert_eq!(center.ledger(ITEM).await.channels[0].held, TOTAL);

    lose_segment(&redis, TARGET).await;
    // The leader finds the segment lost at its next look or heartbeat.
    let found = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move { stock(&mut client, ITEM).await.segments[TARGET as usize].lost }
    })
    .await;
    assert!(found, "the lost segment was never noticed");
    let waiting = target_users.next().unwrap();
    let refused = client.acquire(acquire_req(ITEM, &waiting, 1, &waiting)).await.expect_err("its buyers wait");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains(&format!("segment {TARGET} of item {ITEM} lost its data")), "{refused:?}");
    // Every other segment sells on.
    for segment in (0..SEGMENTS).filter(|s| *s != TARGET) {
        let user = users_of(segment).nth(5).unwrap();
        assert_eq!(reserve(&mut client, &user).await.outcome(), pb::AcquireOutcome::Reserved, "segment {segment}");
    }
    // The center holds exactly the lost segment's units in doubt: its share of the stock
    // (2 of them reserved or sold), not the channel's whole holding.
    let counted =
        wait_until(Duration::from_secs(10), || async { center.ledger(ITEM).await.channels[0].in_doubt == share }).await;
    let view = center.ledger(ITEM).await;
    assert!(counted, "in doubt: {:?}", view.channels);
    assert_eq!((view.channels[0].held, view.item.as_ref().unwrap().available), (TOTAL, 0));
    let rec = center.reconcile().await;
    assert!(rec.ok && rec.in_doubt.len() == 1, "{rec:?}");
    // Its heartbeat names the lost segment and lists every segment for the console.
    let reports = agent.agent.reports().await;
    let report = reports.iter().find(|r| r.item_id == ITEM).expect("the item's report");
    assert_eq!(report.lost_segments, [TARGET], "{report:?}");
    assert_eq!(report.available + report.reserved + report.sold, TOTAL - share, "the intact segments' sums");
    let lost: Vec<bool> = report.segments.iter().map(|g| g.lost).collect();
    assert_eq!(lost, (0..SEGMENTS).map(|s| s == TARGET).collect::<Vec<_>>(), "{report:?}");
    let metrics = http_get(agent.http_addr, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("inventory_agent_segment_lost{") && l.contains(&format!("segment=\"{TARGET}\""))),
        "{metrics}"
    );

    // The operator's orders show one of those units sold: written off, the rest back to
    // the center. The agent creates the segment again, empty, and sells it again.
    let resolved = center
        .admin()
        .await
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: ITEM.into(), channel: "app".into(), sold: 1 })
        .await
        .expect("resolve")
        .into_inner();
    assert_eq!((resolved.written_off, resolved.returned_to_center), (1, share - 1));
    let reopened = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            let s = stock(&mut client, ITEM).await.segments.swap_remove(TARGET as usize);
            !s.lost && s.pool_generation != 0
        }
    })
    .await;
    assert!(reopened, "the lost segment never came back");
    let back = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        let user = waiting.clone();
        async move {
            matches!(client.acquire(acquire_req(ITEM, &user, 1, &user)).await,
                Ok(r) if r.get_ref().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(back, "the segment's buyers never got served again");

    // Everything left sells once: the total less the unit written off. The units the
    // resolution gave back reach the pool through misses (the center looked dry to it).
    let next = std::sync::atomic::AtomicU64::new(0);
    let sold_out = wait_until(Duration::from_secs(20), || {
        let mut client = client.clone();
        let user = format!("late-{}", next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let center = &center;
        async move {
            let r = client.acquire(acquire_req(ITEM, &user, 1, &user)).await.expect("acquire").into_inner();
            r.outcome() == pb::AcquireOutcome::SoldOut
                && center.ledger(ITEM).await.item.unwrap().available == 0
                && stock(&mut client, ITEM).await.available == 0
        }
    })
    .await;
    assert!(sold_out, "the item never sold out");
    let s = stock(&mut client, ITEM).await;
    assert_eq!((s.available, s.reserved + s.sold), (0, TOTAL - 1), "{s:?}");
    assert!(s.segments.iter().all(|g| !g.lost), "{s:?}");
    let r = center.await_quiescence().await;
    assert!(r.ok && r.in_doubt.is_empty(), "{r:?}");
    let item = center.ledger(ITEM).await.item.unwrap();
    assert_eq!((item.total, item.available, item.written_off), (TOTAL - 1, 0, 1));
    agent.stop().await;
}

/// A lost segment that held nothing costs nothing: once the center has heard of it (and
/// finds nothing in doubt) the agent creates it again by itself, no operator needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_lost_segment_that_held_nothing_comes_back_by_itself() {
    const EMPTY: u32 = 3;
    let center = Center::start_postgres().await;
    // 3 units over 4 segments: segment 3's share is none.
    center.create_segmented_item(ITEM, 3, 1, (1, 12, 3), SEGMENTS).await;
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let agent = LocalAgent::start(&center.url, "app", &spec).await;
    let mut client = agent.client().await;
    let _ = client.get_stock(pb::GetStockRequest { item_id: ITEM.into() }).await;
    let stocked = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move { stock(&mut client, ITEM).await.available == 3 }
    })
    .await;
    assert!(stocked, "never stocked");
    let before = stock(&mut client, ITEM).await.segments[EMPTY as usize];
    assert_eq!((before.available, before.reserved, before.sold), (0, 0, 0));
    assert_ne!(before.pool_generation, 0, "the empty segment exists");

    lose_segment(&redis, EMPTY).await;
    let back = wait_until(Duration::from_secs(15), || {
        let mut client = client.clone();
        let old = before.pool_generation;
        async move {
            let s = stock(&mut client, ITEM).await.segments.swap_remove(EMPTY as usize);
            !s.lost && s.pool_generation != 0 && s.pool_generation != old
        }
    })
    .await;
    assert!(back, "the segment never came back: {:?}", stock(&mut client, ITEM).await);
    let view = center.ledger(ITEM).await;
    assert_eq!((view.channels[0].held, view.channels[0].in_doubt), (3, 0), "{:?}", view.channels);
    // Its buyers are served again (by a move from a sibling), and the item sells out once.
    let user = users_of(EMPTY).next().unwrap();
    assert_eq!(reserve(&mut client, &user).await.outcome(), pb::AcquireOutcome::Reserved);
    let s = stock(&mut client, ITEM).await;
    assert_eq!((s.available, s.reserved), (2, 1), "{s:?}");
    let r = center.await_quiescence().await;
    assert!(r.ok && r.in_doubt.is_empty(), "{r:?}");
    agent.stop().await;
}
