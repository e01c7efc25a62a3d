//! A write's answer is a read: a Borrow's open and refill answered with the pool as the
//! write left it stand for the reads that would follow them, and for the whole read the
//! next heartbeat and look would otherwise make.

use super::tests::{ctx, feed, item, view, work};
use super::*;
use crate::schedule::CenterNow;

fn stamp(generation: u64, write_seq: u64) -> PoolStamp {
    PoolStamp { generation, write_seq }
}

fn wrote(available: u64, generation: u64, write_seq: u64) -> Reply {
    Reply::Wrote { view: view(available, generation), write_seq }
}

/// A first Borrow of 10 into a pool the store does not have yet, every write answered
/// with the pool; ends at time 4 with the pool at 10 units, generation 42, sequence 3.
fn stocked() -> ItemCore {
    let mut core = item();
    let (id, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 0)), ctx(1, 1));
    assert_eq!(work(&s).effect, Effect::OpenPool { grant_id: "open-b1".into(), epoch: 1 });
    // The open's answer is the read that would follow it: straight to the center.
    let s = feed(&mut core, &s, wrote(0, 42, 2), ctx(2, 1));
    assert!(matches!(work(&s).effect, Effect::Borrow { quantity: 10, .. }), "{:?}", s.next);
    assert_eq!(core.generation(), 42);
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(3, 1));
    assert_eq!(work(&s).effect, Effect::ReadPool, "the pool may have been lost while the Borrow was out");
    let s = feed(&mut core, &s, Reply::Pool(view(0, 42)), ctx(3, 1));
    let s = feed(&mut core, &s, wrote(10, 42, 3), ctx(4, 1));
    assert_eq!(s.finished, vec![(id, OpResult::Borrowed { granted: 10 })]);
    core
}

/// A Borrow of 10 into the pool of generation 42, granted in full and checked: the step
/// that asks for the refill.
fn at_refill() -> (ItemCore, Step) {
    let mut core = item();
    let (_, s) = core.submit(OpKind::Borrow { want: 10 }, "b1".into(), ctx(0, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 42)), ctx(1, 1));
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, ctx(2, 1));
    let s = feed(&mut core, &s, Reply::Pool(view(0, 42)), ctx(2, 1));
    assert!(matches!(work(&s).effect, Effect::Refill { units: 10, must_exist: true, .. }), "{:?}", s.next);
    (core, s)
}

#[test]
fn a_refill_answered_with_the_pool_is_reported_from_its_stamp() {
    let core = stocked();
    assert_eq!(core.last_view(), Some(view(10, 42)));
    let token = core.begin_read();
    assert_eq!(core.report_unchanged(stamp(42, 3), token, ctx(5, 1)), Some(Report::Counts(view(10, 42))));
    assert_eq!(core.report_unchanged(stamp(42, 4), token, ctx(5, 1)), None, "written since the refill");
    let bound = Settings::default().full_read_every_ms;
    assert_eq!(core.report_unchanged(stamp(42, 3), token, ctx(4 + bound, 1)), None, "past the bound");
}

#[test]
fn a_refill_answered_with_the_pool_is_looked_at_from_its_stamp() {
    let mut core = stocked();
    assert!(core.may_look_unchanged(5));
    let token = core.begin_read();
    let read = core.look_unchanged(stamp(42, 3), token, ctx(5, 1));
    assert_eq!(read, Some(view(10, 42)));
    // The rules decide from it as from a whole look: stocked, nothing to do.
    let kind = core.on_look_at(read.unwrap(), token, 0, ctx(5, 1), CenterNow::exact(5), &mut Vec::new());
    assert_eq!(kind, None);
    assert_eq!(core.look_unchanged(stamp(42, 4), token, ctx(5, 1)), None, "written since the refill");
}

#[test]
fn a_refill_that_left_reservations_is_looked_at_whole() {
    let (mut core, s) = at_refill();
    let reserved = PoolView { available: 10, reserved: 2, sold: 0, generation: 42 };
    feed(&mut core, &s, Reply::Wrote { view: reserved, write_seq: 9 }, ctx(3, 1));
    // A reservation may expire: only a sweep can tell, so the look is whole.
    assert!(!core.may_look_unchanged(4));
    // The heartbeat may still report it from its stamp: the counts are the pool's.
    let token = core.begin_read();
    assert_eq!(core.report_unchanged(stamp(42, 9), token, ctx(4, 1)), Some(Report::Counts(reserved)));
}

#[test]
fn an_answer_of_another_generation_stands_for_nothing() {
    let (mut core, s) = at_refill();
    // The pool was lost and created anew between the check and the refill.
    feed(&mut core, &s, wrote(10, 43, 1), ctx(3, 1));
    let token = core.begin_read();
    assert_eq!(core.report_unchanged(stamp(43, 1), token, ctx(4, 1)), None);
    assert!(!core.may_look_unchanged(4));
}

#[test]
fn an_answer_with_no_sequence_stands_for_nothing() {
    let (mut core, s) = at_refill();
    feed(&mut core, &s, wrote(10, 42, 0), ctx(3, 1));
    assert_eq!(core.report_unchanged(stamp(42, 0), core.begin_read(), ctx(4, 1)), None);
}

#[test]
fn a_resync_takes_a_write_answer_as_the_write_done() {
    let mut core = stocked();
    let (id, s) = core.submit(OpKind::Resync(ops::ResyncWhy::Resolved), "g1".into(), ctx(10, 1));
    assert_eq!(work(&s).effect, Effect::Describe);
    let holding = Holding { held: 25, generation: 42, in_doubt: 0 };
    let s = feed(&mut core, &s, Reply::Holding(holding), ctx(11, 1));
    assert_eq!(work(&s).effect, Effect::ReadPool);
    let s = feed(&mut core, &s, Reply::Pool(view(10, 42)), ctx(12, 1));
    assert!(matches!(work(&s).effect, Effect::Refill { units: 15, must_exist: false, .. }), "{:?}", s.next);
    let s = feed(&mut core, &s, wrote(25, 42, 4), ctx(13, 1));
    assert_eq!(s.finished, vec![(id, OpResult::Resynced)]);
}
