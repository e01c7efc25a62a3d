//! A pool store that went back in time: a Redis restarted from a snapshot older than its
//! last writes, or a Redis Cluster failing over to a replica whose link was cut. The pool
//! keeps its generation and every structure, with older contents. Its write sequence is
//! below what the agent saw acknowledged, so it is a lost pool: frozen, its units in doubt
//! at the center, nothing resold, replays of the old generation refused, reopened with a
//! new generation once an operator settled it, then sold to the end. An agent restarted
//! since saw none of those writes: the floor the center remembers from the channel's
//! reports catches it.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::cluster::RedisCluster;
use inventory_test_support::{RedisServer, wait_until};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{AgentProcess, Center, LocalAgent, StoreSpec, acquire_req, agent_config, buy_one, stock};

const ITEM: &str = "rb";
const TOTAL: u64 = 100;

async fn acquire(client: &AgentClient<Channel>, user: &str) -> pb::AcquireResponse {
    let mut client = client.clone();
    let r = client.acquire(acquire_req(ITEM, user, 1, &format!("k-{user}"))).await.unwrap().into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "{user}");
    r
}

async fn confirm(client: &AgentClient<Channel>, id: String) {
    let c = pb::ConfirmRequest { item_id: ITEM.into(), reservation_id: id };
    assert_eq!(client.clone().confirm(c).await.unwrap().into_inner().state(), pb::ReservationState::Confirmed);
}

/// Buyers u`from`..u`to`, the first `confirming` of them confirming; then quiescence.
/// Returns the units confirmed, what the channel holds, and the pool's generation.
async fn sell(center: &Center, client: &AgentClient<Channel>, from: u32, to: u32, confirming: u32) -> (u64, u64, u64) {
    let mut confirmed = 0;
    let mut generation = 0;
    for i in from..to {
        let r = acquire(client, &format!("u{i}")).await;
        assert!(generation == 0 || r.pool_generation == generation, "one generation");
        generation = r.pool_generation;
        if i < from + confirming {
            confirm(client, r.reservation_id).await;
            confirmed += 1;
        }
    }
    center.await_quiescence().await;
    (confirmed, center.ledger(ITEM).await.channels[0].held, generation)
}

/// Waits for the refill the last sales asked for (the channel holds more than `above`),
/// then for quiescence; returns what the channel holds.
async fn refilled(center: &Center, above: u64) -> u64 {
    let grew =
        wait_until(Duration::from_secs(20), || async { center.ledger(ITEM).await.channels[0].held > above }).await;
    assert!(grew, "no refill after the store's copy: {:?}", center.ledger(ITEM).await);
    center.await_quiescence().await;
    center.ledger(ITEM).await.channels[0].held
}

/// The replay of the last buyer's key, naming the generation its answer carried.
fn replay(generation: u64, last: u32) -> pb::AcquireRequest {
    let user = format!("u{}", last - 1);
    pb::AcquireRequest { expect_pool_generation: generation, ..acquire_req(ITEM, &user, 1, &format!("k-{user}")) }
}

/// After the store went back: no replay reserves anew, the item freezes, the center holds
/// everything the channel holds (`held`) in doubt and reconcile names it.
async fn frozen_and_in_doubt(center: &Center, client: &AgentClient<Channel>, replayed: &pb::AcquireRequest, held: u64) {
    let mut c = client.clone();
    match c.acquire(replayed.clone()).await {
        Ok(r) => panic!("a replay into the pool that went back answered {:?}", r.into_inner()),
        Err(s) => assert!(matches!(s.code(), Code::Unavailable | Code::FailedPrecondition), "{s:?}"),
    }
    let frozen = wait_until(Duration::from_secs(20), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req(ITEM, "late", 1, "k-late")).await, Err(s) if s.code() == Code::Unavailable)
        }
    })
    .await;
    assert!(frozen, "the agent kept selling from a pool that went back in time");
    let in_doubt = wait_until(Duration::from_secs(10), || async {
        let view = center.ledger(ITEM).await;
        view.channels[0].in_doubt == held
    })
    .await;
    assert!(in_doubt, "the center never held the channel's units in doubt: {:?}", center.ledger(ITEM).await);
    let rec = center.reconcile().await;
    assert!(rec.in_doubt.iter().any(|v| v.detail.contains(&format!("{held} units in doubt"))), "{rec:?}");
    let s = stock(&mut c, ITEM).await;
    assert_eq!((s.pool_generation, s.available, s.reserved, s.sold), (0, 0, 0, 0), "read as lost: {s:?}");
    let refused = c.acquire(replayed.clone()).await.expect_err("frozen");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(!center.reconcile().await.in_doubt.is_empty(), "reconcile names it until it is resolved");
}

