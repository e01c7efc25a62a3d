//! Fan-out of ledger events to agents watching their channel (`WatchChannel`).
//!
//! On SQLite (one center process) events stay in-process. On PostgreSQL they travel
//! through `NOTIFY inventory_events`, and every center replica `LISTEN`s and hands them to
//! its own watchers, so an agent hears every event whichever replica it is connected to.
//! A listener that lost its connection may have missed notifications (PostgreSQL keeps
//! none for a session that is gone): it hands its watchers a [`LedgerEvent::Gap`], which
//! ends their streams, and agents re-read their settings with `DescribeItem` when they
//! watch again; it does so again once it listens again. A replica sends its events in
//! the order they were published, and one whose notifications fail (the database
//! unreachable) keeps them and tries again, so an event is not lost for every replica at
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use tokio::sync::{broadcast, mpsc, watch};

/// The PostgreSQL channel carrying events between center replicas.
pub const PG_CHANNEL: &str = "inventory_events";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerEvent {
    /// Watermarks of an item changed: the default (`channel = None`) or one override.
    Watermarks { item_id: String, channel: Option<String> },
    /// The center has stock again; `from_channel` is who returned it, if a channel did.
    Restocked { item_id: String, center_available: u64, from_channel: Option<String> },
    /// The center ran dry while `starving` was asking: holders should return idle units.
    ReturnRequested { item_id: String, starving: String },
    /// An operator settled `channel`'s in-doubt units of the item.
    InDoubtResolved { item_id: String, channel: String },
    /// A scheduled item was created, its schedule moved, or it closed: every channel.
    Scheduled { item_id: String, opens_at_ms: i64, closes_at_ms: i64, prestock_lead_ms: u64, closed: bool },
    /// Events may have been missed: a replica's listener lost its connection (handed to
    /// its own watchers), or a replica dropped events it could not send (sent as a
    /// notification to every replica). Every channel's stream ends, so its agent watches
    /// again and re-reads what it missed.
    Gap,
}

impl LedgerEvent {
    /// Whether a watcher of `channel` should see this event.
    pub fn concerns(&self, channel: &str) -> bool {
        match self {
            LedgerEvent::Watermarks { channel: target, .. } => target.as_deref().is_none_or(|t| t == channel),
            LedgerEvent::Restocked { from_channel, .. } => from_channel.as_deref() != Some(channel),
            LedgerEvent::ReturnRequested { starving, .. } => starving != channel,
            LedgerEvent::InDoubtResolved { channel: target, .. } => target == channel,
            LedgerEvent::Scheduled { .. } | LedgerEvent::Gap => true,
        }
    }

    /// The item's schedule as it now stands.
    pub fn scheduled(record: &crate::store::ItemRecord) -> Self {
        let s = record.plan.schedule;
        LedgerEvent::Scheduled {
            item_id: record.item_id.clone(),
            opens_at_ms: s.opens_at_ms,
            closes_at_ms: s.closes_at_ms,
            prestock_lead_ms: s.prestock_lead_ms,
            closed: record.state.closed,
        }
    }
}

/// Events a watcher may fall behind by before it misses one: its stream then ends
/// UNAVAILABLE, and the agent watches again and re-reads every item's settings.
pub const CAPACITY: usize = 1024;

/// Events a replica keeps for sending while its notifications fail (the database
/// unreachable). Past it the newest are dropped, and every replica's watchers are told to
/// watch again once notifications go out.
pub const PUBLISH_QUEUE: usize = 1024;
/// Events sent in one statement at most.
const PUBLISH_BATCH: usize = 256;
/// How long a listener or a publisher waits before it tries again, at first and at most.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Between tries of a listener that cannot connect.
const LISTEN_RETRY: Duration = Duration::from_millis(500);

/// Faults tests make in the PostgreSQL event path.
#[derive(Debug, Default)]
pub struct EventFaults {
    /// The next N sends of notifications fail, as they do while the database cannot be
    /// reached.
    pub fail_notifications: AtomicU32,
    /// While true, a listener that lost its connection does not connect again, as one
    /// whose database cannot be reached yet.
    pub hold_listener: watch::Sender<bool>,
}

#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<LedgerEvent>,
    /// Set on PostgreSQL: events go out as NOTIFY and come back through the listener.
    outgoing: Option<Outgoing>,
}

/// Events on their way to `NOTIFY`, in the order they were published.
#[derive(Clone)]
struct Outgoing {
    queue: mpsc::Sender<LedgerEvent>,
    /// Set when an event found the queue full and was dropped.
    overflowed: Arc<AtomicBool>,
}

impl EventHub {
    pub fn new() -> Self {
        Self { tx: broadcast::channel(CAPACITY).0, outgoing: None }
    }

