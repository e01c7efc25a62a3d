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
