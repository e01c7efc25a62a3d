//! Metrics both servers export alike: calls, errors and latency per gRPC method (one tower
//! layer in front of the services) and the build the process runs.
//!
//! [`RpcMetrics::layer`] learns each call's status without holding it up: a status sent
//! in the response headers (a trailers-only answer, which is how tonic answers every
//! error) ends the call at once; otherwise the response body is passed through frame by
//! frame and the `grpc-status` trailer ends it (a unary answer just after its message, a
//! `WatchChannel` stream when it closes). A call whose response is dropped before it has
//! a status (the client went away, the server's deadline fired) counts as `cancelled`,
//! which is what the caller saw.
//!
//! Label values come only from bounded sets: the methods of the descriptor sets the
//! server was built with (any other path is `unknown`), and the 17 gRPC codes.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use prost::Message;
use tonic::Code;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The version the binaries are built as (the workspace's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binaries are built from, "unknown" outside a git checkout.
pub const GIT_HASH: &str = env!("INVENTORY_GIT_HASH");

/// What `--version` prints after the program's name.
pub const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("INVENTORY_GIT_HASH"), ")");

/// Registers `inventory_build_info{version, git} 1`.
pub fn register_build_info(registry: &mut Registry) {
    registry.register(
        "inventory_build",
        "The version and git commit this server was built from (always 1)",
        Info::new([("version", VERSION), ("git", GIT_HASH)]),
    );
}

/// A gRPC status code as a label value (`ok`, `invalid_argument`, ...).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// Upper bounds (seconds) of the RPC latency buckets: from a memory answer to a stuck call.
const DURATION_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// `service`, `method`.
type MethodLabels = [(&'static str, Arc<str>); 2];
/// `service`, `method`, `code`.
type CallLabels = (MethodLabels, [(&'static str, &'static str); 1]);

struct Inner {
    /// Request path (`/package.Service/Method`) to its method.
    known: HashMap<Box<str>, Arc<Method>>,
    unknown: Arc<Method>,
    requests: Family<CallLabels, Counter>,
    duration: Family<MethodLabels, Histogram>,
    in_flight: Family<MethodLabels, Gauge>,
}

/// One method's labels, and its series once it has had a call: a call then updates them
/// through these handles (atomics, and the histogram's lock) without looking them up in
/// the families (a read lock and a hash of the labels each).
struct Method {
    labels: MethodLabels,
    series: OnceLock<Series>,
    /// Calls answered OK, the common code; other codes go through the family.
    ok: OnceLock<Counter>,
}

struct Series {
    in_flight: Gauge,
    duration: Histogram,
}

impl Method {
    fn new(labels: MethodLabels) -> Arc<Self> {
        Arc::new(Self { labels, series: OnceLock::new(), ok: OnceLock::new() })
    }
}

/// Per-method call counters, latency and calls in flight of one gRPC server.
#[derive(Clone)]
pub struct RpcMetrics(Arc<Inner>);

impl std::fmt::Debug for RpcMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcMetrics").field("methods", &self.0.known.len()).finish()
    }
}

impl RpcMetrics {
    /// Metrics for the methods declared in `descriptor_sets` (encoded
    /// `FileDescriptorSet`s, as the generated code and tonic's health service ship them).
    pub fn new(descriptor_sets: &[&[u8]]) -> Self {
        let mut known = HashMap::new();
        for set in descriptor_sets {
            // The sets are compiled into the binary; one that does not decode names nothing.
            let Ok(set) = prost_types::FileDescriptorSet::decode(*set) else { continue };
            for file in &set.file {
                let package = file.package();
                for service in &file.service {
                    let full: Arc<str> = if package.is_empty() {
                        service.name().into()
                    } else {
                        format!("{package}.{}", service.name()).into()
                    };
                    for method in &service.method {
                        let path = format!("/{full}/{}", method.name());
                        known.insert(
                            path.into_boxed_str(),
                            Method::new([("service", Arc::clone(&full)), ("method", method.name().into())]),
                        );
                    }
                }
            }
        }
        let unknown = Method::new([("service", Arc::from("unknown")), ("method", Arc::from("unknown"))]);
        Self(Arc::new(Inner {
            known,
            unknown,
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            in_flight: Family::default(),
        }))
    }

    /// Adds the RPC families to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "inventory_rpc_requests",
            "gRPC calls finished, by service, method and status code",
            self.0.requests.clone(),
        );
        registry.register(
            "inventory_rpc_duration_seconds",
            "Time from a gRPC call's arrival to its status, by service and method (a stream: its lifetime)",
            self.0.duration.clone(),
        );
        registry.register(
            "inventory_rpc_in_flight",
            "gRPC calls (streams included) started and not yet finished, by service and method",
            self.0.in_flight.clone(),
        );
    }

    /// The tower layer that measures every call passing through it.
    pub fn layer(&self) -> RpcMetricsLayer {
        RpcMetricsLayer(self.clone())
    }

    fn start(&self, path: &str) -> Call {
        let method = Arc::clone(self.0.known.get(path).unwrap_or(&self.0.unknown));
        self.series(&method).in_flight.inc();
        Call { metrics: self.clone(), method, started: Instant::now(), done: false }
    }

    fn series<'a>(&self, method: &'a Method) -> &'a Series {
        method.series.get_or_init(|| Series {
            in_flight: self.0.in_flight.get_or_create(&method.labels).clone(),
            duration: self.0.duration.get_or_create(&method.labels).clone(),
        })
    }
}

