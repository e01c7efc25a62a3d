//! [`Pool`] and its operations. Every branch has its twin in a `lua/` script.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::shards::Shards;
use super::{
    AcquireArgs, AcquireResult, EventPage, ExtendResult, OutboxStats, PoolError, PoolEvent, PoolSnapshot,
    ReservationRef, ReservationState, Transition,
};
use crate::ledger::PoolCounts;

/// At most this many forgettable records are dropped per [`Pool::expire_due`] call.
pub const GC_BATCH: u64 = 100;

/// The most one extend pushes an expiry out, whatever the caller asks: keeps every expiry
/// an exact integer in the Lua twin (its records keep 14 significant digits) and far
/// beyond any reservation TTL (about 317 years).
pub const MAX_EXTEND_MS: u64 = 10_000_000_000_000;

/// How many events a pool's outbox keeps by default before it drops the oldest.
pub const DEFAULT_OUTBOX_MAX: u64 = 100_000;

/// One reservation as the pool records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub state: ReservationState,
    pub quantity: u64,
    pub expires_at_ms: i64,
    pub user_id: String,
    pub idempotency_key: String,
    /// The quantity the acquire asked for, when it reserved fewer (allow_partial); 0 when
    /// it reserved what it asked. A replay matches on the asked quantity.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub requested: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Reservation {
    /// The quantity the acquire that made this reservation asked for.
    pub fn requested_quantity(&self) -> u64 {
        if self.requested == 0 { self.quantity } else { self.requested }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Take {
    units: u64,
    put_back: bool,
}

/// A record that may be forgotten once its retention ran out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Forgettable {
    Reservation(String),
    Grant(String),
    Take(String),
}

/// One channel's pool of one item. `generation == 0` means the pool does not exist (never
/// refilled, or lost): it may still hold take records and a fence, but its counters are
/// all zero. Ordered collections only, so whatever a caller iterates comes in the same
/// order on every run. Serializable, so an embedded store can keep its pools across a
/// planned restart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    available: u64,
    reserved: u64,
    sold: u64,
    generation: u64,
    /// The highest center epoch that fenced the pool. Kept with the pool's data, so a
    /// store that loses the pool loses its fence too.
    fence: u64,
    // Looked up by id, key and user on every call: hash maps (a pool holds every
    // reservation of its retention window; ordered trees of strings cost a cache miss per
    // level), split in shards so that growing one never stalls the pool for long. What
    // iterates them sorts first, so answers stay deterministic.
    reservations: Shards<Reservation>,
    /// RESERVED reservations by expiry.
    due: BTreeSet<(i64, String)>,
    /// Units each user holds (reserved + confirmed); users holding 0 are absent.
    held: Shards<u64>,
    /// idempotency key -> reservation id.
    keys: Shards<String>,
    /// grant id -> units applied.
    grants: BTreeMap<String, u64>,
    takes: BTreeMap<String, Take>,
    /// Records by the time after which they may be forgotten.
    gc: BTreeSet<(i64, Forgettable)>,
    /// The outbox: the reservation transitions not yet trimmed, oldest first.
    #[serde(default)]
    events: VecDeque<PoolEvent>,
    /// The sequence of the last event written.
    #[serde(default)]
    event_sequence: u64,
    /// Events dropped by the outbox bound.
    #[serde(default)]
    events_dropped: u64,
    /// The pool's write sequence: raised by every call that changes it, never lowered, and
    /// carried over to the pool's next generation, so a copy restored from before a write
    /// the store acknowledged reads below what its caller saw (see [`super::went_back`]).
    #[serde(default)]
    write_seq: u64,
    /// The outbox bound; `None` is [`DEFAULT_OUTBOX_MAX`]. Set by the store, not saved.
    #[serde(skip)]
    outbox_max: Option<u64>,
}

fn add(x: u64, by: u64, what: &'static str) -> Result<u64, PoolError> {
    x.checked_add(by).ok_or(PoolError::Overflow(what))
}

mod seq;

fn sub(x: u64, by: u64, what: &'static str) -> Result<u64, PoolError> {
    x.checked_sub(by).ok_or(PoolError::Overflow(what))
}

