//! The agent's behaviour: selling (the hot path), borrowing and returning, reporting,
//! and bringing pools in line with the center after (re)registration. The gRPC service
//! and the worker loops call into this; the decisions themselves are in
//! `inventory_core::rebalance`.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use inventory_core::rebalance::{self, Action, Inputs};
use inventory_core::{ItemId, UserId};
use inventory_proto::v1 as pb;
use tonic::Code;
use tracing::Instrument;

use crate::error::{AgentError, from_center};
use crate::items::{ItemRuntime, Policy};
use crate::link::CenterLink;
use crate::metrics::Metrics;
use crate::security::UserLimits;
use crate::store::{AcquireArgs, AcquireResult, PoolSnapshot, PoolStore, ReservationState, StoreError, Transition};

/// After a Borrow or Return with an unknown outcome, resync the pool this much later (a
/// late call has landed or been refused by then).
const RESYNC_AFTER_UNKNOWN_MS: i64 = 5_000;

/// How long an item id the center does not know is answered NOT_FOUND without asking.
const UNKNOWN_ITEM_MS: i64 = 2_000;

/// At most this many unknown ids are remembered (a flood of random ids cannot grow it).
const UNKNOWN_ITEMS_KEPT: usize = 100_000;

/// Pool reads in flight at once when reading many pools (reports).
const STORE_READS_IN_FLIGHT: usize = 64;

/// At most one starvation Borrow per item per this many ms.
const STARVING_SIGNAL_EVERY_MS: i64 = 200;

/// Tunables of the agent's behaviour.
#[derive(Debug, Clone, Copy)]
pub struct AgentSettings {
    /// How long an Acquire that found the pool empty waits for the shared Borrow.
    pub miss_wait: Duration,
    /// How long the pool must stay above the high watermark before surplus goes back.
    pub return_sustain_ms: u64,
    /// How long a replica's claim to lead the channel lasts unless renewed.
    pub leader_ttl_ms: u64,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self { miss_wait: Duration::from_secs(2), return_sustain_ms: 2_000, leader_ttl_ms: 3_000 }
    }
}

/// A validated Acquire.
pub struct AcquireRequest {
    pub item: ItemId,
    pub user: UserId,
    pub quantity: u64,
    pub idempotency_key: String,
}

pub struct Agent {
    pub store: Arc<dyn PoolStore>,
    pub limits: UserLimits,
    /// Acquires refused by the per-user rate limit.
    pub rate_limited: std::sync::atomic::AtomicU64,
    pub link: CenterLink,
    pub items: DashMap<String, Arc<ItemRuntime>>,
    /// Items being loaded from the center (one DescribeItem per item at a time).
    loading: DashMap<String, Arc<tokio::sync::OnceCell<Arc<ItemRuntime>>>>,
    /// Item ids the center said it does not know, and until when (ms) to believe it: a
    /// flood of calls for one unknown id costs one DescribeItem per [`UNKNOWN_ITEM_MS`].
    unknown: DashMap<String, i64>,
    pub metrics: Metrics,
    pub settings: AgentSettings,
    draining: AtomicBool,
    /// Whether this replica leads its channel (see [`crate::replicas`]): only the leader
    /// talks to the center about stock; every replica sells from the shared pools.
    leading: AtomicBool,
}

