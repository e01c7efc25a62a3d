//! The Redis pool store: every operation is exactly one call of a Lua script from `lua/`
//! (EVALSHA, reloaded on NOSCRIPT), so each is atomic on the Redis server and the pool's
//! only clock is Redis `TIME`.
//!
//! Keys of one pool: `<prefix>{channel:item}:<name>` for the names `pool`, `res`, `due`,
//! `held`, `idem`, `gc`, `grants`, `takes`, `fence`, `outbox` (a stream of the pool's
//! events, written by the same script call as the change, see `lua/outbox.lua`); of one channel (replica coordination):
//! `<prefix>{channel}:<name>` for `leader`, `lease`, `wants`; of one item's segments (their
//! move intents): `<prefix>{channel:item}:moves`. The scripts' header comments
//! say what each holds. A pool's eight structures (all but `pool` and `fence`) each carry
//! a marker from the pool's creation on (`lua/intact.lua`), so one lost on its own makes
//! the pool read as lost instead of being re-created empty. All keys of a script carry one
//! hash tag, so each call lives on one Redis Cluster slot, and every key a script touches
//! is passed in KEYS. Request data goes in ARGV only.
//!
//! **Architecture invariant:** Rust never reads or writes pool keys directly; it builds
//! key names, passes arguments and parses answers. The rules live in the scripts, whose
//! twin is [`super::memory`].
//!
//! **Group commit on Acquire.** Acquires of one pool that arrive while a script call for
//! that pool is in flight wait, and go to Redis together as one call of
//! `acquire_batch.lua`, which answers each as `acquire.lua` would answer them one after
//! the other in arrival order. A caller that finds no call of its pool in flight goes
//! straight through with `acquire.lua`, so a quiet pool pays no added latency. A batch
//! only ever holds one pool's keys, so it stays on one Redis Cluster slot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, FromRedisValue, Script, ScriptInvocation, ServerErrorKind, Value};
use tokio::sync::oneshot;

mod argv;
mod baskets;
mod batch;
mod durable;
mod errors;
mod orders;
pub mod persistence;
pub mod policy;
mod reply;
mod scripts;
mod snapshots;
mod stock;

use argv::{Argv, invocation};
pub use batch::BatchStats;
use batch::{BatchConfig, BatchCounters, Handoff, PoolEntry, Waiter, unwrap_seq};
use durable::{ClusterNodes, Durability, DurablePool, DurableWrites, write};
pub use errors::OUT_OF_MEMORY;
use errors::map_err;
use reply::{acquire_result, array, int, state, string, transition, uint};
use scripts::{Keys, Scripts};

use super::health::StoreHealth;
use super::memory::{DEFAULT_RECORD_RETENTION, GC_BATCH};
use super::{
    AcquireArgs, AcquireResult, ChannelOp, ChannelReply, DEFAULT_OUTBOX_MAX, EventPage, ExtendResult, Looked,
    MoveIntent, OutboxStats, PoolKey, PoolSnapshot, PoolStamp, PoolStore, Reservation, ReservationRef,
    ReservationState, StoreError, Transition, channel_tag,
};
use super::{BASKET_RETENTION, BasketWrite, Intent, StoredBasket};
use policy::RedisNodes;

/// How many requests one `acquire_batch.lua` call carries at most: bounds how long one
/// script call holds the (single-threaded) Redis server.
pub const DEFAULT_ACQUIRE_BATCH_MAX: usize = 64;
/// The most a setting may ask for: the script writes a batch's due ids, holdings and
/// idempotency keys with one command each, whose arguments Lua's `unpack` must hold.
pub const ACQUIRE_BATCH_LIMIT: usize = 1_000;

/// How many multiplexed connections a store keeps to one Redis server by default.
pub const DEFAULT_CONNECTIONS: usize = 4;

