//! Channel shares at the center, against PostgreSQL and SQLite: weights, caps and floors
//! stored with the item and shown, the opening allocation split by them, caps and floors
//! kept in every Borrow (single and BorrowMany), hostile values refused naming the field.

use std::time::{SystemTime, UNIX_EPOCH};

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::contract::{assert_conserved, assert_status, borrow, ledger, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    shares_are_stored_shown_and_split_the_opening_stock,
    a_borrow_never_passes_a_cap_and_floors_are_kept_from_the_others,
    hostile_shares_are_refused_naming_the_field_and_create_nothing,
);

fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn share(channel: &str, weight: u64, cap_units: u64, floor_units: u64) -> pb::ChannelShare {
    pb::ChannelShare { channel: channel.into(), weight, cap_units, floor_units }
}

fn with_shares(item: &str, total: u64, shares: Vec<pb::ChannelShare>) -> pb::CreateItemRequest {
    pb::CreateItemRequest { item_id: item.into(), total, channel_shares: shares, ..Default::default() }
}

async fn opening(center: &mut CenterClient<Channel>, item: &str, channel: &str) -> u64 {
    let r = pb::DescribeItemRequest { item_id: item.into(), channel: channel.into() };
    center.describe_item(r).await.expect("describe").into_inner().opening_allocation
}

async fn shares_are_stored_shown_and_split_the_opening_stock(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    for ch in ["app", "web", "partner", "other"] {
        register(&mut center, ch).await;
    }
    let plan = vec![share("app", 50, 0, 0), share("web", 30, 0, 0), share("partner", 20, 300, 100)];
    let req = pb::CreateItemRequest {
        opens_at_unix_ms: now_ms() + 3_600_000,
        center_reserve: Some(300),
        ..with_shares("launch", 3_000, plan.clone())
    };
    assert!(admin.create_item(req.clone()).await.unwrap().into_inner().created);
    // Shown as stored, by channel name, by GetItem and ListItems.
    let by_name = vec![share("app", 50, 0, 0), share("partner", 20, 300, 100), share("web", 30, 0, 0)];
    assert_eq!(ledger(&mut admin, "launch").await.item.unwrap().channel_shares, by_name);
    let list = admin.list_items(pb::ListItemsRequest {}).await.unwrap().into_inner();
    assert_eq!(list.items[0].channel_shares, by_name);
    // 2,700 shared: the partner's floor of 100 first, 2,600 by weight (1,300 / 780 / 520),
    // the partner then capped at 300; a channel without a share starts from the reserve.
    let mut each = Vec::new();
    for ch in ["app", "web", "partner", "other"] {
        each.push(opening(&mut center, "launch", ch).await);
    }
    assert_eq!(each, [1_300, 780, 300, 0]);
    // The shares are part of the definition: the same in another order is the same item,
    // others are ALREADY_EXISTS.
    let mut reordered = req.clone();
    reordered.channel_shares.reverse();
    assert!(!admin.create_item(reordered).await.unwrap().into_inner().created);
    let mut other = req.clone();
    other.channel_shares[2].cap_units = 400;
    assert_status(admin.create_item(other).await, Code::AlreadyExists, "channel_shares");
    let mut none = req;
    none.channel_shares.clear();
    assert_status(admin.create_item(none).await, Code::AlreadyExists, "channel_shares");
}