/// One call being measured; ends exactly once, as `cancelled` if dropped unfinished.
struct Call {
    metrics: RpcMetrics,
    method: Arc<Method>,
    started: Instant,
    done: bool,
}

impl Call {
    fn end(&mut self, code: Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let (m, method) = (&self.metrics, &*self.method);
        let series = m.series(method);
        series.in_flight.dec();
        series.duration.observe(self.started.elapsed().as_secs_f64());
        let requests = |code| m.0.requests.get_or_create(&(method.labels.clone(), [("code", code_name(code))])).clone();
        match code {
            Code::Ok => method.ok.get_or_init(|| requests(Code::Ok)).inc(),
            other => requests(other).inc(),
        };
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.end(Code::Cancelled);
    }
}

/// The status in a header map (`grpc-status`), if there is one.
fn status_in(headers: &http::HeaderMap) -> Option<Code> {
    headers.get("grpc-status").map(|v| Code::from_bytes(v.as_bytes()))
}

/// The status tonic will answer for an error of the layers inside this one (load
/// shedding's refusal, a status, ...): the same inference as `tonic::Status::from_error`,
/// made on a borrowed error because the error itself travels on.
fn status_of_error(err: &(dyn StdError + 'static)) -> Code {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(status) = e.downcast_ref::<tonic::Status>() {
            return status.code();
        }
        if e.is::<tower::load_shed::error::Overloaded>() {
            return Code::ResourceExhausted;
        }
        if e.is::<tonic::TimeoutExpired>() {
            return Code::Cancelled;
        }
        source = e.source();
    }
    Code::Unknown
}

/// See [`RpcMetrics::layer`].
#[derive(Clone, Debug)]
pub struct RpcMetricsLayer(RpcMetrics);

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService { inner, metrics: self.0.clone() }
    }
}

#[derive(Clone, Debug)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: RpcMetrics,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for RpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let call = self.metrics.start(req.uri().path());
        ResponseFuture { inner: self.inner.call(req), call: Some(call) }
    }
}

