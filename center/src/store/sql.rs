//! The ledger over sqlx, for PostgreSQL and SQLite.
//!
//! One body of SQL serves both engines; [`Dialect`] holds the differences:
//! - PostgreSQL: each mutation locks the item row with `SELECT ... FOR UPDATE` (and the
//!   channel row `FOR SHARE`), so concurrent center replicas serialise per item;
//! - SQLite: a single connection is the single writer; row locks do not exist and are not
//!   needed.
//!
//! In both, the write is a conditional `UPDATE ... WHERE available = <value read>` so a
//! missing lock would show up as an error rather than as a lost update.
//!
//! SQL text never contains request data: every value is a bind parameter.

use std::time::Duration;

use async_trait::async_trait;
use inventory_core::ledger::{self, Allocation, ChannelSession, ItemState, Mutation, PoolCounts};
use inventory_core::watermarks::Watermarks;
use inventory_core::{AgentId, Channel, ItemId, Quantity, RequestId};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Executor, Row, Transaction};

use super::{
    BorrowOutcome, ChannelRecord, ChannelView, Holding, ItemLedger, ItemPolicy, ItemRecord, LedgerStore, NewItem,
    PoolReportIn, ReclaimOutcome, Reconciliation, Registration, Result, ReturnOutcome,
};
use crate::error::CenterError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Sqlite,
}

impl Dialect {
    pub fn from_url(url: &str) -> std::result::Result<Self, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Dialect::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Dialect::Sqlite)
        } else {
            Err(format!("invalid database_url {:?}: expected postgres://... or sqlite://...", url))
        }
    }

    fn for_update(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR UPDATE",
            Dialect::Sqlite => "",
        }
    }

    /// Conflicts only with FOR UPDATE. (SQLite has one writer at a time: no row locks.)
    fn for_key_share(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR KEY SHARE",
            Dialect::Sqlite => "",
        }
    }

    /// Conflicts with itself and FOR UPDATE, not with FOR KEY SHARE.
    fn for_no_key_update(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR NO KEY UPDATE",
            Dialect::Sqlite => "",
        }
    }
}

/// Statements whose text depends on the dialect, built once.
struct Queries {
    lock_item: String,
    /// Borrow, Return, reports, loss: exclude only a new registration or a reclaim.
    lock_channel_share: String,
    /// Lease renewal: excludes registration, reclaim and other renewals, not borrows.
    lock_channel_renew: String,
    /// Registration and reclaim: exclude everything else on the channel.
    lock_channel_update: String,
}

impl Queries {
    fn new(d: Dialect) -> Self {
        Self {
            lock_item: format!("{ITEM_SELECT} WHERE item_id = $1{}", d.for_update()),
            lock_channel_share: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_key_share()),
            lock_channel_renew: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_no_key_update()),
            lock_channel_update: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_update()),
        }
    }
}

const ITEM_SELECT: &str = "SELECT item_id, total, available, per_user_limit, reservation_ttl_ms, closed, \
     wm_low, wm_high, wm_batch, written_off FROM items";
const SESSION_SELECT: &str = "SELECT channel, epoch, agent_id, lease_expires_at_ms, last_heartbeat_ms FROM channels";
const ALLOC_SELECT: &str = "SELECT item_id, channel, granted, returned, reclaimed, reported_available, \
     reported_reserved, reported_sold, reported_at_ms, pool_generation, in_doubt FROM allocations";

pub struct SqlLedger {
    pool: AnyPool,
    dialect: Dialect,
    q: Queries,
}

/// Opens the database named by `url`, creating a SQLite file if needed, and runs the
/// dialect's migrations.
pub async fn connect(url: &str) -> std::result::Result<SqlLedger, CenterError> {
    sqlx::any::install_default_drivers();
    let dialect = Dialect::from_url(url)
        .map_err(|e| CenterError::Invalid(inventory_core::ValidationError::new("database_url", url, e)))?;
    let pool = match dialect {
        Dialect::Postgres => {
            AnyPoolOptions::new().max_connections(16).acquire_timeout(Duration::from_secs(5)).connect(url).await?
        }
        Dialect::Sqlite => {
            let url = if url.contains("mode=") {
                url.to_owned()
            } else if url.contains('?') {
                format!("{url}&mode=rwc")
            } else {
                format!("{url}?mode=rwc")
            };
            // One connection: SQLite has one writer anyway, and this makes every
            // transaction strictly serial.
            AnyPoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA synchronous = FULL").await?;
                        Ok(())
                    })
                })
                .connect(&url)
                .await?
        }
    };
    let migrated = match dialect {
        Dialect::Postgres => sqlx::migrate!("../migrations/postgres").run(&pool).await,
        Dialect::Sqlite => sqlx::migrate!("../migrations/sqlite").run(&pool).await,
    };
    migrated.map_err(|e| CenterError::Unavailable(format!("database migration failed: {e}")))?;
    Ok(SqlLedger { pool, dialect, q: Queries::new(dialect) })
}

