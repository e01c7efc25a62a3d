//! The center's one error type and its one mapping to `tonic::Status`.

use inventory_core::ValidationError;
use inventory_core::ledger::LedgerError;
use inventory_core::watermarks::WatermarkError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum CenterError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("{kind} {id:?} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Precondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// Details are logged, never sent to the caller.
    #[error("internal error: {0}")]
    Internal(String),
}

impl CenterError {
    pub fn item_not_found(id: impl Into<String>) -> Self {
        CenterError::NotFound { kind: "item", id: id.into() }
    }

    pub fn code(&self) -> Code {
        match self {
            CenterError::Invalid(_) => Code::InvalidArgument,
            CenterError::NotFound { .. } => Code::NotFound,
            CenterError::AlreadyExists(_) => Code::AlreadyExists,
            CenterError::Precondition(_) => Code::FailedPrecondition,
            CenterError::Unavailable(_) => Code::Unavailable,
            CenterError::PermissionDenied(_) => Code::PermissionDenied,
            CenterError::Internal(_) => Code::Internal,
        }
    }
}

impl From<LedgerError> for CenterError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::TotalTooLarge { .. } => {
                CenterError::Invalid(ValidationError::new("quantity", 0u64, e.to_string()))
            }
            LedgerError::ReturnExceedsHeld { .. }
            | LedgerError::StaleEpoch { .. }
            | LedgerError::UnknownChannel { .. }
            | LedgerError::LeaseLive { .. }
            | LedgerError::NothingInDoubt { .. }
            | LedgerError::SoldExceedsHeld { .. } => CenterError::Precondition(e.to_string()),
        }
    }
}

impl From<WatermarkError> for CenterError {
    fn from(e: WatermarkError) -> Self {
        match e {
            WatermarkError::Invalid(v) => CenterError::Invalid(v),
            WatermarkError::LowNotBelowHigh { .. } => CenterError::Precondition(e.to_string()),
        }
    }
}

impl From<sqlx::Error> for CenterError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => CenterError::Unavailable(format!("database unavailable: {e}")),
            // Serialization failures and deadlocks roll back whole: retrying is safe.
            sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01" | "57P01")) => {
                CenterError::Unavailable("database busy, retry with the same request id".into())
            }
            _ => CenterError::Internal(e.to_string()),
        }
    }
}

impl From<CenterError> for Status {
    fn from(e: CenterError) -> Self {
        match &e {
            CenterError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
                Status::internal("internal error")
            }
            CenterError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "dependency unavailable");
                Status::unavailable(e.to_string())
            }
            _ => Status::new(e.code(), e.to_string()),
        }
    }
}
