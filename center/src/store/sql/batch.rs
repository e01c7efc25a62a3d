//! One transaction for a batch of Borrows and Returns (`store::batch` decides; this
//! reads and writes). A fixed number of statements whatever the batch's size (chunked
//! only past a few hundred lines): request records, the items locked in id order, the
//! channels' sessions, the items' allocations, then one write per table (on PostgreSQL
//! the three writes are one statement).

use std::collections::{BTreeSet, HashMap};

use inventory_core::ledger::{ChannelSession, ItemState};

use super::rows::{
    alloc_from_row, item_from_row, placeholders, plan_from_row, session_from_row, shares_from_row, to_db,
};
use super::{Dialect, SqlLedger, Tx};
use crate::error::CenterError;
use crate::store::Result;
use crate::store::batch::{self, AllocRow, AllocWrite, Answer, ItemPlan, Op, Recorded, RequestKey, Snapshot};

/// Lines per statement of a batch (at most 8 parameters a line: within both engines'
/// limits).
const CHUNK: usize = 500;

/// Attempts of a batch whose request ids another transaction recorded meanwhile.
const ATTEMPTS: usize = 3;

/// `($first, ...), (...), ...`: `rows` groups of `width` placeholders.
fn value_rows(first: usize, rows: usize, width: usize) -> String {
    (0..rows).map(|r| format!("({})", placeholders(first + r * width, width))).collect::<Vec<_>>().join(", ")
}

impl SqlLedger {
    /// Runs the batch in one transaction. `Ok` holds one answer per line (a line's own
    /// error among them) and the first line that failed the epoch check; `Err` is a failure of
    /// the whole transaction (the database).
    pub(super) async fn run_batch(&self, ops: &[Op]) -> Result<(Vec<Result<Answer>>, Option<usize>)> {
        for _ in 0..ATTEMPTS {
            if let Some(done) = self.try_batch(ops).await? {
                return Ok(done);
            }
        }
        // Each attempt lost a race for a request id to another call: rare, and safe to retry.
        Ok((ops.iter().map(|_| Err(busy())).collect(), None))
    }

    /// `None` when another transaction recorded one of the batch's request ids after the
    /// replay lookup: rolled back, and the next attempt answers those lines from the record.
    async fn try_batch(&self, ops: &[Op]) -> Result<Option<(Vec<Result<Answer>>, Option<usize>)>> {
        let mut tx = self.begin().await?;
        // Replays are answered before any lock.
        let recorded = self.find_requests(&mut tx, ops).await?;
        let replays = batch::answer_replays(ops, &recorded);
        let live: Vec<&Op> = ops.iter().zip(&replays).filter(|(_, r)| r.is_none()).map(|(op, _)| op).collect();
        if live.is_empty() {
            tx.commit().await?;
            return Ok(Some((replays.into_iter().flatten().collect(), None)));
        }
        let items: BTreeSet<&str> = live.iter().map(|op| op.item.as_str()).collect();
        let channels: BTreeSet<&str> = live.iter().map(|op| op.channel.as_str()).collect();
        // The Borrows' clock (a batch of Returns only needs none: i64::MAX reads no plan).
        let now_ms = live
            .iter()
            .filter_map(|op| match op.kind {
                batch::OpKind::Borrow(rate) => Some(rate.now_ms),
                batch::OpKind::Return => None,
            })
            .max()
            .unwrap_or(i64::MAX);
        let snap = self.read_snapshot(&mut tx, &items, &channels, now_ms).await?;
        let applied = batch::apply(ops, replays, &snap);
        let mut records = Vec::with_capacity(applied.record.len());
        for &i in &applied.record {
            let answer =
                applied.answers[i].as_ref().map_err(|_| CenterError::Internal("no answer to record".into()))?;
            records.push((&ops[i], answer.to_record()?));
        }
        let fits = [applied.items.len(), applied.allocs.len(), records.len()].iter().all(|&n| n <= CHUNK);
        let recorded = if self.dialect == Dialect::Postgres && fits {
            Self::write_together(&mut tx, &applied.items, &applied.allocs, &records).await?
        } else {
            Self::write_items(&mut tx, &applied.items).await?;
            Self::write_allocs(&mut tx, &applied.allocs).await?;
            Self::put_requests(&mut tx, &records).await?
        };
        if !recorded {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some((applied.answers, applied.stale)))
    }

