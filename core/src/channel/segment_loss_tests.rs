//! Part of a pool lost (some segments of a segmented item): the intact part sells, no
//! stock moves, the center hears the intact part, and the lost part is reopened only once
//! nothing about it is in doubt any more.

use super::*;
use crate::channel::ops::Reply;
use crate::watermarks::Watermarks;

fn item() -> ItemCore {
    let policy = Policy {
        per_user_limit: 2,
        reservation_ttl_ms: 60_000,
        watermarks: Watermarks { low: 5, high: 30, batch: 10 },
        rate_batching: None,
        closed: false,
    };
    let mut core = ItemCore::new(policy, 100, Settings::default());
    // The pool known under generation 9, 20 units in it.
    let token = core.begin_read();
    core.on_look(view(20, 9), token, 0, ctx(0), &mut Vec::new());
    assert_eq!(core.generation(), 9);
    core
}

fn ctx(now_ms: i64) -> Ctx {
    Ctx { now_ms, epoch: 1 }
}

fn view(available: u64, generation: u64) -> PoolView {
    PoolView { available, reserved: 0, sold: 0, generation }
}

fn feed(core: &mut ItemCore, step: &Step, reply: Reply, now_ms: i64) -> Step {
    core.feed(step.next.as_ref().expect("an effect").op, reply, ctx(now_ms))
}

fn lose_part(core: &mut ItemCore) {
    let mut notes = Vec::new();
    assert!(core.on_segments_lost(ctx(10), &mut notes));
    assert!(!core.on_segments_lost(ctx(11), &mut notes), "news once");
    assert_eq!(notes, vec![Note::SegmentsLost]);
}

#[test]
fn the_intact_part_sells_but_nothing_is_borrowed_or_given_back() {
    let mut core = item();
    lose_part(&mut core);
    assert!(matches!(core.admit("k", 1), Admission::Store { .. }), "the intact part sells");
    assert_eq!(core.on_miss(1, ctx(20)), MissPlan::Answer, "a miss borrows nothing");
    let token = core.begin_read();
    assert_eq!(core.on_look(view(0, 9), token, 0, ctx(30), &mut Vec::new()), None, "below low: no Borrow");
    let token = core.begin_read();
    assert_eq!(core.on_look(view(500, 9), token, 0, ctx(40), &mut Vec::new()), None, "above high: no Return");
    let (id, s) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(50));
    assert_eq!(s.finished, vec![(id, OpResult::Borrowed { granted: 0 })]);
    let (id, s) = core.submit(OpKind::Return { max: 10 }, "r".into(), ctx(50));
    assert_eq!(s.finished, vec![(id, OpResult::Returned { units: 0 })]);
    assert!(!core.on_in_doubt(), "the center's doubt is the lost part's: the rest sells on");
    assert_eq!(core.mode(), Mode::Selling);
}

#[test]
fn a_report_is_only_made_of_a_read_no_operation_changed_the_pool_under() {
    let mut core = item();
    // A Borrow runs when the loss is found: its refill may land after a read.
    let (_, borrow) = core.submit(OpKind::Borrow { want: 10 }, "b".into(), ctx(5));
    lose_part(&mut core);
    let token = core.begin_read();
    assert_eq!(core.report(Some(view(12, 9)), token, ctx(12), &mut Vec::new()), None, "an operation runs");
    let s = feed(&mut core, &borrow, Reply::Pool(view(12, 9)), 13);
    let s = feed(&mut core, &s, Reply::Granted { granted: 10, center_available: 90 }, 14);
    let s = feed(&mut core, &s, Reply::Pool(view(12, 9)), 15);
    let s = feed(&mut core, &s, Reply::Done, 16);
    assert!(!core.busy() && s.next.is_none());
    assert_eq!(core.report(Some(view(12, 9)), token, ctx(17), &mut Vec::new()), None, "read before the refill");
    let token = core.begin_read();
    assert_eq!(core.report(Some(view(22, 9)), token, ctx(18), &mut Vec::new()), Some(Report::Counts(view(22, 9))));
}

