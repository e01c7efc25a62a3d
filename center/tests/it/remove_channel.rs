//! RemoveChannel, run against PostgreSQL and SQLite: a channel goes only once it holds
//! nothing and no agent is attached, and an agent that comes back for it registers anew
//! above every epoch the channel had.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::wait_until;
use tonic::Code;
use tonic::transport::Channel;

use crate::contract::{assert_conserved, assert_status, borrow, create, give_back, ledger, reconcile, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    remove_refuses_a_channel_holding_stock_then_removes_it_and_fences_its_epoch,
    remove_refuses_units_in_doubt_until_they_are_resolved,
    remove_waits_for_an_attached_agents_lease,
    remove_names_an_unknown_or_invalid_channel,
);

fn remove(channel: &str) -> pb::RemoveChannelRequest {
    pb::RemoveChannelRequest { channel: channel.into() }
}

/// The agent's drain: its report is its last word, so nobody is attached any more.
async fn last_word(center: &mut CenterClient<Channel>, channel: &str, epoch: u64, pools: Vec<pb::PoolReport>) {
    center
        .heartbeat(pb::HeartbeatRequest { channel: channel.into(), epoch, pools, last_report: true })
        .await
        .expect("last report");
}

fn pool(item: &str, available: u64) -> pb::PoolReport {
    pb::PoolReport { item_id: item.into(), available, generation: 7, ..Default::default() }
}

async fn channel_names(admin: &mut AdminClient<Channel>) -> Vec<String> {
    let all = admin.list_channels(pb::ListChannelsRequest::default()).await.expect("list channels").into_inner();
    all.channels.into_iter().map(|c| c.channel).collect()
}

async fn request_stored(pool: &sqlx::AnyPool, scope: &str, request_id: &str) -> bool {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM requests WHERE scope = $1 AND request_id = $2")
        .bind(scope)
        .bind(request_id)
        .fetch_one(pool)
        .await
        .expect("count requests");
    n > 0
}

async fn remove_refuses_a_channel_holding_stock_then_removes_it_and_fences_its_epoch(c: TestCenter) {
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&c.database_url).await.unwrap();
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    create(&mut admin, "j", 50).await;
    let web = register(&mut center, "web").await;
    borrow(&mut center, "i", "web", web, 5, "w-1").await.unwrap();
    register(&mut center, "app").await;
    let app = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", app, 10, "b-1").await.unwrap();
    borrow(&mut center, "j", "app", app, 3, "b-2").await.unwrap();
    last_word(&mut center, "app", app, vec![pool("i", 10), pool("j", 3)]).await;

    let refused = admin.remove_channel(remove("app")).await;
    assert_status(
        refused,
        Code::FailedPrecondition,
        r#"channel "app" still holds 10 units of item "i", 3 units of item "j""#,
    );
    assert_eq!(channel_names(&mut admin).await, ["app", "web"], "a refused removal changes nothing");
    assert_eq!(ledger(&mut admin, "i").await.channels.len(), 2);

    give_back(&mut center, "i", "app", app, 10, "r-1").await.unwrap();
    give_back(&mut center, "j", "app", app, 3, "r-2").await.unwrap();
    let removed = admin.remove_channel(remove("app")).await.expect("remove").into_inner();
    assert_eq!(
        removed,
        pb::RemoveChannelResponse { channel: "app".into(), last_epoch: app, item_ids: vec!["i".into(), "j".into()] }
    );
    assert_eq!(channel_names(&mut admin).await, ["web"]);
    for item in ["i", "j"] {
        let view = ledger(&mut admin, item).await;
        assert_conserved(&view);
        assert!(view.channels.iter().all(|ch| ch.channel != "app"), "{view:?}");
    }
    assert!(reconcile(&mut admin).await.ok);
    assert_status(admin.remove_channel(remove("app")).await, Code::NotFound, r#"channel "app" not found"#);

    // No retry of the removed incarnation can be applied any more: its records go.
    let pruned = wait_until(Duration::from_secs(10), || {
        let db = db.clone();
        async move { !request_stored(&db, "channel:app", "b-1").await }
    })
    .await;
    assert!(pruned, "the removed channel's request records are pruned");
    assert!(request_stored(&db, "channel:web", "w-1").await, "another channel's current records stay");

    // A call of the removed incarnation moves nothing and brings nothing back.
    let late = borrow(&mut center, "i", "app", app, 1, "b-3").await;
    assert_status(late, Code::FailedPrecondition, "stale epoch 2 for channel app: channel is not registered");
    let hb = center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch: app,
            pools: vec![pool("i", 0)],
            last_report: false,
        })
        .await;
    assert_status(hb, Code::FailedPrecondition, "app");
    assert_eq!(channel_names(&mut admin).await, ["web"]);
    assert!(ledger(&mut admin, "i").await.channels.iter().all(|ch| ch.channel != "app"));

    // The agent comes back: it registers anew, above every epoch the channel had.
    let again = register(&mut center, "app").await;
    assert!(again > app, "epoch {again} after removal must exceed {app}");
    let stale = borrow(&mut center, "i", "app", app, 1, "b-4").await;
    assert_status(stale, Code::FailedPrecondition, "stale epoch");
    let granted = borrow(&mut center, "i", "app", again, 4, "b-5").await.unwrap().granted;
    assert_eq!(granted, 4);
    let view = ledger(&mut admin, "i").await;
    assert_conserved(&view);
    let app_line = view.channels.iter().find(|ch| ch.channel == "app").expect("app holds again");
    assert_eq!((app_line.held, app_line.granted, app_line.returned), (4, 4, 0), "a fresh allocation");
}