/// One Redis server (through a connection manager that multiplexes concurrent calls over
/// one connection and reconnects after restarts) or a Redis Cluster (the cluster client
/// routes each script call by its first key, follows MOVED/ASK and failovers, and sends
/// `SCRIPT LOAD` to every node when a node answers NOSCRIPT).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// What is shared with the tasks that send batches.
struct Shared {
    /// Connections to one server (used in turn) or one cluster connection.
    conns: Vec<Conn>,
    next: AtomicUsize,
    scripts: Scripts,
    stats: BatchCounters,
    /// Where writes that wait for replicas go: one server's connections of their own, or
    /// each cluster master's.
    durable: DurableWrites,
}

impl Shared {
    fn conn(&self) -> Conn {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].clone()
    }
}

/// The Redis [`PoolStore`]. Cheap to share behind an `Arc`.
pub struct RedisPoolStore {
    shared: Arc<Shared>,
    key_prefix: String,
    retention_ms: u64,
    outbox_max: u64,
    durability: Option<Durability>,
    batch_max: usize,
    /// Every pool this store was asked about. Grows with the channel's items (a few hundred
    /// bytes each), like the agent's item registry.
    pools: Mutex<HashMap<PoolKey, Arc<PoolEntry>>>,
    /// The one server's URL without credentials (None: a cluster), for the policy check.
    node: Option<String>,
    /// Told of every write the server refused (its memory limit, ...).
    health: Arc<StoreHealth>,
}

impl std::fmt::Debug for RedisPoolStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPoolStore").field("key_prefix", &self.key_prefix).finish_non_exhaustive()
    }
}

impl RedisPoolStore {
    /// Connects to `redis_url`; every key starts with `key_prefix` (which must not contain
    /// `{` or `}`, so the pool's hash tag stays the first braces of each key).
    pub async fn new(redis_url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        Self::with_connections(redis_url, key_prefix, DEFAULT_CONNECTIONS).await
    }

    /// Like [`RedisPoolStore::new`] with `connections` multiplexed connections (at least
    /// one), used in turn: one connection is served by one task on each side, so a few
    /// spread the client's and the server's I/O work.
    pub async fn with_connections(redis_url: &str, key_prefix: &str, connections: usize) -> Result<Self, StoreError> {
        check_prefix(key_prefix)?;
        let client = redis::Client::open(redis_url)
            .map_err(|e| StoreError::Unavailable(format!("bad redis url {redis_url:?}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_max_delay(Duration::from_secs(2));
        let mut conns = Vec::new();
        for _ in 0..connections.max(1) {
            let conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await.map_err(map_err)?;
            conns.push(Conn::Single(conn));
        }
        let mut store = Self::with_conns(conns, DurableWrites::Single(DurablePool::new(client)), key_prefix);
        store.node = Some(inventory_net::without_credentials(redis_url));
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of its `seed_nodes` (`redis://host:port`);
    /// the client learns the rest of the cluster, and again after a failover.
    pub async fn new_cluster(seed_nodes: &[String], key_prefix: &str) -> Result<Self, StoreError> {
        check_prefix(key_prefix)?;
        if seed_nodes.is_empty() {
            return Err(StoreError::Protocol("a Redis Cluster needs at least one seed node".to_owned()));
        }
        let client = ClusterClientBuilder::new(seed_nodes.to_vec())
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .retries(6)
            .max_retry_wait(500)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("bad redis cluster seed nodes {seed_nodes:?}: {e}")))?;
        let conn = client.get_async_connection().await.map_err(map_err)?;
        let durable = DurableWrites::Cluster(ClusterNodes::new(seed_nodes)?);
        Ok(Self::with_conns(vec![Conn::Cluster(conn)], durable, key_prefix))
    }

    fn with_conns(conns: Vec<Conn>, durable: DurableWrites, key_prefix: &str) -> Self {
        Self {
            shared: Arc::new(Shared {
                conns,
                next: AtomicUsize::new(0),
                scripts: Scripts::load(),
                stats: BatchCounters::default(),
                durable,
            }),
            key_prefix: key_prefix.to_owned(),
            retention_ms: duration_ms(DEFAULT_RECORD_RETENTION),
            outbox_max: DEFAULT_OUTBOX_MAX,
            durability: None,
            batch_max: DEFAULT_ACQUIRE_BATCH_MAX,
            pools: Mutex::new(HashMap::new()),
            node: None,
            health: Arc::default(),
        }
    }

    /// Reports every write the server refuses to `health` (the agent's).
    pub fn with_health(mut self, health: Arc<StoreHealth>) -> Self {
        self.health = health;
        self
    }

    /// The store's nodes, for the policy check ([`policy::PolicyWatch`]).
    pub fn nodes(&self) -> RedisNodes {
        match (self.shared.conn(), &self.node) {
            (Conn::Single(conn), Some(node)) => RedisNodes::Single { node: node.clone(), conn },
            (Conn::Single(conn), None) => RedisNodes::Single { node: "redis".to_owned(), conn },
            (Conn::Cluster(conn), _) => RedisNodes::Cluster(conn),
        }
    }

    /// A refused write is told to the health as it passes.
    fn noted<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Refused(why)) = &r {
            self.health.write_refused(why);
        }
        r
    }

