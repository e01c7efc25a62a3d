use super::*;

const RETAIN: i64 = 60_000;
const TTL: u64 = 1_000;

fn args(user: &str, quantity: u64, key: &str, id: &str) -> AcquireArgs {
    AcquireArgs {
        allow_partial: false,
        user_id: user.to_owned(),
        quantity,
        idempotency_key: key.to_owned(),
        new_reservation_id: id.to_owned(),
        per_user_limit: 5,
        reservation_ttl_ms: TTL,
        expect_generation: None,
    }
}

/// A pool created by a refill of `units` at epoch 1, generation 7.
fn stocked(units: u64) -> Pool {
    let mut p = Pool::new();
    assert_eq!(p.refill("g0", units, 1, 7, 0, RETAIN), Ok(true));
    p
}

fn reserve(p: &mut Pool, user: &str, quantity: u64, key: &str, id: &str, now: i64) -> AcquireResult {
    p.acquire(&args(user, quantity, key, id), now).expect("acquire")
}

fn totals(p: &Pool) -> (u64, u64, u64) {
    (p.available(), p.reserved(), p.sold())
}

#[test]
fn acquire_reserves_and_a_replay_returns_the_first_reservation() {
    let mut p = stocked(10);
    let first = reserve(&mut p, "u1", 2, "k1", "r1", 100);
    assert_eq!(
        first,
        AcquireResult::Reserved {
            reservation_id: "r1".into(),
            quantity: 2,
            expires_at_ms: 1_100,
            replayed: false,
            generation: 7
        }
    );
    assert_eq!(totals(&p), (8, 2, 0));
    assert_eq!(p.held_by("u1"), 2);
    let again = reserve(&mut p, "u1", 2, "k1", "r2", 500);
    assert_eq!(
        again,
        AcquireResult::Reserved {
            reservation_id: "r1".into(),
            quantity: 2,
            expires_at_ms: 1_100,
            replayed: true,
            generation: 7
        }
    );
    assert_eq!(totals(&p), (8, 2, 0));
    assert_eq!(p.idempotency_keys().collect::<Vec<_>>(), ["k1"]);
}

#[test]
fn a_replay_expecting_a_lost_generation_is_refused_and_writes_nothing() {
    let mut p = stocked(10);
    let first = args("u1", 2, "k1", "r1");
    assert!(matches!(p.acquire(&first, 0), Ok(AcquireResult::Reserved { generation: 7, .. })));
    // The generation the answer carried: a replay expecting it is answered as before.
    let replay = AcquireArgs { expect_generation: Some(7), new_reservation_id: "r2".into(), ..first.clone() };
    assert!(matches!(p.acquire(&replay, 0), Ok(AcquireResult::Reserved { replayed: true, .. })));

    // The store lost the pool; a new one (generation 8) is stocked and does not know k1.
    let mut p = Pool::new();
    assert_eq!(p.refill("g0", 10, 1, 8, 0, RETAIN), Ok(true));
    let refused = PoolError::GenerationChanged { expected: 7, actual: 8 };
    assert_eq!(p.acquire(&replay, 0), Err(refused));
    assert_eq!((totals(&p), p.reservation_state("r2")), ((10, 0, 0), None));
    assert_eq!(p.idempotency_keys().count(), 0);
    // A first request (nothing expected) reserves; so does one expecting this generation.
    assert!(matches!(p.acquire(&args("u2", 1, "k2", "r3"), 0), Ok(AcquireResult::Reserved { generation: 8, .. })));
    let current = AcquireArgs { expect_generation: Some(8), ..args("u3", 1, "k3", "r4") };
    assert!(matches!(p.acquire(&current, 0), Ok(AcquireResult::Reserved { replayed: false, .. })));
    // No pool at all: generation 0.
    let refused = PoolError::GenerationChanged { expected: 8, actual: 0 };
    assert_eq!(Pool::new().acquire(&current, 0), Err(refused));
    // 0 expects nothing (the Lua twin receives 0 for "not checked").
    let unchecked = AcquireArgs { expect_generation: Some(0), ..args("u4", 1, "k4", "r5") };
    assert!(matches!(p.acquire(&unchecked, 0), Ok(AcquireResult::Reserved { replayed: false, .. })));
}