async fn remove_refuses_units_in_doubt_until_they_are_resolved(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let app = register(&mut center, "app").await;
    borrow(&mut center, "i", "app", app, 10, "b-1").await.unwrap();
    last_word(&mut center, "app", app, vec![pool("i", 10)]).await;
    // The pool is lost: everything the channel holds of the item goes in doubt.
    let lost = pb::PoolReport { item_id: "i".into(), lost: true, ..Default::default() };
    last_word(&mut center, "app", app, vec![lost]).await;
    assert_eq!(ledger(&mut admin, "i").await.channels[0].in_doubt, 10);

    let refused = admin.remove_channel(remove("app")).await;
    assert_status(refused, Code::FailedPrecondition, r#"channel "app" still holds 10 units of item "i" (10 in doubt)"#);

    admin
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "i".into(), channel: "app".into(), sold: 4 })
        .await
        .expect("resolve");
    let removed = admin.remove_channel(remove("app")).await.expect("remove").into_inner();
    assert_eq!(removed.item_ids, ["i"]);
    let view = ledger(&mut admin, "i").await;
    let item = view.item.clone().expect("item");
    assert_eq!((item.total, item.available, item.written_off), (96, 96, 4));
    assert!(view.channels.is_empty(), "{view:?}");
    assert_conserved(&view);
    assert!(reconcile(&mut admin).await.ok);
}

async fn remove_waits_for_an_attached_agents_lease(c: TestCenter) {
    // This contract needs a short lease: start a second center on the same backend kind.
    let backend = if c.database_url.starts_with("postgres") {
        crate::support::Backend::Postgres
    } else {
        crate::support::Backend::Sqlite
    };
    drop(c);
    let c = TestCenter::start_with(backend, |cfg| cfg.lease_ttl_ms = 300).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    // A ghost: an agent that registered and never served (nothing borrowed).
    let epoch = register(&mut center, "ghost").await;
    assert_status(
        admin.remove_channel(remove("ghost")).await,
        Code::FailedPrecondition,
        r#"lease of channel "ghost" is live"#,
    );
    assert_eq!(channel_names(&mut admin).await, ["ghost"]);
    // Once the lease has run out nobody is attached: the removal goes through.
    let mut attempts = 0;
    let removed = wait_until(Duration::from_secs(5), || {
        attempts += 1;
        let mut admin = admin.clone();
        async move {
            match admin.remove_channel(remove("ghost")).await {
                Ok(r) => r.into_inner().last_epoch == epoch,
                Err(s) => {
                    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
                    false
                }
            }
        }
    })
    .await;
    assert!(removed, "removed once the lease ended ({attempts} attempts)");
    assert!(channel_names(&mut admin).await.is_empty());
}

async fn remove_names_an_unknown_or_invalid_channel(c: TestCenter) {
    let mut admin = c.admin().await;
    assert_status(admin.remove_channel(remove("nobody")).await, Code::NotFound, r#"channel "nobody" not found"#);
    assert_status(admin.remove_channel(remove("")).await, Code::InvalidArgument, "channel");
    assert_status(admin.remove_channel(remove("no spaces")).await, Code::InvalidArgument, r#"channel"#);
}
