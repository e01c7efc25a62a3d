//! What agents tell the center: registration, and heartbeats with pool reports (the loss
//! rule runs inside each report's transaction).

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use inventory_core::ledger::{Allocation, ChannelSession};
use inventory_core::loss;
use inventory_core::{AgentId, Channel, ItemId};
use sqlx::Row;

use super::rows::{
    ALLOC_SELECT, REPORT_ROWS_PER_STATEMENT, alloc_from_row, col, placeholders, stale_or_unknown, to_db,
};
use super::{Dialect, SqlLedger, Tx};
use crate::error::CenterError;
use crate::store::{HeartbeatOutcome, Holding, PoolReportIn, Registration, Result};

/// Chunks of one heartbeat's reports applied at once (each holds a connection meanwhile).
const REPORT_CHUNKS_IN_FLIGHT: usize = 2;

impl SqlLedger {
    /// Stores one chunk of pool reports (every item exists: [`SqlLedger::allocations_of`]
    /// checked), in one statement whatever its size.
    async fn write_reports(&self, tx: &mut Tx, channel: &Channel, chunk: &[&PoolReportIn], now_ms: i64) -> Result<()> {
        let mut rows = Vec::with_capacity(chunk.len());
        for PoolReportIn { item, report, segments, .. } in chunk {
            rows.push(ReportRow {
                item_id: item.as_str(),
                available: to_db("available", report.counts.available)?,
                reserved: to_db("reserved", report.counts.reserved)?,
                sold: to_db("sold", report.counts.sold)?,
                generation: to_db("generation", report.kept_generation())?,
                sell_rate_milli: to_db("sell_rate_milli", if report.lost { 0 } else { report.sell_rate_milli })?,
                segments: inventory_core::segments::encode(segments),
            });
        }
        sqlx::query(&self.q.report_write)
            .bind(channel.as_str())
            .bind(now_ms)
            .bind(json_rows(&rows)?)
            .execute(&mut **tx)
            .await?;
        self.remember_write_seqs(tx, channel, chunk).await
    }

    /// Raises the remembered write sequence of every pool segment the chunk reports, never
    /// lowering one (`core::pool::remember_write_seq`, as one conditional upsert, so two
    /// reports racing cannot lower it either).
    async fn remember_write_seqs(&self, tx: &mut Tx, channel: &Channel, chunk: &[&PoolReportIn]) -> Result<()> {
        let seqs: Vec<(&str, u32, u64)> =
            chunk.iter().flat_map(|r| r.write_seqs.iter().map(|(s, w)| (r.item.as_str(), *s, *w))).collect();
        self.upsert_write_seqs(tx, channel, &seqs).await
    }

    /// A Return's write sequences (`ReturnRequest.write_seq_floors`), or a ReturnMany's
    /// lines', raised in a transaction of their own before the Returns apply: whatever
    /// they answer, the pools got that far. In key order, so two such transactions of one
    /// channel never wait on each other's rows in a cycle; one row per segment (the
    /// highest), as one statement may touch a row only once.
    pub(super) async fn raise_write_seqs(&self, channel: &Channel, seqs: &[(&ItemId, u32, u64)]) -> Result<()> {
        let mut highest: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for (item, segment, seq) in seqs {
            let h = highest.entry((item.as_str(), *segment)).or_default();
            *h = (*h).max(*seq);
        }
        let seqs: Vec<(&str, u32, u64)> = highest.into_iter().map(|((item, s), w)| (item, s, w)).collect();
        let mut tx = self.begin().await?;
        self.upsert_write_seqs(&mut tx, channel, &seqs).await?;
        tx.commit().await?;
        Ok(())
    }

