//! Which database server the ledger's connections reach. A failover behind a stable
//! address (a virtual IP, a proxy, a DNS name) leaves the center running while its pool
//! reconnects to a promoted standby that may have lost the last commits, as a restart on
//! it would: the center must treat that like its own start (`ledger::hold_back`). The
//! health ping and the sampler only notice when the database stops answering; a failover
//! faster than their periods is seen here instead, by the server's start time
//! (`pg_postmaster_start_time()`, readable by any role: a promoted standby, a restarted or
//! a restored server each has its own), read on every new connection and by every sample
//! (behind a pooler the connections outlive the server).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server the last connection reached, and how often that changed.
#[derive(Debug, Default)]
pub struct ServerIdentity {
    last: Mutex<Option<String>>,
    changes: AtomicU64,
}

impl ServerIdentity {
    /// A new connection, or a sample, reached the server that started at `started`.
    /// Returns whether it is another server than the last one seen.
    pub fn saw(&self, started: &str) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let changed = last.as_deref().is_some_and(|known| known != started);
        if changed {
            self.changes.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                was = last.as_deref().unwrap_or_default(),
                now = started,
                "the ledger's database is another server than before (a failover, a restart or a restore): commits may have been lost"
            );
        }
        if last.as_deref() != Some(started) {
            *last = Some(started.to_owned());
        }
        changed
    }

    /// How many times a connection reached another server than the one before.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }
}

/// The query whose answer tells servers apart.
pub const SERVER_STARTED: &str = "SELECT pg_postmaster_start_time()::text";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_another_server_counts_as_a_change() {
        let s = ServerIdentity::default();
        assert!(!s.saw("2026-12-05 06:00:00+00"), "the first server is no change");
        assert!(!s.saw("2026-12-05 06:00:00+00"), "another connection to the same server");
        assert_eq!(s.changes(), 0);
        assert!(s.saw("2026-12-05 06:10:00+00"), "a promoted standby started at another time");
        assert!(!s.saw("2026-12-05 06:10:00+00"));
        assert!(s.saw("2026-12-05 06:00:00+00"), "a connection back on the old server changes again");
        assert_eq!(s.changes(), 2);
    }
}
