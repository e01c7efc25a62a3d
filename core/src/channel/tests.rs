//! The rules with no store, no center and no runtime: each test feeds replies by hand.

use super::*;
use crate::channel::ops::Reply;
use crate::watermarks::Watermarks;

fn policy() -> Policy {
    Policy {
        per_user_limit: 2,
        reservation_ttl_ms: 60_000,
        watermarks: Watermarks { low: 5, high: 30, batch: 10 },
        rate_batching: None,
        closed: false,
    }
}

pub(super) fn ctx(now_ms: i64, epoch: u64) -> Ctx {
    Ctx { now_ms, epoch }
}

pub(super) fn view(available: u64, generation: u64) -> PoolView {
    PoolView { available, reserved: 0, sold: 0, generation }
}

pub(super) fn item() -> ItemCore {
    ItemCore::new(policy(), 100, Settings::default())
}

/// The effect the step asks for (panics if none).
pub(super) fn work(step: &Step) -> Work {
    step.next.clone().expect("an effect to carry out")
}

/// Feeds `reply` to the running operation of `step`.
pub(super) fn feed(core: &mut ItemCore, step: &Step, reply: Reply, c: Ctx) -> Step {
    core.feed(work(step).op, reply, c)
}

#[test]
fn a_borrow_reads_the_pool_calls_the_center_and_refills_under_one_epoch() {
    let mut core = item();
    let (id, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 7));
    assert_eq!(work(&s).effect, Effect::ReadPool);
    let s = feed(&mut core, &s, Reply::Pool(view(0, 42)), ctx(1, 7));
    assert_eq!(work(&s).effect, Effect::Borrow { request_id: "b1".into(), quantity: 10, epoch: 7, sell_rate_milli: 0 });
    // The channel re-registers meanwhile: the refill still carries the epoch read first.
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(2, 8));
    assert_eq!(work(&s).effect, Effect::ReadPool);
    let s = feed(&mut core, &s, Reply::Pool(view(0, 42)), ctx(3, 8));
    assert_eq!(
        work(&s).effect,
        Effect::Refill { grant_id: "b1".into(), units: 10, epoch: 7, must_exist: true, after_ms: 0 }
    );
    let s = feed(&mut core, &s, Reply::Done, ctx(4, 8));
    assert_eq!(s.finished, vec![(id, OpResult::Borrowed { granted: 10 })]);
    assert!(s.next.is_none() && !core.busy());
    assert_eq!(core.borrows_done(), 1);
    assert_eq!(core.generation(), 42);
}

#[test]
fn a_pool_is_created_before_its_first_borrow() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 0)), ctx(0, 1));
    assert_eq!(work(&s).effect, Effect::OpenPool { grant_id: "open-b1".into(), epoch: 1 });
    let s = feed(&mut core, &s, Reply::Done, ctx(0, 1));
    assert_eq!(work(&s).effect, Effect::ReadPool);
    let s = feed(&mut core, &s, Reply::Pool(view(0, 5)), ctx(0, 1));
    assert!(matches!(work(&s).effect, Effect::Borrow { .. }));
    assert_eq!(core.generation(), 5);
}

#[test]
fn concurrent_misses_share_one_borrow() {
    let mut core = item();
    let (first, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let (second, queued) = core.submit(OpKind::Borrow { want: 10 }, "b2".into(), ctx(0, 1));
    assert!(queued.next.is_none() && queued.finished.is_empty(), "queued behind the running one");
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Done, ctx(0, 1));
    assert_eq!(s.finished, vec![(first, OpResult::Borrowed { granted: 10 }), (second, OpResult::Skipped)]);
    assert!(!core.busy());
}

#[test]
fn a_borrow_whose_outcome_is_unknown_schedules_a_resync() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(100, 1));
    assert!(matches!(s.finished[..], [(_, OpResult::Borrowed { granted: 0 })]));
    assert_eq!(core.resync_at(), Some(100 + Settings::default().resync_after_unknown_ms));
    // A refused Borrow was not applied: nothing to settle.
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    feed(&mut core, &s, Reply::Center(CallFault::Refused), ctx(100, 1));
    assert_eq!(core.resync_at(), None);
}

