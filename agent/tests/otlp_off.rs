//! Without `--otlp-endpoint` no exporter exists: a Borrow through a real agent and center
//! sends nothing to a collector that is listening, and the agent's call keeps the
//! request-id `traceparent`. Its own test binary: the global subscriber is set once per
//! process.

#[allow(dead_code)]
#[path = "support/collector.rs"]
mod collector;
#[allow(dead_code)]
#[path = "it/harness.rs"]
mod harness;

use std::time::Duration;

use collector::Collector;
use harness::{Center, LocalAgent, StoreSpec, acquire_req};
use inventory_net::LogFormat;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_built_or_exported() {
    let collector = Collector::start().await;
    let telemetry = inventory_net::init_tracing(LogFormat::Text, None).expect("tracing set up");
    assert!(!telemetry.exporting(), "no exporter without an endpoint");
    assert!(!inventory_net::trace::exporting());

    let center = Center::start_sqlite().await;
    center.create_item("tea", 100, 10, (5, 20, 10)).await;
    let agent = LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await;
    let reply = agent.client().await.acquire(acquire_req("tea", "u1", 1, "k1")).await.expect("acquire").into_inner();
    assert!(!reply.reservation_id.is_empty(), "{reply:?}");

    // Inside a span, as the agent's Borrow is: no OpenTelemetry context is written.
    let span = tracing::info_span!("borrow");
    let mut metadata = tonic::metadata::MetadataMap::new();
    assert!(!span.in_scope(|| inventory_net::trace::inject_current(&mut metadata)));
    assert!(metadata.is_empty(), "{metadata:?}");

    telemetry.shutdown().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());
    drop(agent);
}
