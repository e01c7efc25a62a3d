//! Row mapping (columns to ledger structs and back) and single-row reads and writes
//! shared by the transactions.

use inventory_core::ledger::{Allocation, ChannelSession, ChannelShares, ItemState, PoolCounts};
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_core::{Channel, ItemId, ValidationError};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::{SqlLedger, Tx};
use crate::error::CenterError;
pub(super) use crate::store::batch::stale_or_unknown;
use crate::store::{ItemRecord, LimitSettings, Result, SalePlan};
use inventory_core::buyers::{LimitScope, RegistryFallback};

pub(super) const ITEM_SELECT: &str = "SELECT item_id, total, available, per_user_limit, reservation_ttl_ms, closed, \
     wm_low, wm_high, wm_batch, written_off, rate_batching, rate_min_batch, rate_max_batch, rate_target_ms, segments, \
     limit_scope, registry_fallback, opens_at_ms, closes_at_ms, prestock_lead_ms, center_reserve, channel_shares FROM items";
pub(super) const SESSION_SELECT: &str =
    "SELECT channel, epoch, agent_id, lease_expires_at_ms, last_heartbeat_ms FROM channels";
pub(super) const ALLOC_SELECT: &str = "SELECT item_id, channel, granted, returned, reclaimed, reported_available, \
     reported_reserved, reported_sold, reported_at_ms, pool_generation, in_doubt, sell_rate_milli FROM allocations";

/// A number read back from a BIGINT column. Columns hold what [`to_db`] let through, so a
/// negative value is corruption: refused, never shown as another number.
pub(super) fn col(row: &AnyRow, column: &str) -> Result<u64> {
    let v: i64 = row.try_get(column)?;
    u64::try_from(v).map_err(|_| CenterError::Internal(format!("column {column} holds {v}")))
}

/// Pool reports per transaction of a heartbeat (each read and written set-based, one
/// statement each): the chunk's row locks stay few and short.
pub(super) const REPORT_ROWS_PER_STATEMENT: usize = 500;

/// `$first, $first+1, ...`: `count` bind placeholders for an `IN (...)` list.
pub(super) fn placeholders(first: usize, count: usize) -> String {
    (first..first + count).map(|n| format!("${n}")).collect::<Vec<_>>().join(", ")
}

/// A number as the database stores it (BIGINT): one that does not fit is refused, naming
/// the field, never wrapped to a negative value.
pub(super) fn to_db(field: &str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| ValidationError::new(field, v, format!("must be at most {}", i64::MAX)).into())
}

/// An item row: its id, state, fixed watermarks, rate-following batches, segments and limit settings.
pub(super) type ItemRow = (String, ItemState, Watermarks, Option<RateBatching>, u32, LimitSettings);

pub(super) fn item_from_row(row: &AnyRow) -> Result<ItemRow> {
    Ok((
        row.try_get("item_id")?,
        ItemState {
            total: col(row, "total")?,
            available: col(row, "available")?,
            per_user_limit: col(row, "per_user_limit")?,
            reservation_ttl_ms: col(row, "reservation_ttl_ms")?,
            closed: row.try_get::<i64, _>("closed")? != 0,
            written_off: col(row, "written_off")?,
        },
        Watermarks { low: col(row, "wm_low")?, high: col(row, "wm_high")?, batch: col(row, "wm_batch")? },
        (row.try_get::<i64, _>("rate_batching")? != 0)
            .then(|| -> Result<RateBatching> {
                Ok(RateBatching {
                    min_batch: col(row, "rate_min_batch")?,
                    max_batch: col(row, "rate_max_batch")?,
                    target_ms: col(row, "rate_target_ms")?,
                })
            })
            .transpose()?,
        {
            let n = col(row, "segments")?;
            u32::try_from(n).map_err(|_| CenterError::Internal(format!("column segments holds {n}")))?
        },
        limit_from_row(row)?,
    ))
}

