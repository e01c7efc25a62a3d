//! The Acquire path as a pipeline of named stages, each free to end the call:
//!
//! 1. **open**: the agent sells at all (not draining, its lease valid, the store healthy);
//! 2. **admit**: the item's rules let the call through to the store (`gate`, then `admit`),
//!    or answer it from memory (not started, sold out everywhere) or refuse it; the user's
//!    segment is picked;
//! 3. **claim**: an item with a global per-user limit claims the quantity in the buyer
//!    registry first (or answers LIMIT_EXCEEDED);
//! 4. **reserve**: the store call in the user's segment; on a miss, the Borrow it waits for
//!    (or a move between segments) and one more call; with `allow_partial`, one more call
//!    for what is left;
//! 5. **settle**: the buyer registry's second look, which may withdraw the reservation;
//! 6. **answer**: the store's answer on the wire, the rules and the event feed told.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use inventory_core::channel::{Admission, Gate, MissPlan, OpKind, Policy, Refusal};
use inventory_core::schedule::Phase;
use inventory_proto::v1 as pb;

use super::{AcquireRequest, Selling};
use crate::buyers::limit::{AfterAcquire, Claimed, ClaimedAcquire};
use crate::error::AgentError;
use crate::items::Item;
use crate::metrics::Outcome;
use crate::segmented;
use crate::store::{AcquireArgs, AcquireResult, PoolKey, StoreError};

/// How the pipeline ends before its last stage: an answer (sent as OK) or an error.
enum Exit {
    Answer(pb::AcquireResponse),
    Fail(AgentError),
}

impl From<AgentError> for Exit {
    fn from(e: AgentError) -> Self {
        Exit::Fail(e)
    }
}

impl From<StoreError> for Exit {
    fn from(e: StoreError) -> Self {
        Exit::Fail(e.into())
    }
}

/// What the admit stage hands on.
struct Admitted {
    item: Arc<Item>,
    /// The user's segment (the item's one pool unless it is segmented).
    pool: PoolKey,
    policy: Policy,
    /// What `ItemCore::on_sold_out` needs if the store says sold out.
    shelf: u64,
}

/// What the claim stage hands on.
struct Claim {
    /// What the pool is asked for: the request's quantity, or what a global limit's room
    /// left of it with `allow_partial`.
    quantity: u64,
    claimed_at: Instant,
}

/// What the reserve stage hands on.
struct Attempt {
    args: AcquireArgs,
    result: AcquireResult,
    /// The first store call did not say sold out: the pool changed, the rebalancer looks.
    changed: bool,
}

impl Selling {
    /// An Acquire past [`Selling::admit_user`]: a basket's line goes through here.
    pub async fn acquire_admitted(&self, req: AcquireRequest) -> Result<pb::AcquireResponse, AgentError> {
        match self.acquire_stages(req).await {
            Ok(answer) | Err(Exit::Answer(answer)) => Ok(answer),
            Err(Exit::Fail(e)) => Err(e),
        }
    }

    async fn acquire_stages(&self, req: AcquireRequest) -> Result<pb::AcquireResponse, Exit> {
        self.open_for_sales()?;
        let (admitted, user) = self.admit(&req).await?;
        let claim = self.claim(&admitted, &user, &req).await?;
        let attempt = self.reserve(&admitted, user, req, claim.quantity).await?;
        self.settle(&admitted, &attempt, claim.claimed_at).await?;
        Ok(self.answer(&admitted, attempt).await?)
    }

    /// Stage 1: nothing is sold while the agent drains, its lease lapsed, or the store may
    /// lose writes.
    fn open_for_sales(&self) -> Result<(), AgentError> {
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
        Ok(())
    }

