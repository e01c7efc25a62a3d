//! Failure semantics: partitions (through the fault proxy), a paused agent whose channel
//! is reclaimed, Redis losing its data under an agent, and the end of a sale.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use inventory_proto::v1 as pb;
use inventory_test_support::proxy::{Fault, FaultProxy};
use inventory_test_support::{RedisServer, TestSqlite, wait_until};
use tonic::Code;

use crate::harness::{AgentProcess, Center, Db, LocalAgent, StoreSpec, acquire_req, agent_config, stock};

fn wall_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_agent_sells_its_pool_until_the_lease_ends_then_recovers() {
    let center = Center::start(Db::Lite(TestSqlite::create()), |c| c.lease_ttl_ms = 1_500).await;
    center.create_item("p", 1_000, 1, (20, 200, 100)).await;
    let proxy = FaultProxy::start(center.url.trim_start_matches("http://").parse().unwrap()).await.unwrap();
    let agent = LocalAgent::start(&proxy.url(), "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    let mut n = 0;
    let mut buy = |client: &mut inventory_proto::v1::agent_client::AgentClient<tonic::transport::Channel>| {
        n += 1;
        let key = format!("u{n}");
        let mut client = client.clone();
        async move { client.acquire(acquire_req("p", &key, 1, &key)).await }
    };
    assert_eq!(buy(&mut client).await.unwrap().into_inner().outcome(), pb::AcquireOutcome::Reserved);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let mut client = client.clone();
            async move { stock(&mut client, "p").await.available >= 90 }
        })
        .await
    );

    // Cut the link. The agent keeps selling from its pool...
    proxy.set(Fault::BlackHole);
    let cut_at = Instant::now();
    let r = buy(&mut client).await.expect("sells from the local pool while the lease lasts");
    assert_eq!(r.into_inner().outcome(), pb::AcquireOutcome::Reserved);
    // ...until its lease runs out; then it answers UNAVAILABLE.
    let mut last_sale_wall_ms = wall_ms();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match buy(&mut client).await {
            Ok(_) => last_sale_wall_ms = wall_ms(),
            Err(s) => {
                assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                assert!(s.message().contains("lease"), "{s:?}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "agent kept selling without a lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cut_at.elapsed() <= Duration::from_millis(1_500 + 500), "stopped within the lease");
    // It stopped before the center could consider the lease gone.
    let lease_end = center.ledger("p").await.channels[0].lease_expires_at_unix_ms;
    assert!(last_sale_wall_ms < lease_end, "sold at {last_sale_wall_ms}, lease ended {lease_end}");

    // Heal: heartbeats get through, the lease is renewed, sales resume.
    proxy.set(Fault::Pass);
    let resumed = wait_until(Duration::from_secs(10), || {
        let fut = buy(&mut client);
        async move { fut.await.is_ok() }
    })
    .await;
    assert!(resumed, "agent never recovered after the partition healed");
    let r = center.await_quiescence().await;
    assert!(r.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_agent_whose_channel_was_reclaimed_sells_nothing_it_no_longer_holds() {
    let center = Center::start(Db::Lite(TestSqlite::create()), |c| {
        c.lease_ttl_ms = 1_000;
        c.reclaim_grace_ms = 0;
    })
    .await;
    center.create_item("r", 30, 1, (10, 60, 30)).await;
    let mut app = AgentProcess::spawn(&center.url, "app", &StoreSpec::Memory, None).await;
    let mut app_client = app.client().await;
    for i in 0..5 {
        let r = app_client.acquire(acquire_req("r", &format!("a{i}"), 1, &format!("a{i}"))).await.unwrap();
        assert_eq!(r.into_inner().outcome(), pb::AcquireOutcome::Reserved);
    }
    // The app pool took all 30 units; wait until the center has its report.
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let v = center.ledger("r").await;
            v.channels.first().is_some_and(|c| c.held == 30 && c.reported_reserved == 5 && c.drift == 0)
        })
        .await
    );

    let pid = app.child.id().unwrap().to_string();
    let signal = |sig: &'static str, pid: String| async move {
        assert!(tokio::process::Command::new("kill").args([sig, &pid]).status().await.unwrap().success());
    };
    inventory_test_support::stop_process(app.child.id().unwrap());
    // Past the lease: the center takes back the 25 unsold units...
    let deadline = Instant::now() + Duration::from_secs(10);
    let reclaimed = loop {
        match center.admin().await.reclaim(pb::ReclaimRequest { channel: "app".into() }).await {
            Ok(r) => break r.into_inner(),
            Err(s) => {
                assert_eq!(s.code(), Code::FailedPrecondition);
                assert!(Instant::now() < deadline, "reclaim never allowed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // The paused agent never said its last word (it did not drain), so it may have sold
    // some of its 25 unreported units: they go in doubt, not back on sale.
    assert_eq!((reclaimed.items[0].reclaimed, reclaimed.items[0].in_doubt), (0, 25));
    assert_eq!(center.ledger("r").await.item.unwrap().available, 0);

    // The agent wakes up with 25 units in its memory pool that it may no longer sell.
    signal("-CONT", pid).await;
    let mut app_sold_after = 0;
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while Instant::now() < until {
        i += 1;
        if let Ok(r) = app_client.acquire(acquire_req("r", &format!("late{i}"), 1, &format!("late{i}"))).await
            && r.into_inner().outcome() == pb::AcquireOutcome::Reserved
        {
            app_sold_after += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app_sold_after, 0, "the woken agent sold units the center had reclaimed");
    let registered_again = wait_until(Duration::from_secs(10), || async {
        let v = center.ledger("r").await;
        v.channels.iter().any(|c| c.channel == "app" && c.epoch > reclaimed.new_epoch)
    })
    .await;
    assert!(registered_again, "the fenced agent registered again");

    // The operator checks the channel's orders: nothing sold after the last report.
    let resolved = center
        .admin()
        .await
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "r".into(), channel: "app".into(), sold: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.returned_to_center, 25);
    // Another channel sells them.
    let web = LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await;
    let mut web_client = web.client().await;
    let mut web_sold = 0;
    for i in 0..200 {
        let r = web_client.acquire(acquire_req("r", &format!("w{i}"), 1, &format!("w{i}"))).await.unwrap();
        if r.into_inner().outcome() == pb::AcquireOutcome::Reserved {
            web_sold += 1;
        }
        if web_sold == 25 {
            break;
        }
    }
    assert_eq!(web_sold, 25);
    // The app pool is brought in line with what the channel still holds: its 5 reservations.
    let aligned = wait_until(Duration::from_secs(10), || {
        let mut app_client = app_client.clone();
        async move {
            let s = stock(&mut app_client, "r").await;
            (s.available, s.reserved) == (0, 5)
        }
    })
    .await;
    assert!(aligned, "pool brought in line with the center");
    let r = center.await_quiescence().await;
    assert!(r.ok && r.in_doubt.is_empty(), "{r:?}");
    assert_eq!(center.ledger("r").await.item.unwrap().available, 0);
    app.kill9().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_its_data_freezes_the_pool_and_shows_units_in_doubt() {
    let center = Center::start_sqlite().await;
    center.create_item("d", 100, 1, (10, 40, 20)).await;
    let mut redis = RedisServer::start().await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: "inv:".into() };
    let agent = LocalAgent::start(&center.url, "app", &store).await;
    let mut client = agent.client().await;
    let mut generations = Vec::new();
    for i in 0..8 {
        let r = client.acquire(acquire_req("d", &format!("u{i}"), 1, &format!("k{i}"))).await.unwrap().into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
        generations.push(r.pool_generation);
    }
    let generation = generations[0];
    assert!(generation != 0 && generations.iter().all(|g| *g == generation), "{generations:?}");
    center.await_quiescence().await;
    let held_before = center.ledger("d").await.channels[0].held;
    assert!(held_before >= 8);

    // Redis restarts without persistence: the pool and its 8 reservations are gone.
    redis.restart_empty().await;
    let frozen = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req("d", "x", 1, "kx")).await, Err(s) if s.code() == Code::Unavailable)
        }
    })
    .await;
    assert!(frozen, "agent kept selling from a lost pool");
    // The center learns of it and shows the units in doubt, never resold.
    let mut rec = center.reconcile().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while rec.in_doubt.is_empty() {
        assert!(Instant::now() < deadline, "units never shown in doubt");
        tokio::time::sleep(Duration::from_millis(20)).await;
        rec = center.reconcile().await;
    }
    assert!(rec.ok, "in doubt is not an invariant violation: {rec:?}");
    assert!(rec.in_doubt[0].detail.contains(&format!("{held_before} units in doubt")), "{rec:?}");
    let view = center.ledger("d").await;
    assert_eq!((view.channels[0].in_doubt, view.channels[0].held), (held_before, held_before));
    // Reclaim cannot take in-doubt units.
    assert_eq!(center.ledger("d").await.item.unwrap().available, 100 - held_before);

    // The operator resolves: the channel's orders show 8 sold.
    let resolved = center
        .admin()
        .await
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "d".into(), channel: "app".into(), sold: 8 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((resolved.written_off, resolved.returned_to_center), (8, held_before - 8));
    let item = resolved.item.unwrap();
    assert_eq!((item.total, item.available, item.written_off), (92, 92, 8));
    // The agent sells again from a fresh pool.
    let resumed = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            matches!(client.acquire(acquire_req("d", "y", 1, "ky")).await,
                Ok(r) if r.get_ref().outcome() == pb::AcquireOutcome::Reserved)
        }
    })
    .await;
    assert!(resumed, "agent never resumed after the resolution");
    // The new pool does not know the keys of the lost one: a replay of k0 that passes the
    // generation its answer carried is refused instead of reserving a second time.
    let before = stock(&mut client, "d").await;
    let replay = pb::AcquireRequest { expect_pool_generation: generation, ..acquire_req("d", "u0", 1, "k0") };
    let refused = client.acquire(replay).await.expect_err("a replay into another generation is refused");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(&format!("expect_pool_generation {generation} does not match")), "{refused:?}");
    let after = stock(&mut client, "d").await;
    assert_eq!((after.reserved, after.sold), (before.reserved, before.sold), "the refusal reserved nothing");
    let fresh = client.acquire(acquire_req("d", "y", 1, "ky")).await.unwrap().into_inner();
    assert!(fresh.replayed && fresh.pool_generation != generation, "{fresh:?}");
    let r = center.await_quiescence().await;
    assert!(r.ok && r.in_doubt.is_empty(), "{r:?}");
}

