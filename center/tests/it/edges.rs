//! What a caller can hold at the center's gRPC port: a call stuck past the center's request
//! timeout answers DEADLINE_EXCEEDED (saying to retry with the same request_id), not
//! CANCELLED, and a connection that never sends its HTTP/2 preface is closed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use inventory_center::startup::REQUEST_TIMEOUT;
use inventory_net::edge::PREFACE_TIMEOUT;
use inventory_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

use crate::contract::{create, ledger, register};
use crate::support::{Backend, TestCenter};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_stuck_past_the_request_timeout_answers_deadline_exceeded() {
    let c = TestCenter::start(Backend::Sqlite).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    // The Borrow commits and its handler never answers: only the center's own limit ends it
    // (the caller sets no deadline).
    c.faults.lose_borrow_replies.store(1, std::sync::atomic::Ordering::SeqCst);
    let ask = || pb::BorrowRequest {
        item_id: "i".into(),
        channel: "app".into(),
        epoch,
        quantity: 25,
        request_id: "stuck-1".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let err = center.borrow(ask()).await.expect_err("the call is stuck");
    let took = started.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(
        err.message(),
        format!("request timed out after {} ms; retry with the same request_id", REQUEST_TIMEOUT.as_millis())
    );
    assert!(took >= REQUEST_TIMEOUT && took < REQUEST_TIMEOUT + Duration::from_secs(5), "answered after {took:?}");
    // As it says: the retry with the same id gets the grant that committed, once.
    let retry = center.borrow(ask()).await.expect("the retry answers").into_inner();
    assert_eq!((retry.granted, retry.replayed), (25, true));
    assert_eq!(ledger(&mut admin, "i").await.channels[0].granted, 25);
}

/// Opens a raw TCP connection to `addr`, writes `send`, then only reads: how long the
/// server took to close it (EOF or reset), or `None` if it was still open after `within`.
async fn closed_after(addr: SocketAddr, send: &[u8], within: Duration) -> Option<Duration> {
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
    let c = TestCenter::start(Backend::Sqlite).await;
    // With TLS, a client that never starts its handshake is closed the same way.
    let pki = inventory_test_support::pki::TestPki::generate();
    let tls = TestCenter::start_with(Backend::Sqlite, |c| {
        c.tls_cert = Some(pki.server.cert.clone());
        c.tls_key = Some(pki.server.key.clone());
    })
    .await;
    let bound = PREFACE_TIMEOUT + Duration::from_secs(5);
    let (silent, partial, silent_tls) = tokio::join!(
        closed_after(c.addr, b"", bound),
        closed_after(c.addr, b"PRI * HTTP/2.0\r\n", bound),
        closed_after(tls.addr, b"", bound)
    );
    for (what, closed) in [("silent", silent), ("partial preface", partial), ("silent on tls", silent_tls)] {
        let took = closed.unwrap_or_else(|| panic!("{what}: still open after {bound:?}"));
        assert!(took >= PREFACE_TIMEOUT - Duration::from_millis(100), "{what}: closed after {took:?}, too early");
    }
    // A real client is served as before.
    let mut admin = c.admin().await;
    create(&mut admin, "after", 10).await;
}
