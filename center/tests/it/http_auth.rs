//! The center's HTTP port with tokens configured: the console and its feeds need the
//! operator token (401 without it, or with a wrong or an agent's token), `/metrics` and
//! `/healthz` stay open and move to `--metrics-listen` when it is given (the agent's too),
//! HTTPS with the gRPC certificate, and the console signing in inside headless Chromium.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use inventory_agent::config::StoreKind;
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_center::{Application, CenterConfig};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_test_support::pki::TestPki;
use inventory_test_support::{TestSqlite, free_port};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::console::{chromium_present, dump_dom, element, screenshot};

const OPERATOR: &str = "operator-token-0123456789";
const APP: &str = "app-agent-token-0123456789";
const ITEM: &str = "guarded-item";

/// A center with operator and agent tokens; `tweak` adds listeners or TLS.
struct Guarded {
    grpc: SocketAddr,
    http: SocketAddr,
    metrics: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    _db: TestSqlite,
}

impl Guarded {
    async fn start(tweak: impl FnOnce(&mut CenterConfig)) -> Self {
        let db = TestSqlite::create();
        let mut cfg = CenterConfig::for_tests(&db.url);
        cfg.insecure = false;
        cfg.operator_token = Some(OPERATOR.into());
        cfg.agent_tokens = Some(format!("app:{APP}"));
        tweak(&mut cfg);
        let app = Application::build(cfg).await.expect("center starts");
        let (grpc, http, metrics) = (app.grpc_addr(), app.http_addr(), app.metrics_addr());
        let task = tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("center runs") });
        Self { grpc, http, metrics, task, _db: db }
    }

    /// Creates [`ITEM`] (100 units) over Admin with the operator token.
    async fn create_item(&self) {
        let mut admin = AdminClient::connect(format!("http://{}", self.grpc)).await.expect("connect admin");
        let mut request =
            tonic::Request::new(pb::CreateItemRequest { item_id: ITEM.into(), total: 100, ..Default::default() });
        request.metadata_mut().insert("authorization", format!("Bearer {OPERATOR}").parse().expect("header"));
        admin.create_item(request).await.expect("operator creates the item");
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP/1.1 answer: status, headers (names lowercased), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// GET `path` over `stream`, with `authorization` as given; bounded to 10 s.
async fn get_over<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, path: &str, authorization: Option<&str>) -> Answer {
    let auth = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send request");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("answered within 10 s")
        .expect("read response");
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("http response");
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).expect("status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer { status, headers, body: body.to_owned() }
}