#[test]
fn a_key_reused_for_another_payload_conflicts() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 2, "k1", "r1", 0);
    assert_eq!(reserve(&mut p, "u2", 2, "k1", "r2", 0), AcquireResult::KeyConflict);
    assert_eq!(reserve(&mut p, "u1", 3, "k1", "r3", 0), AcquireResult::KeyConflict);
    assert_eq!(totals(&p), (8, 2, 0));
    assert_eq!(p.reservation_state("r2"), None);
}

#[test]
fn the_per_user_limit_counts_reserved_and_sold_units_and_writes_nothing() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 3, "k1", "r1", 0);
    assert_eq!(p.confirm("r1", 1, RETAIN), Ok(Transition::Done(ReservationState::Confirmed)));
    reserve(&mut p, "u1", 2, "k2", "r2", 0);
    assert_eq!(reserve(&mut p, "u1", 1, "k3", "r3", 0), AcquireResult::LimitExceeded { held: 5 });
    assert_eq!(p.idempotency_keys().count(), 2);
    // Another user is not affected.
    assert!(matches!(reserve(&mut p, "u2", 1, "k4", "r4", 0), AcquireResult::Reserved { .. }));
}

#[test]
fn sold_out_answers_what_is_left_and_writes_nothing() {
    let mut p = stocked(1);
    assert_eq!(reserve(&mut p, "u1", 2, "k1", "r1", 0), AcquireResult::SoldOut { available: 1 });
    assert_eq!(p.idempotency_keys().count(), 0);
    // A pool that does not exist has nothing.
    let mut missing = Pool::new();
    assert_eq!(reserve(&mut missing, "u1", 1, "k1", "r1", 0), AcquireResult::SoldOut { available: 0 });
    assert_eq!(missing, Pool::new());
}

#[test]
fn acquire_refuses_zero_quantity_and_a_used_reservation_id() {
    let mut p = stocked(10);
    assert_eq!(p.acquire(&args("u1", 0, "k0", "r0"), 0), Err(PoolError::ZeroQuantity));
    reserve(&mut p, "u1", 1, "k1", "r1", 0);
    assert_eq!(p.acquire(&args("u1", 1, "k2", "r1"), 0), Err(PoolError::DuplicateReservationId("r1".into())));
    assert_eq!(totals(&p), (9, 1, 0));
}

#[test]
fn confirm_moves_reserved_to_sold_once() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 2, "k1", "r1", 0);
    assert_eq!(p.confirm("r1", 10, RETAIN), Ok(Transition::Done(ReservationState::Confirmed)));
    assert_eq!(p.confirm("r1", 20, RETAIN), Ok(Transition::Done(ReservationState::Confirmed)));
    assert_eq!(totals(&p), (8, 0, 2));
    assert_eq!(p.held_by("u1"), 2);
    assert_eq!(p.cancel("r1", 30, RETAIN), Ok(Transition::Refused(ReservationState::Confirmed)));
    assert_eq!(p.confirm("nope", 30, RETAIN), Ok(Transition::NotFound));
}

#[test]
fn cancel_gives_units_and_allowance_back_once() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 2, "k1", "r1", 0);
    assert_eq!(p.cancel("r1", 10, RETAIN), Ok(Transition::Done(ReservationState::Cancelled)));
    assert_eq!(p.cancel("r1", 20, RETAIN), Ok(Transition::Done(ReservationState::Cancelled)));
    assert_eq!(totals(&p), (10, 0, 0));
    assert_eq!(p.held_by("u1"), 0);
    assert_eq!(p.confirm("r1", 30, RETAIN), Ok(Transition::Refused(ReservationState::Cancelled)));
}

