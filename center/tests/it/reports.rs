//! Heartbeat reports and the loss rule, through gRPC, against PostgreSQL and SQLite: a pool
//! reported lost, or with another generation than the one last reported, puts what the
//! channel holds of the item in doubt, in the report's own transaction.

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::transport::Channel;

use crate::contract::{borrow, create, ledger, register};
use crate::support::TestCenter;

crate::for_each_backend!(a_lost_or_recreated_pool_puts_its_units_in_doubt);

async fn report(
    center: &mut CenterClient<Channel>,
    epoch: u64,
    pools: &[(&str, u64, u64, bool)],
) -> pb::HeartbeatResponse {
    let pools = pools
        .iter()
        .map(|&(item, available, generation, lost)| pb::PoolReport {
            item_id: item.into(),
            available,
            generation,
            lost,
            ..Default::default()
        })
        .collect();
    let mut r = center
        .heartbeat(pb::HeartbeatRequest { channel: "app".into(), epoch, pools, ..Default::default() })
        .await
        .expect("heartbeat")
        .into_inner();
    // A set: the order says nothing.
    r.in_doubt_items.sort();
    r
}

async fn a_lost_or_recreated_pool_puts_its_units_in_doubt(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    for item in ["a", "b", "c"] {
        create(&mut admin, item, 100).await;
    }
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "a", "app", epoch, 10, "a1").await.unwrap();
    borrow(&mut center, "b", "app", epoch, 4, "b1").await.unwrap();
    let r = report(&mut center, epoch, &[("a", 10, 5, false), ("b", 4, 9, false)]).await;
    assert!(r.in_doubt_items.is_empty(), "{r:?}");

    // a's pool comes back with a new generation, b's is reported lost, c was never held.
    let r = report(&mut center, epoch, &[("a", 0, 6, false), ("b", 0, 9, true), ("c", 0, 0, true)]).await;
    assert_eq!(r.in_doubt_items, ["a", "b"], "only pools whose loss put units in doubt");
    let a = ledger(&mut admin, "a").await.channels[0].clone();
    assert_eq!((a.in_doubt, a.generation, a.reported_available), (10, 6, 0));
    assert_eq!(ledger(&mut admin, "b").await.channels[0].in_doubt, 4);
    assert_eq!(ledger(&mut admin, "c").await.channels[0].in_doubt, 0);

    // The new pool is the one now known: reporting it again loses nothing more; items
    // still in doubt stay listed.
    let r = report(&mut center, epoch, &[("a", 0, 6, false)]).await;
    assert_eq!(r.in_doubt_items, ["a", "b"]);
    assert_eq!(ledger(&mut admin, "a").await.channels[0].in_doubt, 10);
    // A generation of 0 after a real one: the pool vanished.
    admin
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "a".into(), channel: "app".into(), sold: 0 })
        .await
        .expect("resolve");
    borrow(&mut center, "a", "app", epoch, 3, "a2").await.unwrap();
    report(&mut center, epoch, &[("a", 3, 7, false)]).await;
    let r = report(&mut center, epoch, &[("a", 0, 0, false)]).await;
    assert!(r.in_doubt_items.contains(&"a".to_owned()), "{r:?}");
    assert_eq!(ledger(&mut admin, "a").await.channels[0].in_doubt, 3);
    let rec = admin.reconcile(pb::ReconcileRequest::default()).await.unwrap().into_inner();
    assert!(rec.ok, "{rec:?}");
}