    /// Stage 2: the item's rules, in one short lock, and the user's segment. Returns the
    /// user id as a string, which the later stages move into the store call.
    async fn admit(&self, req: &AcquireRequest) -> Result<(Admitted, String), Exit> {
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
        let shelf = match gate {
            Gate::NotStarted { opens_at_ms } => {
                // From memory: no store call, no center call, nothing reserved.
                self.metrics.acquire(Outcome::NotStarted);
                return Err(Exit::Answer(pb::AcquireResponse {
                    outcome: pb::AcquireOutcome::NotStarted as i32,
                    opens_at_unix_ms: opens_at_ms,
                    ..Default::default()
                }));
            }
            Gate::Admit(Admission::Refuse(why)) => return Err(Exit::Fail(refusal(&item, req.quantity, why))),
            Gate::Admit(Admission::SoldOut) => {
                self.metrics.acquire(Outcome::SoldOutFast);
                if let Some(want) = starving_want {
                    self.stocking.submit(&item, OpKind::Borrow { want });
                }
                return Err(Exit::Answer(sold_out()));
            }
            Gate::Admit(Admission::Store { shelf }) => shelf,
        };
        let user = req.user.to_string();
        // The user's segment (one pool unless the item is segmented); its reservation ids
        // name it, so the calls by reservation id find it.
        let pool = item.pool_for_user(&user).clone();
        if item.is_segmented() && item.segment_lost(pool.segment) {
            return Err(Exit::Fail(AgentError::Unavailable(format!(
                "segment {} of item {} lost its data in the store; its buyers wait until an operator resolves its units in doubt (invctl resolve), then retry with the same idempotency_key",
                pool.segment, item.item_id
            ))));
        }
        Ok((Admitted { item, pool, policy, shelf }, user))
    }

    /// Stage 3: the buyer registry's claim when the item's limit is global. With
    /// allow_partial, a global limit with less room than asked claims what is left and the
    /// pool is asked for that (a replay of the key is asked for the same).
    async fn claim(&self, a: &Admitted, user: &str, req: &AcquireRequest) -> Result<Claim, Exit> {
        let claimed_at = Instant::now();
        let claimed = self
            .global
            .claim(&a.item, user, &req.idempotency_key, req.quantity, a.policy.per_user_limit, req.allow_partial)
            .await?;
        let quantity = match claimed {
            Claimed::OverLimit { remaining } => {
                self.metrics.acquire(Outcome::LimitExceeded);
                return Err(Exit::Answer(limit_exceeded(remaining)));
            }
            Claimed::Held { quantity } => quantity,
            Claimed::NoClaim => req.quantity,
        };
        Ok(Claim { quantity, claimed_at })
    }

    /// Stage 4: the store calls. The whole quantity first, so a short pool still borrows
    /// from the center before settling for less ([`Selling::partial`]).
    async fn reserve(
        &self,
        a: &Admitted,
        user: String,
        req: AcquireRequest,
        quantity: u64,
    ) -> Result<Attempt, AgentError> {
        let args = AcquireArgs {
            new_reservation_id: self.store.new_reservation_id(a.pool.segment),
            user_id: user,
            quantity,
            idempotency_key: req.idempotency_key,
            per_user_limit: a.policy.per_user_limit,
            reservation_ttl_ms: a.policy.reservation_ttl_ms,
            expect_generation: req.expect_pool_generation,
            allow_partial: false,
        };
        let mut result = self.acquire_in(&a.item, &a.pool, &args).await?;
        // The pool changed unless it said sold out: the rebalancer looks (marked when the
        // answer is told to the rules, in the same lock as the sell rate's count).
        let changed = !matches!(result, AcquireResult::SoldOut { .. });
        if !changed {
            result = self.after_miss(&a.item, &a.pool, &args, result).await?;
        }
        if req.allow_partial {
            result = self.partial(a, &args, result, req.quantity).await?;
        }
        Ok(Attempt { args, result, changed })
    }

    /// With allow_partial, one more store call, on the short path only: the pool reserves
    /// what is left of stock and allowance, atomically (a replay of this key matches
    /// either way).
    async fn partial(
        &self,
        a: &Admitted,
        args: &AcquireArgs,
        mut result: AcquireResult,
        asked: u64,
    ) -> Result<AcquireResult, AgentError> {
        if partial_fits(&result, a.policy.per_user_limit) {
            let args = AcquireArgs { allow_partial: true, ..args.clone() };
            result = self.store.acquire(&a.pool, &args).await?;
        }
        if matches!(result, AcquireResult::Reserved { replayed: false, quantity, .. } if quantity < asked) {
            self.metrics.partial_acquire();
        }
        Ok(result)
    }

