//! Segmented pools: one channel's pool of an item kept as N pools under their own hash
//! tags (`inventory_core::segments`). The rules (`core::channel`) still see one pool per
//! item: this module is how the driver turns their pool effects into calls on every
//! segment, and how it moves units between segments.
//!
//! - A read sums the segments; its generation is a digest of theirs, so any segment's loss
//!   (a new generation, or a segment vanished) reads as the item's pool lost.
//! - A refill of `units` (a grant, an alignment) spreads them evenly over the segments,
//!   each keyed by the same grant id: a replay adds each share once.
//! - A take removes from the segments in order, each keyed by the same take id: a replay
//!   answers each segment's first amount, so the sum is the first sum.
//! - A move takes from a sibling and refills the empty segment under one move id, with an
//!   intent recorded before the take and cleared after the refill. Reads of the item's
//!   segments as one pool first finish every recorded move (replaying take and refill,
//!   each once per id), under the item's move lock: so no read, and no resync built on
//!   one, counts moved units as missing.

use inventory_core::pool::PoolSnapshot;
use inventory_core::segments::plan_move;

use crate::items::Item;
use crate::segment_health::digest;
use crate::store::{MoveIntent, PoolKey, PoolStore, StoreError};

/// The segments' counters summed; generation: [`digest`] of theirs.
pub fn sum(snaps: &[PoolSnapshot]) -> PoolSnapshot {
    let mut out = PoolSnapshot::default();
    for s in snaps {
        out.available = out.available.saturating_add(s.available);
        out.reserved = out.reserved.saturating_add(s.reserved);
        out.sold = out.sold.saturating_add(s.sold);
        out.now_ms = out.now_ms.max(s.now_ms);
    }
    out.generation = digest(snaps.iter().map(|s| s.generation));
    out
}

/// Segment `i`'s share of `units` spread over `n` segments.
pub fn share(units: u64, n: usize, i: usize) -> u64 {
    let n = n.max(1) as u64;
    units / n + u64::from((i as u64) < units % n)
}

/// Every segment's snapshot, after finishing the item's recorded moves (under its move
/// lock). An unsegmented item is one snapshot and no lock.
pub async fn snapshots(store: &dyn PoolStore, item: &Item, epoch: u64) -> Result<Vec<PoolSnapshot>, StoreError> {
    if !item.is_segmented() {
        return Ok(vec![store.snapshot(&item.pool).await?]);
    }
    let _moving = item.moves.lock().await;
    finish_moves(store, item, epoch).await?;
    let snaps = read_all(store, &item.pools).await?;
    item.set_segment_snapshots(&snaps);
    Ok(snaps)
}

/// The item's segments as one pool for the rules (see [`snapshots`]), read by the
/// leading replica. Lost segments (a part: [`SegmentHealth`]) are left out of the sums and
/// the rules are told ([`ItemCore::on_segments_lost`]); the generation stays the known
/// one, so the rules see the intact part of the same pool. All of them lost: the sums of
/// what is there now, under generation 0 or another one, which the rules see as the pool
/// lost.
///
/// [`ItemCore::on_segments_lost`]: inventory_core::channel::ItemCore::on_segments_lost
/// [`SegmentHealth`]: crate::segment_health::SegmentHealth
pub async fn snapshot(store: &dyn PoolStore, item: &Item, epoch: u64) -> Result<PoolSnapshot, StoreError> {
    let snaps = snapshots(store, item, epoch).await?;
    if !item.is_segmented() {
        return Ok(sum(&snaps));
    }
    let generations: Vec<u64> = snaps.iter().map(|s| s.generation).collect();
    let (part, intact) = item.with_segment_health(|h| {
        if !h.observe(&generations) || h.all_lost() {
            return (None, Vec::new());
        }
        let intact: Vec<PoolSnapshot> = (0u32..).zip(&snaps).filter(|(i, _)| !h.is_lost(*i)).map(|(_, s)| *s).collect();
        (Some(h.known_digest()), intact)
    });
    let Some(known) = part else { return Ok(sum(&snaps)) };
    let mut notes = Vec::new();
    let ctx = inventory_core::channel::Ctx { now_ms: crate::clock::now_ms(), epoch };
    if item.with(|c| c.on_segments_lost(ctx, &mut notes)) {
        tracing::error!(
            item = %item.item_id,
            segments = ?item.lost_segments(),
            "segments of the pool lost their data in the store; their buyers wait, their units in doubt until an operator resolves them"
        );
    }
    Ok(PoolSnapshot { generation: known, ..sum(&intact) })
}

async fn read_all(store: &dyn PoolStore, pools: &[PoolKey]) -> Result<Vec<PoolSnapshot>, StoreError> {
    futures::future::try_join_all(pools.iter().map(|p| store.snapshot(p))).await
}

/// Replays every recorded move of the item (take, then refill, each once per id) and
/// clears it. The caller holds the move lock.
async fn finish_moves(store: &dyn PoolStore, item: &Item, epoch: u64) -> Result<(), StoreError> {
    for m in store.pending_moves(&item.pool).await? {
        let (Some(from), Some(to)) = (item.pools.get(m.from as usize), item.pools.get(m.to as usize)) else {
            tracing::error!(item = %item.item_id, intent = ?m, "move names a segment the item does not have");
            continue;
        };
        let taken = store.take_for_return(from, &m.id, m.quantity, epoch).await?;
        if taken > 0 {
            store.refill(to, &m.id, taken, epoch).await?;
        }
        store.clear_move(&item.pool, &m.id).await?;
        tracing::warn!(item = %item.item_id, from = m.from, to = m.to, units = taken, "finished an interrupted move between segments");
    }
    Ok(())
}

