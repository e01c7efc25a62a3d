//! An agent giving back many pools at once (its drain) sends their Returns to the center
//! together (ReturnMany), and still gives each back, one Return at a time, to a center
//! without it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use inventory_agent::agent::Agent;

use crate::borrow_many::{ITEMS, stock_every_pool};
use crate::harness::{Center, LocalAgent};

/// Stops the agent as SIGTERM does (its drain) and checks every unit of every pool is back
/// at the center, each once.
async fn drain_every_pool(center: &Center, agent: LocalAgent) -> Arc<Agent> {
    let kept = Arc::clone(&agent.agent);
    agent.stop().await;
    for i in 0..ITEMS {
        let view = center.ledger(&format!("sku-{i}")).await;
        let app = &view.channels[0];
        assert!(app.granted > 0, "sku-{i} was stocked");
        assert_eq!((app.held, app.returned), (0, app.granted), "sku-{i}: every unit back, once");
        assert_eq!(view.item.unwrap().available, 20, "sku-{i}");
    }
    assert!(center.reconcile().await.ok);
    kept
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_agent_gives_back_many_pools_in_few_return_many_calls() {
    let center = Center::start_postgres().await;
    let agent = stock_every_pool(&center).await;
    let link = Arc::clone(&agent.agent.link);
    let before = (link.return_many_calls(), link.return_calls());
    drain_every_pool(&center, agent).await;
    let (many, single) = (link.return_many_calls() - before.0, link.return_calls() - before.1);
    assert!(many > 0, "no ReturnMany was sent");
    // The drain gives back many pools at once: their Returns go together.
    assert!(many + single <= (ITEMS / 10) as u64, "{many} ReturnMany and {single} Return calls for {ITEMS} pools");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_agent_gives_back_every_pool_through_a_center_without_return_many() {
    let center = Center::start_postgres().await;
    center.faults.refuse_return_many.store(true, Ordering::Relaxed);
    let agent = stock_every_pool(&center).await;
    let agent = drain_every_pool(&center, agent).await;
    assert_eq!(agent.link.return_many_calls(), 0);
    assert!(agent.link.return_calls() >= ITEMS as u64, "{} Return calls", agent.link.return_calls());
}
