//! Command-line and environment configuration. Every flag is also read from
//! `INVENTORY_<FLAG>` (e.g. `INVENTORY_REDIS_URL`).

use std::net::SocketAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// In-process pools (dashmap): no server needed; pools die with the process.
    Memory,
    /// Pools in Redis, changed only by the Lua scripts in `lua/`.
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "inventory-agent",
    version,
    about = "A sales channel's inventory agent: sells from local pools (gRPC)"
)]
pub struct AgentConfig {
    /// The sales channel this agent serves (app, web, eu-west, ...).
    #[arg(long, env = "INVENTORY_CHANNEL")]
    pub channel: String,
    /// This agent process; defaults to CHANNEL-PID.
    #[arg(long, env = "INVENTORY_AGENT_ID")]
    pub agent_id: Option<String>,
    /// The center's gRPC address.
    #[arg(long, env = "INVENTORY_CENTER", default_value = "http://127.0.0.1:50051")]
    pub center: String,
    /// gRPC listen address (Agent service, health, reflection).
    #[arg(long, env = "INVENTORY_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,
    /// HTTP listen address for /metrics and /healthz.
    #[arg(long, env = "INVENTORY_HTTP_LISTEN", default_value = "127.0.0.1:9465")]
    pub http_listen: SocketAddr,
    #[arg(long, env = "INVENTORY_STORE", value_enum, default_value = "memory")]
    pub store: StoreKind,
    #[arg(long, env = "INVENTORY_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Prefix of every Redis key (before the pool's `{channel:item}` hash tag).
    #[arg(long, env = "INVENTORY_REDIS_PREFIX", default_value = "inv:")]
    pub redis_prefix: String,
    /// How often the rebalancer looks at each pool.
    #[arg(long, env = "INVENTORY_REBALANCE_INTERVAL_MS", default_value_t = 50)]
    pub rebalance_interval_ms: u64,
    /// How often pools are reported to the center; 0 means a third of the lease TTL.
    #[arg(long, env = "INVENTORY_HEARTBEAT_INTERVAL_MS", default_value_t = 0)]
    pub heartbeat_interval_ms: u64,
    /// How long a pool must stay above its high watermark before surplus goes back.
    #[arg(long, env = "INVENTORY_RETURN_SUSTAIN_MS", default_value_t = 2_000)]
    pub return_sustain_ms: u64,
    /// How long an Acquire that found the pool empty waits for the shared Borrow.
    #[arg(long, env = "INVENTORY_MISS_WAIT_MS", default_value_t = 2_000)]
    pub miss_wait_ms: u64,
    /// Safety margin of the lease: the agent stops selling this long before the lease it
    /// was granted would end (counted from when it asked), so it never sells after the
    /// center may consider the lease gone.
    #[arg(long, env = "INVENTORY_LEASE_MARGIN_MS", default_value_t = 1_000)]
    pub lease_margin_ms: u64,
    /// Deadline of each call to the center.
    #[arg(long, env = "INVENTORY_CENTER_TIMEOUT_MS", default_value_t = 2_000)]
    pub center_timeout_ms: u64,
    #[arg(long, env = "INVENTORY_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl AgentConfig {
    /// A configuration for tests: listeners on free ports, the given center and store.
    pub fn for_tests(channel: &str, center: &str, store: StoreKind, redis_url: &str, redis_prefix: &str) -> Self {
        Self {
            channel: channel.to_owned(),
            agent_id: Some(format!("{channel}-test")),
            center: center.to_owned(),
            listen: "127.0.0.1:0".parse().expect("literal address"),
            http_listen: "127.0.0.1:0".parse().expect("literal address"),
            store,
            redis_url: redis_url.to_owned(),
            redis_prefix: redis_prefix.to_owned(),
            rebalance_interval_ms: 20,
            heartbeat_interval_ms: 200,
            return_sustain_ms: 500,
            miss_wait_ms: 2_000,
            lease_margin_ms: 200,
            center_timeout_ms: 2_000,
            log_format: LogFormat::Text,
        }
    }
}

pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
