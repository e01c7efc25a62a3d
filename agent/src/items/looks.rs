//! The rebalancer's queue of items to look at: those whose rules turned dirty (a sale, an
//! operation's end) since it last took them. Its frequent passes look at these without
//! scanning every item of a large catalogue; the rest wait for its scans of them all
//! (`workers::rebalancer`). An item is queued by the release of its lock
//! (`Locked`), at most once until taken.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::Item;

#[derive(Default)]
pub struct LookQueue(Mutex<Vec<String>>);

impl LookQueue {
    pub(crate) fn push(&self, item_id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(item_id.to_owned());
    }

    /// The queued items, each once, found by `lookup`. Each is marked unqueued before the
    /// caller reads its rules: turning dirty after this queues it again.
    pub fn take(&self, lookup: impl Fn(&str) -> Option<Arc<Item>>) -> Vec<Arc<Item>> {
        let ids = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        ids.iter()
            .filter_map(|id| {
                let item = lookup(id)?;
                item.look_queued.store(false, Ordering::Release);
                Some(item)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inventory_core::channel::{Policy, Settings};
    use inventory_core::watermarks::Watermarks;

    fn item(id: &str) -> Arc<Item> {
        let policy = Policy {
            per_user_limit: 1,
            reservation_ttl_ms: 60_000,
            watermarks: Watermarks { low: 1, high: 4, batch: 2 },
            rate_batching: None,
            closed: false,
        };
        Arc::new(Item::new(id.to_owned(), "web", policy, 10, Settings::default()))
    }

    fn take(q: &LookQueue, items: &[&Arc<Item>]) -> Vec<String> {
        q.take(|id| items.iter().find(|i| i.item_id == id).map(|i| Arc::clone(i)))
            .iter()
            .map(|i| i.item_id.clone())
            .collect()
    }

    #[test]
    fn an_item_is_queued_when_its_rules_turn_dirty_once_until_taken() {
        let q = Arc::new(LookQueue::default());
        let (a, b) = (item("a"), item("b"));
        // New items start dirty: joining queues them.
        a.join_looks(&q);
        b.join_looks(&q);
        a.with(|c| c.touch());
        assert_eq!(take(&q, &[&a, &b]), ["a", "b"], "each once");
        assert!(take(&q, &[&a, &b]).is_empty());

        // Still dirty (nobody looked): queued again at its next release.
        a.with(|_| ());
        // Looked at (dirty taken): not queued, until it turns dirty again.
        b.with(|c| c.needs_look(0, i64::MAX));
        b.with(|_| ());
        assert_eq!(take(&q, &[&a, &b]), ["a"]);
        b.with(|c| c.touch());
        assert_eq!(take(&q, &[&a, &b]), ["b"]);
    }

    #[test]
    fn an_item_not_joined_is_never_queued() {
        let q = LookQueue::default();
        let a = item("a");
        a.with(|c| c.touch());
        assert!(take(&q, &[&a]).is_empty());
    }
}
