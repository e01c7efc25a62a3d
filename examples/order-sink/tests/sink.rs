//! The order sink against a real JetStream and PostgreSQL: redelivered, repeated and
//! reordered events leave one row per reservation in its latest state; garbage is dropped.

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use inventory_proto::v1 as pb;
use inventory_test_support::nats::{nats_server_url, unique_name};
use inventory_test_support::{TestDatabase, wait_until};
use prost::Message;
use sqlx::Row;

fn event(reservation: &str, sequence: u64, state: pb::ReservationState) -> pb::ReservationEvent {
    pb::ReservationEvent {
        event_id: format!("web:sku:0:1:{sequence}"),
        channel: "web".into(),
        item_id: "sku".into(),
        sequence,
        reservation_id: reservation.into(),
        idempotency_key: format!("k-{reservation}"),
        user_id: "u1".into(),
        quantity: 2,
        state: state as i32,
        pool_generation: 1,
        at_unix_ms: 1_700_000_000_000 + i64::try_from(sequence).unwrap(),
        ..Default::default()
    }
}

async fn rows(db: &sqlx::PgPool) -> Vec<(String, String, i64)> {
    sqlx::query("SELECT reservation_id, state, sequence FROM orders ORDER BY reservation_id")
        .fetch_all(db)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test]
async fn an_older_event_never_overwrites_a_newer_one() {
    let database = TestDatabase::create().await;
    let db = sqlx::PgPool::connect(&database.url).await.unwrap();
    order_sink::migrate(&db).await.unwrap();
    // Twice: migrations are repeatable.
    order_sink::migrate(&db).await.unwrap();
    use pb::ReservationState::*;
    order_sink::apply(&db, &[event("r1", 1, Reserved), event("r1", 3, Confirmed)]).await.unwrap();
    // A late copy of the reservation event, and the confirm again.
    order_sink::apply(&db, &[event("r1", 1, Reserved), event("r1", 3, Confirmed)]).await.unwrap();
    assert_eq!(rows(&db).await, [("r1".to_owned(), "confirmed".to_owned(), 3)]);
    order_sink::apply(&db, &[event("r1", 7, Refunded)]).await.unwrap();
    assert_eq!(rows(&db).await, [("r1".to_owned(), "refunded".to_owned(), 7)]);
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM order_events_seen").fetch_one(&db).await.unwrap();
    assert_eq!(seen, 3);
}

#[tokio::test]
async fn the_sink_writes_each_reservation_once_from_jetstream_and_drops_garbage() {
    let database = TestDatabase::create().await;
    let url = nats_server_url();
    let stream = unique_name("SINK_TEST");
    let prefix = unique_name("sinktest");
    let config = order_sink::SinkConfig {
        nats_url: url.clone(),
        stream: stream.clone(),
        subject_prefix: prefix.clone(),
        durable: "orders".into(),
        database_url: database.url.clone(),
        batch: 3,
    };
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    js.get_or_create_stream(jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{prefix}.>")],
        ..Default::default()
    })
    .await
    .unwrap();
    use pb::ReservationState::*;
    let subject = format!("{prefix}.web.sku");
    let mut payloads: Vec<(String, Vec<u8>)> = Vec::new();
    // r2's cancel before its reservation (reordered), r1 repeated under another message
    // id (a redelivery the broker did not dedup), and two messages that are no event.
    for e in [event("r1", 1, Reserved), event("r2", 4, Cancelled), event("r2", 2, Reserved), event("r1", 3, Confirmed)]
    {
        payloads.push((e.event_id.clone(), e.encode_to_vec()));
    }
    payloads.push(("again".into(), event("r1", 1, Reserved).encode_to_vec()));
    payloads.push(("garbage".into(), vec![0xff, 0xff, 0xff]));
    payloads.push(("empty".into(), Vec::new()));
    for (id, payload) in payloads {
        js.send_publish(subject.clone(), PublishMessage::build().payload(payload.into()).message_id(id))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let sink = tokio::spawn(order_sink::run(config, async move {
        let _ = stop_rx.await;
    }));
    let db = sqlx::PgPool::connect(&database.url).await.unwrap();
    let done = wait_until(Duration::from_secs(20), || async {
        let info = js.get_stream(&stream).await.unwrap().consumer_info("orders").await;
        matches!(info, Ok(i) if i.num_ack_pending == 0 && i.num_pending == 0 && i.delivered.stream_sequence == 7)
    })
    .await;
    assert!(done, "the sink did not consume and acknowledge all 7 messages");
    assert_eq!(
        rows(&db).await,
        [("r1".to_owned(), "confirmed".to_owned(), 3), ("r2".to_owned(), "cancelled".to_owned(), 4)]
    );
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), sink).await.expect("the sink stops on shutdown").unwrap().unwrap();
    js.delete_stream(&stream).await.unwrap();
}
