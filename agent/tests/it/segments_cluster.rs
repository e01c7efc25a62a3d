//! A sale of one hot item split into 8 segments on a 3-master Redis Cluster, two channels,
//! with one master killed (-9) mid-sale: each segment under its own hash tag, so the
//! segments spread over the masters and the failover hits some of them.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::cluster::RedisCluster;
use tonic::transport::Channel;

use crate::harness::{Center, acquire_req, retryable, stock};

const ITEM: &str = "hot-drop";
const TOTAL: u64 = 3_000;
const SEGMENTS: u32 = 8;
const LIMIT: u64 = 2;
const CHANNELS: [&str; 2] = ["app", "web"];
const BUYERS: usize = 6_000;
const HEAVY_USERS: usize = 50;
const CONCURRENCY: usize = 32;

/// The user of buyer `n`: every third buyer is one of a few heavy users (who try again
/// and again with new keys), the rest buy once each.
fn user_of(n: usize) -> String {
    if n.is_multiple_of(3) { format!("heavy-{}", n % HEAVY_USERS) } else { format!("user-{n}") }
}

/// What one buyer ended with.
#[derive(Debug)]
enum Got {
    Sold(String),
    SoldOut,
    OverLimit,
}

/// One buyer with its own idempotency key: Acquire retried (same key) on retryable codes,
/// then Confirm retried likewise. Bounded.
async fn buy(client: &mut AgentClient<Channel>, user: &str, key: &str) -> Got {
    let mut reservation = None;
    for _ in 0..300 {
        match client.acquire(acquire_req(ITEM, user, 1, key)).await {
            Ok(r) => {
                let r = r.into_inner();
                match r.outcome() {
                    pb::AcquireOutcome::Reserved => reservation = Some(r.reservation_id),
                    pb::AcquireOutcome::SoldOut => return Got::SoldOut,
                    pb::AcquireOutcome::LimitExceeded => return Got::OverLimit,
                    other => panic!("{user}: unexpected outcome {other:?}"),
                }
                break;
            }
            Err(s) if retryable(s.code()) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(s) => panic!("{user}: acquire failed: {s:?}"),
        }
    }
    let id = reservation.unwrap_or_else(|| panic!("{user}: acquire still failing"));
    for _ in 0..300 {
        match client.confirm(pb::ConfirmRequest { item_id: ITEM.into(), reservation_id: id.clone() }).await {
            Ok(r) => {
                assert_eq!(r.into_inner().state(), pb::ReservationState::Confirmed, "{user}: confirm of {id}");
                return Got::Sold(id);
            }
            Err(s) if retryable(s.code()) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(s) => panic!("{user}: confirm of {id} failed (an acknowledged reservation was lost?): {s:?}"),
        }
    }
    panic!("{user}: confirm of {id} still failing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segmented_sale_on_a_redis_cluster_survives_a_master_failover() {
    let mut cluster = RedisCluster::start(3, 2).await;
    let center = Center::start_postgres().await;
    center.create_segmented_item(ITEM, TOTAL, LIMIT, (100, 400, 200), SEGMENTS).await;
    // Every pool write (and move intent) waits for a replica: no segment's data is lost.
    let (agents, clients) = crate::cluster::agents_on(&cluster, &center, &CHANNELS, "sg").await;
    // The segments spread over the masters.
    let mut masters = HashSet::new();
    for s in 0..SEGMENTS {
        masters.insert(cluster.master_of(&inventory_core::segments::hash_tag("app", ITEM, s)).await);
    }
    assert!(masters.len() >= 2, "8 segments on {} master(s)", masters.len());
    let victim_key = inventory_core::segments::hash_tag("app", ITEM, 3);
    let victim = cluster.master_of(&victim_key).await;

    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&done);
    let buyers: Vec<_> = (0..BUYERS).map(|n| (clients[n % CHANNELS.len()].clone(), n)).collect();
    let sale = tokio::spawn(async move {
        futures::stream::iter(buyers)
            .map(|(mut client, n)| {
                let counter = std::sync::Arc::clone(&counter);
                async move {
                    let user = user_of(n);
                    let got = buy(&mut client, &user, &format!("key-{n}")).await;
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    (user, got)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await
    });
    // Once sales are seen to progress: kill -9 the master of one segment.
    let progressed = inventory_test_support::wait_until(Duration::from_secs(60), || {
        let done = std::sync::Arc::clone(&done);
        async move { done.load(std::sync::atomic::Ordering::SeqCst) >= BUYERS / 4 }
    })
    .await;
    assert!(progressed, "the sale did not progress");
    let started = std::time::Instant::now();
    cluster.kill(victim);
    let promoted = cluster.await_failover(&victim_key, victim, 3).await;
    println!("master {victim} killed; replica {promoted} promoted after {:?}", started.elapsed());

    let mut sold: HashSet<String> = HashSet::new();
    let mut per_user: HashMap<String, u64> = HashMap::new();
    let (mut sold_out, mut over_limit) = (0, 0);
    for (user, got) in sale.await.expect("sale task") {
        match got {
            Got::Sold(id) => {
                assert!(sold.insert(id), "a reservation id was handed out twice");
                *per_user.entry(user).or_default() += 1;
            }
            Got::SoldOut => sold_out += 1,
            Got::OverLimit => over_limit += 1,
        }
    }
    assert!(over_limit > 0, "the heavy users met their limit");
    // Late buyers take whatever is left (a channel may have answered sold out while the
    // other still held units), until every unit is sold.
    let mut late = 0;
    for round in 0..3_000 {
        if sold.len() as u64 >= TOTAL {
            break;
        }
        let user = format!("late-{round}");
        if let Got::Sold(id) = buy(&mut clients[round % CHANNELS.len()].clone(), &user, &user).await {
            assert!(sold.insert(id));
            *per_user.entry(user).or_default() += 1;
            late += 1;
        }
    }
    println!("sold {} units: {sold_out} sold out, {over_limit} over the limit, {late} late", sold.len());
    assert_eq!(sold.len() as u64, TOTAL, "every unit sold exactly once");
    assert!(per_user.values().all(|&n| n <= LIMIT), "a user bought more than {LIMIT}");

    let r = center.await_quiescence().await;
    assert!(r.ok && r.violations.is_empty(), "{r:?}");
    let view = center.ledger(ITEM).await;
    assert_eq!(view.item.as_ref().expect("item").available, 0, "units stranded at the center");
    let mut sold_in_pools = 0;
    for (c, channel) in CHANNELS.iter().enumerate() {
        let s = stock(&mut clients[c].clone(), ITEM).await;
        assert_eq!(s.segments.len(), SEGMENTS as usize);
        assert!(s.segments.iter().all(|g| g.available == 0 && g.reserved == 0), "{channel}: {s:?}");
        let held = view.channels.iter().find(|l| l.channel == *channel).map_or(0, |l| l.held);
        assert_eq!(held, s.sold, "{channel}: pool = what the center granted");
        sold_in_pools += s.sold;
    }
    assert_eq!(sold_in_pools, TOTAL, "the pools' sold counters match the confirmed sales");
    drop(agents);
}
