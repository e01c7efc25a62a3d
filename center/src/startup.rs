//! Builds the center: opens the ledger, binds both listeners, and returns an
//! [`Application`] that knows its addresses (tests bind port 0 and read them back).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use inventory_net::edge;
use inventory_proto::v1::admin_server::AdminServer;
use inventory_proto::v1::center_server::CenterServer;
use tokio::net::TcpListener;

use crate::config::CenterConfig;
use crate::events::EventHub;
use crate::health::Health;
use crate::security::{AgentAuth, OperatorAuth, Security};
use crate::service::admin::AdminService;
use crate::service::center::{CenterService, FaultHooks, LeaseSettings};
use crate::store::{self, LedgerStore};
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;

/// Largest request the center decodes; its largest message is a heartbeat with a few
/// thousand pools.
const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// How long a call may take to start answering before it answers DEADLINE_EXCEEDED.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long in-flight calls may run on after the shutdown signal: below the 5 s a
/// supervisor (or an agent waiting to reconnect) is promised.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

pub struct Application {
    grpc: TcpListener,
    http: TcpListener,
    /// `--metrics-listen`: the probes on a listener of their own.
    metrics: Option<TcpListener>,
    http_tls: Option<inventory_net::ServerConfig>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    store: Arc<dyn LedgerStore>,
    events: EventHub,
    faults: Arc<FaultHooks>,
    lease: LeaseSettings,
    auto_reclaim_after_ms: u64,
    prune_interval: Duration,
    request_max_age_ms: u64,
    metrics_per_item_limit: usize,
    limits: Arc<crate::limits::ChannelLimits>,
    security: Arc<Security>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    /// The database in use, without credentials, for the start-up line.
    database: String,
}

