//! The Redis nodes' `maxmemory-policy` and memory, checked at start and every few seconds.
//!
//! Pools are only safe on `noeviction`: any other policy lets Redis drop a pool's keys
//! (a reservation record, the idempotency index, the due list) when memory runs short,
//! and what is gone cannot be told from what never was. So the agent refuses to start
//! when a node of its pool store (every master of a Redis Cluster) or of its buyer
//! registry runs another policy, with one line naming the node and the policy, unless
//! `--allow-evicting-redis` says the operator takes that risk (then it warns). A policy
//! changed at run time stops sales (Acquire UNAVAILABLE, health NOT_SERVING) until it is
//! `noeviction` again ([`StoreHealth`]).
//!
//! The policy is read with `CONFIG GET maxmemory-policy`; where that is refused (managed
//! services rename or forbid CONFIG), from `INFO memory`'s `maxmemory_policy`. A node that
//! answers neither counts as unsafe: the agent cannot know, so it refuses to start unless
//! the flag is set. `INFO memory` also says whether a node is above its `maxmemory` (the
//! test Redis applies before a write: used memory less what it does not count for
//! eviction), which the health reports as a store refusing writes.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{RedisError, Value};

use crate::store::health::StoreHealth;

/// The one safe policy.
pub const SAFE_POLICY: &str = "noeviction";

/// How long one check of one store may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// The nodes of one Redis deployment the agent writes to.
#[derive(Clone)]
pub enum RedisNodes {
    /// One server, named by its URL (without credentials).
    Single { node: String, conn: ConnectionManager },
    /// Every master of a cluster, each named by its address.
    Cluster(ClusterConnection),
}

/// What one node said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReading {
    pub node: String,
    /// The policy, or why it could not be read.
    pub policy: Result<String, String>,
    pub memory: Option<Memory>,
}

/// `INFO memory`'s figures, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub used: u64,
    /// `maxmemory`; 0: no limit.
    pub max: u64,
    /// `mem_not_counted_for_evict`: replication and AOF buffers Redis leaves out.
    pub not_counted: u64,
}

impl Memory {
    /// Whether Redis refuses writes that need memory now (what it checks before a write).
    pub fn over_limit(&self) -> bool {
        self.max > 0 && self.used.saturating_sub(self.not_counted) > self.max
    }
}

impl RedisNodes {
    /// Every node's answer to `cmd` (every master of a cluster), named as readings name
    /// them; a server's error answer is kept as that node's answer. Err: no answer at all.
    pub(super) async fn ask(&self, cmd: &redis::Cmd) -> Result<Vec<(String, Value)>, String> {
        match self {
            Self::Single { node, conn } => Ok(vec![(node.clone(), answer(cmd.query_async(&mut conn.clone()).await)?)]),
            Self::Cluster(conn) => {
                let every_master = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let answers =
                    per_node(conn.clone().route_command(cmd.clone(), every_master).await.map_err(|e| e.to_string())?)?;
                let mut out: Vec<(String, Value)> =
                    answers.into_iter().map(|(node, v)| (format!("redis://{node}"), v)).collect();
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
        }
    }

    /// Every node's reading; Err when the store could not be asked at all (connection
    /// trouble: nothing learned).
    pub async fn read(&self) -> Result<Vec<NodeReading>, String> {
        tokio::time::timeout(CHECK_TIMEOUT, self.read_unbounded())
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())))
    }

    async fn read_unbounded(&self) -> Result<Vec<NodeReading>, String> {
        let config = {
            let mut c = redis::cmd("CONFIG");
            c.arg("GET").arg("maxmemory-policy");
            c
        };
        let info = {
            let mut c = redis::cmd("INFO");
            c.arg("memory");
            c
        };
        match self {
            Self::Single { node, conn } => {
                let mut conn = conn.clone();
                let config: Value = answer(config.query_async(&mut conn).await)?;
                let info: Value = answer(info.query_async(&mut conn).await)?;
                Ok(vec![reading(node.clone(), &config, &info)])
            }
            Self::Cluster(conn) => {
                let mut conn = conn.clone();
                let every_master = || RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let config = per_node(conn.route_command(config, every_master()).await.map_err(|e| e.to_string())?)?;
                let info = per_node(conn.route_command(info, every_master()).await.map_err(|e| e.to_string())?)?;
                let mut out: Vec<NodeReading> = config
                    .into_iter()
                    .map(|(node, config)| {
                        let info = info.iter().find(|(n, _)| *n == node).map_or(Value::Nil, |(_, v)| v.clone());
                        reading(format!("redis://{node}"), &config, &info)
                    })
                    .collect();
                out.sort_by(|a, b| a.node.cmp(&b.node));
                Ok(out)
            }
        }
    }
}

