//! The events of a run: buyers, time, the agents' workers and calls, the network, crashes,
//! operators. Each handler mirrors one path of the real code and says which.
//!
//! One step is one event drawn from the seeded PRNG; the checker runs after each. The
//! agent's concurrent tasks are modelled as explicit in-flight operations ([`Op`]) whose
//! progress (send, retry after a deadline, apply a grant) is itself a step, so any
//! interleaving of tasks, replies and crashes can occur.

use inventory_core::ledger::PoolCounts;
use inventory_core::rebalance::{self, Action, Inputs};

use crate::world::{
    AcquireResult, AgentMem, Answer, CenterEvent, HEARTBEAT_EVERY_MS, Holding, ItemFlags, KeyUse, LINK_ATTEMPTS,
    Message, Op, OpKind, Phase, RETURN_SUSTAIN_MS, Reclaims, Refusal, Report, ResState, STARVING_SIGNAL_EVERY_MS,
    Transition, Violation, World,
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
                let c = self.pick_live().expect("enabled");
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
                let c =
                    self.pick(|w, c| w.agents[c].mem.as_ref().is_some_and(|m| !m.events.is_empty())).expect("enabled");
                self.watch_event(c)
            }
            Event::Crash => {
                let c = self.pick_live().expect("enabled");
                self.crash(c);
                Ok(())
            }
            Event::Stop => {
                let c = self.pick_live().expect("enabled");
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
            Event::Rebalance => any(&|w, c| w.agents[c].mem.is_some()),
            Event::Deliver => !self.network.is_empty(),
            Event::Progress => any(&|w, c| w.agents[c].mem.as_ref().is_some_and(|m| !m.ops.is_empty())),
            Event::Heard => any(&|w, c| w.agents[c].mem.as_ref().is_some_and(|m| !m.events.is_empty())),
            Event::Crash => faults.crashes && any(&|w, c| w.agents[c].mem.is_some()),
            Event::Stop => faults.stops && any(&|w, c| w.agents[c].mem.is_some()),
            Event::Restart => any(&|w, c| w.agents[c].mem.is_none()),
            Event::Reclaim => faults.reclaims != Reclaims::Never,
            Event::DataLoss => faults.pool_data_loss,
            Event::Rival => faults.rival_registrations && any(&|w, c| w.agents[c].mem.is_some()),
        }
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

    /// `Agent::acquire`: fast path, one pool call, a Borrow on a miss.
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
        if self.agents[c].mem.is_none() {
            self.log(format!("{what} -> agent down"));
            return Ok(());
        }
        let state = self.center.item(item).state.clone();
        let batch = self.center.item(item).watermarks.batch;
        let now = self.now_ms;
        if !self.mem(c).lease_valid(now) {
            self.log(format!("{what} -> unavailable (the agent's lease expired)"));
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
        let new_id = self.fresh_id("r");
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let result = pool.acquire(user, quantity, key, &new_id, state.per_user_limit, state.reservation_ttl_ms, now)?;
        let losses = self.reference.pool_losses.get(&(c, item.to_owned())).copied().unwrap_or(0);
        match &result {
            AcquireResult::Reserved { reservation_id, replayed } => {
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
            }
            AcquireResult::SoldOut { available } => {
                let available = *available;
                self.log(format!("{what} -> sold out (pool available {available})"));
                if replay_of.is_none() {
                    self.remember_key(c, item, user, quantity, key);
                }
                if self.flags(c, item).center_dry {
                    self.signal_starving(c, item, quantity)?;
                } else {
                    let want = if self.flags(c, item).end_of_sale { quantity } else { batch.max(quantity) };
                    self.borrow_shared(c, item, want)?;
                    if !self.mem(c).reachable {
                        // Not sold out: the pool is empty and the center cannot be asked.
                        self.log(format!("{what} -> unavailable (center unreachable)"));
                        return Ok(());
                    }
                }
                if available == 0 {
                    let keys = self.agents[c].pools[item].keys.keys().cloned().collect();
                    let flags = self.flags(c, item);
                    flags.local_empty = true;
                    // fast_path_wanted + fast_path_on
                    if flags.center_dry && flags.fast_path_keys.is_none() {
                        flags.fast_path_keys = Some(keys);
                    }
                }
            }
            AcquireResult::LimitExceeded => {
                self.log(format!("{what} -> limit exceeded"));
                if replay_of.is_none() {
                    self.remember_key(c, item, user, quantity, key);
                }
            }
            AcquireResult::KeyConflict => {
                self.log(format!("{what} -> key conflict"));
                if replay_of.is_none_or(|k| self.keys[k].quantity == quantity && self.keys[k].user == user) {
                    return Err(Violation::new("4", format!("key {key} replayed with its own payload was refused")));
                }
            }
        }
        Ok(())
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
        if self.agents[c].mem.is_none() {
            self.log(format!("{what} -> agent down"));
            return Ok(());
        }
        let now = self.now_ms;
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let t = if confirm { pool.confirm(id, now)? } else { pool.cancel(id, now)? };
        self.log(format!("{what} -> {t:?}"));
        let returned = match t {
            Transition::Refused(ResState::Expired) => confirm,
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

    /// Time passes; every running agent whose heartbeat is due sends it.
    pub fn advance(&mut self, ms: i64) -> Res {
        self.now_ms += ms;
        self.log(format!("time +{ms} ms"));
        for c in 0..self.agents.len() {
            let due =
                self.agents[c].mem.as_ref().is_some_and(|m| self.now_ms - m.last_heartbeat_ms >= HEARTBEAT_EVERY_MS);
            if due {
                self.heartbeat(c)?;
            }
        }
        Ok(())
    }

    /// `workers::heartbeat`: report every pool (a frozen one as lost); success renews the
    /// agent's own lease; a stale epoch means fenced: register again.
    fn heartbeat(&mut self, c: usize) -> Res {
        let sent_at = self.now_ms;
        self.mem(c).last_heartbeat_ms = sent_at;
        let reports = self.reports(c);
        if !self.calm() && self.rng.percent(self.config.faults.lose_heartbeat_pct) {
            self.mem(c).reachable = false;
            self.log(format!("heartbeat {} lost", self.name(c)));
            return Ok(());
        }
        let epoch = self.mem(c).epoch;
        let channel = self.agents[c].channel.clone();
        let result = self.center.heartbeat(&channel, epoch, &reports, self.now_ms);
        self.mem(c).reachable = true;
        match result {
            Ok(()) => {
                self.mem(c).renew_lease(sent_at);
                self.log(format!("heartbeat {} epoch {epoch}: {}", self.name(c), show_reports(&reports)));
                Ok(())
            }
            Err(r) => {
                self.log(format!("heartbeat {} epoch {epoch} -> {r}; registering again", self.name(c)));
                self.stats.fenced_reregistrations += 1;
                self.stats.fenced_with_calls_in_flight += u64::from(!self.mem(c).ops.is_empty());
                self.register_and_resync(c)
            }
        }
    }

    /// `Agent::rebalance`: expire due reservations, then act on the watermarks.
    pub fn rebalance(&mut self, c: usize, item: &str) -> Res {
        let now = self.now_ms;
        let freed = self.agents[c].pools.entry(item.to_owned()).or_default().expire_due(1_000, now)?;
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
            Action::Borrow(n) => self.borrow_shared(c, item, n),
            Action::Return(n) => {
                self.give_back(c, item, n)?;
                self.flags(c, item).above_high_since = None;
                Ok(())
            }
            Action::Hold => Ok(()),
        }
    }

    /// `Agent::pool_lost`: a pool whose generation changed since first seen was lost by
    /// the store; the item is frozen.
    fn pool_lost(&mut self, c: usize, item: &str) -> bool {
        let generation = self.agents[c].pools.get(item).map_or(0, |p| p.generation);
        let flags = self.flags(c, item);
        if flags.generation == 0 {
            if generation != 0 {
                flags.generation = generation;
            }
        } else if generation != flags.generation {
            flags.frozen = true;
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
            return self.borrow_shared(c, item, quantity);
        }
        Ok(())
    }

    /// `Agent::borrow_shared`: one Borrow per item in flight; later callers join it.
    fn borrow_shared(&mut self, c: usize, item: &str, want: u64) -> Res {
        if self.mem(c).ops.iter().any(|o| o.kind == OpKind::Borrow && o.item == item) {
            self.log(format!("{} joins the borrow of {item} in flight", self.name(c)));
            return Ok(());
        }
        // `borrow_now`: never borrow into a pool the store lost.
        if self.pool_lost(c, item) {
            self.log(format!("{} does not borrow {item}: pool lost", self.name(c)));
            return Ok(());
        }
        let request_id = self.fresh_id("b");
        self.mem(c).ops.push(Op {
            kind: OpKind::Borrow,
            item: item.to_owned(),
            request_id,
            quantity: want,
            attempt: 1,
            phase: Phase::Waiting,
        });
        let i = self.mem(c).ops.len() - 1;
        self.send(c, i)
    }

    /// `Agent::give_back`, first half: take the units out of the pool (the Return is sent
    /// by a later step, so a crash can fall in between).
    fn give_back(&mut self, c: usize, item: &str, max: u64) -> Res {
        let take_id = self.fresh_id("t");
        let taken = self.agents[c].pools.entry(item.to_owned()).or_default().take_for_return(&take_id, max)?;
        self.log(format!("{} takes {taken} of {item} to return ({take_id})", self.name(c)));
        if taken > 0 {
            self.mem(c).ops.push(Op {
                kind: OpKind::Return,
                item: item.to_owned(),
                request_id: take_id,
                quantity: taken,
                attempt: 1,
                phase: Phase::Taken,
            });
        }
        Ok(())
    }

    /// Moves one in-flight operation on: send a taken Return, time out (and retry with
    /// the same request id, or give up after the link's attempts), or add a grant to the
    /// pool.
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
                self.mem(c).ops.remove(i);
                self.mem(c).reachable = false;
                self.stats.give_ups += 1;
                self.log(format!(
                    "{} {} {} gave up after {} attempts; left to the next resync",
                    self.name(c),
                    op.kind,
                    op.request_id,
                    op.attempt
                ));
                Ok(())
            }
            Phase::Granted(granted) => {
                self.mem(c).ops.remove(i);
                self.refill(c, &op.item, &op.request_id, granted, "borrow")
            }
        }
    }

    /// `PoolStore::refill`, recording the application for the checker.
    fn refill(&mut self, c: usize, item: &str, grant_id: &str, units: u64, why: &str) -> Res {
        let generation = self.fresh_generation();
        let applied = self.agents[c].pools.entry(item.to_owned()).or_default().refill(grant_id, units, generation)?;
        if applied {
            *self.reference.refills.entry((c, item.to_owned(), grant_id.to_owned())).or_default() += 1;
        }
        self.log(format!(
            "{} refills {units} of {item} ({why} {grant_id}){}",
            self.name(c),
            if applied { "" } else { ": already applied" }
        ));
        if let Some(flags) = self.agents[c].mem.as_mut().and_then(|m| m.items.get_mut(item)) {
            flags.stock_returned_locally();
        }
        Ok(())
    }

    /// The link sends one attempt with the agent's current epoch (`CenterLink::retry`
    /// reads the epoch on every attempt).
    fn send(&mut self, c: usize, i: usize) -> Res {
        let mem = self.mem(c);
        let (incarnation, epoch, op) = (mem.incarnation, mem.epoch, mem.ops[i].clone());
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
            Message::Request { channel: c, incarnation, epoch, kind, item, quantity, request_id, attempt } => {
                let ch = self.agents[c].channel.clone();
                let breakage = self.config.breakage;
                let result = match kind {
                    OpKind::Borrow => self.center.borrow(&item, &ch, epoch, quantity, &request_id, &breakage),
                    OpKind::Return => self.center.give_back(&item, &ch, epoch, quantity, &request_id, &breakage),
                };
                match &result {
                    Ok((_, true)) => self.stats.replays_answered += 1,
                    Err(Refusal::Precondition(m)) if m.contains("stale epoch") => self.stats.stale_refused += 1,
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
                    self.network.push(Message::Reply { channel: c, incarnation, request_id, attempt, result });
                }
                Ok(())
            }
            Message::Reply { channel: c, incarnation, request_id, attempt, result } => {
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
                self.on_reply(c, i, result)
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
                    self.mem(c).ops.remove(i);
                } else {
                    self.mem(c).ops[i].phase = Phase::Granted(granted);
                }
                Ok(())
            }
            (OpKind::Return, Ok(Answer::Return { .. })) => {
                self.mem(c).ops.remove(i);
                self.log(format!("{who}: returned"));
                Ok(())
            }
            (OpKind::Return, Err(Refusal::Precondition(m))) => {
                self.mem(c).ops.remove(i);
                let back = self.agents[c].pools.entry(op.item.clone()).or_default().untake(&op.request_id)?;
                self.log(format!("{who}: refused ({m}); {back} units put back"));
                Ok(())
            }
            (OpKind::Return, Err(r)) => {
                self.mem(c).ops.remove(i);
                self.log(format!("{who}: {r}; outcome unknown, units left out"));
                Ok(())
            }
            (OpKind::Borrow, Err(r)) => {
                self.mem(c).ops.remove(i);
                self.log(format!("{who}: failed ({r})"));
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
                self.give_back(c, &item, u64::MAX)
            }
            CenterEvent::InDoubtResolved { item, .. } => {
                // The channel holds nothing of the item now: empty the pool, sell again.
                let generation = self.agents[c].pools.get(&item).map_or(0, |p| p.generation);
                self.align(c, &item, 0)?;
                let flags = self.flags(c, &item);
                flags.generation = generation;
                flags.frozen = false;
                flags.stock_returned_locally();
                self.reference.reclaimed_unsynced.remove(&(c, item));
                Ok(())
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Crashes, registration, operators
    // -----------------------------------------------------------------------------------

    /// The process dies: memory, in-flight tasks and the event stream are gone; the pool
    /// store and requests already on the wire are not.
    pub fn crash(&mut self, c: usize) {
        let ops = self.agents[c].mem.take().map_or(0, |m| m.ops.len());
        self.stats.crashes += 1;
        self.log(format!("{} crashes ({ops} calls in flight abandoned)", self.name(c)));
    }

    /// SIGTERM (`startup.rs`): no new acquires, workers stopped, every unreserved unit
    /// given back, a final report, exit. The Returns are sent but not awaited here (a
    /// superset of what the real shutdown does, which awaits them with the link's
    /// retries); the final report is not lost (a stop whose report fails counts as a
    /// crash).
    pub fn stop(&mut self, c: usize) -> Res {
        self.log(format!("{} stops gracefully", self.name(c)));
        for item in self.item_names() {
            self.give_back(c, &item, u64::MAX)?;
        }
        for i in 0..self.mem(c).ops.len() {
            if self.mem(c).ops[i].phase == Phase::Taken {
                self.mem(c).ops[i].phase = Phase::Waiting;
                self.send(c, i)?;
            }
        }
        let reports = self.reports(c);
        let (epoch, channel) = (self.mem(c).epoch, self.agents[c].channel.clone());
        let answer = self.center.heartbeat(&channel, epoch, &reports, self.now_ms);
        self.log(format!("final report of {channel}: {} -> {answer:?}", show_reports(&reports)));
        let ops = self.agents[c].mem.take().map_or(0, |m| m.ops.len());
        self.agents[c].stopped_gracefully = true;
        self.log(format!("{channel} exits ({ops} calls in flight abandoned)"));
        Ok(())
    }

    /// `Agent::reports`: the pools as the heartbeat reports them; a frozen one as lost.
    fn reports(&self, c: usize) -> Vec<Report> {
        let mem = self.agents[c].mem.as_ref().expect("a running agent reports");
        self.item_names()
            .into_iter()
            .map(|item| {
                if mem.items[&item].frozen {
                    return Report { item, counts: PoolCounts::default(), generation: 0, lost: true };
                }
                let pool = self.agents[c].pools.get(&item);
                let counts = pool.map(|p| p.counts()).unwrap_or_default();
                let generation = pool.map_or(0, |p| p.generation);
                Report { item, counts, generation, lost: false }
            })
            .collect()
    }

    /// A new process: items loaded fresh (`DescribeItem`), then register and resync.
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
        });
        self.log(format!("{} starts (incarnation {})", self.name(c), self.agents[c].incarnations));
        self.register_and_resync(c)
    }

    /// `Agent::register_and_resync`: a new epoch, then every pool brought in line with
    /// what the center says the channel holds.
    pub fn register_and_resync(&mut self, c: usize) -> Res {
        let name = self.name(c);
        let sent_at = self.now_ms;
        self.mem(c).lease_until_ms = 0; // `CenterLink::register` drops the lease
        let (epoch, held) = self.center.register(&name, &format!("{name}-1"), self.now_ms);
        self.mem(c).epoch = epoch;
        self.mem(c).last_heartbeat_ms = self.now_ms;
        self.log(format!("{name} registers: epoch {epoch}, holds {}", show_holdings(&held)));
        for h in held {
            self.resync(c, &h, true)?;
        }
        self.mem(c).renew_lease(sent_at);
        Ok(())
    }

    /// Another process of the channel (sharing its pool store) starts, registers, resyncs
    /// the pools and stops: a deploy overlapping the old process. The running agent is
    /// fenced and registers again at its next heartbeat, with its calls still in flight.
    fn rival(&mut self, c: usize) -> Res {
        let name = self.name(c);
        let (epoch, held) = self.center.register(&name, &format!("{name}-2"), self.now_ms);
        self.log(format!("a second {name} process registers: epoch {epoch}, holds {}", show_holdings(&held)));
        for h in held {
            self.resync(c, &h, false)?;
        }
        self.log(format!("the second {name} process stops"));
        Ok(())
    }

    /// `Agent::resync`. The running agent's flags are updated only if the agent is the
    /// one registering (not a [`rival`](Self::rival)).
    fn resync(&mut self, c: usize, h: &Holding, own: bool) -> Res {
        let (item, held) = (h.item.as_str(), h.held);
        let generation = self.agents[c].pools.get(item).map_or(0, |p| p.generation);
        let lost = h.in_doubt > 0
            || (generation == 0 && held > 0)
            || (h.generation != 0 && generation != 0 && generation != h.generation);
        if lost {
            // Never resell: the units may have been sold before the store lost them.
            self.log(format!("{} resync: pool of {item} lost; units in doubt, item frozen", self.name(c)));
            if own {
                self.flags(c, item).frozen = true;
            }
            return Ok(());
        }
        self.align(c, item, held)?;
        if generation != 0 && own {
            self.flags(c, item).generation = generation;
        }
        self.reference.reclaimed_unsynced.remove(&(c, item.to_owned()));
        Ok(())
    }

    /// `Agent::align`: makes the pool's total what the center says the channel holds.
    fn align(&mut self, c: usize, item: &str, held: u64) -> Res {
        let pool_sum = self.agents[c].pools.get(item).map_or(0, |p| p.counts().sum());
        let op_id = self.fresh_id("resync-");
        if held != pool_sum {
            self.stats.resync_moves += 1;
        }
        if held > pool_sum {
            self.refill(c, item, &op_id, held - pool_sum, "resync")?;
        } else if pool_sum > held {
            let excess = pool_sum - held;
            let taken = self.agents[c].pools.entry(item.to_owned()).or_default().take_for_return(&op_id, excess)?;
            self.log(format!("{} resync removes {taken} of {item} (excess {excess})", self.name(c)));
            let pool = &self.agents[c].pools[item];
            // Units written off as sold may stay in the pool; nothing else may.
            let written_off = self.reference.written_off.get(&(c, item.to_owned())).copied().unwrap_or(0);
            if pool.reserved + pool.sold > held + written_off {
                self.reference.noticed.push(Violation::new(
                    "3",
                    format!(
                        "resync of {}/{item}: the center counts {held} units as the channel's (+{written_off} written \
                         off) but its pool holds {pool_sum} ({} available, {} reserved, {} sold) and only {taken} \
                         could be removed: {} reserved/sold units are also back at the center, which can sell them \
                         again",
                        self.name(c),
                        pool.available + taken,
                        pool.reserved,
                        pool.sold,
                        pool.reserved + pool.sold - held - written_off
                    ),
                ));
            }
        }
        Ok(())
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
            let sold_in_pool = self.agents[c].pools.get(&item).map_or(0, |p| p.sold);
            let lost = self.reference.lost_sold.get(&key).copied().unwrap_or(0);
            let already = self.reference.written_off.get(&key).copied().unwrap_or(0);
            let sold = (sold_in_pool + lost).saturating_sub(already);
            let ch = self.agents[c].channel.clone();
            self.step += 1;
            let returned = self.center.resolve_in_doubt(&item, &ch, sold).map_err(|r| {
                Violation::new("8", format!("the operator cannot resolve {channel}/{item} with {sold} sold: {r}"))
            })?;
            self.log(format!(
                "operator resolves {channel}/{item}: {sold} written off as sold, {returned} back to the center"
            ));
            self.stats.resolutions += 1;
            if !self.reference.pool_losses.contains_key(&key) {
                self.stats.resolutions_without_data_loss += 1;
            }
            *self.reference.written_off.entry(key.clone()).or_default() += sold;
            // Until the agent hears of it, its (frozen) pool still has the returned units.
            *self.reference.reclaimed_unsynced.entry(key).or_default() += returned;
            self.fan_out();
        }
        Ok(())
    }

    /// The operator's `invctl reclaim --channel C`: refused while the lease is live.
    fn reclaim(&mut self, c: usize) -> Res {
        let channel = self.agents[c].channel.clone();
        let alive = if self.agents[c].mem.is_some() { "running" } else { "crashed" };
        match self.center.reclaim(&channel, self.now_ms) {
            Err(r) => {
                self.log(format!("reclaim {channel} ({alive}) -> {r}"));
            }
            Ok(items) => {
                self.log(format!("reclaim {channel} ({alive}) -> {items:?}"));
                self.stats.reclaims += 1;
                for (item, units) in items {
                    *self.reference.reclaimed_unsynced.entry((c, item)).or_default() += units;
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

    /// The pool's store loses its data (Redis restarted without persistence): invariant 8.
    fn lose_pool(&mut self, c: usize, item: &str) {
        let Some(pool) = self.agents[c].pools.get_mut(item) else { return };
        let sold = pool.sold;
        *pool = Default::default();
        *self.reference.lost_sold.entry((c, item.to_owned())).or_default() += sold;
        *self.reference.pool_losses.entry((c, item.to_owned())).or_default() += 1;
        self.log(format!("pool {}/{item} loses its data ({sold} sold units forgotten)", self.name(c)));
    }

    /// Whether faults are off (draining to quiescence and selling out).
    pub fn calm(&self) -> bool {
        self.step > self.config.steps
    }

    // -----------------------------------------------------------------------------------
    // Quiescence and the end of the sale
    // -----------------------------------------------------------------------------------

    /// Without faults: deliver everything in flight, let every call finish, every event
    /// be heard. `check` runs after every sub-step.
    pub fn drain(&mut self, check: &mut dyn FnMut(&World) -> Res) -> Res {
        for _ in 0..100_000 {
            self.step += 1;
            if !self.network.is_empty() {
                self.deliver(0)?;
            } else if let Some(c) =
                (0..self.agents.len()).find(|c| self.agents[*c].mem.as_ref().is_some_and(|m| !m.events.is_empty()))
            {
                self.watch_event(c)?;
            } else if let Some(c) =
                (0..self.agents.len()).find(|c| self.agents[*c].mem.as_ref().is_some_and(|m| !m.ops.is_empty()))
            {
                self.progress(c, 0)?;
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