impl Pool {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep at most `max` events in the outbox (at least 1); the oldest are dropped first.
    pub fn set_outbox_max(&mut self, max: u64) {
        self.outbox_max = Some(max.max(1));
    }

    /// Appends the event of a transition, dropping the oldest kept events past the bound.
    fn emit(&mut self, id: &str, r: &Reservation, previous: Option<ReservationState>, now_ms: i64) {
        self.wrote();
        self.event_sequence = self.event_sequence.saturating_add(1);
        self.events.push_back(PoolEvent {
            sequence: self.event_sequence,
            reservation_id: id.to_owned(),
            idempotency_key: r.idempotency_key.clone(),
            user_id: r.user_id.clone(),
            quantity: r.quantity,
            state: r.state,
            previous,
            at_ms: now_ms,
        });
        let max = usize::try_from(self.outbox_max.unwrap_or(DEFAULT_OUTBOX_MAX)).unwrap_or(usize::MAX);
        while self.events.len() > max {
            self.events.pop_front();
            self.events_dropped = self.events_dropped.saturating_add(1);
        }
    }

    /// The expected generation (if given), replay check on the idempotency key, per-user
    /// limit check, then `quantity` moves
    /// from available to reserved with an expiry of `now_ms` + ttl. A sold-out or limit
    /// answer writes nothing.
    pub fn acquire(&mut self, args: &AcquireArgs, now_ms: i64) -> Result<AcquireResult, PoolError> {
        if args.quantity == 0 {
            return Err(PoolError::ZeroQuantity);
        }
        // Before the key lookup: a pool of another generation cannot know the key. 0 is
        // "not checked", as in the Lua twin: no pool answered a reservation at generation 0.
        if let Some(expected) = args.expect_generation.filter(|g| *g != 0)
            && expected != self.generation
        {
            return Err(PoolError::GenerationChanged { expected, actual: self.generation });
        }
        if let Some(id) = self.keys.get(&args.idempotency_key)
            && let Some(r) = self.reservations.get(id)
        {
            if r.user_id == args.user_id && r.requested_quantity() == args.quantity {
                return Ok(AcquireResult::Reserved {
                    reservation_id: id.clone(),
                    quantity: r.quantity,
                    expires_at_ms: r.expires_at_ms,
                    replayed: true,
                    generation: self.generation,
                });
            }
            return Ok(AcquireResult::KeyConflict);
        }
        let held = self.held_by(&args.user_id);
        let room = args.per_user_limit.saturating_sub(held);
        let quantity = if args.allow_partial { args.quantity.min(room).min(self.available) } else { args.quantity };
        if room == 0 || (!args.allow_partial && args.quantity > room) {
            return Ok(AcquireResult::LimitExceeded { held });
        }
        if quantity == 0 || self.available < quantity {
            return Ok(AcquireResult::SoldOut { available: self.available });
        }
        if self.reservations.contains_key(&args.new_reservation_id) {
            return Err(PoolError::DuplicateReservationId(args.new_reservation_id.clone()));
        }
        // Checked above: available >= quantity and held + quantity <= limit.
        let reserved = add(self.reserved, quantity, "pool reserved")?;
        let user_held = add(held, quantity, "user held")?;
        let expires_at_ms = now_ms.saturating_add(i64::try_from(args.reservation_ttl_ms).unwrap_or(i64::MAX));
        self.available -= quantity;
        self.reserved = reserved;
        self.held.insert(args.user_id.clone(), user_held);
        let r = Reservation {
            state: ReservationState::Reserved,
            quantity,
            expires_at_ms,
            user_id: args.user_id.clone(),
            idempotency_key: args.idempotency_key.clone(),
            requested: if quantity == args.quantity { 0 } else { args.quantity },
        };
        self.emit(&args.new_reservation_id, &r, None, now_ms);
        self.reservations.insert(args.new_reservation_id.clone(), r);
        self.due.insert((expires_at_ms, args.new_reservation_id.clone()));
        self.keys.insert(args.idempotency_key.clone(), args.new_reservation_id.clone());
        Ok(AcquireResult::Reserved {
            reservation_id: args.new_reservation_id.clone(),
            quantity,
            expires_at_ms,
            replayed: false,
            generation: self.generation,
        })
    }