/// A server's error answer is an answer (kept, per node); anything else is no answer.
pub(super) fn answer(r: Result<Value, RedisError>) -> Result<Value, String> {
    match r {
        Ok(v) => Ok(v),
        Err(e) if e.code().is_some() => Ok(error_value(&e)),
        Err(e) => Err(e.to_string()),
    }
}

/// A server error kept as a value, so a refused CONFIG on one node is that node's answer.
fn error_value(e: &RedisError) -> Value {
    Value::SimpleString(format!("{ERROR_MARK}{e}"))
}

pub(super) const ERROR_MARK: &str = "\u{0}refused: ";

/// A cluster fan-out's answer: (node address, its answer) per master.
pub(super) fn per_node(v: Value) -> Result<Vec<(String, Value)>, String> {
    let Value::Map(pairs) = v else { return Err(format!("unexpected cluster answer {v:?}")) };
    pairs
        .into_iter()
        .map(|(node, answer)| {
            let node = text(&node).ok_or_else(|| format!("unexpected node name {node:?}"))?;
            let answer = match answer {
                Value::ServerError(e) => Value::SimpleString(format!("{ERROR_MARK}{e}")),
                other => other,
            };
            Ok((node, answer))
        })
        .collect()
}

pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        _ => None,
    }
}

pub(super) fn refusal(v: &Value) -> Option<String> {
    match v {
        Value::SimpleString(s) => s.strip_prefix(ERROR_MARK).map(str::to_owned),
        Value::ServerError(e) => Some(e.to_string()),
        _ => None,
    }
}

/// One node's reading from its `CONFIG GET maxmemory-policy` and `INFO memory` answers.
fn reading(node: String, config: &Value, info: &Value) -> NodeReading {
    let info_text = text(info).filter(|_| refusal(info).is_none());
    let field = |name: &str| {
        info_text.as_deref().and_then(|t| {
            t.lines().find_map(|l| l.trim_end().strip_prefix(name).and_then(|v| v.strip_prefix(':')).map(str::to_owned))
        })
    };
    let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    let from_config = config_policy(config);
    let policy = match (from_config, field("maxmemory_policy")) {
        (Ok(p), _) => Ok(p),
        (Err(_), Some(p)) => Ok(p),
        (Err(config_err), None) => Err(match refusal(info) {
            Some(info_err) => format!("CONFIG GET refused ({config_err}) and INFO refused ({info_err})"),
            None => format!("CONFIG GET refused ({config_err}) and INFO memory has no maxmemory_policy"),
        }),
    };
    let memory = match (number("used_memory"), number("maxmemory")) {
        (Some(used), Some(max)) => {
            Some(Memory { used, max, not_counted: number("mem_not_counted_for_evict").unwrap_or(0) })
        }
        _ => None,
    };
    NodeReading { node, policy, memory }
}

/// The policy in a `CONFIG GET` answer (an array or, on RESP3, a map of name and value).
fn config_policy(v: &Value) -> Result<String, String> {
    if let Some(e) = refusal(v) {
        return Err(e);
    }
    let flat: Vec<String> = match v {
        Value::Array(items) => items.iter().filter_map(text).collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [text(k), text(v)]).flatten().collect(),
        _ => Vec::new(),
    };
    match flat.as_slice() {
        [name, value] if name.eq_ignore_ascii_case("maxmemory-policy") => Ok(value.clone()),
        _ => Err(format!("unexpected answer {v:?}")),
    }
}