    /// At most `max` Acquires per `acquire_batch.lua` call (default
    /// [`DEFAULT_ACQUIRE_BATCH_MAX`], at most [`ACQUIRE_BATCH_LIMIT`]); 1 turns group commit
    /// off (every Acquire is one `acquire.lua` call, however many are in flight).
    pub fn with_acquire_batch_max(mut self, max: usize) -> Self {
        self.batch_max = max.clamp(1, ACQUIRE_BATCH_LIMIT);
        self
    }

    /// Batches sent so far.
    pub fn batch_stats(&self) -> BatchStats {
        let s = &self.shared.stats;
        BatchStats {
            calls: s.calls.load(Ordering::Relaxed),
            requests: s.requests.load(Ordering::Relaxed),
            largest: s.largest.load(Ordering::Relaxed),
        }
    }

    /// Answers a write only once `replicas` replicas of the pool's server acknowledged it
    /// (Redis `WAIT`, up to `timeout`); a write they did not acknowledge in time answers
    /// [`StoreError::Unavailable`] (retry with the same ids: every write is idempotent).
    /// Without this, a failover may lose the last writes a master acknowledged.
    pub fn with_replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.durability = (replicas > 0).then(|| Durability { replicas, timeout_ms: duration_ms(timeout).max(1) });
        self
    }

    /// How long finished reservations, grant ids and take ids are remembered (default
    /// [`DEFAULT_RECORD_RETENTION`]). An idempotency key is forgotten with its reservation.
    pub fn with_record_retention(mut self, retention: Duration) -> Self {
        self.retention_ms = duration_ms(retention);
        self
    }

    /// Keep at most `max` events per pool (default [`DEFAULT_OUTBOX_MAX`]); past it the
    /// oldest are dropped and counted.
    pub fn with_outbox_max(mut self, max: u64) -> Self {
        self.outbox_max = max.max(1);
        self
    }

    /// The pool's entry: its key names and its lane, made on first use.
    fn entry(&self, pool: &PoolKey) -> Arc<PoolEntry> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = pools.get(pool) {
            return Arc::clone(e);
        }
        let entry = Arc::new(PoolEntry::new(pool.clone(), self.make_keys(pool)));
        pools.insert(pool.clone(), Arc::clone(&entry));
        entry
    }

    /// The move intents of a pool's item: under segment 0's hash tag.
    fn moves_key(&self, pool: &PoolKey) -> String {
        let first = PoolKey::new(pool.channel.clone(), pool.item_id.clone());
        format!("{}{}:moves", self.key_prefix, first.hash_tag())
    }

    fn make_keys(&self, pool: &PoolKey) -> Keys {
        let base = format!("{}{}", self.key_prefix, pool.hash_tag());
        let key = |name: &str| format!("{base}:{name}");
        Keys {
            pool: key("pool"),
            res: key("res"),
            due: key("due"),
            held: key("held"),
            idem: key("idem"),
            gc: key("gc"),
            grants: key("grants"),
            takes: key("takes"),
            fence: key("fence"),
            outbox: key("outbox"),
        }
    }

    /// Runs a script that only reads.
    async fn read<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        self.noted(read(self.shared.conn(), call).await)
    }

    async fn write<T: FromRedisValue>(&self, routing_key: &str, call: &ScriptInvocation<'_>) -> Result<T, StoreError> {
        self.noted(write(&self.shared, self.durability, routing_key, call).await)
    }

    /// The store's part of [`PoolStore::acquire`]: straight through when no call of the
    /// pool is in flight, else wait to go with the next batch.
    async fn acquire_grouped(&self, pool: &PoolKey, args: &AcquireArgs) -> Result<AcquireResult, StoreError> {
        let entry = self.entry(pool);
        let waiting = {
            let mut lane = entry.lane.lock().unwrap_or_else(PoisonError::into_inner);
            if lane.busy && self.batch_max > 1 {
                let (answer, waiting) = oneshot::channel();
                lane.waiting.push(Waiter { args: args.clone(), answer });
                Some(waiting)
            } else {
                lane.busy = true;
                None
            }
        };
        if let Some(waiting) = waiting {
            // The sender is dropped unanswered only if the batch's task died (the runtime
            // is shutting down): whether the batch reached Redis is then unknown.
            return self.noted(waiting.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable("the batch carrying this acquire was abandoned".to_owned()))
            }));
        }
        // Whatever ends this call (an answer, an error, or the caller dropping it), the
        // lane passes on to those who queued meanwhile.
        let _handoff = Handoff { entry: Arc::clone(&entry), shared: Arc::clone(&self.shared), batch: self.batch() };
        let k = &entry.keys;
        let keys = k.acquire_keys();
        let script = &self.shared.scripts.acquire;
        let mut call = invocation(script, &keys);
        acquire_argv(&mut call, &entry, args, self.outbox_max);
        let reply: Value = self.write(&k.pool, &call).await?;
        acquire_result(entry.acknowledged(reply)?, pool, &args.new_reservation_id)
    }

    /// One call of a script that does nothing (`return 1`, the pool's `pool` key as its
    /// only key, so a cluster routes it as the pool's scripts) over the store's
    /// connections: the floor under what any script call of the pool costs Redis, which
    /// the benchmark measures beside Acquire.
    pub async fn bare_call(&self, pool: &PoolKey) -> Result<(), StoreError> {
        let entry = self.entry(pool);
        let _: Value = self.read(&self.shared.scripts.bare.key(&entry.keys.pool)).await?;
        Ok(())
    }

    fn batch(&self) -> BatchConfig {
        BatchConfig { durability: self.durability, max: self.batch_max, outbox_max: self.outbox_max }
    }
}

