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

use crate::items::Item;
use crate::link::CenterLink;
use crate::role::Role;
use crate::store::{ChannelOp, ChannelReply, PoolStore, StoreError};

/// How often a follower waiting for stock looks at the pool.
const STOCK_POLL: Duration = Duration::from_millis(20);

/// What one round of the leadership loop changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Nothing changed (still leading, or still following).
    Same,
    /// This replica just took the lead: it must register with the center.
    Leading,
    /// Another replica leads now.
    Following,
}

pub struct Replicas {
    store: Arc<dyn PoolStore>,
    link: Arc<CenterLink>,
    role: Arc<Role>,
    leader_ttl_ms: u64,
    miss_wait: Duration,
}

impl Replicas {
    pub fn new(
        store: Arc<dyn PoolStore>,
        link: Arc<CenterLink>,
        role: Arc<Role>,
        leader_ttl_ms: u64,
        miss_wait: Duration,
    ) -> Self {
        Self { store, link, role, leader_ttl_ms, miss_wait }
    }

    async fn op(&self, op: ChannelOp<'_>) -> Result<ChannelReply, StoreError> {
        self.store.channel_op(self.link.channel.as_str(), op).await
    }

    fn replica(&self) -> &str {
        self.link.agent_id.as_str()
    }

    /// How often the leadership loop runs.
    pub fn period(&self) -> Duration {
        Duration::from_millis((self.leader_ttl_ms / 3).max(10))
    }

    /// Says this replica is alive (for `leader_ttl_ms`); answers how many others are.
    pub async fn announce(&self) -> Result<u64, StoreError> {
        match self.op(ChannelOp::Present { replica: self.replica(), ttl_ms: self.leader_ttl_ms }).await? {
            ChannelReply::Count(n) => Ok(n),
            other => Err(StoreError::Protocol(format!("present: unexpected reply {other:?}"))),
        }
    }

    /// Claims (or renews) the leadership. True when this replica leads now.
    pub async fn claim(&self) -> Result<bool, StoreError> {
        let op = ChannelOp::Lead { replica: self.replica(), ttl_ms: self.leader_ttl_ms };
        Ok(self.op(op).await? == ChannelReply::Done(true))
    }

    /// Publishes the leader's lease for the followers (nothing if this replica does not lead).
    pub async fn publish_lease(&self) {
        let ttl_ms = self.link.lease_left_ms();
        if !self.role.is_leading() || ttl_ms == 0 {
            return;
        }
        if let Err(e) = self.op(ChannelOp::Publish { replica: self.replica(), ttl_ms }).await {
            tracing::warn!(error = %e, "cannot publish the channel's lease");
        }
    }

    /// A follower tells the leader the item wants attention (rate limited per item).
    /// `refresh`: also re-read the center's stock of it (a follower hears no events).
    pub async fn want(&self, item: &Item, refresh: bool) {
        if !item.with(|c| c.starving_signal_due(crate::clock::now_ms())) {
            return;
        }
        if let Err(e) = self.op(ChannelOp::Want { item_id: &item.item_id }).await {
            tracing::warn!(item = %item.item_id, error = %e, "cannot tell the leader about the item");
            return;
        }
        if refresh && let Ok(d) = self.link.describe(&item.item_id).await {
            item.with(|c| c.set_center_available(d.center_available));
        }
    }

    /// A follower found the pool short: asks the leader for stock and waits (up to the miss
    /// wait) until the pool has `quantity` available. False when the center has none left or
    /// the wait ran out.
    pub async fn wait_for_stock(&self, item: &Arc<Item>, quantity: u64) -> bool {
        self.want(item, true).await;
        let deadline = Instant::now() + self.miss_wait;
        while !item.with(|c| c.supply().center_dry) && Instant::now() < deadline {
            tokio::time::sleep(STOCK_POLL).await;
            match crate::segmented::available(self.store.as_ref(), item).await {
                Ok(available) if available >= quantity => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    }

    /// The items followers asked about since the last call.
    pub async fn take_wants(&self) -> Vec<String> {
        match self.op(ChannelOp::TakeWants { max: 1_000 }).await {
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
    /// published. Also keeps this replica's presence fresh. The caller registers when this
    /// says [`Round::Leading`].
    pub async fn step(&self) -> Round {
        let _ = self.announce().await;
        let was_leading = self.role.is_leading();
        match self.claim().await {
            Ok(true) if was_leading => {
                self.publish_lease().await;
                Round::Same
            }
            Ok(true) => {
                tracing::info!(replica = self.replica(), "leading the channel: registering with the center");
                self.role.set_leading(true);
                Round::Leading
            }
            Ok(false) => {
                let round = if was_leading {
                    tracing::warn!(replica = self.replica(), "another replica leads the channel now; following");
                    self.role.set_leading(false);
                    Round::Following
                } else {
                    Round::Same
                };
                let asked_at = self.link.now_ms();
                match self.op(ChannelOp::LeaseLeft).await {
                    Ok(ChannelReply::Millis(left)) => self.link.follow_lease(left, asked_at),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "cannot read the channel's lease"),
                }
                round
            }
            // The store is unreachable: nobody sells from it anyway; a lapsed claim is taken
            // by another replica, whose registration fences this one.
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew the leadership");
                Round::Same
            }
        }
    }

    /// On shutdown: a leader gives up its claim. True when other replicas are alive to go on
    /// selling from the shared pools (then this one must not give their stock back to the
    /// center); false when this is the channel's last replica.
    pub async fn hand_over(&self) -> bool {
        if self.role.is_leading() {
            let _ = self.op(ChannelOp::Resign { replica: self.replica() }).await;
            self.role.set_leading(false);
        }
        match self.op(ChannelOp::Absent { replica: self.replica() }).await {
            Ok(ChannelReply::Count(others)) => others > 0,
            // Unknown: assume others remain (keeping stock in the pools is the safe side; a
            // reclaim or the next leader's registration settles it).
            _ => true,
        }
    }
}
