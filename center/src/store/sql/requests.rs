//! The `requests` table: the first answer to every request id (exactly once).

use inventory_core::RequestId;
use inventory_core::ledger::Mutation;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Row;

use super::{SqlLedger, Tx};
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
    pub(super) async fn put_request<T: Serialize>(
        tx: &mut Tx,
        m: &Mutation,
        request_id: &RequestId,
        answer: &T,
    ) -> Result<bool> {
        let response = serde_json::to_string(answer).map_err(|e| CenterError::Internal(e.to_string()))?;
        let done = sqlx::query(
            "INSERT INTO requests (scope, request_id, fingerprint, response, created_at_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (scope, request_id) DO NOTHING",
        )
        .bind(m.scope())
        .bind(request_id.as_str())
        .bind(m.fingerprint())
        .bind(response)
        .bind(crate::clock::now_ms())
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
}
