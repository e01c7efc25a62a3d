//! The events of a run: buyers, time, the agents' workers and calls, the network, crashes,
//! operators. Each handler mirrors one path of the real code and says which.
//!
//! One step is one event drawn from the seeded PRNG; the checker runs after each. The
//! agent's concurrent tasks are modelled as explicit in-flight operations ([`Op`]) whose
//! progress (send, retry after a deadline, apply a grant) is itself a step, so any
//! interleaving of tasks, replies and crashes can occur. Each item's `borrow_lock` is
//! modelled too: an [`Op`] holds it from the start of its Borrow to the refill, or from
//! the take of its Return to the center's answer; everything else that needs it (another
//! Borrow, a Return, a registration's resync, `resync_item`, an in-doubt resolution)
//! queues as a [`Waiter`] and runs, in arrival order, as soon as it is free
//! (`World::settle`). A task waiting for the lock or a call does nothing else meanwhile
//! (see [`Task`]).

use std::collections::{BTreeSet, VecDeque};

use inventory_core::Channel;
use inventory_core::ledger::PoolCounts;
use inventory_core::rebalance::{self, Action, Inputs};

use crate::world::{
    AcquireArgs, AcquireResult, AgentMem, Answer, CenterEvent, Fenced, HEARTBEAT_EVERY_MS, HeartbeatAnswer, Holding,
    ItemFlags, KeyUse, LINK_ATTEMPTS, LOST_POOL_RESYNC_AFTER_MS, MAX_DELAY_MS, MISS_WAIT_MS, Message, Miss, Op, OpKind,
    Phase, Pool, RECORD_RETENTION_MS, RESYNC_AFTER_UNKNOWN_MS, RETURN_SUSTAIN_MS, Reclaims, Refill, Refusal,
    Registration, Report, ReservationState, Rivals, STARVING_SIGNAL_EVERY_MS, Task, Transition, Violation, Waiter,
    World, broken, unless_fenced,
};

type Res<T = ()> = Result<T, Violation>;

/// Users per run: few, so per-user limits bite.
const USERS: u64 = 6;

/// Event kinds and their weights.
const EVENTS: [(Event, u32); 15] = [
    (Event::Acquire, 30),
    (Event::Confirm, 8),
    (Event::Cancel, 4),
    (Event::Tick, 12),
    (Event::Rebalance, 12),
    (Event::Deliver, 22),
    (Event::Progress, 12),
    (Event::Heard, 6),
    (Event::Crash, 1),
    (Event::Stop, 1),
    (Event::Restart, 2),
    (Event::Reclaim, 3),
    (Event::AddStock, 1),
    (Event::DataLoss, 1),
    (Event::Rival, 2),
];

/// What happens in one step. `Heard`: an agent takes the next event off its WatchChannel
/// stream; `Rival`: a second process of a channel registers (see [`World::rival`]).
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
    Rival,
}

impl World {
    /// Starts every agent (register + resync), as `inventory-agent` does at start-up.
    pub fn boot(&mut self) -> Res {
        for c in 0..self.agents.len() {
            self.restart(c)?;
        }
        Ok(())
    }

    /// One random event.
    pub fn random_step(&mut self) -> Res {
        let weights: Vec<u32> = EVENTS.iter().map(|(e, w)| if self.enabled(*e) { *w } else { 0 }).collect();
        let event = EVENTS[self.rng.weighted(&weights)].0;
        match event {
            Event::Acquire => self.random_acquire(),
            Event::Confirm | Event::Cancel => self.random_finish(event == Event::Confirm),
            Event::Tick => {
                let ms = if self.rng.percent(8) { self.rng.range(1_500, 5_000) } else { self.rng.range(1, 250) };
                self.advance(ms as i64)
            }
            Event::Rebalance => {
                let c = self.pick(|w, c| w.rebalancer_free(c)).expect("enabled");
                let item = self.pick_item();
                self.rebalance(c, &item)
            }
            Event::Deliver => {
                let i = self.rng.index(self.network.len());
                self.deliver(i)
            }
            Event::Progress => {
                let c = self.pick(|w, c| w.agents[c].mem.as_ref().is_some_and(|m| !m.ops.is_empty())).expect("enabled");
                let n = self.agents[c].mem.as_ref().map_or(0, |m| m.ops.len());
                let i = self.rng.index(n);
                self.progress(c, i)
            }
            Event::Heard => {
                let c = self.pick(|w, c| w.may_hear(c)).expect("enabled");
                self.watch_event(c)
            }
            Event::Crash => {
                let c = self.pick_live().expect("enabled");
                self.crash(c);
                Ok(())
            }
            Event::Stop => {
                let c = self.pick(|w, c| w.may_stop(c)).expect("enabled");
                self.stop(c)
            }
            Event::Restart => {
                let c = self.pick(|w, c| w.agents[c].mem.is_none()).expect("enabled");
                self.restart(c)
            }
            Event::Reclaim => {
                // The operator reclaims a channel GetItem shows as expired, if any.
                let now = self.now_ms;
                let only_stopped = self.config.faults.reclaims == Reclaims::StoppedAgents;
                let expired = |w: &World, c: usize| {
                    let lease_over = w
                        .center
                        .sessions
                        .get(w.agents[c].name())
                        .is_some_and(|s| now >= s.lease_expires_at_ms + crate::world::RECLAIM_GRACE_MS as i64);
                    lease_over && (!only_stopped || w.agents[c].stopped_gracefully)
                };
                let c = match self.pick(expired) {
                    Some(c) => c,
                    // Nothing expired: the operator's call is refused (lease live), unless
                    // only stopped agents may be reclaimed.
                    None if only_stopped => {
                        self.log("reclaim: no stopped channel whose lease expired".to_owned());
                        return Ok(());
                    }
                    None => self.rng.index(self.agents.len()),
                };
                self.reclaim(c)
            }
            Event::AddStock => self.random_add_stock(),
            Event::Rival => {
                let c = self.pick_live().expect("enabled");
                self.rival(c)
            }
            Event::DataLoss => {
                let c = self.rng.index(self.agents.len());
                let item = self.pick_item();
                self.lose_pool(c, &item);
                Ok(())
            }
        }
    }

    fn enabled(&self, e: Event) -> bool {
        let faults = self.config.faults;
        let any = |f: &dyn Fn(&World, usize) -> bool| (0..self.agents.len()).any(|c| f(self, c));
        match e {
            Event::Acquire | Event::Tick | Event::AddStock => true,
            Event::Confirm | Event::Cancel => !self.reservations.is_empty(),
            Event::Rebalance => any(&|w, c| w.rebalancer_free(c)),
            Event::Deliver => !self.network.is_empty(),
            Event::Progress => any(&|w, c| w.agents[c].mem.as_ref().is_some_and(|m| !m.ops.is_empty())),
            Event::Heard => any(&|w, c| w.may_hear(c)),
            Event::Crash => faults.crashes && any(&|w, c| w.agents[c].mem.is_some()),
            Event::Stop => faults.stops && any(&|w, c| w.may_stop(c)),
            Event::Restart => any(&|w, c| w.agents[c].mem.is_none()),
            Event::Reclaim => faults.reclaims != Reclaims::Never,
            Event::DataLoss => faults.pool_data_loss,
            Event::Rival => faults.rivals != Rivals::Never && any(&|w, c| w.agents[c].mem.is_some()),
        }
    }

    /// The rebalancer runs: the agent is up, not shutting down, and the rebalancer is not
    /// waiting for a lock or a Return of its own. (It keeps running while the heartbeat
    /// worker registers again.)
    fn rebalancer_free(&self, c: usize) -> bool {
        self.agents[c].mem.as_ref().is_some_and(|m| m.stopping.is_none() && !m.busy(Task::Rebalancer))
    }

    /// The watcher reads its next event (also while the heartbeat worker registers again).
    fn may_hear(&self, c: usize) -> bool {
        self.agents[c]
            .mem
            .as_ref()
            .is_some_and(|m| m.stopping.is_none() && !m.busy(Task::Watcher) && !m.events.is_empty())
    }

    fn may_stop(&self, c: usize) -> bool {
        self.agents[c].mem.as_ref().is_some_and(|m| m.stopping.is_none())
    }

