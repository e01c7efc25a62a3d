//! Fan-out of ledger events to agents watching their channel (`WatchChannel`).
//!
//! On SQLite (one center process) events stay in-process. On PostgreSQL they travel
//! through `NOTIFY inventory_events`, and every center replica `LISTEN`s and hands them to
//! its own watchers, so an agent hears every event whichever replica it is connected to.
//! A listener that lost its connection may have missed notifications (PostgreSQL keeps
//! none for a session that is gone): it hands its watchers a [`LedgerEvent::Gap`], which
//! ends their streams, and agents re-read their settings with `DescribeItem` when they
//! watch again.

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

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
    /// This replica's listener lost its connection and may have missed events: every
    /// channel's stream ends, so its agent watches again and re-reads what it missed.
    /// Never sent as a notification.
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

#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<LedgerEvent>,
    /// Set on PostgreSQL: events go out as NOTIFY and come back through the listener.
    notify: Option<sqlx::AnyPool>,
}

impl EventHub {
    pub fn new() -> Self {
        Self { tx: broadcast::channel(CAPACITY).0, notify: None }
    }

    /// Events shared by every center replica on this PostgreSQL database. Spawns the
    /// listener that feeds this replica's watchers.
    pub async fn postgres(pool: sqlx::AnyPool, url: &str) -> Result<Self, sqlx::Error> {
        let hub = Self { tx: broadcast::channel(CAPACITY).0, notify: Some(pool) };
        let mut listener = sqlx::postgres::PgListener::connect(url).await?;
        listener.listen(PG_CHANNEL).await?;
        // The listener holds only a weak handle: when the center (and its hub) goes away,
        // the task ends instead of reconnecting forever.
        let tx = hub.tx.downgrade();
        tokio::spawn(async move {
            loop {
                // try_recv() says when the connection was lost (`Ok(None)`); the next call
                // connects and listens again.
                let received = listener.try_recv().await;
                let Some(tx) = tx.upgrade() else { return };
                match received {
                    Ok(Some(n)) => match serde_json::from_str::<LedgerEvent>(n.payload()) {
                        Ok(e) => {
                            let _ = tx.send(e);
                        }
                        Err(e) => tracing::warn!(error = %e, "unreadable event notification"),
                    },
                    Ok(None) => {
                        tracing::warn!("event listener lost its connection; watchers told to watch again");
                        let _ = tx.send(LedgerEvent::Gap);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "event listener failed; watchers told to watch again, retrying");
                        let _ = tx.send(LedgerEvent::Gap);
                        drop(tx);
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(hub)
    }

    pub fn publish(&self, event: LedgerEvent) {
        match &self.notify {
            // No receivers is fine: nobody is watching.
            None => {
                let _ = self.tx.send(event);
            }
            Some(pool) => {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let payload = serde_json::to_string(&event).unwrap_or_default();
                    let sent =
                        sqlx::query("SELECT pg_notify($1, $2)").bind(PG_CHANNEL).bind(payload).execute(&pool).await;
                    if let Err(e) = sent {
                        tracing::warn!(error = %e, "event notification failed");
                    }
                });
            }
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<LedgerEvent> {
        self.tx.subscribe()
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
