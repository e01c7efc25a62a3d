//! Background work, one task each, all stopped by one shutdown signal:
//! the rebalancer (expiry sweep + watermarks), the heartbeat, and the event watcher.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::Code;

use crate::agent::Agent;
use crate::clock::now_ms;
use crate::items::Policy;

/// A pool nothing happened to is still looked at this often (expiries, above-high timing).
const IDLE_LOOK_EVERY_MS: i64 = 500;

/// Resolves once shutdown is signalled (the guard `wait_for` returns is not Send, so it
/// is dropped here rather than held across the caller's awaits).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Waits for `period` or shutdown; false means stop.
async fn tick(stop: &mut watch::Receiver<bool>, period: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(period) => {}
        _ = stopped(stop) => return false,
    }
    !*stop.borrow()
}

/// Sweeps expired reservations and keeps each pool between its watermarks.
pub async fn rebalancer(agent: Arc<Agent>, period: Duration, mut stop: watch::Receiver<bool>) {
    while tick(&mut stop, period).await {
        for item in agent.items() {
            let now = now_ms();
            if !item.needs_look(now, IDLE_LOOK_EVERY_MS) {
                continue;
            }
            if let Err(e) = agent.rebalance(&item, now).await {
                if crate::metrics::is_pool_store_error(&e) {
                    agent.metrics.pool_store_error();
                }
                tracing::warn!(item = %item.item_id, error = %e, "rebalance failed");
            }
        }
    }
}

/// Reports every pool to the center and renews the lease. A stale epoch means the
/// channel was fenced (another registration, or a reclaim): register again and resync.
pub async fn heartbeat(agent: Arc<Agent>, period: Option<Duration>, mut stop: watch::Receiver<bool>) {
    loop {
        let period = period.unwrap_or_else(|| Duration::from_millis((agent.link.lease_ttl_ms() / 3).max(100)));
        if !tick(&mut stop, period).await {
            return;
        }
        let reports = agent.reports().await;
        match agent.link.heartbeat(reports, false).await {
            Ok(r) => agent.freeze_in_doubt(&r.in_doubt_items),
            Err(s) if s.code() == Code::FailedPrecondition => {
                tracing::warn!(message = s.message(), "fenced by the center; registering again");
                if let Err(e) = agent.register_and_resync().await {
                    tracing::warn!(error = %e, "re-registration failed");
                }
            }
            Err(s) => {
                agent.metrics.center_error();
                tracing::warn!(code = ?s.code(), message = s.message(), "heartbeat failed");
            }
        }
    }
}

/// Follows the channel's event stream; on every (re)connect, re-reads each item's
/// settings so nothing missed while disconnected stays stale.
pub async fn watcher(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            return;
        }
        match agent.link.watch().await {
            Ok(mut stream) => {
                resync_policies(&agent).await;
                loop {
                    tokio::select! {
                        msg = stream.message() => match msg {
                            Ok(Some(ev)) => {
                                if let Some(e) = ev.event {
                                    agent.on_event(e).await;
                                }
                            }
                            Ok(None) | Err(_) => break,
                        },
                        _ = stopped(&mut stop) => {
                            return;
                        }
                    }
                }
            }
            Err(s) => tracing::debug!(code = ?s.code(), "watch failed"),
        }
        // Reconnect backoff.
        if !tick(&mut stop, Duration::from_millis(500)).await {
            return;
        }
    }
}

async fn resync_policies(agent: &Agent) {
    for item in agent.items() {
        if let Ok(d) = agent.link.describe(&item.item_id).await {
            item.set_policy(Policy::from_describe(&d));
            item.set_center_available(d.center_available);
        }
    }
}

/// Keeps the per-user rate limiter's memory to the recently active users.
pub async fn limiter_gc(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    while tick(&mut stop, Duration::from_secs(1)).await {
        let tracked = agent.limits.forget_idle();
        tracing::trace!(tracked, "rate limiter state");
    }
}
