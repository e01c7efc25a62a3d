//! Writes that wait for replicas (`--redis-replica-acks`): the script call and its `WAIT`
//! go out together, pipelined, on a connection the write holds alone, to the node that
//! holds the pool.
//!
//! `WAIT` blocks the connection it is sent on until the replicas acknowledge or its timeout
//! passes, and Redis answers nothing else on that connection meanwhile. On the store's
//! shared multiplexed connections every other caller (reads included) would queue behind
//! it, so a durable write takes a connection of its own from a small pool for the two
//! commands, and returns it after. `WAIT` covers every write sent before it on its
//! connection, so it covers this one, and only an answer from that connection counts.
//!
//! On a Redis Cluster the pair goes straight to the master of the pool's slot, never
//! through the cluster client: that client sends a command on its own when the connection
//! of the command before it broke, and routes a command for an unconnected node to another
//! one, so a `WAIT` could be answered by a master that never saw the write. Here the
//! master is learned from `MOVED` answers (a node that does not hold the slot runs
//! nothing and names the one that does), and a connection that breaks after the pair was
//! sent leaves the write's outcome unknown: UNAVAILABLE, retried by the caller with the
//! same ids (every write is idempotent).

use super::*;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError};
use tokio::sync::Semaphore;

/// How many durable writes to one server run at once at most; more wait for a connection.
pub(super) const DURABLE_CONNECTIONS: usize = 32;

/// How many redirections or unreachable nodes a cluster write goes through before it
/// answers UNAVAILABLE (a failover in progress settles within a few).
const CLUSTER_HOPS: usize = 6;

/// How many replicas must acknowledge a write before it is answered (Redis `WAIT`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Durability {
    pub(super) replicas: u32,
    pub(super) timeout_ms: u64,
}

/// Why a pipelined write has no answer.
pub(super) enum Failure {
    /// No connection could be opened: nothing was sent.
    NotSent(RedisError),
    /// The server answered the pair with an error (which says whether the script ran).
    Answered(RedisError),
    /// Sent, then the connection broke or timed out: the write may or may not have run.
    Lost(RedisError),
}

impl Failure {
    fn into_store_error(self) -> StoreError {
        match self {
            Failure::NotSent(e) | Failure::Answered(e) | Failure::Lost(e) => map_err(e),
        }
    }
}

/// The connections durable writes to one server take in turn, opened when first needed.
pub(super) struct DurablePool {
    client: redis::Client,
    idle: Mutex<Vec<MultiplexedConnection>>,
    permits: Semaphore,
}

impl DurablePool {
    pub(super) fn new(client: redis::Client) -> Self {
        Self { client, idle: Mutex::new(Vec::new()), permits: Semaphore::new(DURABLE_CONNECTIONS) }
    }

    /// The script call and its `WAIT`, pipelined; a script the server lost (NOSCRIPT) is
    /// loaded and the pair sent again (the first script call did not run).
    async fn send<T: FromRedisValue>(&self, d: Durability, call: &ScriptInvocation<'_>) -> Result<(T, i64), Failure> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| Failure::NotSent(RedisError::from((ErrorKind::Io, "the store is shutting down"))))?;
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut conn = match idle {
            Some(c) => c,
            None => {
                // Longer than the WAIT itself, which may take its whole timeout.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(Some(Duration::from_millis(d.timeout_ms) + Duration::from_secs(2)));
                self.client.get_multiplexed_async_connection_with_config(&config).await.map_err(Failure::NotSent)?
            }
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(call).cmd("WAIT").arg(d.replicas).arg(d.timeout_ms);
        let mut answer = pipe.query_async::<(T, i64)>(&mut conn).await;
        if answer.as_ref().is_err_and(|e| e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)) {
            answer = match call.load_async(&mut conn).await {
                Ok(_) => pipe.query_async(&mut conn).await,
                Err(e) => Err(e),
            };
        }
        match answer {
            Ok(a) => {
                self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
                Ok(a)
            }
            // A server's error answer leaves the connection usable; anything else (I/O, a
            // timeout, a dropped connection) does not: it is closed, and the next write
            // opens another.
            Err(e) if matches!(e.kind(), ErrorKind::Server(_)) => {
                self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
                Err(Failure::Answered(e))
            }
            Err(e) => Err(Failure::Lost(e)),
        }
    }
}

/// Where a `MOVED` answer to the pair's script says the slot lives (`host:port`), if the
/// script (the pipeline's first command) was redirected.
fn moved_to(e: RedisError) -> Option<String> {
    let errors = e.into_server_errors()?;
    let (index, first) = errors.first()?;
    if *index != 0 || first.kind() != Some(ServerErrorKind::Moved) {
        return None;
    }
    // "<slot> <host>:<port>"
    first.details()?.split_ascii_whitespace().nth(1).map(str::to_owned)
}

/// The masters of a Redis Cluster as durable writes see them: learned per pool from
/// `MOVED` answers, each with its own pool of connections.
pub(super) struct ClusterNodes {
    /// Where to start when a pool's master is unknown, and how to connect (credentials,
    /// TLS) to every node.
    seeds: Vec<ConnectionInfo>,
    /// The master each pool's key was last answered by (`host:port`).
    masters: Mutex<HashMap<String, String>>,
    nodes: Mutex<HashMap<String, Arc<DurablePool>>>,
    next_seed: AtomicUsize,
}

