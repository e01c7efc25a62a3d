//! Command-line and environment configuration. Every flag is also read from
//! `INVENTORY_<FLAG>` (e.g. `INVENTORY_DATABASE_URL`).

pub use inventory_net::{LogFormat, init_tracing};
use std::net::SocketAddr;
use std::path::PathBuf;

/// How often the pruner runs unless configured (`--prune-interval-ms`).
pub const PRUNE_INTERVAL_MS: u64 = 60_000;

#[derive(Debug, Clone, clap::Parser)]
#[command(name = "inventory-center", version = inventory_net::metrics::LONG_VERSION, about = "Authoritative inventory ledger for flash sales (gRPC)")]
pub struct CenterConfig {
    /// gRPC listen address (Center, Admin, health, reflection).
    #[arg(long, env = "INVENTORY_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// HTTP listen address: the console (`/`, `/api/...`, behind the operator token when
    /// there is one), and /metrics and /healthz unless --metrics-listen moves them.
    #[arg(long, env = "INVENTORY_HTTP_LISTEN", default_value = "127.0.0.1:9464")]
    pub http_listen: SocketAddr,
    /// A listen address of their own for /metrics and /healthz (open to scrapers and
    /// probes, no token); --http-listen then serves only the console.
    #[arg(long, env = "INVENTORY_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Items shown on /metrics with series of their own at most. With more items, those an
    /// alert looks at (drift, units in doubt) are shown first and the rest are summed into
    /// series without the item label (inventory_center_metrics_folded_items counts them).
    #[arg(long, env = "INVENTORY_METRICS_PER_ITEM_LIMIT", default_value_t = crate::fold::DEFAULT_PER_ITEM_LIMIT)]
    pub metrics_per_item_limit: usize,
    /// Ledger database: sqlite://FILE (created if missing) or postgres://...
    #[arg(long, env = "INVENTORY_DATABASE_URL", default_value = "sqlite://inventory.db")]
    pub database_url: String,
    /// Refuse to start unless the PostgreSQL database waits for a synchronous standby on
    /// every commit (synchronous_standby_names set, synchronous_commit on or remote_apply):
    /// a failover to an asynchronous standby can lose grants and oversell. Without it, such
    /// a database draws a warning. Refused with SQLite, which has no synchronous standby.
    #[arg(long, env = "INVENTORY_REQUIRE_SYNCHRONOUS_REPLICATION")]
    pub require_synchronous_replication: bool,
    /// How long an agent's lease lasts without a heartbeat.
    #[arg(long, env = "INVENTORY_LEASE_TTL_MS", default_value_t = 10_000)]
    pub lease_ttl_ms: u64,
    /// How long after lease expiry Reclaim is allowed.
    #[arg(long, env = "INVENTORY_RECLAIM_GRACE_MS", default_value_t = 5_000)]
    pub reclaim_grace_ms: u64,
    /// Reclaim a dead channel's unsold units automatically this long after its lease
    /// expired (0: never; operators use `invctl reclaim`).
    #[arg(long, env = "INVENTORY_AUTO_RECLAIM_AFTER_MS", default_value_t = 0)]
    pub auto_reclaim_after_ms: u64,
    /// How often request records no retry can use any more (those of an epoch the agent's
    /// channel has left, and those past --request-max-age-ms) are deleted.
    #[arg(long, env = "INVENTORY_PRUNE_INTERVAL_MS", default_value_t = PRUNE_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub prune_interval_ms: u64,
    /// How long a channel's request ids are honoured: records of requests are deleted
    /// this long (plus a quarter, for clock differences) after they were made, and a
    /// Borrow or Return whose id was made longer ago than this (the agent's ids tell) is
    /// refused with FAILED_PRECONDITION instead of applied again. Default a day.
    #[arg(long, env = "INVENTORY_REQUEST_MAX_AGE_MS", default_value_t = inventory_core::records::DEFAULT_MAX_AGE_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_max_age_ms: u64,
    /// Calls per second each channel may make to the Center service (a BorrowMany counts
    /// its lines); above it, RESOURCE_EXHAUSTED.
    #[arg(long, env = "INVENTORY_CHANNEL_RATE_PER_SEC", default_value_t = crate::limits::DEFAULT_RATE_PER_SEC, value_parser = clap::value_parser!(u32).range(1..))]
    pub channel_rate_per_sec: u32,
    /// Calls a channel may make at once above its rate.
    #[arg(long, env = "INVENTORY_CHANNEL_BURST", default_value_t = crate::limits::DEFAULT_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub channel_burst: u32,
    /// Open WatchChannel streams each channel may hold; one more is RESOURCE_EXHAUSTED.
    #[arg(long, env = "INVENTORY_MAX_WATCH_STREAMS_PER_CHANNEL", default_value_t = crate::limits::DEFAULT_MAX_WATCHES)]
    pub max_watch_streams_per_channel: usize,
    #[arg(long, env = "INVENTORY_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// OTLP/gRPC collector URL (e.g. http://127.0.0.1:4317) to export trace spans to;
    /// without it nothing is exported.
    #[arg(long, env = "INVENTORY_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Operators' token for the Admin service (prefer --operator-token-file).
    #[arg(long, env = "INVENTORY_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// File holding the operators' token(s), one per line.
    #[arg(long, env = "INVENTORY_OPERATOR_TOKEN_FILE")]
    pub operator_token_file: Option<PathBuf>,
    /// Agents' tokens, each bound to one channel: `channel:token,channel:token`.
    #[arg(long, env = "INVENTORY_AGENT_TOKENS", hide_env_values = true)]
    pub agent_tokens: Option<String>,
    /// File of agents' tokens, one `channel:token` per line.
    #[arg(long, env = "INVENTORY_AGENT_TOKENS_FILE")]
    pub agent_tokens_file: Option<PathBuf>,
    /// Run without tokens (anyone reaching the port may act). Logged loudly at start.
    #[arg(long, env = "INVENTORY_INSECURE")]
    pub insecure: bool,
    /// Read token files that group or others may read (refused by default: a token file
    /// should be mode 600, readable by the server's user only).
    #[arg(long, env = "INVENTORY_ALLOW_READABLE_TOKEN_FILES")]
    pub allow_readable_token_files: bool,
    /// TLS certificate (PEM) for the gRPC listener and the HTTP ones (console, metrics);
    /// with --tls-key enables TLS.
    #[arg(long, env = "INVENTORY_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, env = "INVENTORY_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to: enables mutual TLS.
    #[arg(long, env = "INVENTORY_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

impl CenterConfig {
    /// A configuration for tests: both listeners on free ports of 127.0.0.1.
    pub fn for_tests(database_url: &str) -> Self {
        Self {
            listen: "127.0.0.1:0".parse().expect("literal address"),
            http_listen: "127.0.0.1:0".parse().expect("literal address"),
            metrics_listen: None,
            metrics_per_item_limit: crate::fold::DEFAULT_PER_ITEM_LIMIT,
            database_url: database_url.to_owned(),
            require_synchronous_replication: false,
            lease_ttl_ms: 10_000,
            reclaim_grace_ms: 0,
            auto_reclaim_after_ms: 0,
            prune_interval_ms: 100,
            request_max_age_ms: inventory_core::records::DEFAULT_MAX_AGE_MS,
            channel_rate_per_sec: crate::limits::DEFAULT_RATE_PER_SEC,
            channel_burst: crate::limits::DEFAULT_BURST,
            max_watch_streams_per_channel: crate::limits::DEFAULT_MAX_WATCHES,
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            operator_token: None,
            operator_token_file: None,
            agent_tokens: None,
            agent_tokens_file: None,
            insecure: true,
            allow_readable_token_files: false,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
        }
    }
}
