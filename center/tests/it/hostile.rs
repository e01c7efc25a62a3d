//! Hostile values in every string and number field of every Center and Admin RPC: each is
//! refused with INVALID_ARGUMENT naming the field, before any I/O, and the ledger is
//! exactly as it was.

use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::contract::{borrow, create, register};
use crate::support::{Backend, TestCenter};

fn hostile_strings() -> Vec<(&'static str, String)> {
    vec![
        ("empty", String::new()),
        ("10 KB", "x".repeat(10 * 1024)),
        ("NUL byte", "a\0b".into()),
        ("space", "a b".into()),
        ("SQL", "i'; DROP TABLE items; --".into()),
        ("Lua", "k') redis.call('FLUSHALL') --".into()),
        ("hash tag", "{app:i}".into()),
        ("newline", "a\nb".into()),
        ("unicode", "ｉｔｅｍ".into()),
    ]
}

/// Everything an operator can see, to prove a refused call changed nothing.
async fn ledger_state(admin: &mut AdminClient<Channel>) -> String {
    let items = admin.list_items(pb::ListItemsRequest {}).await.unwrap().into_inner();
    let channels = admin.list_channels(pb::ListChannelsRequest::default()).await.unwrap().into_inner();
    let mut item = admin.get_item(pb::GetItemRequest { item_id: "i".into() }).await.unwrap().into_inner();
    item.center_now_unix_ms = 0; // the center's clock moves
    let wm = admin.get_watermarks(pb::GetWatermarksRequest { item_id: "i".into() }).await.unwrap().into_inner();
    // Lease times move with heartbeats; nothing here sends any, so the whole view is stable.
    format!("{items:?}{channels:?}{item:?}{wm:?}")
}

