//! The plan of a sale at the center, against PostgreSQL and SQLite: a schedule and a
//! reserve stored with the item, shown to operators, delivered to agents (DescribeItem,
//! RegisterAgent, WatchChannel); moved by SetSchedule before the opening and only at its
//! end after; an item closed by its `closes_at`; hostile values refused naming the field.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::wait_until;
use tonic::Code;
use tonic::transport::Channel;

use crate::contract::{assert_status, borrow, ledger, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    a_schedule_is_stored_shown_and_delivered_to_agents,
    set_schedule_moves_everything_before_the_opening_and_only_the_end_after,
    closes_at_closes_the_item_and_asks_every_channel_to_give_back,
    hostile_schedule_values_are_refused_naming_the_field_and_change_nothing,
);

fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn scheduled(item: &str, total: u64, opens_at: i64, closes_at: i64) -> pb::CreateItemRequest {
    pb::CreateItemRequest {
        item_id: item.into(),
        total,
        opens_at_unix_ms: opens_at,
        closes_at_unix_ms: closes_at,
        ..Default::default()
    }
}

fn set(item: &str, opens_at: i64, closes_at: i64) -> pb::SetScheduleRequest {
    pb::SetScheduleRequest { item_id: item.into(), opens_at_unix_ms: opens_at, closes_at_unix_ms: closes_at }
}

/// The next event of the stream, within 5 s.
async fn next_event(stream: &mut tonic::Streaming<pb::ChannelEvent>) -> pb::channel_event::Event {
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.expect("an event within 5 s");
    event.unwrap().expect("stream open").event.expect("event set")
}

async fn watch(center: &mut CenterClient<Channel>, channel: &str, epoch: u64) -> tonic::Streaming<pb::ChannelEvent> {
    center.watch_channel(pb::WatchChannelRequest { channel: channel.into(), epoch }).await.unwrap().into_inner()
}

