//! A reply lost on the way back (the test fault proxy drops it): the client's retry, with
//! the same key, finds the first reservation instead of making a second.

use std::time::Duration;

use inventory_client::{Acquired, AgentClient, Options};
use inventory_proto::v1 as pb;
use inventory_test_support::proxy::{Fault, FaultProxy};
use inventory_test_support::wait_until;

use crate::harness::{Center, LocalAgent, Store, agent_config, stock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_retried_with_the_same_key_and_finds_the_first_reservation() {
    let center = Center::start().await;
    center.create_item("skin", 10, 1, (2, 8, 4)).await;
    let agent = LocalAgent::start(agent_config(&center.url, "app", &Store::Memory)).await;
    let proxy = FaultProxy::start(agent.addr).await.expect("proxy");
    let options = Options::default().attempt_timeout(Duration::from_millis(300)).deadline(Duration::from_secs(20));
    let client = AgentClient::connect([proxy.url()], options).await.expect("client");

    proxy.set(Fault::DropReplies);
    let call = tokio::spawn(async move { client.acquire("skin", "ann", 1, "order-1").await });
    // The agent reserved; the answer never came back.
    let mut raw = agent.raw().await;
    let reserved = wait_until(Duration::from_secs(10), || {
        let mut raw = raw.clone();
        async move { stock(&mut raw, "skin").await.reserved == 1 }
    })
    .await;
    assert!(reserved, "the first attempt never reached the agent");
    assert!(!call.is_finished(), "the caller got an answer through a proxy that drops them");
    proxy.set(Fault::Pass);

    let answer = call.await.expect("call task").expect("an answer once replies flow again");
    let Acquired::Reserved { id, replayed, .. } = answer else { panic!("not reserved: {answer:?}") };
    assert!(replayed, "the answer is the first request's, replayed");
    let first = raw
        .get_reservation(pb::GetReservationRequest {
            item_id: "skin".into(),
            idempotency_key: "order-1".into(),
            ..Default::default()
        })
        .await
        .expect("lookup")
        .into_inner()
        .reservation
        .expect("reservation");
    assert_eq!(id, first.reservation_id, "the retry answered the first reservation");
    assert_eq!(stock(&mut raw, "skin").await.reserved, 1, "one reservation, not two");
    assert!(proxy.connections_accepted() >= 2, "the retry came over a new connection");
}