    /// Events shared by every center replica on this PostgreSQL database. Spawns the
    /// listener that feeds this replica's watchers and the task that sends its events.
    pub async fn postgres(pool: sqlx::AnyPool, url: &str, faults: Arc<EventFaults>) -> Result<Self, sqlx::Error> {
        let listener = listen(url).await?;
        let (queue, pending) = mpsc::channel(PUBLISH_QUEUE);
        let overflowed = Arc::new(AtomicBool::new(false));
        let hub = Self {
            tx: broadcast::channel(CAPACITY).0,
            outgoing: Some(Outgoing { queue, overflowed: Arc::clone(&overflowed) }),
        };
        // The listener holds only a weak handle: when the center (and its hub) goes away,
        // the task ends instead of reconnecting forever. The sender ends with the queue.
        tokio::spawn(relay(listener, url.to_owned(), hub.tx.downgrade(), Arc::clone(&faults)));
        tokio::spawn(send_notifications(pool, pending, overflowed, faults));
        Ok(hub)
    }

    pub fn publish(&self, event: LedgerEvent) {
        match &self.outgoing {
            // No receivers is fine: nobody is watching.
            None => {
                let _ = self.tx.send(event);
            }
            Some(out) => {
                if out.queue.try_send(event).is_err() {
                    out.overflowed.store(true, Ordering::Release);
                }
            }
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<LedgerEvent> {
        self.tx.subscribe()
    }
}

async fn listen(url: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    listener.listen(PG_CHANNEL).await?;
    Ok(listener)
}

/// Hands each notification to this replica's watchers. A lost connection is a
/// [`LedgerEvent::Gap`] twice: when it is lost (the streams end at once), and when the
/// listener listens again, since a watcher that came back in between heard nothing of
/// what was sent before the listener was back (and failed tries tell the watchers too).
async fn relay(
    mut listener: PgListener,
    url: String,
    tx: broadcast::WeakSender<LedgerEvent>,
    faults: Arc<EventFaults>,
) {
    let gap = |why: &str| match tx.upgrade() {
        Some(tx) => {
            tracing::warn!("{why}; watchers told to watch again");
            let _ = tx.send(LedgerEvent::Gap);
            true
        }
        None => false,
    };
    loop {
        let received = listener.try_recv().await;
        let error = match received {
            Ok(Some(n)) => {
                let Some(tx) = tx.upgrade() else { return };
                match serde_json::from_str::<LedgerEvent>(n.payload()) {
                    Ok(e) => {
                        let _ = tx.send(e);
                    }
                    Err(e) => tracing::warn!(error = %e, "unreadable event notification"),
                }
                continue;
            }
            Ok(None) => "the event listener lost its connection".to_owned(),
            Err(e) => format!("the event listener failed: {e}"),
        };
        if !gap(&error) {
            return;
        }
        let mut held = faults.hold_listener.subscribe();
        listener = loop {
            let _ = held.wait_for(|held| !held).await;
            match listen(&url).await {
                Ok(l) => break l,
                Err(e) => {
                    if !gap(&format!("the event listener cannot listen again: {e}")) {
                        return;
                    }
                    tokio::time::sleep(LISTEN_RETRY).await;
                }
            }
        };
        if !gap("the event listener listens again") {
            return;
        }
    }
}

/// Sends queued events as notifications, in order, a batch a statement; a failed send is
/// tried again (with the events queued meanwhile behind it) until it goes out. Events
/// dropped on a full queue are followed by a [`LedgerEvent::Gap`] notification: every
/// replica's watchers watch again and re-read what they missed.
async fn send_notifications(
    pool: sqlx::AnyPool,
    mut pending: mpsc::Receiver<LedgerEvent>,
    overflowed: Arc<AtomicBool>,
    faults: Arc<EventFaults>,
) {
    let mut batch = Vec::with_capacity(PUBLISH_BATCH);
    while pending.recv_many(&mut batch, PUBLISH_BATCH).await > 0 {
        if overflowed.swap(false, Ordering::AcqRel) {
            batch.push(LedgerEvent::Gap);
        }
        let texts: Vec<String> = batch.drain(..).map(|e| serde_json::to_string(&e).unwrap_or_default()).collect();
        let payloads = serde_json::to_string(&texts).unwrap_or_default();
        let mut wait = RETRY_FIRST;
        loop {
            let failing =
                faults.fail_notifications.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            let sent = if failing.is_ok() {
                Err(sqlx::Error::PoolTimedOut)
            } else {
                // One notification per element, in the array's order.
                sqlx::query("SELECT pg_notify($1, e) FROM json_array_elements_text($2::json) AS e")
                    .bind(PG_CHANNEL)
                    .bind(&payloads)
                    .execute(&pool)
                    .await
                    .map(|_| ())
            };
            match sent {
                Ok(()) => break,
                // The center is gone: nobody is left to send for.
                Err(_) if pending.is_closed() => return,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?wait, "event notifications not sent; trying again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_reach_the_right_channels() {
        let wm_all = LedgerEvent::Watermarks { item_id: "i".into(), channel: None };
        let wm_app = LedgerEvent::Watermarks { item_id: "i".into(), channel: Some("app".into()) };
        assert!(wm_all.concerns("web") && wm_all.concerns("app"));
        assert!(wm_app.concerns("app") && !wm_app.concerns("web"));
        let back =
            LedgerEvent::Restocked { item_id: "i".into(), center_available: 3, from_channel: Some("app".into()) };
        assert!(!back.concerns("app") && back.concerns("web"));
        let ask = LedgerEvent::ReturnRequested { item_id: "i".into(), starving: "app".into() };
        assert!(!ask.concerns("app") && ask.concerns("web"));
    }
}
