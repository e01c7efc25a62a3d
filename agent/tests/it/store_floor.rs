//! The `PoolStore` contract, continued: floors (`raise_floor`, `floor`). A floor the center
//! hands back above the pool's write sequence means the pool went back in time: it reads
//! as lost, and its next generation continues above the floor. Run against every backend
//! like `store_contract`.

use super::store_contract::{Backend, pool};

contract_suite!(a_pool_below_a_raised_floor_is_lost_and_its_next_generation_continues_above);

async fn a_pool_below_a_raised_floor_is_lost_and_its_next_generation_continues_above(backend: &Backend) {
    let store = backend.store().await;
    let p = pool("sku-floor");
    assert!(store.refill(&p, "grant-1", 5, 0).await.unwrap());
    let live = store.snapshot(&p).await.unwrap();
    assert!(live.write_seq > 0, "a write raises the sequence: {live:?}");
    assert_eq!(store.floor(&p), live.write_seq, "the floor is what the store's own writes saw");

    // The pool's own sequence, or a lower one, changes nothing: never lowered, not lost.
    store.raise_floor(&p, live.write_seq).await.unwrap();
    store.raise_floor(&p, 1).await.unwrap();
    assert_eq!(store.floor(&p), live.write_seq);
    let same = store.snapshot(&p).await.unwrap();
    assert_eq!((same.generation, same.available), (live.generation, 5), "{same:?}");

    // The center remembers writes this pool lacks: it reads as lost, nothing of it left.
    let floor = live.write_seq + 10;
    store.raise_floor(&p, floor).await.unwrap();
    let lost = store.snapshot(&p).await.unwrap();
    assert_eq!((lost.generation, lost.available, lost.reserved, lost.sold), (0, 0, 0, 0), "{lost:?}");
    let grant = store.refill_existing(&p, "grant-2", 3, 0).await;
    assert!(grant.is_err(), "a grant never lands in a lost pool: {grant:?}");

    // Opened again: a new generation, its sequence above the floor.
    assert!(store.refill(&p, "grant-3", 3, 0).await.unwrap());
    let again = store.snapshot(&p).await.unwrap();
    assert!(again.generation != 0 && again.generation != live.generation, "{again:?}");
    assert_eq!(again.available, 3);
    assert!(again.write_seq > floor, "the next generation continues above the floor: {again:?}");
}