/// What a set of readings means for sales.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Nodes with a policy other than noeviction.
    pub evicting: Vec<String>,
    /// Nodes whose policy could not be read.
    pub unknown: Vec<String>,
    /// Nodes above their memory limit.
    pub over_limit: Vec<String>,
}

/// The pure rule: which nodes are unsafe and which are full. `what` names the store
/// ("pool store", "buyer registry").
pub fn judge(what: &str, readings: &[NodeReading]) -> Findings {
    let mut f = Findings::default();
    for r in readings {
        match &r.policy {
            Ok(p) if p == SAFE_POLICY => {}
            Ok(p) => f.evicting.push(format!("{what} {} has maxmemory-policy {p}, not {SAFE_POLICY}", r.node)),
            Err(e) => f.unknown.push(format!("{what} {}: cannot read its maxmemory-policy: {e}", r.node)),
        }
        if let Some(m) = r.memory.filter(Memory::over_limit) {
            f.over_limit
                .push(format!("{what} {} is at its memory limit (maxmemory {} bytes, {} used)", r.node, m.max, m.used));
        }
    }
    f
}

/// One store the watch looks at.
struct Target {
    what: &'static str,
    nodes: RedisNodes,
    /// Its last findings (None: never read since start).
    last: Option<Findings>,
}

/// Checks the stores' nodes at start and every `interval` after, and keeps
/// [`StoreHealth`] up to date.
pub struct PolicyWatch {
    targets: Vec<Target>,
    allow_evicting: bool,
    health: Arc<StoreHealth>,
    interval: Duration,
}

