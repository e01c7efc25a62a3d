//! Quiet heartbeats on a Redis store (`Reporting::quiet`): each pool's stamp is read, and
//! only pools whose stamp moved, plus a share in turn, are read whole; a pool written
//! behind the agent's back (another replica's sale) is reported with what it holds now,
//! and every pool is read whole again within a round of the shares. A pool stocked by a
//! refill is not read whole for its first report: the refill's answer stands for a read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use inventory_agent::reporting::Reporting;
use inventory_agent::store::PoolStore;
use inventory_agent::store::redis::RedisPoolStore;
use inventory_core::ItemId;
use inventory_core::channel::full_reads_per_heartbeat;
use inventory_test_support::{TestRedis, TestSqlite, wait_until};

use crate::harness::{Center, Db, LocalAgent, ObservedStore, StoreSpec, agent_config};
use crate::store_contract::{LONG_TTL_MS, acquire_args, pool, reserve_with};

const ITEMS: usize = 200;
const PERIOD: Duration = Duration::from_secs(1);

fn name(i: usize) -> String {
    format!("q-{i:03}")
}

/// Whole reads made between two counts, per item.
fn reads_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let made = |k: &String, n: u64| n - before.get(k).copied().unwrap_or(0);
    after.iter().map(|(k, n)| (k.clone(), made(k, *n))).filter(|(_, n)| *n > 0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_heartbeat_reads_whole_only_what_moved_and_a_share_in_turn() {
    let center = Center::start(Db::Lite(TestSqlite::create()), |_| {}).await;
    for i in 0..ITEMS {
        // Stocked once to the low watermark, the pools stay between the watermarks.
        center.create_item(&name(i), 40, 5, (2, 8, 4)).await;
    }
    let redis = TestRedis::create().await;
    let spec = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let mut config = agent_config(&center.url, "app", &spec);
    // No periodic heartbeat: this test sends them.
    config.heartbeat_interval_ms = 3_600_000;
    config.item_lookups_per_sec = 1_000_000;
    let agent = LocalAgent::start_with(config, None).await;
    for i in 0..ITEMS {
        agent.agent.item(&ItemId::parse("item_id", &name(i)).unwrap()).await.expect("load item");
    }
    let stocked = wait_until(Duration::from_secs(60), || async {
        agent.agent.items().iter().all(|i| i.last_snapshot().is_some_and(|s| s.available >= 2))
    })
    .await;
    assert!(stocked, "every pool stocked");

    // Reports read through a store of their own on the same Redis, so only their reads count.
    let inner: Arc<dyn PoolStore> = Arc::new(RedisPoolStore::new(&redis.url, &redis.prefix).await.expect("redis"));
    let observed = Arc::new(ObservedStore::over(Arc::clone(&inner)));
    let reporting = Reporting::new(
        Arc::clone(&observed) as Arc<dyn PoolStore>,
        Arc::clone(&agent.agent.link),
        Arc::clone(&agent.agent.items),
    );
    let share = full_reads_per_heartbeat(
        ITEMS,
        i64::try_from(PERIOD.as_millis()).unwrap(),
        agent.agent.items.settings().full_read_every_ms,
    );
    assert!(share > 0 && share < ITEMS / 10, "a share of {share} pools");

    // The first: no pool was read whole for a report yet, but each was stocked by a refill
    // whose answer stands for a whole read, so the stamps vouch for all but the share.
    let first = reporting.quiet(PERIOD).await;
    assert_eq!(observed.snapshots_of().len(), share, "the refills' answers stood for whole reads");
    assert_eq!(first.len(), ITEMS, "every pool reported the first time");
    assert!(reporting.send(first, false).await.is_ok());

    // Nothing moved since: the stamps vouch for every pool but the share in turn.
    let before = observed.snapshots_of();
    let quiet = reporting.quiet(PERIOD).await;
    let read = reads_between(&before, &observed.snapshots_of());
    assert_eq!(read.len(), share, "only the share read whole: {read:?}");
    assert!(quiet.is_empty(), "nothing changed since acknowledged: {} reports", quiet.len());

    // Another replica sells from a pool: its stamp moves, so it is read whole and reported.
    let sold = name(ITEMS / 2);
    reserve_with(inner.as_ref(), &pool(&sold), &acquire_args("u1", 1, "k-1", 5, LONG_TTL_MS)).await;
    let before = observed.snapshots_of();
    let quiet = reporting.quiet(PERIOD).await;
    let read = reads_between(&before, &observed.snapshots_of());
    assert!(read.contains_key(&sold), "the pool written is read whole: {read:?}");
    assert!(read.len() <= share + 1, "the share and the pool written: {read:?}");
    let reports = quiet.to_pb();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!((reports[0].item_id.as_str(), reports[0].reserved), (sold.as_str(), 1), "{reports:?}");
    assert!(reporting.send(quiet, false).await.is_ok());

    // Round after round, the shares come to every pool.
    let before = observed.snapshots_of();
    for _ in 0..ITEMS.div_ceil(share) {
        reporting.quiet(PERIOD).await;
    }
    let read = reads_between(&before, &observed.snapshots_of());
    assert_eq!(read.len(), ITEMS, "every pool read whole within a round of shares");
    assert!(read.values().all(|n| *n <= 2), "each once or twice: {read:?}");
}
