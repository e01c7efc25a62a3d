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
///
/// A redirection the cluster client gave up following (MOVED or ASK while a failover moves
/// slots) is `Unavailable` too: the node that answered it ran nothing. So is a NOSCRIPT
/// left after the client loaded the script and called it again (a node promoted, or its
/// scripts flushed, in between): the script did not run.
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
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::NoScript
            ) | ErrorKind::ClusterConnectionNotFound
        )
        || e.code() == Some("BUSY");
    if unavailable { StoreError::Unavailable(e.to_string()) } else { StoreError::Protocol(e.to_string()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(kind: ErrorKind, text: &'static str) -> StoreError {
        map_err(RedisError::from((kind, text)))
    }

    #[test]
    fn a_failover_in_progress_is_unavailable_whatever_the_node_answers() {
        for kind in [
            ServerErrorKind::Moved,
            ServerErrorKind::Ask,
            ServerErrorKind::TryAgain,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ReadOnly,
            ServerErrorKind::BusyLoading,
            ServerErrorKind::NoScript,
        ] {
            let e = mapped(ErrorKind::Server(kind), "slot moving");
            assert!(matches!(e, StoreError::Unavailable(_)), "{kind:?} mapped to {e:?}");
        }
        assert!(matches!(mapped(ErrorKind::ClusterConnectionNotFound, "no node"), StoreError::Unavailable(_)));
    }

    #[test]
    fn refusals_and_unexpected_answers_keep_their_kinds() {
        let oom = mapped(
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "OOM command not allowed when used memory > 'maxmemory'",
        );
        assert!(matches!(oom, StoreError::Refused(ref why) if why == OUT_OF_MEMORY), "{oom:?}");
        let cross = mapped(ErrorKind::Server(ServerErrorKind::CrossSlot), "keys in different slots");
        assert!(matches!(cross, StoreError::Protocol(_)), "{cross:?}");
        let parse = mapped(ErrorKind::UnexpectedReturnType, "not an array");
        assert!(matches!(parse, StoreError::Protocol(_)), "{parse:?}");
    }
}
