//! Calls to the center that wait to go together: what arrives while every sender is busy
//! joins one sender's next call. Borrows (as BorrowMany) and item loads (as DescribeItems)
//! both go this way; what one call may carry is theirs to pick.

use std::sync::Mutex;

/// Tasks sending at once: one slow call does not hold up every caller.
pub(super) const SENDERS: usize = 4;

pub(super) struct Gather<T> {
    queue: Mutex<Queue<T>>,
}

struct Queue<T> {
    waiting: Vec<T>,
    /// Tasks sending what waits, at most [`SENDERS`].
    senders: usize,
}

impl<T> Default for Gather<T> {
    fn default() -> Self {
        Self { queue: Mutex::new(Queue { waiting: Vec::new(), senders: 0 }) }
    }
}

impl<T> Gather<T> {
    /// Queues `item`; true when the caller is to start a sender (one task of its own, so a
    /// caller that stops waiting strands nobody), which calls [`Gather::next`] until it
    /// answers `None`.
    pub(super) fn push(&self, item: T) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.waiting.push(item);
        let start = q.senders < SENDERS;
        if start {
            q.senders += 1;
        }
        start
    }

    /// The next call's share of what waits, chosen by `pick` from the queue (what it leaves
    /// waits for a later call), or `None` when nothing waits: the sender then stops.
    pub(super) fn next(&self, pick: impl FnOnce(&mut Vec<T>) -> Vec<T>) -> Option<Vec<T>> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.waiting.is_empty() {
            q.senders -= 1;
            return None;
        }
        Some(pick(&mut q.waiting))
    }
}
