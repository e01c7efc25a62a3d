//! The buyer registry model: one user's allowance of one item whose per-user limit is
//! global (over every channel), kept outside the channels' pools.
//!
//! A registry entry per (item, user) holds a claim per Acquire idempotency key. An Acquire
//! of a global item claims first (over the limit → refused before any pool is touched),
//! then reserves in its channel's pool, then binds the claim to the reservation; an
//! Acquire that reserved nothing releases its claim, and so do cancel, expiry and refund.
//! Every claim counts against the limit until it is released, so a crash between the
//! steps can only hold an allowance too long, never let the user over the limit; the
//! sweeper settles claims left pending past a bound, or held past their reservation's
//! expiry, by asking the pool what became of the reservation ([`Buyer::settle`]).
//!
//! Pure and synchronous, like [`crate::pool`]: the caller passes the clock and makes each
//! call atomic (one Lua call on the registry's Redis; a mutex in memory).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pool::ReservationState;

/// Where an item's per-user limit applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LimitScope {
    /// In each channel's pool on its own (the pool's Lua checks it).
    #[default]
    Channel,
    /// Over every channel: claimed in the buyer registry before the pool is touched.
    Global,
}

/// What an agent does with an Acquire of a global item when the registry is unreachable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegistryFallback {
    /// UNAVAILABLE: the limit is never broken, sales stop while the registry is down.
    #[default]
    Refuse,
    /// Sell under the per-channel limit only: sales go on, the global limit may be exceeded.
    Channel,
}

impl LimitScope {
    /// The stored (and wire) number: 0 channel, 1 global; anything else is unknown.
    pub fn from_number(n: i64) -> Option<Self> {
        match n {
            0 => Some(Self::Channel),
            1 => Some(Self::Global),
            _ => None,
        }
    }

    pub fn number(self) -> i64 {
        match self {
            Self::Channel => 0,
            Self::Global => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Channel => "channel",
            Self::Global => "global",
        }
    }
}

impl RegistryFallback {
    /// The stored (and wire) number: 0 refuse, 1 channel; anything else is unknown.
    pub fn from_number(n: i64) -> Option<Self> {
        match n {
            0 => Some(Self::Refuse),
            1 => Some(Self::Channel),
            _ => None,
        }
    }

    pub fn number(self) -> i64 {
        match self {
            Self::Refuse => 0,
            Self::Channel => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::Channel => "channel",
        }
    }
}

/// Where a claim stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Claimed; the pool call has not been bound yet. Settled by the sweeper after
    /// `deadline_ms` if the agent never bound or released it (it crashed in between).
    Pending { deadline_ms: i64 },
    /// The pool reserved: verified again after `expires_at_ms` (an expired reservation
    /// frees its allowance).
    Held { reservation_id: String, expires_at_ms: i64 },
    /// Paid: counts until released by a refund.
    Confirmed { reservation_id: String },
}

/// One Acquire's claim on the user's allowance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Units counted against the limit: those claimed, fewer once the pool reserved less.
    pub quantity: u64,
    /// The channel whose pool the Acquire went to (the sweeper asks that pool).
    pub channel: String,
    pub state: ClaimState,
    /// The Acquire's own quantity, when a partial claim got less than it asked for
    /// (`None`: it got all of it). A replay is matched on what was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<u64>,
    /// What a partial claim got, which its pool was asked to reserve; kept apart from
    /// `quantity` (which a partial reservation shrinks) so a replay asks the pool the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<u64>,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimResult {
    /// The allowance is claimed (or was, by an earlier call with this key).
    Claimed { replayed: bool },
    /// A partial claim: `granted` of the quantity asked is claimed, all the allowance had
    /// left (or was, by an earlier call with this key). The pool is asked for `granted`.
    Partial { granted: u64, replayed: bool },
    /// The user's claims already hold `held` units: this quantity would pass the limit.
    LimitExceeded { held: u64 },
    /// The key was claimed before for another channel or quantity.
    KeyConflict,
}

/// What the pool says of a claim's reservation, as the sweeper read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub reservation_id: String,
    pub state: ReservationState,
    pub quantity: u64,
    pub expires_at_ms: i64,
}

/// What the sweeper did with a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Not due, or unknown key: nothing changed.
    Untouched,
    /// The reservation is open: the claim is held until its expiry.
    Held,
    Confirmed,
    /// No reservation, or one that was cancelled, expired or refunded: the allowance is
    /// free again (`quantity` units).
    Released {
        quantity: u64,
    },
    /// The reservation is past its expiry but the pool has not expired it yet: still
    /// counted, looked at again later.
    Waiting,
}

