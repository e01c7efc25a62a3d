//! Local pools: one channel's stock of each item, and the reservations sold from it.
//!
//! One trait, two implementations that pass the same contract suite
//! (`agent/tests/it/store_contract.rs`):
//! - [`redis::RedisPoolStore`]: every operation is exactly one call of a Lua script in
//!   `lua/`, so each is atomic on the Redis server;
//! - [`memory::MemoryPoolStore`]: the embedded default, over the reference model
//!   [`inventory_core::pool::Pool`].
//!
//! Every reservation transition writes its [`PoolEvent`] into the pool's outbox in the same
//! atomic step (the same Lua call, the same critical section); [`PoolStore::events`] reads
//! it and [`PoolStore::trim_events`] forgets what a relay delivered. The outbox keeps at
//! most the store's outbox bound per pool, dropping the oldest.
//!
//! **Architecture invariant:** the pool counters change only inside these operations;
//! nothing else writes them. `available + reserved + sold` changes only through
//! `refill` (up) and `take_for_return` (down).

pub mod health;
pub mod memory;
pub mod redis;

use async_trait::async_trait;

/// Identifies one pool: a channel's stock of one item, or one segment of it. Every key of
/// a pool carries the pool's hash tag (`{channel:item}`, `{channel:item#s}` for segment
/// s > 0) so a pool lives on one Redis Cluster slot and the segments of a hot item spread
/// over the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub channel: String,
    pub item_id: String,
    pub segment: u32,
}

impl PoolKey {
    /// Segment 0: the pool of a one-segment item.
    pub fn new(channel: impl Into<String>, item_id: impl Into<String>) -> Self {
        Self::segment(channel, item_id, 0)
    }

    pub fn segment(channel: impl Into<String>, item_id: impl Into<String>, segment: u32) -> Self {
        Self { channel: channel.into(), item_id: item_id.into(), segment }
    }

    /// The hash tag shared by all keys of the pool (`inventory_core::segments::hash_tag`).
    pub fn hash_tag(&self) -> String {
        inventory_core::segments::hash_tag(&self.channel, &self.item_id, self.segment)
    }
}

// The pool model and the data it speaks live in `inventory_core::pool`; the stores wrap it
// (memory) or mirror it (Lua).
pub use inventory_core::pool::{
    AcquireArgs, AcquireResult, DEFAULT_OUTBOX_MAX, EventPage, ExtendResult, OutboxStats, PoolEvent, PoolSnapshot,
    Reservation, ReservationRef, ReservationState, Transition,
};

pub use inventory_core::channel::PoolStamp;

/// What [`PoolStore::look`] found.
#[derive(Debug, Clone)]
pub struct Looked {
    /// Units the sweep put back.
    pub freed: u64,
    /// The pool after the sweep.
    pub snapshot: PoolSnapshot,
    /// Its outbox after the sweep (which may have written events); `None` when the pool is
    /// missing or lost.
    pub outbox: Option<OutboxStats>,
}

/// A move of units between two segments of one channel's pool of an item, recorded before
/// its take and cleared after its refill (both keyed by `id`), so a crash between them is
/// finished by whoever reads the item's segments next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveIntent {
    pub id: String,
    pub from: u32,
    pub to: u32,
    pub quantity: u64,
}

impl MoveIntent {
    /// The stored form, `"<from> <to> <quantity>"`.
    pub fn encode(&self) -> String {
        format!("{} {} {}", self.from, self.to, self.quantity)
    }

    pub fn decode(id: &str, text: &str) -> Option<Self> {
        let mut parts = text.split(' ').map(str::parse::<u64>);
        let (from, to, quantity) = (parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?);
        Some(Self { id: id.to_owned(), from: u32::try_from(from).ok()?, to: u32::try_from(to).ok()?, quantity })
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("pool store unavailable: {0}")]
    Unavailable(String),
    /// The store refused a write without making it (its memory limit, ...): the caller
    /// may retry with the same ids once it takes writes again.
    #[error("pool store refused the write: {0}; retry with the same idempotency_key")]
    Refused(String),
    #[error("pool store returned an unexpected answer: {0}")]
    Protocol(String),
    /// The pool does not exist in the store (never opened, or the store lost it).
    #[error("pool {0} does not exist in the store")]
    PoolMissing(String),
    /// The pool was fenced by a later center epoch: the caller's incarnation of the channel
    /// is over (another replica, or this one, registered again) and must not move its units.
    #[error("pool {0} was fenced by a later epoch of its channel")]
    Fenced(String),
    /// An acquire expected another pool generation than the pool has (0: no pool):
    /// nothing was read or written beyond the generation.
    #[error(
        "expect_pool_generation {expected} does not match generation {actual} of pool {pool}: the pool's data was \
         lost since that answer and its idempotency keys with it, so the key is not replayed; look the order up \
         instead of retrying"
    )]
    GenerationChanged { pool: String, expected: u64, actual: u64 },
}

