//! The events of a run. One step is one event drawn from the seeded PRNG; the checker
//! runs after each. Every effect of the agents' operations, every attempt and reply on
//! the network, every event heard and every retried Acquire is an event of its own, so
//! any interleaving of them with buyers, time, crashes and faults can occur.

use crate::agent::Res;
use crate::config::{HEARTBEAT_EVERY_MS, MAX_DELAY_MS, RECLAIM_GRACE_MS, Reclaims, Rivals, Violation};
use crate::world::World;

/// Event kinds and their weights.
const EVENTS: [(Event, u32); 21] = [
    (Event::Acquire, 30),
    (Event::Confirm, 8),
    (Event::Cancel, 4),
    (Event::Tick, 12),
    (Event::Rebalance, 12),
    (Event::Deliver, 22),
    (Event::Progress, 16),
    (Event::Heard, 6),
    (Event::Crash, 1),
    (Event::Stop, 1),
    (Event::Restart, 2),
    (Event::Reclaim, 3),
    (Event::AddStock, 1),
    (Event::DataLoss, 1),
    (Event::PoolRollback, 2),
    (Event::Rival, 2),
    (Event::Outage, 1),
    (Event::StoreFull, 1),
    (Event::Schedule, 2),
    (Event::LedgerRollback, 1),
    // Last: a scenario without it draws the same events from the same seed as before.
    (Event::WatchLag, 2),
];

/// What happens in one step. `Progress`: an agent carries out an effect, times out an
/// attempt, or retries an Acquire; `Heard`: an agent takes the next event off its
/// WatchChannel stream; `Rival`: a second process of a channel registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Acquire,
    Confirm,
    Cancel,
    Tick,
    Rebalance,
    Deliver,
    Progress,
    Heard,
    Crash,
    Stop,
    Restart,
    Reclaim,
    AddStock,
    DataLoss,
    /// A pool store goes back to an earlier copy of a pool (`crate::pool_rollback`).
    PoolRollback,
    Rival,
    Outage,
    StoreFull,
    /// The operator moves a schedule (`crate::schedules`).
    Schedule,
    /// The center's ledger goes back to an earlier state (`crate::rollback`).
    LedgerRollback,
    /// An agent's event stream falls behind (`World::watch_lag`).
    WatchLag,
}

/// One thing an agent can do next on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// Carry out the item's pending effect.
    Work(String),
    /// The item's call attempt times out.
    TimeOut(String),
    /// Retry the Acquire waiting in `wakeups[i]`.
    Wake(usize),
}

impl World {
    /// Starts every agent, as `inventory-agent` does at start-up.
    pub fn boot(&mut self) -> Res {
        for c in 0..self.agents.len() {
            self.restart(c)?;
        }
        Ok(())
    }