impl Application {
    pub async fn build(config: CenterConfig) -> anyhow::Result<Self> {
        let security = Arc::new(Security::from_config(&config)?);
        let tls = Security::tls(&config)?;
        // Before the ledger is opened: a refused database is left as it was (not migrated).
        crate::replication::check(&config.database_url, config.require_synchronous_replication).await?;
        let ledger = store::connect(&config.database_url).await?;
        let faults = Arc::new(FaultHooks::default());
        // On PostgreSQL, events reach the watchers of every center replica.
        let events = match ledger.dialect() {
            store::Dialect::Postgres => {
                EventHub::postgres(ledger.pool(), &config.database_url, Arc::clone(&faults.events)).await?
            }
            store::Dialect::Sqlite => EventHub::new(),
        };
        let store: Arc<dyn LedgerStore> = Arc::new(ledger);
        let grpc = inventory_net::bind(config.listen, "--listen").await?;
        let http = inventory_net::bind(config.http_listen, "--http-listen").await?;
        let metrics = match config.metrics_listen {
            Some(addr) => Some(inventory_net::bind(addr, "--metrics-listen").await?),
            None => None,
        };
        security.warn_if_insecure();
        let http_tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => Some(inventory_net::server_config(cert, key)?),
            _ => None,
        };
        Ok(Self {
            database: inventory_net::without_credentials(&config.database_url),
            http_tls,
            grpc_addr: grpc.local_addr()?,
            http_addr: http.local_addr()?,
            metrics_addr: metrics.as_ref().map(TcpListener::local_addr).transpose()?,
            grpc,
            http,
            metrics,
            store,
            events,
            faults,
            lease: LeaseSettings { lease_ttl_ms: config.lease_ttl_ms, reclaim_grace_ms: config.reclaim_grace_ms },
            auto_reclaim_after_ms: config.auto_reclaim_after_ms,
            prune_interval: Duration::from_millis(config.prune_interval_ms),
            request_max_age_ms: config.request_max_age_ms,
            metrics_per_item_limit: config.metrics_per_item_limit,
            limits: Arc::new(crate::limits::ChannelLimits::new(
                config.channel_rate_per_sec,
                config.channel_burst,
                config.max_watch_streams_per_channel,
            )),
            security,
            tls,
        })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The console's address (and the probes', unless they have their own).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Where `/metrics` and `/healthz` are served: `--metrics-listen`, or the HTTP port.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr.unwrap_or(self.http_addr)
    }

    /// Fault injection handles, for tests of failure paths.
    pub fn faults(&self) -> Arc<FaultHooks> {
        Arc::clone(&self.faults)
    }

    pub fn store(&self) -> Arc<dyn LedgerStore> {
        Arc::clone(&self.store)
    }

    /// Serves until `shutdown` completes, then drains in-flight calls and returns. Open
    /// `WatchChannel` streams end at once; whatever is still running after
    /// [`SHUTDOWN_GRACE`] is dropped, so the center stops within that bound.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<CenterServer<CenterService>>().await;
        health.set_serving::<AdminServer<AdminService>>().await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(inventory_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        // The ledger sampled every few seconds: the console's history, stuck drift, and
        // grants the ledger lost re-learned from the pools' reports.
        let history = Arc::new(crate::history::History::new(crate::history::HistoryConfig::default()));
        crate::history::History::spawn_sampler(&history, Arc::clone(&self.store));
        let center = CenterService::new(
            Arc::clone(&self.store),
            self.events.clone(),
            self.lease,
            self.faults,
            Arc::clone(&history),
            stop_rx.clone(),
        )
        .with_request_max_age_ms(self.request_max_age_ms)
        .with_limits(Arc::clone(&self.limits));
        let admin = AdminService::new(Arc::clone(&self.store), self.events.clone(), self.lease, Arc::clone(&history));

        let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let rpc = crate::http::rpc_metrics();
        let (verdicts, db_health) = Health::channel();
        let routes = crate::http::routes_with_history(
            Arc::clone(&self.store),
            Arc::new(std::sync::atomic::AtomicU64::new(0)),
            history,
            rpc.clone(),
            db_health,
            self.metrics_per_item_limit,
        );
        // The console shows the ledger: the operator token, as Admin asks. The probes stay
        // open, on the console's port or on their own.
        let console = crate::http_auth::require_operator(routes.console, Arc::clone(&self.security));
        let (main_router, probes) = match self.metrics {
            Some(listener) => (console, Some((listener, routes.probes))),
            None => (console.merge(routes.probes), None),
        };
        // The HTTP ports speak TLS with the gRPC port's certificate when one is set.
        let mut http_servers =
            vec![inventory_net::serve_http(self.http, self.http_tls.clone(), main_router, stopped(stop_rx.clone()))?];
        if let Some((listener, router)) = probes {
            http_servers.push(inventory_net::serve_http(listener, self.http_tls, router, stopped(stop_rx.clone()))?);
        }

        let reclaimer = (self.auto_reclaim_after_ms > 0).then(|| {
            tokio::spawn(crate::reclaimer::run(
                Arc::clone(&self.store),
                self.events.clone(),
                self.auto_reclaim_after_ms,
                stop_rx.clone(),
            ))
        });

        let pruner = tokio::spawn(crate::pruner::run(
            Arc::clone(&self.store),
            self.prune_interval,
            self.request_max_age_ms,
            stop_rx.clone(),
        ));
        // The empty name is the server as a whole.
        let served = vec!["", CenterServer::<CenterService>::NAME, AdminServer::<AdminService>::NAME];
        let pinger =
            tokio::spawn(crate::health::run(Arc::clone(&self.store), health, served, verdicts, stop_rx.clone()));
        let closer = tokio::spawn(crate::closer::run(Arc::clone(&self.store), self.events.clone(), stop_rx.clone()));
        let reloader = tokio::spawn(crate::security::reload_on_sighup(Arc::clone(&self.security), stop_rx.clone()));

        tracing::info!(
            grpc = %self.grpc_addr,
            http = %self.http_addr,
            metrics = %self.metrics_addr.unwrap_or(self.http_addr),
            database = %self.database,
            auth = if self.security.insecure() { "insecure" } else { "tokens" },
            tls = self.tls.is_some(),
            "center serving"
        );
        let mut grpc_stop = stop_rx.clone();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = self.tls {
            builder = builder.tls_config(tls.timeout(edge::PREFACE_TIMEOUT))?;
        }
        let grpc = builder
            // Quiet connections are pinged, so a peer gone without a word is let go.
            .http2_keepalive_interval(Some(edge::HTTP2_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(edge::HTTP2_KEEPALIVE_TIMEOUT))
            // Around every service, health and reflection included, and outside the timeout
            // below, so a call it cuts off counts as DEADLINE_EXCEEDED (what the caller saw).
            .layer(rpc.layer())
            // A stuck call must not hold a connection forever; WatchChannel streams are
            // exempt because the deadline covers only the call's start. DEADLINE_EXCEEDED
            // (not tonic's CANCELLED): the outcome is unknown, a retry with the same id safe.
            .layer(edge::RequestTimeoutLayer::new(REQUEST_TIMEOUT, "request_id"))
            .add_service(health_service)
            .add_service(reflection)
            // Tokens are checked before any handler runs; health and reflection stay open
            // for probes.
            .add_service(InterceptedService::new(
                CenterServer::new(center).max_decoding_message_size(MAX_MESSAGE_BYTES),
                AgentAuth(Arc::clone(&self.security)),
            ))
            .add_service(InterceptedService::new(
                AdminServer::new(admin).max_decoding_message_size(MAX_MESSAGE_BYTES),
                OperatorAuth(Arc::clone(&self.security)),
            ))
            .serve_with_incoming_shutdown(
                // TCP_NODELAY on every accepted socket, and a deadline on the HTTP/2 preface.
                edge::incoming(self.grpc),
                async move {
                    let _ = grpc_stop.wait_for(|s| *s).await;
                },
            );
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("center shutting down");
            let _ = stop_tx.send(true);
        });

        // From the shutdown signal on, everything below shares one deadline.
        tokio::pin!(grpc);
        let mut stopping = stop_rx;
        let mut grpc_done = false;
        tokio::select! {
            served = &mut grpc => {
                served?;
                grpc_done = true;
            }
            _ = stopping.wait_for(|s| *s) => {}
        }
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        if !grpc_done {
            match tokio::time::timeout_at(deadline, &mut grpc).await {
                Ok(served) => served?,
                Err(_) => tracing::warn!(
                    grace_ms = SHUTDOWN_GRACE.as_millis(),
                    "calls still running after the shutdown grace; dropped"
                ),
            }
        }
        for mut worker in reclaimer.into_iter().chain([pruner, pinger, closer, reloader]) {
            if tokio::time::timeout_at(deadline, &mut worker).await.is_err() {
                worker.abort();
            }
        }
        for mut http in http_servers {
            match tokio::time::timeout_at(deadline, &mut http).await {
                Ok(served) => served??,
                Err(_) => {
                    tracing::warn!("http connections still open after the shutdown grace; dropped");
                    http.abort();
                }
            }
        }
        Ok(())
    }
}
