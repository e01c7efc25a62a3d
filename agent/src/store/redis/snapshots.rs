//! Pool snapshots (`lua/snapshot.lua`): one pool, or many in a few calls for a full
//! report. On one Redis server a call reads up to [`POOLS_PER_CALL`] pools; on a Redis
//! Cluster a script may touch one slot only, so each call reads one pool (the calls still
//! go concurrently over the cluster's connections).

use super::batch::unwrap_seq;
use super::reply::{array, int, uint};
use super::{Conn, RedisPoolStore};
use crate::store::{PoolKey, PoolSnapshot, StoreError};

/// Pools one call reads at most: a call of a hundred pools holds the server for well under
/// a millisecond, so sales on other pools wait no longer than behind a few Acquires.
pub(super) const POOLS_PER_CALL: usize = 100;

const WHAT: &str = "snapshot";

impl RedisPoolStore {
    /// The snapshots of `pools`, in their order; a failed call fails each of its pools.
    pub(super) async fn snapshot_pools(&self, pools: &[PoolKey]) -> Vec<Result<PoolSnapshot, StoreError>> {
        let per_call = match self.shared.conn() {
            Conn::Single(_) => POOLS_PER_CALL,
            Conn::Cluster(_) => 1,
        };
        let calls = futures::future::join_all(pools.chunks(per_call).map(|chunk| self.snapshot_call(chunk))).await;
        let mut out = Vec::with_capacity(pools.len());
        for (chunk, result) in pools.chunks(per_call).zip(calls) {
            match result {
                Ok(snaps) => out.extend(snaps.into_iter().map(Ok)),
                Err(e) => out.extend(chunk.iter().map(|_| Err(e.clone()))),
            }
        }
        out
    }

    /// One script call reading `pools` (all on one server).
    pub(super) async fn snapshot_call(&self, pools: &[PoolKey]) -> Result<Vec<PoolSnapshot>, StoreError> {
        let entries: Vec<_> = pools.iter().map(|p| self.entry(p)).collect();
        let mut call = self.shared.scripts.snapshot.prepare_invoke();
        for e in &entries {
            call.key(&e.keys.pool);
            e.keys.structures(&mut call);
        }
        for e in &entries {
            e.floor_arg(&mut call);
        }
        // The floor every script's ARGV ends with; each pool's own came first.
        call.arg(0u64);
        let (_, reply) = unwrap_seq(self.read(&call).await?)?;
        let rows = array(WHAT, reply)?;
        if rows.len() != pools.len() {
            return Err(StoreError::Protocol(format!("snapshot: {} pools read, {} answered", pools.len(), rows.len())));
        }
        rows.into_iter().map(parse).collect()
    }
}

fn parse(row: redis::Value) -> Result<PoolSnapshot, StoreError> {
    let items = array(WHAT, row)?;
    let [available, reserved, sold, generation, now_ms, write_seq] = items.as_slice() else {
        return Err(StoreError::Protocol(format!("snapshot: unexpected reply {items:?}")));
    };
    Ok(PoolSnapshot {
        available: uint(WHAT, available)?,
        reserved: uint(WHAT, reserved)?,
        sold: uint(WHAT, sold)?,
        generation: uint(WHAT, generation)?,
        now_ms: int(WHAT, now_ms)?,
        write_seq: uint(WHAT, write_seq)?,
    })
}
