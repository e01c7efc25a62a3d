//! What the agent knows about each item it sells: the center's policy, and the flags
//! behind the sold-out fast path and end-of-sale behaviour. In memory only; rebuilt from
//! the center (DescribeItem) and the pool store after a restart.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use inventory_core::watermarks::Watermarks;
use inventory_proto::v1 as pb;

use crate::store::{PoolKey, PoolSnapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub per_user_limit: u64,
    pub reservation_ttl_ms: u64,
    pub watermarks: Watermarks,
    pub closed: bool,
}

impl Policy {
    pub fn from_describe(d: &pb::DescribeItemResponse) -> Self {
        let w = d.watermarks.unwrap_or_default();
        Self {
            per_user_limit: d.per_user_limit,
            reservation_ttl_ms: d.reservation_ttl_ms,
            watermarks: Watermarks { low: w.low, high: w.high, batch: w.batch.max(1) },
            closed: d.closed,
        }
    }
}

pub struct ItemRuntime {
    pub item_id: String,
    pub pool: PoolKey,
    policy: RwLock<Policy>,
    /// The center said it has none left (last Borrow or DescribeItem answered 0).
    center_dry: AtomicBool,
    /// The center asked holders to give back idle units: borrow only on real misses.
    end_of_sale: AtomicBool,
    /// The pool store answered sold out with 0 available.
    local_empty: AtomicBool,
    /// While sold out everywhere: the keys that reserved (loaded once from the store), so
    /// their replays still reach the store and every other request is answered from
    /// memory. `None` when the fast path is off.
    fast_path_keys: RwLock<Option<HashSet<String>>>,
    /// Since when available has been above the high watermark.
    pub above_high_since: Mutex<Option<i64>>,
    /// Serialises Borrows of this item: concurrent misses share one call.
    pub borrow_lock: tokio::sync::Mutex<()>,
    /// Completed Borrows; a waiter that sees it move knows another borrow just finished.
    pub borrows_done: AtomicU64,
    /// The pool's generation as first seen; a change means the store lost the pool.
    pub generation: AtomicU64,
    /// Set when the pool store lost this pool: selling stops until reconciled.
    pub frozen: AtomicBool,
    /// Set while the center holds some of the channel's units of this item in doubt (a
    /// reclaim without the agent's last word): no selling until an operator settles them,
    /// but the pool itself is intact and reported as it is.
    pub held_in_doubt: AtomicBool,
    last_starving_signal_ms: AtomicI64,
    /// When to resync the pool with the center (0: no resync pending).
    resync_at_ms: AtomicI64,
    /// Something happened to the pool since the rebalancer last looked at it.
    dirty: AtomicBool,
    /// When the rebalancer last looked at the pool (ms).
    last_look_ms: AtomicI64,
    /// The pool as last read from the store (metrics render from it: a scrape costs no
    /// store call).
    last_snapshot: Mutex<Option<PoolSnapshot>>,
    /// The report the center last acknowledged for this pool (heartbeats send a pool only
    /// when it differs).
    last_reported: Mutex<Option<pb::PoolReport>>,
}

impl ItemRuntime {
    pub fn new(item_id: String, channel: &str, policy: Policy, center_available: u64) -> Self {
        Self {
            pool: PoolKey::new(channel, item_id.clone()),
            item_id,
            policy: RwLock::new(policy),
            center_dry: AtomicBool::new(center_available == 0),
            end_of_sale: AtomicBool::new(false),
            local_empty: AtomicBool::new(false),
            fast_path_keys: RwLock::new(None),
            above_high_since: Mutex::new(None),
            borrow_lock: tokio::sync::Mutex::new(()),
            borrows_done: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            frozen: AtomicBool::new(false),
            held_in_doubt: AtomicBool::new(false),
            last_starving_signal_ms: AtomicI64::new(0),
            resync_at_ms: AtomicI64::new(0),
            dirty: AtomicBool::new(true),
            last_look_ms: AtomicI64::new(0),
            last_snapshot: Mutex::new(None),
            last_reported: Mutex::new(None),
        }
    }

