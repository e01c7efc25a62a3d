//! The relay against a real JetStream: a broker down for a whole sale costs no sale and
//! loses no event; agents killed -9 while publishing and a broker restart leave the order
//! consumer's table with exactly one row per reservation, in its final state, no gaps.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use inventory_proto::v1 as pb;
use inventory_test_support::nats::{NatsServer, unique_name};
use inventory_test_support::wait_until;
use prost::Message;

use crate::harness::*;

/// Every message of `stream` (subject, decoded event), in stream order (bounded by
/// `expect` messages or 20 s).
pub async fn read_stream(url: &str, stream: &str, expect: usize) -> Vec<(String, pb::ReservationEvent)> {
    let js = jetstream::new(async_nats::connect(url).await.expect("connect nats"));
    let stream = js.get_stream(stream).await.expect("stream exists");
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("ephemeral consumer");
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while out.len() < expect && tokio::time::Instant::now() < deadline {
        let mut batch = consumer.fetch().max_messages(500).messages().await.expect("fetch");
        let before = out.len();
        while let Some(m) = batch.next().await {
            let m = m.expect("message");
            let event = pb::ReservationEvent::decode(m.payload.clone()).expect("a ReservationEvent");
            out.push((m.subject.to_string(), event));
        }
        if out.len() == before {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    out
}

/// Per pool generation: the sequences seen, sorted (duplicates kept, so they show).
fn sequences(events: &[(String, pb::ReservationEvent)]) -> BTreeMap<(String, String, u64), Vec<u64>> {
    let mut out: BTreeMap<_, Vec<u64>> = BTreeMap::new();
    for (_, e) in events {
        out.entry((e.channel.clone(), e.item_id.clone(), e.pool_generation)).or_default().push(e.sequence);
    }
    for v in out.values_mut() {
        v.sort_unstable();
    }
    out
}

fn relay_config(center: &str, channel: &str, nats: &str, stream: &str, prefix: &str) -> inventory_agent::AgentConfig {
    let mut config = agent_config(center, channel, &StoreSpec::Memory);
    config.nats_url = Some(nats.to_owned());
    config.nats_stream = stream.to_owned();
    config.nats_subject_prefix = prefix.to_owned();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_for_the_whole_sale_costs_no_sale_and_every_event_arrives_after() {
    const BUYERS: u64 = 60;
    let mut nats = NatsServer::start().await;
    nats.kill();
    let center = Center::start_sqlite().await;
    center.create_item("down", 1_000, 1, (20, 80, 50)).await;
    let (stream, prefix) = (unique_name("RELAY_DOWN"), unique_name("relaydown"));
    let agent = LocalAgent::start_with(relay_config(&center.url, "web", &nats.url, &stream, &prefix), None).await;
    let mut client = agent.client().await;
    for i in 0..BUYERS {
        let r = client.acquire(acquire_req("down", &format!("u{i}"), 1, &format!("k{i}"))).await.expect("acquire");
        let r = r.into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "buyer {i}");
        let id = r.reservation_id;
        let state = if i % 2 == 0 {
            client
                .confirm(pb::ConfirmRequest { item_id: "down".into(), reservation_id: id })
                .await
                .unwrap()
                .into_inner()
                .state()
        } else {
            client
                .cancel(pb::CancelRequest { item_id: "down".into(), reservation_id: id })
                .await
                .unwrap()
                .into_inner()
                .state()
        };
        assert_ne!(state, pb::ReservationState::Unspecified);
    }
    let events = 2 * BUYERS;
    // The relay tried, failed, and keeps every event.
    let metrics_show_it = wait_until(Duration::from_secs(10), || async {
        let m = http_get(agent.http_addr, "/metrics").await;
        sample(&m, "inventory_agent_relay_unpublished_events{channel=\"web\",item=\"down\"}") == Some(events as f64)
            && sample(&m, "inventory_agent_relay_publish_failures_total{channel=\"web\"}").is_some_and(|v| v >= 1.0)
            && sample(&m, "inventory_agent_relay_lag_seconds{channel=\"web\"}").is_some_and(|v| v > 0.0)
    })
    .await;
    assert!(metrics_show_it, "metrics: {}", http_get(agent.http_addr, "/metrics").await);
    assert_eq!(stock(&mut client, "down").await.published_event_sequence, 0);

    nats.start_again().await;
    let published = wait_until(Duration::from_secs(30), || {
        let mut client = client.clone();
        async move { stock(&mut client, "down").await.published_event_sequence == events }
    })
    .await;
    assert!(published, "the relay did not publish every event after the broker came back");
    let got = read_stream(&nats.url, &stream, usize::try_from(events).unwrap()).await;
    let seqs = sequences(&got);
    assert_eq!(seqs.len(), 1, "one pool: {:?}", seqs.keys());
    assert_eq!(seqs.values().next().unwrap(), &(1..=events).collect::<Vec<_>>(), "each event once, no gap");
    for (subject, e) in &got {
        assert_eq!(subject, &format!("{prefix}.web.down"));
        assert_eq!(e.event_id, format!("web:down:0:{}:{}", e.pool_generation, e.sequence));
        assert!(!e.reservation_id.is_empty() && !e.user_id.is_empty() && e.quantity == 1);
    }
    // The outbox was trimmed through what the broker acknowledged.
    let pool = inventory_agent::store::PoolKey::new("web", "down");
    let page = agent.agent.store.events(&pool, 1, 1_000).await.unwrap();
    assert!(page.events.is_empty(), "{} events still in the outbox", page.events.len());
    assert_eq!(page.first_kept, events + 1);
    let m = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&m, "inventory_agent_relay_events_published_total{channel=\"web\"}"), Some(events as f64));
    assert_eq!(sample(&m, "inventory_agent_relay_lag_seconds{channel=\"web\"}"), Some(0.0));
    agent.stop().await;
}
