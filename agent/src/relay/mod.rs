//! The relay: the leading replica publishes each pool's outbox (the events every
//! reservation change wrote in the same atomic step) to a broker, and trims the outbox
//! only through what the broker acknowledged. A broker that is down or slow never touches
//! a sale: the outbox grows meanwhile and drains when the broker is back.
//!
//! - [`state`]: the decisions (cursor per pool, what to publish and trim, backoff), pure;
//! - [`jetstream`]: the NATS JetStream sink, one [`EventSink`] (another broker would be
//!   another implementation of that trait);
//! - this file: the outbox and sink traits, the status shared with GetStock and
//!   `/metrics`, and the thin loop that drives them.

pub mod jetstream;
pub mod outbox;
pub mod state;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use inventory_proto::v1 as pb;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::{Notify, watch};

use crate::store::{PoolKey, StoreError};
use state::{Backoff, Cursors, Plan};

/// A page of one pool's outbox, as the relay reads it.
#[derive(Debug, Clone, Default)]
pub struct OutboxPage {
    /// The pool's generation: events of another generation are other events.
    pub generation: u64,
    /// Events from the asked sequence on, in sequence order.
    pub events: Vec<pb::ReservationEvent>,
    /// The last sequence the pool wrote (0: none in this generation).
    pub last_sequence: u64,
    /// The oldest sequence the outbox still keeps (everything before was trimmed).
    pub first_kept: u64,
}

/// Where the relay reads events from and trims them (the pool store's outbox).
#[async_trait]
pub trait Outbox: Send + Sync + 'static {
    async fn read(&self, pool: &PoolKey, from_sequence: u64, max: u64) -> Result<OutboxPage, StoreError>;
    /// Drops the events through `through_sequence`; returns how many were dropped.
    /// Only while the pool still has `generation` (a pool created anew keeps its new events).
    async fn trim(&self, pool: &PoolKey, generation: u64, through_sequence: u64) -> Result<u64, StoreError>;
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// The broker is down, unreachable or did not acknowledge in time: retry later.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The broker refused the message (too large, no stream for the subject, ...).
    #[error("broker refused the event: {0}")]
    Refused(String),
}

/// What a batch publish came to: the broker acknowledged the first `acked` events (in
/// order); `error` says why the next one was not.
#[derive(Debug, Default)]
pub struct Published {
    pub acked: usize,
    pub error: Option<SinkError>,
}

/// A broker. Publishes a batch in order, pipelined (all sent, then the acknowledgements
/// awaited under one deadline for the batch, up to the first that fails), each event with
/// its `event_id` as the broker's deduplication id.
#[async_trait]
pub trait EventSink: Send + Sync + 'static {
    async fn publish(&self, events: &[pb::ReservationEvent]) -> Published;
}

/// Tunables of the relay.
#[derive(Debug, Clone, Copy)]
pub struct RelaySettings {
    /// How often each pool's outbox is looked at when nothing wakes the relay.
    pub interval: Duration,
    /// Events read and published per batch.
    pub batch_max: u64,
    /// Batches per pool in one pass, so one busy pool does not starve the others.
    pub batches_per_pass: u32,
    /// First wait after a broker failure; doubles up to `backoff_cap`.
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(50),
            batch_max: 256,
            batches_per_pass: 8,
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_secs(2),
        }
    }
}

/// One pool as the relay last saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolProgress {
    pub generation: u64,
    /// Acknowledged by the broker through this sequence (0: none yet in this generation).
    pub published: u64,
    /// The last sequence the pool wrote.
    pub last_sequence: u64,
    /// When the oldest event not yet acknowledged was written (store clock, ms); 0: none.
    pub oldest_unpublished_ms: i64,
}

/// What the relay tells the rest of the agent: per pool progress (GetStock's
/// `published_event_sequence`), counters and gauges for `/metrics`, and a wake-up.
#[derive(Debug, Default)]
pub struct RelayStatus {
    enabled: std::sync::atomic::AtomicBool,
    pools: DashMap<PoolKey, PoolProgress>,
    published: AtomicU64,
    failures: AtomicU64,
    wake: Notify,
}

impl RelayStatus {
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The sequence through which the broker acknowledged the pool's events, in the
    /// generation given (0: none, another generation, or no relay).
    pub fn published_sequence(&self, pool: &PoolKey, generation: u64) -> u64 {
        self.pools.get(pool).filter(|p| p.generation == generation).map_or(0, |p| p.published)
    }

