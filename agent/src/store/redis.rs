//! The Redis pool store: every operation is exactly one call of a Lua script from `lua/`
//! (EVALSHA, reloaded on NOSCRIPT), so each is atomic on the Redis server and the pool's
//! only clock is Redis `TIME`.
//!
//! Keys of one pool: `<prefix>{channel:item}:<name>` for the names `pool`, `res`, `due`,
//! `held`, `idem`, `gc`, `grants`, `takes`; the scripts' header comments say what each
//! holds. All carry the pool's hash tag, so a pool lives on one Redis Cluster slot, and
//! every key a script touches is passed in KEYS. Request data goes in ARGV only.
//!
//! **Architecture invariant:** Rust never reads or writes pool keys directly; it builds
//! key names, passes arguments and parses answers. The rules live in the scripts, whose
//! twin is [`super::memory`].

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::memory::{DEFAULT_RECORD_RETENTION, GC_BATCH};
use super::{AcquireArgs, AcquireResult, PoolKey, PoolSnapshot, PoolStore, ReservationState, StoreError, Transition};

struct Scripts {
    acquire: Script,
    confirm: Script,
    cancel: Script,
    expire: Script,
    refill: Script,
    take_for_return: Script,
    untake: Script,
    snapshot: Script,
    reservation_state: Script,
    idempotency_keys: Script,
}

impl Scripts {
    fn load() -> Self {
        Self {
            acquire: Script::new(include_str!("../../../lua/acquire.lua")),
            confirm: Script::new(include_str!("../../../lua/confirm.lua")),
            cancel: Script::new(include_str!("../../../lua/cancel.lua")),
            expire: Script::new(include_str!("../../../lua/expire.lua")),
            refill: Script::new(include_str!("../../../lua/refill.lua")),
            take_for_return: Script::new(include_str!("../../../lua/take_for_return.lua")),
            untake: Script::new(include_str!("../../../lua/untake.lua")),
            snapshot: Script::new(include_str!("../../../lua/snapshot.lua")),
            reservation_state: Script::new(include_str!("../../../lua/reservation_state.lua")),
            idempotency_keys: Script::new(include_str!("../../../lua/idempotency_keys.lua")),
        }
    }
}

/// The key names of one pool.
struct Keys {
    pool: String,
    res: String,
    due: String,
    held: String,
    idem: String,
    gc: String,
    grants: String,
    takes: String,
}

/// The Redis [`PoolStore`]. Cheap to share behind an `Arc`; the connection manager
/// multiplexes concurrent calls over one connection and reconnects after Redis restarts.
pub struct RedisPoolStore {
    conn: ConnectionManager,
    key_prefix: String,
    retention_ms: u64,
    scripts: Scripts,
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
        if key_prefix.contains(['{', '}']) {
            return Err(StoreError::Protocol(format!("key prefix {key_prefix:?} must not contain braces")));
        }
        let client = redis::Client::open(redis_url)
            .map_err(|e| StoreError::Unavailable(format!("bad redis url {redis_url:?}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_with_config(client, config).await.map_err(map_err)?;
        Ok(Self {
            conn,
            key_prefix: key_prefix.to_owned(),
            retention_ms: duration_ms(DEFAULT_RECORD_RETENTION),
            scripts: Scripts::load(),
        })
    }

    /// How long finished reservations, grant ids and take ids are remembered (default
    /// [`DEFAULT_RECORD_RETENTION`]). An idempotency key is forgotten with its reservation.
    pub fn with_record_retention(mut self, retention: Duration) -> Self {
        self.retention_ms = duration_ms(retention);
        self
    }

    fn keys(&self, pool: &PoolKey) -> Keys {
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
        }
    }
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
        let k = self.keys(pool);
        let reply: Value = script
            .key(&k.pool)
            .key(&k.res)
            .key(&k.due)
            .key(&k.held)
            .key(&k.gc)
            .arg(reservation_id)
            .arg(self.retention_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        transition(what, reply)
    }

    async fn refill_script(
        &self,
        pool: &PoolKey,
        grant_id: &str,
        units: u64,
        must_exist: bool,
    ) -> Result<bool, StoreError> {
        let k = self.keys(pool);
        let reply: Value = self
            .scripts
            .refill
            .key(&k.pool)
            .key(&k.grants)
            .key(&k.gc)
            .arg(grant_id)
            .arg(units)
            .arg(self.retention_ms)
            .arg(if must_exist { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        match int("refill", &reply)? {
            -1 => Err(StoreError::PoolMissing(pool.hash_tag())),
            n => Ok(n == 1),
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Connection trouble (and servers that cannot serve right now) is `Unavailable`: the
/// caller may retry with the same ids. Anything else means the store answered something
/// this code does not expect.
fn map_err(e: RedisError) -> StoreError {
    let unavailable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            ) | ErrorKind::ClusterConnectionNotFound
        )
        || e.code() == Some("BUSY");
    if unavailable { StoreError::Unavailable(e.to_string()) } else { StoreError::Protocol(e.to_string()) }
}

fn unexpected(what: &str, v: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: unexpected reply {v:?}"))
}

fn array(what: &str, v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(unexpected(what, &other)),
    }
}

fn string(what: &str, v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| unexpected(what, v)),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(unexpected(what, other)),
    }
}

fn int(what: &str, v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(unexpected(what, other)),
    }
}

