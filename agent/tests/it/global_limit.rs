//! A global per-user limit end to end: a center, agent processes on one Redis (their
//! pools and the buyer registry), items with limit 1 over all channels; an agent killed
//! between the claim and the pool call; an agent without the registry.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{RedisServer, TestRedis, wait_until};
use tonic::transport::Channel;

use inventory_agent::buyers::BuyerRegistry;

use crate::harness::{AgentProcess, Center, LocalAgent, StoreSpec, acquire_req, agent_config, stock};

const CHANNELS: [&str; 3] = ["app", "web", "partner"];
const USERS: usize = 2_000;
const TOTAL: u64 = 1_500;
const IN_FLIGHT: usize = 256;
/// The claims' pending bound: above the longest Acquire (a 2 s wait for a Borrow), else
/// the sweeper could release a claim whose pool call is still on its way.
const PENDING_MS: &str = "4000";

pub(crate) async fn create_global(center: &Center, item: &str, total: u64, ttl_ms: u64) {
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: item.into(),
            total,
            per_user_limit: 1,
            reservation_ttl_ms: ttl_ms,
            watermarks: Some(pb::Watermarks { low: 20, high: 200, batch: 100 }),
            limit_scope: pb::LimitScope::Global.into(),
            ..Default::default()
        })
        .await
        .expect("create item");
}

async fn agents(center: &Center, redis: &TestRedis) -> Vec<AgentProcess> {
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let flags = ["--buyer-registry-url", &redis.url, "--buyer-registry-prefix", &redis.prefix];
    let more = ["--buyer-claim-pending-ms", PENDING_MS, "--user-rate-per-sec", "10000", "--user-burst", "10000"];
    let flags = [&flags[..], &more[..]].concat();
    let mut out = Vec::new();
    for c in CHANNELS {
        out.push(AgentProcess::spawn_with(&center.url, c, &store, None, &format!("{c}-g"), &flags).await);
    }
    out
}

/// What one Acquire answered: a reservation id, another outcome, or a gRPC code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Reserved(String),
    Outcome(i32),
    Code(tonic::Code),
}

pub(crate) async fn acquire(client: &mut AgentClient<Channel>, item: &str, user: &str, key: &str) -> Answer {
    match client.acquire(acquire_req(item, user, 1, key)).await {
        Ok(r) => {
            let r = r.into_inner();
            if r.outcome == pb::AcquireOutcome::Reserved as i32 {
                Answer::Reserved(r.reservation_id)
            } else {
                Answer::Outcome(r.outcome)
            }
        }
        Err(s) => Answer::Code(s.code()),
    }
}