    /// `(item, segment, write_seq)` rows as one conditional upsert.
    async fn upsert_write_seqs(&self, tx: &mut Tx, channel: &Channel, seqs: &[(&str, u32, u64)]) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        let mut rows = Vec::with_capacity(seqs.len());
        for (item_id, segment, seq) in seqs {
            rows.push(WriteSeqRow { item_id, segment: *segment, write_seq: to_db("write_seq", *seq)? });
        }
        sqlx::query(&self.q.write_seqs_raise).bind(channel.as_str()).bind(json_rows(&rows)?).execute(&mut **tx).await?;
        Ok(())
    }

    /// The channel's remembered write sequences (`core::pool::floors_by_segment`) of
    /// `items` (all of them when `None`), by item.
    pub(super) async fn write_seq_floors<'e, E>(
        executor: E,
        dialect: Dialect,
        channel: &str,
        items: Option<&[&str]>,
    ) -> Result<HashMap<String, Vec<u64>>>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        let sql = match (items, dialect) {
            (None, _) => "SELECT item_id, segment, write_seq FROM pool_write_seqs WHERE channel = $1".to_owned(),
            (Some([]), _) => return Ok(HashMap::new()),
            // Each item's rows by key (`OFFSET 0` keeps the lookup per item), not the
            // channel's every row filtered, whatever the planner's statistics say.
            (Some(items), Dialect::Postgres) => format!(
                "SELECT k.item_id, w.segment, w.write_seq FROM (VALUES {}) AS k(item_id) CROSS JOIN LATERAL \
                 (SELECT segment, write_seq FROM pool_write_seqs WHERE channel = $1 AND item_id = k.item_id \
                 OFFSET 0) w",
                (0..items.len()).map(|i| format!("(${})", i + 2)).collect::<Vec<_>>().join(", ")
            ),
            (Some(items), Dialect::Sqlite) => format!(
                "SELECT item_id, segment, write_seq FROM pool_write_seqs WHERE channel = $1 AND item_id IN ({})",
                placeholders(2, items.len())
            ),
        };
        let mut query = sqlx::query(&sql).bind(channel);
        for item in items.unwrap_or_default() {
            query = query.bind(*item);
        }
        let mut pairs: HashMap<String, Vec<(u32, u64)>> = HashMap::new();
        for row in &query.fetch_all(executor).await? {
            let item: String = row.try_get("item_id")?;
            let segment = u32::try_from(col(row, "segment")?).unwrap_or(u32::MAX);
            pairs.entry(item).or_default().push((segment, col(row, "write_seq")?));
        }
        Ok(pairs.into_iter().map(|(item, p)| (item, inventory_core::pool::floors_by_segment(p))).collect())
    }

    pub(super) async fn register(
        &self,
        channel: &Channel,
        agent: &AgentId,
        now_ms: i64,
        lease_ttl_ms: u64,
        fenced_at: u64,
    ) -> Result<Registration> {
        let above = to_db("fenced_at", fenced_at.saturating_add(1))?;
        let mut tx = self.begin().await?;
        let previous = self.lock_session(&mut tx, channel, &self.q.lock_channel_update).await?;
        let mut session = ChannelSession::register(previous.as_ref(), agent.as_str(), now_ms, lease_ttl_ms, fenced_at);
        if previous.is_none() {
            // A removed channel comes back above every epoch it had, so its earlier
            // incarnation stays fenced. (A removal waits for this row lock, or this
            // registration's statements see the removal's commit.)
            let removed = sqlx::query("SELECT epoch FROM removed_channels WHERE channel = $1")
                .bind(channel.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(row) = removed {
                let last: u64 = col(&row, "epoch")?;
                let after = last.checked_add(1).ok_or(CenterError::Internal("epoch would overflow".into()))?;
                session.epoch = session.epoch.max(after);
            }
        }
        // The upsert bumps the stored epoch atomically even if two registrations race
        // on a channel that had no row yet; never to a pool fence or below ($6 is above it).
        let row = sqlx::query(
            "INSERT INTO channels (channel, epoch, agent_id, lease_expires_at_ms, last_heartbeat_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (channel) DO UPDATE SET epoch = \
             CASE WHEN channels.epoch + 1 > $6 THEN channels.epoch + 1 ELSE $6 END, \
             agent_id = excluded.agent_id, lease_expires_at_ms = excluded.lease_expires_at_ms, \
             last_heartbeat_ms = excluded.last_heartbeat_ms, last_report = 0 RETURNING epoch",
        )
        .bind(channel.as_str())
        .bind(to_db("epoch", session.epoch)?)
        .bind(&session.agent_id)
        .bind(session.lease_expires_at_ms)
        .bind(session.last_heartbeat_ms)
        .bind(above)
        .fetch_one(&mut *tx)
        .await?;
        let session = ChannelSession { epoch: col(&row, "epoch")?, ..session };
        let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE channel = $1 ORDER BY item_id"))
            .bind(channel.as_str())
            .fetch_all(&mut *tx)
            .await?;
        let mut floors = Self::write_seq_floors(&mut *tx, self.dialect, channel.as_str(), None).await?;
        let mut held = Vec::with_capacity(rows.len());
        for row in &rows {
            let (item_id, _, a) = alloc_from_row(row)?;
            let write_seq_floors = floors.remove(&item_id).unwrap_or_default();
            held.push(Holding {
                item_id,
                held: a.held(),
                generation: a.generation,
                in_doubt: a.in_doubt,
                write_seq_floors,
            });
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
    ) -> Result<HeartbeatOutcome> {
        // Reports first, one short transaction per chunk of rows, each checking the epoch
        // under a lock that borrows and returns share (FOR KEY SHARE): a channel with
        // thousands of items never holds thousands of row locks at once, and its borrows go
        // on meanwhile. One report per item (the last one wins).
        let mut latest: BTreeMap<&str, &PoolReportIn> = BTreeMap::new();
        for r in reports {
            latest.insert(r.item.as_str(), r);
        }
        let latest: Vec<&PoolReportIn> = latest.into_values().collect();
        // A few chunks at once, each its own transaction on its own connection: one chunk's
        // round trips overlap another's statements. Their items are disjoint and each
        // takes its item locks in order, so they never wait on each other.
        let pending: Vec<_> = latest
            .chunks(REPORT_ROWS_PER_STATEMENT)
            .map(|chunk| self.report_chunk(channel, epoch, chunk, now_ms))
            .collect();
        let mut chunks = futures::stream::iter(pending).buffered(REPORT_CHUNKS_IN_FLIGHT);
        let mut lost = Vec::new();
        while let Some(chunk_lost) = chunks.next().await {
            lost.extend(chunk_lost?);
        }
        drop(chunks);
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
        let in_doubt_items = sqlx::query("SELECT item_id FROM allocations WHERE channel = $1 AND in_doubt > 0")
            .bind(channel.as_str())
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| row.try_get("item_id"))
            .collect::<std::result::Result<_, _>>()?;
        tx.commit().await?;
        Ok(HeartbeatOutcome { session, lost, in_doubt_items })
    }

    /// One chunk of reports in one transaction, the loss rule included. Units in doubt
    /// change only under the item's row lock (a Return checks them under it), so the
    /// items whose pool the rule may find lost are locked first (lock order: items, then
    /// the channel), and the rule runs on the rows read under the locks. If a report of
    /// the same channel changed a generation in between, the chunk starts over. Returns
    /// the lost pools with the units each put in doubt.
    async fn report_chunk(
        &self,
        channel: &Channel,
        epoch: u64,
        chunk: &[&PoolReportIn],
        now_ms: i64,
    ) -> Result<Vec<(String, u64)>> {
        const ATTEMPTS: usize = 3;
        let items = items_json(chunk)?;
        let loses = |rows: &HashMap<String, Allocation>, r: &PoolReportIn| {
            let before = rows.get(r.item.as_str()).copied().unwrap_or_default();
            loss::report_touches_doubt(&before, &r.report)
        };
        // Most chunks touch no units in doubt, so need no item lock: the channel is locked
        // first and the rows read once under it. A chunk that does starts over below, its
        // items locked before the channel.
        let mut suspects: Vec<&ItemId> = Vec::new();
        let mut tx = self.begin().await?;
        let session = self.lock_session(&mut tx, channel, &self.q.lock_channel_share).await?;
        stale_or_unknown(channel, session.as_ref(), epoch)?;
        let mut rows = self.allocations_of(&mut tx, channel, &items).await?;
        let mut attempt = 0;
        while chunk.iter().any(|r| loses(&rows, r) && !suspects.contains(&&r.item)) {
            tx.rollback().await?;
            attempt += 1;
            if attempt > ATTEMPTS {
                return Err(CenterError::Unavailable("pool reports changed meanwhile, retry".into()));
            }
            tx = self.begin().await?;
            let seen = self.allocations_of(&mut tx, channel, &items).await?;
            suspects = chunk.iter().filter(|r| loses(&seen, r)).map(|r| &r.item).collect();
            // The chunk is sorted by item id, so these locks are taken in order.
            for item in &suspects {
                self.lock_item(&mut tx, item).await?;
            }
            let session = self.lock_session(&mut tx, channel, &self.q.lock_channel_share).await?;
            stale_or_unknown(channel, session.as_ref(), epoch)?;
            rows = self.allocations_of(&mut tx, channel, &items).await?;
        }
        let mut lost = Vec::new();
        for r in chunk {
            let existing = rows.get(r.item.as_str());
            let mut alloc = existing.copied().unwrap_or_default();
            let doubt_before = alloc.in_doubt;
            let newly_lost = loss::apply_report(&mut alloc, &r.report, now_ms);
            // Without a row the channel never held any of the item: nothing in doubt.
            if existing.is_some() && (newly_lost.is_some() || alloc.in_doubt != doubt_before) {
                Self::write_doubt(&mut tx, r.item.as_str(), channel.as_str(), &alloc).await?;
            }
            if let Some(units) = newly_lost {
                lost.push((r.item.to_string(), units));
            }
        }
        self.write_reports(&mut tx, channel, chunk, now_ms).await?;
        tx.commit().await?;
        Ok(lost)
    }

    /// The channel's allocation rows of the chunk's items, by item, in one statement
    /// (`items`: the chunk's ids as [`items_json`] writes them). NOT_FOUND for an item the
    /// ledger does not hold.
    async fn allocations_of(&self, tx: &mut Tx, channel: &Channel, items: &str) -> Result<HashMap<String, Allocation>> {
        let rows = sqlx::query(&self.q.report_rows).bind(channel.as_str()).bind(items).fetch_all(&mut **tx).await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in &rows {
            if row.try_get::<Option<String>, _>("known")?.is_none() {
                let asked: String = row.try_get("asked")?;
                return Err(CenterError::item_not_found(&asked));
            }
            if row.try_get::<Option<String>, _>("channel")?.is_some() {
                let (item, _, a) = alloc_from_row(row)?;
                out.insert(item, a);
            }
        }
        Ok(out)
    }
}

