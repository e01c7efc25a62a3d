//! The ledger contract over gRPC, run against both PostgreSQL and SQLite.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::TestCenter;

crate::for_each_backend!(
    create_is_idempotent_on_the_definition,
    segments_are_part_of_the_definition_and_reach_the_agents,
    borrow_and_return_move_units_and_keep_conservation,
    borrow_grants_at_most_what_is_available,
    return_more_than_held_is_failed_precondition,
    add_stock_raises_total_once_per_request_id,
    borrow_replay_returns_the_first_answer,
    request_id_reused_with_another_payload_is_already_exists,
    stale_epoch_is_failed_precondition_and_changes_nothing,
    unknown_item_is_not_found,
    bad_input_is_invalid_argument_naming_the_field,
    watermarks_default_override_and_validation,
    reconcile_reports_drift_and_detects_corruption,
    watch_channel_streams_watermark_changes,
    health_and_reflection_are_served,
    close_item_stops_grants_and_reopen_restores_them,
    list_channels_shows_sessions_and_holdings,
    describe_item_answers_for_the_channel_asked_about,
    describe_items_answers_each_as_describe_item_does,
);

pub async fn create(admin: &mut AdminClient<Channel>, item: &str, total: u64) -> pb::Item {
    admin
        .create_item(pb::CreateItemRequest { item_id: item.into(), total, per_user_limit: 2, ..Default::default() })
        .await
        .expect("create item")
        .into_inner()
        .item
        .expect("item in response")
}

pub async fn register(center: &mut CenterClient<Channel>, channel: &str) -> u64 {
    center
        .register_agent(pb::RegisterAgentRequest {
            channel: channel.into(),
            agent_id: format!("{channel}-1"),
            fenced_at: 0,
        })
        .await
        .expect("register")
        .into_inner()
        .epoch
}

pub async fn borrow(
    center: &mut CenterClient<Channel>,
    item: &str,
    channel: &str,
    epoch: u64,
    quantity: u64,
    request_id: &str,
) -> Result<pb::BorrowResponse, tonic::Status> {
    center
        .borrow(pb::BorrowRequest {
            item_id: item.into(),
            channel: channel.into(),
            epoch,
            quantity,
            request_id: request_id.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

pub async fn give_back(
    center: &mut CenterClient<Channel>,
    item: &str,
    channel: &str,
    epoch: u64,
    quantity: u64,
    request_id: &str,
) -> Result<pb::ReturnResponse, tonic::Status> {
    center
        .r#return(pb::ReturnRequest {
            item_id: item.into(),
            channel: channel.into(),
            epoch,
            quantity,
            request_id: request_id.into(),
            write_seq_floors: vec![],
        })
        .await
        .map(|r| r.into_inner())
}

pub async fn ledger(admin: &mut AdminClient<Channel>, item: &str) -> pb::GetItemResponse {
    admin.get_item(pb::GetItemRequest { item_id: item.into() }).await.expect("get item").into_inner()
}

pub async fn reconcile(admin: &mut AdminClient<Channel>) -> pb::ReconcileResponse {
    admin.reconcile(pb::ReconcileRequest::default()).await.expect("reconcile").into_inner()
}

pub fn assert_conserved(view: &pb::GetItemResponse) {
    let item = view.item.as_ref().expect("item");
    let held: u64 = view.channels.iter().map(|c| c.held).sum();
    assert_eq!(item.total, item.available + held, "invariant 1 broken: {view:?}");
    assert_eq!(item.held, held);
}

#[track_caller]
pub fn assert_status(result: Result<impl std::fmt::Debug, tonic::Status>, code: Code, needle: &str) {
    let status = result.expect_err("call should fail");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(needle), "message {:?} should contain {needle:?}", status.message());
}

