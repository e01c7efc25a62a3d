//! The binary's start-up failures: one line on stderr, exit code 1, no backtrace even
//! when RUST_BACKTRACE asks for one.

use inventory_test_support::TestSqlite;

fn run_center(args: &[&str], db: &TestSqlite) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("INVENTORY_DATABASE_URL", &db.url)
        .env("INVENTORY_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_HTTP_LISTEN", "127.0.0.1:0")
        .env_remove("INVENTORY_INSECURE")
        .env_remove("INVENTORY_OPERATOR_TOKEN")
        .env_remove("INVENTORY_AGENT_TOKENS")
        .output()
        .expect("the center binary runs")
}

fn assert_one_line(out: &std::process::Output, mentions: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line, no backtrace: {stderr}");
    assert!(stderr.starts_with("inventory-center: ") && stderr.contains(mentions), "{stderr}");
    assert!(!stderr.contains("Stack backtrace") && !stderr.contains("Error: "), "{stderr}");
}

#[test]
fn no_tokens_without_insecure_is_one_line() {
    let db = TestSqlite::create();
    assert_one_line(&run_center(&[], &db), "--insecure");
}

#[test]
fn a_port_in_use_is_one_line() {
    let db = TestSqlite::create();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = taken.local_addr().expect("bound").to_string();
    let out = run_center(&["--insecure", "--listen", &addr], &db);
    assert_one_line(&out, "in use");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&addr), "names the address");
}

fn run_center_on(args: &[&str], database_url: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("INVENTORY_DATABASE_URL", database_url)
        .env("INVENTORY_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_HTTP_LISTEN", "127.0.0.1:0")
        .env_remove("INVENTORY_REQUIRE_SYNCHRONOUS_REPLICATION")
        .output()
        .expect("the center binary runs")
}

/// The suite's PostgreSQL has no synchronous standby (`synchronous_standby_names` empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiring_synchronous_replication_without_a_synchronous_standby_is_one_line() {
    let db = inventory_test_support::TestDatabase::create().await;
    let out = run_center_on(&["--insecure", "--require-synchronous-replication"], &db.url);
    assert_one_line(&out, "--require-synchronous-replication: synchronous_standby_names is ''");
    assert!(String::from_utf8_lossy(&out.stderr).contains("oversell"), "says why");
    // Refused before the ledger was opened: nothing was written to the database.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url).await.expect("connect");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&mut conn)
        .await
        .expect("count tables");
    assert_eq!(tables, 0, "a refused start does not migrate the database");
    drop(conn);
    // The environment variable is the same flag.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .args(["--insecure"])
        .env("INVENTORY_DATABASE_URL", &db.url)
        .env("INVENTORY_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_HTTP_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_REQUIRE_SYNCHRONOUS_REPLICATION", "true")
        .output()
        .expect("the center binary runs");
    assert_one_line(&out, "synchronous_standby_names");
}

#[test]
fn requiring_synchronous_replication_on_sqlite_is_one_line() {
    let db = TestSqlite::create();
    assert_one_line(&run_center(&["--insecure", "--require-synchronous-replication"], &db), "SQLite");
}

/// Without the flag the same database is served, after one warning that says the risk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_a_database_without_a_synchronous_standby_is_served_with_a_warning() {
    use tokio::io::AsyncBufReadExt;
    let db = inventory_test_support::TestDatabase::create().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .args(["--insecure"])
        .env("INVENTORY_DATABASE_URL", &db.url)
        .env("INVENTORY_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_HTTP_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_LOG_FORMAT", "text")
        .env("NO_COLOR", "1")
        .env_remove("INVENTORY_REQUIRE_SYNCHRONOUS_REPLICATION")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the center binary starts");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = Vec::new();
    let served = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let serving = line.contains("center serving");
            seen.push(line);
            if serving {
                return true;
            }
        }
        false
    })
    .await;
    let _ = child.kill().await;
    assert_eq!(served, Ok(true), "the center did not start: {seen:#?}");
    let warnings: Vec<&String> = seen.iter().filter(|l| l.contains("standbys can lose commits")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {seen:#?}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("synchronous_standby_names"), "{}", warnings[0]);
    assert!(warnings[0].contains("oversell"), "{}", warnings[0]);
}
