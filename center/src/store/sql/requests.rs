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

    pub(super) async fn put_request<T: Serialize>(
        tx: &mut Tx,
        m: &Mutation,
        request_id: &RequestId,
        answer: &T,
    ) -> Result<()> {
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
}