    /// One random event.
    pub fn random_step(&mut self) -> Res {
        self.keep_ledger_copy();
        let weights: Vec<u32> = EVENTS.iter().map(|(e, w)| if self.enabled(*e) { *w } else { 0 }).collect();
        let event = EVENTS[self.rng.weighted(&weights)].0;
        match event {
            Event::Acquire => self.random_acquire()?,
            Event::Confirm | Event::Cancel => self.random_finish(event == Event::Confirm)?,
            Event::Tick => {
                let ms = if self.rng.percent(8) { self.rng.range(1_500, 5_000) } else { self.rng.range(1, 250) };
                self.advance(i64::try_from(ms).expect("small"))?;
            }
            Event::Rebalance => {
                let c = self.pick(|w, c| w.looks(c)).expect("enabled");
                let item = self.pick_item();
                self.rebalance(c, &item)?;
            }
            Event::Deliver => {
                let i = self.rng.index(self.network.len());
                self.deliver(i)?;
            }
            Event::Progress => {
                let c = self.pick(|w, c| !w.actions(c).is_empty()).expect("enabled");
                self.progress(c)?;
            }
            Event::Heard => {
                let c = self.pick(|w, c| w.may_hear(c)).expect("enabled");
                self.hear(c)?;
            }
            Event::WatchLag => {
                let c = self.pick(|w, c| w.may_hear(c)).expect("enabled");
                self.watch_lag(c)?;
            }
            Event::Crash => {
                let c = self.pick(|w, c| w.agents[c].mem.is_some()).expect("enabled");
                self.crash(c);
            }
            Event::Stop => {
                let c = self.pick(|w, c| w.looks(c)).expect("enabled");
                self.stop(c)?;
            }
            Event::Restart => {
                let c = self.pick(|w, c| w.agents[c].mem.is_none()).expect("enabled");
                self.restart(c)?;
            }
            Event::Reclaim => self.random_reclaim()?,
            Event::AddStock => self.random_add_stock()?,
            Event::Rival => {
                let c = self.pick(|w, c| w.agents[c].mem.is_some()).expect("enabled");
                self.rival(c)?;
            }
            Event::Outage => {
                let ms = self.rng.range(2_000, 25_000);
                self.start_outage(i64::try_from(ms).expect("small"));
            }
            Event::StoreFull => {
                let c = self.rng.index(self.agents.len());
                let ms = i64::try_from(self.rng.range(500, 8_000)).expect("small");
                self.agents[c].store_full_until = Some(self.now_ms + ms);
                self.stats.stores_full += 1;
                self.log(format!("{}: pool store at its memory limit for {ms} ms", self.name(c)));
            }
            Event::DataLoss => {
                let c = self.rng.index(self.agents.len());
                let item = self.pick_item();
                self.lose_pool(c, &item);
            }
            Event::Schedule => self.random_reschedule(),
            Event::LedgerRollback => self.roll_ledger_back(),
            Event::PoolRollback => {
                let c = self.rng.index(self.agents.len());
                let item = self.pick_item();
                self.roll_back_pool(c, &item);
            }
        }
        self.settle_all()
    }

    fn enabled(&self, e: Event) -> bool {
        let faults = self.config.faults;
        let any = |f: &dyn Fn(&World, usize) -> bool| (0..self.agents.len()).any(|c| f(self, c));
        match e {
            Event::Acquire | Event::Tick | Event::AddStock => true,
            Event::Confirm | Event::Cancel => !self.reservations.is_empty(),
            Event::Rebalance => any(&|w, c| w.looks(c)),
            Event::Deliver => !self.network.is_empty(),
            Event::Progress => any(&|w, c| !w.actions(c).is_empty()),
            Event::Heard => any(&|w, c| w.may_hear(c)),
            Event::Crash => faults.crashes && any(&|w, c| w.agents[c].mem.is_some()),
            Event::Stop => faults.stops && any(&|w, c| w.looks(c)),
            Event::Restart => any(&|w, c| w.agents[c].mem.is_none()),
            Event::Reclaim => faults.reclaims != Reclaims::Never,
            Event::DataLoss => faults.pool_data_loss,
            Event::PoolRollback => faults.pool_rollback,
            Event::Rival => faults.rivals != Rivals::Never && any(&|w, c| w.agents[c].mem.is_some()),
            Event::Outage => faults.outages && self.center_down_until.is_none(),
            Event::StoreFull => faults.store_full,
            Event::Schedule => faults.schedules && !self.sched.plans.is_empty(),
            Event::LedgerRollback => faults.ledger_rollback && !self.ledger.snapshots.is_empty(),
            Event::WatchLag => faults.watch_lags && any(&|w, c| w.may_hear(c)),
        }
    }

    /// The agent's workers run: it started and is not shutting down.
    fn looks(&self, c: usize) -> bool {
        self.agents[c].mem.as_ref().is_some_and(|m| m.started && m.stopping.is_none())
    }

    /// The watcher reads its next event (not while it awaits an operation, nor after
    /// SIGTERM).
    fn may_hear(&self, c: usize) -> bool {
        self.agents[c]
            .mem
            .as_ref()
            .is_some_and(|m| m.started && m.stopping.is_none() && m.watcher_awaits.is_none() && !m.events.is_empty())
    }

    fn actions(&self, c: usize) -> Vec<Action> {
        let Some(mem) = self.agents[c].mem.as_ref() else { return Vec::new() };
        let mut actions = Vec::new();
        for (item, slot) in &mem.items {
            if slot.work.is_some() {
                actions.push(Action::Work(item.clone()));
            }
            if slot.call.is_some() {
                actions.push(Action::TimeOut(item.clone()));
            }
        }
        actions.extend((0..mem.wakeups.len()).map(Action::Wake));
        actions
    }