/// Phase 1 puts idle units in every pool; in phase 2 only one channel has buyers, so the
/// others must give their idle units back for the sale to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_of_sale_moves_idle_units_to_the_channel_with_demand() {
    const TOTAL: u64 = 400;
    let center = Center::start_sqlite().await;
    center.create_item("e", TOTAL, 1, (10, 80, 40)).await;
    let names = ["app", "web", "partner", "eu-west"];
    let mut agents = Vec::new();
    for name in names {
        let mut cfg = agent_config(&center.url, name, &StoreSpec::Memory);
        cfg.return_sustain_ms = 60_000; // surplus stays put unless the center asks
        agents.push(LocalAgent::start_with(cfg, None).await);
    }
    let mut clients = Vec::new();
    for a in &agents {
        clients.push(a.client().await);
    }
    let clients = Arc::new(clients);
    let mut sold = 0u64;
    let mut key = 0u64;
    // Phase 1: a few buyers on every channel; each pool borrows a batch.
    let calls: Vec<(usize, u64)> = (0..4)
        .flat_map(|ch| (0..3).map(move |n| (ch, n)))
        .map(|(ch, _)| {
            key += 1;
            (ch, key)
        })
        .collect();
    sold += run(&clients, &calls).await;
    let mut idle = 0;
    for c in clients.iter().skip(1) {
        let mut c = c.clone();
        assert!(
            wait_until(Duration::from_secs(5), || {
                let mut c = c.clone();
                async move { stock(&mut c, "e").await.available >= 10 }
            })
            .await
        );
        idle += stock(&mut c, "e").await.available;
    }
    assert!(idle >= 30, "the quiet channels hold idle units ({idle})");
    // Phase 2: buyers only on the first channel; the others must give their idle units
    // back once the center runs dry.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sold < TOTAL {
        assert!(Instant::now() < deadline, "stuck at {sold}/{TOTAL}: units stranded");
        let calls: Vec<(usize, u64)> = (0..20)
            .map(|_| {
                key += 1;
                (0, key)
            })
            .collect();
        sold += run(&clients, &calls).await;
    }
    assert_eq!(sold, TOTAL, "100% sell-through");
    let r = center.await_quiescence().await;
    assert!(r.ok);
    assert_eq!(center.ledger("e").await.item.unwrap().available, 0);
}

