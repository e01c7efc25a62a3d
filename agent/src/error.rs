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
    /// A dependency (the center) is down, or the agent is draining: the caller may retry
    /// with the same idempotency key.
    #[error("{0}")]
    Unavailable(String),
    /// The pool store failed: UNAVAILABLE when it is down, refused the write (its memory
    /// limit) or the pool was fenced (retry), INTERNAL when it answered something unexpected.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The center refuses this agent's credentials (a configuration error): UNAVAILABLE to
    /// callers, fatal at start-up.
    #[error("{0}")]
    CenterRefused(String),
    /// Rate-limited or overloaded: answered at once instead of queueing into timeouts.
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl AgentError {
    /// Whether the pool store caused this error (counted apart from the center's).
    pub fn is_pool_store_error(&self) -> bool {
        matches!(self, AgentError::Store(_))
    }
}

/// Maps an error from the center to what the agent's caller should see.
pub fn from_center(status: Status) -> AgentError {
    match status.code() {
        Code::NotFound => AgentError::NotFound(status.message().to_owned()),
        Code::InvalidArgument | Code::AlreadyExists => {
            AgentError::Internal(format!("center rejected a request: {}", status.message()))
        }
        Code::PermissionDenied | Code::Unauthenticated => AgentError::CenterRefused(format!(
            "the center refuses this agent's credentials ({}); an operator must fix the agent's token or channel",
            status.message()
        )),
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
            AgentError::Store(s @ (StoreError::Unavailable(_) | StoreError::Fenced(_))) => {
                tracing::debug!(error = %s, "unavailable");
                Status::unavailable(s.to_string())
            }
            // A full store is a dependency that cannot take the call now, not an overload
            // of this agent: UNAVAILABLE, so clients retry with the same key.
            AgentError::Store(s @ StoreError::Refused(_)) => {
                tracing::debug!(error = %s, "pool store refused a write");
                Status::unavailable(s.to_string())
            }
            AgentError::Store(s @ StoreError::GenerationChanged { .. }) => Status::failed_precondition(s.to_string()),
            // The pool lost its data: nothing was written; the item is frozen until an
            // operator settles its units (the agent's reads find it lost).
            AgentError::Store(StoreError::PoolMissing(tag)) => Status::unavailable(format!(
                "pool {tag} lost its data in the store; nothing was written, and selling the item waits until its \
                 units are reconciled"
            )),
            AgentError::Store(s @ StoreError::Protocol(_)) => {
                tracing::error!(error = %s, "internal error");
                Status::internal("internal error")
            }
            AgentError::CenterRefused(m) => Status::unavailable(m.clone()),
            AgentError::ResourceExhausted(m) => Status::resource_exhausted(m.clone()),
            AgentError::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                Status::internal("internal error")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_store_errors_are_told_apart_from_center_errors() {
        assert!(AgentError::from(StoreError::Unavailable("connection refused".into())).is_pool_store_error());
        assert!(AgentError::from(StoreError::Protocol("bad reply".into())).is_pool_store_error());
        assert!(!from_center(Status::unavailable("down")).is_pool_store_error());
        assert!(!AgentError::Unavailable("agent is shutting down".into()).is_pool_store_error());
    }

    #[test]
    fn a_store_that_is_down_is_unavailable_and_a_bad_answer_internal() {
        let down = Status::from(AgentError::from(StoreError::Unavailable("connection refused".into())));
        assert_eq!(down.code(), Code::Unavailable);
        assert!(down.message().contains("pool store unavailable"));
        let bad = Status::from(AgentError::from(StoreError::Protocol("bad reply".into())));
        assert_eq!(bad.code(), Code::Internal);
        assert_eq!(bad.message(), "internal error", "no internals in INTERNAL");
    }

    #[test]
    fn a_store_at_its_memory_limit_is_unavailable_and_says_so() {
        let full = Status::from(AgentError::from(StoreError::Refused(crate::store::redis::OUT_OF_MEMORY.to_owned())));
        assert_eq!(full.code(), Code::Unavailable);
        assert_eq!(
            full.message(),
            "pool store refused the write: redis is at its memory limit (maxmemory); retry with the same \
             idempotency_key"
        );
    }
}
