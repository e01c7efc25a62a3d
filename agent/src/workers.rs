//! Background work, one task each, all stopped by one shutdown signal: the rebalancer
//! (expiry sweep + watermarks), the heartbeat and the event watcher (these three only on
//! the replica leading the channel), the leadership loop and the rate limiter's upkeep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;
use tonic::Code;

use crate::agent::Agent;
use crate::items::Item;
use crate::replicas::Round;
use inventory_core::ItemId;

/// A pool nothing happened to is still looked at this often (expiries, above-high timing,
/// stock sold by other replicas)...
const IDLE_LOOK_EVERY_MS: i64 = 500;

/// ...but with many items, quiet pools together get at most this many looks per second
/// (10,000 quiet items: each looked at every 5 s).
const IDLE_LOOKS_PER_SEC: i64 = 2_000;

/// How often the rebalancer scans every item for looks due (idle, a resync); between
/// scans it looks at the items whose rules turned dirty (`items::LookQueue`).
const SCAN_EVERY: Duration = Duration::from_millis(200);

/// Pools looked at concurrently in one rebalancer pass.
const LOOKS_IN_FLIGHT: usize = 32;

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
    let mut scanned: Option<Instant> = None;
    while tick(&mut stop, period).await {
        if !agent.is_leading() {
            continue;
        }
        // Items the followers loaded or found short of stock: look at them now.
        for id in agent.replicas.take_wants().await {
            if let Ok(id) = ItemId::parse("item_id", &id)
                && let Ok(item) = agent.item(&id).await
            {
                item.with(|c| c.touch());
            }
        }
        // Every pass looks at the items whose rules turned dirty; only every SCAN_EVERY
        // does it scan them all for the other reasons to look (idle, a resync due), which
        // a catalogue of 100,000 items would otherwise pay fifty times a second.
        let wanted = agent.items.take_looks_wanted();
        let candidates = if scanned.is_none_or(|at| at.elapsed() >= SCAN_EVERY) {
            scanned = Some(Instant::now());
            agent.items()
        } else {
            wanted
        };
        let idle_every = idle_look_every_ms(agent.items.len());
        let now = crate::clock::now_ms();
        let due: Vec<_> = candidates.into_iter().filter(|item| item.with(|c| c.needs_look(now, idle_every))).collect();
        let whole = quiet_looks(&agent, due, now).await;
        futures::stream::iter(whole)
            .for_each_concurrent(LOOKS_IN_FLIGHT, |item| {
                let agent = Arc::clone(&agent);
                async move {
                    if let Err(e) = agent.stocking.look(&item).await {
                        agent.metrics.pool_store_error();
                        tracing::warn!(item = %item.item_id, error = %e, "rebalance failed");
                    }
                }
            })
            .await;
    }
}

/// Outbox sizes the reader reads at most per pass (5 s apart): 200 store calls a second.
const OUTBOX_READS_PER_PASS: usize = 1_000;

/// An outbox size older than this is read again: two idle looks' time and a pass of the
/// reader's, so a pool looked at whole that often is not read again.
fn outbox_stale_after(items: usize) -> Duration {
    let looks = u64::try_from(2 * idle_look_every_ms(items)).unwrap_or(u64::MAX);
    Duration::from_millis(looks) + Duration::from_secs(5)
}

/// Looks at the `due` items whose last whole look may still answer (`core::channel::quiet`)
/// from their pools' stamps, read a hundred pools a store call; returns the items to look
/// at whole (their stamp moved, could not be read, or they may not be answered so).
async fn quiet_looks(agent: &Arc<Agent>, due: Vec<Arc<Item>>, now_ms: i64) -> Vec<Arc<Item>> {
    let (quiet, mut whole): (Vec<_>, Vec<_>) =
        due.into_iter().partition(|item| !item.is_segmented() && item.with(|c| c.may_look_unchanged(now_ms)));
    if quiet.is_empty() {
        return whole;
    }
    // Taken before the stamps are read: a stamp read after an operation changed what the
    // rules know decides nothing.
    let tokens: Vec<_> = quiet.iter().map(|item| item.with(|c| c.begin_read())).collect();
    let pools: Vec<_> = quiet.iter().map(|item| item.pool.clone()).collect();
    let stamps = agent.store.stamps(&pools).await;
    let ctx = agent.stocking.ctx();
    for ((item, token), stamp) in quiet.into_iter().zip(tokens).zip(stamps) {
        let read = stamp.ok().and_then(|stamp| item.with(|c| c.look_unchanged(stamp, token, ctx)));
        match read {
            Some(read) => {
                agent.stocking.look_unchanged(&item, read, token);
            }
            None => whole.push(item),
        }
    }
    whole
}