/// Acquire, retried (bounded) while the answer says to retry with the same key.
async fn acquire_settled(client: &mut AgentClient<Channel>, item: &str, user: &str, key: &str) -> Answer {
    let mut answer = acquire(client, item, user, key).await;
    for _ in 0..50 {
        if answer != Answer::Code(tonic::Code::Unavailable) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer = acquire(client, item, user, key).await;
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn users_racing_on_three_channels_never_exceed_a_global_limit() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    create_global(&center, "drop", TOTAL, 300_000).await;
    let agents = agents(&center, &redis).await;
    let mut clients = Vec::new();
    for a in &agents {
        clients.push(a.client().await);
    }

    // Every user asks on all three channels at once, each channel's request sent twice
    // (a replay with the same key).
    let jobs = (0..USERS).flat_map(|u| (0..CHANNELS.len()).flat_map(move |c| [(u, c), (u, c)]));
    let answers: Vec<(usize, usize, Answer)> = futures::stream::iter(jobs)
        .map(|(u, c)| {
            let mut client = clients[c].clone();
            async move {
                let (user, key) = (format!("u{u}"), format!("u{u}-{}", CHANNELS[c]));
                (u, c, acquire_settled(&mut client, "drop", &user, &key).await)
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;

    // Per key: every copy that reserved got the same reservation. Per user: at most one
    // reservation over all channels. No error is left after the bounded retries.
    let mut by_key: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
    for (u, c, a) in answers {
        match a {
            Answer::Reserved(id) => {
                by_key.entry((u, c)).or_default().insert(id);
            }
            Answer::Outcome(_) => {}
            Answer::Code(code) => panic!("user {u} on {}: {code:?}", CHANNELS[c]),
        }
    }
    let mut held: BTreeMap<usize, Vec<(usize, String)>> = BTreeMap::new();
    for ((u, c), ids) in &by_key {
        assert_eq!(ids.len(), 1, "user {u} on {}: one key, several reservations {ids:?}", CHANNELS[*c]);
        held.entry(*u).or_default().push((*c, ids.first().cloned().expect("one id")));
    }
    for (u, list) in &held {
        assert_eq!(list.len(), 1, "user {u} holds more than the global limit: {list:?}");
    }
    // A replay after the race gives the same reservation.
    for ((u, c), ids) in by_key.iter().take(200) {
        let (user, key) = (format!("u{u}"), format!("u{u}-{}", CHANNELS[*c]));
        let again = acquire(&mut clients[*c].clone(), "drop", &user, &key).await;
        assert_eq!(again, Answer::Reserved(ids.first().cloned().expect("one id")), "replay of {key}");
    }
    let reserved = held.len();
    assert!(reserved > 0 && reserved as u64 <= TOTAL, "{reserved} reservations of {TOTAL}");

    // Confirm them all: each unit sold exactly once.
    for (u, list) in &held {
        let (c, id) = &list[0];
        let r = clients[*c]
            .clone()
            .confirm(pb::ConfirmRequest { item_id: "drop".into(), reservation_id: id.clone() })
            .await
            .unwrap_or_else(|e| panic!("confirm user {u}: {e}"));
        assert_eq!(r.into_inner().state, pb::ReservationState::Confirmed as i32);
    }
    let mut sold = 0;
    for client in &mut clients {
        sold += stock(client, "drop").await.sold;
    }
    assert_eq!(sold, reserved as u64, "units sold over the channels vs reservations");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");

    // A cancelled reservation frees the allowance: the user buys again (where the unit
    // went back: the first channel borrowed all ten).
    let item_cancel = "drop-c";
    create_global(&center, item_cancel, 10, 300_000).await;
    let mut app = clients[0].clone();
    let Answer::Reserved(first) = acquire_settled(&mut app, item_cancel, "v1", "v1-a").await else {
        panic!("first purchase");
    };
    let mut web = clients[1].clone();
    let over = acquire_settled(&mut web, item_cancel, "v1", "v1-b").await;
    assert_eq!(over, Answer::Outcome(pb::AcquireOutcome::LimitExceeded as i32));
    app.cancel(pb::CancelRequest { item_id: item_cancel.into(), reservation_id: first }).await.expect("cancel");
    let again = acquire_settled(&mut app, item_cancel, "v1", "v1-c").await;
    assert!(matches!(again, Answer::Reserved(_)), "{again:?}");

    // An expired reservation frees it too (the pool expires it, the sweeper releases the
    // claim): the user can buy again once both happened.
    let item_expire = "drop-e";
    create_global(&center, item_expire, 10, 200).await;
    assert!(matches!(acquire_settled(&mut app, item_expire, "v2", "v2-a").await, Answer::Reserved(_)));
    // A fresh key per attempt: a refused key would answer the same on replay.
    let mut attempt = 0;
    let rebought = wait_until(Duration::from_secs(15), || {
        attempt += 1;
        let (mut app, key) = (app.clone(), format!("v2-b{attempt}"));
        async move { matches!(acquire(&mut app, item_expire, "v2", &key).await, Answer::Reserved(_)) }
    })
    .await;
    assert!(rebought, "the expired reservation's allowance was never freed");

    drop(agents);
}

/// Agent `app` with the registry, its Acquires of `user` aborting the process after the
/// claim (the test fault point) when `abort_user` is given.
async fn app_agent(center: &Center, redis: &TestRedis, abort_user: Option<&str>) -> AgentProcess {
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let mut flags = vec!["--buyer-registry-url", &redis.url, "--buyer-registry-prefix", &redis.prefix];
    flags.extend(["--buyer-claim-pending-ms", PENDING_MS]);
    if let Some(user) = abort_user {
        flags.extend(["--test-abort-after-claim", user]);
    }
    AgentProcess::spawn_with(&center.url, "app", &store, None, "app-g", &flags).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_claim_and_deduct_holds_nothing_after_the_sweep() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    create_global(&center, "crash", 1_000, 300_000).await;
    let registry = BuyerRegistry::connect(&redis.url, &redis.prefix).await.expect("registry");

    // The agent dies after claiming the victim's allowance, before its pool call.
    let mut app = app_agent(&center, &redis, Some("victim")).await;
    let died = acquire(&mut app.client().await, "crash", "victim", "k1").await;
    assert!(matches!(died, Answer::Code(_)), "{died:?}");
    let status = app.child.wait().await.expect("reap");
    assert!(!status.success(), "the fault point aborts the process: {status:?}");
    assert_eq!(registry.count("crash", "victim", "app").await.unwrap(), 1, "the claim outlived the agent");
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let flags = ["--buyer-registry-url", &redis.url, "--buyer-registry-prefix", &redis.prefix];
    let web = AgentProcess::spawn_with(&center.url, "web", &store, None, "web-g", &flags).await;
    // Meanwhile the claim counts: never over the limit.
    let over = acquire(&mut web.client().await, "crash", "victim", "w1").await;
    assert_eq!(over, Answer::Outcome(pb::AcquireOutcome::LimitExceeded as i32));

    // Restarted, the agent's sweeper finds no reservation for the key and releases it.
    let app = app_agent(&center, &redis, None).await;
    let released = wait_until(Duration::from_secs(15), || {
        let registry = registry.clone();
        async move { registry.count("crash", "victim", "app").await.unwrap() == 0 }
    })
    .await;
    assert!(released, "the sweeper never released the claim no reservation accounts for");
    let mut pool_client = app.client().await;
    assert_eq!(stock(&mut pool_client, "crash").await.reserved, 0, "nothing held in the pool either");

    // Replays of the crashed key: one answer, one reservation; the limit holds after it.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(acquire_settled(&mut pool_client, "crash", "victim", "k1").await);
    }
    assert!(matches!(answers[0], Answer::Reserved(_)), "{answers:?}");
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    assert_eq!(stock(&mut pool_client, "crash").await.reserved, 1);
    let over = acquire(&mut web.client().await, "crash", "victim", "w2").await;
    assert_eq!(over, Answer::Outcome(pb::AcquireOutcome::LimitExceeded as i32));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_item_without_a_registry_is_unavailable_naming_the_flag() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    create_global(&center, "g", 10, 300_000).await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let agent = LocalAgent::start(&center.url, "app", &store).await;
    let err = agent.client().await.acquire(acquire_req("g", "u", 1, "k")).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("--buyer-registry-url"), "{}", err.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_registry_refuses_or_falls_back_per_item() {
    let redis = TestRedis::create().await;
    let mut registry = RedisServer::start().await;
    let center = Center::start_sqlite().await;
    create_global(&center, "strict", 100, 300_000).await;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: "lenient".into(),
            total: 100,
            per_user_limit: 1,
            watermarks: Some(pb::Watermarks { low: 20, high: 200, batch: 100 }),
            limit_scope: pb::LimitScope::Global.into(),
            registry_fallback: pb::RegistryFallback::Channel.into(),
            ..Default::default()
        })
        .await
        .expect("create item");
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let mut config = agent_config(&center.url, "app", &store);
    config.buyer_registry_url = Some(registry.url.clone());
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;
    assert!(matches!(acquire(&mut client, "strict", "u1", "k1").await, Answer::Reserved(_)));

    registry.kill();
    let answer = |item: &'static str, user: &'static str, key: &'static str| {
        let mut client = client.clone();
        async move {
            let call = client.acquire(acquire_req(item, user, 1, key));
            tokio::time::timeout(Duration::from_secs(10), call).await.expect("answered without the registry")
        }
    };
    let refused = answer("strict", "u2", "k2").await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(refused.message().contains("buyer registry"), "{}", refused.message());
    // The fallback sells under the per-channel limit: one unit, then LIMIT_EXCEEDED.
    let r = answer("lenient", "u3", "k3").await.expect("sold under the channel's limit").into_inner();
    assert_eq!(r.outcome, pb::AcquireOutcome::Reserved as i32);
    let r = answer("lenient", "u3", "k4").await.expect("answered").into_inner();
    assert_eq!(r.outcome, pb::AcquireOutcome::LimitExceeded as i32);
    let errors = agent.agent.metrics.buyer_registry_errors.get();
    assert!(errors >= 2, "registry errors counted: {errors}");
}

/// The buyer registry on a 3-master Redis Cluster (the pools on a single Redis): the
/// buyers' claims spread over the masters, every node's script cache is flushed mid-race
/// (the client reloads on NOSCRIPT), and no user gets more than the global limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_global_limit_holds_with_the_registry_on_a_redis_cluster() {
    const CLUSTER_USERS: usize = 300;
    let cluster = inventory_test_support::cluster::RedisCluster::start(3, 0).await;
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    create_global(&center, "drop", TOTAL, 300_000).await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let mut agents = Vec::new();
    for c in CHANNELS {
        let mut config = agent_config(&center.url, c, &store);
        config.buyer_registry_url = Some(cluster.seeds().join(","));
        config.buyer_registry_cluster = true;
        config.buyer_registry_prefix = redis.prefix.clone();
        config.user_rate_per_sec = 10_000;
        config.user_burst = 10_000;
        agents.push(LocalAgent::start_with(config, None).await);
    }
    let mut clients = Vec::new();
    for a in &agents {
        clients.push(a.client().await);
    }

    let jobs = (0..CLUSTER_USERS).flat_map(|u| (0..CHANNELS.len()).flat_map(move |c| [(u, c), (u, c)]));
    let race = |jobs: Vec<(usize, usize)>| {
        let clients = clients.clone();
        futures::stream::iter(jobs)
            .map(move |(u, c)| {
                let mut client = clients[c].clone();
                async move {
                    let (user, key) = (format!("u{u}"), format!("u{u}-{}", CHANNELS[c]));
                    (u, c, acquire_settled(&mut client, "drop", &user, &key).await)
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
    };
    let jobs: Vec<_> = jobs.collect();
    let (first, second) = jobs.split_at(jobs.len() / 2);
    let mut answers = race(first.to_vec()).await;
    assert_eq!(cluster.flush_scripts().await, 3, "every master's script cache flushed");
    answers.extend(race(second.to_vec()).await);

    let mut held: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for (u, c, a) in answers {
        match a {
            Answer::Reserved(id) => {
                held.entry(u).or_default().insert(id);
            }
            Answer::Outcome(_) => {}
            Answer::Code(code) => panic!("user {u} on {}: {code:?}", CHANNELS[c]),
        }
    }
    assert_eq!(held.len(), CLUSTER_USERS, "stock for all: every user got one unit");
    for (u, ids) in &held {
        assert_eq!(ids.len(), 1, "user {u} holds more than the global limit: {ids:?}");
    }

    // The claims live on every master of the cluster, not on one.
    let registry = BuyerRegistry::connect_cluster(&cluster.seeds(), &redis.prefix).await.expect("registry");
    let mut masters = BTreeSet::new();
    for u in 0..CLUSTER_USERS {
        let user = format!("u{u}");
        let count: u64 = futures::future::join_all(CHANNELS.iter().map(|c| registry.count("drop", &user, c)))
            .await
            .into_iter()
            .map(|n| n.expect("count"))
            .sum();
        assert_eq!(count, 1, "user {user}: one claim over all channels");
        if u % 10 == 0 {
            masters.insert(cluster.master_of(&registry.key("drop", &user)).await);
        }
    }
    assert_eq!(masters.len(), 3, "buyers spread over the masters: {masters:?}");
    drop(agents);
}