    /// Moves a RESERVED reservation to `to`: CONFIRMED (reserved -> sold) or CANCELLED /
    /// EXPIRED (reserved -> available, the user's allowance freed). Returns its quantity;
    /// 0 if `id` is not a RESERVED reservation.
    fn finish(&mut self, id: &str, to: ReservationState, now_ms: i64, retention_ms: i64) -> Result<u64, PoolError> {
        let Some(r) = self.reservations.get(id).filter(|r| r.state == ReservationState::Reserved) else {
            return Ok(0);
        };
        let (quantity, expires_at_ms) = (r.quantity, r.expires_at_ms);
        // Every counter is computed before any is written, so a broken invariant changes nothing.
        let reserved = sub(self.reserved, quantity, "pool reserved")?;
        let (available, sold) = if to == ReservationState::Confirmed {
            (self.available, add(self.sold, quantity, "pool sold")?)
        } else {
            (add(self.available, quantity, "pool available")?, self.sold)
        };
        if to != ReservationState::Confirmed
            && let Some(held) = self.held.get_mut(&r.user_id)
        {
            *held = held.saturating_sub(quantity);
            if *held == 0 {
                self.held.remove(&r.user_id);
            }
        }
        (self.available, self.reserved, self.sold) = (available, reserved, sold);
        if let Some(r) = self.reservations.get_mut(id) {
            r.state = to;
            let r = r.clone();
            self.emit(id, &r, Some(ReservationState::Reserved), now_ms);
        }
        self.due.remove(&(expires_at_ms, id.to_owned()));
        self.gc.insert((now_ms.saturating_add(retention_ms), Forgettable::Reservation(id.to_owned())));
        Ok(quantity)
    }

    /// RESERVED -> CONFIRMED (reserved -> sold). Idempotent. A reservation past its expiry
    /// is expired on the spot and the confirm is refused.
    pub fn confirm(&mut self, reservation_id: &str, now_ms: i64, retention_ms: i64) -> Result<Transition, PoolError> {
        let Some(r) = self.reservations.get(reservation_id) else { return Ok(Transition::NotFound) };
        Ok(match r.state {
            ReservationState::Confirmed => Transition::Done(ReservationState::Confirmed),
            ReservationState::Cancelled | ReservationState::Expired | ReservationState::Refunded => {
                Transition::Refused(r.state)
            }
            ReservationState::Reserved if r.expires_at_ms <= now_ms => {
                self.finish(reservation_id, ReservationState::Expired, now_ms, retention_ms)?;
                Transition::Refused(ReservationState::Expired)
            }
            ReservationState::Reserved => {
                self.finish(reservation_id, ReservationState::Confirmed, now_ms, retention_ms)?;
                Transition::Done(ReservationState::Confirmed)
            }
        })
    }

    /// RESERVED -> CANCELLED (reserved -> available, frees the user's allowance).
    /// Idempotent; refused after confirm; a no-op returning EXPIRED after expiry.
    pub fn cancel(&mut self, reservation_id: &str, now_ms: i64, retention_ms: i64) -> Result<Transition, PoolError> {
        let Some(r) = self.reservations.get(reservation_id) else { return Ok(Transition::NotFound) };
        Ok(match r.state {
            ReservationState::Confirmed | ReservationState::Refunded => Transition::Refused(r.state),
            ReservationState::Cancelled | ReservationState::Expired => Transition::Done(r.state),
            ReservationState::Reserved => {
                let to =
                    if r.expires_at_ms <= now_ms { ReservationState::Expired } else { ReservationState::Cancelled };
                self.finish(reservation_id, to, now_ms, retention_ms)?;
                Transition::Done(to)
            }
        })
    }

