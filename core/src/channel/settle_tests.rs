//! The rules for calls of unknown outcome (settled by replay before a resync reads the
//! center's holding) and for a store that refuses writes (grants given back, no Borrow).

use super::tests::{ctx, feed, item, view, work};
use super::*;
use crate::channel::ops::Reply;

#[test]
fn after_a_lost_borrow_reply_an_empty_pool_is_not_sold_out_until_settled() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(100, 1));
    assert!(core.unsettled(), "the grant may sit with the channel");
    // The center answers again (a later Borrow: it has none left, the channel holds them).
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b2".into(), ctx(200, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(200, 1));
    feed(&mut core, &s, Reply::Granted { granted: 0, center_available: 0 }, ctx(300, 1));
    assert!(core.unsettled());
    assert_eq!(core.resync_at(), Some(300), "settled now, not 5 s after the lost reply");
    assert_eq!(core.due_resyncs(300), vec![OpKind::Resync(ResyncWhy::Scheduled)]);
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(300, 1));
    // First the lost call is replayed under its own id, quantity and epoch.
    assert_eq!(
        work(&s).effect,
        Effect::Borrow { request_id: "b1".into(), quantity: 10, epoch: 1, sell_rate_milli: 0 },
        "the replay of the call of unknown outcome"
    );
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 0 }, ctx(300, 1));
    assert!(s.notes.contains(&Note::Settled { borrow: true }));
    // Answered for (no attempt of it can land later), but the grant is not on the shelf
    // until this resync aligns the pool: an empty pool still proves nothing.
    assert!(core.unsettled(), "unsettled for the selling side until the pool is aligned");
    assert_eq!(work(&s).effect, Effect::Describe);
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 10, generation: 3, in_doubt: 0 }), ctx(300, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(300, 1));
    assert!(matches!(work(&s).effect, Effect::Refill { units: 10, .. }));
    feed(&mut core, &s, Reply::Done, ctx(300, 1));
    assert!(!core.unsettled());
    assert_eq!(core.resync_at(), None);
}

/// A Borrow the agent gave up on may be applied whenever an attempt reaches the center (a
/// database that comes back, a process that resumes), also after the resync that followed.
/// The resync replays it first, so it is applied or refused before the holding is read,
/// and the holding the pool is aligned to is final.
#[test]
fn a_call_the_center_does_not_answer_for_stays_unsettled_and_is_replayed_again() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(100, 1));
    let at = core.resync_at().expect("a resync");
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s1".into(), ctx(at, 1));
    assert!(matches!(&work(&s).effect, Effect::Borrow { request_id, .. } if request_id == "b1"));
    // The center is still down: the holding is read anyway (it may answer that).
    let s = feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(at, 1));
    assert_eq!(work(&s).effect, Effect::Describe);
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 0, generation: 3, in_doubt: 0 }), ctx(at, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(at, 1));
    assert!(s.next.is_none() && s.finished.len() == 1, "aligned: nothing to move");
    assert!(core.unsettled(), "the call is still not answered for");
    let again = core.resync_at().expect("settled at the next resync");
    assert!(again > at);
    // The late attempt lands at the center now; the next resync's replay hears its answer.
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s2".into(), ctx(again, 1));
    assert!(matches!(&work(&s).effect, Effect::Borrow { request_id, .. } if request_id == "b1"));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 5 }, ctx(again, 1));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 10, generation: 3, in_doubt: 0 }), ctx(again, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(again, 1));
    assert!(matches!(work(&s).effect, Effect::Refill { units: 10, .. }), "the late grant reaches the shelf");
    feed(&mut core, &s, Reply::Done, ctx(again, 1));
    assert!(!core.unsettled());
}

