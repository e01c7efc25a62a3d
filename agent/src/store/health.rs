//! Whether the agent's Redis servers can be trusted with sales right now: the one place
//! the store's write refusals and the policy checks ([`super::redis::nodes`]) meet, read
//! by the hot path, `/healthz` and the gRPC health service.
//!
//! Two conditions, each with the line that explains it:
//! - **evicting**: a pool store or buyer registry node runs a `maxmemory-policy` other
//!   than `noeviction` (and `--allow-evicting-redis` is not set). Redis may then drop any
//!   key of a pool and the loss would go unnoticed, so Acquire answers UNAVAILABLE until
//!   the policy is `noeviction` again;
//! - **refusing writes**: the store refused a write for its memory limit (or another
//!   refusal, [`super::StoreError::Refused`]), or a node reads above its `maxmemory`.
//!   Nothing is stopped by the agent (the store refuses by itself, and the first write it
//!   takes again sells again); the health says so, and it clears with the next write the
//!   store takes, or once every node reads below its limit.
//!
//! Either turns the agent NOT_SERVING (gRPC health, `/healthz` 503), so a load balancer
//! sends buyers to a replica that can serve them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    evicting: Option<String>,
    refusing_writes: Option<String>,
}

/// Shared by the store, the policy check and the agent's edges.
#[derive(Debug)]
pub struct StoreHealth {
    state: Mutex<State>,
    /// Whether `state.refusing_writes` is set: lets every write that succeeds check it
    /// without the lock.
    refusing: AtomicBool,
    /// Bumped on every change, so the gRPC health follows without polling.
    changes: watch::Sender<u64>,
}

impl Default for StoreHealth {
    fn default() -> Self {
        Self { state: Mutex::new(State::default()), refusing: AtomicBool::new(false), changes: watch::channel(0).0 }
    }
}

impl StoreHealth {
    /// Why sales are stopped, if they are: a node's eviction policy.
    pub fn sales_stopped(&self) -> Option<String> {
        self.read(|s| s.evicting.clone())
    }

    /// Why the store refuses writes, if it does (the last refusal, or a node over its limit).
    pub fn refusing_writes(&self) -> Option<String> {
        self.read(|s| s.refusing_writes.clone())
    }

    /// Why the agent is not serving, if it is not: the eviction policy first.
    pub fn not_serving(&self) -> Option<String> {
        self.read(|s| s.evicting.clone().or_else(|| s.refusing_writes.clone()))
    }

    /// A receiver that sees every change of [`StoreHealth::not_serving`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Sets (or clears, with None) why sales are stopped.
    pub fn set_evicting(&self, why: Option<String>) {
        self.update(|s| s.evicting = why);
    }

    /// A write was refused by the store (its memory limit, ...): `why` says how.
    pub fn write_refused(&self, why: &str) {
        // The check's reading, when it has one, names the node: it stays.
        self.update(|s| {
            if s.refusing_writes.is_none() {
                s.refusing_writes = Some(why.to_owned());
            }
        });
    }

    /// The store took a write: it refuses none now.
    pub fn write_taken(&self) {
        if self.refusing.load(Ordering::Acquire) {
            self.update(|s| s.refusing_writes = None);
        }
    }

    /// The policy check's reading of the nodes' memory: Some(why) while one is over its
    /// limit, None once all are below theirs (which also ends a refusal seen by a write).
    pub fn set_memory(&self, over_limit: Option<String>) {
        self.update(|s| s.refusing_writes = over_limit);
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let (before, after) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let before = state.clone();
            f(&mut state);
            self.refusing.store(state.refusing_writes.is_some(), Ordering::Release);
            (before, state.clone())
        };
        if before == after {
            return;
        }
        if after.refusing_writes != before.refusing_writes {
            match &after.refusing_writes {
                Some(why) => tracing::error!(problem = %why, "the pool store refuses writes: not serving"),
                None => tracing::warn!("the pool store takes writes again"),
            }
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_stops_sales_and_a_refusal_only_the_health() {
        let h = StoreHealth::default();
        let mut changes = h.subscribe();
        assert_eq!(h.not_serving(), None);
        h.write_refused("redis is at its memory limit");
        assert_eq!(h.sales_stopped(), None);
        assert_eq!(h.not_serving().as_deref(), Some("redis is at its memory limit"));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        h.write_refused("redis is at its memory limit");
        assert!(!changes.has_changed().unwrap(), "the same refusal again is no change");
        h.set_evicting(Some("node x has maxmemory-policy allkeys-lru".into()));
        assert_eq!(h.sales_stopped().as_deref(), Some("node x has maxmemory-policy allkeys-lru"));
        assert_eq!(h.not_serving().as_deref(), Some("node x has maxmemory-policy allkeys-lru"));
        h.write_taken();
        assert_eq!(h.refusing_writes(), None, "a write taken ends the refusal");
        h.set_evicting(None);
        assert_eq!(h.not_serving(), None);
        assert!(changes.has_changed().unwrap());
    }
}
