//! Test harness shared by every crate's tests.
//!
//! Tests talk to real servers: PostgreSQL at `INVENTORY_TEST_DATABASE_URL` and Redis at
//! `INVENTORY_TEST_REDIS_URL` (defaults: the local services on their standard ports).
//! Each test isolates itself: a fresh PostgreSQL database, a private Redis key prefix, or
//! its own `redis-server` process on a free port when it must kill, flush or restart Redis.
//! A private PostgreSQL server ([`postgres`]) for tests that stop, replicate or promote it.
//! NATS (JetStream) at `INVENTORY_TEST_NATS_URL` for the relay ([`nats`]).
//! An unreachable server fails the test with a message saying how to start it.

pub mod cluster;
pub mod nats;
pub mod pki;
pub mod postgres;
pub mod proxy;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

const PG_HINT: &str = "start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
     or point INVENTORY_TEST_DATABASE_URL at a server (user with CREATEDB)";
const REDIS_HINT: &str = "start it with `redis-server --daemonize yes --port 6379 --save '' --appendonly no` \
     or point INVENTORY_TEST_REDIS_URL at a server";

fn unique_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_owned()
}

/// URL of the PostgreSQL server the suite uses (a maintenance database on it).
pub fn database_server_url() -> String {
    std::env::var("INVENTORY_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// URL of the shared Redis server the suite uses.
pub fn redis_server_url() -> String {
    std::env::var("INVENTORY_TEST_REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned())
}

/// A fresh PostgreSQL database, dropped when the value is dropped.
pub struct TestDatabase {
    pub url: String,
    name: String,
    server_url: String,
}

fn replace_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    // postgres://user@host:port/db -> keep everything up to the last '/' after the host.
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let base = match base[after_scheme..].rfind('/') {
        Some(i) => &base[..after_scheme + i],
        None => base,
    };
    format!("{base}/{name}{query}")
}

impl TestDatabase {
    pub async fn create() -> Self {
        let server_url = database_server_url();
        let mut conn = sqlx::PgConnection::connect(&server_url)
            .await
            .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {server_url}: {e}; {PG_HINT}"));
        let name = format!("inv_test_{}", unique_suffix());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("cannot create test database {name} on {server_url}: {e}"));
        let _ = conn.close().await;
        Self { url: replace_database(&server_url, &name), name, server_url }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (server_url, name) = (self.server_url.clone(), self.name.clone());
        // Drop runs inside or outside a runtime; a short thread with its own runtime works in both.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&server_url).await.ok()?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut conn).await.ok()?;
                conn.close().await.ok()
            })
        })
        .join();
    }
}

/// A SQLite database file in the temp directory, removed when dropped.
pub struct TestSqlite {
    pub url: String,
    path: PathBuf,
}

impl TestSqlite {
    pub fn create() -> Self {
        let path = std::env::temp_dir().join(format!("inventory-test-{}.db", unique_suffix()));
        Self { url: format!("sqlite://{}?mode=rwc", path.display()), path }
    }
}

impl Drop for TestSqlite {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

/// The shared Redis server with a private key prefix; keys under the prefix are deleted
/// when dropped.
pub struct TestRedis {
    pub url: String,
    pub prefix: String,
}

impl TestRedis {
    pub async fn create() -> Self {
        let url = redis_server_url();
        ping_redis(&url).await.unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}; {REDIS_HINT}"));
        Self { url, prefix: format!("test:{}:", unique_suffix()) }
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let (url, pattern) = (self.url.clone(), format!("{}*", self.prefix));
        let _ = std::thread::spawn(move || -> redis::RedisResult<()> {
            let client = redis::Client::open(url)?;
            let mut conn = client.get_connection()?;
            let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut conn)?;
            for chunk in keys.chunks(500) {
                redis::cmd("DEL").arg(chunk).query::<()>(&mut conn)?;
            }
            Ok(())
        })
        .join();
    }
}

async fn ping_redis(url: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("PING").query_async::<String>(&mut conn).await.map(|_| ())
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// A private `redis-server` on a free port, without persistence, for tests that kill,
/// flush or restart Redis. Killed (and its directory removed) when dropped.
pub struct RedisServer {
    pub port: u16,
    pub url: String,
    /// Its working directory: a full resync between a master and a replica writes an RDB
    /// file even with `--save ""`, and it must not land in the caller's directory.
    dir: PathBuf,
    child: Option<Child>,
    /// Extra command-line settings, kept across restarts.
    args: Vec<String>,
}

impl RedisServer {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Started with extra settings (`["--rename-command", "CONFIG", ""]`).
    pub async fn start_with(args: &[&str]) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("inventory-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("create the redis-server directory");
        let args = args.iter().map(|a| (*a).to_owned()).collect();
        let mut server = Self { port, url: format!("redis://127.0.0.1:{port}"), dir, child: None, args };
        server.spawn().await;
        server
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server (is it installed? apt-get install redis-server): {e}")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while ping_redis(&self.url).await.is_err() {
            assert!(Instant::now() < deadline, "redis-server on port {} did not answer PING within 10 s", self.port);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: the server dies without saving anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill -9 and start again on the same port and directory: the server loads what it
    /// last saved there (an explicit `SAVE`), as a Redis restarted from an older snapshot.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// Kill -9 and start again on the same port, empty (no persistence).
    pub async fn restart_empty(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A token file in the temp directory with the given permission bits, removed when
/// dropped (servers refuse token files that group or others may read).
pub struct TokenFile {
    pub path: PathBuf,
}

impl TokenFile {
    pub fn new(text: &str, mode: u32) -> Self {
        let path = std::env::temp_dir().join(format!("inventory-test-{}.token", unique_suffix()));
        let file = Self { path };
        file.write(text, mode);
        file
    }

    /// Replaces the file's text and mode (a rotation, before a SIGHUP).
    pub fn write(&self, text: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&self.path, text).expect("token file written");
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(mode)).expect("token file mode set");
    }

    pub fn arg(&self) -> &str {
        self.path.to_str().expect("temp paths are UTF-8")
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// SIGSTOPs process `pid` and returns once every thread of it is stopped: `kill` returns
/// when the signal is sent, and a busy multi-threaded process (a Go server, say) may run
/// on for a while on its other cores, answering what it already read. Panics if the
/// signal cannot be sent, or the process is not stopped within 10 s.
pub fn stop_process(pid: u32) {
    let status = Command::new("kill").args(["-STOP", &pid.to_string()]).status();
    assert!(status.is_ok_and(|s| s.success()), "cannot SIGSTOP process {pid}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_threads_stopped(pid) {
        assert!(Instant::now() < deadline, "process {pid} still runs 10 s after SIGSTOP");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is in state `T` (stopped), as `/proc/<pid>/task/*/stat` says.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            // The state follows the command name, which is in parentheses and may hold spaces.
            .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T')))
    })
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn replaces_the_database_name_only() {
        assert_eq!(
            replace_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(replace_database("postgres://u:p@h/db?sslmode=disable", "x"), "postgres://u:p@h/x?sslmode=disable");
        assert_eq!(replace_database("postgres://h:5432", "x"), "postgres://h:5432/x");
    }
}
