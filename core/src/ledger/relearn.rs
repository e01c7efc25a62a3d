//! A ledger that went back in time (an asynchronous standby promoted, a backup restored)
//! counts fewer units with a channel than its pool holds: grants the pool shelved were
//! lost with the commits that recorded them. The pools are the witnesses of what they
//! shelved: the center re-learns the lost grants from a channel's report, out of its own
//! `available` (which still counts those units as lendable), before it lends any of the
//! item again.

use super::{Allocation, ItemState};

/// What re-learning a channel's lost grants did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relearned {
    /// `units` moved from the center's available to the channel's granted.
    Units(u64),
    /// The channel's report no longer exceeds what it holds (a report in flight was
    /// counted meanwhile): nothing to learn.
    Nothing,
    /// The center has fewer units available than the pools hold beyond their grants: those
    /// units were lent twice before the loss was seen (an oversell already happened). The
    /// center learns what it can; `short` units stay beyond the ledger.
    Short { units: u64, short: u64 },
}

/// Re-learns up to `expected` units the channel's last report holds beyond its grants.
/// `expected` is the excess the caller saw as stuck: if the report moved since, nothing is
/// learned (the next look decides again).
pub fn relearn(item: &mut ItemState, alloc: &mut Allocation, expected: u64) -> Relearned {
    let beyond = u64::try_from(-i128::from(alloc.drift()).min(0)).unwrap_or(u64::MAX);
    if beyond == 0 || beyond != expected {
        return Relearned::Nothing;
    }
    let units = beyond.min(item.available);
    item.available -= units;
    alloc.granted = alloc.granted.saturating_add(units);
    if units < beyond { Relearned::Short { units, short: beyond - units } } else { Relearned::Units(units) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Quantity;
    use crate::ledger::{PoolCounts, check_item};

    fn item(total: u64, available: u64) -> ItemState {
        let mut s = ItemState::new(Quantity::parse("total", total).expect("valid"), 1, 60_000);
        s.available = available;
        s
    }

    fn alloc(granted: u64, reported: u64) -> Allocation {
        Allocation { granted, reported: PoolCounts { available: reported, ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn lost_grants_are_learned_back_from_the_pools_report() {
        // 100 units; the channel's pool shelved 60, the restored ledger remembers 40 granted.
        let mut s = item(100, 60);
        let mut a = alloc(40, 60);
        assert_eq!(relearn(&mut s, &mut a, 20), Relearned::Units(20));
        assert_eq!((s.available, a.held(), a.drift()), (40, 60, 0));
        assert!(check_item("i", &s, &[("c".to_owned(), a)]).violations.is_empty());
    }

    #[test]
    fn a_report_that_moved_since_it_was_seen_teaches_nothing() {
        let mut s = item(100, 60);
        let mut a = alloc(40, 50);
        assert_eq!(relearn(&mut s, &mut a, 20), Relearned::Nothing);
        assert_eq!((s.available, a.granted), (60, 40));
        let mut a = alloc(40, 40);
        assert_eq!(relearn(&mut s, &mut a, 0), Relearned::Nothing);
    }

    #[test]
    fn units_lent_twice_before_the_loss_was_seen_are_short() {
        let mut s = item(100, 5);
        let mut a = alloc(40, 60);
        assert_eq!(relearn(&mut s, &mut a, 20), Relearned::Short { units: 5, short: 15 });
        assert_eq!((s.available, a.held()), (0, 45));
    }
}
