//! Selling: the hot path (Acquire) and the reservation calls. One store call in the common
//! case; none when sold out everywhere. The rules say what to do before and after the
//! store call ([`inventory_core::channel::ItemCore::admit`], `on_miss`, `on_sold_out`).
//!
//! - `acquire`: the Acquire path as named stages (open, admit, claim, reserve, settle,
//!   answer);
//! - `reservations`: confirm, cancel, refund, extend, lookup, GetStock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use inventory_core::{ItemId, UserId};
use inventory_proto::v1 as pb;

use crate::buyers::limit::GlobalLimits;
use crate::error::AgentError;
use crate::items::{Item, Items};
use crate::link::CenterLink;
use crate::metrics::Metrics;
use crate::outbox::EventFeed;
use crate::replicas::Replicas;
use crate::role::Role;
use crate::security::UserLimits;
use crate::segmented;
use crate::stocking::Stocking;
use crate::store::PoolStore;

mod acquire;
mod reservations;

/// A validated Acquire.
pub struct AcquireRequest {
    pub item: ItemId,
    pub user: UserId,
    pub quantity: u64,
    pub idempotency_key: String,
    /// The pool generation an earlier answer for this key carried, when the backend passed it.
    pub expect_pool_generation: Option<u64>,
    /// Reserve up to `quantity` when fewer remain (or the user's allowance has less room).
    pub allow_partial: bool,
}

pub struct Selling {
    pub(crate) store: Arc<dyn PoolStore>,
    pub(crate) link: Arc<CenterLink>,
    pub(crate) items: Arc<Items>,
    pub(crate) stocking: Arc<Stocking>,
    pub(crate) replicas: Arc<Replicas>,
    pub(crate) role: Arc<Role>,
    pub(crate) metrics: Arc<Metrics>,
    /// Told of every transition this agent wrote, so event streams wake.
    pub(crate) events: Arc<EventFeed>,
    pub limits: UserLimits,
    /// Acquires refused by the per-user rate limit.
    pub rate_limited: AtomicU64,
    /// How long an Acquire that found the pool empty waits for the shared Borrow.
    pub(crate) miss_wait: Duration,
    /// Items with a global per-user limit: the buyer registry.
    pub global: GlobalLimits,
    /// What the Redis nodes' policy check and the store's refusals say: sales stop while
    /// a node may evict keys.
    pub store_health: Arc<crate::store::health::StoreHealth>,
    /// Test-only fault point (`--test-abort-after-move-take`): abort the process between
    /// a move's take and its refill.
    pub abort_after_move_take: segmented::AbortHook,
}

impl Selling {
    /// The item's state, loading it from the center on first use. A follower tells the
    /// leader about an item it loaded (the leader may not know it yet).
    pub async fn item(&self, item: &ItemId) -> Result<Arc<Item>, AgentError> {
        let (it, loaded) = self.items.load(item, &self.link, crate::clock::now_ms()).await?;
        if loaded && !self.role.is_leading() {
            self.replicas.want(&it, false).await;
        }
        Ok(it)
    }

    pub async fn acquire(&self, req: AcquireRequest) -> Result<pb::AcquireResponse, AgentError> {
        self.admit_user(req.user.as_str())?;
        self.acquire_admitted(req).await
    }

    /// The checks every purchase passes once (an Acquire, or a basket however many lines
    /// it has): the agent is not draining, the user is within the per-user rate.
    pub fn admit_user(&self, user: &str) -> Result<(), AgentError> {
        if self.role.is_draining() {
            return Err(AgentError::Unavailable("agent is shutting down; retry on another agent".into()));
        }
        if !self.limits.allow(user) {
            self.rate_limited.fetch_add(1, Ordering::Relaxed);
            return Err(AgentError::ResourceExhausted(format!(
                "user_id {user:?} is sending requests too fast; retry later"
            )));
        }
        Ok(())
    }
}