#[test]
fn a_reservation_past_its_expiry_expires_on_confirm_or_cancel() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 2, "k1", "r1", 0);
    reserve(&mut p, "u1", 1, "k2", "r2", 0);
    assert_eq!(p.confirm("r1", 1_000, RETAIN), Ok(Transition::Refused(ReservationState::Expired)));
    assert_eq!(p.cancel("r2", 1_000, RETAIN), Ok(Transition::Done(ReservationState::Expired)));
    assert_eq!(totals(&p), (10, 0, 0));
    assert_eq!(p.reservation_state("r1"), Some(ReservationState::Expired));
}

#[test]
fn expire_due_frees_due_reservations_earliest_first_up_to_max() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 1, "k1", "r1", 0);
    reserve(&mut p, "u2", 2, "k2", "r2", 10);
    reserve(&mut p, "u3", 3, "k3", "r3", 5_000);
    assert_eq!(p.expire_due(1, 2_000, RETAIN), Ok(1));
    assert_eq!(p.reservation_state("r1"), Some(ReservationState::Expired));
    assert_eq!(p.expire_due(10, 2_000, RETAIN), Ok(2));
    assert_eq!(p.expire_due(10, 2_000, RETAIN), Ok(0));
    assert_eq!(p.reservation_state("r3"), Some(ReservationState::Reserved));
    assert_eq!(totals(&p), (7, 3, 0));
    assert_eq!((p.held_by("u1"), p.held_by("u2"), p.held_by("u3")), (0, 0, 3));
}

#[test]
fn finished_records_are_forgotten_after_their_retention() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 1, "k1", "r1", 0);
    p.confirm("r1", 10, RETAIN).unwrap();
    assert_eq!(p.expire_due(10, 10 + RETAIN - 1, RETAIN), Ok(0));
    assert!(p.reservation("r1").is_some());
    p.expire_due(10, 10 + RETAIN, RETAIN).unwrap();
    assert_eq!(p.reservation_state("r1"), None);
    assert_eq!(p.idempotency_keys().count(), 0);
    // The grant g0 (applied at 0) is forgotten too: the same id now applies again.
    assert_eq!(p.refill("g0", 1, 1, 9, 20 + RETAIN, RETAIN), Ok(true));
    assert_eq!(totals(&p), (10, 0, 1));
}

#[test]
fn refill_applies_once_per_grant_id_and_creates_the_pool_with_the_given_generation() {
    let mut p = Pool::new();
    assert!(!p.exists());
    assert_eq!(p.snapshot(5), PoolSnapshot { now_ms: 5, ..PoolSnapshot::default() });
    assert_eq!(p.refill("g1", 4, 1, 42, 0, RETAIN), Ok(true));
    assert_eq!(p.refill("g1", 4, 1, 43, 0, RETAIN), Ok(false));
    assert_eq!(p.refill("g2", 1, 1, 43, 0, RETAIN), Ok(true));
    assert_eq!(
        p.snapshot(9),
        PoolSnapshot { available: 5, reserved: 0, sold: 0, generation: 42, now_ms: 9, write_seq: 2 }
    );
    // A refill of 0 units creates the pool too; generation 0 is never stored.
    let mut q = Pool::new();
    assert_eq!(q.refill("open", 0, 0, 0, 0, RETAIN), Ok(true));
    assert_eq!(q.generation(), 1);
}

#[test]
fn refill_refuses_to_overflow() {
    let mut p = stocked(u64::MAX - 1);
    assert_eq!(p.refill("g1", 2, 1, 7, 0, RETAIN), Err(PoolError::Overflow("pool available")));
    assert_eq!(p.refill("g1", 1, 1, 7, 0, RETAIN), Ok(true));
}

