//! Keeps the `requests` table to what replay protection needs: every period, deletes the
//! records no retry can use any more (`LedgerStore::prune_requests`): those of an epoch
//! the channel has left, and those older than the age bound (`inventory_core::records`),
//! a small batch per statement so no statement holds many rows. So a channel's records
//! number at most what it can send in the bound's time (its rate limit times
//! `records::kept_ms`). One task, stopped by the shutdown signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::store::LedgerStore;

/// Rows deleted per statement.
pub const BATCH: u32 = 500;

pub async fn run(store: Arc<dyn LedgerStore>, period: Duration, max_age_ms: u64, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let mut removed = 0;
        loop {
            let before_ms = inventory_core::records::prune_before(crate::clock::now_ms(), max_age_ms);
            match store.prune_requests(BATCH, before_ms).await {
                Ok(n) => {
                    removed += n;
                    if n < u64::from(BATCH) || *stop.borrow() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "request records not pruned");
                    break;
                }
            }
        }
        if removed > 0 {
            tracing::debug!(removed, "request records of superseded epochs or past the age bound removed");
        }
    }
}
