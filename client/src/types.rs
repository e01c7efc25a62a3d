//! The calls' answers as Rust types: outcomes are enums, times are `SystemTime`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inventory_proto::v1 as pb;

use crate::Error;

/// The answer to an Acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Units are held for the user until `expires_at`; confirm (pay) or cancel them.
    Reserved {
        /// The reservation id that confirm, cancel, refund and extend take.
        id: String,
        /// Units held.
        qty: u64,
        /// When the reservation expires unless confirmed or extended.
        expires_at: SystemTime,
        /// The pool's generation: kept in the [`OrderStore`](crate::OrderStore) and sent
        /// back on every replay of the key.
        generation: u64,
        /// True when this is the answer to an earlier request with the same key.
        replayed: bool,
    },
    /// Nothing left in this channel; nothing was reserved.
    SoldOut,
    /// The user reached the item's per-user limit; nothing was reserved.
    LimitExceeded {
        /// How many more units the user may still take (0: none until one of their
        /// reservations is cancelled or expires).
        remaining: u64,
    },
    /// The sale has not opened yet (by the center's clock); nothing was reserved.
    NotStarted {
        /// When it opens.
        opens_at: SystemTime,
    },
}

impl Acquired {
    /// A short stable name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Acquired::Reserved { replayed: false, .. } => "reserved",
            Acquired::Reserved { replayed: true, .. } => "replayed",
            Acquired::SoldOut => "sold_out",
            Acquired::LimitExceeded { .. } => "limit_exceeded",
            Acquired::NotStarted { .. } => "not_started",
        }
    }

    pub(crate) fn from_pb(r: pb::AcquireResponse) -> Result<Self, Error> {
        Ok(match r.outcome() {
            pb::AcquireOutcome::Reserved => Acquired::Reserved {
                id: r.reservation_id,
                qty: r.quantity,
                expires_at: time(r.expires_at_unix_ms),
                generation: r.pool_generation,
                replayed: r.replayed,
            },
            pb::AcquireOutcome::SoldOut => Acquired::SoldOut,
            pb::AcquireOutcome::LimitExceeded => Acquired::LimitExceeded { remaining: r.limit_remaining },
            pb::AcquireOutcome::NotStarted => Acquired::NotStarted { opens_at: time(r.opens_at_unix_ms) },
            pb::AcquireOutcome::Unspecified => return Err(Error::Protocol("acquire answered no outcome".into())),
        })
    }
}

/// The outcome of an Acquire's answer, named as [`Acquired::kind`] names it.
pub(crate) fn acquire_kind(r: &pb::AcquireResponse) -> &'static str {
    match r.outcome() {
        pb::AcquireOutcome::Reserved if r.replayed => "replayed",
        pb::AcquireOutcome::Reserved => "reserved",
        pb::AcquireOutcome::SoldOut => "sold_out",
        pb::AcquireOutcome::LimitExceeded => "limit_exceeded",
        pb::AcquireOutcome::NotStarted => "not_started",
        pb::AcquireOutcome::Unspecified => "protocol",
    }
}

/// A reservation's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Held, not paid yet.
    Reserved,
    /// Paid.
    Confirmed,
    /// Cancelled; its units went back on sale.
    Cancelled,
    /// Not paid in time; its units went back on sale.
    Expired,
    /// Paid, then refunded; its units went back on sale.
    Refunded,
}

impl State {
    /// Lowercase name (`"reserved"`, `"confirmed"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Reserved => "reserved",
            State::Confirmed => "confirmed",
            State::Cancelled => "cancelled",
            State::Expired => "expired",
            State::Refunded => "refunded",
        }
    }

    pub(crate) fn from_pb(s: pb::ReservationState) -> Result<Self, Error> {
        Ok(match s {
            pb::ReservationState::Reserved => State::Reserved,
            pb::ReservationState::Confirmed => State::Confirmed,
            pb::ReservationState::Cancelled => State::Cancelled,
            pb::ReservationState::Expired => State::Expired,
            pb::ReservationState::Refunded => State::Refunded,
            pb::ReservationState::Unspecified => return Err(Error::Protocol("no reservation state".into())),
        })
    }
}

