//! End to end: an Acquire with allow_partial reserves what the channel can get when that
//! is less than asked, says how many, and its replay returns the same reservation.

use inventory_proto::v1 as pb;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, http_get, sample, stock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_acquire_takes_what_the_channel_can_get_and_replays_it() {
    let center = Center::start_sqlite().await;
    // 3 units in all, a limit of 10 per user.
    center.create_item("p", 3, 10, (1, 3, 3)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;

    // Without the flag, 5 of 3 is sold out (after asking the center) and reserves nothing.
    let whole = client.acquire(acquire_req("p", "u1", 5, "whole")).await.unwrap().into_inner();
    assert_eq!(whole.outcome(), pb::AcquireOutcome::SoldOut, "{whole:?}");
    assert_eq!(stock(&mut client, "p").await.reserved, 0);

    let ask = pb::AcquireRequest { allow_partial: true, ..acquire_req("p", "u1", 5, "part") };
    let got = client.acquire(ask.clone()).await.unwrap().into_inner();
    assert_eq!((got.outcome(), got.quantity, got.replayed), (pb::AcquireOutcome::Reserved, 3, false), "{got:?}");
    let again = client.acquire(ask.clone()).await.unwrap().into_inner();
    assert_eq!((again.reservation_id.as_str(), again.quantity, again.replayed), (got.reservation_id.as_str(), 3, true));
    // The same key for another quantity is another payload.
    let other = client
        .acquire(pb::AcquireRequest { quantity: 3, ..ask.clone() })
        .await
        .expect_err("another quantity for the key conflicts");
    assert_eq!(other.code(), tonic::Code::AlreadyExists, "{other:?}");
    let s = stock(&mut client, "p").await;
    assert_eq!((s.available, s.reserved), (0, 3));
    // Nothing left: a partial acquire is sold out.
    let none = pb::AcquireRequest { allow_partial: true, ..acquire_req("p", "u2", 2, "none") };
    assert_eq!(client.acquire(none).await.unwrap().into_inner().outcome(), pb::AcquireOutcome::SoldOut);

    let metrics = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&metrics, r#"inventory_agent_partial_acquires_total{channel="app"}"#), Some(1.0), "{metrics}");
}