#[test]
fn the_lost_part_waits_for_the_operator_then_is_reopened_and_the_new_generation_adopted() {
    let mut core = item();
    lose_part(&mut core);
    assert!(core.resync_at().is_some(), "the center is asked soon whether anything was lost");
    // The center counts 8 of the 20 held in doubt: the resync waits for the operator.
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(5_000));
    assert_eq!(s.next.as_ref().unwrap().effect, Effect::Describe);
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 20, generation: 0, in_doubt: 8 }), 5_001);
    let s = feed(&mut core, &s, Reply::Pool(view(12, 9)), 5_002);
    assert!(matches!(s.finished[..], [(_, OpResult::Resynced)]) && s.next.is_none());
    assert!(core.segments_lost() && core.resync_at().is_none(), "nothing more until the operator acts");

    // The operator wrote 8 off: held 12, nothing in doubt. The resolution reopens the lost
    // part, reads the pool whole again and adopts its generation.
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Resolved), "r".into(), ctx(6_000));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 12, generation: 0, in_doubt: 0 }), 6_001);
    let s = feed(&mut core, &s, Reply::Pool(view(12, 9)), 6_002);
    assert_eq!(s.next.as_ref().unwrap().effect, Effect::OpenPool { grant_id: "reopen-r".into(), epoch: 1 });
    // A look or a report reading the reopened pool before the resync adopts its generation
    // decides nothing (it is no loss); nor does one that began before the reopening.
    let early = core.begin_read();
    let s = feed(&mut core, &s, Reply::Done, 6_003);
    assert_eq!(s.next.as_ref().unwrap().effect, Effect::ReadPool);
    let during = core.begin_read();
    assert_eq!(core.on_look(view(12, 31), during, 0, ctx(6_003), &mut Vec::new()), None);
    assert_eq!(core.report(Some(view(12, 31)), during, ctx(6_003), &mut Vec::new()), None);
    assert_eq!(core.mode(), Mode::Selling, "a reopened part is no loss");
    let s = feed(&mut core, &s, Reply::Pool(view(12, 31)), 6_004);
    assert_eq!(s.notes, vec![Note::Unfrozen]);
    for stale in [early, during] {
        assert_eq!(core.report(Some(view(12, 31)), stale, ctx(6_005), &mut Vec::new()), None, "a read of before");
    }
    let token = core.begin_read();
    assert_eq!(core.report(Some(view(12, 31)), token, ctx(6_005), &mut Vec::new()), Some(Report::Counts(view(12, 31))));
    assert!(matches!(s.finished[..], [(_, OpResult::Resynced)]), "{s:?}");
    assert!(!core.segments_lost());
    assert_eq!((core.generation(), core.mode()), (31, Mode::Selling));
    assert!(matches!(core.on_miss(1, ctx(6_010)), MissPlan::Borrow { .. }), "borrowing again");
}

#[test]
fn a_lost_part_that_held_nothing_is_reopened_once_the_center_heard_of_it() {
    let mut core = item();
    let token = core.begin_read();
    let before = core.report(Some(view(20, 9)), token, ctx(1), &mut Vec::new()).unwrap();
    core.reported(before, 0);
    assert!(!core.report_changed(&before, 0));
    lose_part(&mut core);
    assert!(core.report_changed(&before, 0), "the same counts are reported again, now naming the lost part");
    // The center has not heard of the loss yet (its generation is the old one): wait.
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s".into(), ctx(5_000));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 20, generation: 9, in_doubt: 0 }), 5_001);
    let s = feed(&mut core, &s, Reply::Pool(view(20, 9)), 5_002);
    assert!(s.next.is_none() && core.segments_lost());
    assert!(core.resync_at().is_some(), "asked again");
    // It has (generation 0), and nothing is in doubt: the intact part accounts for all 20.
    let (_, s) = core.submit(OpKind::Resync(ResyncWhy::Scheduled), "s2".into(), ctx(7_000));
    let s = feed(&mut core, &s, Reply::Holding(Holding { held: 20, generation: 0, in_doubt: 0 }), 7_001);
    let s = feed(&mut core, &s, Reply::Pool(view(20, 9)), 7_002);
    assert!(matches!(s.next.as_ref().unwrap().effect, Effect::OpenPool { .. }));
    let s = feed(&mut core, &s, Reply::Done, 7_003);
    feed(&mut core, &s, Reply::Pool(view(20, 40)), 7_004);
    assert_eq!((core.segments_lost(), core.generation(), core.mode()), (false, 40, Mode::Selling));
}

#[test]
fn losing_the_whole_pool_after_a_part_is_the_lost_pool() {
    let mut core = item();
    lose_part(&mut core);
    let token = core.begin_read();
    core.on_look(view(0, 0), token, 0, ctx(100), &mut Vec::new());
    assert_eq!((core.mode(), core.segments_lost()), (Mode::Lost, false));
    assert!(!core.on_segments_lost(ctx(101), &mut Vec::new()), "a lost pool is not partly lost");
}
