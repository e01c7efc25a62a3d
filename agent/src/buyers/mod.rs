//! The buyer registry client (one Redis or a Redis Cluster): the Redis twin of `inventory_core::buyers::Buyer`
//! (`lua/buyer.lua`), one hash per (item, user) under `<prefix>{<item>:<user>}:claims`, so
//! a Redis Cluster spreads buyers over its slots. Every call is one script call on the
//! buyer's slot: the extra round trip a global-limit Acquire pays before its pool call.
//!
//! Used by Acquire, Confirm, Cancel and Refund of items with a global limit
//! ([`limit::GlobalLimits`]) when the agent runs with `--buyer-registry-url`.

use inventory_core::buyers::{ClaimResult, Found, Settled};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, Script, ScriptInvocation, Value};

pub mod limit;
mod sweeper;
pub use sweeper::{SweepStats, sweep};

/// The registry cannot be asked (connection, timeout) or answered out of contract.
#[derive(Debug, thiserror::Error)]
#[error("buyer registry: {0}")]
pub struct RegistryError(String);

fn err(e: impl std::fmt::Display) -> RegistryError {
    RegistryError(e.to_string())
}

/// The longest a registry call may take: an Acquire waits for it, so a registry that is
/// down (its client reconnecting) answers an error within this instead of hanging.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

async fn bounded<T>(call: impl Future<Output = redis::RedisResult<T>>) -> Result<T, RegistryError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r.map_err(err),
        Err(_) => Err(RegistryError(format!("no answer within {} ms", CALL_TIMEOUT.as_millis()))),
    }
}

/// One Redis (one multiplexed connection that reconnects) or a Redis Cluster (the cluster
/// client follows the slots, also after a failover). Every key names its slot with a
/// hash tag, so each call goes to one node either way.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn script<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> Result<T, RegistryError> {
        match self.clone() {
            Conn::Single(mut c) => bounded(call.invoke_async(&mut c)).await,
            Conn::Cluster(mut c) => bounded(call.invoke_async(&mut c)).await,
        }
    }

    async fn cmd<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, RegistryError> {
        match self.clone() {
            Conn::Single(mut c) => bounded(cmd.query_async(&mut c)).await,
            Conn::Cluster(mut c) => bounded(cmd.query_async(&mut c)).await,
        }
    }
}

/// A connection to the buyer registry.
#[derive(Clone)]
pub struct BuyerRegistry {
    conn: Conn,
    prefix: String,
    script: std::sync::Arc<Script>,
    /// One server's URL without credentials (empty for a cluster), for the policy check.
    node: String,
}

