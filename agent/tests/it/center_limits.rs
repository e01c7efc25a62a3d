//! Agents under the center's per-channel rate limit: their Borrows and heartbeats are
//! refused now and then with RESOURCE_EXHAUSTED; they back off, retry with the same
//! request ids, and still sell every unit with nothing left in doubt.

use inventory_test_support::TestSqlite;

use crate::harness::{Center, Db, LocalAgent, StoreSpec, buy_one, http_get};

const TOTAL: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_under_the_centers_rate_limit_sell_every_unit() {
    let center = Center::start(Db::Lite(TestSqlite::create()), |c| {
        c.channel_rate_per_sec = 15;
        c.channel_burst = 3;
    })
    .await;
    // Small batches: many Borrows, more than the limit lets through at once.
    center.create_item("i", TOTAL, 1, (2, 6, 4)).await;
    let app = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let web = LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await;
    let mut clients = [app.client().await, web.client().await];

    let mut sold = 0;
    // Bounded: at most 400 buyers, each at most 50 tries.
    for n in 0..400usize {
        if sold == TOTAL {
            break;
        }
        if buy_one(&mut clients[n % 2], "i", &format!("u{n}"), 50).await.is_some() {
            sold += 1;
        }
    }
    assert_eq!(sold, TOTAL, "every unit sold");

    let metrics = http_get(center.http_addr, "/metrics").await;
    let refused: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("inventory_rpc_requests_total{") && l.contains(r#"code="resource_exhausted""#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(refused > 0.0, "the limit was met: {refused} calls refused");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");
    let ledger = center.ledger("i").await;
    let item = ledger.item.clone().expect("item");
    assert_eq!(item.available, 0, "nothing left at the center: {ledger:?}");
}