    pub fn remember_snapshot(&self, s: PoolSnapshot) {
        *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    pub fn last_snapshot(&self) -> Option<PoolSnapshot> {
        *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `report` differs from what the center last acknowledged.
    pub fn report_changed(&self, report: &pb::PoolReport) -> bool {
        self.last_reported.lock().unwrap_or_else(|e| e.into_inner()).as_ref() != Some(report)
    }

    pub fn reported(&self, report: pb::PoolReport) {
        *self.last_reported.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
    }

    pub fn policy(&self) -> Policy {
        *self.policy.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_policy(&self, p: Policy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = p;
    }

    pub fn set_watermarks(&self, w: Watermarks) {
        self.policy.write().unwrap_or_else(|e| e.into_inner()).watermarks = w;
    }

    pub fn center_dry(&self) -> bool {
        self.center_dry.load(Ordering::Acquire)
    }

    /// Records what the center said it has left.
    pub fn set_center_available(&self, available: u64) {
        let dry = available == 0;
        self.center_dry.store(dry, Ordering::Release);
        if !dry {
            self.fast_path_off();
        }
    }

    /// Marks the pool as changed: the rebalancer looks at it on its next tick.
    pub fn touch(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Whether the rebalancer should look at the pool now: it changed, a resync is due,
    /// or `idle_every_ms` passed (reservations may have expired meanwhile). With many
    /// items, quiet pools then cost one look per `idle_every_ms` instead of one per tick.
    pub fn needs_look(&self, now_ms: i64, idle_every_ms: i64) -> bool {
        let due = self.dirty.swap(false, Ordering::AcqRel)
            || self.resync_due(now_ms)
            || now_ms - self.last_look_ms.load(Ordering::Acquire) >= idle_every_ms;
        if due {
            self.last_look_ms.store(now_ms, Ordering::Release);
        }
        due
    }

    /// Asks for a resync at `at_ms` (the latest request wins).
    pub fn schedule_resync(&self, at_ms: i64) {
        self.resync_at_ms.store(at_ms, Ordering::Release);
    }

    pub fn resync_due(&self, now_ms: i64) -> bool {
        self.resync_scheduled(now_ms).is_some()
    }

    /// Whether a resync is scheduled (an outcome is still unknown), due or not.
    pub fn resync_pending(&self) -> bool {
        self.resync_at_ms.load(Ordering::Acquire) != 0
    }

    /// The due resync's schedule, if one is due.
    pub fn resync_scheduled(&self, now_ms: i64) -> Option<i64> {
        let at = self.resync_at_ms.load(Ordering::Acquire);
        (at != 0 && now_ms >= at).then_some(at)
    }

    /// Clears the schedule a resync served, unless a newer one replaced it meanwhile.
    pub fn resync_done(&self, served: i64) {
        let _ = self.resync_at_ms.compare_exchange(served, 0, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The center has plenty again (a full grant with stock to spare): prefetch resumes.
    pub fn clear_end_of_sale(&self) {
        self.end_of_sale.store(false, Ordering::Release);
    }

    /// Rate limit for the Borrow a starving pool sends while the center looks dry: it
    /// tells the center this channel has demand (so holders are asked to give back)
    /// without sending a call per request.
    pub fn starving_signal_due(&self, now_ms: i64, every_ms: i64) -> bool {
        let last = self.last_starving_signal_ms.load(Ordering::Acquire);
        now_ms - last >= every_ms
            && self.last_starving_signal_ms.compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    pub fn end_of_sale(&self) -> bool {
        self.end_of_sale.load(Ordering::Acquire)
    }

    pub fn set_end_of_sale(&self) {
        self.end_of_sale.store(true, Ordering::Release);
    }

    /// Whether the pool may borrow ahead of demand (watermark refills).
    pub fn may_prefetch(&self) -> bool {
        !self.center_dry() && !self.end_of_sale()
    }

    pub fn local_empty(&self) -> bool {
        self.local_empty.load(Ordering::Acquire)
    }

    pub fn mark_local_empty(&self) {
        self.local_empty.store(true, Ordering::Release);
    }

    /// Units came back into the pool (refill, cancel, expiry): the pool may sell again.
    pub fn stock_returned_locally(&self) {
        self.local_empty.store(false, Ordering::Release);
        self.fast_path_off();
    }

    pub fn fast_path_off(&self) {
        *self.fast_path_keys.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Turns the fast path on with the keys that reserved.
    pub fn fast_path_on(&self, keys: HashSet<String>) {
        if self.center_dry() && self.local_empty.load(Ordering::Acquire) {
            *self.fast_path_keys.write().unwrap_or_else(|e| e.into_inner()) = Some(keys);
        }
    }

    pub fn fast_path_wanted(&self) -> bool {
        self.center_dry()
            && self.local_empty.load(Ordering::Acquire)
            && self.fast_path_keys.read().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// `Some(true)`: answer SOLD_OUT from memory. `Some(false)`: the key reserved before,
    /// go to the store for its replay. `None`: the fast path is off.
    pub fn fast_sold_out(&self, idempotency_key: &str) -> Option<bool> {
        if !self.center_dry() || !self.local_empty.load(Ordering::Acquire) {
            return None;
        }
        let keys = self.fast_path_keys.read().unwrap_or_else(|e| e.into_inner());
        keys.as_ref().map(|k| !k.contains(idempotency_key))
    }
}