    async fn find_requests(&self, tx: &mut Tx, ops: &[Op]) -> Result<HashMap<RequestKey, Recorded>> {
        let mut found = HashMap::new();
        for chunk in ops.chunks(CHUNK) {
            let keys: BTreeSet<(String, &str)> =
                chunk.iter().map(|op| (op.mutation().scope(), op.request_id.as_str())).collect();
            let sql = match self.dialect {
                // Each record by its key (`OFFSET 0` keeps the lookup one per key): with
                // statistics behind the table's growth the planner reads every record of
                // the scope (the channel's, all of them) and filters by id.
                Dialect::Postgres => format!(
                    "SELECT r.scope, r.request_id, r.fingerprint, r.response FROM (VALUES {}) AS k(scope, request_id) \
                     CROSS JOIN LATERAL (SELECT * FROM requests WHERE scope = k.scope AND request_id = k.request_id \
                     OFFSET 0) r",
                    value_rows(1, keys.len(), 2)
                ),
                Dialect::Sqlite => format!(
                    "SELECT scope, request_id, fingerprint, response FROM requests WHERE (scope, request_id) IN (VALUES {})",
                    value_rows(1, keys.len(), 2)
                ),
            };
            let mut q = sqlx::query(&sql);
            for (scope, id) in &keys {
                q = q.bind(scope.as_str()).bind(*id);
            }
            for row in q.fetch_all(&mut **tx).await? {
                use sqlx::Row;
                found.insert(
                    (row.try_get("scope")?, row.try_get("request_id")?),
                    Recorded { fingerprint: row.try_get("fingerprint")?, response: row.try_get("response")? },
                );
            }
        }
        Ok(found)
    }

    /// Locks the items (in id order, so two batches never wait on each other in a cycle)
    /// and the channels' rows (key share: only a registration or a reclaim waits), and
    /// reads every allocation of the items with its channel's lease.
    async fn read_snapshot(
        &self,
        tx: &mut Tx,
        items: &BTreeSet<&str>,
        channels: &BTreeSet<&str>,
        now_ms: i64,
    ) -> Result<Snapshot> {
        let mut snap = Snapshot::default();
        let items: Vec<&str> = items.iter().copied().collect();
        for chunk in items.chunks(CHUNK) {
            let sql = format!(
                "{} WHERE item_id IN ({}) ORDER BY item_id{}",
                super::rows::ITEM_SELECT,
                placeholders(1, chunk.len()),
                self.dialect.for_no_key_update()
            );
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            for row in q.fetch_all(&mut **tx).await? {
                let (id, state, ..) = item_from_row(&row)?;
                let shares = shares_from_row(&row)?;
                let plan = plan_from_row(&row)?;
                if !shares.is_empty() || plan.schedule.opens_at_ms > 0 {
                    let (schedule, center_reserve) = (plan.schedule, plan.center_reserve);
                    snap.plans.insert(id.clone(), ItemPlan { shares, schedule, center_reserve, live: Vec::new() });
                }
                snap.items.insert(id, state);
            }
        }
        // The opening allocation splits by the channels selling now: read them only when
        // an item has not opened (its prestock lead, or earlier).
        if snap.plans.values().any(|p| p.schedule.opens_at_ms > now_ms) {
            let sql = "SELECT channel FROM channels WHERE lease_expires_at_ms > $1 ORDER BY channel";
            let live: Vec<String> = sqlx::query_scalar(sql).bind(now_ms).fetch_all(&mut **tx).await?;
            for plan in snap.plans.values_mut().filter(|p| p.schedule.opens_at_ms > now_ms) {
                plan.live.clone_from(&live);
            }
        }
        let channels: Vec<&str> = channels.iter().copied().collect();
        for chunk in channels.chunks(CHUNK) {
            let sql = format!(
                "{} WHERE channel IN ({}) ORDER BY channel{}",
                super::rows::SESSION_SELECT,
                placeholders(1, chunk.len()),
                self.dialect.for_key_share()
            );
            let mut q = sqlx::query(&sql);
            for c in chunk {
                q = q.bind(*c);
            }
            for row in q.fetch_all(&mut **tx).await? {
                use sqlx::Row;
                let s: ChannelSession = session_from_row(&row)?;
                snap.sessions.insert(row.try_get("channel")?, s);
            }
        }
        let found: Vec<&str> = items.iter().copied().filter(|id| snap.items.contains_key(*id)).collect();
        for chunk in found.chunks(CHUNK) {
            let sql = format!(
                "SELECT a.item_id, a.channel, a.granted, a.returned, a.reclaimed, a.reported_available, \
                 a.reported_reserved, a.reported_sold, a.reported_at_ms, a.pool_generation, a.in_doubt, \
                 a.sell_rate_milli, COALESCE(c.lease_expires_at_ms, 0) AS lease_expires_at_ms \
                 FROM {} LEFT JOIN channels c ON c.channel = a.channel",
                self.dialect.rows_of_items("allocations", "a", chunk.len())
            );
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            for row in q.fetch_all(&mut **tx).await? {
                use sqlx::Row;
                let (item, channel, alloc) = alloc_from_row(&row)?;
                let lease_expires_at_ms: i64 = row.try_get("lease_expires_at_ms")?;
                snap.allocs.insert((item, channel), AllocRow { alloc, stored: true, lease_expires_at_ms });
            }
        }
        Ok(snap)
    }

