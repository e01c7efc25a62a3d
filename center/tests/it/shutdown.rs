//! Stopping the center binary with agents attached: SIGTERM ends every `WatchChannel`
//! stream and the process exits within its bound, even while a call is stuck; a second
//! signal exits at once.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use inventory_agent::config::StoreKind;
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::{TestDatabase, free_port, wait_until};
use sqlx::Connection;
use tokio::process::Child;
use tokio::time::timeout;

/// The bound the center promises between SIGTERM and exit.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

async fn spawn_center(db: &str) -> (Child, String) {
    spawn_center_at(db, format!("127.0.0.1:{}", free_port()).parse().unwrap()).await
}

async fn spawn_center_at(db: &str, addr: SocketAddr) -> (Child, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .args(["--listen", &addr.to_string(), "--http-listen", "127.0.0.1:0", "--database-url", db, "--insecure"])
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
    (child, url)
}

fn signal(child: &Child, name: &str) {
    let pid = child.id().expect("center still running").to_string();
    let sent = std::process::Command::new("kill").args([&format!("-{name}"), &pid]).status().expect("run kill");
    assert!(sent.success(), "kill -{name} {pid}");
}

async fn register(url: &str, channel: &str) -> (CenterClient<tonic::transport::Channel>, u64) {
    let mut center = CenterClient::connect(url.to_owned()).await.expect("connect");
    let epoch = center
        .register_agent(pb::RegisterAgentRequest {
            channel: channel.into(),
            agent_id: format!("{channel}-1"),
            fenced_at: 0,
        })
        .await
        .expect("register")
        .into_inner()
        .epoch;
    (center, epoch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_watch_streams_of_three_agents_and_exits_within_the_bound() {
    let db = TestDatabase::create().await;
    let (mut center, url) = spawn_center(&db.url).await;
    let mut streams = Vec::new();
    for channel in ["app", "web", "eu-west"] {
        let (mut client, epoch) = register(&url, channel).await;
        let stream = client
            .watch_channel(pb::WatchChannelRequest { channel: channel.into(), epoch })
            .await
            .expect("watch")
            .into_inner();
        streams.push(stream);
    }

    signal(&center, "TERM");
    // The server ends each stream (an agent then reconnects elsewhere) instead of
    // waiting for the agents to hang up.
    for stream in &mut streams {
        let end = timeout(SHUTDOWN_BOUND, stream.message()).await.expect("stream ended within the bound");
        assert!(matches!(end, Ok(None)), "stream ended cleanly by the server: {end:?}");
    }
    let status = timeout(SHUTDOWN_BOUND, center.wait()).await.expect("center exited within the bound").unwrap();
    assert!(status.success(), "graceful exit: {status:?}");
}

/// Starts a center with one item whose row the returned connection holds locked, and a
/// Borrow waiting on that lock: a call that cannot finish.
async fn center_with_a_stuck_borrow(db: &TestDatabase) -> (Child, sqlx::PgConnection) {
    let (center, url) = spawn_center(&db.url).await;
    let mut admin = AdminClient::connect(url.clone()).await.unwrap();
    admin
        .create_item(pb::CreateItemRequest { item_id: "i".into(), total: 10, ..Default::default() })
        .await
        .expect("create item");
    let (mut client, epoch) = register(&url, "app").await;
    let mut lock = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut lock).await.unwrap();
    sqlx::query("SELECT * FROM items WHERE item_id = 'i' FOR UPDATE").execute(&mut lock).await.unwrap();
    tokio::spawn(async move {
        let _ = client
            .borrow(pb::BorrowRequest {
                item_id: "i".into(),
                channel: "app".into(),
                epoch,
                quantity: 1,
                request_id: "stuck".into(),
                ..Default::default()
            })
            .await;
    });
    let name = db.url.rsplit('/').next().unwrap().to_owned();
    let server = inventory_test_support::database_server_url();
    let waiting = wait_until(Duration::from_secs(10), || {
        let (name, server) = (name.clone(), server.clone());
        async move {
            let mut conn = sqlx::PgConnection::connect(&server).await.unwrap();
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
            )
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            n > 0
        }
    })
    .await;
    assert!(waiting, "the borrow never waited on the row lock");
    (center, lock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_call_holds_shutdown_no_longer_than_the_bound() {
    let db = TestDatabase::create().await;
    let (mut center, _lock) = center_with_a_stuck_borrow(&db).await;
    signal(&center, "TERM");
    let exited = timeout(SHUTDOWN_BOUND + Duration::from_secs(2), center.wait()).await;
    assert!(exited.is_ok(), "center still running {:?} after SIGTERM", SHUTDOWN_BOUND + Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let db = TestDatabase::create().await;
    let (mut center, _lock) = center_with_a_stuck_borrow(&db).await;
    signal(&center, "TERM");
    // The first signal drains: the stuck call keeps the center up for now.
    assert!(timeout(Duration::from_millis(500), center.wait()).await.is_err(), "the first signal drains first");
    signal(&center, "TERM");
    let exited = timeout(Duration::from_secs(1), center.wait()).await;
    assert!(exited.is_ok(), "center ignored the second signal");
}

/// Buys `units` from an agent, one unit per buyer, retrying while the agent answers
/// UNAVAILABLE (its center is away); fails after `deadline`.
async fn buy(client: &mut AgentClient<tonic::transport::Channel>, prefix: &str, units: u64, deadline: Instant) {
    let mut sold = 0;
    let mut n = 0;
    while sold < units {
        assert!(Instant::now() < deadline, "{prefix}: sold {sold} of {units} before the deadline");
        n += 1;
        let key = format!("{prefix}-{n}");
        let r = client
            .acquire(pb::AcquireRequest {
                item_id: "c".into(),
                user_id: key.clone(),
                quantity: 1,
                idempotency_key: key,
                ..Default::default()
            })
            .await;
        match r.map(|r| r.into_inner().outcome()) {
            Ok(pb::AcquireOutcome::Reserved) => sold += 1,
            Ok(_) => {}
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{prefix}: {s:?}");
                // Back off while the agent reaches the center again.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_sell_through_a_restarted_center_within_a_lease() {
    const LEASE: Duration = Duration::from_secs(10);
    let db = TestDatabase::create().await;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (mut center, url) = spawn_center_at(&db.url, addr).await;
    let mut admin = AdminClient::connect(url.clone()).await.unwrap();
    admin
        .create_item(pb::CreateItemRequest {
            item_id: "c".into(),
            total: 3_000,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 5, high: 40, batch: 20 }),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut agents = Vec::new();
    for channel in ["app", "web", "eu-west"] {
        let config = AgentConfig::for_tests(channel, &url, StoreKind::Memory, "redis://unused", "x:");
        let agent = AgentApp::build(config).await.expect("agent starts");
        let client = AgentClient::connect(format!("http://{}", agent.grpc_addr())).await.unwrap();
        let task = tokio::spawn(agent.run_until(std::future::pending()));
        agents.push((channel, client, task));
    }
    for (channel, client, _) in &mut agents {
        buy(client, &format!("{channel}-before"), 5, Instant::now() + LEASE).await;
    }

    signal(&center, "TERM");
    let status = timeout(SHUTDOWN_BOUND, center.wait()).await.expect("center exited within the bound").unwrap();
    assert!(status.success(), "{status:?}");

    let (_center, _) = spawn_center_at(&db.url, addr).await;
    // Each agent sells more than its pool held: the rest is borrowed from the new center.
    let deadline = Instant::now() + LEASE;
    for (channel, client, _) in &mut agents {
        let pool = client.get_stock(pb::GetStockRequest { item_id: "c".into() }).await.unwrap().into_inner();
        buy(client, &format!("{channel}-after"), pool.available + 25, deadline).await;
    }
    for (_, _, task) in agents {
        task.abort();
    }
}