    /// The agent does one of the things it can do next, drawn from the seed.
    fn progress(&mut self, c: usize) -> Res {
        let actions = self.actions(c);
        match actions[self.rng.index(actions.len())].clone() {
            Action::Work(item) => self.perform(c, &item)?,
            Action::TimeOut(item) => self.time_out(c, &item)?,
            Action::Wake(i) => self.wake(c, i)?,
        }
        self.settle(c)
    }

    pub(crate) fn pick(&mut self, f: impl Fn(&World, usize) -> bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.agents.len()).filter(|c| f(self, *c)).collect();
        if candidates.is_empty() {
            return None;
        }
        Some(candidates[self.rng.index(candidates.len())])
    }

    pub(crate) fn pick_item(&mut self) -> String {
        let items = self.item_names();
        items[self.rng.index(items.len())].clone()
    }

    /// The operator reclaims a channel GetItem shows as expired, if any.
    fn random_reclaim(&mut self) -> Res {
        let now = self.now_ms;
        let only_stopped = self.config.faults.reclaims == Reclaims::StoppedAgents;
        let grace = i64::try_from(RECLAIM_GRACE_MS).expect("small");
        let expired = |w: &World, c: usize| {
            let lease_over =
                w.center.sessions.get(w.agents[c].name()).is_some_and(|s| now >= s.lease_expires_at_ms + grace);
            lease_over && (!only_stopped || w.agents[c].stopped_gracefully)
        };
        let c = match self.pick(expired) {
            Some(c) => c,
            // Nothing expired: the operator's call is refused (lease live), unless only
            // stopped agents may be reclaimed.
            None if only_stopped => {
                self.log("reclaim: no stopped channel whose lease expired".to_owned());
                return Ok(());
            }
            None => self.rng.index(self.agents.len()),
        };
        self.reclaim(c)
    }

    /// Time passes; every running agent whose heartbeat is due sends it (not while its
    /// heartbeat worker awaits a registration, nor after SIGTERM). With bounded delays,
    /// calls and replies whose deadline the clock is about to pass land first.
    pub fn advance(&mut self, ms: i64) -> Res {
        if self.config.faults.bounded_delays {
            let deadline = self.now_ms + ms - MAX_DELAY_MS;
            while let Some(i) = self.network.iter().position(|m| m.sent_at_ms() < deadline) {
                self.stats.late_landings += 1;
                self.deliver(i)?;
            }
        }
        self.now_ms += ms;
        self.log(format!("time +{ms} ms"));
        if self.center_down_until.is_some_and(|until| self.now_ms >= until) {
            self.end_outage();
        }
        self.close_due();
        self.sample_ledger();
        for agent in &mut self.agents {
            if agent.store_full_until.is_some_and(|until| self.now_ms >= until) {
                agent.store_full_until = None;
            }
        }
        for c in 0..self.agents.len() {
            let due = self.agents[c].mem.as_ref().is_some_and(|m| {
                m.started
                    && m.registering.is_none()
                    && m.stopping.is_none()
                    && self.now_ms - m.last_heartbeat_ms >= HEARTBEAT_EVERY_MS
            });
            if due {
                self.heartbeat(c)?;
            }
        }
        self.settle_all()
    }

    /// Without faults: deliver everything in flight, let every operation finish and every
    /// event be heard, in an order drawn from the seed. `check` runs after every sub-step.
    pub fn drain(&mut self, check: &mut dyn FnMut(&World) -> Res) -> Res {
        for _ in 0..100_000 {
            self.step += 1;
            if !self.network.is_empty() {
                let i = self.rng.index(self.network.len());
                self.deliver(i)?;
            } else if let Some(c) = self.pick(|w, c| w.may_hear(c)) {
                self.hear(c)?;
            } else if let Some(c) = self.pick(|w, c| !w.actions(c).is_empty()) {
                // Effects, retried Acquires, and attempts whose reply was lost time out.
                self.progress(c)?;
            } else {
                return Ok(());
            }
            self.settle_all()?;
            check(self)?;
        }
        Err(Violation::new("2", "no quiescence after 100000 sub-steps"))
    }
}
