//! Optional automatic reclaim: takes back a dead channel's unsold units once its lease
//! has been expired for the configured delay. One task, stopped by the shutdown signal.

use std::sync::Arc;
use std::time::Duration;

use inventory_core::Channel;
use inventory_core::ledger::reclaimable;
use tokio::sync::watch;

use crate::clock::now_ms;
use crate::events::{EventHub, LedgerEvent};
use crate::store::LedgerStore;

pub async fn run(store: Arc<dyn LedgerStore>, events: EventHub, after_ms: u64, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_millis((after_ms / 4).clamp(100, 5_000));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let channels = match store.channels().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "auto reclaim: ledger unreadable");
                continue;
            }
        };
        let now = now_ms();
        for c in channels {
            let due = now >= c.session.lease_expires_at_ms.saturating_add(i64::try_from(after_ms).unwrap_or(i64::MAX));
            // Only channels that still hold something reclaimable: an idle dead channel
            // is left alone (each reclaim bumps its epoch).
            if !due || !c.allocations.iter().any(|(_, a)| reclaimable(a) > 0) {
                continue;
            }
            let Ok(channel) = Channel::parse("channel", &c.channel) else { continue };
            match store.reclaim(&channel, now, after_ms).await {
                Ok(out) => {
                    for (item_id, units, center_available, in_doubt) in out.items {
                        tracing::warn!(channel = %channel, item = %item_id, units, in_doubt, new_epoch = out.new_epoch, "auto reclaimed");
                        if units > 0 {
                            events.publish(LedgerEvent::Restocked {
                                item_id,
                                center_available,
                                from_channel: Some(channel.to_string()),
                            });
                        }
                    }
                }
                Err(e) => tracing::debug!(channel = %channel, error = %e, "auto reclaim skipped"),
            }
        }
    }
}
