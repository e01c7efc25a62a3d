//! Bounds on what a caller can hold at either gRPC server: a call, and a connection.
//!
//! - [`RequestTimeoutLayer`]: a call still running after the server's limit answers
//!   DEADLINE_EXCEEDED with a message that says what to do (retry with the same id), not
//!   tonic's own CANCELLED, which is no code the API documents. Only the call's start is
//!   bounded (until the response headers), so server streams run on.
//! - [`PrefaceDeadline`] (through [`incoming`]): a connection that has not sent the 24
//!   bytes of the HTTP/2 preface within [`PREFACE_TIMEOUT`] is closed. hyper bounds an
//!   HTTP/1 request's headers, but waits for an HTTP/2 preface for ever, and its keepalive
//!   pings start only after it; so a peer that connects and sends nothing would hold a
//!   socket (and a graceful shutdown) for good.
//! - [`HTTP2_KEEPALIVE_INTERVAL`] and [`HTTP2_KEEPALIVE_TIMEOUT`]: pings on established
//!   connections, so a peer that vanished without a FIN is noticed and its connection freed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Sleep;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpIncoming};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a new connection may take to send the HTTP/2 preface (and, with TLS, to finish
/// the handshake).
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may stay silent before the server pings it.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long the server waits for a ping's acknowledgement before it closes the connection.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's half of the HTTP/2 connection preface (RFC 9113, 3.4).
const PREFACE_BYTES: usize = 24;

/// The listener's connections, each with TCP_NODELAY (the builder's own setting does not
/// apply to a caller-supplied listener, and Nagle's delay shows as ~40 ms stalls) and under
/// a [`PrefaceDeadline`].
pub fn incoming(
    listener: TcpListener,
) -> impl Stream<Item = Result<PrefaceDeadline<tokio::net::TcpStream>, std::io::Error>> + Send + 'static {
    TcpIncoming::from(listener).with_nodelay(Some(true)).map(|accepted| accepted.map(PrefaceDeadline::new))
}

pin_project_lite::pin_project! {
    /// A connection whose reads fail with `TimedOut` when its first [`PREFACE_BYTES`] have
    /// not all arrived within [`PREFACE_TIMEOUT`] of the accept; afterwards, a plain
    /// connection. The server's connection task is the one reading, so the error ends it.
    ///
    /// With TLS the bytes counted are the handshake's, bounded by the TLS acceptor's own
    /// timeout (set to the same [`PREFACE_TIMEOUT`]).
    pub struct PrefaceDeadline<IO> {
        #[pin]
        inner: IO,
        // Preface bytes still to arrive; 0 once it did.
        awaited: usize,
        deadline: Option<Pin<Box<Sleep>>>,
    }
}

impl<IO> PrefaceDeadline<IO> {
    pub fn new(inner: IO) -> Self {
        Self::with_timeout(inner, PREFACE_TIMEOUT)
    }

    pub fn with_timeout(inner: IO, timeout: Duration) -> Self {
        Self { inner, awaited: PREFACE_BYTES, deadline: Some(Box::pin(tokio::time::sleep(timeout))) }
    }
}

impl<IO: AsyncRead> AsyncRead for PrefaceDeadline<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.inner.poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            *this.awaited = this.awaited.saturating_sub(buf.filled().len() - before);
        }
        if *this.awaited == 0 {
            *this.deadline = None;
            return polled;
        }
        if polled.is_pending()
            && let Some(deadline) = this.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no HTTP/2 preface within {} ms", PREFACE_TIMEOUT.as_millis()),
            )));
        }
        polled
    }
}

impl<IO: AsyncWrite> AsyncWrite for PrefaceDeadline<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<IO: Connected> Connected for PrefaceDeadline<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Answers DEADLINE_EXCEEDED for a call whose response has not started within `timeout`,
/// naming the limit and the id to retry with (`retry_with`, e.g. `idempotency_key`).
#[derive(Clone, Debug)]
pub struct RequestTimeoutLayer {
    timeout: Duration,
    retry_with: &'static str,
}

impl RequestTimeoutLayer {
    pub fn new(timeout: Duration, retry_with: &'static str) -> Self {
        Self { timeout, retry_with }
    }

    /// The status a timed-out call answers.
    pub fn status(&self) -> tonic::Status {
        tonic::Status::deadline_exceeded(format!(
            "request timed out after {} ms; retry with the same {}",
            self.timeout.as_millis(),
            self.retry_with
        ))
    }
}

impl<S> tower::Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout { inner, layer: self.clone() }
    }
}

#[derive(Clone, Debug)]
pub struct RequestTimeout<S> {
    inner: S,
    layer: RequestTimeoutLayer,
}

impl<S, Req> tower::Service<Req> for RequestTimeout<S>
where
    S: tower::Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = TimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        TimeoutFuture {
            inner: self.inner.call(req),
            sleep: tokio::time::sleep(self.layer.timeout),
            layer: Some(self.layer.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    pub struct TimeoutFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: Sleep,
        layer: Option<RequestTimeoutLayer>,
    }
}

impl<F, T, E> Future for TimeoutFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.inner.poll(cx) {
            return Poll::Ready(result.map_err(Into::into));
        }
        ready!(this.sleep.poll(cx));
        // tonic turns a `Status` error into the call's answer.
        let status =
            this.layer.take().map_or_else(|| tonic::Status::deadline_exceeded("request timed out"), |l| l.status());
        Poll::Ready(Err(Box::new(status)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn a_call_past_the_limit_answers_deadline_exceeded_naming_limit_and_id() {
        let slow = tower::service_fn(|_: ()| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, std::convert::Infallible>("late")
        });
        let mut svc = RequestTimeoutLayer::new(Duration::from_millis(50), "idempotency_key").layer(slow);
        let err = svc.ready().await.expect("ready").call(()).await.expect_err("timed out");
        let status = err.downcast::<tonic::Status>().expect("a status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(status.message(), "request timed out after 50 ms; retry with the same idempotency_key");
        let status = RequestTimeoutLayer::new(Duration::from_secs(10), "request_id").status();
        assert_eq!(status.message(), "request timed out after 10000 ms; retry with the same request_id");

        let quick = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>("on time") });
        let mut svc = RequestTimeoutLayer::new(Duration::from_millis(10), "request_id").layer(quick);
        assert_eq!(svc.ready().await.expect("ready").call(()).await.expect("answered"), "on time");
    }

    #[tokio::test]
    async fn a_connection_is_cut_without_its_preface_and_kept_with_it() {
        let (client, server) = tokio::io::duplex(64);
        let mut silent = PrefaceDeadline::with_timeout(server, Duration::from_millis(50));
        let mut buf = [0u8; 64];
        let err = silent.read(&mut buf).await.expect_err("no preface");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        drop(client);

        let (mut client, server) = tokio::io::duplex(64);
        let mut talking = PrefaceDeadline::with_timeout(server, Duration::from_millis(50));
        client.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("write");
        let mut preface = [0u8; PREFACE_BYTES];
        talking.read_exact(&mut preface).await.expect("the preface");
        // Past the deadline, a connection that sent its preface may stay silent.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let read = tokio::time::timeout(Duration::from_millis(100), talking.read(&mut buf)).await;
        assert!(read.is_err(), "still waiting for data, not cut: {read:?}");
    }
}