    pub fn progress(&self, pool: &PoolKey) -> Option<PoolProgress> {
        self.pools.get(pool).map(|p| *p)
    }

    /// Something was sold or changed: look at the outboxes now rather than at the next tick.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn published_total(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    pub fn failures_total(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn saw(&self, pool: &PoolKey, page: &OutboxPage, published: u64) {
        let oldest = page.events.iter().find(|e| e.sequence > published).map_or(0, |e| e.at_unix_ms);
        let mut p = self.pools.entry(pool.clone()).or_default();
        if p.generation != page.generation {
            *p = PoolProgress { generation: page.generation, ..PoolProgress::default() };
        }
        p.published = p.published.max(published);
        p.last_sequence = page.last_sequence;
        p.oldest_unpublished_ms = if p.published >= page.last_sequence { 0 } else { oldest };
    }
}

/// The relay's metrics, read from its status at scrape time.
#[derive(Debug)]
pub struct RelayCollector(pub Arc<RelayStatus>);

impl Collector for RelayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        if !s.is_enabled() {
            return Ok(());
        }
        for (name, help, v) in [
            ("inventory_agent_relay_events_published", "Events the broker acknowledged", s.published_total()),
            (
                "inventory_agent_relay_publish_failures",
                "Batches the broker did not (fully) acknowledge",
                s.failures_total(),
            ),
        ] {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let now = crate::clock::now_ms();
        let mut pools: Vec<(PoolKey, PoolProgress)> = s.pools.iter().map(|e| (e.key().clone(), *e.value())).collect();
        pools.sort_by(|a, b| a.0.item_id.cmp(&b.0.item_id));
        let mut unpublished = encoder.encode_descriptor(
            "inventory_agent_relay_unpublished_events",
            "Events in the outbox the broker has not acknowledged yet, per item",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (pool, p) in &pools {
            let n = i64::try_from(p.last_sequence.saturating_sub(p.published)).unwrap_or(i64::MAX);
            ConstGauge::new(n).encode(unpublished.encode_family(&[("item", pool.item_id.as_str())])?)?;
        }
        let lag = pools
            .iter()
            .filter(|(_, p)| p.oldest_unpublished_ms > 0)
            .map(|(_, p)| now.saturating_sub(p.oldest_unpublished_ms).max(0))
            .max()
            .unwrap_or(0);
        #[allow(clippy::cast_precision_loss)] // milliseconds far below 2^52
        let lag = ConstGauge::new(lag as f64 / 1_000.0);
        lag.encode(encoder.encode_descriptor(
            "inventory_agent_relay_lag_seconds",
            "Age of the oldest event the broker has not acknowledged (0: all published)",
            None,
            lag.metric_type(),
        )?)?;
        Ok(())
    }
}

/// What one pass over the pools came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub published: u64,
    /// The broker (or the store) failed: back off.
    pub failed: bool,
    /// Some pool has more to publish right away.
    pub more: bool,
}

/// The relay of one agent: an outbox, a sink, and the cursors.
pub struct Relay {
    pub outbox: Arc<dyn Outbox>,
    pub sink: Arc<dyn EventSink>,
    pub status: Arc<RelayStatus>,
    pub settings: RelaySettings,
    cursors: Cursors,
}

impl Relay {
    pub fn new(
        outbox: Arc<dyn Outbox>,
        sink: Arc<dyn EventSink>,
        status: Arc<RelayStatus>,
        settings: RelaySettings,
    ) -> Self {
        status.enabled.store(true, Ordering::Relaxed);
        Self { outbox, sink, status, settings, cursors: Cursors::default() }
    }

    /// This replica stopped leading: forget the cursors (re-read from the outbox later).
    pub fn step_down(&mut self) {
        self.cursors.clear();
    }

    /// Publishes what each pool's outbox holds, a bounded number of batches per pool.
    pub async fn pass(&mut self, pools: &[PoolKey]) -> Pass {
        let mut pass = Pass::default();
        for pool in pools {
            let mut published = 0;
            let result = self.pool(pool, &mut published).await;
            pass.published += published;
            match result {
                Ok(more) => pass.more |= more,
                Err(e) => {
                    pass.failed = true;
                    tracing::warn!(item = %pool.item_id, error = %e, "relay: events not published; retrying");
                    // The broker is down for every pool alike: don't wait out each one.
                    if matches!(e, RelayError::Sink(SinkError::Unavailable(_))) {
                        break;
                    }
                }
            }
        }
        pass
    }

