//! Quiet heartbeats: a pool reported from its last whole read only while its stamp says
//! nothing changed, and never past the bound.

use super::tests::{ctx, item, view};
use super::*;

fn stamp(generation: u64, write_seq: u64) -> PoolStamp {
    PoolStamp { generation, write_seq }
}

/// An item whose pool (generation 42, write sequence 7) was read whole at time 1,000.
fn read_whole() -> ItemCore {
    let mut core = item();
    let report = core.report_read(Some((view(5, 42), 7)), core.begin_read(), ctx(1_000, 1), &mut Vec::new());
    assert_eq!(report, Some(Report::Counts(view(5, 42))));
    core
}

#[test]
fn an_unchanged_stamp_reports_the_last_whole_read() {
    let core = read_whole();
    let token = core.begin_read();
    assert_eq!(core.report_unchanged(stamp(42, 7), token, ctx(2_000, 1)), Some(Report::Counts(view(5, 42))));
}

#[test]
fn a_stamp_that_moved_asks_for_a_whole_read() {
    let core = read_whole();
    let token = core.begin_read();
    assert_eq!(core.report_unchanged(stamp(42, 8), token, ctx(2_000, 1)), None, "written since");
    assert_eq!(core.report_unchanged(stamp(42, 6), token, ctx(2_000, 1)), None, "went back in time");
    assert_eq!(core.report_unchanged(stamp(43, 7), token, ctx(2_000, 1)), None, "another generation");
    assert_eq!(core.report_unchanged(stamp(0, 7), token, ctx(2_000, 1)), None, "missing, or found lost");
}

#[test]
fn a_store_that_keeps_no_sequence_is_always_read_whole() {
    let mut core = item();
    core.report_read(Some((view(5, 42), 0)), core.begin_read(), ctx(1_000, 1), &mut Vec::new());
    assert_eq!(core.report_unchanged(stamp(42, 0), core.begin_read(), ctx(1_001, 1)), None);
}

#[test]
fn the_last_whole_read_is_trusted_only_within_the_bound() {
    let core = read_whole();
    let bound = Settings::default().full_read_every_ms;
    let token = core.begin_read();
    assert!(core.report_unchanged(stamp(42, 7), token, ctx(1_000 + bound - 1, 1)).is_some());
    assert_eq!(core.report_unchanged(stamp(42, 7), token, ctx(1_000 + bound, 1)), None, "at the bound");
    assert_eq!(core.report_unchanged(stamp(42, 7), token, ctx(999, 1)), None, "a clock behind the read");
}

#[test]
fn nothing_is_reported_unread_before_a_whole_read() {
    let core = item();
    assert_eq!(core.report_unchanged(stamp(42, 7), core.begin_read(), ctx(0, 1)), None);
}

#[test]
fn a_lost_pool_is_read_whole_again_once_it_is_back() {
    let mut core = read_whole();
    // The store lost the pool: the next whole read reports it lost and forgets the last.
    let lost = core.report_read(Some((view(0, 0), 9)), core.begin_read(), ctx(2_000, 1), &mut Vec::new());
    assert_eq!(lost, Some(Report::Lost));
    assert_eq!(core.report_unchanged(stamp(42, 7), core.begin_read(), ctx(2_001, 1)), None);
}

#[test]
fn a_generation_adopted_after_the_token_decides_nothing() {
    let mut core = item();
    let token = core.begin_read();
    // The pool is created meanwhile (a refill the rules saw), then read whole.
    core.report_read(Some((view(5, 42), 7)), core.begin_read(), ctx(1_000, 1), &mut Vec::new());
    assert_eq!(core.report_unchanged(stamp(42, 7), token, ctx(1_001, 1)), None);
}

#[test]
fn a_partly_lost_pool_is_always_read_whole() {
    let mut core = read_whole();
    assert!(core.on_segments_lost(ctx(1_500, 1), &mut Vec::new()));
    assert_eq!(core.report_unchanged(stamp(42, 7), core.begin_read(), ctx(2_000, 1)), None);
}

#[test]
fn each_heartbeat_reads_a_share_whole_so_every_pool_comes_round_twice_within_the_bound() {
    assert_eq!(full_reads_per_heartbeat(100_000, 3_333, 120_000), 5_555);
    assert_eq!(full_reads_per_heartbeat(2, 3_333, 120_000), 0, "a handful waits for the bound");
    assert_eq!(full_reads_per_heartbeat(10, 100_000, 120_000), 10, "never more than there are");
    assert_eq!(full_reads_per_heartbeat(10, 3_333, 0), 10, "no bound: every pool read whole");
}

