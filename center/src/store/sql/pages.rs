//! Views of the whole catalogue (the scrape, ListItems, the console's sampler) and of one
//! page of it (the console's feed). Each is one snapshot; a page reads only its items' rows,
//! and no view matches rows item by item in memory (linear in the catalogue, never worse).

use std::collections::HashMap;

use inventory_core::ledger::{Allocation, ChannelSession};
use inventory_core::segments::{SegmentCounts, decode as decode_segments};
use inventory_core::watermarks::Watermarks;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::dialect::Dialect;
use super::rows::{
    ALLOC_SELECT, ITEM_SELECT, SESSION_SELECT, alloc_from_row, col, item_from_row, plan_from_row, session_from_row,
    shares_from_row,
};
use super::{SqlLedger, Tx};
use crate::error::CenterError;
use crate::store::{ChannelRecord, ItemLedger, ItemRecord, LedgerPage, LedgerSample, Result};

/// Every item with the units out with its channels, summed by the database (each line as
/// `Allocation::held` computes it: saturating at 0), by item.
fn items_with_held() -> String {
    format!(
        "SELECT i.*, COALESCE(h.held_sum, 0) AS held_sum FROM ({ITEM_SELECT}) i LEFT JOIN \
         (SELECT item_id, CAST(SUM(CASE WHEN granted - returned - reclaimed > 0 \
             THEN granted - returned - reclaimed ELSE 0 END) AS BIGINT) AS held_sum \
          FROM allocations GROUP BY item_id) h ON h.item_id = i.item_id ORDER BY i.item_id"
    )
}

/// The first and last item of a page: the rows of its items are those in this range.
type Range<'a> = Option<(&'a str, &'a str)>;

