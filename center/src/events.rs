//! Fan-out of ledger events to agents watching their channel (`WatchChannel`).
//!
//! In-process only: with several center replicas, an agent sees the events of the replica
//! it is connected to, and re-reads its settings with `DescribeItem` on reconnect.

use tokio::sync::broadcast;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerEvent {
    /// Watermarks of an item changed: the default (`channel = None`) or one override.
    Watermarks { item_id: String, channel: Option<String> },
    /// The center has stock again; `from_channel` is who returned it, if a channel did.
    Restocked { item_id: String, center_available: u64, from_channel: Option<String> },
    /// The center ran dry while `starving` was asking: holders should return idle units.
    ReturnRequested { item_id: String, starving: String },
    /// An operator settled `channel`'s in-doubt units of the item.
    InDoubtResolved { item_id: String, channel: String },
}

impl LedgerEvent {
    /// Whether a watcher of `channel` should see this event.
    pub fn concerns(&self, channel: &str) -> bool {
        match self {
            LedgerEvent::Watermarks { channel: target, .. } => target.as_deref().is_none_or(|t| t == channel),
            LedgerEvent::Restocked { from_channel, .. } => from_channel.as_deref() != Some(channel),
            LedgerEvent::ReturnRequested { starving, .. } => starving != channel,
            LedgerEvent::InDoubtResolved { channel: target, .. } => target == channel,
        }
    }
}

#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<LedgerEvent>,
}

impl EventHub {
    pub fn new() -> Self {
        Self { tx: broadcast::channel(1024).0 }
    }

    pub fn publish(&self, event: LedgerEvent) {
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(event);
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