/// acquire.lua's ARGV for one Acquire, then the floor.
fn acquire_argv(call: &mut impl Argv, entry: &PoolEntry, args: &AcquireArgs, outbox_max: u64) {
    call.push(&args.user_id).push(args.quantity).push(&args.idempotency_key).push(&args.new_reservation_id);
    // 0 expects nothing: no pool has generation 0 and answered a reservation.
    call.push(args.per_user_limit).push(args.reservation_ttl_ms).push(args.expect_generation.unwrap_or(0));
    call.push(outbox_max).push(u8::from(args.allow_partial));
    entry.floor_arg(call);
}

/// Runs a script that only reads.
async fn read<T: FromRedisValue>(conn: Conn, call: &ScriptInvocation<'_>) -> Result<T, StoreError> {
    match conn {
        Conn::Single(mut c) => call.invoke_async(&mut c).await,
        Conn::Cluster(mut c) => call.invoke_async(&mut c).await,
    }
    .map_err(map_err)
}

fn check_prefix(key_prefix: &str) -> Result<(), StoreError> {
    if key_prefix.contains(['{', '}']) {
        return Err(StoreError::Protocol(format!("key prefix {key_prefix:?} must not contain braces")));
    }
    Ok(())
}

impl RedisPoolStore {
    /// Confirm and cancel take the same keys and arguments; only the script differs.
    async fn transition_script(
        &self,
        script: &Script,
        what: &str,
        pool: &PoolKey,
        reservation_id: &str,
    ) -> Result<Transition, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = script.key(&k.pool);
        call.key(&k.res).key(&k.due).key(&k.held).key(&k.gc).key(&k.outbox);
        k.structures(&mut call);
        call.arg(reservation_id).arg(self.retention_ms).arg(self.outbox_max);
        entry.floor_arg(&mut call);
        let reply: Value = self.write(&k.pool, &call).await?;
        transition(what, pool, entry.acknowledged(reply)?)
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl PoolStore for RedisPoolStore {
    async fn acquire(&self, pool: &PoolKey, args: &AcquireArgs) -> Result<AcquireResult, StoreError> {
        if args.quantity == 0 {
            return Err(StoreError::Protocol("acquire quantity must be positive".to_owned()));
        }
        let answer = self.acquire_grouped(pool, args).await;
        if matches!(answer, Ok(AcquireResult::Reserved { replayed: false, .. })) {
            self.health.write_taken();
        }
        answer
    }

    /// The id's prefix, `<segment tag>k<8 hex digits of randomness>`: acquire completes it
    /// with a hash of the idempotency key, which addresses the record (`lua/ids.lua`), so
    /// the pool keeps no index from key to id.
    fn new_reservation_id(&self, segment: u32) -> String {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        inventory_core::segments::tag_reservation_id(segment, &format!("k{}", &nonce[..8]))
    }

    async fn confirm(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        self.transition_script(&self.shared.scripts.confirm, "confirm", pool, reservation_id).await
    }

    async fn cancel(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        self.transition_script(&self.shared.scripts.cancel, "cancel", pool, reservation_id).await
    }

    async fn refund(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        self.refund_script(pool, reservation_id).await
    }

    async fn extend(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
        extend_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExtendResult, StoreError> {
        self.extend_script(pool, reservation_id, extend_ms, ttl_ms).await
    }

    async fn reservation(
        &self,
        pool: &PoolKey,
        by: &ReservationRef,
    ) -> Result<Option<(String, Reservation)>, StoreError> {
        self.reservation_script(pool, by).await
    }

    async fn events(&self, pool: &PoolKey, from_sequence: u64, max: u64) -> Result<EventPage, StoreError> {
        Ok(self.events_script(pool, from_sequence, max).await?.0)
    }

    async fn trim_events(&self, pool: &PoolKey, generation: u64, through_sequence: u64) -> Result<u64, StoreError> {
        self.trim_events_script(pool, generation, through_sequence).await
    }

    async fn outbox_stats(&self, pool: &PoolKey) -> Result<OutboxStats, StoreError> {
        Ok(self.events_script(pool, 0, 0).await?.1)
    }

    async fn expire_due(&self, pool: &PoolKey, max: u64) -> Result<u64, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.expire.key(&k.pool);
        call.key(&k.res).key(&k.due).key(&k.held).key(&k.idem).key(&k.gc).key(&k.grants).key(&k.takes).key(&k.outbox);
        call.arg(max).arg(self.retention_ms).arg(GC_BATCH).arg(self.outbox_max);
        entry.floor_arg(&mut call);
        // An expiry lost in a failover is found due again (with its event, as the outbox
        // is lost with it): no need to wait for replicas, and, not waited for, it does not
        // raise the floor (a failover losing only it is no loss).
        let (_, reply) = unwrap_seq(self.read(&call).await?)?;
        uint("expire_due", &reply)
    }

    async fn look(&self, pool: &PoolKey, max: u64) -> Result<Looked, StoreError> {
        self.look_call(pool, max).await
    }

    async fn refill(&self, pool: &PoolKey, grant_id: &str, units: u64, epoch: u64) -> Result<bool, StoreError> {
        self.refill_script(pool, grant_id, units, false, epoch).await.map(|(applied, _)| applied)
    }

    async fn refill_existing(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        self.refill_script(pool, grant_id, units, true, epoch).await.map(|(applied, _)| applied)
    }

    async fn refill_read(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        must_exist: bool,
        epoch: u64,
    ) -> Result<(bool, PoolSnapshot), StoreError> {
        self.refill_script(pool, grant_id, units, must_exist, epoch).await
    }

    async fn take_for_return(
        &self,
        pool: &PoolKey,
        take_id: &str,
        max_units: u64,
        epoch: u64,
    ) -> Result<u64, StoreError> {
        self.take_script(pool, take_id, max_units, epoch).await
    }

    async fn untake(&self, pool: &PoolKey, take_id: &str, epoch: u64) -> Result<u64, StoreError> {
        self.untake_script(pool, take_id, epoch).await
    }

    async fn raise_fence(&self, pool: &PoolKey, epoch: u64) -> Result<u64, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.fence.key(&k.fence);
        call.arg(epoch);
        let reply: Value = self.write(&k.pool, &call).await?;
        uint("raise_fence", &reply)
    }

