//! Scale-out end to end: two agent replicas of one channel (processes) share one Redis,
//! each talking to its own center replica on one PostgreSQL database; a third agent sells
//! for another channel. Under concurrent load the leading replica is killed (-9): the
//! other takes the lead (a new epoch, every pool fenced), and the sale goes on through it.
//! Every unit of every item is sold exactly once and the center granted exactly the stock.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{ChannelOp, ChannelReply, PoolStore};
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TestRedis, wait_until};
use tonic::transport::Channel;

use crate::harness::{AgentProcess, BackgroundSale, Center, LocalAgent, StoreSpec, buy_one_via, stock};

const ITEMS: [&str; 2] = ["bundle-x", "bundle-y"];
const TOTAL: u64 = 600;
/// Buyers per item in the main wave (more than the stock).
const BUYERS: usize = 900;
const CONCURRENCY: usize = 32;
/// Late buyers' bounds, in time and in count.
const LATE_BUYERS_FOR: Duration = Duration::from_secs(60);
const LATE_ROUNDS: usize = 2_000;

async fn leader(store: &RedisPoolStore, channel: &str) -> Option<String> {
    match store.channel_op(channel, ChannelOp::Leader).await.expect("read the leader") {
        ChannelReply::Leader(l) => l,
        other => panic!("leader: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agent_replicas_and_two_centers_sell_exactly_the_stock_through_a_leader_crash() {
    let center_a = Center::start_postgres().await;
    let center_b = center_a.replica().await;
    for item in ITEMS {
        center_a.create_item(item, TOTAL, 1, (10, 40, 25)).await;
    }
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let coordination = RedisPoolStore::new(&redis.url, &redis.prefix).await.expect("redis");
    let ttl = ["--leader-ttl-ms", "600"];
    let mut first = AgentProcess::spawn_with(&center_a.url, "app", &spec, None, "app-1", &ttl).await;
    let second = AgentProcess::spawn_with(&center_b.url, "app", &spec, None, "app-2", &ttl).await;
    assert_eq!(leader(&coordination, "app").await.as_deref(), Some("app-1"), "the first replica leads");
    let web = LocalAgent::start(&center_b.url, "web", &StoreSpec::Memory).await;

    // Buyers: two of three on the app channel (through both replicas), one on web.
    let app: Vec<AgentClient<Channel>> = vec![first.client().await, second.client().await];
    let web_client = vec![web.client().await];
    let buyers = (0..BUYERS * ITEMS.len())
        .map(|n| {
            let clients = if n % 3 != 2 { app.clone() } else { web_client.clone() };
            (clients, n % ITEMS.len(), format!("buyer-{n}"))
        })
        .collect();
    let sale = BackgroundSale::start(&ITEMS, buyers, CONCURRENCY);

    // A third of the way in, the leader dies without a word.
    let third = BUYERS * ITEMS.len() / 3;
    assert!(sale.reached(third).await);
    first.kill9().await;
    let took_over = wait_until(Duration::from_secs(30), || async {
        leader(&coordination, "app").await.as_deref() == Some("app-2")
    })
    .await;
    assert!(took_over, "the surviving replica never took the lead");
    let mut granted_at_takeover = HashMap::new();
    for item in ITEMS {
        let view = center_b.ledger(item).await;
        granted_at_takeover.insert(item, view.channels.iter().find(|l| l.channel == "app").map_or(0, |l| l.granted));
    }
    println!("leader killed at {} buyers; app-2 leads", sale.done());

    let mut confirmed: HashMap<&str, HashSet<String>> = HashMap::new();
    for (i, got) in sale.finish().await {
        if let Some(id) = got {
            assert!(confirmed.entry(ITEMS[i]).or_default().insert(id), "a reservation id was handed out twice");
        }
    }
    for item in ITEMS {
        let n = confirmed.get(item).map_or(0, HashSet::len) as u64;
        assert!(n <= TOTAL, "{item}: {n} confirmed sales of {TOTAL} units (oversold)");
    }

    // Late buyers on both channels take whatever is left, until every unit is sold. A
    // pool may be short for a while: a grant the dead leader got but never put in the
    // pool comes back with the new leader's resync, up to seconds later when an outcome
    // was unknown. So a sold-out answer is followed by another buyer a little later,
    // for a bounded time.
    let mut survivors = vec![second.client().await];
    let mut late = 0;
    let until = Instant::now() + LATE_BUYERS_FOR;
    for item in ITEMS {
        for round in 0..LATE_ROUNDS {
            if confirmed.get(item).map_or(0, HashSet::len) as u64 == TOTAL || Instant::now() >= until {
                break;
            }
            let clients = if round % 2 == 0 { &mut survivors } else { &mut web_client.clone() };
            match buy_one_via(clients, item, &format!("late-{item}-{round}"), 300).await {
                Some(id) => {
                    assert!(confirmed.entry(item).or_default().insert(id));
                    late += 1;
                }
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    println!("late buyers bought {late} units");

    center_b.await_quiescence().await;
    let channels = center_a.admin().await.list_channels(pb::ListChannelsRequest::default()).await.expect("channels");
    let app_line = channels.into_inner().channels.into_iter().find(|c| c.channel == "app").expect("app channel");
    assert_eq!(app_line.agent_id, "app-2", "the center knows the new leader");
    assert!(app_line.epoch >= 2, "the new leader registered a new epoch ({})", app_line.epoch);
    for item in ITEMS {
        let view = center_a.ledger(item).await;
        let sold = confirmed.get(item).map_or(0, HashSet::len) as u64;
        assert_eq!(sold, TOTAL, "{item}: every unit sold once (late buyers: {late}; ledger: {view:?})");
        assert_eq!(view.item.as_ref().expect("item").available, 0, "{item}: units stranded at the center");
        let granted: u64 = view.channels.iter().map(|l| l.held).sum();
        assert_eq!(granted, TOTAL, "{item}: what the center counts out with the channels");
        let app_pool = stock(&mut survivors[0], item).await;
        let web_pool = stock(&mut web.client().await, item).await;
        let held = |c: &str| view.channels.iter().find(|l| l.channel == c).map_or(0, |l| l.held);
        assert_eq!(held("app"), app_pool.available + app_pool.reserved + app_pool.sold, "{item}: app pool");
        assert_eq!(held("web"), web_pool.available + web_pool.reserved + web_pool.sold, "{item}: web pool");
        assert_eq!(app_pool.sold + web_pool.sold, TOTAL, "{item}: sold counters");
        let app_granted = view.channels.iter().find(|l| l.channel == "app").map_or(0, |l| l.granted);
        assert!(app_granted > granted_at_takeover[item], "{item}: the new leader borrowed for the channel");
    }
    drop(second);
    drop(web);
}

/// SIGTERM on the leader while another replica runs: the leader drains and resigns but
/// gives nothing back (the pool is the channel's, and the other replica sells from it);
/// the other replica leads from then on and the sale goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_leader_hands_the_channel_over_and_keeps_the_stock_in_the_pool() {
    const ITEM: &str = "handover";
    let center = Center::start_postgres().await;
    center.create_item(ITEM, 200, 1, (10, 40, 25)).await;
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let coordination = RedisPoolStore::new(&redis.url, &redis.prefix).await.expect("redis");
    let ttl = ["--leader-ttl-ms", "600"];
    let mut first = AgentProcess::spawn_with(&center.url, "app", &spec, None, "app-1", &ttl).await;
    let second = AgentProcess::spawn_with(&center.url, "app", &spec, None, "app-2", &ttl).await;
    let mut clients = vec![first.client().await];
    for n in 0..20 {
        assert!(buy_one_via(&mut clients, ITEM, &format!("early-{n}"), 50).await.is_some());
    }
    let before = center.ledger(ITEM).await;
    let app = |v: &pb::GetItemResponse| v.channels.iter().find(|l| l.channel == "app").cloned().expect("app line");
    assert!(app(&before).held > 20, "the pool holds unsold units");

    assert!(first.sigterm_and_wait().await.success(), "the leader drains and exits cleanly");
    let took_over = wait_until(Duration::from_secs(30), || async {
        leader(&coordination, "app").await.as_deref() == Some("app-2")
    })
    .await;
    assert!(took_over, "the other replica never took the lead");
    let after = center.ledger(ITEM).await;
    assert_eq!(app(&after).returned, app(&before).returned, "the draining leader gave nothing back");

    let mut survivors = vec![second.client().await];
    let mut sold = 20;
    for n in 0..400 {
        if buy_one_via(&mut survivors, ITEM, &format!("late-{n}"), 100).await.is_some() {
            sold += 1;
        }
        if sold == 200 {
            break;
        }
    }
    assert_eq!(sold, 200, "every unit sold through the remaining replica");
    center.await_quiescence().await;
    let end = center.ledger(ITEM).await;
    assert_eq!(end.item.as_ref().expect("item").available, 0);
    assert_eq!(stock(&mut survivors[0], ITEM).await.sold, 200);
    drop(second);
}
