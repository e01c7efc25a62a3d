//! Selling: the hot path (Acquire) and the reservation calls. One store call in the common
//! case; none when sold out everywhere. The rules say what to do before and after the
//! store call ([`inventory_core::channel::ItemCore::admit`], `on_miss`, `on_sold_out`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use inventory_core::channel::{Admission, Gate, MissPlan, OpKind, Refusal};
use inventory_core::schedule::Phase;
use inventory_core::{ItemId, UserId};
use inventory_proto::v1 as pb;

use crate::buyers::limit::{AfterAcquire, Claimed, ClaimedAcquire, GlobalLimits};
use crate::error::AgentError;
use crate::items::{Item, Items};
use crate::link::CenterLink;
use crate::metrics::{Metrics, Outcome};
use crate::outbox::EventFeed;
use crate::replicas::Replicas;
use crate::role::Role;
use crate::security::UserLimits;
use crate::segmented;
use crate::stocking::Stocking;
use crate::store::{
    AcquireArgs, AcquireResult, ExtendResult, PoolKey, PoolStore, Reservation, ReservationRef, ReservationState,
    StoreError, Transition,
};

/// A validated Acquire.
pub struct AcquireRequest {
    pub item: ItemId,
    pub user: UserId,
    pub quantity: u64,
    pub idempotency_key: String,
    /// The pool generation an earlier answer for this key carried, when the backend passed it.
    pub expect_pool_generation: Option<u64>,
    /// Reserve up to `quantity` when fewer remain (or the user's allowance has less room).
    pub allow_partial: bool,
}

pub struct Selling {
    pub(crate) store: Arc<dyn PoolStore>,
    pub(crate) link: Arc<CenterLink>,
    pub(crate) items: Arc<Items>,
    pub(crate) stocking: Arc<Stocking>,
    pub(crate) replicas: Arc<Replicas>,
    pub(crate) role: Arc<Role>,
    pub(crate) metrics: Arc<Metrics>,
    /// Told of every transition this agent wrote, so event streams wake.
    pub(crate) events: Arc<EventFeed>,
    pub limits: UserLimits,
    /// Acquires refused by the per-user rate limit.
    pub rate_limited: AtomicU64,
    /// How long an Acquire that found the pool empty waits for the shared Borrow.
    pub(crate) miss_wait: Duration,
    /// Items with a global per-user limit: the buyer registry.
    pub global: GlobalLimits,
    /// What the Redis nodes' policy check and the store's refusals say: sales stop while
    /// a node may evict keys.
    pub store_health: Arc<crate::store::health::StoreHealth>,
    /// Test-only fault point (`--test-abort-after-move-take`): abort the process between
    /// a move's take and its refill.
    pub abort_after_move_take: segmented::AbortHook,
}

impl Selling {
    /// The item's state, loading it from the center on first use. A follower tells the
    /// leader about an item it loaded (the leader may not know it yet).
    pub async fn item(&self, item: &ItemId) -> Result<Arc<Item>, AgentError> {
        let (it, loaded) = self.items.load(item, &self.link, crate::clock::now_ms()).await?;
        if loaded && !self.role.is_leading() {
            self.replicas.want(&it, false).await;
        }
        Ok(it)
    }

    pub async fn acquire(&self, req: AcquireRequest) -> Result<pb::AcquireResponse, AgentError> {
        self.admit_user(req.user.as_str())?;
        self.acquire_admitted(req).await
    }

    /// The checks every purchase passes once (an Acquire, or a basket however many lines
    /// it has): the agent is not draining, the user is within the per-user rate.
    pub fn admit_user(&self, user: &str) -> Result<(), AgentError> {
        if self.role.is_draining() {
            return Err(AgentError::Unavailable("agent is shutting down; retry on another agent".into()));
        }
        if !self.limits.allow(user) {
            self.rate_limited.fetch_add(1, Ordering::Relaxed);
            return Err(AgentError::ResourceExhausted(format!(
                "user_id {user:?} is sending requests too fast; retry later"
            )));
        }
        Ok(())
    }

