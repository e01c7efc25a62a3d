//! The client's retries and failover against two agent replicas of one channel on Redis:
//! one is killed (-9) in the middle of a burst of buyers. Every buyer gets one answer, no
//! key holds two reservations, and every unit is accounted for.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use inventory_client::{Acquired, AgentClient, Lookup, Metrics, Options, State};
use inventory_test_support::{TestRedis, wait_until};

use crate::harness::{AgentProcess, Center, Store, stock};

const ITEM: &str = "burst";
const TOTAL: u64 = 1_500;
/// More buyers than units: the burst ends sold out.
const BUYERS: usize = 2_000;
const CONCURRENCY: usize = 32;

/// Counts calls that needed more than one attempt.
#[derive(Default)]
struct Retries {
    retried_calls: AtomicU64,
}

impl Metrics for Retries {
    fn call(&self, _: &'static str, _: &'static str, attempts: u32, _: Duration) {
        if attempts > 1 {
            self.retried_calls.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_burst_loses_no_answer_and_doubles_no_reservation() {
    let center = Center::start().await;
    center.create_item(ITEM, TOTAL, 1, (50, 200, 100)).await;
    let redis = TestRedis::create().await;
    let store = Store::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let ttl = ["--leader-ttl-ms", "600"];
    let mut first = AgentProcess::spawn(&center.url, "app", "app-1", &store, &ttl).await;
    let second = AgentProcess::spawn(&center.url, "app", "app-2", &store, &ttl).await;
    let retries = Arc::new(Retries::default());
    let options = Options::default()
        .deadline(Duration::from_secs(60))
        .health_interval(Duration::from_millis(200))
        .metrics(Arc::clone(&retries) as Arc<dyn Metrics>);
    let client = AgentClient::connect([first.url(), second.url()], options).await.expect("client");

    let done = Arc::new(AtomicUsize::new(0));
    let burst = {
        let (client, done) = (client.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            futures::stream::iter(0..BUYERS)
                .map(|n| {
                    let (client, done) = (client.clone(), Arc::clone(&done));
                    async move {
                        let key = format!("order-{n}");
                        let answer = client.acquire(ITEM, &format!("buyer-{n}"), 1, &key).await;
                        done.fetch_add(1, Ordering::SeqCst);
                        (key, answer)
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .collect::<Vec<_>>()
                .await
        })
    };
    let third = wait_until(Duration::from_secs(120), || async { done.load(Ordering::SeqCst) >= BUYERS / 3 }).await;
    assert!(third, "a third of the buyers never got an answer");
    first.kill9().await;
    println!("replica app-1 killed after {} answers", done.load(Ordering::SeqCst));
    let answers = tokio::time::timeout(Duration::from_secs(180), burst).await.expect("the burst ends").expect("burst");

    // One answer per buyer, each final; a reservation id is never answered twice.
    assert_eq!(answers.len(), BUYERS);
    let (mut keys, mut ids, mut reserved, mut sold_out) = (HashSet::new(), HashSet::new(), Vec::new(), 0);
    for (key, answer) in answers {
        assert!(keys.insert(key.clone()), "{key} answered twice");
        match answer.unwrap_or_else(|e| panic!("{key}: no answer within the deadline: {e}")) {
            Acquired::Reserved { id, qty, .. } => {
                assert_eq!(qty, 1);
                assert!(ids.insert(id.clone()), "reservation {id} answered to two keys");
                reserved.push((key, id));
            }
            Acquired::SoldOut => sold_out += 1,
            other => panic!("{key}: unexpected answer {other:?}"),
        }
    }
    let retried = retries.retried_calls.load(Ordering::Relaxed);
    println!("reserved {}, sold out {sold_out}, calls retried {retried}", reserved.len());
    assert!(retried > 0, "the kill never made a call retry: the test did not test failover");
    assert!(reserved.len() as u64 <= TOTAL, "oversold: {} reservations of {TOTAL} units", reserved.len());

    // Each key that reserved holds exactly the reservation it was answered.
    for (key, id) in &reserved {
        let held = client.reservation(ITEM, Lookup::Key(key)).await.expect("reservation by key");
        assert_eq!((&held.id, held.state), (id, State::Reserved), "{key}");
    }
    // Every unit: the pool holds exactly the answered reservations, the channel's pool is
    // what the center counts out with it, and the center's counts add up to the total.
    center.await_quiescence().await;
    let pool = stock(&mut second.raw().await, ITEM).await;
    assert_eq!(pool.reserved, reserved.len() as u64, "reserved units in the pool vs reserved answers");
    assert_eq!(pool.sold, 0);
    let view = center.ledger(ITEM).await;
    let held: u64 = view.channels.iter().filter(|l| l.channel == "app").map(|l| l.held).sum();
    assert_eq!(held, pool.available + pool.reserved + pool.sold, "the channel's pool vs what it holds: {view:?}");
    let item = view.item.as_ref().expect("item");
    assert_eq!(item.total, item.available + held, "the center's conservation: {view:?}");
}
