//! Pool snapshots (`lua/snapshot.lua`) and stamps (`lua/stamps.lua`): one pool, or many
//! in a few calls for a report. On one Redis server a call reads up to [`POOLS_PER_CALL`]
//! pools; on a Redis Cluster a script may touch one slot only, so each call reads one pool
//! (the calls still go concurrently over the cluster's connections). And the
//! rebalancer's look (`lua/look.lua`): a pool's sweep and its snapshot in one call.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::batch::{PoolEntry, unwrap_seq};
use super::reply::{array, int, uint};
use super::{Conn, RedisPoolStore};
use crate::store::{Looked, OutboxStats, PoolKey, PoolSnapshot, PoolStamp, StoreError};

/// Pools one call reads at most: a call of a hundred pools holds the server for well under
/// a millisecond, so sales on other pools wait no longer than behind a few Acquires.
pub(super) const POOLS_PER_CALL: usize = 100;

const WHAT: &str = "snapshot";

impl RedisPoolStore {
    /// Pools one script call may read.
    fn pools_per_call(&self) -> usize {
        match self.shared.conn() {
            Conn::Single(_) => POOLS_PER_CALL,
            Conn::Cluster(_) => 1,
        }
    }

    /// The snapshots of `pools`, in their order; a failed call fails each of its pools.
    pub(super) async fn snapshot_pools(&self, pools: &[PoolKey]) -> Vec<Result<PoolSnapshot, StoreError>> {
        let per_call = self.pools_per_call();
        let calls = futures::future::join_all(pools.chunks(per_call).map(|chunk| self.snapshot_call(chunk))).await;
        spread(pools.chunks(per_call).zip(calls))
    }

    /// The stamps of `pools`, in their order; a failed call fails each of its pools.
    pub(super) async fn stamp_pools(&self, pools: &[PoolKey]) -> Vec<Result<PoolStamp, StoreError>> {
        let per_call = self.pools_per_call();
        let calls = futures::future::join_all(pools.chunks(per_call).map(|chunk| self.stamp_call(chunk))).await;
        spread(pools.chunks(per_call).zip(calls))
    }

    /// One script call reading the stamps of `pools` (all on one server). A pool marked
    /// behind, or whose sequence is below this store layer's floor, has gone back in time:
    /// its stamp says generation 0, so its report reads it whole (which finds it lost).
    async fn stamp_call(&self, pools: &[PoolKey]) -> Result<Vec<PoolStamp>, StoreError> {
        const WHAT: &str = "stamps";
        let entries: Vec<_> = pools.iter().map(|p| self.entry(p)).collect();
        let mut call = self.shared.scripts.stamps.prepare_invoke();
        for e in &entries {
            call.key(&e.keys.pool);
        }
        let rows = array(WHAT, self.read(&call).await?)?;
        if rows.len() != pools.len() {
            return Err(StoreError::Protocol(format!("stamps: {} pools read, {} answered", pools.len(), rows.len())));
        }
        let stamp = |(entry, row): (&Arc<PoolEntry>, redis::Value)| {
            let items = array(WHAT, row)?;
            let [generation, write_seq, behind] = items.as_slice() else {
                return Err(StoreError::Protocol(format!("stamps: unexpected reply {items:?}")));
            };
            let write_seq = uint(WHAT, write_seq)?;
            let lost = uint(WHAT, behind)? != 0 || write_seq < entry.floor.load(Ordering::Acquire);
            Ok(PoolStamp { generation: if lost { 0 } else { uint(WHAT, generation)? }, write_seq })
        };
        entries.iter().zip(rows).map(stamp).collect()
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

impl RedisPoolStore {
    /// `PoolStore::look`: expire.lua's sweep and the pool's snapshot, one script call.
    pub(super) async fn look_call(&self, pool: &PoolKey, max: u64) -> Result<Looked, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.look.key(&k.pool);
        k.structures(&mut call);
        call.arg(max).arg(self.retention_ms).arg(super::GC_BATCH).arg(self.outbox_max);
        entry.floor_arg(&mut call);
        // Not waited for, as expire_due's sweep is not (an expiry lost in a failover is
        // found due again), so it does not raise the floor either.
        let (_, reply) = unwrap_seq(self.read(&call).await?)?;
        let parts = array("look", reply)?;
        let [freed, row, outbox] = <[redis::Value; 3]>::try_from(parts)
            .map_err(|p| StoreError::Protocol(format!("look: unexpected reply {p:?}")))?;
        let outbox = match array("look", outbox)?.as_slice() {
            [] => None,
            [kept, dropped, last] => Some(OutboxStats {
                kept: uint("look", kept)?,
                dropped: uint("look", dropped)?,
                last_sequence: uint("look", last)?,
            }),
            other => return Err(StoreError::Protocol(format!("look: unexpected outbox {other:?}"))),
        };
        Ok(Looked { freed: uint("look", &freed)?, snapshot: parse(row)?, outbox })
    }
}

/// Each chunk's answers, or its error for each of its pools.
fn spread<'a, T>(
    calls: impl Iterator<Item = (&'a [PoolKey], Result<Vec<T>, StoreError>)>,
) -> Vec<Result<T, StoreError>> {
    let mut out = Vec::new();
    for (chunk, result) in calls {
        match result {
            Ok(answers) => out.extend(answers.into_iter().map(Ok)),
            Err(e) => out.extend(chunk.iter().map(|_| Err(e.clone()))),
        }
    }
    out
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
