//! ConfirmBasket and CancelBasket: every line of a reserved basket, through the ordinary
//! Confirm and Cancel (events, global allowances).
//!
//! The lines live in different pools, so neither is atomic. Both look at every line first
//! and refuse before writing anything when one line is in the way (confirm: a line
//! expired or cancelled; cancel: a line confirmed). A line that expires between that look
//! and its confirm leaves the lines before it confirmed: the answer is FAILED_PRECONDITION
//! naming that line's item, and the backend refunds the confirmed ones or cancels the
//! basket (which cancels the lines still reserved and refuses only for the confirmed).

use inventory_core::ItemId;
use inventory_core::basket::{Held, Refused};

use super::Baskets;
use crate::error::AgentError;
use crate::selling::Selling;
use crate::store::{BasketWrite, ReservationRef, ReservationState, StoredBasket};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verb {
    Confirm,
    Cancel,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Verb::Confirm => "confirm",
            Verb::Cancel => "cancel",
        }
    }
}

impl Baskets {
    /// Confirms every line. Idempotent (a confirmed basket answers CONFIRMED).
    pub async fn confirm(&self, selling: &Selling, basket_id: &str) -> Result<ReservationState, AgentError> {
        self.settle(selling, basket_id, Verb::Confirm).await
    }

    /// Cancels every line (a line that expired counts as released). Idempotent.
    pub async fn cancel(&self, selling: &Selling, basket_id: &str) -> Result<ReservationState, AgentError> {
        self.settle(selling, basket_id, Verb::Cancel).await
    }

    async fn settle(&self, selling: &Selling, id: &str, verb: Verb) -> Result<ReservationState, AgentError> {
        let channel = selling.link.channel.as_str();
        let (done, target) = match verb {
            Verb::Confirm => (ReservationState::Confirmed, ReservationState::Confirmed),
            Verb::Cancel => (ReservationState::Cancelled, ReservationState::Cancelled),
        };
        // A few rounds: a compare-and-set lost to a concurrent confirm or cancel of the
        // same basket is read again.
        for _ in 0..4 {
            let Some(stored) = selling.store.basket(channel, id).await? else { return Err(unknown(id)) };
            let next = match verb {
                Verb::Confirm => stored.intent.confirmed(),
                Verb::Cancel => stored.intent.cancelled(),
            };
            let next = match next {
                Ok(n) => n,
                Err(Refused::NotReserved) => return Err(unknown(id)),
                Err(r) => return Err(AgentError::Precondition(format!("cannot {} basket {id}: {r}", verb.as_str()))),
            };
            if next == stored.intent {
                return Ok(done);
            }
            let held = stored.intent.held().unwrap_or_default().to_vec();
            check_lines(selling, id, &held, &stored, verb).await?;
            for h in &held {
                let item = ItemId::parse("item_id", &h.item_id)?;
                let result = match verb {
                    Verb::Confirm => selling.confirm(&item, &h.reservation_id).await,
                    Verb::Cancel => selling.cancel(&item, &h.reservation_id).await,
                };
                match result {
                    Ok(_) => {}
                    // Expired since the look: released, which is what a cancel wants.
                    Err(AgentError::Precondition(_))
                        if verb == Verb::Cancel && line_state(selling, h).await? == Some(ReservationState::Expired) => {
                    }
                    Err(AgentError::Precondition(m)) => {
                        return Err(AgentError::Precondition(format!(
                            "cannot {} basket {id}: item {}: {m}; the lines before it are {}",
                            verb.as_str(),
                            h.item_id,
                            target.as_str()
                        )));
                    }
                    Err(e) => return Err(e),
                }
            }
            if let BasketWrite::Written { .. } = selling.store.put_basket(channel, id, stored.version, &next).await? {
                return Ok(done);
            }
        }
        Err(AgentError::Unavailable(format!("basket {id} keeps changing; retry")))
    }
}

/// Refuses before any write when a line is in the way: for a confirm, a line expired (by
/// the store's clock), cancelled or gone; for a cancel, a line confirmed.
async fn check_lines(
    selling: &Selling,
    id: &str,
    held: &[Held],
    stored: &StoredBasket,
    verb: Verb,
) -> Result<(), AgentError> {
    for h in held {
        let item = selling.item(&ItemId::parse("item_id", &h.item_id)?).await?;
        let found = selling.store.reservation(&item.pool, &ReservationRef::Id(h.reservation_id.clone())).await?;
        let state = found.as_ref().map(|(_, r)| r.state);
        let in_the_way = match (verb, state) {
            (Verb::Confirm, Some(ReservationState::Reserved)) => {
                found.as_ref().is_some_and(|(_, r)| r.expires_at_ms <= stored.now_ms).then_some("expired")
            }
            (Verb::Confirm, Some(ReservationState::Confirmed)) => None,
            (Verb::Confirm, Some(s)) => Some(s.as_str()),
            (Verb::Confirm, None) => Some("unknown to its pool"),
            (Verb::Cancel, Some(ReservationState::Confirmed | ReservationState::Refunded)) => Some("confirmed"),
            (Verb::Cancel, _) => None,
        };
        if let Some(what) = in_the_way {
            return Err(AgentError::Precondition(format!(
                "cannot {} basket {id}: the reservation of item {} is {what}; no line was changed",
                verb.as_str(),
                h.item_id
            )));
        }
    }
    Ok(())
}

async fn line_state(selling: &Selling, h: &Held) -> Result<Option<ReservationState>, AgentError> {
    let item = selling.item(&ItemId::parse("item_id", &h.item_id)?).await?;
    Ok(selling.store.reservation_state(&item.pool, &h.reservation_id).await?)
}

fn unknown(id: &str) -> AgentError {
    AgentError::NotFound(format!("basket {id:?} not found (or it reserved nothing)"))
}
