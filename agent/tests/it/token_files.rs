//! The agent's token files checked as a whole at start: its own `--center-token-file` and
//! the backends' tokens. Each bad file refuses to start with one line naming the file and
//! the entries, never the token; SIGHUP re-reads them.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TokenFile, wait_until};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{AgentProcess, Center, StoreSpec};

const BACKEND: &str = "backend-token-0123456789";
const CENTER: &str = "center-token-0123456789";

fn refused(center: &TokenFile, backends: &TokenFile, mentions: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-agent"))
        .args(["--channel", "app", "--center-token-file", center.arg(), "--backend-tokens-file", backends.arg()])
        .env("INVENTORY_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_HTTP_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_CENTER", "http://127.0.0.1:9")
        .env_remove("INVENTORY_INSECURE")
        .env_remove("INVENTORY_CENTER_TOKEN")
        .env_remove("INVENTORY_BACKEND_TOKENS")
        .env_remove("INVENTORY_ALLOW_READABLE_TOKEN_FILES")
        .output()
        .expect("the agent binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("inventory-agent: token files: "), "{stderr}");
    assert!(stderr.contains(mentions), "expected {mentions:?} in {stderr}");
    for token in [BACKEND, CENTER, "t0k5x"] {
        assert!(!stderr.contains(token), "a token in the message: {stderr}");
    }
}

#[test]
fn an_empty_or_short_center_token_file_refuses_to_start() {
    let backends = TokenFile::new(BACKEND, 0o600);
    let empty = TokenFile::new("", 0o600);
    refused(&empty, &backends, &format!("{}: no token", empty.arg()));
    let short = TokenFile::new("t0k5x\n", 0o600);
    refused(&short, &backends, &format!("{}: line 1: token shorter than 16 characters (5 given)", short.arg()));
}

#[test]
fn a_backend_token_equal_to_the_center_token_refuses_to_start() {
    let backends = TokenFile::new(&format!("{BACKEND}\n{CENTER}\n"), 0o600);
    let center = TokenFile::new(CENTER, 0o600);
    refused(
        &center,
        &backends,
        &format!(
            "the same token listed twice: {} line 2 (backend) and {} line 1 (center)",
            backends.arg(),
            center.arg()
        ),
    );
    let twice = TokenFile::new(&format!("{BACKEND}\n{BACKEND}\n"), 0o600);
    refused(&TokenFile::new(CENTER, 0o600), &twice, "the same token listed twice");
}

#[test]
fn a_center_token_file_others_may_read_refuses_to_start() {
    let backends = TokenFile::new(BACKEND, 0o600);
    let center = TokenFile::new(CENTER, 0o640);
    refused(&center, &backends, &format!("{}: mode 640 lets group or others read it", center.arg()));
}

async fn get_stock(client: &mut AgentClient<Channel>, token: &str) -> Code {
    let mut req = tonic::Request::new(pb::GetStockRequest { item_id: "i".into() });
    req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    match client.get_stock(req).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// A backend token removed from its file and SIGHUP sent: the next call with it is
/// UNAUTHENTICATED (on the same connection), the other backend is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_revokes_a_backend_token_and_keeps_serving_the_others() {
    const OTHER: &str = "other-backend-token-0123456789";
    let center = Center::start_sqlite().await;
    center.create_item("i", 100, 1, (5, 20, 10)).await;
    let backends = TokenFile::new(&format!("{BACKEND}\n{OTHER}\n"), 0o600);
    let center_token = TokenFile::new(CENTER, 0o600);
    let args = ["--backend-tokens-file", backends.arg(), "--center-token-file", center_token.arg()];
    let agent = AgentProcess::spawn_with(&center.url, "app", &StoreSpec::Memory, None, "app-1", &args).await;
    let mut client = agent.client().await;
    assert_eq!(get_stock(&mut client, BACKEND).await, Code::Ok);
    assert_eq!(get_stock(&mut client, OTHER).await, Code::Ok);

    backends.write(&format!("{OTHER}\n"), 0o600);
    let pid = agent.child.id().expect("running").to_string();
    let hup = tokio::process::Command::new("kill").args(["-HUP", &pid]).status().await.expect("kill runs");
    assert!(hup.success());
    let revoked = wait_until(Duration::from_secs(10), || {
        let mut c = client.clone();
        async move { get_stock(&mut c, BACKEND).await == Code::Unauthenticated }
    })
    .await;
    assert!(revoked, "the removed token is refused after SIGHUP");
    assert_eq!(get_stock(&mut client, OTHER).await, Code::Ok, "the other backend carries on");
}
