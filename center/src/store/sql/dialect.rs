//! The connection and the differences between the two engines.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Executor;
use sqlx::any::AnyPoolOptions;

use super::SqlLedger;
use super::rows::{ITEM_SELECT, SESSION_SELECT};
use super::server::{SERVER_STARTED, ServerIdentity};
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

    pub(super) fn for_update(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR UPDATE",
            Dialect::Sqlite => "",
        }
    }

    /// Conflicts only with FOR UPDATE. (SQLite has one writer at a time: no row locks.)
    pub(super) fn for_key_share(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR KEY SHARE",
            Dialect::Sqlite => "",
        }
    }

    /// Conflicts with itself and FOR UPDATE, not with FOR KEY SHARE.
    pub(super) fn for_no_key_update(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR NO KEY UPDATE",
            Dialect::Sqlite => "",
        }
    }

    /// A derived table `alias` of every row of `table` of the items bound at
    /// `$1..=$items`, each item's looked up by key. On PostgreSQL a lateral lookup per
    /// item (`OFFSET 0` keeps it one): with statistics behind the table's growth the
    /// planner filters every row of the table instead, a scan that grows with the
    /// catalogue.
    pub(super) fn rows_of_items(self, table: &str, alias: &str, items: usize) -> String {
        match self {
            Dialect::Postgres => format!(
                "(VALUES {}) AS k(item_id) CROSS JOIN LATERAL (SELECT * FROM {table} WHERE item_id = k.item_id OFFSET 0) {alias}",
                (1..=items).map(|i| format!("(${i})")).collect::<Vec<_>>().join(", ")
            ),
            Dialect::Sqlite => {
                format!("(SELECT * FROM {table} WHERE item_id IN ({})) {alias}", super::rows::placeholders(1, items))
            }
        }
    }

    /// `LEFT JOIN` of the one row of `table` (as `alias`) that `on` finds by its primary
    /// key from the row of the outer query. On PostgreSQL a lateral lookup with `LIMIT 1`:
    /// the planner cannot turn it into a join that reads every row of the channel, which it
    /// does with a plain join when its statistics lag behind the tables' growth (a catalogue
    /// created minutes ago, autovacuum late or off).
    pub(super) fn join_one(self, table: &str, alias: &str, on: &str) -> String {
        match self {
            Dialect::Postgres => {
                format!("LEFT JOIN LATERAL (SELECT * FROM {table} {alias} WHERE {on} LIMIT 1) {alias} ON true")
            }
            Dialect::Sqlite => format!("LEFT JOIN {table} {alias} ON {on}"),
        }
    }
}

/// A column of [`Dialect::json_rows`]: its name and type.
#[derive(Debug, Clone, Copy)]
pub(super) enum JsonCol {
    Text(&'static str),
    Int(&'static str),
}

impl Dialect {
    /// A derived table `r` of the rows of the JSON array of objects bound at `$param`, with
    /// `columns` (each object's keys): a statement of one parameter reads or writes any
    /// number of rows, set-based (PostgreSQL `json_to_recordset`, SQLite `json_each`).
    pub(super) fn json_rows(self, param: usize, columns: &[JsonCol]) -> String {
        let list = |f: &dyn Fn(&JsonCol) -> String| columns.iter().map(f).collect::<Vec<_>>().join(", ");
        match self {
            Dialect::Postgres => format!(
                "json_to_recordset(${param}::json) AS r({})",
                list(&|c| match c {
                    JsonCol::Text(n) => format!("{n} TEXT"),
                    JsonCol::Int(n) => format!("{n} BIGINT"),
                })
            ),
            Dialect::Sqlite => format!(
                "(SELECT {} FROM json_each(${param})) AS r",
                list(&|c| {
                    let (JsonCol::Text(n) | JsonCol::Int(n)) = c;
                    format!("json_extract(value, '$.{n}') AS {n}")
                })
            ),
        }
    }
}

/// Statements whose text depends on the dialect, built once.
pub(super) struct Queries {
    /// An item's movements: exclude each other, not the key-share lock a foreign key check
    /// of another transaction's allocation insert takes (a report of another item's pool
    /// must not wait for a Borrow, nor wait in a cycle with one).
    pub(super) lock_item: String,
    /// Borrow, Return, reports, loss: exclude only a new registration or a reclaim.
    pub(super) lock_channel_share: String,
    /// Lease renewal: excludes registration, reclaim and other renewals, not borrows.
    pub(super) lock_channel_renew: String,
    /// Registration and reclaim: exclude everything else on the channel.
    pub(super) lock_channel_update: String,
    /// A chunk of pool reports: the channel's rows of the chunk's items ($1 the channel,
    /// $2 the items as `[{"item_id": ..}]`), and whether each item exists.
    pub(super) report_rows: String,
    /// A chunk of pool reports stored ($1 channel, $2 time, $3 the reports).
    pub(super) report_write: String,
    /// Write sequences raised, never lowered ($1 channel, $2 `[{item_id, segment, write_seq}]`).
    pub(super) write_seqs_raise: String,
}

impl Queries {
    pub(super) fn new(d: Dialect) -> Self {
        Self {
            lock_item: format!("{ITEM_SELECT} WHERE item_id = $1{}", d.for_no_key_update()),
            lock_channel_share: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_key_share()),
            lock_channel_renew: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_no_key_update()),
            lock_channel_update: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_update()),
            report_rows: report_rows(d),
            // `WHERE true`: SQLite reads ON CONFLICT after a bare SELECT as a join's ON.
            report_write: format!(
                "INSERT INTO allocations (item_id, channel, reported_available, reported_reserved, reported_sold, \
                 reported_at_ms, pool_generation, sell_rate_milli, reported_segments) \
                 SELECT r.item_id, $1, r.available, r.reserved, r.sold, $2, r.generation, r.sell_rate_milli, \
                 r.segments FROM {} WHERE true \
                 ON CONFLICT (item_id, channel) DO UPDATE SET \
                 reported_available = excluded.reported_available, reported_reserved = excluded.reported_reserved, \
                 reported_sold = excluded.reported_sold, reported_at_ms = excluded.reported_at_ms, \
                 pool_generation = excluded.pool_generation, sell_rate_milli = excluded.sell_rate_milli, \
                 reported_segments = excluded.reported_segments",
                d.json_rows(
                    3,
                    &[
                        JsonCol::Text("item_id"),
                        JsonCol::Int("available"),
                        JsonCol::Int("reserved"),
                        JsonCol::Int("sold"),
                        JsonCol::Int("generation"),
                        JsonCol::Int("sell_rate_milli"),
                        JsonCol::Text("segments"),
                    ]
                )
            ),
            write_seqs_raise: format!(
                "INSERT INTO pool_write_seqs (item_id, channel, segment, write_seq) \
                 SELECT r.item_id, $1, r.segment, r.write_seq FROM {} WHERE true \
                 ON CONFLICT (channel, item_id, segment) DO UPDATE SET write_seq = excluded.write_seq \
                 WHERE excluded.write_seq > pool_write_seqs.write_seq",
                d.json_rows(2, &[JsonCol::Text("item_id"), JsonCol::Int("segment"), JsonCol::Int("write_seq")])
            ),
        }
    }
}

