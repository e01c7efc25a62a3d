//! A Borrow that commits but whose reply never arrives: the retry with the same
//! request_id gets the same grant, and the ledger shows it once.

use std::time::Duration;

use inventory_proto::v1 as pb;
use tonic::Code;

use crate::contract::{create, ledger, register};
use crate::support::{Backend, TestCenter};

async fn lost_reply(backend: Backend) {
    let c = TestCenter::start(backend).await;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "i", 100).await;
    let epoch = register(&mut center, "app").await;
    c.faults.lose_borrow_replies.store(1, std::sync::atomic::Ordering::SeqCst);

    let ask = || {
        let mut r = tonic::Request::new(pb::BorrowRequest {
            item_id: "i".into(),
            channel: "app".into(),
            epoch,
            quantity: 25,
            request_id: "lost-1".into(),
            ..Default::default()
        });
        r.set_timeout(Duration::from_millis(500));
        r
    };
    let lost = center.borrow(ask()).await.expect_err("the reply is withheld");
    assert!(matches!(lost.code(), Code::DeadlineExceeded | Code::Cancelled), "{lost:?}");
    // The borrow committed even though the caller never heard of it.
    assert_eq!(ledger(&mut admin, "i").await.channels[0].granted, 25);

    let retry = center.borrow(ask()).await.expect("retry answers").into_inner();
    assert_eq!((retry.granted, retry.center_available, retry.replayed), (25, 75, true));
    let view = ledger(&mut admin, "i").await;
    assert_eq!((view.item.unwrap().available, view.channels[0].granted), (75, 25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lost_borrow_reply_is_applied_once() {
    lost_reply(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lost_borrow_reply_is_applied_once() {
    lost_reply(Backend::Sqlite).await;
}
