//! NATS with JetStream for the relay's tests: the shared server at
//! `INVENTORY_TEST_NATS_URL`, or a private `nats-server` on a free port that a test may
//! kill and start again (same port, same store directory).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

const NATS_HINT: &str = "start it with `nats-server -js -a 127.0.0.1 -p 4222 -sd /var/lib/nats-server &` \
     (Debian: apt-get install nats-server) or point INVENTORY_TEST_NATS_URL at a server with JetStream";

/// URL of the shared NATS server; fails the test with a hint when nothing listens there.
pub fn nats_server_url() -> String {
    let url = std::env::var("INVENTORY_TEST_NATS_URL").unwrap_or_else(|_| DEFAULT_NATS_URL.to_owned());
    let addr = url.trim_start_matches("nats://").to_owned();
    if std::net::TcpStream::connect_timeout(
        &addr.parse().unwrap_or_else(|e| panic!("INVENTORY_TEST_NATS_URL {url}: not host:port ({e})")),
        Duration::from_secs(2),
    )
    .is_err()
    {
        panic!("cannot reach NATS at {url}; {NATS_HINT}");
    }
    url
}

/// A name unique to one test, for its stream and subject prefix (`[A-Za-z0-9_]`).
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A private `nats-server -js` on a free port with its own store directory. Killed (and
/// the directory removed) when dropped.
pub struct NatsServer {
    pub port: u16,
    pub url: String,
    store_dir: PathBuf,
    child: Option<Child>,
}

impl NatsServer {
    pub async fn start() -> Self {
        let port = crate::free_port();
        let store_dir = std::env::temp_dir().join(unique_name("nats_store"));
        std::fs::create_dir_all(&store_dir).expect("create the NATS store directory");
        let mut server = Self { port, url: format!("nats://127.0.0.1:{port}"), store_dir, child: None };
        server.spawn().await;
        server
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    async fn spawn(&mut self) {
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(&self.store_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start nats-server (apt-get install nats-server): {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_err() {
            assert!(Instant::now() < deadline, "nats-server on port {} did not listen within 10 s", self.port);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill -9, then start again on the same port with the same store (JetStream keeps
    /// its streams and consumers on disk).
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// SIGSTOP: the server keeps its connections open and answers nothing (what a
    /// frozen or partitioned broker looks like to a client). [`NatsServer::kill`] still works.
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            crate::stop_process(child.id());
        }
    }

    /// Start again after [`NatsServer::kill`].
    pub async fn start_again(&mut self) {
        if self.child.is_none() {
            self.spawn().await;
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.store_dir);
    }
}
