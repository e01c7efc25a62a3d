//! The in-memory pool store: the embedded default. The pool model itself is
//! [`inventory_core::pool::Pool`] (every branch of it has its twin in a `lua/` script; the
//! contract suite runs both stores); this adds the map of pools, the system clock, the
//! generations of new pools and the replicas' channel coordination.
//!
//! One `DashMap` entry per pool, each pool behind a `std::sync::Mutex` held only for one
//! short synchronous critical section, never across an await. The clock is the system
//! clock in ms since the Unix epoch.
//!
//! **Architecture invariant:** no operation touches more than one pool, and each one is a
//! single critical section, so each is atomic like its Lua twin.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dashmap::DashMap;
pub use inventory_core::pool::GC_BATCH;
use inventory_core::pool::{Pool, PoolError};

use super::{
    BASKET_RETENTION, BasketWrite, DEFAULT_OUTBOX_MAX, EventPage, ExtendResult, Intent, OutboxStats, Reservation,
    ReservationRef, StoredBasket,
};

use super::{
    AcquireArgs, AcquireResult, ChannelOp, ChannelReply, PoolKey, PoolSnapshot, PoolStore, ReservationState,
    StoreError, Transition,
};

/// How long finished reservations (with their idempotency keys), applied grant ids and take
/// ids are remembered before the sweeper (`expire_due`) forgets them.
pub const DEFAULT_RECORD_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// Milliseconds since the Unix epoch by the system clock.
fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Microseconds since the Unix epoch: nonzero, below 2^53 (like the Lua twin, which takes
/// Redis TIME), and different for a pool created again later.
fn new_generation() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(1).max(1))
}

/// What [`MemoryPoolStore::save`] writes.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedPools {
    center: String,
    pools: Vec<SavedPool>,
    /// Basket intents (absent in files of agents without baskets).
    #[serde(default)]
    baskets: Vec<SavedBasket>,
}

/// One basket intent as [`MemoryPoolStore::save`] writes it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct SavedBasket {
    channel: String,
    basket_id: String,
    intent: Intent,
    version: u64,
    written_at_ms: i64,
}

/// One pool as [`MemoryPoolStore::save`] writes it.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedPool {
    channel: String,
    item_id: String,
    #[serde(default)]
    segment: u32,
    pool: Pool,
}

/// The in-memory [`PoolStore`].
#[derive(Debug)]
pub struct MemoryPoolStore {
    pools: DashMap<PoolKey, Arc<Mutex<Pool>>>,
    channels: DashMap<String, Arc<Mutex<ChannelState>>>,
    /// Basket intents by (channel, basket id): few and small next to the pools, so one lock.
    baskets: Mutex<HashMap<(String, String), SavedBasket>>,
    /// Move intents per item (keyed by segment 0's pool), as `lua/moves.lua` keeps them.
    moves: DashMap<PoolKey, Vec<super::MoveIntent>>,
    retention_ms: i64,
    outbox_max: u64,
}

impl Default for MemoryPoolStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryPoolStore {
    pub fn new() -> Self {
        Self {
            pools: DashMap::new(),
            channels: DashMap::new(),
            baskets: Mutex::new(HashMap::new()),
            moves: DashMap::new(),
            retention_ms: duration_ms(DEFAULT_RECORD_RETENTION),
            outbox_max: DEFAULT_OUTBOX_MAX,
        }
    }

    /// Keep at most `max` events per pool (default [`DEFAULT_OUTBOX_MAX`]); past it the
    /// oldest are dropped and counted.
    pub fn with_outbox_max(mut self, max: u64) -> Self {
        self.outbox_max = max.max(1);
        for p in &self.pools {
            lock(p.value()).set_outbox_max(self.outbox_max);
        }
        self
    }

    /// How long finished reservations, grant ids and take ids are remembered (default
    /// [`DEFAULT_RECORD_RETENTION`]). An idempotency key is forgotten with its reservation.
    pub fn with_record_retention(mut self, retention: Duration) -> Self {
        self.retention_ms = duration_ms(retention);
        self
    }

