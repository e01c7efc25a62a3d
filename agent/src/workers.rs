//! Background work, one task each, all stopped by one shutdown signal: the rebalancer
//! (expiry sweep + watermarks), the heartbeat and the event watcher (these three only on
//! the replica leading the channel), and the leadership loop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::Code;

use crate::agent::Agent;
use crate::clock::now_ms;
use crate::items::Policy;
use crate::replicas;
use inventory_core::ItemId;

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
        if !agent.is_leading() {
            continue;
        }
        // Items the followers loaded or found short of stock: look at them now.
        for id in replicas::take_wants(&agent).await {
            if let Ok(id) = ItemId::parse("item_id", &id)
                && let Ok(item) = agent.item(&id).await
            {
                item.touch();
            }
        }
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
        if !agent.is_leading() {
            continue;
        }
        let reports = agent.reports().await;
        match agent.link.heartbeat(reports, false).await {
            Ok(r) => {
                agent.freeze_in_doubt(&r.in_doubt_items);
                replicas::publish_lease(&agent).await;
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // Register again only while this replica still leads the channel; else
                // the replica that leads now registered, and this one follows.
                if matches!(replicas::claim(&agent).await, Ok(true)) {
                    tracing::warn!(message = s.message(), "fenced by the center; registering again");
                    if let Err(e) = agent.register_and_resync().await {
                        tracing::warn!(error = %e, "re-registration failed");
                    }
                } else {
                    tracing::warn!(message = s.message(), "fenced by the center; another replica leads");
                    agent.set_leading(false);
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
        if !agent.is_leading() {
            // Events are the leader's business (they move stock).
            if !tick(&mut stop, Duration::from_millis(200)).await {
                return;
            }
            continue;
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

/// Leadership among the channel's replicas: renew or take the claim, follow the lease.
pub async fn leadership(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_millis((agent.settings.leader_ttl_ms / 3).max(10));
    while tick(&mut stop, period).await {
        if agent.is_draining() {
            return;
        }
        replicas::step(&agent).await;
    }
}

/// Keeps the per-user rate limiter's memory to the recently active users.
pub async fn limiter_gc(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    while tick(&mut stop, Duration::from_secs(1)).await {
        let tracked = agent.limits.forget_idle();
        tracing::trace!(tracked, "rate limiter state");
    }
}
