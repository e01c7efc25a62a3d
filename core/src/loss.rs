//! The loss rule of heartbeat reports: when a channel's report says its pool store lost
//! the pool, everything the channel holds of the item goes in doubt (invariant 8). The
//! center runs [`apply_report`] inside the transaction that stores the report.

use crate::ledger::{Allocation, PoolCounts, mark_lost};

/// One pool as a heartbeat reports it: totals, the generation the pool store gave the
/// pool when it created it, and whether the agent found the pool lost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolReport {
    pub counts: PoolCounts,
    pub generation: u64,
    pub lost: bool,
    /// The pool's sell rate (units/s × 1000); a lost pool sells nothing.
    pub sell_rate_milli: u64,
    /// How many segments of a segmented pool the store lost while the others are intact;
    /// `counts` are the intact ones'. 0: the pool is whole (or wholly `lost`).
    pub lost_segments: u32,
}

impl PoolReport {
    /// Some segments lost, the others intact (see [`apply_report`]).
    pub fn partly_lost(&self) -> bool {
        self.lost_segments > 0 && !self.lost
    }

    /// The generation the center keeps from this report: none (0) from a partly lost
    /// pool, which comes back whole under a new one.
    pub fn kept_generation(&self) -> u64 {
        if self.partly_lost() { 0 } else { self.generation }
    }
}

/// Whether applying the report may change what the channel holds in doubt (so the center
/// applies it under the item's row lock).
pub fn report_touches_doubt(alloc: &Allocation, report: &PoolReport) -> bool {
    report.partly_lost() || report_loses_pool(alloc, report)
}

/// The loss rule: a pool is lost when its agent says so, or when it comes with another
/// generation (0 included) than the non-zero one the channel last reported: the pool
/// store lost the pool and something recreated it (or nothing did).
pub fn report_loses_pool(alloc: &Allocation, report: &PoolReport) -> bool {
    report.lost || (alloc.generation != 0 && report.generation != alloc.generation)
}

/// Applies one report to the channel's allocation: a lost pool ([`report_loses_pool`])
/// puts everything the channel holds of the item in doubt ([`mark_lost`]); then the
/// report's totals and generation are kept. Returns `None` when the pool is not lost,
/// else the units now in doubt (0: lost while the channel held nothing of it).
///
/// A report of a pool with some segments lost (`lost_segments`) puts in doubt what the
/// channel holds beyond what the intact segments account for: the lost segments' units,
/// exactly, because the agent neither borrows nor returns the item meanwhile and reports
/// only reads no operation changed. Computed afresh from each such report, so a later
/// one (after an operator settled the doubt) agrees with the settlement. The generation
/// is forgotten (0): the pool comes back whole under a new one, which is then no loss.
pub fn apply_report(alloc: &mut Allocation, report: &PoolReport, now_ms: i64) -> Option<u64> {
    let lost = if report.partly_lost() {
        let doubt = alloc.held().saturating_sub(report.counts.sum());
        let grew = doubt > alloc.in_doubt;
        alloc.in_doubt = doubt;
        grew.then_some(doubt)
    } else {
        report_loses_pool(alloc, report).then(|| {
            mark_lost(alloc);
            alloc.in_doubt
        })
    };
    alloc.reported = report.counts;
    alloc.reported_at_ms = now_ms;
    alloc.generation = report.kept_generation();
    alloc.sell_rate_milli = if report.lost { 0 } else { report.sell_rate_milli };
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quantity;
    use crate::ledger::{ItemState, borrow};

    fn q(n: u64) -> Quantity {
        Quantity::parse("quantity", n).unwrap()
    }

    fn report(available: u64, generation: u64, lost: bool) -> PoolReport {
        PoolReport {
            counts: PoolCounts { available, reserved: 0, sold: 0 },
            generation,
            lost,
            sell_rate_milli: 0,
            lost_segments: 0,
        }
    }

    #[test]
    fn a_pool_is_lost_when_said_or_when_its_generation_changes() {
        let never = Allocation::default();
        assert!(!report_loses_pool(&never, &report(0, 5, false)), "a first generation is no loss");
        assert!(report_loses_pool(&never, &report(0, 0, true)), "the agent says so");
        let known = Allocation { generation: 5, ..Default::default() };
        assert!(!report_loses_pool(&known, &report(3, 5, false)));
        assert!(report_loses_pool(&known, &report(0, 6, false)), "recreated");
        assert!(report_loses_pool(&known, &report(0, 0, false)), "vanished");
    }

    #[test]
    fn a_lost_report_puts_what_the_channel_holds_in_doubt_then_keeps_the_report() {
        let mut item = ItemState::new(q(100), 1, 1000);
        let mut a = Allocation::default();
        borrow(&mut item, &mut a, q(10));
        assert_eq!(apply_report(&mut a, &report(10, 5, false), 7), None);
        assert_eq!((a.reported.available, a.generation, a.reported_at_ms), (10, 5, 7));
        assert_eq!(apply_report(&mut a, &report(0, 6, false), 8), Some(10));
        assert_eq!((a.in_doubt, a.reported, a.generation), (10, PoolCounts::default(), 6));
        assert_eq!(apply_report(&mut a, &report(0, 6, false), 9), None, "the new pool is the one now known");
        assert_eq!(a.in_doubt, 10);
        let mut empty = Allocation::default();
        assert_eq!(apply_report(&mut empty, &report(0, 0, true), 1), Some(0), "lost holding nothing");
    }

    #[test]
    fn a_report_with_lost_segments_puts_only_what_the_intact_ones_miss_in_doubt() {
        let mut item = ItemState::new(q(100), 1, 1000);
        let mut a = Allocation::default();
        borrow(&mut item, &mut a, q(40));
        assert_eq!(apply_report(&mut a, &report(40, 5, false), 1), None);
        // One of four segments lost with its 10 units; the intact ones hold 30 (12 sold).
        let part = PoolReport {
            counts: PoolCounts { available: 15, reserved: 3, sold: 12 },
            lost_segments: 1,
            ..report(0, 5, false)
        };
        assert_eq!(apply_report(&mut a, &part, 2), Some(10));
        assert_eq!((a.in_doubt, a.held(), a.reported.sum(), a.generation), (10, 40, 30, 0));
        assert_eq!(a.drift(), 10, "the lost units are the drift, and all in doubt");
        assert_eq!(apply_report(&mut a, &part, 3), None, "the same report again changes nothing");
        assert_eq!(a.in_doubt, 10);
        // The operator settles: held 30; the same report (sent before the agent heard)
        // now finds nothing in doubt.
        crate::ledger::resolve_in_doubt(&mut item, &mut a, &crate::Channel::parse("channel", "app").unwrap(), 4)
            .unwrap();
        assert_eq!((a.held(), a.in_doubt), (30, 0));
        assert_eq!(apply_report(&mut a, &part, 4), None);
        assert_eq!(a.in_doubt, 0);
        // Whole again under a new generation: not a loss, the center had forgotten the old.
        assert_eq!(apply_report(&mut a, &report(30, 77, false), 5), None);
        assert_eq!((a.in_doubt, a.generation), (0, 77));
    }
}
