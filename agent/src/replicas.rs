//! Several agent replicas of one channel sharing one pool store (a Redis server or a Redis
//! Cluster). The coordination state lives next to the pools (`lua/channel.lua`).
//!
//! - **One leader per channel.** A replica leads while it holds a short claim in the
//!   store (`leader_ttl_ms`, renewed every third of it). Only the leader registers with the
//!   center, borrows, returns, reports and follows the channel's events, so the channel
//!   keeps one epoch and one lease at the center and two replicas never both top up a
//!   pool. A lone agent is a leader nobody contests.
//! - **Everyone sells.** Every replica serves Acquire/Confirm/Cancel from the shared pools
//!   (each one Lua call, atomic whoever makes it) while the channel's lease runs: the
//!   leader publishes its lease in the store, followers read it.
//! - **Followers ask.** A follower that loads an item or finds its pool empty adds the item
//!   to the channel's wants; the leader takes the wants on every rebalancer tick.
//! - **Takeover is fenced.** When a claim lapses another replica takes it and registers: a
//!   new epoch, so the center refuses the old leader's calls from then on, and it raises
//!   every pool's fence to that epoch before resyncing it, so the old leader's late refill
//!   or return can no longer move units the resync has counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::Agent;
use crate::clock::now_ms;
use crate::items::ItemRuntime;
use crate::store::{ChannelOp, ChannelReply, StoreError};

/// At most one want (and one look at the center) per item per this many ms.
const WANT_EVERY_MS: i64 = 200;

/// How often a follower waiting for stock looks at the pool.
const STOCK_POLL: Duration = Duration::from_millis(20);

async fn op(agent: &Agent, op: ChannelOp<'_>) -> Result<ChannelReply, StoreError> {
    agent.store.channel_op(agent.link.channel.as_str(), op).await
}

fn replica(agent: &Agent) -> &str {
    agent.link.agent_id.as_str()
}

/// Says this replica is alive (for `leader_ttl_ms`); answers how many others are.
pub async fn announce(agent: &Agent) -> Result<u64, StoreError> {
    let ttl_ms = agent.settings.leader_ttl_ms;
    match op(agent, ChannelOp::Present { replica: replica(agent), ttl_ms }).await? {
        ChannelReply::Count(n) => Ok(n),
        other => Err(StoreError::Protocol(format!("present: unexpected reply {other:?}"))),
    }
}

/// Claims (or renews) the leadership. True when this replica leads now.
pub async fn claim(agent: &Agent) -> Result<bool, StoreError> {
    let ttl_ms = agent.settings.leader_ttl_ms;
    Ok(op(agent, ChannelOp::Lead { replica: replica(agent), ttl_ms }).await? == ChannelReply::Done(true))
}

/// Publishes the leader's lease for the followers (nothing if this replica does not lead).
pub async fn publish_lease(agent: &Agent) {
    let ttl_ms = agent.link.lease_left_ms();
    if !agent.is_leading() || ttl_ms == 0 {
        return;
    }
    if let Err(e) = op(agent, ChannelOp::Publish { replica: replica(agent), ttl_ms }).await {
        tracing::warn!(error = %e, "cannot publish the channel's lease");
    }
}

/// A follower tells the leader the item wants attention (rate limited per item).
pub async fn want(agent: &Agent, item: &ItemRuntime) {
    if !item.starving_signal_due(now_ms(), WANT_EVERY_MS) {
        return;
    }
    if let Err(e) = op(agent, ChannelOp::Want { item_id: &item.item_id }).await {
        tracing::warn!(item = %item.item_id, error = %e, "cannot tell the leader about the item");
        return;
    }
    // A follower hears no events: refresh what it knows of the center's stock here.
    if item.local_empty()
        && let Ok(d) = agent.link.describe(&item.item_id).await
    {
        item.set_center_available(d.center_available);
    }
}

/// A follower found the pool short: asks the leader for stock and waits (up to the miss
/// wait) until the pool has `quantity` available. False when the center has none left or
/// the wait ran out.
pub async fn wait_for_stock(agent: &Agent, item: &Arc<ItemRuntime>, quantity: u64) -> bool {
    item.mark_local_empty();
    want(agent, item).await;
    let deadline = Instant::now() + agent.settings.miss_wait;
    while !item.center_dry() && Instant::now() < deadline {
        tokio::time::sleep(STOCK_POLL).await;
        match agent.store.snapshot(&item.pool).await {
            Ok(s) if s.available >= quantity => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// The items followers asked about since the last call.
pub async fn take_wants(agent: &Agent) -> Vec<String> {
    match op(agent, ChannelOp::TakeWants { max: 1_000 }).await {
        Ok(ChannelReply::Items(items)) => items,
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the followers' wants");
            Vec::new()
        }
    }
}

/// One round of the leadership loop: a leader renews its claim (and steps down if it
/// lost it); a follower tries to take the lead, else adopts the lease its leader
/// published. Also keeps this replica's presence fresh.
pub async fn step(agent: &Agent) {
    let _ = announce(agent).await;
    let was_leading = agent.is_leading();
    match claim(agent).await {
        Ok(true) if was_leading => publish_lease(agent).await,
        Ok(true) => {
            tracing::info!(replica = replica(agent), "leading the channel: registering with the center");
            agent.set_leading(true);
            // On failure the heartbeat loop registers again (its epoch is stale).
            if let Err(e) = agent.register_and_resync().await {
                tracing::warn!(error = %e, "registration as the new leader failed; retrying");
            }
        }
        Ok(false) => {
            if was_leading {
                tracing::warn!(replica = replica(agent), "another replica leads the channel now; following");
                agent.set_leading(false);
            }
            let asked_at = agent.link.now_ms();
            match op(agent, ChannelOp::LeaseLeft).await {
                Ok(ChannelReply::Millis(left)) => agent.link.follow_lease(left, asked_at),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read the channel's lease"),
            }
        }
        // The store is unreachable: nobody sells from it anyway; a lapsed claim is taken
        // by another replica, whose registration fences this one.
        Err(e) => tracing::warn!(error = %e, "cannot renew the leadership"),
    }
}

/// On shutdown: a leader gives up its claim. True when other replicas are alive to go on
/// selling from the shared pools (then this one must not give their stock back to the
/// center); false when this is the channel's last replica.
pub async fn hand_over(agent: &Agent) -> bool {
    if agent.is_leading() {
        let _ = op(agent, ChannelOp::Resign { replica: replica(agent) }).await;
        agent.set_leading(false);
    }
    match op(agent, ChannelOp::Absent { replica: replica(agent) }).await {
        Ok(ChannelReply::Count(others)) => others > 0,
        // Unknown: assume others remain (keeping stock in the pools is the safe side; a
        // reclaim or the next leader's registration settles it).
        _ => true,
    }
}
