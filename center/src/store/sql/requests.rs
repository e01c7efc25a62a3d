//! The `requests` table: the first answer to every request id (exactly once).

use inventory_core::ledger::Mutation;
use inventory_core::{Channel, RequestId};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Row;

use super::rows::to_db;
use super::{Dialect, SqlLedger, Tx};
use crate::error::CenterError;
use crate::store::Result;

impl SqlLedger {
    pub(super) async fn find_request<T: DeserializeOwned>(
        tx: &mut Tx,
        m: &Mutation,
        request_id: &RequestId,
    ) -> Result<Option<T>> {
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

    /// Records the first answer to `request_id`; false when the id is already recorded.
    ///
    /// Request ids are unique per caller scope but looked up under one item's lock, so a
    /// call naming another item with the same id can record it first. `DO NOTHING` waits
    /// for that call's transaction and does not abort this one: the caller rolls back and
    /// answers from the record ([`SqlLedger::recorded_answer`]).
    ///
    /// `applied_under` is the channel and epoch an agent's request was applied under (none
    /// for an operator's): what [`SqlLedger::prune_requests`] goes by.
    pub(super) async fn put_request<T: Serialize>(
        tx: &mut Tx,
        m: &Mutation,
        request_id: &RequestId,
        applied_under: Option<(&Channel, u64)>,
        answer: &T,
    ) -> Result<bool> {
        let response = serde_json::to_string(answer).map_err(|e| CenterError::Internal(e.to_string()))?;
        let epoch = applied_under.map(|(_, epoch)| to_db("epoch", epoch)).transpose()?;
        let done = sqlx::query(
            "INSERT INTO requests (scope, request_id, fingerprint, response, created_at_ms, channel, epoch) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (scope, request_id) DO NOTHING",
        )
        .bind(m.scope())
        .bind(request_id.as_str())
        .bind(m.fingerprint())
        .bind(response)
        .bind(crate::clock::now_ms())
        .bind(applied_under.map(|(channel, _)| channel.as_str()))
        .bind(epoch)
        .execute(&mut **tx)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The answer to a request whose id another call recorded while this one ran: the
    /// first answer for the same payload, ALREADY_EXISTS for another.
    pub(super) async fn recorded_answer<T: DeserializeOwned>(&self, m: &Mutation, request_id: &RequestId) -> Result<T> {
        let mut tx = self.begin().await?;
        let first = Self::find_request::<T>(&mut tx, m, request_id).await?;
        tx.commit().await?;
        first.ok_or_else(|| CenterError::Unavailable("request id busy, retry with the same request id".into()))
    }

    /// Deletes up to `limit` records that no retry can use any more: those of an agent's
    /// request applied under an epoch its channel has since left. A retry carries the
    /// epoch it was first sent under (the agent never re-sends a call under a newer one),
    /// and the store answers a replay before it checks the epoch; so while the epoch is
    /// current the record answers the retry, and after it the epoch check refuses the
    /// retry whether or not the record is there. Epochs only grow, so a row found
    /// superseded stays superseded. A removed channel has left every epoch up to its last
    /// one (a new registration starts above it), so its records go too. Operators' records
    /// have no epoch and are kept.
    ///
    /// Also an agent's records created before `before_ms`, whatever their epoch: the
    /// service refuses a request made that long ago before it looks for its record
    /// (`inventory_core::records`), so no retry can use them either.
    ///
    /// Each kind is looked up through its index (`requests_by_channel_epoch` from each
    /// channel's row, `requests_by_age`), so a run that finds little reads little; on
    /// PostgreSQL as lateral lookups in index order, which the planner keeps whatever its
    /// statistics say. One condition over every record was a scan of the whole table per
    /// 500 records deleted.
    pub(super) async fn prune_requests(&self, limit: u32, before_ms: i64) -> Result<u64> {
        let sql = match self.dialect {
            Dialect::Postgres => {
                "DELETE FROM requests WHERE (scope, request_id) IN (SELECT scope, request_id FROM (\
                 SELECT r.scope, r.request_id FROM channels c CROSS JOIN LATERAL (SELECT scope, request_id \
                 FROM requests WHERE channel = c.channel AND epoch < c.epoch ORDER BY epoch LIMIT $1) r \
                 UNION ALL SELECT r.scope, r.request_id FROM removed_channels t CROSS JOIN LATERAL (SELECT scope, \
                 request_id FROM requests WHERE channel = t.channel AND epoch <= t.epoch ORDER BY epoch LIMIT $1) r \
                 WHERE NOT EXISTS (SELECT 1 FROM channels c WHERE c.channel = t.channel) \
                 UNION ALL (SELECT scope, request_id FROM requests WHERE created_at_ms < $2 AND channel IS NOT NULL \
                 ORDER BY created_at_ms LIMIT $1)) d LIMIT $1)"
            }
            Dialect::Sqlite => {
                "DELETE FROM requests WHERE (scope, request_id) IN (SELECT scope, request_id FROM (\
                 SELECT r.scope, r.request_id FROM channels c JOIN requests r ON r.channel = c.channel AND r.epoch < c.epoch \
                 UNION ALL SELECT r.scope, r.request_id FROM removed_channels t \
                 JOIN requests r ON r.channel = t.channel AND r.epoch <= t.epoch \
                 WHERE NOT EXISTS (SELECT 1 FROM channels c WHERE c.channel = t.channel) \
                 UNION ALL SELECT scope, request_id FROM requests WHERE created_at_ms < $2 AND channel IS NOT NULL\
                 ) d LIMIT $1)"
            }
        };
        let done = sqlx::query(sql).bind(i64::from(limit)).bind(before_ms).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }
}