#[test]
fn a_grant_never_recreates_a_lost_pool() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let Effect::Refill { must_exist, .. } = work(&s).effect else { panic!("a refill") };
    assert!(must_exist, "a grant's refill must not create the pool");
    // The store lost the pool just before the refill: the item freezes.
    let s = feed(&mut core, &s, Reply::Store(StoreFault::PoolMissing), ctx(0, 1));
    assert!(matches!(s.finished[..], [(_, OpResult::Borrowed { granted: 0 })]));
    assert_eq!(core.mode(), Mode::Lost);
    assert_eq!(core.admit("k", 1), Admission::Refuse(Refusal::Lost));
}

#[test]
fn a_pool_whose_generation_changed_is_lost_and_reported_lost() {
    let mut core = item();
    let mut notes = Vec::new();
    assert!(!core.check_pool(&view(5, 10), ctx(0, 1), &mut notes), "first sight records the generation");
    assert_eq!(
        core.report(Some(view(5, 10)), core.begin_read(), ctx(0, 1), &mut notes),
        Some(Report::Counts(view(5, 10)))
    );
    // The store restarted empty: a vanished pool is never reported as an empty one.
    assert_eq!(core.report(Some(view(0, 0)), core.begin_read(), ctx(50, 1), &mut notes), Some(Report::Lost));
    assert_eq!(core.mode(), Mode::Lost);
    assert!(!core.report_needs_read());
    assert_eq!(core.resync_at(), Some(50 + Settings::default().lost_resync_after_ms));
    assert!(matches!(notes[..], [Note::PoolLost { known: 10, now: 0 }]));
    // A lost pool neither borrows nor gives back.
    assert_eq!(core.on_look(view(0, 0), core.begin_read(), 0, ctx(60, 1), &mut notes), None);
    let (id, s) = core.submit(OpKind::Return { max: 5 }, "r".into(), ctx(70, 1));
    assert_eq!(s.finished, vec![(id, OpResult::Returned { units: 0 })]);
}

#[test]
fn a_return_takes_then_calls_under_the_epoch_of_its_take() {
    let mut core = item();
    let (id, s) = core.submit(OpKind::Return { max: 8 }, "r1".into(), ctx(0, 4));
    assert_eq!(work(&s).effect, Effect::Take { take_id: "r1".into(), max: 8, epoch: 4 });
    // A registration in between must not move the Return to the new epoch: a Return sent
    // under it could be accepted after the new incarnation's resync counted its units.
    let s = feed(&mut core, &s, Reply::Units(6), ctx(1, 5));
    assert_eq!(work(&s).effect, Effect::Return { request_id: "r1".into(), quantity: 6, epoch: 4 });
    let s = feed(&mut core, &s, Reply::Done, ctx(2, 5));
    assert_eq!(s.finished, vec![(id, OpResult::Returned { units: 6 })]);
}

#[test]
fn a_refused_return_puts_its_units_back_and_an_unknown_one_is_resynced() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Return { max: 8 }, "r1".into(), ctx(0, 4));
    let s = feed(&mut core, &s, Reply::Units(6), ctx(0, 4));
    let s = feed(&mut core, &s, Reply::Center(CallFault::Refused), ctx(0, 4));
    assert_eq!(work(&s).effect, Effect::Untake { take_id: "r1".into(), epoch: 4 });
    let s = feed(&mut core, &s, Reply::Units(6), ctx(0, 4));
    assert!(matches!(s.finished[..], [(_, OpResult::Returned { units: 0 })]));
    assert_eq!(core.resync_at(), None);

    let (_, s) = core.submit(OpKind::Return { max: 8 }, "r2".into(), ctx(0, 4));
    let s = feed(&mut core, &s, Reply::Units(6), ctx(0, 4));
    let s = feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(10, 4));
    assert!(s.next.is_none(), "units stay out of the pool: never sold twice");
    assert_eq!(core.resync_at(), Some(10 + Settings::default().resync_after_unknown_ms));
}