    /// An Acquire past [`Selling::admit_user`]: a basket's line goes through here.
    pub async fn acquire_admitted(&self, req: AcquireRequest) -> Result<pb::AcquireResponse, AgentError> {
        if self.role.is_draining() {
            return Err(AgentError::Unavailable("agent is shutting down; retry on another agent".into()));
        }
        if !self.link.lease_valid() {
            return Err(AgentError::Unavailable(
                "agent's lease with the center has expired; not selling until it is renewed".into(),
            ));
        }
        if let Some(why) = self.store_health.sales_stopped() {
            return Err(AgentError::Unavailable(why));
        }
        let item = self.item(&req.item).await?;
        let leading = self.role.is_leading();
        // The center's clock within bounds: a sale never opens early nor closes late here,
        // whatever this machine's clock says.
        let center_now = self.link.center_now();
        let (gate, policy, starving_want) = item.with(|c| {
            let gate = c.gate(&req.idempotency_key, req.quantity, center_now);
            // A fast SOLD_OUT's starvation signal, in the same lock. Only the leader talks
            // to the center; a follower's misses reach it as wants. A sale that closed by
            // its schedule asks for nothing.
            let want = match gate {
                Gate::Admit(Admission::SoldOut) if leading && c.phase(center_now) == Phase::Open => {
                    c.on_fast_sold_out(req.quantity, self.stocking.ctx())
                }
                _ => None,
            };
            (gate, c.policy(), want)
        });
        let admission = match gate {
            Gate::NotStarted { opens_at_ms } => {
                // From memory: no store call, no center call, nothing reserved.
                self.metrics.acquire(Outcome::NotStarted);
                return Ok(pb::AcquireResponse {
                    outcome: pb::AcquireOutcome::NotStarted as i32,
                    opens_at_unix_ms: opens_at_ms,
                    ..Default::default()
                });
            }
            Gate::Admit(a) => a,
        };
        let shelf = match admission {
            Admission::Refuse(Refusal::InDoubt) => {
                return Err(AgentError::Unavailable(format!(
                    "units of item {} are in doubt at the center; selling waits for an operator to resolve them",
                    item.item_id
                )));
            }
            Admission::Refuse(Refusal::Lost) => {
                return Err(AgentError::Unavailable(format!(
                    "pool of item {} lost its data in the store; selling is frozen until reconciled",
                    item.item_id
                )));
            }
            Admission::Refuse(Refusal::OverLimit { limit }) => {
                return Err(inventory_core::ValidationError::new(
                    "quantity",
                    req.quantity,
                    format!("must be at most the per-user limit {limit} of item {}", item.item_id),
                )
                .into());
            }
            Admission::SoldOut => {
                self.metrics.acquire(Outcome::SoldOutFast);
                if let Some(want) = starving_want {
                    self.stocking.submit(&item, OpKind::Borrow { want });
                }
                return Ok(sold_out());
            }
            Admission::Store { shelf } => shelf,
        };
        let user = req.user.to_string();
        // The user's segment (one pool unless the item is segmented); its reservation ids
        // name it, so the calls by reservation id find it.
        let pool = item.pool_for_user(&user).clone();
        if item.is_segmented() && item.segment_lost(pool.segment) {
            return Err(AgentError::Unavailable(format!(
                "segment {} of item {} lost its data in the store; its buyers wait until an operator resolves its units in doubt (invctl resolve), then retry with the same idempotency_key",
                pool.segment, item.item_id
            )));
        }
        let claimed_at = Instant::now();
        let claim = self.global.claim(
            &item,
            &user,
            &req.idempotency_key,
            req.quantity,
            policy.per_user_limit,
            req.allow_partial,
        );
        // With allow_partial, a global limit with less room than asked claims what is left
        // and the pool is asked for that (a replay of the key is asked for the same).
        let quantity = match claim.await? {
            Claimed::OverLimit { remaining } => {
                self.metrics.acquire(Outcome::LimitExceeded);
                return Ok(pb::AcquireResponse {
                    outcome: pb::AcquireOutcome::LimitExceeded as i32,
                    limit_remaining: remaining,
                    ..Default::default()
                });
            }
            Claimed::Held { quantity } => quantity,
            Claimed::NoClaim => req.quantity,
        };
        let args = AcquireArgs {
            new_reservation_id: inventory_core::segments::tag_reservation_id(
                pool.segment,
                &uuid::Uuid::new_v4().simple().to_string(),
            ),
            user_id: user,
            quantity,
            idempotency_key: req.idempotency_key,
            per_user_limit: policy.per_user_limit,
            reservation_ttl_ms: policy.reservation_ttl_ms,
            expect_generation: req.expect_pool_generation,
            // The whole quantity first, so a short pool still borrows from the center
            // before settling for less (below).
            allow_partial: false,
        };
        let mut result = self.acquire_in(&item, &pool, &args).await?;
        // The pool changed unless it said sold out: the rebalancer looks (marked below,
        // in the same lock as the sell rate's count).
        let changed = !matches!(result, AcquireResult::SoldOut { .. });
        if !changed {
            result = self.after_miss(&item, &pool, &args, result).await?;
        }
        if req.allow_partial && partial_fits(&result, policy.per_user_limit) {
            // One more store call, on the short path only: the pool reserves what is left
            // of stock and allowance, atomically (a replay of this key matches either way).
            let args = AcquireArgs { allow_partial: true, ..args.clone() };
            result = self.store.acquire(&pool, &args).await?;
        }
        if req.allow_partial
            && matches!(result, AcquireResult::Reserved { replayed: false, quantity, .. } if quantity < req.quantity)
        {
            self.metrics.partial_acquire();
        }
        let claimed = ClaimedAcquire {
            user: &args.user_id,
            key: &args.idempotency_key,
            limit: policy.per_user_limit,
            claimed_at,
        };
        if let AfterAcquire::OverLimit { remaining } = self.global.after_acquire(&item, claimed, &result).await? {
            if let AcquireResult::Reserved { reservation_id, .. } = &result {
                self.withdraw(&item, &pool, reservation_id).await;
            }
            self.metrics.acquire(Outcome::LimitExceeded);
            return Ok(pb::AcquireResponse {
                outcome: pb::AcquireOutcome::LimitExceeded as i32,
                limit_remaining: remaining,
                ..Default::default()
            });
        }
        let response = match result {
            AcquireResult::Reserved { reservation_id, quantity, expires_at_ms, replayed, generation } => {
                self.metrics.acquire(Outcome::Reserved);
                if !replayed {
                    self.events.written(&pool);
                }
                if changed || !replayed {
                    item.with(|c| {
                        c.touch();
                        if !replayed {
                            c.on_reserved(quantity, self.stocking.ctx());
                        }
                    });
                }
                pb::AcquireResponse {
                    outcome: pb::AcquireOutcome::Reserved as i32,
                    reservation_id,
                    expires_at_unix_ms: expires_at_ms,
                    replayed,
                    quantity,
                    pool_generation: generation,
                    limit_remaining: 0,
                    opens_at_unix_ms: 0,
                }
            }
            AcquireResult::SoldOut { available } => {
                self.metrics.acquire(Outcome::SoldOut);
                let leading = self.role.is_leading();
                if item.with(|c| c.on_sold_out(shelf, available, leading)) {
                    self.enable_fast_path(&item).await;
                }
                sold_out()
            }
            AcquireResult::LimitExceeded { held } => {
                if changed {
                    item.with(|c| c.touch());
                }
                self.metrics.acquire(Outcome::LimitExceeded);
                pb::AcquireResponse {
                    outcome: pb::AcquireOutcome::LimitExceeded as i32,
                    limit_remaining: policy.per_user_limit.saturating_sub(held),
                    ..Default::default()
                }
            }
            AcquireResult::KeyConflict => {
                if changed {
                    item.with(|c| c.touch());
                }
                return Err(AgentError::AlreadyExists(format!(
                    "idempotency_key {:?} was already used for another user or quantity",
                    args.idempotency_key
                )));
            }
        };
        Ok(response)
    }

