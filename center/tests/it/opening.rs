//! Nothing leaves the center before an item's opening but the opening's stocking, against
//! PostgreSQL and SQLite: a Borrow before the prestock lead gets nothing and says when
//! the item opens, during the lead at most the channel's opening allocation (single
//! Borrow and BorrowMany alike), after the opening the reserve lends as ever; and a manual
//! CloseItem asks every channel to give back, as an automatic close at `closes_at` does.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::transport::Channel;

use crate::contract::{assert_conserved, borrow, ledger, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    before_the_opening_a_borrow_gets_only_the_opening_stock,
    close_item_asks_every_channel_to_give_back,
);

fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn planned(item: &str, opens_at: i64, prestock_lead_ms: u64) -> pb::CreateItemRequest {
    pb::CreateItemRequest {
        item_id: item.into(),
        total: 100,
        opens_at_unix_ms: opens_at,
        prestock_lead_ms,
        center_reserve: Some(10),
        ..Default::default()
    }
}

async fn borrow_many(
    center: &mut CenterClient<Channel>,
    item: &str,
    channel: &str,
    epoch: u64,
    quantity: u64,
    request_id: &str,
) -> pb::BorrowLineResult {
    let line = pb::BorrowLine { item_id: item.into(), quantity, request_id: request_id.into(), sell_rate_milli: 0 };
    let req = pb::BorrowManyRequest { channel: channel.into(), epoch, lines: vec![line] };
    let mut out = center.borrow_many(req).await.expect("borrow many").into_inner();
    out.results.remove(0)
}

async fn before_the_opening_a_borrow_gets_only_the_opening_stock(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let (app, web) = (register(&mut center, "app").await, register(&mut center, "web").await);
    // Opens in an hour; its lead starts in 59 minutes: nothing may leave yet.
    let opens = now_ms() + 3_600_000;
    admin.create_item(planned("early", opens, 60_000)).await.unwrap();
    let b = borrow(&mut center, "early", "app", app, 40, "e1").await.unwrap();
    assert_eq!((b.granted, b.opens_at_unix_ms), (0, opens), "before the lead: nothing, and when it opens");
    assert_eq!(b.center_available, 100, "the center is not dry for after the opening: {b:?}");
    let line = borrow_many(&mut center, "early", "app", app, 40, "e2").await;
    assert_eq!((line.code, line.granted, line.opens_at_unix_ms), (0, 0, opens), "{line:?}");
    assert_eq!(ledger(&mut admin, "early").await.item.unwrap().available, 100);

    // In its lead (two hours long): each live channel may take its opening allocation,
    // (100 − 10 reserved) / 2 = 45, and no more.
    admin.create_item(planned("lead", opens, 7_200_000)).await.unwrap();
    let b = borrow(&mut center, "lead", "app", app, 80, "l1").await.unwrap();
    assert_eq!((b.granted, b.opens_at_unix_ms), (45, opens), "{b:?}");
    assert_eq!(borrow(&mut center, "lead", "app", app, 5, "l2").await.unwrap().granted, 0, "already stocked");
    let line = borrow_many(&mut center, "lead", "web", web, 80, "l3").await;
    assert_eq!((line.code, line.granted, line.opens_at_unix_ms), (0, 45, opens), "{line:?}");
    let view = ledger(&mut admin, "lead").await;
    assert_eq!(view.item.as_ref().unwrap().available, 10, "the reserve stays at the center");
    assert_conserved(&view);

    // Opened (SetSchedule: an opening of 0 opens now): the reserve lends as ever.
    let open = pb::SetScheduleRequest { item_id: "lead".into(), opens_at_unix_ms: 0, closes_at_unix_ms: 0 };
    admin.set_schedule(open).await.unwrap();
    let b = borrow(&mut center, "lead", "app", app, 5, "l4").await.unwrap();
    assert_eq!((b.granted, b.center_available, b.opens_at_unix_ms), (5, 5, 0), "{b:?}");
}

/// The next event of the stream, within 5 s.
async fn next_event(stream: &mut tonic::Streaming<pb::ChannelEvent>) -> pb::channel_event::Event {
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.expect("an event within 5 s");
    event.unwrap().expect("stream open").event.expect("event set")
}

async fn close_item_asks_every_channel_to_give_back(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    admin.create_item(pb::CreateItemRequest { item_id: "k".into(), total: 100, ..Default::default() }).await.unwrap();
    let epoch = register(&mut center, "app").await;
    assert_eq!(borrow(&mut center, "k", "app", epoch, 30, "b1").await.unwrap().granted, 30);
    let mut events =
        center.watch_channel(pb::WatchChannelRequest { channel: "app".into(), epoch }).await.unwrap().into_inner();

    admin.close_item(pb::CloseItemRequest { item_id: "k".into(), closed: true }).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(next_event(&mut events).await);
    }
    assert!(
        seen.iter().any(|e| matches!(e, pb::channel_event::Event::WatermarksChanged(w) if w.item_id == "k")),
        "the agents re-read the closed item: {seen:?}"
    );
    assert!(
        seen.contains(&pb::channel_event::Event::ReturnRequested(pb::ReturnRequested { item_id: "k".into() })),
        "the end-of-sale return, as at closes_at: {seen:?}"
    );

    // Reopening asks nobody to give back: the next event is the settings' change alone.
    admin.close_item(pb::CloseItemRequest { item_id: "k".into(), closed: false }).await.unwrap();
    let reopened = next_event(&mut events).await;
    assert!(matches!(reopened, pb::channel_event::Event::WatermarksChanged(_)), "{reopened:?}");
    let quiet = tokio::time::timeout(Duration::from_millis(500), events.message()).await;
    assert!(quiet.is_err(), "no return asked on reopening: {quiet:?}");
}
