//! The `PoolStore` contract, continued: basket intents (compare-and-set, the index of open
//! intents, the store's clock). Run against every backend like `store_contract`.

use inventory_agent::store::memory::MemoryPoolStore;
use inventory_agent::store::{BasketWrite, Intent, PoolStore};
use inventory_core::basket::{Basket, Failure, Held};

use super::store_contract::Backend;

contract_suite!(
    an_intent_is_created_once_and_moved_by_compare_and_set,
    open_intents_are_listed_oldest_first_until_they_finish,
    of_concurrent_writers_of_one_version_exactly_one_wins,
);

fn intent(key: &str, lines: &[(&str, u64)]) -> Intent {
    Intent::new(&Basket::parse("u1", key, lines).expect("valid basket"))
}

fn held(item: &str) -> Held {
    Held {
        item_id: item.into(),
        reservation_id: format!("r-{item}"),
        quantity: 2,
        expires_at_ms: 1_700_000_000_000,
        pool_generation: 7,
    }
}

async fn put(store: &dyn PoolStore, channel: &str, id: &str, version: u64, intent: &Intent) -> BasketWrite {
    store.put_basket(channel, id, version, intent).await.expect("put_basket")
}

async fn an_intent_is_created_once_and_moved_by_compare_and_set(backend: &Backend) {
    let store = backend.store().await;
    let pending = intent("k1", &[("console", 1), ("pad", 2), ("console", 1)]);
    assert_eq!(store.basket("app", "b1").await.unwrap(), None);

    assert_eq!(put(&*store, "app", "b1", 0, &pending).await, BasketWrite::Written { version: 1 });
    let got = store.basket("app", "b1").await.unwrap().expect("written");
    assert_eq!((got.intent.clone(), got.version), (pending.clone(), 1), "the intent round-trips as written");
    assert!(got.written_at_ms > 0 && got.now_ms >= got.written_at_ms, "{got:?}");
    // Another channel's basket of the same id is another intent.
    assert_eq!(store.basket("web", "b1").await.unwrap(), None);

    // A second create loses and is shown what is stored.
    match put(&*store, "app", "b1", 0, &pending).await {
        BasketWrite::Conflict(Some(s)) => {
            assert_eq!((s.intent, s.version, s.written_at_ms), (pending.clone(), 1, got.written_at_ms))
        }
        other => panic!("expected a conflict, got {other:?}"),
    }

    let reserved = pending.reserved(vec![held("console"), held("pad")]).unwrap();
    assert_eq!(put(&*store, "app", "b1", 1, &reserved).await, BasketWrite::Written { version: 2 });
    // A writer that read version 1 (a late driver, a sweeper) writes nothing.
    let releasing = pending.releasing(Failure::Interrupted).unwrap();
    match put(&*store, "app", "b1", 1, &releasing).await {
        BasketWrite::Conflict(Some(s)) => assert_eq!((s.intent, s.version), (reserved.clone(), 2)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let got = store.basket("app", "b1").await.unwrap().unwrap();
    assert_eq!((got.intent, got.version), (reserved.clone(), 2));
    // A version nobody wrote is refused too.
    assert!(matches!(put(&*store, "app", "b1", 9, &reserved).await, BasketWrite::Conflict(Some(_))));
    // An absent intent answers a stale write with nothing stored.
    assert_eq!(put(&*store, "app", "b2", 3, &pending).await, BasketWrite::Conflict(None));
    assert_eq!(store.basket("app", "b2").await.unwrap(), None);
}

async fn open_intents_are_listed_oldest_first_until_they_finish(backend: &Backend) {
    let store = backend.store().await;
    let a = intent("ka", &[("x", 1)]);
    let b = intent("kb", &[("y", 1)]);
    assert_eq!(put(&*store, "app", "ba", 0, &a).await, BasketWrite::Written { version: 1 });
    // Distinct write times (ms clocks) so the order is defined.
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    assert_eq!(put(&*store, "app", "bb", 0, &b).await, BasketWrite::Written { version: 1 });
    assert_eq!(put(&*store, "web", "bw", 0, &a).await, BasketWrite::Written { version: 1 });
    assert_eq!(store.open_baskets("app", 10).await.unwrap(), ["ba", "bb"]);
    assert_eq!(store.open_baskets("app", 1).await.unwrap(), ["ba"], "one page");
    assert_eq!(store.open_baskets("web", 10).await.unwrap(), ["bw"]);

    // Releasing is still open (compensation owed), and moves to the back of the line.
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    let releasing = a.releasing(Failure::SoldOut { item_id: "x".into() }).unwrap();
    assert_eq!(put(&*store, "app", "ba", 1, &releasing).await, BasketWrite::Written { version: 2 });
    assert_eq!(store.open_baskets("app", 10).await.unwrap(), ["bb", "ba"]);
    // Failed and reserved are not.
    assert_eq!(put(&*store, "app", "ba", 2, &releasing.failed().unwrap()).await, BasketWrite::Written { version: 3 });
    let reserved = b.reserved(vec![held("y")]).unwrap();
    assert_eq!(put(&*store, "app", "bb", 1, &reserved).await, BasketWrite::Written { version: 2 });
    assert!(store.open_baskets("app", 10).await.unwrap().is_empty());
    // A failed intent tried again is open again.
    let failed = store.basket("app", "ba").await.unwrap().unwrap();
    let retry = failed.intent.retry().unwrap();
    assert_eq!(put(&*store, "app", "ba", 3, &retry).await, BasketWrite::Written { version: 4 });
    assert_eq!(store.open_baskets("app", 10).await.unwrap(), ["ba"]);
    assert_eq!(store.basket("app", "ba").await.unwrap().unwrap().intent.attempt, 1);
}

async fn of_concurrent_writers_of_one_version_exactly_one_wins(backend: &Backend) {
    let stores = backend.shared_stores(8).await;
    let pending = intent("kc", &[("z", 1)]);
    assert_eq!(put(&*stores[0], "app", "bc", 0, &pending).await, BasketWrite::Written { version: 1 });
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let store = std::sync::Arc::clone(store);
        let next = if i % 2 == 0 {
            pending.reserved(vec![held("z")]).unwrap()
        } else {
            pending.releasing(Failure::Interrupted).unwrap()
        };
        tasks.push(tokio::spawn(async move { (put(&*store, "app", "bc", 1, &next).await, next) }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        if let (BasketWrite::Written { version }, next) = t.await.unwrap() {
            winners.push((version, next));
        }
    }
    assert_eq!(winners.len(), 1, "one compare-and-set wins: {winners:?}");
    let got = stores[0].basket("app", "bc").await.unwrap().unwrap();
    assert_eq!((got.version, got.intent), (2, winners[0].1.clone()));
}

#[tokio::test]
async fn memory_intents_are_saved_and_loaded_with_the_pools() {
    let dir = std::env::temp_dir().join(format!("inventory-baskets-keep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("app.pools.json");
    let store = MemoryPoolStore::new();
    let pending = intent("kk", &[("a", 1), ("b", 1)]);
    assert_eq!(put(&store, "app", "bk", 0, &pending).await, BasketWrite::Written { version: 1 });
    store.save(&path, "http://c:1").unwrap();
    let (again, _) = MemoryPoolStore::load(&path, "http://c:1").unwrap();
    let got = again.basket("app", "bk").await.unwrap().expect("kept");
    assert_eq!((got.intent, got.version), (pending, 1));
    assert_eq!(again.open_baskets("app", 10).await.unwrap(), ["bk"], "still owed its compensation");
    let _ = std::fs::remove_dir_all(&dir);
}