async fn create_is_idempotent_on_the_definition(c: TestCenter) {
    let mut admin = c.admin().await;
    let first = admin
        .create_item(pb::CreateItemRequest { item_id: "skin-1".into(), total: 100, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(first.created);
    let item = first.item.unwrap();
    assert_eq!((item.total, item.available, item.per_user_limit, item.reservation_ttl_ms), (100, 100, 1, 300_000));
    let again = admin
        .create_item(pb::CreateItemRequest { item_id: "skin-1".into(), total: 100, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    let other =
        admin.create_item(pb::CreateItemRequest { item_id: "skin-1".into(), total: 101, ..Default::default() }).await;
    assert_status(other, Code::AlreadyExists, "skin-1");
    let list = admin.list_items(pb::ListItemsRequest {}).await.unwrap().into_inner();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].total, 100);
}

async fn segments_are_part_of_the_definition_and_reach_the_agents(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let req = |segments| pb::CreateItemRequest { item_id: "hot".into(), total: 3000, segments, ..Default::default() };
    let first = admin.create_item(req(1)).await.unwrap().into_inner();
    assert!(first.created);
    assert_eq!(first.item.unwrap().segments, 1);
    // 0 and 1 both mean one pool: the same definition, a replay.
    assert!(!admin.create_item(req(0)).await.unwrap().into_inner().created);
    assert_eq!(ledger(&mut admin, "hot").await.item.unwrap().segments, 1);
    let d = pb::DescribeItemRequest { item_id: "hot".into(), channel: "app".into() };
    assert_eq!(center.describe_item(d).await.unwrap().into_inner().segments, 1);
    // Above the bound is refused, naming field and value.
    let one = pb::CreateItemRequest { item_id: "cold".into(), total: 5, ..Default::default() };
    assert_eq!(admin.create_item(one).await.unwrap().into_inner().item.unwrap().segments, 1);
    let many = pb::CreateItemRequest { item_id: "many".into(), total: 5, segments: 65, ..Default::default() };
    assert_status(admin.create_item(many).await, Code::InvalidArgument, "segments");
    let many = pb::CreateItemRequest { item_id: "many".into(), total: 5, segments: 65, ..Default::default() };
    assert_status(admin.create_item(many).await, Code::InvalidArgument, "65");
    assert_status(admin.get_item(pb::GetItemRequest { item_id: "many".into() }).await, Code::NotFound, "many");
    // Eight segments: recorded, part of the definition (another count is ALREADY_EXISTS),
    // and delivered to agents.
    let hot8 = |segments| pb::CreateItemRequest { item_id: "hot8".into(), total: 3000, segments, ..Default::default() };
    assert_eq!(admin.create_item(hot8(8)).await.unwrap().into_inner().item.unwrap().segments, 8);
    assert_status(admin.create_item(hot8(4)).await, Code::AlreadyExists, "segments");
    let d = pb::DescribeItemRequest { item_id: "hot8".into(), channel: "app".into() };
    assert_eq!(center.describe_item(d).await.unwrap().into_inner().segments, 8);
}

async fn borrow_and_return_move_units_and_keep_conservation(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    let b = borrow(&mut center, "i", "app", epoch, 30, "b1").await.unwrap();
    assert_eq!((b.granted, b.center_available, b.replayed), (30, 70, false));
    let r = give_back(&mut center, "i", "app", epoch, 10, "r1").await.unwrap();
    assert_eq!(r.center_available, 80);
    let view = ledger(&mut admin, "i").await;
    assert_conserved(&view);
    let app = &view.channels[0];
    assert_eq!((app.channel.as_str(), app.granted, app.returned, app.held), ("app", 30, 10, 20));
    // A re-registration sees what the channel holds.
    let again = center
        .register_agent(pb::RegisterAgentRequest { channel: "app".into(), agent_id: "app-2".into(), fenced_at: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.epoch, epoch + 1);
    assert_eq!(again.held, vec![pb::ChannelHolding { item_id: "i".into(), held: 20, ..Default::default() }]);
    assert!(reconcile(&mut admin).await.ok);
}

async fn borrow_grants_at_most_what_is_available(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    let b = borrow(&mut center, "i", "app", epoch, 150, "b1").await.unwrap();
    assert_eq!((b.granted, b.center_available), (100, 0));
    let b = borrow(&mut center, "i", "app", epoch, 1, "b2").await.unwrap();
    assert_eq!((b.granted, b.center_available), (0, 0));
    assert_conserved(&ledger(&mut admin, "i").await);
}

async fn return_more_than_held_is_failed_precondition(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 5, "b1").await.unwrap();
    assert_status(give_back(&mut center, "i", "app", epoch, 6, "r1").await, Code::FailedPrecondition, "holds 5");
    let view = ledger(&mut admin, "i").await;
    assert_eq!(view.item.unwrap().available, 95);
}

async fn add_stock_raises_total_once_per_request_id(c: TestCenter) {
    let mut admin = c.admin().await;
    create(&mut admin, "i", 100).await;
    let add = |q: u64, rid: &str| pb::AddStockRequest { item_id: "i".into(), quantity: q, request_id: rid.into() };
    let first = admin.add_stock(add(50, "restock-1")).await.unwrap().into_inner();
    assert!(!first.replayed);
    assert_eq!(first.item.as_ref().map(|i| (i.total, i.available)), Some((150, 150)));
    let replay = admin.add_stock(add(50, "restock-1")).await.unwrap().into_inner();
    assert!(replay.replayed);
    assert_eq!(replay.item.as_ref().map(|i| (i.total, i.available)), Some((150, 150)));
    assert_status(admin.add_stock(add(60, "restock-1")).await, Code::AlreadyExists, "restock-1");
    assert_eq!(ledger(&mut admin, "i").await.item.unwrap().total, 150);
}

async fn borrow_replay_returns_the_first_answer(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    let first = borrow(&mut center, "i", "app", epoch, 10, "b1").await.unwrap();
    borrow(&mut center, "i", "app", epoch, 5, "b2").await.unwrap();
    let replay = borrow(&mut center, "i", "app", epoch, 10, "b1").await.unwrap();
    assert!(replay.replayed);
    // The first answer, including the center_available of that moment.
    assert_eq!((replay.granted, replay.center_available), (first.granted, first.center_available));
    let view = ledger(&mut admin, "i").await;
    assert_eq!(view.channels[0].granted, 15);
    assert_conserved(&view);
    // A retry after re-registration carries the epoch it was first sent under: answered
    // from the record while that is kept, refused as stale once it is pruned; never
    // applied twice.
    register(&mut center, "app").await;
    match borrow(&mut center, "i", "app", epoch, 10, "b1").await {
        Ok(replay) => assert!(replay.replayed, "{replay:?}"),
        Err(s) => assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}"),
    }
    assert_eq!(ledger(&mut admin, "i").await.channels[0].granted, 15);
}

async fn request_id_reused_with_another_payload_is_already_exists(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 10, "req-7").await.unwrap();
    assert_status(borrow(&mut center, "i", "app", epoch, 11, "req-7").await, Code::AlreadyExists, "req-7");
    assert_status(give_back(&mut center, "i", "app", epoch, 10, "req-7").await, Code::AlreadyExists, "req-7");
    let view = ledger(&mut admin, "i").await;
    assert_eq!((view.channels[0].granted, view.channels[0].returned), (10, 0));
}

