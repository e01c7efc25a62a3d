//! The Acquire path's use of the buyer registry for items whose per-user limit is global:
//! claim the user's allowance before the pool call, then bind the claim to the
//! reservation or release it; release on cancel and refund, mark confirmed on confirm.
//! A failure after the claim leaves it counted (never over the limit); the sweeper
//! settles it from the pool after the pending bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inventory_core::buyers::{ClaimResult, LimitScope, RegistryFallback};

use super::BuyerRegistry;
use crate::error::AgentError;
use crate::items::Item;
use crate::metrics::Metrics;
use crate::store::{AcquireResult, Reservation};

/// How long a claim may stay pending (claimed, pool call not bound) before the sweeper
/// asks the pool what became of it. Far above an Acquire's longest wait (a Borrow's).
pub const DEFAULT_PENDING_MS: u64 = 10_000;

/// How one Acquire of a global item stands after asking the registry.
pub enum Claimed {
    /// Not a global item, or the registry is down and the item falls back to the
    /// per-channel limit: go on without a claim.
    NoClaim,
    /// The allowance is claimed under the Acquire's key: `quantity` units, fewer than
    /// asked when an Acquire with `allow_partial` got what the allowance had left (the
    /// pool is then asked for that many).
    Held { quantity: u64 },
    /// Over the global limit: answer LIMIT_EXCEEDED with what is left.
    OverLimit { remaining: u64 },
}

/// The Acquire a claim was made for, as [`GlobalLimits::after_acquire`] needs it.
pub struct ClaimedAcquire<'a> {
    pub user: &'a str,
    pub key: &'a str,
    /// The limit the claim was made under.
    pub limit: u64,
    /// When the claim was asked for (before its registry call).
    pub claimed_at: Instant,
}

/// What the pool's answer may be given as after the registry's part.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterAcquire {
    /// Answer as the pool said.
    Kept,
    /// The claim lapsed during the pool call and the allowance went to another of the
    /// user's Acquires: the reservation must be cancelled, the answer LIMIT_EXCEEDED.
    OverLimit { remaining: u64 },
}

pub struct GlobalLimits {
    pub registry: Option<BuyerRegistry>,
    pub pending_ms: u64,
    /// Test-only fault point (`--test-abort-after-claim`): abort the process right after
    /// this user's claim, before the pool call, to test the crash between the two.
    pub abort_after_claim: Option<String>,
    /// Items this process noted in the channel's set of global items (once each).
    noted_items: std::sync::Mutex<std::collections::HashSet<String>>,
    pub(crate) metrics: Arc<Metrics>,
}

impl GlobalLimits {
    pub fn new(registry: Option<BuyerRegistry>, metrics: Arc<Metrics>) -> Self {
        Self {
            registry,
            pending_ms: DEFAULT_PENDING_MS,
            abort_after_claim: None,
            noted_items: Default::default(),
            metrics,
        }
    }

    fn registry_for(&self, item: &Item) -> Result<Option<&BuyerRegistry>, AgentError> {
        if item.limit.scope != LimitScope::Global {
            return Ok(None);
        }
        match &self.registry {
            Some(r) => Ok(Some(r)),
            None => Err(AgentError::Unavailable(format!(
                "item {} has a global per-user limit; start the agent with --buyer-registry-url to sell it",
                item.item_id
            ))),
        }
    }

    /// Claims `quantity` of the user's allowance under `key` (with `partial`, what the
    /// allowance has left when that is less), the buyer noted first in the channel's
    /// index so a crash right after the claim leaves it for the sweeper.
    pub async fn claim(
        &self,
        item: &Item,
        user: &str,
        key: &str,
        quantity: u64,
        limit: u64,
        partial: bool,
    ) -> Result<Claimed, AgentError> {
        let Some(registry) = self.registry_for(item)? else { return Ok(Claimed::NoClaim) };
        let (id, channel) = (item.item_id.as_str(), item.pool.channel.as_str());
        let at = crate::clock::now_ms().saturating_add(i64::try_from(self.pending_ms).unwrap_or(i64::MAX));
        let result = match self.note(registry, id, channel, user, at).await {
            Ok(()) if partial => registry.claim_up_to(id, user, key, channel, quantity, limit, self.pending_ms).await,
            Ok(()) => registry.claim(id, user, key, channel, quantity, limit, self.pending_ms).await,
            Err(e) => Err(e),
        };
        let granted = match &result {
            Ok(ClaimResult::Claimed { replayed }) => Some((quantity, *replayed)),
            Ok(ClaimResult::Partial { granted, replayed }) => Some((*granted, *replayed)),
            _ => None,
        };
        if let Some((granted, replayed)) = granted {
            if !replayed {
                self.metrics.buyer_claims.inc();
            }
            if self.abort_after_claim.as_deref() == Some(user) {
                tracing::error!(user, "test fault point: aborting between the claim and the pool call");
                std::process::abort();
            }
            return Ok(Claimed::Held { quantity: granted });
        }
        match result {
            Ok(ClaimResult::Claimed { .. } | ClaimResult::Partial { .. }) => unreachable!("handled above"),
            Ok(ClaimResult::LimitExceeded { held }) => Ok(Claimed::OverLimit { remaining: limit.saturating_sub(held) }),
            Ok(ClaimResult::KeyConflict) => Err(AgentError::AlreadyExists(format!(
                "idempotency_key {key:?} was already used for another quantity of item {id}"
            ))),
            Err(e) => {
                self.metrics.buyer_registry_errors.inc();
                tracing::warn!(item = %id, error = %e, "buyer registry unreachable");
                match item.limit.fallback {
                    RegistryFallback::Channel => Ok(Claimed::NoClaim),
                    RegistryFallback::Refuse => Err(AgentError::Unavailable(format!(
                        "the buyer registry that keeps item {id}'s global per-user limit is unreachable ({e}); \
                         retry with the same idempotency_key"
                    ))),
                }
            }
        }
    }

