//! The end-to-end sale on a Redis Cluster: three masters with two replicas each (local
//! `redis-server --cluster-enabled` processes), two channels' agents on it, a real center on
//! PostgreSQL. Mid-sale the master holding one pool is killed (-9) and a replica takes
//! over; later every node's script cache is flushed. Every acknowledged reservation must
//! still confirm, no item sells more than its stock, and in the end every unit is sold.

use std::collections::{HashMap, HashSet};

use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::cluster::RedisCluster;
use tonic::transport::Channel;

use crate::harness::{BackgroundSale, Center, LocalAgent, StoreSpec, agent_config, buy_one, stock};

const ITEMS: [&str; 3] = ["drop-a", "drop-b", "drop-c"];
const TOTAL: u64 = 200;
const CHANNELS: [&str; 2] = ["app", "web"];
/// Buyers per item in the main wave (more than the stock: some find it sold out).
const BUYERS: usize = 300;
const CONCURRENCY: usize = 32;

/// One agent per channel on the cluster (keys under a fresh prefix starting with `tag`),
/// and a client of each. Every pool write waits for a replica (`--redis-replica-acks 1`;
/// two replicas per master, so the promoted one still has one): a failover loses no
/// acknowledged write.
pub(crate) async fn agents_on(
    cluster: &RedisCluster,
    center: &Center,
    channels: &[&str],
    tag: &str,
) -> (Vec<LocalAgent>, Vec<AgentClient<Channel>>) {
    let prefix = format!("{tag}{}:", uuid::Uuid::new_v4().simple());
    let mut agents = Vec::new();
    for channel in channels {
        let spec = StoreSpec::Redis { url: "redis://unused".into(), prefix: prefix.clone() };
        let mut config = agent_config(&center.url, channel, &spec);
        config.redis_cluster = cluster.seeds();
        config.redis_replica_acks = 1;
        config.redis_replica_ack_timeout_ms = 1_000;
        agents.push(LocalAgent::start_with(config, None).await);
    }
    let mut clients = Vec::new();
    for a in &agents {
        clients.push(a.client().await);
    }
    (agents, clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_on_a_redis_cluster_survives_a_master_failover_and_a_script_flush() {
    let mut cluster = RedisCluster::start(3, 2).await;
    let center = Center::start_postgres().await;
    for item in ITEMS {
        center.create_item(item, TOTAL, 1, (10, 40, 25)).await;
    }
    let (agents, clients) = agents_on(&cluster, &center, &CHANNELS, "cl").await;

    // The pools of one item spread over the cluster's slots; kill the master of app's pool.
    let victim_key = format!("{{app:{}}}", ITEMS[0]);
    let victim = cluster.master_of(&victim_key).await;
    let served: Vec<u16> = {
        let mut ports = HashSet::new();
        for item in ITEMS {
            for channel in CHANNELS {
                ports.insert(cluster.master_of(&format!("{{{channel}:{item}}}")).await);
            }
        }
        ports.into_iter().collect()
    };
    println!("pools live on {} of the 3 masters; killing the master on port {victim}", served.len());

    let buyers = (0..BUYERS * ITEMS.len())
        .map(|n| (vec![clients[n % CHANNELS.len()].clone()], n % ITEMS.len(), format!("buyer-{n}")))
        .collect();
    let sale = BackgroundSale::start(&ITEMS, buyers, CONCURRENCY);

    // A third of the way in: kill -9 the master, wait for a replica to take over.
    let third = BUYERS * ITEMS.len() / 3;
    assert!(sale.reached(third).await);
    cluster.kill(victim);
    let promoted = cluster.await_failover(&victim_key, victim, 3).await;
    println!("master {victim} killed at {} buyers; replica {promoted} promoted", sale.done());
    // Then every node forgets its scripts: the agents reload them (NOSCRIPT -> SCRIPT LOAD).
    let flushed = cluster.flush_scripts().await;
    assert!(flushed >= 6, "SCRIPT FLUSH reached {flushed} nodes");
    println!("SCRIPT FLUSH on {flushed} live nodes at {} buyers", sale.done());

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

    // Late buyers take whatever a failed call left behind, until every unit is sold.
    let mut late = 0;
    for item in ITEMS {
        for round in 0..200 {
            let sold = confirmed.get(item).map_or(0, HashSet::len) as u64;
            if sold == TOTAL {
                break;
            }
            let user = format!("late-{item}-{round}");
            if let Some(id) = buy_one(&mut clients[round % CHANNELS.len()].clone(), item, &user, 300).await {
                assert!(confirmed.entry(item).or_default().insert(id));
                late += 1;
            }
        }
    }
    println!("late buyers bought {late} units");

    center.await_quiescence().await;
    for item in ITEMS {
        let n = confirmed.get(item).map_or(0, HashSet::len) as u64;
        assert_eq!(n, TOTAL, "{item}: every unit sold exactly once");
        let view = center.ledger(item).await;
        assert_eq!(view.item.as_ref().expect("item").available, 0, "{item}: units stranded at the center");
        let mut sold_in_pools = 0;
        for (c, channel) in CHANNELS.iter().enumerate() {
            let s = stock(&mut clients[c].clone(), item).await;
            let held = view.channels.iter().find(|l| l.channel == *channel).map_or(0, |l| l.held);
            assert_eq!(held, s.available + s.reserved + s.sold, "{item}/{channel}: pool = what the center granted");
            sold_in_pools += s.sold;
        }
        assert_eq!(sold_in_pools, TOTAL, "{item}: the pools' sold counters match the confirmed sales");
    }
    drop(agents);
}