/// The sale's plan of an item row (columns of migration 0010).
pub(super) fn plan_from_row(row: &AnyRow) -> Result<SalePlan> {
    Ok(SalePlan {
        schedule: inventory_core::schedule::Schedule {
            opens_at_ms: row.try_get("opens_at_ms")?,
            closes_at_ms: row.try_get("closes_at_ms")?,
            prestock_lead_ms: col(row, "prestock_lead_ms")?,
        },
        center_reserve: col(row, "center_reserve")?,
    })
}

/// The item row's channel shares (column of migration 0011; '' without any).
pub(super) fn shares_from_row(row: &AnyRow) -> Result<ChannelShares> {
    let text: String = row.try_get("channel_shares")?;
    if text.is_empty() {
        return Ok(ChannelShares::default());
    }
    let shares = serde_json::from_str(&text)
        .map_err(|e| CenterError::Internal(format!("column channel_shares unreadable: {e}")))?;
    Ok(ChannelShares::from_stored(shares))
}

/// Channel shares as the column keeps them ('' without any).
pub(super) fn shares_to_db(shares: &ChannelShares) -> Result<String> {
    if shares.is_empty() {
        return Ok(String::new());
    }
    serde_json::to_string(shares).map_err(|e| CenterError::Internal(e.to_string()))
}

fn limit_from_row(row: &AnyRow) -> Result<LimitSettings> {
    let scope: i64 = row.try_get("limit_scope")?;
    let fallback: i64 = row.try_get("registry_fallback")?;
    Ok(LimitSettings {
        scope: LimitScope::from_number(scope)
            .ok_or_else(|| CenterError::Internal(format!("column limit_scope holds {scope}")))?,
        fallback: RegistryFallback::from_number(fallback)
            .ok_or_else(|| CenterError::Internal(format!("column registry_fallback holds {fallback}")))?,
    })
}

pub(super) fn session_from_row(row: &AnyRow) -> Result<ChannelSession> {
    Ok(ChannelSession {
        epoch: col(row, "epoch")?,
        agent_id: row.try_get("agent_id")?,
        lease_expires_at_ms: row.try_get("lease_expires_at_ms")?,
        last_heartbeat_ms: row.try_get("last_heartbeat_ms")?,
    })
}

pub(super) fn alloc_from_row(row: &AnyRow) -> Result<(String, String, Allocation)> {
    Ok((
        row.try_get("item_id")?,
        row.try_get("channel")?,
        Allocation {
            granted: col(row, "granted")?,
            returned: col(row, "returned")?,
            reclaimed: col(row, "reclaimed")?,
            reported: PoolCounts {
                available: col(row, "reported_available")?,
                reserved: col(row, "reported_reserved")?,
                sold: col(row, "reported_sold")?,
            },
            reported_at_ms: row.try_get("reported_at_ms")?,
            generation: col(row, "pool_generation")?,
            in_doubt: col(row, "in_doubt")?,
            sell_rate_milli: col(row, "sell_rate_milli")?,
        },
    ))
}

impl SqlLedger {
    pub(super) async fn lock_item(&self, tx: &mut Tx, item: &ItemId) -> Result<(ItemState, Watermarks)> {
        let row = sqlx::query(&self.q.lock_item).bind(item.as_str()).fetch_optional(&mut **tx).await?;
        let row = row.ok_or_else(|| CenterError::item_not_found(item.as_str()))?;
        let (_, state, wm, _, _, _) = item_from_row(&row)?;
        Ok((state, wm))
    }

    pub(super) async fn lock_session(
        &self,
        tx: &mut Tx,
        channel: &Channel,
        lock: &str,
    ) -> Result<Option<ChannelSession>> {
        let row = sqlx::query(lock).bind(channel.as_str()).fetch_optional(&mut **tx).await?;
        row.as_ref().map(session_from_row).transpose()
    }

    pub(super) async fn alloc(tx: &mut Tx, item: &str, channel: &str) -> Result<Allocation> {
        let row = sqlx::query(&format!("{ALLOC_SELECT} WHERE item_id = $1 AND channel = $2"))
            .bind(item)
            .bind(channel)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(match row {
            Some(row) => alloc_from_row(&row)?.2,
            None => Allocation::default(),
        })
    }