    /// Cancels a reservation that is not to be answered (its global claim lapsed and the
    /// allowance went elsewhere), so its units are on sale again at once. A failed cancel
    /// leaves it to expire: nobody was told of it.
    async fn withdraw(&self, item: &Item, pool: &PoolKey, reservation_id: &str) {
        if let Err(e) = self.cancel_in(item, pool, reservation_id).await {
            tracing::warn!(item = %item.item_id, reservation_id, error = %e, "withdrawn reservation left to expire");
        }
    }

    /// The pool had too little: a follower asks the leader and waits for its refill; the
    /// leader joins (or starts) the item's Borrow, waits a bounded time and tries once
    /// more, or, with the center dry, signals its demand in the background.
    async fn after_miss(
        &self,
        item: &Arc<Item>,
        pool: &PoolKey,
        args: &AcquireArgs,
        missed: AcquireResult,
    ) -> Result<AcquireResult, AgentError> {
        if !self.role.is_leading() {
            item.with(|c| c.touch());
            if self.replicas.wait_for_stock(item, args.quantity).await && self.still_open(item) {
                return self.acquire_in(item, pool, args).await;
            }
            return Ok(missed);
        }
        match item.with(|c| c.on_miss(args.quantity, self.stocking.ctx())) {
            MissPlan::Answer => unsettled(item, missed),
            MissPlan::Signal { want } => {
                self.stocking.submit(item, OpKind::Borrow { want });
                unsettled(item, missed)
            }
            MissPlan::Borrow { .. }
                if !self.link.reachable() && !item.with(|c| c.starving_signal_due(crate::clock::now_ms())) =>
            {
                // Back off: while the center gets no answer, one Borrow per item per
                // signal period probes it; every other miss answers at once.
                Err(AgentError::Unavailable(
                    "local pool is empty and the center is unreachable; retry with the same idempotency_key".into(),
                ))
            }
            MissPlan::Borrow { want } => {
                let done = self.stocking.submit(item, OpKind::Borrow { want });
                let mut result = missed;
                if matches!(tokio::time::timeout(self.miss_wait, done).await, Ok(Ok(_))) && self.still_open(item) {
                    result = self.acquire_in(item, pool, args).await?;
                }
                if matches!(result, AcquireResult::SoldOut { .. }) && !self.link.reachable() {
                    // Not sold out: the pool is empty and the center cannot be asked.
                    return Err(AgentError::Unavailable(
                        "local pool is empty and the center is unreachable; retry with the same idempotency_key".into(),
                    ));
                }
                unsettled(item, result)
            }
        }
    }

