//! A catalogue larger than `--metrics-per-item-limit`: `/metrics` keeps series of their own
//! for at most that many items (a drifting one first) and sums the rest into series without
//! the item label; `/api/items` answers one page at a time. Below the limit every item has
//! its series, as before.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use inventory_center::CenterConfig;
use inventory_proto::v1 as pb;
use inventory_test_support::free_port;

use crate::console::{SimulatedAgent, http_get};
use crate::support::{Backend, TestCenter};

const ITEMS: usize = 24;
const UNITS: u64 = 10;

async fn center_with_items(limit: usize) -> (TestCenter, SocketAddr, SimulatedAgent) {
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let center = TestCenter::start_with(Backend::Sqlite, |c: &mut CenterConfig| {
        c.http_listen = http;
        c.metrics_per_item_limit = limit;
    })
    .await;
    let mut admin = center.admin().await;
    for i in 0..ITEMS {
        admin
            .create_item(pb::CreateItemRequest {
                item_id: format!("item-{i:02}"),
                total: UNITS,
                per_user_limit: 1,
                reservation_ttl_ms: 300_000,
                watermarks: Some(pb::Watermarks { low: 1, high: 8, batch: 4 }),
                ..Default::default()
            })
            .await
            .expect("create item");
    }
    // Every item lent to "app" and reported, but the last one, whose report is missing:
    // its drift is what an alert looks at.
    let mut app = SimulatedAgent::register(&center, "app").await;
    for i in 0..ITEMS {
        let item = format!("item-{i:02}");
        assert_eq!(app.borrow_of(&item, 4).await, 4);
        if i + 1 < ITEMS {
            app.report_of(&item, 4, 0, 0).await;
        }
    }
    (center, http, app)
}

fn items_labelled(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once("item=\"").and_then(|(_, rest)| rest.split_once('"')).map(|(id, _)| id.to_owned()))
        .collect()
}

fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_limit_the_scrape_shows_that_many_items_and_sums_the_rest() {
    const LIMIT: usize = 5;
    let (_center, http, _app) = center_with_items(LIMIT).await;
    let (status, _, metrics) = http_get(http, "/metrics").await;
    assert_eq!(status, 200);
    let shown = items_labelled(&metrics);
    assert!(shown.len() <= LIMIT, "at most {LIMIT} items with series of their own: {shown:?}");
    assert!(shown.contains("item-23"), "the drifting item is shown first: {shown:?}");
    let folded = ITEMS - shown.len();
    assert_eq!(value(&metrics, "inventory_center_metrics_folded_items"), Some(folded as f64), "{metrics}");
    // The folded items' sums, without the item label: nothing lost, nothing counted twice.
    assert_eq!(value(&metrics, "inventory_center_item_total_units"), Some((folded as u64 * UNITS) as f64), "{metrics}");
    assert_eq!(
        value(&metrics, r#"inventory_center_held_units{channel="app"}"#),
        Some((folded as u64 * 4) as f64),
        "{metrics}"
    );
    assert_eq!(value(&metrics, r#"inventory_center_channel_drift_units{channel="app"}"#), Some(0.0), "{metrics}");
    assert_eq!(value(&metrics, r#"inventory_center_channel_drift_units{item="item-23",channel="app"}"#), Some(4.0));
    // Bounded: the families' samples are a few per shown item and line, plus the sums.
    let samples = metrics.lines().filter(|l| l.starts_with("inventory_center_")).count();
    assert!(samples < 20 * (LIMIT + 1) + 10, "{samples} samples:\n{metrics}");

    // The feed answers a page of the items, and says how many there are.
    let (status, _, body) = http_get(http, "/api/items?offset=20&limit=10").await;
    assert_eq!(status, 200);
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(page["total_items"], ITEMS);
    assert_eq!(page["offset"], 20);
    let ids: Vec<&str> =
        page["items"].as_array().expect("items").iter().map(|i| i["item_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["item-20", "item-21", "item-22", "item-23"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_limit_every_item_has_its_series() {
    let (_center, http, _app) = center_with_items(ITEMS).await;
    let (_, _, metrics) = http_get(http, "/metrics").await;
    assert_eq!(items_labelled(&metrics).len(), ITEMS);
    assert_eq!(value(&metrics, "inventory_center_metrics_folded_items"), Some(0.0));
    assert_eq!(value(&metrics, "inventory_center_item_total_units"), None, "no sum without folded items");
    assert_eq!(value(&metrics, r#"inventory_center_item_total_units{item="item-07"}"#), Some(UNITS as f64));
    assert_eq!(value(&metrics, r#"inventory_center_held_units{item="item-07",channel="app"}"#), Some(4.0));
    let (_, _, body) = http_get(http, "/api/items").await;
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(page["items"].as_array().expect("items").len(), ITEMS);
}