#[test]
fn a_registration_fences_reads_the_center_and_aligns_the_pool() {
    let mut core = item();
    let why = OpKind::Resync(ResyncWhy::Registration { epoch: 9 });
    let (id, s) = core.submit(why, "g".into(), ctx(0, 9));
    assert_eq!(work(&s).effect, Effect::RaiseFence { epoch: 9 });
    let s = feed(&mut core, &s, Reply::Fence { found: 8 }, ctx(0, 9));
    assert_eq!(work(&s).effect, Effect::Describe);
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 20, generation: 3, in_doubt: 0 }), ctx(0, 9));
    assert_eq!(work(&s).effect, Effect::ReadPool);
    let pool = PoolView { available: 5, reserved: 3, sold: 2, generation: 3 };
    let s = feed(&mut core, &s, Reply::Pool(pool), ctx(0, 9));
    assert_eq!(
        work(&s).effect,
        Effect::Refill { grant_id: "resync-g".into(), units: 10, epoch: 9, must_exist: false, after_ms: 0 }
    );
    let s = feed(&mut core, &s, Reply::Done, ctx(0, 9));
    assert_eq!(s.finished, vec![(id, OpResult::Resynced)]);
    assert!(s.notes.contains(&Note::Aligned { added: 10, removed: 0 }));
    assert_eq!(core.generation(), 3);
}

#[test]
fn a_registration_whose_epoch_the_pool_was_fenced_with_writes_nothing_and_says_so() {
    // A ledger that went back answered epoch 9 again; the pool was fenced at 9 (another
    // incarnation held it) or above: the resync stops before it reads or writes anything.
    for fence in [9, 12] {
        let mut core = item();
        let why = OpKind::Resync(ResyncWhy::Registration { epoch: 9 });
        let (id, s) = core.submit(why, "g".into(), ctx(0, 9));
        assert_eq!(work(&s).effect, Effect::RaiseFence { epoch: 9 });
        let s = feed(&mut core, &s, Reply::Fence { found: fence }, ctx(0, 9));
        assert!(s.next.is_none(), "nothing more after a fence at {fence}");
        assert_eq!(s.finished, vec![(id, OpResult::EpochReused { fence })]);
        assert!(s.notes.contains(&Note::EpochReused { epoch: 9, fence }));
    }
}

#[test]
fn a_scheduled_resync_that_is_no_longer_due_does_nothing() {
    let mut core = item();
    let (id, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(0, 1));
    assert_eq!(s.finished, vec![(id, OpResult::Resynced)]);
    assert!(s.next.is_none());
}

#[test]
fn a_lost_pool_of_an_item_the_channel_held_none_of_sells_again_after_a_resync() {
    let mut core = item();
    let mut notes = Vec::new();
    core.check_pool(&view(0, 3), ctx(0, 1), &mut notes);
    core.check_pool(&view(0, 4), ctx(0, 1), &mut notes);
    assert_eq!(core.mode(), Mode::Lost);
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(5_000, 1));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 0, generation: 3, in_doubt: 0 }), ctx(5_000, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 4)), ctx(5_000, 1));
    assert!(s.notes.contains(&Note::Unfrozen));
    assert_eq!(core.mode(), Mode::Selling);
    assert_eq!(core.generation(), 4);
}

#[test]
fn a_lost_pool_of_held_units_stays_lost_until_resolved() {
    let holding = Holding { held: 10, generation: 3, in_doubt: 0 };
    assert_eq!(resync_plan(&holding, &view(0, 0), false), ResyncPlan::Lost);
    assert_eq!(resync_plan(&holding, &view(4, 9), false), ResyncPlan::Lost);
    assert_eq!(resync_plan(&Holding { in_doubt: 2, ..holding }, &view(4, 3), false), ResyncPlan::InDoubt);
    assert_eq!(resync_plan(&holding, &view(4, 3), true), ResyncPlan::Align { target: 4 });

    let mut core = item();
    let mut notes = Vec::new();
    core.check_pool(&view(0, 3), ctx(0, 1), &mut notes);
    core.check_pool(&view(0, 0), ctx(0, 1), &mut notes);
    // The operator resolved it: align to what the channel holds now and sell again.
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Resolved), "r".into(), ctx(10, 1));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 0, generation: 3, in_doubt: 0 }), ctx(10, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 0)), ctx(10, 1));
    assert!(s.next.is_none());
    assert_eq!(core.mode(), Mode::Selling);
}

