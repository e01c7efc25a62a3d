//! Trace export over OTLP/gRPC (`--otlp-endpoint`) and the W3C trace context carried
//! between agent and center, so one Borrow's spans on both sides join one trace.
//!
//! Without an endpoint nothing here runs: no exporter is built, no OpenTelemetry layer
//! sits in the subscriber, and [`inject_current`] / [`adopt_remote_parent`] return at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Set once the OpenTelemetry layer is part of the global subscriber.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// How long shutdown waits for the last batch to reach the collector.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Where spans go and whose they are.
#[derive(Debug, Clone)]
pub struct OtlpExport {
    /// The collector's OTLP/gRPC URL, e.g. `http://127.0.0.1:4317`.
    pub endpoint: String,
    /// `service.name` of the resource.
    pub service_name: String,
    /// Further resource attributes (the agent's channel).
    pub attributes: Vec<(&'static str, String)>,
}

impl OtlpExport {
    pub fn new(endpoint: &str, service_name: &str) -> Self {
        Self { endpoint: endpoint.to_owned(), service_name: service_name.to_owned(), attributes: Vec::new() }
    }

    pub fn with_attribute(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.attributes.push((key, value.into()));
        self
    }
}

/// Whether spans are being exported (an endpoint was given and the layer installed).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

pub(crate) fn set_exporting() {
    EXPORTING.store(true, Ordering::Relaxed);
}

/// Holds the exporter of [`crate::init_tracing`]; [`TracingGuard::shutdown`] sends what
/// is still batched before the process exits.
#[must_use = "dropping the guard without shutdown loses the last batch of spans"]
pub struct TracingGuard {
    pub(crate) provider: Option<SdkTracerProvider>,
}

impl TracingGuard {
    /// Whether an exporter was built.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends what is batched now, and keeps exporting.
    pub async fn flush(&self) {
        let Some(provider) = self.provider.clone() else { return };
        match tokio::task::spawn_blocking(move || provider.force_flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "trace export did not flush"),
            Err(e) => tracing::warn!(error = %e, "trace export did not flush"),
        }
    }

    /// Flushes and stops the exporter. The SDK waits on a thread of its own for the
    /// export, so the wait is moved off the async workers that drive the gRPC call.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else { return };
        match tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "trace export did not flush"),
            Err(e) => tracing::warn!(error = %e, "trace export did not flush"),
        }
    }
}

/// The batch exporter. The tonic channel it opens is driven by the current Tokio runtime,
/// so this is called from inside one.
pub(crate) fn provider(otlp: &OtlpExport) -> anyhow::Result<SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(otlp.endpoint.clone())
        .build()
        .map_err(|e| anyhow::anyhow!("cannot set up trace export to {}: {e}", otlp.endpoint))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(otlp.service_name.clone())
        .with_attributes(otlp.attributes.iter().map(|(k, v)| opentelemetry::KeyValue::new(*k, v.clone())))
        .build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

struct MetadataWriter<'a>(&'a mut MetadataMap);

impl Injector for MetadataWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value)) {
            self.0.insert(k, v);
        }
    }
}

struct MetadataReader<'a>(&'a MetadataMap);

impl Extractor for MetadataReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Writes the current span's context as `traceparent`, making it the parent of the call
/// the caller is about to send. False (nothing written) when not exporting or outside a
/// span, so the caller keeps its own header.
pub fn inject_current(metadata: &mut MetadataMap) -> bool {
    if !exporting() {
        return false;
    }
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return false;
    }
    TraceContextPropagator::new().inject_context(&cx, &mut MetadataWriter(metadata));
    true
}

/// Makes `span` (not yet entered) a child of the caller's span named by the request's
/// `traceparent`, when exporting.
pub fn adopt_remote_parent(span: &tracing::Span, metadata: &MetadataMap) {
    if !exporting() {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&MetadataReader(metadata));
    if cx.span().span_context().is_valid() {
        // Fails only for a span that is disabled or already started: then it stays a root.
        let _ = span.set_parent(cx);
    }
}
