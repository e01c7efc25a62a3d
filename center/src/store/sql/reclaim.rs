//! Taking units back from a channel: reclaim after its lease, settling units in doubt, and
//! removing a channel that holds nothing.

use inventory_core::ledger;
use inventory_core::{Channel, ItemId};
use sqlx::Row;

use super::SqlLedger;
use super::rows::{ALLOC_SELECT, alloc_from_row, to_db};
use crate::error::CenterError;
use crate::store::{ItemRecord, ReclaimOutcome, RemovedChannel, Result};

impl SqlLedger {
    pub(super) async fn resolve_in_doubt(
        &self,
        item: &ItemId,
        channel: &Channel,
        sold: u64,
    ) -> Result<(ItemRecord, u64)> {
        let mut tx = self.begin().await?;
        let (before, _) = self.lock_item(&mut tx, item).await?;
        let mut alloc = Self::alloc(&mut tx, item.as_str(), channel.as_str()).await?;
        let mut after = before.clone();
        let returned = ledger::resolve_in_doubt(&mut after, &mut alloc, channel, sold)?;
        Self::write_item(&mut tx, item.as_str(), &before, &after).await?;
        Self::write_movements(&mut tx, item.as_str(), channel.as_str(), &alloc).await?;
        Self::write_doubt(&mut tx, item.as_str(), channel.as_str(), &alloc).await?;
        let record = self.item_record(&mut tx, item).await?;
        tx.commit().await?;
        Ok((record, returned))
    }

    /// Re-learns grants a channel's pool holds beyond what the ledger counts with it
    /// ([`ledger::relearn`]), if its report still shows the `expected` excess.
    pub(super) async fn relearn(&self, item: &ItemId, channel: &Channel, expected: u64) -> Result<ledger::Relearned> {
        let mut tx = self.begin().await?;
        let (before, _) = self.lock_item(&mut tx, item).await?;
        let mut alloc = Self::alloc(&mut tx, item.as_str(), channel.as_str()).await?;
        let mut after = before.clone();
        let learned = ledger::relearn(&mut after, &mut alloc, expected);
        if learned != ledger::Relearned::Nothing {
            Self::write_item(&mut tx, item.as_str(), &before, &after).await?;
            Self::write_movements(&mut tx, item.as_str(), channel.as_str(), &alloc).await?;
        }
        tx.commit().await?;
        Ok(learned)
    }

    pub(super) async fn reclaim(&self, channel: &Channel, now_ms: i64, grace_ms: u64) -> Result<ReclaimOutcome> {
        let mut tx = self.begin().await?;
        let item_rows = sqlx::query("SELECT item_id FROM allocations WHERE channel = $1 ORDER BY item_id")
            .bind(channel.as_str())
            .fetch_all(&mut *tx)
            .await?;
        // Lock order everywhere: item rows (sorted), then the channel row.
        let mut items = Vec::with_capacity(item_rows.len());
        for row in &item_rows {
            let id: String = row.try_get("item_id")?;
            let id = ItemId::parse("item_id", &id)?;
            let state = self.lock_item(&mut tx, &id).await?.0;
            items.push((id, state));
        }
        let mut session = self
            .lock_session(&mut tx, channel, &self.q.lock_channel_update)
            .await?
            .ok_or_else(|| CenterError::Precondition(format!("channel {channel} is not registered")))?;
        session.begin_reclaim(channel, now_ms, grace_ms)?;
        // Did the agent say its last word (drained)? Only then is its last report final.
        let last_word: i64 = sqlx::query("SELECT last_report FROM channels WHERE channel = $1")
            .bind(channel.as_str())
            .fetch_one(&mut *tx)
            .await?
            .try_get("last_report")?;
        sqlx::query("UPDATE channels SET epoch = $1 WHERE channel = $2")
            .bind(to_db("epoch", session.epoch)?)
            .bind(channel.as_str())
            .execute(&mut *tx)
            .await?;
        let mut reclaimed = Vec::new();
        for (id, before) in items {
            let mut alloc = Self::alloc(&mut tx, id.as_str(), channel.as_str()).await?;
            let mut after = before.clone();
            if last_word == 0 {
                let doubt = ledger::reclaim_into_doubt(&mut alloc);
                if doubt > 0 {
                    Self::write_doubt(&mut tx, id.as_str(), channel.as_str(), &alloc).await?;
                }
                reclaimed.push((id.to_string(), 0, after.available, doubt));
                continue;
            }
            let units = ledger::reclaim(&mut after, &mut alloc);
            if units > 0 {
                Self::write_item(&mut tx, id.as_str(), &before, &after).await?;
                sqlx::query(
                    "UPDATE allocations SET reclaimed = $1, reported_available = $2 WHERE item_id = $3 AND channel = $4",
                )
                .bind(to_db("reclaimed", alloc.reclaimed)?)
                .bind(to_db("available", alloc.reported.available)?)
                .bind(id.as_str())
                .bind(channel.as_str())
                .execute(&mut *tx)
                .await?;
            }
            reclaimed.push((id.to_string(), units, after.available, 0));
        }
        tx.commit().await?;
        Ok(ReclaimOutcome { items: reclaimed, new_epoch: session.epoch })
    }

