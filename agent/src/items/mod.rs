//! The items the agent sells: each one's rules ([`ItemCore`], behind a short lock never
//! held across an await) and its pool's key, loaded from the center on first use.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use dashmap::DashMap;
use inventory_core::buyers::{LimitScope, RegistryFallback};
use inventory_core::channel::{ItemCore, Mode, OpId, OpResult, Policy, PoolView, Settings, Shelf};
use inventory_core::schedule::Schedule;
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_core::{Channel, ItemId};
use inventory_proto::v1 as pb;
use tokio::sync::oneshot;

use crate::error::{AgentError, from_center};
use crate::link::CenterLink;
use crate::store::{PoolKey, PoolSnapshot};

mod looks;
pub use looks::LookQueue;

/// How long an item id the center does not know is answered NOT_FOUND without asking (so
/// an item created meanwhile becomes sellable within this).
const UNKNOWN_ITEM_MS: i64 = 1_000;

/// Lookups of items not loaded yet, per second, at most (`--item-lookups-per-sec`): a
/// flood of random item ids costs the center this many DescribeItem calls a second, not
/// one per request.
pub const DEFAULT_LOOKUPS_PER_SEC: u32 = 1_000;

/// At most this many unknown ids are remembered (a flood of random ids cannot grow it).
const UNKNOWN_ITEMS_KEPT: usize = 100_000;

/// The item's settings from a DescribeItem answer.
pub fn policy_from(d: &pb::DescribeItemResponse) -> Policy {
    let w = d.watermarks.unwrap_or_default();
    Policy {
        per_user_limit: d.per_user_limit,
        reservation_ttl_ms: d.reservation_ttl_ms,
        watermarks: Watermarks { low: w.low, high: w.high, batch: w.batch.max(1) },
        rate_batching: d.rate_batching.filter(|r| r.enabled).map(|r| RateBatching {
            min_batch: r.min_batch.max(1),
            max_batch: r.max_batch.max(r.min_batch).max(1),
            target_ms: r.target_ms.max(1),
        }),
        closed: d.closed,
    }
}

/// The item's schedule from a DescribeItem answer (the center's clock).
pub fn schedule_from(d: &pb::DescribeItemResponse) -> Schedule {
    Schedule {
        opens_at_ms: d.opens_at_unix_ms,
        closes_at_ms: d.closes_at_unix_ms,
        prestock_lead_ms: d.prestock_lead_ms,
    }
}

/// Where an item's per-user limit applies and what to do without the buyer registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemLimit {
    pub scope: LimitScope,
    pub fallback: RegistryFallback,
}

/// The limit settings from a DescribeItem answer (unknown numbers: the defaults).
pub fn limit_from(d: &pb::DescribeItemResponse) -> ItemLimit {
    ItemLimit {
        scope: LimitScope::from_number(i64::from(d.limit_scope)).unwrap_or_default(),
        fallback: RegistryFallback::from_number(i64::from(d.registry_fallback)).unwrap_or_default(),
    }
}

/// A pool snapshot as the rules read it.
pub fn view(s: &PoolSnapshot) -> PoolView {
    PoolView::from(s)
}

pub(crate) struct ItemState {
    pub core: ItemCore,
    /// Callers waiting for an operation of the item to finish.
    pub waiters: HashMap<OpId, oneshot::Sender<OpResult>>,
}

impl ItemState {
    /// Hands each finished operation's result to whoever waits for it.
    pub fn finished(&mut self, finished: &[(OpId, OpResult)]) {
        for (id, result) in finished {
            if let Some(tx) = self.waiters.remove(id) {
                let _ = tx.send(*result);
            }
        }
    }
}

/// One item of the channel.
pub struct Item {
    pub item_id: String,
    /// Segment 0's pool: the item's one pool unless it is segmented.
    pub pool: PoolKey,
    /// Every segment's pool, segment s at index s (one entry for an unsegmented item).
    pub pools: Vec<PoolKey>,
    /// Held by a move between segments from its intent to its refill, and by every read of
    /// the item's segments as one pool (which finishes recorded moves first), so no such
    /// read sees moved units in neither segment (`crate::segmented`).
    pub(crate) moves: tokio::sync::Mutex<()>,
    /// Where the per-user limit applies; part of the item's definition, so fixed.
    pub limit: ItemLimit,
    state: Mutex<ItemState>,
    /// The pool's outbox as last read (metrics render from it), and when (or when the item
    /// was made, before the first read).
    outbox: Mutex<(Option<crate::store::OutboxStats>, Instant)>,
    /// Each segment's counters as last read (metrics and reports render from them).
    segment_snapshots: Mutex<Vec<inventory_core::pool::PoolSnapshot>>,
    /// Which segments the store lost (the leading replica's reads).
    segment_health: Mutex<crate::segment_health::SegmentHealth>,
    /// Where the item goes when its rules turn dirty, and whether it is there already.
    looks: std::sync::OnceLock<Arc<LookQueue>>,
    /// In `looks` (cleared by [`LookQueue::take`]).
    pub(crate) look_queued: AtomicBool,
}