    /// Stage 5: the buyer registry's second look at a global limit. A claim that lapsed
    /// while the store call ran, and whose allowance went elsewhere, withdraws the
    /// reservation and answers LIMIT_EXCEEDED.
    async fn settle(&self, a: &Admitted, attempt: &Attempt, claimed_at: Instant) -> Result<(), Exit> {
        let claimed = ClaimedAcquire {
            user: &attempt.args.user_id,
            key: &attempt.args.idempotency_key,
            limit: a.policy.per_user_limit,
            claimed_at,
        };
        if let AfterAcquire::OverLimit { remaining } =
            self.global.after_acquire(&a.item, claimed, &attempt.result).await?
        {
            if let AcquireResult::Reserved { reservation_id, .. } = &attempt.result {
                self.withdraw(&a.item, &a.pool, reservation_id).await;
            }
            self.metrics.acquire(Outcome::LimitExceeded);
            return Err(Exit::Answer(limit_exceeded(remaining)));
        }
        Ok(())
    }

    /// Stage 6: the store's answer on the wire; the rules told what it did to the pool
    /// (touched, reserved, sold out) and the event feed of a new reservation.
    async fn answer(&self, a: &Admitted, attempt: Attempt) -> Result<pb::AcquireResponse, AgentError> {
        let Attempt { args, result, changed } = attempt;
        let item = &a.item;
        match result {
            AcquireResult::Reserved { reservation_id, quantity, expires_at_ms, replayed, generation } => {
                self.metrics.acquire(Outcome::Reserved);
                if !replayed {
                    self.events.written(&a.pool);
                }
                if changed || !replayed {
                    item.with(|c| {
                        c.touch();
                        if !replayed {
                            c.on_reserved(quantity, self.stocking.ctx());
                        }
                    });
                }
                Ok(pb::AcquireResponse {
                    outcome: pb::AcquireOutcome::Reserved as i32,
                    reservation_id,
                    expires_at_unix_ms: expires_at_ms,
                    replayed,
                    quantity,
                    pool_generation: generation,
                    limit_remaining: 0,
                    opens_at_unix_ms: 0,
                })
            }
            AcquireResult::SoldOut { available } => {
                self.metrics.acquire(Outcome::SoldOut);
                let leading = self.role.is_leading();
                if item.with(|c| c.on_sold_out(a.shelf, available, leading)) {
                    self.enable_fast_path(item).await;
                }
                Ok(sold_out())
            }
            AcquireResult::LimitExceeded { held } => {
                if changed {
                    item.with(|c| c.touch());
                }
                self.metrics.acquire(Outcome::LimitExceeded);
                Ok(limit_exceeded(a.policy.per_user_limit.saturating_sub(held)))
            }
            AcquireResult::KeyConflict => {
                if changed {
                    item.with(|c| c.touch());
                }
                Err(AgentError::AlreadyExists(format!(
                    "idempotency_key {:?} was already used for another user or quantity",
                    args.idempotency_key
                )))
            }
        }
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
}

/// The rules' refusal of an Acquire as the caller's error.
fn refusal(item: &Item, quantity: u64, why: Refusal) -> AgentError {
    match why {
        Refusal::InDoubt => AgentError::Unavailable(format!(
            "units of item {} are in doubt at the center; selling waits for an operator to resolve them",
            item.item_id
        )),
        Refusal::Lost => AgentError::Unavailable(format!(
            "pool of item {} lost its data in the store; selling is frozen until reconciled",
            item.item_id
        )),
        Refusal::OverLimit { limit } => inventory_core::ValidationError::new(
            "quantity",
            quantity,
            format!("must be at most the per-user limit {limit} of item {}", item.item_id),
        )
        .into(),
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

fn limit_exceeded(remaining: u64) -> pb::AcquireResponse {
    pb::AcquireResponse {
        outcome: pb::AcquireOutcome::LimitExceeded as i32,
        limit_remaining: remaining,
        ..Default::default()
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
