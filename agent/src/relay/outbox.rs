//! The pool store's outbox as the relay reads it, each event as its wire message.

use std::sync::Arc;

use async_trait::async_trait;
use inventory_proto::v1 as pb;

use super::{Outbox, OutboxPage};
use crate::selling::reservation_state_pb;
use crate::store::{PoolEvent, PoolKey, PoolStore, StoreError};

/// The one pool segment while items have one pool per channel.
const SEGMENT: u32 = 0;

/// `ReservationEvent` of a pool's event: its id is unique over the pool's re-creations
/// (`<channel>:<item>:<segment>:<generation>:<sequence>`), the broker's dedup id.
pub fn reservation_event(pool: &PoolKey, generation: u64, e: &PoolEvent) -> pb::ReservationEvent {
    pb::ReservationEvent {
        event_id: format!("{}:{}:{SEGMENT}:{generation}:{}", pool.channel, pool.item_id, e.sequence),
        channel: pool.channel.clone(),
        item_id: pool.item_id.clone(),
        segment: SEGMENT,
        sequence: e.sequence,
        reservation_id: e.reservation_id.clone(),
        idempotency_key: e.idempotency_key.clone(),
        user_id: e.user_id.clone(),
        quantity: e.quantity,
        state: reservation_state_pb(e.state),
        previous_state: e.previous.map_or(pb::ReservationState::Unspecified as i32, reservation_state_pb),
        at_unix_ms: e.at_ms,
        pool_generation: generation,
    }
}

pub struct StoreOutbox(pub Arc<dyn PoolStore>);

#[async_trait]
impl Outbox for StoreOutbox {
    async fn read(&self, pool: &PoolKey, from_sequence: u64, max: u64) -> Result<OutboxPage, StoreError> {
        let page = self.0.events(pool, from_sequence, max).await?;
        Ok(OutboxPage {
            generation: page.generation,
            events: page.events.iter().map(|e| reservation_event(pool, page.generation, e)).collect(),
            last_sequence: page.last_sequence,
            first_kept: page.first_kept,
        })
    }

    async fn trim(&self, pool: &PoolKey, through_sequence: u64) -> Result<u64, StoreError> {
        self.0.trim_events(pool, through_sequence).await
    }
}
