//! Builds the agent: opens the pool store (refusing a Redis that may evict keys),
//! registers with the center (resyncing pools), binds both listeners, and returns an
//! [`Application`] that knows its addresses.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inventory_core::{AgentId, Channel};
use inventory_net::edge;
use inventory_proto::v1::agent_server::AgentServer;
use tokio::net::TcpListener;

use crate::agent::{Agent, AgentSettings};
use crate::buyers::BuyerRegistry;
use crate::config::{AgentConfig, StoreKind};
use crate::link::CenterLink;
use crate::security::{BackendAuth, Security, UserLimits};
use crate::service::AgentService;
use crate::store::PoolStore;
use crate::store::health::StoreHealth;
use crate::store::memory::MemoryPoolStore;
use crate::store::redis::RedisPoolStore;
use crate::store::redis::persistence;
use crate::store::redis::policy::PolicyWatch;
use crate::workers;
use tonic::service::interceptor::InterceptedService;

/// Largest request the agent decodes: every Agent request is a few ids and numbers.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// How long a call may take to start answering before it answers DEADLINE_EXCEEDED.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long start-up keeps trying to reach the center.
const REGISTER_PATIENCE: Duration = Duration::from_secs(30);

pub struct Application {
    grpc: TcpListener,
    http: TcpListener,
    http_tls: Option<inventory_net::ServerConfig>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    agent: Arc<Agent>,
    security: Arc<Security>,
    server_tls: Option<tonic::transport::ServerTlsConfig>,
    max_concurrent: usize,
    rebalance_interval: Duration,
    heartbeat_interval: Option<Duration>,
    /// Which pool store, for the start-up line.
    store_kind: String,
    /// The memory store and where it keeps its pools across a graceful stop.
    memory_state: Option<(Arc<MemoryPoolStore>, PathBuf)>,
    /// The broker relay, with `--nats-url`.
    relay: Option<crate::relay::Relay>,
    /// The Redis nodes' eviction policy and memory, watched (None: no Redis).
    policy_watch: Option<PolicyWatch>,
}

impl Application {
    pub async fn build(config: AgentConfig) -> anyhow::Result<Self> {
        let acks_timeout = Duration::from_millis(config.redis_replica_ack_timeout_ms);
        let mut memory_state = None;
        let mut kept_items = Vec::new();
        let health: Arc<StoreHealth> = Arc::default();
        let mut watch = policy_watch(&config, &health);
        let store: Arc<dyn PoolStore> = match config.store {
            _ if !config.redis_cluster.is_empty() => {
                let store = RedisPoolStore::new_cluster(&config.redis_cluster, &config.redis_prefix).await?;
                let store = tune(store, &config, acks_timeout, &health);
                // Before anything else: an evicting store must not sell.
                watch.add("pool store", store.nodes()).await.map_err(anyhow::Error::msg)?;
                check_persistence(&store, &config).await?;
                Arc::new(store)
            }
            StoreKind::Memory => match config.memory_state_path() {
                Some(path) => {
                    let (mem, items) = MemoryPoolStore::load(&path, &config.center)
                        .map_err(|e| anyhow::anyhow!("cannot read the pools kept at {}: {e}", path.display()))?;
                    if !items.is_empty() {
                        tracing::info!(pools = items.len(), file = %path.display(), "pools kept from the last graceful stop");
                    }
                    kept_items = items;
                    let mem = Arc::new(mem.with_outbox_max(config.outbox_max_events));
                    memory_state = Some((Arc::clone(&mem), path));
                    mem
                }
                None => Arc::new(MemoryPoolStore::new().with_outbox_max(config.outbox_max_events)),
            },
            StoreKind::Redis => {
                let store =
                    RedisPoolStore::with_connections(&config.redis_url, &config.redis_prefix, config.redis_connections)
                        .await?;
                let store = tune(store, &config, acks_timeout, &health);
                watch.add("pool store", store.nodes()).await.map_err(anyhow::Error::msg)?;
                check_persistence(&store, &config).await?;
                Arc::new(store)
            }
        };
        let mut app = Self::build_with_store_keeping(config, store, kept_items, health, watch).await?;
        app.memory_state = memory_state;
        Ok(app)
    }

