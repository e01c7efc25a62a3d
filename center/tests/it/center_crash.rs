//! kill -9 of the center (PostgreSQL ledger) in the middle of a sale: the agent keeps
//! selling its local pool, the restarted center carries on from the database, and the
//! invariants hold.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use inventory_agent::config::StoreKind;
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TestDatabase, free_port, wait_until};
use tonic::transport::Channel;

const TOTAL: u64 = 300;

async fn spawn_center(db: &str, addr: SocketAddr) -> tokio::process::Child {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory-center"))
        .args(["--listen", &addr.to_string(), "--http-listen", "127.0.0.1:0", "--database-url", db, "--insecure"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn inventory-center");
    let up =
        wait_until(
            Duration::from_secs(30),
            || async move { AdminClient::connect(format!("http://{addr}")).await.is_ok() },
        )
        .await;
    assert!(up, "center on {addr} never came up");
    child
}

async fn buy(client: &mut AgentClient<Channel>, key: &str) -> Result<bool, tonic::Status> {
    let r = client
        .acquire(pb::AcquireRequest {
            item_id: "c".into(),
            user_id: key.into(),
            quantity: 1,
            idempotency_key: key.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.outcome() == pb::AcquireOutcome::Reserved)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn center_killed_mid_sale_agents_keep_selling_and_the_ledger_holds() {
    let db = TestDatabase::create().await;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let url = format!("http://{addr}");
    let mut center = spawn_center(&db.url, addr).await;
    let mut admin = AdminClient::connect(url.clone()).await.unwrap();
    admin
        .create_item(pb::CreateItemRequest {
            item_id: "c".into(),
            total: TOTAL,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 10, high: 120, batch: 60 }),
            ..Default::default()
        })
        .await
        .unwrap();
    let agent = AgentApp::build(AgentConfig::for_tests("app", &url, StoreKind::Memory, "redis://unused", "x:"))
        .await
        .expect("agent starts");
    let agent_addr = agent.grpc_addr();
    let agent_task = tokio::spawn(agent.run_until(std::future::pending()));
    let mut client = AgentClient::connect(format!("http://{agent_addr}")).await.unwrap();

    let mut sold = 0u64;
    let mut n = 0;
    while sold < 100 {
        n += 1;
        if buy(&mut client, &format!("b{n}")).await.unwrap() {
            sold += 1;
        }
    }
    let before = client.get_stock(pb::GetStockRequest { item_id: "c".into() }).await.unwrap().into_inner();
    assert!(before.available > 0, "the pool has local stock to sell during the outage");

    center.start_kill().unwrap();
    center.wait().await.unwrap();
    // The center is gone: the agent still sells what its pool holds (its lease lasts).
    let mut sold_while_down = 0;
    for _ in 0..before.available {
        n += 1;
        match buy(&mut client, &format!("b{n}")).await {
            Ok(true) => sold_while_down += 1,
            Ok(false) | Err(_) => break,
        }
    }
    assert_eq!(sold_while_down, before.available, "sold the whole local pool while the center was down");
    sold += sold_while_down;
    // With the pool empty and the center down, a buyer is told to retry, not "sold out".
    n += 1;
    let status = buy(&mut client, &format!("b{n}")).await.expect_err("no stock to sell and nobody to ask");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    let _center = spawn_center(&db.url, addr).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while sold < TOTAL {
        assert!(Instant::now() < deadline, "sale stalled at {sold}");
        n += 1;
        match buy(&mut client, &format!("b{n}")).await {
            Ok(true) => sold += 1,
            Ok(false) => {}
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_eq!(sold, TOTAL);

    // Quiescence: reports caught up, ledger clean, everything sold exactly once.
    let mut admin = AdminClient::connect(url.clone()).await.unwrap();
    let settled = wait_until(Duration::from_secs(20), || {
        let mut admin = admin.clone();
        async move {
            let r = admin.reconcile(pb::ReconcileRequest::default()).await.unwrap().into_inner();
            let view = admin.get_item(pb::GetItemRequest { item_id: "c".into() }).await.unwrap().into_inner();
            // Quiet: the last report shows the finished sale and matches what is held.
            r.ok && r.drifts.is_empty() && view.channels[0].reported_reserved == TOTAL
        }
    })
    .await;
    assert!(settled, "ledger never settled");
    let view = admin.get_item(pb::GetItemRequest { item_id: "c".into() }).await.unwrap().into_inner();
    let app = &view.channels[0];
    assert_eq!((view.item.unwrap().available, app.held, app.reported_reserved), (0, TOTAL, TOTAL));
    agent_task.abort();
}