    /// Writes every pool to `path` (through a temporary file and a rename, so a reader
    /// never sees half a file), with the center they belong to. Call only once nothing
    /// changes the pools any more.
    pub fn save(&self, path: &Path, center: &str) -> std::io::Result<usize> {
        let pools: Vec<SavedPool> = self
            .pools
            .iter()
            .map(|e| SavedPool {
                channel: e.key().channel.clone(),
                item_id: e.key().item_id.clone(),
                segment: e.key().segment,
                pool: lock(e.value()).clone(),
            })
            .collect();
        let n = pools.len();
        let baskets = self.lock_baskets().values().cloned().collect();
        let saved = SavedPools { center: center.to_owned(), pools, baskets };
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(&saved).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, path)?;
        Ok(n)
    }

    /// A store holding the pools [`MemoryPoolStore::save`] wrote to `path` for `center`,
    /// and the items they are of; the file is then deleted: a later crash must not bring
    /// back pools older than what was sold since (the restarted agent must find them lost
    /// instead). No file: an empty store. Pools kept for another center are refused.
    pub fn load(path: &Path, center: &str) -> std::io::Result<(Self, Vec<String>)> {
        let store = Self::new();
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((store, Vec::new())),
            Err(e) => return Err(e),
        };
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let saved: SavedPools =
            serde_json::from_slice(&bytes).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
        if saved.center != center {
            return Err(invalid(format!(
                "{} holds pools of the center at {}, not {center}; move it away to start with empty pools",
                path.display(),
                saved.center
            )));
        }
        std::fs::remove_file(path)?;
        let mut items = Vec::with_capacity(saved.pools.len());
        for p in saved.pools {
            if !items.contains(&p.item_id) {
                items.push(p.item_id.clone());
            }
            store.pools.insert(PoolKey::segment(p.channel, p.item_id, p.segment), Arc::new(Mutex::new(p.pool)));
        }
        let mut baskets = store.lock_baskets();
        for b in saved.baskets {
            baskets.insert((b.channel.clone(), b.basket_id.clone()), b);
        }
        drop(baskets);
        Ok((store, items))
    }

    fn lock_baskets(&self) -> MutexGuard<'_, HashMap<(String, String), SavedBasket>> {
        self.baskets.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The pool if it exists. The dashmap shard lock is released before the pool is locked.
    fn existing(&self, pool: &PoolKey) -> Option<Arc<Mutex<Pool>>> {
        self.pools.get(pool).map(|p| Arc::clone(p.value()))
    }

    fn existing_or_new(&self, pool: &PoolKey) -> Arc<Mutex<Pool>> {
        if let Some(p) = self.existing(pool) {
            return p;
        }
        let new = || {
            let mut p = Pool::new();
            p.set_outbox_max(self.outbox_max);
            Arc::new(Mutex::new(p))
        };
        Arc::clone(self.pools.entry(pool.clone()).or_insert_with(new).value())
    }
}