/// The operator settles `confirmed` as sold; the pool opens as a new generation, the
/// replay of the old one is refused, and every unit left is sold once.
async fn resolved_and_sold(
    center: &Center,
    client: &AgentClient<Channel>,
    replayed: pb::AcquireRequest,
    confirmed: u64,
) {
    let resolved = center
        .admin()
        .await
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: ITEM.into(), channel: "app".into(), sold: confirmed })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.written_off, confirmed);
    let selling = wait_until(Duration::from_secs(20), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req(ITEM, "probe", 1, "k-probe")).await,
                Ok(r) if r.get_ref().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(selling, "the item never sold again after the resolution");
    let mut c = client.clone();
    let s = stock(&mut c, ITEM).await;
    let generation = replayed.expect_pool_generation;
    assert!(s.pool_generation != 0 && s.pool_generation != generation, "a new generation: {s:?}");
    let refused = c.acquire(replayed).await.expect_err("a replay naming the old generation");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");

    let probe = acquire(client, "probe").await;
    confirm(client, probe.reservation_id).await;
    let mut sold_again = 1;
    let mut n = 0;
    loop {
        n += 1;
        assert!(n < 400, "the sale never ended: {sold_again} sold again");
        if buy_one(&mut c, ITEM, &format!("v{n}"), 100).await.is_some() {
            sold_again += 1;
            continue;
        }
        let view = center.ledger(ITEM).await;
        if view.item.as_ref().unwrap().available == 0 && stock(&mut c, ITEM).await.available == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sold_again, TOTAL - confirmed, "sold to the end, nothing twice");
    let rec = center.await_quiescence().await;
    assert!(rec.in_doubt.is_empty(), "{rec:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_from_an_older_snapshot_is_a_lost_pool_never_resold() {
    let center = Center::start_sqlite().await;
    center.create_item(ITEM, TOTAL, 1, (10, 40, 20)).await;
    let mut redis = RedisServer::start().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let agent = LocalAgent::start(&center.url, "app", &spec).await;
    let client = agent.client().await;
    let url = redis.url.clone();
    // SAVE blocks the server while it writes: a response timeout longer than the default.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    let conn = || async {
        let client = redis::Client::open(url.as_str()).unwrap();
        client.get_multiplexed_async_connection_with_config(&config).await.unwrap()
    };
    let (before, held_at_snapshot, _) = sell(&center, &client, 0, 5, 2).await;

    // The snapshot; then a refill and reservations, all acknowledged, that it lacks.
    let saved: String = redis::cmd("SAVE").query_async(&mut conn().await).await.unwrap();
    assert_eq!(saved, "OK");
    let (after, _, generation) = sell(&center, &client, 5, 35, 10).await;
    let held = refilled(&center, held_at_snapshot).await;

    // kill -9, restarted on the same directory: the pool as the snapshot had it, with the
    // same generation.
    redis.restart().await;
    let counters = || async {
        let c: Vec<Option<String>> = redis::cmd("HMGET")
            .arg("inv:{app:rb}:pool")
            .arg(&["available", "reserved", "sold", "generation"][..])
            .query_async(&mut conn().await)
            .await
            .unwrap();
        c
    };
    let restored = counters().await;
    assert_eq!(restored[3].as_deref(), Some(generation.to_string().as_str()), "the same generation");
    let replayed = replay(generation, 35);
    frozen_and_in_doubt(&center, &client, &replayed, held).await;
    assert_eq!(counters().await, restored, "nothing of the rolled-back pool was sold or moved");
    resolved_and_sold(&center, &client, replayed, before + after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_to_a_lagging_replica_is_a_lost_pool_never_resold() {
    let mut cluster = RedisCluster::start(3, 1).await;
    let center = Center::start_sqlite().await;
    center.create_item(ITEM, TOTAL, 1, (10, 40, 20)).await;
    let spec =
        StoreSpec::Redis { url: "redis://unused".into(), prefix: format!("rb{}:", uuid::Uuid::new_v4().simple()) };
    let mut config = agent_config(&center.url, "app", &spec);
    config.redis_cluster = cluster.seeds();
    let agent = LocalAgent::start_with(config, None).await;
    let client = agent.client().await;
    let (before, held_at_cut, _) = sell(&center, &client, 0, 5, 2).await;

    // The replica of the pool's master is frozen and its link cut: what follows, all
    // acknowledged by the master (no replica acks asked), never reaches it.
    let key = format!("{{app:{ITEM}}}");
    let master = cluster.master_of(&key).await;
    let replica = cluster.replica_of(master).await;
    cluster.freeze(replica);
    assert!(cluster.command(master, &["CLIENT", "KILL", "TYPE", "replica"]).await.is_some());
    let (after, _, generation) = sell(&center, &client, 5, 35, 10).await;
    let held = refilled(&center, held_at_cut).await;

    // The master dies; the lagging replica takes over (same generation, older contents).
    cluster.kill(master);
    cluster.thaw(replica);
    // (It may also have been elected on its own once it woke up: it only lags a few seconds.)
    let took_over = wait_until(Duration::from_secs(20), || async {
        cluster.command(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]).await.is_some()
            || cluster.nodes_info().await.iter().any(|n| n.port == replica && n.master && n.healthy)
    })
    .await;
    assert!(took_over, "the replica refused to take over");
    assert_eq!(cluster.await_failover(&key, master, 3).await, replica);

    let replayed = replay(generation, 35);
    frozen_and_in_doubt(&center, &client, &replayed, held).await;
    resolved_and_sold(&center, &client, replayed, before + after).await;
}

