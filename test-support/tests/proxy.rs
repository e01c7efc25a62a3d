//! The fault proxy against a small echo server on 127.0.0.1: each fault does what it says to
//! real TCP connections, and `Fault::Pass` heals.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use inventory_test_support::proxy::{Fault, FaultProxy};
use inventory_test_support::wait_until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

/// How long something that should happen may take.
const PATIENCE: Duration = Duration::from_secs(5);
/// How long we watch for something that should not happen.
const QUIET: Duration = Duration::from_millis(300);

/// Echoes every chunk back and reports it through `received`; counts upstream connections.
struct EchoServer {
    addr: SocketAddr,
    received: mpsc::UnboundedReceiver<Vec<u8>>,
    connections: Arc<AtomicUsize>,
}

impl EchoServer {
    async fn start() -> EchoServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo server");
        let addr = listener.local_addr().expect("echo server address");
        let (report, received) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let report = report.clone();
                tokio::spawn(async move {
                    let mut buf = [0; 4096];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        let _ = report.send(buf[..n].to_vec());
                        if stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        EchoServer { addr, received, connections }
    }

    /// Waits until the server has received exactly `expected` (possibly in several chunks).
    async fn expect_received(&mut self, expected: &[u8]) {
        let mut got = Vec::new();
        while got.len() < expected.len() {
            let chunk = timeout(PATIENCE, self.received.recv())
                .await
                .expect("echo server received nothing in time")
                .expect("echo server stopped");
            got.extend(chunk);
        }
        assert_eq!(got, expected);
    }

    /// Asserts the server receives nothing for `QUIET`.
    async fn expect_nothing_received(&mut self) {
        if let Ok(chunk) = timeout(QUIET, self.received.recv()).await {
            panic!("echo server received {chunk:?}, expected nothing");
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn connect(proxy: &FaultProxy) -> TcpStream {
    timeout(PATIENCE, TcpStream::connect(proxy.addr())).await.expect("connect in time").expect("connect to the proxy")
}

/// Sends `message` and reads the same number of bytes back.
async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    stream.write_all(message).await.expect("write to the proxy");
    let mut reply = vec![0; message.len()];
    timeout(PATIENCE, stream.read_exact(&mut reply)).await.expect("reply in time").expect("read the reply");
    reply
}

/// Asserts `stream` yields neither bytes nor EOF nor an error for `QUIET`.
async fn expect_silence(stream: &mut TcpStream) {
    let mut buf = [0; 64];
    if let Ok(read) = timeout(QUIET, stream.read(&mut buf)).await {
        panic!("expected silence, read returned {read:?}");
    }
}

/// Asserts `stream` is closed promptly: a read gives EOF or an error (RST), never bytes.
async fn expect_closed(stream: &mut TcpStream) {
    let mut buf = [0; 64];
    match timeout(PATIENCE, stream.read(&mut buf)).await.expect("connection closed in time") {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected a closed connection, read {:?}", &buf[..n]),
    }
}

/// Asserts a new connection through `proxy` fails, or is closed right after it opens.
async fn expect_new_connection_refused(proxy: &FaultProxy) {
    if let Ok(Ok(mut stream)) = timeout(PATIENCE, TcpStream::connect(proxy.addr())).await {
        // Nothing read back may be echoed data; writing may fail once the RST has arrived.
        let _ = stream.write_all(b"anyone?").await;
        expect_closed(&mut stream).await;
    }
}

#[tokio::test]
async fn pass_forwards_both_ways() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    assert_eq!(proxy.fault(), Fault::Pass);
    assert_eq!(proxy.url(), format!("http://127.0.0.1:{}", proxy.addr().port()));

    let mut client = connect(&proxy).await;
    assert_eq!(round_trip(&mut client, b"ping").await, b"ping");
    server.expect_received(b"ping").await;

    let large: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(round_trip(&mut client, &large).await, large);
    server.expect_received(&large).await;
    assert_eq!(proxy.connections_accepted(), 1);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn delay_holds_every_chunk_in_both_directions() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let mut client = connect(&proxy).await;
    assert_eq!(round_trip(&mut client, b"warm").await, b"warm");
    server.expect_received(b"warm").await;

    // Applies to the connection already open.
    let hold = Duration::from_millis(150);
    proxy.set(Fault::Delay(hold));
    assert_eq!(proxy.fault(), Fault::Delay(hold));
    let started = Instant::now();
    assert_eq!(round_trip(&mut client, b"slow").await, b"slow");
    let elapsed = started.elapsed();
    // Held once on the way in and once on the way back.
    assert!(elapsed >= 2 * hold, "round trip took {elapsed:?}, expected at least {:?}", 2 * hold);
    server.expect_received(b"slow").await;

    // Order is kept across several chunks in flight.
    for part in [&b"one,"[..], b"two,", b"three"] {
        client.write_all(part).await.expect("write");
    }
    let mut reply = vec![0; b"one,two,three".len()];
    timeout(PATIENCE, client.read_exact(&mut reply)).await.expect("reply in time").expect("read");
    assert_eq!(reply, b"one,two,three");
}

#[tokio::test]
async fn drop_replies_delivers_requests_but_loses_replies() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"warm").await, b"warm");
    server.expect_received(b"warm").await;

    proxy.set(Fault::DropReplies);
    open.write_all(b"commit").await.expect("write");
    server.expect_received(b"commit").await;
    expect_silence(&mut open).await;

    let mut fresh = connect(&proxy).await;
    fresh.write_all(b"commit again").await.expect("write");
    server.expect_received(b"commit again").await;
    expect_silence(&mut fresh).await;
}

