//! End to end: a real center (PostgreSQL) and three agents (two on Redis, one in memory)
//! sell one item under skewed demand with replays; then cancellations free exactly the
//! units they held.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::join_all;
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::TestRedis;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, stock};

const ITEM: &str = "launch-bundle";
const TOTAL: u64 = 1_000;
const LIMIT: u64 = 2;
const CALLS: usize = 20_000;
const USERS: u64 = 5_000;
const CONCURRENCY: usize = 64;

#[derive(Clone)]
struct Call {
    channel: usize,
    user: String,
    quantity: u64,
    key: String,
}

struct Sale {
    clients: Vec<AgentClient<Channel>>,
}

impl Sale {
    async fn send(&self, call: &Call) -> pb::AcquireResponse {
        let mut client = self.clients[call.channel].clone();
        client
            .acquire(acquire_req(ITEM, &call.user, call.quantity, &call.key))
            .await
            .unwrap_or_else(|s| panic!("acquire {} failed: {s:?}", call.key))
            .into_inner()
    }
}

fn pick_channel(rng: &mut StdRng) -> usize {
    // 70% of the traffic on the first channel, 15% on each of the others.
    match rng.random_range(0..100) {
        0..70 => 0,
        70..85 => 1,
        _ => 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_sell_exactly_the_stock_under_skewed_demand() {
    let center = Center::start_postgres().await;
    center.create_item(ITEM, TOTAL, LIMIT, (20, 80, 50)).await;
    let redis = TestRedis::create().await;
    let on_redis = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let agents = vec![
        LocalAgent::start(&center.url, "app", &on_redis).await,
        LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await,
        LocalAgent::start(&center.url, "eu-west", &on_redis).await,
    ];
    let mut clients = Vec::new();
    for a in &agents {
        clients.push(a.client().await);
    }
    let sale = Arc::new(Sale { clients });

    let mut rng = StdRng::seed_from_u64(7);
    let mut history: Vec<Call> = Vec::new();
    // key -> the reservation it got (from the first RESERVED answer on).
    let mut reserved_by_key: HashMap<String, (usize, String, u64)> = HashMap::new();
    let mut replays_of_reserved = 0;
    let mut sent = 0;
    while sent < CALLS {
        let batch: Vec<Call> = (0..CONCURRENCY.min(CALLS - sent))
            .map(|_| {
                if !history.is_empty() && rng.random_bool(0.2) {
                    history[rng.random_range(0..history.len())].clone()
                } else {
                    let n = history.len();
                    Call {
                        channel: pick_channel(&mut rng),
                        user: format!("user-{}", rng.random_range(0..USERS)),
                        quantity: if rng.random_bool(0.8) { 1 } else { 2 },
                        key: format!("k-{n}-{}", rng.random::<u32>()),
                    }
                }
            })
            .collect();
        sent += batch.len();
        let answers = join_all(batch.iter().map(|c| {
            let sale = Arc::clone(&sale);
            async move { sale.send(c).await }
        }))
        .await;
        // A key may appear twice in one batch (two replays of a call that was not reserved
        // before): the copies race, and either one may be the call that reserves.
        let reserved_before: HashSet<String> = reserved_by_key.keys().cloned().collect();
        let mut first_answers: HashMap<String, usize> = HashMap::new();
        for (call, answer) in batch.into_iter().zip(answers) {
            let reserved = answer.outcome() == pb::AcquireOutcome::Reserved;
            if reserved && !answer.replayed {
                *first_answers.entry(call.key.clone()).or_default() += 1;
            }
            match reserved_by_key.get(&call.key) {
                Some((_, id, q)) => {
                    replays_of_reserved += 1;
                    assert!(reserved, "a replay of reserved key {} got {:?}", call.key, answer.outcome());
                    assert_eq!((&answer.reservation_id, answer.quantity), (id, *q), "replay of {}", call.key);
                    if reserved_before.contains(&call.key) {
                        assert!(answer.replayed, "a key reserved in an earlier batch came back as new");
                    }
                }
                None if reserved => {
                    reserved_by_key
                        .insert(call.key.clone(), (call.channel, answer.reservation_id.clone(), answer.quantity));
                }
                None => {}
            }
            history.push(call);
        }
        for (key, n) in first_answers {
            assert_eq!(n, 1, "key {key} reserved {n} times (only one answer may be the first)");
        }
    }
    assert!(replays_of_reserved > 100, "the run replayed reserved keys ({replays_of_reserved})");

    // Exactly the stock was reserved, and nobody is over the limit.
    let units: u64 = reserved_by_key.values().map(|(_, _, q)| q).sum();
    assert_eq!(units, TOTAL, "units reserved");
    let ids: HashSet<_> = reserved_by_key.values().map(|(c, id, _)| (*c, id.clone())).collect();
    assert_eq!(ids.len(), reserved_by_key.len(), "one reservation per key");
    let mut held_by_user: HashMap<(usize, String), u64> = HashMap::new();
    let mut counted = HashSet::new();
    for call in &history {
        if let Some((_, _, q)) = reserved_by_key.get(&call.key)
            && counted.insert(call.key.clone())
        {
            *held_by_user.entry((call.channel, call.user.clone())).or_default() += q;
        }
    }
    assert!(held_by_user.values().all(|&u| u <= LIMIT), "a user went over the limit");

    // Quiescence: invariants 1 and 2, nothing stranded at the center.
    center.await_quiescence().await;
    let view = center.ledger(ITEM).await;
    assert_eq!(view.item.as_ref().unwrap().available, 0, "units stranded at the center");
    let mut reserved_total = 0;
    for (n, name) in ["app", "web", "eu-west"].iter().enumerate() {
        let s = stock(&mut sale.clients[n].clone(), ITEM).await;
        let line = view.channels.iter().find(|c| c.channel == *name).expect("channel in ledger");
        assert_eq!(line.held, s.available + s.reserved + s.sold, "invariant 2 for {name}");
        assert_eq!(s.available, 0, "{name} still has idle units");
        reserved_total += s.reserved;
    }
    assert_eq!(reserved_total, TOTAL);

    // Cancel 100 reservations: exactly 100 more units can be bought.
    let mut cancelled = 0;
    for (channel, id, q) in reserved_by_key.values() {
        if *q != 1 {
            continue;
        }
        let mut client = sale.clients[*channel].clone();
        let r = client.cancel(pb::CancelRequest { item_id: ITEM.into(), reservation_id: id.clone() }).await.unwrap();
        assert_eq!(r.into_inner().state(), pb::ReservationState::Cancelled);
        cancelled += 1;
        if cancelled == 100 {
            break;
        }
    }
    let mut bought = 0;
    let mut round = 0;
    while round < 30 {
        let batch: Vec<Call> = (0..CONCURRENCY)
            .map(|i| Call {
                channel: pick_channel(&mut rng),
                user: format!("late-{round}-{i}"),
                quantity: 1,
                key: format!("late-{round}-{i}"),
            })
            .collect();
        let answers = join_all(batch.iter().map(|c| {
            let sale = Arc::clone(&sale);
            async move { sale.send(c).await }
        }))
        .await;
        bought += answers.iter().filter(|a| a.outcome() == pb::AcquireOutcome::Reserved).count();
        round += 1;
    }
    assert_eq!(bought, 100, "purchases after cancelling 100");
    center.await_quiescence().await;
    assert_eq!(center.ledger(ITEM).await.item.unwrap().available, 0);
    drop(agents);
}
