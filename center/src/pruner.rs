//! Keeps the `requests` table to what replay protection needs: every period, deletes the
//! records no retry can use any more (`LedgerStore::prune_requests`), a small batch per
//! transaction so no statement holds many rows. One task, stopped by the shutdown signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::store::LedgerStore;

/// Rows deleted per statement.
pub const BATCH: u32 = 500;

pub async fn run(store: Arc<dyn LedgerStore>, period: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let mut removed = 0;
        loop {
            match store.prune_requests(BATCH).await {
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
            tracing::debug!(removed, "request records of superseded epochs removed");
        }
    }
}
