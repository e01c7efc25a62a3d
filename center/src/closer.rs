//! Closes items whose `closes_at` has come (the center's clock): each as CloseItem would,
//! then asks every channel to give back its idle units (the end-of-sale return), so
//! unsold units come back; reservations already made still confirm until they expire.
//! One task, stopped by the shutdown signal. Several center replicas may each run it: the
//! store closes an item once, and only that call tells the channels.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::now_ms;
use crate::events::{EventHub, LedgerEvent};
use crate::store::LedgerStore;

/// How often due items are looked for: an item closes at the center within this of its
/// `closes_at` (agents stop selling it at `closes_at` by their own bound on this clock).
pub const PERIOD: Duration = Duration::from_millis(250);

pub async fn run(store: Arc<dyn LedgerStore>, events: EventHub, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(PERIOD) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        match store.close_due(now_ms()).await {
            Ok(closed) => {
                for record in closed {
                    tracing::info!(item = %record.item_id, closes_at = record.plan.schedule.closes_at_ms, "item closed by its schedule");
                    events.publish(LedgerEvent::scheduled(&record));
                    // No starving channel: every channel gives back.
                    events.publish(LedgerEvent::ReturnRequested { item_id: record.item_id, starving: String::new() });
                }
            }
            Err(e) => tracing::warn!(error = %e, "closing due items: ledger unreachable"),
        }
    }
}
