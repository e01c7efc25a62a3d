//! The rate-following batches of a pool, as the rules apply them.

use super::*;
use crate::watermarks::{RateBatching, Watermarks};

const FIXED: Watermarks = Watermarks { low: 5, high: 30, batch: 10 };

fn auto_item() -> ItemCore {
    let policy = Policy {
        per_user_limit: 5,
        reservation_ttl_ms: 60_000,
        watermarks: FIXED,
        rate_batching: Some(RateBatching { min_batch: 2, max_batch: 500, target_ms: 1_000 }),
        closed: false,
    };
    ItemCore::new(policy, 10_000, Settings::default())
}

fn ctx(now_ms: i64) -> Ctx {
    Ctx { now_ms, epoch: 1 }
}

/// Sells one unit every `every_ms` from `from_ms` for `n` sales; returns the last time.
fn sell(core: &mut ItemCore, from_ms: i64, every_ms: i64, n: i64) -> i64 {
    for i in 0..n {
        core.on_reserved(1, ctx(from_ms + i * every_ms));
    }
    from_ms + (n - 1) * every_ms
}

#[test]
fn a_pool_that_has_not_sold_keeps_the_fixed_watermarks() {
    let core = auto_item();
    assert_eq!(core.watermarks_at(5_000), FIXED);
    assert_eq!(core.sell_rate_milli(5_000), 0);
}

#[test]
fn the_batch_follows_the_rate_and_shrinks_when_sales_stop() {
    let mut core = auto_item();
    // 200 units/s for 3 s.
    let end = sell(&mut core, 0, 5, 600);
    let w = core.watermarks_at(end);
    assert!((180..=220).contains(&w.batch), "about one second of sales: {w:?}");
    assert_eq!((w.low, w.high), (w.batch, 3 * w.batch));
    // A minute of silence: the batch falls to the floor, so an idle pool gives its stock back.
    let quiet = core.watermarks_at(end + 60_000);
    assert_eq!(quiet, Watermarks { low: 2, high: 6, batch: 2 });
}

#[test]
fn a_miss_borrows_the_rate_batch_and_the_borrow_carries_the_rate() {
    let mut core = auto_item();
    let end = sell(&mut core, 0, 10, 300);
    let MissPlan::Borrow { want } = core.on_miss(1, ctx(end)) else { panic!("a borrow") };
    assert!((90..=110).contains(&want), "100 units/s: {want}");
    let (_, s) = core.submit(OpKind::Borrow { want }, "b".into(), ctx(end));
    let s = core.feed(s.next.unwrap().op, Reply::Pool(PoolView { generation: 3, ..PoolView::default() }), ctx(end));
    let Effect::Borrow { sell_rate_milli, quantity, .. } = s.next.unwrap().effect else { panic!("a borrow call") };
    assert_eq!(quantity, want);
    assert!((95_000..=105_000).contains(&sell_rate_milli), "{sell_rate_milli}");
}

#[test]
fn the_look_borrows_below_one_batch_and_returns_above_three() {
    let mut core = auto_item();
    let end = sell(&mut core, 0, 10, 300);
    let look = |core: &mut ItemCore, available: u64, at: i64| {
        let view = PoolView { available, reserved: 0, sold: 0, generation: 3 };
        let token = core.begin_read();
        core.on_look(view, token, 0, ctx(at), &mut Vec::new())
    };
    assert!(matches!(look(&mut core, 50, end), Some(OpKind::Borrow { want }) if want >= 90), "half a second left");
    assert_eq!(look(&mut core, 150, end), None, "between one and three batches");
    // The same pool a minute later holds far more than three batches of its decayed rate.
    let later = end + 60_000;
    assert_eq!(look(&mut core, 150, later), None, "not sustained yet");
    assert_eq!(look(&mut core, 150, later + 2_000), Some(OpKind::Return { max: 146 }), "down to two batches");
}

#[test]
fn the_rate_is_reported_again_only_when_it_moved() {
    let mut core = auto_item();
    let end = sell(&mut core, 0, 10, 3_000);
    let report = Report::Counts(PoolView { available: 3, reserved: 0, sold: 0, generation: 3 });
    let rate = core.sell_rate_milli(end);
    assert!(core.report_changed(&report, rate));
    core.reported(report, rate);
    assert!(!core.report_changed(&report, core.sell_rate_milli(end + 1_000)), "decayed by an eighth");
    // Long after the first sale the average simply halves every half-life.
    assert!(core.report_changed(&report, core.sell_rate_milli(end + 5_000)), "halved");
}

#[test]
fn at_the_end_of_a_sale_a_selling_pool_still_asks_for_its_batch() {
    let mut core = auto_item();
    let _ = core.on_return_requested();
    assert_eq!(core.on_miss(1, ctx(0)), MissPlan::Borrow { want: 1 }, "not selling yet: only what it needs");
    let end = sell(&mut core, 0, 10, 300);
    let MissPlan::Borrow { want } = core.on_miss(1, ctx(end)) else { panic!("a borrow") };
    assert!(want >= 90, "its batch, which the center shares when short: {want}");
    // Fixed watermarks keep the old rule: one unit per miss.
    let mut fixed = auto_item();
    fixed.set_policy(Policy { rate_batching: None, ..fixed.policy() });
    let _ = fixed.on_return_requested();
    sell(&mut fixed, 0, 10, 300);
    assert_eq!(fixed.on_miss(1, ctx(end)), MissPlan::Borrow { want: 1 });
}