#[test]
fn an_unsettled_return_keeps_a_resync_from_adding_back_until_it_is_answered_for() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Return { max: 5 }, "r".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Units(5), ctx(0, 1));
    feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(100, 1));
    assert!(core.unsettled());
    let at = core.resync_at().expect("a resync");
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(at, 1));
    assert_eq!(work(&s).effect, Effect::Return { request_id: "r".into(), quantity: 5, epoch: 1 });
    // Not answered: the center still counts the 5 units, but the Return may land later.
    let s = feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(at, 1));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 10, generation: 3, in_doubt: 0 }), ctx(at, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(5, 3)), ctx(at, 1));
    assert!(s.next.is_none(), "re-adding units whose Return then lands would sell them twice");
    // Answered by the replay: applied, so the holding drops and nothing is added.
    let again = core.resync_at().expect("settled at the next resync");
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s2".into(), ctx(again, 1));
    let s = feed(&mut core, &s, Reply::Done, ctx(again, 1));
    assert!(s.notes.contains(&Note::Settled { borrow: false }));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 5, generation: 3, in_doubt: 0 }), ctx(again, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(5, 3)), ctx(again, 1));
    assert!(s.next.is_none());
    assert!(!core.unsettled());
    assert_eq!(core.resync_at(), None);
}

#[test]
fn a_registration_settles_a_call_of_unknown_outcome_before_it_aligns() {
    let mut core = item();
    // A Borrow's reply was lost: a late attempt may still land.
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(0, 1));
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Registration { epoch: 2 }), "g".into(), ctx(10, 2));
    let s = feed(&mut core, &s, Reply::Fence { found: 1 }, ctx(10, 2));
    // The fence is up; the lost call is replayed under its own (now stale) epoch: the
    // center answers the first answer if it applied, else refuses it for good.
    assert_eq!(work(&s).effect, Effect::Borrow { request_id: "b1".into(), quantity: 10, epoch: 1, sell_rate_milli: 0 });
    let s = feed(&mut core, &s, Reply::Center(CallFault::Refused), ctx(10, 2));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 20, generation: 3, in_doubt: 0 }), ctx(10, 2));
    let s = feed(&mut core, &s, Reply::Pool(view(4, 3)), ctx(10, 2));
    assert!(matches!(work(&s).effect, Effect::Refill { units: 16, must_exist: false, .. }));
    let s = feed(&mut core, &s, Reply::Done, ctx(10, 2));
    assert!(s.notes.contains(&Note::Aligned { added: 16, removed: 0 }));
    assert!(!core.unsettled(), "answered for, and the pool aligned with the holding that counts it");
}

#[test]
fn while_a_return_is_not_answered_for_a_registration_only_removes_units() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Return { max: 6 }, "r1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Units(6), ctx(0, 1));
    feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(0, 1));
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Registration { epoch: 2 }), "g".into(), ctx(10, 2));
    let s = feed(&mut core, &s, Reply::Fence { found: 1 }, ctx(10, 2));
    let s = feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(10, 2));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 20, generation: 3, in_doubt: 0 }), ctx(10, 2));
    let s = feed(&mut core, &s, Reply::Pool(view(14, 3)), ctx(10, 2));
    assert!(s.next.is_none(), "nothing added while the Return may still land");
    assert!(core.resync_at().is_some(), "the scheduled resync settles it");
    // ... which replays it when due, hears it applied, and finds nothing missing.
    let at = core.resync_at().expect("scheduled");
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(at, 2));
    let s = feed(&mut core, &s, Reply::Done, ctx(at, 2));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 14, generation: 3, in_doubt: 0 }), ctx(at, 2));
    let s = feed(&mut core, &s, Reply::Pool(view(14, 3)), ctx(at, 2));
    assert!(s.next.is_none());
    assert_eq!(core.resync_at(), None);
}