    /// Whether an Acquire that waited for stock may try the pool again: its sale may have
    /// reached its end (or its opening moved later) during the wait (`ItemCore::may_retry`).
    fn still_open(&self, item: &Item) -> bool {
        let center_now = self.link.center_now();
        item.with(|c| c.may_retry(center_now))
    }

    /// One store Acquire in the user's segment. A segmented item's segment that is short
    /// while siblings hold stock gets units moved in first (`segmented::move_into`), so it
    /// answers sold out only when every segment is.
    async fn acquire_in(&self, item: &Item, pool: &PoolKey, args: &AcquireArgs) -> Result<AcquireResult, AgentError> {
        let result = self.store.acquire(pool, args).await?;
        if !item.is_segmented() || !matches!(result, AcquireResult::SoldOut { .. }) {
            return Ok(result);
        }
        let (store, epoch) = (self.store.as_ref(), self.link.epoch());
        if !self.role.is_leading() {
            // Moves are the leader's (its epoch fences them, its lock orders them with its
            // resyncs): a follower's empty segment with stock in its siblings is not sold out.
            if segmented::available(store, item).await? >= args.quantity {
                return Err(AgentError::Unavailable(format!(
                    "segment {} of item {} is empty and only the channel's leading replica moves stock between segments; retry with the same idempotency_key",
                    pool.segment, item.item_id
                )));
            }
            return Ok(result);
        }
        match segmented::move_into(store, item, pool.segment, args.quantity, epoch, self.abort_after_move_take).await {
            Ok(segmented::Moved::Nothing) => Ok(result),
            Ok(moved) => {
                if matches!(moved, segmented::Moved::Units(_)) {
                    self.metrics.segment_move();
                }
                Ok(self.store.acquire(pool, args).await?)
            }
            Err(e) => {
                tracing::warn!(item = %item.item_id, segment = pool.segment, error = %e, "move between segments failed");
                Err(AgentError::Unavailable(format!(
                    "segment {} of item {} is empty and stock could not be moved from its siblings; retry with the same idempotency_key",
                    pool.segment, item.item_id
                )))
            }
        }
    }

