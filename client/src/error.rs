//! One error type for every call, and the one mapping from a final `tonic::Status`.

use std::time::Duration;

use tonic::Code;

/// Why a call did not do what it asked. [`Error::is_retry_safe`] says whether the caller
/// may send the same request (same idempotency key) again later.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request was wrong (an id's charset, a quantity above the per-user limit); the
    /// message names the field.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The item, reservation or basket is unknown to the agent.
    #[error("not found: {0}")]
    NotFound(String),
    /// The idempotency key was used before with another user, item or quantity.
    #[error("idempotency key reused with another request: {0}")]
    KeyReused(String),
    /// The pool lost its data since the first answer for this key (its generation is not
    /// the one that answer gave): nothing was reserved, and the first reservation is gone
    /// with the pool. Settle the order from the backend's own records; do not retry.
    #[error("the pool was re-created since generation {expected}: {message}")]
    PoolGenerationChanged {
        /// The generation the first answer gave.
        expected: u64,
        /// The agent's message.
        message: String,
    },
    /// The reservation is in a state that does not allow the call (confirm after cancel
    /// or expiry, cancel after confirm, refund before confirm).
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// No token, or one the agent does not accept.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The token is not allowed this call.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The agent kept answering RESOURCE_EXHAUSTED (the user sends too fast, or the agent
    /// is overloaded) until the deadline.
    #[error("rate limited: {message}")]
    RateLimited {
        /// The server's pushback, when it sent one.
        retry_after: Option<Duration>,
        /// The agent's message.
        message: String,
    },
    /// No replica could serve the call before the deadline (down, unreachable, pool store
    /// down, item frozen after a loss).
    #[error("unavailable after {attempts} attempts: {message}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// The last failure's message.
        message: String,
    },
    /// The caller's deadline passed without an answer (a lost reply, a slow replica).
    #[error("no answer after {attempts} attempts before the deadline: {message}")]
    DeadlineExceeded {
        /// Attempts made.
        attempts: u32,
        /// The last failure's message.
        message: String,
    },
    /// The client was set up wrong (a bad URL, an unreadable CA file).
    #[error("configuration: {0}")]
    Config(String),
    /// The backend's [`OrderStore`](crate::OrderStore) failed.
    #[error("order store: {0}")]
    OrderStore(String),
    /// The agent answered something this client does not understand (a newer agent).
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// Any other code (INTERNAL, UNIMPLEMENTED, ...).
    #[error("{code:?}: {message}")]
    Other {
        /// The gRPC code.
        code: Code,
        /// The agent's message.
        message: String,
    },
}

impl Error {
    /// Whether sending the same request again (same key, same generation) later is safe
    /// and may succeed: the call's outcome was unknown or the agent asked to come back.
    pub fn is_retry_safe(&self) -> bool {
        matches!(self, Error::RateLimited { .. } | Error::Unavailable { .. } | Error::DeadlineExceeded { .. })
    }

    /// A short stable name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidArgument(_) => "invalid_argument",
            Error::NotFound(_) => "not_found",
            Error::KeyReused(_) => "key_reused",
            Error::PoolGenerationChanged { .. } => "pool_generation_changed",
            Error::FailedPrecondition(_) => "failed_precondition",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PermissionDenied(_) => "permission_denied",
            Error::RateLimited { .. } => "rate_limited",
            Error::Unavailable { .. } => "unavailable",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
            Error::Config(_) => "config",
            Error::OrderStore(_) => "order_store",
            Error::Protocol(_) => "protocol",
            Error::Other { .. } => "other",
        }
    }

    /// The last attempt's status after `attempts` attempts, with the server's pushback.
    pub(crate) fn from_status(status: &tonic::Status, attempts: u32, retry_after: Option<Duration>) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::InvalidArgument | Code::OutOfRange => Error::InvalidArgument(message),
            Code::NotFound => Error::NotFound(message),
            Code::AlreadyExists => Error::KeyReused(message),
            Code::FailedPrecondition => Error::FailedPrecondition(message),
            Code::Unauthenticated => Error::Unauthenticated(message),
            Code::PermissionDenied => Error::PermissionDenied(message),
            Code::ResourceExhausted => Error::RateLimited { retry_after, message },
            Code::Unavailable | Code::Unknown | Code::Cancelled => Error::Unavailable { attempts, message },
            Code::DeadlineExceeded => Error::DeadlineExceeded { attempts, message },
            code => Error::Other { code, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outcomes_left_open_are_retry_safe() {
        let status = |code| Error::from_status(&tonic::Status::new(code, "m"), 3, None);
        assert!(status(Code::Unavailable).is_retry_safe());
        assert!(status(Code::DeadlineExceeded).is_retry_safe());
        assert!(status(Code::ResourceExhausted).is_retry_safe());
        assert!(status(Code::Cancelled).is_retry_safe(), "a connection cut mid-call leaves the outcome open");
        for code in [Code::InvalidArgument, Code::AlreadyExists, Code::FailedPrecondition, Code::Internal] {
            assert!(!status(code).is_retry_safe(), "{code:?}");
        }
        assert!(!Error::PoolGenerationChanged { expected: 1, message: String::new() }.is_retry_safe());
    }
}
