//! Where the backend keeps each order's pool generation, so a replay carries it.

use std::collections::HashMap;
use std::sync::Mutex;

/// A failure of the backend's own order storage.
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// The generation rule's memory: for each (item, idempotency key) that reserved, the
/// `pool_generation` of the answer. [`AgentClient::acquire`](crate::AgentClient::acquire)
/// reads it before the first attempt and sends it as `expect_pool_generation`, and
/// records it when the agent reserves. Implement it over the backend's order table so the
/// rule survives the backend's restarts; [`MemoryOrderStore`] is the default.
#[async_trait::async_trait]
pub trait OrderStore: Send + Sync {
    /// The generation the first reserved answer for `key` gave, if any.
    async fn generation(&self, item: &str, key: &str) -> Result<Option<u64>, StoreError>;
    /// Records the generation of a reserved answer for `key` (called on every reserved
    /// answer; the value never changes for a key while its pool lives).
    async fn remember(&self, item: &str, key: &str, generation: u64) -> Result<(), StoreError>;
}

/// An [`OrderStore`] in the process's memory: the rule holds while the process lives.
/// It grows by one entry per reserved key.
#[derive(Debug, Default)]
pub struct MemoryOrderStore {
    generations: Mutex<HashMap<(String, String), u64>>,
}

impl MemoryOrderStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), u64>> {
        // A panic while holding the lock cannot leave the map half-written.
        self.generations.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait::async_trait]
impl OrderStore for MemoryOrderStore {
    async fn generation(&self, item: &str, key: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.lock().get(&(item.to_owned(), key.to_owned())).copied())
    }

    async fn remember(&self, item: &str, key: &str, generation: u64) -> Result<(), StoreError> {
        self.lock().insert((item.to_owned(), key.to_owned()), generation);
        Ok(())
    }
}
