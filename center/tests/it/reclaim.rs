//! Reclaim and units in doubt, run against PostgreSQL and SQLite: a dead channel's units
//! come back only after its lease, the old epoch is fenced, and units whose fate is unknown
//! stay in doubt until an operator resolves them.

use std::time::Duration;

use inventory_proto::v1 as pb;
use tonic::Code;

use crate::contract::{assert_conserved, assert_status, borrow, create, ledger, reconcile, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    reclaim_waits_for_lease_then_fences_the_old_epoch,
    auto_reclaim_takes_back_a_dead_channels_units,
    in_doubt_units_are_never_reclaimed_and_resolve_once,
    reclaim_without_a_last_report_puts_unreported_units_in_doubt,
);

async fn reclaim_waits_for_lease_then_fences_the_old_epoch(c: TestCenter) {
    // This contract needs a short lease: start a second center on the same backend kind.
    let backend = backend_of(&c);
    drop(c);
    let c = TestCenter::start_with(backend, |cfg| {
        cfg.lease_ttl_ms = 300;
        cfg.reclaim_grace_ms = 100;
    })
    .await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 50, "b1").await.unwrap();
    let hb = center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch,
            pools: vec![pb::PoolReport {
                item_id: "i".into(),
                available: 30,
                reserved: 5,
                sold: 15,
                ..Default::default()
            }],
            // The agent drained: this report is its last word.
            last_report: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.lease_ttl_ms, 300);
    let reclaim = || pb::ReclaimRequest { channel: "app".into() };
    assert_status(admin.reclaim(reclaim()).await, Code::FailedPrecondition, "lease of channel app is still live");
    // Poll until the lease (plus grace) has run out; the refused attempts change nothing.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let outcome = loop {
        match admin.reclaim(reclaim()).await {
            Ok(r) => break r.into_inner(),
            Err(s) => {
                assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
                assert!(std::time::Instant::now() < deadline, "reclaim never allowed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    assert_eq!(outcome.items, vec![pb::ReclaimedItem { item_id: "i".into(), reclaimed: 30, in_doubt: 0 }]);
    assert!(outcome.new_epoch > epoch);
    let view = ledger(&mut admin, "i").await;
    assert_conserved(&view);
    assert_eq!((view.item.as_ref().unwrap().available, view.channels[0].held), (80, 20));
    assert_status(borrow(&mut center, "i", "app", epoch, 1, "b2").await, Code::FailedPrecondition, "stale epoch");
    assert!(reconcile(&mut admin).await.ok);
}

fn backend_of(c: &TestCenter) -> crate::support::Backend {
    if c.database_url.starts_with("postgres") {
        crate::support::Backend::Postgres
    } else {
        crate::support::Backend::Sqlite
    }
}

async fn auto_reclaim_takes_back_a_dead_channels_units(c: TestCenter) {
    let backend = backend_of(&c);
    drop(c);
    let c = TestCenter::start_with(backend, |cfg| {
        cfg.lease_ttl_ms = 200;
        cfg.auto_reclaim_after_ms = 100;
    })
    .await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 40, "b1").await.unwrap();
    center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch,
            pools: vec![pb::PoolReport { item_id: "i".into(), available: 30, reserved: 10, ..Default::default() }],
            last_report: true,
        })
        .await
        .unwrap();
    // Nobody calls Reclaim: the center does it once the lease is long gone.
    let reclaimed = inventory_test_support::wait_until(Duration::from_secs(10), || {
        let mut admin = admin.clone();
        async move { ledger(&mut admin, "i").await.channels[0].reclaimed == 30 }
    })
    .await;
    assert!(reclaimed, "auto reclaim never happened");
    let view = ledger(&mut admin, "i").await;
    assert_eq!((view.item.as_ref().unwrap().available, view.channels[0].held), (90, 10));
    assert!(view.channels[0].epoch > epoch, "the dead agent is fenced");
    assert!(reconcile(&mut admin).await.ok);
}

