//! A database error's text stays in the center's log, with the request id, and never
//! reaches the caller: the answer is a short message saying what to do.
//!
//! A test binary of its own: it captures the log with a subscriber of its thread, and
//! tracing's per-callsite interest cache, shared by every thread of a process, must not be
//! settled by other tests' threads that have no subscriber.

use std::io::Write;
use std::sync::{Arc, Mutex};

use inventory_center::{Application, CenterConfig};
use inventory_test_support::TestDatabase;
use inventory_test_support::proxy::{Fault, FaultProxy};
use tonic::Code;

use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use tonic::transport::Channel;

async fn create(admin: &mut AdminClient<Channel>, item: &str, total: u64) {
    let req = pb::CreateItemRequest { item_id: item.into(), total, per_user_limit: 2, ..Default::default() };
    admin.create_item(req).await.expect("create item");
}

async fn register(center: &mut CenterClient<Channel>, channel: &str) -> u64 {
    let req = pb::RegisterAgentRequest { channel: channel.into(), agent_id: format!("{channel}-1"), fenced_at: 0 };
    center.register_agent(req).await.expect("register").into_inner().epoch
}

async fn borrow(
    center: &mut CenterClient<Channel>,
    item: &str,
    channel: &str,
    epoch: u64,
    quantity: u64,
    request_id: &str,
) -> Result<pb::BorrowResponse, tonic::Status> {
    let req = pb::BorrowRequest {
        item_id: item.into(),
        channel: channel.into(),
        epoch,
        quantity,
        request_id: request_id.into(),
        ..Default::default()
    };
    center.borrow(req).await.map(|r| r.into_inner())
}

/// Log lines written by the center while the test runs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a database's own words look like in a message.
fn leaks(message: &str) -> bool {
    ["os error", "communicating", "relation", "pool timed out", "error returned", "sqlx"]
        .iter()
        .any(|w| message.to_lowercase().contains(w))
}

// One thread: the center's tasks run where the log capture is installed.
#[tokio::test(flavor = "current_thread")]
async fn database_error_text_is_logged_with_the_request_id_not_answered() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let db = TestDatabase::create().await;
    let upstream = db.url.split('@').nth(1).and_then(|h| h.split('/').next()).expect("host:port in url");
    let proxy = FaultProxy::start(upstream.parse().expect("socket address")).await.expect("proxy");
    let url = db.url.replace(upstream, &proxy.addr().to_string());
    let app = Application::build(CenterConfig::for_tests(&url)).await.expect("center starts");
    let addr = app.grpc_addr();
    let server = tokio::spawn(app.run_until(std::future::pending()));
    let endpoint = format!("http://{addr}");
    let mut admin = inventory_proto::v1::admin_client::AdminClient::connect(endpoint.clone()).await.unwrap();
    let mut center = inventory_proto::v1::center_client::CenterClient::connect(endpoint).await.unwrap();
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;

    // A statement the database refuses: INTERNAL, and the log says which and for whom.
    let mut direct = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url).await.unwrap();
    sqlx::query("ALTER TABLE requests RENAME TO requests_gone").execute(&mut direct).await.unwrap();
    let s = borrow(&mut center, "i", "app", epoch, 1, "rid-refused").await.expect_err("no requests table");
    assert_eq!(s.code(), Code::Internal, "{s:?}");
    assert!(!leaks(s.message()), "database text reached the caller: {s:?}");
    let logged = logs.text();
    let line = logged.lines().find(|l| l.contains("rid-refused")).unwrap_or_else(|| panic!("no log line: {logged}"));
    assert!(line.contains("requests"), "the log keeps the database's words: {line}");
    sqlx::query("ALTER TABLE requests_gone RENAME TO requests").execute(&mut direct).await.unwrap();

    // The database unreachable: UNAVAILABLE, retry with the same id.
    proxy.set(Fault::Reset);
    let s = borrow(&mut center, "i", "app", epoch, 1, "rid-unreachable").await.expect_err("database down");
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert!(!leaks(s.message()), "database text reached the caller: {s:?}");
    assert!(s.message().contains("retry"), "says what to do: {s:?}");
    let logged = logs.text();
    assert!(logged.lines().any(|l| l.contains("rid-unreachable")), "no log line with the request id: {logged}");

    proxy.set(Fault::Pass);
    server.abort();
}