    /// Like [`Application::build`] with a given pool store (tests wrap stores to observe
    /// or break them).
    pub async fn build_with_store(config: AgentConfig, store: Arc<dyn PoolStore>) -> anyhow::Result<Self> {
        let health: Arc<StoreHealth> = Arc::default();
        let watch = policy_watch(&config, &health);
        Self::build_with_store_keeping(config, store, Vec::new(), health, watch).await
    }

    /// `kept_items`: items whose pools the store kept from an earlier run; the first
    /// registration resyncs them too, whether or not the center lists them as held.
    /// `health`: what the pool store and `watch` (which has checked the pool store's nodes
    /// if they are Redis) tell about the stores.
    async fn build_with_store_keeping(
        config: AgentConfig,
        store: Arc<dyn PoolStore>,
        kept_items: Vec<String>,
        health: Arc<StoreHealth>,
        mut watch: PolicyWatch,
    ) -> anyhow::Result<Self> {
        let channel = Channel::parse("channel", &config.channel)?;
        let agent_id = match &config.agent_id {
            Some(id) => AgentId::parse("agent_id", id)?,
            None => AgentId::parse("agent_id", &format!("{}-{}", channel, std::process::id()))?,
        };
        let security = Arc::new(Security::from_config(&config)?);
        let server_tls = Security::server_tls(&config)?;
        let link = CenterLink::new(
            &config.center,
            channel,
            agent_id,
            Duration::from_millis(config.center_timeout_ms),
            Duration::from_millis(config.lease_margin_ms),
            Security::center_tls(&config)?,
            security.tokens().center_token.as_deref(),
        )?;
        let settings = AgentSettings {
            miss_wait: Duration::from_millis(config.miss_wait_ms),
            return_sustain_ms: config.return_sustain_ms,
            leader_ttl_ms: config.leader_ttl_ms.max(30),
            item_lookups_per_sec: config.item_lookups_per_sec,
            outbox_max_events: config.outbox_max_events,
            metrics_per_item_limit: config.metrics_per_item_limit,
        };
        let limits = UserLimits::new(config.user_rate_per_sec, config.user_burst);
        // Bind before registering: an agent that cannot serve must not leave a registered
        // channel behind at the center.
        let grpc = inventory_net::bind(config.listen, "--listen").await?;
        let http = match config.metrics_listen {
            Some(addr) => inventory_net::bind(addr, "--metrics-listen").await?,
            None => inventory_net::bind(config.http_listen, "--http-listen").await?,
        };
        security.warn_if_insecure();
        let mut agent = Agent::new(store, link, settings, limits);
        agent.selling.store_health = health;
        if let Some(url) = &config.buyer_registry_url {
            let prefix = &config.buyer_registry_prefix;
            let registry = if config.buyer_registry_cluster {
                let seeds: Vec<String> =
                    url.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
                BuyerRegistry::connect_cluster(&seeds, prefix).await
            } else {
                BuyerRegistry::connect(url, prefix).await
            }
            .map_err(|e| {
                let shown: Vec<String> = url.split(',').map(inventory_net::without_credentials).collect();
                anyhow::anyhow!("--buyer-registry-url {}: cannot connect: {e}", shown.join(","))
            })?;
            watch.add("buyer registry", registry.nodes()).await.map_err(anyhow::Error::msg)?;
            agent.selling.global.registry = Some(registry);
            // A claim's pool call must end before the sweeper may settle it: above the
            // longest Acquire (its wait for a Borrow, twice for margin).
            agent.selling.global.pending_ms = config.buyer_claim_pending_ms.max(config.miss_wait_ms.saturating_mul(2));
            agent.selling.global.abort_after_claim.clone_from(&config.test_abort_after_claim);
        }
        // A driver starts no line after half the bound, and a line takes at most its wait
        // for a Borrow (plus the store calls): the bound stays above twice that.
        agent.baskets.pending_ms =
            config.basket_pending_ms.max(config.miss_wait_ms.saturating_add(500).saturating_mul(2));
        agent.baskets.abort_between_lines.clone_from(&config.test_abort_between_basket_lines);
        if config.test_clock_skew_ms != 0 {
            tracing::warn!(skew_ms = config.test_clock_skew_ms, "test hook: this agent's clock is skewed");
            agent.link.set_clock_skew_ms(config.test_clock_skew_ms);
        }
        if config.test_abort_after_move_take {
            agent.selling.abort_after_move_take = Some(crate::segmented::abort_process);
        }
        let agent = Arc::new(agent);
        agent.resync_at_next_registration(kept_items);
        // Replicas of the channel sharing this store: the first one leads; the others
        // follow (and sell under the leader's lease) until one of them takes over.
        agent.replicas.announce().await?;
        if agent.replicas.claim().await? {
            agent.role.set_leading(true);
            let deadline = Instant::now() + REGISTER_PATIENCE;
            loop {
                match agent.register().await {
                    Ok(_) => break,
                    // A configuration error does not heal by waiting: say so and stop.
                    Err(e @ crate::error::AgentError::CenterRefused(_)) => {
                        anyhow::bail!("cannot register with the center at {}: {e}", config.center)
                    }
                    Err(e) if Instant::now() < deadline => {
                        tracing::warn!(error = %e, "cannot register with the center yet; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        // Keep the claim meanwhile (the leadership loop is not running yet).
                        let _ = agent.replicas.claim().await;
                    }
                    Err(e) => anyhow::bail!("cannot register with the center at {}: {e}", config.center),
                }
            }
        } else {
            tracing::info!(channel = %agent.link.channel, "another replica leads the channel; following it");
            agent.replicas.step().await;
        }
        let relay = match &config.nats_url {
            Some(url) => Some(relay(&config, url, &agent).await?),
            None => None,
        };
        let http_tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => Some(inventory_net::server_config(cert, key)?),
            _ => None,
        };
        Ok(Self {
            http_tls,
            grpc_addr: grpc.local_addr()?,
            http_addr: http.local_addr()?,
            grpc,
            http,
            agent,
            security,
            server_tls,
            max_concurrent: config.max_concurrent_requests.max(1),
            rebalance_interval: Duration::from_millis(config.rebalance_interval_ms.max(1)),
            memory_state: None,
            relay,
            policy_watch: (!watch.is_empty()).then_some(watch),
            store_kind: store_description(&config),
            heartbeat_interval: (config.heartbeat_interval_ms > 0)
                .then(|| Duration::from_millis(config.heartbeat_interval_ms)),
        })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// Where `/metrics` and `/healthz` are served (`--metrics-listen`, else `--http-listen`).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn agent(&self) -> Arc<Agent> {
        Arc::clone(&self.agent)
    }

