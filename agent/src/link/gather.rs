//! Calls to the center that wait to go together: what arrives while every sender is busy
//! joins one sender's next call. Borrows (as BorrowMany), Returns (as ReturnMany) and
//! item loads (as DescribeItems) go this way; what one call may carry is theirs to pick.
//!
//! A call made while none is in flight goes at once: a lone Borrow on a miss waits for
//! nothing. A sender that would go while others are in flight with only a few calls
//! waiting first gathers for [`WINDOW`]: stocking thousands of pools sends a few large
//! calls instead of one call per pool that happened to arrive between two answers.

use std::sync::Mutex;
use std::time::Duration;

/// Tasks sending at once: one slow call does not hold up every caller.
pub(super) const SENDERS: usize = 4;

/// How long a sender gathers before it goes while other calls are in flight.
pub(super) const WINDOW: Duration = Duration::from_millis(3);

/// Waiting calls that make a sender go without gathering.
const ENOUGH: usize = 64;

pub(super) struct Gather<T> {
    queue: Mutex<Queue<T>>,
}

struct Queue<T> {
    waiting: Vec<T>,
    /// Tasks sending what waits, at most [`SENDERS`].
    senders: usize,
    /// Senders in their gathering window (counted in `senders`).
    gathering: usize,
}

/// What a sender does next.
pub(super) enum Next<T> {
    /// Send these.
    Send(Vec<T>),
    /// Wait [`WINDOW`] for more to arrive, then ask again (with `gathered` true).
    Gather,
    /// Nothing waits: the sender stops.
    Stop,
}

impl<T> Default for Gather<T> {
    fn default() -> Self {
        Self { queue: Mutex::new(Queue { waiting: Vec::new(), senders: 0, gathering: 0 }) }
    }
}

impl<T> Gather<T> {
    /// Queues `item`; true when the caller is to start a sender (one task of its own, so a
    /// caller that stops waiting strands nobody), which calls [`Gather::next`] until it
    /// answers [`Next::Stop`]. No sender starts while one is gathering: that one takes it.
    pub(super) fn push(&self, item: T) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.waiting.push(item);
        let start = q.senders < SENDERS && q.gathering == 0;
        if start {
            q.senders += 1;
        }
        start
    }

    /// The sender's next step: a call's share of what waits, chosen by `pick` from the
    /// queue (what it leaves waits for a later call), a gathering window first when other
    /// calls are in flight and few wait (`gathered`: this sender just had its window), or
    /// stop when nothing waits.
    pub(super) fn next(&self, gathered: bool, pick: impl FnOnce(&mut Vec<T>) -> Vec<T>) -> Next<T> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if gathered {
            q.gathering -= 1;
        }
        if q.waiting.is_empty() {
            q.senders -= 1;
            return Next::Stop;
        }
        if !gathered && q.senders > 1 && q.waiting.len() < ENOUGH {
            q.gathering += 1;
            return Next::Gather;
        }
        Next::Send(pick(&mut q.waiting))
    }

    /// Calls [`Gather::next`] until it stops, sending each share with `send`.
    pub(super) async fn drain<F, Fut>(&self, pick: impl Fn(&mut Vec<T>) -> Vec<T>, send: F)
    where
        F: Fn(Vec<T>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut gathered = false;
        loop {
            match self.next(gathered, &pick) {
                Next::Send(batch) => {
                    gathered = false;
                    send(batch).await;
                }
                Next::Gather => {
                    gathered = true;
                    tokio::time::sleep(WINDOW).await;
                }
                Next::Stop => return,
            }
        }
    }
}

/// A call's share of what waits: up to `max` calls of the first one's epoch (one epoch per
/// call), in the order they came; the others wait for a later call.
pub(super) fn one_epoch<T>(waiting: &mut Vec<T>, max: usize, epoch: impl Fn(&T) -> u64) -> Vec<T> {
    let first = epoch(&waiting[0]);
    let mut batch = Vec::new();
    let mut rest = Vec::new();
    for w in waiting.drain(..) {
        if epoch(&w) == first && batch.len() < max {
            batch.push(w);
        } else {
            rest.push(w);
        }
    }
    *waiting = rest;
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(w: &mut Vec<u32>) -> Vec<u32> {
        std::mem::take(w)
    }

    #[test]
    fn a_lone_call_goes_at_once() {
        let g = Gather::default();
        assert!(g.push(1));
        assert!(matches!(g.next(false, all), Next::Send(b) if b == vec![1]));
        assert!(matches!(g.next(false, all), Next::Stop));
    }

    #[test]
    fn a_call_made_while_another_is_in_flight_gathers_the_next_ones() {
        let g = Gather::default();
        assert!(g.push(1));
        assert!(matches!(g.next(false, all), Next::Send(_)), "the first goes at once");
        // While it is in flight: a second sender starts and gathers first.
        assert!(g.push(2));
        assert!(matches!(g.next(false, all), Next::Gather));
        // What arrives in its window starts no sender of its own: it joins the gatherer.
        assert!(!g.push(3));
        assert!(!g.push(4));
        assert!(matches!(g.next(true, all), Next::Send(b) if b == vec![2, 3, 4]));
        // The first sender's call answered: nothing waits, both stop.
        assert!(matches!(g.next(false, all), Next::Stop));
        assert!(matches!(g.next(false, all), Next::Stop));
        // Quiet again: a lone call goes at once.
        assert!(g.push(5));
        assert!(matches!(g.next(false, all), Next::Send(b) if b == vec![5]));
    }

    #[test]
    fn enough_waiting_goes_without_a_window() {
        let g = Gather::default();
        assert!(g.push(0));
        assert!(matches!(g.next(false, all), Next::Send(_)));
        assert!(g.push(1));
        for i in 2..=ENOUGH {
            g.push(u32::try_from(i).unwrap());
        }
        assert!(matches!(g.next(false, all), Next::Send(b) if b.len() == ENOUGH));
    }

    #[test]
    fn a_call_carries_one_epoch_and_at_most_max() {
        let mut waiting = vec![(1, 'a'), (2, 'b'), (1, 'c'), (1, 'd'), (2, 'e')];
        assert_eq!(one_epoch(&mut waiting, 2, |w| w.0), vec![(1, 'a'), (1, 'c')]);
        assert_eq!(waiting, vec![(2, 'b'), (1, 'd'), (2, 'e')], "the rest waits, in order");
        assert_eq!(one_epoch(&mut waiting, 500, |w| w.0), vec![(2, 'b'), (2, 'e')]);
        assert_eq!(waiting, vec![(1, 'd')]);
    }

    #[test]
    fn never_more_than_senders_at_once() {
        let g = Gather::default();
        let mut started = 0;
        for i in 0..100 {
            // Senders started and not yet asking (a runtime busy elsewhere).
            started += usize::from(g.push(i));
        }
        assert_eq!(started, SENDERS);
    }
}
