//! A segmented pool as the center sees it: a heartbeat naming a lost segment puts exactly
//! the units the intact segments do not account for in doubt, and the console shows each
//! segment, the lost one in red.

use inventory_proto::v1 as pb;

use crate::console::{SimulatedAgent, chromium_present, dump_dom, element, http_get, start_center};
use crate::support::Backend;

const ITEM: &str = "hot";

fn segment(segment: u32, available: u64, reserved: u64, sold: u64, lost: bool) -> pb::SegmentCounts {
    pb::SegmentCounts { segment, available, reserved, sold, lost, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_segment_puts_only_its_units_in_doubt_and_the_console_shows_each_segment() {
    chromium_present();
    let (center, http) = start_center(Backend::Postgres).await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 100,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 5, high: 40, batch: 20 }),
            segments: 4,
            ..Default::default()
        })
        .await
        .expect("create item");
    let mut app = SimulatedAgent::register(&center, "app").await;
    assert_eq!(app.borrow_of(ITEM, 20).await, 20);
    // Five units in each segment; segment 2 is lost, the other three hold 15 (2 sold).
    let pool = pb::PoolReport {
        item_id: ITEM.into(),
        available: 12,
        reserved: 1,
        sold: 2,
        generation: 42,
        lost_segments: vec![2],
        segments: vec![
            segment(0, 3, 0, 2, false),
            segment(1, 5, 0, 0, false),
            segment(2, 0, 0, 0, true),
            segment(3, 4, 1, 0, false),
        ],
        ..Default::default()
    };
    let heartbeat = pb::HeartbeatRequest {
        channel: "app".into(),
        epoch: app.epoch,
        pools: vec![pool.clone()],
        ..Default::default()
    };
    let answer = app.client.heartbeat(heartbeat.clone()).await.expect("heartbeat").into_inner();
    assert_eq!(answer.in_doubt_items, [ITEM], "the item has units in doubt");
    let view = center.admin().await.get_item(pb::GetItemRequest { item_id: ITEM.into() }).await.unwrap().into_inner();
    let c = &view.channels[0];
    assert_eq!((c.held, c.in_doubt, c.generation), (20, 5, 0), "only the lost segment's 5 units: {c:?}");
    // The same report again (a retry) changes nothing.
    app.client.heartbeat(heartbeat).await.expect("heartbeat again");
    let view = center.admin().await.get_item(pb::GetItemRequest { item_id: ITEM.into() }).await.unwrap().into_inner();
    assert_eq!(view.channels[0].in_doubt, 5);

    let (status, _, body) = http_get(http, "/api/items").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let segments = &v["items"][0]["channels"][0]["segments"];
    assert_eq!(segments.as_array().map(Vec::len), Some(4), "{body}");
    assert_eq!(segments[2], serde_json::json!({"segment": 2, "available": 0, "reserved": 0, "sold": 0, "lost": true}));
    assert_eq!(segments[3], serde_json::json!({"segment": 3, "available": 4, "reserved": 1, "sold": 0, "lost": false}));

    let dom = dump_dom(&format!("http://{http}/")).await;
    let row = element(&dom, r#"<tr data-segments="app""#, "</tr>");
    assert!(row.contains(r#"<span class="segment" data-segment="0">0: 3/0/2</span>"#), "{row}");
    assert!(
        row.contains(r#"<span class="segment warn" data-segment="2" data-alarm="segment-lost">2: 0/0/0 lost</span>"#),
        "the lost segment is not red:\n{row}"
    );
}
