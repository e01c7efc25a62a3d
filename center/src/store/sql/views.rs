//! Read views: each one snapshot, so a view never mixes states.

use std::collections::HashMap;

use inventory_core::ledger::{self, Allocation, ChannelSession};
use inventory_core::watermarks::Watermarks;
use inventory_core::{Channel, ItemId};
use sqlx::Row;

use super::SqlLedger;
use super::rows::{
    ALLOC_SELECT, ITEM_SELECT, SESSION_SELECT, alloc_from_row, col, item_from_row, plan_from_row, session_from_row,
    shares_from_row,
};
use crate::error::CenterError;
use crate::store::{ChannelRecord, ChannelView, ItemLedger, ItemPolicy, ItemRecord, Reconciliation, Result};

impl SqlLedger {
    pub(super) async fn channels(&self) -> Result<Vec<ChannelView>> {
        let mut tx = self.begin_read().await?;
        let sessions = sqlx::query(&format!("{SESSION_SELECT} ORDER BY channel")).fetch_all(&mut *tx).await?;
        let allocations = sqlx::query(&format!("{ALLOC_SELECT} ORDER BY channel, item_id")).fetch_all(&mut *tx).await?;
        let segmented = Self::reported_segments(&mut tx, None).await?;
        tx.commit().await?;
        let allocations = allocations.iter().map(alloc_from_row).collect::<Result<Vec<_>>>()?;
        sessions
            .iter()
            .map(|row| {
                let channel: String = row.try_get("channel")?;
                let session = session_from_row(row)?;
                let mine = allocations
                    .iter()
                    .filter(|(_, c, _)| *c == channel)
                    .map(|(item, _, a)| (item.clone(), *a))
                    .collect();
                let segments = segmented
                    .iter()
                    .filter(|((_, c), _)| *c == channel)
                    .map(|((item, _), s)| (item.clone(), s.clone()))
                    .collect();
                Ok(ChannelView { channel, session, allocations: mine, segments })
            })
            .collect()
    }