/// The chunk's item ids as [`Queries::report_rows`] reads them.
fn items_json(chunk: &[&PoolReportIn]) -> Result<String> {
    json_rows(&chunk.iter().map(|r| ItemRef { item_id: r.item.as_str() }).collect::<Vec<_>>())
}

/// The JSON array a statement reads its rows from (`Dialect::json_rows`). Each row is a
/// struct, serialized straight to text: a report of thousands of pools builds no map per
/// row.
fn json_rows<T: serde::Serialize>(rows: &[T]) -> Result<String> {
    serde_json::to_string(rows).map_err(|e| CenterError::Internal(format!("rows as JSON: {e}")))
}

#[derive(serde::Serialize)]
struct ItemRef<'a> {
    item_id: &'a str,
}

/// One row of the statement that stores a chunk of reports (`Queries::report_write`).
#[derive(serde::Serialize)]
struct ReportRow<'a> {
    item_id: &'a str,
    available: i64,
    reserved: i64,
    sold: i64,
    generation: i64,
    sell_rate_milli: i64,
    segments: String,
}

/// One row of the statement that raises write sequences (`Queries::write_seqs_raise`).
#[derive(serde::Serialize)]
struct WriteSeqRow<'a> {
    item_id: &'a str,
    segment: u32,
    write_seq: i64,
}