    /// CONFIRMED -> REFUNDED (sold -> available, frees the user's allowance). Idempotent;
    /// refused unless confirmed. The record keeps the retention it got at its confirm.
    pub fn refund(&mut self, reservation_id: &str, now_ms: i64) -> Result<Transition, PoolError> {
        let Some(r) = self.reservations.get(reservation_id) else { return Ok(Transition::NotFound) };
        match r.state {
            ReservationState::Refunded => return Ok(Transition::Done(ReservationState::Refunded)),
            ReservationState::Confirmed => {}
            other => return Ok(Transition::Refused(other)),
        }
        let quantity = r.quantity;
        let sold = sub(self.sold, quantity, "pool sold")?;
        let available = add(self.available, quantity, "pool available")?;
        if let Some(held) = self.held.get_mut(&r.user_id) {
            *held = held.saturating_sub(quantity);
            if *held == 0 {
                self.held.remove(&r.user_id);
            }
        }
        (self.available, self.sold) = (available, sold);
        if let Some(r) = self.reservations.get_mut(reservation_id) {
            r.state = ReservationState::Refunded;
            let r = r.clone();
            self.emit(reservation_id, &r, Some(ReservationState::Confirmed), now_ms);
        }
        Ok(Transition::Done(ReservationState::Refunded))
    }

    /// Pushes a RESERVED reservation's expiry to `max(current, now + min(extend_ms,
    /// ttl_ms, MAX_EXTEND_MS))`. Not a transition, so no event. One found past its expiry is expired on
    /// the spot (an event) and refused, as [`Pool::confirm`] does.
    pub fn extend(
        &mut self,
        reservation_id: &str,
        extend_ms: u64,
        ttl_ms: u64,
        now_ms: i64,
        retention_ms: i64,
    ) -> Result<ExtendResult, PoolError> {
        let Some(r) = self.reservations.get_mut(reservation_id) else { return Ok(ExtendResult::NotFound) };
        if r.state != ReservationState::Reserved {
            return Ok(ExtendResult::Refused(r.state));
        }
        if r.expires_at_ms <= now_ms {
            self.finish(reservation_id, ReservationState::Expired, now_ms, retention_ms)?;
            return Ok(ExtendResult::Refused(ReservationState::Expired));
        }
        let by = i64::try_from(extend_ms.min(ttl_ms).min(MAX_EXTEND_MS)).unwrap_or(i64::MAX);
        let old = r.expires_at_ms;
        let new = old.max(now_ms.saturating_add(by));
        if new != old {
            r.expires_at_ms = new;
            self.due.remove(&(old, reservation_id.to_owned()));
            self.due.insert((new, reservation_id.to_owned()));
            self.write_seq = self.write_seq.saturating_add(1);
        }
        Ok(ExtendResult::Extended { expires_at_ms: new })
    }

    /// One reservation by id or by idempotency key, with its id.
    pub fn find(&self, by: &ReservationRef) -> Option<(&str, &Reservation)> {
        let id = match by {
            ReservationRef::Id(id) => id,
            ReservationRef::IdempotencyKey(key) => self.keys.get(key)?,
        };
        self.reservations.get_key_value(id).map(|(id, r)| (id.as_str(), r))
    }

    /// Kept events with `sequence >= from_sequence`, at most `max`, oldest first.
    pub fn events(&self, from_sequence: u64, max: u64) -> EventPage {
        let first_kept = self.events.front().map_or(self.event_sequence.saturating_add(1), |e| e.sequence);
        // Sequences are contiguous in the deque, so the start is an index.
        let skip = usize::try_from(from_sequence.saturating_sub(first_kept)).unwrap_or(usize::MAX);
        let take = usize::try_from(max).unwrap_or(usize::MAX);
        EventPage {
            generation: self.generation,
            events: self.events.iter().skip(skip).take(take).cloned().collect(),
            last_sequence: self.event_sequence,
            first_kept,
        }
    }

    /// Forgets kept events with `sequence <= through_sequence`; returns how many. Only
    /// while the pool has `generation`: events acknowledged for a pool since lost and
    /// created anew are not the events it keeps now.
    pub fn trim_events(&mut self, generation: u64, through_sequence: u64) -> u64 {
        if generation != self.generation {
            return 0;
        }
        let mut n: u64 = 0;
        while self.events.front().is_some_and(|e| e.sequence <= through_sequence) {
            self.events.pop_front();
            n += 1;
        }
        n
    }

