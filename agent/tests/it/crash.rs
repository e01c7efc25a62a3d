//! Agents as real processes: kill -9 mid-sale and restart on Redis, and SIGTERM drain.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use inventory_proto::v1 as pb;
use inventory_test_support::{TestRedis, free_port, wait_until};

use crate::harness::{AgentProcess, Center, StoreSpec, acquire_req, stock};

const ITEM: &str = "crash-item";
const TOTAL: u64 = 600;

/// Buys with distinct keys until `stop_after` units are reserved or the item is sold out.
/// A call that fails (the agent is dead) is retried later with the same key.
async fn buy(
    proc_addr: &str,
    keys: &mut Vec<String>,
    next: &mut usize,
    got: &mut HashMap<String, String>,
    stop_after: usize,
) -> bool {
    let Ok(mut client) = inventory_proto::v1::agent_client::AgentClient::connect(proc_addr.to_owned()).await else {
        return false;
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < stop_after && Instant::now() < deadline {
        // Retry unanswered keys first: their replies may have been lost with the process.
        let key = if let Some(k) = keys.pop() {
            k
        } else {
            *next += 1;
            format!("buyer-{next}")
        };
        match client.acquire(acquire_req(ITEM, &key, 1, &key)).await {
            Ok(r) => {
                let r = r.into_inner();
                match r.outcome() {
                    pb::AcquireOutcome::Reserved => {
                        if let Some(first) = got.get(&key) {
                            assert_eq!(first, &r.reservation_id, "replay of {key} changed reservation");
                        }
                        got.insert(key, r.reservation_id);
                    }
                    pb::AcquireOutcome::SoldOut => {
                        if got.len() as u64 == TOTAL {
                            return true;
                        }
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            Err(_) => {
                keys.push(key);
                return false;
            }
        }
    }
    got.len() as u64 == TOTAL
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_agent_killed_mid_sale_resumes_without_selling_twice() {
    let center = Center::start_postgres().await;
    center.create_item(ITEM, TOTAL, 1, (20, 80, 50)).await;
    let redis = TestRedis::create().await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let port = free_port();
    let mut agent = AgentProcess::spawn(&center.url, "app", &store, Some(port)).await;
    let url = format!("http://{}", agent.addr);

    let (mut pending, mut next, mut got) = (Vec::new(), 0, HashMap::new());
    buy(&url, &mut pending, &mut next, &mut got, 250).await;
    assert_eq!(got.len(), 250);
    // Kill -9 with a call possibly in flight: fire one more acquire and kill at once.
    let in_flight_key = "in-flight".to_string();
    let mut c = agent.client().await;
    let fire = tokio::spawn(async move { c.acquire(acquire_req(ITEM, "in-flight", 1, "in-flight")).await });
    agent.kill9().await;
    let _ = fire.await;
    pending.push(in_flight_key);

    let mut agent = AgentProcess::spawn(&center.url, "app", &store, Some(port)).await;
    let done = buy(&url, &mut pending, &mut next, &mut got, usize::try_from(TOTAL).unwrap()).await;
    assert!(done, "sale did not finish after the restart ({} reserved)", got.len());

    // Nothing sold twice: one reservation per unit, all distinct.
    let ids: std::collections::HashSet<_> = got.values().collect();
    assert_eq!(ids.len() as u64, TOTAL);
    let s = stock(&mut agent.client().await, ITEM).await;
    assert_eq!((s.available, s.reserved + s.sold), (0, TOTAL));
    let r = center.await_quiescence().await;
    assert!(r.ok && r.violations.is_empty());
    assert_eq!(center.ledger(ITEM).await.item.unwrap().available, 0);

    // The kill -9 lost no event and wrote none twice: one 'reserved' per reservation,
    // numbered 1..=TOTAL without a gap, read through the restarted agent.
    assert_eq!(s.last_event_sequence, TOTAL);
    let from = pb::StreamEventsRequest { from_sequence: 0, item_id: ITEM.into() };
    let mut events = agent.client().await.stream_events(from).await.unwrap().into_inner();
    let mut seen = std::collections::HashSet::new();
    for expected in 1..=TOTAL {
        let e =
            tokio::time::timeout(Duration::from_secs(10), events.message()).await.expect("bounded").unwrap().unwrap();
        assert_eq!((e.sequence, e.state()), (expected, pb::ReservationState::Reserved));
        assert!(seen.insert(e.reservation_id), "one event per reservation");
    }
    assert_eq!(seen, ids.into_iter().cloned().collect(), "the events name exactly the reservations sold");
    agent.kill9().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_returns_unreserved_units() {
    let center = Center::start_sqlite().await;
    center.create_item("drain", 1_000, 1, (20, 80, 50)).await;
    let mut agent = AgentProcess::spawn(&center.url, "web", &StoreSpec::Memory, None).await;
    let mut client = agent.client().await;
    for i in 0..3 {
        let r = client.acquire(acquire_req("drain", &format!("u{i}"), 1, &format!("k{i}"))).await.unwrap();
        assert_eq!(r.into_inner().outcome(), pb::AcquireOutcome::Reserved);
    }
    // The pool holds a batch beyond the 3 reserved units.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let mut client = client.clone();
            async move { stock(&mut client, "drain").await.available >= 20 }
        })
        .await
    );
    let status = agent.sigterm_and_wait().await;
    assert!(status.success(), "agent exited with {status}");
    let view = center.ledger("drain").await;
    let web = view.channels.iter().find(|c| c.channel == "web").unwrap();
    assert_eq!(web.held, 3, "only the reserved units stay with the channel");
    assert_eq!((web.reported_available, web.reported_reserved), (0, 3), "last report sent");
    assert_eq!(view.item.unwrap().available, 997);
}

/// A drain gives back the pools of many items at once (not one Return after another):
/// every item's unreserved units reach the center, each reserved unit stays with the
/// channel, and the last report names every pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_pool_of_many_items() {
    const ITEMS: usize = 60;
    let center = Center::start_sqlite().await;
    let ids: Vec<String> = (0..ITEMS).map(|i| format!("many-{i:02}")).collect();
    for id in &ids {
        center.create_item(id, 100, 1, (10, 40, 20)).await;
    }
    let mut agent = AgentProcess::spawn(&center.url, "web", &StoreSpec::Memory, None).await;
    let mut client = agent.client().await;
    for id in &ids {
        let r = client.acquire(acquire_req(id, &format!("buyer-{id}"), 1, &format!("k-{id}"))).await.unwrap();
        assert_eq!(r.into_inner().outcome(), pb::AcquireOutcome::Reserved, "{id}");
    }
    for id in &ids {
        let stocked = wait_until(Duration::from_secs(10), || {
            let mut client = client.clone();
            async move { stock(&mut client, id).await.available >= 10 }
        })
        .await;
        assert!(stocked, "{id} stocked beyond its reservation");
    }
    assert!(agent.sigterm_and_wait().await.success(), "drains and exits cleanly");
    for id in &ids {
        let view = center.ledger(id).await;
        let web = view.channels.iter().find(|c| c.channel == "web").unwrap();
        assert_eq!(web.held, 1, "{id}: only the reserved unit stays with the channel");
        assert_eq!((web.reported_available, web.reported_reserved), (0, 1), "{id}: last report sent");
        assert_eq!(view.item.unwrap().available, 99, "{id}");
    }
}

/// A planned restart of an agent on the embedded memory store is not an incident: SIGTERM
/// in the middle of a sale with open reservations keeps the pools (reservations and their
/// generation) for the next start, which sells on; the reservations still confirm, and
/// nothing is in doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_store_agent_restarted_with_sigterm_keeps_its_reservations() {
    let center = Center::start_sqlite().await;
    center.create_item("keep", 100, 1, (5, 30, 10)).await;
    let dir = std::env::temp_dir().join(format!("inventory-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("app.pools.json");
    let state_arg = state.to_str().unwrap().to_owned();
    let flags = ["--memory-state-file", state_arg.as_str()];
    let port = free_port();
    let mut agent = AgentProcess::spawn_with(&center.url, "app", &StoreSpec::Memory, Some(port), "app-1", &flags).await;
    let mut client = agent.client().await;
    let mut open = Vec::new();
    for n in 0..8 {
        let key = format!("before-{n}");
        let r = client.acquire(acquire_req("keep", &key, 1, &key)).await.expect("acquire").into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
        open.push(r.reservation_id);
    }
    // Two of them are paid before the restart, the rest stay open across it.
    for id in &open[..2] {
        client
            .confirm(pb::ConfirmRequest { item_id: "keep".into(), reservation_id: id.clone() })
            .await
            .expect("confirm");
    }
    assert!(agent.sigterm_and_wait().await.success(), "drains and exits cleanly");
    assert!(state.exists(), "the pools were kept for the next start");

    let agent = AgentProcess::spawn_with(&center.url, "app", &StoreSpec::Memory, Some(port), "app-1", &flags).await;
    assert!(!state.exists(), "the kept pools are read once: a later crash must not bring them back");
    let mut client = agent.client().await;
    for id in &open[2..] {
        let r = client.confirm(pb::ConfirmRequest { item_id: "keep".into(), reservation_id: id.clone() }).await;
        assert_eq!(
            r.expect("a reservation made before the restart confirms").into_inner().state(),
            pb::ReservationState::Confirmed
        );
    }
    // A replay of a key that reserved before the restart gets its reservation back.
    let replay = client.acquire(acquire_req("keep", "before-3", 1, "before-3")).await.expect("replay").into_inner();
    assert!(replay.replayed && replay.reservation_id == open[3]);
    // And it sells on.
    let sells = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            client
                .acquire(acquire_req("keep", "after", 1, "after-1"))
                .await
                .is_ok_and(|r| r.into_inner().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(sells, "the restarted agent never sold again");
    let ledger = center.ledger("keep").await;
    assert!(ledger.channels.iter().all(|c| c.in_doubt == 0), "nothing in doubt: {ledger:?}");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{:?}", r.violations);
    let _ = std::fs::remove_dir_all(&dir);
}
