//! Scheduled sales in the simulation: items created with an opening in the future, a
//! prestock lead, a center reserve and sometimes an end; the operator moving the schedule
//! before the opening and the end after it (an early close); the center closing an item
//! when its `closes_at` comes (`center/src/closer.rs`: the closed flag, the schedule told
//! to every channel, then the end-of-sale return); and each agent's clock, skewed from
//! the center's by a few seconds, bounded as `agent/src/link` measures it
//! (`schedule::CenterClock` from every registration and heartbeat answer).
//!
//! The world's clock is the center's. An agent's clock runs `skew_ms` ahead of it (drawn
//! per channel, ±[`MAX_SKEW_MS`]); a measurement's round trip is drawn up to
//! [`MAX_ROUND_TRIP_MS`] and the center reads its clock somewhere inside it. Agents decide
//! with their bounds ([`World::center_now`]); the checker judges every reservation by the
//! center's clock and schedule ([`World::judge_reservation`]).

use std::collections::BTreeMap;

use inventory_core::channel::{OpId, OpKind, OpResult};
use inventory_core::schedule::{self, CenterClock, CenterNow, Phase, Schedule};

use crate::agent::{Awaiter, Res};
use crate::center::CenterEvent;
use crate::config::Violation;
use crate::world::World;

/// How far an agent's clock may run from the center's (either way).
pub const MAX_SKEW_MS: u64 = 3_000;
/// The longest round trip of a registration or heartbeat that measures the clock.
pub const MAX_ROUND_TRIP_MS: u64 = 60;

/// An item's plan at the center (`items` columns of migration 0010) and whether the
/// center closed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub schedule: Schedule,
    pub reserve: u64,
    /// Closed by its schedule (`closer.rs`): nothing is sold any more.
    pub closed: bool,
    /// The opening has been counted (for the statistics).
    pub opened: bool,
}

/// The schedules of a run and the agents' clocks.
#[derive(Debug, Clone, Default)]
pub struct Schedules {
    /// Item -> its plan; items without an entry are on sale from the start.
    pub plans: BTreeMap<String, Plan>,
    /// Channel -> how far its agent's clock runs ahead of the center's.
    pub skew_ms: Vec<i64>,
    /// Channel -> the running incarnation's last measurement (volatile: keyed by the
    /// incarnation that measured it).
    pub clocks: BTreeMap<usize, (u64, CenterClock)>,
    /// Running opening stocks: (channel, item, operation).
    pub prestocks: Vec<(usize, String, OpId)>,
    /// Reservations made against the schedule by the center's clock while the agent's
    /// own copy of the schedule and its clock bounds allowed them: the clock rule broken.
    pub breaches: Vec<String>,
}

impl Schedules {
    pub fn plan(&self, item: &str) -> Option<&Plan> {
        self.plans.get(item)
    }
}

impl World {
    /// With [`crate::Faults::schedules`]: each item is scheduled with even odds (an
    /// opening 0.5–8 s ahead, a lead of 0.2–3 s, a reserve up to a third of the stock, an
    /// end 2–20 s after the opening one time in three), and each channel's clock is
    /// skewed. Drawn after the world, so a seed's items and channels stay what they were.
    pub(crate) fn plan_schedules(&mut self) {
        if !self.config.faults.schedules {
            return;
        }
        let max = i64::try_from(MAX_SKEW_MS).expect("small");
        self.sched.skew_ms = (0..self.agents.len())
            .map(|_| i64::try_from(self.rng.range(0, 2 * MAX_SKEW_MS + 1)).expect("small") - max)
            .collect();
        for name in self.item_names() {
            if !self.rng.percent(50) {
                continue;
            }
            let total = self.center.item(&name).state.total;
            let opens_at_ms = self.now_ms + ms(self.rng.range(500, 8_000));
            let closes_at_ms = if self.rng.percent(33) { opens_at_ms + ms(self.rng.range(2_000, 20_000)) } else { 0 };
            let prestock_lead_ms = self.rng.range(200, 3_000);
            let reserve = self.rng.range(0, total / 3 + 1);
            let schedule = Schedule { opens_at_ms, closes_at_ms, prestock_lead_ms };
            self.sched.plans.insert(name.clone(), Plan { schedule, reserve, closed: false, opened: false });
            self.stats.scheduled_items += 1;
            self.log(format!("{name} scheduled: {schedule:?}, reserve {reserve}"));
        }
        let skews = self.sched.skew_ms.clone();
        self.log(format!("agents' clocks ahead of the center's by {skews:?} ms"));
    }

