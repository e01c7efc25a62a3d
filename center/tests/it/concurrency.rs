//! Many agents borrowing one item at once: every unit is granted exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use inventory_proto::v1 as pb;
use rand::Rng;

use crate::contract::{borrow, create, ledger, reconcile, register};
use crate::support::{Backend, TestCenter};

const TOTAL: u64 = 10_000;
const CHANNELS: usize = 8;
const TASKS: usize = 64;

async fn drain_one_item(backend: Backend) {
    let c = TestCenter::start(backend).await;
    let mut admin = c.admin().await;
    create(&mut admin, "drop", TOTAL).await;
    let mut epochs = Vec::new();
    for n in 0..CHANNELS {
        epochs.push(register(&mut c.center().await, &format!("ch{n}")).await);
    }

    // A watcher checks invariant 1 and that `available` only falls, while borrows run.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (mut admin, stop) = (admin.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut last = TOTAL;
            let mut looks = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let view = ledger(&mut admin, "drop").await;
                let item = view.item.unwrap();
                let held: u64 = view.channels.iter().map(|c| c.held).sum();
                assert_eq!(item.total, item.available + held, "invariant 1 broken mid-run");
                assert!(item.available <= last, "available rose from {last} to {}", item.available);
                last = item.available;
                looks += 1;
            }
            looks
        })
    };

    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let channel = format!("ch{}", t % CHANNELS);
        let epoch = epochs[t % CHANNELS];
        let mut center = c.center().await;
        tasks.push(tokio::spawn(async move {
            let mut granted = 0u64;
            // Bounded: 10,000 units need at most 10,000 non-empty grants in total.
            for n in 0..10_000u32 {
                let quantity = rand::rng().random_range(1..=50);
                let rid = format!("t{t}-{n}");
                let b = borrow(&mut center, "drop", &channel, epoch, quantity, &rid).await.expect("borrow");
                assert!(b.granted <= quantity);
                granted += b.granted;
                if b.granted == 0 {
                    assert_eq!(b.center_available, 0);
                    return granted;
                }
            }
            panic!("task {t} never saw the item run out");
        }));
    }
    let mut sum = 0;
    for task in tasks {
        sum += task.await.expect("task");
    }
    stop.store(true, Ordering::Relaxed);
    let looks = watcher.await.expect("watcher");
    assert!(looks > 0);

    assert_eq!(sum, TOTAL, "sum of grants");
    let view = ledger(&mut admin, "drop").await;
    let item = view.item.clone().unwrap();
    assert_eq!(item.available, 0);
    assert_eq!(view.channels.iter().map(|c| c.granted).sum::<u64>(), TOTAL);
    let r = reconcile(&mut admin).await;
    assert!(r.ok, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_64_tasks_on_8_channels_grant_every_unit_once() {
    drain_one_item(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_64_tasks_on_8_channels_grant_every_unit_once() {
    drain_one_item(Backend::Sqlite).await;
}

/// One channel reuses request ids across two items at once (a caller bug, or two
/// replicas of a channel sharing an id generator): per id, exactly one call applies and
/// the other is ALREADY_EXISTS, never INTERNAL. A true replay racing its first call gets
/// the first answer.
async fn one_request_id_raced_over_two_items(backend: Backend) {
    const ROUNDS: usize = 40;
    let c = TestCenter::start(backend).await;
    let mut admin = c.admin().await;
    create(&mut admin, "a", TOTAL).await;
    create(&mut admin, "b", TOTAL).await;
    let epoch = register(&mut c.center().await, "app").await;
    let (mut one, mut two) = (c.center().await, c.center().await);
    let mut applied = 0;
    for n in 0..ROUNDS {
        let rid = format!("race-{n}");
        let (first, second) =
            tokio::join!(borrow(&mut one, "a", "app", epoch, 1, &rid), borrow(&mut two, "b", "app", epoch, 1, &rid));
        let mut conflicts = 0;
        for result in [first, second] {
            match result {
                Ok(b) => {
                    assert!(!b.replayed, "another item's call is no replay: {b:?}");
                    applied += b.granted;
                }
                Err(s) if s.code() == tonic::Code::AlreadyExists => {
                    assert!(s.message().contains(&rid), "names the request id: {s:?}");
                    conflicts += 1;
                }
                Err(s) => panic!("round {n}: {s:?}"),
            }
        }
        assert_eq!(conflicts, 1, "round {n}: one of the two calls applies");

        // Operators' request ids race the same way.
        let rid = format!("stock-{n}");
        let add = |item: &str| pb::AddStockRequest { item_id: item.into(), quantity: 1, request_id: rid.clone() };
        let (mut admin_a, mut admin_b) = (admin.clone(), admin.clone());
        let (first, second) = tokio::join!(admin_a.add_stock(add("a")), admin_b.add_stock(add("b")));
        let codes: Vec<_> = [first, second].into_iter().map(|r| r.map(|_| ()).map_err(|s| s.code())).collect();
        assert!(codes.contains(&Ok(())), "round {n}: {codes:?}");
        assert!(codes.contains(&Err(tonic::Code::AlreadyExists)), "round {n}: {codes:?}");

        let rid = format!("replay-{n}");
        let (first, second) =
            tokio::join!(borrow(&mut one, "a", "app", epoch, 1, &rid), borrow(&mut two, "a", "app", epoch, 1, &rid));
        let (first, second) = (first.expect("first"), second.expect("replay"));
        assert_eq!(first.granted, second.granted, "round {n}: a replay answers the first answer");
        assert!(first.replayed != second.replayed, "round {n}: exactly one applied: {first:?} {second:?}");
        applied += first.granted;
    }
    let mut held = 0;
    for item in ["a", "b"] {
        held += ledger(&mut admin, item).await.channels.iter().map(|c| c.held).sum::<u64>();
    }
    assert_eq!(held, applied, "every applied call moved its units once");
    assert!(reconcile(&mut admin).await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_one_request_id_raced_over_two_items_is_already_exists() {
    one_request_id_raced_over_two_items(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_one_request_id_raced_over_two_items_is_already_exists() {
    one_request_id_raced_over_two_items(Backend::Sqlite).await;
}
