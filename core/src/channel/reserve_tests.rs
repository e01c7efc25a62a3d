//! The center's reserve of a scheduled item: while the center holds no more than it, a
//! pool borrows only on misses, never to refill to its (rate-following) watermarks.

use super::tests::{ctx, view};
use super::*;
use crate::schedule::{CenterNow, Schedule};
use crate::watermarks::{RateBatching, Watermarks};

const OPENS: i64 = 10_000;

/// A scheduled item whose batches follow its rate, its center keeping 50 units.
fn planned(center_available: u64) -> ItemCore {
    let policy = Policy {
        per_user_limit: 5,
        reservation_ttl_ms: 60_000,
        watermarks: Watermarks { low: 5, high: 30, batch: 10 },
        rate_batching: Some(RateBatching { min_batch: 2, max_batch: 500, target_ms: 1_000 }),
        closed: false,
    };
    let mut core = ItemCore::new(policy, center_available, Settings::default());
    core.set_schedule(Schedule { opens_at_ms: OPENS, closes_at_ms: 0, prestock_lead_ms: 3_000 });
    core.set_center_reserve(50);
    core.set_center_available(center_available);
    core
}

/// A burst of `n` sales in the second before `at_ms`.
fn burst(core: &mut ItemCore, at_ms: i64, n: i64) {
    for i in 0..n {
        core.on_reserved(1, ctx(at_ms - 1_000 + i * 1_000 / n, 1));
    }
}

fn look(core: &mut ItemCore, available: u64, at_ms: i64) -> Option<OpKind> {
    let token = core.begin_read();
    core.on_look_at(view(available, 1), token, 0, ctx(at_ms, 1), CenterNow::exact(at_ms), &mut Vec::new())
}

#[test]
fn at_the_reserve_a_pool_borrows_on_misses_only() {
    let mut core = planned(50);
    assert!(core.supply().at_reserve && !core.supply().center_dry);
    burst(&mut core, OPENS + 1_000, 1_000);
    let low = core.watermarks_at(OPENS + 1_000).low;
    assert!(low > 100, "the burst raised the low watermark to {low}");
    assert_eq!(look(&mut core, low - 1, OPENS + 1_000), None, "no refill from the reserve");
    // A miss still borrows (its batch, which the center shares by rate when short).
    assert!(matches!(core.on_miss(1, ctx(OPENS + 1_000, 1)), MissPlan::Borrow { .. }));
    // The center holds more again (a Return elsewhere, stock added): prefetch resumes.
    core.on_restocked(400);
    assert!(!core.supply().at_reserve);
    assert!(matches!(look(&mut core, low - 1, OPENS + 1_010), Some(OpKind::Borrow { .. })));
    core.set_center_available(50);
    assert!(core.supply().at_reserve, "a Borrow's answer at the reserve stops it again");
}

#[test]
fn a_pool_stocked_for_the_opening_expects_the_reserve_alone_at_the_opening() {
    // The first channel to stock heard the center with 650 left: the others had not
    // stocked yet.
    let mut core = planned(650);
    assert!(!core.supply().at_reserve);
    assert!(core.prestock_due(CenterNow::exact(OPENS - 2_000)));
    assert_eq!(look(&mut core, 300, OPENS - 1_000), None);
    assert!(core.supply().at_reserve, "every channel stocks its allocation in the lead");
    burst(&mut core, OPENS + 1_000, 1_000);
    let low = core.watermarks_at(OPENS + 1_000).low;
    assert_eq!(look(&mut core, low - 1, OPENS + 1_000), None, "no refill from the reserve after the opening");
    // A channel that did not stock (it came late) expects nothing and borrows as ever.
    let mut late = planned(650);
    assert_eq!(look(&mut late, 0, OPENS - 1_000), None);
    assert!(!late.supply().at_reserve);
    burst(&mut late, OPENS + 1_000, 1_000);
    assert!(matches!(look(&mut late, 0, OPENS + 1_000), Some(OpKind::Borrow { .. })));
}

#[test]
fn an_unscheduled_item_prefetches_until_the_center_is_dry() {
    let mut core = planned(50);
    core.set_schedule(Schedule::default());
    core.set_center_available(50);
    assert!(!core.supply().at_reserve, "the reserve only counts for an item with an opening");
    burst(&mut core, 1_000, 1_000);
    assert!(matches!(look(&mut core, 1, 1_000), Some(OpKind::Borrow { .. })));
}

#[test]
fn at_the_reserve_the_opening_stock_stays_on_the_shelf() {
    let mut core = planned(50);
    let sustain = i64::try_from(Settings::default().return_sustain_ms).unwrap();
    assert_eq!(look(&mut core, 800, OPENS), None);
    assert_eq!(look(&mut core, 800, OPENS + sustain + 1), None, "far above high, but the plan put it there");
    // The center holds more than its reserve again: surplus goes back as ever.
    core.set_center_available(400);
    assert!(matches!(look(&mut core, 800, OPENS + 2 * sustain + 2), Some(OpKind::Return { .. })));
}