    /// Publishes one pool's outbox (counting into `published`); true: it has more.
    async fn pool(&mut self, pool: &PoolKey, published: &mut u64) -> Result<bool, RelayError> {
        // Re-reads are bounded too: two per batch at most.
        let mut reads = 0;
        let mut batches = 0;
        while batches < self.settings.batches_per_pass && reads < 2 * self.settings.batches_per_pass {
            reads += 1;
            let from = self.cursors.from(pool);
            let page = match self.outbox.read(pool, from, self.settings.batch_max).await {
                Ok(page) => page,
                // A pool not created yet (or lost: its loss is the stocking's to handle).
                Err(StoreError::PoolMissing(_)) => return Ok(false),
                Err(e) => return Err(RelayError::Store(e)),
            };
            let sequences: Vec<u64> = page.events.iter().map(|e| e.sequence).collect();
            let known = self.cursors.get(pool);
            let plan = self.cursors.plan(pool, from, page.generation, page.first_kept, &sequences);
            if let (Some(was), Some(now)) = (known, self.cursors.get(pool))
                && was.generation == now.generation
                && now.next > was.next
            {
                // Only the outbox's bound removes events nobody acknowledged.
                tracing::error!(
                    item = %pool.item_id,
                    lost = now.next - was.next,
                    from = was.next,
                    "relay: events were dropped from the outbox before the broker had them"
                );
            }
            let n = match plan {
                Plan::Reread => continue,
                Plan::Publish(n) => n,
            };
            batches += 1;
            let before = self.cursors.from(pool).saturating_sub(1);
            self.status.saw(pool, &page, before);
            if n == 0 {
                return Ok(false);
            }
            let out = self.sink.publish(&page.events[..n]).await;
            if out.acked > 0 {
                let through = page.events[out.acked - 1].sequence;
                let acked = u64::try_from(out.acked).unwrap_or(u64::MAX);
                *published += acked;
                self.status.published.fetch_add(acked, Ordering::Relaxed);
                if let Some(trim) = self.cursors.acked(pool, page.generation, through) {
                    self.status.saw(pool, &page, trim);
                    // A failed trim only keeps events a little longer: the next trim
                    // covers them (trimming is through a sequence, not of one event).
                    if let Err(e) = self.outbox.trim(pool, page.generation, trim).await {
                        tracing::warn!(item = %pool.item_id, error = %e, "relay: outbox not trimmed yet");
                    }
                }
            }
            if let Some(e) = out.error {
                self.status.failures.fetch_add(1, Ordering::Relaxed);
                return Err(RelayError::Sink(e));
            }
            let drained = page.events[n - 1].sequence >= page.last_sequence;
            if drained {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Sink(SinkError),
    #[error("reading the outbox: {0}")]
    Store(StoreError),
}

/// Resolves once shutdown is signalled (the guard of `wait_for` is not Send).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The relay's loop: on the leading replica only, a pass over every item the agent knows
/// each interval (or at once when woken or when a pool has more), backing off while the
/// broker fails. Stops with the agent's other workers.
pub async fn run(
    mut relay: Relay,
    pools: impl Fn() -> Vec<PoolKey> + Send,
    leading: impl Fn() -> bool + Send,
    mut stop: watch::Receiver<bool>,
) {
    let status = Arc::clone(&relay.status);
    let mut backoff = Backoff::new(relay.settings.backoff_base, relay.settings.backoff_cap);
    let mut was_leading = false;
    while !*stop.borrow() {
        let mut wait = relay.settings.interval;
        if leading() {
            was_leading = true;
            let pass = relay.pass(&pools()).await;
            if pass.failed {
                wait = backoff.failed();
            } else {
                backoff.succeeded();
                if pass.more {
                    wait = Duration::ZERO;
                }
            }
        } else if was_leading {
            was_leading = false;
            relay.step_down();
        }
        if wait.is_zero() {
            tokio::task::yield_now().await;
            continue;
        }
        let failing = backoff.failures() > 0;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            // A sale wakes a healthy relay early; a failing one keeps its backoff.
            _ = status.wake.notified(), if !failing => {}
            _ = stopped(&mut stop) => break,
        }
    }
}

#[cfg(test)]
mod tests;
