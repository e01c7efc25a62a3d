//! The center's PostgreSQL fails over to an asynchronous standby that missed commits, with
//! real processes: a private primary and a standby made with `pg_basebackup -R`, streaming
//! through the fault proxy so the test can cut its link. Grants keep committing on the
//! primary while the link is cut; then the standby is promoted and the primary dies
//! (`-m immediate`). Either the center restarts on the standby, at the address the agents
//! know, or it keeps running and its database's address (a second proxy, as a virtual IP
//! or a pooler would be) moves to the standby under it. The promoted ledger lacks grants
//! the pools shelved: it counts those units available.
//!
//! Lending them again would oversell. What must hold: at every sample, the units the pools
//! hold reserved or sold never exceed the total; reconcile names the channels holding more
//! than the ledger counts, and the metric behind `InventoryLedgerBehindPool` is negative,
//! while it lasts; the lost grants are re-learned (the ledger ends without drift); and the
//! sale ends with no unit sold twice.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::postgres::PgServer;
use inventory_test_support::proxy::{Fault, FaultProxy};
use inventory_test_support::wait_until;
use tonic::transport::Channel;

use crate::center_process::CenterProcess;
use crate::harness::{BackgroundSale, LocalAgent, StoreSpec, buy_one, sample};

const ITEMS: &[&str] = &["fo"];
const UNITS: usize = 1_000;
const TOTAL: u64 = UNITS as u64;
/// Small batches: grants commit often.
const WATERMARKS: (u64, u64, u64) = (20, 80, 40);
/// Grants committed on the primary while the standby hears nothing (units).
const UNREPLICATED: u64 = 2 * WATERMARKS.2;

fn granted(view: &pb::GetItemResponse) -> u64 {
    view.channels.iter().map(|c| c.granted).sum()
}

/// What the test saw while the sale ran: the most units reserved or sold in the pools at
/// once, reconcile's findings of pools beyond the ledger, and whether the drift metric
/// went negative.
#[derive(Default)]
struct Seen {
    max_taken: AtomicU64,
    samples: AtomicU64,
    beyond: Mutex<Vec<pb::Violation>>,
    negative_metric: AtomicBool,
}