impl ClusterNodes {
    pub(super) fn new(seed_nodes: &[String]) -> Result<Self, StoreError> {
        let seeds = seed_nodes
            .iter()
            .map(|s| {
                s.as_str()
                    .into_connection_info()
                    .map_err(|e| StoreError::Unavailable(format!("bad redis cluster seed node {s:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { seeds, masters: Mutex::default(), nodes: Mutex::default(), next_seed: AtomicUsize::new(0) })
    }

    fn seed_addr(&self) -> Option<String> {
        let i = self.next_seed.fetch_add(1, Ordering::Relaxed) % self.seeds.len().max(1);
        match self.seeds.get(i)?.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some(format!("{host}:{port}"))
            }
            _ => None,
        }
    }

    /// The connections to `addr` (`host:port`), with the seeds' credentials and TLS.
    fn node(&self, addr: &str) -> Result<Arc<DurablePool>, StoreError> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pool) = nodes.get(addr) {
            return Ok(pool.clone());
        }
        let bad = || StoreError::Protocol(format!("a redis cluster node named {addr:?}"));
        let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let seed = self.seeds.first().ok_or_else(bad)?.clone();
        let node_addr = match seed.addr() {
            ConnectionAddr::TcpTls { insecure, tls_params, .. } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let client = redis::Client::open(seed.set_addr(node_addr)).map_err(map_err)?;
        let pool = Arc::new(DurablePool::new(client));
        nodes.insert(addr.to_owned(), pool.clone());
        Ok(pool)
    }

    /// The pair on the master of `routing_key`'s slot, following redirections.
    async fn send<T: FromRedisValue>(
        &self,
        d: Durability,
        routing_key: &str,
        call: &ScriptInvocation<'_>,
    ) -> Result<(T, i64), StoreError> {
        let known = self.masters.lock().unwrap_or_else(PoisonError::into_inner).get(routing_key).cloned();
        let mut addr = known.or_else(|| self.seed_addr());
        let mut last = None;
        for hop in 0..CLUSTER_HOPS {
            let Some(target) = addr.take() else { break };
            match self.node(&target)?.send(d, call).await {
                Ok(answer) => {
                    self.masters.lock().unwrap_or_else(PoisonError::into_inner).insert(routing_key.to_owned(), target);
                    return Ok(answer);
                }
                // The script did not run there; the answer names the slot's master.
                Err(Failure::Answered(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::Moved) => {
                    let Some(next) = moved_to(e) else {
                        return Err(StoreError::Unavailable(format!("{target} redirected {routing_key} nowhere")));
                    };
                    self.masters
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(routing_key.to_owned(), next.clone());
                    addr = Some(next);
                }
                // Unreachable (a master killed, a failover under way): forget it and ask
                // a seed, which redirects to whoever holds the slot now.
                Err(Failure::NotSent(e)) => {
                    self.masters.lock().unwrap_or_else(PoisonError::into_inner).remove(routing_key);
                    self.nodes.lock().unwrap_or_else(PoisonError::into_inner).remove(&target);
                    last = Some(map_err(e));
                    if hop + 1 < CLUSTER_HOPS {
                        tokio::time::sleep(Duration::from_millis(100 << hop.min(3))).await;
                    }
                    addr = self.seed_addr();
                }
                // Sent, then no answer: the write may have run; it is retried whole by
                // the caller, never acknowledged by another node's WAIT.
                Err(Failure::Lost(e)) => {
                    self.masters.lock().unwrap_or_else(PoisonError::into_inner).remove(routing_key);
                    return Err(map_err(e));
                }
                Err(other) => return Err(other.into_store_error()),
            }
        }
        Err(last
            .unwrap_or_else(|| StoreError::Unavailable(format!("no redis cluster master answered for {routing_key}"))))
    }
}

/// Where durable writes go: one server's connection pool, or a cluster's masters.
pub(super) enum DurableWrites {
    Single(DurablePool),
    Cluster(ClusterNodes),
}

/// Runs a script that writes the pool whose key is `routing_key`, then waits for replicas
/// when asked to.
pub(super) async fn write<T: FromRedisValue>(
    shared: &Shared,
    durability: Option<Durability>,
    routing_key: &str,
    call: &ScriptInvocation<'_>,
) -> Result<T, StoreError> {
    let Some(d) = durability else { return read(shared.conn(), call).await };
    let (reply, acked): (T, i64) = match &shared.durable {
        DurableWrites::Single(pool) => pool.send(d, call).await.map_err(Failure::into_store_error)?,
        DurableWrites::Cluster(nodes) => nodes.send(d, routing_key, call).await?,
    };
    if acked < i64::from(d.replicas) {
        return Err(StoreError::Unavailable(format!(
            "write to {routing_key} acknowledged by {acked} of {} replicas within {} ms",
            d.replicas, d.timeout_ms
        )));
    }
    Ok(reply)
}