    pub fn outbox_stats(&self) -> OutboxStats {
        OutboxStats {
            kept: u64::try_from(self.events.len()).unwrap_or(u64::MAX),
            dropped: self.events_dropped,
            last_sequence: self.event_sequence,
        }
    }

    /// Expires up to `max` reservations due by `now_ms`, earliest first, then forgets up to
    /// [`GC_BATCH`] records whose retention ran out. Returns the units put back into
    /// available.
    pub fn expire_due(&mut self, max: u64, now_ms: i64, retention_ms: i64) -> Result<u64, PoolError> {
        let due: Vec<String> = self
            .due
            .iter()
            .take_while(|(expires_at_ms, _)| *expires_at_ms <= now_ms)
            .take(usize::try_from(max).unwrap_or(usize::MAX))
            .map(|(_, id)| id.clone())
            .collect();
        let mut freed: u64 = 0;
        for id in due {
            let units = self.finish(&id, ReservationState::Expired, now_ms, retention_ms)?;
            freed = freed.saturating_add(units);
        }
        self.forget_old(now_ms);
        Ok(freed)
    }

    /// Drops up to [`GC_BATCH`] records whose retention ran out. A reservation's
    /// idempotency key goes with it.
    fn forget_old(&mut self, now_ms: i64) {
        let batch = usize::try_from(GC_BATCH).unwrap_or(usize::MAX);
        let old: Vec<(i64, Forgettable)> =
            self.gc.iter().take_while(|(forget_at, _)| *forget_at <= now_ms).take(batch).cloned().collect();
        for entry in old {
            match &entry.1 {
                Forgettable::Reservation(id) => {
                    if let Some(r) = self.reservations.get(id)
                        && r.state != ReservationState::Reserved
                    {
                        let key = r.idempotency_key.clone();
                        self.reservations.remove(id);
                        if self.keys.get(&key) == Some(id) {
                            self.keys.remove(&key);
                        }
                    }
                }
                Forgettable::Grant(id) => {
                    self.grants.remove(id);
                }
                Forgettable::Take(id) => {
                    self.takes.remove(id);
                }
            }
            self.gc.remove(&entry);
        }
    }

    /// Adds `units` granted by the center to available, once per `grant_id` (a replay
    /// counts once and answers `false`). Creates the pool with `new_generation` if it does
    /// not exist (0 is taken as 1: a pool's generation is never 0). Refused below the
    /// fence.
    pub fn refill(
        &mut self,
        grant_id: &str,
        units: u64,
        epoch: u64,
        new_generation: u64,
        now_ms: i64,
        retention_ms: i64,
    ) -> Result<bool, PoolError> {
        self.check_fence(epoch)?;
        if self.grants.contains_key(grant_id) {
            return Ok(false);
        }
        let available = add(self.available, units, "pool available")?;
        add(available, self.reserved.saturating_add(self.sold), "pool total")?;
        self.grants.insert(grant_id.to_owned(), units);
        self.gc.insert((now_ms.saturating_add(retention_ms), Forgettable::Grant(grant_id.to_owned())));
        if self.generation == 0 {
            // A new generation numbers its events from 1 again.
            self.generation = new_generation.max(1);
            self.events.clear();
            self.event_sequence = 0;
            self.events_dropped = 0;
        }
        self.available = available;
        self.wrote();
        Ok(true)
    }

    /// Like [`Pool::refill`], but never creates the pool: a pool that does not exist is
    /// [`PoolError::Missing`] and nothing is recorded (a grant never recreates a pool the
    /// store lost).
    pub fn refill_existing(
        &mut self,
        grant_id: &str,
        units: u64,
        epoch: u64,
        now_ms: i64,
        retention_ms: i64,
    ) -> Result<bool, PoolError> {
        self.check_fence(epoch)?;
        if self.generation == 0 {
            return Err(PoolError::Missing);
        }
        self.refill(grant_id, units, epoch, self.generation, now_ms, retention_ms)
    }

