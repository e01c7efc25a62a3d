//! A Borrow the agent gave up on is applied by the center after the agent's resync (a
//! transaction that waited for a database that came back, a frozen center that resumed).
//! The grant must still reach the shelf: every unit sold, no drift at quiescence.

use std::sync::atomic::Ordering;
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::{TestRedis, wait_until};

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, agent_config, buy_one};

const TOTAL: u64 = 40;

async fn a_grant_applied_after_the_agents_resync_reaches_the_shelf(store: StoreSpec) {
    let center = Center::start_postgres().await;
    center.create_item("late", TOTAL, 1, (2, 20, 10)).await;
    let mut config = agent_config(&center.url, "app", &store);
    // Give up on a call quickly: five attempts of 300 ms.
    config.center_timeout_ms = 300;
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;

    // The center's database stalls: Borrows wait, and are applied when it returns.
    center.faults.hold_borrows.send_replace(true);
    let first = client.acquire(acquire_req("late", "u-first", 1, "k-first")).await;
    assert!(
        !first.as_ref().is_ok_and(|r| r.get_ref().outcome() == pb::AcquireOutcome::Reserved),
        "nothing can be reserved before a grant: {first:?}"
    );
    let item = agent.agent.items.get("late").expect("item loaded");
    // The link gave up on the Borrow (every attempt waits at the center)...
    assert!(
        wait_until(Duration::from_secs(30), || async {
            center.faults.held_borrows.load(Ordering::SeqCst) >= 5 && item.with(|c| c.unsettled() && !c.busy())
        })
        .await,
        "the agent never gave up on the held Borrow"
    );
    // ... and its resync ran and ended, all while the Borrow was still waiting: the resync
    // replays the call first (five more attempts that wait too), then reads the holding.
    assert!(
        wait_until(Duration::from_secs(30), || async {
            center.faults.held_borrows.load(Ordering::SeqCst) >= 10 && item.with(|c| c.unsettled() && !c.busy())
        })
        .await,
        "the resync never replayed the call of unknown outcome"
    );
    assert_eq!(center.ledger("late").await.item.expect("item").available, TOTAL, "nothing granted yet");

    // The database answers again: the waiting attempts are applied (the first grants, the
    // others repeat its answer), long after the agent gave up on them.
    center.faults.hold_borrows.send_replace(false);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            center.ledger("late").await.item.expect("item").available < TOTAL
        })
        .await,
        "the held Borrow was never applied"
    );

    // The sale runs to the end: every unit is sold, the late grant included.
    let mut sold = 0;
    for n in 0..TOTAL * 3 {
        match buy_one(&mut client, "late", &format!("u{n}"), 200).await {
            Some(_) => sold += 1,
            None if sold == TOTAL => break,
            None => {}
        }
    }
    let view = center.ledger("late").await;
    assert_eq!(sold, TOTAL, "every unit sold, none stranded with the channel: {view:?}");
    let r = center.await_quiescence().await;
    assert!(r.ok && r.drifts.is_empty(), "{r:?}");
    assert!(!item.with(|c| c.unsettled()), "the late Borrow was answered for");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_a_grant_applied_after_the_agents_resync_reaches_the_shelf() {
    a_grant_applied_after_the_agents_resync_reaches_the_shelf(StoreSpec::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_a_grant_applied_after_the_agents_resync_reaches_the_shelf() {
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    a_grant_applied_after_the_agents_resync_reaches_the_shelf(spec).await;
}