    pub(super) async fn remove_channel(&self, channel: &Channel, now_ms: i64) -> Result<RemovedChannel> {
        let mut tx = self.begin().await?;
        let item_rows = sqlx::query("SELECT item_id FROM allocations WHERE channel = $1 ORDER BY item_id")
            .bind(channel.as_str())
            .fetch_all(&mut *tx)
            .await?;
        // Lock order everywhere: item rows (sorted), then the channel row.
        for row in &item_rows {
            let id: String = row.try_get("item_id")?;
            self.lock_item(&mut tx, &ItemId::parse("item_id", &id)?).await?;
        }
        let session = self
            .lock_session(&mut tx, channel, &self.q.lock_channel_update)
            .await?
            .ok_or_else(|| CenterError::NotFound { kind: "channel", id: channel.to_string() })?;
        // Read again under the channel's lock: every call that adds units or an allocation
        // row (Borrow, reports) holds a share of that lock, so what is read now stays.
        let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE channel = $1 ORDER BY item_id"))
            .bind(channel.as_str())
            .fetch_all(&mut *tx)
            .await?;
        let allocations =
            rows.iter().map(|row| alloc_from_row(row).map(|(item, _, a)| (item, a))).collect::<Result<Vec<_>>>()?;
        let last_word: i64 = sqlx::query("SELECT last_report FROM channels WHERE channel = $1")
            .bind(channel.as_str())
            .fetch_one(&mut *tx)
            .await?
            .try_get("last_report")?;
        ledger::check_removal(channel, &session, last_word != 0, now_ms, &allocations)?;
        // Only settled rows go; one that is not (it cannot be, under the locks) keeps the
        // whole removal from happening rather than losing units from the ledger.
        let deleted = sqlx::query(
            "DELETE FROM allocations WHERE channel = $1 AND in_doubt = 0 AND granted = returned + reclaimed",
        )
        .bind(channel.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if usize::try_from(deleted).ok() != Some(allocations.len()) {
            tx.rollback().await?;
            return Err(CenterError::Unavailable(format!(
                "channel {:?} changed while it was being removed, retry",
                channel.as_str()
            )));
        }
        sqlx::query("DELETE FROM channels WHERE channel = $1").bind(channel.as_str()).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO removed_channels (channel, epoch) VALUES ($1, $2) \
             ON CONFLICT (channel) DO UPDATE SET epoch = excluded.epoch",
        )
        .bind(channel.as_str())
        .bind(to_db("epoch", session.epoch)?)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(RemovedChannel {
            last_epoch: session.epoch,
            item_ids: allocations.into_iter().map(|(item, _)| item).collect(),
        })
    }
}
