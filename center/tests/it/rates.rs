//! Sell rates at the center, against PostgreSQL and SQLite: a short supply shared by the
//! channels' rates inside the Borrow's transaction, the rates shown, and the item's
//! rate-following batches set, shown and validated.

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::contract::{assert_conserved, assert_status, ledger, register};
use crate::support::TestCenter;

crate::for_each_backend!(a_short_borrow_is_shared_by_the_channels_rates, rate_batching_is_set_shown_and_validated,);

async fn borrow_at(
    center: &mut CenterClient<Channel>,
    channel: &str,
    epoch: u64,
    quantity: u64,
    request_id: &str,
    sell_rate_milli: u64,
) -> pb::BorrowResponse {
    center
        .borrow(pb::BorrowRequest {
            item_id: "i".into(),
            channel: channel.into(),
            epoch,
            quantity,
            request_id: request_id.into(),
            sell_rate_milli,
        })
        .await
        .expect("borrow")
        .into_inner()
}

async fn a_short_borrow_is_shared_by_the_channels_rates(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    admin
        .create_item(pb::CreateItemRequest { item_id: "i".into(), total: 120, ..Default::default() })
        .await
        .expect("create");
    let (fast, slow, web) =
        (register(&mut center, "fast").await, register(&mut center, "slow").await, register(&mut center, "web").await);
    // Enough stock: granted in full whatever the rates.
    assert_eq!(borrow_at(&mut center, "web", web, 10, "w1", 0).await.granted, 10);
    // The slow channel's rate reaches the center in a heartbeat (1 unit/s).
    let pool = pb::PoolReport { item_id: "i".into(), sell_rate_milli: 1_000, ..Default::default() };
    center
        .heartbeat(pb::HeartbeatRequest {
            channel: "slow".into(),
            epoch: slow,
            pools: vec![pool],
            ..Default::default()
        })
        .await
        .expect("heartbeat");
    // 110 left, the fast channel (10/s) asks for more: its share is 10/11 of them.
    let b = borrow_at(&mut center, "fast", fast, 500, "f1", 10_000).await;
    assert_eq!((b.granted, b.center_available), (100, 10));
    // A replay with another rate is the same request: the first answer.
    assert_eq!(borrow_at(&mut center, "fast", fast, 500, "f1", 1).await.granted, 100);
    // The slow channel's share of the 10 left is under one unit: it still gets one.
    let b = borrow_at(&mut center, "slow", slow, 500, "s1", 1_000).await;
    assert_eq!((b.granted, b.center_available), (1, 9));
    // A Borrow that says no rate is served first come, first served.
    let b = borrow_at(&mut center, "web", web, 500, "w2", 0).await;
    assert_eq!((b.granted, b.center_available), (9, 0));
    let view = ledger(&mut admin, "i").await;
    assert_conserved(&view);
    let line = |name: &str| view.channels.iter().find(|l| l.channel == name).cloned().expect("a line");
    assert_eq!((line("fast").sell_rate_milli, line("slow").sell_rate_milli), (10_000, 1_000));
    // The item's batches follow the rate (its default): one second of 10 units/s is a
    // batch of 10; 1 unit/s is the floor of 1.
    assert_eq!((line("fast").current_batch, line("slow").current_batch), (10, 1));
    assert_eq!(line("web").current_batch, 6, "no rate: the fixed batch (5% of 120)");
}

async fn rate_batching_is_set_shown_and_validated(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let create = |item: &str, watermarks: Option<pb::Watermarks>| pb::CreateItemRequest {
        item_id: item.into(),
        total: 1_000,
        watermarks,
        ..Default::default()
    };
    let auto = admin.create_item(create("auto", None)).await.unwrap().into_inner().item.unwrap();
    let defaults = pb::RateBatching { enabled: true, min_batch: 1, max_batch: 100, target_ms: 1_000 };
    assert_eq!(auto.rate_batching, Some(defaults), "no watermarks given: batches follow the rate");
    let wm = pb::Watermarks { low: 5, high: 50, batch: 20 };
    let fixed = admin.create_item(create("fixed", Some(wm))).await.unwrap().into_inner().item.unwrap();
    assert_eq!(fixed.rate_batching.map(|r| r.enabled), Some(false), "the operator's watermarks are fixed");

    // Rate-following on, with bounds, keeping the fixed watermarks (all three 0).
    let set = |channel: &str, rb: pb::RateBatching| pb::SetWatermarksRequest {
        item_id: "fixed".into(),
        channel: channel.into(),
        rate_batching: Some(rb),
        ..Default::default()
    };
    let bounds = pb::RateBatching { enabled: true, min_batch: 4, max_batch: 200, target_ms: 500 };
    let r = admin.set_watermarks(set("", bounds)).await.unwrap().into_inner();
    assert_eq!(r.watermarks, Some(wm));
    let got = admin.get_watermarks(pb::GetWatermarksRequest { item_id: "fixed".into() }).await.unwrap().into_inner();
    assert_eq!(got.rate_batching, Some(bounds));
    // A channel's agent learns it from DescribeItem, unless the channel has fixed ones.
    let epoch = register(&mut center, "app").await;
    let describe = |channel: &str| pb::DescribeItemRequest { item_id: "fixed".into(), channel: channel.into() };
    let d = center.describe_item(describe("app")).await.unwrap().into_inner();
    assert_eq!(d.rate_batching, Some(bounds));
    admin
        .set_watermarks(pb::SetWatermarksRequest {
            item_id: "fixed".into(),
            channel: "web".into(),
            low: 1,
            high: 9,
            batch: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let d = center.describe_item(describe("web")).await.unwrap().into_inner();
    assert_eq!(d.rate_batching, None, "a channel's own watermarks override");

    // Bad bounds name their field; bounds are per item.
    let bad = pb::RateBatching { enabled: true, min_batch: 10, max_batch: 5, target_ms: 0 };
    assert_status(admin.set_watermarks(set("", bad)).await, Code::InvalidArgument, "rate_batching.max_batch 5");
    assert_status(admin.set_watermarks(set("app", bounds)).await, Code::InvalidArgument, "channel");
    let long = pb::RateBatching { target_ms: 600_001, ..bounds };
    assert_status(admin.set_watermarks(set("", long)).await, Code::InvalidArgument, "rate_batching.target_ms");
    // An agent's rate beyond any sale is refused, naming the field.
    let pool = pb::PoolReport { item_id: "fixed".into(), sell_rate_milli: u64::MAX, ..Default::default() };
    let hb = pb::HeartbeatRequest { channel: "app".into(), epoch, pools: vec![pool], ..Default::default() };
    assert_status(center.heartbeat(hb).await, Code::InvalidArgument, "pools[0].sell_rate_milli");

    // Fixed watermarks on the item's default turn rate-following off again.
    admin
        .set_watermarks(pb::SetWatermarksRequest {
            item_id: "fixed".into(),
            low: 5,
            high: 50,
            batch: 20,
            ..Default::default()
        })
        .await
        .unwrap();
    let got = admin.get_watermarks(pb::GetWatermarksRequest { item_id: "fixed".into() }).await.unwrap().into_inner();
    assert_eq!(got.rate_batching.map(|r| r.enabled), Some(false));
}
