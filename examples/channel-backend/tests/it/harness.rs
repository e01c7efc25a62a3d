//! Real centers and agents for the client's and the backend's tests: a center in this
//! process on a fresh PostgreSQL database; agents in this process, or as child processes
//! (this test binary run again as an agent) where a test kills one with -9.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use inventory_agent::config::StoreKind;
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_center::{Application as CenterApp, CenterConfig};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient as RawAgent;
use inventory_test_support::{TestDatabase, free_port, wait_until};
use tonic::transport::Channel;

/// Set in a child process: the agent's command line, one argument per line.
const AGENT_ARGS_ENV: &str = "CHANNEL_BACKEND_IT_AGENT_ARGS";

/// Not a test: the entry point of an agent child process (see [`AgentProcess`]). Without
/// the variable it returns at once.
#[test]
fn agent_process_entry() {
    let Ok(args) = std::env::var(AGENT_ARGS_ENV) else { return };
    use clap::Parser;
    let config = AgentConfig::parse_from(std::iter::once("inventory-agent").chain(args.lines()));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let app = AgentApp::build(config).await.expect("agent starts");
        app.run_until(std::future::pending()).await.expect("agent runs");
    });
}

pub struct Center {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
    _db: TestDatabase,
}

impl Center {
    pub async fn start() -> Self {
        let db = TestDatabase::create().await;
        let app = CenterApp::build(CenterConfig::for_tests(&db.url)).await.expect("center starts");
        let addr = app.grpc_addr();
        let task = tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("center runs") });
        Center { url: format!("http://{addr}"), task, _db: db }
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::connect(self.url.clone()).await.expect("connect admin")
    }

    pub async fn create_item(&self, item: &str, total: u64, per_user_limit: u64, wm: (u64, u64, u64)) {
        self.admin()
            .await
            .create_item(pb::CreateItemRequest {
                item_id: item.into(),
                total,
                per_user_limit,
                reservation_ttl_ms: 300_000,
                watermarks: Some(pb::Watermarks { low: wm.0, high: wm.1, batch: wm.2 }),
                ..Default::default()
            })
            .await
            .expect("create item");
    }

    pub async fn ledger(&self, item: &str) -> pb::GetItemResponse {
        self.admin().await.get_item(pb::GetItemRequest { item_id: item.into() }).await.expect("get item").into_inner()
    }

    pub async fn reconcile(&self) -> pb::ReconcileResponse {
        self.admin().await.reconcile(pb::ReconcileRequest::default()).await.expect("reconcile").into_inner()
    }

    /// Waits until no channel drifts and the ledger is clean.
    pub async fn await_quiescence(&self) -> pb::ReconcileResponse {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.reconcile().await;
            if r.ok && r.drifts.is_empty() {
                return r;
            }
            assert!(std::time::Instant::now() < deadline, "ledger never settled: {r:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Center {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub enum Store {
    Memory,
    Redis { url: String, prefix: String },
}

pub fn agent_config(center: &str, channel: &str, store: &Store) -> AgentConfig {
    match store {
        Store::Memory => AgentConfig::for_tests(channel, center, StoreKind::Memory, "redis://unused", "unused:"),
        Store::Redis { url, prefix } => AgentConfig::for_tests(channel, center, StoreKind::Redis, url, prefix),
    }
}

/// An agent in this process.
pub struct LocalAgent {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl LocalAgent {
    pub async fn start(config: AgentConfig) -> Self {
        let app = AgentApp::build(config).await.expect("agent starts");
        let addr = app.grpc_addr();
        let task = tokio::spawn(app.run_until(std::future::pending()));
        LocalAgent { addr, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn raw(&self) -> RawAgent<Channel> {
        RawAgent::connect(self.url()).await.expect("connect agent")
    }
}

impl Drop for LocalAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An agent replica as a child process, for kill -9.
pub struct AgentProcess {
    pub addr: SocketAddr,
    child: tokio::process::Child,
}

impl AgentProcess {
    pub async fn spawn(center: &str, channel: &str, agent_id: &str, store: &Store, extra: &[&str]) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
        let mut args: Vec<String> = ["--channel", channel, "--agent-id", agent_id, "--center", center]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect();
        args.extend(["--listen".into(), addr.to_string(), "--http-listen".into(), "127.0.0.1:0".into()]);
        for flag in [
            "--rebalance-interval-ms=20",
            "--heartbeat-interval-ms=200",
            "--return-sustain-ms=500",
            "--lease-margin-ms=200",
            "--insecure",
        ] {
            args.push(flag.into());
        }
        match store {
            Store::Memory => args.extend(["--store", "memory", "--no-memory-state"].map(String::from)),
            Store::Redis { url, prefix } => {
                args.extend(["--store", "redis", "--redis-url", url, "--redis-prefix", prefix].map(|s| s.to_owned()))
            }
        }
        let child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "harness::agent_process_entry", "--nocapture", "--test-threads", "1"])
            .env(AGENT_ARGS_ENV, args.join("\n"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the agent process");
        let ready = wait_until(Duration::from_secs(30), || async move {
            let Ok(channel) =
                tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await
            else {
                return false;
            };
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.is_ok()
        })
        .await;
        assert!(ready, "agent process on {addr} never became healthy");
        AgentProcess { addr, child }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn raw(&self) -> RawAgent<Channel> {
        RawAgent::connect(self.url()).await.expect("connect agent")
    }

    pub async fn kill9(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("reap");
    }
}

pub async fn stock(agent: &mut RawAgent<Channel>, item: &str) -> pb::GetStockResponse {
    agent.get_stock(pb::GetStockRequest { item_id: item.into() }).await.expect("get stock").into_inner()
}
