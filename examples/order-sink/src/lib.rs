//! The reference order consumer: reads the relay's JetStream stream with a durable pull
//! consumer and keeps one row per reservation in PostgreSQL, in the reservation's latest
//! state. Copy it to wire an order service.
//!
//! Exactly once from at-least-once: a message is acknowledged only after its transaction
//! committed, so a crash redelivers it; the upsert moves a row only forward (a higher
//! `(pool_generation, sequence)`), so a redelivered or reordered event changes nothing.
//! `order_events_seen` keeps every event's number, so a gap in a pool's sequence shows.

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::pull, stream};
use futures::StreamExt;
use inventory_proto::v1 as pb;
use prost::Message;
use sqlx::PgPool;

#[derive(Debug, Clone)]
pub struct SinkConfig {
    pub nats_url: String,
    pub stream: String,
    /// The stream's subjects are `<subject_prefix>.>` (when the sink creates it).
    pub subject_prefix: String,
    pub durable: String,
    pub database_url: String,
    /// Messages fetched (and committed in one transaction) at most per batch.
    pub batch: usize,
}

/// Creates the tables if missing (serialised, so several sinks may start together).
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(7243001)").execute(&mut *tx).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
            reservation_id TEXT PRIMARY KEY,
            channel TEXT NOT NULL,
            item_id TEXT NOT NULL,
            pool_generation BIGINT NOT NULL,
            sequence BIGINT NOT NULL,
            idempotency_key TEXT NOT NULL,
            user_id TEXT NOT NULL,
            quantity BIGINT NOT NULL,
            state TEXT NOT NULL,
            at_unix_ms BIGINT NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS order_events_seen (
            channel TEXT NOT NULL,
            item_id TEXT NOT NULL,
            pool_generation BIGINT NOT NULL,
            sequence BIGINT NOT NULL,
            event_id TEXT NOT NULL,
            reservation_id TEXT NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (channel, item_id, pool_generation, sequence)
        )",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The state as the tables spell it.
pub fn state_name(state: i32) -> &'static str {
    match pb::ReservationState::try_from(state) {
        Ok(pb::ReservationState::Reserved) => "reserved",
        Ok(pb::ReservationState::Confirmed) => "confirmed",
        Ok(pb::ReservationState::Cancelled) => "cancelled",
        Ok(pb::ReservationState::Expired) => "expired",
        Ok(pb::ReservationState::Refunded) => "refunded",
        _ => "unspecified",
    }
}

fn signed(field: &str, v: u64) -> anyhow::Result<i64> {
    i64::try_from(v).with_context(|| format!("{field} {v} does not fit a BIGINT"))
}

/// Writes the events in one transaction: each one's number, and each reservation's row
/// moved forward to its latest event.
pub async fn apply(db: &PgPool, events: &[pb::ReservationEvent]) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    for e in events {
        let (generation, sequence) = (signed("pool_generation", e.pool_generation)?, signed("sequence", e.sequence)?);
        let state = state_name(e.state);
        sqlx::query(
            "INSERT INTO order_events_seen (channel, item_id, pool_generation, sequence, event_id, reservation_id, state)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .bind(&e.channel)
        .bind(&e.item_id)
        .bind(generation)
        .bind(sequence)
        .bind(&e.event_id)
        .bind(&e.reservation_id)
        .bind(state)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO orders (reservation_id, channel, item_id, pool_generation, sequence, idempotency_key,
                                 user_id, quantity, state, at_unix_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (reservation_id) DO UPDATE SET
                 pool_generation = excluded.pool_generation, sequence = excluded.sequence,
                 state = excluded.state, at_unix_ms = excluded.at_unix_ms, updated_at = now()
             WHERE (orders.pool_generation, orders.sequence) < (excluded.pool_generation, excluded.sequence)",
        )
        .bind(&e.reservation_id)
        .bind(&e.channel)
        .bind(&e.item_id)
        .bind(generation)
        .bind(sequence)
        .bind(&e.idempotency_key)
        .bind(&e.user_id)
        .bind(signed("quantity", e.quantity)?)
        .bind(state)
        .bind(e.at_unix_ms)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Consumes until `shutdown` resolves (between batches: a batch in hand is committed and
/// acknowledged first). Messages that are not a `ReservationEvent` are terminated (never
/// redelivered) and logged.
pub async fn run(config: SinkConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&config.database_url)
        .await
        .context("--database-url: cannot connect")?;
    migrate(&db).await?;
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(config.nats_url.as_str())
        .await
        .context("--nats-url: cannot connect")?;
    let js = jetstream::new(client);
    let consumer = loop {
        match consumer(&js, &config).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "stream or consumer not ready; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    tracing::info!(stream = %config.stream, durable = %config.durable, "order sink consuming");
    tokio::pin!(shutdown);
    loop {
        let batch = tokio::select! {
            _ = &mut shutdown => break,
            b = next_batch(&consumer, config.batch) => b,
        };
        let messages = match batch {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "fetch failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if messages.is_empty() {
            continue;
        }
        let mut events = Vec::with_capacity(messages.len());
        let mut garbage = Vec::new();
        for m in &messages {
            match pb::ReservationEvent::decode(m.payload.clone()) {
                Ok(e) if !e.reservation_id.is_empty() && e.sequence > 0 => events.push(e),
                Ok(_) => garbage.push((m, "no reservation_id or sequence".to_owned())),
                Err(e) => garbage.push((m, e.to_string())),
            }
        }
        if let Err(e) = apply(&db, &events).await {
            // Nothing acknowledged: the broker redelivers the batch after its ack wait.
            tracing::warn!(error = %e, "batch not written; it will be redelivered");
            for m in &messages {
                let _ = m.ack_with(AckKind::Nak(Some(Duration::from_millis(500)))).await;
            }
            continue;
        }
        for (m, why) in garbage {
            tracing::error!(subject = %m.subject, error = %why, "not a ReservationEvent; dropped");
            let _ = m.ack_with(AckKind::Term).await;
        }
        for m in &messages {
            if let Err(e) = m.ack().await {
                tracing::warn!(error = %e, "ack lost; the event will be redelivered and changes nothing");
            }
        }
    }
    tracing::info!("order sink stopped");
    Ok(())
}

async fn consumer(js: &jetstream::Context, config: &SinkConfig) -> anyhow::Result<jetstream::consumer::PullConsumer> {
    let stream = js
        .get_or_create_stream(stream::Config {
            name: config.stream.clone(),
            subjects: vec![format!("{}.>", config.subject_prefix.trim_end_matches('.'))],
            duplicate_window: Duration::from_secs(120),
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            &config.durable,
            pull::Config {
                durable_name: Some(config.durable.clone()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(10),
                ..Default::default()
            },
        )
        .await?;
    Ok(consumer)
}

async fn next_batch(
    consumer: &jetstream::consumer::PullConsumer,
    max: usize,
) -> anyhow::Result<Vec<jetstream::Message>> {
    let mut batch = consumer.batch().max_messages(max.max(1)).expires(Duration::from_secs(1)).messages().await?;
    let mut out = Vec::new();
    while let Some(m) = batch.next().await {
        out.push(m.map_err(|e| anyhow::anyhow!(e))?);
    }
    Ok(out)
}