    async fn raise_floor(&self, pool: &PoolKey, floor: u64) -> Result<(), StoreError> {
        // Every later script of the pool carries it (`lua/intact.lua`).
        self.entry(pool).floor.fetch_max(floor, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    fn floor(&self, pool: &PoolKey) -> u64 {
        self.entry(pool).floor.load(std::sync::atomic::Ordering::Acquire)
    }

    async fn snapshot(&self, pool: &PoolKey) -> Result<PoolSnapshot, StoreError> {
        let mut snaps = self.snapshot_call(std::slice::from_ref(pool)).await?;
        snaps.pop().ok_or_else(|| StoreError::Protocol("snapshot: no pool answered".to_owned()))
    }

    async fn snapshots(&self, pools: &[PoolKey]) -> Vec<Result<PoolSnapshot, StoreError>> {
        self.snapshot_pools(pools).await
    }

    async fn stamps(&self, pools: &[PoolKey]) -> Vec<Result<PoolStamp, StoreError>> {
        self.stamp_pools(pools).await
    }

    async fn reservation_state(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
    ) -> Result<Option<ReservationState>, StoreError> {
        const WHAT: &str = "reservation_state";
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.reservation_state.key(&k.res);
        call.key(&k.pool);
        k.structures(&mut call);
        call.arg(reservation_id);
        entry.floor_arg(&mut call);
        match unwrap_seq(self.read(&call).await?)?.1 {
            Value::Nil => Ok(None),
            other if string(WHAT, &other)? == "lost" => Err(StoreError::PoolMissing(pool.hash_tag())),
            other => Ok(Some(state(WHAT, &string(WHAT, &other)?)?)),
        }
    }

    async fn idempotency_keys(&self, pool: &PoolKey) -> Result<Vec<String>, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        self.read(&self.shared.scripts.idempotency_keys.key(&k.res)).await
    }

    async fn basket(&self, channel: &str, basket_id: &str) -> Result<Option<StoredBasket>, StoreError> {
        self.get_basket(channel, basket_id).await
    }

    async fn put_basket(
        &self,
        channel: &str,
        basket_id: &str,
        expected_version: u64,
        intent: &Intent,
    ) -> Result<BasketWrite, StoreError> {
        self.write_basket(channel, basket_id, expected_version, intent).await
    }

    async fn open_baskets(&self, channel: &str, max: u64) -> Result<Vec<String>, StoreError> {
        self.list_open_baskets(channel, max).await
    }

    async fn record_move(&self, pool: &PoolKey, intent: &MoveIntent) -> Result<(), StoreError> {
        let key = self.moves_key(pool);
        let mut call = self.shared.scripts.moves.key(&key);
        call.arg("record").arg(&intent.id).arg(intent.encode());
        // Waits for replicas like a pool write: the intent must outlive the take.
        let _: Value = self.write(&key, &call).await?;
        Ok(())
    }

    async fn pending_moves(&self, pool: &PoolKey) -> Result<Vec<MoveIntent>, StoreError> {
        const WHAT: &str = "moves";
        let mut call = self.shared.scripts.moves.key(self.moves_key(pool));
        call.arg("list");
        let flat = array(WHAT, self.read(&call).await?)?;
        let mut out = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            let [id, text] = pair else { return Err(StoreError::Protocol("moves: odd reply".into())) };
            let (id, text) = (string(WHAT, id)?, string(WHAT, text)?);
            out.push(
                MoveIntent::decode(&id, &text)
                    .ok_or_else(|| StoreError::Protocol(format!("moves: bad intent {text:?}")))?,
            );
        }
        Ok(out)
    }

