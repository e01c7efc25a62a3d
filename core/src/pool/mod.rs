//! The pool model: one channel's stock of one item and the reservations sold from it.
//!
//! This is the reference every pool store follows: the agent's in-memory store wraps a
//! [`Pool`] per item, each `lua/` script is its twin in Redis, and the simulator runs it on
//! a logical clock. Pure and synchronous: the caller passes the clock (`now_ms`, ms since
//! the Unix epoch), how long finished records are remembered (`retention_ms`) and the
//! generation of a pool created by a refill, and makes each call atomic.
//!
//! Every reservation transition appends a [`PoolEvent`] to the pool's outbox within the same
//! call (numbered per pool without gaps, bounded by dropping the oldest).
//!
//! **Invariant:** `available + reserved + sold` changes only through [`Pool::refill`] /
//! [`Pool::refill_existing`] (up, once per grant id), [`Pool::take_for_return`] (down, once
//! per take id) and [`Pool::untake`] (up again, once per take id).

mod model;
mod shards;
#[cfg(test)]
mod tests;

pub use model::{DEFAULT_OUTBOX_MAX, GC_BATCH, MAX_EXTEND_MS, Pool, Reservation};

/// One purchase attempt, already validated at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireArgs {
    pub user_id: String,
    pub quantity: u64,
    pub idempotency_key: String,
    /// Used only if this call reserves (a replay returns the first reservation's id).
    pub new_reservation_id: String,
    pub per_user_limit: u64,
    pub reservation_ttl_ms: u64,
    /// The pool generation the caller saw with an earlier answer for this key: the call is
    /// refused ([`PoolError::GenerationChanged`]) unless the pool still has it. A pool
    /// that lost its data and was created again has another generation and does not know
    /// the keys of the lost one, so this is what keeps such a replay from reserving twice.
    /// `Some(0)` checks nothing, like `None`: no pool answered a reservation at generation 0.
    pub expect_generation: Option<u64>,
    /// Reserve up to `quantity`: when fewer units are available, or the user's allowance
    /// has less room, reserve what there is (if any) instead of answering sold out / over
    /// the limit. The reservation remembers the requested quantity, so a replay of the
    /// same (user, requested quantity) returns it.
    pub allow_partial: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireResult {
    Reserved {
        reservation_id: String,
        quantity: u64,
        expires_at_ms: i64,
        replayed: bool,
        /// The generation of the pool that holds the reservation.
        generation: u64,
    },
    /// The pool has fewer than `quantity` units available.
    SoldOut { available: u64 },
    /// The user already holds `held` units (reserved + sold) of the item in this channel.
    LimitExceeded { held: u64 },
    /// The idempotency key was used before for another user or quantity.
    KeyConflict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReservationState {
    Reserved,
    Confirmed,
    Cancelled,
    Expired,
    /// A confirmed reservation paid back: its units are on sale again.
    Refunded,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Reserved => "reserved",
            ReservationState::Confirmed => "confirmed",
            ReservationState::Cancelled => "cancelled",
            ReservationState::Expired => "expired",
            ReservationState::Refunded => "refunded",
        }
    }

    /// The inverse of [`ReservationState::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "reserved" => ReservationState::Reserved,
            "confirmed" => ReservationState::Confirmed,
            "cancelled" => ReservationState::Cancelled,
            "expired" => ReservationState::Expired,
            "refunded" => ReservationState::Refunded,
            _ => return None,
        })
    }
}

/// One reservation transition as the pool's outbox keeps it. Written in the same atomic
/// step as the change it tells of (the same critical section, the same Lua call).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolEvent {
    /// Per pool, from 1, without gaps; starts again at 1 when the pool is created anew
    /// (a new generation).
    pub sequence: u64,
    pub reservation_id: String,
    pub idempotency_key: String,
    pub user_id: String,
    pub quantity: u64,
    /// The state the reservation entered.
    pub state: ReservationState,
    /// The state it left; `None` for the event that created the reservation.
    pub previous: Option<ReservationState>,
    /// The store's clock, in ms since the Unix epoch.
    pub at_ms: i64,
}

/// A read of a pool's outbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventPage {
    /// The pool's generation (0: the pool does not exist); sequences are per generation.
    pub generation: u64,
    /// Kept events from the asked sequence on, oldest first.
    pub events: Vec<PoolEvent>,
    /// The sequence of the last event written (0: none yet).
    pub last_sequence: u64,
    /// The sequence of the oldest kept event; `last_sequence + 1` when none is kept.
    pub first_kept: u64,
}

/// The size of a pool's outbox, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Events kept.
    pub kept: u64,
    /// Events the outbox bound dropped (oldest first) since the pool was created.
    pub dropped: u64,
    /// The sequence of the last event written (0: none yet).
    pub last_sequence: u64,
}

impl OutboxStats {
    /// A segmented pool's outboxes as one, for the metrics: the fullest segment's kept
    /// events (each segment's outbox has the bound of its own), the drops summed.
    pub fn fullest(segments: &[OutboxStats]) -> OutboxStats {
        segments.iter().fold(OutboxStats::default(), |acc, s| OutboxStats {
            kept: acc.kept.max(s.kept),
            dropped: acc.dropped.saturating_add(s.dropped),
            last_sequence: acc.last_sequence.max(s.last_sequence),
        })
    }
}

