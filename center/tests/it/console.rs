//! The center's HTTP port as operators see it: `/metrics`, the `/api/items` feed and the
//! live console page at `/`, rendered by a real headless Chromium.
//!
//! The healthy-sale page test runs real agents (in this process, pools in memory) that sell
//! while the page polls: nothing may be red. The other tests play the channels through the
//! Center gRPC API as an agent drives it (RegisterAgent, Borrow, Heartbeat with its pool
//! counts), so the ledger has known numbers: a drift of 1 that no report explains turns
//! red once it has stood past the (shortened) report period, and a page opened after the
//! center sampled a sale (at a shortened period) shows that history.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use inventory_agent::config::StoreKind;
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_center::CenterConfig;
use inventory_center::history::HistoryConfig;
use inventory_center::store::LedgerStore;
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::{free_port, wait_until};
use tonic::transport::Channel;

use crate::support::{Backend, TestCenter};

const ITEM: &str = "console-item";
const CHROMIUM: &str = "/usr/bin/chromium";

/// A plain HTTP/1.1 GET: `(status code, content type, body)`.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect http");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read response");
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("http response");
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let content_type = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

/// The value of one sample in Prometheus text, by its full name with labels.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

/// One channel, driven over the Center API as its agent would.
pub(crate) struct SimulatedAgent {
    pub(crate) client: CenterClient<Channel>,
    pub(crate) channel: String,
    pub(crate) epoch: u64,
    requests: u64,
}

impl SimulatedAgent {
    pub(crate) async fn register(center: &TestCenter, channel: &str) -> Self {
        let mut client = center.center().await;
        let reg = client
            .register_agent(pb::RegisterAgentRequest {
                channel: channel.into(),
                agent_id: format!("{channel}-sim"),
                fenced_at: 0,
            })
            .await
            .expect("register")
            .into_inner();
        Self { client, channel: channel.into(), epoch: reg.epoch, requests: 0 }
    }

    async fn borrow(&mut self, quantity: u64) -> u64 {
        self.borrow_of(ITEM, quantity).await
    }

    pub(crate) async fn borrow_of(&mut self, item: &str, quantity: u64) -> u64 {
        self.requests += 1;
        self.client
            .borrow(pb::BorrowRequest {
                item_id: item.into(),
                channel: self.channel.clone(),
                epoch: self.epoch,
                quantity,
                request_id: format!("{}-borrow-{}", self.channel, self.requests),
                ..Default::default()
            })
            .await
            .expect("borrow")
            .into_inner()
            .granted
    }

    async fn report(&mut self, available: u64, reserved: u64, sold: u64) {
        self.report_of(ITEM, available, reserved, sold).await
    }

    pub(crate) async fn report_of(&mut self, item: &str, available: u64, reserved: u64, sold: u64) {
        // Fields added to PoolReport later (generation, ...) keep their defaults.
        #[allow(clippy::needless_update)]
        let pool = pb::PoolReport { item_id: item.into(), available, reserved, sold, ..Default::default() };
        self.client
            .heartbeat(pb::HeartbeatRequest {
                channel: self.channel.clone(),
                epoch: self.epoch,
                pools: vec![pool],
                ..Default::default()
            })
            .await
            .expect("heartbeat");
    }
}

/// A center whose HTTP port is known (the shared harness exposes only the gRPC address).
pub(crate) async fn start_center(backend: Backend) -> (TestCenter, SocketAddr) {
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let center = TestCenter::start_with(backend, |c: &mut CenterConfig| c.http_listen = http).await;
    (center, http)
}

