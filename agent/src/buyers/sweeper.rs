//! The buyer registry's sweeper for one channel's pool of a global item: settles the
//! claims this channel's Acquires left pending (the agent died between the claim and the
//! pool call, or before binding) or held past their reservation's expiry, from what the
//! pool says of the reservation made with each claim's key.

use inventory_core::buyers::{Found, Settled};

use super::{BuyerRegistry, RegistryError, err};
use crate::store::{PoolKey, PoolStore, ReservationRef};

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Buyers looked at.
    pub buyers: u64,
    /// Claims released (their units free again), held, confirmed, still waiting.
    pub released: u64,
    pub held: u64,
    pub confirmed: u64,
    pub waiting: u64,
}

/// Looks at up to `max` buyers of the channel's index due at `now_ms` (the agent's clock);
/// a buyer with claims left to settle in the channel is looked at again `recheck_ms`
/// later; one with none, or only confirmed ones (a refund releases those itself), leaves
/// the index, so a sale's paid buyers are not looked at again and again.
pub async fn sweep(
    registry: &BuyerRegistry,
    store: &dyn PoolStore,
    pools: &[PoolKey],
    now_ms: i64,
    recheck_ms: i64,
    max: usize,
) -> Result<SweepStats, RegistryError> {
    let Some(first) = pools.first() else { return Ok(SweepStats::default()) };
    let (item, channel) = (first.item_id.as_str(), first.channel.as_str());
    let mut stats = SweepStats::default();
    for user in registry.noted(item, channel, now_ms, max).await? {
        stats.buyers += 1;
        // The user's segment holds their reservations (one pool unless segmented).
        let segments = u32::try_from(pools.len()).unwrap_or(1);
        let pool = &pools[inventory_core::segments::route(&user, segments) as usize];
        for key in registry.due(item, &user, channel).await? {
            let found = store.reservation(pool, &ReservationRef::IdempotencyKey(key.clone())).await.map_err(err)?;
            let found = found.map(|(reservation_id, r)| Found {
                reservation_id,
                state: r.state,
                quantity: r.quantity,
                expires_at_ms: r.expires_at_ms,
            });
            match registry.settle(item, &user, &key, found.as_ref()).await? {
                Settled::Released { .. } => stats.released += 1,
                Settled::Held => stats.held += 1,
                Settled::Confirmed => stats.confirmed += 1,
                Settled::Waiting => stats.waiting += 1,
                Settled::Untouched => {}
            }
        }
        if registry.open(item, &user, channel).await? == 0 {
            registry.forget(item, channel, &user).await?;
        } else {
            registry.recheck(item, channel, &user, now_ms.saturating_add(recheck_ms)).await?;
        }
    }
    Ok(stats)
}