async fn stale_epoch_is_failed_precondition_and_changes_nothing(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let old = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", old, 10, "b1").await.unwrap();
    let new = register(&mut center, "app").await;
    assert!(new > old);
    assert_status(borrow(&mut center, "i", "app", old, 5, "b2").await, Code::FailedPrecondition, "stale epoch");
    assert_status(give_back(&mut center, "i", "app", old, 5, "r1").await, Code::FailedPrecondition, "stale epoch");
    let hb = center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch: old,
            pools: vec![pb::PoolReport {
                item_id: "i".into(),
                available: 1,
                reserved: 0,
                sold: 0,
                ..Default::default()
            }],
            ..Default::default()
        })
        .await;
    assert_status(hb, Code::FailedPrecondition, "stale epoch");
    // An epoch that was never issued is as bad as an old one.
    assert_status(borrow(&mut center, "i", "app", new + 5, 5, "b3").await, Code::FailedPrecondition, "stale epoch");
    assert_status(borrow(&mut center, "i", "web", 1, 5, "b4").await, Code::FailedPrecondition, "not registered");
    let view = ledger(&mut admin, "i").await;
    assert_eq!(view.item.as_ref().unwrap().available, 90);
    assert_eq!((view.channels[0].granted, view.channels[0].returned, view.channels[0].reported_available), (10, 0, 0));
}