/// Available units summed over the segments, read without the move lock or finishing
/// moves (a follower's look: it moves nothing).
pub async fn available(store: &dyn PoolStore, item: &Item) -> Result<u64, StoreError> {
    Ok(read_all(store, &item.pools).await?.iter().map(|s| s.available).sum())
}

/// What [`move_into`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// This many units came from a sibling.
    Units(u64),
    /// The segment had enough again (another caller's move or a refill came first).
    AlreadyStocked,
    /// No sibling had any (or the segment is missing: a move never creates it).
    Nothing,
}

/// A test-only fault point: abort the process between a move's take and its refill.
pub type AbortHook = Option<fn()>;

/// The hook `--test-abort-after-move-take` installs: no cleanup, as under kill -9.
pub fn abort_process() {
    std::process::abort()
}

/// Moves units into segment `to`, whose Acquire of `need` found it short, from the richest
/// sibling (`segments::plan_move`).
pub async fn move_into(
    store: &dyn PoolStore,
    item: &Item,
    to: u32,
    need: u64,
    epoch: u64,
    abort_after_take: AbortHook,
) -> Result<Moved, StoreError> {
    let _moving = item.moves.lock().await;
    finish_moves(store, item, epoch).await?;
    let snaps = read_all(store, &item.pools).await?;
    let Some(target) = snaps.get(to as usize) else { return Ok(Moved::Nothing) };
    if target.available >= need {
        return Ok(Moved::AlreadyStocked);
    }
    if target.generation == 0 {
        // Never created, or lost: a move must not create it (its loss must stay visible).
        return Ok(Moved::Nothing);
    }
    if item.segment_lost(to) {
        return Ok(Moved::Nothing);
    }
    // A lost segment gives nothing: its units are in doubt.
    let available: Vec<(u32, u64)> = snaps
        .iter()
        .enumerate()
        .map(|(s, snap)| {
            let s = u32::try_from(s).unwrap_or(0);
            (s, if item.segment_lost(s) { 0 } else { snap.available })
        })
        .collect();
    let Some(plan) = plan_move(to, need, &available) else { return Ok(Moved::Nothing) };
    let intent = MoveIntent {
        id: format!("move-{}", uuid::Uuid::new_v4().simple()),
        from: plan.from,
        to: plan.to,
        quantity: plan.quantity,
    };
    store.record_move(&item.pool, &intent).await?;
    let taken = store.take_for_return(&item.pools[plan.from as usize], &intent.id, plan.quantity, epoch).await?;
    if let Some(abort) = abort_after_take {
        abort();
    }
    if taken > 0 {
        store.refill_existing(&item.pools[plan.to as usize], &intent.id, taken, epoch).await?;
    }
    store.clear_move(&item.pool, &intent.id).await?;
    Ok(if taken > 0 { Moved::Units(taken) } else { Moved::Nothing })
}

/// A grant or alignment of `units`: each segment's share refilled under the same id.
pub async fn refill(
    store: &dyn PoolStore,
    pools: &[PoolKey],
    grant_id: &str,
    units: u64,
    epoch: u64,
    must_exist: bool,
) -> Result<(), StoreError> {
    for (i, pool) in pools.iter().enumerate() {
        let part = share(units, pools.len(), i);
        // Opening a pool (0 units) creates every segment.
        if part == 0 && (units > 0 || must_exist) {
            continue;
        }
        if must_exist {
            store.refill_existing(pool, grant_id, part, epoch).await?;
        } else {
            store.refill(pool, grant_id, part, epoch).await?;
        }
    }
    Ok(())
}

/// Takes up to `max` from the segments in order, each under `take_id`.
pub async fn take(
    store: &dyn PoolStore,
    pools: &[PoolKey],
    take_id: &str,
    max: u64,
    epoch: u64,
) -> Result<u64, StoreError> {
    let mut taken = 0u64;
    for pool in pools {
        if taken >= max {
            break;
        }
        taken += store.take_for_return(pool, take_id, max - taken, epoch).await?;
    }
    Ok(taken)
}

/// Puts back what a take under `take_id` removed, from every segment.
pub async fn untake(store: &dyn PoolStore, pools: &[PoolKey], take_id: &str, epoch: u64) -> Result<u64, StoreError> {
    let mut back = 0;
    for pool in pools {
        back += store.untake(pool, take_id, epoch).await?;
    }
    Ok(back)
}

/// Raises every segment's fence.
/// Raises every segment's fence; the highest fence found before.
pub async fn raise_fence(store: &dyn PoolStore, pools: &[PoolKey], epoch: u64) -> Result<u64, StoreError> {
    let mut found = 0;
    for pool in pools {
        found = found.max(store.raise_fence(pool, epoch).await?);
    }
    Ok(found)
}

/// Expires due reservations in every segment; the units put back.
pub async fn expire_due(store: &dyn PoolStore, pools: &[PoolKey], max: u64) -> Result<u64, StoreError> {
    let mut freed = 0;
    for pool in pools {
        freed += store.expire_due(pool, max).await?;
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        for units in [0, 1, 7, 8, 9, 500] {
            assert_eq!((0..8).map(|i| share(units, 8, i)).sum::<u64>(), units);
        }
        assert_eq!(share(5, 1, 0), 5);
    }
}
