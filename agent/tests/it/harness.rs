//! Starts real centers and agents for end-to-end tests: centers in-process on a fresh
//! database, agents in-process (or as child processes when a test kills them).

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use inventory_agent::agent::Agent;
use inventory_agent::config::StoreKind;
use inventory_agent::store::{
    AcquireArgs, AcquireResult, ChannelOp, ChannelReply, EventPage, ExtendResult, MoveIntent, OutboxStats, PoolKey,
    PoolSnapshot, PoolStore, Reservation, ReservationRef, ReservationState, StoreError, Transition,
};
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_center::{Application as CenterApp, CenterConfig};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TestDatabase, TestSqlite, free_port, wait_until};
use tonic::transport::Channel;

pub enum Db {
    Pg(TestDatabase),
    Lite(TestSqlite),
    /// Another center's database (this center is a replica).
    Shared(String),
}

pub struct Center {
    pub url: String,
    pub http_addr: SocketAddr,
    pub faults: Arc<inventory_center::service::center::FaultHooks>,
    task: tokio::task::JoinHandle<()>,
    _db: Db,
}

impl Center {
    pub async fn start_postgres() -> Self {
        Self::start(Db::Pg(TestDatabase::create().await), |_| {}).await
    }

    pub async fn start_sqlite() -> Self {
        Self::start(Db::Lite(TestSqlite::create()), |_| {}).await
    }