#[test]
fn refill_existing_refuses_a_missing_pool_and_records_nothing() {
    let mut p = Pool::new();
    assert_eq!(p.refill_existing("g1", 4, 1, 0, RETAIN), Err(PoolError::Missing));
    assert_eq!(p, Pool::new());
    let mut p = stocked(1);
    assert_eq!(p.refill_existing("g1", 4, 1, 0, RETAIN), Ok(true));
    assert_eq!(p.refill_existing("g1", 4, 1, 0, RETAIN), Ok(false));
    assert_eq!((p.available(), p.generation()), (5, 7));
}

#[test]
fn take_for_return_takes_once_per_take_id_and_untake_puts_back_once() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 2, "k1", "r1", 0);
    assert_eq!(p.take_for_return("t1", 20, 1, 0, RETAIN), Ok(8));
    assert_eq!(p.take_for_return("t1", 20, 1, 0, RETAIN), Ok(8));
    assert_eq!(totals(&p), (0, 2, 0));
    assert_eq!(p.untake("t1", 1), Ok(8));
    assert_eq!(p.untake("t1", 1), Ok(0));
    assert_eq!(p.untake("unknown", 1), Ok(0));
    assert_eq!(totals(&p), (8, 2, 0));
    // A take of nothing puts nothing back.
    assert_eq!(p.take_for_return("t2", 0, 1, 0, RETAIN), Ok(0));
    assert_eq!(p.untake("t2", 1), Ok(0));
}

#[test]
fn untake_puts_nothing_back_into_a_lost_pool() {
    let mut p = Pool::new();
    assert_eq!(p.take_for_return("t1", 3, 0, 0, RETAIN), Ok(0));
    assert_eq!(p.untake("t1", 0), Ok(0));
    assert!(!p.exists());
}

#[test]
fn the_fence_refuses_older_epochs_and_never_goes_down() {
    let mut p = stocked(10);
    assert_eq!(p.raise_fence(3), 0, "the fence found");
    assert_eq!(p.raise_fence(2), 3);
    assert_eq!(p.fence(), 3);
    let fenced = Err(PoolError::Fenced { fence: 3 });
    assert_eq!(p.refill("g1", 1, 2, 9, 0, RETAIN), fenced.clone().map(|()| false));
    assert_eq!(p.refill_existing("g1", 1, 2, 0, RETAIN), fenced.clone().map(|()| false));
    assert_eq!(p.take_for_return("t1", 1, 2, 0, RETAIN), fenced.clone().map(|()| 0));
    assert_eq!(p.untake("t1", 2), fenced.clone().map(|()| 0));
    assert_eq!(p.check_fence(2), fenced);
    assert_eq!(totals(&p), (10, 0, 0));
    // The fencing epoch and later ones pass; nothing was recorded by the refused calls.
    assert_eq!(p.refill("g1", 1, 3, 9, 0, RETAIN), Ok(true));
    assert_eq!(p.take_for_return("t1", 1, 4, 0, RETAIN), Ok(1));
    assert_eq!(p.untake("t1", 3), Ok(1));
    assert_eq!(totals(&p), (11, 0, 0));
    // Selling is not fenced.
    assert!(matches!(reserve(&mut p, "u1", 1, "k1", "r1", 0), AcquireResult::Reserved { .. }));
}

#[test]
fn a_missing_pool_may_carry_a_fence() {
    let mut p = Pool::new();
    p.raise_fence(5);
    assert_eq!(p.refill_existing("g1", 1, 4, 0, RETAIN), Err(PoolError::Fenced { fence: 5 }));
    assert_eq!(p.refill_existing("g1", 1, 5, 0, RETAIN), Err(PoolError::Missing));
    assert_eq!(p.refill("g1", 1, 5, 8, 0, RETAIN), Ok(true));
    assert_eq!((p.fence(), p.generation()), (5, 8));
}