fn first_segment(pool: &PoolKey) -> PoolKey {
    PoolKey::new(pool.channel.clone(), pool.item_id.clone())
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
        let now = now_ms();
        let Some(p) = self.existing(pool) else {
            // A missing pool has nothing available and nobody holds anything: answer without writing.
            return Pool::default().acquire(args, now).map_err(|e| store_error(pool, e));
        };
        lock(&p).acquire(args, now).map_err(|e| store_error(pool, e))
    }

    async fn confirm(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Transition::NotFound) };
        lock(&p).confirm(reservation_id, now_ms(), self.retention_ms).map_err(|e| store_error(pool, e))
    }

    async fn cancel(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Transition::NotFound) };
        lock(&p).cancel(reservation_id, now_ms(), self.retention_ms).map_err(|e| store_error(pool, e))
    }

    async fn refund(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Transition::NotFound) };
        lock(&p).refund(reservation_id, now_ms()).map_err(|e| store_error(pool, e))
    }

    async fn extend(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
        extend_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExtendResult, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(ExtendResult::NotFound) };
        let result = lock(&p).extend(reservation_id, extend_ms, ttl_ms, now_ms(), self.retention_ms);
        result.map_err(|e| store_error(pool, e))
    }

    async fn reservation(
        &self,
        pool: &PoolKey,
        by: &ReservationRef,
    ) -> Result<Option<(String, Reservation)>, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(None) };
        Ok(lock(&p).find(by).map(|(id, r)| (id.to_owned(), r.clone())))
    }

    async fn events(&self, pool: &PoolKey, from_sequence: u64, max: u64) -> Result<EventPage, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Pool::new().events(from_sequence, max)) };
        Ok(lock(&p).events(from_sequence, max))
    }

    async fn trim_events(&self, pool: &PoolKey, generation: u64, through_sequence: u64) -> Result<u64, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(0) };
        Ok(lock(&p).trim_events(generation, through_sequence))
    }

    async fn outbox_stats(&self, pool: &PoolKey) -> Result<OutboxStats, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(OutboxStats::default()) };
        Ok(lock(&p).outbox_stats())
    }

    async fn expire_due(&self, pool: &PoolKey, max: u64) -> Result<u64, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(0) };
        lock(&p).expire_due(max, now_ms(), self.retention_ms).map_err(|e| store_error(pool, e))
    }

    async fn refill(&self, pool: &PoolKey, grant_id: &str, units: u64, epoch: u64) -> Result<bool, StoreError> {
        let p = self.existing_or_new(pool);
        let generation = new_generation();
        let result = lock(&p).refill(grant_id, units, epoch, generation, now_ms(), self.retention_ms);
        result.map_err(|e| store_error(pool, e))
    }

    async fn refill_existing(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        let p = self.existing(pool).ok_or_else(|| store_error(pool, PoolError::Missing))?;
        let result = lock(&p).refill_existing(grant_id, units, epoch, now_ms(), self.retention_ms);
        result.map_err(|e| store_error(pool, e))
    }

    async fn refill_read(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        must_exist: bool,
        epoch: u64,
    ) -> Result<(bool, PoolSnapshot), StoreError> {
        let p = if must_exist {
            self.existing(pool).ok_or_else(|| store_error(pool, PoolError::Missing))?
        } else {
            self.existing_or_new(pool)
        };
        // The write and the read under one lock: nothing comes between them.
        let mut p = lock(&p);
        let (now, retention) = (now_ms(), self.retention_ms);
        let applied = if must_exist {
            p.refill_existing(grant_id, units, epoch, now, retention)
        } else {
            p.refill(grant_id, units, epoch, new_generation(), now, retention)
        };
        let applied = applied.map_err(|e| store_error(pool, e))?;
        Ok((applied, p.snapshot(now)))
    }

    async fn take_for_return(
        &self,
        pool: &PoolKey,
        take_id: &str,
        max_units: u64,
        epoch: u64,
    ) -> Result<u64, StoreError> {
        let p = self.existing_or_new(pool);
        let result = lock(&p).take_for_return(take_id, max_units, epoch, now_ms(), self.retention_ms);
        result.map_err(|e| store_error(pool, e))
    }

    async fn untake(&self, pool: &PoolKey, take_id: &str, epoch: u64) -> Result<u64, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(0) };
        lock(&p).untake(take_id, epoch).map_err(|e| store_error(pool, e))
    }

    async fn raise_fence(&self, pool: &PoolKey, epoch: u64) -> Result<u64, StoreError> {
        let p = self.existing_or_new(pool);
        Ok(lock(&p).raise_fence(epoch))
    }

    async fn raise_floor(&self, pool: &PoolKey, floor: u64) -> Result<(), StoreError> {
        // A pool here changes only through this store, so it can be behind only as loaded
        // from a saved file: checked once, now. A missing one's sequence continues above.
        let p = self.existing_or_new(pool);
        let mut p = lock(&p);
        let existed = p.exists();
        if p.drop_if_behind(floor) && existed {
            tracing::error!(pool = ?pool, floor, "pool below the floor the center remembers: it went back in time; lost");
        }
        Ok(())
    }

    fn floor(&self, pool: &PoolKey) -> u64 {
        self.existing(pool).map_or(0, |p| lock(&p).write_seq())
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
        Ok(lock(&p).reservation_state(reservation_id))
    }

    async fn idempotency_keys(&self, pool: &PoolKey) -> Result<Vec<String>, StoreError> {
        let Some(p) = self.existing(pool) else { return Ok(Vec::new()) };
        Ok(lock(&p).idempotency_keys().map(str::to_owned).collect())
    }

    async fn basket(&self, channel: &str, basket_id: &str) -> Result<Option<StoredBasket>, StoreError> {
        let now = now_ms();
        let baskets = self.lock_baskets();
        let found = baskets.get(&(channel.to_owned(), basket_id.to_owned())).filter(|b| kept(b, now));
        Ok(found.map(|b| stored(b, now)))
    }

    async fn put_basket(
        &self,
        channel: &str,
        basket_id: &str,
        expected_version: u64,
        intent: &Intent,
    ) -> Result<BasketWrite, StoreError> {
        let now = now_ms();
        let mut baskets = self.lock_baskets();
        let id = (channel.to_owned(), basket_id.to_owned());
        let current = baskets.get(&id).filter(|b| kept(b, now));
        if current.map_or(0, |b| b.version) != expected_version {
            return Ok(BasketWrite::Conflict(current.map(|b| stored(b, now))));
        }
        let version = expected_version + 1;
        let saved = SavedBasket {
            channel: channel.to_owned(),
            basket_id: basket_id.to_owned(),
            intent: intent.clone(),
            version,
            written_at_ms: now,
        };
        baskets.insert(id, saved);
        Ok(BasketWrite::Written { version })
    }

    async fn open_baskets(&self, channel: &str, max: u64) -> Result<Vec<String>, StoreError> {
        let mut baskets = self.lock_baskets();
        forget_old_baskets(&mut baskets, now_ms());
        let mut open: Vec<&SavedBasket> =
            baskets.values().filter(|b| b.channel == channel && b.intent.is_open()).collect();
        open.sort_by_key(|b| (b.written_at_ms, b.basket_id.clone()));
        let n = usize::try_from(max).unwrap_or(usize::MAX);
        Ok(open.into_iter().take(n).map(|b| b.basket_id.clone()).collect())
    }

    async fn record_move(&self, pool: &PoolKey, intent: &super::MoveIntent) -> Result<(), StoreError> {
        let mut list = self.moves.entry(first_segment(pool)).or_default();
        list.retain(|m| m.id != intent.id);
        list.push(intent.clone());
        Ok(())
    }

    async fn pending_moves(&self, pool: &PoolKey) -> Result<Vec<super::MoveIntent>, StoreError> {
        Ok(self.moves.get(&first_segment(pool)).map(|l| l.clone()).unwrap_or_default())
    }

    async fn clear_move(&self, pool: &PoolKey, move_id: &str) -> Result<(), StoreError> {
        if let Some(mut list) = self.moves.get_mut(&first_segment(pool)) {
            list.retain(|m| m.id != move_id);
        }
        Ok(())
    }

    async fn channel_op(&self, channel: &str, op: ChannelOp<'_>) -> Result<ChannelReply, StoreError> {
        let state = Arc::clone(self.channels.entry(channel.to_owned()).or_default().value());
        let mut c = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(c.apply(op, now_ms()))
    }
}