/// Key names of a channel's coordination state: `{channel}` is its hash tag.
pub fn channel_tag(channel: &str) -> String {
    format!("{{{channel}}}")
}

#[async_trait]
pub trait PoolStore: Send + Sync + 'static {
    /// Atomically: replay check on the idempotency key, per-user limit check, deduct
    /// `quantity` from available into reserved, record the reservation with an expiry of
    /// store-clock now + ttl. A sold-out or limit answer writes nothing. The reservation's
    /// id is `args.new_reservation_id`, or, when that is one [`PoolStore::new_reservation_id`]
    /// made, what the store completes it to; the answer says which.
    async fn acquire(&self, pool: &PoolKey, args: &AcquireArgs) -> Result<AcquireResult, StoreError>;

    /// A `new_reservation_id` for an Acquire on segment `segment` of an item: a fresh id
    /// tagged with the segment (`inventory_core::segments::tag_reservation_id`), or what
    /// the store turns into one. Other ids of the caller's own are taken as they are.
    fn new_reservation_id(&self, segment: u32) -> String {
        inventory_core::segments::tag_reservation_id(segment, &uuid::Uuid::new_v4().simple().to_string())
    }

    /// RESERVED -> CONFIRMED (reserved -> sold). Idempotent. A reservation past its expiry
    /// is expired on the spot and the confirm is refused.
    async fn confirm(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError>;

    /// RESERVED -> CANCELLED (reserved -> available, frees the user's allowance).
    /// Idempotent; refused after confirm; a no-op returning EXPIRED after expiry.
    async fn cancel(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError>;

    /// CONFIRMED -> REFUNDED (sold -> available, frees the user's allowance). Idempotent;
    /// refused unless confirmed.
    async fn refund(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError>;

    /// Pushes a RESERVED reservation's expiry to `max(current, now + min(extend_ms,
    /// ttl_ms))` by the store's clock. One already past its expiry is expired on the spot
    /// and refused, as confirm does.
    async fn extend(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
        extend_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExtendResult, StoreError>;

    /// One reservation by id or by idempotency key, with its id, while the store knows it.
    async fn reservation(
        &self,
        pool: &PoolKey,
        by: &ReservationRef,
    ) -> Result<Option<(String, Reservation)>, StoreError>;

    /// Events with sequence >= from_sequence, oldest first, at most max; plus the pool's
    /// generation, last written sequence and oldest kept sequence.
    async fn events(&self, pool: &PoolKey, from_sequence: u64, max: u64) -> Result<EventPage, StoreError>;

    /// Forgets events with sequence <= through_sequence (the relay calls this after the
    /// broker acknowledged them), only while the pool still has `generation` (a pool lost
    /// and created anew numbers its events from 1 again; those are not the acknowledged
    /// ones). Returns how many were removed.
    async fn trim_events(&self, pool: &PoolKey, generation: u64, through_sequence: u64) -> Result<u64, StoreError>;

    /// How many events the outbox keeps and has dropped (for metrics).
    async fn outbox_stats(&self, pool: &PoolKey) -> Result<OutboxStats, StoreError>;

    /// Expires up to `max` reservations whose expiry is due by the store's clock.
    /// Returns the number of units put back into available.
    async fn expire_due(&self, pool: &PoolKey, max: u64) -> Result<u64, StoreError>;

    /// The rebalancer's look at a pool: [`PoolStore::expire_due`], then
    /// [`PoolStore::snapshot`] and [`PoolStore::outbox_stats`] of the pool after it.
    /// A store may do all in one call (nothing can happen to the pool in between there,
    /// which the rules take as they take the separate calls).
    async fn look(&self, pool: &PoolKey, max: u64) -> Result<Looked, StoreError> {
        let freed = self.expire_due(pool, max).await?;
        let snapshot = self.snapshot(pool).await?;
        // Only for the metrics: a failed read of it fails no look.
        let outbox = if snapshot.generation > 0 { self.outbox_stats(pool).await.ok() } else { None };
        Ok(Looked { freed, snapshot, outbox })
    }

    /// Adds `units` granted by the center to available, once per `grant_id` (a replayed
    /// refill counts once). Creates the pool if needed. Returns whether it was applied.
    ///
    /// `epoch` is the caller's center epoch: this and the three operations below are
    /// refused with [`StoreError::Fenced`] once the pool was fenced with a later epoch
    /// ([`PoolStore::raise_fence`]).
    async fn refill(&self, pool: &PoolKey, grant_id: &str, units: u64, epoch: u64) -> Result<bool, StoreError>;

    /// Like [`PoolStore::refill`], but never creates the pool: a pool that does not exist is
    /// [`StoreError::PoolMissing`] and nothing is recorded. Grants use this, so a pool the
    /// store lost between the Borrow and the refill is not quietly recreated.
    async fn refill_existing(&self, pool: &PoolKey, grant_id: &str, units: u64, epoch: u64)
    -> Result<bool, StoreError>;

    /// [`PoolStore::refill_existing`] when `must_exist`, else [`PoolStore::refill`], answered
    /// with whether it was applied and the pool as the write left it. The pool is checked
    /// whole before the write and read in the same atomic step, so the answer stands for a
    /// whole read at the write (`core::channel::quiet`: the next look and heartbeat read the
    /// pool's stamp only). This default reads the pool after the write: later, still a
    /// whole read.
    async fn refill_read(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        must_exist: bool,
        epoch: u64,
    ) -> Result<(bool, PoolSnapshot), StoreError> {
        let applied = if must_exist {
            self.refill_existing(pool, grant_id, units, epoch).await?
        } else {
            self.refill(pool, grant_id, units, epoch).await?
        };
        Ok((applied, self.snapshot(pool).await?))
    }

    /// Removes up to `max_units` from available so they can be returned to the center,
    /// once per `take_id` (a replay returns the first amount). Returns the units taken.
    async fn take_for_return(
        &self,
        pool: &PoolKey,
        take_id: &str,
        max_units: u64,
        epoch: u64,
    ) -> Result<u64, StoreError>;

    /// Puts back units taken by `take_for_return` whose Return the center refused or
    /// never applied; once per `take_id`.
    async fn untake(&self, pool: &PoolKey, take_id: &str, epoch: u64) -> Result<u64, StoreError>;

    /// Raises the pool's fence to `epoch` (never lowers it) and returns the fence it found
    /// before. A new incarnation of the channel does this before it reads a pool to resync
    /// it; a fence found at or above its epoch means the center handed that epoch out
    /// before (`ledger::fence`).
    async fn raise_fence(&self, pool: &PoolKey, epoch: u64) -> Result<u64, StoreError>;

    /// Raises the pool's floor to `floor`, never lowering it: the write sequence below
    /// which the pool went back in time and is lost (`core::pool::went_back`). The agent
    /// sets the one the center remembers (what the channel reported) before it touches the
    /// pool, so a pool that went back is caught even by an incarnation that never saw its
    /// writes. A store whose pools cannot go back between two calls checks it at once.
    async fn raise_floor(&self, pool: &PoolKey, floor: u64) -> Result<(), StoreError>;

    /// The pool's floor: the highest write sequence this store layer's own writes were
    /// acknowledged with, or was given (what a report carries to the center).
    fn floor(&self, pool: &PoolKey) -> u64;

    /// The counters, the generation and the store's clock.
    async fn snapshot(&self, pool: &PoolKey) -> Result<PoolSnapshot, StoreError>;

    /// [`PoolStore::snapshot`] of each of `pools`, in their order: what a full report
    /// reads. A store that can read many pools in one call does (the Redis store).
    async fn snapshots(&self, pools: &[PoolKey]) -> Vec<Result<PoolSnapshot, StoreError>> {
        futures::future::join_all(pools.iter().map(|p| self.snapshot(p))).await
    }

    /// Each of `pools`' stamp, in their order: its generation and write sequence, read
    /// without the checks a snapshot makes of each structure (a quiet heartbeat reads a
    /// pool whole only when its stamp moved, `core::channel::quiet`). Generation 0: the
    /// pool is missing, or known lost, or below the floor. A store without a cheaper read
    /// answers from snapshots.
    async fn stamps(&self, pools: &[PoolKey]) -> Vec<Result<PoolStamp, StoreError>> {
        let snaps = self.snapshots(pools).await;
        snaps.into_iter().map(|s| s.map(|s| PoolStamp { generation: s.generation, write_seq: s.write_seq })).collect()
    }

    /// The state of one reservation, if the store still knows it.
    async fn reservation_state(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
    ) -> Result<Option<ReservationState>, StoreError>;

    /// Every idempotency key the pool remembers (keys that reserved). Bounded by the
    /// pool's reservations within the record retention.
    async fn idempotency_keys(&self, pool: &PoolKey) -> Result<Vec<String>, StoreError>;

    /// The intent of basket `basket_id` of `channel`, with its version and when it was last
    /// written (the store's clock, with the store's now).
    async fn basket(&self, channel: &str, basket_id: &str) -> Result<Option<StoredBasket>, StoreError>;

    /// Writes the intent only if the stored one has version `expected_version` (0: only if
    /// there is none): a compare-and-set, so of two parties moving one intent only one
    /// wins; the loser gets what is stored. Open intents ([`Intent::is_open`]) are listed
    /// by [`PoolStore::open_baskets`]; every intent is forgotten [`BASKET_RETENTION`] after
    /// its last write.
    async fn put_basket(
        &self,
        channel: &str,
        basket_id: &str,
        expected_version: u64,
        intent: &Intent,
    ) -> Result<BasketWrite, StoreError>;

    /// Ids of up to `max` open intents of the channel, least recently written first.
    async fn open_baskets(&self, channel: &str, max: u64) -> Result<Vec<String>, StoreError>;
    /// Records a move between segments of `pool`'s item (`pool` is segment 0: the intents
    /// live under its hash tag), before the move's take (`lua/moves.lua`).
    async fn record_move(&self, pool: &PoolKey, intent: &MoveIntent) -> Result<(), StoreError>;

    /// The moves of `pool`'s item recorded and not cleared yet.
    async fn pending_moves(&self, pool: &PoolKey) -> Result<Vec<MoveIntent>, StoreError>;

    /// Forgets a move once its refill is done.
    async fn clear_move(&self, pool: &PoolKey, move_id: &str) -> Result<(), StoreError>;

    /// Coordination of the replicas of one channel sharing this store (`lua/channel.lua`).
    async fn channel_op(&self, channel: &str, op: ChannelOp<'_>) -> Result<ChannelReply, StoreError>;
}

pub use inventory_core::basket::Intent;

/// How long a basket's intent is kept after its last write: its reservations' longest TTL
/// (24 h) and the record retention after that.
pub const BASKET_RETENTION: std::time::Duration = std::time::Duration::from_secs(48 * 60 * 60);

/// A basket's intent as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBasket {
    pub intent: Intent,
    /// From 1; every write adds 1.
    pub version: u64,
    /// When it was last written and the store's now, by the store's clock (ms).
    pub written_at_ms: i64,
    pub now_ms: i64,
}

impl StoredBasket {
    pub fn age_ms(&self) -> i64 {
        self.now_ms.saturating_sub(self.written_at_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BasketWrite {
    Written {
        version: u64,
    },
    /// The stored version was another: nothing written; what is stored (None: nothing).
    Conflict(Option<StoredBasket>),
}

/// One coordination step between the agent replicas of a channel (see `lua/channel.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelOp<'a> {
    /// Claim or renew the leadership for `ttl_ms`.
    Lead { replica: &'a str, ttl_ms: u64 },
    /// Drop the leadership if `replica` holds it.
    Resign { replica: &'a str },
    /// Set the channel's selling lease to `ttl_ms` from now, only if `replica` leads.
    Publish { replica: &'a str, ttl_ms: u64 },
    /// How long the channel's selling lease still runs.
    LeaseLeft,
    /// A follower saw this item short of stock (or loaded it first).
    Want { item_id: &'a str },
    /// Take up to `max` wanted items.
    TakeWants { max: u64 },
    /// Who leads.
    Leader,
    /// `replica` is alive for `ttl_ms`; answers how many other replicas are.
    Present { replica: &'a str, ttl_ms: u64 },
    /// `replica` is going away; answers how many other replicas are alive.
    Absent { replica: &'a str },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelReply {
    /// Lead, Resign, Publish, Want: whether it took effect.
    Done(bool),
    /// LeaseLeft: milliseconds.
    Millis(u64),
    /// TakeWants: item ids.
    Items(Vec<String>),
    /// Leader: the leading replica, if any.
    Leader(Option<String>),
    /// Present, Absent: how many other replicas are alive.
    Count(u64),
}

/// Raises the floors the center handed back for an item (`floors[s]` for segment s's pool,
/// see [`PoolStore::raise_floor`]); a floor of 0 or for a segment the item does not have
/// changes nothing.
pub async fn raise_floors(store: &dyn PoolStore, pools: &[PoolKey], floors: &[u64]) -> Result<(), StoreError> {
    for (pool, floor) in pools.iter().zip(floors) {
        if *floor > 0 {
            store.raise_floor(pool, *floor).await?;
        }
    }
    Ok(())
}