#[test]
fn a_resolution_that_cannot_ask_the_center_is_retried() {
    let mut core = item();
    core.on_in_doubt();
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Resolved), "r".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(0, 1));
    assert!(matches!(s.finished[..], [(_, OpResult::Failed)]));
    assert_eq!(core.mode(), Mode::InDoubt);
    assert!(core.needs_look(1, 1_000_000), "the pending resolution brings the rebalancer back");
    assert_eq!(core.due_resyncs(1), vec![OpKind::Resync(ResyncWhy::Resolved)]);
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Resolved), "r2".into(), ctx(2, 1));
    assert!(core.due_resyncs(3).is_empty(), "never queued twice");
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 0, generation: 0, in_doubt: 0 }), ctx(3, 1));
    feed(&mut core, &s, Reply::Pool(view(0, 0)), ctx(3, 1));
    assert_eq!(core.mode(), Mode::Selling);
}

#[test]
fn units_in_doubt_stop_sales_but_the_pool_is_reported_as_it_is() {
    let mut core = item();
    let mut notes = Vec::new();
    assert!(core.on_in_doubt());
    assert!(!core.on_in_doubt(), "news once");
    assert_eq!(core.admit("k", 1), Admission::Refuse(Refusal::InDoubt));
    assert_eq!(
        core.report(Some(view(3, 1)), core.begin_read(), ctx(0, 1), &mut notes),
        Some(Report::Counts(view(3, 1)))
    );
    let (id, s) = core.submit(OpKind::Return { max: 3 }, "r".into(), ctx(0, 1));
    assert_eq!(s.finished, vec![(id, OpResult::Returned { units: 0 })]);
}

#[test]
fn admission_checks_the_limit_the_closed_flag_and_the_fast_path() {
    let mut core = item();
    assert_eq!(core.admit("k", 3), Admission::Refuse(Refusal::OverLimit { limit: 2 }));
    assert!(matches!(core.admit("k", 1), Admission::Store { .. }));
    core.set_policy(Policy { closed: true, ..policy() });
    assert_eq!(core.admit("k", 1), Admission::SoldOut);
    core.set_policy(policy());

    core.set_center_available(0);
    let Admission::Store { shelf } = core.admit("k", 1) else { panic!("to the store") };
    assert!(core.on_sold_out(shelf, 0, true), "load the keys for the fast path");
    core.fast_path_on(["paid".to_owned()].into(), core.shelf_version());
    assert_eq!(core.admit("other", 1), Admission::SoldOut);
    assert!(matches!(core.admit("paid", 1), Admission::Store { .. }), "a replay of a key that reserved");
    // The center has stock again: the fast path is off.
    core.on_restocked(0);
    assert!(matches!(core.admit("other", 1), Admission::Store { .. }));
}

#[test]
fn the_schedule_gates_admission_and_stocking_by_the_center_clock() {
    use crate::schedule::{CenterNow, Schedule};
    let at = CenterNow::exact;
    let mut core = item();
    core.set_schedule(Schedule { opens_at_ms: 10_000, closes_at_ms: 20_000, prestock_lead_ms: 3_000 });
    assert_eq!(core.gate("k", 1, at(9_999)), Gate::NotStarted { opens_at_ms: 10_000 });
    assert!(!core.may_stock(at(6_999)) && core.may_stock(at(7_000)), "stocking starts with the lead");
    assert!(matches!(core.gate("k", 1, at(10_000)), Gate::Admit(Admission::Store { .. })));
    assert_eq!(core.gate("k", 3, at(10_000)), Gate::Admit(Admission::Refuse(Refusal::OverLimit { limit: 2 })));
    assert_eq!(core.gate("k", 1, at(20_000)), Gate::Admit(Admission::SoldOut), "closed by its schedule");
    assert!(!core.may_stock(at(20_000)));
    core.set_schedule(Schedule::default());
    assert!(matches!(core.gate("k", 1, at(0)), Gate::Admit(Admission::Store { .. })));
}

#[test]
fn an_acquire_waiting_for_its_borrow_retries_only_while_the_sale_is_open() {
    use crate::schedule::{CenterNow, Schedule};
    let at = CenterNow::exact;
    let mut core = item();
    core.set_schedule(Schedule { opens_at_ms: 10_000, closes_at_ms: 20_000, prestock_lead_ms: 3_000 });
    assert!(matches!(core.gate("k", 1, at(19_000)), Gate::Admit(Admission::Store { .. })));
    assert!(core.may_retry(at(19_999)));
    assert!(!core.may_retry(CenterNow { earliest_ms: 19_990, latest_ms: 20_000 }), "the end came during the wait");
    // The opening moved later while the Acquire waited.
    core.set_schedule(Schedule { opens_at_ms: 30_000, closes_at_ms: 40_000, prestock_lead_ms: 3_000 });
    assert!(!core.may_retry(at(19_000)));
    core.set_schedule(Schedule::default());
    assert!(core.may_retry(at(19_000)));
}