#[test]
fn counts_and_reservations_agree() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 2, "k1", "r1", 0);
    reserve(&mut p, "u2", 3, "k2", "r2", 0);
    p.confirm("r2", 1, RETAIN).unwrap();
    let c = p.counts();
    assert_eq!((c.available, c.reserved, c.sold, c.sum()), (5, 2, 3, 10));
    let ids: Vec<&str> = p.reservations().map(|(id, _)| id).collect();
    assert_eq!(ids, ["r1", "r2"]);
    assert_eq!(p.reservation("r2").map(|r| (r.user_id.as_str(), r.quantity)), Some(("u2", 3)));
    assert_eq!(Pool::new().counts(), crate::ledger::PoolCounts::default());
}

/// (sequence, reservation id, state, previous) of every kept event.
fn event_log(p: &Pool) -> Vec<(u64, String, ReservationState, Option<ReservationState>)> {
    p.events(0, u64::MAX).events.into_iter().map(|e| (e.sequence, e.reservation_id, e.state, e.previous)).collect()
}

#[test]
fn every_transition_writes_one_event_numbered_without_gaps_and_replays_write_none() {
    use ReservationState::{Cancelled, Confirmed, Expired, Refunded, Reserved};
    let mut p = stocked(10);
    for (i, id) in ["r1", "r2", "r3", "r4"].into_iter().enumerate() {
        reserve(&mut p, &format!("u{i}"), 1, &format!("k{i}"), id, 100);
    }
    reserve(&mut p, "u0", 1, "k0", "r9", 100); // replay: no event
    assert_eq!(p.confirm("r1", 200, RETAIN), Ok(Transition::Done(Confirmed)));
    assert_eq!(p.confirm("r1", 200, RETAIN), Ok(Transition::Done(Confirmed)));
    assert_eq!(p.cancel("r2", 200, RETAIN), Ok(Transition::Done(Cancelled)));
    assert_eq!(p.cancel("r2", 200, RETAIN), Ok(Transition::Done(Cancelled)));
    // Past its expiry: the confirm expires it on the spot, one event.
    assert_eq!(p.confirm("r3", 1_100, RETAIN), Ok(Transition::Refused(Expired)));
    assert_eq!(p.confirm("r3", 1_100, RETAIN), Ok(Transition::Refused(Expired)));
    assert_eq!(p.expire_due(10, 1_100, RETAIN), Ok(1));
    assert_eq!(p.refund("r1", 1_200), Ok(Transition::Done(Refunded)));
    assert_eq!(p.refund("r1", 1_200), Ok(Transition::Done(Refunded)));
    let log = event_log(&p);
    let expected = [
        ("r1", Reserved, None),
        ("r2", Reserved, None),
        ("r3", Reserved, None),
        ("r4", Reserved, None),
        ("r1", Confirmed, Some(Reserved)),
        ("r2", Cancelled, Some(Reserved)),
        ("r3", Expired, Some(Reserved)),
        ("r4", Expired, Some(Reserved)),
        ("r1", Refunded, Some(Confirmed)),
    ];
    assert_eq!(log.len(), expected.len(), "{log:?}");
    for (i, ((seq, id, state, previous), (eid, estate, eprev))) in log.iter().zip(expected).enumerate() {
        assert_eq!((*seq, id.as_str(), *state, *previous), (i as u64 + 1, eid, estate, eprev));
    }
    let e = &p.events(9, 1).events[0];
    assert_eq!((e.user_id.as_str(), e.idempotency_key.as_str(), e.quantity, e.at_ms), ("u0", "k0", 1, 1_200));
}

