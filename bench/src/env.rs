//! The benchmark's private world: a fresh PostgreSQL database, a private Redis key prefix,
//! and a center and agents started in this process (on their own runtime, so servers and
//! load generator do not share worker threads). Everything is removed afterwards.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use inventory_agent::agent::Agent;
use inventory_agent::config::StoreKind;
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_center::{Application as CenterApp, CenterConfig};
use sqlx::Connection;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::args::ensure_loopback;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

pub fn database_server_url() -> String {
    std::env::var("INVENTORY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

pub fn redis_url() -> String {
    std::env::var("INVENTORY_TEST_REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned())
}

fn random_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// `postgres://user@host:port/db?query` with the database name replaced.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let base = match base[after_scheme..].rfind('/') {
        Some(i) => &base[..after_scheme + i],
        None => base,
    };
    format!("{base}/{name}{query}")
}

/// A fresh database `inv_bench_<random>`; [`BenchDatabase::drop_database`] removes it.
pub struct BenchDatabase {
    pub url: String,
    name: String,
    server_url: String,
}

impl BenchDatabase {
    pub async fn create() -> anyhow::Result<Self> {
        let server_url = database_server_url();
        ensure_loopback("INVENTORY_TEST_DATABASE_URL", &server_url).map_err(anyhow::Error::msg)?;
        let mut conn = sqlx::PgConnection::connect(&server_url).await.with_context(|| {
            format!("cannot reach PostgreSQL at {server_url} (set INVENTORY_TEST_DATABASE_URL to a local server)")
        })?;
        let name = format!("inv_bench_{}", random_suffix());
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.context("create database")?;
        let _ = conn.close().await;
        Ok(Self { url: with_database(&server_url, &name), name, server_url })
    }

    pub async fn server_version(&self) -> Option<String> {
        let mut conn = sqlx::PgConnection::connect(&self.server_url).await.ok()?;
        let v: (String,) = sqlx::query_as("SHOW server_version").fetch_one(&mut conn).await.ok()?;
        let _ = conn.close().await;
        Some(v.0)
    }

    pub async fn drop_database(self) {
        let result = async {
            let mut conn = sqlx::PgConnection::connect(&self.server_url).await?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).execute(&mut conn).await?;
            conn.close().await
        }
        .await;
        if let Err(e) = result {
            eprintln!("warning: could not drop database {}: {e}", self.name);
        }
    }
}

/// The shared Redis with a private key prefix `bench:<random>:`.
pub struct BenchRedis {
    pub url: String,
    pub prefix: String,
}

impl BenchRedis {
    pub async fn connect() -> anyhow::Result<(Self, redis::aio::MultiplexedConnection)> {
        let url = redis_url();
        ensure_loopback("INVENTORY_TEST_REDIS_URL", &url).map_err(anyhow::Error::msg)?;
        let client = redis::Client::open(url.as_str())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("cannot reach Redis at {url} (set INVENTORY_TEST_REDIS_URL to a local server)"))?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok((Self { url, prefix: format!("bench:{}:", random_suffix()) }, conn))
    }

    pub async fn version(conn: &mut redis::aio::MultiplexedConnection) -> Option<String> {
        let info: String = redis::cmd("INFO").arg("server").query_async(conn).await.ok()?;
        info.lines().find_map(|l| l.strip_prefix("redis_version:")).map(|v| v.trim().to_owned())
    }

    /// Deletes every key under the prefix (SCAN + UNLINK, so Redis never blocks long).
    pub async fn delete_keys(&self, conn: &mut redis::aio::MultiplexedConnection) {
        let pattern = format!("{}*", self.prefix);
        let mut cursor: u64 = 0;
        loop {
            let step: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1_000)
                .query_async(conn)
                .await;
            let Ok((next, keys)) = step else {
                eprintln!("warning: could not scan Redis keys {pattern}");
                return;
            };
            if !keys.is_empty() {
                let _: redis::RedisResult<u64> = redis::cmd("UNLINK").arg(&keys).query_async(conn).await;
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }
}