impl Agent {
    pub fn new(store: Arc<dyn PoolStore>, link: CenterLink, settings: AgentSettings, limits: UserLimits) -> Self {
        Self {
            store,
            limits,
            rate_limited: Default::default(),
            link,
            items: DashMap::new(),
            loading: DashMap::new(),
            unknown: DashMap::new(),
            metrics: Metrics::default(),
            settings,
            draining: AtomicBool::new(false),
            leading: AtomicBool::new(false),
        }
    }

    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    pub(crate) fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Release);
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The item's runtime, loading its policy from the center on first use.
    pub async fn item(&self, item: &ItemId) -> Result<Arc<ItemRuntime>, AgentError> {
        if let Some(rt) = self.items.get(item.as_str()) {
            return Ok(Arc::clone(&rt));
        }
        let now = crate::clock::now_ms();
        if self.unknown.get(item.as_str()).is_some_and(|until| now < *until) {
            return Err(AgentError::NotFound(format!("item {item} not found")));
        }
        // Single flight: the first buyers of a new item all wait for one DescribeItem
        // instead of each asking the center.
        let cell = Arc::clone(self.loading.entry(item.to_string()).or_default().value());
        let rt = cell
            .get_or_try_init(|| async {
                let d = self.link.describe(item.as_str()).await.map_err(from_center)?;
                Ok::<_, AgentError>(Arc::new(ItemRuntime::new(
                    item.to_string(),
                    self.link.channel.as_str(),
                    Policy::from_describe(&d),
                    d.center_available,
                )))
            })
            .await;
        let rt = rt.map(|rt| Arc::clone(self.items.entry(item.to_string()).or_insert_with(|| Arc::clone(rt)).value()));
        // Whatever the outcome, the cell has served its purpose (callers waiting on it hold
        // their own handle): the map of loads in progress stays as small as the loads.
        self.loading.remove(item.as_str());
        let rt = match rt {
            Ok(rt) => rt,
            Err(e) => {
                if matches!(e, AgentError::NotFound(_)) {
                    if self.unknown.len() >= UNKNOWN_ITEMS_KEPT {
                        self.unknown.clear();
                    }
                    self.unknown.insert(item.to_string(), now + UNKNOWN_ITEM_MS);
                }
                return Err(e);
            }
        };
        if !self.is_leading() {
            // The leader may not know the item yet: it looks after every pool's stock.
            crate::replicas::want(self, &rt).await;
        }
        Ok(rt)
    }

    pub fn items(&self) -> Vec<Arc<ItemRuntime>> {
        self.items.iter().map(|e| Arc::clone(e.value())).collect()
    }

    /// The hot path. One store call in the common case; none when sold out everywhere.
    pub async fn acquire(self: &Arc<Self>, req: AcquireRequest) -> Result<pb::AcquireResponse, AgentError> {
        if self.is_draining() {
            return Err(AgentError::Unavailable("agent is shutting down; retry on another agent".into()));
        }
        if !self.limits.allow(req.user.as_str()) {
            self.rate_limited.fetch_add(1, Ordering::Relaxed);
            return Err(AgentError::ResourceExhausted(format!(
                "user_id {:?} is sending requests too fast; retry later",
                req.user.as_str()
            )));
        }
        if !self.link.lease_valid() {
            return Err(AgentError::Unavailable(
                "agent's lease with the center has expired; not selling until it is renewed".into(),
            ));
        }
        let item = self.item(&req.item).await?;
        if item.held_in_doubt.load(Ordering::Acquire) {
            return Err(AgentError::Unavailable(format!(
                "units of item {} are in doubt at the center; selling waits for an operator to resolve them",
                item.item_id
            )));
        }
        if item.frozen.load(Ordering::Acquire) {
            return Err(AgentError::Unavailable(format!(
                "pool of item {} lost its data in the store; selling is frozen until reconciled",
                item.item_id
            )));
        }
        let policy = item.policy();
        if req.quantity > policy.per_user_limit {
            return Err(inventory_core::ValidationError::new(
                "quantity",
                req.quantity,
                format!("must be at most the per-user limit {} of item {}", policy.per_user_limit, item.item_id),
            )
            .into());
        }
        if item.fast_sold_out(&req.idempotency_key) == Some(true) || policy.closed {
            self.metrics.acquire(Outcome::SoldOutFast);
            self.signal_starving(&item, req.quantity);
            return Ok(sold_out());
        }
        let args = AcquireArgs {
            user_id: req.user.to_string(),
            quantity: req.quantity,
            idempotency_key: req.idempotency_key,
            new_reservation_id: uuid::Uuid::new_v4().simple().to_string(),
            per_user_limit: policy.per_user_limit,
            reservation_ttl_ms: policy.reservation_ttl_ms,
        };
        let mut result = self.store.acquire(&item.pool, &args).await?;
        item.touch();
        if let AcquireResult::SoldOut { .. } = result {
            if !self.is_leading() {
                // A follower does not borrow: it tells the leader and waits for the refill.
                if crate::replicas::wait_for_stock(self, &item, req.quantity).await {
                    result = self.store.acquire(&item.pool, &args).await?;
                }
            } else if item.center_dry() {
                self.signal_starving(&item, req.quantity);
            } else {
                // Pool empty: join the single in-flight Borrow, wait a bounded time, retry
                // once. At the end of a sale grants are small: just what this call needs.
                let want = if item.end_of_sale() { req.quantity } else { policy.watermarks.batch.max(req.quantity) };
                if self.borrow_shared(&item, want).await {
                    result = self.store.acquire(&item.pool, &args).await?;
                }
                if matches!(result, AcquireResult::SoldOut { .. }) && !self.link.reachable() {
                    // Not sold out: the pool is empty and the center cannot be asked.
                    return Err(AgentError::Unavailable(
                        "local pool is empty and the center is unreachable; retry with the same idempotency_key".into(),
                    ));
                }
            }
        }
        let response = match result {
            AcquireResult::Reserved { reservation_id, quantity, expires_at_ms, replayed } => {
                self.metrics.acquire(Outcome::Reserved);
                pb::AcquireResponse {
                    outcome: pb::AcquireOutcome::Reserved as i32,
                    reservation_id,
                    expires_at_unix_ms: expires_at_ms,
                    replayed,
                    quantity,
                }
            }
            AcquireResult::SoldOut { available } => {
                self.metrics.acquire(Outcome::SoldOut);
                // Followers skip the in-memory fast path: another replica's cancel or the
                // leader's refill would not reach this process's view of the pool.
                if available == 0 && self.is_leading() {
                    item.mark_local_empty();
                    if item.fast_path_wanted() {
                        self.enable_fast_path(&item).await;
                    }
                }
                sold_out()
            }
            AcquireResult::LimitExceeded { .. } => {
                self.metrics.acquire(Outcome::LimitExceeded);
                pb::AcquireResponse { outcome: pb::AcquireOutcome::LimitExceeded as i32, ..Default::default() }
            }
            AcquireResult::KeyConflict => {
                return Err(AgentError::AlreadyExists(format!(
                    "idempotency_key {:?} was already used for another user or quantity",
                    args.idempotency_key
                )));
            }
        };
        Ok(response)
    }

    /// A pool with demand while the center looks dry still sends a small Borrow now and
    /// then (in the background): it picks up units other channels gave back, and a short
    /// grant makes the center ask holders to return idle units (no stranded stock).
    fn signal_starving(self: &Arc<Self>, item: &Arc<ItemRuntime>, quantity: u64) {
        // Only the leader talks to the center; a follower's misses reach it as wants.
        if self.is_leading() && item.starving_signal_due(crate::clock::now_ms(), STARVING_SIGNAL_EVERY_MS) {
            let (agent, item) = (Arc::clone(self), Arc::clone(item));
            tokio::spawn(async move {
                agent.borrow_shared(&item, quantity).await;
            });
        }
    }

    /// Loads the keys that reserved, then answers further sold-out requests from memory.
    async fn enable_fast_path(&self, item: &ItemRuntime) {
        match self.store.idempotency_keys(&item.pool).await {
            Ok(keys) => item.fast_path_on(keys.into_iter().collect::<HashSet<_>>()),
            Err(e) => tracing::warn!(item = %item.item_id, error = %e, "cannot load idempotency keys"),
        }
    }

    pub async fn confirm(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let rt = self.item(item).await?;
        let t = self.store.confirm(&rt.pool, reservation_id).await?;
        rt.touch();
        if let Transition::Refused(ReservationState::Expired) = t {
            // The expiry just put units back.
            rt.stock_returned_locally();
        }
        transition_result(t, reservation_id, "confirm")
    }

    pub async fn cancel(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let rt = self.item(item).await?;
        let t = self.store.cancel(&rt.pool, reservation_id).await?;
        rt.touch();
        if matches!(t, Transition::Done(_)) {
            rt.stock_returned_locally();
        }
        transition_result(t, reservation_id, "cancel")
    }

    pub async fn get_stock(&self, item: &ItemId) -> Result<pb::GetStockResponse, AgentError> {
        let rt = self.item(item).await?;
        let s = self.store.snapshot(&rt.pool).await?;
        Ok(pb::GetStockResponse {
            available: s.available,
            reserved: s.reserved,
            sold: s.sold,
            sold_out: s.available == 0 && rt.center_dry(),
        })
    }

    /// Borrows `want` units for the item unless another Borrow completes meanwhile
    /// (single flight). Runs in its own task, so a caller that gives up waiting does not
    /// cancel a Borrow half-way. Returns whether a Borrow completed.
    pub async fn borrow_shared(self: &Arc<Self>, item: &Arc<ItemRuntime>, want: u64) -> bool {
        let seen = item.borrows_done.load(Ordering::Acquire);
        let task = {
            let (item, agent) = (Arc::clone(item), Arc::clone(self));
            tokio::spawn(async move {
                let _flight = item.borrow_lock.lock().await;
                if item.borrows_done.load(Ordering::Acquire) != seen {
                    return; // someone borrowed while we queued
                }
                agent.borrow_now(&item, want).await;
                item.borrows_done.fetch_add(1, Ordering::AcqRel);
            })
        };
        matches!(tokio::time::timeout(self.settings.miss_wait, task).await, Ok(Ok(())))
    }

    /// One Borrow, applied to the pool with the Borrow's request id as the grant id, so
    /// a replay of either counts once.
    async fn borrow_now(&self, item: &ItemRuntime, want: u64) {
        let Ok(snap) = self.store.snapshot(&item.pool).await else { return };
        // Never borrow into a pool the store lost (the refill would quietly recreate it).
        if self.pool_lost(item, &snap) {
            return;
        }
        // Create the pool before its first Borrow, so that later a pool that is missing
        // while the center counts units with the channel can only mean data loss (and not
        // a crash between a Borrow and its refill).
        // The epoch this Borrow is sent under: its refill is refused once a later
        // incarnation of the channel fenced the pool (that one's resync counts the grant).
        let epoch = self.link.epoch();
        if snap.generation == 0 {
            let opened = format!("open-{}", uuid::Uuid::new_v4().simple());
            if self.store.refill(&item.pool, &opened, 0, epoch).await.is_err() {
                return;
            }
            match self.store.snapshot(&item.pool).await {
                Ok(s) if s.generation != 0 => item.generation.store(s.generation, Ordering::Release),
                _ => return,
            }
        }
        let request_id = uuid::Uuid::new_v4().simple().to_string();
        let span = tracing::info_span!("borrow", item = %item.item_id, want, trace_id = %request_id);
        let answer = match self.link.borrow(&item.item_id, want, &request_id, epoch).instrument(span).await {
            Ok(a) => a,
            Err(s) => {
                self.metrics.center_error();
                tracing::warn!(item = %item.item_id, code = ?s.code(), message = s.message(), "borrow failed");
                if s.code() != Code::FailedPrecondition && s.code() != Code::NotFound {
                    // It may have been applied: settle with the center's view later.
                    item.schedule_resync(crate::clock::now_ms() + RESYNC_AFTER_UNKNOWN_MS);
                }
                return;
            }
        };
        self.metrics.borrowed(answer.granted);
        item.set_center_available(answer.center_available);
        if answer.granted == want && answer.center_available >= item.policy().watermarks.high {
            item.clear_end_of_sale();
        }
        if answer.granted < want {
            tracing::info!(item = %item.item_id, want, granted = answer.granted, "borrow short");
        }
        if answer.granted == 0 {
            return;
        }
        // The pool may have been lost while the Borrow was out: a refill would recreate it
        // and hide the loss. The units then count as the channel's and fall in doubt.
        if let Ok(snap) = self.store.snapshot(&item.pool).await
            && self.pool_lost(item, &snap)
        {
            return;
        }
        for attempt in 0..5u32 {
            match self.store.refill_existing(&item.pool, &request_id, answer.granted, epoch).await {
                Ok(_) => {
                    item.stock_returned_locally();
                    return;
                }
                Err(StoreError::Fenced(_)) => {
                    tracing::warn!(item = %item.item_id, granted = answer.granted, "pool fenced by a newer incarnation of the channel; its resync counts this grant");
                    return;
                }
                Err(StoreError::PoolMissing(_)) => {
                    // Lost after the check above: freeze; the units fall in doubt.
                    if !item.frozen.swap(true, Ordering::AcqRel) {
                        tracing::error!(item = %item.item_id, "pool lost while a Borrow was out; frozen");
                    }
                    return;
                }
                Err(e) => {
                    self.metrics.pool_store_error();
                    tracing::warn!(item = %item.item_id, error = %e, attempt, "refill failed");
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
            }
        }
        // Granted at the center but not in the pool: the units show as drift and come
        // back at the next registration's resync.
        tracing::error!(item = %item.item_id, granted = answer.granted, "borrowed units could not be added to the pool");
    }

    /// Takes up to `max` available units out of the pool and returns them to the center.
    pub async fn give_back(&self, item: &ItemRuntime, max: u64) -> u64 {
        // Serialised with Borrows and resyncs of the item: a resync must never see units
        // taken out for a Return that has not reached the center yet.
        let _flight = item.borrow_lock.lock().await;
        // A lost or in-doubt pool gives nothing back: only an operator's resolution moves
        // those units.
        if item.frozen.load(Ordering::Acquire) || item.held_in_doubt.load(Ordering::Acquire) {
            return 0;
        }
        let take_id = uuid::Uuid::new_v4().simple().to_string();
        let epoch = self.link.epoch();
        let taken = match self.store.take_for_return(&item.pool, &take_id, max, epoch).await {
            Ok(n) => n,
            Err(e) => {
                self.metrics.pool_store_error();
                tracing::warn!(item = %item.item_id, error = %e, "take for return failed");
                return 0;
            }
        };
        if taken == 0 {
            return 0;
        }
        match self.link.give_back(&item.item_id, taken, &take_id, epoch).await {
            Ok(_) => {
                self.metrics.returned(taken);
                taken
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // The center refused (stale epoch, or it holds less for us than we think):
                // the units stay ours; the next resync settles the difference.
                tracing::warn!(item = %item.item_id, message = s.message(), "return refused; units put back");
                // Refused as fenced when a newer incarnation took over: its resync counts them.
                let _ = self.store.untake(&item.pool, &take_id, epoch).await;
                0
            }
            Err(s) => {
                // Unknown whether it applied. The units stay out of the pool (never sold
                // twice); a resync with the center's view settles it.
                self.metrics.center_error();
                item.schedule_resync(crate::clock::now_ms() + RESYNC_AFTER_UNKNOWN_MS);
                tracing::warn!(item = %item.item_id, code = ?s.code(), "return outcome unknown");
                0
            }
        }
    }

    /// One pass of the rebalancer for one item: expire due reservations, then act on
    /// the watermarks.
    pub async fn rebalance(self: &Arc<Self>, item: &Arc<ItemRuntime>, now_ms: i64) -> Result<Action, AgentError> {
        if item.resync_due(now_ms) {
            self.resync_item(item).await?;
        }
        let freed = self.store.expire_due(&item.pool, 1_000).await?;
        if freed > 0 {
            item.stock_returned_locally();
        }
        let snap = self.store.snapshot(&item.pool).await?;
        item.remember_snapshot(snap);
        if self.pool_lost(item, &snap) {
            return Ok(Action::Hold);
        }
        if snap.available > 0 {
            // Units came back through another replica (a cancel, say): sell them here too.
            item.stock_returned_locally();
        }
        let policy = item.policy();
        let since = {
            let mut guard = item.above_high_since.lock().unwrap_or_else(|e| e.into_inner());
            *guard = rebalance::above_high_since(snap.available, policy.watermarks.high, *guard, now_ms);
            *guard
        };
        let action = rebalance::decide(&Inputs {
            available: snap.available,
            watermarks: policy.watermarks,
            prefetch: item.may_prefetch(),
            above_high_since_ms: since,
            now_ms,
            sustain_ms: self.settings.return_sustain_ms,
        });
        match action {
            Action::Borrow(n) => {
                self.borrow_shared(item, n).await;
            }
            Action::Return(n) => {
                self.give_back(item, n).await;
                *item.above_high_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
            Action::Hold => {}
        }
        Ok(action)
    }

    /// Detects a pool that vanished from the store (data loss). The pool is frozen: its
    /// units are in doubt until an operator reconciles, never resold.
    fn pool_lost(&self, item: &ItemRuntime, snap: &PoolSnapshot) -> bool {
        let known = item.generation.load(Ordering::Acquire);
        if known == 0 {
            if snap.generation != 0 {
                item.generation.store(snap.generation, Ordering::Release);
            }
            return item.frozen.load(Ordering::Acquire);
        }
        if snap.generation != known && !item.frozen.swap(true, Ordering::AcqRel) {
            tracing::error!(item = %item.item_id, known, now = snap.generation, "pool lost its data; frozen");
            // Ask the center soon: if the channel held nothing of the item, nothing was lost.
            item.schedule_resync(crate::clock::now_ms() + 1_000);
        }
        item.frozen.load(Ordering::Acquire)
    }

    /// The pools as reported to the center, all of them. A frozen pool (lost by the store)
    /// is reported as lost, so the center puts what the channel holds in doubt. Pools are
    /// read concurrently (pipelined on the store's connection): with thousands of items a
    /// report costs one round of pipelined reads, not one round trip per item.
    pub async fn reports(&self) -> Vec<pb::PoolReport> {
        self.read_reports().await.into_iter().map(|(_, r)| r).collect()
    }

    /// Only the pools whose report changed since the center last acknowledged one: what a
    /// heartbeat carries ([`Agent::send_reports`] records what the center acknowledged).
    pub async fn changed_reports(&self) -> Vec<pb::PoolReport> {
        self.read_reports().await.into_iter().filter(|(item, r)| item.report_changed(r)).map(|(_, r)| r).collect()
    }

    /// One heartbeat carrying `reports`: renews the lease, records the reports the center
    /// stored, and stops selling items it holds in doubt.
    pub async fn send_reports(
        &self,
        reports: Vec<pb::PoolReport>,
        last_report: bool,
    ) -> Result<pb::HeartbeatResponse, tonic::Status> {
        let sent: Vec<(String, pb::PoolReport)> = reports.iter().map(|r| (r.item_id.clone(), r.clone())).collect();
        let answer = self.link.heartbeat(reports, last_report).await?;
        for (id, r) in sent {
            if let Some(item) = self.items.get(&id) {
                item.reported(r);
            }
        }
        self.freeze_in_doubt(&answer.in_doubt_items);
        Ok(answer)
    }

    async fn read_reports(&self) -> Vec<(Arc<ItemRuntime>, pb::PoolReport)> {
        use futures::StreamExt;
        let lost =
            |item: &ItemRuntime| pb::PoolReport { item_id: item.item_id.clone(), lost: true, ..Default::default() };
        futures::stream::iter(self.items())
            .map(|item| async move {
                if item.frozen.load(Ordering::Acquire) {
                    let r = lost(&item);
                    return Some((item, r));
                }
                let s = self.store.snapshot(&item.pool).await.ok()?;
                item.remember_snapshot(s);
                // Never report a vanished pool as an empty one.
                let r = if self.pool_lost(&item, &s) {
                    lost(&item)
                } else {
                    pb::PoolReport {
                        item_id: item.item_id.clone(),
                        available: s.available,
                        reserved: s.reserved,
                        sold: s.sold,
                        generation: s.generation,
                        lost: false,
                    }
                };
                Some((item, r))
            })
            .buffer_unordered(STORE_READS_IN_FLIGHT)
            .filter_map(|x| async move { x })
            .collect()
            .await
    }

    /// Registers (a new epoch) and brings every pool in line with what the center says
    /// the channel holds: units granted but never added are added; units the center no
    /// longer counts as ours (reclaimed, or returned without our knowing) are removed. A
    /// pool the store lost is frozen instead (its units are in doubt). Selling resumes only
    /// when this is done: the lease is granted at the end.
    pub async fn register_and_resync(&self) -> Result<u64, AgentError> {
        let sent_at = self.link.now_ms();
        let reg = self.link.register().await.map_err(from_center)?;
        for holding in &reg.held {
            let id = ItemId::parse("item_id", &holding.item_id)?;
            let item = self.item(&id).await?;
            let _flight = item.borrow_lock.lock().await;
            // Fence first: from here on no call of an earlier incarnation (another replica
            // sharing the store, or this process before re-registering) moves units in or
            // out of the pool, so the pool and the center's view below stay comparable.
            self.store.raise_fence(&item.pool, reg.epoch).await?;
            // Calls under the new epoch may have landed between the registration and
            // this lock (a Return that was waiting for it, say): read the center's view
            // again now that nothing else can move this pool.
            let fresh = self.holding(&item).await?;
            self.resync(&item, &fresh, item.resync_pending()).await?;
        }
        self.link.renew_lease(sent_at);
        crate::replicas::publish_lease(self).await;
        // Report at once: a reclaim must never judge this incarnation by the last one's
        // report.
        let _ = self.send_reports(self.reports().await, false).await;
        tracing::info!(channel = %self.link.channel, epoch = reg.epoch, items = reg.held.len(), "registered and resynced");
        Ok(reg.epoch)
    }

    async fn resync(
        &self,
        item: &ItemRuntime,
        holding: &pb::ChannelHolding,
        only_remove: bool,
    ) -> Result<(), AgentError> {
        let snap = self.store.snapshot(&item.pool).await?;
        if holding.held == 0 && holding.in_doubt == 0 {
            // The channel holds nothing of the item: a lost pool cost nothing. Sell again
            // from whatever the store has now (aligned to nothing).
            if item.frozen.swap(false, Ordering::AcqRel) {
                tracing::info!(item = %item.item_id, "pool lost while holding nothing; selling again");
            }
            item.held_in_doubt.store(false, Ordering::Release);
            self.align(item, 0, &snap).await?;
            item.generation.store(snap.generation, Ordering::Release);
            return Ok(());
        }
        let lost = (snap.generation == 0 && holding.held > 0)
            || (holding.generation != 0 && snap.generation != 0 && snap.generation != holding.generation);
        if lost {
            // Never resell: the units may have been sold before the store lost them.
            if !item.frozen.swap(true, Ordering::AcqRel) {
                tracing::error!(item = %item.item_id, held = holding.held, "pool lost in the store; units in doubt, item frozen");
            }
            return Ok(());
        }
        if holding.in_doubt > 0 {
            // The pool is intact, but the center holds some of its units in doubt: sell
            // nothing until they are settled; keep reporting the pool as it is.
            if !item.held_in_doubt.swap(true, Ordering::AcqRel) {
                tracing::error!(item = %item.item_id, in_doubt = holding.in_doubt, "units in doubt at the center; not selling");
            }
            return Ok(());
        }
        // While a Borrow/Return of this item has an unknown outcome (a late attempt may
        // still land), only take units away; the scheduled resync adds what is missing.
        let pool = snap.available + snap.reserved + snap.sold;
        let held = if only_remove { holding.held.min(pool) } else { holding.held };
        self.align(item, held, &snap).await?;
        if snap.generation != 0 {
            item.generation.store(snap.generation, Ordering::Release);
        }
        Ok(())
    }

    /// Resyncs one pool with the center's view without registering again (after a
    /// Borrow or Return whose outcome is unknown).
    pub async fn resync_item(&self, item: &ItemRuntime) -> Result<(), AgentError> {
        let _flight = item.borrow_lock.lock().await;
        // A call that finished while this waited for the lock may have pushed the resync
        // later (its own outcome is still unknown): then it is not due yet.
        let Some(scheduled) = item.resync_scheduled(crate::clock::now_ms()) else { return Ok(()) };
        let holding = self.holding(item).await?;
        self.resync(item, &holding, false).await?;
        item.resync_done(scheduled);
        tracing::info!(item = %item.item_id, held = holding.held, "pool resynced with the center");
        Ok(())
    }

    /// What the center says this channel holds of the item, now.
    async fn holding(&self, item: &ItemRuntime) -> Result<pb::ChannelHolding, AgentError> {
        let d = self.link.describe(&item.item_id).await.map_err(from_center)?;
        Ok(pb::ChannelHolding {
            item_id: item.item_id.clone(),
            held: d.held,
            generation: d.generation,
            in_doubt: d.in_doubt,
        })
    }

    /// The center holds these items in doubt for this channel: stop selling them.
    pub fn freeze_in_doubt(&self, items: &[String]) {
        for id in items {
            if let Some(item) = self.items.get(id)
                && !item.held_in_doubt.swap(true, Ordering::AcqRel)
            {
                tracing::error!(item = %id, "center holds units of the item in doubt; not selling it");
            }
        }
    }

    /// Makes the pool's total equal to what the center says the channel holds.
    async fn align(&self, item: &ItemRuntime, held: u64, snap: &PoolSnapshot) -> Result<(), AgentError> {
        let pool = snap.available + snap.reserved + snap.sold;
        let op_id = format!("resync-{}", uuid::Uuid::new_v4().simple());
        let epoch = self.link.epoch();
        if held > pool {
            self.store.refill(&item.pool, &op_id, held - pool, epoch).await?;
            tracing::warn!(item = %item.item_id, units = held - pool, "resync: added units granted but missing from the pool");
            item.stock_returned_locally();
        } else if pool > held {
            let excess = pool - held;
            let taken = self.store.take_for_return(&item.pool, &op_id, excess, epoch).await?;
            tracing::warn!(item = %item.item_id, units = taken, "resync: removed units the center no longer counts as ours");
            if taken < excess {
                tracing::error!(item = %item.item_id, units = excess - taken, "resync: reserved/sold units beyond what the center granted");
            }
        }
        Ok(())
    }

    /// Applies one event from the center's WatchChannel stream.
    pub async fn on_event(self: &Arc<Self>, event: pb::channel_event::Event) {
        use pb::channel_event::Event;
        match event {
            Event::WatermarksChanged(w) => {
                if let Some(item) = self.items.get(&w.item_id).map(|e| Arc::clone(&e)) {
                    // Re-read the whole policy (watermarks, and whether the item closed).
                    match self.link.describe(&w.item_id).await {
                        Ok(d) => item.set_policy(Policy::from_describe(&d)),
                        Err(_) => {
                            if let Some(wm) = w.watermarks {
                                item.set_watermarks(inventory_core::watermarks::Watermarks {
                                    low: wm.low,
                                    high: wm.high,
                                    batch: wm.batch.max(1),
                                });
                            }
                        }
                    }
                    let p = item.policy();
                    tracing::info!(item = %w.item_id, low = p.watermarks.low, high = p.watermarks.high, batch = p.watermarks.batch, closed = p.closed, "item settings changed");
                    // Act at once (a raised low watermark borrows now).
                    let _ = self.rebalance(&item, crate::clock::now_ms()).await;
                }
            }
            Event::Restocked(r) => {
                if let Some(item) = self.items.get(&r.item_id).map(|e| Arc::clone(&e)) {
                    item.set_center_available(r.center_available.max(1));
                }
            }
            Event::InDoubtResolved(r) => {
                if let Some(item) = self.items.get(&r.item_id).map(|e| Arc::clone(&e)) {
                    let _flight = item.borrow_lock.lock().await;
                    // The center settled it: bring the pool to what the channel holds now
                    // (nothing after a lost pool; what was not in doubt after a reclaim).
                    let held = self.holding(&item).await.map(|h| h.held).unwrap_or(0);
                    if let Ok(snap) = self.store.snapshot(&item.pool).await
                        && self.align(&item, held, &snap).await.is_ok()
                    {
                        item.generation.store(snap.generation, Ordering::Release);
                        item.frozen.store(false, Ordering::Release);
                        item.held_in_doubt.store(false, Ordering::Release);
                        item.stock_returned_locally();
                        tracing::warn!(item = %r.item_id, "in-doubt units resolved; selling again");
                    }
                }
            }
            Event::ReturnRequested(r) => {
                if let Some(item) = self.items.get(&r.item_id).map(|e| Arc::clone(&e)) {
                    item.set_end_of_sale();
                    let given = self.give_back(&item, u64::MAX).await;
                    tracing::info!(item = %r.item_id, given, "end of sale: returned idle units");
                }
            }
        }
    }

    /// On shutdown: give every pool's available units back to the center.
    pub async fn return_all(&self) {
        for item in self.items() {
            let given = self.give_back(&item, u64::MAX).await;
            if given > 0 {
                tracing::info!(item = %item.item_id, given, "returned unreserved units at shutdown");
            }
        }
    }
}

fn sold_out() -> pb::AcquireResponse {
    pb::AcquireResponse { outcome: pb::AcquireOutcome::SoldOut as i32, ..Default::default() }
}

fn state_pb(s: ReservationState) -> pb::ReservationState {
    match s {
        ReservationState::Reserved => pb::ReservationState::Reserved,
        ReservationState::Confirmed => pb::ReservationState::Confirmed,
        ReservationState::Cancelled => pb::ReservationState::Cancelled,
        ReservationState::Expired => pb::ReservationState::Expired,
    }
}

pub fn reservation_state_pb(s: ReservationState) -> i32 {
    state_pb(s) as i32
}

fn transition_result(t: Transition, id: &str, verb: &str) -> Result<ReservationState, AgentError> {
    match t {
        Transition::Done(s) => Ok(s),
        Transition::Refused(s) => {
            Err(AgentError::Precondition(format!("cannot {verb} reservation {id:?}: it is {}", s.as_str())))
        }
        Transition::NotFound => Err(AgentError::NotFound(format!("reservation {id:?} not found"))),
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Reserved,
    SoldOut,
    SoldOutFast,
    LimitExceeded,
}