async fn run(
    clients: &Arc<Vec<inventory_proto::v1::agent_client::AgentClient<tonic::transport::Channel>>>,
    calls: &[(usize, u64)],
) -> u64 {
    let answers = join_all(calls.iter().map(|(ch, k)| {
        let mut c = clients[*ch].clone();
        let key = format!("b{k}");
        async move { c.acquire(acquire_req("e", &key, 1, &key)).await.expect("acquire").into_inner() }
    }))
    .await;
    answers.iter().filter(|a| a.outcome() == pb::AcquireOutcome::Reserved).count() as u64
}

/// The center applies a Borrow and its replies are lost: until the agent has settled that
/// grant with the center, an empty pool is no proof of being sold out, so buyers hear
/// UNAVAILABLE (retry), never SOLD_OUT, and buy as soon as the center answers again (not
/// only at the resync scheduled seconds later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_borrow_reply_is_never_a_false_sold_out() {
    let center = Center::start(Db::Lite(TestSqlite::create()), |_| {}).await;
    // Low watermark 0: nothing is borrowed ahead of demand; the buyer's miss borrows.
    center.create_item("q", 10, 1, (0, 20, 10)).await;
    let proxy = FaultProxy::start(center.url.trim_start_matches("http://").parse().unwrap()).await.unwrap();
    let mut config = agent_config(&proxy.url(), "app", &StoreSpec::Memory);
    // Each attempt gives up quickly, so the Borrow's outcome is known to be unknown
    // within the Acquire's miss wait.
    config.center_timeout_ms = 150;
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;
    assert_eq!(stock(&mut client, "q").await.available, 0, "the item is known, its pool empty");

    proxy.set(Fault::DropReplies);
    let first = client.acquire(acquire_req("q", "u1", 1, "k1")).await;
    let first = first.expect_err("the grant's outcome is unknown");
    assert_eq!(first.code(), Code::Unavailable);
    assert_eq!(center.ledger("q").await.channels[0].held, 10, "the center granted the batch to the channel");

    proxy.set(Fault::Pass);
    let bought = wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            match client.acquire(acquire_req("q", "u1", 1, "k1")).await {
                Ok(r) => {
                    let r = r.into_inner();
                    assert_eq!(
                        r.outcome(),
                        pb::AcquireOutcome::Reserved,
                        "false answer while the channel holds the grant"
                    );
                    true
                }
                Err(s) => {
                    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                    false
                }
            }
        }
    })
    .await;
    assert!(bought, "the grant was never settled");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{:?}", r.violations);
}