/// Samples the pools (GetStock on every agent) and the center (Reconcile, /metrics) every
/// 50 ms until `stop`.
fn watch(
    clients: [AgentClient<Channel>; 2],
    center: (String, std::net::SocketAddr),
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut clients = clients;
        while !stop.load(Ordering::SeqCst) {
            let mut taken = 0;
            for client in &mut clients {
                let request = pb::GetStockRequest { item_id: ITEMS[0].into() };
                if let Ok(s) = client.get_stock(request).await {
                    let s = s.into_inner();
                    taken += s.reserved + s.sold;
                }
            }
            seen.max_taken.fetch_max(taken, Ordering::SeqCst);
            seen.samples.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut admin) = inventory_proto::v1::admin_client::AdminClient::connect(center.0.clone()).await {
                let call = admin.reconcile(pb::ReconcileRequest::default());
                if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(1), call).await {
                    let found = r.into_inner().violations.into_iter().filter(|v| v.invariant == "beyond_ledger");
                    seen.beyond.lock().unwrap().extend(found);
                }
            }
            if let Some((200, body)) = crate::center_process::http(center.1, "/metrics").await {
                let negative = ["app", "web"].iter().any(|c| {
                    let series = format!("inventory_center_channel_drift_units{{item=\"fo\",channel=\"{c}\"}}");
                    sample(&body, &series).is_some_and(|d| d < 0.0)
                });
                if negative {
                    seen.negative_metric.store(true, Ordering::SeqCst);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_lagging_standby_oversells_nothing_and_the_lost_grants_are_relearned() {
    failover(Center::Restarts).await;
}

/// A failover fast enough that no read of the center failed: only the new connections'
/// server tells the center that its ledger may have gone back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_a_running_center_oversells_nothing_and_the_lost_grants_are_relearned() {
    failover(Center::KeepsRunning).await;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Center {
    Restarts,
    KeepsRunning,
}

async fn failover(how: Center) {
    let primary = PgServer::start().await;
    primary.create_database("inventory").await;
    let link = FaultProxy::start(primary.addr()).await.expect("replication proxy");
    let standby = PgServer::standby_of(link.addr()).await;
    let database = FaultProxy::start(primary.addr()).await.expect("database address");
    let center = CenterProcess::spawn(&format!("postgres://postgres@{}/inventory", database.addr())).await;
    let (center_addr, center_http) = (center.addr, center.http_addr);
    center.create_item(ITEMS[0], TOTAL, WATERMARKS).await;
    let app = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let web = LocalAgent::start(&center.url, "web", &StoreSpec::Memory).await;
    let clients = [app.client().await, web.client().await];

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(clients.clone(), (center.url.clone(), center_http), Arc::clone(&seen), Arc::clone(&stop));

    // Steady buyers on both channels, more of them than units.
    let buyers: Vec<(Vec<AgentClient<Channel>>, usize, String)> =
        (0..UNITS + UNITS / 2).map(|n| (vec![clients[n % 2].clone()], 0, format!("b{n}"))).collect();
    let sale = BackgroundSale::start(ITEMS, buyers, 8);
    assert!(sale.reached(UNITS / 5).await, "the sale never got going");

    // The standby has everything so far; then its link is cut while grants commit.
    let caught_up_to = primary.wal_position().await;
    assert!(
        wait_until(Duration::from_secs(10), || async { standby.wal_position().await >= caught_up_to }).await,
        "the standby never caught up"
    );
    link.set(Fault::BlackHole);
    // Read after the cut: a grant committed between this read and the cut would count as
    // unreplicated while its WAL still reached the standby.
    let replicated = granted(&center.ledger(ITEMS[0]).await);
    let committed_meanwhile = wait_until(Duration::from_secs(30), || async {
        granted(&center.ledger(ITEMS[0]).await) >= replicated + UNREPLICATED
    })
    .await;
    assert!(committed_meanwhile, "grants stopped committing on the primary");

    // The standby is promoted and the primary dies (a failover manager fences the old
    // primary once the new one takes writes), so the database's address is never without
    // a server for long enough that a failed read would tell the center. The center
    // restarts on the standby, where the agents expect it, or stays while its database's
    // address moves.
    let on_primary = center.ledger(ITEMS[0]).await;
    standby.promote().await;
    primary.stop_immediate();
    database.redirect(standby.addr()).expect("the standby is on loopback");
    let center = match how {
        Center::Restarts => {
            center.kill9().await;
            CenterProcess::spawn_at(&standby.url("inventory"), center_addr, center_http).await
        }
        Center::KeepsRunning => center,
    };
    // Its pool's connections to the dead primary fail once each, then reconnect.
    let answers = wait_until(Duration::from_secs(30), || async {
        center.admin().await.get_item(pb::GetItemRequest { item_id: ITEMS[0].into() }).await.is_ok()
    })
    .await;
    assert!(answers, "the center never read the promoted ledger");
    let promoted = center.ledger(ITEMS[0]).await;
    assert!(
        granted(&promoted) < granted(&on_primary),
        "the promoted ledger lacks the unreplicated grants: {on_primary:?} then {promoted:?}"
    );
    eprintln!(
        "grants lost in the failover: {} units; the promoted ledger: {promoted:?}",
        granted(&on_primary) - granted(&promoted)
    );

    // The sale runs to the end.
    let results = sale.finish().await;
    let mut ids: HashSet<String> = results.into_iter().filter_map(|(_, id)| id).collect();
    let mut clients = clients;
    let mut late = 0u64;
    let mut sold_out_in_a_row = 0;
    while sold_out_in_a_row < 40 && late < 2 * TOTAL {
        let client = &mut clients[(late % 2) as usize];
        match buy_one(client, ITEMS[0], &format!("late{late}"), 300).await {
            Some(id) => {
                assert!(ids.insert(id.clone()), "reservation {id} answered twice");
                sold_out_in_a_row = 0;
            }
            None => sold_out_in_a_row += 1,
        }
        late += 1;
    }
    // Settled, and the pools' reports carry the last sales (a sale makes no drift, so a
    // quiet ledger alone can stand before the next heartbeat).
    let settled = wait_until(Duration::from_secs(30), || async {
        let reported: u64 = center.ledger(ITEMS[0]).await.channels.iter().map(|c| c.reported_sold).sum();
        reported == ids.len() as u64 && center.try_reconcile().await.is_some_and(|r| r.ok && r.drifts.is_empty())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    watcher.await.expect("watcher");
    let end = center.ledger(ITEMS[0]).await;
    let max_taken = seen.max_taken.load(Ordering::SeqCst);
    let samples = seen.samples.load(Ordering::SeqCst);

    eprintln!(
        "failover: {} reservations answered for {TOTAL} units; at most {max_taken} reserved or sold at once ({samples} samples)",
        ids.len()
    );
    assert!(
        max_taken <= TOTAL,
        "oversold: the pools held {max_taken} units reserved or sold of {TOTAL} ({} answered RESERVED): {end:?}",
        ids.len()
    );
    assert!(ids.len() as u64 <= TOTAL, "{} reservations for {TOTAL} units", ids.len());
    let beyond = seen.beyond.lock().unwrap().clone();
    assert!(!beyond.is_empty(), "reconcile never named a pool beyond the ledger ({samples} samples)");
    for v in &beyond {
        assert!(["app", "web"].contains(&v.channel.as_str()) && v.item_id == ITEMS[0], "{v:?}");
        let units: u64 = v.detail.split_whitespace().find_map(|w| w.parse().ok()).unwrap_or(0);
        assert!(units > 0, "reconcile names the units: {v:?}");
    }
    assert!(seen.negative_metric.load(Ordering::SeqCst), "the drift metric never went negative");
    if how == Center::KeepsRunning {
        let metrics = crate::center_process::http(center_http, "/metrics").await.expect("center /metrics").1;
        let changes = sample(&metrics, "inventory_center_database_server_changes_total");
        assert!(changes >= Some(1.0), "the running center saw its database change: {changes:?}");
    }
    assert!(settled, "the ledger never settled: {:?} {end:?}", center.try_reconcile().await);
    let reported_sold: u64 = end.channels.iter().map(|c| c.reported_sold).sum();
    assert_eq!(reported_sold, ids.len() as u64, "{end:?}");
    assert_eq!(ids.len() as u64, TOTAL, "the lost grants were re-learned and sold: {end:?}");
    app.stop().await;
    web.stop().await;
}