    async fn clear_move(&self, pool: &PoolKey, move_id: &str) -> Result<(), StoreError> {
        let key = self.moves_key(pool);
        let mut call = self.shared.scripts.moves.key(&key);
        call.arg("clear").arg(move_id);
        let _: Value = self.write(&key, &call).await?;
        Ok(())
    }

    async fn channel_op(&self, channel: &str, op: ChannelOp<'_>) -> Result<ChannelReply, StoreError> {
        const WHAT: &str = "channel";
        let base = format!("{}{}", self.key_prefix, channel_tag(channel));
        let leader = format!("{base}:leader");
        let mut call = self.shared.scripts.channel.key(&leader);
        call.key(format!("{base}:lease")).key(format!("{base}:wants")).key(format!("{base}:replicas"));
        match op {
            ChannelOp::Lead { replica, ttl_ms } => call.arg("lead").arg(replica).arg(ttl_ms.max(1)),
            ChannelOp::Resign { replica } => call.arg("resign").arg(replica),
            ChannelOp::Publish { replica, ttl_ms } => call.arg("publish").arg(replica).arg(ttl_ms.max(1)),
            ChannelOp::LeaseLeft => call.arg("lease_left"),
            ChannelOp::Want { item_id } => call.arg("want").arg(item_id),
            ChannelOp::TakeWants { max } => call.arg("take_wants").arg(max.max(1)),
            ChannelOp::Leader => call.arg("leader"),
            ChannelOp::Present { replica, ttl_ms } => call.arg("present").arg(replica).arg(ttl_ms.max(1)),
            ChannelOp::Absent { replica } => call.arg("absent").arg(replica),
        };
        // Coordination state is soft (a lost leader key or want is found again), so these
        // writes do not wait for replicas.
        let reply: Value = self.read(&call).await?;
        Ok(match op {
            ChannelOp::LeaseLeft => ChannelReply::Millis(uint(WHAT, &reply)?),
            ChannelOp::Present { .. } | ChannelOp::Absent { .. } => ChannelReply::Count(uint(WHAT, &reply)?),
            ChannelOp::TakeWants { .. } => {
                ChannelReply::Items(array(WHAT, reply)?.iter().map(|v| string(WHAT, v)).collect::<Result<Vec<_>, _>>()?)
            }
            ChannelOp::Leader => match reply {
                Value::Nil => ChannelReply::Leader(None),
                other => ChannelReply::Leader(Some(string(WHAT, &other)?)),
            },
            _ => ChannelReply::Done(int(WHAT, &reply)? == 1),
        })
    }
}