async fn a_schedule_is_stored_shown_and_delivered_to_agents(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let epoch = register(&mut center, "app").await;
    let mut events = watch(&mut center, "app", epoch).await;
    let opens = now_ms() + 3_600_000;
    let closes = opens + 600_000;
    let req = pb::CreateItemRequest {
        prestock_lead_ms: 20_000,
        center_reserve: Some(300),
        ..scheduled("launch", 3_000, opens, closes)
    };
    let created = admin.create_item(req.clone()).await.unwrap().into_inner();
    assert!(created.created);
    let item = created.item.unwrap();
    assert_eq!(
        (item.opens_at_unix_ms, item.closes_at_unix_ms, item.prestock_lead_ms, item.center_reserve),
        (opens, closes, 20_000, 300)
    );
    // Every watching channel hears of the new scheduled item at once.
    let told = pb::ItemSchedule {
        item_id: "launch".into(),
        opens_at_unix_ms: opens,
        closes_at_unix_ms: closes,
        prestock_lead_ms: 20_000,
        closed: false,
    };
    assert_eq!(next_event(&mut events).await, pb::channel_event::Event::ScheduleChanged(told.clone()));

    // Defaults: open now, no end, a 30 s lead, 5 % of the total kept back.
    let plain = admin
        .create_item(pb::CreateItemRequest { item_id: "plain".into(), total: 3_000, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .item
        .unwrap();
    assert_eq!(
        (plain.opens_at_unix_ms, plain.closes_at_unix_ms, plain.prestock_lead_ms, plain.center_reserve),
        (0, 0, 30_000, 150)
    );

    // Read back from the ledger, not echoed.
    let view = ledger(&mut admin, "launch").await;
    let shown = view.item.unwrap();
    assert_eq!((shown.opens_at_unix_ms, shown.closes_at_unix_ms, shown.center_reserve), (opens, closes, 300));
    let skew = (view.center_now_unix_ms - now_ms()).abs();
    assert!(skew < 5_000, "GetItem carries the center's clock: {skew} ms off");
    let list = admin.list_items(pb::ListItemsRequest {}).await.unwrap().into_inner();
    let opens_listed: Vec<_> = list.items.iter().map(|i| (i.item_id.as_str(), i.opens_at_unix_ms)).collect();
    assert_eq!(opens_listed, [("launch", opens), ("plain", 0)]);

    // The agent's item load carries it, with the center's clock.
    let d = center
        .describe_item(pb::DescribeItemRequest { item_id: "launch".into(), channel: "app".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((d.opens_at_unix_ms, d.closes_at_unix_ms, d.prestock_lead_ms), (opens, closes, 20_000));
    // The only live channel stocks the whole total less the reserve at the lead's start.
    assert_eq!(d.opening_allocation, 2_700);
    let plain_d = center
        .describe_item(pb::DescribeItemRequest { item_id: "plain".into(), channel: "app".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain_d.opening_allocation, 0, "an unscheduled item is stocked by its watermarks");
    assert!((d.center_now_unix_ms - now_ms()).abs() < 5_000);
    let many = center
        .describe_items(pb::DescribeItemsRequest { channel: "app".into(), item_ids: vec!["launch".into()] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((many.items[0].opens_at_unix_ms, many.items[0].opening_allocation), (opens, 2_700));

    // A registration lists every scheduled item not closed, held or not, and the holdings
    // carry their schedules.
    let reg = center
        .register_agent(pb::RegisterAgentRequest { channel: "web".into(), agent_id: "web-1".into(), fenced_at: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reg.scheduled, vec![told.clone()]);
    assert!((reg.center_now_unix_ms - now_ms()).abs() < 5_000);
    // Before the lead the center lends nothing (`opening.rs` has the rule); in its lead
    // the opening's stocking, and a holding shows the schedule.
    let b = borrow(&mut center, "launch", "web", reg.epoch, 5, "b1").await.unwrap();
    assert_eq!((b.granted, b.opens_at_unix_ms), (0, opens));
    let req = pb::CreateItemRequest { prestock_lead_ms: 7_200_000, ..scheduled("stocking", 100, opens, 0) };
    admin.create_item(req).await.unwrap();
    assert_eq!(borrow(&mut center, "stocking", "web", reg.epoch, 5, "b2").await.unwrap().granted, 5);
    let reg = center
        .register_agent(pb::RegisterAgentRequest { channel: "web".into(), agent_id: "web-1".into(), fenced_at: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(reg.held.iter().all(|h| h.item_id != "launch"), "{reg:?}");
    let holding = reg.held.iter().find(|h| h.item_id == "stocking").expect("holding");
    let stocking = holding.schedule.as_ref().expect("a schedule");
    assert_eq!((stocking.opens_at_unix_ms, stocking.prestock_lead_ms), (opens, 7_200_000));
    let hb = center
        .heartbeat(pb::HeartbeatRequest { channel: "web".into(), epoch: reg.epoch, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!((hb.center_now_unix_ms - now_ms()).abs() < 5_000);

    // Not part of the definition: a create with another schedule returns the item as it is.
    let again = admin.create_item(scheduled("launch", 3_000, opens + 1, 0)).await.unwrap().into_inner();
    assert!(!again.created);
    assert_eq!(again.item.unwrap().opens_at_unix_ms, opens, "unchanged: SetSchedule moves it");
}

async fn set_schedule_moves_everything_before_the_opening_and_only_the_end_after(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let opens = now_ms() + 3_600_000;
    admin.create_item(scheduled("s", 100, opens, 0)).await.unwrap();
    let epoch = register(&mut center, "app").await;
    let mut events = watch(&mut center, "app", epoch).await;
    // A stream starts with the schedules as they stand: a channel that was not watching
    // when the item was created hears of it now.
    match next_event(&mut events).await {
        pb::channel_event::Event::ScheduleChanged(s) => {
            assert_eq!((s.item_id.as_str(), s.opens_at_unix_ms, s.closes_at_unix_ms, s.closed), ("s", opens, 0, false));
        }
        other => panic!("expected the standing schedule, got {other:?}"),
    }

    // Before the opening both move, and every channel hears of it.
    let later = opens + 60_000;
    let moved = admin.set_schedule(set("s", later, later + 1_000)).await.unwrap().into_inner();
    let item = moved.item.unwrap();
    assert_eq!((item.opens_at_unix_ms, item.closes_at_unix_ms), (later, later + 1_000));
    // On PostgreSQL the creation's event reaches the stream through the database's
    // notifications, and may arrive after the stream's start: the standing schedule again
    // (delivery is at least once). Skipped, a few times at most.
    let mut next = next_event(&mut events).await;
    for _ in 0..3 {
        match &next {
            pb::channel_event::Event::ScheduleChanged(s) if (s.opens_at_unix_ms, s.closes_at_unix_ms) == (opens, 0) => {
                next = next_event(&mut events).await;
            }
            _ => break,
        }
    }
    match next {
        pb::channel_event::Event::ScheduleChanged(s) => {
            assert_eq!((s.item_id.as_str(), s.opens_at_unix_ms, s.closes_at_unix_ms), ("s", later, later + 1_000));
        }
        other => panic!("expected the schedule, got {other:?}"),
    }
    assert_eq!(ledger(&mut admin, "s").await.item.unwrap().opens_at_unix_ms, later);

    // Open it soon, and wait until it has opened by the center's clock.
    let soon = now_ms() + 300;
    admin.set_schedule(set("s", soon, 0)).await.unwrap();
    assert!(wait_until(Duration::from_secs(5), || async { now_ms() > soon + 50 }).await, "the opening passed");
    // After the opening: the opening stays.
    assert_status(admin.set_schedule(set("s", soon + 10_000, 0)).await, Code::FailedPrecondition, "opened at");
    assert_status(admin.set_schedule(set("s", 1, 0)).await, Code::FailedPrecondition, "only closes_at_unix_ms");
    // ... and the end moves, later or earlier; 0 or the same opening both keep it.
    let end = now_ms() + 3_600_000;
    let r = admin.set_schedule(set("s", soon, end)).await.unwrap().into_inner().item.unwrap();
    assert_eq!((r.opens_at_unix_ms, r.closes_at_unix_ms), (soon, end));
    let r = admin.set_schedule(set("s", 0, end - 1_000)).await.unwrap().into_inner().item.unwrap();
    assert_eq!((r.opens_at_unix_ms, r.closes_at_unix_ms), (soon, end - 1_000));
    let r = admin.set_schedule(set("s", 0, 0)).await.unwrap().into_inner().item.unwrap();
    assert_eq!((r.opens_at_unix_ms, r.closes_at_unix_ms, r.closed), (soon, 0, false));
    // An end in the past is closing now, which is CloseItem.
    assert_status(admin.set_schedule(set("s", 0, now_ms() - 1)).await, Code::InvalidArgument, "closes_at_unix_ms");
    assert_status(admin.set_schedule(set("nope", 0, 0)).await, Code::NotFound, "nope");
    // An opening of 0 before the opening opens the item now.
    admin.create_item(scheduled("t", 10, now_ms() + 3_600_000, 0)).await.unwrap();
    let r = admin.set_schedule(set("t", 0, 0)).await.unwrap().into_inner().item.unwrap();
    assert_eq!(r.opens_at_unix_ms, 0);
}

async fn closes_at_closes_the_item_and_asks_every_channel_to_give_back(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let closes = now_ms() + 1_000;
    admin.create_item(scheduled("c", 100, 0, closes)).await.unwrap();
    let epoch = register(&mut center, "app").await;
    assert_eq!(borrow(&mut center, "c", "app", epoch, 10, "b1").await.unwrap().granted, 10);
    let mut events = watch(&mut center, "app", epoch).await;
    assert!(now_ms() < closes, "watching before closes_at (test too slow)");

    let closed = wait_until(Duration::from_secs(10), || {
        let mut admin = admin.clone();
        async move { ledger(&mut admin, "c").await.item.unwrap().closed }
    })
    .await;
    assert!(closed, "the center closed the item by its schedule");
    assert!(now_ms() >= closes, "not before closes_at");
    // The stream started with the item's schedule as it stood (the watch opened before it
    // closed: the test asserts it was opened within the second). On PostgreSQL the
    // creation's own notification may come after it, the same schedule again.
    let return_requested = pb::channel_event::Event::ReturnRequested(pb::ReturnRequested { item_id: "c".into() });
    let mut seen = Vec::new();
    while seen.len() < 6 && !seen.contains(&return_requested) {
        seen.push(next_event(&mut events).await);
    }
    assert!(
        matches!(&seen[0], pb::channel_event::Event::ScheduleChanged(s) if s.item_id == "c" && !s.closed),
        "the standing schedule first: {seen:?}"
    );
    assert!(
        seen.iter().any(|e| matches!(e, pb::channel_event::Event::ScheduleChanged(s) if s.item_id == "c" && s.closed)),
        "{seen:?}"
    );
    assert!(seen.contains(&return_requested), "the end-of-sale return: {seen:?}");
    // No more grants; what the channel holds comes back by Return as ever.
    assert_eq!(borrow(&mut center, "c", "app", epoch, 5, "b2").await.unwrap().granted, 0);
    let back = center
        .r#return(pb::ReturnRequest {
            item_id: "c".into(),
            channel: "app".into(),
            epoch,
            quantity: 10,
            request_id: "r1".into(),
            write_seq_floors: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(back.center_available, 100);

    // Reopening needs the end moved first.
    let reopen = pb::CloseItemRequest { item_id: "c".into(), closed: false };
    assert_status(admin.close_item(reopen.clone()).await, Code::FailedPrecondition, "closes_at_unix_ms");
    admin.set_schedule(set("c", 0, now_ms() + 3_600_000)).await.unwrap();
    let item = admin.close_item(reopen).await.unwrap().into_inner().item.unwrap();
    assert!(!item.closed);
    assert_eq!(borrow(&mut center, "c", "app", epoch, 5, "b3").await.unwrap().granted, 5);
}

/// Everything an operator sees of the ledger.
async fn state(admin: &mut AdminClient<Channel>) -> String {
    let items = admin.list_items(pb::ListItemsRequest {}).await.unwrap().into_inner();
    format!("{items:?}")
}

#[track_caller]
fn refused<T: std::fmt::Debug>(what: &str, field: &str, r: Result<T, tonic::Status>) {
    let s = r.expect_err(what);
    assert_eq!(s.code(), Code::InvalidArgument, "{what}: {s:?}");
    assert!(s.message().contains(field), "{what}: message {:?} should name {field}", s.message());
}

async fn hostile_schedule_values_are_refused_naming_the_field_and_change_nothing(c: TestCenter) {
    let mut admin = c.admin().await;
    let opens = now_ms() + 3_600_000;
    admin.create_item(scheduled("i", 100, opens, 0)).await.unwrap();
    let before = state(&mut admin).await;
    let year_10000 = 253_402_300_800_000;
    for t in [-1, i64::MIN, i64::MAX, year_10000] {
        refused(&format!("opens {t}"), "opens_at_unix_ms", admin.create_item(scheduled("j", 10, t, 0)).await);
        refused(&format!("closes {t}"), "closes_at_unix_ms", admin.create_item(scheduled("j", 10, 0, t)).await);
        refused(&format!("set opens {t}"), "opens_at_unix_ms", admin.set_schedule(set("i", t, 0)).await);
        refused(&format!("set closes {t}"), "closes_at_unix_ms", admin.set_schedule(set("i", opens, t)).await);
    }
    // The end at or before the opening, or already past.
    for closes in [opens, opens - 1, 1] {
        refused("closes before opens", "closes_at_unix_ms", admin.create_item(scheduled("j", 10, opens, closes)).await);
        refused("set closes before opens", "closes_at_unix_ms", admin.set_schedule(set("i", opens, closes)).await);
    }
    refused("closes past", "closes_at_unix_ms", admin.create_item(scheduled("j", 10, 0, now_ms() - 1_000)).await);
    // A lead longer than a day; a reserve above the total.
    for lead in [86_400_001, u64::MAX] {
        let r = pb::CreateItemRequest { prestock_lead_ms: lead, ..scheduled("j", 10, opens, 0) };
        refused(&format!("lead {lead}"), "prestock_lead_ms", admin.create_item(r).await);
    }
    for reserve in [11, u64::MAX] {
        let r = pb::CreateItemRequest { center_reserve: Some(reserve), ..scheduled("j", 10, opens, 0) };
        refused(&format!("reserve {reserve}"), "center_reserve", admin.create_item(r).await);
    }
    for bad in ["", "a b", "i'; DROP TABLE items; --", "{app:i}", &"x".repeat(10 * 1024)] {
        refused("set item_id", "item_id", admin.set_schedule(set(bad, 0, 0)).await);
    }
    assert_eq!(state(&mut admin).await, before, "refused calls changed nothing");
    // The edges themselves are accepted.
    let r = pb::CreateItemRequest {
        prestock_lead_ms: 86_400_000,
        center_reserve: Some(10),
        ..scheduled("k", 10, opens, 0)
    };
    let item = admin.create_item(r).await.unwrap().into_inner().item.unwrap();
    assert_eq!((item.prestock_lead_ms, item.center_reserve), (86_400_000, 10));
}