#[test]
fn before_the_opening_only_the_opening_stock_fills_the_pool_once() {
    use crate::schedule::{CenterNow, Schedule};
    let at = CenterNow::exact;
    let mut core = item();
    core.set_schedule(Schedule { opens_at_ms: 10_000, closes_at_ms: 0, prestock_lead_ms: 3_000 });
    assert!(!core.prestock_due(at(6_999)), "not before the lead");
    assert!(core.prestock_due(at(7_000)));
    assert!(!core.prestock_due(at(7_100)), "once");
    core.prestock_failed();
    assert!(core.prestock_due(at(7_200)), "again after a failure");
    // A look before the opening decides nothing, even with the pool far above high...
    let mut notes = Vec::new();
    let token = core.begin_read();
    assert_eq!(core.on_look_at(view(300, 1), token, 0, ctx(8_000, 1), at(8_000), &mut notes), None);
    let token = core.begin_read();
    assert_eq!(core.on_look_at(view(300, 1), token, 0, ctx(9_999, 1), at(9_999), &mut notes), None);
    // ... and surplus counts from the opening on.
    let token = core.begin_read();
    assert_eq!(core.on_look_at(view(300, 1), token, 0, ctx(10_000, 1), at(10_000), &mut notes), None);
    let token = core.begin_read();
    let later = 10_000 + i64::try_from(Settings::default().return_sustain_ms).unwrap();
    assert!(matches!(
        core.on_look_at(view(300, 1), token, 0, ctx(later, 1), at(later), &mut notes),
        Some(OpKind::Return { .. })
    ));
    assert!(!core.prestock_due(at(10_000)), "not once open");
}

#[test]
fn a_refill_is_never_hidden_by_an_older_sold_out_answer() {
    let mut core = item();
    core.set_center_available(0);
    let Admission::Store { shelf } = core.admit("k", 1) else { panic!("to the store") };
    // The store answers sold out, but a refill lands before the answer is recorded.
    core.stock_returned();
    assert!(!core.on_sold_out(shelf, 0, true));
    assert_eq!(core.shelf(), &Shelf::Stocked);
    assert!(matches!(core.admit("k2", 1), Admission::Store { .. }));
    // Likewise a fast path whose keys were loaded before a refill.
    let Admission::Store { shelf } = core.admit("k", 1) else { panic!("to the store") };
    assert!(core.on_sold_out(shelf, 0, true));
    let loaded_at = core.shelf_version();
    core.stock_returned();
    core.fast_path_on(Default::default(), loaded_at);
    assert_eq!(core.shelf(), &Shelf::Stocked);
}

#[test]
fn a_follower_never_marks_the_shelf_empty() {
    let mut core = item();
    let Admission::Store { shelf } = core.admit("k", 1) else { panic!("to the store") };
    assert!(!core.on_sold_out(shelf, 0, false));
    assert_eq!(core.shelf(), &Shelf::Stocked);
}

#[test]
fn a_miss_borrows_a_batch_or_what_the_call_needs_at_the_end_of_a_sale() {
    let mut core = item();
    assert_eq!(core.on_miss(1, ctx(0, 1)), MissPlan::Borrow { want: 10 });
    assert_eq!(core.on_return_requested(), OpKind::Return { max: u64::MAX });
    assert_eq!(core.on_miss(1, ctx(0, 1)), MissPlan::Borrow { want: 1 });
    core.set_center_available(0);
    assert_eq!(core.on_miss(2, ctx(0, 1)), MissPlan::Signal { want: 2 });
    assert_eq!(core.on_miss(2, ctx(100, 1)), MissPlan::Answer, "one signal per 200 ms");
    assert_eq!(core.on_miss(2, ctx(200, 1)), MissPlan::Signal { want: 2 });
}

