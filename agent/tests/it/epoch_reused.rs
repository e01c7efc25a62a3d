//! The center's ledger goes back in time and its epoch counter with it: it hands out an
//! epoch the channel's pools are already fenced above. The agent's registration finds the
//! fence, writes nothing under that epoch, registers again above it, and the sale ends
//! with every unit sold once; without that, the pools refuse every refill under the
//! reused epoch while the center goes on granting under it.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::{TestDatabase, wait_until};

use crate::harness::{Center, Db, LocalAgent, StoreSpec, buy_one};

const TOTAL: u64 = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_handed_out_again_below_the_pools_fence_is_never_used() {
    let db = TestDatabase::create().await;
    let db_url = db.url.clone();
    let center = Center::start(Db::Pg(db), |_| {}).await;
    center.create_item("er", TOTAL, 1, (5, 30, 10)).await;
    let app = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = app.client().await;
    let mut sold = 0;
    for n in 0..5 {
        assert!(buy_one(&mut client, "er", &format!("a{n}"), 100).await.is_some());
        sold += 1;
    }
    // A second process registers (epoch 2) and fences the agent, which registers again
    // (epoch 3) and fences its pool with it.
    let mut center_client = CenterClient::connect(center.url.clone()).await.expect("connect center");
    let rival = pb::RegisterAgentRequest { channel: "app".into(), agent_id: "app-2".into(), fenced_at: 0 };
    assert_eq!(center_client.register_agent(rival).await.expect("register").into_inner().epoch, 2);
    let pg = sqlx::PgPool::connect(&db_url).await.expect("connect to the center's database");
    let epoch = || async {
        let e: i64 = sqlx::query_scalar("SELECT epoch FROM channels WHERE channel = 'app'")
            .fetch_one(&pg)
            .await
            .expect("read the epoch");
        e
    };
    assert!(wait_until(Duration::from_secs(20), || async { app.agent.link.epoch() == 3 }).await, "re-registered");

    // The ledger goes back to when epoch 1 was the last one handed out: the agent's next
    // heartbeat is refused, and its registration is answered epoch 2, below the fence 3.
    sqlx::query("UPDATE channels SET epoch = 1 WHERE channel = 'app'").execute(&pg).await.expect("roll back");
    let above =
        wait_until(Duration::from_secs(20), || async { app.agent.link.epoch() == 4 && epoch().await == 4 }).await;
    assert!(above, "registered above the fence: agent {}, center {}", app.agent.link.epoch(), epoch().await);

    // The sale runs to the end under the new epoch: every unit sold once.
    for n in 0..TOTAL * 2 {
        if buy_one(&mut client, "er", &format!("late{n}"), 200).await.is_some() {
            sold += 1;
        }
        if sold >= TOTAL {
            break;
        }
    }
    assert_eq!(sold, TOTAL, "every unit sold under the epoch above the fence");
    assert!(buy_one(&mut client, "er", "one-more", 20).await.is_none(), "nothing beyond the stock");
    assert_eq!(epoch().await, 4, "no registration since");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");
    app.stop().await;
}

/// The first report after a registration is refused as of a stale epoch (the ledger went
/// back below the new epoch, or the channel was fenced since): the agent registers again
/// instead of going on under an epoch the center no longer answers for. The simulator
/// found why it must (scenario `ledger-rollback`, seed 9,363): a ledger gone back granted
/// units to a dead incarnation after the resync had read it, a second process was handed
/// the agent's own epoch again, and those units stayed counted with the channel while no
/// pool held them, so the sale ended four units short. Here the center refuses that one
/// report (a fault hook), so without the new registration the epoch would stay 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_whose_first_report_is_refused_registers_again() {
    let center = Center::start_sqlite().await;
    center.create_item("rr", 20, 1, (5, 15, 5)).await;
    center.faults.refuse_heartbeats.store(1, std::sync::atomic::Ordering::SeqCst);
    let app = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    assert_eq!(center.faults.refuse_heartbeats.load(std::sync::atomic::Ordering::SeqCst), 0, "a report was refused");
    let registered_again = wait_until(Duration::from_secs(20), || async { app.agent.link.epoch() == 2 }).await;
    assert!(registered_again, "the agent goes on under epoch {}", app.agent.link.epoch());
    let mut client = app.client().await;
    assert!(buy_one(&mut client, "rr", "after", 100).await.is_some(), "it sells under the new epoch");
    app.stop().await;
}