    /// Loads the keys that reserved (in every segment), then answers further sold-out
    /// requests from memory.
    async fn enable_fast_path(&self, item: &Item) {
        let shelf = item.with(|c| c.shelf_version());
        let mut keys = BTreeSet::new();
        for pool in &item.pools {
            match self.store.idempotency_keys(pool).await {
                Ok(k) => keys.extend(k),
                Err(e) => {
                    tracing::warn!(item = %item.item_id, error = %e, "cannot load idempotency keys");
                    return;
                }
            }
        }
        item.with(|c| c.fast_path_on(keys, shelf));
    }

    /// The pool holding a reservation by id: its segment's (by the id's prefix).
    fn reservation_pool<'a>(it: &'a Item, reservation_id: &str) -> Result<&'a PoolKey, AgentError> {
        it.pool_for_reservation(reservation_id)
            .ok_or_else(|| AgentError::NotFound(format!("reservation {reservation_id:?} not found")))
    }

    pub async fn confirm(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let it = self.item(item).await?;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        let t = self.store.confirm(pool, reservation_id).await?;
        self.events.written(pool);
        if t == Transition::Done(ReservationState::Confirmed)
            && let Some(r) = self.global_reservation(&it, reservation_id).await
        {
            self.global.confirmed(&it, reservation_id, &r).await;
        }
        it.with(|c| {
            if let Transition::Refused(ReservationState::Expired) = t {
                // The expiry just put units back.
                c.stock_returned();
            } else {
                c.touch();
            }
        });
        transition_result(t, reservation_id, "confirm")
    }

    pub async fn cancel(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let it = self.item(item).await?;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        let t = self.cancel_in(&it, pool, reservation_id).await?;
        if matches!(t, Transition::Done(_))
            && let Some(r) = self.global_reservation(&it, reservation_id).await
        {
            self.global.released(&it, &r).await;
        }
        transition_result(t, reservation_id, "cancel")
    }

    /// The pool's part of a cancel: the store call, the event feed, the rules told.
    async fn cancel_in(&self, item: &Item, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        let t = self.store.cancel(pool, reservation_id).await?;
        self.events.written(pool);
        item.with(|c| if matches!(t, Transition::Done(_)) { c.stock_returned() } else { c.touch() });
        Ok(t)
    }

    /// CONFIRMED -> REFUNDED: the units are on sale again in the pool. After the item's
    /// sale ended they go back to the center with the pool's other unsold units.
    pub async fn refund(&self, item: &ItemId, reservation_id: &str) -> Result<ReservationState, AgentError> {
        let it = self.item(item).await?;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        let t = self.store.refund(pool, reservation_id).await?;
        self.events.written(pool);
        if t == Transition::Done(ReservationState::Refunded)
            && let Some(r) = self.global_reservation(&it, reservation_id).await
        {
            self.global.released(&it, &r).await;
        }
        it.with(|c| if t == Transition::Done(ReservationState::Refunded) { c.stock_returned() } else { c.touch() });
        transition_result(t, reservation_id, "refund")
    }

    /// The reservation's user and key, for the registry, when the item's limit is global.
    /// A failed read leaves the claim to the sweeper.
    async fn global_reservation(&self, it: &Item, reservation_id: &str) -> Option<Reservation> {
        if it.limit.scope != inventory_core::buyers::LimitScope::Global {
            return None;
        }
        let pool = it.pool_for_reservation(reservation_id)?;
        match self.store.reservation(pool, &ReservationRef::Id(reservation_id.to_owned())).await {
            Ok(found) => found.map(|(_, r)| r),
            Err(e) => {
                tracing::warn!(item = %it.item_id, error = %e, "reservation unread: its claim is left for the sweeper");
                None
            }
        }
    }

    /// Pushes a RESERVED reservation's expiry out by up to `extend_ms`, bounded by the
    /// item's reservation TTL from now.
    pub async fn extend(
        &self,
        item: &ItemId,
        reservation_id: &str,
        extend_ms: u64,
    ) -> Result<pb::ExtendResponse, AgentError> {
        let it = self.item(item).await?;
        let ttl_ms = it.policy().reservation_ttl_ms;
        let pool = Self::reservation_pool(&it, reservation_id)?;
        match self.store.extend(pool, reservation_id, extend_ms, ttl_ms).await? {
            ExtendResult::Extended { expires_at_ms } => Ok(pb::ExtendResponse {
                state: pb::ReservationState::Reserved as i32,
                expires_at_unix_ms: expires_at_ms,
            }),
            ExtendResult::Refused(s) => {
                if s == ReservationState::Expired {
                    // It may have expired just now, putting units back.
                    self.events.written(pool);
                    it.with(|c| c.stock_returned());
                }
                Err(AgentError::Precondition(format!(
                    "cannot extend reservation {reservation_id:?}: it is {}",
                    s.as_str()
                )))
            }
            ExtendResult::NotFound => Err(AgentError::NotFound(format!("reservation {reservation_id:?} not found"))),
        }
    }

    /// One reservation by id or idempotency key, with the pool's generation. By key on a
    /// segmented item: each segment is asked in turn (the key's user is not known here).
    pub async fn reservation(&self, item: &ItemId, by: &ReservationRef) -> Result<pb::Reservation, AgentError> {
        let it = self.item(item).await?;
        let pools: Vec<&PoolKey> = match by {
            ReservationRef::Id(id) => it.pool_for_reservation(id).into_iter().collect(),
            ReservationRef::IdempotencyKey(_) => it.pools.iter().collect(),
        };
        for pool in pools {
            if let Some((id, r)) = self.store.reservation(pool, by).await? {
                let generation = self.store.snapshot(pool).await?.generation;
                return Ok(reservation_pb(id, r, generation));
            }
        }
        let what = match by {
            ReservationRef::Id(id) => format!("reservation {id:?}"),
            ReservationRef::IdempotencyKey(key) => format!("reservation with idempotency_key {key:?}"),
        };
        Err(AgentError::NotFound(format!("{what} not found in the pool of item {}", it.item_id)))
    }

    pub async fn get_stock(&self, item: &ItemId) -> Result<pb::GetStockResponse, AgentError> {
        let it = self.item(item).await?;
        let center_now = self.link.center_now();
        let not_started = matches!(it.with(|c| c.phase(center_now)), Phase::NotStarted { .. });
        let snaps = segmented::snapshots(self.store.as_ref(), &it, self.link.epoch()).await?;
        let s = segmented::sum(&snaps);
        let mut outboxes = Vec::with_capacity(snaps.len());
        for pool in &it.pools {
            outboxes.push(self.store.outbox_stats(pool).await?);
        }
        it.set_outbox_stats(inventory_core::pool::OutboxStats::fullest(&outboxes));
        it.set_segment_snapshots(&snaps);
        let segments = if it.is_segmented() {
            snaps
                .iter()
                .zip(&outboxes)
                .enumerate()
                .map(|(i, (s, o))| pb::SegmentStock {
                    segment: u32::try_from(i).unwrap_or(0),
                    available: s.available,
                    reserved: s.reserved,
                    sold: s.sold,
                    pool_generation: s.generation,
                    last_event_sequence: o.last_sequence,
                    // The broker relay fills it.
                    published_event_sequence: 0,
                    lost: it.segment_lost(u32::try_from(i).unwrap_or(0)),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(pb::GetStockResponse {
            available: s.available,
            reserved: s.reserved,
            sold: s.sold,
            sold_out: s.available == 0 && it.with(|c| c.supply().center_dry),
            // Segment 0's generation and events (the segments list has each one's).
            pool_generation: snaps[0].generation,
            last_event_sequence: outboxes[0].last_sequence,
            // The broker relay fills it.
            published_event_sequence: 0,
            segments,
            not_started,
            opens_at_unix_ms: it.with(|c| c.schedule().opens_at_ms),
        })
    }
}

/// A sold-out answer while a Borrow or Return of the item has an unsettled outcome is not
/// proof of being sold out (the center may have granted units the pool lacks), nor while
/// the pool store refuses writes (nothing could be borrowed into it): UNAVAILABLE.
fn unsettled(item: &Item, result: AcquireResult) -> Result<AcquireResult, AgentError> {
    if !matches!(result, AcquireResult::SoldOut { .. }) {
        return Ok(result);
    }
    if item.with(|c| c.store_refusing(crate::clock::now_ms())) {
        return Err(AgentError::Unavailable(format!(
            "the pool store refused to shelve stock of item {}: it is at its memory limit (maxmemory); retry with \
             the same idempotency_key",
            item.item_id
        )));
    }
    if item.with(|c| c.unsettled()) {
        return Err(AgentError::Unavailable(format!(
            "the outcome of a call to the center about item {} is not settled yet; retry with the same idempotency_key",
            item.item_id
        )));
    }
    Ok(result)
}

fn sold_out() -> pb::AcquireResponse {
    pb::AcquireResponse { outcome: pb::AcquireOutcome::SoldOut as i32, ..Default::default() }
}

pub fn reservation_state_pb(s: ReservationState) -> i32 {
    let s = match s {
        ReservationState::Reserved => pb::ReservationState::Reserved,
        ReservationState::Confirmed => pb::ReservationState::Confirmed,
        ReservationState::Cancelled => pb::ReservationState::Cancelled,
        ReservationState::Expired => pb::ReservationState::Expired,
        ReservationState::Refunded => pb::ReservationState::Refunded,
    };
    s as i32
}

fn reservation_pb(id: String, r: Reservation, pool_generation: u64) -> pb::Reservation {
    pb::Reservation {
        reservation_id: id,
        idempotency_key: r.idempotency_key,
        user_id: r.user_id,
        quantity: r.quantity,
        state: reservation_state_pb(r.state),
        expires_at_unix_ms: r.expires_at_ms,
        pool_generation,
    }
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

/// A whole-quantity answer that a partial acquire could turn into a reservation: some
/// stock left, or some room left in the user's allowance.
fn partial_fits(result: &AcquireResult, per_user_limit: u64) -> bool {
    match result {
        AcquireResult::SoldOut { available } => *available > 0,
        AcquireResult::LimitExceeded { held } => *held < per_user_limit,
        AcquireResult::Reserved { .. } | AcquireResult::KeyConflict => false,
    }
}