#[tokio::test]
async fn black_hole_forwards_nothing_either_way() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"warm").await, b"warm");
    server.expect_received(b"warm").await;

    proxy.set(Fault::BlackHole);
    open.write_all(b"hello?").await.expect("write");
    server.expect_nothing_received().await;
    expect_silence(&mut open).await;

    // New connections are accepted, but nothing reaches upstream, not even the connection.
    let mut fresh = connect(&proxy).await;
    fresh.write_all(b"anyone?").await.expect("write");
    server.expect_nothing_received().await;
    expect_silence(&mut fresh).await;
    assert_eq!(proxy.connections_accepted(), 2);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn reset_closes_open_connections_and_new_ones() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"warm").await, b"warm");
    server.expect_received(b"warm").await;

    proxy.set(Fault::Reset);
    expect_closed(&mut open).await;
    expect_new_connection_refused(&proxy).await;
    server.expect_nothing_received().await;
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn pass_heals_every_fault_for_new_connections() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let faults = [Fault::Delay(Duration::from_millis(50)), Fault::DropReplies, Fault::BlackHole, Fault::Reset];
    for fault in faults {
        proxy.set(fault);
        // Exercise the fault on a connection before healing; what it does was tested above.
        if let Ok(Ok(mut during)) = timeout(PATIENCE, TcpStream::connect(proxy.addr())).await {
            let _ = during.write_all(b"during").await;
            let mut buf = [0; 64];
            let _ = timeout(QUIET, during.read(&mut buf)).await;
        }
        // Forget what reached the server during the fault.
        while server.received.try_recv().is_ok() {}

        proxy.set(Fault::Pass);
        let mut after = connect(&proxy).await;
        assert_eq!(round_trip(&mut after, b"healed").await, b"healed", "after {fault:?}");
        server.expect_received(b"healed").await;
    }
}

#[tokio::test]
async fn a_connection_that_lost_bytes_is_reset_when_healed() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"warm").await, b"warm");
    server.expect_received(b"warm").await;

    proxy.set(Fault::BlackHole);
    open.write_all(b"lost").await.expect("write");
    server.expect_nothing_received().await;

    // Its byte stream now has a gap, so it is not resumed.
    proxy.set(Fault::Pass);
    expect_closed(&mut open).await;
    server.expect_nothing_received().await;
}

#[tokio::test]
async fn a_connection_that_lost_nothing_resumes_when_healed() {
    let mut server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"warm").await, b"warm");
    server.expect_received(b"warm").await;

    proxy.set(Fault::BlackHole);
    // Accepted during the black hole but silent: it connects upstream once healed.
    let mut accepted_during = connect(&proxy).await;
    assert!(wait_until(PATIENCE, || async { proxy.connections_accepted() == 2 }).await, "second connection accepted");
    expect_silence(&mut open).await;
    assert_eq!(server.connections(), 1, "a connection accepted during a black hole stays away from upstream");

    proxy.set(Fault::Pass);
    assert_eq!(round_trip(&mut open, b"still here").await, b"still here");
    server.expect_received(b"still here").await;
    assert_eq!(round_trip(&mut accepted_during, b"me too").await, b"me too");
    server.expect_received(b"me too").await;
}

#[tokio::test]
async fn dropping_the_proxy_closes_connections_and_the_listener() {
    let server = EchoServer::start().await;
    let proxy = FaultProxy::start(server.addr).await.expect("start proxy");
    let addr = proxy.addr();
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"warm").await, b"warm");

    drop(proxy);
    expect_closed(&mut open).await;
    // The listener went with the accept task, which had to finish before the connection task.
    assert!(TcpStream::connect(addr).await.is_err(), "the proxy still accepts connections after drop");
}

#[tokio::test]
async fn refuses_an_upstream_that_is_not_loopback() {
    let upstream: SocketAddr = "192.0.2.1:80".parse().expect("address");
    let error = FaultProxy::start(upstream).await.err().expect("non-loopback upstream must be refused");
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn a_redirect_sends_new_connections_to_the_new_upstream_and_keeps_open_ones() {
    let mut first = EchoServer::start().await;
    let mut second = EchoServer::start().await;
    let proxy = FaultProxy::start(first.addr).await.expect("start proxy");
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"before").await, b"before");
    first.expect_received(b"before").await;

    proxy.redirect(second.addr).expect("redirect to a loopback address");
    let mut fresh = connect(&proxy).await;
    assert_eq!(round_trip(&mut fresh, b"after").await, b"after");
    second.expect_received(b"after").await;
    assert_eq!(round_trip(&mut open, b"still").await, b"still");
    first.expect_received(b"still").await;
    assert_eq!((first.connections(), second.connections()), (1, 1));

    let elsewhere: SocketAddr = "192.0.2.1:80".parse().expect("address");
    assert_eq!(proxy.redirect(elsewhere).err().map(|e| e.kind()), Some(std::io::ErrorKind::InvalidInput));
    let mut last = connect(&proxy).await;
    assert_eq!(round_trip(&mut last, b"kept").await, b"kept");
    second.expect_received(b"kept").await;
}
