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

/// Messages in `stream` now (0 while the broker does not answer).
async fn stream_messages(url: &str, stream: &str) -> u64 {
    let Ok(client) = async_nats::connect(url).await else { return 0 };
    match jetstream::new(client).get_stream(stream).await {
        Ok(mut s) => s.info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    }
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
    crate::metrics::promtool_check(&m).expect("the relay's metrics pass promtool check metrics");
    agent.stop().await;
}

/// `invctl`, built next to this test binary (brought up to date here: a `-p` run does not
/// build other packages' binaries).
fn invctl_path() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            let dir = exe.parent().and_then(|d| d.parent()).expect("target dir").to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let ok =
                std::process::Command::new(cargo).args(["build", "-q", "-p", "invctl", "--bin", "invctl"]).status();
            assert!(ok.is_ok_and(|s| s.success()), "cannot build invctl");
            dir.join("invctl")
        })
        .clone()
}

/// Calls until answered, retrying (same request) what a backend retries; bounded.
async fn retry<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    for _ in 0..300 {
        match call().await {
            Ok(v) => return v,
            Err(s) if retryable(s.code()) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(s) => panic!("{what}: {s:?}"),
        }
    }
    panic!("{what}: still failing after 300 tries");
}

/// What a buyer does with the unit it reserved, by its number.
fn plan(i: usize) -> &'static str {
    ["confirmed", "cancelled", "expired", "refunded"][i % 4]
}

/// One buyer: reserve one unit (retried with the same key across agent restarts), then
/// confirm, cancel, let it expire, or confirm and refund. Returns (reservation, final state).
async fn buyer(url: String, channel: &'static str, i: usize) -> (String, &'static str) {
    let endpoint = tonic::transport::Endpoint::from_shared(url).unwrap().connect_lazy();
    let client = pb::agent_client::AgentClient::new(endpoint);
    let (user, key) = (format!("{channel}-u{i}"), format!("{channel}-k{i}"));
    let r = retry(&format!("{user} acquire"), || {
        let mut c = client.clone();
        let req = acquire_req(SALE_ITEM, &user, 1, &key);
        async move { c.acquire(req).await }
    })
    .await
    .into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "{user}");
    let id = r.reservation_id;
    let state = plan(i);
    let confirm = || {
        let mut c = client.clone();
        let req = pb::ConfirmRequest { item_id: SALE_ITEM.into(), reservation_id: id.clone() };
        async move { c.confirm(req).await }
    };
    match state {
        "confirmed" => {
            retry(&format!("{user} confirm"), confirm).await;
        }
        "cancelled" => {
            retry(&format!("{user} cancel"), || {
                let mut c = client.clone();
                let req = pb::CancelRequest { item_id: SALE_ITEM.into(), reservation_id: id.clone() };
                async move { c.cancel(req).await }
            })
            .await;
        }
        "refunded" => {
            retry(&format!("{user} confirm"), confirm).await;
            let r = retry(&format!("{user} refund"), || {
                let mut c = client.clone();
                let req = pb::RefundRequest { item_id: SALE_ITEM.into(), reservation_id: id.clone() };
                async move { c.refund(req).await }
            })
            .await;
            assert_eq!(r.into_inner().state(), pb::ReservationState::Refunded, "{user}");
        }
        _ => {}
    }
    (id, state)
}