    /// Serves until `shutdown`; then stops taking Acquire, lets in-flight calls finish,
    /// gives unreserved units back to the center, sends a last report, and returns.
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = vec![
            tokio::spawn(workers::rebalancer(Arc::clone(&self.agent), self.rebalance_interval, stop_rx.clone())),
            tokio::spawn(workers::heartbeat(Arc::clone(&self.agent), self.heartbeat_interval, stop_rx.clone())),
            tokio::spawn(workers::watcher(Arc::clone(&self.agent), stop_rx.clone())),
            tokio::spawn(workers::limiter_gc(Arc::clone(&self.agent), stop_rx.clone())),
            tokio::spawn(workers::leadership(Arc::clone(&self.agent), stop_rx.clone())),
            tokio::spawn(workers::outbox_sizes(Arc::clone(&self.agent), stop_rx.clone())),
            tokio::spawn(workers::buyer_sweeper(Arc::clone(&self.agent), stop_rx.clone())),
            tokio::spawn(workers::basket_sweeper(Arc::clone(&self.agent), stop_rx.clone())),
            tokio::spawn(crate::security::reload_on_sighup(
                Arc::clone(&self.security),
                Arc::clone(&self.agent.link),
                stop_rx.clone(),
            )),
        ];
        if let Some(watch) = self.policy_watch.take() {
            tasks.push(tokio::spawn(watch.run(stop_rx.clone())));
        }
        if let Some(relay) = self.relay.take() {
            let (agent, leader) = (Arc::clone(&self.agent), Arc::clone(&self.agent));
            let pools = move || agent.items().iter().flat_map(|i| i.pools.clone()).collect();
            tasks.push(tokio::spawn(crate::relay::run(relay, pools, move || leader.is_leading(), stop_rx.clone())));
        }

        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<AgentServer<AgentService>>().await;
        tasks.push(tokio::spawn(follow_store_health(
            health,
            Arc::clone(&self.agent.selling.store_health),
            stop_rx.clone(),
        )));
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(inventory_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;

        let mut http_stop = stop_rx.clone();
        let http_stopped = async move {
            let _ = http_stop.wait_for(|s| *s).await;
        };
        let router = crate::http::router(Arc::clone(&self.agent));
        // The side port speaks TLS with the gRPC port's certificate when one is set.
        let http = inventory_net::serve_http(self.http, self.http_tls, router, http_stopped)?;

        let (drain_tx, mut drain_rx) = tokio::sync::watch::channel(false);
        let agent = Arc::clone(&self.agent);
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("agent draining: no new acquires");
            agent.role.start_draining();
            // Event streams never end by themselves: end them, or the server waits for them.
            agent.events.stop();
            let _ = drain_tx.send(true);
        });

        tracing::info!(
            grpc = %self.grpc_addr,
            http = %self.http_addr,
            channel = %self.agent.link.channel,
            store = %self.store_kind,
            center = %self.agent.link.url(),
            auth = self.security.mode(),
            leading = self.agent.is_leading(),
            "agent serving"
        );
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = self.server_tls {
            builder = builder.tls_config(tls.timeout(edge::PREFACE_TIMEOUT))?;
        }
        builder
            // Quiet connections are pinged, so a peer gone without a word is let go.
            .http2_keepalive_interval(Some(edge::HTTP2_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(edge::HTTP2_KEEPALIVE_TIMEOUT))
            .tcp_nodelay(true)
            // Outermost, so every call counts with the code its caller saw: RESOURCE_EXHAUSTED
            // from load shedding, DEADLINE_EXCEEDED from the timeout.
            .layer(self.agent.metrics.rpc.layer())
            // Acquire answers in milliseconds; anything slower is stuck. DEADLINE_EXCEEDED
            // says so, and that a retry with the same key is safe (not tonic's CANCELLED).
            .layer(edge::RequestTimeoutLayer::new(REQUEST_TIMEOUT, "idempotency_key"))
            .layer(
                tower::ServiceBuilder::new()
                    // Outermost: when the limit below is reached, refuse at once
                    // (RESOURCE_EXHAUSTED) rather than queue callers into their deadlines.
                    .load_shed()
                    // At most this many calls in progress across all connections.
                    .layer(tower::limit::GlobalConcurrencyLimitLayer::new(self.max_concurrent)),
            )
            .add_service(health_service)
            .add_service(reflection)
            // Backend tokens are checked before the handler parses anything.
            .add_service(InterceptedService::new(
                AgentServer::new(AgentService::new(Arc::clone(&self.agent)))
                    .max_decoding_message_size(MAX_MESSAGE_BYTES),
                BackendAuth(Arc::clone(&self.security)),
            ))
            .serve_with_incoming_shutdown(
                // TCP_NODELAY on every accepted socket, and a deadline on the HTTP/2 preface.
                edge::incoming(self.grpc),
                async move {
                    let _ = drain_rx.wait_for(|s| *s).await;
                },
            )
            .await?;

        // In-flight calls are done. Stop the workers, then give back what is unreserved.
        let _ = stop_tx.send(true);
        self.agent.events.stopped().await;
        for t in tasks {
            let _ = t.await;
        }
        let was_leading = self.agent.is_leading();
        if self.agent.replicas.hand_over().await {
            // Other replicas of the channel go on selling from the shared pools: their
            // stock stays; one of them leads (and talks to the center) from now on.
            tracing::info!(was_leading, "other replicas of the channel remain; stock stays in the pools");
        } else if was_leading {
            // No Acquire is taken any more: what the pools hold now is final, and the last
            // report says so (a later Reclaim may then put the unsold units back on sale).
            self.agent.drain().await;
        }
        // Operations still queued (a follower's, or a leader handing over) end before exit.
        self.agent.stocking.wait_idle().await;
        if let Some((mem, path)) = &self.memory_state {
            match mem.save(path, self.agent.link.url()) {
                Ok(n) => tracing::info!(pools = n, file = %path.display(), "pools kept for the next start"),
                Err(e) => {
                    tracing::error!(error = %e, file = %path.display(), "cannot keep the pools; the next start will find them lost")
                }
            }
        }
        http.await??;
        tracing::info!("agent stopped");
        Ok(())
    }
}

