//! A report of more pools than one Heartbeat carries goes in several calls, one after
//! another; only the last carries `last_report`, so the center takes the report as the
//! agent's last word only once every part landed. A registration's or a drain's report
//! (`Reporting::send_all`) reads each part while the one before it is sent: the same calls.

use std::time::{Duration, Instant};

use inventory_core::ItemId;
use inventory_test_support::{TestSqlite, wait_until};
use tonic::Code;

use crate::harness::{Center, Db, LocalAgent, StoreSpec, agent_config};

const ITEMS: usize = 10;

/// An agent of `channel` that sends no periodic heartbeat, with every item loaded and its
/// pool stocked.
async fn stocked_agent(center: &Center, channel: &str) -> LocalAgent {
    let mut config = agent_config(&center.url, channel, &StoreSpec::Memory);
    // An hour apart: a periodic heartbeat after the last word would be a word more (0
    // means a third of the lease, not none).
    config.heartbeat_interval_ms = 3_600_000;
    let agent = LocalAgent::start_with(config, None).await;
    for i in 0..ITEMS {
        let id = ItemId::parse("item_id", &format!("p-{i}")).unwrap();
        agent.agent.item(&id).await.expect("load item");
    }
    let stocked = wait_until(Duration::from_secs(20), || async {
        agent.agent.items().iter().all(|i| i.last_snapshot().is_some_and(|s| s.available >= 2))
    })
    .await;
    assert!(stocked, "not every pool of {channel} was stocked");
    agent
}

async fn reclaim(center: &Center, channel: &str) -> Vec<(String, u64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match center.admin().await.reclaim(inventory_proto::v1::ReclaimRequest { channel: channel.into() }).await {
            Ok(r) => {
                let mut items: Vec<_> =
                    r.into_inner().items.into_iter().map(|i| (i.item_id, i.reclaimed, i.in_doubt)).collect();
                items.sort();
                return items;
            }
            Err(s) => {
                assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
                assert!(Instant::now() < deadline, "reclaim of {channel} never allowed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_report_in_parts_is_the_last_word_with_every_pool_in_it() {
    let center = Center::start(Db::Lite(TestSqlite::create()), |c| {
        c.lease_ttl_ms = 1_000;
        c.reclaim_grace_ms = 0;
    })
    .await;
    for i in 0..ITEMS {
        center.create_item(&format!("p-{i}"), 40, 1, (2, 8, 4)).await;
    }
    let app = stocked_agent(&center, "app").await;
    let web = stocked_agent(&center, "web").await;
    for agent in [&app, &web] {
        agent.agent.reporting.set_max_pools_per_call(3);
    }
    // app: its last word, in four calls of at most three pools, each part read while the
    // one before it is sent (as a drain sends it).
    let answer = app.agent.reporting.send_all(true).await;
    assert!(answer.is_ok(), "{answer:?}");
    // web: the same report in parts, read whole before the first call, not a last word.
    let answer = web.agent.reporting.send(web.agent.reporting.all().await, false).await;
    assert!(answer.is_ok(), "{answer:?}");
    // Every pool's report landed: what each channel holds, as the center sees it.
    let (mut app_held, mut web_held) = (Vec::new(), Vec::new());
    for i in 0..ITEMS {
        let item = format!("p-{i}");
        let view = center.ledger(&item).await;
        for (channel, held) in [("app", &mut app_held), ("web", &mut web_held)] {
            let row = view.channels.iter().find(|c| c.channel == channel).expect("the channel's row");
            assert!(row.held >= 2, "{item}: {channel} holds {}", row.held);
            assert_eq!(row.reported_available, row.held, "{item}: {channel}'s report landed");
            held.push((item.clone(), row.held));
        }
    }

    // Both agents stop without a word more (no drain), so the leases run out.
    drop((app, web));
    // Past the leases: app's units come back on sale (its last report was its last word,
    // every part of it stored); web's go in doubt.
    let app_back = reclaim(&center, "app").await;
    assert_eq!(app_back, app_held.iter().map(|(i, u)| (i.clone(), *u, 0)).collect::<Vec<_>>());
    let web_back = reclaim(&center, "web").await;
    assert_eq!(web_back, web_held.iter().map(|(i, u)| (i.clone(), 0, *u)).collect::<Vec<_>>());
}