    pub async fn start(db: Db, tweak: impl FnOnce(&mut CenterConfig)) -> Self {
        let url = match &db {
            Db::Pg(d) => d.url.clone(),
            Db::Lite(d) => d.url.clone(),
            Db::Shared(url) => url.clone(),
        };
        let mut config = CenterConfig::for_tests(&url);
        tweak(&mut config);
        let app = CenterApp::build(config).await.expect("center starts");
        let (addr, http_addr, faults) = (app.grpc_addr(), app.http_addr(), app.faults());
        let task = tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("center runs") });
        Self { url: format!("http://{addr}"), http_addr, faults, task, _db: db }
    }

    /// Another center process on the same database (the first one keeps it alive).
    pub async fn replica(&self) -> Self {
        let url = match &self._db {
            Db::Pg(d) => d.url.clone(),
            Db::Lite(d) => d.url.clone(),
            Db::Shared(url) => url.clone(),
        };
        Self::start(Db::Shared(url), |_| {}).await
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::connect(self.url.clone()).await.expect("connect admin")
    }

    /// Creates an item with explicit default watermarks.
    pub async fn create_item(&self, item: &str, total: u64, per_user_limit: u64, wm: (u64, u64, u64)) {
        self.create_segmented_item(item, total, per_user_limit, wm, 0).await;
    }

    /// Like [`Center::create_item`], the item's stock in each channel split over `segments`
    /// pools (0: the center's default).
    pub async fn create_segmented_item(
        &self,
        item: &str,
        total: u64,
        per_user_limit: u64,
        wm: (u64, u64, u64),
        segments: u32,
    ) {
        self.admin()
            .await
            .create_item(pb::CreateItemRequest {
                item_id: item.into(),
                total,
                per_user_limit,
                reservation_ttl_ms: 300_000,
                watermarks: Some(pb::Watermarks { low: wm.0, high: wm.1, batch: wm.2 }),
                segments,
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

    /// Waits until every channel's last report matches what it holds (no drift) and the
    /// ledger is clean: the quiescent state the invariants talk about.
    pub async fn await_quiescence(&self) -> pb::ReconcileResponse {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
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

#[derive(Clone)]
pub enum StoreSpec {
    Memory,
    Redis { url: String, prefix: String },
}

pub fn agent_config(center: &str, channel: &str, store: &StoreSpec) -> AgentConfig {
    match store {
        StoreSpec::Memory => AgentConfig::for_tests(channel, center, StoreKind::Memory, "redis://unused", "unused:"),
        StoreSpec::Redis { url, prefix } => AgentConfig::for_tests(channel, center, StoreKind::Redis, url, prefix),
    }
}

/// An agent running in this process.
pub struct LocalAgent {
    pub addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub agent: Arc<Agent>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl LocalAgent {
    pub async fn start(center: &str, channel: &str, store: &StoreSpec) -> Self {
        Self::start_with(agent_config(center, channel, store), None).await
    }

    pub async fn start_with(config: AgentConfig, store: Option<Arc<dyn PoolStore>>) -> Self {
        let app = match store {
            Some(s) => AgentApp::build_with_store(config, s).await,
            None => AgentApp::build(config).await,
        }
        .expect("agent starts");
        let (addr, http_addr, agent) = (app.grpc_addr(), app.http_addr(), app.agent());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(app.run_until(async move {
            let _ = rx.await;
        }));
        Self { addr, http_addr, agent, stop: Some(tx), task: Some(task) }
    }

    pub async fn client(&self) -> AgentClient<Channel> {
        AgentClient::connect(format!("http://{}", self.addr)).await.expect("connect agent")
    }

    /// Graceful stop (what SIGTERM does): drain, return unreserved units, last report.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("agent task").expect("agent stops cleanly");
        }
    }
}

impl Drop for LocalAgent {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// An agent running as a child process (`inventory-agent`), for kill -9 and signals.
pub struct AgentProcess {
    pub addr: SocketAddr,
    pub child: tokio::process::Child,
}

impl AgentProcess {
    pub async fn spawn(center: &str, channel: &str, store: &StoreSpec, port: Option<u16>) -> Self {
        Self::spawn_with(center, channel, store, port, &format!("{channel}-proc"), &[]).await
    }

    /// One replica of a channel: its own agent id, and extra flags.
    pub async fn spawn_with(
        center: &str,
        channel: &str,
        store: &StoreSpec,
        port: Option<u16>,
        agent_id: &str,
        extra: &[&str],
    ) -> Self {
        Self::spawn_logging(center, channel, store, port, agent_id, extra, None).await
    }

    /// Like [`AgentProcess::spawn_with`], its log (stderr) written to `log` if given.
    pub async fn spawn_logging(
        center: &str,
        channel: &str,
        store: &StoreSpec,
        port: Option<u16>,
        agent_id: &str,
        extra: &[&str],
        log: Option<std::fs::File>,
    ) -> Self {
        let port = port.unwrap_or_else(free_port);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory-agent"));
        cmd.args(["--channel", channel, "--agent-id", agent_id, "--center", center])
            .args(extra)
            .args(["--listen", &addr.to_string()])
            .args(if extra.contains(&"--http-listen") { &[][..] } else { &["--http-listen", "127.0.0.1:0"][..] })
            .args(["--rebalance-interval-ms", "20", "--heartbeat-interval-ms", "200", "--return-sustain-ms", "500"])
            .args(["--lease-margin-ms", "200", "--insecure"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(match log {
                Some(file) => Stdio::from(file),
                None => Stdio::inherit(),
            })
            .kill_on_drop(true);
        match store {
            // Pools kept across a restart only where a test asks for it (a file of its own).
            StoreSpec::Memory if extra.contains(&"--memory-state-file") => cmd.args(["--store", "memory"]),
            StoreSpec::Memory => cmd.args(["--store", "memory", "--no-memory-state"]),
            StoreSpec::Redis { url, prefix } => {
                cmd.args(["--store", "redis", "--redis-url", url, "--redis-prefix", prefix])
            }
        };
        let child = cmd.spawn().expect("spawn inventory-agent");
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
        Self { addr, child }
    }

    pub async fn client(&self) -> AgentClient<Channel> {
        AgentClient::connect(format!("http://{}", self.addr)).await.expect("connect agent")
    }

    pub async fn kill9(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("reap");
    }

    pub async fn sigterm_and_wait(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running").to_string();
        let status = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill");
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("exits after SIGTERM")
            .expect("wait")
    }
}

pub fn acquire_req(item: &str, user: &str, quantity: u64, key: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        item_id: item.into(),
        user_id: user.into(),
        quantity,
        idempotency_key: key.into(),
        ..Default::default()
    }
}

pub async fn stock(client: &mut AgentClient<Channel>, item: &str) -> pb::GetStockResponse {
    client.get_stock(pb::GetStockRequest { item_id: item.into() }).await.expect("get stock").into_inner()
}

/// A plain HTTP/1.1 GET over TCP (enough for /metrics; no client crate needed).
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    let (status, body) = http_status(addr, path).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// The status code and body of a plain HTTP/1.1 GET (any status).
pub async fn http_status(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect http");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read response");
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("http response");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    (status, body.to_owned())
}

/// `CONFIG SET name value` on a private redis-server.
pub async fn config_set(redis: &inventory_test_support::RedisServer, name: &str, value: &str) {
    let client = redis::Client::open(redis.url.as_str()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect to the private redis");
    let _: () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query_async(&mut conn).await.expect("CONFIG SET");
}

/// The value of one sample in Prometheus text, by its full name with labels.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

/// Codes the Agent API tells callers to retry with the same idempotency key, and
/// CANCELLED, which a client sees when the connection dies mid-call (outcome unknown).
pub fn retryable(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

/// One buyer as a channel backend would behave: Acquire one unit with its own key, retried
/// (same key) while the agent answers with a retryable code, then Confirm, retried the
/// same way. Returns the confirmed reservation id, or None when sold out. Bounded: at most
/// `attempts` tries of each call, 100 ms apart.
pub async fn buy_one(client: &mut AgentClient<Channel>, item: &str, user: &str, attempts: u32) -> Option<String> {
    buy_one_via(std::slice::from_mut(client), item, user, attempts).await
}

/// Like [`buy_one`] through a channel's replicas, as a load balancer would: every retry
/// goes to the next replica (with the same idempotency key).
pub async fn buy_one_via(
    clients: &mut [AgentClient<Channel>],
    item: &str,
    user: &str,
    attempts: u32,
) -> Option<String> {
    let key = format!("key-{user}");
    let mut reservation = None;
    let start = user.bytes().map(usize::from).sum::<usize>();
    for attempt in 0..attempts as usize {
        let client = &mut clients[(start + attempt) % clients.len()];
        match client.acquire(acquire_req(item, user, 1, &key)).await {
            Ok(r) => {
                let r = r.into_inner();
                match r.outcome() {
                    pb::AcquireOutcome::Reserved => reservation = Some(r.reservation_id),
                    pb::AcquireOutcome::SoldOut => return None,
                    other => panic!("{user}: unexpected outcome {other:?}"),
                }
                break;
            }
            Err(s) if retryable(s.code()) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(s) => panic!("{user}: acquire failed: {s:?}"),
        }
    }
    let id = reservation.unwrap_or_else(|| panic!("{user}: acquire still failing after {attempts} attempts"));
    for attempt in 0..attempts as usize {
        let client = &mut clients[(start + attempt) % clients.len()];
        match client.confirm(pb::ConfirmRequest { item_id: item.into(), reservation_id: id.clone() }).await {
            Ok(r) => {
                assert_eq!(r.into_inner().state(), pb::ReservationState::Confirmed, "{user}: confirm of {id}");
                return Some(id);
            }
            Err(s) if retryable(s.code()) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(s) => panic!("{user}: confirm of {id} failed (an acknowledged reservation was lost?): {s:?}"),
        }
    }
    panic!("{user}: confirm of {id} still failing after {attempts} attempts");
}

/// Any pool store (a memory store by default) with every call counted by operation; it
/// can also hold Acquire calls at a gate. Lets tests see which answers never reach the
/// store, keep calls "in progress", and what background work costs in store calls.
pub struct ObservedStore {
    inner: Arc<dyn PoolStore>,
    calls: DashMap<&'static str, u64>,
    /// Snapshots per item id (whole reads of its pool).
    snapshots_of: DashMap<String, u64>,
    open: tokio::sync::watch::Sender<bool>,
}

impl ObservedStore {
    /// A memory store; counts, never holds.
    pub fn counting() -> Self {
        Self::over(Arc::new(inventory_agent::store::memory::MemoryPoolStore::new()))
    }

    /// A memory store that holds every Acquire until [`ObservedStore::open_gate`].
    pub fn gated() -> Self {
        let store = Self::counting();
        store.open.send_replace(false);
        store
    }

    /// `inner`, counted; never holds.
    pub fn over(inner: Arc<dyn PoolStore>) -> Self {
        Self { inner, calls: DashMap::new(), snapshots_of: DashMap::new(), open: tokio::sync::watch::channel(true).0 }
    }

    pub fn open_gate(&self) {
        self.open.send_replace(true);
    }

    /// Holds the Acquires that arrive from now on, until [`ObservedStore::open_gate`].
    pub fn close_gate(&self) {
        self.open.send_replace(false);
    }

    fn count(&self, op: &'static str) {
        *self.calls.entry(op).or_default() += 1;
    }

    /// Calls per operation so far.
    pub fn calls(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.calls.iter().map(|e| (*e.key(), *e.value())).collect()
    }

    /// Whole reads (snapshots) of each item's pool so far.
    pub fn snapshots_of(&self) -> std::collections::BTreeMap<String, u64> {
        self.snapshots_of.iter().map(|e| (e.key().clone(), *e.value())).collect()
    }

    /// Acquire calls that reached the store (counted before the gate).
    pub fn acquire_calls(&self) -> u64 {
        self.calls.get("acquire").map_or(0, |n| *n)
    }
}

#[async_trait::async_trait]
impl PoolStore for ObservedStore {
    async fn acquire(&self, pool: &PoolKey, args: &AcquireArgs) -> Result<AcquireResult, StoreError> {
        self.count("acquire");
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|o| *o).await;
        self.inner.acquire(pool, args).await
    }
    async fn confirm(&self, pool: &PoolKey, id: &str) -> Result<Transition, StoreError> {
        self.count("confirm");
        self.inner.confirm(pool, id).await
    }
    async fn cancel(&self, pool: &PoolKey, id: &str) -> Result<Transition, StoreError> {
        self.count("cancel");
        self.inner.cancel(pool, id).await
    }
    async fn expire_due(&self, pool: &PoolKey, max: u64) -> Result<u64, StoreError> {
        self.count("expire_due");
        self.inner.expire_due(pool, max).await
    }
    async fn raise_floor(&self, pool: &PoolKey, floor: u64) -> Result<(), StoreError> {
        self.inner.raise_floor(pool, floor).await
    }
    fn floor(&self, pool: &PoolKey) -> u64 {
        self.inner.floor(pool)
    }
    async fn refill(&self, pool: &PoolKey, grant_id: &str, units: u64, epoch: u64) -> Result<bool, StoreError> {
        self.count("refill");
        self.inner.refill(pool, grant_id, units, epoch).await
    }
    async fn refill_existing(&self, pool: &PoolKey, id: &str, units: u64, epoch: u64) -> Result<bool, StoreError> {
        self.count("refill");
        self.inner.refill_existing(pool, id, units, epoch).await
    }
    async fn take_for_return(&self, pool: &PoolKey, id: &str, max: u64, epoch: u64) -> Result<u64, StoreError> {
        self.count("take_for_return");
        self.inner.take_for_return(pool, id, max, epoch).await
    }
    async fn untake(&self, pool: &PoolKey, take_id: &str, epoch: u64) -> Result<u64, StoreError> {
        self.count("untake");
        self.inner.untake(pool, take_id, epoch).await
    }
    async fn raise_fence(&self, pool: &PoolKey, epoch: u64) -> Result<u64, StoreError> {
        self.count("raise_fence");
        self.inner.raise_fence(pool, epoch).await
    }
    async fn snapshot(&self, pool: &PoolKey) -> Result<PoolSnapshot, StoreError> {
        self.count("snapshot");
        *self.snapshots_of.entry(pool.item_id.to_string()).or_default() += 1;
        self.inner.snapshot(pool).await
    }
    async fn stamps(&self, pools: &[PoolKey]) -> Vec<Result<inventory_agent::store::PoolStamp, StoreError>> {
        *self.calls.entry("stamped pools").or_default() += pools.len() as u64;
        self.inner.stamps(pools).await
    }
    async fn reservation_state(&self, pool: &PoolKey, id: &str) -> Result<Option<ReservationState>, StoreError> {
        self.count("reservation_state");
        self.inner.reservation_state(pool, id).await
    }
    async fn idempotency_keys(&self, pool: &PoolKey) -> Result<Vec<String>, StoreError> {
        self.count("idempotency_keys");
        self.inner.idempotency_keys(pool).await
    }
    async fn basket(
        &self,
        channel: &str,
        basket_id: &str,
    ) -> Result<Option<inventory_agent::store::StoredBasket>, StoreError> {
        self.count("basket");
        self.inner.basket(channel, basket_id).await
    }
    async fn put_basket(
        &self,
        channel: &str,
        basket_id: &str,
        expected_version: u64,
        intent: &inventory_agent::store::Intent,
    ) -> Result<inventory_agent::store::BasketWrite, StoreError> {
        self.count("put_basket");
        self.inner.put_basket(channel, basket_id, expected_version, intent).await
    }
    async fn open_baskets(&self, channel: &str, max: u64) -> Result<Vec<String>, StoreError> {
        self.count("open_baskets");
        self.inner.open_baskets(channel, max).await
    }
    async fn record_move(&self, pool: &PoolKey, intent: &MoveIntent) -> Result<(), StoreError> {
        self.count("record_move");
        self.inner.record_move(pool, intent).await
    }
    async fn pending_moves(&self, pool: &PoolKey) -> Result<Vec<MoveIntent>, StoreError> {
        self.count("pending_moves");
        self.inner.pending_moves(pool).await
    }
    async fn clear_move(&self, pool: &PoolKey, move_id: &str) -> Result<(), StoreError> {
        self.count("clear_move");
        self.inner.clear_move(pool, move_id).await
    }
    async fn channel_op(&self, channel: &str, op: ChannelOp<'_>) -> Result<ChannelReply, StoreError> {
        self.count("channel_op");
        self.inner.channel_op(channel, op).await
    }
    async fn refund(&self, pool: &PoolKey, id: &str) -> Result<Transition, StoreError> {
        self.count("refund");
        self.inner.refund(pool, id).await
    }
    async fn extend(&self, pool: &PoolKey, id: &str, extend_ms: u64, ttl_ms: u64) -> Result<ExtendResult, StoreError> {
        self.count("extend");
        self.inner.extend(pool, id, extend_ms, ttl_ms).await
    }
    async fn reservation(
        &self,
        pool: &PoolKey,
        by: &ReservationRef,
    ) -> Result<Option<(String, Reservation)>, StoreError> {
        self.count("reservation");
        self.inner.reservation(pool, by).await
    }
    async fn events(&self, pool: &PoolKey, from: u64, max: u64) -> Result<EventPage, StoreError> {
        self.count("events");
        self.inner.events(pool, from, max).await
    }
    async fn trim_events(&self, pool: &PoolKey, generation: u64, through: u64) -> Result<u64, StoreError> {
        self.count("trim_events");
        self.inner.trim_events(pool, generation, through).await
    }
    async fn outbox_stats(&self, pool: &PoolKey) -> Result<OutboxStats, StoreError> {
        self.count("outbox_stats");
        self.inner.outbox_stats(pool).await
    }
}

/// Buyers sent in the background, `concurrency` at a time, each through its own list of
/// replicas (see [`buy_one_via`]), while the test breaks something.
pub struct BackgroundSale {
    done: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<Vec<(usize, Option<String>)>>,
}

impl BackgroundSale {
    /// `buyers`: the replicas to try, the item's index in `items`, the user.
    pub fn start(
        items: &'static [&'static str],
        buyers: Vec<(Vec<AgentClient<Channel>>, usize, String)>,
        concurrency: usize,
    ) -> Self {
        use futures::StreamExt;
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&done);
        let task = tokio::spawn(async move {
            futures::stream::iter(buyers)
                .map(|(mut clients, i, user)| {
                    let done = Arc::clone(&counter);
                    async move {
                        let got = buy_one_via(&mut clients, items[i], &user, 300).await;
                        done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        (i, got)
                    }
                })
                .buffer_unordered(concurrency)
                .collect::<Vec<_>>()
                .await
        });
        Self { done, task }
    }

    /// Buyers finished so far.
    pub fn done(&self) -> usize {
        self.done.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits (up to 2 minutes) until `n` buyers finished.
    pub async fn reached(&self, n: usize) -> bool {
        wait_until(Duration::from_secs(120), || async move { self.done() >= n }).await
    }

    /// Every buyer's item index and confirmed reservation id (None: sold out).
    pub async fn finish(self) -> Vec<(usize, Option<String>)> {
        self.task.await.expect("sale task")
    }
}