/// The JetStream relay of the pools' outboxes (`--nats-url`). A broker that is down at
/// start is no reason not to sell: the client connects in the background.
async fn relay(config: &AgentConfig, url: &str, agent: &Arc<Agent>) -> anyhow::Result<crate::relay::Relay> {
    use crate::relay::jetstream::{JetStreamSettings, JetStreamSink};
    let mut js = JetStreamSettings::new(url, &config.nats_stream, &config.nats_subject_prefix);
    js.duplicate_window = Duration::from_millis(config.nats_duplicate_window_ms.max(1));
    let sink = JetStreamSink::connect(js).await?;
    let settings = crate::relay::RelaySettings {
        interval: Duration::from_millis(config.relay_interval_ms.max(1)),
        batch_max: config.relay_batch_max.clamp(1, 10_000),
        ..Default::default()
    };
    tracing::info!(
        nats = %inventory_net::without_credentials(url),
        stream = %config.nats_stream,
        subjects = %format!("{}.>", config.nats_subject_prefix),
        "relaying reservation events to JetStream"
    );
    Ok(crate::relay::Relay::new(
        Arc::new(crate::relay::outbox::StoreOutbox(Arc::clone(&agent.store))),
        Arc::new(sink),
        Arc::clone(&agent.relay),
        settings,
    ))
}