#[test]
fn refund_gives_sold_units_and_allowance_back_once_and_only_after_confirm() {
    use ReservationState::{Cancelled, Confirmed, Refunded, Reserved};
    let mut p = stocked(10);
    reserve(&mut p, "u1", 3, "k1", "r1", 0);
    assert_eq!(p.refund("r1", 0), Ok(Transition::Refused(Reserved)));
    assert_eq!(p.confirm("r1", 0, RETAIN), Ok(Transition::Done(Confirmed)));
    assert_eq!((totals(&p), p.held_by("u1")), ((7, 0, 3), 3));
    assert_eq!(p.refund("r1", 0), Ok(Transition::Done(Refunded)));
    assert_eq!((totals(&p), p.held_by("u1")), ((10, 0, 0), 0));
    assert_eq!(p.refund("r1", 0), Ok(Transition::Done(Refunded)));
    assert_eq!(totals(&p), (10, 0, 0));
    assert_eq!(p.cancel("r1", 0, RETAIN), Ok(Transition::Refused(Refunded)));
    assert_eq!(p.confirm("r1", 0, RETAIN), Ok(Transition::Refused(Refunded)));
    reserve(&mut p, "u2", 1, "k2", "r2", 0);
    assert_eq!(p.cancel("r2", 0, RETAIN), Ok(Transition::Done(Cancelled)));
    assert_eq!(p.refund("r2", 0), Ok(Transition::Refused(Cancelled)));
    assert_eq!(p.refund("nope", 0), Ok(Transition::NotFound));
    // The refunded record goes when the confirm's retention runs out.
    p.expire_due(0, RETAIN + 1, RETAIN).unwrap();
    assert_eq!(p.reservation_state("r1"), None);
}

#[test]
fn extend_pushes_the_expiry_within_the_ttl_and_expires_a_late_one_on_the_spot() {
    use ReservationState::{Confirmed, Expired};
    let mut p = stocked(10);
    reserve(&mut p, "u1", 1, "k1", "r1", 0); // expires at 1_000
    assert_eq!(p.extend("r1", 5_000, TTL, 500, RETAIN), Ok(ExtendResult::Extended { expires_at_ms: 1_500 }));
    // Never earlier than it already is.
    assert_eq!(p.extend("r1", 10, TTL, 600, RETAIN), Ok(ExtendResult::Extended { expires_at_ms: 1_500 }));
    assert_eq!(p.expire_due(10, 1_499, RETAIN), Ok(0), "the sweeper follows the new expiry");
    let events = p.outbox_stats().last_sequence;
    assert_eq!(p.extend("r1", 100, TTL, 1_500, RETAIN), Ok(ExtendResult::Refused(Expired)));
    assert_eq!((totals(&p), p.held_by("u1")), ((10, 0, 0), 0));
    assert_eq!(p.outbox_stats().last_sequence, events + 1, "one 'expired' event");
    assert_eq!(p.extend("r1", 100, TTL, 1_500, RETAIN), Ok(ExtendResult::Refused(Expired)));
    reserve(&mut p, "u2", 1, "k2", "r2", 0);
    p.confirm("r2", 0, RETAIN).unwrap();
    assert_eq!(p.extend("r2", 100, TTL, 0, RETAIN), Ok(ExtendResult::Refused(Confirmed)));
    assert_eq!(p.extend("nope", 100, TTL, 0, RETAIN), Ok(ExtendResult::NotFound));
}

#[test]
fn find_looks_up_by_id_or_idempotency_key() {
    let mut p = stocked(10);
    reserve(&mut p, "u1", 2, "k1", "r1", 0);
    let by_id = p.find(&ReservationRef::Id("r1".into())).map(|(id, r)| (id.to_owned(), r.clone()));
    let by_key = p.find(&ReservationRef::IdempotencyKey("k1".into())).map(|(id, r)| (id.to_owned(), r.clone()));
    assert_eq!(by_id, by_key);
    let (id, r) = by_id.expect("found");
    assert_eq!((id.as_str(), r.user_id.as_str(), r.quantity, r.expires_at_ms), ("r1", "u1", 2, 1_000));
    assert!(p.find(&ReservationRef::Id("k1".into())).is_none());
    assert!(p.find(&ReservationRef::IdempotencyKey("r1".into())).is_none());
}