impl BuyerRegistry {
    /// One Redis at `url`.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, RegistryError> {
        let client = redis::Client::open(url).map_err(err)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(CALL_TIMEOUT))
            .set_max_delay(Duration::from_secs(2));
        let conn = ConnectionManager::new_with_config(client, config).await.map_err(err)?;
        let mut registry = Self::with(Conn::Single(conn), prefix);
        registry.node = inventory_net::without_credentials(url);
        Ok(registry)
    }

    /// A Redis Cluster reached through any of its `seed_nodes` (`redis://host:port`).
    pub async fn connect_cluster(seed_nodes: &[String], prefix: &str) -> Result<Self, RegistryError> {
        if seed_nodes.is_empty() {
            return Err(RegistryError("a Redis Cluster needs at least one seed node".to_owned()));
        }
        let client = ClusterClientBuilder::new(seed_nodes.to_vec())
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(CALL_TIMEOUT)
            .retries(6)
            .max_retry_wait(500)
            .build()
            .map_err(err)?;
        let conn = client.get_async_connection().await.map_err(err)?;
        Ok(Self::with(Conn::Cluster(conn), prefix))
    }

    fn with(conn: Conn, prefix: &str) -> Self {
        let script = std::sync::Arc::new(Script::new(include_str!("../../../lua/buyer.lua")));
        Self { conn, prefix: prefix.to_owned(), script, node: String::new() }
    }

    /// The registry's nodes, for the eviction-policy check (`store::redis::policy`).
    pub fn nodes(&self) -> crate::store::redis::policy::RedisNodes {
        use crate::store::redis::policy::RedisNodes;
        match &self.conn {
            Conn::Single(conn) => RedisNodes::Single { node: self.node.clone(), conn: conn.clone() },
            Conn::Cluster(conn) => RedisNodes::Cluster(conn.clone()),
        }
    }

    /// The buyer's hash: the hash tag keeps one buyer's claims on one slot.
    pub fn key(&self, item: &str, user: &str) -> String {
        format!("{}{{{item}:{user}}}:claims", self.prefix)
    }

    async fn call(&self, item: &str, user: &str, args: &[&str]) -> Result<Value, RegistryError> {
        let key = self.key(item, user);
        let mut call = self.script.key(&key);
        for a in args {
            call.arg(*a);
        }
        self.conn.script(&call).await
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        item: &str,
        user: &str,
        key: &str,
        channel: &str,
        quantity: u64,
        limit: u64,
        pending_ms: u64,
    ) -> Result<ClaimResult, RegistryError> {
        self.claim_with(item, user, key, channel, quantity, limit, pending_ms, false).await
    }

    /// As [`BuyerRegistry::claim`], but over the limit it claims what the user's
    /// allowance has left (an Acquire with `allow_partial`; `core::buyers::Buyer::claim_up_to`).
    #[allow(clippy::too_many_arguments)]
    pub async fn claim_up_to(
        &self,
        item: &str,
        user: &str,
        key: &str,
        channel: &str,
        quantity: u64,
        limit: u64,
        pending_ms: u64,
    ) -> Result<ClaimResult, RegistryError> {
        self.claim_with(item, user, key, channel, quantity, limit, pending_ms, true).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn claim_with(
        &self,
        item: &str,
        user: &str,
        key: &str,
        channel: &str,
        quantity: u64,
        limit: u64,
        pending_ms: u64,
        partial: bool,
    ) -> Result<ClaimResult, RegistryError> {
        let (q, l, p) = (quantity.to_string(), limit.to_string(), pending_ms.to_string());
        let partial = if partial { "1" } else { "0" };
        let reply = self.call(item, user, &["claim", key, channel, &q, &l, &p, partial]).await?;
        let parts = strings(reply)?;
        match parts.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["claimed", replayed] => Ok(ClaimResult::Claimed { replayed: *replayed == "1" }),
            ["partial", replayed, granted] => {
                Ok(ClaimResult::Partial { granted: granted.parse().map_err(err)?, replayed: *replayed == "1" })
            }
            ["limit", held] => Ok(ClaimResult::LimitExceeded { held: held.parse().map_err(err)? }),
            ["conflict"] => Ok(ClaimResult::KeyConflict),
            other => Err(RegistryError(format!("claim: unexpected reply {other:?}"))),
        }
    }

    pub async fn bind(
        &self,
        item: &str,
        user: &str,
        key: &str,
        reservation_id: &str,
        quantity: u64,
        expires_at_ms: i64,
    ) -> Result<bool, RegistryError> {
        let (q, e) = (quantity.to_string(), expires_at_ms.to_string());
        int(self.call(item, user, &["bind", key, reservation_id, &q, &e]).await?).map(|n| n == 1)
    }

    pub async fn confirm(
        &self,
        item: &str,
        user: &str,
        key: &str,
        reservation_id: &str,
    ) -> Result<bool, RegistryError> {
        int(self.call(item, user, &["confirm", key, reservation_id]).await?).map(|n| n == 1)
    }

    /// Frees the claim; returns the units freed (0: none, e.g. released before).
    pub async fn release(&self, item: &str, user: &str, key: &str) -> Result<u64, RegistryError> {
        int(self.call(item, user, &["release", key]).await?)
    }

    /// The keys of the buyer's claims in `channel` ("": any) due for the sweeper now (by
    /// the registry's clock).
    pub async fn due(&self, item: &str, user: &str, channel: &str) -> Result<Vec<String>, RegistryError> {
        strings(self.call(item, user, &["due", channel]).await?)
    }

    /// How many claims the buyer has in `channel`.
    pub async fn count(&self, item: &str, user: &str, channel: &str) -> Result<u64, RegistryError> {
        int(self.call(item, user, &["count", channel]).await?)
    }

    /// How many of the buyer's claims in `channel` are not confirmed: the ones a sweep
    /// may still have to settle.
    pub async fn open(&self, item: &str, user: &str, channel: &str) -> Result<u64, RegistryError> {
        int(self.call(item, user, &["open", channel]).await?)
    }

    /// The sweeper's index of one channel's buyers of an item: a zset of users scored by
    /// when to look at them next (the agent's clock). On its own slot, so written apart
    /// from the claims, best-effort: an extra entry costs one look, a missing one is why
    /// the index is written before the claim (see [`BuyerRegistry::note`]).
    fn index_key(&self, item: &str, channel: &str) -> String {
        format!("{}buyers:{{{item}:{channel}}}:index", self.prefix)
    }

    /// Puts the buyer in the channel's index, to be looked at from `at_ms` on. Called
    /// before the claim, so a crash right after the claim leaves it findable. Never
    /// later than an earlier note said (`LT`): a user's retries cannot keep their buyer
    /// from the sweeper.
    pub async fn note(&self, item: &str, channel: &str, user: &str, at_ms: i64) -> Result<(), RegistryError> {
        self.conn.cmd::<()>(redis::cmd("ZADD").arg(self.index_key(item, channel)).arg("LT").arg(at_ms).arg(user)).await
    }

    /// Looks at the buyer again from `at_ms` on (the sweeper, after looking).
    pub async fn recheck(&self, item: &str, channel: &str, user: &str, at_ms: i64) -> Result<(), RegistryError> {
        self.conn.cmd::<()>(redis::cmd("ZADD").arg(self.index_key(item, channel)).arg(at_ms).arg(user)).await
    }

    /// Up to `max` buyers of the channel's index due at `now_ms`.
    pub async fn noted(
        &self,
        item: &str,
        channel: &str,
        now_ms: i64,
        max: usize,
    ) -> Result<Vec<String>, RegistryError> {
        self.conn
            .cmd(
                redis::cmd("ZRANGEBYSCORE")
                    .arg(self.index_key(item, channel))
                    .arg("-inf")
                    .arg(now_ms)
                    .arg("LIMIT")
                    .arg(0)
                    .arg(max),
            )
            .await
    }

    /// The channel's set of items with global limits it claimed for: how a restarted
    /// agent's sweeper finds the claims of items it has not loaded again.
    fn items_key(&self, channel: &str) -> String {
        format!("{}buyers:{{{channel}}}:items", self.prefix)
    }

    pub async fn note_item(&self, channel: &str, item: &str) -> Result<(), RegistryError> {
        self.conn.cmd::<()>(redis::cmd("SADD").arg(self.items_key(channel)).arg(item)).await
    }

    pub async fn items(&self, channel: &str) -> Result<Vec<String>, RegistryError> {
        self.conn.cmd(redis::cmd("SMEMBERS").arg(self.items_key(channel))).await
    }

    /// Drops the buyer from the channel's index.
    pub async fn forget(&self, item: &str, channel: &str, user: &str) -> Result<(), RegistryError> {
        self.conn.cmd::<()>(redis::cmd("ZREM").arg(self.index_key(item, channel)).arg(user)).await
    }

    /// Settles a due claim from what the pool says of its reservation.
    pub async fn settle(
        &self,
        item: &str,
        user: &str,
        key: &str,
        found: Option<&Found>,
    ) -> Result<Settled, RegistryError> {
        let reply = match found {
            None => self.call(item, user, &["settle", key, "0"]).await?,
            Some(f) => {
                let (q, e) = (f.quantity.to_string(), f.expires_at_ms.to_string());
                self.call(item, user, &["settle", key, "1", &f.reservation_id, f.state.as_str(), &q, &e]).await?
            }
        };
        let parts = strings(reply)?;
        match parts.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["untouched"] => Ok(Settled::Untouched),
            ["held"] => Ok(Settled::Held),
            ["confirmed"] => Ok(Settled::Confirmed),
            ["waiting"] => Ok(Settled::Waiting),
            ["released", q] => Ok(Settled::Released { quantity: q.parse().map_err(err)? }),
            other => Err(RegistryError(format!("settle: unexpected reply {other:?}"))),
        }
    }
}

fn int(v: Value) -> Result<u64, RegistryError> {
    match v {
        Value::Int(n) => u64::try_from(n).map_err(err),
        other => Err(RegistryError(format!("unexpected reply {other:?}"))),
    }
}

/// An array of strings or integers, as text.
fn strings(v: Value) -> Result<Vec<String>, RegistryError> {
    let Value::Array(items) = v else { return Err(RegistryError(format!("unexpected reply {v:?}"))) };
    items
        .into_iter()
        .map(|i| match i {
            Value::BulkString(b) => String::from_utf8(b).map_err(err),
            Value::SimpleString(s) => Ok(s),
            Value::Int(n) => Ok(n.to_string()),
            other => Err(RegistryError(format!("unexpected reply item {other:?}"))),
        })
        .collect()
}
