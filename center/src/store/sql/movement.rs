//! Transactions that change an item: AddStock, CreateItem, closing and watermarks
//! (Borrow and Return run in batches: `batch`, `group`).

use inventory_core::ledger::{self, ItemState, Mutation};
use inventory_core::schedule::{self, RescheduleError, Schedule};
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_core::{Channel, ItemId, Quantity, RequestId};
use sqlx::Row;

use super::SqlLedger;
use super::rows::to_db;
use crate::error::CenterError;
use crate::store::{ItemRecord, NewItem, Result};

impl SqlLedger {
    pub(super) async fn create_item(&self, new: &NewItem, now_ms: i64) -> Result<(ItemRecord, bool)> {
        let mut tx = self.begin().await?;
        let state = ItemState::new(new.total, new.per_user_limit, new.reservation_ttl_ms);
        // ON CONFLICT DO NOTHING makes concurrent creates safe; the loser compares.
        let inserted = sqlx::query(
            "INSERT INTO items (item_id, total, available, per_user_limit, reservation_ttl_ms, closed, \
             wm_low, wm_high, wm_batch, created_at_ms, rate_batching, rate_min_batch, rate_max_batch, rate_target_ms, segments, \
             limit_scope, registry_fallback, opens_at_ms, closes_at_ms, prestock_lead_ms, center_reserve, channel_shares) \
             VALUES ($1, $2, $3, $4, $5, 0, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21) \
             ON CONFLICT (item_id) DO NOTHING",
        )
        .bind(new.item_id.as_str())
        .bind(to_db("total", state.total)?)
        .bind(to_db("available", state.available)?)
        .bind(to_db("per_user_limit", state.per_user_limit)?)
        .bind(to_db("reservation_ttl_ms", state.reservation_ttl_ms)?)
        .bind(to_db("low", new.watermarks.low)?)
        .bind(to_db("high", new.watermarks.high)?)
        .bind(to_db("batch", new.watermarks.batch)?)
        .bind(now_ms)
        .bind(i64::from(new.rate_batching.is_some()))
        .bind(to_db("min_batch", new.rate_batching.map_or(0, |r| r.min_batch))?)
        .bind(to_db("max_batch", new.rate_batching.map_or(0, |r| r.max_batch))?)
        .bind(to_db("target_ms", new.rate_batching.map_or(0, |r| r.target_ms))?)
        .bind(i64::from(new.segments))
        .bind(new.limit.scope.number())
        .bind(new.limit.fallback.number())
        .bind(new.plan.schedule.opens_at_ms)
        .bind(new.plan.schedule.closes_at_ms)
        .bind(to_db("prestock_lead_ms", new.plan.schedule.prestock_lead_ms)?)
        .bind(to_db("center_reserve", new.plan.center_reserve)?)
        .bind(super::rows::shares_to_db(&new.shares)?)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let record = self.item_record(&mut tx, &new.item_id).await?;
        tx.commit().await?;
        if !inserted {
            // The definition is what was asked at creation; stock added since does not count.
            let same = record.state.per_user_limit == new.per_user_limit
                && record.state.reservation_ttl_ms == new.reservation_ttl_ms
                && record.segments == new.segments
                && record.limit == new.limit
                && record.shares == new.shares;
            let same_total = record.state.total == new.total.get();
            if !(same && same_total) {
                return Err(CenterError::AlreadyExists(format!(
                    "item {:?} already exists with total {}, per_user_limit {}, reservation_ttl_ms {}, segments {}, \
                     limit_scope {}, registry_fallback {}, channel_shares {}",
                    new.item_id.as_str(),
                    record.state.total,
                    record.state.per_user_limit,
                    record.state.reservation_ttl_ms,
                    record.segments,
                    record.limit.scope.as_str(),
                    record.limit.fallback.as_str(),
                    super::rows::shares_to_db(&record.shares)?
                )));
            }
        }
        Ok((record, inserted))
    }

    pub(super) async fn add_stock(
        &self,
        item: &ItemId,
        quantity: Quantity,
        request_id: &RequestId,
    ) -> Result<(ItemRecord, bool)> {
        let m = Mutation::AddStock { item: item.clone(), quantity };
        let mut tx = self.begin().await?;
        let (before, _) = self.lock_item(&mut tx, item).await?;
        let replayed = if Self::find_request::<()>(&mut tx, &m, request_id).await?.is_some() {
            true
        } else {
            let mut after = before.clone();
            ledger::add_stock(&mut after, quantity)?;
            Self::write_item(&mut tx, item.as_str(), &before, &after).await?;
            if !Self::put_request(&mut tx, &m, request_id, None, &()).await? {
                // Recorded meanwhile under the same id (another item's lock): ours rolls back.
                tx.rollback().await?;
                self.recorded_answer::<()>(&m, request_id).await?;
                let mut tx = self.begin_read().await?;
                let record = self.item_record(&mut tx, item).await?;
                tx.commit().await?;
                return Ok((record, true));
            }
            false
        };
        let record = self.item_record(&mut tx, item).await?;
        tx.commit().await?;
        Ok((record, replayed))
    }