    /// The schedule an agent loads with the item (DescribeItem carries it): the center's.
    pub(crate) fn loaded_schedule(&self, item: &str) -> Schedule {
        self.sched.plan(item).map_or_else(Schedule::default, |p| p.schedule)
    }

    /// An answer carrying the center's time reached agent `c` (a registration, a
    /// heartbeat): the link's new measurement of the center's clock.
    pub(crate) fn measure_clock(&mut self, c: usize) {
        if !self.config.faults.schedules {
            return;
        }
        let Some(incarnation) = self.agents[c].mem.as_ref().map(|m| m.incarnation) else { return };
        let round_trip = ms(self.rng.range(1, MAX_ROUND_TRIP_MS + 1));
        let read_after = ms(self.rng.range(0, u64::try_from(round_trip).expect("positive") + 1));
        let local_received = self.now_ms + self.sched.skew_ms[c];
        let clock =
            CenterClock::measure(local_received - round_trip, local_received, self.now_ms - round_trip + read_after);
        self.sched.clocks.insert(c, (incarnation, clock));
    }

    /// The center's time as agent `c` bounds it now (`CenterLink::center_now`): unknown
    /// before its incarnation's first measurement. With the deliberately broken clock rule,
    /// the agent's own clock taken for the center's.
    pub(crate) fn center_now(&self, c: usize) -> CenterNow {
        if !self.config.faults.schedules {
            return CenterNow::exact(self.now_ms);
        }
        let local = self.now_ms + self.sched.skew_ms[c];
        if self.config.breakage.trust_agent_clock {
            return CenterNow::exact(local);
        }
        let incarnation = self.agents[c].mem.as_ref().map(|m| m.incarnation);
        match self.sched.clocks.get(&c) {
            Some((inc, clock)) if Some(*inc) == incarnation => clock.bounds(local),
            _ => CenterNow::UNKNOWN,
        }
    }

    /// `Stocking::prestock` once `ItemCore::prestock_due` said so: DescribeItem for the
    /// channel's opening allocation (the center splits the total less its reserve over the
    /// channels whose lease is live, 0 once opened), then one Borrow of what the channel
    /// does not hold yet. A DescribeItem that is lost or meets an outage, or a Borrow that
    /// does not end with a grant, makes it due again.
    pub(crate) fn prestock(&mut self, c: usize, item: &str) -> Res {
        let lost = !self.calm() && self.rng.percent(self.config.faults.lose_request_pct);
        if self.center_down() || lost {
            self.log(format!("{}/{item}: opening stock: the center did not answer", self.name(c)));
            self.slot(c, item).core.prestock_failed();
            return Ok(());
        }
        let plan = *self.sched.plan(item).expect("a scheduled item");
        let now = self.now_ms;
        let want = if plan.closed || plan.schedule.opens_at_ms <= now {
            0
        } else {
            self.center.opening_allocation(item, plan.reserve, self.agents[c].name(), now)
        }
        .saturating_sub(self.center.held(item, self.agents[c].name()));
        self.log(format!("{}/{item}: opening stock: borrows {want}", self.name(c)));
        if want == 0 {
            return Ok(());
        }
        self.stats.prestocks += 1;
        let op = self.submit(c, item, OpKind::Borrow { want }, Awaiter::Nobody)?;
        self.sched.prestocks.push((c, item.to_owned(), op));
        Ok(())
    }

    /// An operation ended: an opening stock that was not granted is due again.
    pub(crate) fn prestock_ended(&mut self, c: usize, item: &str, op: OpId, result: &OpResult) {
        let Some(i) = self.sched.prestocks.iter().position(|(pc, pi, po)| *pc == c && pi == item && *po == op) else {
            return;
        };
        self.sched.prestocks.remove(i);
        if !matches!(result, OpResult::Borrowed { .. }) {
            self.slot(c, item).core.prestock_failed();
        }
    }

    /// A crashed or exited process's opening stocks end with it.
    pub(crate) fn forget_prestocks(&mut self, c: usize) {
        self.sched.prestocks.retain(|(pc, _, _)| *pc != c);
    }