/// [`Queries::report_rows`]. Each report's rows are found by key, whatever the chunk's and
/// the tables' sizes ([`Dialect::join_one`]); SQLite looks up each row of `json_each` by
/// the primary keys.
fn report_rows(d: Dialect) -> String {
    const LINE: &str = "item_id, channel, granted, returned, reclaimed, reported_available, reported_reserved, \
         reported_sold, reported_at_ms, pool_generation, in_doubt, sell_rate_milli";
    let rows = d.json_rows(2, &[JsonCol::Text("item_id")]);
    let items = d.join_one("items", "i", "i.item_id = r.item_id");
    let lines = d.join_one("allocations", "a", "a.item_id = r.item_id AND a.channel = $1");
    let cols = LINE.split(", ").map(|c| format!("a.{}", c.trim())).collect::<Vec<_>>().join(", ");
    format!("SELECT r.item_id AS asked, i.item_id AS known, {cols} FROM {rows} {items} {lines}")
}

/// Connections of a SQLite ledger's read pool.
const SQLITE_READERS: u32 = 4;

/// Opens the database named by `url`, creating a SQLite file if needed, and runs the
/// dialect's migrations.
pub async fn connect(url: &str) -> std::result::Result<SqlLedger, CenterError> {
    sqlx::any::install_default_drivers();
    let dialect = Dialect::from_url(url)
        .map_err(|e| CenterError::Invalid(inventory_core::ValidationError::new("database_url", url, e)))?;
    let server = Arc::new(ServerIdentity::default());
    let (pool, read_url) = match dialect {
        Dialect::Postgres => {
            let seen = Arc::clone(&server);
            let pool = AnyPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(5))
                .after_connect(move |conn, _| {
                    let seen = Arc::clone(&seen);
                    Box::pin(async move {
                        let started: String = sqlx::query_scalar(SERVER_STARTED).fetch_one(&mut *conn).await?;
                        seen.saw(&started);
                        Ok(())
                    })
                })
                .connect(url)
                .await?;
            (pool, None)
        }
        Dialect::Sqlite => {
            let url = if url.contains("mode=") {
                url.to_owned()
            } else if url.contains('?') {
                format!("{url}&mode=rwc")
            } else {
                format!("{url}?mode=rwc")
            };
            // One writing connection: SQLite has one writer anyway, and this makes every
            // transaction strictly serial.
            let pool = AnyPoolOptions::new()
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
                .await?;
            // An in-memory database exists only in its one connection.
            let in_memory = url.contains(":memory:") || url.contains("mode=memory");
            (pool, (!in_memory).then_some(url))
        }
    };
    let migrated = match dialect {
        Dialect::Postgres => sqlx::migrate!("../migrations/postgres").run(&pool).await,
        Dialect::Sqlite => sqlx::migrate!("../migrations/sqlite").run(&pool).await,
    };
    migrated.map_err(|e| CenterError::Database { detail: format!("migration failed: {e}") })?;
    // SQLite: views read through connections of their own. In WAL mode a reader sees the
    // last commit and neither waits for the writer nor holds it up, so a scrape of a big
    // ledger does not stall a Borrow behind the one writing connection.
    let read_pool = match read_url {
        Some(url) => AnyPoolOptions::new().max_connections(SQLITE_READERS).connect(&url).await?,
        None => pool.clone(),
    };
    Ok(SqlLedger {
        pool,
        read_pool,
        dialect,
        server,
        q: std::sync::Arc::new(Queries::new(dialect)),
        groups: Default::default(),
    })
}
