//! The center as a child process (`inventory-center`), for faults an in-process center
//! cannot suffer: frozen by SIGSTOP, killed, restarted on another database at the same
//! address (the agents' configured center).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_test_support::{free_port, wait_until};
use tonic::transport::Channel;

/// `inventory-center`, built next to this test binary (brought up to date here: a `-p`
/// run does not build other packages' binaries).
fn center_path() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            let dir = exe.parent().and_then(|d| d.parent()).expect("target dir").to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let ok = std::process::Command::new(cargo)
                .args(["build", "-q", "-p", "inventory-center", "--bin", "inventory-center"])
                .status();
            assert!(ok.is_ok_and(|s| s.success()), "cannot build inventory-center");
            dir.join("inventory-center")
        })
        .clone()
}

pub struct CenterProcess {
    pub addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub url: String,
    child: tokio::process::Child,
}

impl CenterProcess {
    /// A center on `database_url`, on free ports.
    pub async fn spawn(database_url: &str) -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        Self::spawn_at(database_url, addr, http_addr).await
    }

    /// A center on `database_url` listening on the given addresses (a restart where the
    /// agents expect it).
    pub async fn spawn_at(database_url: &str, addr: SocketAddr, http_addr: SocketAddr) -> Self {
        let child = tokio::process::Command::new(center_path())
            .args(["--listen", &addr.to_string(), "--http-listen", &http_addr.to_string()])
            .args(["--database-url", database_url, "--insecure", "--reclaim-grace-ms", "0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn inventory-center");
        let url = format!("http://{addr}");
        let up = wait_until(Duration::from_secs(30), || {
            let url = url.clone();
            async move { AdminClient::connect(url).await.is_ok() }
        })
        .await;
        assert!(up, "center on {addr} never came up");
        Self { addr, http_addr, url, child }
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::connect(self.url.clone()).await.expect("connect admin")
    }

    pub async fn create_item(&self, item: &str, total: u64, wm: (u64, u64, u64)) {
        self.admin()
            .await
            .create_item(pb::CreateItemRequest {
                item_id: item.into(),
                total,
                per_user_limit: 1,
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

    /// Reconcile, or None while the center cannot answer.
    pub async fn try_reconcile(&self) -> Option<pb::ReconcileResponse> {
        let mut admin = AdminClient::connect(self.url.clone()).await.ok()?;
        let call = admin.reconcile(pb::ReconcileRequest::default());
        tokio::time::timeout(Duration::from_secs(2), call).await.ok()?.ok().map(tonic::Response::into_inner)
    }

    /// `/healthz`'s status code (None: no answer within a second).
    pub async fn healthz(&self) -> Option<u16> {
        http(self.http_addr, "/healthz").await.map(|(status, _)| status)
    }

    /// gRPC health of the Center service (None: no answer within a second).
    pub async fn grpc_health(&self) -> Option<tonic_health::pb::health_check_response::ServingStatus> {
        let check = async {
            let channel = tonic::transport::Endpoint::from_shared(self.url.clone()).ok()?.connect().await.ok()?;
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let request = tonic_health::pb::HealthCheckRequest { service: "inventory.v1.Center".into() };
            health.check(request).await.ok().map(|r| r.into_inner().status())
        };
        tokio::time::timeout(Duration::from_secs(1), check).await.ok().flatten()
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the center runs").to_string();
        let status = std::process::Command::new("kill").args([signal, &pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} {pid}");
    }

    /// SIGSTOP: the process answers nothing, its connections stay open.
    pub fn freeze(&self) {
        inventory_test_support::stop_process(self.child.id().expect("the center runs"));
    }

    /// SIGCONT after [`CenterProcess::freeze`].
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// SIGKILL, and reaped.
    pub async fn kill9(mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("reap");
    }
}

/// A GET on a center's HTTP port that may not answer (down, frozen, restarting): None then.
pub async fn http(addr: SocketAddr, path: &'static str) -> Option<(u16, String)> {
    tokio::net::TcpStream::connect(addr).await.ok()?;
    // The harness's GET panics on a refused connection (the center may die meanwhile): run
    // it where a panic is an answer.
    let call = tokio::spawn(crate::harness::http_status(addr, path));
    tokio::time::timeout(Duration::from_secs(1), call).await.ok()?.ok()
}
