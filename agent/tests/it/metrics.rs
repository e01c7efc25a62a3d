//! /metrics of a center and an agent after a sale agree with the ledger.

use inventory_proto::v1 as pb;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, http_get, sample};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_ledger_after_a_sale_and_a_graceful_stop() {
    let center = Center::start_sqlite().await;
    center.create_item("m", 100, 1, (10, 40, 20)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    for i in 0..7 {
        let r = client.acquire(acquire_req("m", &format!("u{i}"), 1, &format!("k{i}"))).await.unwrap().into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    }
    let again = client.acquire(acquire_req("m", "u0", 1, "other-key")).await.unwrap().into_inner();
    assert_eq!(again.outcome(), pb::AcquireOutcome::LimitExceeded);
    center.await_quiescence().await;

    let text = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&text, r#"inventory_agent_acquires_total{channel="app",outcome="reserved"}"#), Some(7.0));
    assert_eq!(sample(&text, r#"inventory_agent_acquires_total{channel="app",outcome="limit_exceeded"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"inventory_agent_pool_units{channel="app",item="m",state="reserved"}"#), Some(7.0));
    let view = center.ledger("m").await;
    let app = &view.channels[0];
    let pool_available = sample(&text, r#"inventory_agent_pool_units{channel="app",item="m",state="available"}"#);
    assert_eq!(pool_available, Some(app.reported_available as f64));

    let text = http_get(center.http_addr, "/metrics").await;
    let item = view.item.as_ref().unwrap();
    assert_eq!(sample(&text, r#"inventory_center_available_units{item="m"}"#), Some(item.available as f64));
    assert_eq!(sample(&text, r#"inventory_center_held_units{item="m",channel="app"}"#), Some(app.held as f64));
    assert_eq!(sample(&text, r#"inventory_center_channel_drift_units{item="m",channel="app"}"#), Some(0.0));
    assert!(http_get(center.http_addr, "/healthz").await.starts_with("ok"));

    // A graceful stop gives back everything not reserved.
    agent.stop().await;
    let view = center.ledger("m").await;
    assert_eq!((view.item.unwrap().available, view.channels[0].held), (93, 7));
}
