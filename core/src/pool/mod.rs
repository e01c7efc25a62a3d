//! The pool model: one channel's stock of one item and the reservations sold from it.
//!
//! This is the reference every pool store follows: the agent's in-memory store wraps a
//! [`Pool`] per item, each `lua/` script is its twin in Redis, and the simulator runs it on
//! a logical clock. Pure and synchronous: the caller passes the clock (`now_ms`, ms since
//! the Unix epoch), how long finished records are remembered (`retention_ms`) and the
//! generation of a pool created by a refill, and makes each call atomic.
//!
//! **Invariant:** `available + reserved + sold` changes only through [`Pool::refill`] /
//! [`Pool::refill_existing`] (up, once per grant id), [`Pool::take_for_return`] (down, once
//! per take id) and [`Pool::untake`] (up again, once per take id).

mod model;
#[cfg(test)]
mod tests;

pub use model::{GC_BATCH, Pool, Reservation};

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
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Reserved => "reserved",
            ReservationState::Confirmed => "confirmed",
            ReservationState::Cancelled => "cancelled",
            ReservationState::Expired => "expired",
        }
    }
}

/// Outcome of confirm or cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The reservation is now (or already was) in this state.
    Done(ReservationState),
    /// Not allowed from the reservation's current state (confirm after cancel/expiry,
    /// cancel after confirm).
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