const SALE_ITEM: &str = "drop";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_match_the_sale_after_two_agent_crashes_and_a_broker_restart() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const PER_CHANNEL: usize = 300;

    let mut nats = NatsServer::start().await;
    let (stream, prefix) = (unique_name("RELAY_SALE"), unique_name("relaysale"));
    let orders = inventory_test_support::TestDatabase::create().await;
    let (sink_stop, sink_stopped) = tokio::sync::oneshot::channel::<()>();
    let sink = tokio::spawn(order_sink::run(
        order_sink::SinkConfig {
            nats_url: nats.url.clone(),
            stream: stream.clone(),
            subject_prefix: prefix.clone(),
            durable: "orders".into(),
            database_url: orders.url.clone(),
            batch: 64,
        },
        async move {
            let _ = sink_stopped.await;
        },
    ));

    let center = Center::start_postgres().await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: SALE_ITEM.into(),
            total: 1_000,
            per_user_limit: 1,
            reservation_ttl_ms: 1_500,
            watermarks: Some(pb::Watermarks { low: 20, high: 80, batch: 50 }),
            rate_batching: None,
            segments: 0,
            ..Default::default()
        })
        .await
        .expect("create item");
    let nats_url = nats.url.clone();
    let nats_flags =
        ["--nats-url", nats_url.as_str(), "--nats-stream", stream.as_str(), "--nats-subject-prefix", prefix.as_str()];
    let mut agents = Vec::new();
    let mut redis = Vec::new();
    for channel in ["app", "web"] {
        let r = inventory_test_support::TestRedis::create().await;
        let spec = StoreSpec::Redis { url: r.url.clone(), prefix: r.prefix.clone() };
        let agent =
            AgentProcess::spawn_with(&center.url, channel, &spec, None, &format!("{channel}-1"), &nats_flags).await;
        agents.push((channel, spec, agent));
        redis.push(r);
    }

    let done = Arc::new(AtomicUsize::new(0));
    let mut buyers = Vec::new();
    for (channel, _, agent) in &agents {
        let (url, done, channel) = (format!("http://{}", agent.addr), Arc::clone(&done), *channel);
        buyers.push(tokio::spawn(async move {
            futures::stream::iter(0..PER_CHANNEL)
                .map(|i| {
                    let (url, done) = (url.clone(), Arc::clone(&done));
                    async move {
                        let got = buyer(url, channel, i).await;
                        done.fetch_add(1, Ordering::Relaxed);
                        got
                    }
                })
                .buffer_unordered(8)
                .collect::<Vec<_>>()
                .await
        }));
    }

    // Faults while the sale runs and the relay publishes: the app agent killed -9 twice
    // (restarted on the same port over the same Redis), the broker once.
    let reached = |n: usize| {
        let done = Arc::clone(&done);
        async move { wait_until(Duration::from_secs(60), || async { done.load(Ordering::Relaxed) >= n }).await }
    };
    for (at, fault) in [(120, "kill app"), (260, "restart broker"), (400, "kill app")] {
        assert!(reached(at).await, "the sale stalled before {at} buyers ({fault})");
        // Each fault strikes while the relay publishes: the stream keeps growing.
        let before = stream_messages(&nats.url, &stream).await;
        assert!(
            wait_until(Duration::from_secs(10), || async { stream_messages(&nats.url, &stream).await > before }).await,
            "the relay published nothing before '{fault}' ({before} messages)"
        );
        if fault == "restart broker" {
            nats.restart().await;
            continue;
        }
        let (channel, spec, agent) = &mut agents[0];
        let port = agent.addr.port();
        agent.kill9().await;
        *agent = AgentProcess::spawn_with(&center.url, channel, spec, Some(port), "app-1", &nats_flags).await;
    }
    let mut expected: BTreeMap<String, &'static str> = BTreeMap::new();
    for b in buyers {
        for (id, state) in b.await.expect("buyers") {
            assert!(expected.insert(id.clone(), state).is_none(), "reservation {id} handed out twice");
        }
    }
    assert_eq!(expected.len(), 2 * PER_CHANNEL);

    // Every reservation reaches its final state in the orders (the unpaid ones expire).
    let db = sqlx::PgPool::connect(&orders.url).await.expect("orders db");
    let rows = || async {
        sqlx::query_as::<_, (String, String)>("SELECT reservation_id, state FROM orders")
            .fetch_all(&db)
            .await
            .expect("read orders")
            .into_iter()
            .collect::<BTreeMap<String, String>>()
    };
    let settled = wait_until(Duration::from_secs(60), || async {
        let got = rows().await;
        got.len() == expected.len() && expected.iter().all(|(id, s)| got.get(id).is_some_and(|g| g == s))
    })
    .await;
    let got = rows().await;
    let wrong: Vec<_> =
        expected.iter().filter(|(id, s)| got.get(*id).map(String::as_str) != Some(**s)).take(10).collect();
    assert!(settled, "{} orders for {} reservations; first wrong: {wrong:?}", got.len(), expected.len());

    // Every pool's events arrived without a gap, each once.
    let seen: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT channel, pool_generation, COUNT(*), MAX(sequence) FROM order_events_seen GROUP BY 1, 2 ORDER BY 1",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(seen.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(), ["app", "web"], "{seen:?}");
    for (channel, generation, count, max) in &seen {
        assert_eq!(count, max, "{channel} generation {generation}: {count} events seen of 1..={max}");
    }
    let events: i64 = seen.iter().map(|s| s.2).sum();
    let expected_events: usize = expected.values().map(|s| if *s == "refunded" { 3 } else { 2 }).sum();
    assert_eq!(events, i64::try_from(expected_events).unwrap(), "one event per transition");

    // invctl agrees: pools, relay and orders match.
    let agent_for: Vec<String> = agents.iter().map(|(c, _, a)| format!("{c}=http://{}", a.addr)).collect();
    let reconciled = wait_until(Duration::from_secs(20), || async {
        let out = tokio::process::Command::new(invctl_path())
            .args(["--center", &center.url, "reconcile", "--orders-db", &orders.url])
            .args(["--agent-for", &agent_for[0], "--agent-for", &agent_for[1]])
            .output()
            .await
            .expect("invctl runs");
        out.status.success()
    })
    .await;
    let out = tokio::process::Command::new(invctl_path())
        .args(["--center", &center.url, "reconcile", "--orders-db", &orders.url])
        .args(["--agent-for", &agent_for[0], "--agent-for", &agent_for[1]])
        .output()
        .await
        .unwrap();
    assert!(
        reconciled && out.status.success(),
        "invctl reconcile --orders-db: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = sink_stop.send(());
    sink.await.expect("sink task").expect("sink stops cleanly");

    // And it notices a lost order: one confirmed order and its events gone.
    let lost: String =
        sqlx::query_scalar("SELECT reservation_id FROM orders WHERE channel = 'web' AND state = 'confirmed' LIMIT 1")
            .fetch_one(&db)
            .await
            .unwrap();
    sqlx::query("DELETE FROM order_events_seen WHERE reservation_id = $1").bind(&lost).execute(&db).await.unwrap();
    sqlx::query("DELETE FROM orders WHERE reservation_id = $1").bind(&lost).execute(&db).await.unwrap();
    let out = tokio::process::Command::new(invctl_path())
        .args(["--center", &center.url, "--output", "json", "reconcile", "--orders-db", &orders.url])
        .args(["--agent-for", &agent_for[0], "--agent-for", &agent_for[1]])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a lost order must fail reconcile: {text}");
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let checks: Vec<&str> = view["order_differences"]
        .as_array()
        .expect("differences listed")
        .iter()
        .map(|d| d["check"].as_str().unwrap())
        .collect();
    assert!(checks.contains(&"sold") && checks.contains(&"gap"), "{text}");
    for (_, _, mut a) in agents {
        a.kill9().await;
    }
}