    /// Notes the item in the channel's set (first claim of this process) and the buyer
    /// in the item's index, both before the claim.
    async fn note(
        &self,
        registry: &BuyerRegistry,
        item: &str,
        channel: &str,
        user: &str,
        at: i64,
    ) -> Result<(), super::RegistryError> {
        let known = self.noted_items.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(item);
        if !known {
            registry.note_item(channel, item).await?;
            self.noted_items.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(item.to_owned());
        }
        registry.note(item, channel, user, at).await
    }

    /// After the pool call: a reservation binds the claim; no reservation releases it.
    ///
    /// A reservation is answered only while its claim stands. The sweeper releases a claim
    /// pending past the bound whose key the pool does not know, and a pool call still on
    /// its way (a starved process, a slow store) looks just like that. So a bind that
    /// finds its claim gone claims again before the reservation is answered: over the
    /// limit then, the caller cancels the reservation nobody has seen and answers
    /// LIMIT_EXCEEDED. A bind the registry did not answer is left to the sweeper while the
    /// claim cannot have lapsed yet (the call took less than the pending bound); after
    /// that nothing tells whether it did, so the answer is UNAVAILABLE (a retry with the
    /// key claims first, then finds the same reservation in the pool).
    pub async fn after_acquire(
        &self,
        item: &Item,
        acquire: ClaimedAcquire<'_>,
        result: &AcquireResult,
    ) -> Result<AfterAcquire, AgentError> {
        let Some(registry) = self.registry_for(item)? else { return Ok(AfterAcquire::Kept) };
        let ClaimedAcquire { user, key, limit, claimed_at } = acquire;
        let id = item.item_id.as_str();
        let outcome = match result {
            AcquireResult::Reserved { reservation_id, quantity: got, expires_at_ms, .. } => {
                match registry.bind(id, user, key, reservation_id, *got, *expires_at_ms).await {
                    Ok(true) => return Ok(AfterAcquire::Kept),
                    Ok(false) => {
                        self.metrics.buyer_lapsed_claims.inc();
                        tracing::warn!(item = %id, key, "buyer registry: the claim lapsed during the pool call; claiming again");
                        return match self.claim(item, user, key, *got, limit, false).await? {
                            Claimed::OverLimit { remaining } => Ok(AfterAcquire::OverLimit { remaining }),
                            Claimed::NoClaim => Ok(AfterAcquire::Kept),
                            Claimed::Held { .. } => {
                                // Bound now, or bound by a replay of the key meanwhile.
                                let bound = registry.bind(id, user, key, reservation_id, *got, *expires_at_ms).await;
                                if let Err(e) = bound {
                                    self.metrics.buyer_registry_errors.inc();
                                    tracing::warn!(item = %id, error = %e, "buyer registry: claim left for the sweeper");
                                }
                                Ok(AfterAcquire::Kept)
                            }
                        };
                    }
                    Err(e) => {
                        let pending = Duration::from_millis(self.pending_ms);
                        if claimed_at.elapsed() >= pending && item.limit.fallback == RegistryFallback::Refuse {
                            self.metrics.buyer_registry_errors.inc();
                            return Err(AgentError::Unavailable(format!(
                                "the buyer registry that keeps item {id}'s global per-user limit did not confirm the claim ({e}); \
                                 retry with the same idempotency_key"
                            )));
                        }
                        Err(e)
                    }
                }
            }
            // The pool holds a reservation under this key (another quantity): the claim
            // may be that reservation's; the sweeper settles it from the pool.
            AcquireResult::KeyConflict => Ok(()),
            AcquireResult::SoldOut { .. } | AcquireResult::LimitExceeded { .. } => {
                registry.release(id, user, key).await.map(|n| {
                    if n > 0 {
                        self.metrics.buyer_releases.inc();
                    }
                })
            }
        };
        if let Err(e) = outcome {
            self.metrics.buyer_registry_errors.inc();
            tracing::warn!(item = %id, error = %e, "buyer registry: claim left for the sweeper");
        }
        Ok(AfterAcquire::Kept)
    }

    /// The reservation was cancelled or refunded (the pool's change is done): its
    /// allowance is free again. Best-effort: the sweeper frees it otherwise.
    pub async fn released(&self, item: &Item, r: &Reservation) {
        let Ok(Some(registry)) = self.registry_for(item) else { return };
        match registry.release(item.item_id.as_str(), &r.user_id, &r.idempotency_key).await {
            Ok(n) => {
                if n > 0 {
                    self.metrics.buyer_releases.inc();
                }
            }
            Err(e) => {
                self.metrics.buyer_registry_errors.inc();
                tracing::warn!(item = %item.item_id, error = %e, "buyer registry: release left for the sweeper");
            }
        }
    }

    /// The reservation was paid: the claim stays for good (until a refund).
    pub async fn confirmed(&self, item: &Item, reservation_id: &str, r: &Reservation) {
        let Ok(Some(registry)) = self.registry_for(item) else { return };
        let id = item.item_id.as_str();
        if let Err(e) = registry.confirm(id, &r.user_id, &r.idempotency_key, reservation_id).await {
            self.metrics.buyer_registry_errors.inc();
            tracing::warn!(item = %id, error = %e, "buyer registry: confirm left for the sweeper");
        }
    }
}