    /// The operator moves a schedule (`SetSchedule`): before the opening both times (an
    /// opening 0.3–6 s ahead, the end kept relative to it); after it only the end, most
    /// often earlier (an early close, 1 ms–1 s ahead), else later. The center tells every
    /// channel (`ScheduleChanged`).
    pub(crate) fn random_reschedule(&mut self) {
        let now = self.now_ms;
        let open: Vec<String> = self.sched.plans.iter().filter(|(_, p)| !p.closed).map(|(n, _)| n.clone()).collect();
        if open.is_empty() {
            return;
        }
        let item = open[self.rng.index(open.len())].clone();
        let current = self.sched.plans[&item].schedule;
        let (opens_at, closes_at, early) = if current.opened(now) {
            let early = self.rng.percent(70);
            let closes_at =
                if early { now + ms(self.rng.range(1, 1_000)) } else { now + ms(self.rng.range(1_000, 10_000)) };
            (current.opens_at_ms, closes_at, early && (current.closes_at_ms == 0 || closes_at < current.closes_at_ms))
        } else {
            let opens_at = now + ms(self.rng.range(300, 6_000));
            let closes_at = match current.closes_at_ms {
                0 => 0,
                end => opens_at + (end - current.opens_at_ms),
            };
            (opens_at, closes_at, false)
        };
        match schedule::reschedule(&current, opens_at, closes_at, now) {
            Ok(moved) => {
                let plan = self.sched.plans.get_mut(&item).expect("chosen");
                plan.schedule = moved;
                if current.opened(now) {
                    self.stats.ends_moved += 1;
                    self.stats.early_closes += u64::from(early);
                } else {
                    self.stats.reschedules += 1;
                }
                self.center.outbox.push(CenterEvent::ScheduleChanged { item: item.clone(), schedule: moved });
                self.log(format!("operator moves {item}'s schedule: {current:?} -> {moved:?}"));
            }
            Err(e) => self.log(format!("operator moves {item}'s schedule: refused {e:?}")),
        }
        self.fan_out();
    }

    /// The center's clock moved: openings are counted, and items whose end came close
    /// (`closer.rs`: the schedule told to every channel, then the end-of-sale return).
    pub(crate) fn close_due(&mut self) {
        let now = self.now_ms;
        let mut closing = Vec::new();
        for (name, plan) in &mut self.sched.plans {
            if !plan.opened && !plan.closed && plan.schedule.opened(now) {
                plan.opened = true;
                self.stats.openings += 1;
            }
            if !plan.closed && plan.schedule.closes_at_ms > 0 && plan.schedule.closes_at_ms <= now {
                plan.closed = true;
                closing.push((name.clone(), plan.schedule));
            }
        }
        for (item, schedule) in closing {
            self.stats.closes_by_schedule += 1;
            self.log(format!("the center closes {item} (closes_at {})", schedule.closes_at_ms));
            self.center.outbox.push(CenterEvent::ScheduleChanged { item: item.clone(), schedule });
            self.center.outbox.push(CenterEvent::ReturnRequested { item, starving: String::new() });
        }
        self.fan_out();
    }

    /// Whether the center closed the item by its schedule.
    pub fn closed_by_schedule(&self, item: &str) -> bool {
        self.sched.plan(item).is_some_and(|p| p.closed)
    }

    /// A new reservation of agent `c` was made now: by the center's clock and schedule
    /// the item must be open. One made before `opens_at` or from `closes_at` on is a
    /// breach of the clock rule if the agent's own copy of the schedule, at its bounds of
    /// the center's clock, forbade it too (it should not have sold); it is counted as sold
    /// on a stale schedule if the agent had not heard the move yet (the notification's
    /// window).
    pub(crate) fn judge_reservation(&mut self, c: usize, item: &str) {
        let Some(plan) = self.sched.plan(item).copied() else { return };
        let now = self.now_ms;
        let truth = schedule::phase(&plan.schedule, now);
        if truth == Phase::Open {
            return;
        }
        let Some(slot) = self.agents[c].mem.as_ref().and_then(|m| m.items.get(item)) else { return };
        let known = slot.core.schedule();
        let agent_saw = schedule::phase_within(&known, self.center_now(c));
        if known != plan.schedule && agent_saw == Phase::Open {
            self.stats.sold_on_stale_schedule += 1;
            self.log(format!("{}/{item}: reserved at {now} on a schedule not heard yet ({truth:?})", self.name(c)));
            return;
        }
        let skew = self.sched.skew_ms.get(c).copied().unwrap_or(0);
        self.sched.breaches.push(format!(
            "{}/{item} reserved at center time {now} while the sale is {truth:?} by the center's clock \
             (schedule {:?}; the agent's clock is {skew} ms ahead, its bounds {:?}, its schedule {known:?})",
            self.name(c),
            plan.schedule,
            self.center_now(c),
        ));
    }
}

/// The schedule checks of every step: nothing reserved before `opens_at` nor from
/// `closes_at` on, by the center's clock (the clock rule; numbered S in reports).
pub fn check_schedules(w: &World) -> Result<(), Violation> {
    match w.sched.breaches.first() {
        Some(b) => Err(Violation::new("S", b.clone())),
        None => Ok(()),
    }
}

fn ms(n: u64) -> i64 {
    i64::try_from(n).expect("simulated durations are small")
}
