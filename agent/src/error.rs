//! The agent's one error type and its one mapping to `tonic::Status`.

use inventory_core::ValidationError;
use tonic::{Code, Status};

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Precondition(String),
    /// A dependency (pool store, center) is down, or the agent is draining: the caller
    /// may retry with the same idempotency key.
    #[error("{0}")]
    Unavailable(String),
    /// Rate-limited or overloaded: answered at once instead of queueing into timeouts.
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for AgentError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) | StoreError::Fenced(_) => AgentError::Unavailable(e.to_string()),
            StoreError::Protocol(_) | StoreError::PoolMissing(_) => AgentError::Internal(e.to_string()),
        }
    }
}

/// Maps an error from the center to what the agent's caller should see.
pub fn from_center(status: Status) -> AgentError {
    match status.code() {
        Code::NotFound => AgentError::NotFound(status.message().to_owned()),
        Code::InvalidArgument => AgentError::Internal(format!("center rejected a request: {}", status.message())),
        _ => AgentError::Unavailable(format!("center unavailable: {}", status.message())),
    }
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Self {
        match &e {
            AgentError::Invalid(_) => Status::invalid_argument(e.to_string()),
            AgentError::NotFound(m) => Status::not_found(m.clone()),
            AgentError::AlreadyExists(m) => Status::already_exists(m.clone()),
            AgentError::Precondition(m) => Status::failed_precondition(m.clone()),
            AgentError::Unavailable(m) => {
                tracing::debug!(error = %m, "unavailable");
                Status::unavailable(m.clone())
            }
            AgentError::ResourceExhausted(m) => Status::resource_exhausted(m.clone()),
            AgentError::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                Status::internal("internal error")
            }
        }
    }
}
