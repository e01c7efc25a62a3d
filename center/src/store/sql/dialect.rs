//! The connection and the differences between the two engines.

use std::time::Duration;

use sqlx::Executor;
use sqlx::any::AnyPoolOptions;

use super::SqlLedger;
use super::rows::{ITEM_SELECT, SESSION_SELECT};
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
}

impl Queries {
    pub(super) fn new(d: Dialect) -> Self {
        Self {
            lock_item: format!("{ITEM_SELECT} WHERE item_id = $1{}", d.for_no_key_update()),
            lock_channel_share: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_key_share()),
            lock_channel_renew: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_no_key_update()),
            lock_channel_update: format!("{SESSION_SELECT} WHERE channel = $1{}", d.for_update()),
        }
    }
}

/// Connections of a SQLite ledger's read pool.
const SQLITE_READERS: u32 = 4;

/// Opens the database named by `url`, creating a SQLite file if needed, and runs the
/// dialect's migrations.
pub async fn connect(url: &str) -> std::result::Result<SqlLedger, CenterError> {
    sqlx::any::install_default_drivers();
    let dialect = Dialect::from_url(url)
        .map_err(|e| CenterError::Invalid(inventory_core::ValidationError::new("database_url", url, e)))?;
    let (pool, read_url) = match dialect {
        Dialect::Postgres => (
            AnyPoolOptions::new().max_connections(16).acquire_timeout(Duration::from_secs(5)).connect(url).await?,
            None,
        ),
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
        q: std::sync::Arc::new(Queries::new(dialect)),
        groups: Default::default(),
    })
}
