//! Redis errors as the store's: a write the server refused before running it, connection
//! trouble (retry with the same ids), or an answer this code does not expect.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::StoreError;

/// What Redis says when it refuses a write for its memory limit (`maxmemory` with
/// `noeviction`): nothing of the script was written, as Redis refuses a script at its
/// first write when it started out of memory.
pub const OUT_OF_MEMORY: &str = "redis is at its memory limit (maxmemory)";

/// A write the server refused without running it: out of memory, a failed snapshot
/// (`stop-writes-on-bgsave-error`), too few replicas (`min-replicas-to-write`).
fn refusal(e: &RedisError) -> Option<&'static str> {
    let text = e.to_string();
    let code = e.code();
    if code == Some("OOM") || text.contains("OOM command not allowed") {
        return Some(OUT_OF_MEMORY);
    }
    if code == Some("MISCONF") || text.contains("MISCONF") {
        return Some("redis stopped writes as it cannot persist to disk (MISCONF)");
    }
    if code == Some("NOREPLICAS") || text.contains("NOREPLICAS") {
        return Some("redis has fewer replicas than min-replicas-to-write (NOREPLICAS)");
    }
    None
}

/// Connection trouble (and servers that cannot serve right now) is `Unavailable`, a write
/// the server refused `Refused`: the caller may retry with the same ids. Anything else
/// means the store answered something this code does not expect.
pub(super) fn map_err(e: RedisError) -> StoreError {
    if let Some(why) = refusal(&e) {
        return StoreError::Refused(why.to_owned());
    }
    let unavailable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            ) | ErrorKind::ClusterConnectionNotFound
        )
        || e.code() == Some("BUSY");
    if unavailable { StoreError::Unavailable(e.to_string()) } else { StoreError::Protocol(e.to_string()) }
}
