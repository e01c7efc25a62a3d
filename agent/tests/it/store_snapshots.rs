//! The `PoolStore` contract, continued: `snapshots`, many pools read at once (what a full
//! report reads), answers each pool as `snapshot` does and in the order asked, across more
//! pools than one store call reads (the Redis store reads a hundred to a script call): a
//! pool never opened, stocked ones, ones with reservations and sales, and ones below a
//! raised floor (lost) side by side, so one pool's state cannot leak into its neighbours'.
//! Run against every backend like `store_contract`.

use inventory_agent::store::{PoolKey, PoolSnapshot};

use super::store_contract::{Backend, LONG_TTL_MS, acquire_args, pool, reserve_with};

contract_suite!(many_pools_read_at_once_answer_as_each_read_alone);

/// What pool `i` holds once set up: (available, reserved, sold), or `None` when it reads
/// as gone (never opened, or lost).
fn expected(i: usize) -> Option<(u64, u64, u64)> {
    let stock = 10 + i as u64;
    match i % 5 {
        0 => None,
        1 => Some((stock, 0, 0)),
        2 => Some((stock - 2, 2, 0)),
        3 => Some((stock - 1, 0, 1)),
        _ => (i % 10 != 9).then_some((stock, 0, 0)),
    }
}

async fn many_pools_read_at_once_answer_as_each_read_alone(backend: &Backend) {
    let store = backend.store().await;
    // Not a multiple of a call's hundred, so the last call is a short one.
    let pools: Vec<PoolKey> = (0..250).map(|i| pool(&format!("sku-many-{i}"))).collect();
    for (i, p) in pools.iter().enumerate() {
        if i % 5 == 0 {
            continue;
        }
        assert!(store.refill(p, "grant-1", 10 + i as u64, 0).await.unwrap());
        match i % 5 {
            2 => {
                reserve_with(store.as_ref(), p, &acquire_args("u1", 2, &format!("k-{i}"), 5, LONG_TTL_MS)).await;
            }
            3 => {
                let (id, _) =
                    reserve_with(store.as_ref(), p, &acquire_args("u1", 1, &format!("k-{i}"), 5, LONG_TTL_MS)).await;
                store.confirm(p, &id).await.unwrap();
            }
            4 if i % 10 == 9 => {
                // The center remembers writes the pool lacks: it reads as lost.
                let seq = store.snapshot(p).await.unwrap().write_seq;
                store.raise_floor(p, seq + 5).await.unwrap();
            }
            _ => {}
        }
    }

    let together = store.snapshots(&pools).await;
    assert_eq!(together.len(), pools.len(), "one answer per pool");
    let counts = |s: &PoolSnapshot| (s.available, s.reserved, s.sold);
    for (i, (p, read)) in pools.iter().zip(together).enumerate() {
        let read = read.unwrap_or_else(|e| panic!("pool {i}: {e}"));
        let alone = store.snapshot(p).await.unwrap();
        match expected(i) {
            None => assert_eq!((counts(&read), read.generation), ((0, 0, 0), 0), "pool {i} reads as gone: {read:?}"),
            Some(c) => {
                assert_eq!(counts(&read), c, "pool {i}: {read:?}");
                assert_ne!(read.generation, 0, "pool {i}: {read:?}");
            }
        }
        assert_eq!(
            (counts(&read), read.generation, read.write_seq),
            (counts(&alone), alone.generation, alone.write_seq),
            "pool {i}: read with the others as read alone"
        );
        assert!(read.now_ms > 0, "pool {i}: the store's clock: {read:?}");
    }
    assert!(store.snapshots(&[]).await.is_empty(), "no pools, no answers");
}
