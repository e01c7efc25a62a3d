//! The relay's decisions, without I/O: where each pool's outbox is read from next, which
//! events of a page go to the broker, which acknowledgements count, what may be trimmed,
//! and how long to back off.

use std::collections::HashMap;
use std::time::Duration;

use crate::store::PoolKey;

/// Where one pool stands: the generation its events belong to and the next sequence to
/// publish. Everything before `next` was acknowledged by the broker (or trimmed by an
/// earlier incarnation, which trims only what the broker acknowledged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub generation: u64,
    pub next: u64,
}

/// What to do with a page read from a pool's outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Publish the first `n` events of the page (contiguous from the cursor); 0: none new.
    Publish(usize),
    /// The page was read from a position that no longer holds (the pool's generation
    /// changed, or older events were trimmed): read again from [`Cursors::from`].
    Reread,
}

/// The cursors of every pool the relay serves.
#[derive(Debug, Default)]
pub struct Cursors {
    pools: HashMap<PoolKey, Cursor>,
}

impl Cursors {
    /// The first sequence to read. An unknown pool reads from its oldest kept event: the
    /// outbox keeps only what the broker has not acknowledged, or acknowledged just before
    /// a crash (those the broker drops as duplicates of their event id).
    pub fn from(&self, pool: &PoolKey) -> u64 {
        self.pools.get(pool).map_or(1, |c| c.next)
    }

    pub fn get(&self, pool: &PoolKey) -> Option<Cursor> {
        self.pools.get(pool).copied()
    }

    /// Forgets every pool (this replica stopped leading: another one publishes now, and
    /// the cursors are read back from the outbox when it leads again).
    pub fn clear(&mut self) {
        self.pools.clear();
    }

    /// Judges a page read from `from`: its pool `generation`, the oldest sequence the
    /// outbox still keeps, and the sequences of the events it returned, in order.
    pub fn plan(&mut self, pool: &PoolKey, from: u64, generation: u64, first_kept: u64, sequences: &[u64]) -> Plan {
        let floor = first_kept.max(1);
        let cursor = self.pools.entry(pool.clone()).or_insert(Cursor { generation, next: floor });
        if cursor.generation != generation {
            // A lost and re-created pool numbers anew: its events are new events.
            *cursor = Cursor { generation, next: floor };
        }
        if cursor.next < floor {
            // Trimmed by an earlier incarnation after the broker acknowledged them.
            cursor.next = floor;
        }
        if from != cursor.next {
            return Plan::Reread;
        }
        let mut n = 0;
        for (i, s) in sequences.iter().enumerate() {
            if *s != cursor.next + i as u64 {
                break;
            }
            n += 1;
        }
        if n == 0 && !sequences.is_empty() {
            // The outbox answered from further on than asked: the events between are gone.
            return Plan::Reread;
        }
        Plan::Publish(n)
    }

    /// The broker acknowledged every event of `generation` through `through`: returns the
    /// sequence the outbox may be trimmed through, if the cursor moved.
    pub fn acked(&mut self, pool: &PoolKey, generation: u64, through: u64) -> Option<u64> {
        let cursor = self.pools.get_mut(pool)?;
        if cursor.generation != generation || through < cursor.next {
            return None;
        }
        cursor.next = through + 1;
        Some(through)
    }
}

/// A batch's acknowledgements, taken in publish order: only the prefix before the first
/// one that failed (or did not come in time) counts, since the cursor moves through a
/// contiguous run. So the first failure ends the wait: the acknowledgements after it could
/// not move the cursor, and awaiting them only delays the next try.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AckPrefix {
    acked: usize,
    broken: bool,
}

impl AckPrefix {
    /// Records the next acknowledgement in order; returns whether the next one is still
    /// worth awaiting.
    pub fn record(&mut self, acknowledged: bool) -> bool {
        if self.broken {
            return false;
        }
        if acknowledged {
            self.acked += 1;
        } else {
            self.broken = true;
        }
        !self.broken
    }

    /// Events acknowledged in order from the batch's start.
    pub fn acked(&self) -> usize {
        self.acked
    }

    /// Whether an acknowledgement failed.
    pub fn broken(&self) -> bool {
        self.broken
    }
}