async fn get(addr: SocketAddr, path: &str, authorization: Option<&str>) -> Answer {
    get_over(tokio::net::TcpStream::connect(addr).await.expect("connect http"), path, authorization).await
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_and_feeds_refuse_callers_without_the_operator_token_and_probes_stay_open() {
    let center = Guarded::start(|_| {}).await;
    center.create_item().await;
    let http = center.http;

    for path in ["/api/items", "/api/history"] {
        let none = get(http, path, None).await;
        assert_eq!(none.status, 401, "{path} without a token: {}", none.body);
        assert_eq!(none.header("content-type"), Some("application/json"));
        assert_eq!(none.header("www-authenticate"), Some(r#"Bearer realm="inventory-center""#));
        let error: serde_json::Value = serde_json::from_str(&none.body).expect("json error");
        assert_eq!(error["error"], "missing operator token (authorization: Bearer ...)");
        assert!(!none.body.contains(ITEM), "the refusal shows no ledger: {}", none.body);

        let wrong = get(http, path, Some(&bearer("operator-token-0123456780"))).await;
        assert_eq!(wrong.status, 401, "{path} with a wrong token");
        assert!(wrong.body.contains("invalid operator token"), "{}", wrong.body);
        // An agent's token is not an operator's, and only the Bearer scheme counts.
        assert_eq!(get(http, path, Some(&bearer(APP))).await.status, 401, "{path} with an agent's token");
        assert_eq!(get(http, path, Some(&format!("Basic {OPERATOR}"))).await.status, 401, "{path} as Basic");
    }
    let items = get(http, "/api/items", Some(&bearer(OPERATOR))).await;
    assert_eq!(items.status, 200, "{}", items.body);
    let view: serde_json::Value = serde_json::from_str(&items.body).expect("json");
    assert_eq!((view["items"][0]["item_id"].as_str(), view["items"][0]["total"].as_u64()), (Some(ITEM), Some(100)));
    assert_eq!(get(http, "/api/history", Some(&format!("bearer {OPERATOR}"))).await.status, 200);

    // The page: 401 with its sign-in form, and the page itself with the token.
    let page = get(http, "/", None).await;
    assert_eq!(page.status, 401);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(page.body.contains(r#"<form id="signin""#), "the 401 page signs in");
    assert!(page.header("content-security-policy").is_some_and(|c| c.contains("connect-src 'self'")));
    assert_eq!(get(http, "/", Some(&bearer("wrong-operator-token-0123"))).await.status, 401);
    assert_eq!(get(http, "/", Some(&bearer(OPERATOR))).await.status, 200);

    // Probes answer anyone, as Prometheus and orchestrators expect.
    let metrics = get(http, "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains("inventory_center_database_up 1"), "{}", metrics.body);
    let health = get(http, "/healthz", None).await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    assert_eq!(get(http, "/nothing-here", None).await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_operator_tokens_the_console_asks_for_none() {
    let db = TestSqlite::create();
    let app = Application::build(CenterConfig::for_tests(&db.url)).await.expect("insecure center starts");
    let http = app.http_addr();
    let task = tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("runs") });
    assert_eq!(get(http, "/api/items", None).await.status, 200);
    assert_eq!(get(http, "/", None).await.status, 200);
    // A token sent anyway changes nothing.
    assert_eq!(get(http, "/api/items", Some(&bearer("whatever-token-0123456"))).await.status, 200);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listen_takes_the_probes_off_the_console_port_on_center_and_agent() {
    let center = Guarded::start(|c| c.metrics_listen = Some("127.0.0.1:0".parse().expect("address"))).await;
    center.create_item().await;
    let (http, probes) = (center.http, center.metrics);
    assert_ne!(http, probes, "two listeners");

    // The probe port: /metrics and /healthz without a token, and nothing of the console.
    let metrics = get(probes, "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains(r#"inventory_center_item_total_units{item="guarded-item"} 100"#), "{}", metrics.body);
    assert_eq!(get(probes, "/healthz", None).await.status, 200);
    for path in ["/", "/api/items", "/api/history"] {
        assert_eq!(get(probes, path, Some(&bearer(OPERATOR))).await.status, 404, "{path} on the probe port");
    }
    // The console port: the console behind the token, and no probes any more.
    assert_eq!(get(http, "/api/items", None).await.status, 401);
    assert_eq!(get(http, "/api/items", Some(&bearer(OPERATOR))).await.status, 200);
    for path in ["/metrics", "/healthz"] {
        assert_eq!(get(http, path, None).await.status, 404, "{path} on the console port");
        assert_eq!(get(http, path, Some(&bearer(OPERATOR))).await.status, 404, "{path} on the console port");
    }

    // The agent's HTTP port serves only the probes: --metrics-listen is where they go, and
    // --http-listen is then not bound at all.
    let unused: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let wanted: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let mut cfg =
        AgentConfig::for_tests("app", &format!("http://{}", center.grpc), StoreKind::Memory, "redis://unused", "x:");
    cfg.center_token = Some(APP.into());
    cfg.http_listen = unused;
    cfg.metrics_listen = Some(wanted);
    let agent = AgentApp::build(cfg).await.expect("agent starts");
    assert_eq!(agent.http_addr(), wanted);
    let agent_task = tokio::spawn(agent.run_until(std::future::pending()));
    let agent_metrics = get(wanted, "/metrics", None).await;
    assert_eq!(agent_metrics.status, 200);
    assert!(agent_metrics.body.contains(r#"channel="app""#), "{}", agent_metrics.body);
    assert_eq!(get(wanted, "/healthz", None).await.status, 200);
    assert!(tokio::net::TcpStream::connect(unused).await.is_err(), "--http-listen stays unbound");
    agent_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_and_the_probes_speak_https_with_the_grpc_certificate() {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

    let pki = TestPki::generate();
    let center = Guarded::start(|c| {
        c.tls_cert = Some(pki.server.cert.clone());
        c.tls_key = Some(pki.server.key.clone());
        c.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&pki.ca).expect("ca")).expect("trust the ca");
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let https = |addr: SocketAddr, path: &'static str, auth: Option<String>| {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let tls =
                connector.connect(ServerName::try_from("localhost").expect("name"), tcp).await.expect("handshake");
            get_over(tls, path, auth.as_deref()).await
        }
    };

    assert_eq!(https(center.http, "/api/items", None).await.status, 401);
    let items = https(center.http, "/api/items", Some(bearer(OPERATOR))).await;
    assert_eq!((items.status, items.header("content-type")), (200, Some("application/json")), "{}", items.body);
    assert_eq!(https(center.http, "/", Some(bearer(OPERATOR))).await.status, 200);
    assert_eq!(https(center.metrics, "/healthz", None).await.body, "ok\n");
    assert_eq!(https(center.metrics, "/metrics", None).await.status, 200);

    // Plain HTTP gets nothing from either port.
    for addr in [center.http, center.metrics] {
        let mut plain = tokio::net::TcpStream::connect(addr).await.expect("connect");
        plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.expect("send");
        let mut raw = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut raw)).await;
        assert!(!String::from_utf8_lossy(&raw).contains("200 OK"), "plain HTTP was served on {addr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_headless_chromium_asks_for_the_token_and_shows_the_ledger_once_signed_in() {
    chromium_present();
    let center = Guarded::start(|_| {}).await;
    center.create_item().await;
    let page = format!("http://{}/", center.http);

    // No token: the sign-in form, nothing of the ledger.
    let dom = dump_dom(&page).await;
    assert!(dom.contains(r#"<form id="signin">"#), "the sign-in form is shown:\n{dom}");
    assert!(dom.contains(r#"data-state="locked""#), "{dom}");
    assert!(!dom.contains(ITEM), "nothing of the ledger without a token:\n{dom}");
    screenshot(&page, "inventory-console-sign-in.png").await;

    // A wrong token: refused, said so, still nothing shown.
    let dom = dump_dom(&format!("{page}#token=operator-token-0123456780")).await;
    let form = element(&dom, r#"<form id="signin""#, "</form>");
    assert!(!form.contains("hidden"), "{form}");
    assert!(form.contains("refused the token (invalid operator token)"), "{form}");
    assert!(!dom.contains(ITEM), "nothing of the ledger with a wrong token:\n{dom}");

    // The operator's token: the ledger, live, and the form hidden.
    let dom = dump_dom(&format!("{page}#token={OPERATOR}")).await;
    assert!(dom.contains(&format!(r#"<section class="item" data-item="{ITEM}">"#)), "item section missing:\n{dom}");
    assert!(dom.contains(r#"data-state="live""#), "{dom}");
    assert!(element(&dom, r#"<form id="signin""#, ">").contains("hidden"), "form still shown:\n{dom}");
    assert!(!dom.contains(OPERATOR), "the token is not written into the page");
}