#[test]
fn a_full_grant_with_plenty_left_ends_the_end_of_sale() {
    let mut core = item();
    core.on_return_requested();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 30 }, ctx(0, 1));
    assert!(core.supply().may_prefetch());
}

#[test]
fn the_look_borrows_below_low_and_returns_sustained_surplus_once() {
    let mut core = item();
    let mut notes = Vec::new();
    assert_eq!(
        core.on_look(view(2, 1), core.begin_read(), 0, ctx(0, 1), &mut notes),
        Some(OpKind::Borrow { want: 10 })
    );
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(0, 1));
    assert_eq!(core.on_look(view(2, 1), core.begin_read(), 0, ctx(1, 1), &mut notes), None, "one Borrow at a time");
    let s = feed(&mut core, &s, Reply::Pool(view(2, 1)), ctx(0, 1));
    core.feed(work(&s).op, Reply::Center(CallFault::Refused), ctx(0, 1));

    assert_eq!(
        core.on_look(view(50, 1), core.begin_read(), 0, ctx(1_000, 1), &mut notes),
        None,
        "above high: not yet sustained"
    );
    assert_eq!(core.on_look(view(50, 1), core.begin_read(), 0, ctx(2_500, 1), &mut notes), None);
    assert_eq!(
        core.on_look(view(50, 1), core.begin_read(), 0, ctx(3_000, 1), &mut notes),
        Some(OpKind::Return { max: 33 })
    );
    let (_, _s) = core.submit(OpKind::Return { max: 33 }, "r".into(), ctx(3_000, 1));
    assert_eq!(
        core.on_look(view(50, 1), core.begin_read(), 0, ctx(6_000, 1), &mut notes),
        None,
        "one Return at a time"
    );
}

#[test]
fn a_dry_center_stops_prefetching() {
    let mut core = ItemCore::new(policy(), 0, Settings::default());
    let mut notes = Vec::new();
    assert_eq!(core.on_look(view(0, 1), core.begin_read(), 0, ctx(0, 1), &mut notes), None);
}

#[test]
fn an_abandoned_operation_frees_the_queue_and_schedules_a_resync() {
    let mut core = item();
    let (first, s) = core.submit(OpKind::Return { max: 1 }, "r".into(), ctx(0, 1));
    let (second, _) = core.submit(OpKind::Borrow { want: 1 }, "b".into(), ctx(0, 1));
    let s2 = core.abandon(work(&s).op, ctx(5, 1));
    assert_eq!(s2.finished, vec![(first, OpResult::Failed)]);
    assert_eq!(work(&s2).op, second);
    assert!(core.resync_at().is_some());
}

#[test]
fn a_refill_failing_every_attempt_is_given_up_and_resynced() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(0, 1));
    let mut s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    for attempt in 1..Settings::default().refill_attempts {
        s = feed(&mut core, &s, Reply::Store(StoreFault::Failed), ctx(0, 1));
        let Effect::Refill { after_ms, grant_id, .. } = work(&s).effect else { panic!("a retry") };
        assert_eq!(grant_id, "b", "the same grant id on every attempt");
        assert_eq!(after_ms, 50 << attempt);
    }
    let s = feed(&mut core, &s, Reply::Store(StoreFault::Failed), ctx(0, 1));
    assert!(s.notes.contains(&Note::GrantNotRefilled { granted: 10 }));
    assert!(core.resync_at().is_some());
}

/// Units granted after the pool was reported lost are not in doubt at the center (it put
/// in doubt what the channel held when the report came): the pool must be reported lost
/// again, else they stay with the frozen channel, neither sold nor resolvable.
#[test]
fn a_grant_for_a_pool_already_reported_lost_is_reported_again() {
    let mut core = item();
    let mut notes = Vec::new();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    assert!(matches!(work(&s).effect, Effect::Borrow { .. }));
    // While the Borrow is out, the store loses the pool; a heartbeat reports it lost, and
    // the center (holding nothing of the channel yet) acknowledges it.
    assert_eq!(core.report(Some(view(0, 0)), core.begin_read(), ctx(10, 1), &mut notes), Some(Report::Lost));
    core.reported(Report::Lost, 0);
    assert!(!core.report_changed(&Report::Lost, 0));
    // The grant lands: not refilled into the lost pool, so the center must hear again.
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(20, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 0)), ctx(20, 1));
    assert!(matches!(s.finished[..], [(_, OpResult::Borrowed { granted: 0 })]));
    assert!(core.report_changed(&Report::Lost, 0), "the lost pool is reported again");
}

