//! Sharing a short supply by the channels' sell rates.
//!
//! When the center cannot satisfy a Borrow in full, first come, first served would hand
//! the tail of a sale to whichever channel asks first, big batch and all, while a busier
//! channel starves. Instead each short Borrow gets the asking channel's share of what is
//! left, by the rates the channels last reported: `available × rate_c / Σ rates` (the sum
//! over channels with a live lease and a rate above 0, the asking one included), at least
//! one unit so a channel with a tiny rate still makes progress. What a share leaves at the
//! center is shared again on the next Borrow, so nothing is stranded there: every unit is
//! granted as long as somebody asks (invariant 7), and the fast channel, asking more
//! often, takes most of it.

use super::{Allocation, ItemState, borrow};
use crate::ids::Quantity;

/// The channels' reported rates as one short Borrow sees them (units/s × 1000).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateShare {
    /// The asking channel's rate.
    pub own_milli: u64,
    /// The rates of the other channels with a live lease.
    pub others_milli: u64,
}

/// How many of `available` units a Borrow of `quantity` gets. Full when there is enough,
/// or when rates are unknown (the asking channel's or everybody else's: first come, first
/// served, as without rates); else the channel's share, at least 1, at most `quantity`.
pub fn share_of(quantity: u64, available: u64, rates: RateShare) -> u64 {
    let full = quantity.min(available);
    if quantity <= available || rates.own_milli == 0 || rates.others_milli == 0 {
        return full;
    }
    let all = u128::from(rates.own_milli) + u128::from(rates.others_milli);
    let share = u128::from(available) * u128::from(rates.own_milli) / all;
    u64::try_from(share).unwrap_or(u64::MAX).clamp(1, full.max(1)).min(full)
}

/// [`borrow`] of the asking channel's share ([`share_of`]) when the supply is short.
pub fn borrow_shared(item: &mut ItemState, alloc: &mut Allocation, quantity: Quantity, rates: RateShare) -> u64 {
    let n = share_of(quantity.get(), item.available, rates);
    match Quantity::parse("quantity", n) {
        Ok(q) => borrow(item, alloc, q),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(own: u64, others: u64) -> RateShare {
        RateShare { own_milli: own, others_milli: others }
    }

    #[test]
    fn enough_stock_or_unknown_rates_grant_in_full() {
        assert_eq!(share_of(50, 100, rates(1, 10)), 50, "not short");
        assert_eq!(share_of(50, 30, rates(0, 10)), 30, "own rate unknown");
        assert_eq!(share_of(50, 30, rates(10, 0)), 30, "nobody else sells");
        assert_eq!(share_of(50, 0, rates(10, 10)), 0, "nothing left");
    }

    #[test]
    fn a_short_supply_is_shared_by_rate() {
        assert_eq!(share_of(500, 110, rates(10_000, 1_000)), 100, "the fast channel: 10/11");
        assert_eq!(share_of(500, 110, rates(1_000, 10_000)), 10, "the slow channel: 1/11");
        assert_eq!(share_of(5, 110, rates(10_000, 1_000)), 5, "never more than asked");
        assert_eq!(share_of(500, 3, rates(1, 10_000)), 1, "at least one unit");
        assert_eq!(share_of(500, 3, rates(u64::MAX, u64::MAX)), 1, "no overflow");
    }

    #[test]
    fn a_sale_at_ten_to_one_ends_ten_to_one_with_nothing_stranded() {
        // Each tick the fast channel sells 10 units and the slow one 1; a pool that cannot
        // cover its next tick borrows five ticks' worth, from a center short from the start.
        let mut item = ItemState::new(Quantity::parse("total", 1_100).unwrap(), 1, 1);
        let mut allocs = [Allocation::default(), Allocation::default()];
        let (rate, mut pool, mut sold, mut calls) = ([10_000, 1_000], [0u64; 2], [0u64; 2], [0u64; 2]);
        for _ in 0..1_000 {
            for c in 0..2 {
                let per_tick = rate[c] / 1_000;
                if pool[c] < per_tick && item.available > 0 {
                    let rates = RateShare { own_milli: rate[c], others_milli: rate[1 - c] };
                    let q = Quantity::parse("quantity", per_tick * 5).unwrap();
                    pool[c] += borrow_shared(&mut item, &mut allocs[c], q, rates);
                    calls[c] += 1;
                }
                let n = pool[c].min(per_tick);
                pool[c] -= n;
                sold[c] += n;
            }
        }
        assert_eq!((item.available, pool), (0, [0, 0]), "every unit granted and sold");
        assert_eq!(sold[0] + sold[1], 1_100);
        assert!((900..=1_050).contains(&sold[0]), "fast {} slow {} (calls {calls:?})", sold[0], sold[1]);
    }
}
