//! Baskets: the driver of [`inventory_core::basket`]. An AcquireBasket records the intent
//! in the channel's store, then reserves each item's summed lines through the ordinary
//! Acquire path ([`Selling::acquire_admitted`], so per-user limits, global limits,
//! borrowing on a miss and events all apply) under keys derived from the basket's key,
//! and finally moves the intent to Reserved with a compare-and-set. A line that cannot be
//! served undoes the lines before it; an intent whose driver died is undone by the
//! sweeper ([`Baskets::sweep`]) once it is older than the bound.
//!
//! Replays: a reserved basket answers its first answer (`replayed`); a pending one is
//! waited for (up to twice the bound, then UNAVAILABLE: retry with the same key), and past
//! the bound undone by the replay itself; a failed one is evaluated again under the next
//! attempt's keys, as a replay of an Acquire that reserved nothing is.

use std::time::{Duration, Instant};

use inventory_core::ItemId;
use inventory_core::basket::{self, Basket, Failure, Held, Intent, OnReplay};
use inventory_proto::v1 as pb;

use crate::error::AgentError;
use crate::selling::{AcquireRequest, Selling};
use crate::store::{BasketWrite, ReservationRef, ReservationState, StoredBasket};

mod settle;

/// How often a replay looks again at an intent another caller drives.
const WAIT_STEP: Duration = Duration::from_millis(25);

/// Open intents the sweeper reads per pass.
pub const SWEEP_PAGE: u64 = 200;

pub struct Baskets {
    /// An open intent older than this (by the store's clock) is undone by recovery.
    pub pending_ms: u64,
    /// Test-only fault point (`--test-abort-between-basket-lines`): abort the process after
    /// this user's first line is reserved and before the next one.
    pub abort_between_lines: Option<String>,
}

impl Default for Baskets {
    fn default() -> Self {
        Self { pending_ms: crate::config::DEFAULT_BASKET_PENDING_MS, abort_between_lines: None }
    }
}

impl Baskets {
    pub async fn acquire(&self, selling: &Selling, basket: Basket) -> Result<pb::AcquireBasketResponse, AgentError> {
        selling.admit_user(&basket.user_id)?;
        // Each item's sum against its limit before anything is recorded: such a basket can
        // never be served (as an Acquire above the limit).
        for line in basket.sums() {
            let item = selling.item(&ItemId::parse("item_id", &line.item_id)?).await?;
            basket.check_limit(&line.item_id, item.policy().per_user_limit)?;
        }
        let channel = selling.link.channel.as_str();
        let id = basket.id();
        let started = Instant::now();
        loop {
            let Some(stored) = selling.store.basket(channel, &id).await? else {
                let intent = Intent::new(&basket);
                if let BasketWrite::Written { version } = selling.store.put_basket(channel, &id, 0, &intent).await? {
                    return self.drive(selling, &id, intent, version).await;
                }
                continue;
            };
            match basket::on_replay(&stored.intent, &basket, stored.age_ms(), self.pending_ms) {
                OnReplay::Conflict => {
                    return Err(AgentError::AlreadyExists(format!(
                        "idempotency_key {:?} was already used for another user or other lines",
                        basket.idempotency_key
                    )));
                }
                OnReplay::Answer => return Ok(reserved_answer(&id, &stored.intent, true)),
                OnReplay::Wait => {
                    if started.elapsed() > Duration::from_millis(self.pending_ms.saturating_mul(2)) {
                        return Err(AgentError::Unavailable(format!(
                            "basket {id} is still being reserved; retry with the same idempotency_key"
                        )));
                    }
                    tokio::time::sleep(WAIT_STEP).await;
                }
                OnReplay::Compensate => self.compensate(selling, &id, stored).await?,
                OnReplay::Retry => {
                    let next = stored.intent.retry().map_err(|e| AgentError::Internal(e.to_string()))?;
                    if let BasketWrite::Written { version } =
                        selling.store.put_basket(channel, &id, stored.version, &next).await?
                    {
                        return self.drive(selling, &id, next, version).await;
                    }
                }
            }
        }
    }