async fn unknown_item_is_not_found(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let epoch = register(&mut center, "app").await;
    assert_status(borrow(&mut center, "i", "app", epoch, 1, "b1").await, Code::NotFound, "item \"i\" not found");
    assert_status(admin.get_item(pb::GetItemRequest { item_id: "nope".into() }).await, Code::NotFound, "nope");
    let add = pb::AddStockRequest { item_id: "nope".into(), quantity: 1, request_id: "a".into() };
    assert_status(admin.add_stock(add).await, Code::NotFound, "nope");
    let wm = pb::SetWatermarksRequest { item_id: "nope".into(), low: 1, high: 2, batch: 1, ..Default::default() };
    assert_status(admin.set_watermarks(wm).await, Code::NotFound, "nope");
    let d = pb::DescribeItemRequest { item_id: "nope".into(), channel: "app".into() };
    assert_status(center.describe_item(d).await, Code::NotFound, "nope");
}

async fn bad_input_is_invalid_argument_naming_the_field(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    let long = "x".repeat(10_000);
    let creates = [
        (pb::CreateItemRequest { item_id: "has space".into(), total: 1, ..Default::default() }, "item_id"),
        (pb::CreateItemRequest { item_id: "".into(), total: 1, ..Default::default() }, "item_id"),
        (pb::CreateItemRequest { item_id: long.clone(), total: 1, ..Default::default() }, "item_id"),
        (pb::CreateItemRequest { item_id: "j".into(), total: 0, ..Default::default() }, "invalid total 0"),
        (pb::CreateItemRequest { item_id: "j".into(), total: u64::MAX, ..Default::default() }, "invalid total"),
        (
            pb::CreateItemRequest { item_id: "j".into(), total: 1, reservation_ttl_ms: 5, ..Default::default() },
            "reservation_ttl_ms 5",
        ),
        (
            pb::CreateItemRequest { item_id: "j".into(), total: 1, per_user_limit: u64::MAX, ..Default::default() },
            "per_user_limit",
        ),
    ];
    for (req, needle) in creates {
        assert_status(admin.create_item(req).await, Code::InvalidArgument, needle);
    }
    let borrows = [
        ("i'; DROP TABLE items;--", "app", 1, "b", "invalid item_id"),
        ("i", "a/b", 1, "b", "invalid channel \"a/b\""),
        ("i", &"c".repeat(33), 1, "b", "invalid channel"),
        ("i", "app", 0, "b", "invalid quantity 0"),
        ("i", "app", 1_000_000_001, "b", "invalid quantity 1000000001"),
        ("i", "app", 1, "", "invalid request_id \"\""),
        ("i", "app", 1, "r\0", "invalid request_id"),
    ];
    for (item, channel, q, rid, needle) in borrows {
        assert_status(borrow(&mut center, item, channel, epoch, q, rid).await, Code::InvalidArgument, needle);
    }
    let reg = pb::RegisterAgentRequest { channel: "app".into(), agent_id: long, fenced_at: 0 };
    assert_status(center.register_agent(reg).await, Code::InvalidArgument, "invalid agent_id");
    let hb = pb::HeartbeatRequest {
        channel: "app".into(),
        epoch,
        pools: vec![
            pb::PoolReport { item_id: "i".into(), ..Default::default() },
            pb::PoolReport { item_id: "b a d".into(), ..Default::default() },
        ],
        ..Default::default()
    };
    assert_status(center.heartbeat(hb).await, Code::InvalidArgument, "pools[1].item_id");
    // Nothing changed.
    let view = ledger(&mut admin, "i").await;
    assert_eq!(view.item.unwrap().available, 100);
    assert!(view.channels.is_empty());
    assert_eq!(admin.list_items(pb::ListItemsRequest {}).await.unwrap().into_inner().items.len(), 1);
}

