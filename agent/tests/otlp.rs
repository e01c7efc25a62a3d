//! Trace export: one Borrow's spans on a real agent and a real center (in-process) reach
//! an OTLP collector as one trace. Its own test binary: the global subscriber is set once
//! per process.

#[path = "support/collector.rs"]
mod collector;
#[allow(dead_code)]
#[path = "it/harness.rs"]
mod harness;

use collector::Collector;
use harness::{Center, LocalAgent, StoreSpec, acquire_req};
use inventory_net::{LogFormat, OtlpExport};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrows_spans_on_agent_and_center_join_one_trace() {
    let collector = Collector::start().await;
    let telemetry = inventory_net::init_tracing(
        LogFormat::Text,
        Some(OtlpExport::new(&collector.url, "inventory-agent").with_attribute("inventory.channel", "web")),
    )
    .expect("tracing set up");
    assert!(telemetry.exporting() && inventory_net::trace::exporting());

    let center = Center::start_sqlite().await;
    center.create_item("tea", 100, 10, (5, 20, 10)).await;
    let agent = LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await;
    // The first Acquire finds no pool: it waits for the Borrow that stocks it.
    let reply = agent.client().await.acquire(acquire_req("tea", "u1", 1, "k1")).await.expect("acquire").into_inner();
    assert!(!reply.reservation_id.is_empty(), "{reply:?}");

    // The agent's span carries the amount it asks for; the center's the request id. The
    // center's span closes when its handler's future is dropped, which may come just after
    // the agent has its answer: flush until both arrived (bounded), then shut down.
    let both = |spans: &[collector::Received]| {
        let borrows = || spans.iter().filter(|s| s.span.name == "borrow");
        borrows().any(|s| s.attribute("want").is_some()) && borrows().any(|s| s.attribute("request_id").is_some())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        telemetry.flush().await;
        if both(&collector.spans()) || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    telemetry.shutdown().await;
    let spans = collector.spans();
    let borrows: Vec<_> = spans.iter().filter(|s| s.span.name == "borrow").collect();
    let on_agent: Vec<_> = borrows.iter().filter(|s| s.attribute("want").is_some()).collect();
    let on_center: Vec<_> = borrows.iter().filter(|s| s.attribute("request_id").is_some()).collect();
    assert!(!on_agent.is_empty() && !on_center.is_empty(), "no borrow spans on both sides: {spans:#?}");
    for c in &on_center {
        let parent = on_agent.iter().find(|a| a.span.span_id == c.span.parent_span_id).unwrap_or_else(|| {
            panic!("the center's borrow span has no agent borrow span as parent: {c:#?} {on_agent:#?}")
        });
        assert_eq!(parent.span.trace_id, c.span.trace_id, "one trace");
        assert_eq!(parent.span.trace_id.len(), 16);
        assert_eq!(c.attribute("trace_id").as_deref(), Some(hex(&c.span.trace_id).as_str()), "logs name the trace");
    }
    let first = on_agent[0];
    assert_eq!(first.resource_attribute("service.name").as_deref(), Some("inventory-agent"));
    assert_eq!(first.resource_attribute("inventory.channel").as_deref(), Some("web"));
    drop(agent);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