    /// On PostgreSQL, the three writes of [`SqlLedger::write_items`],
    /// [`SqlLedger::write_allocs`] and [`SqlLedger::put_requests`] as one statement
    /// (data-modifying CTEs): one round trip under the items' locks instead of three. Its
    /// answer is theirs: `Err` when an item changed under the lock, `false` when another
    /// transaction recorded one of the request ids first.
    async fn write_together(
        tx: &mut Tx,
        items: &[ItemWrite],
        allocs: &[AllocWrite],
        records: &[(&Op, String)],
    ) -> Result<bool> {
        let mut parts = Vec::new();
        let mut next = 1;
        if !items.is_empty() {
            parts.push(format!(
                "vi (item_id, total, available, written_off, old_total, old_available) AS (VALUES {}), \
                 wi AS ({ITEMS_UPDATE} FROM vi {ITEMS_WHERE} RETURNING 1)",
                value_rows(next, items.len(), 6)
            ));
            next += items.len() * 6;
        }
        if !allocs.is_empty() {
            parts.push(format!(
                "va (item_id, channel, granted, returned, reclaimed, sell_rate_milli) AS (VALUES {}), \
                 wa AS ({ALLOCS_INSERT} SELECT * FROM va {ALLOCS_CONFLICT} RETURNING 1)",
                value_rows(next, allocs.len(), 6)
            ));
            next += allocs.len() * 6;
        }
        if !records.is_empty() {
            parts.push(format!(
                "vr (scope, request_id, fingerprint, response, created_at_ms, channel, epoch) AS (VALUES {}), \
                 wr AS ({REQUESTS_INSERT} SELECT * FROM vr {REQUESTS_CONFLICT} RETURNING 1)",
                value_rows(next, records.len(), 7)
            ));
        }
        if parts.is_empty() {
            return Ok(true);
        }
        let count =
            |written: bool, cte: &str| if written { format!("(SELECT count(*) FROM {cte})") } else { "0".into() };
        let sql = format!(
            "WITH {} SELECT {} AS items, {} AS requests",
            parts.join(", "),
            count(!items.is_empty(), "wi"),
            count(!records.is_empty(), "wr")
        );
        let q = bind_requests(bind_allocs(bind_items(sqlx::query(&sql), items)?, allocs)?, records)?;
        use sqlx::Row;
        let row = q.fetch_one(&mut **tx).await?;
        let (updated, recorded): (i64, i64) = (row.try_get("items")?, row.try_get("requests")?);
        if usize::try_from(updated).ok() != Some(items.len()) {
            return Err(CenterError::Internal("an item changed under a held lock".into()));
        }
        Ok(usize::try_from(recorded).ok() == Some(records.len()))
    }

    /// Conditional updates: each applies only if the row still holds what was read.
    async fn write_items(tx: &mut Tx, items: &[ItemWrite]) -> Result<()> {
        for chunk in items.chunks(CHUNK) {
            let sql = format!(
                "WITH vi (item_id, total, available, written_off, old_total, old_available) AS (VALUES {}) \
                 {ITEMS_UPDATE} FROM vi {ITEMS_WHERE}",
                value_rows(1, chunk.len(), 6)
            );
            let done = bind_items(sqlx::query(&sql), chunk)?.execute(&mut **tx).await?;
            if done.rows_affected() != chunk.len() as u64 {
                return Err(CenterError::Internal("an item changed under a held lock".into()));
            }
        }
        Ok(())
    }

