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