    /// Reserves each item's lines in turn; all reserved: the intent becomes Reserved;
    /// else the lines reserved so far are cancelled and the intent becomes Failed.
    async fn drive(
        &self,
        selling: &Selling,
        id: &str,
        intent: Intent,
        version: u64,
    ) -> Result<pb::AcquireBasketResponse, AgentError> {
        let started = Instant::now();
        let mut held = Vec::new();
        let mut failed: Option<(Failure, Option<AgentError>)> = None;
        for line in intent.sums() {
            let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            if !basket::may_start_line(elapsed, self.pending_ms) {
                failed = Some((Failure::Interrupted, None));
                break;
            }
            if !held.is_empty() && self.abort_between_lines.as_deref() == Some(intent.user_id.as_str()) {
                tracing::error!(basket = id, "test fault point: aborting between two lines of a basket");
                std::process::abort();
            }
            let req = AcquireRequest {
                item: ItemId::parse("item_id", &line.item_id)?,
                user: inventory_core::UserId::parse("user_id", &intent.user_id)?,
                quantity: line.quantity,
                idempotency_key: intent.line_key(&line.item_id),
                expect_pool_generation: None,
                allow_partial: false,
            };
            let item_id = line.item_id.clone();
            match selling.acquire_admitted(req).await {
                Ok(r) if r.outcome == pb::AcquireOutcome::Reserved as i32 => held.push(Held {
                    item_id,
                    reservation_id: r.reservation_id,
                    quantity: r.quantity,
                    expires_at_ms: r.expires_at_unix_ms,
                    pool_generation: r.pool_generation,
                }),
                Ok(r) if r.outcome == pb::AcquireOutcome::NotStarted as i32 => {
                    failed = Some((Failure::NotStarted { item_id, opens_at_ms: r.opens_at_unix_ms }, None));
                    break;
                }
                Ok(r) if r.outcome == pb::AcquireOutcome::LimitExceeded as i32 => {
                    failed = Some((Failure::LimitExceeded { item_id, remaining: r.limit_remaining }, None));
                    break;
                }
                Ok(_) => {
                    failed = Some((Failure::SoldOut { item_id }, None));
                    break;
                }
                Err(e) => {
                    failed = Some((Failure::Error { item_id }, Some(e)));
                    break;
                }
            }
        }
        let channel = selling.link.channel.as_str();
        if let Some((failure, error)) = failed {
            let releasing = intent.releasing(failure.clone()).map_err(|e| AgentError::Internal(e.to_string()))?;
            match selling.store.put_basket(channel, id, version, &releasing).await? {
                BasketWrite::Written { version } => self.release(selling, id, &releasing, version).await?,
                // Recovery took it over: undo our lines too (idempotent) and say so.
                BasketWrite::Conflict(_) => {
                    cancel_lines(selling, &releasing).await?;
                    return Err(interrupted(id));
                }
            }
            selling.metrics.baskets_failed.inc();
            return match (failure, error) {
                (_, Some(e)) => Err(e),
                (Failure::Interrupted, None) => Err(interrupted(id)),
                (f, None) => Ok(failure_answer(&f)),
            };
        }
        let reserved = intent.reserved(held).map_err(|e| AgentError::Internal(e.to_string()))?;
        match selling.store.put_basket(channel, id, version, &reserved).await? {
            BasketWrite::Written { .. } => {
                selling.metrics.baskets_reserved.inc();
                Ok(reserved_answer(id, &reserved, false))
            }
            BasketWrite::Conflict(_) => {
                // Recovery began undoing it while the lines were reserved (this driver was
                // slower than the bound): undo the lines too; a replay evaluates it again.
                cancel_lines(selling, &intent).await?;
                Err(interrupted(id))
            }
        }
    }

    /// Cancels the lines of a Releasing intent, then marks it Failed.
    async fn release(&self, selling: &Selling, id: &str, releasing: &Intent, version: u64) -> Result<(), AgentError> {
        cancel_lines(selling, releasing).await?;
        let failed = releasing.failed().map_err(|e| AgentError::Internal(e.to_string()))?;
        // A conflict: someone else finished it first (the same cancels, the same end).
        selling.store.put_basket(selling.link.channel.as_str(), id, version, &failed).await?;
        Ok(())
    }