    /// The movement counters, and the sell rate a Borrow gave (reported fields belong to
    /// heartbeats). A rate of -1 keeps the stored one: only rows that exist get it.
    async fn write_allocs(tx: &mut Tx, allocs: &[AllocWrite]) -> Result<()> {
        for chunk in allocs.chunks(CHUNK) {
            let sql = format!("{ALLOCS_INSERT} VALUES {} {ALLOCS_CONFLICT}", value_rows(1, chunk.len(), 6));
            bind_allocs(sqlx::query(&sql), chunk)?.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Records the first answers; false when another transaction recorded one of the ids
    /// first (`DO NOTHING` waits for it and does not abort this transaction).
    async fn put_requests(tx: &mut Tx, records: &[(&Op, String)]) -> Result<bool> {
        for chunk in records.chunks(CHUNK) {
            let sql = format!("{REQUESTS_INSERT} VALUES {} {REQUESTS_CONFLICT}", value_rows(1, chunk.len(), 7));
            if bind_requests(sqlx::query(&sql), chunk)?.execute(&mut **tx).await?.rows_affected() != chunk.len() as u64
            {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;
type ItemWrite = (String, ItemState, ItemState);

// The three writes of a batch, as statements of their own (any engine) and as the CTEs of
// one statement (PostgreSQL). The items' values come as `vi`.
const ITEMS_UPDATE: &str = "UPDATE items SET total = vi.total, available = vi.available, written_off = vi.written_off";
const ITEMS_WHERE: &str =
    "WHERE items.item_id = vi.item_id AND items.total = vi.old_total AND items.available = vi.old_available";
const ALLOCS_INSERT: &str = "INSERT INTO allocations (item_id, channel, granted, returned, reclaimed, sell_rate_milli)";
const ALLOCS_CONFLICT: &str = "ON CONFLICT (item_id, channel) DO UPDATE SET granted = excluded.granted, \
     returned = excluded.returned, reclaimed = excluded.reclaimed, sell_rate_milli = CASE \
     WHEN excluded.sell_rate_milli < 0 THEN allocations.sell_rate_milli ELSE excluded.sell_rate_milli END";
const REQUESTS_INSERT: &str =
    "INSERT INTO requests (scope, request_id, fingerprint, response, created_at_ms, channel, epoch)";
const REQUESTS_CONFLICT: &str = "ON CONFLICT (scope, request_id) DO NOTHING";

/// Six values an item: id, the new total, available and written off, the old total and
/// available (the update applies only if the row still holds those).
fn bind_items<'q>(mut q: Query<'q>, items: &'q [ItemWrite]) -> Result<Query<'q>> {
    for (id, before, after) in items {
        q = q
            .bind(id.as_str())
            .bind(to_db("total", after.total)?)
            .bind(to_db("available", after.available)?)
            .bind(to_db("written_off", after.written_off)?)
            .bind(to_db("total", before.total)?)
            .bind(to_db("available", before.available)?);
    }
    Ok(q)
}

/// Six values an allocation; a sell rate of -1 keeps the stored one.
fn bind_allocs<'q>(mut q: Query<'q>, allocs: &'q [AllocWrite]) -> Result<Query<'q>> {
    for w in allocs {
        let rate = match w.sell_rate {
            Some(r) => to_db("sell_rate_milli", r)?,
            None => -1,
        };
        q = q
            .bind(w.item.as_str())
            .bind(w.channel.as_str())
            .bind(to_db("granted", w.alloc.granted)?)
            .bind(to_db("returned", w.alloc.returned)?)
            .bind(to_db("reclaimed", w.alloc.reclaimed)?)
            .bind(rate);
    }
    Ok(q)
}

/// Seven values a request record.
fn bind_requests<'q>(mut q: Query<'q>, records: &'q [(&Op, String)]) -> Result<Query<'q>> {
    let now = crate::clock::now_ms();
    for (op, response) in records {
        let m = op.mutation();
        q = q
            .bind(m.scope())
            .bind(op.request_id.as_str())
            .bind(m.fingerprint())
            .bind(response.as_str())
            .bind(now)
            .bind(op.channel.as_str())
            .bind(to_db("epoch", op.epoch)?);
    }
    Ok(q)
}

fn busy() -> CenterError {
    CenterError::Unavailable("request id busy, retry with the same request id".into())
}