/// A resync that finds the pool lost while the center holds units of it not in doubt
/// (granted after the loss was reported) has the pool reported lost again.
#[test]
fn a_resync_finding_units_not_in_doubt_of_a_lost_pool_reports_it_again() {
    let mut core = item();
    let mut notes = Vec::new();
    core.check_pool(&view(0, 3), ctx(0, 1), &mut notes);
    assert_eq!(core.report(Some(view(0, 0)), core.begin_read(), ctx(0, 1), &mut notes), Some(Report::Lost));
    core.reported(Report::Lost, 0);
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(5_000, 1));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 10, generation: 3, in_doubt: 0 }), ctx(5_000, 1));
    feed(&mut core, &s, Reply::Pool(view(0, 0)), ctx(5_000, 1));
    assert_eq!(core.mode(), Mode::Lost);
    assert!(core.report_changed(&Report::Lost, 0), "the center must put those units in doubt");
    // Once every unit is in doubt, nothing more to tell.
    core.reported(Report::Lost, 0);
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s2".into(), ctx(5_000, 1));
    assert!(s.next.is_none(), "not due: the resync ran");
    let mut core2 = core.clone();
    core2.schedule_resync(0);
    let (_, s) = core2.submit(OpKind::Resync(ResyncWhy::Scheduled), "s3".into(), ctx(5_000, 1));
    let s = feed(&mut core2, &s, Reply::Holding(Holding { held: 10, generation: 3, in_doubt: 10 }), ctx(5_000, 1));
    feed(&mut core2, &s, Reply::Pool(view(0, 0)), ctx(5_000, 1));
    assert!(!core2.report_changed(&Report::Lost, 0));
}

/// A heartbeat's answer that does not list a lost pool's item in doubt (a rolled-back
/// ledger forgot the report that put its units there) has it reported again; an answer
/// that lists it, or a selling item, leaves the last report standing.
#[test]
fn a_lost_pool_the_center_no_longer_holds_in_doubt_is_reported_again() {
    let mut core = item();
    let mut notes = Vec::new();
    core.on_not_in_doubt();
    core.check_pool(&view(0, 3), ctx(0, 1), &mut notes);
    let counts = core.report(Some(view(0, 3)), core.begin_read(), ctx(0, 1), &mut notes).expect("a report");
    core.reported(counts, 0);
    core.on_not_in_doubt();
    assert!(!core.report_changed(&counts, 0), "a selling item is not reported again");
    assert_eq!(core.report(Some(view(0, 0)), core.begin_read(), ctx(10, 1), &mut notes), Some(Report::Lost));
    core.reported(Report::Lost, 0);
    assert!(core.on_in_doubt() || core.mode() == Mode::Lost);
    assert!(!core.report_changed(&Report::Lost, 0), "acknowledged, and held in doubt");
    core.on_not_in_doubt();
    assert!(core.report_changed(&Report::Lost, 0), "the center must hear of the loss again");
}

/// A pool read that began before an operation of this agent created the pool (so it saw
/// no pool) says nothing about a loss: the rebalancer's look and a heartbeat's report run
/// beside the item's operations.
#[test]
fn a_read_older_than_the_pools_creation_is_not_a_loss() {
    let mut core = item();
    let mut notes = Vec::new();
    let before = core.begin_read();
    // Meanwhile a Borrow creates the pool.
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 0)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Done, ctx(0, 1));
    feed(&mut core, &s, Reply::Pool(view(0, 7)), ctx(0, 1));
    assert_eq!(core.generation(), 7);
    // The read that began before saw no pool: neither a look nor a report calls it lost.
    assert_eq!(core.on_look(view(0, 0), before, 0, ctx(1, 1), &mut notes), None);
    assert_eq!(core.report(Some(view(0, 0)), before, ctx(1, 1), &mut notes), None);
    assert_eq!(core.mode(), Mode::Selling);
    // A read begun now that sees no pool is a loss.
    assert_eq!(core.report(Some(view(0, 0)), core.begin_read(), ctx(2, 1), &mut notes), Some(Report::Lost));
    assert_eq!(core.mode(), Mode::Lost);
}