/// The item's state, locked. On release an item whose rules turned dirty is queued for
/// the rebalancer ([`LookQueue`]).
pub(crate) struct Locked<'a> {
    item: &'a Item,
    state: MutexGuard<'a, ItemState>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = ItemState;
    fn deref(&self) -> &ItemState {
        &self.state
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut ItemState {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if self.state.core.is_dirty()
            && let Some(looks) = self.item.looks.get()
            && !self.item.look_queued.swap(true, Ordering::AcqRel)
        {
            looks.push(&self.item.item_id);
        }
    }
}

impl Item {
    pub fn new(item_id: String, channel: &str, policy: Policy, center_available: u64, settings: Settings) -> Self {
        Self {
            pool: PoolKey::new(channel, item_id.clone()),
            pools: vec![PoolKey::new(channel, item_id.clone())],
            moves: tokio::sync::Mutex::new(()),
            item_id,
            limit: ItemLimit::default(),
            state: Mutex::new(ItemState {
                core: ItemCore::new(policy, center_available, settings),
                waiters: HashMap::new(),
            }),
            outbox: Mutex::new((None, Instant::now())),
            segment_snapshots: Mutex::new(Vec::new()),
            segment_health: Mutex::new(Default::default()),
            looks: std::sync::OnceLock::new(),
            look_queued: AtomicBool::new(false),
        }
    }

    /// From now on the item goes to `looks` whenever its rules turn dirty (now, if they
    /// are). Called once the item is registered, so the rebalancer finds it by its id.
    pub(crate) fn join_looks(&self, looks: &Arc<LookQueue>) {
        let _ = self.looks.set(Arc::clone(looks));
        drop(self.lock());
    }

    pub fn with_limit(self, limit: ItemLimit) -> Self {
        Self { limit, ..self }
    }

    /// The item's settings and schedule as a DescribeItem answered them (its definition,
    /// the limit and the segments, does not change).
    pub fn apply_describe(&self, d: &pb::DescribeItemResponse) {
        self.with(|c| {
            c.set_policy(policy_from(d));
            c.set_schedule(schedule_from(d));
            c.set_center_reserve(d.center_reserve);
        });
    }

    /// The item's pool split into `segments` pools (`DescribeItem.segments`; 0 and 1: one).
    pub fn with_segments(self, segments: u32) -> Self {
        let n = segments.clamp(1, inventory_core::segments::MAX_SEGMENTS);
        let pools = (0..n).map(|s| PoolKey::segment(self.pool.channel.clone(), self.item_id.clone(), s)).collect();
        Self { pools, ..self }
    }

    /// How many segments the item's pool has in this channel (1: not segmented).
    pub fn segments(&self) -> u32 {
        u32::try_from(self.pools.len()).unwrap_or(1)
    }

    pub fn is_segmented(&self) -> bool {
        self.pools.len() > 1
    }

    /// The pool of the segment serving `user_id`.
    pub fn pool_for_user(&self, user_id: &str) -> &PoolKey {
        &self.pools[inventory_core::segments::route(user_id, self.segments()) as usize]
    }

    /// The pool holding a reservation by its id (`s<N>.` prefix), or `None` when the id
    /// names a segment the item does not have.
    pub fn pool_for_reservation(&self, reservation_id: &str) -> Option<&PoolKey> {
        let (segment, _) = inventory_core::segments::split_reservation_id(reservation_id, self.segments())?;
        self.pools.get(segment as usize)
    }

    pub fn set_outbox_stats(&self, stats: crate::store::OutboxStats) {
        *self.outbox.lock().unwrap_or_else(|e| e.into_inner()) = (Some(stats), Instant::now());
    }

    pub fn set_segment_snapshots(&self, snaps: &[inventory_core::pool::PoolSnapshot]) {
        *self.segment_snapshots.lock().unwrap_or_else(|e| e.into_inner()) = snaps.to_vec();
    }