async fn a_borrow_never_passes_a_cap_and_floors_are_kept_from_the_others(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let plan = vec![share("fast", 1, 0, 0), share("partner", 1, 100, 0), share("slow", 1, 0, 200)];
    admin.create_item(with_shares("i", 1_000, plan.clone())).await.expect("create");
    let (fast, partner, slow) = (
        register(&mut center, "fast").await,
        register(&mut center, "partner").await,
        register(&mut center, "slow").await,
    );

    // The cap: trimmed to the room under it, then 0 with nothing left for it.
    let b = borrow(&mut center, "i", "partner", partner, 60, "p1").await.unwrap();
    assert_eq!((b.granted, b.center_available), (60, 40));
    let b = borrow(&mut center, "i", "partner", partner, 60, "p2").await.unwrap();
    assert_eq!((b.granted, b.center_available), (40, 0), "the center is dry for a channel at its cap");
    let b = borrow(&mut center, "i", "partner", partner, 60, "p3").await.unwrap();
    assert_eq!(b.granted, 0);

    // The slow channel took stock and its pool moved (a report): its floor is kept.
    assert_eq!(borrow(&mut center, "i", "slow", slow, 50, "s1").await.unwrap().granted, 50);
    let pool = pb::PoolReport { item_id: "i".into(), available: 50, sell_rate_milli: 1_000, ..Default::default() };
    let hb = pb::HeartbeatRequest { channel: "slow".into(), epoch: slow, pools: vec![pool], ..Default::default() };
    center.heartbeat(hb).await.expect("heartbeat");
    // 850 at the center, 150 kept for the slow channel's floor: the fast channel gets 700,
    // and sees the center dry for it.
    let b = borrow(&mut center, "i", "fast", fast, 10_000, "f1").await.unwrap();
    assert_eq!((b.granted, b.center_available), (700, 0));
    let many = center
        .borrow_many(pb::BorrowManyRequest {
            channel: "fast".into(),
            epoch: fast,
            lines: vec![pb::BorrowLine {
                item_id: "i".into(),
                quantity: 10,
                request_id: "f2".into(),
                ..Default::default()
            }],
        })
        .await
        .expect("borrow many")
        .into_inner();
    assert_eq!(many.results[0].granted, 0, "a BorrowMany line keeps the floor too");
    // The slow channel itself takes what was kept for it.
    let b = borrow(&mut center, "i", "slow", slow, 500, "s2").await.unwrap();
    assert_eq!((b.granted, b.center_available), (150, 0));
    let view = ledger(&mut admin, "i").await;
    assert_conserved(&view);
    let held = |name: &str| view.channels.iter().find(|l| l.channel == name).map(|l| l.held).unwrap();
    assert_eq!((held("fast"), held("partner"), held("slow")), (700, 100, 200));

    // A floor channel that never took stock of the item keeps no floor.
    admin.create_item(with_shares("j", 1_000, plan)).await.expect("create");
    assert_eq!(borrow(&mut center, "j", "fast", fast, 10_000, "jf1").await.unwrap().granted, 1_000);
}

async fn hostile_shares_are_refused_naming_the_field_and_create_nothing(c: TestCenter) {
    let mut admin = c.admin().await;
    let cases: Vec<(Vec<pb::ChannelShare>, &str)> = vec![
        (vec![share("", 1, 0, 0)], "channel_shares[0].channel"),
        (vec![share("a b", 1, 0, 0)], "channel_shares[0].channel"),
        (vec![share("app", 1, 0, 0), share("app", 1, 0, 0)], "channel_shares[1].channel"),
        (vec![share("app", u64::MAX, 0, 0)], "channel_shares[0].weight"),
        (vec![share("app", 1, u64::MAX, 0)], "channel_shares[0].cap_units"),
        (vec![share("app", 1, 1_001, 0)], "channel_shares[0].cap_units"),
        (vec![share("app", 1, 10, 11)], "channel_shares[0].floor_units"),
        (vec![share("app", 1, 0, u64::MAX)], "channel_shares[0].floor_units"),
        // Floors beyond the total less the reserve (5 % of 1,000 by default).
        (vec![share("app", 1, 0, 500), share("web", 1, 0, 451)], "channel_shares[1].floor_units"),
        ((0..300).map(|i| share(&format!("c{i}"), 1, 0, 0)).collect(), "channel_shares"),
    ];
    for (shares, field) in cases {
        let r = admin.create_item(with_shares("bad", 1_000, shares)).await;
        let status = r.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{field}: {}", status.message());
    }
    assert_status(admin.get_item(pb::GetItemRequest { item_id: "bad".into() }).await, Code::NotFound, "bad");
}
