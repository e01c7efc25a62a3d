//! What the center's database promises about its standbys, read at start-up.
//!
//! A grant is a promise the pools act on at once: the agent shelves the units and sells
//! them. If the commit that recorded it is lost (a failover to a standby that had not
//! received it), the ledger forgets units the pools still hold, counts them as available,
//! and lends them again: an oversell. So the center's PostgreSQL must not acknowledge a
//! commit before a standby that could be promoted has it. The center reads the two
//! settings that say so, on its own connection (so settings per database or per role
//! count), and judges them with [`judge`]:
//!
//! - `synchronous_standby_names` must name at least one standby (non-empty): otherwise no
//!   commit waits for any standby, and every streaming standby is asynchronous;
//! - `synchronous_commit` must be `on` or `remote_apply`: with `remote_write` a commit
//!   waits only until the standby's operating system has the WAL, not its disk; with
//!   `local` or `off` it does not wait for a standby at all.
//!
//! A database that fails the judgement draws one warning at start-up, or with
//! `--require-synchronous-replication` refuses the start. What the settings cannot say
//! stays the operator's: with a quorum (`ANY 1 (a, b)`), only a standby that confirmed the
//! commits may be promoted (failover tools pick the most advanced one). On SQLite the flag
//! is refused: a SQLite ledger's copies (backups, file replication) are all asynchronous.

use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::store::Dialect;

/// The settings read from the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationSettings {
    pub synchronous_commit: String,
    pub synchronous_standby_names: String,
}

/// The setting that lets a standby lose commits, and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Risk {
    pub setting: &'static str,
    pub value: String,
}

impl std::fmt::Display for Risk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is '{}'", self.setting, self.value)
    }
}

/// `None` when every commit the database acknowledges is on a synchronous standby's disk
/// (see the module's rule); otherwise the first setting that breaks it.
pub fn judge(settings: &ReplicationSettings) -> Option<Risk> {
    if settings.synchronous_standby_names.trim().is_empty() {
        return Some(Risk { setting: "synchronous_standby_names", value: settings.synchronous_standby_names.clone() });
    }
    match settings.synchronous_commit.trim() {
        "on" | "remote_apply" => None,
        other => Some(Risk { setting: "synchronous_commit", value: other.to_owned() }),
    }
}

/// Why a failover can oversell, for the warning and the refusal.
const CONSEQUENCE: &str = "a failover to an asynchronous standby can lose grants the pools already shelved, and \
                           the center would lend them again (oversell)";

/// Reads the settings (PostgreSQL, on a connection of its own, before the ledger is opened
/// or migrated) and warns, or refuses when `require` is set. On SQLite, `require` is
/// refused and nothing is read. A database that cannot be reached is left to the ledger's
/// own connection to report, unless `require` is set.
pub async fn check(database_url: &str, require: bool) -> anyhow::Result<()> {
    match Dialect::from_url(database_url) {
        Ok(Dialect::Postgres) => {}
        Ok(Dialect::Sqlite) if require => anyhow::bail!(
            "--require-synchronous-replication: a SQLite ledger has no synchronous standby (its copies are all \
             asynchronous); use PostgreSQL with a synchronous standby, or drop the flag"
        ),
        // SQLite without the flag, or a URL the ledger's connection will refuse.
        _ => return Ok(()),
    }
    let settings = match read(database_url).await {
        Ok(settings) => settings,
        Err(e) if require => {
            anyhow::bail!("--require-synchronous-replication: cannot read the database's replication settings: {e}")
        }
        Err(Read::Connect(_)) => return Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the database's replication settings: {CONSEQUENCE}");
            return Ok(());
        }
    };
    match judge(&settings) {
        None => {
            tracing::info!(
                synchronous_commit = %settings.synchronous_commit,
                synchronous_standby_names = %settings.synchronous_standby_names,
                "the database waits for a synchronous standby on every commit"
            );
            Ok(())
        }
        Some(risk) if require => {
            anyhow::bail!("--require-synchronous-replication: {risk}, so a standby can lose commits: {CONSEQUENCE}")
        }
        Some(risk) => {
            tracing::warn!(
                setting = risk.setting,
                value = %risk.value,
                "the database's standbys can lose commits: {CONSEQUENCE}; give it a synchronous standby \
                 (synchronous_standby_names, synchronous_commit on or remote_apply), and see \
                 --require-synchronous-replication"
            );
            Ok(())
        }
    }
}

/// How long reading the settings may take, connection included.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
enum Read {
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Query(String),
}

async fn read(database_url: &str) -> Result<ReplicationSettings, Read> {
    let connect = tokio::time::timeout(READ_TIMEOUT, PgConnection::connect(database_url));
    let mut conn = match connect.await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(Read::Connect(e.to_string())),
        Err(_) => return Err(Read::Connect(format!("no connection within {} ms", READ_TIMEOUT.as_millis()))),
    };
    // One session for both: the values the center's own sessions get, per-role and
    // per-database settings included.
    let read = async {
        let synchronous_commit =
            sqlx::query_scalar::<_, String>("SHOW synchronous_commit").fetch_one(&mut conn).await?;
        let synchronous_standby_names =
            sqlx::query_scalar::<_, String>("SHOW synchronous_standby_names").fetch_one(&mut conn).await?;
        Ok::<_, sqlx::Error>(ReplicationSettings { synchronous_commit, synchronous_standby_names })
    };
    let settings = match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(settings)) => Ok(settings),
        Ok(Err(e)) => Err(Read::Query(e.to_string())),
        Err(_) => Err(Read::Query(format!("no answer within {} ms", READ_TIMEOUT.as_millis()))),
    };
    let _ = conn.close().await;
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(commit: &str, names: &str) -> ReplicationSettings {
        ReplicationSettings { synchronous_commit: commit.into(), synchronous_standby_names: names.into() }
    }

    #[test]
    fn only_a_named_standby_waited_for_on_disk_keeps_every_commit() {
        assert_eq!(judge(&settings("on", "standby1")), None);
        assert_eq!(judge(&settings("remote_apply", "ANY 1 (a, b)")), None);
        assert_eq!(judge(&settings("on", "*")), None);
    }

    #[test]
    fn no_standby_named_is_a_risk_whatever_synchronous_commit_says() {
        for commit in ["on", "remote_apply", "off"] {
            let risk = judge(&settings(commit, "")).expect("a risk");
            assert_eq!(risk.setting, "synchronous_standby_names");
            assert_eq!(risk.to_string(), "synchronous_standby_names is ''");
        }
        assert_eq!(judge(&settings("on", "  ")).map(|r| r.setting), Some("synchronous_standby_names"));
    }

    #[test]
    fn a_commit_that_does_not_wait_for_the_standby_disk_is_a_risk() {
        for commit in ["off", "local", "remote_write"] {
            let risk = judge(&settings(commit, "standby1")).expect("a risk");
            assert_eq!(risk, Risk { setting: "synchronous_commit", value: commit.into() });
        }
    }
}
