//! Events reach the watchers of a channel (`WatchChannel`), or the watchers are told to
//! watch again (UNAVAILABLE), after which an agent re-reads every item's settings: a
//! watcher that fell behind, a PostgreSQL listener cut or back from an outage, and
//! notifications that failed to go out.

use std::sync::atomic::Ordering;
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use crate::contract::{create, register};
use crate::support::{Backend, TestCenter};

const WAIT: Duration = Duration::from_secs(10);

/// The next message of `stream` within [`WAIT`]: an event, or the status it ended with.
async fn next(stream: &mut Streaming<pb::ChannelEvent>) -> Result<pb::channel_event::Event, tonic::Status> {
    let message = tokio::time::timeout(WAIT, stream.message()).await.expect("an answer within 10 s")?;
    Ok(message.expect("the stream ends with a status, not quietly").event.expect("event set"))
}

/// Asserts that `stream` ends UNAVAILABLE, telling its watcher to watch again, after at
/// most `events` events; answers how many came first.
async fn ends_telling_to_watch_again(stream: &mut Streaming<pb::ChannelEvent>, events: usize) -> usize {
    for n in 0..=events {
        match next(stream).await {
            Ok(_) => continue,
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(status.message().contains("watch again"), "{status:?}");
                return n;
            }
        }
    }
    panic!("the stream went on past {events} events");
}

async fn watch(center: &mut CenterClient<Channel>, epoch: u64) -> Streaming<pb::ChannelEvent> {
    center.watch_channel(pb::WatchChannelRequest { channel: "app".into(), epoch }).await.unwrap().into_inner()
}

fn watermarks(low: u64) -> pb::SetWatermarksRequest {
    pb::SetWatermarksRequest {
        item_id: "i".into(),
        channel: "app".into(),
        low,
        high: 90,
        batch: 10,
        ..Default::default()
    }
}

fn watermarks_changed(low: u64) -> pb::channel_event::Event {
    pb::channel_event::Event::WatermarksChanged(pb::WatermarksChanged {
        item_id: "i".into(),
        watermarks: Some(pb::Watermarks { low, high: 90, batch: 10 }),
    })
}

/// A watcher that falls further behind than the center keeps events for is told so: its
/// stream ends UNAVAILABLE (the agent then watches again and re-reads every item's
/// settings), instead of going on without the events it missed. On SQLite, whose events
/// reach the hub as they are published (on PostgreSQL they come back through NOTIFY, later),
/// so the test knows every event is queued before the watcher resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_falls_behind_is_told_to_watch_again() {
    let c = TestCenter::start(Backend::Sqlite).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 1000).await;
    let epoch = register(&mut center, "app").await;
    let mut stream =
        center.watch_channel(pb::WatchChannelRequest { channel: "app".into(), epoch }).await.unwrap().into_inner();
    // The watcher stops taking events; more than the hub keeps are published.
    c.faults.stall_watches.send_replace(true);
    let published = inventory_center::events::CAPACITY + 10;
    for n in 0..published {
        let add = pb::AddStockRequest { item_id: "i".into(), quantity: 1, request_id: format!("restock-{n}") };
        admin.add_stock(add).await.unwrap();
    }
    c.faults.stall_watches.send_replace(false);
    let mut delivered = 0;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("an answer within 10 s") {
            Ok(Some(_)) => delivered += 1,
            other => break other,
        }
    };
    let status = ended.expect_err("the stream ends with an error, not quietly");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("behind") && status.message().contains("watch again"), "{status:?}");
    assert!(delivered < published, "{delivered} of {published} events delivered: the watcher did not fall behind");

    // Watching again works, and carries what happens next.
    let mut stream =
        center.watch_channel(pb::WatchChannelRequest { channel: "app".into(), epoch }).await.unwrap().into_inner();
    let add = pb::AddStockRequest { item_id: "i".into(), quantity: 5, request_id: "restock-after".into() };
    admin.add_stock(add).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.expect("event within 5 s");
    let event = event.unwrap().expect("stream open").event.expect("event set");
    let total = 1000 + published as u64 + 5;
    assert_eq!(
        event,
        pb::channel_event::Event::Restocked(pb::Restocked { item_id: "i".into(), center_available: total })
    );
}

/// Cuts the center's one `LISTEN` connection to `database_url` (`pg_terminate_backend`).
async fn cut_listener(database_url: &str) {
    use sqlx::Connection;
    let mut db = sqlx::PgConnection::connect(database_url).await.expect("connect to the center's database");
    let cut: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_all(&mut db)
    .await
    .expect("terminate the listener");
    assert_eq!(cut, [true], "the center's one listener connection was cut");
}