async fn watermarks_default_override_and_validation(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 1000).await;
    let get = |admin: &mut AdminClient<Channel>| {
        let mut admin = admin.clone();
        async move { admin.get_watermarks(pb::GetWatermarksRequest { item_id: "i".into() }).await.unwrap().into_inner() }
    };
    let initial = get(&mut admin).await;
    assert_eq!(initial.default_watermarks, Some(pb::Watermarks { low: 25, high: 100, batch: 50 }));
    let set = |channel: &str, low, high, batch| pb::SetWatermarksRequest {
        item_id: "i".into(),
        channel: channel.into(),
        low,
        high,
        batch,
        ..Default::default()
    };
    admin.set_watermarks(set("", 20, 80, 50)).await.unwrap();
    admin.set_watermarks(set("web", 5, 30, 10)).await.unwrap();
    let now = get(&mut admin).await;
    assert_eq!(now.default_watermarks, Some(pb::Watermarks { low: 20, high: 80, batch: 50 }));
    assert_eq!(now.overrides.len(), 1);
    assert_eq!(now.overrides[0].channel, "web");
    assert_eq!(now.overrides[0].watermarks, Some(pb::Watermarks { low: 5, high: 30, batch: 10 }));
    let describe = |channel: &str| pb::DescribeItemRequest { item_id: "i".into(), channel: channel.into() };
    let web = center.describe_item(describe("web")).await.unwrap().into_inner();
    assert_eq!(web.watermarks, Some(pb::Watermarks { low: 5, high: 30, batch: 10 }));
    let app = center.describe_item(describe("app")).await.unwrap().into_inner();
    assert_eq!(app.watermarks, Some(pb::Watermarks { low: 20, high: 80, batch: 50 }));
    assert_status(admin.set_watermarks(set("", 80, 80, 5)).await, Code::FailedPrecondition, "low watermark 80");
    assert_status(admin.set_watermarks(set("", 1, 8, 0)).await, Code::InvalidArgument, "invalid batch 0");
    assert_status(admin.set_watermarks(set("bad channel", 1, 8, 1)).await, Code::InvalidArgument, "invalid channel");
    assert_eq!(get(&mut admin).await, now, "rejected settings changed nothing");
}

async fn reconcile_reports_drift_and_detects_corruption(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 40, "b1").await.unwrap();
    let report = |available, reserved, sold| pb::HeartbeatRequest {
        channel: "app".into(),
        epoch,
        pools: vec![pb::PoolReport { item_id: "i".into(), available, reserved, sold, ..Default::default() }],
        ..Default::default()
    };
    center.heartbeat(report(30, 4, 6)).await.unwrap();
    let clean = reconcile(&mut admin).await;
    assert!(clean.ok && clean.violations.is_empty() && clean.drifts.is_empty(), "{clean:?}");
    assert_eq!(clean.items_checked, 1);
    center.heartbeat(report(30, 4, 5)).await.unwrap();
    let drifting = reconcile(&mut admin).await;
    assert!(drifting.ok, "drift alone is not a violation");
    assert_eq!(drifting.drifts.len(), 1);
    assert!(drifting.drifts[0].detail.contains("drift 1"), "{drifting:?}");
    assert_eq!(ledger(&mut admin, "i").await.channels[0].drift, 1);

    // Corrupt the ledger behind the center's back: reconcile must notice.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&c.database_url).await.unwrap();
    sqlx::query("UPDATE items SET available = available - 1 WHERE item_id = 'i'").execute(&pool).await.unwrap();
    pool.close().await;
    let broken = reconcile(&mut admin).await;
    assert!(!broken.ok);
    assert_eq!(broken.violations[0].invariant, "conservation");
    assert!(broken.violations[0].detail.contains("total 100 != center available 59 + held 40"), "{broken:?}");
}

