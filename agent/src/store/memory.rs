//! The in-memory pool store: the embedded default and the reference model for the Redis
//! store (every branch here has its twin in a `lua/` script; the contract suite runs both).
//!
//! One `DashMap` entry per pool, each pool behind a `std::sync::Mutex` held only for one
//! short synchronous critical section, never across an await. The clock is the system
//! clock in ms since the Unix epoch.
//!
//! **Architecture invariant:** no operation touches more than one pool, and each one is a
//! single critical section, so each is atomic like its Lua twin.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dashmap::DashMap;

use super::{
    AcquireArgs, AcquireResult, ChannelOp, ChannelReply, PoolKey, PoolSnapshot, PoolStore, ReservationState,
    StoreError, Transition,
};

/// How long finished reservations (with their idempotency keys), applied grant ids and take
/// ids are remembered before the sweeper (`expire_due`) forgets them.
pub const DEFAULT_RECORD_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// At most this many forgettable records are dropped per `expire_due` call.
pub const GC_BATCH: u64 = 100;

#[derive(Debug, Clone)]
struct Reservation {
    state: ReservationState,
    quantity: u64,
    expires_at_ms: i64,
    user_id: String,
    idempotency_key: String,
}

#[derive(Debug, Clone, Copy)]
struct Take {
    units: u64,
    put_back: bool,
}

/// A record that may be forgotten once its retention ran out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Forgettable {
    Reservation(String),
    Grant(String),
    Take(String),
}

/// One pool. `generation == 0` means the pool was never refilled: it may still hold take
/// records, but its counters are all zero.
#[derive(Debug, Default)]
struct Pool {
    available: u64,
    reserved: u64,
    sold: u64,
    generation: u64,
    reservations: HashMap<String, Reservation>,
    /// RESERVED reservations by expiry.
    due: BTreeSet<(i64, String)>,
    /// Units each user holds (reserved + confirmed); users holding 0 are absent.
    held: HashMap<String, u64>,
    /// idempotency key -> reservation id.
    keys: HashMap<String, String>,
    /// grant id -> units applied.
    grants: HashMap<String, u64>,
    takes: HashMap<String, Take>,
    /// Records by the time after which they may be forgotten.
    gc: BTreeSet<(i64, Forgettable)>,
    /// The highest center epoch that fenced the pool.
    fence: u64,
}

impl Pool {
    fn acquire(&mut self, args: &AcquireArgs, now: i64) -> Result<AcquireResult, StoreError> {
        if let Some(id) = self.keys.get(&args.idempotency_key)
            && let Some(r) = self.reservations.get(id)
        {
            if r.user_id == args.user_id && r.quantity == args.quantity {
                return Ok(AcquireResult::Reserved {
                    reservation_id: id.clone(),
                    quantity: r.quantity,
                    expires_at_ms: r.expires_at_ms,
                    replayed: true,
                });
            }
            return Ok(AcquireResult::KeyConflict);
        }
        let held = self.held.get(&args.user_id).copied().unwrap_or(0);
        if held.saturating_add(args.quantity) > args.per_user_limit {
            return Ok(AcquireResult::LimitExceeded { held });
        }
        if self.available < args.quantity {
            return Ok(AcquireResult::SoldOut { available: self.available });
        }
        if self.reservations.contains_key(&args.new_reservation_id) {
            return Err(duplicate_reservation_id(&args.new_reservation_id));
        }
        let expires_at_ms = now.saturating_add(i64::try_from(args.reservation_ttl_ms).unwrap_or(i64::MAX));
        self.available -= args.quantity;
        self.reserved += args.quantity;
        *self.held.entry(args.user_id.clone()).or_default() += args.quantity;
        self.reservations.insert(
            args.new_reservation_id.clone(),
            Reservation {
                state: ReservationState::Reserved,
                quantity: args.quantity,
                expires_at_ms,
                user_id: args.user_id.clone(),
                idempotency_key: args.idempotency_key.clone(),
            },
        );
        self.due.insert((expires_at_ms, args.new_reservation_id.clone()));
        self.keys.insert(args.idempotency_key.clone(), args.new_reservation_id.clone());
        Ok(AcquireResult::Reserved {
            reservation_id: args.new_reservation_id.clone(),
            quantity: args.quantity,
            expires_at_ms,
            replayed: false,
        })
    }

