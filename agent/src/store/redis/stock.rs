//! The scripts that move stock in and out of a pool: refill.lua (a grant applied, or the
//! pool created), take_for_return.lua and untake.lua (units taken out for a Return, and
//! put back when the Return did not land).

use redis::Value;

use super::RedisPoolStore;
use super::reply::{array, int, uint, unexpected};
use crate::store::{PoolKey, PoolSnapshot, StoreError};

impl RedisPoolStore {
    /// refill.lua: whether the grant was applied now (not a replay), and the pool as the
    /// call left it (checked whole before the write: it stands for a whole read).
    pub(super) async fn refill_script(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        must_exist: bool,
        epoch: u64,
    ) -> Result<(bool, PoolSnapshot), StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.refill.key(&k.pool);
        call.key(&k.grants).key(&k.gc).key(&k.fence).key(&k.outbox);
        k.structures(&mut call);
        call.arg(grant_id).arg(units).arg(self.retention_ms).arg(if must_exist { "1" } else { "0" }).arg(epoch);
        entry.floor_arg(&mut call);
        let (wseq, reply) = entry.acknowledged_seq(self.write(&k.pool, &call).await?)?;
        if let Value::Int(code) = reply {
            return match code {
                -1 => Err(StoreError::PoolMissing(pool.hash_tag())),
                -2 => Err(StoreError::Fenced(pool.hash_tag())),
                _ => Err(unexpected("refill", &reply)),
            };
        }
        let v = array("refill", reply)?;
        let [code, available, reserved, sold, generation, now_ms, found] = v.as_slice() else {
            return Err(StoreError::Protocol(format!("refill: expected 7 values, got {v:?}")));
        };
        let snapshot = PoolSnapshot {
            available: uint("refill", available)?,
            reserved: uint("refill", reserved)?,
            sold: uint("refill", sold)?,
            generation: uint("refill", generation)?,
            now_ms: int("refill", now_ms)?,
            // The sequence after this call's own change; a replay changed nothing.
            write_seq: if wseq != 0 { wseq } else { uint("refill", found)? },
        };
        Ok((int("refill", code)? == 1, snapshot))
    }

    pub(super) async fn take_script(
        &self,
        pool: &PoolKey,
        take_id: &str,
        max_units: u64,
        epoch: u64,
    ) -> Result<u64, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.take_for_return.key(&k.pool);
        call.key(&k.takes).key(&k.gc).key(&k.fence);
        k.structures(&mut call);
        call.arg(take_id).arg(max_units).arg(self.retention_ms).arg(epoch);
        entry.floor_arg(&mut call);
        let reply: Value = entry.acknowledged(self.write(&k.pool, &call).await?)?;
        match int("take_for_return", &reply)? {
            -1 => Err(StoreError::PoolMissing(pool.hash_tag())),
            -2 => Err(StoreError::Fenced(pool.hash_tag())),
            _ => uint("take_for_return", &reply),
        }
    }

    pub(super) async fn untake_script(&self, pool: &PoolKey, take_id: &str, epoch: u64) -> Result<u64, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.untake.key(&k.pool);
        call.key(&k.takes).key(&k.fence);
        k.structures(&mut call);
        call.arg(take_id).arg(epoch);
        entry.floor_arg(&mut call);
        let reply: Value = entry.acknowledged(self.write(&k.pool, &call).await?)?;
        match int("untake", &reply)? {
            -2 => Err(StoreError::Fenced(pool.hash_tag())),
            _ => uint("untake", &reply),
        }
    }
}
