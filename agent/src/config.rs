//! Command-line and environment configuration. Every flag is also read from
//! `INVENTORY_<FLAG>` (e.g. `INVENTORY_REDIS_URL`).

pub use inventory_net::{LogFormat, init_tracing};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Default of `--basket-pending-ms`. Here rather than in `baskets`, so the configuration
/// sits below the parts it configures.
pub const DEFAULT_BASKET_PENDING_MS: u64 = 5_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// In-process pools (dashmap): no server needed; pools die with the process.
    Memory,
    /// Pools in Redis, changed only by the Lua scripts in `lua/`.
    Redis,
}

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "inventory-agent",
    version = inventory_net::metrics::LONG_VERSION,
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
    /// HTTP listen address for /metrics and /healthz (nothing else is served over HTTP).
    #[arg(long, env = "INVENTORY_HTTP_LISTEN", default_value = "127.0.0.1:9465")]
    pub http_listen: SocketAddr,
    /// Where /metrics and /healthz are served, as the center's flag of the same name; the
    /// agent's HTTP port serves nothing else, so this replaces --http-listen when given.
    #[arg(long, env = "INVENTORY_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[arg(long, env = "INVENTORY_STORE", value_enum, default_value = "memory")]
    pub store: StoreKind,
    /// With `--store memory`: where the pools are written when the agent stops gracefully
    /// and read back (then deleted) when it starts, so a planned restart keeps every
    /// reservation. Default `inventory-agent-<channel>.pools.json` in the working directory.
    /// A crash writes nothing: the restarted agent then finds its pools lost, and the
    /// units they held stay in doubt until an operator resolves them.
    #[arg(long, env = "INVENTORY_MEMORY_STATE_FILE")]
    pub memory_state_file: Option<PathBuf>,
    /// With `--store memory`: keep nothing across a restart.
    #[arg(long, env = "INVENTORY_NO_MEMORY_STATE")]
    pub no_memory_state: bool,
    #[arg(long, env = "INVENTORY_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Prefix of every Redis key (before the pool's `{channel:item}` hash tag).
    #[arg(long, env = "INVENTORY_REDIS_PREFIX", default_value = "inv:")]
    pub redis_prefix: String,
    /// Seed nodes of a Redis Cluster (comma separated `redis://host:port`); with it the
    /// pools live in the cluster (implies `--store redis`; `--redis-url` is not used).
    #[arg(long, env = "INVENTORY_REDIS_CLUSTER", value_delimiter = ',')]
    pub redis_cluster: Vec<String>,
    /// Replicas that must acknowledge each pool write before it is answered (Redis WAIT);
    /// 1 with replicated Redis, so a failover loses no acknowledged sale. 0: don't wait.
    #[arg(long, env = "INVENTORY_REDIS_REPLICA_ACKS", default_value_t = 0)]
    pub redis_replica_acks: u32,
    /// How long a write waits for those acknowledgements before it answers UNAVAILABLE.
    #[arg(long, env = "INVENTORY_REDIS_REPLICA_ACK_TIMEOUT_MS", default_value_t = 500)]
    pub redis_replica_ack_timeout_ms: u64,
    /// UNSAFE: start (and keep selling) on a Redis whose maxmemory-policy is not
    /// noeviction, or whose policy cannot be read. An evicting Redis may drop any key of a
    /// pool (a reservation, an idempotency key) under memory pressure, losing sales without
    /// a trace. Without this flag the agent refuses to start on one, and stops selling
    /// (UNAVAILABLE, NOT_SERVING) while a node's policy is changed at run time.
    #[arg(long, env = "INVENTORY_ALLOW_EVICTING_REDIS")]
    pub allow_evicting_redis: bool,
    /// Refuse to start unless the pool store loses no write it acknowledged: replica acks
    /// (`--redis-replica-acks` 1 or more), `appendfsync always`, or no persistence at all
    /// (a restart then loses pools outright, which the agent finds). Without it, a store
    /// that may come back older than its acknowledged writes (snapshots, `appendfsync
    /// everysec`) draws one warning at start-up.
    #[arg(long, env = "INVENTORY_REQUIRE_DURABLE_REDIS")]
    pub require_durable_redis: bool,
    /// How often the agent reads its Redis nodes' maxmemory-policy and memory (pool store
    /// and buyer registry).
    #[arg(long, env = "INVENTORY_REDIS_CHECK_INTERVAL_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub redis_check_interval_ms: u64,
    /// Multiplexed connections to the Redis server, used in turn (not with a cluster).
    #[arg(long, env = "INVENTORY_REDIS_CONNECTIONS", default_value_t = 4)]
    pub redis_connections: usize,
    /// At most this many Acquires of one pool that arrive while a call for the pool is in
    /// flight go to Redis together, in one script call (group commit); 1 turns it off.
    #[arg(long, env = "INVENTORY_REDIS_ACQUIRE_BATCH_MAX", default_value_t = 64,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000))]
    pub redis_acquire_batch_max: usize,
    /// Events each pool's outbox keeps at most (per pool). Past it the oldest are dropped
    /// (counted, and alerted on): a sale never fails or waits on the outbox.
    #[arg(long, env = "INVENTORY_OUTBOX_MAX_EVENTS", default_value_t = crate::store::DEFAULT_OUTBOX_MAX,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub outbox_max_events: u64,
    /// Items shown on /metrics with series of their own at most. With more items, those an
    /// alert looks at (a frozen pool, a lost segment, an empty shelf, a filling outbox) are
    /// shown first and the rest are summed into series without the item label
    /// (inventory_agent_metrics_folded_items counts them).
    #[arg(long, env = "INVENTORY_METRICS_PER_ITEM_LIMIT", default_value_t = crate::agent::DEFAULT_METRICS_PER_ITEM_LIMIT)]
    pub metrics_per_item_limit: usize,
    /// Replicas of one channel sharing a pool store elect a leader through it; a leader's
    /// claim lasts this long unless renewed (a dead leader is replaced after it).
    #[arg(long, env = "INVENTORY_LEADER_TTL_MS", default_value_t = 3_000)]
    pub leader_ttl_ms: u64,
    /// At most this many lookups (DescribeItem) of items the agent has not loaded yet, per
    /// second: a flood of random item ids costs the center this many calls, no more.
    #[arg(long, env = "INVENTORY_ITEM_LOOKUPS_PER_SEC", default_value_t = crate::items::DEFAULT_LOOKUPS_PER_SEC)]
    pub item_lookups_per_sec: u32,
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
    /// OTLP/gRPC collector URL (e.g. http://127.0.0.1:4317) to export trace spans to;
    /// without it nothing is exported.
    #[arg(long, env = "INVENTORY_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Token this agent presents to the center (bound to its channel there).
    #[arg(long, env = "INVENTORY_CENTER_TOKEN", hide_env_values = true)]
    pub center_token: Option<String>,
    #[arg(long, env = "INVENTORY_CENTER_TOKEN_FILE")]
    pub center_token_file: Option<PathBuf>,
    /// Tokens the channel's backends must present to the Agent service (comma separated).
    #[arg(long, env = "INVENTORY_BACKEND_TOKENS", hide_env_values = true)]
    pub backend_tokens: Option<String>,
    /// File of backend tokens, one per line.
    #[arg(long, env = "INVENTORY_BACKEND_TOKENS_FILE")]
    pub backend_tokens_file: Option<PathBuf>,
    /// Run without tokens. Logged loudly at start.
    #[arg(long, env = "INVENTORY_INSECURE")]
    pub insecure: bool,
    /// Read token files that group or others may read (refused by default: a token file
    /// should be mode 600, readable by the server's user only).
    #[arg(long, env = "INVENTORY_ALLOW_READABLE_TOKEN_FILES")]
    pub allow_readable_token_files: bool,
    /// TLS certificate and key (PEM) for the agent's gRPC listener and its HTTP port.
    #[arg(long, env = "INVENTORY_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, env = "INVENTORY_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that backends' client certificates must chain to (mutual TLS).
    #[arg(long, env = "INVENTORY_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// CA (PEM) that the center's certificate must chain to; needed for https:// centers.
    #[arg(long, env = "INVENTORY_CENTER_CA")]
    pub center_ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS with the center.
    #[arg(long, env = "INVENTORY_CENTER_CLIENT_CERT")]
    pub center_client_cert: Option<PathBuf>,
    #[arg(long, env = "INVENTORY_CENTER_CLIENT_KEY")]
    pub center_client_key: Option<PathBuf>,
    /// NATS server (e.g. nats://127.0.0.1:4222) to relay reservation events to, through
    /// JetStream; without it no relay runs and the events stay in the outbox. No
    /// credentials or TLS to the broker yet.
    #[arg(long, env = "INVENTORY_NATS_URL")]
    pub nats_url: Option<String>,
    /// The JetStream stream events go to, created if missing.
    #[arg(long, env = "INVENTORY_NATS_STREAM", default_value = "INVENTORY_EVENTS")]
    pub nats_stream: String,
    /// Events go to `<prefix>.<channel>.<item>`; the stream takes `<prefix>.>`.
    #[arg(long, env = "INVENTORY_NATS_SUBJECT_PREFIX", default_value = "inventory.events")]
    pub nats_subject_prefix: String,
    /// The stream's duplicate window (set when the relay creates it): a re-publish of an
    /// event id within it is dropped by the broker.
    #[arg(long, env = "INVENTORY_NATS_DUPLICATE_WINDOW_MS", default_value_t = 120_000)]
    pub nats_duplicate_window_ms: u64,
    /// How often the relay looks at each pool's outbox when no sale wakes it.
    #[arg(long, env = "INVENTORY_RELAY_INTERVAL_MS", default_value_t = 50)]
    pub relay_interval_ms: u64,
    /// Events per published batch (all sent, then the acknowledgements awaited); 1..=10,000.
    #[arg(long, env = "INVENTORY_RELAY_BATCH_MAX", default_value_t = 256)]
    pub relay_batch_max: u64,
    /// Redis URL of the buyer registry, where the allowances of items with a global
    /// per-user limit are kept (shared by every channel's agents). Without it, such items
    /// are refused with UNAVAILABLE. With --buyer-registry-cluster: seed nodes of a Redis
    /// Cluster, comma separated.
    #[arg(long, env = "INVENTORY_BUYER_REGISTRY_URL")]
    pub buyer_registry_url: Option<String>,
    /// The buyer registry is a Redis Cluster (--buyer-registry-url lists seed nodes).
    #[arg(long, env = "INVENTORY_BUYER_REGISTRY_CLUSTER")]
    pub buyer_registry_cluster: bool,
    /// Key prefix in the buyer registry (the same for every agent sharing it).
    #[arg(long, env = "INVENTORY_BUYER_REGISTRY_PREFIX", default_value = "inv:")]
    pub buyer_registry_prefix: String,
    /// How long a claim may stay unbound to a reservation before the sweeper settles it
    /// from the pool (an agent died between the claim and the pool call). At least twice
    /// --miss-wait-ms, so a running Acquire's claim is rarely settled under it; one that
    /// is (a starved process, a slow store) claims again before it answers.
    #[arg(long, env = "INVENTORY_BUYER_CLAIM_PENDING_MS", default_value_t = crate::buyers::limit::DEFAULT_PENDING_MS)]
    pub buyer_claim_pending_ms: u64,
    /// Test-only fault point: the process aborts (no cleanup, as under kill -9) when an
    /// Acquire of this user has claimed its global allowance and not yet touched the pool.
    #[arg(long, hide = true)]
    pub test_abort_after_claim: Option<String>,
    /// How long a basket's intent may stay pending before the sweeper undoes it (its
    /// driver crashed or is too slow): every line found reserved under the basket's
    /// derived keys is cancelled. Raised to at least twice --miss-wait-ms plus 1 s: a
    /// driver starts no line after half of it, so no line of a live basket is in flight
    /// when it is undone.
    #[arg(long, env = "INVENTORY_BASKET_PENDING_MS", default_value_t = DEFAULT_BASKET_PENDING_MS)]
    pub basket_pending_ms: u64,
    /// Test-only fault point: the process aborts (no cleanup, as under kill -9) when a
    /// basket of this user has reserved its first line and not yet the next.
    #[arg(long, hide = true)]
    pub test_abort_between_basket_lines: Option<String>,
    /// Test-only fault point: the process aborts (no cleanup, as under kill -9) between a
    /// move's take from one segment and its refill of another.
    #[arg(long, hide = true)]
    pub test_abort_after_move_take: bool,
    /// Test hook: this agent's wall clock runs this many ms ahead (behind if negative), for
    /// tests of the rule that a sale opens by the center's clock, never the agent's.
    #[arg(long, hide = true, env = "INVENTORY_TEST_CLOCK_SKEW_MS", default_value_t = 0, allow_hyphen_values = true)]
    pub test_clock_skew_ms: i64,
    /// Per-user Acquire rate (requests per second, GCRA) before RESOURCE_EXHAUSTED.
    #[arg(long, env = "INVENTORY_USER_RATE_PER_SEC", default_value_t = 5)]
    pub user_rate_per_sec: u32,
    /// Per-user burst above the rate.
    #[arg(long, env = "INVENTORY_USER_BURST", default_value_t = 10)]
    pub user_burst: u32,
    /// Requests in progress at once before new ones are shed with RESOURCE_EXHAUSTED.
    #[arg(long, env = "INVENTORY_MAX_CONCURRENT_REQUESTS", default_value_t = 1024)]
    pub max_concurrent_requests: usize,
}