/// A server task with its stop signal.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    fn spawn<F, Fut>(rt: &Handle, run: F) -> Self
    where
        F: FnOnce(oneshot::Receiver<()>) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        Self { stop: Some(tx), task: rt.spawn(run(rx)) }
    }

    async fn stop(self, what: &str) {
        self.stop_within(what, Duration::from_secs(10)).await;
    }

    async fn stop_within(mut self, what: &str, limit: Duration) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let abort = self.task.abort_handle();
        match tokio::time::timeout(limit, self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("warning: {what} stopped with an error: {e}"),
            Ok(Err(e)) if e.is_cancelled() => {}
            Ok(Err(e)) => eprintln!("warning: {what} task failed: {e}"),
            Err(_) => {
                eprintln!("warning: {what} did not stop within {limit:?}; aborted");
                abort.abort();
            }
        }
    }
}

pub struct CenterHandle {
    pub url: String,
    /// The HTTP port: `/metrics` and the console's feeds.
    pub http: std::net::SocketAddr,
    running: Running,
}

impl CenterHandle {
    pub async fn start(rt: &Handle, database_url: &str) -> anyhow::Result<Self> {
        let mut config = CenterConfig::for_tests(database_url);
        // Leases as in production (for_tests keeps 10 s too; no reclaim in a benchmark).
        // The center's throughput is measured, not its per-channel rate limit.
        config.channel_rate_per_sec = 10_000_000;
        config.channel_burst = 10_000_000;
        // The pruner as in production: for_tests runs it every 100 ms, so tests see
        // records go, and at 100,000 items each run scanned every request record.
        config.prune_interval_ms = inventory_center::config::PRUNE_INTERVAL_MS;
        let app = rt.spawn(CenterApp::build(config)).await?.context("start the center")?;
        let (url, http) = (format!("http://{}", app.grpc_addr()), app.http_addr());
        let running = Running::spawn(rt, move |rx| {
            app.run_until(async move {
                let _ = rx.await;
            })
        });
        Ok(Self { url, http, running })
    }

    pub async fn stop(self) {
        self.running.stop("center").await;
    }
}

pub struct AgentHandle {
    pub url: String,
    /// The HTTP port: `/metrics`.
    pub http: std::net::SocketAddr,
    pub agent: Arc<Agent>,
    running: Running,
}

/// The store an agent sells from.
#[derive(Debug, Clone)]
pub enum Store {
    Memory,
    Redis { url: String, prefix: String, tuning: RedisTuning },
}

/// The Redis store's settings where a run overrides the agent's defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisTuning {
    pub connections: Option<usize>,
    pub batch_max: Option<usize>,
}

impl AgentHandle {
    /// An agent with the production defaults of `inventory-agent` for everything that
    /// shapes a sale (rebalance every 50 ms, heartbeat at a third of the lease, surplus
    /// returned after 2 s above high), except the per-user rate limit: it still runs on
    /// every call, but generous, so the hot users of a skewed population are measured
    /// rather than refused. No tokens or TLS (loopback only).
    pub async fn start(rt: &Handle, center_url: &str, channel: &str, store: &Store) -> anyhow::Result<Self> {
        Self::start_relaying(rt, center_url, channel, store, None).await
    }

    /// Like [`AgentHandle::start`], relaying its events to JetStream when `nats` is
    /// (server URL, stream; the subjects are `<stream in lower case>.>`).
    pub async fn start_relaying(
        rt: &Handle,
        center_url: &str,
        channel: &str,
        store: &Store,
        nats: Option<(&str, &str)>,
    ) -> anyhow::Result<Self> {
        Self::start_configured(rt, Self::config(center_url, channel, store, nats)).await
    }