async fn watch_channel_streams_watermark_changes(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 1000).await;
    let epoch = register(&mut center, "app").await;
    let mut stream =
        center.watch_channel(pb::WatchChannelRequest { channel: "app".into(), epoch }).await.unwrap().into_inner();
    // The subscription is live once the response headers arrived; change a setting.
    admin
        .set_watermarks(pb::SetWatermarksRequest {
            item_id: "i".into(),
            channel: "app".into(),
            low: 7,
            high: 70,
            batch: 14,
            ..Default::default()
        })
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.expect("event within 5 s");
    let event = event.unwrap().expect("stream open").event.expect("event set");
    assert_eq!(
        event,
        pb::channel_event::Event::WatermarksChanged(pb::WatermarksChanged {
            item_id: "i".into(),
            watermarks: Some(pb::Watermarks { low: 7, high: 70, batch: 14 }),
        })
    );
    let stale = center.watch_channel(pb::WatchChannelRequest { channel: "app".into(), epoch: epoch + 1 }).await;
    assert_status(stale.map(|_| ()), Code::FailedPrecondition, "stale epoch");
}

async fn health_and_reflection_are_served(c: TestCenter) {
    let channel = tonic::transport::Endpoint::from_shared(c.url()).unwrap().connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "inventory.v1.Center", "inventory.v1.Admin"] {
        let r =
            health.check(tonic_health::pb::HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(r.status(), tonic_health::pb::health_check_response::ServingStatus::Serving, "{service}");
    }
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let ask = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection.server_reflection_info(tokio_stream::once(ask)).await.unwrap().into_inner();
    let answer = answers.message().await.unwrap().expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected reflection answer {answer:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for wanted in ["inventory.v1.Center", "inventory.v1.Admin", "grpc.health.v1.Health"] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }
}

async fn close_item_stops_grants_and_reopen_restores_them(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    let close = |closed| pb::CloseItemRequest { item_id: "i".into(), closed };
    let closed = admin.close_item(close(true)).await.unwrap().into_inner().item.unwrap();
    assert!(closed.closed);
    let d = center.describe_item(pb::DescribeItemRequest { item_id: "i".into(), channel: "app".into() }).await;
    assert!(d.unwrap().into_inner().closed);
    let b = borrow(&mut center, "i", "app", epoch, 10, "b1").await.unwrap();
    assert_eq!(b.granted, 0);
    assert!(!admin.close_item(close(false)).await.unwrap().into_inner().item.unwrap().closed);
    assert_eq!(borrow(&mut center, "i", "app", epoch, 10, "b2").await.unwrap().granted, 10);
    assert_status(
        admin.close_item(pb::CloseItemRequest { item_id: "x y".into(), closed: true }).await,
        Code::InvalidArgument,
        "invalid item_id",
    );
}