#[test]
fn the_outbox_bound_drops_the_oldest_and_trim_forgets_what_was_delivered() {
    let mut p = stocked(100);
    p.set_outbox_max(3);
    for i in 0..5 {
        reserve(&mut p, &format!("u{i}"), 1, &format!("k{i}"), &format!("r{i}"), 0);
    }
    let page = p.events(0, 100);
    assert_eq!((page.first_kept, page.last_sequence, page.generation), (3, 5, 7));
    assert_eq!(page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [3, 4, 5]);
    assert_eq!(p.outbox_stats(), OutboxStats { kept: 3, dropped: 2, last_sequence: 5 });
    assert_eq!(p.events(4, 1).events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [4]);
    assert!(p.events(6, 10).events.is_empty());
    assert_eq!(p.trim_events(8, 4), 0, "acknowledged for another generation");
    assert_eq!(p.trim_events(7, 4), 2);
    assert_eq!(p.trim_events(7, 4), 0);
    let page = p.events(0, 100);
    assert_eq!((page.first_kept, page.events.len()), (5, 1));
    assert_eq!(p.trim_events(7, u64::MAX), 1);
    assert_eq!((p.events(0, 10).first_kept, p.events(0, 10).last_sequence), (6, 5));
    // Sequences go on after a trim; a pool created anew starts at 1.
    reserve(&mut p, "u9", 1, "k9", "r9", 0);
    assert_eq!(p.events(0, 10).events[0].sequence, 6);
    let mut fresh = Pool::new();
    assert_eq!(fresh.events(0, 10), EventPage { generation: 0, events: vec![], last_sequence: 0, first_kept: 1 });
    fresh.refill("g", 1, 1, 9, 0, RETAIN).unwrap();
    reserve(&mut fresh, "u", 1, "k", "r", 0);
    assert_eq!(fresh.events(0, 10).events[0].sequence, 1);
}

fn partial(user: &str, quantity: u64, key: &str, id: &str) -> AcquireArgs {
    AcquireArgs { allow_partial: true, ..args(user, quantity, key, id) }
}

#[test]
fn a_partial_acquire_reserves_the_least_of_asked_stock_and_allowance() {
    let mut p = stocked(4);
    assert_eq!(
        reserve(&mut p, "u1", 2, "k1", "r1", 0),
        AcquireResult::Reserved {
            reservation_id: "r1".into(),
            quantity: 2,
            expires_at_ms: 1_000,
            replayed: false,
            generation: 7
        }
    );
    // Limit 5, 2 held, 2 in stock: 5 asked, 2 reserved.
    let got = p.acquire(&partial("u1", 5, "k2", "r2"), 0).unwrap();
    assert!(matches!(got, AcquireResult::Reserved { quantity: 2, replayed: false, .. }), "{got:?}");
    assert_eq!(totals(&p), (0, 4, 0));
    assert_eq!(p.reservation("r2").map(|r| (r.quantity, r.requested_quantity())), Some((2, 5)));
    // The replay matches the asked quantity, another one conflicts.
    let again = p.acquire(&partial("u1", 5, "k2", "r3"), 10).unwrap();
    assert!(
        matches!(again, AcquireResult::Reserved { quantity: 2, replayed: true, ref reservation_id, .. } if reservation_id == "r2")
    );
    assert_eq!(p.acquire(&partial("u1", 2, "k2", "r3"), 10), Ok(AcquireResult::KeyConflict));
    // Allowance full (4 of 5 held, stock 0): sold out; a full allowance: over the limit.
    assert_eq!(p.acquire(&partial("u1", 3, "k3", "r4"), 10), Ok(AcquireResult::SoldOut { available: 0 }));
    p.refill("g1", 3, 1, 7, 10, RETAIN).unwrap();
    let one = p.acquire(&partial("u1", 3, "k4", "r5"), 10).unwrap();
    assert!(matches!(one, AcquireResult::Reserved { quantity: 1, .. }), "{one:?}");
    assert_eq!(p.acquire(&partial("u1", 1, "k5", "r6"), 10), Ok(AcquireResult::LimitExceeded { held: 5 }));
    assert_eq!(totals(&p), (2, 5, 0));
}