    /// Like [`AgentHandle::start`], for loading thousands of items at once: the bound on
    /// lookups of unknown items is lifted (what figure (iii) measures is the loading).
    pub async fn start_stocking(rt: &Handle, center_url: &str, channel: &str, store: &Store) -> anyhow::Result<Self> {
        let mut config = Self::config(center_url, channel, store, None);
        config.item_lookups_per_sec = 1_000_000;
        // A heartbeat of every pool is one call, whose time is measured rather than cut.
        config.center_timeout_ms = 60_000;
        Self::start_configured(rt, config).await
    }

    fn config(center_url: &str, channel: &str, store: &Store, nats: Option<(&str, &str)>) -> AgentConfig {
        let mut config = match store {
            Store::Memory => {
                AgentConfig::for_tests(channel, center_url, StoreKind::Memory, "redis://unused", "unused:")
            }
            Store::Redis { url, prefix, tuning } => {
                let mut config = AgentConfig::for_tests(channel, center_url, StoreKind::Redis, url, prefix);
                config.redis_connections = tuning.connections.unwrap_or(config.redis_connections);
                config.redis_acquire_batch_max = tuning.batch_max.unwrap_or(config.redis_acquire_batch_max);
                config
            }
        };
        config.agent_id = Some(format!("{channel}-bench"));
        config.rebalance_interval_ms = 50;
        config.heartbeat_interval_ms = 0;
        config.return_sustain_ms = 2_000;
        config.user_rate_per_sec = 1_000_000;
        config.user_burst = 1_000_000;
        if let Some((url, stream)) = nats {
            config.nats_url = Some(url.to_owned());
            config.nats_stream = stream.to_owned();
            config.nats_subject_prefix = stream.to_lowercase();
            config.relay_interval_ms = 50;
        }
        config
    }

    async fn start_configured(rt: &Handle, config: AgentConfig) -> anyhow::Result<Self> {
        let channel = config.channel.clone();
        let app = rt.spawn(AgentApp::build(config)).await?.with_context(|| format!("start agent {channel}"))?;
        let (addr, http, agent) = (app.grpc_addr(), app.http_addr(), app.agent());
        let running = Running::spawn(rt, move |rx| {
            app.run_until(async move {
                let _ = rx.await;
            })
        });
        Ok(Self { url: format!("http://{addr}"), http, agent, running })
    }

    pub fn center_calls(&self) -> u64 {
        self.agent.metrics.borrow_calls() + self.agent.metrics.return_calls()
    }

    /// SOLD_OUT answers given from memory (no store call), read from the agent's metrics.
    pub fn fast_path_answers(&self) -> u64 {
        let mut text = String::new();
        self.agent.metrics.render(&mut text, "bench");
        text.lines()
            .find_map(|l| l.strip_prefix("inventory_agent_sold_out_fast_path_total"))
            .and_then(|rest| rest.rsplit(' ').next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    pub async fn stop(self, what: &str) {
        self.running.stop(what).await;
    }

    /// Stops within `limit`: an agent with many pools sends every pool's report as it
    /// drains, which takes longer than a small one's stop.
    pub async fn stop_within(self, what: &str, limit: Duration) {
        self.running.stop_within(what, limit).await;
    }
}

/// `count` gRPC connections (HTTP/2, one TCP connection each) to `url`.
pub async fn channels(url: &str, count: usize) -> anyhow::Result<Vec<tonic::transport::Channel>> {
    tls_channels(url, count, None).await
}

/// As [`channels`], with TLS for an `https://` url.
pub async fn tls_channels(
    url: &str,
    count: usize,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> anyhow::Result<Vec<tonic::transport::Channel>> {
    ensure_loopback("target", url).map_err(anyhow::Error::msg)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        if let (true, Some(tls)) = (url.starts_with("https://"), &tls) {
            endpoint = endpoint.tls_config(tls.clone()).with_context(|| format!("tls for {url}"))?;
        }
        out.push(endpoint.connect().await.with_context(|| format!("connect to {url}"))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_name_only() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(with_database("postgres://u:p@h/db?sslmode=disable", "x"), "postgres://u:p@h/x?sslmode=disable");
    }
}