/// One (item, user) entry of the registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buyer {
    claims: BTreeMap<String, Claim>,
}

impl Buyer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Units the user's claims hold, in every state.
    pub fn held(&self) -> u64 {
        self.claims.values().fold(0, |sum, c| sum.saturating_add(c.quantity))
    }

    pub fn claim_of(&self, key: &str) -> Option<&Claim> {
        self.claims.get(key)
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// Claims `quantity` units for the Acquire `key` in `channel`. A replay of the key
    /// answers as the first call did, whatever state its claim is in.
    pub fn claim(
        &mut self,
        key: &str,
        channel: &str,
        quantity: u64,
        limit: u64,
        now_ms: i64,
        pending_ms: u64,
    ) -> ClaimResult {
        self.claim_with(key, channel, quantity, limit, false, now_ms, pending_ms)
    }

    /// As [`Buyer::claim`], but an Acquire with `allow_partial` that would pass the limit
    /// claims what the allowance has left (at least one unit) instead of being refused.
    pub fn claim_up_to(
        &mut self,
        key: &str,
        channel: &str,
        quantity: u64,
        limit: u64,
        now_ms: i64,
        pending_ms: u64,
    ) -> ClaimResult {
        self.claim_with(key, channel, quantity, limit, true, now_ms, pending_ms)
    }

    #[allow(clippy::too_many_arguments)]
    fn claim_with(
        &mut self,
        key: &str,
        channel: &str,
        quantity: u64,
        limit: u64,
        partial: bool,
        now_ms: i64,
        pending_ms: u64,
    ) -> ClaimResult {
        if let Some(c) = self.claims.get(key) {
            let asked = c.asked.unwrap_or(c.quantity);
            if c.channel == channel && (asked == quantity || !matches!(c.state, ClaimState::Pending { .. })) {
                // A bound claim may hold fewer units than asked (a partial acquire).
                return match c.granted {
                    Some(granted) => ClaimResult::Partial { granted, replayed: true },
                    None => ClaimResult::Claimed { replayed: true },
                };
            }
            return ClaimResult::KeyConflict;
        }
        let held = self.held();
        let room = limit.saturating_sub(held);
        let granted = if quantity <= room {
            quantity
        } else if partial && room > 0 {
            room
        } else {
            return ClaimResult::LimitExceeded { held };
        };
        let deadline_ms = now_ms.saturating_add(i64::try_from(pending_ms).unwrap_or(i64::MAX));
        let short = granted < quantity;
        self.claims.insert(
            key.to_owned(),
            Claim {
                quantity: granted,
                channel: channel.to_owned(),
                state: ClaimState::Pending { deadline_ms },
                asked: short.then_some(quantity),
                granted: short.then_some(granted),
            },
        );
        if short { ClaimResult::Partial { granted, replayed: false } } else { ClaimResult::Claimed { replayed: false } }
    }

    /// The pool reserved `quantity` (at most what was claimed; fewer after a partial
    /// acquire) as `reservation_id`: the claim is held until `expires_at_ms`. False when
    /// the key has no claim (released meanwhile: the caller must not leave the
    /// reservation unaccounted, see [`Buyer::settle`]) or it is bound to another id.
    pub fn bind(&mut self, key: &str, reservation_id: &str, quantity: u64, expires_at_ms: i64) -> bool {
        let Some(c) = self.claims.get_mut(key) else { return false };
        match &c.state {
            ClaimState::Pending { .. } => {
                c.quantity = c.quantity.min(quantity);
                c.state = ClaimState::Held { reservation_id: reservation_id.to_owned(), expires_at_ms };
                true
            }
            ClaimState::Held { reservation_id: id, .. } | ClaimState::Confirmed { reservation_id: id } => {
                id == reservation_id
            }
        }
    }

    /// The reservation was paid: the claim counts until a refund releases it.
    pub fn confirm(&mut self, key: &str, reservation_id: &str) -> bool {
        let Some(c) = self.claims.get_mut(key) else { return false };
        if let ClaimState::Held { reservation_id: id, .. } | ClaimState::Confirmed { reservation_id: id } = &c.state
            && id != reservation_id
        {
            return false;
        }
        c.state = ClaimState::Confirmed { reservation_id: reservation_id.to_owned() };
        true
    }

    /// Frees the claim's units (nothing reserved, or the reservation was cancelled,
    /// expired or refunded). Returns the units freed; 0 when there was no claim, so a
    /// second release frees nothing.
    pub fn release(&mut self, key: &str) -> u64 {
        self.claims.remove(key).map_or(0, |c| c.quantity)
    }

    /// Keys whose claims the sweeper should verify at `now_ms`: pending past their
    /// deadline, held past their reservation's expiry. Confirmed claims are settled by
    /// refunds, not by time.
    pub fn due(&self, now_ms: i64) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, c)| match c.state {
                ClaimState::Pending { deadline_ms } => deadline_ms <= now_ms,
                ClaimState::Held { expires_at_ms, .. } => expires_at_ms <= now_ms,
                ClaimState::Confirmed { .. } => false,
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Settles a due claim from what the pool says of the reservation made with its key
    /// (`None`: the pool has none, so the Acquire never reserved).
    pub fn settle(&mut self, key: &str, found: Option<&Found>, now_ms: i64) -> Settled {
        if !self.due(now_ms).iter().any(|k| k == key) {
            return Settled::Untouched;
        }
        // No record: a pending claim's Acquire has not reserved (if its pool call is still
        // on its way, its bind finds the claim gone and claims again before answering); a
        // held one's record outlived its retention, so it ended long ago and holds nothing.
        let Some(f) = found else { return Settled::Released { quantity: self.release(key) } };
        match f.state {
            ReservationState::Reserved if f.expires_at_ms > now_ms => {
                let (quantity, expires) = (f.quantity, f.expires_at_ms);
                if let Some(c) = self.claims.get_mut(key) {
                    c.quantity = c.quantity.min(quantity);
                    c.state = ClaimState::Held { reservation_id: f.reservation_id.clone(), expires_at_ms: expires };
                }
                Settled::Held
            }
            ReservationState::Reserved => Settled::Waiting,
            ReservationState::Confirmed => {
                if let Some(c) = self.claims.get_mut(key) {
                    c.quantity = c.quantity.min(f.quantity);
                    c.state = ClaimState::Confirmed { reservation_id: f.reservation_id.clone() };
                }
                Settled::Confirmed
            }
            ReservationState::Cancelled | ReservationState::Expired | ReservationState::Refunded => {
                Settled::Released { quantity: self.release(key) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PENDING: u64 = 4_000;

    #[test]
    fn a_partial_claim_takes_what_the_allowance_has_left_and_replays_as_it_was() {
        let mut b = Buyer::new();
        assert_eq!(b.claim("k1", "app", 2, 5, 0, PENDING), ClaimResult::Claimed { replayed: false });
        // 4 asked, 3 left: a plain claim is refused, a partial one gets the 3.
        assert_eq!(b.claim("k2", "web", 4, 5, 0, PENDING), ClaimResult::LimitExceeded { held: 2 });
        assert_eq!(b.claim_up_to("k2", "web", 4, 5, 0, PENDING), ClaimResult::Partial { granted: 3, replayed: false });
        assert_eq!(b.held(), 5);
        // A replay with the asked quantity answers as the first call did, bound or not.
        assert_eq!(b.claim_up_to("k2", "web", 4, 5, 1, PENDING), ClaimResult::Partial { granted: 3, replayed: true });
        assert!(b.bind("k2", "r2", 1, 100));
        assert_eq!(b.held(), 3);
        assert_eq!(b.claim_up_to("k2", "web", 4, 5, 2, PENDING), ClaimResult::Partial { granted: 3, replayed: true });
        // A claim that fits whole is not marked partial; nothing left refuses even a partial one.
        assert_eq!(b.claim_up_to("k3", "app", 2, 5, 3, PENDING), ClaimResult::Claimed { replayed: false });
        assert_eq!(b.claim_up_to("k4", "app", 1, 5, 3, PENDING), ClaimResult::LimitExceeded { held: 5 });
        // The granted quantity is not a replay of the asked one while pending.
        assert_eq!(b.claim_up_to("k5", "app", 1, 6, 3, PENDING), ClaimResult::Claimed { replayed: false });
        assert_eq!(b.claim("k5", "app", 2, 6, 3, PENDING), ClaimResult::KeyConflict);
    }

    fn found(state: ReservationState, quantity: u64, expires_at_ms: i64) -> Found {
        Found { reservation_id: "r1".into(), state, quantity, expires_at_ms }
    }

    #[test]
    fn claims_over_all_channels_never_pass_the_limit_and_replays_answer_the_same() {
        let mut b = Buyer::new();
        assert_eq!(b.claim("k1", "app", 1, 1, 0, PENDING), ClaimResult::Claimed { replayed: false });
        // The same purchase on another channel with another key: over the limit.
        assert_eq!(b.claim("k2", "web", 1, 1, 0, PENDING), ClaimResult::LimitExceeded { held: 1 });
        // A replay of k1 on its channel is the same claim; on another channel it conflicts.
        assert_eq!(b.claim("k1", "app", 1, 1, 5, PENDING), ClaimResult::Claimed { replayed: true });
        assert_eq!(b.claim("k1", "web", 1, 1, 5, PENDING), ClaimResult::KeyConflict);
        assert_eq!(b.claim("k1", "app", 2, 3, 5, PENDING), ClaimResult::KeyConflict);
        assert_eq!(b.held(), 1);
        // Nothing reserved: released once; the allowance is free for another channel.
        assert_eq!(b.release("k1"), 1);
        assert_eq!(b.release("k1"), 0);
        assert_eq!(b.claim("k2", "web", 1, 1, 10, PENDING), ClaimResult::Claimed { replayed: false });
    }

    #[test]
    fn bind_keeps_what_a_partial_acquire_reserved_and_replays_still_match() {
        let mut b = Buyer::new();
        assert_eq!(b.claim("k", "app", 3, 3, 0, PENDING), ClaimResult::Claimed { replayed: false });
        assert!(b.bind("k", "r1", 2, 60_000));
        assert_eq!(b.held(), 2);
        assert!(b.bind("k", "r1", 2, 60_000), "binding again is idempotent");
        assert!(!b.bind("k", "r2", 2, 60_000), "another reservation for the key is a bug");
        assert_eq!(b.claim("k", "app", 3, 3, 1, PENDING), ClaimResult::Claimed { replayed: true });
        assert!(!b.bind("gone", "r9", 1, 60_000));
        assert!(b.confirm("k", "r1"));
        assert!(b.due(i64::MAX).is_empty(), "a confirmed claim is settled by a refund, not by time");
    }

    #[test]
    fn a_claim_left_pending_by_a_crash_is_settled_from_the_pool() {
        let mut b = Buyer::new();
        b.claim("none", "app", 1, 5, 0, PENDING);
        b.claim("open", "app", 1, 5, 0, PENDING);
        b.claim("paid", "app", 1, 5, 0, PENDING);
        // Before the bound nothing is due, whatever the pool says.
        assert!(b.due(3_999).is_empty());
        assert_eq!(b.settle("none", None, 3_999), Settled::Untouched);
        assert_eq!(b.due(4_000).len(), 3);
        assert_eq!(b.settle("none", None, 4_000), Settled::Released { quantity: 1 });
        assert_eq!(b.settle("open", Some(&found(ReservationState::Reserved, 1, 60_000)), 4_000), Settled::Held);
        assert_eq!(b.settle("paid", Some(&found(ReservationState::Confirmed, 1, 60_000)), 4_000), Settled::Confirmed);
        assert_eq!(b.held(), 2);
        assert_eq!(b.due(59_999), Vec::<String>::new());
        // The open one's reservation expired: while the pool still says reserved, it counts.
        assert_eq!(b.due(60_000), vec!["open".to_owned()]);
        assert_eq!(b.settle("open", Some(&found(ReservationState::Reserved, 1, 60_000)), 60_000), Settled::Waiting);
        assert_eq!(
            b.settle("open", Some(&found(ReservationState::Expired, 1, 60_000)), 60_001),
            Settled::Released { quantity: 1 }
        );
        assert_eq!(b.held(), 1);
    }

    #[test]
    fn cancelled_or_refunded_reservations_free_the_allowance_once() {
        for end in [ReservationState::Cancelled, ReservationState::Refunded, ReservationState::Expired] {
            let mut b = Buyer::new();
            b.claim("k", "app", 1, 1, 0, PENDING);
            assert!(b.bind("k", "r1", 1, 1_000));
            assert_eq!(b.settle("k", Some(&found(end, 1, 1_000)), 1_000), Settled::Released { quantity: 1 });
            assert_eq!(b.settle("k", Some(&found(end, 1, 1_000)), 1_000), Settled::Untouched);
            assert!(b.is_empty());
            assert_eq!(b.claim("k2", "web", 1, 1, 2_000, PENDING), ClaimResult::Claimed { replayed: false });
        }
    }
}
