//! An item's sale plan as the rules apply it: the schedule, the phase by the center's
//! clock, the Acquire's gate before the opening and after the end, and the opening's
//! stocking during the prestock lead.

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

    /// The opening's stocking did not happen (the center did not answer): due again.
    pub fn prestock_failed(&mut self) {
        self.prestocked = false;
    }
}