fn u(v: i64) -> u64 {
    // Columns are CHECKed non-negative; a negative value here is corruption, shown as 0
    // and caught by reconcile.
    v.max(0) as u64
}

/// Pool reports written per INSERT (7 parameters each; PostgreSQL allows 65,535).
const REPORT_ROWS_PER_STATEMENT: usize = 500;

/// `$first, $first+1, ...`: `count` bind placeholders for an `IN (...)` list.
fn placeholders(first: usize, count: usize) -> String {
    (first..first + count).map(|n| format!("${n}")).collect::<Vec<_>>().join(", ")
}

fn i(v: u64) -> i64 {
    v as i64
}

fn item_from_row(row: &AnyRow) -> Result<(String, ItemState, Watermarks)> {
    Ok((
        row.try_get("item_id")?,
        ItemState {
            total: u(row.try_get("total")?),
            available: u(row.try_get("available")?),
            per_user_limit: u(row.try_get("per_user_limit")?),
            reservation_ttl_ms: u(row.try_get("reservation_ttl_ms")?),
            closed: row.try_get::<i64, _>("closed")? != 0,
            written_off: u(row.try_get("written_off")?),
        },
        Watermarks {
            low: u(row.try_get("wm_low")?),
            high: u(row.try_get("wm_high")?),
            batch: u(row.try_get("wm_batch")?),
        },
    ))
}

fn session_from_row(row: &AnyRow) -> Result<ChannelSession> {
    Ok(ChannelSession {
        epoch: u(row.try_get("epoch")?),
        agent_id: row.try_get("agent_id")?,
        lease_expires_at_ms: row.try_get("lease_expires_at_ms")?,
        last_heartbeat_ms: row.try_get("last_heartbeat_ms")?,
    })
}

fn alloc_from_row(row: &AnyRow) -> Result<(String, String, Allocation)> {
    Ok((
        row.try_get("item_id")?,
        row.try_get("channel")?,
        Allocation {
            granted: u(row.try_get("granted")?),
            returned: u(row.try_get("returned")?),
            reclaimed: u(row.try_get("reclaimed")?),
            reported: PoolCounts {
                available: u(row.try_get("reported_available")?),
                reserved: u(row.try_get("reported_reserved")?),
                sold: u(row.try_get("reported_sold")?),
            },
            reported_at_ms: row.try_get("reported_at_ms")?,
            generation: u(row.try_get("pool_generation")?),
            in_doubt: u(row.try_get("in_doubt")?),
        },
    ))
}

fn stale_or_unknown(channel: &Channel, session: Option<&ChannelSession>, epoch: u64) -> Result<()> {
    match session {
        None => Err(CenterError::Precondition(format!(
            "stale epoch {epoch} for channel {channel}: channel is not registered"
        ))),
        Some(s) => Ok(s.check_epoch(channel, epoch)?),
    }
}

type Tx = Transaction<'static, Any>;

impl SqlLedger {
    /// The connection pool (for NOTIFY of events on PostgreSQL).
    pub fn pool(&self) -> AnyPool {
        self.pool.clone()
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    async fn lock_item(&self, tx: &mut Tx, item: &ItemId) -> Result<(ItemState, Watermarks)> {
        let row = sqlx::query(&self.q.lock_item).bind(item.as_str()).fetch_optional(&mut **tx).await?;
        let row = row.ok_or_else(|| CenterError::item_not_found(item.as_str()))?;
        let (_, state, wm) = item_from_row(&row)?;
        Ok((state, wm))
    }

    /// Stores one chunk of pool reports (every item must exist).
    async fn write_reports(tx: &mut Tx, channel: &Channel, chunk: &[&PoolReportIn], now_ms: i64) -> Result<()> {
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
                .bind(i(pool.available))
                .bind(i(pool.reserved))
                .bind(i(pool.sold))
                .bind(now_ms)
                .bind(i(*generation));
        }
        query.execute(&mut **tx).await?;
        Ok(())
    }