/// The center is gone for 10 s while two agents sell: each logs once that it lost the
/// center and once that it regained it (not a line per failed call), counts the failed
/// calls in a metric, and sells again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_center_outage_is_logged_once_lost_and_once_regained() {
    let center = Center::start(Db::Lite(TestSqlite::create()), |c| c.lease_ttl_ms = 30_000).await;
    center.create_item("o", 100_000, 1, (20, 200, 100)).await;
    let proxy = FaultProxy::start(center.url.trim_start_matches("http://").parse().unwrap()).await.unwrap();
    let mut agents = Vec::new();
    for channel in ["app", "web"] {
        let log_path = std::env::temp_dir().join(format!("inventory-outage-{}-{channel}.log", std::process::id()));
        let log = std::fs::File::create(&log_path).unwrap();
        let http = inventory_test_support::free_port();
        let http_flag = format!("127.0.0.1:{http}");
        let flags = ["--http-listen", http_flag.as_str()];
        let agent_id = format!("{channel}-1");
        let agent =
            AgentProcess::spawn_logging(&proxy.url(), channel, &StoreSpec::Memory, None, &agent_id, &flags, Some(log))
                .await;
        let client = agent.client().await;
        agents.push((channel, agent, client, http, log_path));
    }
    let clients: Vec<_> = agents.iter().map(|a| a.2.clone()).collect();
    let buyers = |from: usize, n: usize| {
        let clients = clients.clone();
        async move {
            let mut sold = 0;
            for i in from..from + n {
                let key = format!("b{i}");
                let mut client = clients[i % clients.len()].clone();
                if let Ok(r) = client.acquire(acquire_req("o", &key, 1, &key)).await {
                    sold += usize::from(r.into_inner().outcome() == pb::AcquireOutcome::Reserved);
                }
            }
            sold
        }
    };
    assert!(buyers(0, 50).await > 0, "sells before the outage");

    proxy.set(Fault::Reset);
    let outage = Instant::now();
    let mut n = 1_000;
    while outage.elapsed() < Duration::from_secs(10) {
        buyers(n, 20).await;
        n += 20;
    }
    proxy.set(Fault::Pass);
    let resumed = wait_until(Duration::from_secs(20), || {
        let fut = buyers(n, 10);
        n += 10;
        async move { fut.await >= 2 }
    })
    .await;
    assert!(resumed, "never sold again after the outage");
    for (channel, mut agent, _, http, log_path) in agents {
        let metrics = crate::harness::http_get(format!("127.0.0.1:{http}").parse().unwrap(), "/metrics").await;
        let series = format!("inventory_agent_center_unanswered_calls_total{{channel=\"{channel}\"}}");
        let unanswered = crate::harness::sample(&metrics, &series);
        assert!(unanswered.is_some_and(|v| v >= 3.0), "{channel}: failed calls counted: {unanswered:?}");
        assert!(agent.sigterm_and_wait().await.success());
        let text = std::fs::read_to_string(&log_path).unwrap();
        let _ = std::fs::remove_file(&log_path);
        let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
        assert_eq!(count("center lost"), 1, "{channel}:\n{text}");
        assert_eq!(count("center regained"), 1, "{channel}:\n{text}");
        assert!(text.lines().count() < 20, "{channel}: a quiet log through an outage:\n{text}");
    }
}
