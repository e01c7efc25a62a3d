//! The center stops answering mid-sale for 20 s, with real processes: its PostgreSQL
//! stopped (`pg_ctl stop -m immediate`) and started again, or the center itself frozen
//! (SIGSTOP, then SIGCONT). Two channels sell to steady buyers throughout. Borrows the
//! agents give up on are applied when the center answers again, after the agents' own
//! resync: they must still reach a shelf (or come back), so the sale ends with every unit
//! sold exactly once, no drift within a bound, and reconcile clean. While the database is
//! down the center says it does not serve (`/healthz` 503, gRPC NOT_SERVING). A third run
//! forces late grants through the test proxy: every byte between the agents and the center
//! held past the agents' deadline for a while, then delivered, so Borrows the agents gave
//! up on commit after they did.

use std::collections::HashSet;
use std::time::Duration;

use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::postgres::PgServer;
use inventory_test_support::proxy::{Fault as LinkFault, FaultProxy};
use inventory_test_support::{TestDatabase, wait_until};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::center_process::CenterProcess;
use crate::harness::{BackgroundSale, LocalAgent, StoreSpec, buy_one};

const ITEMS: &[&str] = &["out"];
const UNITS: usize = 600;
const TOTAL: u64 = UNITS as u64;
/// Small batches: grants commit often, so some are in flight when the center stops.
const WATERMARKS: (u64, u64, u64) = (10, 60, 30);
/// How long the center does not answer.
const OUTAGE: Duration = Duration::from_secs(20);

enum Fault {
    /// The center's private PostgreSQL stopped for [`OUTAGE`].
    DatabaseDown(PgServer),
    /// The center process frozen for [`OUTAGE`].
    CenterFrozen,
    /// The agents reach the center through a proxy, which holds every byte for
    /// [`LATE_BY`] (past the agents' deadline) during [`SLOW_FOR`].
    LateReplies,
}

/// The agents' deadline for one center call under [`Fault::LateReplies`].
const AGENT_DEADLINE_MS: u64 = 500;
/// How long the proxy holds each byte: well past the deadline, well short of a lease.
const LATE_BY: Duration = Duration::from_secs(3);
/// How long the link stays that slow.
const SLOW_FOR: Duration = Duration::from_secs(12);

/// Sells half the stock, breaks the center for [`OUTAGE`] while buyers keep coming, then
/// sells to the end and checks what a sale through an outage must end with.
async fn a_sale_through(fault: Fault, database_url: &str) {
    let center = CenterProcess::spawn(database_url).await;
    center.create_item(ITEMS[0], TOTAL, WATERMARKS).await;
    let proxy = match fault {
        Fault::LateReplies => Some(FaultProxy::start(center.addr).await.expect("proxy starts")),
        _ => None,
    };
    let agent = |channel: &'static str| {
        let mut config = crate::harness::agent_config(&center.url, channel, &StoreSpec::Memory);
        if let Some(proxy) = &proxy {
            config.center = proxy.url();
            config.center_timeout_ms = AGENT_DEADLINE_MS;
        }
        LocalAgent::start_with(config, None)
    };
    let app = agent("app").await;
    let web = agent("web").await;
    let clients = [app.client().await, web.client().await];

    // Steady buyers on both channels, more of them than units.
    let buyers: Vec<(Vec<AgentClient<Channel>>, usize, String)> =
        (0..UNITS).map(|n| (vec![clients[n % 2].clone()], 0, format!("b{n}"))).collect();
    let sale = BackgroundSale::start(ITEMS, buyers, 8);
    assert!(sale.reached(UNITS / 4).await, "the sale never got going");

    match &fault {
        Fault::DatabaseDown(pg) => {
            pg.stop_immediate();
            let not_serving = wait_until(Duration::from_secs(5), || async {
                center.healthz().await == Some(503) && center.grpc_health().await == Some(ServingStatus::NotServing)
            })
            .await;
            assert!(
                not_serving,
                "the center looked healthy with its database down: /healthz {:?}",
                center.healthz().await
            );
            tokio::time::sleep(OUTAGE).await;
            assert_eq!(center.healthz().await, Some(503), "still down: still not serving");
            pg.start_again().await;
            let serving = wait_until(Duration::from_secs(10), || async {
                center.healthz().await == Some(200) && center.grpc_health().await == Some(ServingStatus::Serving)
            })
            .await;
            assert!(serving, "the center never served again once its database was back");
        }
        Fault::CenterFrozen => {
            center.freeze();
            tokio::time::sleep(OUTAGE).await;
            center.thaw();
        }
        Fault::LateReplies => {
            let proxy = proxy.as_ref().expect("the proxy of this fault");
            proxy.set(LinkFault::Delay(LATE_BY));
            tokio::time::sleep(SLOW_FOR).await;
            proxy.set(LinkFault::Pass);
        }
    }

    let results = sale.finish().await;
    let mut ids: HashSet<String> = results.into_iter().filter_map(|(_, id)| id).collect();
    let during = ids.len();

    // The rest of the sale: latecomers on both channels until every unit is sold. A unit
    // stranded with a channel (held at the center, on no shelf) is never sold.
    let mut clients = clients;
    let mut late = 0u64;
    while (ids.len() as u64) < TOTAL && late < 3 * TOTAL {
        let client = &mut clients[(late % 2) as usize];
        if let Some(id) = buy_one(client, ITEMS[0], &format!("late{late}"), 300).await {
            assert!(ids.insert(id.clone()), "reservation {id} answered twice");
        }
        late += 1;
    }
    let view = center.ledger(ITEMS[0]).await;
    assert_eq!(ids.len() as u64, TOTAL, "every unit sold ({during} during the sale, {late} latecomers): {view:?}");

    // No drift within a bound, nothing stranded, reconcile clean; every unit sold once, as
    // the pools' reports say once they have arrived (a report follows its sales by up to
    // a heartbeat).
    let settled = wait_until(Duration::from_secs(30), || async {
        let reported: u64 = center.ledger(ITEMS[0]).await.channels.iter().map(|c| c.reported_sold).sum();
        reported == TOTAL && center.try_reconcile().await.is_some_and(|r| r.ok && r.drifts.is_empty())
    })
    .await;
    assert!(
        settled,
        "the ledger never settled: {:?} {:?}",
        center.try_reconcile().await,
        center.ledger(ITEMS[0]).await
    );
    let end = center.ledger(ITEMS[0]).await;
    let sold: u64 = end.channels.iter().map(|c| c.reported_sold).sum();
    assert_eq!(sold, TOTAL, "the pools sold each unit once: {end:?}");
    assert_eq!(end.item.as_ref().expect("item").available, 0, "{end:?}");
    app.stop().await;
    web.stop().await;
    drop(fault);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_stopped_for_20_s_mid_sale_strands_nothing_and_the_center_says_it_does_not_serve() {
    let pg = PgServer::start().await;
    let url = pg.create_database("inventory").await;
    a_sale_through(Fault::DatabaseDown(pg), &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_center_frozen_for_20_s_mid_sale_strands_nothing() {
    let db = TestDatabase::create().await;
    a_sale_through(Fault::CenterFrozen, &db.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_landing_after_the_agents_gave_up_strand_nothing() {
    let db = TestDatabase::create().await;
    a_sale_through(Fault::LateReplies, &db.url).await;
}
