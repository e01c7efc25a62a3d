//! Writes that wait for replicas (`--redis-replica-acks`): the script call and its `WAIT`
//! go out together, pipelined, on a connection the write holds alone.
//!
//! `WAIT` blocks the connection it is sent on until the replicas acknowledge or its timeout
//! passes, and Redis answers nothing else on that connection meanwhile. On the store's
//! shared multiplexed connections every other caller (reads included) would queue behind
//! it, so a durable write on one server takes a connection of its own from a small pool
//! for the two commands, and returns it after. `WAIT` covers every write sent before it on
//! its connection, so it covers this one.

use super::*;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use tokio::sync::Semaphore;

/// How many durable writes to one server run at once at most; more wait for a connection.
pub(super) const DURABLE_CONNECTIONS: usize = 32;

/// How many replicas must acknowledge a write before it is answered (Redis `WAIT`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Durability {
    pub(super) replicas: u32,
    pub(super) timeout_ms: u64,
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
    async fn call<T: FromRedisValue>(
        &self,
        d: Durability,
        call: &ScriptInvocation<'_>,
    ) -> Result<(T, i64), StoreError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable("the store is shutting down".to_owned()))?;
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut conn = match idle {
            Some(c) => c,
            None => {
                // Longer than the WAIT itself, which may take its whole timeout.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(Some(Duration::from_millis(d.timeout_ms) + Duration::from_secs(2)));
                self.client.get_multiplexed_async_connection_with_config(&config).await.map_err(map_err)?
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
        // An answer, or a server's error answer, leaves the connection usable; anything
        // else (I/O, timeout, a dropped connection) does not: it is closed, and the next
        // write opens another.
        if answer.as_ref().map_or_else(|e| matches!(e.kind(), ErrorKind::Server(_)), |_| true) {
            self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
        }
        answer.map_err(map_err)
    }
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
    // A single server has its pool of connections for durable writes; a cluster client
    // sends each command to the node of its slot.
    let (reply, acked): (T, i64) = match (&shared.durable, shared.conn()) {
        (Some(pool), _) => pool.call(d, call).await?,
        (None, Conn::Single(_)) => {
            return Err(StoreError::Protocol("a durable write to one server needs the store's write pool".to_owned()));
        }
        (None, Conn::Cluster(mut c)) => {
            let reply = call.invoke_async(&mut c).await.map_err(map_err)?;
            // Route WAIT like a write of the pool's key: to the master holding its slot.
            let route = Route::with_key(routing_key, SlotAddr::Master);
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            let mut wait = redis::cmd("WAIT");
            wait.arg(d.replicas).arg(d.timeout_ms);
            // Mid-failover the client's slot map may still name a replica here: then
            // the write's durability is unknown, and the caller retries (idempotent).
            match c.route_command(wait, routing).await.map_err(map_err)? {
                Value::Int(n) => (reply, n),
                other => return Err(StoreError::Unavailable(format!("WAIT for {routing_key}: {other:?}"))),
            }
        }
    };
    if acked < i64::from(d.replicas) {
        return Err(StoreError::Unavailable(format!(
            "write to {routing_key} acknowledged by {acked} of {} replicas within {} ms",
            d.replicas, d.timeout_ms
        )));
    }
    Ok(reply)
}
