//! A global-limit claim that lapses under its own pool call: the Acquire is held at the
//! store (a gated store) past the claim's pending bound, so the sweeper finds no
//! reservation for the key and releases the claim while the pool call is still on its
//! way. The user must still end with one reservation over all channels: the held Acquire
//! claims again before it answers, and when the allowance went elsewhere meanwhile it
//! withdraws its reservation and answers LIMIT_EXCEEDED.

use std::sync::Arc;
use std::time::Duration;

use inventory_agent::buyers::BuyerRegistry;
use inventory_proto::v1 as pb;
use inventory_test_support::{TestRedis, wait_until};

use crate::global_limit::{Answer, acquire, create_global};
use crate::harness::{Center, LocalAgent, ObservedStore, StoreSpec, agent_config, http_get, sample, stock};

const ITEM: &str = "lapse";
const LAPSED: &str = r#"inventory_agent_buyer_lapsed_claims_total{channel="app"}"#;

/// Waits until the user's claims in `channel` number `n`.
async fn claims_reach(registry: &BuyerRegistry, user: &str, channel: &str, n: u64) -> bool {
    wait_until(Duration::from_secs(15), || async move { registry.count(ITEM, user, channel).await.unwrap() == n }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_lapses_during_its_pool_call_never_lets_a_user_over_the_global_limit() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    create_global(&center, ITEM, 1_000, 300_000).await;
    let registry = BuyerRegistry::connect(&redis.url, &redis.prefix).await.expect("registry");
    let with_registry = |channel: &str| {
        let mut config = agent_config(&center.url, channel, &StoreSpec::Memory);
        config.buyer_registry_url = Some(redis.url.clone());
        config.buyer_registry_prefix.clone_from(&redis.prefix);
        // A short pending bound (twice the miss wait), so the sweeper soon settles a claim
        // whose Acquire the gate holds.
        config.miss_wait_ms = 100;
        config.buyer_claim_pending_ms = 200;
        config
    };
    let store = Arc::new(ObservedStore::gated());
    let app = LocalAgent::start_with(with_registry("app"), Some(store.clone())).await;
    let web = LocalAgent::start_with(with_registry("web"), None).await;
    let (mut app_client, mut web_client) = (app.client().await, web.client().await);
    for client in [&app_client, &web_client] {
        let stocked = wait_until(Duration::from_secs(15), || {
            let mut client = client.clone();
            async move { stock(&mut client, ITEM).await.available > 0 }
        })
        .await;
        assert!(stocked, "both channels' pools stocked before the race");
    }

    // 1. The allowance goes to another channel while the claim has lapsed.
    let held = tokio::spawn({
        let mut client = app_client.clone();
        async move { acquire(&mut client, ITEM, "u1", "u1-app").await }
    });
    assert!(
        wait_until(Duration::from_secs(15), || async { store.acquire_calls() == 1 }).await,
        "never reached the store"
    );
    assert!(claims_reach(&registry, "u1", "app", 0).await, "the sweeper never released the claim under the held call");
    let on_web = acquire(&mut web_client, ITEM, "u1", "u1-web").await;
    assert!(matches!(on_web, Answer::Reserved(_)), "the released allowance is the user's to use: {on_web:?}");
    store.open_gate();
    let on_app = held.await.expect("acquire task");
    assert_eq!(on_app, Answer::Outcome(pb::AcquireOutcome::LimitExceeded as i32), "the late reservation is withdrawn");
    assert_eq!(stock(&mut app_client, ITEM).await.reserved, 0, "the withdrawn reservation's unit is on sale again");
    assert_eq!(stock(&mut web_client, ITEM).await.reserved, 1);
    assert_eq!(registry.count(ITEM, "u1", "app").await.unwrap(), 0);
    assert_eq!(registry.count(ITEM, "u1", "web").await.unwrap(), 1);
    // A replay of the withdrawn key is refused at the claim, before the pool.
    let replay = acquire(&mut app_client, ITEM, "u1", "u1-app").await;
    assert_eq!(replay, Answer::Outcome(pb::AcquireOutcome::LimitExceeded as i32));

    // 2. Nobody took the allowance meanwhile: the held Acquire claims again and reserves.
    store.close_gate();
    let calls = store.acquire_calls();
    let held = tokio::spawn({
        let mut client = app_client.clone();
        async move { acquire(&mut client, ITEM, "u2", "u2-app").await }
    });
    assert!(
        wait_until(Duration::from_secs(15), || async { store.acquire_calls() > calls }).await,
        "never reached the store"
    );
    assert!(claims_reach(&registry, "u2", "app", 0).await, "the sweeper never released the claim under the held call");
    store.open_gate();
    let on_app = held.await.expect("acquire task");
    assert!(matches!(on_app, Answer::Reserved(_)), "{on_app:?}");
    assert_eq!(registry.count(ITEM, "u2", "app").await.unwrap(), 1, "claimed again and bound");
    let on_web = acquire(&mut web_client, ITEM, "u2", "u2-web").await;
    assert_eq!(on_web, Answer::Outcome(pb::AcquireOutcome::LimitExceeded as i32), "the claim counts again");
    assert_eq!(stock(&mut app_client, ITEM).await.reserved, 1);

    let metrics = http_get(app.http_addr, "/metrics").await;
    assert_eq!(sample(&metrics, LAPSED), Some(2.0), "{metrics}");
}