/// Exponential backoff while the broker fails, capped; reset by a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap: cap.max(base), failures: 0 }
    }

    /// Records a failure; returns how long to wait before the next try.
    pub fn failed(&mut self) -> Duration {
        let wait = self.base.saturating_mul(1u32 << self.failures.min(16)).min(self.cap);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> PoolKey {
        PoolKey::new("web", "sku-1")
    }

    #[test]
    fn a_new_pool_reads_from_its_oldest_kept_event() {
        let mut c = Cursors::default();
        assert_eq!(c.from(&pool()), 1);
        // Read from 1, but the outbox keeps from 5 on: read again from 5.
        assert_eq!(c.plan(&pool(), 1, 1, 5, &[5, 6]), Plan::Reread);
        assert_eq!(c.from(&pool()), 5);
        assert_eq!(c.plan(&pool(), 5, 1, 5, &[5, 6]), Plan::Publish(2));
    }

    #[test]
    fn only_the_contiguous_run_from_the_cursor_is_published() {
        let mut c = Cursors::default();
        assert_eq!(c.plan(&pool(), 1, 1, 1, &[1, 2, 4, 5]), Plan::Publish(2));
        assert_eq!(c.acked(&pool(), 1, 2), Some(2));
        assert_eq!(c.from(&pool()), 3);
    }

    #[test]
    fn acknowledgements_advance_the_cursor_and_say_what_to_trim() {
        let mut c = Cursors::default();
        assert_eq!(c.plan(&pool(), 1, 7, 1, &[1, 2, 3]), Plan::Publish(3));
        assert_eq!(c.acked(&pool(), 7, 3), Some(3));
        assert_eq!(c.from(&pool()), 4);
        // An old or repeated acknowledgement moves nothing and trims nothing.
        assert_eq!(c.acked(&pool(), 7, 2), None);
        // Nor does one of another generation.
        assert_eq!(c.acked(&pool(), 6, 10), None);
        assert_eq!(c.from(&pool()), 4);
        // An empty page: nothing to publish.
        assert_eq!(c.plan(&pool(), 4, 7, 4, &[]), Plan::Publish(0));
    }

    #[test]
    fn a_new_generation_starts_its_cursor_over() {
        let mut c = Cursors::default();
        assert_eq!(c.plan(&pool(), 1, 1, 1, &[1, 2, 3]), Plan::Publish(3));
        c.acked(&pool(), 1, 3);
        // The pool was lost and re-created: generation 2 numbers from 1 again.
        assert_eq!(c.plan(&pool(), 4, 2, 1, &[]), Plan::Reread);
        assert_eq!(c.get(&pool()), Some(Cursor { generation: 2, next: 1 }));
        assert_eq!(c.plan(&pool(), 1, 2, 1, &[1]), Plan::Publish(1));
        // A late acknowledgement of generation 1 trims nothing of generation 2.
        assert_eq!(c.acked(&pool(), 1, 3), None);
        assert_eq!(c.acked(&pool(), 2, 1), Some(1));
    }

    #[test]
    fn a_page_that_skips_ahead_is_read_again() {
        let mut c = Cursors::default();
        assert_eq!(c.plan(&pool(), 1, 1, 1, &[1]), Plan::Publish(1));
        c.acked(&pool(), 1, 1);
        // Asked from 2, the outbox says it keeps from 1 yet answers from 4: a hole.
        assert_eq!(c.plan(&pool(), 2, 1, 1, &[4, 5]), Plan::Reread);
        assert_eq!(c.from(&pool()), 2);
    }

    #[test]
    fn clearing_forgets_every_cursor() {
        let mut c = Cursors::default();
        c.plan(&pool(), 1, 1, 1, &[1]);
        c.acked(&pool(), 1, 1);
        c.clear();
        assert_eq!(c.from(&pool()), 1);
    }

    #[test]
    fn only_the_acknowledged_prefix_counts_and_the_first_failure_ends_the_wait() {
        let mut acks = AckPrefix::default();
        assert!(acks.record(true));
        assert!(acks.record(true));
        assert!(!acks.record(false), "a failure ends the wait");
        assert!(!acks.record(true), "later acknowledgements move nothing");
        assert_eq!((acks.acked(), acks.broken()), (2, true));
        let mut all = AckPrefix::default();
        for _ in 0..256 {
            assert!(all.record(true));
        }
        assert_eq!((all.acked(), all.broken()), (256, false));
        let mut none = AckPrefix::default();
        assert!(!none.record(false));
        assert_eq!(none.acked(), 0);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets_on_success() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let waits: Vec<u128> = (0..7).map(|_| b.failed().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_600, 2_000, 2_000]);
        assert_eq!(b.failures(), 7);
        b.succeeded();
        assert_eq!(b.failed(), Duration::from_millis(100));
        // Many failures never overflow.
        for _ in 0..100 {
            assert!(b.failed() <= Duration::from_secs(2));
        }
    }
}
