//! The `PoolStore` contract, continued: `snapshots`, many pools read at once (what a full
//! report reads), answers each pool as `snapshot` does and in the order asked, across more
//! pools than one store call reads (the Redis store reads a hundred to a script call): a
//! pool never opened, stocked ones, ones with reservations and sales, and ones below a
//! raised floor (lost) side by side, so one pool's state cannot leak into its neighbours'.
//! Run against every backend like `store_contract`. And `stamps`, what a quiet heartbeat
//! reads first: each pool's generation and write sequence as a snapshot would show them,
//! moved by every write and by nothing else. And `look`, the rebalancer's sweep and read
//! of a pool (one script call on Redis): what `expire_due` then `snapshot` answer. And
//! `refill_read`, a refill answered with the pool as it left it: what `snapshot` reads
//! right after, its write sequence the stamp's.

use std::sync::Arc;

use inventory_agent::store::{Looked, PoolKey, PoolSnapshot, PoolStamp, PoolStore};

use super::store_contract::{
    Backend, LONG_TTL_MS, SHORT_TTL_MS, acquire_args, pool, reserve_with, sweep_until_freed, wait_past,
};

contract_suite!(
    many_pools_read_at_once_answer_as_each_read_alone,
    stamps_move_with_every_write_and_only_then,
    a_look_sweeps_then_reads_as_the_two_calls_do,
    a_refill_answers_the_pool_as_a_snapshot_reads_it_after,
);

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
    // Not a multiple of a call's hundred pools, so the last call is a short one.
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
    let stamps = store.stamps(&pools).await;
    assert_eq!(stamps.len(), pools.len(), "one stamp per pool");
    let counts = |s: &PoolSnapshot| (s.available, s.reserved, s.sold);
    for (i, ((p, read), stamp)) in pools.iter().zip(together).zip(stamps).enumerate() {
        let read = read.unwrap_or_else(|e| panic!("pool {i}: {e}"));
        let alone = store.snapshot(p).await.unwrap();
        let stamp = stamp.unwrap_or_else(|e| panic!("pool {i}: {e}"));
        // A pool read as gone has no generation in its stamp either (its sequence, kept
        // for the pool's next generation, may show).
        let as_read = PoolStamp { generation: read.generation, write_seq: read.write_seq };
        if read.generation == 0 {
            assert_eq!(stamp.generation, 0, "pool {i}: gone, {stamp:?}");
        } else {
            assert_eq!(stamp, as_read, "pool {i}: its stamp as its snapshot");
        }
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

async fn stamp(store: &dyn PoolStore, p: &PoolKey) -> PoolStamp {
    let mut stamps = store.stamps(std::slice::from_ref(p)).await;
    assert_eq!(stamps.len(), 1);
    stamps.remove(0).expect("stamps")
}

/// After `what`, the pool's stamp moved and is what a snapshot shows; returns it.
async fn moved(store: &dyn PoolStore, p: &PoolKey, before: PoolStamp, what: &str) -> PoolStamp {
    let now = stamp(store, p).await;
    let snap = store.snapshot(p).await.unwrap();
    assert_eq!(now, PoolStamp { generation: snap.generation, write_seq: snap.write_seq }, "{what}: as a snapshot");
    assert_eq!(now.generation, before.generation, "{what}: the same pool");
    assert!(now.write_seq > before.write_seq, "{what} moved the stamp: {before:?} -> {now:?}");
    now
}

async fn stamps_move_with_every_write_and_only_then(backend: &Backend) {
    let store: Arc<dyn PoolStore> = backend.store().await;
    let p = pool("sku-stamped");
    assert_eq!(stamp(store.as_ref(), &p).await.generation, 0, "a pool never opened has no generation");
    assert!(store.refill(&p, "grant-1", 20, 0).await.unwrap());
    let mut s = stamp(store.as_ref(), &p).await;
    assert!(s.generation != 0 && s.write_seq != 0, "{s:?}");

    // Reads move nothing.
    store.snapshot(&p).await.unwrap();
    store.snapshots(std::slice::from_ref(&p)).await;
    assert_eq!(store.expire_due(&p, u64::MAX).await.unwrap(), 0, "nothing due");
    assert_eq!(stamp(store.as_ref(), &p).await, s, "reads and an empty sweep leave the stamp");

    // Each kind of write moves it.
    let (id, _) = reserve_with(store.as_ref(), &p, &acquire_args("u1", 2, "k-1", 5, LONG_TTL_MS / 2)).await;
    s = moved(store.as_ref(), &p, s, "acquire").await;
    store.extend(&p, &id, LONG_TTL_MS, LONG_TTL_MS).await.unwrap();
    s = moved(store.as_ref(), &p, s, "extend").await;
    store.confirm(&p, &id).await.unwrap();
    s = moved(store.as_ref(), &p, s, "confirm").await;
    store.refund(&p, &id).await.unwrap();
    s = moved(store.as_ref(), &p, s, "refund").await;
    let (id, _) = reserve_with(store.as_ref(), &p, &acquire_args("u2", 1, "k-2", 5, LONG_TTL_MS)).await;
    s = moved(store.as_ref(), &p, s, "acquire").await;
    store.cancel(&p, &id).await.unwrap();
    s = moved(store.as_ref(), &p, s, "cancel").await;
    let (_, expires_at) = reserve_with(store.as_ref(), &p, &acquire_args("u3", 1, "k-3", 5, SHORT_TTL_MS)).await;
    s = moved(store.as_ref(), &p, s, "acquire").await;
    wait_past(&store, &p, expires_at).await;
    assert_eq!(sweep_until_freed(&store, &p, 1).await, 1);
    s = moved(store.as_ref(), &p, s, "expiry").await;
    assert_eq!(store.take_for_return(&p, "take-1", 3, 0).await.unwrap(), 3);
    s = moved(store.as_ref(), &p, s, "take").await;
    assert_eq!(store.untake(&p, "take-1", 0).await.unwrap(), 3);
    s = moved(store.as_ref(), &p, s, "untake").await;
    assert!(store.refill(&p, "grant-2", 4, 0).await.unwrap());
    s = moved(store.as_ref(), &p, s, "refill").await;
    // A replay writes nothing.
    assert!(!store.refill(&p, "grant-2", 4, 0).await.unwrap());
    assert_eq!(stamp(store.as_ref(), &p).await, s, "a replayed refill leaves the stamp");

    // A pool below the floor (it went back in time) has no generation to vouch with.
    store.raise_floor(&p, s.write_seq + 5).await.unwrap();
    assert_eq!(stamp(store.as_ref(), &p).await.generation, 0, "below the floor");
}

/// `look` answers what `expire_due` and then `snapshot` and `outbox_stats` answer: on a pool
/// never opened, on one with nothing due, on one with expired and live reservations (the
/// expired put back, the pool read after the sweep, its stamp the one a snapshot shows, its
/// outbox with the sweep's events), and on one below its floor (lost: nothing swept, nothing
/// read).
async fn a_look_sweeps_then_reads_as_the_two_calls_do(backend: &Backend) {
    let store: Arc<dyn PoolStore> = backend.store().await;
    let counts = |s: &PoolSnapshot| (s.available, s.reserved, s.sold, s.generation, s.write_seq);

    let never = pool("sku-look-never");
    let Looked { freed, snapshot: snap, outbox } = store.look(&never, 100).await.unwrap();
    assert_eq!((freed, snap.available, snap.generation), (0, 0, 0), "never opened: {snap:?}");
    assert_eq!(outbox, None, "never opened: no outbox");

    // Two pools set up alike: one looked at, one swept and read by the two calls.
    let (looked, twin) = (pool("sku-look-one"), pool("sku-look-twin"));
    let mut short_expiries = Vec::new();
    for p in [&looked, &twin] {
        assert!(store.refill(p, "grant-1", 20, 0).await.unwrap());
        let Looked { freed, snapshot: snap, outbox } = store.look(p, 100).await.unwrap();
        assert_eq!(freed, 0, "nothing due");
        assert_eq!(outbox, Some(store.outbox_stats(p).await.unwrap()), "the outbox as outbox_stats reads it");
        assert_eq!(counts(&snap), counts(&store.snapshot(p).await.unwrap()), "an empty sweep reads as a snapshot");
        assert_eq!(stamp(store.as_ref(), p).await.write_seq, snap.write_seq, "an empty sweep writes nothing");
        for (n, ttl) in [(1, SHORT_TTL_MS), (2, SHORT_TTL_MS), (3, LONG_TTL_MS)] {
            let (_, expires_at) =
                reserve_with(store.as_ref(), p, &acquire_args(&format!("u{n}"), 1, &format!("k-{n}"), 5, ttl)).await;
            if ttl == SHORT_TTL_MS {
                short_expiries.push(expires_at);
            }
        }
        let (id, _) = reserve_with(store.as_ref(), p, &acquire_args("u4", 1, "k-4", 5, LONG_TTL_MS)).await;
        store.confirm(p, &id).await.unwrap();
    }
    wait_past(&store, &looked, short_expiries.into_iter().max().unwrap()).await;

    let outbox_before = store.outbox_stats(&looked).await.unwrap();
    let Looked { freed, snapshot: snap, outbox } = store.look(&looked, 100).await.unwrap();
    let outbox = outbox.expect("an open pool's outbox");
    assert_eq!(outbox, store.outbox_stats(&looked).await.unwrap(), "the outbox after the sweep");
    assert_eq!(outbox.last_sequence, outbox_before.last_sequence + 2, "with the sweep's two expiry events");
    let twin_freed = store.expire_due(&twin, 100).await.unwrap();
    let twin_snap = store.snapshot(&twin).await.unwrap();
    assert_eq!((freed, twin_freed), (2, 2), "both short reservations put back by either way");
    assert_eq!((snap.available, snap.reserved, snap.sold), (18, 1, 1), "the pool after the sweep: {snap:?}");
    assert_eq!((snap.available, snap.reserved, snap.sold), (twin_snap.available, twin_snap.reserved, twin_snap.sold));
    assert_eq!(counts(&snap), counts(&store.snapshot(&looked).await.unwrap()), "the look read the pool as it is after");
    assert_eq!(stamp(store.as_ref(), &looked).await.write_seq, snap.write_seq, "its sequence once the sweep wrote");
    assert!(snap.now_ms > 0);
    assert_eq!(store.look(&looked, 100).await.unwrap().freed, 0, "nothing due twice");

    // Below its floor the pool is lost: the look neither sweeps nor reads it.
    let seq = store.snapshot(&looked).await.unwrap().write_seq;
    store.raise_floor(&looked, seq + 5).await.unwrap();
    let Looked { freed, snapshot: lost, outbox } = store.look(&looked, 100).await.unwrap();
    assert_eq!((freed, lost.available, lost.reserved, lost.generation), (0, 0, 0, 0), "lost: {lost:?}");
    assert_eq!(outbox, None, "lost: no outbox read");
}

/// `refill_read` answers what the refill answers and the pool as `snapshot` reads it right
/// after, with the write sequence its stamp shows: a pool created by it, a grant applied to
/// it, the same grant replayed (applied once, nothing written), a pool with reservations
/// and sales, a missing pool with `must_exist` (refused, nothing created), and a pool below
/// its floor (lost: refused with `must_exist`, created anew without).
async fn a_refill_answers_the_pool_as_a_snapshot_reads_it_after(backend: &Backend) {
    let store: Arc<dyn PoolStore> = backend.store().await;
    let counts = |s: &PoolSnapshot| (s.available, s.reserved, s.sold, s.generation, s.write_seq);
    let p = pool("sku-refill-read");
    let check = |what: &'static str, answer: &PoolSnapshot, after: &PoolSnapshot, stamp: PoolStamp| {
        assert_eq!(counts(answer), counts(after), "{what}: the answer is the pool as read after");
        assert_eq!((stamp.generation, stamp.write_seq), (answer.generation, answer.write_seq), "{what}: its stamp");
        assert!(answer.now_ms > 0, "{what}: the store's clock");
    };

    let missing = store.refill_read(&p, "open-1", 0, true, 0).await;
    assert!(matches!(missing, Err(inventory_agent::store::StoreError::PoolMissing(_))), "{missing:?}");
    assert_eq!(store.snapshot(&p).await.unwrap().generation, 0, "must_exist created nothing");

    let (applied, opened) = store.refill_read(&p, "open-1", 0, false, 0).await.unwrap();
    assert!(applied);
    assert!(opened.generation != 0 && opened.write_seq != 0, "created: {opened:?}");
    check("created", &opened, &store.snapshot(&p).await.unwrap(), stamp(store.as_ref(), &p).await);

    let (applied, granted) = store.refill_read(&p, "grant-1", 20, true, 0).await.unwrap();
    assert!(applied);
    assert_eq!((granted.available, granted.generation), (20, opened.generation));
    assert!(granted.write_seq > opened.write_seq, "the grant wrote: {granted:?}");
    check("granted", &granted, &store.snapshot(&p).await.unwrap(), stamp(store.as_ref(), &p).await);

    let (applied, replayed) = store.refill_read(&p, "grant-1", 20, true, 0).await.unwrap();
    assert!(!applied, "a replay is applied once");
    assert_eq!(counts(&replayed), counts(&granted), "a replay writes nothing");

    let (id, _) = reserve_with(store.as_ref(), &p, &acquire_args("u1", 1, "k-1", 5, LONG_TTL_MS)).await;
    store.confirm(&p, &id).await.unwrap();
    reserve_with(store.as_ref(), &p, &acquire_args("u2", 2, "k-2", 5, LONG_TTL_MS)).await;
    let (_, busy) = store.refill_read(&p, "grant-2", 5, true, 0).await.unwrap();
    assert_eq!((busy.available, busy.reserved, busy.sold), (22, 2, 1), "{busy:?}");
    check("with reservations and sales", &busy, &store.snapshot(&p).await.unwrap(), stamp(store.as_ref(), &p).await);

    // Below its floor the pool is lost: a grant is refused, an open creates it anew.
    store.raise_floor(&p, busy.write_seq + 5).await.unwrap();
    let lost = store.refill_read(&p, "grant-3", 5, true, 0).await;
    assert!(matches!(lost, Err(inventory_agent::store::StoreError::PoolMissing(_))), "{lost:?}");
    let (_, anew) = store.refill_read(&p, "open-2", 0, false, 0).await.unwrap();
    assert!(anew.generation != 0 && anew.generation != opened.generation, "a new generation: {anew:?}");
    assert_eq!((anew.available, anew.reserved, anew.sold), (0, 0, 0));
    assert!(anew.write_seq > busy.write_seq + 5, "continues above the floor: {anew:?}");
    check("created anew", &anew, &store.snapshot(&p).await.unwrap(), stamp(store.as_ref(), &p).await);
}