/// How often a quiet pool is looked at when the agent has `items` pools.
pub fn idle_look_every_ms(items: usize) -> i64 {
    let spread = i64::try_from(items).unwrap_or(i64::MAX).saturating_mul(1_000) / IDLE_LOOKS_PER_SEC;
    spread.max(IDLE_LOOK_EVERY_MS)
}

/// Reports the pools that changed and renews the lease. A stale epoch means the channel
/// was fenced (another registration, or a reclaim): register again and resync.
pub async fn heartbeat(agent: Arc<Agent>, period: Option<Duration>, mut stop: watch::Receiver<bool>) {
    let mut started = Instant::now();
    loop {
        let period = period.unwrap_or_else(|| Duration::from_millis((agent.link.lease_ttl_ms() / 3).max(100)));
        // A period from the last heartbeat's start, not its end: reading many thousands of
        // pools takes seconds, which must not push each renewal of the lease that much
        // closer to its expiry.
        if !tick(&mut stop, period.saturating_sub(started.elapsed())).await {
            return;
        }
        started = Instant::now();
        if !agent.is_leading() {
            continue;
        }
        // Only pools that changed since the center's last acknowledgement: with many
        // quiet items a heartbeat stays small (the center keeps the last report of each),
        // and reads little more than each pool's stamp (`Reporting::quiet`).
        match agent.reporting.send(agent.reporting.quiet(period).await, false).await {
            Ok(_) => agent.replicas.publish_lease().await,
            Err(s) if s.code() == Code::FailedPrecondition => {
                // Register again only while this replica still leads the channel; else
                // the replica that leads now registered, and this one follows.
                if matches!(agent.replicas.claim().await, Ok(true)) {
                    tracing::warn!(message = s.message(), "fenced by the center; registering again");
                    if let Err(e) = agent.register().await {
                        tracing::warn!(error = %e, "re-registration failed");
                    }
                } else {
                    tracing::warn!(message = s.message(), "fenced by the center; another replica leads");
                    agent.role.set_leading(false);
                }
            }
            Err(s) => {
                // Counted; the link logs when the center is lost and regained.
                agent.metrics.center_error();
                tracing::debug!(code = ?s.code(), message = s.message(), "heartbeat failed");
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
                crate::events::refresh_all(&agent.items, &agent.link).await;
                loop {
                    tokio::select! {
                        msg = stream.message() => match msg {
                            Ok(Some(ev)) => {
                                if let Some(e) = ev.event {
                                    crate::events::apply(&agent.items, &agent.link, &agent.stocking, e).await;
                                }
                            }
                            Ok(None) | Err(_) => break,
                        },
                        _ = stopped(&mut stop) => return,
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

/// Leadership among the channel's replicas: renew or take the claim, follow the lease;
/// a replica that just took the lead registers.
pub async fn leadership(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    let period = agent.replicas.period();
    while tick(&mut stop, period).await {
        if agent.is_draining() {
            return;
        }
        if agent.replicas.step().await == Round::Leading {
            // On failure the heartbeat loop registers again (its epoch is stale).
            if let Err(e) = agent.register().await {
                tracing::warn!(error = %e, "registration as the new leader failed; retrying");
            }
        }
    }
}

/// Reads the outbox size of pools no whole look read lately, for the metrics (on the
/// leading replica, which exports the pool gauges). A whole look reads it on the way
/// (`Stocking::look`), and every write that adds events moves the pool's stamp, so the
/// next look is whole: what this reads is a segmented item's, a pool whose looks failed,
/// or an idle pool's outbox that the relay emptied since (a trim moves no stamp). The
/// oldest first, a bounded number a pass: it feeds an alert on a bound, not a dashboard,
/// and must not cost an idle catalogue of many items a script call per pool.
pub async fn outbox_sizes(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    while tick(&mut stop, Duration::from_secs(5)).await {
        if !agent.is_leading() {
            continue;
        }
        let items = agent.items();
        let stale_after = outbox_stale_after(items.len());
        let mut stale: Vec<_> =
            items.into_iter().map(|item| (item.outbox_age(), item)).filter(|(age, _)| *age >= stale_after).collect();
        stale.sort_by_key(|(age, _)| std::cmp::Reverse(*age));
        stale.truncate(OUTBOX_READS_PER_PASS);
        let stale = stale.into_iter().map(|(_, item)| item);
        futures::stream::iter(stale)
            .for_each_concurrent(LOOKS_IN_FLIGHT, |item| {
                let agent = Arc::clone(&agent);
                async move {
                    let reads = futures::future::try_join_all(item.pools.iter().map(|p| agent.store.outbox_stats(p)));
                    if let Ok(stats) = reads.await {
                        item.set_outbox_stats(inventory_core::pool::OutboxStats::fullest(&stats));
                    }
                }
            })
            .await;
    }
}

/// Keeps the per-user rate limiter's memory to the recently active users.
pub async fn limiter_gc(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    while tick(&mut stop, Duration::from_secs(1)).await {
        let tracked = agent.selling.limits.forget_idle();
        tracing::trace!(tracked, "rate limiter state");
    }
}

/// Buyers the registry's sweeper looks at per item and pass.
const SWEEP_BUYERS_PER_PASS: usize = 500;

/// How often the buyer registry's sweeper passes over the global items.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// Settles the claims this channel's Acquires left pending or held past their
/// reservation's expiry (items with a global limit; leading replica only).
pub async fn buyer_sweeper(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    let Some(registry) = agent.selling.global.registry.clone() else { return };
    let recheck_ms = i64::try_from(agent.selling.global.pending_ms).unwrap_or(i64::MAX);
    while tick(&mut stop, SWEEP_EVERY).await {
        if !agent.is_leading() {
            continue;
        }
        // The channel's global items, loaded or not (a restarted agent has claims of its
        // predecessor to settle).
        let ids = match registry.items(agent.link.channel.as_str()).await {
            Ok(ids) => ids,
            Err(e) => {
                agent.metrics.buyer_registry_errors.inc();
                tracing::warn!(error = %e, "buyer registry unreachable: no sweep");
                continue;
            }
        };
        let mut global = Vec::new();
        for id in ids {
            let Ok(id) = ItemId::parse("item_id", &id) else { continue };
            match agent.item(&id).await {
                Ok(item) if item.limit.scope == inventory_core::buyers::LimitScope::Global => global.push(item),
                Ok(_) => {}
                Err(e) => tracing::warn!(item = %id, error = %e, "buyer registry sweep: item not loaded"),
            }
        }
        for item in global {
            let now = crate::clock::now_ms();
            match crate::buyers::sweep(
                &registry,
                agent.store.as_ref(),
                &item.pools,
                now,
                recheck_ms,
                SWEEP_BUYERS_PER_PASS,
            )
            .await
            {
                Ok(stats) => {
                    agent.metrics.buyer_swept.inc_by(stats.released);
                }
                Err(e) => {
                    agent.metrics.buyer_registry_errors.inc();
                    tracing::warn!(item = %item.item_id, error = %e, "buyer registry sweep failed");
                }
            };
        }
    }
}

/// How often the basket sweeper looks for open intents.
const BASKET_SWEEP_EVERY: Duration = Duration::from_millis(250);

/// Undoes the channel's basket intents left open past the bound (a driver that crashed,
/// here or in an earlier run of the channel's agent; leading replica only).
pub async fn basket_sweeper(agent: Arc<Agent>, mut stop: watch::Receiver<bool>) {
    while tick(&mut stop, BASKET_SWEEP_EVERY).await {
        if !agent.is_leading() {
            continue;
        }
        match agent.baskets.sweep(&agent.selling).await {
            Ok(open) => {
                agent.metrics.baskets_open.set(i64::try_from(open).unwrap_or(i64::MAX));
            }
            Err(e) => {
                if e.is_pool_store_error() {
                    agent.metrics.pool_store_error();
                }
                tracing::warn!(error = %e, "basket sweep failed");
            }
        }
    }
}
