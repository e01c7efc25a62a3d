//! Token files checked as a whole at start (the binary refuses with one line naming the
//! file and entries, never the token) and re-read on SIGHUP (a revoked token is refused
//! at once, other callers carry on).

use std::process::Stdio;
use std::time::{Duration, Instant};

use inventory_center::{Application, CenterConfig};
use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::{TestSqlite, TokenFile};
use tonic::Code;

const OPERATOR: &str = "operator-token-0123456789";
const APP: &str = "app-agent-token-0123456789";
const WEB: &str = "web-agent-token-0123456789";

fn run_center(args: &[&str], db: &TestSqlite) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .args(args)
        .env("INVENTORY_DATABASE_URL", &db.url)
        .env("INVENTORY_LISTEN", "127.0.0.1:0")
        .env("INVENTORY_HTTP_LISTEN", "127.0.0.1:0")
        .env_remove("INVENTORY_INSECURE")
        .env_remove("INVENTORY_OPERATOR_TOKEN")
        .env_remove("INVENTORY_AGENT_TOKENS")
        .env_remove("INVENTORY_ALLOW_READABLE_TOKEN_FILES")
        .output()
        .expect("the center binary runs")
}

/// Starts the binary with these files; it must refuse with one line saying `mentions`.
fn refused(operators: &TokenFile, agents: &TokenFile, mentions: &str) {
    let db = TestSqlite::create();
    let out = run_center(&["--operator-token-file", operators.arg(), "--agent-tokens-file", agents.arg()], &db);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("inventory-center: token files: "), "{stderr}");
    assert!(stderr.contains(mentions), "expected {mentions:?} in {stderr}");
    for token in [OPERATOR, APP, WEB] {
        assert!(!stderr.contains(token), "a token in the message: {stderr}");
    }
}

#[test]
fn a_token_for_two_channels_refuses_to_start() {
    let ops = TokenFile::new(OPERATOR, 0o600);
    let agents = TokenFile::new(&format!("app:{APP}\nweb:{APP}\n"), 0o600);
    refused(
        &ops,
        &agents,
        &format!(
            "the same token listed twice: {a} line 1 (channel app) and {a} line 2 (channel web)",
            a = agents.arg()
        ),
    );
}

#[test]
fn an_operator_token_reused_as_an_agent_token_refuses_to_start() {
    let ops = TokenFile::new(&format!("{OPERATOR}\n"), 0o600);
    let agents = TokenFile::new(&format!("app:{APP}\nweb:{OPERATOR}\n"), 0o600);
    refused(
        &ops,
        &agents,
        &format!(
            "an operator's token reused as an agent's: {} line 1 (operator) and {} line 2 (channel web)",
            ops.arg(),
            agents.arg()
        ),
    );
}