/// How a reservation is looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// By the reservation id an Acquire answered.
    Id(&'a str),
    /// By the idempotency key the Acquire carried.
    Key(&'a str),
}

/// One reservation as the pool remembers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Its id.
    pub id: String,
    /// The Acquire's idempotency key.
    pub key: String,
    /// The buyer.
    pub user: String,
    /// Units held.
    pub qty: u64,
    /// Its state.
    pub state: State,
    /// When it expires (or expired) unless confirmed.
    pub expires_at: SystemTime,
    /// The generation of the pool holding it.
    pub generation: u64,
}

impl Reservation {
    pub(crate) fn from_pb(r: pb::Reservation) -> Result<Self, Error> {
        Ok(Reservation {
            state: State::from_pb(r.state())?,
            id: r.reservation_id,
            key: r.idempotency_key,
            user: r.user_id,
            qty: r.quantity,
            expires_at: time(r.expires_at_unix_ms),
            generation: r.pool_generation,
        })
    }
}

/// The channel's pool of one item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stock {
    /// Units on sale now.
    pub available: u64,
    /// Units held by open reservations.
    pub reserved: u64,
    /// Units confirmed.
    pub sold: u64,
    /// The pool is empty and the center has none left either.
    pub sold_out: bool,
    /// When the sale opens, if it has not yet.
    pub opens_at: Option<SystemTime>,
    /// The pool's generation (0: no pool yet).
    pub generation: u64,
}

impl From<pb::GetStockResponse> for Stock {
    fn from(s: pb::GetStockResponse) -> Self {
        Stock {
            available: s.available,
            reserved: s.reserved,
            sold: s.sold,
            sold_out: s.sold_out,
            opens_at: s.not_started.then(|| time(s.opens_at_unix_ms)),
            generation: s.pool_generation,
        }
    }
}

/// One reservation of a reserved basket (the lines of one item share it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasketLine {
    /// The item.
    pub item: String,
    /// The reservation id.
    pub id: String,
    /// Units held.
    pub qty: u64,
    /// When it expires unless confirmed.
    pub expires_at: SystemTime,
    /// The generation of the item's pool.
    pub generation: u64,
}

/// The answer to an AcquireBasket: every line or none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BasketAcquired {
    /// Every line is held.
    Reserved {
        /// What confirm_basket and cancel_basket take.
        basket_id: String,
        /// One per request line, in the request's order.
        lines: Vec<BasketLine>,
        /// True when this is the answer to an earlier request with the same key.
        replayed: bool,
    },
    /// `item` is sold out; nothing was held.
    SoldOut {
        /// The line's item.
        item: String,
    },
    /// The user's limit on `item` is reached; nothing was held.
    LimitExceeded {
        /// The line's item.
        item: String,
        /// How many more units of it the user may take.
        remaining: u64,
    },
    /// `item`'s sale has not opened; nothing was held.
    NotStarted {
        /// The line's item.
        item: String,
        /// When it opens.
        opens_at: SystemTime,
    },
}

impl BasketAcquired {
    pub(crate) fn from_pb(r: pb::AcquireBasketResponse) -> Result<Self, Error> {
        Ok(match r.outcome() {
            pb::AcquireOutcome::Reserved => BasketAcquired::Reserved {
                basket_id: r.basket_id,
                lines: r
                    .reservations
                    .into_iter()
                    .map(|l| BasketLine {
                        item: l.item_id,
                        id: l.reservation_id,
                        qty: l.quantity,
                        expires_at: time(l.expires_at_unix_ms),
                        generation: l.pool_generation,
                    })
                    .collect(),
                replayed: r.replayed,
            },
            pb::AcquireOutcome::SoldOut => BasketAcquired::SoldOut { item: r.short_item_id },
            pb::AcquireOutcome::LimitExceeded => {
                BasketAcquired::LimitExceeded { item: r.short_item_id, remaining: r.limit_remaining }
            }
            pb::AcquireOutcome::NotStarted => {
                BasketAcquired::NotStarted { item: r.short_item_id, opens_at: time(r.opens_at_unix_ms) }
            }
            pb::AcquireOutcome::Unspecified => return Err(Error::Protocol("basket answered no outcome".into())),
        })
    }
}

/// Milliseconds since 1970 as a `SystemTime` (negative values as 1970).
pub fn time(unix_ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0))
}

/// A `SystemTime` as milliseconds since 1970 (0 before 1970, saturating far out).
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