fn uint(what: &str, v: &Value) -> Result<u64, StoreError> {
    u64::try_from(int(what, v)?).map_err(|_| unexpected(what, v))
}

fn state(what: &str, s: &str) -> Result<ReservationState, StoreError> {
    match s {
        "reserved" => Ok(ReservationState::Reserved),
        "confirmed" => Ok(ReservationState::Confirmed),
        "cancelled" => Ok(ReservationState::Cancelled),
        "expired" => Ok(ReservationState::Expired),
        other => Err(StoreError::Protocol(format!("{what}: unknown reservation state {other:?}"))),
    }
}

/// Parses `{verdict, state}` from confirm.lua and cancel.lua.
fn transition(what: &str, v: Value) -> Result<Transition, StoreError> {
    let items = array(what, v)?;
    let verdict = items.first().map(|v| string(what, v)).transpose()?;
    let st = items.get(1).map(|v| string(what, v)).transpose()?;
    match (verdict.as_deref(), st.as_deref()) {
        (Some("done"), Some(s)) => Ok(Transition::Done(state(what, s)?)),
        (Some("refused"), Some(s)) => Ok(Transition::Refused(state(what, s)?)),
        (Some("not_found"), _) => Ok(Transition::NotFound),
        _ => Err(StoreError::Protocol(format!("{what}: unexpected reply {items:?}"))),
    }
}

fn acquire_result(v: Value, new_reservation_id: &str) -> Result<AcquireResult, StoreError> {
    const WHAT: &str = "acquire";
    let items = array(WHAT, v)?;
    let Some(tag) = items.first() else { return Err(StoreError::Protocol("acquire: empty reply".to_owned())) };
    let field = |i: usize| items.get(i).ok_or_else(|| StoreError::Protocol(format!("acquire: short reply {items:?}")));
    match string(WHAT, tag)?.as_str() {
        "reserved" => Ok(AcquireResult::Reserved {
            reservation_id: string(WHAT, field(1)?)?,
            quantity: uint(WHAT, field(2)?)?,
            expires_at_ms: int(WHAT, field(3)?)?,
            replayed: int(WHAT, field(4)?)? == 1,
        }),
        "sold_out" => Ok(AcquireResult::SoldOut { available: uint(WHAT, field(1)?)? }),
        "limit" => Ok(AcquireResult::LimitExceeded { held: uint(WHAT, field(1)?)? }),
        "conflict" => Ok(AcquireResult::KeyConflict),
        "duplicate_id" => Err(super::memory::duplicate_reservation_id(new_reservation_id)),
        _ => Err(StoreError::Protocol(format!("acquire: unexpected reply {items:?}"))),
    }
}