impl AgentConfig {
    /// A configuration for tests: listeners on free ports, the given center and store.
    /// Where the memory store keeps its pools across a planned restart (None: nowhere).
    pub fn memory_state_path(&self) -> Option<PathBuf> {
        if self.no_memory_state || self.store != StoreKind::Memory || !self.redis_cluster.is_empty() {
            return None;
        }
        Some(
            self.memory_state_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("inventory-agent-{}.pools.json", self.channel))),
        )
    }

    pub fn for_tests(channel: &str, center: &str, store: StoreKind, redis_url: &str, redis_prefix: &str) -> Self {
        Self {
            channel: channel.to_owned(),
            agent_id: Some(format!("{channel}-test")),
            center: center.to_owned(),
            listen: "127.0.0.1:0".parse().expect("literal address"),
            http_listen: "127.0.0.1:0".parse().expect("literal address"),
            metrics_listen: None,
            store,
            redis_url: redis_url.to_owned(),
            redis_prefix: redis_prefix.to_owned(),
            memory_state_file: None,
            no_memory_state: true,
            item_lookups_per_sec: crate::items::DEFAULT_LOOKUPS_PER_SEC,
            redis_cluster: Vec::new(),
            redis_replica_acks: 0,
            redis_replica_ack_timeout_ms: 500,
            redis_connections: 4,
            allow_evicting_redis: false,
            require_durable_redis: false,
            redis_check_interval_ms: 100,
            redis_acquire_batch_max: 64,
            outbox_max_events: crate::store::DEFAULT_OUTBOX_MAX,
            metrics_per_item_limit: crate::agent::DEFAULT_METRICS_PER_ITEM_LIMIT,
            leader_ttl_ms: 1_000,
            rebalance_interval_ms: 20,
            heartbeat_interval_ms: 200,
            return_sustain_ms: 500,
            miss_wait_ms: 2_000,
            lease_margin_ms: 200,
            center_timeout_ms: 2_000,
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            center_token: None,
            center_token_file: None,
            backend_tokens: None,
            backend_tokens_file: None,
            insecure: true,
            allow_readable_token_files: false,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            center_ca: None,
            center_client_cert: None,
            center_client_key: None,
            buyer_registry_url: None,
            buyer_registry_cluster: false,
            buyer_registry_prefix: redis_prefix.to_owned(),
            buyer_claim_pending_ms: crate::buyers::limit::DEFAULT_PENDING_MS,
            test_abort_after_claim: None,
            basket_pending_ms: DEFAULT_BASKET_PENDING_MS,
            test_abort_between_basket_lines: None,
            test_abort_after_move_take: false,
            test_clock_skew_ms: 0,
            // Generous: end-to-end tests send many requests per user.
            user_rate_per_sec: 100_000,
            user_burst: 100_000,
            max_concurrent_requests: 4_096,
            nats_url: None,
            nats_stream: "INVENTORY_EVENTS".to_owned(),
            nats_subject_prefix: "inventory.events".to_owned(),
            nats_duplicate_window_ms: 120_000,
            relay_interval_ms: 20,
            relay_batch_max: 256,
        }
    }
}