    /// Moves a RESERVED reservation to `to`: CONFIRMED (reserved -> sold) or CANCELLED /
    /// EXPIRED (reserved -> available, the user's allowance freed). The caller checked the
    /// reservation exists and is RESERVED.
    fn finish(&mut self, id: &str, to: ReservationState, now: i64, retention_ms: i64) -> u64 {
        let r = self.reservations.get_mut(id).expect("finish: the caller checked the reservation exists");
        debug_assert_eq!(r.state, ReservationState::Reserved);
        r.state = to;
        let (quantity, expires_at_ms, user_id) = (r.quantity, r.expires_at_ms, r.user_id.clone());
        self.due.remove(&(expires_at_ms, id.to_owned()));
        self.gc.insert((now.saturating_add(retention_ms), Forgettable::Reservation(id.to_owned())));
        self.reserved -= quantity;
        if to == ReservationState::Confirmed {
            self.sold += quantity;
        } else {
            self.available += quantity;
            if let Some(held) = self.held.get_mut(&user_id) {
                *held = held.saturating_sub(quantity);
                if *held == 0 {
                    self.held.remove(&user_id);
                }
            }
        }
        quantity
    }

    fn confirm(&mut self, id: &str, now: i64, retention_ms: i64) -> Transition {
        let Some(r) = self.reservations.get(id) else { return Transition::NotFound };
        match r.state {
            ReservationState::Confirmed => Transition::Done(ReservationState::Confirmed),
            ReservationState::Cancelled | ReservationState::Expired => Transition::Refused(r.state),
            ReservationState::Reserved if r.expires_at_ms <= now => {
                self.finish(id, ReservationState::Expired, now, retention_ms);
                Transition::Refused(ReservationState::Expired)
            }
            ReservationState::Reserved => {
                self.finish(id, ReservationState::Confirmed, now, retention_ms);
                Transition::Done(ReservationState::Confirmed)
            }
        }
    }

    fn cancel(&mut self, id: &str, now: i64, retention_ms: i64) -> Transition {
        let Some(r) = self.reservations.get(id) else { return Transition::NotFound };
        match r.state {
            ReservationState::Confirmed => Transition::Refused(ReservationState::Confirmed),
            ReservationState::Cancelled | ReservationState::Expired => Transition::Done(r.state),
            ReservationState::Reserved => {
                let to = if r.expires_at_ms <= now { ReservationState::Expired } else { ReservationState::Cancelled };
                self.finish(id, to, now, retention_ms);
                Transition::Done(to)
            }
        }
    }

    fn expire_due(&mut self, max: u64, now: i64, retention_ms: i64) -> u64 {
        let due: Vec<String> = self
            .due
            .iter()
            .take_while(|(expires_at_ms, _)| *expires_at_ms <= now)
            .take(usize::try_from(max).unwrap_or(usize::MAX))
            .map(|(_, id)| id.clone())
            .collect();
        let mut freed = 0;
        for id in due {
            if self.reservations.get(&id).is_some_and(|r| r.state == ReservationState::Reserved) {
                freed += self.finish(&id, ReservationState::Expired, now, retention_ms);
            }
        }
        self.forget_old(now);
        freed
    }

    /// Drops up to [`GC_BATCH`] records whose retention ran out.
    fn forget_old(&mut self, now: i64) {
        let old: Vec<(i64, Forgettable)> =
            self.gc.iter().take_while(|(forget_at, _)| *forget_at <= now).take(GC_BATCH as usize).cloned().collect();
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

    fn refill(&mut self, grant_id: &str, units: u64, now: i64, retention_ms: i64) -> bool {
        if self.grants.contains_key(grant_id) {
            return false;
        }
        self.grants.insert(grant_id.to_owned(), units);
        self.gc.insert((now.saturating_add(retention_ms), Forgettable::Grant(grant_id.to_owned())));
        if self.generation == 0 {
            self.generation = new_generation();
        }
        self.available += units;
        true
    }

    fn take_for_return(&mut self, take_id: &str, max_units: u64, now: i64, retention_ms: i64) -> u64 {
        if let Some(take) = self.takes.get(take_id) {
            return take.units;
        }
        let units = max_units.min(self.available);
        self.available -= units;
        self.takes.insert(take_id.to_owned(), Take { units, put_back: false });
        self.gc.insert((now.saturating_add(retention_ms), Forgettable::Take(take_id.to_owned())));
        units
    }

    fn untake(&mut self, take_id: &str) -> u64 {
        let Some(take) = self.takes.get_mut(take_id) else { return 0 };
        if take.put_back || take.units == 0 || self.generation == 0 {
            return 0;
        }
        take.put_back = true;
        self.available += take.units;
        take.units
    }

    fn snapshot(&self, now: i64) -> PoolSnapshot {
        if self.generation == 0 {
            return PoolSnapshot { now_ms: now, ..PoolSnapshot::default() };
        }
        PoolSnapshot {
            available: self.available,
            reserved: self.reserved,
            sold: self.sold,
            generation: self.generation,
            now_ms: now,
        }
    }
}

/// Milliseconds since the Unix epoch by the system clock.
fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Microseconds since the Unix epoch: nonzero, below 2^53 (like the Lua twin, which takes
/// Redis TIME), and different for a pool created again later.
fn new_generation() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(1).max(1))
}

