//! Every typed call of the client against a real agent: the outcomes as enums, lookups by
//! id and by key, extend, baskets, stock, and a sale that has not opened.

use std::time::{Duration, SystemTime};

use inventory_client::{Acquired, AgentClient, BasketAcquired, Error, Lookup, Options, State, unix_ms};
use inventory_proto::v1 as pb;

use crate::harness::{Center, LocalAgent, Store, agent_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_answers_in_the_clients_types() {
    let center = Center::start().await;
    center.create_item("skin", 20, 2, (2, 8, 4)).await;
    center.create_item("hat", 20, 2, (2, 8, 4)).await;
    let opens_at = SystemTime::now() + Duration::from_secs(3_600);
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: "later".into(),
            total: 10,
            per_user_limit: 1,
            reservation_ttl_ms: 300_000,
            opens_at_unix_ms: unix_ms(opens_at),
            ..Default::default()
        })
        .await
        .expect("create a scheduled item");
    let agent = LocalAgent::start(agent_config(&center.url, "app", &Store::Memory)).await;
    let client = AgentClient::connect([agent.url()], Options::default()).await.expect("client");

    let Acquired::Reserved { id, qty, generation, .. } = client.acquire("skin", "ann", 2, "o-1").await.unwrap() else {
        panic!("not reserved")
    };
    assert_eq!(qty, 2);
    let over = client.acquire("skin", "ann", 1, "o-2").await.unwrap();
    assert_eq!(over, Acquired::LimitExceeded { remaining: 0 });
    let by_key = client.reservation("skin", Lookup::Key("o-1")).await.unwrap();
    let by_id = client.reservation("skin", Lookup::Id(&id)).await.unwrap();
    assert_eq!(by_key, by_id);
    assert_eq!(
        (by_key.user.as_str(), by_key.qty, by_key.state, by_key.generation),
        ("ann", 2, State::Reserved, generation)
    );
    let (state, until) = client.extend("skin", &id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(state, State::Reserved);
    assert!(until >= by_key.expires_at, "an extend never brings the expiry forward: {until:?}");
    assert_eq!(client.confirm("skin", &id).await.unwrap(), State::Confirmed);
    assert_eq!(client.confirm("skin", &id).await.unwrap(), State::Confirmed, "idempotent");
    assert!(matches!(client.cancel("skin", &id).await, Err(Error::FailedPrecondition(_))));
    assert_eq!(client.refund("skin", &id).await.unwrap(), State::Refunded);
    let stock = client.stock("skin").await.unwrap();
    assert_eq!((stock.reserved, stock.sold, stock.opens_at), (0, 0, None));
    assert!(matches!(client.reservation("skin", Lookup::Key("nope")).await, Err(Error::NotFound(_))));
    assert!(
        matches!(client.acquire("skin", "ann", 1, "bad key").await, Err(Error::InvalidArgument(m)) if m.contains("idempotency_key"))
    );
    assert!(matches!(client.acquire("skin", "bob", 1, "o-1").await, Err(Error::KeyReused(_))));

    let later = client.acquire("later", "ann", 1, "o-3").await.unwrap();
    assert!(matches!(later, Acquired::NotStarted { opens_at: at } if unix_ms(at) == unix_ms(opens_at)), "{later:?}");
    assert_eq!(client.stock("later").await.unwrap().opens_at.map(unix_ms), Some(unix_ms(opens_at)));

    let basket = client.acquire_basket("cid", "b-1", &[("skin", 1), ("hat", 2)]).await.unwrap();
    let BasketAcquired::Reserved { basket_id, lines, replayed: false } = basket else { panic!("{basket:?}") };
    assert_eq!(lines.iter().map(|l| (l.item.as_str(), l.qty)).collect::<Vec<_>>(), [("skin", 1), ("hat", 2)]);
    assert_eq!(client.confirm_basket(&basket_id).await.unwrap(), State::Confirmed);
    let short = client.acquire_basket("cid", "b-2", &[("hat", 1)]).await.unwrap();
    assert_eq!(short, BasketAcquired::LimitExceeded { item: "hat".into(), remaining: 0 });
    let other = client.acquire_basket("dan", "b-3", &[("hat", 1)]).await.unwrap();
    let BasketAcquired::Reserved { basket_id, .. } = other else { panic!("{other:?}") };
    assert_eq!(client.cancel_basket(&basket_id).await.unwrap(), State::Cancelled);
}