/// Which reservation to look up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReservationRef {
    Id(String),
    IdempotencyKey(String),
}

/// Outcome of extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtendResult {
    /// The reservation is RESERVED until this time (ms since the Unix epoch).
    Extended {
        expires_at_ms: i64,
    },
    /// Not RESERVED (any more): the state it is in. A reservation found past its expiry is
    /// expired on the spot, as a confirm would.
    Refused(ReservationState),
    NotFound,
}

/// Outcome of confirm or cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The reservation is now (or already was) in this state.
    Done(ReservationState),
    /// Not allowed from the reservation's current state (confirm after cancel/expiry,
    /// cancel after confirm, refund before confirm).
    Refused(ReservationState),
    NotFound,
}

/// The pool counters. `generation` is set when the pool is first created in the store;
/// a pool that disappears and comes back (Redis lost its data) has another generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    /// 0 when the pool does not exist in the store.
    pub generation: u64,
    /// The store's clock, in ms since the Unix epoch.
    pub now_ms: i64,
    /// The pool's write sequence: raised by every write, never lowered, carried over to a
    /// new generation (0 from a store that does not keep one).
    pub write_seq: u64,
}

/// Whether a pool went back in time: its write sequence is below `floor`, the highest one
/// its caller saw acknowledged (restored from an older snapshot, a lagging replica
/// promoted). Such a pool lost acknowledged writes under the same generation, so it is a
/// lost pool: its units in doubt at the center, nothing of it read or written, reopened
/// with a new generation once an operator settled them.
pub fn went_back(floor: u64, write_seq: u64) -> bool {
    write_seq < floor
}

/// The center's memory of a pool's write sequence, from a report: the highest one ever
/// reported, never lowered (a report read from a pool that went back is older, not newer,
/// and an agent restarted without a floor may report one). Handed back to the channel's
/// agent as the pool's floor, so a pool that went back is caught even by an incarnation
/// that never saw its writes.
pub fn remember_write_seq(remembered: u64, reported: u64) -> u64 {
    remembered.max(reported)
}

/// A report's write sequences as `(segment, write_seq)`: an unsegmented pool's own as
/// segment 0, a segmented one's per segment; those of 0 (nothing known) left out.
pub fn reported_write_seqs(pool_write_seq: u64, segments: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let all = if segments.is_empty() { vec![(0, pool_write_seq)] } else { segments.to_vec() };
    all.into_iter().filter(|(_, seq)| *seq > 0).collect()
}

/// A Return's write sequences (`ReturnRequest.write_seq_floors`: segment s at index s, 0
/// where none is known) as `(segment, write_seq)`, those of 0 left out. At most one per
/// segment a pool can have, each storable as a signed 64-bit number.
pub fn return_write_seqs(floors: &[u64]) -> Result<Vec<(u32, u64)>, crate::ValidationError> {
    let max = crate::segments::MAX_SEGMENTS as usize;
    if floors.len() > max {
        let reason = format!("must hold at most {max} write sequences (one per segment)");
        return Err(crate::ValidationError::new("write_seq_floors", floors.len() as u64, reason));
    }
    let mut out = Vec::new();
    for (segment, &seq) in (0u32..).zip(floors) {
        if i64::try_from(seq).is_err() {
            let reason = format!("must be at most {}", i64::MAX);
            return Err(crate::ValidationError::new(format!("write_seq_floors[{segment}]"), seq, reason));
        }
        if seq > 0 {
            out.push((segment, seq));
        }
    }
    Ok(out)
}

/// Floors by segment (segment s at index s, 0 where none is known) from `(segment,
/// floor)` pairs: what the center hands an agent.
pub fn floors_by_segment(pairs: impl IntoIterator<Item = (u32, u64)>) -> Vec<u64> {
    let mut out = Vec::new();
    for (segment, floor) in pairs {
        let i = segment as usize;
        if i >= crate::segments::MAX_SEGMENTS as usize {
            continue;
        }
        if out.len() <= i {
            out.resize(i + 1, 0);
        }
        out[i] = remember_write_seq(out[i], floor);
    }
    out
}

/// A call the pool refuses. Nothing was changed or recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The pool was fenced with a later epoch than the caller's: the caller's incarnation
    /// of the channel is over and must not move units.
    #[error("the pool was fenced by epoch {fence}")]
    Fenced { fence: u64 },
    /// The pool does not exist (never refilled, or the store lost it).
    #[error("the pool does not exist")]
    Missing,
    #[error("acquire quantity must be positive")]
    ZeroQuantity,
    /// The caller expected another pool generation than the pool has (0: no pool).
    #[error("expected pool generation {expected}, the pool has generation {actual}")]
    GenerationChanged { expected: u64, actual: u64 },
    #[error("new_reservation_id {0:?} names an existing reservation")]
    DuplicateReservationId(String),
    /// A counter would leave `u64`: a refill beyond any real stock, or a broken invariant.
    #[error("{0} would leave the range of u64")]
    Overflow(&'static str),
}