/// The in-memory [`PoolStore`].
#[derive(Debug)]
pub struct MemoryPoolStore {
    pools: DashMap<PoolKey, Arc<Mutex<Pool>>>,
    channels: DashMap<String, Arc<Mutex<ChannelState>>>,
    retention_ms: i64,
}

impl Default for MemoryPoolStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryPoolStore {
    pub fn new() -> Self {
        Self { pools: DashMap::new(), channels: DashMap::new(), retention_ms: duration_ms(DEFAULT_RECORD_RETENTION) }
    }

    /// How long finished reservations, grant ids and take ids are remembered (default
    /// [`DEFAULT_RECORD_RETENTION`]). An idempotency key is forgotten with its reservation.
    pub fn with_record_retention(mut self, retention: Duration) -> Self {
        self.retention_ms = duration_ms(retention);
        self
    }

    /// The pool if it exists. The dashmap shard lock is released before the pool is locked.
    fn existing(&self, pool: &PoolKey) -> Option<Arc<Mutex<Pool>>> {
        self.pools.get(pool).map(|p| Arc::clone(p.value()))
    }

    fn existing_or_new(&self, pool: &PoolKey) -> Arc<Mutex<Pool>> {
        if let Some(p) = self.existing(pool) {
            return p;
        }
        Arc::clone(self.pools.entry(pool.clone()).or_default().value())
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The critical sections hold no panicking path short of a broken invariant (a bug), so a
/// poisoned lock is taken over rather than turning the pool unavailable for good.
fn lock(pool: &Mutex<Pool>) -> MutexGuard<'_, Pool> {
    pool.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl PoolStore for MemoryPoolStore {
    async fn acquire(&self, pool: &PoolKey, args: &AcquireArgs) -> Result<AcquireResult, StoreError> {
        if args.quantity == 0 {
            return Err(StoreError::Protocol("acquire quantity must be positive".to_owned()));
        }
        let now = now_ms();
        let Some(p) = self.existing(pool) else {
            // A missing pool has nothing available and nobody holds anything: answer without writing.
            return Pool::default().acquire(args, now);
        };
        lock(&p).acquire(args, now)
    }

    async fn confirm(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Transition::NotFound) };
        Ok(lock(&p).confirm(reservation_id, now_ms(), self.retention_ms))
    }

    async fn cancel(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Transition::NotFound) };
        Ok(lock(&p).cancel(reservation_id, now_ms(), self.retention_ms))
    }

    async fn expire_due(&self, pool: &PoolKey, max: u64) -> Result<u64, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(0) };
        Ok(lock(&p).expire_due(max, now_ms(), self.retention_ms))
    }

    async fn refill(&self, pool: &PoolKey, grant_id: &str, units: u64, epoch: u64) -> Result<bool, StoreError> {
        let p = self.existing_or_new(pool);
        let mut guard = lock(&p);
        fenced(pool, &guard, epoch)?;
        Ok(guard.refill(grant_id, units, now_ms(), self.retention_ms))
    }

    async fn refill_existing(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        let missing = || StoreError::PoolMissing(pool.hash_tag());
        let p = self.existing(pool).ok_or_else(missing)?;
        let mut guard = lock(&p);
        fenced(pool, &guard, epoch)?;
        if guard.generation == 0 {
            return Err(missing());
        }
        Ok(guard.refill(grant_id, units, now_ms(), self.retention_ms))
    }

    async fn take_for_return(
        &self,
        pool: &PoolKey,
        take_id: &str,
        max_units: u64,
        epoch: u64,
    ) -> Result<u64, StoreError> {
        let p = self.existing_or_new(pool);
        let mut guard = lock(&p);
        fenced(pool, &guard, epoch)?;
        Ok(guard.take_for_return(take_id, max_units, now_ms(), self.retention_ms))
    }

    async fn untake(&self, pool: &PoolKey, take_id: &str, epoch: u64) -> Result<u64, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(0) };
        let mut guard = lock(&p);
        fenced(pool, &guard, epoch)?;
        Ok(guard.untake(take_id))
    }

    async fn raise_fence(&self, pool: &PoolKey, epoch: u64) -> Result<u64, StoreError> {
        let p = self.existing_or_new(pool);
        let mut guard = lock(&p);
        guard.fence = guard.fence.max(epoch);
        Ok(guard.fence)
    }

    async fn snapshot(&self, pool: &PoolKey) -> Result<PoolSnapshot, StoreError> {
        let now = now_ms();
        let Some(p) = self.existing(pool) else { return Ok(PoolSnapshot { now_ms: now, ..PoolSnapshot::default() }) };
        Ok(lock(&p).snapshot(now))
    }

    async fn reservation_state(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
    ) -> Result<Option<ReservationState>, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(None) };
        Ok(lock(&p).reservations.get(reservation_id).map(|r| r.state))
    }

    async fn idempotency_keys(&self, pool: &PoolKey) -> Result<Vec<String>, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Vec::new()) };
        Ok(lock(&p).keys.keys().cloned().collect())
    }

    async fn channel_op(&self, channel: &str, op: ChannelOp<'_>) -> Result<ChannelReply, StoreError> {
        let state = Arc::clone(self.channels.entry(channel.to_owned()).or_default().value());
        let mut c = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(c.apply(op, now_ms()))
    }
}