    fn pick(&mut self, f: impl Fn(&World, usize) -> bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.agents.len()).filter(|c| f(self, *c)).collect();
        if candidates.is_empty() {
            return None;
        }
        Some(candidates[self.rng.index(candidates.len())])
    }

    fn pick_live(&mut self) -> Option<usize> {
        self.pick(|w, c| w.agents[c].mem.is_some())
    }

    fn pick_item(&mut self) -> String {
        let items = self.item_names();
        items[self.rng.index(items.len())].clone()
    }

    fn mem(&mut self, c: usize) -> &mut AgentMem {
        self.agents[c].mem.as_mut().expect("caller checked the agent is up")
    }

    fn flags(&mut self, c: usize, item: &str) -> &mut ItemFlags {
        self.mem(c).items.get_mut(item).expect("every item is loaded")
    }

    fn name(&self, c: usize) -> String {
        self.agents[c].name().to_owned()
    }

    // -----------------------------------------------------------------------------------
    // Buyers
    // -----------------------------------------------------------------------------------

    fn random_acquire(&mut self) -> Res {
        let c = self.rng.index(self.agents.len());
        let item = self.pick_item();
        let earlier: Vec<usize> =
            (0..self.keys.len()).filter(|k| self.keys[*k].channel == c && self.keys[*k].item == item).collect();
        if !earlier.is_empty() && self.rng.percent(30) {
            // A replay: same key, usually the same payload.
            let k = earlier[self.rng.index(earlier.len())];
            let (user, key, mut quantity) =
                (self.keys[k].user.clone(), self.keys[k].key.clone(), self.keys[k].quantity);
            if self.rng.percent(10) {
                quantity += 1;
            }
            return self.acquire(c, &item, &user, quantity, &key, Some(k));
        }
        let user = format!("u{}", self.rng.below(USERS));
        let limit = self.center.item(&item).state.per_user_limit;
        let quantity = self.rng.range(1, limit + 1);
        let key = self.fresh_id("k");
        self.acquire(c, &item, &user, quantity, &key, None)
    }

    /// `Agent::acquire`: fast path, one pool call; on a miss, join the Borrow and try once
    /// more when it is done ([`Miss`]).
    pub(crate) fn acquire(
        &mut self,
        c: usize,
        item: &str,
        user: &str,
        quantity: u64,
        key: &str,
        replay_of: Option<usize>,
    ) -> Res {
        let what = format!("acquire {}/{item} {user} x{quantity} key {key}", self.name(c));
        let Some(mem) = self.agents[c].mem.as_ref() else {
            self.log(format!("{what} -> agent down"));
            return Ok(());
        };
        if mem.stopping.is_some() {
            self.log(format!("{what} -> unavailable (the agent is shutting down)"));
            return Ok(());
        }
        let state = self.center.item(item).state.clone();
        let batch = self.center.item(item).watermarks.batch;
        let now = self.now_ms;
        if !self.mem(c).lease_valid(now) {
            self.log(format!("{what} -> unavailable (the agent's lease expired)"));
            return Ok(());
        }
        if self.flags(c, item).held_in_doubt {
            self.log(format!("{what} -> unavailable (units in doubt at the center)"));
            return Ok(());
        }
        if self.flags(c, item).frozen {
            self.log(format!("{what} -> unavailable (pool frozen)"));
            return Ok(());
        }
        if quantity > state.per_user_limit {
            self.log(format!("{what} -> invalid (above limit {})", state.per_user_limit));
            return Ok(());
        }
        if self.flags(c, item).fast_sold_out(key) == Some(true) {
            self.log(format!("{what} -> sold out (fast path)"));
            return self.signal_starving(c, item, quantity);
        }
        let Some(available) = self.reserve(c, item, user, quantity, key, replay_of, &what)? else { return Ok(()) };
        let key_use = match replay_of {
            Some(k) => k,
            None => {
                self.remember_key(c, item, user, quantity, key);
                self.keys.len() - 1
            }
        };
        if self.flags(c, item).center_dry {
            self.log(format!("{what} -> sold out (pool available {available})"));
            self.signal_starving(c, item, quantity)?;
            return self.answered_sold_out(c, item, available);
        }
        // Join the single Borrow, wait for it (bounded), try once more.
        self.log(format!("{what} -> pool empty; waits for a borrow"));
        let want = if self.flags(c, item).end_of_sale { quantity } else { batch.max(quantity) };
        let miss = Miss { user: user.to_owned(), quantity, key: key.to_owned(), key_use, at_ms: now };
        self.borrow_shared(c, item, want, Some(miss))
    }

    /// The Acquire's second try after its Borrow task finished (`Agent::acquire`, after
    /// `borrow_shared`). One that waited longer than `miss_wait` has already answered.
    fn retry_acquire(&mut self, c: usize, item: &str, miss: Miss) -> Res {
        let what = format!("acquire {}/{item} {} x{} key {} (retry)", self.name(c), miss.user, miss.quantity, miss.key);
        if self.now_ms - miss.at_ms > MISS_WAIT_MS {
            self.log(format!("{what}: the caller stopped waiting"));
            return Ok(());
        }
        let Some(available) = self.reserve(c, item, &miss.user, miss.quantity, &miss.key, Some(miss.key_use), &what)?
        else {
            return Ok(());
        };
        if !self.mem(c).reachable {
            // Not sold out: the pool is empty and the center cannot be asked.
            self.log(format!("{what} -> unavailable (pool empty, center unreachable)"));
            return Ok(());
        }
        self.log(format!("{what} -> sold out (pool available {available})"));
        self.answered_sold_out(c, item, available)
    }

    /// SOLD_OUT answered: an empty pool while the center is dry turns the fast path on.
    fn answered_sold_out(&mut self, c: usize, item: &str, available: u64) -> Res {
        if available == 0 {
            let keys = self.agents[c].pools[item].idempotency_keys().map(str::to_owned).collect();
            let flags = self.flags(c, item);
            flags.local_empty = true;
            // fast_path_wanted + fast_path_on
            if flags.center_dry && flags.fast_path_keys.is_none() {
                flags.fast_path_keys = Some(keys);
            }
        }
        Ok(())
    }

    /// The acquire script (one pool call) and what the buyer learns, except a sold-out
    /// answer: `Some(available)` then.
    #[allow(clippy::too_many_arguments)]
    fn reserve(
        &mut self,
        c: usize,
        item: &str,
        user: &str,
        quantity: u64,
        key: &str,
        replay_of: Option<usize>,
        what: &str,
    ) -> Res<Option<u64>> {
        let state = self.center.item(item).state.clone();
        let now = self.now_ms;
        let new_id = self.fresh_id("r");
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let args = AcquireArgs {
            user_id: user.to_owned(),
            quantity,
            idempotency_key: key.to_owned(),
            new_reservation_id: new_id,
            per_user_limit: state.per_user_limit,
            reservation_ttl_ms: state.reservation_ttl_ms,
            expect_generation: None,
        };
        let result = pool.acquire(&args, now).map_err(broken)?;
        let losses = self.reference.pool_losses.get(&(c, item.to_owned())).copied().unwrap_or(0);
        match &result {
            AcquireResult::Reserved { reservation_id, replayed, .. } => {
                self.log(format!("{what} -> reserved {reservation_id}{}", if *replayed { " (replayed)" } else { "" }));
                match replay_of {
                    Some(k) => {
                        if let Some((first, at_losses)) = self.keys[k].reservation.clone()
                            && at_losses == losses
                            && first != *reservation_id
                        {
                            return Err(Violation::new(
                                "4",
                                format!("key {key} reserved {first} and then again {reservation_id}"),
                            ));
                        }
                        if !*replayed {
                            // The key had reserved nothing (sold-out and limit answers are not
                            // remembered): it now belongs to this payload.
                            let use_ = &mut self.keys[k];
                            (use_.user, use_.quantity) = (user.to_owned(), quantity);
                            use_.reservation = Some((reservation_id.clone(), losses));
                        }
                    }
                    None => self.keys.push(KeyUse {
                        channel: c,
                        item: item.to_owned(),
                        key: key.to_owned(),
                        user: user.to_owned(),
                        quantity,
                        reservation: Some((reservation_id.clone(), losses)),
                    }),
                }
                if !*replayed {
                    self.reservations.push((c, item.to_owned(), reservation_id.clone()));
                }
                Ok(None)
            }
            AcquireResult::SoldOut { available } => Ok(Some(*available)),
            AcquireResult::LimitExceeded { .. } => {
                self.log(format!("{what} -> limit exceeded"));
                if replay_of.is_none() {
                    self.remember_key(c, item, user, quantity, key);
                }
                Ok(None)
            }
            AcquireResult::KeyConflict => {
                self.log(format!("{what} -> key conflict"));
                if replay_of.is_none_or(|k| self.keys[k].quantity == quantity && self.keys[k].user == user) {
                    return Err(Violation::new("4", format!("key {key} replayed with its own payload was refused")));
                }
                Ok(None)
            }
        }
    }

    fn remember_key(&mut self, c: usize, item: &str, user: &str, quantity: u64, key: &str) {
        self.keys.push(KeyUse {
            channel: c,
            item: item.to_owned(),
            key: key.to_owned(),
            user: user.to_owned(),
            quantity,
            reservation: None,
        });
    }

    fn random_finish(&mut self, confirm: bool) -> Res {
        let i = self.rng.index(self.reservations.len());
        let (c, item, id) = self.reservations[i].clone();
        self.finish(c, &item, &id, confirm)
    }

    /// `Agent::confirm` / `Agent::cancel`.
    pub(crate) fn finish(&mut self, c: usize, item: &str, id: &str, confirm: bool) -> Res {
        let verb = if confirm { "confirm" } else { "cancel" };
        let what = format!("{verb} {}/{item} {id}", self.name(c));
        let Some(mem) = self.agents[c].mem.as_ref() else {
            self.log(format!("{what} -> agent down"));
            return Ok(());
        };
        if mem.stopping.is_some() {
            self.log(format!("{what} -> unavailable (the agent is shutting down)"));
            return Ok(());
        }
        let now = self.now_ms;
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let t = if confirm {
            pool.confirm(id, now, RECORD_RETENTION_MS)
        } else {
            pool.cancel(id, now, RECORD_RETENTION_MS)
        };
        let t = t.map_err(broken)?;
        self.log(format!("{what} -> {t:?}"));
        let returned = match t {
            Transition::Refused(ReservationState::Expired) => confirm,
            Transition::Done(_) => !confirm,
            _ => false,
        };
        if returned {
            self.flags(c, item).stock_returned_locally();
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Time and the agents' workers
    // -----------------------------------------------------------------------------------

    /// Time passes; every running agent whose heartbeat is due sends it. With bounded
    /// delays, calls and replies whose deadline the clock is about to pass land first.
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
        for c in 0..self.agents.len() {
            // The heartbeat worker stands still while it registers again, and stops at
            // shutdown.
            let due = self.agents[c].mem.as_ref().is_some_and(|m| {
                m.registering.is_none()
                    && m.stopping.is_none()
                    && self.now_ms - m.last_heartbeat_ms >= HEARTBEAT_EVERY_MS
            });
            if due {
                self.heartbeat(c)?;
            }
        }
        Ok(())
    }

    /// `CenterLink::heartbeat` with `Agent::reports`: `None` if the heartbeat was lost.
    /// Success renews the agent's lease from the send time.
    fn send_heartbeat(&mut self, c: usize) -> Option<Result<HeartbeatAnswer, Refusal>> {
        let sent_at = self.now_ms;
        let reports = self.reports(c);
        if !self.calm() && self.rng.percent(self.config.faults.lose_heartbeat_pct) {
            self.mem(c).reachable = false;
            self.log(format!("heartbeat {} lost", self.name(c)));
            return None;
        }
        let epoch = self.mem(c).epoch;
        let channel = self.agents[c].channel.clone();
        let result = self.center_heartbeat(&channel, epoch, &reports, false);
        self.mem(c).reachable = true;
        match &result {
            Ok(answer) => {
                self.mem(c).renew_lease(sent_at);
                self.stats.generation_changes += answer.generation_changed.len() as u64;
                self.log(format!(
                    "heartbeat {channel} epoch {epoch}: {}; in doubt {:?}{}",
                    show_reports(&reports),
                    answer.in_doubt_items,
                    if answer.generation_changed.is_empty() {
                        String::new()
                    } else {
                        format!("; center: generation of {:?} changed, marked lost", answer.generation_changed)
                    }
                ));
            }
            Err(r) => self.log(format!("heartbeat {channel} epoch {epoch} -> {r}")),
        }
        Some(result)
    }

    /// The center's Heartbeat (as it was before a fix if the scenario says so), counting
    /// pools marked lost with nothing in doubt. `last_report`: only the drain's final
    /// report (195d94b).
    fn center_heartbeat(
        &mut self,
        channel: &Channel,
        epoch: u64,
        reports: &[Report],
        last_report: bool,
    ) -> Result<HeartbeatAnswer, Refusal> {
        let result = self.center.heartbeat(channel, epoch, reports, last_report, self.now_ms, self.config.old_agent);
        if let Ok(answer) = &result {
            self.stats.lost_pools_without_units += answer.lost_without_units.len() as u64;
        }
        result
    }

    /// `workers::heartbeat`: report every pool (a frozen one as lost) and freeze what the
    /// center holds in doubt; a stale epoch means fenced: register again.
    fn heartbeat(&mut self, c: usize) -> Res {
        self.mem(c).last_heartbeat_ms = self.now_ms;
        match self.send_heartbeat(c) {
            None => Ok(()),
            Some(Ok(answer)) => {
                self.freeze_in_doubt(c, &answer.in_doubt_items);
                Ok(())
            }
            Some(Err(_)) => {
                self.log(format!("{} is fenced; registering again", self.name(c)));
                self.stats.fenced_reregistrations += 1;
                self.stats.fenced_with_calls_in_flight += u64::from(!self.mem(c).ops.is_empty());
                self.register_and_resync(c)
            }
        }
    }

    /// `Agent::freeze_in_doubt`: since 195d94b it sets `held_in_doubt` (no selling; the
    /// pool is still reported as it is), not `frozen`.
    fn freeze_in_doubt(&mut self, c: usize, items: &[String]) {
        for item in items {
            let flags = self.flags(c, item);
            if !flags.held_in_doubt {
                flags.held_in_doubt = true;
                self.stats.frozen_by_center += 1;
                self.log(format!("{} stops selling {item}: the center holds units of it in doubt", self.name(c)));
            }
        }
    }

    /// `Agent::rebalance`: a due per-item resync first, then expire due reservations and
    /// act on the watermarks.
    pub fn rebalance(&mut self, c: usize, item: &str) -> Res {
        if !self.rebalancer_free(c) {
            self.log(format!("rebalance {}/{item}: the rebalancer is busy", self.name(c)));
            return Ok(());
        }
        if !self.due_resync(c, item)? {
            return Ok(());
        }
        let now = self.now_ms;
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let freed = pool.expire_due(1_000, now, RECORD_RETENTION_MS).map_err(broken)?;
        if freed > 0 {
            self.flags(c, item).stock_returned_locally();
        }
        let available = self.agents[c].pools[item].counts().available;
        if self.pool_lost(c, item) {
            self.log(format!("rebalance {}/{item}: frozen", self.name(c)));
            return Ok(());
        }
        let watermarks = self.center.item(item).watermarks;
        let flags = self.flags(c, item);
        let since = rebalance::above_high_since(available, watermarks.high, flags.above_high_since, now);
        flags.above_high_since = since;
        let action = rebalance::decide(&Inputs {
            available,
            watermarks,
            prefetch: flags.may_prefetch(),
            above_high_since_ms: since,
            now_ms: now,
            sustain_ms: RETURN_SUSTAIN_MS,
        });
        self.log(format!("rebalance {}/{item}: available {available} -> {action:?}", self.name(c)));
        match action {
            Action::Borrow(n) => self.borrow_shared(c, item, n, None),
            Action::Return(n) => {
                self.flags(c, item).above_high_since = None;
                self.lock(c, item, Waiter::Return { max: n, task: Task::Rebalancer })
            }
            Action::Hold => Ok(()),
        }
    }

    /// The start of the rebalancer's pass over an item: a due per-item resync, under the
    /// item's lock. Returns whether the pass goes on (not if the resync is still due:
    /// waiting for the lock, the rebalancer blocking, or its DescribeItem failed, which
    /// ends the pass with an error).
    fn due_resync(&mut self, c: usize, item: &str) -> Res<bool> {
        let now = self.now_ms;
        if self.flags(c, item).resync_due(now) {
            self.lock(c, item, Waiter::ResyncItem)?;
            return Ok(!self.flags(c, item).resync_due(now));
        }
        Ok(true)
    }

    /// Per-item resyncs scheduled in running agents: (channel, item, when due).
    pub fn scheduled_resyncs(&self) -> Vec<(usize, String, i64)> {
        let mut scheduled = Vec::new();
        for (c, agent) in self.agents.iter().enumerate() {
            let Some(mem) = agent.mem.as_ref() else { continue };
            for (item, flags) in &mem.items {
                if flags.resync_at_ms != 0 {
                    scheduled.push((c, item.clone(), flags.resync_at_ms));
                }
            }
        }
        scheduled
    }

    /// A rebalancer pass over the item that only runs its due resync (the rest of the
    /// pass is left to later passes), if the rebalancer is free.
    pub fn resync_if_due(&mut self, c: usize, item: &str) -> Res {
        if self.rebalancer_free(c) {
            self.due_resync(c, item)?;
        }
        Ok(())
    }

    /// `Agent::pool_lost`: a pool whose generation changed since first seen was lost by
    /// the store; the item is frozen. Since 37a6364, freezing it schedules a resync 1 s
    /// later: if the channel held nothing of the item, nothing was lost and the resync
    /// sells it again.
    fn pool_lost(&mut self, c: usize, item: &str) -> bool {
        let generation = self.agents[c].pools.get(item).map_or(0, Pool::generation);
        let at = self.now_ms + LOST_POOL_RESYNC_AFTER_MS;
        let schedule = !self.config.old_agent.held_zero_stays_frozen;
        let flags = self.flags(c, item);
        if flags.generation == 0 {
            if generation != 0 {
                flags.generation = generation;
            }
        } else if generation != flags.generation && !flags.frozen {
            flags.frozen = true;
            if schedule {
                // `schedule_resync`: the latest request wins.
                flags.resync_at_ms = at;
            }
        }
        flags.frozen
    }

    /// `Agent::signal_starving`: a pool with demand while the center looks dry still
    /// sends a small Borrow every 200 ms.
    fn signal_starving(&mut self, c: usize, item: &str, quantity: u64) -> Res {
        let now = self.now_ms;
        let flags = self.flags(c, item);
        if now - flags.last_starving_signal_ms >= STARVING_SIGNAL_EVERY_MS {
            flags.last_starving_signal_ms = now;
            return self.borrow_shared(c, item, quantity, None);
        }
        Ok(())
    }

    /// `Agent::borrow_shared`: a task that borrows once it holds the item's lock, unless
    /// a Borrow finished meanwhile (then it just ends: its Acquire tries again).
    fn borrow_shared(&mut self, c: usize, item: &str, want: u64, miss: Option<Miss>) -> Res {
        let seen = self.flags(c, item).borrows_done;
        self.lock(c, item, Waiter::Borrow { want, seen, miss })
    }

    /// A Borrow task ended: the Acquire that awaited it tries again.
    fn borrow_task_done(&mut self, c: usize, item: &str, miss: Option<Miss>) {
        if let Some(miss) = miss {
            self.flags(c, item).retries.push(miss);
        }
    }

    // -----------------------------------------------------------------------------------
    // The item locks
    // -----------------------------------------------------------------------------------

    /// Queues for the item's `borrow_lock`; runs at once if it is free.
    fn lock(&mut self, c: usize, item: &str, waiter: Waiter) -> Res {
        if self.mem(c).locked(item) || !self.mem(c).items[item].waiters.is_empty() {
            self.log(format!("{} waits for the lock of {item}: {waiter:?}", self.name(c)));
        }
        self.flags(c, item).waiters.push_back(waiter);
        self.settle(c)
    }

    /// Hands every free lock to its first waiter, and moves a shutdown on, until nothing
    /// more can happen without a step of its own.
    pub(crate) fn settle(&mut self, c: usize) -> Res {
        loop {
            let Some(mem) = self.agents[c].mem.as_ref() else { return Ok(()) };
            // Acquires whose Borrow task ended try the pool again; the task the lock passes
            // to next is woken at the same moment, so either may go first.
            if let Some(item) = mem.items.iter().find(|(_, f)| !f.retries.is_empty()).map(|(i, _)| i.clone()) {
                let waiter_ready = !mem.locked(&item) && !mem.items[&item].waiters.is_empty();
                if !(waiter_ready && self.rng.percent(50)) {
                    for miss in std::mem::take(&mut self.flags(c, &item).retries) {
                        self.retry_acquire(c, &item, miss)?;
                    }
                    continue;
                }
            }
            let mem = self.agents[c].mem.as_ref().expect("up");
            let free = mem.items.iter().find(|(i, f)| !f.waiters.is_empty() && !mem.locked(i)).map(|(i, _)| i.clone());
            if let Some(item) = free {
                let waiter = self.flags(c, &item).waiters.pop_front().expect("not empty");
                self.run_waiter(c, &item, waiter)?;
                continue;
            }
            // `run_until`: the workers finish what they were doing, then `return_all`
            // gives back each item in turn, then the final report.
            let mem = self.agents[c].mem.as_ref().expect("up");
            let Some(left) = &mem.stopping else { return Ok(()) };
            let workers_done = mem.registering.is_none()
                && !mem.busy(Task::Rebalancer)
                && !mem.busy(Task::Watcher)
                && !mem.busy(Task::Shutdown);
            if !workers_done {
                return Ok(());
            }
            match left.front().cloned() {
                Some(item) => {
                    self.mem(c).stopping.as_mut().expect("stopping").pop_front();
                    self.flags(c, &item).waiters.push_back(Waiter::Return { max: u64::MAX, task: Task::Shutdown });
                }
                None => return self.exit(c),
            }
        }
    }

    /// The waiter holds the lock now.
    fn run_waiter(&mut self, c: usize, item: &str, waiter: Waiter) -> Res {
        match waiter {
            Waiter::Borrow { want, seen, miss } => {
                if self.flags(c, item).borrows_done != seen {
                    // Someone borrowed while this task queued.
                    self.borrow_task_done(c, item, miss);
                    return Ok(());
                }
                if !self.borrow_now(c, item, want, miss.clone())? {
                    self.flags(c, item).borrows_done += 1;
                    self.borrow_task_done(c, item, miss);
                }
                Ok(())
            }
            Waiter::Return { max, task } => self.give_back(c, item, max, task),
            Waiter::Resync => {
                let reg = self.mem(c).registering.as_mut().expect("a registration waits");
                let answered = reg.pending.pop_front().expect("a holding waits");
                reg.waiting = false;
                let epoch = reg.epoch;
                // Since 9ffeaf6: fence first, so that no call of an earlier incarnation (a
                // second process sharing the store, or this one before registering again)
                // moves units in or out of the pool from here on.
                self.raise_fence(c, item, epoch);
                // Since 47263b0: while a Borrow/Return of the item has an unknown outcome (a
                // resync is scheduled), only take units away (`item.resync_pending()`).
                let only_remove =
                    !self.config.old_agent.registration_adds_while_unknown && self.flags(c, item).resync_at_ms != 0;
                if self.config.old_agent.registration_held {
                    if self.resync(c, &answered, true, epoch, only_remove)?.is_err() {
                        return self.registration_failed(c, &format!("pool of {item} fenced by a later epoch"));
                    }
                    return self.continue_registration(c);
                }
                // Since 9634405: calls under the new epoch may have landed between the
                // registration and this lock; read the center's view again (DescribeItem).
                if !self.calm() && self.rng.percent(self.config.faults.lose_request_pct) {
                    return self.registration_failed(c, &format!("describe {item} lost"));
                }
                let fresh = self.center.describe(item, self.agents[c].name());
                if fresh.held != answered.held {
                    self.stats.registration_held_moved += 1;
                }
                self.log(format!(
                    "{} describes {item} under the lock: {} (registration said {})",
                    self.name(c),
                    show_holdings(std::slice::from_ref(&fresh)),
                    answered.held
                ));
                if self.resync(c, &fresh, true, epoch, only_remove)?.is_err() {
                    return self.registration_failed(c, &format!("pool of {item} fenced by a later epoch"));
                }
                self.continue_registration(c)
            }
            Waiter::ResyncItem => self.resync_item(c, item),
            Waiter::InDoubtResolved => {
                // The center settled it (195d94b): bring the pool to what the channel holds
                // now (nothing after a lost pool; what was not in doubt after a reclaim),
                // read with DescribeItem under the lock (a failed read counts as 0:
                // `unwrap_or(0)`), and sell again.
                let h = if !self.calm() && self.rng.percent(self.config.faults.lose_request_pct) {
                    self.log(format!("{} describe {item} lost; aligning to 0", self.name(c)));
                    None
                } else {
                    Some(self.center.describe(item, self.agents[c].name()))
                };
                let held = h.as_ref().map_or(0, |h| h.held);
                let generation = self.agents[c].pools.get(item).map_or(0, Pool::generation);
                let epoch = self.mem(c).epoch;
                if self.align(c, item, held, epoch)?.is_err() {
                    // Only if `align` succeeded does the agent sell again.
                    self.log(format!("{} in doubt resolved for {item}, but its pool is fenced", self.name(c)));
                    return Ok(());
                }
                let flags = self.flags(c, item);
                flags.generation = generation;
                flags.frozen = false;
                flags.held_in_doubt = false;
                flags.stock_returned_locally();
                if let Some(h) = h {
                    self.reference.synced(c, item, h.as_of);
                }
                self.log(format!(
                    "{} sells {item} again (in doubt resolved; pool aligned to held {held})",
                    self.name(c)
                ));
                Ok(())
            }
        }
    }

    /// `Agent::borrow_now`, under the lock: never into a pool the store lost; the pool is
    /// created (and its generation recorded) before the first Borrow; then the call.
    /// Returns whether a call is now under way (it holds the lock until done).
    fn borrow_now(&mut self, c: usize, item: &str, want: u64, miss: Option<Miss>) -> Res<bool> {
        if self.pool_lost(c, item) {
            self.log(format!("{} does not borrow {item}: pool lost", self.name(c)));
            return Ok(false);
        }
        // The epoch this Borrow is sent under (since 9ffeaf6): its refill is refused once a
        // later incarnation of the channel fenced the pool (that one's resync counts it).
        let epoch = self.mem(c).epoch;
        if self.agents[c].pools.get(item).is_none_or(|p| !p.exists()) {
            let opened = self.fresh_id("open-");
            if self.refill(c, item, &opened, 0, "open", epoch, false)? == Refill::Fenced {
                return Ok(false);
            }
            let generation = self.agents[c].pools[item].generation();
            self.flags(c, item).generation = generation;
            self.stats.pools_opened += 1;
        }
        let request_id = self.fresh_id("b");
        self.mem(c).ops.push(Op {
            kind: OpKind::Borrow,
            item: item.to_owned(),
            request_id,
            quantity: want,
            attempt: 1,
            phase: Phase::Waiting,
            epoch: None,
            store_epoch: epoch,
            task: Task::Spawned,
            miss,
        });
        let i = self.mem(c).ops.len() - 1;
        self.send(c, i)?;
        Ok(true)
    }

    /// `Agent::give_back`, under the lock: nothing of a frozen or `held_in_doubt` item
    /// (since 37a6364: only an operator's resolution moves units in doubt); else take the
    /// units out of the pool with the epoch read now, which the Return carries too (since
    /// 6b4c4d3; it is sent by a later step, so a crash or a re-registration can fall in
    /// between).
    fn give_back(&mut self, c: usize, item: &str, max: u64, task: Task) -> Res {
        let flags = self.flags(c, item);
        if (flags.frozen || flags.held_in_doubt) && !self.config.old_agent.returns_of_units_in_doubt {
            self.log(format!("{} gives back nothing of {item}: frozen or in doubt", self.name(c)));
            return Ok(());
        }
        let take_id = self.fresh_id("t");
        let epoch = self.mem(c).epoch;
        let now = self.now_ms;
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let taken = unless_fenced(pool.take_for_return(&take_id, max, epoch, now, RECORD_RETENTION_MS))?;
        let Ok(taken) = taken else {
            self.stats.store_calls_fenced += 1;
            self.log(format!(
                "{} cannot take {item} to return: pool fenced by a later epoch than {epoch}",
                self.name(c)
            ));
            return Ok(());
        };
        self.log(format!("{} takes {taken} of {item} to return ({take_id})", self.name(c)));
        if taken > 0 {
            self.mem(c).ops.push(Op {
                kind: OpKind::Return,
                item: item.to_owned(),
                request_id: take_id,
                quantity: taken,
                attempt: 1,
                phase: Phase::Taken,
                epoch: None,
                store_epoch: epoch,
                task,
                miss: None,
            });
        }
        Ok(())
    }

    /// The call is done: it releases the item's lock; a Borrow task ends (its Acquire
    /// tries again).
    fn end_op(&mut self, c: usize, i: usize) {
        let op = self.mem(c).ops.remove(i);
        if op.kind == OpKind::Borrow {
            self.flags(c, &op.item).borrows_done += 1;
            self.borrow_task_done(c, &op.item, op.miss);
        }
    }

    /// After a Borrow or Return whose outcome is unknown: resync the pool 5 s later.
    fn schedule_resync(&mut self, c: usize, item: &str) {
        let at = self.now_ms + RESYNC_AFTER_UNKNOWN_MS;
        self.flags(c, item).resync_at_ms = at;
        self.stats.unknown_outcomes += 1;
    }

    /// Moves one in-flight operation on: send a taken Return, time out (and retry with
    /// the same request id and epoch, or give up after the link's attempts), or add a
    /// grant to the pool. Done, it releases the item's lock.
    fn progress(&mut self, c: usize, i: usize) -> Res {
        let op = self.mem(c).ops[i].clone();
        match op.phase {
            Phase::Taken => {
                self.mem(c).ops[i].phase = Phase::Waiting;
                self.send(c, i)
            }
            Phase::Waiting if op.attempt < LINK_ATTEMPTS => {
                self.log(format!(
                    "{} {} {} attempt {} timed out; retrying",
                    self.name(c),
                    op.kind,
                    op.request_id,
                    op.attempt
                ));
                self.mem(c).ops[i].attempt += 1;
                self.mem(c).reachable = false;
                self.stats.retries += 1;
                self.send(c, i)
            }
            Phase::Waiting => {
                self.end_op(c, i);
                self.mem(c).reachable = false;
                self.stats.give_ups += 1;
                if !self.config.faults.late_attempts {
                    let before = self.network.len();
                    self.network.retain(
                        |m| !matches!(m, Message::Request { channel, request_id, .. } if *channel == c && *request_id == op.request_id),
                    );
                    self.stats.lost_messages += (before - self.network.len()) as u64;
                }
                self.schedule_resync(c, &op.item);
                self.log(format!(
                    "{} {} {} gave up after {} attempts; outcome unknown, resync of {} at t={}",
                    self.name(c),
                    op.kind,
                    op.request_id,
                    op.attempt,
                    op.item,
                    self.now_ms + RESYNC_AFTER_UNKNOWN_MS
                ));
                self.settle(c)
            }
            Phase::Granted(granted) if self.config.old_agent.refill_unchecked => {
                self.end_op(c, i);
                self.refill(c, &op.item, &op.request_id, granted, "borrow", op.store_epoch, false)?;
                self.settle(c)
            }
            Phase::Granted(granted) => {
                // `borrow_now` since 9634405: the pool may have been lost while the Borrow
                // was out; a refill would recreate it and hide the loss. The units count as
                // the channel's and fall in doubt.
                if self.pool_lost(c, &op.item) {
                    self.end_op(c, i);
                    self.stats.refills_withheld += 1;
                    self.log(format!(
                        "{} does not refill {granted} of {} ({}): pool lost while the borrow was out; frozen",
                        self.name(c),
                        op.item,
                        op.request_id
                    ));
                    return self.settle(c);
                }
                // The snapshot passed; the refill script runs in a step of its own (the
                // window of `loss_before_refill`).
                self.mem(c).ops[i].phase = Phase::Refilling(granted);
                Ok(())
            }
            Phase::Refilling(granted) => {
                self.end_op(c, i);
                // `refill_existing` (4473fcb): the script itself refuses a pool that does not
                // exist, so a loss after the check above is caught too (the agent before
                // 4473fcb refilled with a script that creates it).
                let must_exist = !self.config.old_agent.refill_creates;
                match self.refill(c, &op.item, &op.request_id, granted, "borrow", op.store_epoch, must_exist)? {
                    Refill::Missing => {
                        // Lost after the check: freeze; the units fall in doubt.
                        self.stats.refills_of_missing_pools += 1;
                        self.flags(c, &op.item).frozen = true;
                        self.log(format!("{} freezes {}: pool lost while a borrow was out", self.name(c), op.item));
                    }
                    Refill::Fenced => {
                        self.log(format!(
                            "{} leaves {granted} of {} to the newer incarnation's resync",
                            self.name(c),
                            op.item
                        ));
                    }
                    Refill::Applied | Refill::Replayed => {}
                }
                self.settle(c)
            }
        }
    }

    /// `PoolStore::refill` (`must_exist`: `refill_existing`) with the caller's epoch,
    /// recording the application for the checker. Only an applied or replayed refill
    /// counts as stock returned locally.
    #[allow(clippy::too_many_arguments)]
    fn refill(
        &mut self,
        c: usize,
        item: &str,
        grant_id: &str,
        units: u64,
        why: &str,
        epoch: u64,
        must_exist: bool,
    ) -> Res<Refill> {
        let generation = self.fresh_generation();
        let now = self.now_ms;
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let result = crate::world::refill(pool, grant_id, units, generation, epoch, must_exist, now)?;
        if result == Refill::Applied && units > 0 {
            *self.reference.refills.entry((c, item.to_owned(), grant_id.to_owned())).or_default() += 1;
        }
        let fence = self.agents[c].pools[item].fence();
        self.log(format!(
            "{} refills {units} of {item} ({why} {grant_id}, epoch {epoch}){}",
            self.name(c),
            match result {
                Refill::Applied => String::new(),
                Refill::Replayed => ": already applied".to_owned(),
                Refill::Missing => ": refused, the pool does not exist".to_owned(),
                Refill::Fenced => format!(": refused, the pool is fenced at epoch {fence}"),
            }
        ));
        match result {
            Refill::Applied | Refill::Replayed => {
                if let Some(flags) = self.agents[c].mem.as_mut().and_then(|m| m.items.get_mut(item)) {
                    flags.stock_returned_locally();
                }
            }
            Refill::Fenced => self.stats.store_calls_fenced += 1,
            Refill::Missing => {}
        }
        Ok(result)
    }

    /// `PoolStore::raise_fence` (`fence.lua`, since 9ffeaf6; nothing in the store before
    /// it, [`OldAgent::unfenced_store`](crate::OldAgent)).
    fn raise_fence(&mut self, c: usize, item: &str, epoch: u64) {
        if self.config.old_agent.unfenced_store {
            return;
        }
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let before = pool.fence();
        pool.raise_fence(epoch);
        if before != 0 && before < epoch {
            self.stats.fences_raised += 1;
        }
    }

    /// The link sends one attempt. Since 6b4c4d3 every attempt carries the epoch the task
    /// read before its pool writes (`borrow_now`'s before its first store call,
    /// `give_back`'s before its take), passed to `CenterLink::borrow`/`give_back` and
    /// `retry`: the epoch its refill or untake carries too. Before 6b4c4d3 the link read
    /// its own epoch when the call began (`call_epoch_at_send`), and before 35edb44 on
    /// every attempt (`epoch_per_attempt`; both [`OldAgent`](crate::OldAgent)).
    fn send(&mut self, c: usize, i: usize) -> Res {
        let old = self.config.old_agent;
        let mem = self.mem(c);
        let (current, first) = (mem.epoch, mem.ops[i].attempt == 1);
        let epoch = if old.epoch_per_attempt {
            current
        } else if old.call_epoch_at_send {
            mem.ops[i].epoch.unwrap_or(current)
        } else {
            mem.ops[i].store_epoch
        };
        mem.ops[i].epoch = Some(epoch);
        if first && epoch != current {
            self.stats.calls_sent_under_their_pool_epoch += 1;
        }
        let mem = self.mem(c);
        let (incarnation, op) = (mem.incarnation, mem.ops[i].clone());
        let what = format!(
            "{} sends {} {} x{} {} attempt {} epoch {epoch}",
            self.name(c),
            op.kind,
            op.item,
            op.quantity,
            op.request_id,
            op.attempt
        );
        if !self.calm() && self.rng.percent(self.config.faults.lose_request_pct) {
            self.log(format!("{what}: lost"));
            self.stats.lost_messages += 1;
            return Ok(());
        }
        self.log(what);
        self.network.push(Message::Request {
            sent_at_ms: self.now_ms,
            channel: c,
            incarnation,
            epoch,
            kind: op.kind,
            item: op.item,
            quantity: op.quantity,
            request_id: op.request_id,
            attempt: op.attempt,
        });
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // The network and the center
    // -----------------------------------------------------------------------------------

    /// Delivers message `i` (any order: calls are independent streams).
    pub fn deliver(&mut self, i: usize) -> Res {
        match self.network.remove(i) {
            Message::Request { channel: c, incarnation, epoch, kind, item, quantity, request_id, attempt, .. } => {
                let ch = self.agents[c].channel.clone();
                let breakage = self.config.breakage;
                let result = match kind {
                    OpKind::Borrow => self.center.borrow(&item, &ch, epoch, quantity, &request_id, &breakage),
                    OpKind::Return => {
                        let old = self.config.old_agent;
                        self.center.give_back(&item, &ch, epoch, quantity, &request_id, &breakage, old)
                    }
                };
                match &result {
                    Ok((_, true)) => self.stats.replays_answered += 1,
                    Err(Refusal::Precondition(m)) if m.contains("stale epoch") => {
                        self.stats.stale_refused += 1;
                        let own = self.agents[c].mem.as_ref().is_some_and(|m| m.incarnation == incarnation);
                        self.stats.stale_refused_own += u64::from(own);
                    }
                    _ => {}
                }
                let lost = !self.calm() && self.rng.percent(self.config.faults.lose_reply_pct);
                self.stats.lost_messages += u64::from(lost);
                let shown = match &result {
                    Ok((a, replayed)) => format!("{a:?}{}", if *replayed { " (replayed)" } else { "" }),
                    Err(r) => r.to_string(),
                };
                self.log(format!(
                    "center: {kind} {ch}/{item} x{quantity} {request_id} epoch {epoch} -> {shown}{}",
                    if lost { "; reply lost" } else { "" }
                ));
                self.fan_out();
                if !lost {
                    let result = result.map(|(a, _)| a);
                    self.network.push(Message::Reply {
                        sent_at_ms: self.now_ms,
                        channel: c,
                        incarnation,
                        request_id,
                        attempt,
                        result,
                    });
                }
                Ok(())
            }
            Message::Reply { channel: c, incarnation, request_id, attempt, result, .. } => {
                let Some(mem) = self.agents[c].mem.as_ref().filter(|m| m.incarnation == incarnation) else {
                    self.log(format!("reply {request_id} to a dead incarnation of {} dropped", self.name(c)));
                    return Ok(());
                };
                let Some(i) = mem
                    .ops
                    .iter()
                    .position(|o| o.request_id == request_id && o.phase == Phase::Waiting && o.attempt == attempt)
                else {
                    self.log(format!("late reply {request_id} attempt {attempt} to {} dropped", self.name(c)));
                    return Ok(());
                };
                self.on_reply(c, i, result)?;
                self.settle(c)
            }
        }
    }

    /// What `borrow_now` / `give_back` do with the link's answer.
    fn on_reply(&mut self, c: usize, i: usize, result: Result<Answer, Refusal>) -> Res {
        let op = self.mem(c).ops[i].clone();
        self.mem(c).reachable = true; // an answer, even a refusal (`CenterLink::note`)
        let high = self.center.item(&op.item).watermarks.high;
        let who = format!("{} {} {}", self.name(c), op.kind, op.request_id);
        match (op.kind, result) {
            (OpKind::Borrow, Ok(Answer::Borrow { granted, center_available })) => {
                let flags = self.flags(c, &op.item);
                flags.set_center_available(center_available);
                if granted == op.quantity && center_available >= high {
                    flags.end_of_sale = false;
                }
                self.log(format!("{who}: granted {granted}, center has {center_available}"));
                if granted == 0 {
                    self.end_op(c, i);
                } else {
                    self.mem(c).ops[i].phase = Phase::Granted(granted);
                }
                Ok(())
            }
            (OpKind::Return, Ok(Answer::Return { .. })) => {
                self.end_op(c, i);
                self.log(format!("{who}: returned"));
                Ok(())
            }
            (OpKind::Return, Err(Refusal::Precondition(m))) => {
                self.end_op(c, i);
                // The epoch read before the take: refused as fenced when a newer
                // incarnation took over (its resync counts these units).
                let pool = self.agents[c].pools.entry(op.item.clone()).or_default();
                match unless_fenced(pool.untake(&op.request_id, op.store_epoch))? {
                    Ok(back) => self.log(format!("{who}: refused ({m}); {back} units put back")),
                    Err(Fenced) => {
                        self.stats.store_calls_fenced += 1;
                        self.log(format!("{who}: refused ({m}); not put back, the pool is fenced"));
                    }
                }
                Ok(())
            }
            (OpKind::Return, Err(r)) => {
                self.end_op(c, i);
                self.schedule_resync(c, &op.item);
                self.log(format!("{who}: {r}; outcome unknown, units left out, resync scheduled"));
                Ok(())
            }
            (OpKind::Borrow, Err(Refusal::Precondition(m))) => {
                self.end_op(c, i);
                self.log(format!("{who}: refused ({m})"));
                Ok(())
            }
            (OpKind::Borrow, Err(r)) => {
                self.end_op(c, i);
                self.schedule_resync(c, &op.item);
                self.log(format!("{who}: failed ({r}); resync scheduled"));
                Ok(())
            }
            (kind, Ok(a)) => Err(Violation::new("4", format!("{kind} {} answered with {a:?}", op.request_id))),
        }
    }

    /// Hands what the center published to the running agents it concerns.
    fn fan_out(&mut self) {
        for event in std::mem::take(&mut self.center.outbox) {
            for agent in &mut self.agents {
                if let Some(mem) = agent.mem.as_mut()
                    && event.concerns(agent.channel.as_str())
                {
                    mem.events.push_back(event.clone());
                }
            }
        }
    }

    /// `Agent::on_event` for the next event of the channel's stream.
    fn watch_event(&mut self, c: usize) -> Res {
        let event = self.mem(c).events.pop_front().expect("caller checked");
        self.log(format!("{} hears {event:?}", self.name(c)));
        match event {
            CenterEvent::Restocked { item, center_available, .. } => {
                self.flags(c, &item).set_center_available(center_available.max(1));
                Ok(())
            }
            CenterEvent::ReturnRequested { item, .. } => {
                self.flags(c, &item).end_of_sale = true;
                self.lock(c, &item, Waiter::Return { max: u64::MAX, task: Task::Watcher })
            }
            CenterEvent::InDoubtResolved { item, .. } => self.lock(c, &item, Waiter::InDoubtResolved),
        }
    }

    // -----------------------------------------------------------------------------------
    // Crashes, registration, operators
    // -----------------------------------------------------------------------------------

    /// The process dies: memory, in-flight tasks, waiters and the event stream are gone;
    /// the pool store and requests already on the wire are not.
    pub fn crash(&mut self, c: usize) {
        let ops = self.agents[c].mem.take().map_or(0, |m| m.ops.len());
        self.stats.crashes += 1;
        self.log(format!("{} crashes ({ops} calls in flight abandoned)", self.name(c)));
    }

    /// SIGTERM (`startup.rs` `run_until`): no new Acquire, Confirm or Cancel; the workers
    /// finish what they were doing (a registration, a Return) and stop; `return_all`
    /// gives back every item's unreserved units in turn, each under the item's lock and
    /// awaited with the link's retries; a final report; exit (`World::settle` moves this
    /// on). A Borrow task still in flight at the exit is abandoned.
    pub fn stop(&mut self, c: usize) -> Res {
        self.log(format!("{} stops gracefully", self.name(c)));
        let items: VecDeque<String> = self.item_names().into();
        self.mem(c).stopping = Some(items);
        self.settle(c)
    }

    /// The end of a graceful stop: the final report, the agent's last word (`last_report`:
    /// a reclaim may put its unsold units back on sale; not lost: a stop whose report
    /// fails counts as a crash), then the process exits.
    fn exit(&mut self, c: usize) -> Res {
        let reports = self.reports(c);
        let (epoch, channel) = (self.mem(c).epoch, self.agents[c].channel.clone());
        let answer = self.center_heartbeat(&channel, epoch, &reports, true);
        self.log(format!("final report of {channel}: {} -> {answer:?}", show_reports(&reports)));
        let ops = self.agents[c].mem.take().map_or(0, |m| m.ops.len());
        self.agents[c].stopped_gracefully = answer.is_ok();
        self.log(format!("{channel} exits ({ops} calls in flight abandoned)"));
        Ok(())
    }

    /// `Agent::reports`: the pools as the heartbeat reports them; a frozen one as lost, and
    /// (since 9634405) one that fails the generation check (`pool_lost`, which freezes it)
    /// too: a vanished pool is never reported as an empty one.
    fn reports(&mut self, c: usize) -> Vec<Report> {
        if !self.config.old_agent.unchecked_reports {
            for item in self.item_names() {
                if !self.flags(c, &item).frozen && self.pool_lost(c, &item) {
                    self.log(format!("{} reports {item}: its store lost the pool; frozen", self.name(c)));
                }
            }
        }
        let mem = self.agents[c].mem.as_ref().expect("a running agent reports");
        self.reports_of(c, |item| mem.items[item].frozen)
    }

    fn reports_of(&self, c: usize, frozen: impl Fn(&str) -> bool) -> Vec<Report> {
        self.item_names()
            .into_iter()
            .map(|item| {
                if frozen(&item) {
                    return Report { item, counts: PoolCounts::default(), generation: 0, lost: true };
                }
                let pool = self.agents[c].pools.get(&item);
                let counts = pool.map(|p| p.counts()).unwrap_or_default();
                let generation = pool.map_or(0, Pool::generation);
                Report { item, counts, generation, lost: false }
            })
            .collect()
    }

    /// A new process: items loaded fresh (`DescribeItem`), then register and resync
    /// (nothing else runs yet, so it completes at once).
    pub fn restart(&mut self, c: usize) -> Res {
        let agent = &mut self.agents[c];
        agent.incarnations += 1;
        agent.stopped_gracefully = false;
        let items = self
            .center
            .items
            .iter()
            .map(|(n, i)| (n.clone(), ItemFlags { center_dry: i.state.available == 0, ..ItemFlags::default() }))
            .collect();
        agent.mem = Some(AgentMem {
            incarnation: agent.incarnations,
            epoch: 0,
            items,
            ops: Vec::new(),
            events: Default::default(),
            last_heartbeat_ms: self.now_ms,
            lease_until_ms: 0,
            reachable: true,
            registering: None,
            stopping: None,
        });
        self.log(format!("{} starts (incarnation {})", self.name(c), self.agents[c].incarnations));
        self.register(c, true)
    }

    /// `Agent::register_and_resync`: a new epoch (the lease is dropped), then every pool
    /// brought in line with what the center said the channel holds, one item after the
    /// other, each under the item's lock (waiting for a Borrow or Return in flight); then
    /// the lease, and a report at once.
    pub fn register_and_resync(&mut self, c: usize) -> Res {
        self.register(c, false)
    }

    /// [`register_and_resync`](Self::register_and_resync); `startup`: by the start-up
    /// loop, which retries a registration that failed.
    fn register(&mut self, c: usize, startup: bool) -> Res {
        let name = self.name(c);
        let sent_at = self.now_ms;
        self.mem(c).lease_until_ms = 0; // `CenterLink::register` drops the lease
        let (epoch, held) = self.center.register(&name, &format!("{name}-1"), self.now_ms);
        let mem = self.mem(c);
        mem.epoch = epoch;
        mem.last_heartbeat_ms = sent_at;
        mem.registering = Some(Registration {
            sent_at_ms: sent_at,
            epoch,
            pending: held.iter().cloned().collect(),
            waiting: false,
            startup,
        });
        self.log(format!("{name} registers: epoch {epoch}, holds {}", show_holdings(&held)));
        self.continue_registration(c)?;
        self.settle(c)
    }

    /// The registration's next resync: queued for its item's lock (or, in the old agent,
    /// at once); when none is left, the lease and the immediate report.
    fn continue_registration(&mut self, c: usize) -> Res {
        let ignore_lock = self.config.old_agent.resync_ignores_lock;
        let Some(reg) = self.mem(c).registering.as_mut() else { return Ok(()) };
        if reg.waiting {
            return Ok(());
        }
        let Some(item) = reg.pending.front().map(|h| h.item.clone()) else { return self.finish_registration(c) };
        reg.waiting = true;
        if ignore_lock {
            return self.run_waiter(c, &item, Waiter::Resync);
        }
        if self.mem(c).locked(&item) || !self.mem(c).items[&item].waiters.is_empty() {
            self.stats.resyncs_waiting_for_a_call += 1;
            self.log(format!("{} resync of {item} waits for the item's lock", self.name(c)));
        }
        self.flags(c, &item).waiters.push_back(Waiter::Resync);
        Ok(())
    }

    /// The end of `register_and_resync`: the lease from the registration's send time, and
    /// a report at once (so a reclaim never judges this incarnation by the last one's
    /// report); items the answer lists in doubt are frozen. A failed report is only logged.
    fn finish_registration(&mut self, c: usize) -> Res {
        let reg = self.mem(c).registering.take().expect("registering");
        self.mem(c).renew_lease(reg.sent_at_ms);
        self.log(format!("{} registered and resynced (epoch {})", self.name(c), reg.epoch));
        if let Some(Ok(answer)) = self.send_heartbeat(c) {
            self.freeze_in_doubt(c, &answer.in_doubt_items);
        }
        Ok(())
    }

    /// `register_and_resync` returned an error (a DescribeItem under an item's lock failed):
    /// the resyncs left are not done and the lease stays dropped. The start-up loop
    /// retries the whole registration (a new epoch); the heartbeat worker only logs it, and
    /// its next heartbeat, under the new epoch, renews the lease.
    fn registration_failed(&mut self, c: usize, why: &str) -> Res {
        let reg = self.mem(c).registering.take().expect("registering");
        self.stats.registrations_failed += 1;
        let left: Vec<&str> = reg.pending.iter().map(|h| h.item.as_str()).collect();
        self.log(format!(
            "{} registration (epoch {}) fails: {why}; left unresynced: that item and {left:?}",
            self.name(c),
            reg.epoch
        ));
        if reg.startup {
            self.log(format!("{} retries its start-up registration", self.name(c)));
            return self.register(c, true);
        }
        Ok(())
    }

    /// Another process of the channel registers, fencing the running agent at the center,
    /// which registers again at its next heartbeat with its calls still in flight. With
    /// [`Rivals::Fence`] it dies before its resync; with [`Rivals::SharedStore`] (a deploy
    /// overlap: two processes that both believe they lead) it resyncs the pools it shares
    /// with the running agent under its own locks, which the running agent's calls do not
    /// take, reports at once and stops. Since 9ffeaf6 each of those resyncs raises the
    /// pool's fence to its epoch first, so the running agent's late refills, takes and
    /// untakes (of an older epoch) no longer move units the resync counted. (Its
    /// DescribeItem under the lock reads what the registration answered: nothing lands in
    /// between, the whole registration being one step.)
    fn rival(&mut self, c: usize) -> Res {
        let name = self.name(c);
        let (epoch, held) = self.center.register(&name, &format!("{name}-2"), self.now_ms);
        self.log(format!("a second {name} process registers: epoch {epoch}, holds {}", show_holdings(&held)));
        if self.config.faults.rivals == Rivals::SharedStore {
            let mut frozen = BTreeSet::new();
            for h in held {
                self.raise_fence(c, &h.item, epoch);
                match self.resync(c, &h, false, epoch, false)? {
                    Ok(true) => {
                        frozen.insert(h.item.clone());
                    }
                    Ok(false) => {}
                    Err(Fenced) => return Err(Violation::new("6", "the newest registration's resync was fenced")),
                }
            }
            let reports = self.reports_of(c, |item| frozen.contains(item));
            let channel = self.agents[c].channel.clone();
            let answer = self.center_heartbeat(&channel, epoch, &reports, false);
            self.log(format!("the second {name} process reports {} -> {answer:?}", show_reports(&reports)));
        }
        self.log(format!("the second {name} process stops"));
        Ok(())
    }

    /// `Agent::resync` with the center's view `h`: since 37a6364, if the channel holds
    /// nothing of the item and nothing is in doubt, a lost pool cost nothing: the item is
    /// unfrozen (and `held_in_doubt` cleared) and the pool aligned to 0, whatever the store
    /// has now. Otherwise a pool the store lost is frozen; an intact pool of which the
    /// center holds units in doubt (195d94b: a reclaim without the agent's last word) is
    /// left as it is and sells nothing (`held_in_doubt`) until an operator resolves them;
    /// any other is aligned with `held`, or (`only_remove`, since 47263b0: a registration
    /// while an outcome of the item is unknown) with `min(held, pool sum)`, leaving what is
    /// missing to the scheduled `resync_item`. `align` carries `epoch`. The running agent's
    /// flags are updated only if it is the one resyncing (`own`, not a
    /// [`rival`](Self::rival)). Returns whether the pool was found lost, or [`Fenced`] if
    /// `align` was refused.
    fn resync(&mut self, c: usize, h: &Holding, own: bool, epoch: u64, only_remove: bool) -> Res<Result<bool, Fenced>> {
        let (item, held) = (h.item.as_str(), h.held);
        let generation = self.agents[c].pools.get(item).map_or(0, Pool::generation);
        if held == 0 && h.in_doubt == 0 && !self.config.old_agent.held_zero_stays_frozen {
            if let Err(f) = self.align(c, item, 0, epoch)? {
                return Ok(Err(f));
            }
            if own {
                let flags = self.flags(c, item);
                let was_frozen = std::mem::replace(&mut flags.frozen, false);
                flags.held_in_doubt = false;
                flags.generation = generation;
                if was_frozen {
                    self.stats.unfrozen_at_held_zero += 1;
                    self.log(format!(
                        "{} resync: pool of {item} lost while holding nothing; selling again",
                        self.name(c)
                    ));
                }
            }
            self.reference.synced(c, item, h.as_of);
            return Ok(Ok(false));
        }
        let lost =
            (generation == 0 && held > 0) || (h.generation != 0 && generation != 0 && generation != h.generation);
        if lost {
            // Never resell: the units may have been sold before the store lost them.
            self.log(format!("{} resync: pool of {item} lost; units in doubt, item frozen", self.name(c)));
            if own {
                self.flags(c, item).frozen = true;
            }
            return Ok(Ok(true));
        }
        if h.in_doubt > 0 {
            self.log(format!(
                "{} resync: {} units of {item} in doubt at the center; pool kept, not selling",
                self.name(c),
                h.in_doubt
            ));
            if own && !self.flags(c, item).held_in_doubt {
                self.flags(c, item).held_in_doubt = true;
                self.stats.held_in_doubt += 1;
            }
            return Ok(Ok(false));
        }
        let pool_sum = self.agents[c].pools.get(item).map_or(0, |p| p.counts().sum());
        let target = if only_remove { held.min(pool_sum) } else { held };
        if target < held {
            self.stats.registration_adds_withheld += 1;
            self.log(format!(
                "{} resyncs {item} with held {held}, only removing (an outcome is unknown): pool stays at {target}",
                self.name(c)
            ));
        } else {
            self.log(format!("{} resyncs {item} with held {held}", self.name(c)));
        }
        if let Err(f) = self.align(c, item, target, epoch)? {
            return Ok(Err(f));
        }
        if generation != 0 && own {
            self.flags(c, item).generation = generation;
        }
        self.reference.synced(c, item, h.as_of);
        Ok(Ok(false))
    }

    /// `Agent::resync_item`, under the lock: only if a resync is still due
    /// (`resync_scheduled`), DescribeItem (its `held`, `generation`, `in_doubt`; no new
    /// epoch), then the resync, and `resync_done` clears the schedule it served. A
    /// DescribeItem that fails leaves the resync due.
    fn resync_item(&mut self, c: usize, item: &str) -> Res {
        let now = self.now_ms;
        let old = self.config.old_agent.resync_item_unconditional;
        // Since 9634405: a call that finished while this waited for the lock may have
        // pushed the resync later (its own outcome still unknown): then it is not due yet.
        let scheduled = self.flags(c, item).resync_at_ms;
        if !old && !self.flags(c, item).resync_due(now) {
            self.stats.item_resyncs_postponed += 1;
            self.log(format!("{} resync of {item} not due any more (now at t={scheduled})", self.name(c)));
            return Ok(());
        }
        if !self.calm() && self.rng.percent(self.config.faults.lose_request_pct) {
            self.log(format!("{} describe {item} lost; resync stays due", self.name(c)));
            return Ok(());
        }
        let h = self.center.describe(item, self.agents[c].name());
        self.log(format!(
            "{} resyncs {item} after an unknown outcome: {}",
            self.name(c),
            show_holdings(std::slice::from_ref(&h))
        ));
        let epoch = self.mem(c).epoch;
        if self.resync(c, &h, true, epoch, false)?.is_err() {
            // `resync` returned an error: the resync stays due.
            self.log(format!("{} resync of {item} refused: pool fenced; resync stays due", self.name(c)));
            return Ok(());
        }
        // `resync_done(served)`: clears the schedule served, not a newer one (the old agent
        // cleared whatever was set).
        let flags = self.flags(c, item);
        if old || flags.resync_at_ms == scheduled {
            flags.resync_at_ms = 0;
        }
        self.stats.item_resyncs += 1;
        Ok(())
    }

    /// `Agent::align`: makes the pool's total what the center says the channel holds, with
    /// the caller's epoch (an error if the pool was fenced with a later one).
    fn align(&mut self, c: usize, item: &str, held: u64, epoch: u64) -> Res<Result<(), Fenced>> {
        let pool_sum = self.agents[c].pools.get(item).map_or(0, |p| p.counts().sum());
        let op_id = self.fresh_id("resync-");
        if held != pool_sum {
            self.stats.resync_moves += 1;
        }
        if held > pool_sum {
            if self.refill(c, item, &op_id, held - pool_sum, "resync", epoch, false)? == Refill::Fenced {
                return Ok(Err(Fenced));
            }
        } else if pool_sum > held {
            let excess = pool_sum - held;
            let now = self.now_ms;
            let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
            let Ok(taken) = unless_fenced(pool.take_for_return(&op_id, excess, epoch, now, RECORD_RETENTION_MS))?
            else {
                self.stats.store_calls_fenced += 1;
                self.log(format!("{} resync cannot remove {excess} of {item}: pool fenced", self.name(c)));
                return Ok(Err(Fenced));
            };
            self.log(format!("{} resync removes {taken} of {item} (excess {excess})", self.name(c)));
            let pool = &self.agents[c].pools[item];
            // Units written off as sold may stay in the pool; nothing else may.
            let written_off = self.reference.written_off.get(&(c, item.to_owned())).copied().unwrap_or(0);
            let (available, reserved, sold) = (pool.available(), pool.reserved(), pool.sold());
            if reserved + sold > held + written_off {
                self.reference.noticed.push(Violation::new(
                    "3",
                    format!(
                        "resync of {}/{item}: the center counts {held} units as the channel's (+{written_off} written \
                         off) but its pool holds {pool_sum} ({} available, {} reserved, {} sold) and only {taken} \
                         could be removed: {} reserved/sold units are also back at the center, which can sell them \
                         again",
                        self.name(c),
                        available + taken,
                        reserved,
                        sold,
                        reserved + sold - held - written_off
                    ),
                ));
            }
        }
        Ok(Ok(()))
    }

    /// The operator's `invctl resolve`, for every channel with units in doubt, with the
    /// number of units its orders show sold (the pool's sold units, and those sold from
    /// pool data that was lost). Only at quiescence, once every reservation is finished.
    pub fn resolve_in_doubt(&mut self) -> Res {
        let doubtful: Vec<(String, String)> =
            self.center.allocations.iter().filter(|(_, a)| a.in_doubt > 0).map(|(k, _)| k.clone()).collect();
        for (item, channel) in doubtful {
            let c = self.agents.iter().position(|a| a.name() == channel).expect("known channel");
            let key = (c, item.clone());
            let sold_in_pool = self.agents[c].pools.get(&item).map_or(0, Pool::sold);
            let lost = self.reference.lost_sold.get(&key).copied().unwrap_or(0);
            let already = self.reference.written_off.get(&key).copied().unwrap_or(0);
            // Since 195d94b the channel keeps what was not in doubt (`held - in_doubt`): of
            // the pool's sold units, only those beyond it were sold from units in doubt.
            let alloc = self.center.allocations[&(item.clone(), channel.clone())];
            let kept = alloc.held().saturating_sub(alloc.in_doubt);
            let sold = (sold_in_pool + lost).saturating_sub(already).saturating_sub(kept);
            let ch = self.agents[c].channel.clone();
            self.step += 1;
            let returned = self.center.resolve_in_doubt(&item, &ch, sold).map_err(|r| {
                Violation::new("8", format!("the operator cannot resolve {channel}/{item} with {sold} sold: {r}"))
            })?;
            self.log(format!(
                "operator resolves {channel}/{item}: {sold} written off as sold, {returned} back to the center"
            ));
            self.stats.resolutions += 1;
            let after_reclaim = self.reference.reclaimed_into_doubt.contains_key(&key);
            self.stats.resolutions_after_reclaim += u64::from(after_reclaim);
            if !self.reference.pool_losses.contains_key(&key) && !after_reclaim {
                self.stats.resolutions_without_data_loss += 1;
            }
            *self.reference.written_off.entry(key.clone()).or_default() += sold;
            // Until the agent hears of it, its (frozen) pool still has the returned units.
            let as_of = self.center.changes;
            self.reference.unsynced(c, &item, as_of, returned);
            self.fan_out();
        }
        Ok(())
    }

    /// The operator's `invctl reclaim --channel C`: refused while the lease is live.
    fn reclaim(&mut self, c: usize) -> Res {
        let channel = self.agents[c].channel.clone();
        let alive = if self.agents[c].mem.is_some() { "running" } else { "down" };
        match self.center.reclaim(&channel, self.now_ms, self.config.old_agent) {
            Err(r) => {
                self.log(format!("reclaim {channel} ({alive}) -> {r}"));
            }
            Ok(items) => {
                self.log(format!("reclaim {channel} ({alive}) -> (item, back on sale, in doubt) {items:?}"));
                self.stats.reclaims += 1;
                let as_of = self.center.changes;
                let (on_sale, doubt): (u64, u64) = items.iter().fold((0, 0), |(s, d), (_, u, x)| (s + u, d + x));
                self.stats.reclaims_on_sale += u64::from(on_sale > 0);
                self.stats.reclaims_into_doubt += u64::from(doubt > 0);
                for (item, units, in_doubt) in items {
                    self.reference.unsynced(c, &item, as_of, units);
                    if in_doubt > 0 {
                        *self.reference.reclaimed_into_doubt.entry((c, item)).or_default() += in_doubt;
                    }
                }
                self.fan_out();
            }
        }
        Ok(())
    }

    /// `Admin/AddStock`, sometimes replayed, sometimes with a reused id and another
    /// quantity (which must be refused).
    fn random_add_stock(&mut self) -> Res {
        let item = self.pick_item();
        let earlier: Vec<(String, u64)> = self
            .center
            .requests
            .iter()
            .filter(|((scope, _), s)| scope == "admin" && s.fingerprint.starts_with(&format!("add-stock/{item}/")))
            .map(|((_, id), s)| {
                (id.clone(), s.fingerprint.rsplit('/').next().and_then(|q| q.parse().ok()).unwrap_or(1))
            })
            .collect();
        let (id, quantity, expect) = if !earlier.is_empty() && self.rng.percent(40) {
            let (id, q) = earlier[self.rng.index(earlier.len())].clone();
            if self.rng.percent(50) { (id, q, "replay") } else { (id, q + 1, "conflict") }
        } else {
            (self.fresh_id("s"), self.rng.range(1, 10), "new")
        };
        let result = self.center.add_stock(&item, quantity, &id);
        self.log(format!("add stock {item} x{quantity} {id} ({expect}) -> {result:?}"));
        self.fan_out();
        let ok = matches!(
            (expect, &result),
            ("new", Ok(false)) | ("replay", Ok(true)) | ("conflict", Err(Refusal::Conflict(_)))
        );
        if !ok {
            return Err(Violation::new("4", format!("add stock {id} ({expect}) answered {result:?}")));
        }
        Ok(())
    }

    /// The pool's store loses its data (Redis restarted without persistence), its fence
    /// included: invariant 8. Between a Borrow's second generation check and its refill
    /// only with [`Faults::loss_before_refill`](crate::Faults).
    fn lose_pool(&mut self, c: usize, item: &str) {
        let ops = self.agents[c].mem.as_ref().map_or(&[][..], |m| &m.ops[..]);
        let borrowing = ops.iter().any(|o| o.kind == OpKind::Borrow && o.item == item);
        let refilling = ops.iter().any(|o| matches!(o.phase, Phase::Refilling(_)) && o.item == item);
        if refilling && !self.config.faults.loss_before_refill {
            return;
        }
        let Some(pool) = self.agents[c].pools.get_mut(item) else { return };
        if !pool.exists() {
            return; // nothing stored yet
        }
        let sold = pool.sold();
        *pool = Pool::default();
        *self.reference.lost_sold.entry((c, item.to_owned())).or_default() += sold;
        *self.reference.pool_losses.entry((c, item.to_owned())).or_default() += 1;
        self.stats.pool_losses += 1;
        self.stats.pool_losses_during_borrow += u64::from(borrowing);
        let recorded = self.agents[c].mem.as_ref().is_some_and(|m| m.items[item].generation != 0);
        self.stats.pool_losses_unrecorded += u64::from(!recorded);
        self.log(format!(
            "pool {}/{item} loses its data ({sold} sold units forgotten){}",
            self.name(c),
            if recorded { "" } else { "; its agent has no generation of it recorded" }
        ));
    }

    /// Whether faults are off (draining to quiescence and selling out).
    pub fn calm(&self) -> bool {
        self.step > self.config.steps
    }

    // -----------------------------------------------------------------------------------
    // Quiescence and the end of the sale
    // -----------------------------------------------------------------------------------

    /// Without faults: deliver everything in flight, let every call finish, every event
    /// be heard (waiting tasks run as their locks come free), in an order drawn from the
    /// seed (calls race as they do in production). `check` runs after every sub-step.
    pub fn drain(&mut self, check: &mut dyn FnMut(&World) -> Res) -> Res {
        for _ in 0..100_000 {
            self.step += 1;
            if !self.network.is_empty() {
                let i = self.rng.index(self.network.len());
                self.deliver(i)?;
            } else if let Some(c) = self.pick(|w, c| w.may_hear(c)) {
                self.watch_event(c)?;
            } else if let Some(c) = self.pick(|w, c| w.agents[c].mem.as_ref().is_some_and(|m| !m.ops.is_empty())) {
                // A reply lost before the drain began: the attempt times out.
                let n = self.agents[c].mem.as_ref().map_or(0, |m| m.ops.len());
                let i = self.rng.index(n);
                self.progress(c, i)?;
            } else {
                return Ok(());
            }
            check(self)?;
        }
        Err(Violation::new("2", "no quiescence after 100000 sub-steps"))
    }
}

fn show_reports(reports: &[Report]) -> String {
    let shown: Vec<String> = reports
        .iter()
        .map(|r| match r.lost {
            true => format!("{} lost", r.item),
            false => format!("{} {}/{}/{}", r.item, r.counts.available, r.counts.reserved, r.counts.sold),
        })
        .collect();
    shown.join(", ")
}

fn show_holdings(held: &[Holding]) -> String {
    let shown: Vec<String> = held
        .iter()
        .map(|h| match h.in_doubt {
            0 => format!("{} {}", h.item, h.held),
            d => format!("{} {} ({d} in doubt)", h.item, h.held),
        })
        .collect();
    format!("[{}]", shown.join(", "))
}

/// Interleavings driven by hand: the seeded runs reach them too rarely to rely on.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::check;
    use crate::world::{Config, Faults, OpKind};

    /// A world without random faults (the test chooses every step), late attempts allowed.
    fn quiet(seed: u64) -> World {
        let faults = Faults {
            lose_request_pct: 0,
            lose_reply_pct: 0,
            crashes: false,
            stops: false,
            reclaims: Reclaims::Never,
            pool_data_loss: false,
            rivals: Rivals::Never,
            late_attempts: true,
            ..Faults::DEFAULT
        };
        let mut w = World::new(seed, Config { faults, steps: 0, ..Config::default() });
        w.boot().expect("boot");
        w
    }

    /// Was bug D (invariant 3), `a_late_return_after_resync_item`: the rebalancer's
    /// resync, due after an earlier unknown outcome, waits for the item's lock while a
    /// Return holds it. The Return gives up (outcome unknown: its last attempt is still on
    /// its way) and schedules a resync 5 s later; the waiting `resync_item` got the lock at
    /// once, resynced (refilling the units the Return took, since the center had not
    /// applied it yet) and cleared the resync just scheduled; the late attempt then landed
    /// and the pool still had the units. Since 9634405 `resync_item` resyncs only if a
    /// resync is still due once it holds the lock, and clears only the schedule it served.
    fn late_return_after_resync_item(old: bool) -> Res {
        let mut w = quiet(3);
        w.config.old_agent.resync_item_unconditional = old;
        let item = w.item_names()[0].clone();
        // The pool holds 5 units the center granted.
        w.borrow_shared(0, &item, 5, None).unwrap();
        w.deliver(0).unwrap();
        w.deliver(0).unwrap();
        w.progress(0, 0).unwrap();
        w.progress(0, 0).unwrap();
        assert_eq!(w.agents[0].pools[&item].available(), 5);
        // An earlier Borrow or Return of the item ended with an unknown outcome 5 s ago.
        w.flags(0, &item).resync_at_ms = w.now_ms;
        // The watcher gives back 3 (ReturnRequested): taken, attempt 1 on its way.
        w.lock(0, &item, Waiter::Return { max: 3, task: Task::Watcher }).unwrap();
        w.progress(0, 0).unwrap();
        // The rebalancer's pass: the resync is due; it waits for the lock.
        w.rebalance(0, &item).unwrap();
        assert_eq!(w.mem(0).items[&item].waiters.len(), 1);
        // Every attempt times out; the link gives up.
        for _ in 1..=LINK_ATTEMPTS {
            w.progress(0, 0).unwrap();
        }
        assert!(w.mem(0).ops.is_empty(), "the Return gave up");
        let rescheduled = w.mem(0).items[&item].resync_at_ms;
        // One of its attempts lands now, well within its deadline.
        let late = w
            .network
            .iter()
            .position(|m| matches!(m, Message::Request { kind: OpKind::Return, .. }))
            .expect("attempts on their way");
        w.deliver(late).unwrap();
        check::check_step(&w)?;
        assert_ne!(rescheduled, 0, "the resync the Return scheduled is still pending");
        // 5 s later the resync runs and the pool matches the center.
        w.advance(RESYNC_AFTER_UNKNOWN_MS).unwrap();
        w.rebalance(0, &item).unwrap();
        assert_eq!(w.mem(0).items[&item].resync_at_ms, 0);
        assert_eq!(w.agents[0].pools[&item].counts().sum(), w.center.held(&item, w.agents[0].name()));
        check::check_step(&w)
    }

    #[test]
    fn resync_item_waits_for_a_call_that_gave_up_meanwhile() {
        late_return_after_resync_item(false).unwrap();
        assert_eq!(
            late_return_after_resync_item(true).expect_err("the old resync_item is caught").invariant,
            "3",
            "resync_item before 9634405"
        );
    }
}
