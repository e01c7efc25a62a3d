//! The calls on a reservation once it exists: confirm, cancel, refund, extend, lookup, and
//! the item's stock as GetStock shows it.

use inventory_core::ItemId;
use inventory_core::schedule::Phase;
use inventory_proto::v1 as pb;

use super::Selling;
use crate::error::AgentError;
use crate::items::Item;
use crate::segmented;
use crate::store::{ExtendResult, PoolKey, Reservation, ReservationRef, ReservationState, StoreError, Transition};
use crate::wire::reservation_pb;

impl Selling {
    /// The pool holding a reservation by id: its segment's (by the id's prefix).
    fn reservation_pool<'a>(it: &'a Item, reservation_id: &str) -> Result<&'a PoolKey, AgentError> {
        it.pool_for_reservation(reservation_id)
            .ok_or_else(|| AgentError::NotFound(format!("reservation {reservation_id:?} not found")))
    }

    pub async fn confirm(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let it = self.item(item).await?;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        let t = self.store.confirm(pool, reservation_id).await?;
        self.events.written(pool);
        if t == Transition::Done(ReservationState::Confirmed)
            && let Some(r) = self.global_reservation(&it, reservation_id).await
        {
            self.global.confirmed(&it, reservation_id, &r).await;
        }
        it.with(|c| {
            if let Transition::Refused(ReservationState::Expired) = t {
                // The expiry just put units back.
                c.stock_returned();
            } else {
                c.touch();
            }
        });
        transition_result(t, reservation_id, "confirm")
    }

    pub async fn cancel(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let it = self.item(item).await?;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        let t = self.cancel_in(&it, pool, reservation_id).await?;
        if matches!(t, Transition::Done(_))
            && let Some(r) = self.global_reservation(&it, reservation_id).await
        {
            self.global.released(&it, &r).await;
        }
        transition_result(t, reservation_id, "cancel")
    }

    /// The pool's part of a cancel: the store call, the event feed, the rules told.
    pub(super) async fn cancel_in(
        &self,
        item: &Item,
        pool: &PoolKey,
        reservation_id: &str,
    ) -> Result<Transition, StoreError> {
        let t = self.store.cancel(pool, reservation_id).await?;
        self.events.written(pool);
        item.with(|c| if matches!(t, Transition::Done(_)) { c.stock_returned() } else { c.touch() });
        Ok(t)
    }

    /// CONFIRMED -> REFUNDED: the units are on sale again in the pool. After the item's
    /// sale ended they go back to the center with the pool's other unsold units.
    pub async fn refund(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let it = self.item(item).await?;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        let t = self.store.refund(pool, reservation_id).await?;
        self.events.written(pool);
        if t == Transition::Done(ReservationState::Refunded)
            && let Some(r) = self.global_reservation(&it, reservation_id).await
        {
            self.global.released(&it, &r).await;
        }
        it.with(|c| if t == Transition::Done(ReservationState::Refunded) { c.stock_returned() } else { c.touch() });
        transition_result(t, reservation_id, "refund")
    }

    /// The reservation's user and key, for the registry, when the item's limit is global.
    /// A failed read leaves the claim to the sweeper.
    async fn global_reservation(&self, it: &Item, reservation_id: &str) -> Option<Reservation> {
        if it.limit.scope != inventory_core::buyers::LimitScope::Global {
            return None;
        }
        let pool = it.pool_for_reservation(reservation_id)?;
        match self.store.reservation(pool, &ReservationRef::Id(reservation_id.to_owned())).await {
            Ok(found) => found.map(|(_, r)| r),
            Err(e) => {
                tracing::warn!(item = %it.item_id, error = %e, "reservation unread: its claim is left for the sweeper");
                None
            }
        }
    }

    /// Pushes a RESERVED reservation's expiry out by up to `extend_ms`, bounded by the
    /// item's reservation TTL from now.
    pub async fn extend(
        &self,
        item: &ItemId,
        reservation_id: &str,
        extend_ms: u64,
    ) -> Result<pb::ExtendResponse, AgentError> {
        let it = self.item(item).await?;
        let ttl_ms = it.policy().reservation_ttl_ms;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        match self.store.extend(pool, reservation_id, extend_ms, ttl_ms).await? {
            ExtendResult::Extended { expires_at_ms } => Ok(pb::ExtendResponse {
                state: pb::ReservationState::Reserved as i32,
                expires_at_unix_ms: expires_at_ms,
            }),
            ExtendResult::Refused(s) => {
                if s == ReservationState::Expired {
                    // It may have expired just now, putting units back.
                    self.events.written(pool);
                    it.with(|c| c.stock_returned());
                }
                Err(AgentError::Precondition(format!(
                    "cannot extend reservation {reservation_id:?}: it is {}",
                    s.as_str()
                )))
            }
            ExtendResult::NotFound => Err(AgentError::NotFound(format!("reservation {reservation_id:?} not found"))),
        }
    }

    /// One reservation by id or idempotency key, with the pool's generation. By key on a
    /// segmented item: each segment is asked in turn (the key's user is not known here).
    pub async fn reservation(&self, item: &ItemId, by: &ReservationRef) -> Result<pb::Reservation, AgentError> {
        let it = self.item(item).await?;
        let pools: Vec<&PoolKey> = match by {
            ReservationRef::Id(id) => it.pool_for_reservation(id).into_iter().collect(),
            ReservationRef::IdempotencyKey(_) => it.pools.iter().collect(),
        };
        for pool in pools {
            if let Some((id, r)) = self.store.reservation(pool, by).await? {
                let generation = self.store.snapshot(pool).await?.generation;
                return Ok(reservation_pb(id, r, generation));
            }
        }
        let what = match by {
            ReservationRef::Id(id) => format!("reservation {id:?}"),
            ReservationRef::IdempotencyKey(key) => format!("reservation with idempotency_key {key:?}"),
        };
        Err(AgentError::NotFound(format!("{what} not found in the pool of item {}", it.item_id)))
    }

    pub async fn get_stock(&self, item: &ItemId) -> Result<pb::GetStockResponse, AgentError> {
        let it = self.item(item).await?;
        let center_now = self.link.center_now();
        let not_started = matches!(it.with(|c| c.phase(center_now)), Phase::NotStarted { .. });
        let snaps = segmented::snapshots(self.store.as_ref(), &it, self.link.epoch()).await?;
        let s = segmented::sum(&snaps);
        let mut outboxes = Vec::with_capacity(snaps.len());
        for pool in &it.pools {
            outboxes.push(self.store.outbox_stats(pool).await?);
        }
        it.set_outbox_stats(inventory_core::pool::OutboxStats::fullest(&outboxes));
        it.set_segment_snapshots(&snaps);
        let segments = if it.is_segmented() {
            snaps
                .iter()
                .zip(&outboxes)
                .enumerate()
                .map(|(i, (s, o))| pb::SegmentStock {
                    segment: u32::try_from(i).unwrap_or(0),
                    available: s.available,
                    reserved: s.reserved,
                    sold: s.sold,
                    pool_generation: s.generation,
                    last_event_sequence: o.last_sequence,
                    // The broker relay fills it.
                    published_event_sequence: 0,
                    lost: it.segment_lost(u32::try_from(i).unwrap_or(0)),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(pb::GetStockResponse {
            available: s.available,
            reserved: s.reserved,
            sold: s.sold,
            sold_out: s.available == 0 && it.with(|c| c.supply().center_dry),
            // Segment 0's generation and events (the segments list has each one's).
            pool_generation: snaps[0].generation,
            last_event_sequence: outboxes[0].last_sequence,
            // The broker relay fills it.
            published_event_sequence: 0,
            segments,
            not_started,
            opens_at_unix_ms: it.with(|c| c.schedule().opens_at_ms),
        })
    }
}

fn transition_result(t: Transition, id: &str, verb: &str) -> Result<ReservationState, AgentError> {
    match t {
        Transition::Done(s) => Ok(s),
        Transition::Refused(s) => {
            Err(AgentError::Precondition(format!("cannot {verb} reservation {id:?}: it is {}", s.as_str())))
        }
        Transition::NotFound => Err(AgentError::NotFound(format!("reservation {id:?} not found"))),
    }
}
