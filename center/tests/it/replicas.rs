//! Several center replicas on one PostgreSQL database: any replica serves any call, the
//! row locks keep grants exact, and events reach watchers on every replica.

use std::time::Duration;

use inventory_center::{Application, CenterConfig};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::TestDatabase;
use rand::Rng;

use crate::contract::{borrow, create, register};

async fn replica(db: &TestDatabase) -> (String, tokio::task::JoinHandle<()>) {
    let app = Application::build(CenterConfig::for_tests(&db.url)).await.expect("replica starts");
    let url = format!("http://{}", app.grpc_addr());
    (url, tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("runs") }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrows_through_two_replicas_grant_every_unit_once() {
    const TOTAL: u64 = 3_000;
    let db = TestDatabase::create().await;
    let (a, _ta) = replica(&db).await;
    let (b, _tb) = replica(&db).await;
    let mut admin = AdminClient::connect(a.clone()).await.unwrap();
    create(&mut admin, "r", TOTAL).await;
    let mut epochs = Vec::new();
    for n in 0..4 {
        // Registrations through either replica share the one ledger.
        let url = if n % 2 == 0 { &a } else { &b };
        epochs.push(register(&mut CenterClient::connect(url.clone()).await.unwrap(), &format!("ch{n}")).await);
    }
    let mut tasks = Vec::new();
    for t in 0..32usize {
        let url = if t % 2 == 0 { a.clone() } else { b.clone() };
        let (channel, epoch) = (format!("ch{}", t % 4), epochs[t % 4]);
        tasks.push(tokio::spawn(async move {
            let mut c = CenterClient::connect(url).await.unwrap();
            let mut got = 0;
            for n in 0..5_000u32 {
                let q = rand::rng().random_range(1..=40);
                let r = borrow(&mut c, "r", &channel, epoch, q, &format!("t{t}-{n}")).await.expect("borrow");
                if r.granted == 0 {
                    return got;
                }
                got += r.granted;
            }
            panic!("never ran out");
        }));
    }
    let mut sum = 0;
    for t in tasks {
        sum += t.await.unwrap();
    }
    assert_eq!(sum, TOTAL);
    let mut other = AdminClient::connect(b).await.unwrap();
    let r = other.reconcile(pb::ReconcileRequest::default()).await.unwrap().into_inner();
    assert!(r.ok, "{r:?}");
    let view = other.get_item(pb::GetItemRequest { item_id: "r".into() }).await.unwrap().into_inner();
    assert_eq!(view.channels.iter().map(|c| c.granted).sum::<u64>(), TOTAL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_watchers_on_every_replica() {
    let db = TestDatabase::create().await;
    let (a, _ta) = replica(&db).await;
    let (b, _tb) = replica(&db).await;
    let mut admin_b = AdminClient::connect(b.clone()).await.unwrap();
    create(&mut admin_b, "e", 100).await;
    let mut center_a = CenterClient::connect(a.clone()).await.unwrap();
    let epoch = register(&mut center_a, "app").await;
    let mut stream =
        center_a.watch_channel(pb::WatchChannelRequest { channel: "app".into(), epoch }).await.unwrap().into_inner();
    // The change is made through the other replica.
    admin_b
        .set_watermarks(pb::SetWatermarksRequest {
            item_id: "e".into(),
            channel: "app".into(),
            low: 3,
            high: 30,
            batch: 9,
            ..Default::default()
        })
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.expect("event within 5 s");
    let event = got.unwrap().expect("open").event.expect("set");
    assert_eq!(
        event,
        pb::channel_event::Event::WatermarksChanged(pb::WatermarksChanged {
            item_id: "e".into(),
            watermarks: Some(pb::Watermarks { low: 3, high: 30, batch: 9 }),
        })
    );
    admin_b
        .add_stock(pb::AddStockRequest { item_id: "e".into(), quantity: 5, request_id: "more".into() })
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.expect("event within 5 s");
    let event = got.unwrap().expect("open").event.expect("set");
    assert_eq!(
        event,
        pb::channel_event::Event::Restocked(pb::Restocked { item_id: "e".into(), center_available: 105 })
    );
}