pin_project_lite::pin_project! {
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<http::Response<MeteredBody<ResBody>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let mut call = this.call.take();
        match result {
            Ok(response) => {
                if let (Some(c), Some(code)) = (call.as_mut(), status_in(response.headers())) {
                    c.end(code);
                    call = None;
                }
                Poll::Ready(Ok(response.map(|inner| MeteredBody { inner, call })))
            }
            Err(e) => {
                let e = e.into();
                if let Some(c) = call.as_mut() {
                    c.end(status_of_error(&*e));
                }
                Poll::Ready(Err(e))
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body passed through unchanged; its `grpc-status` trailer ends the call.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        let code = match &polled {
            Some(Ok(frame)) => frame.trailers_ref().and_then(status_in),
            // The stream broke, or ended without saying how: the client got no status.
            Some(Err(_)) | None => Some(Code::Unknown),
        };
        if let Some(code) = code
            && let Some(mut call) = this.call.take()
        {
            call.end(code);
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tower::{Layer, Service};

    /// A body of given frames, then the end.
    struct Frames(VecDeque<Frame<&'static [u8]>>);

    impl Body for Frames {
        type Data = &'static [u8];
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    fn trailers(code: i32) -> Frame<&'static [u8]> {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", code.to_string().parse().expect("header value"));
        Frame::trailers(t)
    }

    /// Answers every call with the next prepared response (or error).
    struct Answers(VecDeque<Result<http::Response<Frames>, BoxError>>);

    impl Service<http::Request<()>> for Answers {
        type Response = http::Response<Frames>;
        type Error = BoxError;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _req: http::Request<()>) -> Self::Future {
            std::future::ready(self.0.pop_front().expect("a prepared answer"))
        }
    }

    fn text(metrics: &RpcMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).expect("encode");
        out
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).expect("request")
    }

    async fn next_frame<B: Body + Unpin>(body: &mut B) -> Option<Result<Frame<B::Data>, B::Error>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    const CHECK: &str = "/grpc.health.v1.Health/Check";
    const WATCH: &str = "/grpc.health.v1.Health/Watch";

    fn series(name: &str, method: &str, code: Option<&str>) -> String {
        match code {
            Some(c) => format!(r#"{name}{{service="grpc.health.v1.Health",method="{method}",code="{c}"}}"#),
            None => format!(r#"{name}{{service="grpc.health.v1.Health",method="{method}"}}"#),
        }
    }

    #[tokio::test]
    async fn a_status_in_headers_or_in_trailers_is_counted_once_with_its_code() {
        let metrics = RpcMetrics::new(&[tonic_health::pb::FILE_DESCRIPTOR_SET]);
        let trailers_only = http::Response::builder().header("grpc-status", "5").body(Frames(VecDeque::new())).unwrap();
        let unary = http::Response::new(Frames(VecDeque::from([Frame::data(&b"answer"[..]), trailers(0)])));
        let mut svc = metrics.layer().layer(Answers(VecDeque::from([Ok(trailers_only), Ok(unary)])));

        let response = svc.call(request(CHECK)).await.expect("response");
        let t = text(&metrics);
        assert_eq!(value(&t, &series("inventory_rpc_requests_total", "Check", Some("not_found"))), Some(1.0), "{t}");
        // Reading the (empty) body of a finished call counts nothing more.
        let mut body = response.into_body();
        assert!(next_frame(&mut body).await.is_none());
        drop(body);

        let mut body = svc.call(request(CHECK)).await.expect("response").into_body();
        let t = text(&metrics);
        assert_eq!(value(&t, &series("inventory_rpc_in_flight", "Check", None)), Some(1.0), "until the trailer: {t}");
        assert!(next_frame(&mut body).await.expect("data").expect("frame").is_data());
        assert!(next_frame(&mut body).await.expect("trailers").expect("frame").is_trailers());
        drop(body);
        let t = text(&metrics);
        assert_eq!(value(&t, &series("inventory_rpc_requests_total", "Check", Some("ok"))), Some(1.0), "{t}");
        assert_eq!(value(&t, &series("inventory_rpc_requests_total", "Check", Some("not_found"))), Some(1.0), "{t}");
        assert_eq!(value(&t, &series("inventory_rpc_in_flight", "Check", None)), Some(0.0), "{t}");
        assert_eq!(value(&t, &series("inventory_rpc_duration_seconds_count", "Check", None)), Some(2.0), "{t}");
    }

    #[tokio::test]
    async fn a_stream_is_in_flight_until_it_ends_and_dropped_unfinished_is_cancelled() {
        let metrics = RpcMetrics::new(&[tonic_health::pb::FILE_DESCRIPTOR_SET]);
        let stream = || {
            http::Response::new(Frames(VecDeque::from([Frame::data(&b"1"[..]), Frame::data(&b"2"[..]), trailers(14)])))
        };
        let mut svc = metrics.layer().layer(Answers(VecDeque::from([Ok(stream()), Ok(stream())])));

        let mut finished = svc.call(request(WATCH)).await.expect("response").into_body();
        let mut abandoned = svc.call(request(WATCH)).await.expect("response").into_body();
        // Messages pass as they come: each is readable before the stream ends.
        assert!(next_frame(&mut finished).await.expect("1").expect("frame").is_data());
        assert!(next_frame(&mut abandoned).await.expect("1").expect("frame").is_data());
        let t = text(&metrics);
        assert_eq!(value(&t, &series("inventory_rpc_in_flight", "Watch", None)), Some(2.0), "{t}");
        assert!(!t.contains("inventory_rpc_requests_total{"), "nothing finished yet: {t}");

        drop(abandoned);
        while next_frame(&mut finished).await.is_some() {}
        let t = text(&metrics);
        assert_eq!(value(&t, &series("inventory_rpc_requests_total", "Watch", Some("unavailable"))), Some(1.0), "{t}");
        assert_eq!(value(&t, &series("inventory_rpc_requests_total", "Watch", Some("cancelled"))), Some(1.0), "{t}");
        assert_eq!(value(&t, &series("inventory_rpc_in_flight", "Watch", None)), Some(0.0), "{t}");
    }

    #[tokio::test]
    async fn refusals_of_inner_layers_count_as_the_status_tonic_answers_and_unknown_paths_share_one_label() {
        let metrics = RpcMetrics::new(&[tonic_health::pb::FILE_DESCRIPTOR_SET]);
        let shed: BoxError = Box::new(tower::load_shed::error::Overloaded::new());
        let mut svc = metrics.layer().layer(Answers(VecDeque::from([
            Err(shed),
            Ok(http::Response::builder().header("grpc-status", "12").body(Frames(VecDeque::new())).unwrap()),
        ])));
        let Err(err) = svc.call(request(CHECK)).await else { panic!("shed") };
        assert!(err.is::<tower::load_shed::error::Overloaded>(), "the error travels on unchanged");
        let _ = svc.call(request("/evil.Service/anything-at-all")).await.expect("response");
        let t = text(&metrics);
        assert_eq!(
            value(&t, &series("inventory_rpc_requests_total", "Check", Some("resource_exhausted"))),
            Some(1.0),
            "{t}"
        );
        let unknown = r#"inventory_rpc_requests_total{service="unknown",method="unknown",code="unimplemented"}"#;
        assert_eq!(value(&t, unknown), Some(1.0), "{t}");
        assert!(!t.contains("evil"), "{t}");
    }

    #[test]
    fn build_info_names_version_and_commit() {
        let mut registry = Registry::default();
        register_build_info(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).expect("encode");
        let line = format!(r#"inventory_build_info{{version="{VERSION}",git="{GIT_HASH}"}} 1"#);
        assert!(out.lines().any(|l| l == line), "{out}");
        assert!(out.contains("# TYPE inventory_build_info gauge"), "{out}");
        assert!(!GIT_HASH.is_empty());
    }
}