#[test]
fn a_segmented_pools_outbox_is_its_fullest_segment_with_every_drop() {
    let s = |kept, dropped, last_sequence| OutboxStats { kept, dropped, last_sequence };
    assert_eq!(OutboxStats::fullest(&[]), OutboxStats::default());
    assert_eq!(OutboxStats::fullest(&[s(3, 1, 9)]), s(3, 1, 9));
    assert_eq!(OutboxStats::fullest(&[s(3, 1, 9), s(80, 0, 4), s(0, 2, 0)]), s(80, 3, 9));
}

#[test]
fn a_pool_restored_from_before_a_write_its_caller_saw_is_lost_and_its_next_generation_continues_above() {
    let mut p = Pool::new();
    p.refill("g1", 10, 1, 42, 0, RETAIN).unwrap();
    let copy = p.clone();
    let args = AcquireArgs {
        user_id: "u".into(),
        quantity: 3,
        idempotency_key: "k".into(),
        new_reservation_id: "r".into(),
        per_user_limit: 10,
        reservation_ttl_ms: 1_000,
        expect_generation: None,
        allow_partial: false,
    };
    p.acquire(&args, 1).unwrap();
    let floor = p.write_seq();
    assert!(floor > copy.write_seq(), "every write raises the sequence");
    assert!(!p.clone().drop_if_behind(floor), "the live pool is not behind");

    // The store went back to the copy: same generation, older contents.
    let mut restored = copy;
    assert_eq!(restored.generation(), 42);
    assert!(super::went_back(floor, restored.snapshot(2).write_seq));
    assert!(restored.drop_if_behind(floor));
    assert!(!restored.exists(), "a pool behind reads as lost");
    assert_eq!(restored.refill_existing("g2", 1, 1, 2, RETAIN), Err(PoolError::Missing));
    assert_eq!(restored.refill("g1", 10, 1, 77, 2, RETAIN), Ok(false), "a grant stays a replay");
    assert_eq!(restored.refill("open", 0, 1, 77, 2, RETAIN), Ok(true));
    assert_eq!(restored.generation(), 77, "reopened with a new generation");
    assert_eq!(restored.reservation_state("r"), None);
    assert!(restored.write_seq() > floor, "the new generation continues above the floor");
    assert!(!restored.drop_if_behind(floor));
}

#[test]
fn the_center_remembers_the_highest_write_sequence_per_segment() {
    assert_eq!(super::remember_write_seq(40, 12), 40, "a lower report never lowers it");
    assert_eq!(super::remember_write_seq(40, 41), 41);
    assert_eq!(super::reported_write_seqs(7, &[]), vec![(0, 7)]);
    assert_eq!(super::reported_write_seqs(0, &[]), vec![], "nothing known is not remembered");
    assert_eq!(super::reported_write_seqs(7, &[(0, 3), (1, 0), (2, 9)]), vec![(0, 3), (2, 9)]);
    assert_eq!(super::floors_by_segment([(2, 9), (0, 3), (2, 4)]), vec![3, 0, 9]);
    assert_eq!(super::floors_by_segment([(64, 9)]), Vec::<u64>::new(), "no such segment");
}

#[test]
fn a_returns_write_sequences_are_checked_and_named_by_segment() {
    assert_eq!(super::return_write_seqs(&[]).unwrap(), vec![]);
    assert_eq!(super::return_write_seqs(&[5]).unwrap(), vec![(0, 5)]);
    assert_eq!(super::return_write_seqs(&[0, 8, 0, 2]).unwrap(), vec![(1, 8), (3, 2)], "0 is nothing known");
    let e = super::return_write_seqs(&[1, u64::MAX]).unwrap_err();
    assert_eq!((e.field.as_str(), e.value.as_str()), ("write_seq_floors[1]", "18446744073709551615"));
    let e = super::return_write_seqs(&[1; 65]).unwrap_err();
    assert_eq!((e.field.as_str(), e.value.as_str()), ("write_seq_floors", "65"));
    assert!(e.reason.contains("64"), "{}", e.reason);
}