async fn list_channels_shows_sessions_and_holdings(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let app = register(&mut center, "app").await;
    register(&mut center, "web").await;
    borrow(&mut center, "i", "app", app, 30, "b1").await.unwrap();
    center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch: app,
            pools: vec![pb::PoolReport {
                item_id: "i".into(),
                available: 20,
                reserved: 5,
                sold: 4,
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let all = admin.list_channels(pb::ListChannelsRequest::default()).await.unwrap().into_inner();
    let names: Vec<_> = all.channels.iter().map(|c| c.channel.as_str()).collect();
    assert_eq!(names, ["app", "web"]);
    let a = &all.channels[0];
    assert!(a.lease_live);
    assert_eq!((a.epoch, a.agent_id.as_str()), (app, "app-1"));
    assert_eq!(a.items.len(), 1);
    assert_eq!((a.items[0].held, a.items[0].reported_available, a.items[0].drift), (30, 20, 1));
    let one = admin.list_channels(pb::ListChannelsRequest { channel: "web".into() }).await.unwrap().into_inner();
    assert_eq!(one.channels.len(), 1);
    assert!(one.channels[0].items.is_empty());
    assert_status(
        admin.list_channels(pb::ListChannelsRequest { channel: "nope".into() }).await,
        Code::NotFound,
        "nope",
    );
}

/// DescribeItem (an agent's first use of an item): the item, and the asking channel's
/// watermarks and holding, whether the channel holds any of it and has its own watermarks
/// or not.
async fn describe_item_answers_for_the_channel_asked_about(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let app = register(&mut center, "app").await;
    let web = register(&mut center, "web").await;
    borrow(&mut center, "i", "app", app, 30, "a1").await.unwrap();
    borrow(&mut center, "i", "web", web, 20, "w1").await.unwrap();
    center
        .r#return(pb::ReturnRequest {
            item_id: "i".into(),
            channel: "web".into(),
            epoch: web,
            quantity: 5,
            request_id: "w2".into(),
            write_seq_floors: vec![],
        })
        .await
        .unwrap();
    let pool = pb::PoolReport { item_id: "i".into(), available: 15, generation: 7, ..Default::default() };
    center
        .heartbeat(pb::HeartbeatRequest { channel: "web".into(), epoch: web, pools: vec![pool], ..Default::default() })
        .await
        .unwrap();
    let wm = |low, high, batch| pb::Watermarks { low, high, batch };
    admin
        .set_watermarks(pb::SetWatermarksRequest {
            item_id: "i".into(),
            channel: "web".into(),
            low: 2,
            high: 9,
            batch: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    let describe = |channel: &str| pb::DescribeItemRequest { item_id: "i".into(), channel: channel.into() };
    let a = center.describe_item(describe("app")).await.unwrap().into_inner();
    let w = center.describe_item(describe("web")).await.unwrap().into_inner();
    let n = center.describe_item(describe("new")).await.unwrap().into_inner();
    let item_wm = a.watermarks;
    assert_ne!(item_wm, Some(wm(2, 9, 4)));
    assert_eq!((a.held, a.generation, a.in_doubt, a.center_available), (30, 0, 0, 55));
    assert_eq!((w.held, w.generation, w.watermarks), (15, 7, Some(wm(2, 9, 4))));
    assert!(w.rate_batching.is_none(), "a channel's own watermarks turn rate-following off");
    assert_eq!((n.held, n.generation, n.watermarks, n.center_available), (0, 0, item_wm, 55));
    assert_eq!((n.per_user_limit, n.closed, n.segments), (a.per_user_limit, false, 1));
    assert_status(
        center.describe_item(pb::DescribeItemRequest { item_id: "nope".into(), channel: "app".into() }).await,
        Code::NotFound,
        "nope",
    );
}

/// DescribeItems: each answer as DescribeItem gives it, in the order asked (an id twice,
/// twice), unknown ids named apart; its bounds and bad ids refused by name.
async fn describe_items_answers_each_as_describe_item_does(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    for (i, total) in [("a", 10), ("b", 20), ("c", 30)] {
        create(&mut admin, i, total).await;
    }
    let app = register(&mut center, "app").await;
    borrow(&mut center, "b", "app", app, 5, "b1").await.unwrap();
    let many = |ids: &[&str]| pb::DescribeItemsRequest {
        channel: "app".into(),
        item_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
    };
    let r = center.describe_items(many(&["c", "nope", "b", "a", "b"])).await.unwrap().into_inner();
    let ids: Vec<&str> = r.items.iter().map(|d| d.item_id.as_str()).collect();
    assert_eq!((ids, r.not_found), (vec!["c", "b", "a", "b"], vec!["nope".to_owned()]));
    for d in &r.items {
        let one = pb::DescribeItemRequest { item_id: d.item_id.clone(), channel: "app".into() };
        let one = center.describe_item(one).await.unwrap().into_inner();
        // The center's clock moves between the two answers; the rest is the same.
        let at = |d: &pb::DescribeItemResponse| pb::DescribeItemResponse { center_now_unix_ms: 0, ..d.clone() };
        assert_eq!(at(d), at(&one), "{}", d.item_id);
    }
    assert_eq!((r.items[1].held, r.items[1].center_available), (5, 15));

    assert_status(center.describe_items(many(&[])).await, Code::InvalidArgument, "item_ids");
    let too_many: Vec<String> = (0..501).map(|i| format!("i{i}")).collect();
    let refs: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert_status(center.describe_items(many(&refs)).await, Code::InvalidArgument, "item_ids");
    assert_status(center.describe_items(many(&["a", "bad id"])).await, Code::InvalidArgument, "item_ids[1]");
    let nameless = pb::DescribeItemsRequest { channel: String::new(), item_ids: vec!["a".into()] };
    assert_status(center.describe_items(nameless).await, Code::InvalidArgument, "channel");
}
