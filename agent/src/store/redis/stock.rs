//! The scripts that move stock in and out of a pool: refill.lua (a grant applied, or the
//! pool created), take_for_return.lua and untake.lua (units taken out for a Return, and
//! put back when the Return did not land).

use redis::Value;

use super::RedisPoolStore;
use super::reply::{int, uint};
use crate::store::{PoolKey, StoreError};

impl RedisPoolStore {
    pub(super) async fn refill_script(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        must_exist: bool,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.refill.key(&k.pool);
        call.key(&k.grants).key(&k.gc).key(&k.fence).key(&k.outbox);
        k.structures(&mut call);
        call.arg(grant_id).arg(units).arg(self.retention_ms).arg(if must_exist { "1" } else { "0" }).arg(epoch);
        entry.floor_arg(&mut call);
        let reply: Value = entry.acknowledged(self.write(&k.pool, &call).await?)?;
        match int("refill", &reply)? {
            -1 => Err(StoreError::PoolMissing(pool.hash_tag())),
            -2 => Err(StoreError::Fenced(pool.hash_tag())),
            n => Ok(n == 1),
        }
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