async fn in_doubt_units_are_never_reclaimed_and_resolve_once(c: TestCenter) {
    let backend = backend_of(&c);
    drop(c);
    let c = TestCenter::start_with(backend, |cfg| cfg.lease_ttl_ms = 200).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 40, "b1").await.unwrap();
    center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch,
            pools: vec![pb::PoolReport { item_id: "i".into(), lost: true, ..Default::default() }],
            ..Default::default()
        })
        .await
        .unwrap();
    let r = reconcile(&mut admin).await;
    assert!(r.ok);
    assert_eq!(r.in_doubt.len(), 1);
    assert!(r.in_doubt[0].detail.starts_with("40 units in doubt"), "{r:?}");
    // Registration tells a restarted agent the units are in doubt.
    let again = center
        .register_agent(pb::RegisterAgentRequest { channel: "app".into(), agent_id: "app-2".into(), fenced_at: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.held[0].held, again.held[0].in_doubt), (40, 40));
    // Lease gone: a reclaim takes nothing that is in doubt.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let out = loop {
        match admin.reclaim(pb::ReclaimRequest { channel: "app".into() }).await {
            Ok(r) => break r.into_inner(),
            Err(_) => {
                assert!(std::time::Instant::now() < deadline);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(out.items[0].reclaimed, 0);
    let resolve = |sold| pb::ResolveInDoubtRequest { item_id: "i".into(), channel: "app".into(), sold };
    assert_status(admin.resolve_in_doubt(resolve(41)).await, Code::FailedPrecondition, "has 40 in doubt");
    let done = admin.resolve_in_doubt(resolve(15)).await.unwrap().into_inner();
    assert_eq!((done.written_off, done.returned_to_center), (15, 25));
    assert_status(admin.resolve_in_doubt(resolve(15)).await, Code::FailedPrecondition, "nothing in doubt");
    let view = ledger(&mut admin, "i").await;
    let item = view.item.as_ref().unwrap();
    assert_eq!((item.total, item.available, item.written_off, view.channels[0].held), (85, 85, 15, 0));
    let r = reconcile(&mut admin).await;
    assert!(r.ok && r.in_doubt.is_empty(), "{r:?}");
}

async fn reclaim_without_a_last_report_puts_unreported_units_in_doubt(c: TestCenter) {
    let backend = backend_of(&c);
    drop(c);
    let c = TestCenter::start_with(backend, |cfg| cfg.lease_ttl_ms = 200).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", epoch, 50, "b1").await.unwrap();
    // A report, but not a last word: the agent may go on selling after it (a crash, or a
    // partition in which it sells until its lease ends).
    center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch,
            pools: vec![pb::PoolReport {
                item_id: "i".into(),
                available: 30,
                reserved: 5,
                sold: 15,
                ..Default::default()
            }],
            last_report: false,
        })
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let out = loop {
        match admin.reclaim(pb::ReclaimRequest { channel: "app".into() }).await {
            Ok(r) => break r.into_inner(),
            Err(_) => {
                assert!(std::time::Instant::now() < deadline, "reclaim never allowed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(out.items, vec![pb::ReclaimedItem { item_id: "i".into(), reclaimed: 0, in_doubt: 30 }]);
    let view = ledger(&mut admin, "i").await;
    assert_eq!((view.item.as_ref().unwrap().available, view.channels[0].held, view.channels[0].in_doubt), (50, 50, 30));
    let r = reconcile(&mut admin).await;
    assert!(r.ok && r.in_doubt.len() == 1, "{r:?}");
    // The channel's orders show 3 more sold after its last report.
    let done = admin
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "i".into(), channel: "app".into(), sold: 3 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((done.written_off, done.returned_to_center), (3, 27));
    let view = ledger(&mut admin, "i").await;
    let item = view.item.as_ref().unwrap();
    assert_eq!((item.total, item.available, view.channels[0].held, view.channels[0].in_doubt), (97, 77, 20, 0));
    assert!(reconcile(&mut admin).await.ok);
}