#[async_trait]
impl PoolStore for RedisPoolStore {
    async fn acquire(&self, pool: &PoolKey, args: &AcquireArgs) -> Result<AcquireResult, StoreError> {
        if args.quantity == 0 {
            return Err(StoreError::Protocol("acquire quantity must be positive".to_owned()));
        }
        let k = self.keys(pool);
        let reply: Value = self
            .scripts
            .acquire
            .key(&k.pool)
            .key(&k.res)
            .key(&k.due)
            .key(&k.held)
            .key(&k.idem)
            .arg(&args.user_id)
            .arg(args.quantity)
            .arg(&args.idempotency_key)
            .arg(&args.new_reservation_id)
            .arg(args.per_user_limit)
            .arg(args.reservation_ttl_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        acquire_result(reply, &args.new_reservation_id)
    }

    async fn confirm(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        self.transition_script(&self.scripts.confirm, "confirm", pool, reservation_id).await
    }

    async fn cancel(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        self.transition_script(&self.scripts.cancel, "cancel", pool, reservation_id).await
    }

    async fn expire_due(&self, pool: &PoolKey, max: u64) -> Result<u64, StoreError> {
        let k = self.keys(pool);
        let reply: Value = self
            .scripts
            .expire
            .key(&k.pool)
            .key(&k.res)
            .key(&k.due)
            .key(&k.held)
            .key(&k.idem)
            .key(&k.gc)
            .key(&k.grants)
            .key(&k.takes)
            .arg(max)
            .arg(self.retention_ms)
            .arg(GC_BATCH)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        uint("expire_due", &reply)
    }

    async fn refill(&self, pool: &PoolKey, grant_id: &str, units: u64) -> Result<bool, StoreError> {
        self.refill_script(pool, grant_id, units, false).await
    }

    async fn refill_existing(&self, pool: &PoolKey, grant_id: &str, units: u64) -> Result<bool, StoreError> {
        self.refill_script(pool, grant_id, units, true).await
    }

    async fn take_for_return(&self, pool: &PoolKey, take_id: &str, max_units: u64) -> Result<u64, StoreError> {
        let k = self.keys(pool);
        let reply: Value = self
            .scripts
            .take_for_return
            .key(&k.pool)
            .key(&k.takes)
            .key(&k.gc)
            .arg(take_id)
            .arg(max_units)
            .arg(self.retention_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        uint("take_for_return", &reply)
    }

    async fn untake(&self, pool: &PoolKey, take_id: &str) -> Result<u64, StoreError> {
        let k = self.keys(pool);
        let reply: Value = self
            .scripts
            .untake
            .key(&k.pool)
            .key(&k.takes)
            .arg(take_id)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        uint("untake", &reply)
    }

    async fn snapshot(&self, pool: &PoolKey) -> Result<PoolSnapshot, StoreError> {
        const WHAT: &str = "snapshot";
        let k = self.keys(pool);
        let reply: Value =
            self.scripts.snapshot.key(&k.pool).invoke_async(&mut self.conn.clone()).await.map_err(map_err)?;
        let items = array(WHAT, reply)?;
        let [available, reserved, sold, generation, now_ms] = items.as_slice() else {
            return Err(StoreError::Protocol(format!("snapshot: unexpected reply {items:?}")));
        };
        Ok(PoolSnapshot {
            available: uint(WHAT, available)?,
            reserved: uint(WHAT, reserved)?,
            sold: uint(WHAT, sold)?,
            generation: uint(WHAT, generation)?,
            now_ms: int(WHAT, now_ms)?,
        })
    }

    async fn reservation_state(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
    ) -> Result<Option<ReservationState>, StoreError> {
        const WHAT: &str = "reservation_state";
        let k = self.keys(pool);
        let reply: Value = self
            .scripts
            .reservation_state
            .key(&k.res)
            .arg(reservation_id)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(map_err)?;
        match reply {
            Value::Nil => Ok(None),
            other => Ok(Some(state(WHAT, &string(WHAT, &other)?)?)),
        }
    }

    async fn idempotency_keys(&self, pool: &PoolKey) -> Result<Vec<String>, StoreError> {
        let k = self.keys(pool);
        self.scripts.idempotency_keys.key(&k.idem).invoke_async(&mut self.conn.clone()).await.map_err(map_err)
    }
}