/// Refuses an operation of an incarnation older than the pool's fence.
fn fenced(pool: &PoolKey, p: &Pool, epoch: u64) -> Result<(), StoreError> {
    if p.fence > epoch { Err(StoreError::Fenced(pool.hash_tag())) } else { Ok(()) }
}

/// One channel's coordination state (twin of `lua/channel.lua`).
#[derive(Debug, Default)]
struct ChannelState {
    /// The leader and until when (ms) it leads.
    leader: Option<(String, i64)>,
    /// Until when (ms) the channel may sell.
    lease_until: i64,
    wants: BTreeSet<String>,
    /// Replica -> until when (ms) it is alive.
    replicas: HashMap<String, i64>,
}

impl ChannelState {
    fn apply(&mut self, op: ChannelOp<'_>, now: i64) -> ChannelReply {
        if self.leader.as_ref().is_some_and(|(_, until)| *until <= now) {
            self.leader = None;
        }
        let ms = |ttl: u64| now.saturating_add(i64::try_from(ttl.max(1)).unwrap_or(i64::MAX));
        let leads = |l: &Option<(String, i64)>, r: &str| l.as_ref().is_some_and(|(who, _)| who == r);
        match op {
            ChannelOp::Lead { replica, ttl_ms } => {
                let free_or_mine = self.leader.is_none() || leads(&self.leader, replica);
                if free_or_mine {
                    self.leader = Some((replica.to_owned(), ms(ttl_ms)));
                }
                ChannelReply::Done(free_or_mine)
            }
            ChannelOp::Resign { replica } => {
                let mine = leads(&self.leader, replica);
                if mine {
                    self.leader = None;
                }
                ChannelReply::Done(mine)
            }
            ChannelOp::Publish { replica, ttl_ms } => {
                let mine = leads(&self.leader, replica);
                if mine {
                    self.lease_until = ms(ttl_ms);
                }
                ChannelReply::Done(mine)
            }
            ChannelOp::LeaseLeft => ChannelReply::Millis(u64::try_from(self.lease_until - now).unwrap_or(0)),
            ChannelOp::Want { item_id } => {
                self.wants.insert(item_id.to_owned());
                ChannelReply::Done(true)
            }
            ChannelOp::TakeWants { max } => {
                let n = usize::try_from(max.max(1)).unwrap_or(usize::MAX);
                let taken: Vec<String> = self.wants.iter().take(n).cloned().collect();
                for id in &taken {
                    self.wants.remove(id);
                }
                ChannelReply::Items(taken)
            }
            ChannelOp::Leader => ChannelReply::Leader(self.leader.as_ref().map(|(who, _)| who.clone())),
            ChannelOp::Present { replica, ttl_ms } => {
                let others = self.others_alive(replica, now);
                self.replicas.insert(replica.to_owned(), ms(ttl_ms));
                ChannelReply::Count(others)
            }
            ChannelOp::Absent { replica } => {
                self.replicas.remove(replica);
                ChannelReply::Count(self.others_alive(replica, now))
            }
        }
    }

    fn others_alive(&mut self, replica: &str, now: i64) -> u64 {
        self.replicas.retain(|_, until| *until > now);
        self.replicas.keys().filter(|r| *r != replica).count() as u64
    }
}

pub(super) fn duplicate_reservation_id(id: &str) -> StoreError {
    StoreError::Protocol(format!("new_reservation_id {id:?} names an existing reservation"))
}
