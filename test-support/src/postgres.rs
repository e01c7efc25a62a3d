//! A private PostgreSQL server for tests that stop, crash, replicate or promote the
//! center's database: `initdb` into a directory of its own, `pg_ctl` on a free port.
//!
//! The binaries are PostgreSQL's (`INVENTORY_TEST_PG_BIN`, default the Debian path of
//! PostgreSQL 15). PostgreSQL refuses to run as root: when the tests do, every command runs
//! as the `postgres` user (`runuser -u postgres --`) and the directory is given to it.
//! The server listens on 127.0.0.1 only, trusts local connections (user `postgres`), and
//! keeps its socket in its own directory. Stopped (`-m immediate`) and removed when dropped.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::free_port;

const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn pg_bin(tool: &str) -> PathBuf {
    let dir = std::env::var("INVENTORY_TEST_PG_BIN").unwrap_or_else(|_| DEFAULT_PG_BIN.to_owned());
    Path::new(&dir).join(tool)
}

/// Whether this process runs as root (PostgreSQL's tools then run as `postgres`).
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Runs one of PostgreSQL's tools (as `postgres` when we are root); panics with its output
/// when it fails.
fn run(tool: &str, args: &[&str]) -> Output {
    let bin = pg_bin(tool);
    let mut cmd = if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    let out = cmd
        .args(args)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (is PostgreSQL 15 installed?): {e}", bin.display()));
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A directory PostgreSQL may own: created, and given to `postgres` when we are root.
fn private_dir(kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("inventory-pg-{kind}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create the PostgreSQL directory");
    if running_as_root() {
        let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
        assert!(status.is_ok_and(|s| s.success()), "cannot give {} to the postgres user", dir.display());
    }
    dir
}

/// One private PostgreSQL server (a primary, or a standby streaming from one).
pub struct PgServer {
    pub port: u16,
    dir: PathBuf,
}

impl PgServer {
    /// A fresh cluster (`initdb`), started; ready for streaming standbys (`wal_level =
    /// replica`, replication connections trusted from 127.0.0.1).
    pub async fn start() -> Self {
        let server = Self { port: free_port(), dir: private_dir("primary") };
        let data = server.data();
        run("initdb", &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\nwal_level = replica\n\
             max_wal_senders = 5\nhot_standby = on\nfsync = off\nfull_page_writes = off\nmax_connections = 100\n\
             wal_sender_timeout = 5s\nwal_receiver_timeout = 5s\n",
            server.port,
            server.dir.display()
        );
        server.append_conf(&conf);
        let hba = "host replication postgres 127.0.0.1/32 trust\nhost all postgres 127.0.0.1/32 trust\n";
        append(&Path::new(&data).join("pg_hba.conf"), hba);
        server.start_again().await;
        server
    }

    /// A standby of the server reached at `upstream` (the primary, or a proxy in front of
    /// it): `pg_basebackup -R`, so it streams asynchronously (PostgreSQL's default) from
    /// that address. Started; read-only until [`PgServer::promote`].
    pub async fn standby_of(upstream: SocketAddr) -> Self {
        let server = Self { port: free_port(), dir: private_dir("standby") };
        let data = server.data();
        let (host, port) = (upstream.ip().to_string(), upstream.port().to_string());
        tokio::task::block_in_place(|| {
            run("pg_basebackup", &["-h", &host, "-p", &port, "-U", "postgres", "-D", &data, "-R", "-X", "stream"])
        });
        server.append_conf(&format!("port = {}\nunix_socket_directories = '{}'\n", server.port, server.dir.display()));
        server.start_again().await;
        server
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn append_conf(&self, text: &str) {
        append(&Path::new(&self.data()).join("postgresql.conf"), text);
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates database `name` and returns its URL.
    pub async fn create_database(&self, name: &str) -> String {
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres")).await.expect("connect to the private server");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create database");
        let _ = conn.close().await;
        self.url(name)
    }

    /// `pg_ctl start`, then waits until it accepts connections (a standby: until it answers).
    pub async fn start_again(&self) {
        let log = self.dir.join("server.log").display().to_string();
        run("pg_ctl", &["-D", &self.data(), "-l", &log, "-w", "-t", "60", "start"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sqlx::PgConnection::connect(&self.url("postgres")).await.is_err() {
            assert!(Instant::now() < deadline, "private PostgreSQL on port {} does not answer", self.port);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `pg_ctl stop -m immediate`: the server dies at once, no checkpoint, connections cut
    /// (what a crash does; the next start recovers from the WAL).
    pub fn stop_immediate(&self) {
        run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
    }

    /// Turns a standby into a primary (`pg_ctl promote`), waiting until it accepts writes.
    pub async fn promote(&self) {
        run("pg_ctl", &["-D", &self.data(), "-w", "-t", "60", "promote"]);
        let mut conn =
            sqlx::PgConnection::connect(&self.url("postgres")).await.expect("connect to the promoted server");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (recovering,): (bool,) =
                sqlx::query_as("SELECT pg_is_in_recovery()").fetch_one(&mut conn).await.expect("pg_is_in_recovery");
            if !recovering {
                break;
            }
            assert!(Instant::now() < deadline, "the standby on port {} was never promoted", self.port);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = conn.close().await;
    }

    /// Bytes of WAL this server has written (a primary) or replayed (a standby): what a
    /// test compares to see how far a standby lags.
    pub async fn wal_position(&self) -> i64 {
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres")).await.expect("connect");
        let (lsn,): (i64,) = sqlx::query_as(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END \
             - '0/0'::pg_lsn)::bigint",
        )
        .fetch_one(&mut conn)
        .await
        .expect("wal position");
        let _ = conn.close().await;
        lsn
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let bin = pg_bin("pg_ctl");
        let data = self.data();
        let mut cmd = if running_as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let _ = cmd
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f =
        std::fs::OpenOptions::new().append(true).open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