impl PolicyWatch {
    pub fn new(health: Arc<StoreHealth>, allow_evicting: bool, interval: Duration) -> Self {
        Self { targets: Vec::new(), allow_evicting, health, interval: interval.max(Duration::from_millis(10)) }
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Checks `nodes` now: Err (the start-up line) when a node evicts or its policy cannot
    /// be read, unless evicting is allowed (then a warning). Then watches them.
    pub async fn add(&mut self, what: &'static str, nodes: RedisNodes) -> Result<(), String> {
        let readings = nodes.read().await.map_err(|e| format!("{what}: cannot check its maxmemory-policy: {e}"))?;
        let findings = judge(what, &readings);
        let unsafe_lines: Vec<&String> = findings.evicting.iter().chain(&findings.unknown).collect();
        if !unsafe_lines.is_empty() {
            let line = unsafe_lines.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ");
            if !self.allow_evicting {
                let advice = if findings.evicting.is_empty() {
                    format!(
                        "the agent cannot tell whether Redis may evict pool keys; make sure maxmemory-policy is \
                         {SAFE_POLICY}, then start with --allow-evicting-redis"
                    )
                } else {
                    format!(
                        "an evicting Redis loses reservations without a trace; set maxmemory-policy {SAFE_POLICY} \
                         (or start with --allow-evicting-redis, unsafe)"
                    )
                };
                return Err(format!("{line}: {advice}"));
            }
            tracing::warn!(store = what, problem = %line, "--allow-evicting-redis: selling on a Redis that may evict pool keys (unsafe)");
        }
        self.targets.push(Target { what, nodes, last: Some(findings) });
        self.apply();
        Ok(())
    }

    /// Checks every `interval` until `stop`.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            self.check().await;
        }
    }

    /// Reads every store once; a store that cannot be read keeps its last findings.
    pub async fn check(&mut self) {
        for t in &mut self.targets {
            match t.nodes.read().await {
                Ok(readings) => {
                    let findings = judge(t.what, &readings);
                    let before = t.last.replace(findings.clone());
                    let was_evicting = before.as_ref().is_some_and(|b| !b.evicting.is_empty());
                    if findings.evicting.is_empty() && was_evicting {
                        tracing::warn!(store = t.what, "maxmemory-policy is {SAFE_POLICY} again");
                    } else if !findings.evicting.is_empty() && !was_evicting {
                        tracing::error!(store = t.what, problem = %findings.evicting.join("; "), allowed = self.allow_evicting, "a node's maxmemory-policy evicts keys");
                    }
                }
                Err(e) => tracing::debug!(store = t.what, error = %e, "cannot check the store's nodes"),
            }
        }
        self.apply();
    }

    /// The targets' last findings into the health.
    fn apply(&self) {
        let last = || self.targets.iter().filter_map(|t| t.last.as_ref());
        let evicting: Vec<String> = last().flat_map(|f| f.evicting.iter().cloned()).collect();
        let stopped = (!evicting.is_empty() && !self.allow_evicting).then(|| {
            format!(
                "sales stopped: {}; Redis may evict pool keys and lose reservations, so nothing is sold until it \
                 is {SAFE_POLICY} again; retry with the same idempotency_key",
                evicting.join("; ")
            )
        });
        self.health.set_evicting(stopped);
        let over: Vec<String> = last().flat_map(|f| f.over_limit.iter().cloned()).collect();
        self.health.set_memory((!over.is_empty()).then(|| format!("{}; writes are refused", over.join("; "))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn info(policy: &str, used: u64, max: u64) -> Value {
        bulk(&format!(
            "# Memory\r\nused_memory:{used}\r\nmaxmemory:{max}\r\nmaxmemory_policy:{policy}\r\nmem_not_counted_for_evict:0\r\n"
        ))
    }

    #[test]
    fn the_policy_comes_from_config_get_or_else_from_info() {
        let config = Value::Array(vec![bulk("maxmemory-policy"), bulk("allkeys-lru")]);
        let r = reading("redis://a".into(), &config, &info("allkeys-lru", 10, 0));
        assert_eq!(r.policy.as_deref(), Ok("allkeys-lru"));
        let refused = Value::SimpleString(format!("{ERROR_MARK}unknown command 'CONFIG'"));
        let r = reading("redis://a".into(), &refused, &info("volatile-ttl", 10, 0));
        assert_eq!(r.policy.as_deref(), Ok("volatile-ttl"));
        let r = reading("redis://a".into(), &refused, &Value::SimpleString(format!("{ERROR_MARK}NOPERM")));
        let e = r.policy.unwrap_err();
        assert!(e.contains("CONFIG GET refused") && e.contains("INFO refused"), "{e}");
        let map = Value::Map(vec![(bulk("maxmemory-policy"), bulk("noeviction"))]);
        assert_eq!(config_policy(&map).as_deref(), Ok("noeviction"));
    }

    #[test]
    fn judged_by_policy_and_memory() {
        let ok = NodeReading {
            node: "redis://a".into(),
            policy: Ok("noeviction".into()),
            memory: Some(Memory { used: 5, max: 0, not_counted: 0 }),
        };
        assert_eq!(judge("pool store", std::slice::from_ref(&ok)), Findings::default());
        let lru = NodeReading { node: "redis://b".into(), policy: Ok("allkeys-lru".into()), ..ok.clone() };
        let full = NodeReading { memory: Some(Memory { used: 11, max: 10, not_counted: 0 }), ..ok.clone() };
        let buffers = NodeReading { memory: Some(Memory { used: 11, max: 10, not_counted: 2 }), ..ok.clone() };
        let unknown = NodeReading { policy: Err("CONFIG GET refused".into()), ..ok.clone() };
        let f = judge("pool store", &[ok, lru, full, buffers, unknown]);
        assert_eq!(f.evicting, vec!["pool store redis://b has maxmemory-policy allkeys-lru, not noeviction"]);
        assert_eq!(f.over_limit.len(), 1, "{f:?}");
        assert!(f.over_limit[0].contains("memory limit"));
        assert_eq!(f.unknown.len(), 1);
    }
}