fn stored(b: &SavedBasket, now_ms: i64) -> StoredBasket {
    StoredBasket { intent: b.intent.clone(), version: b.version, written_at_ms: b.written_at_ms, now_ms }
}

/// Intents are kept [`BASKET_RETENTION`] after their last write, as the Lua twin's TTL.
fn kept(b: &SavedBasket, now_ms: i64) -> bool {
    now_ms.saturating_sub(b.written_at_ms) < duration_ms(BASKET_RETENTION)
}

/// Drops the intents past their retention: the sweeper's listing does this (every pass),
/// single reads and writes only ignore them.
fn forget_old_baskets(baskets: &mut HashMap<(String, String), SavedBasket>, now_ms: i64) {
    baskets.retain(|_, b| kept(b, now_ms));
}

/// The model's refusal as the store's error, the same as the Lua twin's.
fn store_error(pool: &PoolKey, e: PoolError) -> StoreError {
    match e {
        PoolError::Fenced { .. } => StoreError::Fenced(pool.hash_tag()),
        PoolError::Missing => StoreError::PoolMissing(pool.hash_tag()),
        PoolError::DuplicateReservationId(id) => duplicate_reservation_id(&id),
        PoolError::GenerationChanged { expected, actual } => {
            StoreError::GenerationChanged { pool: pool.hash_tag(), expected, actual }
        }
        PoolError::ZeroQuantity | PoolError::Overflow(_) => StoreError::Protocol(e.to_string()),
    }
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
        u64::try_from(self.replicas.keys().filter(|r| *r != replica).count()).unwrap_or(u64::MAX)
    }
}

pub(super) fn duplicate_reservation_id(id: &str) -> StoreError {
    StoreError::Protocol(format!("new_reservation_id {id:?} names an existing reservation"))
}

#[cfg(test)]
mod keep_tests {
    use super::*;

    #[tokio::test]
    async fn kept_pools_are_read_once_and_only_for_their_center() {
        let dir = std::env::temp_dir().join(format!("inventory-keep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("app.pools.json");
        let store = MemoryPoolStore::new();
        let pool = PoolKey::new("app", "skin");
        store.refill(&pool, "g1", 5, 1).await.unwrap();
        let args = AcquireArgs {
            user_id: "u".into(),
            quantity: 1,
            idempotency_key: "k".into(),
            new_reservation_id: "r".into(),
            per_user_limit: 5,
            reservation_ttl_ms: 60_000,
            expect_generation: None,
            allow_partial: false,
        };
        store.acquire(&pool, &args).await.unwrap();
        let before = store.snapshot(&pool).await.unwrap();
        let events = store.events(&pool, 0, 10).await.unwrap();
        assert_eq!(events.events.len(), 1);
        assert_eq!(store.save(&path, "http://a:1").unwrap(), 1);

        let other = MemoryPoolStore::load(&path, "http://b:1").expect_err("pools of another center");
        assert!(other.to_string().contains("http://a:1"), "{other}");
        assert!(path.exists(), "a refused file is left for the operator");

        let (again, items) = MemoryPoolStore::load(&path, "http://a:1").unwrap();
        assert_eq!(items, vec!["skin".to_owned()]);
        let after = again.snapshot(&pool).await.unwrap();
        assert_eq!((after.available, after.generation), (before.available, before.generation));
        assert_eq!(again.events(&pool, 0, 10).await.unwrap(), events, "the outbox is kept with the pool");
        assert!(!path.exists(), "read once");
        let (empty, items) = MemoryPoolStore::load(&path, "http://a:1").unwrap();
        assert!(items.is_empty() && empty.snapshot(&pool).await.unwrap().generation == 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