#[test]
fn empty_or_short_tokens_refuse_to_start() {
    let agents = TokenFile::new(&format!("app:{APP}\n"), 0o600);
    let empty = TokenFile::new("\n", 0o600);
    refused(&empty, &agents, &format!("{}: no token", empty.arg()));
    let ops = TokenFile::new(OPERATOR, 0o600);
    let short = TokenFile::new(&format!("app:{APP}\nweb:12345\n"), 0o600);
    refused(&ops, &short, &format!("{}: line 2 (channel web): token shorter than 16 characters", short.arg()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_others_may_read_refuses_to_start_unless_allowed() {
    let ops = TokenFile::new(OPERATOR, 0o600);
    let agents = TokenFile::new(&format!("app:{APP}\n"), 0o644);
    refused(&ops, &agents, &format!("{}: mode 644 lets group or others read it", agents.arg()));

    let db = TestSqlite::create();
    let mut cfg = CenterConfig::for_tests(&db.url);
    cfg.insecure = false;
    cfg.operator_token_file = Some(ops.path.clone());
    cfg.agent_tokens_file = Some(agents.path.clone());
    let err = Application::build(cfg.clone()).await.err().expect("refused").to_string();
    assert!(err.contains("mode 644"), "{err}");
    cfg.allow_readable_token_files = true;
    Application::build(cfg).await.expect("starts with --allow-readable-token-files");
}

/// The center binary on free ports with these token files; killed when dropped. Its log
/// lines (stderr) are collected.
struct Center {
    child: std::process::Child,
    url: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Center {
    fn start(db: &TestSqlite, ops: &TokenFile, agents: &TokenFile) -> Self {
        let port = inventory_test_support::free_port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
            .args(["--operator-token-file", ops.arg(), "--agent-tokens-file", agents.arg()])
            .env("INVENTORY_DATABASE_URL", &db.url)
            .env("INVENTORY_LISTEN", format!("127.0.0.1:{port}"))
            .env("INVENTORY_HTTP_LISTEN", "127.0.0.1:0")
            .env_remove("INVENTORY_INSECURE")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the center binary starts");
        let mut child = child;
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        let sink = std::sync::Arc::clone(&log);
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, url: format!("http://127.0.0.1:{port}"), log }
    }

    /// Waits (bounded: 10 s) until a log line contains `text`; returns it.
    async fn logged(&self, text: &str, after: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.log.lock().unwrap().iter().skip(after).find(|l| l.contains(text)) {
                return line.clone();
            }
            assert!(Instant::now() < deadline, "no log line with {text:?}: {:?}", self.log.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn lines(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    fn hangup(&self) {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "SIGHUP sent");
    }
}

impl Drop for Center {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

async fn register(client: &mut CenterClient<tonic::transport::Channel>, channel: &str, token: &str) -> Code {
    let req = pb::RegisterAgentRequest { channel: channel.into(), agent_id: format!("{channel}-1"), fenced_at: 0 };
    match client.register_agent(with_token(req, token)).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Polls `probe` until it returns `want` (bounded: 10 s, 20 ms apart).
async fn until_code<F, Fut>(what: &str, want: Code, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Code>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = probe().await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {got:?}, expected {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_revokes_a_removed_token_and_keeps_serving_the_others() {
    let db = TestSqlite::create();
    let ops = TokenFile::new(OPERATOR, 0o600);
    let agents = TokenFile::new(&format!("app:{APP}\nweb:{WEB}\n"), 0o600);
    let center = Center::start(&db, &ops, &agents);
    let endpoint = tonic::transport::Endpoint::from_shared(center.url.clone()).unwrap();
    // The same connection throughout: revocation must not need a new one.
    let mut client = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.is_none() {
        match endpoint.connect().await {
            Ok(ch) => client = Some(CenterClient::new(ch)),
            Err(e) => assert!(Instant::now() < deadline, "center did not start: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut client = client.expect("connected");
    assert_eq!(register(&mut client, "app", APP).await, Code::Ok);
    assert_eq!(register(&mut client, "web", WEB).await, Code::Ok);

    // web's token leaked: take it out of the file, and hang up.
    agents.write(&format!("app:{APP}\n"), 0o600);
    center.hangup();
    let c = client.clone();
    until_code("web's revoked token", Code::Unauthenticated, || {
        let mut c = c.clone();
        async move { register(&mut c, "web", WEB).await }
    })
    .await;
    assert_eq!(register(&mut client, "app", APP).await, Code::Ok, "app carries on on the same connection");

    // A reload that fails the checks keeps the tokens in force and says why: had it
    // applied, app's token would now act for web (the later entry) and app be refused.
    let before = center.lines();
    agents.write(&format!("app:{APP}\nweb:{APP}\n"), 0o600);
    center.hangup();
    let line = center.logged("token files not re-read", before).await;
    assert!(line.contains("the same token listed twice") && !line.contains(APP), "{line}");
    assert_eq!(register(&mut client, "app", APP).await, Code::Ok, "the old set stays in force");
    assert_eq!(register(&mut client, "web", WEB).await, Code::Unauthenticated);
}