// Quiet looks: a look decides from the pool's last whole look while its stamp says nothing
// changed and nothing could expire, and never past the bound.

use crate::schedule::CenterNow;

/// An item whose pool (generation 42, write sequence 7, `available` units and `reserved`
/// reserved) was looked at whole at time 1,000: above the high watermark (30) from then.
fn looked_whole(available: u64, reserved: u64) -> ItemCore {
    let mut core = item();
    let v = PoolView { available, reserved, sold: 0, generation: 42 };
    let kind = core.on_whole_look(v, 7, core.begin_read(), 0, ctx(1_000, 1), CenterNow::exact(1_000), &mut Vec::new());
    assert_eq!(kind, None, "above high only from now: nothing to give back yet");
    core
}

#[test]
fn an_idle_pool_unchanged_is_looked_at_from_its_last_whole_look_and_time_still_counts() {
    let mut core = looked_whole(40, 0);
    let sustain = Settings::default().return_sustain_ms;
    let at = 1_000 + i64::try_from(sustain).unwrap() + 1;
    assert!(core.may_look_unchanged(at));
    let token = core.begin_read();
    let read = core.look_unchanged(stamp(42, 7), token, ctx(at, 1)).expect("the last whole look's read");
    assert_eq!(read, view(40, 42));
    // Above high for longer than the sustain: the surplus goes back, as after a whole look.
    let kind = core.on_look_at(read, token, 0, ctx(at, 1), CenterNow::exact(at), &mut Vec::new());
    assert!(matches!(kind, Some(OpKind::Return { .. })), "{kind:?}");
}

#[test]
fn a_pool_that_held_reservations_is_swept_and_read_whole() {
    let core = looked_whole(20, 2);
    assert!(!core.may_look_unchanged(1_500), "a reservation may have expired since");
    assert_eq!(core.look_unchanged(stamp(42, 7), core.begin_read(), ctx(1_500, 1)), None);
}

#[test]
fn a_look_whose_stamp_moved_sweeps_and_reads_whole() {
    let core = looked_whole(20, 0);
    let token = core.begin_read();
    assert_eq!(core.look_unchanged(stamp(42, 8), token, ctx(1_500, 1)), None, "written since");
    assert_eq!(core.look_unchanged(stamp(42, 6), token, ctx(1_500, 1)), None, "went back in time");
    assert_eq!(core.look_unchanged(stamp(43, 7), token, ctx(1_500, 1)), None, "another generation");
    assert_eq!(core.look_unchanged(stamp(0, 7), token, ctx(1_500, 1)), None, "missing, or found lost");
    assert_eq!(core.look_unchanged(stamp(42, 7), token, ctx(1_500, 1)), Some(view(20, 42)));
}

#[test]
fn a_whole_look_is_trusted_only_within_its_bound() {
    let core = looked_whole(20, 0);
    let bound = Settings::default().whole_look_every_ms;
    let token = core.begin_read();
    assert!(core.look_unchanged(stamp(42, 7), token, ctx(1_000 + bound - 1, 1)).is_some());
    assert_eq!(core.look_unchanged(stamp(42, 7), token, ctx(1_000 + bound, 1)), None, "at the bound");
    assert_eq!(core.look_unchanged(stamp(42, 7), token, ctx(999, 1)), None, "a clock behind the look");
}

#[test]
fn a_lost_or_partly_lost_pool_is_always_looked_at_whole() {
    let mut lost = looked_whole(20, 0);
    let kind = lost.on_whole_look(
        view(0, 0),
        9,
        lost.begin_read(),
        0,
        ctx(2_000, 1),
        CenterNow::exact(2_000),
        &mut Vec::new(),
    );
    assert_eq!(kind, None);
    assert_eq!(lost.look_unchanged(stamp(42, 7), lost.begin_read(), ctx(2_001, 1)), None, "lost");

    let mut part = looked_whole(20, 0);
    assert!(part.on_segments_lost(ctx(1_500, 1), &mut Vec::new()));
    assert_eq!(part.look_unchanged(stamp(42, 7), part.begin_read(), ctx(2_000, 1)), None, "partly lost");
}

#[test]
fn a_store_that_keeps_no_sequence_is_always_looked_at_whole() {
    let mut core = item();
    core.on_whole_look(view(20, 42), 0, core.begin_read(), 0, ctx(1_000, 1), CenterNow::exact(1_000), &mut Vec::new());
    assert!(!core.may_look_unchanged(1_001));
    assert_eq!(core.look_unchanged(stamp(42, 0), core.begin_read(), ctx(1_001, 1)), None);
}