/// A store at its memory limit refuses every refill before writing: the grant can never
/// land, so it goes back to the center under its own request id, and no Borrow is made
/// while the store keeps refusing (each would only strand more units at the center).
#[test]
fn a_grant_the_store_refuses_to_shelve_goes_back_and_borrowing_pauses() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(0, 1));
    let mut s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    for _ in 1..Settings::default().refill_attempts {
        s = feed(&mut core, &s, Reply::Store(StoreFault::Refused), ctx(0, 1));
        assert!(matches!(work(&s).effect, Effect::Refill { .. }), "retried while attempts remain");
    }
    let s = feed(&mut core, &s, Reply::Store(StoreFault::Refused), ctx(10, 1));
    assert_eq!(work(&s).effect, Effect::Return { request_id: "back-b".into(), quantity: 10, epoch: 1 });
    let s = feed(&mut core, &s, Reply::Done, ctx(20, 1));
    assert!(s.notes.contains(&Note::GrantGivenBack { granted: 10 }));
    assert_eq!(s.finished.len(), 1);
    assert!(!core.unsettled() && core.resync_at().is_none(), "nothing left to settle");
    // While the store refuses writes, a Borrow does not go out and a miss borrows nothing.
    assert!(core.store_refusing(100));
    let (id, s) = core.submit(OpKind::Borrow { want: 10 }, "b2".into(), ctx(100, 1));
    assert_eq!(s.finished, vec![(id, OpResult::Borrowed { granted: 0 })]);
    assert!(s.next.is_none(), "no center call");
    assert_eq!(core.on_miss(1, ctx(100, 1)), MissPlan::Answer);
    // Later, it borrows again.
    let later = 10 + Settings::default().store_refused_pause_ms;
    assert!(!core.store_refusing(later));
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b3".into(), ctx(later, 1));
    assert_eq!(work(&s).effect, Effect::ReadPool);
}

/// A refill that failed without a definite refusal may have landed: its grant is never
/// given back (the pool could then sell units the center lent again).
#[test]
fn a_grant_whose_refill_may_have_landed_is_not_given_back() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(0, 1));
    let mut s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    for _ in 1..Settings::default().refill_attempts {
        s = feed(&mut core, &s, Reply::Store(StoreFault::Refused), ctx(0, 1));
    }
    let s = feed(&mut core, &s, Reply::Store(StoreFault::Failed), ctx(0, 1));
    assert!(s.next.is_none(), "no Return: the last attempt's outcome is unknown");
    assert!(s.notes.contains(&Note::GrantNotRefilled { granted: 10 }));
    assert!(core.resync_at().is_some(), "a resync settles it with the center's view");
}

/// The give-back's outcome is unknown: it is a Return like any other, replayed until the
/// center answers for it, and no resync adds the units back meanwhile.
#[test]
fn a_give_back_of_unknown_outcome_is_settled_by_its_replay() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(0, 1));
    let mut s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(0, 1));
    for _ in 0..Settings::default().refill_attempts {
        s = feed(&mut core, &s, Reply::Store(StoreFault::Refused), ctx(0, 1));
    }
    feed(&mut core, &s, Reply::Center(CallFault::Unknown), ctx(0, 1));
    assert!(core.unsettled());
    let at = core.resync_at().expect("scheduled");
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(at, 1));
    assert_eq!(work(&s).effect, Effect::Return { request_id: "back-b".into(), quantity: 10, epoch: 1 });
    let s = feed(&mut core, &s, Reply::Done, ctx(at, 1));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 0, generation: 3, in_doubt: 0 }), ctx(at, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 3)), ctx(at, 1));
    assert!(s.next.is_none(), "pool and holding agree");
    assert!(!core.unsettled());
}

