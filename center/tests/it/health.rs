//! Health says what serves: a center whose PostgreSQL connections go through the fault
//! proxy turns NOT_SERVING (`/healthz` 503 with the reason, gRPC health of the server, the
//! Center and the Admin service) while its database does not answer, and serving again
//! once it does.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::proxy::{Fault, FaultProxy};
use inventory_test_support::{database_server_url, wait_until};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::console::http_get;
use crate::support::{Backend, TestCenter};

/// The services the center's gRPC health answers for (the empty name: the whole server).
const SERVICES: [&str; 3] = ["", "inventory.v1.Center", "inventory.v1.Admin"];

/// The PostgreSQL server named by `url` (`postgres://user@host:port/db`, a loopback
/// address), and `url` with its host and port replaced by `via`.
fn reroute(url: &str, via: SocketAddr) -> (SocketAddr, String) {
    let start = url.find("://").expect("a database url") + 3;
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    let host_start = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
    let host = &url[host_start..end];
    let host = if host.contains(':') { host.to_owned() } else { format!("{host}:5432") };
    let server = host
        .to_socket_addrs()
        .expect("the database host resolves")
        .find(|a| a.ip().is_loopback())
        .expect("the test database is on a loopback address");
    (server, format!("{}{via}{}", &url[..host_start], &url[end..]))
}

/// `/healthz`'s status and body, and every service's gRPC health.
async fn health(center: &TestCenter, grpc: &mut HealthClient<tonic::transport::Channel>) -> (u16, String, Vec<i32>) {
    let (status, _, body) = http_get(center.http_addr, "/healthz").await;
    let mut statuses = Vec::new();
    for service in SERVICES {
        let answer = grpc.check(HealthCheckRequest { service: service.to_owned() }).await.expect("health answers");
        statuses.push(answer.into_inner().status);
    }
    (status, body, statuses)
}

async fn await_health(
    center: &TestCenter,
    grpc: &HealthClient<tonic::transport::Channel>,
    http: u16,
    grpc_status: ServingStatus,
    within: Duration,
) -> bool {
    wait_until(within, || {
        let mut grpc = grpc.clone();
        async move {
            let (status, _, statuses) = health(center, &mut grpc).await;
            status == http && statuses.iter().all(|s| *s == grpc_status as i32)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_not_serving_while_the_database_does_not_answer_and_back() {
    let (server, _) = reroute(&database_server_url(), "127.0.0.1:1".parse().expect("an address"));
    let proxy = FaultProxy::start(server).await.expect("the proxy starts");
    let via = proxy.addr();
    let center = TestCenter::start_with(Backend::Postgres, |c| c.database_url = reroute(&c.database_url, via).1).await;
    assert!(proxy.connections_accepted() > 0, "the center reaches its database through the proxy");
    let channel = tonic::transport::Endpoint::from_shared(center.url()).expect("a url").connect().await;
    let mut grpc = HealthClient::new(channel.expect("connect health"));
    let mut admin = center.admin().await;

    let (status, body, statuses) = health(&center, &mut grpc).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(statuses, [ServingStatus::Serving as i32; 3]);

    // Two ways for a database not to answer: silence (a partition) and refused connections.
    for fault in [Fault::BlackHole, Fault::Reset] {
        proxy.set(fault);
        let down = await_health(&center, &grpc, 503, ServingStatus::NotServing, Duration::from_secs(10)).await;
        let (status, body, statuses) = health(&center, &mut grpc).await;
        assert!(down, "{fault:?}: still {status} {body:?}, gRPC {statuses:?}");
        assert!(body.starts_with("not serving: the database "), "{fault:?}: a short reason: {body:?}");

        proxy.set(Fault::Pass);
        let up = await_health(&center, &grpc, 200, ServingStatus::Serving, Duration::from_secs(15)).await;
        let (status, body, statuses) = health(&center, &mut grpc).await;
        assert!(up, "{fault:?} lifted: still {status} {body:?}, gRPC {statuses:?}");
        // Serving means serving: the ledger takes writes again.
        let item = format!("health-{}", format!("{fault:?}").to_lowercase());
        admin
            .create_item(pb::CreateItemRequest {
                item_id: item.clone(),
                total: 10,
                per_user_limit: 1,
                reservation_ttl_ms: 60_000,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{fault:?} lifted: create {item}: {e}"));
    }
}

#[test]
fn reroute_swaps_only_host_and_port() {
    let via: SocketAddr = "127.0.0.1:7000".parse().expect("an address");
    let (server, url) = reroute("postgres://postgres@127.0.0.1:5432/db_1?sslmode=disable", via);
    assert_eq!(server, "127.0.0.1:5432".parse::<SocketAddr>().expect("an address"));
    assert_eq!(url, "postgres://postgres@127.0.0.1:7000/db_1?sslmode=disable");
    let (server, url) = reroute("postgres://u:p@127.0.0.1/db", via);
    assert_eq!(server.port(), 5432);
    assert_eq!(url, "postgres://u:p@127.0.0.1:7000/db");
}
