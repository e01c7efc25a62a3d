//! The pool store's outbox as the relay reads it, each event as its wire message
//! ([`crate::outbox::event_pb`], the same message `StreamEvents` sends).

use std::sync::Arc;

use async_trait::async_trait;

use super::{Outbox, OutboxPage};
use crate::outbox::event_pb;
use crate::store::{PoolKey, PoolStore, StoreError};

pub struct StoreOutbox(pub Arc<dyn PoolStore>);

#[async_trait]
impl Outbox for StoreOutbox {
    async fn read(&self, pool: &PoolKey, from_sequence: u64, max: u64) -> Result<OutboxPage, StoreError> {
        let page = self.0.events(pool, from_sequence, max).await?;
        Ok(OutboxPage {
            generation: page.generation,
            events: page.events.iter().map(|e| event_pb(pool, page.generation, e)).collect(),
            last_sequence: page.last_sequence,
            first_kept: page.first_kept,
        })
    }

    async fn trim(&self, pool: &PoolKey, generation: u64, through_sequence: u64) -> Result<u64, StoreError> {
        self.0.trim_events(pool, generation, through_sequence).await
    }
}