    /// Undoes an open intent whose driver is gone: Pending -> Releasing (so a late driver
    /// cannot mark it Reserved), every line's reservation cancelled, -> Failed. Losing a
    /// compare-and-set means another party moved it: the caller reads it again.
    pub async fn compensate(&self, selling: &Selling, id: &str, stored: StoredBasket) -> Result<(), AgentError> {
        let releasing = match stored.intent.releasing(Failure::Interrupted) {
            Ok(r) => r,
            Err(_) => return Ok(()),
        };
        let version = if releasing == stored.intent {
            stored.version
        } else {
            match selling.store.put_basket(selling.link.channel.as_str(), id, stored.version, &releasing).await? {
                BasketWrite::Written { version } => version,
                BasketWrite::Conflict(_) => return Ok(()),
            }
        };
        self.release(selling, id, &releasing, version).await?;
        selling.metrics.baskets_compensated.inc();
        tracing::info!(basket = id, user = %releasing.user_id, "basket undone by recovery");
        Ok(())
    }

    /// One pass of the sweeper: undoes the channel's open intents older than the bound.
    /// Returns how many are open.
    pub async fn sweep(&self, selling: &Selling) -> Result<usize, AgentError> {
        let channel = selling.link.channel.as_str();
        let open = selling.store.open_baskets(channel, SWEEP_PAGE).await?;
        for id in &open {
            let Some(stored) = selling.store.basket(channel, id).await? else { continue };
            if basket::due_for_compensation(&stored.intent, stored.age_ms(), self.pending_ms)
                && let Err(e) = self.compensate(selling, id, stored).await
            {
                tracing::warn!(basket = %id, error = %e, "basket compensation failed; retried on the next pass");
            }
        }
        Ok(open.len())
    }
}

/// Cancels every line's reservation of the intent's attempt, found by its derived key
/// (whatever reserved it: this driver, or one that crashed). Idempotent.
async fn cancel_lines(selling: &Selling, intent: &Intent) -> Result<(), AgentError> {
    for line in intent.sums() {
        let item_id = ItemId::parse("item_id", &line.item_id)?;
        let item = selling.item(&item_id).await?;
        let by = ReservationRef::IdempotencyKey(intent.line_key(&line.item_id));
        if let Some((rid, r)) = selling.store.reservation(&item.pool, &by).await?
            && r.state == ReservationState::Reserved
        {
            match selling.cancel(&item_id, &rid).await {
                // Expired meanwhile: released as well.
                Ok(_) | Err(AgentError::Precondition(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn interrupted(id: &str) -> AgentError {
    AgentError::Unavailable(format!(
        "basket {id} took longer than its bound and was undone; retry with the same idempotency_key"
    ))
}

fn reserved_answer(id: &str, intent: &Intent, replayed: bool) -> pb::AcquireBasketResponse {
    let held = intent.held().unwrap_or_default();
    pb::AcquireBasketResponse {
        opens_at_unix_ms: 0,
        outcome: pb::AcquireOutcome::Reserved as i32,
        basket_id: id.to_owned(),
        reservations: basket::per_line(&intent.lines, held)
            .into_iter()
            .map(|h| pb::BasketReservation {
                item_id: h.item_id.clone(),
                reservation_id: h.reservation_id.clone(),
                quantity: h.quantity,
                expires_at_unix_ms: h.expires_at_ms,
                pool_generation: h.pool_generation,
            })
            .collect(),
        short_item_id: String::new(),
        replayed,
        limit_remaining: 0,
    }
}

fn failure_answer(f: &Failure) -> pb::AcquireBasketResponse {
    let (outcome, item, remaining, opens_at) = match f {
        Failure::LimitExceeded { item_id, remaining } => {
            (pb::AcquireOutcome::LimitExceeded, item_id.clone(), *remaining, 0)
        }
        Failure::SoldOut { item_id } | Failure::Error { item_id } => {
            (pb::AcquireOutcome::SoldOut, item_id.clone(), 0, 0)
        }
        Failure::Interrupted => (pb::AcquireOutcome::SoldOut, String::new(), 0, 0),
        Failure::NotStarted { item_id, opens_at_ms } => {
            (pb::AcquireOutcome::NotStarted, item_id.clone(), 0, *opens_at_ms)
        }
    };
    pb::AcquireBasketResponse {
        outcome: outcome as i32,
        short_item_id: item,
        limit_remaining: remaining,
        opens_at_unix_ms: opens_at,
        ..Default::default()
    }
}