/// The policy check of the agent's Redis nodes, empty until a store is added.
/// Whether the pool store keeps what it acknowledges (`store::redis::persistence`).
async fn check_persistence(store: &RedisPoolStore, config: &AgentConfig) -> anyhow::Result<()> {
    let nodes = store.nodes();
    persistence::check(&nodes, config.redis_replica_acks, config.require_durable_redis)
        .await
        .map_err(anyhow::Error::msg)
}

fn policy_watch(config: &AgentConfig, health: &Arc<StoreHealth>) -> PolicyWatch {
    PolicyWatch::new(
        Arc::clone(health),
        config.allow_evicting_redis,
        Duration::from_millis(config.redis_check_interval_ms),
    )
}

/// The gRPC health (the server's and the Agent service's) follows the stores' health:
/// NOT_SERVING while a node evicts or the pool store refuses writes.
async fn follow_store_health(
    reporter: tonic_health::server::HealthReporter,
    store: Arc<StoreHealth>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use tonic::server::NamedService;
    use tonic_health::ServingStatus;
    let mut changes = store.subscribe();
    loop {
        let status = if store.not_serving().is_some() { ServingStatus::NotServing } else { ServingStatus::Serving };
        reporter.set_service_status("", status).await;
        reporter.set_service_status(<AgentServer<AgentService> as NamedService>::NAME, status).await;
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The pool store in use, for the start-up line (no credentials: Redis URLs may carry them).
fn store_description(config: &AgentConfig) -> String {
    if !config.redis_cluster.is_empty() {
        return format!("redis cluster ({} seed nodes)", config.redis_cluster.len());
    }
    match config.store {
        StoreKind::Redis => format!("redis at {}", inventory_net::without_credentials(&config.redis_url)),
        StoreKind::Memory => match config.memory_state_path() {
            Some(path) => format!("memory (kept across graceful restarts in {})", path.display()),
            None => "memory".to_owned(),
        },
    }
}

/// The flags every Redis pool store takes, whether on one server or a cluster.
fn tune(
    store: RedisPoolStore,
    config: &AgentConfig,
    acks_timeout: Duration,
    health: &Arc<StoreHealth>,
) -> RedisPoolStore {
    store
        .with_replica_acks(config.redis_replica_acks, acks_timeout)
        .with_acquire_batch_max(config.redis_acquire_batch_max)
        .with_outbox_max(config.outbox_max_events)
        .with_health(Arc::clone(health))
}
