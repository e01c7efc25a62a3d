//! An agent loading and stocking many items at once sends their DescribeItems and Borrows
//! to the center together (DescribeItems, BorrowMany), and still loads and stocks them one
//! call at a time against a center without those.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use inventory_core::ItemId;
use inventory_test_support::wait_until;

use crate::harness::{Center, LocalAgent, StoreSpec};

pub(crate) const ITEMS: usize = 300;

/// Creates the items, loads them all in the agent at once and waits until the
/// rebalancer has stocked every pool; checks the center granted each exactly that.
pub(crate) async fn stock_every_pool(center: &Center) -> LocalAgent {
    futures::stream::iter(0..ITEMS)
        .for_each_concurrent(16, |i| async move { center.create_item(&format!("sku-{i}"), 20, 1, (2, 8, 4)).await })
        .await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    futures::future::join_all((0..ITEMS).map(|i| {
        let a = Arc::clone(&agent.agent);
        async move {
            let id = ItemId::parse("item_id", &format!("sku-{i}")).unwrap();
            a.item(&id).await.expect("load item");
        }
    }))
    .await;
    let stocked = wait_until(Duration::from_secs(60), || async {
        let items = agent.agent.items();
        items.len() == ITEMS && items.iter().all(|i| i.last_snapshot().is_some_and(|s| s.available >= 2))
    })
    .await;
    assert!(stocked, "not every pool was stocked");
    for i in [0, ITEMS / 2, ITEMS - 1] {
        let view = center.ledger(&format!("sku-{i}")).await;
        let pool = agent.agent.items().into_iter().find(|it| it.item_id == format!("sku-{i}")).unwrap();
        let snapshot = pool.last_snapshot().unwrap();
        assert_eq!(view.channels[0].granted, snapshot.available + snapshot.reserved + snapshot.sold, "sku-{i}");
    }
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_loading_and_stocking_many_pools_does_it_in_few_calls() {
    let center = Center::start_postgres().await;
    let agent = stock_every_pool(&center).await;
    // The loads made at once went together, a few hundred items a call.
    let loads = agent.agent.link.describe_many_calls();
    assert!(loads > 0 && loads <= (ITEMS / 10) as u64, "{loads} DescribeItems calls for {ITEMS} items");
    // An unknown id among known ones is NOT_FOUND, alone.
    let results = futures::future::join_all(["sku-1", "nope", "sku-2"].map(|id| {
        let a = Arc::clone(&agent.agent);
        async move { a.item(&ItemId::parse("item_id", id).unwrap()).await.map(|it| it.item_id.clone()) }
    }))
    .await;
    assert_eq!(results[0].as_deref().ok(), Some("sku-1"));
    assert!(matches!(&results[1], Err(inventory_agent::error::AgentError::NotFound(_))), "{:?}", results[1]);
    assert_eq!(results[2].as_deref().ok(), Some("sku-2"));
    let (many, single) = (agent.agent.link.borrow_many_calls(), agent.agent.link.borrow_calls());
    assert!(many > 0, "no BorrowMany was sent");
    // The rebalancer looks at a few dozen pools at a time: their Borrows go together.
    assert!(many + single <= (ITEMS / 4) as u64, "{many} BorrowMany and {single} Borrow calls for {ITEMS} pools");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_loads_and_stocks_every_pool_through_a_center_without_the_batch_calls() {
    let center = Center::start_postgres().await;
    center.faults.refuse_borrow_many.store(true, Ordering::Relaxed);
    center.faults.refuse_describe_items.store(true, Ordering::Relaxed);
    let agent = stock_every_pool(&center).await;
    assert_eq!((agent.agent.link.borrow_many_calls(), agent.agent.link.describe_many_calls()), (0, 0));
    assert!(agent.agent.link.borrow_calls() >= ITEMS as u64);
}