/// An item of 100 units; "app" holds 20 (pool 15/3/2, no drift), "web" holds 10 but
/// reports 9 (one unit in flight: drift 1).
async fn center_with_a_sale(backend: Backend) -> (TestCenter, SocketAddr, SimulatedAgent, SimulatedAgent) {
    let (center, http) = start_center(backend).await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 100,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 5, high: 40, batch: 20 }),
            ..Default::default()
        })
        .await
        .expect("create item");
    let mut app = SimulatedAgent::register(&center, "app").await;
    let mut web = SimulatedAgent::register(&center, "web").await;
    assert_eq!(app.borrow(20).await, 20);
    assert_eq!(web.borrow(10).await, 10);
    app.report(15, 3, 2).await;
    web.report(7, 0, 2).await;
    (center, http, app, web)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_items_and_metrics_show_the_ledger_per_channel() {
    let (_center, http, _app, _web) = center_with_a_sale(Backend::Sqlite).await;

    let (status, content_type, body) = http_get(http, "/api/items").await;
    assert_eq!((status, content_type.as_str()), (200, "application/json"), "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let item = &v["items"][0];
    assert_eq!(item["item_id"], ITEM);
    assert_eq!(
        (item["total"].as_u64(), item["available"].as_u64(), item["held"].as_u64()),
        (Some(100), Some(70), Some(30))
    );
    let channels = item["channels"].as_array().expect("channels");
    let by_name = |name: &str| channels.iter().find(|c| c["channel"] == name).expect(name).clone();
    let (app, web) = (by_name("app"), by_name("web"));
    assert_eq!((app["held"].as_u64(), app["available"].as_u64(), app["sold"].as_u64()), (Some(20), Some(15), Some(2)));
    assert_eq!((app["drift"].as_i64(), web["drift"].as_i64()), (Some(0), Some(1)));
    assert_eq!((web["in_doubt"].as_u64(), item["written_off"].as_u64()), (Some(0), Some(0)));
    // Reported a moment ago: web's drift is still in flight, not stuck (that takes 7 s).
    assert_eq!((web["drift_in_flight"].as_i64(), web["drift_stuck"].as_i64()), (Some(1), Some(0)));
    assert_eq!(web["watermarks"], serde_json::json!({"low": 5, "high": 40, "batch": 20}));
    assert_eq!(item["sold_out_everywhere"], false);
    let sessions = v["channels"].as_array().expect("registered channels");
    let names: Vec<&str> = sessions.iter().filter_map(|c| c["channel"].as_str()).collect();
    assert_eq!(names, ["app", "web"]);
    assert_eq!((sessions[0]["agent_id"].as_str(), sessions[0]["epoch"].as_u64()), (Some("app-sim"), Some(1)));
    let lease = app["lease_remaining_ms"].as_i64().expect("lease");
    assert!(lease > 0 && lease <= 10_000, "lease remaining {lease} ms");

    let (status, content_type, text) = http_get(http, "/metrics").await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let s = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no sample {series} in\n{text}"));
    assert_eq!(s(r#"inventory_center_item_total_units{item="console-item"}"#), 100.0);
    assert_eq!(s(r#"inventory_center_available_units{item="console-item"}"#), 70.0);
    assert_eq!(s(r#"inventory_center_held_units{item="console-item",channel="web"}"#), 10.0);
    assert_eq!(s(r#"inventory_center_channel_drift_units{item="console-item",channel="app"}"#), 0.0);
    assert_eq!(s(r#"inventory_center_channel_drift_units{item="console-item",channel="web"}"#), 1.0);
    assert_eq!(s(r#"inventory_center_reported_pool_units{item="console-item",channel="app",state="reserved"}"#), 3.0);
    assert_eq!(s(r#"inventory_center_granted_units_total{item="console-item",channel="app"}"#), 20.0);
    assert_eq!(s(r#"inventory_center_in_doubt_units{item="console-item",channel="web"}"#), 0.0);
    assert_eq!(s(r#"inventory_center_written_off_units_total{item="console-item"}"#), 0.0);
    assert_eq!(s(r#"inventory_center_returned_units_total{item="console-item",channel="app"}"#), 0.0);
    assert_eq!(s(r#"inventory_center_channel_epoch{channel="web"}"#), 1.0);
    let remaining = s(r#"inventory_center_lease_remaining_seconds{channel="app"}"#);
    assert!(remaining > 0.0 && remaining <= 10.0, "lease remaining {remaining} s");
    let age = s(r#"inventory_center_heartbeat_age_seconds{channel="app"}"#);
    assert!((0.0..10.0).contains(&age), "heartbeat age {age} s");
    assert_eq!(s("inventory_center_database_up"), 1.0);
    assert_eq!(s("inventory_center_database_errors_total"), 0.0);
    // The gRPC layer counted the two channels' Borrows, and the build is named.
    assert_eq!(s(r#"inventory_rpc_requests_total{service="inventory.v1.Center",method="Borrow",code="ok"}"#), 2.0);
    assert_eq!(s(r#"inventory_rpc_duration_seconds_count{service="inventory.v1.Center",method="Borrow"}"#), 2.0);
    let build = format!(
        r#"inventory_build_info{{version="{}",git="{}"}}"#,
        inventory_net::metrics::VERSION,
        inventory_net::metrics::GIT_HASH
    );
    assert_eq!(s(&build), 1.0);
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let (name, kind) = line[7..].split_once(' ').expect("type line");
        let shared = name.starts_with("inventory_rpc_") || name == "inventory_build_info";
        assert!(shared || name.starts_with("inventory_center_"), "{line}");
        assert!(kind != "counter" || name.ends_with("_total"), "a counter without _total: {line}");
    }
}

#[test]
fn version_names_the_git_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .arg("--version")
        .output()
        .expect("run inventory-center --version");
    assert!(out.status.success());
    let expected =
        format!("inventory-center {} (git {})", inventory_net::metrics::VERSION, inventory_net::metrics::GIT_HASH);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_stay_scrapable_and_count_errors_when_the_database_is_gone() {
    let (center, http) = start_center(Backend::Postgres).await;
    let (_, _, before) = http_get(http, "/metrics").await;
    assert_eq!(sample(&before, "inventory_center_database_up"), Some(1.0));

    // Drop the center's database under it (terminating its connections).
    let name = center.database_url.rsplit('/').next().expect("database name").to_owned();
    let server = inventory_test_support::database_server_url();
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server).await.expect("maintenance connection");
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)")).execute(&mut conn).await.expect("drop database");

    let (status, _, body) = http_get(http, "/api/items").await;
    assert_eq!(status, 503, "{body}");
    let (status, _, text) = http_get(http, "/metrics").await;
    assert_eq!(status, 200, "metrics stay scrapable: {text}");
    assert_eq!(sample(&text, "inventory_center_database_up"), Some(0.0), "{text}");
    assert!(sample(&text, "inventory_center_database_errors_total") >= Some(2.0), "{text}");
    let (status, _, page) = http_get(http, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains("/api/items"), "the page still loads and reports the error itself");
}

/// Runs headless Chromium on `url` with the flags that keep it off the network.
async fn chromium(profile: &Path, extra: &[&str], url: &str) -> std::process::Output {
    let child = tokio::process::Command::new(CHROMIUM)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .args(["--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--virtual-time-budget=3000")
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn chromium");
    tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("chromium finished within 90 s")
        .expect("chromium output")
}

fn fresh_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("inventory-chromium-{tag}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create chromium profile dir");
    dir
}

/// A real agent (in this process, pools in memory) selling for `channel`.
struct RealAgent {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RealAgent {
    async fn start(center: &TestCenter, channel: &str) -> Self {
        let config = AgentConfig::for_tests(channel, &center.url(), StoreKind::Memory, "redis://unused", "unused:");
        let app = AgentApp::build(config).await.expect("agent starts");
        let addr = app.grpc_addr();
        let task = tokio::spawn(app.run_until(std::future::pending()));
        Self { addr, task }
    }

    async fn client(&self) -> AgentClient<Channel> {
        AgentClient::connect(format!("http://{}", self.addr)).await.expect("connect agent")
    }
}

impl Drop for RealAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn buy(client: &mut AgentClient<Channel>, user: &str) -> bool {
    let r = client
        .acquire(pb::AcquireRequest {
            item_id: ITEM.into(),
            user_id: user.into(),
            quantity: 1,
            idempotency_key: format!("order-{user}"),
            ..Default::default()
        })
        .await
        .expect("acquire")
        .into_inner();
    r.outcome() == pb::AcquireOutcome::Reserved
}

/// A screenshot of the page for people: saved under the temp dir, path printed.
pub(crate) async fn screenshot(url: &str, name: &str) {
    let shot = std::env::temp_dir().join(name);
    let _ = std::fs::remove_file(&shot);
    let profile = fresh_dir("shot");
    let arg = format!("--screenshot={}", shot.display());
    let out = chromium(&profile, &[arg.as_str(), "--window-size=1280,1400"], url).await;
    let _ = std::fs::remove_dir_all(&profile);
    assert!(out.status.success(), "chromium screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let written = wait_until(Duration::from_secs(5), || {
        let shot = shot.clone();
        async move { std::fs::metadata(&shot).map(|m| m.len() > 10_000).unwrap_or(false) }
    })
    .await;
    assert!(written, "no screenshot at {}", shot.display());
    let png = std::fs::read(&shot).expect("read screenshot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    println!("console screenshot: {}", shot.display());
}

/// The page's DOM after its scripts ran, as headless Chromium dumps it.
pub(crate) async fn dump_dom(url: &str) -> String {
    let profile = fresh_dir("dom");
    let out = chromium(&profile, &["--dump-dom"], url).await;
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && dom.contains("<html"),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

/// The element that starts with `start` (an opening tag's beginning), up to `end`.
pub(crate) fn element<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    let from = dom.find(start).unwrap_or_else(|| panic!("no {start} in\n{dom}"));
    let to = dom[from..].find(end).map_or(dom.len(), |e| from + e);
    &dom[from..to]
}

/// The channel's own pool chart: its line, and its low and high watermarks.
fn assert_pool_chart(dom: &str, channel: &str) {
    let figure = element(dom, &format!(r#"<figure data-chart="pool" data-channel="{channel}">"#), "</figure>");
    for part in [r#"data-mark="low""#, r#"data-mark="high""#, &format!(r#"data-series="{channel}""#)] {
        assert!(figure.contains(part), "the pool chart of {channel} lacks {part}:\n{figure}");
    }
}

/// The `<tr>` of a channel in the dumped DOM.
fn channel_row<'a>(dom: &'a str, channel: &str) -> &'a str {
    let start = dom.find(&format!(r#"<tr data-channel="{channel}">"#)).unwrap_or_else(|| panic!("no row of {channel}"));
    let end = dom[start..].find("</tr>").expect("row ends") + start;
    &dom[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_page_in_headless_chromium_shows_a_healthy_sale_without_red() {
    chromium_present();
    let (center, http) = start_center(Backend::Sqlite).await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 100,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 5, high: 40, batch: 20 }),
            ..Default::default()
        })
        .await
        .expect("create item");
    let (app, web) = (RealAgent::start(&center, "app").await, RealAgent::start(&center, "web").await);
    let (mut app_client, mut web_client) = (app.client().await, web.client().await);
    for i in 0..12 {
        assert!(buy(&mut app_client, &format!("a{i}")).await);
    }
    for i in 0..5 {
        assert!(buy(&mut web_client, &format!("w{i}")).await);
    }
    // Heartbeats carry the pools to the center: wait until both channels reported them.
    let reported = wait_until(Duration::from_secs(20), || async {
        let (_, _, body) = http_get(http, "/api/items").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let channels = v["items"][0]["channels"].as_array().cloned().unwrap_or_default();
        let reserved = |name: &str| channels.iter().find(|c| c["channel"] == name).and_then(|c| c["reserved"].as_u64());
        reserved("app") == Some(12) && reserved("web") == Some(5)
    })
    .await;
    assert!(reported, "the agents' reports never reached the center");

    let url = format!("http://{http}/");
    let (status, content_type, page) = http_get(http, "/").await;
    assert_eq!((status, content_type.as_str()), (200, "text/html; charset=utf-8"));
    // The only absolute URL in the page is the SVG namespace: it loads nothing from elsewhere.
    assert_eq!(page.matches("http").count(), page.matches("http://www.w3.org/2000/svg").count());

    // The app channel keeps selling while the page polls.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let seller = tokio::spawn(async move {
        let mut sold = 0;
        for i in 0..20 {
            if buy(&mut app_client, &format!("late{i}")).await {
                sold += 1;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stop_rx.wait_for(|s| *s) => break,
            }
        }
        sold
    });

    let dom = dump_dom(&url).await;
    assert!(dom.contains(&format!(r#"<section class="item" data-item="{ITEM}">"#)), "item section missing:\n{dom}");
    for channel in ["app", "web"] {
        assert!(channel_row(&dom, channel).contains(r#"<td data-field="drift_in_flight""#), "row of {channel}:\n{dom}");
        assert!(dom.contains(&format!(r#"data-series="{channel}""#)), "chart series of {channel} missing:\n{dom}");
        assert_pool_chart(&dom, channel);
    }
    // A healthy sale: drift comes and goes with the batches, but nothing is red.
    assert!(!dom.contains(r#"data-alarm=""#), "an alarm during a healthy sale:\n{dom}");
    assert!(channel_row(&dom, "web").contains(r#"<td data-field="reserved">5</td>"#), "web reserved 5:\n{dom}");
    assert!(dom.contains(r#"data-series="center""#), "center series missing:\n{dom}");
    assert!(dom.contains(r#"data-session="web""#), "web's lease chip missing:\n{dom}");
    for chart in ["stock", "sold", "drift"] {
        assert!(dom.contains(&format!(r#"<figure data-chart="{chart}">"#)), "chart {chart} missing:\n{dom}");
    }
    assert!(dom.contains(r#"data-state="live""#), "the page reached /api/items:\n{dom}");

    screenshot(&url, "inventory-console.png").await;

    let _ = stop_tx.send(true);
    let late = seller.await.expect("seller");
    assert!(late > 0, "the app channel sold while the page was polling");
    // What the page reads is the ledger: the late sales reach it too.
    let settled = wait_until(Duration::from_secs(20), || async {
        let (_, _, text) = http_get(http, "/metrics").await;
        let series = r#"inventory_center_reported_pool_units{item="console-item",channel="app",state="reserved"}"#;
        sample(&text, series) == Some(12.0 + late as f64)
    })
    .await;
    assert!(settled, "the center never saw the {late} late sales");
}

/// The console of `center`'s ledger with its own sampling (the center under test samples at
/// the default period): a second HTTP port over the same database.
struct Console {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Console {
    async fn start(center: &TestCenter, history: HistoryConfig) -> Self {
        let store: Arc<dyn LedgerStore> =
            Arc::new(inventory_center::store::connect(&center.database_url).await.expect("a second connection"));
        let router = inventory_center::http::router_with(store, Arc::new(AtomicU64::new(0)), history);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the console");
        let addr = listener.local_addr().expect("console address");
        let task = tokio::spawn(async move { axum::serve(listener, router).await.expect("console serves") });
        Self { addr, task }
    }

    async fn json(&self, path: &str) -> serde_json::Value {
        let (_, _, body) = http_get(self.addr, path).await;
        serde_json::from_str(&body).unwrap_or_default()
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn chromium_present() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: this test renders the console in headless Chromium; \
         install it with `apt-get install -y chromium`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_page_in_headless_chromium_shows_a_stuck_drift_in_red_and_an_item_sold_out_everywhere() {
    chromium_present();
    let (center, _http, mut app, _web) = center_with_a_sale(Backend::Postgres).await;
    // A second item, every unit sold through app: nothing left anywhere.
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: "gone".into(),
            total: 10,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 2, high: 8, batch: 5 }),
            ..Default::default()
        })
        .await
        .expect("create item");
    assert_eq!(app.borrow_of("gone", 10).await, 10);
    app.report_of("gone", 0, 0, 10).await;

    // Until the report period has passed, web's drift may still be in flight: shown, not red.
    // (A console that allows ten minutes for it sees exactly that.)
    let patient =
        Console::start(&center, HistoryConfig { stuck_after: Duration::from_secs(600), ..Default::default() }).await;
    let dom = dump_dom(&format!("http://{}/", patient.addr)).await;
    let web = channel_row(&dom, "web");
    assert!(web.contains(r#"<td data-field="drift_in_flight">1</td>"#), "web's drift in flight:\n{web}");
    assert!(web.contains(r#"<td data-field="drift_stuck">0</td>"#), "{web}");
    assert!(!dom.contains(r#"data-alarm="stuck-drift""#), "a drift in flight is not red:\n{dom}");
    drop(patient);

    // Web reported 9 of the 10 units it holds and nothing moves: once that report has stood
    // past the report period (1 s here) the drift is stuck.
    let history =
        HistoryConfig { period: Duration::from_millis(100), stuck_after: Duration::from_secs(1), ..Default::default() };
    let console = Console::start(&center, history).await;
    let stuck = wait_until(Duration::from_secs(20), || async {
        let v = console.json("/api/items").await;
        let item = v["items"].as_array().and_then(|items| items.iter().find(|i| i["item_id"] == ITEM).cloned());
        let web = item.and_then(|i| i["channels"].as_array()?.iter().find(|c| c["channel"] == "web").cloned());
        web.is_some_and(|w| w["drift_stuck"] == 1 && w["drift_in_flight"] == 0)
    })
    .await;
    assert!(stuck, "web's drift never counted as stuck: {}", console.json("/api/items").await);

    let url = format!("http://{}/", console.addr);
    let dom = dump_dom(&url).await;
    let web = channel_row(&dom, "web");
    assert!(
        web.contains(r#"<td data-field="drift_stuck" class="warn" data-alarm="stuck-drift">1</td>"#),
        "web's stuck drift is not red:\n{web}"
    );
    let app_row = channel_row(&dom, "app");
    assert!(app_row.contains(r#"<td data-field="drift_stuck">0</td>"#), "app has no stuck drift:\n{app_row}");
    let section = element(&dom, &format!(r#"<section class="item" data-item="{ITEM}">"#), "</section>");
    assert!(section.contains(r#"data-alarm="stuck-drift""#) && !section.contains("data-soldout"), "{section}");
    let gone = element(&dom, r#"<section class="item" data-item="gone">"#, "</section>");
    assert!(gone.contains("data-soldout") && gone.contains("sold out everywhere"), "not marked sold out:\n{gone}");
    assert!(!gone.contains(r#"data-alarm="stuck-drift""#), "{gone}");
    for channel in ["app", "web"] {
        assert_pool_chart(section, channel);
    }
    screenshot(&url, "inventory-console-stuck.png").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_page_opened_late_shows_the_history_the_center_kept() {
    chromium_present();
    let (center, _http) = start_center(Backend::Postgres).await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 1_000,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 5, high: 40, batch: 20 }),
            ..Default::default()
        })
        .await
        .expect("create item");
    // Sampling every 50 ms stands in for minutes at the default period.
    let console =
        Console::start(&center, HistoryConfig { period: Duration::from_millis(50), ..Default::default() }).await;
    let mut app = SimulatedAgent::register(&center, "app").await;
    let center_available = |v: &serde_json::Value| -> Vec<u64> {
        v["items"][ITEM].as_array().map_or(Vec::new(), |s| s.iter().filter_map(|s| s["available"].as_u64()).collect())
    };
    // Twelve steps of a sale, each sampled before the next.
    for step in 1..=12u64 {
        assert_eq!(app.borrow(20).await, 20);
        app.report(20 * step - step, 0, step).await;
        let sampled = wait_until(Duration::from_secs(10), || async {
            center_available(&console.json("/api/history").await).contains(&(1_000 - 20 * step))
        })
        .await;
        assert!(sampled, "step {step} never reached the history");
    }
    let enough = wait_until(Duration::from_secs(10), || async {
        center_available(&console.json("/api/history").await).len() >= 60
    })
    .await;
    assert!(enough, "the center kept too few samples: {}", console.json("/api/history").await);

    // The page polls once a second, so in its few seconds it could draw only a handful of
    // points itself: the rest of its chart is the center's history.
    let url = format!("http://{}/", console.addr);
    let dom = dump_dom(&url).await;
    let stock = element(&dom, r#"<figure data-chart="stock">"#, "</figure>");
    let points: usize = stock
        .split(r#"data-points=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no point count in the stock chart:\n{stock}"));
    assert!(points >= 60, "the chart shows {points} points, not the kept history:\n{stock}");
    let sold = element(&dom, r#"<figure data-chart="sold">"#, "</figure>");
    assert!(sold.contains(r#"data-series="app""#), "{sold}");
    screenshot(&url, "inventory-console-history.png").await;
}