/// A broker that dies with a batch in flight. The sales happen first (an agent without a
/// relay fills the pool's outbox), so the relay's first page is a full batch; the broker
/// is frozen (SIGSTOP: the connection stays up, nothing is acknowledged) when the relay
/// sends it, then killed -9 and started again on its store. The pass waits out one
/// deadline for the whole batch, not one per event (256 × 2 s), and every event is on the
/// stream within seconds of the broker's return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_with_a_batch_in_flight_has_every_event_within_seconds_of_its_return() {
    use inventory_agent::relay::jetstream::{JetStreamSettings, JetStreamSink};
    use inventory_agent::relay::{EventSink, Relay, RelaySettings, RelayStatus, outbox::StoreOutbox};
    use std::sync::Arc;
    const SALES: u64 = 300;
    let mut nats = NatsServer::start().await;
    let center = Center::start_sqlite().await;
    center.create_item("burst", 1_000, 1, (100, 800, 400)).await;
    let agent = LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    for i in 0..SALES {
        let r = client.acquire(acquire_req("burst", &format!("u{i}"), 1, &format!("k{i}"))).await;
        assert_eq!(r.expect("acquire").into_inner().outcome(), pb::AcquireOutcome::Reserved, "buyer {i}");
    }
    let pool = inventory_agent::store::PoolKey::new("web", "burst");
    assert_eq!(agent.agent.store.events(&pool, 1, 1_000).await.expect("outbox").events.len(), 300);

    let (stream, prefix) = (unique_name("RELAY_INFLIGHT"), unique_name("relayinflight"));
    let sink = JetStreamSink::connect(JetStreamSettings::new(&nats.url, &stream, &prefix)).await.expect("sink");
    // Connected, and the stream made: the next publish goes straight out.
    let ready = sink.publish(&[]).await;
    assert!(ready.error.is_none(), "{:?}", ready.error);
    let status = Arc::new(RelayStatus::default());
    let settings = RelaySettings::default();
    let mut relay = Relay::new(
        Arc::new(StoreOutbox(Arc::clone(&agent.agent.store))),
        Arc::new(sink),
        Arc::clone(&status),
        settings,
    );

    nats.freeze();
    let started = std::time::Instant::now();
    // A deadline per event would hold this pass for 300 x 2 s; one per batch ends it in about
    // 2 x 2 s. The bounds leave room for a busy machine and still tell the two apart.
    let pass = tokio::time::timeout(Duration::from_secs(20), relay.pass(std::slice::from_ref(&pool)))
        .await
        .unwrap_or_else(|_| panic!("a pass over a batch the broker never acknowledges still runs after 20 s"));
    assert!(pass.failed && pass.published == 0, "{pass:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "one deadline per batch, took {:?}", started.elapsed());

    nats.kill();
    nats.start_again().await;
    let back = std::time::Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let pools = vec![pool.clone()];
    let running = tokio::spawn(inventory_agent::relay::run(relay, move || pools.clone(), || true, stop_rx));
    let published =
        wait_until(Duration::from_secs(30), || async { status.progress(&pool).is_some_and(|p| p.published == SALES) })
            .await;
    let took = back.elapsed();
    assert!(published, "{:?} acknowledged {took:?} after the broker came back", status.progress(&pool));
    eprintln!("every event acknowledged {took:?} after the broker came back");
    stop_tx.send_replace(true);
    running.await.expect("the relay stops");
    let got = read_stream(&nats.url, &stream, usize::try_from(SALES).unwrap()).await;
    let seqs = sequences(&got);
    assert_eq!(seqs.len(), 1, "one pool: {:?}", seqs.keys());
    assert_eq!(seqs.values().next().unwrap(), &(1..=SALES).collect::<Vec<_>>(), "each event once, no gap");
    agent.stop().await;
}
