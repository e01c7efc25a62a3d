//! What agents tell the center: registration, heartbeats with pool reports, lost pools.

use inventory_core::ledger::{self, ChannelSession};
use inventory_core::{AgentId, Channel, ItemId};
use sqlx::Row;

use super::rows::{
    ALLOC_SELECT, REPORT_ROWS_PER_STATEMENT, alloc_from_row, col, placeholders, stale_or_unknown, to_db,
};
use super::{SqlLedger, Tx};
use crate::error::CenterError;
use crate::store::{Holding, PoolReportIn, Registration, Result};

impl SqlLedger {
    /// Stores one chunk of pool reports (every item must exist).
    pub(super) async fn write_reports(
        tx: &mut Tx,
        channel: &Channel,
        chunk: &[&PoolReportIn],
        now_ms: i64,
    ) -> Result<()> {
        let list = placeholders(1, chunk.len());
        let sql = format!("SELECT item_id FROM items WHERE item_id IN ({list})");
        let mut query = sqlx::query(&sql);
        for r in chunk {
            query = query.bind(r.item.as_str());
        }
        let known: std::collections::HashSet<String> = query
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|row| row.try_get("item_id"))
            .collect::<std::result::Result<_, _>>()?;
        if let Some(unknown) = chunk.iter().find(|r| !known.contains(r.item.as_str())) {
            return Err(CenterError::item_not_found(unknown.item.as_str()));
        }
        let rows = (0..chunk.len())
            .map(|k| {
                let b = k * 7;
                format!("(${}, ${}, ${}, ${}, ${}, ${}, ${})", b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7)
            })
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO allocations (item_id, channel, reported_available, reported_reserved, reported_sold, \
             reported_at_ms, pool_generation) VALUES {rows} \
             ON CONFLICT (item_id, channel) DO UPDATE SET \
             reported_available = excluded.reported_available, reported_reserved = excluded.reported_reserved, \
             reported_sold = excluded.reported_sold, reported_at_ms = excluded.reported_at_ms, \
             pool_generation = excluded.pool_generation"
        );
        let mut query = sqlx::query(&sql);
        for PoolReportIn { item, counts: pool, generation } in chunk {
            query = query
                .bind(item.as_str())
                .bind(channel.as_str())
                .bind(to_db("available", pool.available)?)
                .bind(to_db("reserved", pool.reserved)?)
                .bind(to_db("sold", pool.sold)?)
                .bind(now_ms)
                .bind(to_db("generation", *generation)?);
        }
        query.execute(&mut **tx).await?;
        Ok(())
    }

    pub(super) async fn register(
        &self,
        channel: &Channel,
        agent: &AgentId,
        now_ms: i64,
        lease_ttl_ms: u64,
    ) -> Result<Registration> {
        let mut tx = self.begin().await?;
        let previous = self.lock_session(&mut tx, channel, &self.q.lock_channel_update).await?;
        let session = ChannelSession::register(previous.as_ref(), agent.as_str(), now_ms, lease_ttl_ms);
        // The upsert bumps the stored epoch atomically even if two registrations race
        // on a channel that had no row yet.
        let row = sqlx::query(
            "INSERT INTO channels (channel, epoch, agent_id, lease_expires_at_ms, last_heartbeat_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (channel) DO UPDATE SET epoch = channels.epoch + 1, \
             agent_id = excluded.agent_id, lease_expires_at_ms = excluded.lease_expires_at_ms, \
             last_heartbeat_ms = excluded.last_heartbeat_ms, last_report = 0 RETURNING epoch",
        )
        .bind(channel.as_str())
        .bind(to_db("epoch", session.epoch)?)
        .bind(&session.agent_id)
        .bind(session.lease_expires_at_ms)
        .bind(session.last_heartbeat_ms)
        .fetch_one(&mut *tx)
        .await?;
        let session = ChannelSession { epoch: col(&row, "epoch")?, ..session };
        let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE channel = $1 ORDER BY item_id"))
            .bind(channel.as_str())
            .fetch_all(&mut *tx)
            .await?;
        let mut held = Vec::with_capacity(rows.len());
        for row in &rows {
            let (item_id, _, a) = alloc_from_row(row)?;
            held.push(Holding { item_id, held: a.held(), generation: a.generation, in_doubt: a.in_doubt });
        }
        tx.commit().await?;
        Ok(Registration { session, held })
    }

    pub(super) async fn heartbeat(
        &self,
        channel: &Channel,
        epoch: u64,
        reports: &[PoolReportIn],
        last_report: bool,
        now_ms: i64,
        lease_ttl_ms: u64,
    ) -> Result<ChannelSession> {
        // Reports first, one short transaction per chunk of rows, each checking the epoch
        // under a lock that borrows and returns share (FOR KEY SHARE): a channel with
        // thousands of items never holds thousands of row locks at once, and its borrows go
        // on meanwhile. One report per item (the last one wins).
        let mut latest: std::collections::BTreeMap<&str, &PoolReportIn> = std::collections::BTreeMap::new();
        for r in reports {
            latest.insert(r.item.as_str(), r);
        }
        let latest: Vec<&PoolReportIn> = latest.into_values().collect();
        for chunk in latest.chunks(REPORT_ROWS_PER_STATEMENT) {
            let mut tx = self.begin().await?;
            let session = self.lock_session(&mut tx, channel, &self.q.lock_channel_share).await?;
            stale_or_unknown(channel, session.as_ref(), epoch)?;
            Self::write_reports(&mut tx, channel, chunk, now_ms).await?;
            tx.commit().await?;
        }
        // Then the lease, and whether this was the agent's last word: set only once every
        // report it sent is stored (a reclaim reads both under FOR UPDATE).
        let mut tx = self.begin().await?;
        let session = self.lock_session(&mut tx, channel, &self.q.lock_channel_renew).await?;
        stale_or_unknown(channel, session.as_ref(), epoch)?;
        let mut session = session.expect("checked above");
        session.renew(now_ms, lease_ttl_ms);
        sqlx::query(
            "UPDATE channels SET lease_expires_at_ms = $1, last_heartbeat_ms = $2, last_report = $3 WHERE channel = $4",
        )
        .bind(session.lease_expires_at_ms)
        .bind(session.last_heartbeat_ms)
        .bind(i64::from(last_report))
        .bind(channel.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(session)
    }

    pub(super) async fn mark_lost(&self, item: &ItemId, channel: &Channel, epoch: u64) -> Result<u64> {
        let mut tx = self.begin().await?;
        self.lock_item(&mut tx, item).await?;
        let session = self.lock_session(&mut tx, channel, &self.q.lock_channel_share).await?;
        stale_or_unknown(channel, session.as_ref(), epoch)?;
        let mut alloc = Self::alloc(&mut tx, item.as_str(), channel.as_str()).await?;
        ledger::mark_lost(&mut alloc);
        Self::write_doubt(&mut tx, item.as_str(), channel.as_str(), &alloc).await?;
        tx.commit().await?;
        Ok(alloc.in_doubt)
    }
}