    pub(super) async fn set_closed(&self, item: &ItemId, closed: bool) -> Result<ItemRecord> {
        let mut tx = self.begin().await?;
        self.lock_item(&mut tx, item).await?;
        sqlx::query("UPDATE items SET closed = $1 WHERE item_id = $2")
            .bind(i64::from(closed))
            .bind(item.as_str())
            .execute(&mut *tx)
            .await?;
        let record = self.item_record(&mut tx, item).await?;
        tx.commit().await?;
        Ok(record)
    }

    pub(super) async fn set_schedule(
        &self,
        item: &ItemId,
        opens_at_ms: i64,
        closes_at_ms: i64,
        now_ms: i64,
    ) -> Result<ItemRecord> {
        let mut tx = self.begin().await?;
        self.lock_item(&mut tx, item).await?;
        let current = self.item_record(&mut tx, item).await?;
        let moved = schedule::reschedule(&current.plan.schedule, opens_at_ms, closes_at_ms, now_ms).map_err(|e| match e {
            RescheduleError::Invalid(v) => CenterError::from(v),
            RescheduleError::Opened { opens_at_ms } => CenterError::Precondition(format!(
                "item {:?} opened at {opens_at_ms}: only closes_at_unix_ms may move (pass opens_at_unix_ms {opens_at_ms} or 0)",
                item.as_str()
            )),
        })?;
        sqlx::query("UPDATE items SET opens_at_ms = $1, closes_at_ms = $2 WHERE item_id = $3")
            .bind(moved.opens_at_ms)
            .bind(moved.closes_at_ms)
            .bind(item.as_str())
            .execute(&mut *tx)
            .await?;
        let record = self.item_record(&mut tx, item).await?;
        tx.commit().await?;
        Ok(record)
    }

    pub(super) async fn close_due(&self, now_ms: i64) -> Result<Vec<ItemRecord>> {
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT item_id FROM items WHERE closed = 0 AND closes_at_ms > 0 AND closes_at_ms <= $1 ORDER BY item_id",
        )
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut closed = Vec::with_capacity(due.len());
        for id in due {
            let item = ItemId::parse("item_id", &id)?;
            let mut tx = self.begin().await?;
            self.lock_item(&mut tx, &item).await?;
            // Only the first closer (of several center replicas, or a CloseItem) changes it.
            let changed = sqlx::query(
                "UPDATE items SET closed = 1 WHERE item_id = $1 AND closed = 0 AND closes_at_ms > 0 AND closes_at_ms <= $2",
            )
            .bind(item.as_str())
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1;
            let record = self.item_record(&mut tx, &item).await?;
            tx.commit().await?;
            if changed {
                closed.push(record);
            }
        }
        Ok(closed)
    }

    pub(super) async fn schedules(&self) -> Result<Vec<(String, Schedule, bool)>> {
        let rows = sqlx::query(
            "SELECT item_id, opens_at_ms, closes_at_ms, prestock_lead_ms, center_reserve, closed FROM items \
             WHERE opens_at_ms > 0 OR closes_at_ms > 0 ORDER BY item_id",
        )
        .fetch_all(&self.read_pool)
        .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("item_id")?;
                let closed = row.try_get::<i64, _>("closed")? != 0;
                Ok((id, super::rows::plan_from_row(row)?.schedule, closed))
            })
            .collect()
    }

    pub(super) async fn set_watermarks(&self, item: &ItemId, channel: Option<&Channel>, wm: Watermarks) -> Result<()> {
        let mut tx = self.begin().await?;
        self.lock_item(&mut tx, item).await?;
        match channel {
            None => {
                // The operator's fixed watermarks override rate-following.
                sqlx::query(
                    "UPDATE items SET wm_low = $1, wm_high = $2, wm_batch = $3, rate_batching = 0 WHERE item_id = $4",
                )
                .bind(to_db("low", wm.low)?)
                .bind(to_db("high", wm.high)?)
                .bind(to_db("batch", wm.batch)?)
                .bind(item.as_str())
                .execute(&mut *tx)
                .await?;
            }
            Some(c) => {
                sqlx::query(
                    "INSERT INTO watermark_overrides (item_id, channel, low, high, batch) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (item_id, channel) DO UPDATE SET low = excluded.low, high = excluded.high, \
                     batch = excluded.batch",
                )
                .bind(item.as_str())
                .bind(c.as_str())
                .bind(to_db("low", wm.low)?)
                .bind(to_db("high", wm.high)?)
                .bind(to_db("batch", wm.batch)?)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn set_rate_batching(
        &self,
        item: &ItemId,
        rate_batching: Option<RateBatching>,
        watermarks: Option<Watermarks>,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let (_, current) = self.lock_item(&mut tx, item).await?;
        let wm = watermarks.unwrap_or(current);
        let r = rate_batching.unwrap_or(RateBatching { min_batch: 0, max_batch: 0, target_ms: 0 });
        sqlx::query(
            "UPDATE items SET wm_low = $1, wm_high = $2, wm_batch = $3, rate_batching = $4, rate_min_batch = $5, \
             rate_max_batch = $6, rate_target_ms = $7 WHERE item_id = $8",
        )
        .bind(to_db("low", wm.low)?)
        .bind(to_db("high", wm.high)?)
        .bind(to_db("batch", wm.batch)?)
        .bind(i64::from(rate_batching.is_some()))
        .bind(to_db("min_batch", r.min_batch)?)
        .bind(to_db("max_batch", r.max_batch)?)
        .bind(to_db("target_ms", r.target_ms)?)
        .bind(item.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