    /// Each segment's available units as last read (empty before the first read).
    pub fn segment_available(&self) -> Vec<u64> {
        self.segment_snapshots.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|s| s.available).collect()
    }

    pub(crate) fn with_segment_health<R>(&self, f: impl FnOnce(&mut crate::segment_health::SegmentHealth) -> R) -> R {
        f(&mut self.segment_health.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether the store lost this segment (its buyers wait until it is reopened).
    pub fn segment_lost(&self, segment: u32) -> bool {
        self.with_segment_health(|h| h.is_lost(segment))
    }

    /// The segments the store lost, by number.
    pub fn lost_segments(&self) -> Vec<u32> {
        self.with_segment_health(|h| h.lost())
    }

    /// The pools of the segments not lost (every pool when none is, or all are).
    pub fn intact_pools(&self) -> Vec<PoolKey> {
        self.with_segment_health(|h| {
            // Every one lost is the whole pool lost: the store's own answers (a pool
            // missing) tell the rules, as for an unsegmented item.
            let all = h.all_lost();
            (0u32..).zip(&self.pools).filter(|(s, _)| all || !h.is_lost(*s)).map(|(_, p)| p.clone()).collect()
        })
    }

    /// The lost segments were created again.
    pub fn segments_reopened(&self) {
        self.with_segment_health(|h| h.reopened());
    }

    /// Each segment as last read, for a heartbeat: counters and whether it is lost.
    pub fn segment_counts(&self) -> Vec<inventory_core::segments::SegmentCounts> {
        let snaps = self.segment_snapshots.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.with_segment_health(|h| {
            (0u32..)
                .zip(&snaps)
                .map(|(segment, s)| inventory_core::segments::SegmentCounts {
                    segment,
                    counts: inventory_core::ledger::PoolCounts {
                        available: s.available,
                        reserved: s.reserved,
                        sold: s.sold,
                    },
                    lost: h.is_lost(segment),
                })
                .collect()
        })
    }

    /// The pool's outbox as last read, if read yet.
    pub fn outbox_stats(&self) -> Option<crate::store::OutboxStats> {
        self.outbox.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// How long ago the outbox was last read (since the item was made, before the first read).
    pub fn outbox_age(&self) -> std::time::Duration {
        self.outbox.lock().unwrap_or_else(|e| e.into_inner()).1.elapsed()
    }

    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked { item: self, state: self.state.lock().unwrap_or_else(|e| e.into_inner()) }
    }

    /// Runs `f` over the item's rules (a short critical section: no await inside).
    pub fn with<R>(&self, f: impl FnOnce(&mut ItemCore) -> R) -> R {
        f(&mut self.lock().core)
    }

    pub fn policy(&self) -> Policy {
        self.with(|c| c.policy())
    }

    pub fn mode(&self) -> Mode {
        self.with(|c| c.mode())
    }

    /// The pool as last read (metrics render from it: a scrape costs no store call).
    pub fn last_snapshot(&self) -> Option<PoolView> {
        self.with(|c| c.last_view())
    }

    /// The pool's recent sell rate (units/s × 1000) and the batch it borrows now.
    pub fn rate_and_batch(&self, now_ms: i64) -> (u64, u64) {
        self.with(|c| (c.sell_rate_milli(now_ms), c.watermarks_at(now_ms).batch))
    }

    /// `Some(true)`: an Acquire with this key is answered SOLD_OUT from memory.
    /// `Some(false)`: the key reserved before; it goes to the store. `None`: the fast path is off.
    pub fn fast_sold_out(&self, idempotency_key: &str) -> Option<bool> {
        self.with(|c| match c.shelf() {
            Shelf::EmptyFast(keys) if c.supply().center_dry => Some(!keys.contains(idempotency_key)),
            _ => None,
        })
    }
}

/// The registry of items, loaded from the center on first use.
pub struct Items {
    channel: Channel,
    settings: Settings,
    items: DashMap<String, Arc<Item>>,
    /// Items being loaded (one DescribeItem per item at a time).
    loading: DashMap<String, Arc<tokio::sync::OnceCell<Arc<Item>>>>,
    /// Item ids the center said it does not know, and until when (ms) to believe it: a
    /// flood of calls for one unknown id costs one DescribeItem per [`UNKNOWN_ITEM_MS`].
    unknown: DashMap<String, i64>,
    lookups: governor::DefaultDirectRateLimiter,
    /// DescribeItem calls made to load items, and lookups refused by the bound.
    lookups_made: AtomicU64,
    lookups_refused: AtomicU64,
    /// Where a loaded item's pool floors go before anyone can touch its pools.
    store: Arc<dyn crate::store::PoolStore>,
    /// The items whose rules turned dirty, for the rebalancer.
    looks: Arc<LookQueue>,
}

impl Items {
    pub fn new(
        channel: Channel,
        settings: Settings,
        lookups_per_sec: u32,
        store: Arc<dyn crate::store::PoolStore>,
    ) -> Self {
        let per_sec = NonZeroU32::new(lookups_per_sec.max(1)).expect("max(1)");
        Self {
            channel,
            settings,
            items: DashMap::new(),
            loading: DashMap::new(),
            unknown: DashMap::new(),
            lookups: governor::RateLimiter::direct(governor::Quota::per_second(per_sec)),
            lookups_made: AtomicU64::new(0),
            lookups_refused: AtomicU64::new(0),
            store,
            looks: Arc::default(),
        }
    }

    /// The items whose rules turned dirty since the last call, each once.
    pub fn take_looks_wanted(&self) -> Vec<Arc<Item>> {
        self.looks.take(|id| self.get(id))
    }

    pub fn get(&self, id: &str) -> Option<Arc<Item>> {
        self.items.get(id).map(|e| Arc::clone(e.value()))
    }

    /// The rules' tunables every item runs with.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    pub fn all(&self) -> Vec<Arc<Item>> {
        self.items.iter().map(|e| Arc::clone(e.value())).collect()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// DescribeItem calls made to load items so far.
    pub fn lookups_made(&self) -> u64 {
        self.lookups_made.load(Ordering::Relaxed)
    }

    /// Loads refused by the lookup bound so far.
    pub fn lookups_refused(&self) -> u64 {
        self.lookups_refused.load(Ordering::Relaxed)
    }

    /// The item, loading its policy from the center on first use. The flag says whether
    /// this call loaded it.
    pub async fn load(
        &self,
        item: &ItemId,
        link: &Arc<CenterLink>,
        now_ms: i64,
    ) -> Result<(Arc<Item>, bool), AgentError> {
        if let Some(it) = self.get(item.as_str()) {
            return Ok((it, false));
        }
        if self.unknown.get(item.as_str()).is_some_and(|until| now_ms < *until) {
            return Err(AgentError::NotFound(format!("item {item} not found")));
        }
        // Single flight: the first buyers of a new item all wait for one DescribeItem.
        let cell = Arc::clone(self.loading.entry(item.to_string()).or_default().value());
        let mut loaded_here = false;
        let result = cell
            .get_or_try_init(|| async {
                loaded_here = true;
                // A load that failed before this caller's turn came leaves the cell empty:
                // believe its NOT_FOUND rather than asking again.
                if self.unknown.get(item.as_str()).is_some_and(|until| now_ms < *until) {
                    return Err(AgentError::NotFound(format!("item {item} not found")));
                }
                if self.lookups.check().is_err() {
                    self.lookups_refused.fetch_add(1, Ordering::Relaxed);
                    return Err(AgentError::Unavailable(format!(
                        "too many lookups of items this agent does not know yet; retry item_id {item:?} later"
                    )));
                }
                self.lookups_made.fetch_add(1, Ordering::Relaxed);
                // Sent with the other items loading meanwhile (one DescribeItems call).
                let d = link.describe_to_load(item.as_str()).await.map_err(from_center)?;
                let it = Item::new(
                    item.to_string(),
                    self.channel.as_str(),
                    policy_from(&d),
                    d.center_available,
                    self.settings,
                )
                .with_limit(limit_from(&d))
                .with_segments(d.segments);
                it.with(|c| {
                    c.set_schedule(schedule_from(&d));
                    c.set_center_reserve(d.center_reserve);
                    c.set_center_available(d.center_available);
                });
                // Before the item is seen by anyone: a pool that went back in time since
                // the channel last reported is caught by the first call that touches it.
                crate::store::raise_floors(self.store.as_ref(), &it.pools, &d.write_seq_floors)
                    .await
                    .map_err(AgentError::from)?;
                Ok::<_, AgentError>(Arc::new(it))
            })
            .await
            .map(|it| Arc::clone(self.items.entry(item.to_string()).or_insert_with(|| Arc::clone(it)).value()));
        // Whatever the outcome, the cell has served its purpose (callers waiting on it hold
        // their own handle): the map of loads in progress stays as small as the loads.
        self.loading.remove(item.as_str());
        match result {
            Ok(it) => {
                it.join_looks(&self.looks);
                Ok((it, loaded_here))
            }
            Err(e) => {
                if matches!(e, AgentError::NotFound(_)) {
                    if self.unknown.len() >= UNKNOWN_ITEMS_KEPT {
                        self.unknown.clear();
                    }
                    self.unknown.insert(item.to_string(), now_ms + UNKNOWN_ITEM_MS);
                }
                Err(e)
            }
        }
    }
}