/// ` WHERE item_id BETWEEN $1 AND $2` (with `and`: ` AND ...`) for a page's range.
fn within(range: Range<'_>, and: bool) -> &'static str {
    match (range, and) {
        (None, _) => "",
        (Some(_), false) => " WHERE item_id BETWEEN $1 AND $2",
        (Some(_), true) => " AND item_id BETWEEN $1 AND $2",
    }
}

async fn fetch_in(tx: &mut Tx, sql: &str, range: Range<'_>) -> Result<Vec<AnyRow>> {
    let mut query = sqlx::query(sql);
    if let Some((first, last)) = range {
        query = query.bind(first).bind(last);
    }
    Ok(query.fetch_all(&mut **tx).await?)
}

impl SqlLedger {
    /// Segmented pools' segments as last reported, by (item, channel), in that order; of
    /// the items in `range` only when given.
    pub(super) async fn reported_segments(
        tx: &mut Tx,
        range: Range<'_>,
    ) -> Result<Vec<((String, String), Vec<SegmentCounts>)>> {
        let sql = format!(
            "SELECT item_id, channel, reported_segments FROM allocations WHERE reported_segments <> ''{} \
             ORDER BY item_id, channel",
            within(range, true)
        );
        let rows = fetch_in(tx, &sql, range).await?;
        rows.iter()
            .map(|r| {
                let text: String = r.try_get("reported_segments")?;
                let decoded = decode_segments(&text)
                    .ok_or_else(|| CenterError::Internal(format!("column reported_segments holds {text:?}")))?;
                Ok(((r.try_get("item_id")?, r.try_get("channel")?), decoded))
            })
            .collect()
    }

    pub(super) async fn sessions(&self) -> Result<Vec<(String, ChannelSession)>> {
        let rows = sqlx::query(&format!("{SESSION_SELECT} ORDER BY channel")).fetch_all(&self.read_pool).await?;
        rows.iter().map(|row| Ok((row.try_get("channel")?, session_from_row(row)?))).collect()
    }

    pub(super) async fn ledgers(&self) -> Result<Vec<(ItemLedger, Vec<(String, Watermarks)>)>> {
        let mut tx = self.begin_read().await?;
        let items = sqlx::query(&format!("{ITEM_SELECT} ORDER BY item_id")).fetch_all(&mut *tx).await?;
        let ledgers = Self::ledgers_of(&mut tx, &items, None).await?;
        tx.commit().await?;
        Ok(ledgers)
    }

    pub(super) async fn ledger_page(&self, offset: usize, limit: usize) -> Result<LedgerPage> {
        let as_db = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let mut tx = self.begin_read().await?;
        let total = sqlx::query("SELECT COUNT(*) AS n FROM items").fetch_one(&mut *tx).await?;
        let total_items = usize::try_from(col(&total, "n")?).unwrap_or(usize::MAX);
        let items = sqlx::query(&format!("{ITEM_SELECT} ORDER BY item_id LIMIT $1 OFFSET $2"))
            .bind(as_db(limit))
            .bind(as_db(offset))
            .fetch_all(&mut *tx)
            .await?;
        let ids: Vec<String> = items.iter().map(|r| r.try_get("item_id")).collect::<std::result::Result<_, _>>()?;
        let range = ids.first().zip(ids.last()).map(|(a, b)| (a.as_str(), b.as_str()));
        let items = match range {
            Some(_) => Self::ledgers_of(&mut tx, &items, range).await?,
            None => Vec::new(),
        };
        tx.commit().await?;
        Ok(LedgerPage { total_items, items })
    }

    /// The ledgers of `items` (rows of [`ITEM_SELECT`], by item id), every one of them when
    /// `range` is `None`, else those from its first to its last item.
    async fn ledgers_of(
        tx: &mut Tx,
        items: &[AnyRow],
        range: Range<'_>,
    ) -> Result<Vec<(ItemLedger, Vec<(String, Watermarks)>)>> {
        let allocs =
            fetch_in(tx, &format!("{ALLOC_SELECT}{} ORDER BY item_id, channel", within(range, false)), range).await?;
        let sessions = sqlx::query(SESSION_SELECT).fetch_all(&mut **tx).await?;
        let overrides = fetch_in(
            tx,
            &format!(
                "SELECT item_id, channel, low, high, batch FROM watermark_overrides{} ORDER BY item_id, channel",
                within(range, false)
            ),
            range,
        )
        .await?;
        let mut by_pool: HashMap<(String, String), Vec<SegmentCounts>> =
            Self::reported_segments(tx, range).await?.into_iter().collect();
        let sessions: HashMap<String, ChannelSession> =
            sessions.iter().map(|row| Ok((row.try_get("channel")?, session_from_row(row)?))).collect::<Result<_>>()?;
        let mut own: HashMap<String, Vec<(String, Watermarks)>> = HashMap::new();
        for r in &overrides {
            let wm = Watermarks { low: col(r, "low")?, high: col(r, "high")?, batch: col(r, "batch")? };
            own.entry(r.try_get("item_id")?).or_default().push((r.try_get("channel")?, wm));
        }
        let mut by_item: HashMap<String, Vec<(String, Allocation)>> = HashMap::new();
        for row in &allocs {
            let (item, channel, a) = alloc_from_row(row)?;
            by_item.entry(item).or_default().push((channel, a));
        }
        items
            .iter()
            .map(|row| {
                let (item_id, state, watermarks, rate_batching, segments, limit) = item_from_row(row)?;
                let allocations = by_item.remove(&item_id).unwrap_or_default();
                let overrides = own.remove(&item_id).unwrap_or_default();
                // Saturating: a corrupted ledger shows in Reconcile, not as a panic here.
                let held = allocations.iter().fold(0u64, |sum, (_, a)| sum.saturating_add(a.held()));
                let channels = allocations
                    .into_iter()
                    .map(|(channel, allocation)| {
                        let overridden = overrides.iter().find(|(c, _)| *c == channel).map(|(_, wm)| *wm);
                        ChannelRecord {
                            session: sessions.get(&channel).cloned(),
                            segments: by_pool.remove(&(item_id.clone(), channel.clone())).unwrap_or_default(),
                            channel,
                            allocation,
                            watermarks: overridden.unwrap_or(watermarks),
                            watermarks_overridden: overridden.is_some(),
                        }
                    })
                    .collect();
                let item = ItemRecord {
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
                Ok((ItemLedger { item, channels }, overrides))
            })
            .collect()
    }

    pub(super) async fn list_items(&self) -> Result<Vec<ItemRecord>> {
        let rows = sqlx::query(&items_with_held()).fetch_all(&self.read_pool).await?;
        rows.iter()
            .map(|row| {
                let (item_id, state, watermarks, rate_batching, segments, limit) = item_from_row(row)?;
                Ok(ItemRecord {
                    item_id,
                    state,
                    watermarks,
                    rate_batching,
                    segments,
                    limit,
                    plan: plan_from_row(row)?,
                    shares: shares_from_row(row)?,
                    held: col(row, "held_sum")?,
                })
            })
            .collect()
    }

    pub(super) async fn sample(&self) -> Result<LedgerSample> {
        let mut tx = self.begin_read().await?;
        let items = sqlx::query("SELECT item_id, available FROM items ORDER BY item_id").fetch_all(&mut *tx).await?;
        let lines = sqlx::query(&format!("{ALLOC_SELECT} ORDER BY item_id, channel")).fetch_all(&mut *tx).await?;
        // Behind a pooler the center's connections outlive a failover: the sampler asks
        // which server it read.
        if self.dialect == Dialect::Postgres {
            let started: String = sqlx::query_scalar(super::server::SERVER_STARTED).fetch_one(&mut *tx).await?;
            self.server.saw(&started);
        }
        tx.commit().await?;
        Ok(LedgerSample {
            items: items.iter().map(|r| Ok((r.try_get("item_id")?, col(r, "available")?))).collect::<Result<_>>()?,
            lines: lines.iter().map(alloc_from_row).collect::<Result<_>>()?,
        })
    }
}
