//! The `requests` table keeps first answers exactly while a retry can still be applied,
//! and loses the rest: run against PostgreSQL and SQLite.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::wait_until;
use tonic::Code;

use crate::contract::{borrow, create, ledger, register};
use crate::support::TestCenter;

crate::for_each_backend!(superseded_requests_are_pruned_and_live_ones_still_replay);

async fn stored(pool: &sqlx::AnyPool, scope: &str, request_id: &str) -> bool {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM requests WHERE scope = $1 AND request_id = $2")
        .bind(scope)
        .bind(request_id)
        .fetch_one(pool)
        .await
        .expect("count requests");
    n > 0
}

async fn pruned(pool: &sqlx::AnyPool, scope: &str, request_id: &str) -> bool {
    wait_until(Duration::from_secs(10), || async move { !stored(pool, scope, request_id).await }).await
}

async fn superseded_requests_are_pruned_and_live_ones_still_replay(c: TestCenter) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&c.database_url).await.unwrap();
    let mut admin = c.admin().await;
    let mut center = c.center().await;
    create(&mut admin, "i", 100).await;
    let add = pb::AddStockRequest { item_id: "i".into(), quantity: 5, request_id: "restock-1".into() };
    admin.add_stock(add.clone()).await.expect("add stock");
    let app = register(&mut center, "app").await;
    let first = borrow(&mut center, "i", "app", app, 7, "b-1").await.expect("borrow");

    // Another channel's request becomes unreplayable when that channel registers again:
    // once it is gone, the pruner has run with app's request in the table.
    let web = register(&mut center, "web").await;
    borrow(&mut center, "i", "web", web, 3, "w-1").await.expect("borrow");
    register(&mut center, "web").await;
    assert!(pruned(&pool, "channel:web", "w-1").await, "a request of a superseded epoch is removed");

    // app's epoch is current: its retry can still arrive, and is still answered from the record.
    assert!(stored(&pool, "channel:app", "b-1").await);
    let retry = borrow(&mut center, "i", "app", app, 7, "b-1").await.expect("retry");
    assert_eq!((retry.granted, retry.center_available, retry.replayed), (first.granted, first.center_available, true));
    // An operator's request has no epoch to supersede it: kept.
    assert!(stored(&pool, "admin", "restock-1").await);
    assert!(admin.add_stock(add).await.expect("add stock again").into_inner().replayed);

    // app registers again: a retry of b-1 carries epoch `app`, which is refused as stale
    // whether or not its record is still there, so the record goes.
    let app2 = register(&mut center, "app").await;
    assert!(pruned(&pool, "channel:app", "b-1").await, "a request of a superseded epoch is removed");
    let late = borrow(&mut center, "i", "app", app, 7, "b-1").await.expect_err("stale");
    assert_eq!(late.code(), Code::FailedPrecondition, "{late:?}");
    let view = ledger(&mut admin, "i").await;
    let held = view.channels.iter().find(|c| c.channel == "app").expect("app").held;
    assert_eq!(held, 7, "the late retry moved nothing");
    // Under the new epoch the channel's requests are protected again.
    let next = borrow(&mut center, "i", "app", app2, 1, "b-2").await.expect("borrow");
    let again = borrow(&mut center, "i", "app", app2, 1, "b-2").await.expect("replay");
    assert_eq!((again.granted, again.replayed), (next.granted, true));
}

async fn channel_records(pool: &sqlx::AnyPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM requests WHERE channel IS NOT NULL")
        .fetch_one(pool)
        .await
        .expect("count requests")
}

/// A UUID v7 request id (as the agent makes them) made at `ms`.
fn v7_made_at(ms: i64, n: u64) -> String {
    format!("{ms:012x}7000{:016x}", 0x8000_0000_0000_0000u64 | n)
}

/// One channel sending 50,000 Borrows with fresh ids in one epoch (100 items × 500
/// BorrowMany calls): its records never outnumber what it sent within the age bound, and
/// after the flood they go within the bound and a pruner period. A replay of an id made
/// longer ago than the bound is refused, naming the id and the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_bounded_by_age_within_one_epoch() {
    const MAX_AGE_MS: u64 = 1_000;
    const ITEMS: usize = 100;
    const CALLS: usize = 500;
    let c = TestCenter::start_with(crate::support::Backend::Sqlite, |cfg| {
        cfg.request_max_age_ms = MAX_AGE_MS;
        cfg.prune_interval_ms = 100;
    })
    .await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&c.database_url).await.unwrap();
    let mut admin = c.admin().await;
    let mut center = c.center().await;
    for i in 0..ITEMS {
        create(&mut admin, &format!("i{i}"), 1).await;
    }
    let epoch = register(&mut center, "app").await;
    let kept_ms = inventory_core::records::kept_ms(MAX_AGE_MS);
    let started = std::time::Instant::now();
    let mut sent = 0u64;
    let mut most = 0;
    for call in 0..CALLS {
        let lines = (0..ITEMS)
            .map(|i| {
                sent += 1;
                pb::BorrowLine {
                    item_id: format!("i{i}"),
                    quantity: 1,
                    request_id: uuid::Uuid::now_v7().simple().to_string(),
                    sell_rate_milli: 0,
                }
            })
            .collect();
        let req = pb::BorrowManyRequest { channel: "app".into(), epoch, lines };
        let answer = center.borrow_many(req).await.expect("borrow many").into_inner();
        assert!(answer.results.iter().all(|r| r.code == 0), "every line answered: {:?}", answer.results[0]);
        if call % 50 == 49 {
            most = most.max(channel_records(&pool).await);
        }
    }
    assert_eq!(sent, 50_000);
    let flood_ms = started.elapsed().as_millis();
    // The documented bound: a channel's records are those it made within kept_ms (and a
    // pruner period); with nothing sent since, none.
    let gone = inventory_test_support::wait_until(Duration::from_secs(10), || {
        let pool = pool.clone();
        async move { channel_records(&pool).await == 0 }
    })
    .await;
    assert!(gone, "records older than {kept_ms} ms remain: {}", channel_records(&pool).await);
    if flood_ms > 2 * u128::from(kept_ms) {
        assert!(most < 50_000, "pruned during the flood ({flood_ms} ms): at most {most} records");
    }

    let old = v7_made_at(inventory_core::records::prune_before(now_ms(), MAX_AGE_MS) - 1, 1);
    let late = borrow(&mut center, "i0", "app", epoch, 1, &old).await.expect_err("too old");
    assert_eq!(late.code(), Code::FailedPrecondition, "{late:?}");
    assert!(late.message().contains(&old) && late.message().contains("--request-max-age-ms 1000"), "{late:?}");
    assert_eq!(channel_records(&pool).await, 0, "a refused replay leaves no record");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis().try_into().unwrap()
}
