//! A ledger that went back in time (a standby promoted without its last commits, a backup
//! restored) forgets registrations, and its epoch counter goes back with them. The fault is
//! made by hand: the channel's epoch row is set back in the database. The agent that finds
//! its pools fenced at or above the epoch it was answered registers again showing the
//! fence, and the center answers an epoch above it, against PostgreSQL and SQLite.

use inventory_proto::v1 as pb;
use tonic::Code;

use crate::contract::{assert_status, borrow, create, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    a_rolled_back_epoch_counter_answers_above_the_fence_it_is_shown,
    a_fence_beyond_the_stored_epochs_range_is_refused,
);

fn register_above(channel: &str, fenced_at: u64) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest { channel: channel.into(), agent_id: format!("{channel}-1"), fenced_at }
}

async fn a_rolled_back_epoch_counter_answers_above_the_fence_it_is_shown(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    // Three incarnations; the last one fenced its pools with epoch 3 and borrowed.
    for expected in 1..=3 {
        assert_eq!(register(&mut center, "app").await, expected);
    }
    borrow(&mut center, "i", "app", 3, 10, "b1").await.expect("borrow under epoch 3");

    // The ledger goes back to when epoch 1 was the last one handed out.
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&c.database_url).await.expect("connect to the center's database");
    sqlx::query("UPDATE channels SET epoch = 1 WHERE channel = 'app'").execute(&db).await.expect("roll the epoch back");
    db.close().await;

    // The next registration is answered with epoch 2 again: the fault happened.
    let reused = center.register_agent(register_above("app", 0)).await.expect("register").into_inner().epoch;
    assert_eq!(reused, 2, "the rolled-back counter hands out an epoch it handed out before");
    // The agent's resync found its pools fenced at 3, at or above 2: it registers again
    // showing the fence, and the epoch answered is above it.
    let above = center.register_agent(register_above("app", 3)).await.expect("register above").into_inner().epoch;
    assert_eq!(above, 4, "the epoch answered is above the fence the agent showed");
    // Every earlier incarnation is fenced at the center too.
    for stale in [2, 3] {
        let r = borrow(&mut center, "i", "app", stale, 1, &format!("b-{stale}")).await;
        assert_status(r, Code::FailedPrecondition, &format!("stale epoch {stale}"));
    }
    borrow(&mut center, "i", "app", above, 1, "b2").await.expect("borrow under the new epoch");
    // A fence below the counter changes nothing: the counter only grows.
    let next = center.register_agent(register_above("app", 1)).await.expect("register").into_inner().epoch;
    assert_eq!(next, 5);
}

async fn a_fence_beyond_the_stored_epochs_range_is_refused(c: TestCenter) {
    let mut center = c.center().await;
    let max = i64::MAX.unsigned_abs();
    let refused = center.register_agent(register_above("app", max)).await.expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    for needle in ["fenced_at".to_owned(), max.to_string()] {
        assert!(refused.message().contains(&needle), "{refused:?} names {needle}");
    }
    // The largest fence allowed is answered just above it.
    let epoch = center.register_agent(register_above("app", max - 1)).await.expect("register").into_inner().epoch;
    assert_eq!(epoch, max);
}