    /// Conditional update: applies only if the row still holds what was read.
    pub(super) async fn write_item(tx: &mut Tx, item: &str, before: &ItemState, after: &ItemState) -> Result<()> {
        let done = sqlx::query(
            "UPDATE items SET total = $1, available = $2, written_off = $6 \
             WHERE item_id = $3 AND total = $4 AND available = $5",
        )
        .bind(to_db("total", after.total)?)
        .bind(to_db("available", after.available)?)
        .bind(item)
        .bind(to_db("total", before.total)?)
        .bind(to_db("available", before.available)?)
        .bind(to_db("written_off", after.written_off)?)
        .execute(&mut **tx)
        .await?;
        if done.rows_affected() != 1 {
            return Err(CenterError::Internal(format!("item {item} changed under a held lock")));
        }
        Ok(())
    }

    /// Writes the movement counters only; reported fields belong to heartbeats.
    pub(super) async fn write_movements(tx: &mut Tx, item: &str, channel: &str, a: &Allocation) -> Result<()> {
        sqlx::query(
            "INSERT INTO allocations (item_id, channel, granted, returned, reclaimed) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (item_id, channel) DO UPDATE SET granted = excluded.granted, \
             returned = excluded.returned, reclaimed = excluded.reclaimed",
        )
        .bind(item)
        .bind(channel)
        .bind(to_db("granted", a.granted)?)
        .bind(to_db("returned", a.returned)?)
        .bind(to_db("reclaimed", a.reclaimed)?)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Writes the in-doubt state and the report fields it resets.
    pub(super) async fn write_doubt(tx: &mut Tx, item: &str, channel: &str, a: &Allocation) -> Result<()> {
        sqlx::query(
            "UPDATE allocations SET in_doubt = $1, reported_available = $2, reported_reserved = $3, \
             reported_sold = $4, pool_generation = $5 WHERE item_id = $6 AND channel = $7",
        )
        .bind(to_db("in_doubt", a.in_doubt)?)
        .bind(to_db("available", a.reported.available)?)
        .bind(to_db("reserved", a.reported.reserved)?)
        .bind(to_db("sold", a.reported.sold)?)
        .bind(to_db("generation", a.generation)?)
        .bind(item)
        .bind(channel)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    pub(super) async fn sum_held(&self, tx: &mut Tx, item: &str) -> Result<u64> {
        let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE item_id = $1")).bind(item).fetch_all(&mut **tx).await?;
        let mut held = 0u64;
        for row in &rows {
            // Saturating: a corrupted ledger shows in Reconcile, not as a panic here.
            held = held.saturating_add(alloc_from_row(row)?.2.held());
        }
        Ok(held)
    }

    pub(super) async fn item_record(&self, tx: &mut Tx, item: &ItemId) -> Result<ItemRecord> {
        let row = sqlx::query(&format!("{ITEM_SELECT} WHERE item_id = $1"))
            .bind(item.as_str())
            .fetch_optional(&mut **tx)
            .await?
            .ok_or_else(|| CenterError::item_not_found(item.as_str()))?;
        let (item_id, state, watermarks, rate_batching, segments, limit) = item_from_row(&row)?;
        let held = self.sum_held(tx, &item_id).await?;
        let plan = plan_from_row(&row)?;
        let shares = shares_from_row(&row)?;
        Ok(ItemRecord { item_id, state, watermarks, rate_batching, segments, limit, plan, shares, held })
    }

    pub(super) async fn override_for(tx: &mut Tx, item: &str, channel: &str) -> Result<Option<Watermarks>> {
        let row = sqlx::query("SELECT low, high, batch FROM watermark_overrides WHERE item_id = $1 AND channel = $2")
            .bind(item)
            .bind(channel)
            .fetch_optional(&mut **tx)
            .await?;
        row.map(|r| -> Result<Watermarks> {
            Ok(Watermarks { low: col(&r, "low")?, high: col(&r, "high")?, batch: col(&r, "batch")? })
        })
        .transpose()
    }
}
