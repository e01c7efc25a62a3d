//! What a caller can hold at the agent's gRPC port: a call stuck past the agent's request
//! timeout answers DEADLINE_EXCEEDED (a documented code, saying to retry with the same
//! key), and a connection that never sends its HTTP/2 preface is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inventory_agent::startup::REQUEST_TIMEOUT;
use inventory_net::edge::PREFACE_TIMEOUT;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_stuck_past_the_request_timeout_answers_deadline_exceeded() {
    let center = Center::start_sqlite().await;
    center.create_item("slow", 100, 10, (5, 50, 20)).await;
    let store = Arc::new(ObservedStore::gated());
    let agent = LocalAgent::start_with(agent_config(&center.url, "app", &StoreSpec::Memory), Some(store.clone())).await;
    let mut client = agent.client().await;
    let started = Instant::now();
    // The store holds the Acquire: the agent's own limit ends the call.
    let err = client.acquire(acquire_req("slow", "u1", 1, "k1")).await.expect_err("the call is stuck");
    let took = started.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(
        err.message(),
        format!("request timed out after {} ms; retry with the same idempotency_key", REQUEST_TIMEOUT.as_millis())
    );
    assert!(took >= REQUEST_TIMEOUT && took < REQUEST_TIMEOUT + Duration::from_secs(5), "answered after {took:?}");
    // Counted with the code the caller saw.
    let metrics = http_get(agent.http_addr, "/metrics").await;
    let counted = metrics.lines().any(|l| {
        l.starts_with("inventory_rpc_requests_total{")
            && l.contains(r#"method="Acquire""#)
            && l.contains(r#"code="deadline_exceeded""#)
            && l.ends_with(" 1")
    });
    assert!(counted, "{metrics}");
    // The retry with the same key, once the store answers, reserves once.
    store.open_gate();
    let r = client.acquire(acquire_req("slow", "u1", 1, "k1")).await.expect("the retry answers").into_inner();
    assert_eq!(r.outcome(), inventory_proto::v1::AcquireOutcome::Reserved);
    let s = client
        .get_stock(inventory_proto::v1::GetStockRequest { item_id: "slow".into() })
        .await
        .expect("stock")
        .into_inner();
    assert_eq!(s.reserved, 1, "one reservation for the key: {s:?}");
}

/// Opens a raw TCP connection to `addr`, writes `send`, then only reads: returns how long
/// the server took to close it (EOF or reset), or `None` if it was still open after `within`.
pub async fn closed_after(addr: SocketAddr, send: &[u8], within: Duration) -> Option<Duration> {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    socket.write_all(send).await.expect("write");
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(within, async {
        // The server may speak first (its SETTINGS frame): read until it hangs up.
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    closed.ok().map(|()| started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_its_http2_preface_is_closed() {
    let center = Center::start_sqlite().await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let bound = PREFACE_TIMEOUT + Duration::from_secs(5);
    // Silent, and a preface cut short: both are closed within the bound.
    let (silent, partial) =
        tokio::join!(closed_after(agent.addr, b"", bound), closed_after(agent.addr, b"PRI * HTTP/2.0\r\n", bound));
    for (what, closed) in [("silent", silent), ("partial preface", partial)] {
        let took = closed.unwrap_or_else(|| panic!("{what}: still open after {bound:?}"));
        assert!(took >= PREFACE_TIMEOUT - Duration::from_millis(100), "{what}: closed after {took:?}, too early");
    }
    // A real client is served as before.
    let mut client = agent.client().await;
    let s = client.get_stock(inventory_proto::v1::GetStockRequest { item_id: "none".into() }).await;
    assert!(s.is_ok() || s.as_ref().is_err_and(|e| e.code() == Code::NotFound), "{s:?}");
}
