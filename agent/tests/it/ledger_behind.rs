//! The center's ledger goes back in time (an asynchronous standby promoted, a backup
//! restored) and forgets a grant a pool already shelved. Its `available` then counts units
//! that are on a shelf; lending them again would oversell. The pools are the witnesses:
//! the center flags the item (reconcile), lends none of it, re-learns the lost grant from
//! the pool's report, and the sale ends with every unit sold exactly once.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::{TestDatabase, wait_until};

use crate::harness::{Center, Db, LocalAgent, StoreSpec, buy_one};

const TOTAL: u64 = 200;
const LOST: u64 = 20;

fn channel<'a>(view: &'a pb::GetItemResponse, name: &str) -> &'a pb::ChannelAllocation {
    view.channels.iter().find(|c| c.channel == name).unwrap_or_else(|| panic!("no channel {name}: {view:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_lost_a_grant_relearns_it_from_the_pool_and_never_lends_it_twice() {
    let db = TestDatabase::create().await;
    let db_url = db.url.clone();
    let center = Center::start(Db::Pg(db), |_| {}).await;
    center.create_item("lb", TOTAL, 1, (5, 60, 20)).await;
    let app = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let web = LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await;
    let (mut app_client, mut web_client) = (app.client().await, web.client().await);
    let mut sold = 0;
    for n in 0..10 {
        assert!(buy_one(&mut app_client, "lb", &format!("a{n}"), 100).await.is_some());
        assert!(buy_one(&mut web_client, "lb", &format!("w{n}"), 100).await.is_some());
        sold += 2;
    }
    center.await_quiescence().await;
    let before = center.ledger("lb").await;
    let app_held = channel(&before, "app").held;
    assert!(app_held >= LOST, "app holds enough to lose a grant of {LOST}: {before:?}");

    // The ledger loses the last grant of the app channel, as a promoted standby that never
    // received its commit would: the units are on app's shelf, and counted available again.
    let pg = sqlx::PgPool::connect(&db_url).await.expect("connect to the center's database");
    let lost_grant = format!(
        "UPDATE allocations SET granted = granted - {LOST} WHERE item_id = 'lb' AND channel = 'app'; \
         UPDATE items SET available = available + {LOST} WHERE item_id = 'lb'"
    );
    sqlx::raw_sql(&lost_grant).execute(&pg).await.expect("the ledger goes back");
    let behind = center.ledger("lb").await;
    assert_eq!(channel(&behind, "app").drift, -i64::try_from(LOST).unwrap(), "{behind:?}");

    // The center sees a pool beyond its ledger, says so, and re-learns the grant.
    let available_before = before.item.as_ref().expect("item").available;
    let flagged = std::sync::Mutex::new(None);
    let relearned = wait_until(Duration::from_secs(30), || async {
        let r = center.reconcile().await;
        if let Some(v) = r.violations.iter().find(|v| v.invariant == "beyond_ledger") {
            *flagged.lock().unwrap() = Some(v.clone());
        }
        let view = center.ledger("lb").await;
        let app = channel(&view, "app");
        app.drift == 0 && app.held == app_held && view.item.as_ref().expect("item").available == available_before
    })
    .await;
    assert!(relearned, "the lost grant was never re-learned: {:?}", center.ledger("lb").await);
    let flagged = flagged.into_inner().unwrap().expect("reconcile named the pool beyond the ledger while it lasted");
    assert_eq!(flagged.channel, "app");
    assert!(flagged.detail.contains(&LOST.to_string()), "{flagged:?}");

    // The sale runs to the end on both channels: every unit sold once, none twice.
    for n in 0..TOTAL * 2 {
        let client = if n % 2 == 0 { &mut app_client } else { &mut web_client };
        if buy_one(client, "lb", &format!("late{n}"), 200).await.is_some() {
            sold += 1;
        }
        if sold > TOTAL {
            break;
        }
    }
    assert_eq!(sold, TOTAL, "every unit sold exactly once");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");
    // A sale moves units from available to sold: no drift, so the ledger is quiet before
    // the pools' next reports carry the last sales. Those reports come within a heartbeat.
    let reported_sold = || async {
        let end = center.ledger("lb").await;
        end.channels.iter().map(|c| c.reported_sold).sum::<u64>()
    };
    let all_reported = wait_until(Duration::from_secs(20), || async { reported_sold().await == TOTAL }).await;
    assert!(
        all_reported,
        "the pools report {} sold of {TOTAL}: {:?}",
        reported_sold().await,
        center.ledger("lb").await
    );
    app.stop().await;
    web.stop().await;
}