    /// Removes up to `max_units` from available to return them to the center, once per
    /// `take_id` (a replay returns the first amount). Refused below the fence.
    pub fn take_for_return(
        &mut self,
        take_id: &str,
        max_units: u64,
        epoch: u64,
        now_ms: i64,
        retention_ms: i64,
    ) -> Result<u64, PoolError> {
        self.check_fence(epoch)?;
        if let Some(take) = self.takes.get(take_id) {
            return Ok(take.units);
        }
        let units = max_units.min(self.available);
        self.available -= units;
        self.takes.insert(take_id.to_owned(), Take { units, put_back: false });
        self.wrote();
        self.gc.insert((now_ms.saturating_add(retention_ms), Forgettable::Take(take_id.to_owned())));
        Ok(units)
    }

    /// Puts back the units of a take whose Return the center refused or never applied,
    /// once per `take_id`; nothing if the pool no longer exists. Refused below the fence.
    pub fn untake(&mut self, take_id: &str, epoch: u64) -> Result<u64, PoolError> {
        self.check_fence(epoch)?;
        let Some(take) = self.takes.get(take_id).copied() else { return Ok(0) };
        if take.put_back || take.units == 0 || self.generation == 0 {
            return Ok(0);
        }
        let available = add(self.available, take.units, "pool available")?;
        self.available = available;
        self.takes.insert(take_id.to_owned(), Take { put_back: true, ..take });
        self.wrote();
        Ok(take.units)
    }

    /// Raises the fence to `epoch` (never lowers it) and returns the fence it found: one at
    /// or above `epoch` means that epoch was handed out before (`ledger::fence::reused`).
    pub fn raise_fence(&mut self, epoch: u64) -> u64 {
        let found = self.fence;
        self.fence = found.max(epoch);
        found
    }

    /// [`PoolError::Fenced`] if the pool was fenced with a later epoch than `epoch`.
    pub fn check_fence(&self, epoch: u64) -> Result<(), PoolError> {
        if self.fence > epoch { Err(PoolError::Fenced { fence: self.fence }) } else { Ok(()) }
    }

    /// The counters and the generation (all 0 for a pool that does not exist), stamped
    /// with `now_ms`.
    pub fn snapshot(&self, now_ms: i64) -> PoolSnapshot {
        let c = self.counts();
        PoolSnapshot {
            available: c.available,
            reserved: c.reserved,
            sold: c.sold,
            generation: self.generation,
            now_ms,
            write_seq: self.write_seq,
        }
    }

    /// The counters as the ledger sees them: all 0 for a pool that does not exist.
    pub fn counts(&self) -> PoolCounts {
        if self.generation == 0 {
            return PoolCounts::default();
        }
        PoolCounts { available: self.available, reserved: self.reserved, sold: self.sold }
    }

    pub fn reservation_state(&self, reservation_id: &str) -> Option<ReservationState> {
        self.reservations.get(reservation_id).map(|r| r.state)
    }

    /// Every idempotency key the pool remembers (keys that reserved), in order.
    pub fn idempotency_keys(&self) -> impl Iterator<Item = &str> {
        let mut keys: Vec<&str> = self.keys.keys().map(String::as_str).collect();
        keys.sort_unstable();
        keys.into_iter()
    }

    /// Whether a refill created the pool (and no loss reset it since).
    pub fn exists(&self) -> bool {
        self.generation != 0
    }

    /// Set by the refill that created the pool; 0 while it does not exist.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn fence(&self) -> u64 {
        self.fence
    }

    pub fn available(&self) -> u64 {
        self.available
    }

    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    pub fn sold(&self) -> u64 {
        self.sold
    }

    pub fn reservation(&self, reservation_id: &str) -> Option<&Reservation> {
        self.reservations.get(reservation_id)
    }

    /// Every reservation the pool remembers, by id.
    pub fn reservations(&self) -> impl Iterator<Item = (&str, &Reservation)> {
        let mut all: Vec<(&str, &Reservation)> = self.reservations.iter().map(|(id, r)| (id.as_str(), r)).collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all.into_iter()
    }

    /// Units `user_id` holds (reserved + confirmed).
    pub fn held_by(&self, user_id: &str) -> u64 {
        self.held.get(user_id).copied().unwrap_or(0)
    }
}
