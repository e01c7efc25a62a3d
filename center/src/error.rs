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
    /// A dependency is down or busy and retrying with the same id is safe; the message is
    /// sent as it is, so it never carries a dependency's own words.
    #[error("{0}")]
    Unavailable(String),
    /// The database cannot be reached. `detail` (the driver's words) is logged, never sent.
    #[error("database unavailable: {detail}")]
    Database { detail: String },
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
            CenterError::Unavailable(_) | CenterError::Database { .. } => Code::Unavailable,
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
            | LedgerError::ChannelHoldsStock { .. }
            | LedgerError::AgentAttached { .. }
            | LedgerError::NothingInDoubt { .. }
            | LedgerError::SoldExceedsHeld { .. }
            | LedgerError::Overflow { .. } => CenterError::Precondition(e.to_string()),
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
            | sqlx::Error::WorkerCrashed => CenterError::Database { detail: e.to_string() },
            // Serialization failures and deadlocks roll back whole: retrying is safe.
            sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01" | "57P01")) => {
                CenterError::Unavailable("database busy, retry with the same request id".into())
            }
            _ => CenterError::Internal(e.to_string()),
        }
    }
}

/// Callers get a short message; what the database said goes to the log, inside the call's
/// span (which carries the request id, where the call has one).
impl From<CenterError> for Status {
    fn from(e: CenterError) -> Self {
        match &e {
            CenterError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
                Status::internal("internal error")
            }
            CenterError::Database { detail } => {
                tracing::warn!(error = %detail, "database unavailable");
                Status::unavailable("database unavailable, retry with the same request id")
            }
            CenterError::Unavailable(message) => {
                tracing::warn!(error = %message, "dependency unavailable");
                Status::unavailable(message.clone())
            }
            _ => Status::new(e.code(), e.to_string()),
        }
    }
}
