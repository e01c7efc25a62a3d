//! The agent's Redis must keep every key: an evicting `maxmemory-policy` is refused at
//! start and stops sales at run time; a Redis at its memory limit answers UNAVAILABLE
//! naming the limit, and the agent's health says so. Each test has a private
//! `redis-server`, so its settings touch nobody else.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::{RedisServer, wait_until};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, agent_config, config_set, http_status};

async fn grpc_health(agent: &LocalAgent) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", agent.addr)).unwrap().connect().await;
    let mut health = HealthClient::new(channel.expect("connect health"));
    let status = health.check(HealthCheckRequest { service: String::new() }).await.expect("health check");
    status.into_inner().status()
}

/// Serving on both probes (gRPC health and /healthz), or not serving on both.
async fn serving(agent: &LocalAgent) -> Option<bool> {
    let grpc = grpc_health(agent).await;
    let (http, _) = http_status(agent.http_addr, "/healthz").await;
    match (grpc, http) {
        (ServingStatus::Serving, 200) => Some(true),
        (ServingStatus::NotServing, 503) => Some(false),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_to_start_on_an_evicting_redis_in_one_line() {
    let redis = RedisServer::start().await;
    config_set(&redis, "maxmemory-policy", "allkeys-lru").await;
    // Refused before the center is asked: nobody listens at this center address.
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory-agent"))
            .args(["--channel", "app", "--center", "http://127.0.0.1:9", "--insecure"])
            .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
            .args(["--store", "redis", "--redis-url", &redis.url, "--redis-prefix", "inv:"])
            .env("RUST_LOG", "off")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the agent exits at once")
    .expect("run inventory-agent");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    let expected = format!("pool store {} has maxmemory-policy allkeys-lru, not noeviction", redis.url);
    assert!(lines[0].starts_with("inventory-agent: ") && lines[0].contains(&expected), "{stderr}");
    assert!(lines[0].contains("--allow-evicting-redis"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unsafe_flag_lets_an_agent_sell_on_an_evicting_redis() {
    let center = Center::start_sqlite().await;
    center.create_item("e", 100, 1, (10, 40, 20)).await;
    let redis = RedisServer::start().await;
    config_set(&redis, "maxmemory-policy", "volatile-lru").await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let mut config = agent_config(&center.url, "app", &store);
    let refused = inventory_agent::Application::build(config.clone()).await.err().expect("refused without the flag");
    assert!(refused.to_string().contains("maxmemory-policy volatile-lru"), "{refused}");
    config.allow_evicting_redis = true;
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;
    let r = client.acquire(acquire_req("e", "u1", 1, "k1")).await.expect("sells").into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    assert_eq!(serving(&agent).await, Some(true), "allowed: the agent serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_changed_at_run_time_stops_sales_until_it_is_noeviction_again() {
    let center = Center::start_sqlite().await;
    center.create_item("p", 100, 5, (10, 40, 20)).await;
    let redis = RedisServer::start().await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let agent = LocalAgent::start(&center.url, "app", &store).await;
    let mut client = agent.client().await;
    let r = client.acquire(acquire_req("p", "u1", 1, "k1")).await.expect("sells").into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    assert_eq!(serving(&agent).await, Some(true));

    config_set(&redis, "maxmemory-policy", "allkeys-lru").await;
    assert!(wait_until(Duration::from_secs(10), || async { serving(&agent).await == Some(false) }).await);
    let refused = client.acquire(acquire_req("p", "u2", 1, "k2")).await.expect_err("sales stopped");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let named = format!("pool store {} has maxmemory-policy allkeys-lru", redis.url);
    assert!(refused.message().contains(&named), "{}", refused.message());
    let (_, body) = http_status(agent.http_addr, "/healthz").await;
    assert!(body.contains("allkeys-lru"), "{body}");
    // A replay is refused too: nothing is read from a store that may have lost keys.
    let replay = client.acquire(acquire_req("p", "u1", 1, "k1")).await.expect_err("sales stopped");
    assert_eq!(replay.code(), Code::Unavailable);

    config_set(&redis, "maxmemory-policy", "noeviction").await;
    assert!(wait_until(Duration::from_secs(10), || async { serving(&agent).await == Some(true) }).await);
    let r = client.acquire(acquire_req("p", "u2", 1, "k2")).await.expect("sells again").into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    let replay = client.acquire(acquire_req("p", "u1", 1, "k1")).await.expect("replays").into_inner();
    assert!(replay.replayed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_at_its_memory_limit_answers_unavailable_naming_it_and_sells_once_freed() {
    let center = Center::start_sqlite().await;
    center.create_item("m", 1_000, 5, (10, 400, 200)).await;
    let redis = RedisServer::start().await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let agent = LocalAgent::start(&center.url, "app", &store).await;
    let mut client = agent.client().await;
    let r = client.acquire(acquire_req("m", "u0", 1, "k0")).await.expect("sells").into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    let stock = crate::harness::stock(&mut client, "m").await;
    assert!(stock.available > 0, "a stocked pool: {stock:?}");

    // The store is full (noeviction, as the agent demands): every write is refused.
    config_set(&redis, "maxmemory", "1").await;
    for i in 1..=5 {
        let full = client.acquire(acquire_req("m", &format!("u{i}"), 1, &format!("k{i}"))).await;
        let full = full.expect_err("a full store reserves nothing");
        assert_eq!(full.code(), Code::Unavailable, "never INTERNAL: {full:?}");
        assert!(full.message().contains("memory limit (maxmemory)"), "{}", full.message());
        assert!(full.message().contains("retry with the same idempotency_key"), "{}", full.message());
    }
    assert!(wait_until(Duration::from_secs(10), || async { serving(&agent).await == Some(false) }).await);
    let (_, body) = http_status(agent.http_addr, "/healthz").await;
    assert!(body.contains("memory limit"), "{body}");
    // A replay of a key that reserved still answers (it writes nothing).
    let replay = client.acquire(acquire_req("m", "u0", 1, "k0")).await.expect("replay").into_inner();
    assert!(replay.replayed && replay.reservation_id == r.reservation_id);
    let after = crate::harness::stock(&mut client, "m").await;
    assert_eq!((after.reserved, after.sold), (stock.reserved, stock.sold), "nothing reserved while full");

    // Memory freed: the same keys sell, and the agent serves again.
    config_set(&redis, "maxmemory", "0").await;
    for i in 1..=5 {
        let r = client.acquire(acquire_req("m", &format!("u{i}"), 1, &format!("k{i}"))).await.expect("sells");
        assert_eq!(r.into_inner().outcome(), pb::AcquireOutcome::Reserved);
    }
    assert!(wait_until(Duration::from_secs(10), || async { serving(&agent).await == Some(true) }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_config_is_read_through_info_and_refused_when_neither_answers() {
    let center = Center::start_sqlite().await;
    center.create_item("c", 100, 1, (10, 40, 20)).await;
    // CONFIG renamed away (as managed services do): the policy comes from INFO memory.
    let lfu = RedisServer::start_with(&["--rename-command", "CONFIG", "", "--maxmemory-policy", "allkeys-lfu"]).await;
    let store = StoreSpec::Redis { url: lfu.url.clone(), prefix: "inv:".into() };
    let refused = inventory_agent::Application::build(agent_config(&center.url, "app", &store)).await.err();
    let refused = refused.expect("allkeys-lfu read through INFO and refused").to_string();
    assert!(refused.contains(&format!("pool store {} has maxmemory-policy allkeys-lfu", lfu.url)), "{refused}");

    let safe = RedisServer::start_with(&["--rename-command", "CONFIG", ""]).await;
    let store = StoreSpec::Redis { url: safe.url.clone(), prefix: "inv:".into() };
    let agent = LocalAgent::start(&center.url, "app", &store).await;
    let r = agent.client().await.acquire(acquire_req("c", "u1", 1, "k1")).await.expect("sells").into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);

    // Neither CONFIG nor INFO: the agent cannot know, so it refuses unless told it may.
    let blind = RedisServer::start_with(&["--rename-command", "CONFIG", "", "--rename-command", "INFO", ""]).await;
    let store = StoreSpec::Redis { url: blind.url.clone(), prefix: "inv:".into() };
    let mut config = agent_config(&center.url, "web", &store);
    let refused = inventory_agent::Application::build(config.clone()).await.err().expect("refused").to_string();
    assert!(refused.contains("cannot read its maxmemory-policy"), "{refused}");
    assert!(refused.contains("--allow-evicting-redis"), "{refused}");
    config.allow_evicting_redis = true;
    let agent = LocalAgent::start_with(config, None).await;
    let r = agent.client().await.acquire(acquire_req("c", "u2", 1, "k2")).await.expect("sells").into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_master_of_a_cluster_and_the_buyer_registry_are_checked() {
    let cluster = inventory_test_support::cluster::RedisCluster::start(3, 0).await;
    let masters: Vec<u16> = cluster.nodes_info().await.iter().filter(|n| n.master).map(|n| n.port).collect();
    assert_eq!(masters.len(), 3);
    // One master of three evicts: that one is named.
    let last = url_of(masters[2]);
    let client = redis::Client::open(last.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-random")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Refused before the center is asked: nobody listens at this center address.
    let mut config = agent_config("http://127.0.0.1:9", "app", &StoreSpec::Memory);
    config.redis_cluster = cluster.seeds();
    let refused = inventory_agent::Application::build(config).await.err().expect("refused").to_string();
    assert!(refused.contains(&format!("pool store {last} has maxmemory-policy allkeys-random")), "{refused}");
    for port in &masters[..2] {
        assert!(!refused.contains(&url_of(*port)), "only the evicting master is named: {refused}");
    }

    let mut config = agent_config("http://127.0.0.1:9", "app", &StoreSpec::Memory);
    config.buyer_registry_url = Some(cluster.seeds().join(","));
    config.buyer_registry_cluster = true;
    let refused = inventory_agent::Application::build(config).await.err().expect("refused").to_string();
    assert!(refused.contains(&format!("buyer registry {last} has maxmemory-policy allkeys-random")), "{refused}");
}

fn url_of(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// `--require-durable-redis`: a pool store that keeps only snapshots may come back older
/// than the sales it acknowledged, so the agent refuses to start on it, naming the node
/// and the setting; on `appendfsync always` it starts and sells. (Without the flag the
/// same store draws a warning and the agent starts: every other test here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_may_lose_acknowledged_writes_is_refused_when_durability_is_required() {
    let center = Center::start_sqlite().await;
    center.create_item("d", 100, 1, (10, 40, 20)).await;
    let redis = RedisServer::start().await;
    config_set(&redis, "save", "3600 1").await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let mut config = agent_config(&center.url, "app", &store);
    config.require_durable_redis = true;
    let refused = inventory_agent::Application::build(config.clone()).await.err().expect("refused: snapshots only");
    let line = refused.to_string();
    let expected = format!("pool store {} keeps only snapshots (save \"3600 1\")", redis.url);
    assert!(line.contains("--require-durable-redis") && line.contains(&expected), "{line}");
    assert!(line.contains("--redis-replica-acks"), "says what closes it: {line}");

    config_set(&redis, "appendonly", "yes").await;
    config_set(&redis, "appendfsync", "everysec").await;
    let refused = inventory_agent::Application::build(config.clone()).await.err().expect("refused: everysec");
    assert!(refused.to_string().contains("appendfsync everysec"), "{refused}");

    config_set(&redis, "appendfsync", "always").await;
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;
    let r = client.acquire(acquire_req("d", "u1", 1, "k1")).await.expect("sells").into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
}