    pub(super) async fn session(&self, channel: &Channel) -> Result<Option<ChannelSession>> {
        let row = sqlx::query(&format!("{SESSION_SELECT} WHERE channel = $1"))
            .bind(channel.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    pub(super) async fn policy(&self, item: &ItemId, channel: Option<&Channel>) -> Result<ItemPolicy> {
        if let Some(c) = channel {
            return self.channel_policy(item, c).await;
        }
        let mut tx = self.begin_read().await?;
        let record = self.item_record(&mut tx, item).await?;
        let (own, allocation) = match channel {
            Some(c) => (
                Self::override_for(&mut tx, item.as_str(), c.as_str()).await?,
                Some(Self::alloc(&mut tx, item.as_str(), c.as_str()).await?),
            ),
            None => (None, None),
        };
        tx.commit().await?;
        // A channel's own fixed watermarks override the item's rate-following batches.
        let rate_batching = if own.is_some() { None } else { record.rate_batching };
        Ok(ItemPolicy {
            watermarks: own.unwrap_or(record.watermarks),
            rate_batching,
            item: record,
            allocation,
            write_seq_floors: Vec::new(),
        })
    }

    /// What an agent asks on its first use of an item (DescribeItem), in one statement: the
    /// item, what every channel holds of it, the channel's own watermarks and its
    /// allocation. One statement sees one snapshot, so no transaction is needed: one round
    /// trip instead of seven.
    async fn channel_policy(&self, item: &ItemId, channel: &Channel) -> Result<ItemPolicy> {
        self.policies(std::slice::from_ref(item), channel)
            .await?
            .pop()
            .flatten()
            .ok_or_else(|| CenterError::item_not_found(item.as_str()))
    }

    /// [`SqlLedger::channel_policy`] of several items (DescribeItems), still one statement.
    pub(super) async fn policies(&self, items: &[ItemId], channel: &Channel) -> Result<Vec<Option<ItemPolicy>>> {
        // Held per channel as `Allocation::held` computes it (saturating at 0).
        const SELECT: &str = "SELECT i.item_id, i.total, i.available, i.per_user_limit, i.reservation_ttl_ms, \
             i.closed, i.wm_low, i.wm_high, i.wm_batch, i.written_off, i.rate_batching, i.rate_min_batch, \
             i.rate_max_batch, i.rate_target_ms, i.segments, i.limit_scope, i.registry_fallback, \
             i.opens_at_ms, i.closes_at_ms, i.prestock_lead_ms, i.center_reserve, i.channel_shares, \
             (SELECT CAST(COALESCE(SUM(CASE WHEN h.granted - h.returned - h.reclaimed > 0 \
                 THEN h.granted - h.returned - h.reclaimed ELSE 0 END), 0) AS BIGINT) \
              FROM allocations h WHERE h.item_id = i.item_id) AS held_sum, \
             o.low AS o_low, o.high AS o_high, o.batch AS o_batch, \
             a.channel AS channel, a.granted, a.returned, a.reclaimed, a.reported_available, \
             a.reported_reserved, a.reported_sold, a.reported_at_ms, a.pool_generation, a.in_doubt, \
             a.sell_rate_milli \
             FROM items i";
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let d = self.dialect;
        let sql = format!(
            "{SELECT} {} {} WHERE i.item_id IN ({})",
            d.join_one("watermark_overrides", "o", "o.item_id = i.item_id AND o.channel = $1"),
            d.join_one("allocations", "a", "a.item_id = i.item_id AND a.channel = $1"),
            super::rows::placeholders(2, items.len())
        );
        let mut query = sqlx::query(&sql).bind(channel.as_str());
        for item in items {
            query = query.bind(item.as_str());
        }
        let rows = query.fetch_all(&self.read_pool).await?;
        // Read apart from the statement above: a floor only rises, so any read of it is one
        // the pool's write sequence has reached.
        let ids: Vec<&str> = items.iter().map(ItemId::as_str).collect();
        let mut floors = Self::write_seq_floors(&self.read_pool, self.dialect, channel.as_str(), Some(&ids)).await?;
        let mut found: HashMap<String, ItemPolicy> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let (item_id, state, watermarks, rate_batching, segments, limit) = item_from_row(row)?;
            let held = col(row, "held_sum")?;
            let own = match row.try_get::<Option<i64>, _>("o_low")? {
                Some(_) => {
                    Some(Watermarks { low: col(row, "o_low")?, high: col(row, "o_high")?, batch: col(row, "o_batch")? })
                }
                None => None,
            };
            let allocation = match row.try_get::<Option<String>, _>("channel")? {
                Some(_) => alloc_from_row(row)?.2,
                None => Allocation::default(),
            };
            // A channel's own fixed watermarks override the item's rate-following batches.
            let record = ItemRecord {
                item_id,
                state,
                watermarks,
                rate_batching,
                segments,
                limit,
                plan: plan_from_row(row)?,
                shares: shares_from_row(row)?,
                held,
            };
            let policy = ItemPolicy {
                watermarks: own.unwrap_or(record.watermarks),
                rate_batching: if own.is_some() { None } else { record.rate_batching },
                allocation: Some(allocation),
                write_seq_floors: floors.remove(&record.item_id).unwrap_or_default(),
                item: record,
            };
            found.insert(policy.item.item_id.clone(), policy);
        }
        // An id asked twice gets its answer twice.
        Ok(items.iter().map(|i| found.get(i.as_str()).cloned()).collect())
    }

    pub(super) async fn item_ledger(&self, item: &ItemId) -> Result<ItemLedger> {
        let mut tx = self.begin_read().await?;
        let record = self.item_record(&mut tx, item).await?;
        let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE item_id = $1 ORDER BY channel"))
            .bind(item.as_str())
            .fetch_all(&mut *tx)
            .await?;
        let mut channels = Vec::with_capacity(rows.len());
        for row in &rows {
            let (_, channel, allocation) = alloc_from_row(row)?;
            let session = sqlx::query(&format!("{SESSION_SELECT} WHERE channel = $1"))
                .bind(&channel)
                .fetch_optional(&mut *tx)
                .await?
                .as_ref()
                .map(session_from_row)
                .transpose()?;
            let overridden = Self::override_for(&mut tx, item.as_str(), &channel).await?;
            channels.push(ChannelRecord {
                channel,
                allocation,
                segments: Vec::new(),
                session,
                watermarks: overridden.unwrap_or(record.watermarks),
                watermarks_overridden: overridden.is_some(),
            });
        }
        tx.commit().await?;
        Ok(ItemLedger { item: record, channels })
    }

    pub(super) async fn watermarks(&self, item: &ItemId) -> Result<(Watermarks, Vec<(String, Watermarks)>)> {
        let mut tx = self.begin_read().await?;
        let record = self.item_record(&mut tx, item).await?;
        let rows = sqlx::query(
            "SELECT channel, low, high, batch FROM watermark_overrides WHERE item_id = $1 ORDER BY channel",
        )
        .bind(item.as_str())
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let overrides = rows
            .iter()
            .map(|r| -> Result<(String, Watermarks)> {
                Ok((
                    r.try_get("channel")?,
                    Watermarks { low: col(r, "low")?, high: col(r, "high")?, batch: col(r, "batch")? },
                ))
            })
            .collect::<Result<_>>()?;
        Ok((record.watermarks, overrides))
    }

    pub(super) async fn reconcile(&self, item: Option<&ItemId>) -> Result<Reconciliation> {
        // One transaction so every item is seen at one instant (REPEATABLE READ would be
        // stricter; per-item consistency is what invariant 1 needs and each item's rows
        // only change under its row lock).
        let mut tx = self.begin_read().await?;
        let items = match item {
            Some(id) => {
                let row = sqlx::query(&format!("{ITEM_SELECT} WHERE item_id = $1"))
                    .bind(id.as_str())
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or_else(|| CenterError::item_not_found(id.as_str()))?;
                vec![row]
            }
            None => sqlx::query(&format!("{ITEM_SELECT} ORDER BY item_id")).fetch_all(&mut *tx).await?,
        };
        let mut result = Reconciliation { check: Default::default(), items_checked: 0 };
        for row in &items {
            let (item_id, state, _, _, _, _) = item_from_row(row)?;
            let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE item_id = $1 ORDER BY channel"))
                .bind(&item_id)
                .fetch_all(&mut *tx)
                .await?;
            let allocations =
                rows.iter().map(|r| alloc_from_row(r).map(|(_, c, a)| (c, a))).collect::<Result<Vec<_>>>()?;
            let check = ledger::check_item(&item_id, &state, &allocations);
            result.check.violations.extend(check.violations);
            result.check.drifts.extend(check.drifts);
            result.check.in_doubt.extend(check.in_doubt);
            result.items_checked += 1;
        }
        tx.commit().await?;
        Ok(result)
    }
}