/// The pool's write sequence in Redis (`wseq` in the pool hash).
async fn wseq(url: &str) -> u64 {
    let mut conn = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let v: Option<u64> = redis::cmd("HGET").arg("inv:{app:rb}:pool").arg("wseq").query_async(&mut conn).await.unwrap();
    v.unwrap_or(0)
}

/// The floor the center hands the channel for the item's pool (DescribeItem).
async fn center_floor(center: &Center) -> u64 {
    let mut c = inventory_proto::v1::center_client::CenterClient::connect(center.url.clone()).await.unwrap();
    let d = c
        .describe_item(pb::DescribeItemRequest { item_id: ITEM.into(), channel: "app".into() })
        .await
        .unwrap()
        .into_inner();
    d.write_seq_floors.first().copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restored_after_the_agent_restarted_is_caught_by_the_floor_the_center_remembers() {
    let center = Center::start_sqlite().await;
    center.create_item(ITEM, TOTAL, 1, (10, 40, 20)).await;
    let mut redis = RedisServer::start().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let mut first = AgentProcess::spawn(&center.url, "app", &spec, None).await;
    let client = first.client().await;
    let (before, held_at_snapshot, _) = sell(&center, &client, 0, 5, 2).await;

    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    let mut conn = redis::Client::open(redis.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let saved: String = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    assert_eq!(saved, "OK");
    let at_snapshot = wseq(&redis.url).await;
    let (after, _, generation) = sell(&center, &client, 5, 35, 10).await;
    let held = refilled(&center, held_at_snapshot).await;
    // The channel's reports carried the writes since: the center remembers a floor above
    // the snapshot's sequence.
    let remembered = wait_until(Duration::from_secs(10), || async { center_floor(&center).await > at_snapshot }).await;
    assert!(remembered, "the center never learned the pool's write sequence: {}", center_floor(&center).await);

    // kill -9, and a new process of the channel: it never saw a write of the pool.
    let at_kill = wseq(&redis.url).await;
    first.kill9().await;
    let second = AgentProcess::spawn(&center.url, "app", &spec, None).await;
    let client = second.client().await;
    let registered = wait_until(Duration::from_secs(20), || async {
        center.ledger(ITEM).await.channels[0].epoch >= 2 && stock(&mut client.clone(), ITEM).await.available > 0
    })
    .await;
    assert!(registered, "the new process never sold: {:?}", center.ledger(ITEM).await);
    let live = wseq(&redis.url).await;
    assert_eq!(live, at_kill, "the new process wrote nothing: only the center's floor can tell");

    // Then Redis is killed and restarted on the snapshot: the pool as it was, same
    // generation. The new process's own writes could not tell (it made none).
    redis.restart().await;
    assert!(wseq(&redis.url).await < live, "the store went back");
    let replayed = replay(generation, 35);
    frozen_and_in_doubt(&center, &client, &replayed, held).await;
    resolved_and_sold(&center, &client, replayed, before + after).await;
}

/// A Return tells the center how far the pool got. With no heartbeat after the sales (the
/// agent's are an hour apart), an operator's CloseItem makes the agent take its idle
/// units and return them: the center's floor for the pool is then the pool's write
/// sequence after the take, so a store that goes back to before the take, or before a
/// sale, is caught by whichever process of the channel comes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_return_carries_the_pools_write_sequence_to_the_center() {
    let center = Center::start_sqlite().await;
    center.create_item(ITEM, TOTAL, 1, (10, 40, 20)).await;
    let redis = RedisServer::start().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let mut config = agent_config(&center.url, "app", &spec);
    config.heartbeat_interval_ms = 3_600_000;
    let agent = LocalAgent::start_with(config, None).await;
    let client = agent.client().await;
    for i in 0..5 {
        acquire(&client, &format!("u{i}")).await;
    }
    let sold_to = wseq(&redis.url).await;
    assert!(center_floor(&center).await < sold_to, "no report told the center of the sales");

    let close = pb::CloseItemRequest { item_id: ITEM.into(), closed: true };
    center.admin().await.close_item(close).await.expect("close item");
    let returned =
        wait_until(Duration::from_secs(10), || async { center.ledger(ITEM).await.channels[0].held == 5 }).await;
    assert!(returned, "the idle units never came back: {:?}", center.ledger(ITEM).await);
    let after_take = wseq(&redis.url).await;
    assert!(after_take > sold_to, "the take wrote to the pool");
    assert_eq!(center_floor(&center).await, after_take, "the Return carried the pool's write sequence");
    let reported_at = center.ledger(ITEM).await.channels[0].reported_at_unix_ms;
    assert_eq!(reported_at, 0, "no heartbeat reported the pool: only the Return can have told");
}