#[track_caller]
fn refused<T: std::fmt::Debug>(what: &str, field: &str, r: Result<T, tonic::Status>) {
    let s = r.expect_err(what);
    assert_eq!(s.code(), Code::InvalidArgument, "{what}: {s:?}");
    assert!(s.message().contains(field), "{what}: message {:?} should name {field}", s.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_of_every_rpc_refuses_hostile_values() {
    let c = TestCenter::start(Backend::Postgres).await;
    let (mut admin, mut center): (AdminClient<Channel>, CenterClient<Channel>) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 10, "b0").await.unwrap();
    let before = ledger_state(&mut admin).await;

    for (label, v) in hostile_strings() {
        let what = |rpc: &str, field: &str| format!("{rpc}.{field} = {label}");
        // Center service.
        let r = center
            .register_agent(pb::RegisterAgentRequest { channel: v.clone(), agent_id: "a".into(), fenced_at: 0 })
            .await;
        refused(&what("RegisterAgent", "channel"), "channel", r);
        let r = center
            .register_agent(pb::RegisterAgentRequest { channel: "app".into(), agent_id: v.clone(), fenced_at: 0 })
            .await;
        refused(&what("RegisterAgent", "agent_id"), "agent_id", r);
        let b = |item: &str, channel: &str, rid: &str| pb::BorrowRequest {
            item_id: item.into(),
            channel: channel.into(),
            epoch,
            quantity: 1,
            request_id: rid.into(),
            ..Default::default()
        };
        refused(&what("Borrow", "item_id"), "item_id", center.borrow(b(&v, "app", "r")).await);
        refused(&what("Borrow", "channel"), "channel", center.borrow(b("i", &v, "r")).await);
        refused(&what("Borrow", "request_id"), "request_id", center.borrow(b("i", "app", &v)).await);
        let rt = |item: &str, channel: &str, rid: &str| pb::ReturnRequest {
            item_id: item.into(),
            channel: channel.into(),
            epoch,
            quantity: 1,
            request_id: rid.into(),
            write_seq_floors: vec![],
        };
        refused(&what("Return", "item_id"), "item_id", center.r#return(rt(&v, "app", "r")).await);
        refused(&what("Return", "channel"), "channel", center.r#return(rt("i", &v, "r")).await);
        refused(&what("Return", "request_id"), "request_id", center.r#return(rt("i", "app", &v)).await);
        let hb = |channel: &str, item: &str| pb::HeartbeatRequest {
            channel: channel.into(),
            epoch,
            pools: vec![pb::PoolReport { item_id: item.into(), ..Default::default() }],
            ..Default::default()
        };
        refused(&what("Heartbeat", "channel"), "channel", center.heartbeat(hb(&v, "i")).await);
        refused(&what("Heartbeat", "pools[0].item_id"), "pools[0].item_id", center.heartbeat(hb("app", &v)).await);
        let d = pb::DescribeItemRequest { item_id: v.clone(), channel: "app".into() };
        refused(&what("DescribeItem", "item_id"), "item_id", center.describe_item(d).await);
        let w = pb::WatchChannelRequest { channel: v.clone(), epoch };
        refused(&what("WatchChannel", "channel"), "channel", center.watch_channel(w).await.map(|_| ()));
        if !v.is_empty() {
            let d = pb::DescribeItemRequest { item_id: "i".into(), channel: v.clone() };
            refused(&what("DescribeItem", "channel"), "channel", center.describe_item(d).await);
        }
        let ds = |channel: &str, item: &str| pb::DescribeItemsRequest {
            channel: channel.into(),
            item_ids: vec!["i".into(), item.into()],
        };
        refused(&what("DescribeItems", "channel"), "channel", center.describe_items(ds(&v, "i")).await);
        refused(&what("DescribeItems", "item_ids[1]"), "item_ids[1]", center.describe_items(ds("app", &v)).await);

        // Admin service.
        let ci = pb::CreateItemRequest { item_id: v.clone(), total: 1, ..Default::default() };
        refused(&what("CreateItem", "item_id"), "item_id", admin.create_item(ci).await);
        let a = pb::AddStockRequest { item_id: v.clone(), quantity: 1, request_id: "r".into() };
        refused(&what("AddStock", "item_id"), "item_id", admin.add_stock(a).await);
        let a = pb::AddStockRequest { item_id: "i".into(), quantity: 1, request_id: v.clone() };
        refused(&what("AddStock", "request_id"), "request_id", admin.add_stock(a).await);
        refused(
            &what("GetItem", "item_id"),
            "item_id",
            admin.get_item(pb::GetItemRequest { item_id: v.clone() }).await,
        );
        let w = pb::SetWatermarksRequest { item_id: v.clone(), low: 1, high: 2, batch: 1, ..Default::default() };
        refused(&what("SetWatermarks", "item_id"), "item_id", admin.set_watermarks(w).await);
        let g = pb::GetWatermarksRequest { item_id: v.clone() };
        refused(&what("GetWatermarks", "item_id"), "item_id", admin.get_watermarks(g).await);
        let rs = pb::ResolveInDoubtRequest { item_id: v.clone(), channel: "app".into(), sold: 0 };
        refused(&what("ResolveInDoubt", "item_id"), "item_id", admin.resolve_in_doubt(rs).await);
        let rs = pb::ResolveInDoubtRequest { item_id: "i".into(), channel: v.clone(), sold: 0 };
        refused(&what("ResolveInDoubt", "channel"), "channel", admin.resolve_in_doubt(rs).await);
        let cl = pb::CloseItemRequest { item_id: v.clone(), closed: true };
        refused(&what("CloseItem", "item_id"), "item_id", admin.close_item(cl).await);
        refused(&what("Reclaim", "channel"), "channel", admin.reclaim(pb::ReclaimRequest { channel: v.clone() }).await);
        let rm = pb::RemoveChannelRequest { channel: v.clone() };
        refused(&what("RemoveChannel", "channel"), "channel", admin.remove_channel(rm).await);
        if !v.is_empty() {
            let w = pb::SetWatermarksRequest {
                item_id: "i".into(),
                channel: v.clone(),
                low: 1,
                high: 2,
                batch: 1,
                ..Default::default()
            };
            refused(&what("SetWatermarks", "channel"), "channel", admin.set_watermarks(w).await);
            let r = pb::ReconcileRequest { item_id: v.clone() };
            refused(&what("Reconcile", "item_id"), "item_id", admin.reconcile(r).await);
            let l = pb::ListChannelsRequest { channel: v.clone() };
            refused(&what("ListChannels", "channel"), "channel", admin.list_channels(l).await);
        }
    }

    // Numbers: zero where it matters, maximal, and "negative" (a client's -1 is u64::MAX).
    for n in [0, u64::MAX, 1_000_000_001] {
        let q = |q: u64| pb::BorrowRequest {
            item_id: "i".into(),
            channel: "app".into(),
            epoch,
            quantity: q,
            request_id: "rq".into(),
            ..Default::default()
        };
        refused(&format!("Borrow.quantity = {n}"), "quantity", center.borrow(q(n)).await);
        let r = pb::ReturnRequest {
            item_id: "i".into(),
            channel: "app".into(),
            epoch,
            quantity: n,
            request_id: "rq".into(),
            write_seq_floors: vec![],
        };
        refused(&format!("Return.quantity = {n}"), "quantity", center.r#return(r).await);
        if n == u64::MAX {
            // A write sequence the ledger cannot store, and more than a pool has segments.
            let r = |floors: Vec<u64>| pb::ReturnRequest {
                item_id: "i".into(),
                channel: "app".into(),
                epoch,
                quantity: 1,
                request_id: "rq".into(),
                write_seq_floors: floors,
            };
            let field = "write_seq_floors[1]";
            refused("Return.write_seq_floors[1] = max", field, center.r#return(r(vec![3, n])).await);
            refused("Return.write_seq_floors x65", "write_seq_floors", center.r#return(r(vec![3; 65])).await);
        }
        let a = pb::AddStockRequest { item_id: "i".into(), quantity: n, request_id: "rq".into() };
        refused(&format!("AddStock.quantity = {n}"), "quantity", admin.add_stock(a).await);
        let ci = pb::CreateItemRequest { item_id: "j".into(), total: n, ..Default::default() };
        refused(&format!("CreateItem.total = {n}"), "total", admin.create_item(ci).await);
        if n != 0 {
            let ci = pb::CreateItemRequest { item_id: "j".into(), total: 1, per_user_limit: n, ..Default::default() };
            refused(&format!("CreateItem.per_user_limit = {n}"), "per_user_limit", admin.create_item(ci).await);
            let ci =
                pb::CreateItemRequest { item_id: "j".into(), total: 1, reservation_ttl_ms: n, ..Default::default() };
            refused(&format!("CreateItem.reservation_ttl_ms = {n}"), "reservation_ttl_ms", admin.create_item(ci).await);
            let rs = pb::ResolveInDoubtRequest { item_id: "i".into(), channel: "app".into(), sold: n };
            if n == u64::MAX {
                refused("ResolveInDoubt.sold = max", "sold", admin.resolve_in_doubt(rs).await);
            }
        }
        let wm = |low, high, batch| pb::SetWatermarksRequest {
            item_id: "i".into(),
            channel: String::new(),
            low,
            high,
            batch,
            ..Default::default()
        };
        if n != 0 {
            refused(&format!("SetWatermarks.high = {n}"), "high", admin.set_watermarks(wm(1, n, 1)).await);
            refused(&format!("SetWatermarks.low = {n}"), "low", admin.set_watermarks(wm(n, u64::MAX, 1)).await);
        }
        refused(&format!("SetWatermarks.batch = {n}"), "batch", admin.set_watermarks(wm(1, 5, n)).await);
        let ci = pb::CreateItemRequest {
            item_id: "j".into(),
            total: 1,
            watermarks: Some(pb::Watermarks { low: 1, high: 5, batch: n }),
            ..Default::default()
        };
        refused(&format!("CreateItem.watermarks.batch = {n}"), "batch", admin.create_item(ci).await);
    }

    assert_eq!(ledger_state(&mut admin).await, before, "a refused request changed the ledger");
    let r = admin.reconcile(pb::ReconcileRequest::default()).await.unwrap().into_inner();
    assert!(r.ok);
}

/// A message whose field 1 is raw bytes: lets the test put invalid UTF-8 where every RPC
/// expects its first string.
#[derive(Clone, PartialEq, prost::Message)]
struct RawFirstField {
    #[prost(bytes = "vec", tag = "1")]
    first: Vec<u8>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_at_the_byte_level_is_invalid_argument() {
    let c = TestCenter::start(Backend::Sqlite).await;
    let mut admin = c.admin().await;
    create(&mut admin, "i", 100).await;
    let before = ledger_state(&mut admin).await;
    let channel = tonic::transport::Endpoint::from_shared(c.url()).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    let paths = [
        "/inventory.v1.Center/RegisterAgent",
        "/inventory.v1.Center/Borrow",
        "/inventory.v1.Center/Return",
        "/inventory.v1.Center/Heartbeat",
        "/inventory.v1.Center/DescribeItem",
        "/inventory.v1.Admin/CreateItem",
        "/inventory.v1.Admin/AddStock",
        "/inventory.v1.Admin/GetItem",
        "/inventory.v1.Admin/SetWatermarks",
        "/inventory.v1.Admin/GetWatermarks",
        "/inventory.v1.Admin/Reconcile",
        "/inventory.v1.Admin/Reclaim",
        "/inventory.v1.Admin/RemoveChannel",
        "/inventory.v1.Admin/ResolveInDoubt",
        "/inventory.v1.Admin/CloseItem",
        "/inventory.v1.Admin/ListChannels",
    ];
    for path in paths {
        grpc.ready().await.unwrap();
        let raw = RawFirstField { first: vec![b'i', 0xff, 0xfe, b'x'] };
        let codec = tonic_prost::ProstCodec::<RawFirstField, RawFirstField>::default();
        let r = grpc
            .unary(tonic::Request::new(raw), tonic::codegen::http::uri::PathAndQuery::from_static(path), codec)
            .await;
        let s = r.expect_err(path);
        assert_eq!(s.code(), Code::InvalidArgument, "{path}: {s:?}");
        assert!(s.message().contains("malformed message"), "{path}: {s:?}");
    }
    assert_eq!(ledger_state(&mut admin).await, before);
}

/// Heartbeat counts and generations are stored as signed 64-bit numbers: a value that
/// would wrap (or that no pool can hold) is refused naming the field and the value, and
/// the largest storable generation reads back unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_numbers_are_checked_at_the_edge() {
    let c = TestCenter::start(Backend::Postgres).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 10, "b0").await.unwrap();
    let before = ledger_state(&mut admin).await;
    type Tweak<'a> = &'a dyn Fn(&mut pb::PoolReport);
    let report = |tweak: Tweak| {
        let mut p = pb::PoolReport { item_id: "i".into(), available: 10, generation: 7, ..Default::default() };
        tweak(&mut p);
        pb::HeartbeatRequest { channel: "app".into(), epoch, pools: vec![p], ..Default::default() }
    };
    let huge = [1_000_000_001, 1 << 63, u64::MAX];
    for n in huge {
        let cases: [(&str, Tweak); 3] = [
            ("pools[0].available", &|p| p.available = n),
            ("pools[0].reserved", &|p| p.reserved = n),
            ("pools[0].sold", &|p| p.sold = n),
        ];
        for (field, tweak) in cases {
            let s = center.heartbeat(report(tweak)).await.expect_err(field);
            assert_eq!(s.code(), Code::InvalidArgument, "{field} = {n}: {s:?}");
            assert!(s.message().contains(field) && s.message().contains(&n.to_string()), "{s:?}");
            assert_eq!(s.message(), s.message().to_lowercase(), "lowercase: {s:?}");
        }
    }
    for n in [1 << 63, u64::MAX] {
        let s = center.heartbeat(report(&|p| p.generation = n)).await.expect_err("generation");
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains("pools[0].generation") && s.message().contains(&n.to_string()), "{s:?}");
    }
    // Lost segments: a segment number past the largest item's, or every segment named.
    for bad in [64, 1_000, u32::MAX] {
        let s = center.heartbeat(report(&|p| p.lost_segments = vec![1, bad])).await.expect_err("segment");
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains("pools[0].lost_segments[1]") && s.message().contains(&bad.to_string()), "{s:?}");
    }
    let s = center.heartbeat(report(&|p| p.lost_segments = (0..64).collect())).await.expect_err("all segments");
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("pools[0].lost_segments") && s.message().contains("64"), "{s:?}");
    assert_eq!(ledger_state(&mut admin).await, before, "a refused heartbeat changed the ledger");

    let max = u64::try_from(i64::MAX).unwrap();
    center.heartbeat(report(&|p| p.generation = max)).await.expect("largest storable generation");
    let view = admin.get_item(pb::GetItemRequest { item_id: "i".into() }).await.unwrap().into_inner();
    assert_eq!(view.channels[0].generation, max);
}