    async fn session(&self, tx: &mut Tx, channel: &Channel, lock: &str) -> Result<Option<ChannelSession>> {
        let row = sqlx::query(lock).bind(channel.as_str()).fetch_optional(&mut **tx).await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn alloc(tx: &mut Tx, item: &str, channel: &str) -> Result<Allocation> {
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
    async fn write_item(tx: &mut Tx, item: &str, before: &ItemState, after: &ItemState) -> Result<()> {
        let done = sqlx::query(
            "UPDATE items SET total = $1, available = $2, written_off = $6 \
             WHERE item_id = $3 AND total = $4 AND available = $5",
        )
        .bind(i(after.total))
        .bind(i(after.available))
        .bind(item)
        .bind(i(before.total))
        .bind(i(before.available))
        .bind(i(after.written_off))
        .execute(&mut **tx)
        .await?;
        if done.rows_affected() != 1 {
            return Err(CenterError::Internal(format!("item {item} changed under a held lock")));
        }
        Ok(())
    }

    /// Writes the movement counters only; reported fields belong to heartbeats.
    async fn write_movements(tx: &mut Tx, item: &str, channel: &str, a: &Allocation) -> Result<()> {
        sqlx::query(
            "INSERT INTO allocations (item_id, channel, granted, returned, reclaimed) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (item_id, channel) DO UPDATE SET granted = excluded.granted, \
             returned = excluded.returned, reclaimed = excluded.reclaimed",
        )
        .bind(item)
        .bind(channel)
        .bind(i(a.granted))
        .bind(i(a.returned))
        .bind(i(a.reclaimed))
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// The one transaction behind Borrow and Return: lock the item row, answer a replay
    /// with the stored first answer, check the epoch, apply `rule` to the item and the
    /// channel's allocation, write what changed, and record the answer under the request id.
    /// Returns the answer and whether it was a replay.
    async fn movement<T, F>(
        &self,
        item: &ItemId,
        channel: &Channel,
        epoch: u64,
        m: &Mutation,
        request_id: &RequestId,
        rule: F,
    ) -> Result<(T, bool)>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(&mut ItemState, &mut Allocation) -> Result<T>,
    {
        let mut tx = self.begin().await?;
        let (before, _) = self.lock_item(&mut tx, item).await?;
        if let Some(first) = Self::find_request::<T>(&mut tx, m, request_id).await? {
            return Ok((first, true));
        }
        let session = self.session(&mut tx, channel, &self.q.lock_channel_share).await?;
        stale_or_unknown(channel, session.as_ref(), epoch)?;
        let mut alloc = Self::alloc(&mut tx, item.as_str(), channel.as_str()).await?;
        let mut after = before.clone();
        let outcome = rule(&mut after, &mut alloc)?;
        if after != before {
            Self::write_item(&mut tx, item.as_str(), &before, &after).await?;
            Self::write_movements(&mut tx, item.as_str(), channel.as_str(), &alloc).await?;
        }
        Self::put_request(&mut tx, m, request_id, &outcome).await?;
        tx.commit().await?;
        Ok((outcome, false))
    }

    /// Writes the in-doubt state and the report fields it resets.
    async fn write_doubt(tx: &mut Tx, item: &str, channel: &str, a: &Allocation) -> Result<()> {
        sqlx::query(
            "UPDATE allocations SET in_doubt = $1, reported_available = $2, reported_reserved = $3, \
             reported_sold = $4, pool_generation = $5 WHERE item_id = $6 AND channel = $7",
        )
        .bind(i(a.in_doubt))
        .bind(i(a.reported.available))
        .bind(i(a.reported.reserved))
        .bind(i(a.reported.sold))
        .bind(i(a.generation))
        .bind(item)
        .bind(channel)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn find_request<T: DeserializeOwned>(tx: &mut Tx, m: &Mutation, request_id: &RequestId) -> Result<Option<T>> {
        let row = sqlx::query("SELECT fingerprint, response FROM requests WHERE scope = $1 AND request_id = $2")
            .bind(m.scope())
            .bind(request_id.as_str())
            .fetch_optional(&mut **tx)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let fingerprint: String = row.try_get("fingerprint")?;
        if fingerprint != m.fingerprint() {
            return Err(CenterError::AlreadyExists(format!(
                "request_id {:?} was already used for another request ({fingerprint})",
                request_id.as_str()
            )));
        }
        let response: String = row.try_get("response")?;
        serde_json::from_str(&response)
            .map(Some)
            .map_err(|e| CenterError::Internal(format!("stored response of {request_id} unreadable: {e}")))
    }

    async fn put_request<T: Serialize>(tx: &mut Tx, m: &Mutation, request_id: &RequestId, answer: &T) -> Result<()> {
        let response = serde_json::to_string(answer).map_err(|e| CenterError::Internal(e.to_string()))?;
        sqlx::query(
            "INSERT INTO requests (scope, request_id, fingerprint, response, created_at_ms) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(m.scope())
        .bind(request_id.as_str())
        .bind(m.fingerprint())
        .bind(response)
        .bind(crate::clock::now_ms())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn sum_held(&self, tx: &mut Tx, item: &str) -> Result<u64> {
        let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE item_id = $1")).bind(item).fetch_all(&mut **tx).await?;
        let mut held = 0;
        for row in &rows {
            held += alloc_from_row(row)?.2.held();
        }
        Ok(held)
    }

    async fn item_record(&self, tx: &mut Tx, item: &ItemId) -> Result<ItemRecord> {
        let row = sqlx::query(&format!("{ITEM_SELECT} WHERE item_id = $1"))
            .bind(item.as_str())
            .fetch_optional(&mut **tx)
            .await?
            .ok_or_else(|| CenterError::item_not_found(item.as_str()))?;
        let (item_id, state, watermarks) = item_from_row(&row)?;
        let held = self.sum_held(tx, &item_id).await?;
        Ok(ItemRecord { item_id, state, watermarks, held })
    }

    async fn override_for(tx: &mut Tx, item: &str, channel: &str) -> Result<Option<Watermarks>> {
        let row = sqlx::query("SELECT low, high, batch FROM watermark_overrides WHERE item_id = $1 AND channel = $2")
            .bind(item)
            .bind(channel)
            .fetch_optional(&mut **tx)
            .await?;
        row.map(|r| -> Result<Watermarks> {
            Ok(Watermarks { low: u(r.try_get("low")?), high: u(r.try_get("high")?), batch: u(r.try_get("batch")?) })
        })
        .transpose()
    }

    async fn begin(&self) -> Result<Tx> {
        Ok(self.pool.begin().await?)
    }

    /// A read-only transaction that sees one snapshot for all its statements, so a
    /// view never mixes an item row from before a Borrow with allocations from after.
    async fn begin_read(&self) -> Result<Tx> {
        let mut tx = self.pool.begin().await?;
        if self.dialect == Dialect::Postgres {
            tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").await?;
        }
        Ok(tx)
    }
}

#[async_trait]
impl LedgerStore for SqlLedger {
    async fn create_item(&self, new: &NewItem, now_ms: i64) -> Result<(ItemRecord, bool)> {
        let mut tx = self.begin().await?;
        let state = ItemState::new(new.total, new.per_user_limit, new.reservation_ttl_ms);
        // ON CONFLICT DO NOTHING makes concurrent creates safe; the loser compares.
        let inserted = sqlx::query(
            "INSERT INTO items (item_id, total, available, per_user_limit, reservation_ttl_ms, closed, \
             wm_low, wm_high, wm_batch, created_at_ms) VALUES ($1, $2, $3, $4, $5, 0, $6, $7, $8, $9) \
             ON CONFLICT (item_id) DO NOTHING",
        )
        .bind(new.item_id.as_str())
        .bind(i(state.total))
        .bind(i(state.available))
        .bind(i(state.per_user_limit))
        .bind(i(state.reservation_ttl_ms))
        .bind(i(new.watermarks.low))
        .bind(i(new.watermarks.high))
        .bind(i(new.watermarks.batch))
        .bind(now_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let record = self.item_record(&mut tx, &new.item_id).await?;
        tx.commit().await?;
        if !inserted {
            // The definition is what was asked at creation; stock added since does not count.
            let same = record.state.per_user_limit == new.per_user_limit
                && record.state.reservation_ttl_ms == new.reservation_ttl_ms;
            let same_total = record.state.total == new.total.get();
            if !(same && same_total) {
                return Err(CenterError::AlreadyExists(format!(
                    "item {:?} already exists with total {}, per_user_limit {}, reservation_ttl_ms {}",
                    new.item_id.as_str(),
                    record.state.total,
                    record.state.per_user_limit,
                    record.state.reservation_ttl_ms
                )));
            }
        }
        Ok((record, inserted))
    }

    async fn add_stock(&self, item: &ItemId, quantity: Quantity, request_id: &RequestId) -> Result<(ItemRecord, bool)> {
        let m = Mutation::AddStock { item: item.clone(), quantity };
        let mut tx = self.begin().await?;
        let (before, _) = self.lock_item(&mut tx, item).await?;
        let replayed = if Self::find_request::<()>(&mut tx, &m, request_id).await?.is_some() {
            true
        } else {
            let mut after = before.clone();
            ledger::add_stock(&mut after, quantity)?;
            Self::write_item(&mut tx, item.as_str(), &before, &after).await?;
            Self::put_request(&mut tx, &m, request_id, &()).await?;
            false
        };
        let record = self.item_record(&mut tx, item).await?;
        tx.commit().await?;
        Ok((record, replayed))
    }

    async fn register(
        &self,
        channel: &Channel,
        agent: &AgentId,
        now_ms: i64,
        lease_ttl_ms: u64,
    ) -> Result<Registration> {
        let mut tx = self.begin().await?;
        let previous = self.session(&mut tx, channel, &self.q.lock_channel_update).await?;
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
        .bind(i(session.epoch))
        .bind(&session.agent_id)
        .bind(session.lease_expires_at_ms)
        .bind(session.last_heartbeat_ms)
        .fetch_one(&mut *tx)
        .await?;
        let session = ChannelSession { epoch: u(row.try_get("epoch")?), ..session };
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

    async fn borrow(
        &self,
        item: &ItemId,
        channel: &Channel,
        epoch: u64,
        quantity: Quantity,
        request_id: &RequestId,
    ) -> Result<BorrowOutcome> {
        let m = Mutation::Borrow { item: item.clone(), channel: channel.clone(), quantity };
        let (out, replayed) = self
            .movement(item, channel, epoch, &m, request_id, |after, alloc| {
                let granted = ledger::borrow(after, alloc, quantity);
                Ok(BorrowOutcome { granted, center_available: after.available, replayed: false })
            })
            .await?;
        Ok(BorrowOutcome { replayed, ..out })
    }

    async fn give_back(
        &self,
        item: &ItemId,
        channel: &Channel,
        epoch: u64,
        quantity: Quantity,
        request_id: &RequestId,
    ) -> Result<ReturnOutcome> {
        let m = Mutation::Return { item: item.clone(), channel: channel.clone(), quantity };
        let (out, replayed) = self
            .movement(item, channel, epoch, &m, request_id, |after, alloc| {
                ledger::give_back(after, alloc, channel, quantity)?;
                Ok(ReturnOutcome { center_available: after.available, replayed: false })
            })
            .await?;
        Ok(ReturnOutcome { replayed, ..out })
    }

    async fn heartbeat(
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
            let session = self.session(&mut tx, channel, &self.q.lock_channel_share).await?;
            stale_or_unknown(channel, session.as_ref(), epoch)?;
            Self::write_reports(&mut tx, channel, chunk, now_ms).await?;
            tx.commit().await?;
        }
        // Then the lease, and whether this was the agent's last word: set only once every
        // report it sent is stored (a reclaim reads both under FOR UPDATE).
        let mut tx = self.begin().await?;
        let session = self.session(&mut tx, channel, &self.q.lock_channel_renew).await?;
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

    async fn mark_lost(&self, item: &ItemId, channel: &Channel, epoch: u64) -> Result<u64> {
        let mut tx = self.begin().await?;
        self.lock_item(&mut tx, item).await?;
        let session = self.session(&mut tx, channel, &self.q.lock_channel_share).await?;
        stale_or_unknown(channel, session.as_ref(), epoch)?;
        let mut alloc = Self::alloc(&mut tx, item.as_str(), channel.as_str()).await?;
        ledger::mark_lost(&mut alloc);
        Self::write_doubt(&mut tx, item.as_str(), channel.as_str(), &alloc).await?;
        tx.commit().await?;
        Ok(alloc.in_doubt)
    }

    async fn resolve_in_doubt(&self, item: &ItemId, channel: &Channel, sold: u64) -> Result<(ItemRecord, u64)> {
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

    async fn channel_allocations(&self, channel: &Channel, items: &[ItemId]) -> Result<Vec<(String, Allocation)>> {
        let mut out = std::collections::BTreeMap::new();
        let rows = sqlx::query(&format!("{ALLOC_SELECT} WHERE channel = $1 AND in_doubt > 0"))
            .bind(channel.as_str())
            .fetch_all(&self.pool)
            .await?;
        for r in &rows {
            let (item, _, a) = alloc_from_row(r)?;
            out.insert(item, a);
        }
        for chunk in items.chunks(REPORT_ROWS_PER_STATEMENT) {
            let list = placeholders(2, chunk.len());
            let sql = format!("{ALLOC_SELECT} WHERE channel = $1 AND item_id IN ({list})");
            let mut query = sqlx::query(&sql).bind(channel.as_str());
            for item in chunk {
                query = query.bind(item.as_str());
            }
            for r in &query.fetch_all(&self.pool).await? {
                let (item, _, a) = alloc_from_row(r)?;
                out.insert(item, a);
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn channels(&self) -> Result<Vec<ChannelView>> {
        let mut tx = self.begin_read().await?;
        let sessions = sqlx::query(&format!("{SESSION_SELECT} ORDER BY channel")).fetch_all(&mut *tx).await?;
        let allocations = sqlx::query(&format!("{ALLOC_SELECT} ORDER BY channel, item_id")).fetch_all(&mut *tx).await?;
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
                Ok(ChannelView { channel, session, allocations: mine })
            })
            .collect()
    }

    async fn set_closed(&self, item: &ItemId, closed: bool) -> Result<ItemRecord> {
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

    async fn session(&self, channel: &Channel) -> Result<Option<ChannelSession>> {
        let row = sqlx::query(&format!("{SESSION_SELECT} WHERE channel = $1"))
            .bind(channel.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn policy(&self, item: &ItemId, channel: Option<&Channel>) -> Result<ItemPolicy> {
        let mut tx = self.begin_read().await?;
        let record = self.item_record(&mut tx, item).await?;
        let (watermarks, allocation) = match channel {
            Some(c) => (
                Self::override_for(&mut tx, item.as_str(), c.as_str()).await?.unwrap_or(record.watermarks),
                Some(Self::alloc(&mut tx, item.as_str(), c.as_str()).await?),
            ),
            None => (record.watermarks, None),
        };
        tx.commit().await?;
        Ok(ItemPolicy { item: record, watermarks, allocation })
    }

    async fn item_ledger(&self, item: &ItemId) -> Result<ItemLedger> {
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
                session,
                watermarks: overridden.unwrap_or(record.watermarks),
                watermarks_overridden: overridden.is_some(),
            });
        }
        tx.commit().await?;
        Ok(ItemLedger { item: record, channels })
    }

    async fn list_items(&self) -> Result<Vec<ItemRecord>> {
        let mut tx = self.begin_read().await?;
        let rows = sqlx::query(&format!("{ITEM_SELECT} ORDER BY item_id")).fetch_all(&mut *tx).await?;
        let allocations = sqlx::query(&format!("{ALLOC_SELECT} ORDER BY item_id, channel"))
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(alloc_from_row)
            .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        rows.iter()
            .map(|row| {
                let (item_id, state, watermarks) = item_from_row(row)?;
                let held = allocations.iter().filter(|(i, _, _)| *i == item_id).map(|(_, _, a)| a.held()).sum();
                Ok(ItemRecord { item_id, state, watermarks, held })
            })
            .collect()
    }

    async fn set_watermarks(&self, item: &ItemId, channel: Option<&Channel>, wm: Watermarks) -> Result<()> {
        let mut tx = self.begin().await?;
        self.lock_item(&mut tx, item).await?;
        match channel {
            None => {
                sqlx::query("UPDATE items SET wm_low = $1, wm_high = $2, wm_batch = $3 WHERE item_id = $4")
                    .bind(i(wm.low))
                    .bind(i(wm.high))
                    .bind(i(wm.batch))
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
                .bind(i(wm.low))
                .bind(i(wm.high))
                .bind(i(wm.batch))
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn watermarks(&self, item: &ItemId) -> Result<(Watermarks, Vec<(String, Watermarks)>)> {
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
                    Watermarks {
                        low: u(r.try_get("low")?),
                        high: u(r.try_get("high")?),
                        batch: u(r.try_get("batch")?),
                    },
                ))
            })
            .collect::<Result<_>>()?;
        Ok((record.watermarks, overrides))
    }

    async fn reconcile(&self, item: Option<&ItemId>) -> Result<Reconciliation> {
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
            let (item_id, state, _) = item_from_row(row)?;
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

    async fn reclaim(&self, channel: &Channel, now_ms: i64, grace_ms: u64) -> Result<ReclaimOutcome> {
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
            .session(&mut tx, channel, &self.q.lock_channel_update)
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
            .bind(i(session.epoch))
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
                .bind(i(alloc.reclaimed))
                .bind(i(alloc.reported.available))
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
}