/// On PostgreSQL, events reach a replica's watchers through its `LISTEN` connection.
/// When that connection is cut (here by `pg_terminate_backend`), the notifications sent
/// meanwhile are gone: every stream ends UNAVAILABLE so its agent watches again and
/// re-reads what it missed, and the listener connects again for the next watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_event_listener_ends_the_watches_and_listens_again() {
    let c = TestCenter::start(Backend::Postgres).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 1000).await;
    let epoch = register(&mut center, "app").await;
    let watch = || pb::WatchChannelRequest { channel: "app".into(), epoch };
    let mut stream = center.watch_channel(watch()).await.unwrap().into_inner();
    cut_listener(&c.database_url).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("an answer within 10 s");
    let status = ended.expect_err("the stream ends with an error");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("watch again"), "{status:?}");

    // A new watch hears the next event once the listener is back. A restock sent before
    // it listens again is not heard, and a watch opened before then is told to watch
    // again when it listens: the agent watches again, and another restock follows.
    let mut stream = center.watch_channel(watch()).await.unwrap().into_inner();
    let mut heard = None;
    for n in 0..20 {
        let add = pb::AddStockRequest { item_id: "i".into(), quantity: 1, request_id: format!("after-cut-{n}") };
        admin.add_stock(add).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
            Ok(Ok(message)) => {
                heard = Some(message.expect("stream open").event.expect("event set"));
                break;
            }
            Ok(Err(status)) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                stream = center.watch_channel(watch()).await.unwrap().into_inner();
            }
            Err(_) => {}
        }
    }
    let event = heard.expect("no event reached a new watch after the listener was cut");
    assert!(matches!(&event, pb::channel_event::Event::Restocked(r) if r.item_id == "i"), "{event:?}");
}

/// A listener back from an outage tells its watchers to watch again once it listens:
/// a watcher that came back while the listener was away heard nothing of what was sent
/// meanwhile (here a watermark change), and would otherwise never learn it missed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_back_from_an_outage_tells_the_watchers_that_came_meanwhile() {
    let c = TestCenter::start(Backend::Postgres).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 1000).await;
    let epoch = register(&mut center, "app").await;
    let mut stream = watch(&mut center, epoch).await;

    // The listener is cut and cannot connect again yet.
    c.faults.events.hold_listener.send_replace(true);
    cut_listener(&c.database_url).await;
    ends_telling_to_watch_again(&mut stream, 0).await;

    // The agent watches again at once, and a change is sent while nobody listens.
    let mut stream = watch(&mut center, epoch).await;
    admin.set_watermarks(watermarks(7)).await.unwrap();
    c.faults.events.hold_listener.send_replace(false);
    ends_telling_to_watch_again(&mut stream, 0).await;

    // Watching again, the agent re-reads the item and finds the change it missed.
    let mut stream = watch(&mut center, epoch).await;
    let d = pb::DescribeItemRequest { item_id: "i".into(), channel: "app".into() };
    let item = center.describe_item(d).await.unwrap().into_inner();
    assert_eq!(item.watermarks, Some(pb::Watermarks { low: 7, high: 90, batch: 10 }));
    admin.set_watermarks(watermarks(8)).await.unwrap();
    assert_eq!(next(&mut stream).await.unwrap(), watermarks_changed(8), "the new watch hears what follows");
}

/// Notifications that fail to go out (the database unreachable for the center's
/// publisher) are sent again, in the order their changes were made, instead of being
/// lost for every replica's watchers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_that_failed_are_sent_again_in_order() {
    let c = TestCenter::start(Backend::Postgres).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 1000).await;
    let epoch = register(&mut center, "app").await;
    let mut stream = watch(&mut center, epoch).await;
    c.faults.events.fail_notifications.store(3, Ordering::SeqCst);
    // Restocks carry what the center then held, so the order they arrive in shows.
    for n in 1..=3 {
        let add = pb::AddStockRequest { item_id: "i".into(), quantity: 1, request_id: format!("restock-{n}") };
        admin.add_stock(add).await.unwrap();
    }
    for n in 1..=3 {
        let restocked = pb::Restocked { item_id: "i".into(), center_available: 1000 + n };
        assert_eq!(next(&mut stream).await.unwrap(), pb::channel_event::Event::Restocked(restocked));
    }
    assert_eq!(c.faults.events.fail_notifications.load(Ordering::SeqCst), 0, "every failure was met");
}

/// A center whose notifications fail long enough that its queue fills drops the newest
/// events, and once notifications go out again every watcher is told to watch again
/// (and re-read) rather than miss them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_dropped_while_notifications_fail_tell_every_watcher_to_watch_again() {
    let c = TestCenter::start(Backend::Postgres).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 1000).await;
    let epoch = register(&mut center, "app").await;
    let mut stream = watch(&mut center, epoch).await;
    c.faults.events.fail_notifications.store(u32::MAX, Ordering::SeqCst);
    let published = inventory_center::events::PUBLISH_QUEUE + 300;
    for n in 0..published {
        let add = pb::AddStockRequest { item_id: "i".into(), quantity: 1, request_id: format!("restock-{n}") };
        admin.add_stock(add).await.unwrap();
    }
    c.faults.events.fail_notifications.store(0, Ordering::SeqCst);
    let heard = ends_telling_to_watch_again(&mut stream, published).await;
    assert!(heard < published, "{heard} of {published} events heard: none was dropped");
}
