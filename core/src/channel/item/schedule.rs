//! An item's sale plan as the rules apply it: the schedule, the phase by the center's
//! clock, the Acquire's gate before the opening and after the end, the opening's
//! stocking during the prestock lead, and the center's reserve after it.
//!
//! **The reserve is for misses.** While the center holds no more of a scheduled item than
//! its `center_reserve`, a pool borrows only on a miss (its shelf could not serve a
//! buyer), never to refill to its watermark: rate-following watermarks under an
//! opening's burst would otherwise pull the reserve onto the shelves of whichever pools
//! sell fastest right after the opening, a center call each, long before any pool runs
//! dry. Nor does it give surplus above its high watermark back: its shelf holds the
//! plan's opening stock, which a pool's first second of sales often exceeds three times
//! over; it comes back when the center runs short and asks every channel
//! (`ReturnRequested`, the end-of-sale return), or at the end. What the center holds is what it last said (a Borrow's answer, DescribeItem,
//! Restocked); before the opening a pool that stocked expects the reserve alone at the
//! opening (every channel stocks its allocation during the lead, and the answers of the
//! first to stock predate the others' Borrows), until the center says otherwise.

use super::*;

impl ItemCore {
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    pub fn set_schedule(&mut self, schedule: Schedule) {
        self.schedule = schedule;
    }

    /// The sale's phase at `now`, the center's clock as the driver bounds it: opened by
    /// the earliest it may read, closed by the latest (`schedule::phase_within`).
    pub fn phase(&self, now: CenterNow) -> Phase {
        crate::schedule::phase_within(&self.schedule, now)
    }

    /// The Acquire's checks at `now`: before the opening NOT_STARTED, and nothing else is
    /// asked (no store, no center); from `closes_at` on as a closed item; otherwise
    /// [`ItemCore::admit`].
    pub fn gate(&self, idempotency_key: &str, quantity: u64, now: CenterNow) -> Gate {
        match self.phase(now) {
            Phase::NotStarted { opens_at_ms } => Gate::NotStarted { opens_at_ms },
            Phase::Open => Gate::Admit(self.admit(idempotency_key, quantity)),
            Phase::Closed => Gate::Admit(match self.admit(idempotency_key, quantity) {
                Admission::Store { .. } => Admission::SoldOut,
                other => other,
            }),
        }
    }

    /// Whether an Acquire admitted earlier may try the pool again at `now` (after waiting
    /// for its Borrow, up to the miss wait): only while the sale is still open. It was
    /// admitted by [`ItemCore::gate`] before its wait; in the meantime the sale may have
    /// reached its end, or a move of the schedule heard since may have put the opening
    /// later. Otherwise the Acquire answers the miss it had.
    pub fn may_retry(&self, now: CenterNow) -> bool {
        self.phase(now) == Phase::Open
    }

    /// Whether the pool may borrow ahead of demand at `now`: not before the schedule's
    /// lead starts, nor once it closed.
    pub fn may_stock(&self, now: CenterNow) -> bool {
        self.schedule.may_stock(now.earliest_ms) && self.phase(now) != Phase::Closed
    }

    /// Whether the driver should stock the pool for the opening now (its opening
    /// allocation, in one Borrow): once, from the start of the schedule's lead until the
    /// opening, so an agent that starts during the lead stocks too.
    pub fn prestock_due(&mut self, now: CenterNow) -> bool {
        let due = !self.prestocked
            && self.mode == Mode::Selling
            && !self.segments_lost
            && matches!(self.phase(now), Phase::NotStarted { .. })
            && self.schedule.may_stock(now.earliest_ms);
        if due {
            self.prestocked = true;
        }
        due
    }

    /// The item's reserve (`DescribeItem.center_reserve`); see the module's rule.
    pub fn set_center_reserve(&mut self, reserve: u64) {
        self.center_reserve = reserve;
    }

    /// The units the center keeps back that prefetch leaves alone: the reserve of an item
    /// with an opening, 0 otherwise (then only a dry center stops prefetch).
    pub(in crate::channel) fn reserve_kept(&self) -> u64 {
        if self.schedule.opens_at_ms > 0 { self.center_reserve } else { 0 }
    }

    /// A look before the opening: a pool that stocked for it expects the center to hold
    /// its reserve alone at the opening, so it borrows only on misses from then on until
    /// the center says it holds more.
    pub(in crate::channel) fn expect_reserve_at_opening(&mut self) {
        if self.prestocked && self.center_reserve > 0 {
            self.supply.at_reserve = true;
        }
    }

    /// The opening's stocking did not happen (the center did not answer): due again.
    pub fn prestock_failed(&mut self) {
        self.prestocked = false;
    }
}