/// A Return whose Center call was refused and whose undo the store then refused (at its
/// memory limit) or failed: the units are out of the pool and still the channel's at the
/// center. A resync puts them back; without one they would be stranded for good.
#[test]
fn units_taken_for_a_return_that_neither_went_back_nor_came_back_are_resynced() {
    let after = Settings::default().resync_after_unknown_ms;
    for fault in [StoreFault::Refused, StoreFault::Failed] {
        let mut core = item();
        let (_, s) = core.submit(OpKind::Return { max: 8 }, "r1".into(), ctx(0, 4));
        let s = feed(&mut core, &s, Reply::Units(6), ctx(0, 4));
        let s = feed(&mut core, &s, Reply::Center(CallFault::Refused), ctx(0, 4));
        let s = feed(&mut core, &s, Reply::Store(fault), ctx(10, 4));
        assert!(matches!(s.finished[..], [(_, OpResult::Returned { units: 0 })]));
        assert!(s.notes.contains(&Note::StoreFailed { what: "untake" }), "{fault:?}: {:?}", s.notes);
        assert_eq!(core.resync_at(), Some(10 + after), "{fault:?}");
        assert_eq!(core.due_resyncs(10 + after), vec![OpKind::Resync(ops::ResyncWhy::Scheduled)]);
    }
    // Fenced: a later incarnation took the pool over, and its resync counts the units.
    let mut core = item();
    let (_, s) = core.submit(OpKind::Return { max: 8 }, "r1".into(), ctx(0, 4));
    let s = feed(&mut core, &s, Reply::Units(6), ctx(0, 4));
    let s = feed(&mut core, &s, Reply::Center(CallFault::Refused), ctx(0, 4));
    feed(&mut core, &s, Reply::Store(StoreFault::Fenced), ctx(10, 4));
    assert_eq!(core.resync_at(), None);
}

/// A take whose answer was lost may have landed: resynced. One the store refused took
/// nothing: not.
#[test]
fn a_take_of_unknown_outcome_is_resynced_and_a_refused_one_is_not() {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Return { max: 8 }, "r1".into(), ctx(0, 4));
    feed(&mut core, &s, Reply::Store(StoreFault::Refused), ctx(10, 4));
    assert_eq!(core.resync_at(), None);
    let (_, s) = core.submit(OpKind::Return { max: 8 }, "r2".into(), ctx(20, 4));
    let s = feed(&mut core, &s, Reply::Store(StoreFault::Failed), ctx(20, 4));
    assert!(matches!(s.finished[..], [(_, OpResult::Returned { units: 0 })]));
    assert_eq!(core.resync_at(), Some(20 + Settings::default().resync_after_unknown_ms));
}

/// A registration's resync that did not finish (the store refused the fence, say): the
/// channel may go on under the new epoch, so the pool is aligned by a scheduled resync,
/// which does not raise the fence again (a fence at the epoch would read as an epoch
/// handed out twice).
#[test]
fn a_registration_whose_resync_failed_is_aligned_later() {
    let after = Settings::default().resync_after_unknown_ms;
    let mut core = item();
    let why = OpKind::Resync(ops::ResyncWhy::Registration { epoch: 9 });
    let (id, s) = core.submit(why, "g".into(), ctx(100, 9));
    assert_eq!(work(&s).effect, Effect::RaiseFence { epoch: 9 });
    let s = feed(&mut core, &s, Reply::Store(StoreFault::Refused), ctx(100, 9));
    assert_eq!(s.finished, vec![(id, OpResult::Failed)]);
    assert_eq!(core.resync_at(), Some(100 + after));
    let kinds = core.due_resyncs(100 + after);
    assert_eq!(kinds, vec![OpKind::Resync(ops::ResyncWhy::Scheduled)]);
    let (_, s) = core.submit(kinds[0], "s".into(), ctx(100 + after, 9));
    assert_eq!(work(&s).effect, Effect::Describe, "aligned from the center's holding, no fence");
    // An earlier resync asked for stands.
    let mut core = item();
    let (_, s) = core.submit(OpKind::Return { max: 8 }, "r".into(), ctx(0, 9));
    feed(&mut core, &s, Reply::Store(StoreFault::Failed), ctx(0, 9));
    let (_, s) = core.submit(why, "g".into(), ctx(1_000, 9));
    feed(&mut core, &s, Reply::Store(StoreFault::Failed), ctx(1_000, 9));
    assert_eq!(core.resync_at(), Some(after));
}
