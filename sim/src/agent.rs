//! The agent's stocking driver, as `agent/src/stocking.rs` runs it: each item's
//! operations come from its [`ItemCore`]; the driver carries out one effect at a time and
//! feeds the result back. A store effect is one atomic step on the channel's durable
//! [`Pool`] (the Lua scripts are atomic); a Borrow or Return goes to the link
//! ([`crate::net`]); a DescribeItem is answered at once, or lost. Each effect is a step of
//! its own, so crashes, data losses, events and other calls fall between any two.

use inventory_core::channel::{
    CallFault, Ctx, Effect, Holding as CoreHolding, Note, OpId, OpKind, OpResult, PoolStamp, PoolView, Reply,
    ResyncWhy, Step, StoreFault,
};
use inventory_core::pool::{PoolError, went_back};

use crate::center::Holding;
use crate::config::Violation;
use crate::world::{AgentMem, Call, Miss, RECORD_RETENTION_MS, Slot, Wakeup, World, broken};

pub type Res<T = ()> = Result<T, Violation>;

/// Who awaits an operation's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Awaiter {
    /// Nobody (a background Borrow, the rebalancer's operations).
    Nobody,
    /// An Acquire, to try the pool once more.
    Miss(Miss),
    /// The registration (`Agent::register` awaits every resync).
    Registration,
    /// The event watcher (a give-back, a resolution's resync).
    Watcher,
    /// The drain's give-back at shutdown.
    Stopping,
}

/// The center's DescribeItem answer as the rules read it.
pub fn core_holding(h: &Holding) -> CoreHolding {
    CoreHolding { held: h.held, generation: h.generation, in_doubt: h.in_doubt }
}

impl World {
    pub(crate) fn mem(&mut self, c: usize) -> &mut AgentMem {
        self.agents[c].mem.as_mut().expect("caller checked the agent is up")
    }

    pub(crate) fn slot(&mut self, c: usize, item: &str) -> &mut Slot {
        self.mem(c).items.get_mut(item).expect("every item is loaded")
    }

    pub(crate) fn name(&self, c: usize) -> String {
        self.agents[c].name().to_owned()
    }

    /// The inputs of a transition now: the clock and the link's epoch.
    pub(crate) fn ctx(&self, c: usize) -> Ctx {
        Ctx { now_ms: self.now_ms, epoch: self.agents[c].mem.as_ref().map_or(0, |m| m.epoch) }
    }

    /// The pool as a store snapshot reads it (generation 0: it does not exist).
    pub(crate) fn view(&mut self, c: usize, item: &str) -> PoolView {
        self.read_whole(c, item).0
    }

    /// [`World::view`] with the pool's write sequence as the same read saw it.
    pub(crate) fn read_whole(&mut self, c: usize, item: &str) -> (PoolView, u64) {
        self.guard_pool(c, item);
        self.saw_pool(c, item);
        let snap = self.agents[c].pools.get(item).map(|p| p.snapshot(self.now_ms));
        if let Some(s) = &snap {
            let stamp = PoolStamp { generation: s.generation, write_seq: s.write_seq };
            self.agents[c].stamps_read.insert(item.to_owned(), stamp);
        }
        snap.map(|s| (PoolView::from(&s), s.write_seq)).unwrap_or_default()
    }

    /// `PoolStore::stamps`: the pool hash's generation and write sequence, read without
    /// the markers (the Redis store's `lua/stamps.lua`). A pool below the store layer's
    /// floor reads as generation 0; a pool lost with its hash left still shows the hash's.
    pub(crate) fn stamp(&mut self, c: usize, item: &str) -> PoolStamp {
        let floor = self.floor(c, item);
        let agent = &mut self.agents[c];
        match agent.pools.get(item) {
            Some(p) if p.exists() => {
                agent.stamps_left.remove(item);
                let s = p.snapshot(self.now_ms);
                let generation = if went_back(floor, s.write_seq) { 0 } else { s.generation };
                let read = agent.stamps_read.get(item).filter(|r| r.generation == generation);
                match read {
                    Some(read) if self.config.breakage.stamps_miss_writes => *read,
                    _ => PoolStamp { generation, write_seq: s.write_seq },
                }
            }
            p => agent
                .stamps_left
                .get(item)
                .copied()
                .unwrap_or(PoolStamp { generation: 0, write_seq: p.map_or(0, |p| p.write_seq()) }),
        }
    }

    /// `Stocking::submit`: queues an operation of the item, `awaiter` waiting for its end.
    pub(crate) fn submit(&mut self, c: usize, item: &str, kind: OpKind, awaiter: Awaiter) -> Res<OpId> {
        let prefix = match kind {
            OpKind::Borrow { .. } => "b",
            OpKind::Return { .. } => "t",
            OpKind::Resync(_) => "g",
        };
        let fresh = self.fresh_id(prefix);
        let ctx = self.ctx(c);
        let slot = self.slot(c, item);
        if matches!(kind, OpKind::Resync(ResyncWhy::Registration { .. })) && slot.core.busy() {
            self.stats.resyncs_waiting_for_a_call += 1;
        }
        let slot = self.slot(c, item);
        let (id, step) = slot.core.submit(kind, fresh.clone(), ctx);
        slot.kinds.insert(id, kind);
        let mem = self.mem(c);
        match awaiter {
            Awaiter::Nobody => {}
            Awaiter::Miss(miss) => mem.items.get_mut(item).expect("loaded").misses.push((id, miss)),
            Awaiter::Registration => mem.registering.as_mut().expect("registering").pending.push((item.to_owned(), id)),
            Awaiter::Watcher => mem.watcher_awaits = Some((item.to_owned(), id)),
            Awaiter::Stopping => mem.stopping.as_mut().expect("stopping").awaits = Some((item.to_owned(), id)),
        }
        self.log(format!("{} queues {kind:?} of {item} ({fresh})", self.name(c)));
        self.apply(c, item, step)?;
        Ok(id)
    }

    /// Records a transition: its notes, its next effect, the operations that finished.
    pub(crate) fn apply(&mut self, c: usize, item: &str, step: Step) -> Res {
        self.notes(c, item, &step.notes);
        if let Some(work) = step.next {
            let slot = self.slot(c, item);
            debug_assert!(slot.work.is_none() && slot.call.is_none(), "one effect at a time");
            slot.work = Some(work);
        }
        for (id, result) in step.finished {
            self.finished(c, item, id, result);
        }
        Ok(())
    }

    fn notes(&mut self, c: usize, item: &str, notes: &[Note]) {
        for note in notes {
            match note {
                Note::PoolLost { .. } if self.slot(c, item).granted.is_some() => self.stats.refills_withheld += 1,
                Note::CenterFailed { call, unknown: true } if *call != "describe" => self.stats.unknown_outcomes += 1,
                Note::Aligned { .. } => self.stats.resync_moves += 1,
                Note::Settled { .. } => self.stats.settled_by_replay += 1,
                Note::GrantGivenBack { .. } => self.stats.grants_given_back += 1,
                Note::StoreFailed { what: "untake" } => self.stats.untakes_failed += 1,
                Note::GrantFenced { granted } => self.grant_fenced(c, item, *granted),

                Note::Unfrozen => self.stats.unfrozen += 1,
                Note::InDoubt => self.stats.held_in_doubt += 1,
                _ => {}
            }
            self.log(format!("{}/{item}: {note:?}", self.name(c)));
        }
    }

    /// An operation ended: whoever awaits it goes on.
    fn finished(&mut self, c: usize, item: &str, id: OpId, result: OpResult) {
        let total = self.agents[c].pools.get(item).map_or(0, |p| p.counts().sum());
        let now = self.now_ms;
        let slot = self.slot(c, item);
        let kind = slot.kinds.remove(&id);
        if slot.granted == Some(id) {
            slot.granted = None;
        }
        let described = slot.described.take_if(|(op, _)| *op == id).map(|(_, h)| h);
        let selling = slot.core.mode() == inventory_core::channel::Mode::Selling;
        let (waking, misses): (Vec<_>, Vec<_>) =
            std::mem::take(&mut slot.misses).into_iter().partition(|(op, _)| *op == id);
        slot.misses = misses;
        let mem = self.mem(c);
        for (_, miss) in waking {
            mem.wakeups.push(Wakeup { item: item.to_owned(), miss, finished_at_ms: now });
        }
        if let Some(reg) = mem.registering.as_mut()
            && let Some(i) = reg.pending.iter().position(|(it, op)| it == item && *op == id)
        {
            reg.pending.remove(i);
            if let OpResult::EpochReused { fence } = result {
                reg.fenced_at = reg.fenced_at.max(fence);
            }
            reg.failed |= result != OpResult::Resynced;
        }
        if mem.watcher_awaits.as_ref().is_some_and(|(it, op)| it == item && *op == id) {
            mem.watcher_awaits = None;
        }
        if let Some(st) = mem.stopping.as_mut()
            && st.awaits.as_ref().is_some_and(|(it, op)| it == item && *op == id)
        {
            st.awaits = None;
        }
        if let Some(h) = described
            && result == OpResult::Resynced
        {
            // A pool aligned to at most what the center counted then has dropped every unit
            // taken from the channel (reclaimed, resolved) before that answer.
            if total <= h.held {
                self.reference.synced(c, item, h.as_of);
            }
            if matches!(kind, Some(OpKind::Resync(ResyncWhy::Registration { .. }))) && selling && total < h.held {
                self.stats.registration_adds_withheld += 1;
            }
        }
        self.prestock_ended(c, item, id, &result);
        self.log(format!("{} {kind:?} of {item} ends: {result:?}", self.name(c)));
    }

    /// Carries out the item's pending effect and feeds the result back.
    pub(crate) fn perform(&mut self, c: usize, item: &str) -> Res {
        let work = self.slot(c, item).work.take().expect("caller checked");
        let reply = match &work.effect {
            Effect::Borrow { request_id, quantity, epoch, .. } | Effect::Return { request_id, quantity, epoch } => {
                let (borrow, sell_rate_milli) = match work.effect {
                    Effect::Borrow { sell_rate_milli, .. } => (true, sell_rate_milli),
                    _ => (false, 0),
                };
                // The Return tells the center how far the pool got, its take included.
                let write_seq = if borrow { 0 } else { self.floor(c, item) };
                self.slot(c, item).call = Some(Call {
                    op: work.op,
                    borrow,
                    request_id: request_id.clone(),
                    quantity: *quantity,
                    epoch: *epoch,
                    attempt: 1,
                    sell_rate_milli,
                    write_seq,
                });
                return self.send(c, item);
            }
            Effect::Describe => self.describe(c, item, work.op),
            effect => self.store(c, item, effect)?,
        };
        self.feed(c, item, work.op, reply)
    }

    /// Feeds a reply to the item's running operation.
    pub(crate) fn feed(&mut self, c: usize, item: &str, op: OpId, reply: Reply) -> Res {
        let ctx = self.ctx(c);
        let step = self.slot(c, item).core.feed(op, reply, ctx);
        self.apply(c, item, step)
    }

    /// DescribeItem: answered at once (it is read-only), or lost.
    fn describe(&mut self, c: usize, item: &str, op: OpId) -> Reply {
        if self.center_down() {
            self.mem(c).unanswered += 1;
            self.log(format!("{} describe {item}: the center's database does not answer", self.name(c)));
            return Reply::Center(CallFault::Unknown);
        }
        if !self.calm() && self.rng.percent(self.config.faults.lose_request_pct) {
            self.mem(c).unanswered += 1;
            self.log(format!("{} describe {item}: lost", self.name(c)));
            return Reply::Center(CallFault::Unknown);
        }
        let h = self.center.describe(item, self.agents[c].name());
        self.mem(c).unanswered = 0;
        // The resync reads the pool next: with the floor the center remembers.
        self.adopt_floor(c, item, h.write_seq_floor);
        let kind = self.slot(c, item).kinds.get(&op).copied();
        match kind {
            Some(OpKind::Resync(ResyncWhy::Scheduled)) => self.stats.item_resyncs += 1,
            Some(OpKind::Resync(ResyncWhy::Registration { .. })) => {
                let answered = self.mem(c).registering.as_ref().and_then(|r| r.held.get(item)).map_or(0, |h| h.held);
                if answered != h.held {
                    self.stats.registration_held_moved += 1;
                }
            }
            _ => {}
        }
        self.log(format!(
            "{} describes {item}: held {} generation {} in doubt {}",
            self.name(c),
            h.held,
            h.generation,
            h.in_doubt
        ));
        let reply = Reply::Holding(core_holding(&h));
        self.slot(c, item).described = Some((op, h));
        reply
    }

    /// A pool store effect, one atomic step on the channel's pool (the store of `agents[c]`,
    /// whichever process asks).
    pub(crate) fn store(&mut self, c: usize, item: &str, effect: &Effect) -> Res<Reply> {
        let now = self.now_ms;
        let generation = self.fresh_generation();
        if self.agents[c].store_full_until.is_some() && self.refused_when_full(c, item, effect) {
            self.stats.store_writes_refused += 1;
            self.log(format!("{} store {item}: {effect:?} -> refused (at its memory limit)", self.name(c)));
            return Ok(Reply::Store(StoreFault::Refused));
        }
        self.guard_pool(c, item);
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let fence = pool.fence();
        let result: Result<Reply, PoolError> = match effect {
            Effect::ReadPool => Ok(Reply::Pool(PoolView::from(&pool.snapshot(now)))),
            Effect::OpenPool { grant_id, epoch } => {
                let existed = pool.exists();
                pool.refill(grant_id, 0, *epoch, generation, now, RECORD_RETENTION_MS).map(|_| {
                    self.stats.pools_opened += u64::from(!existed);
                    Reply::Done
                })
            }
            Effect::Refill { grant_id, units, epoch, must_exist, .. } => {
                let r = if *must_exist {
                    pool.refill_existing(grant_id, *units, *epoch, now, RECORD_RETENTION_MS)
                } else {
                    pool.refill(grant_id, *units, *epoch, generation, now, RECORD_RETENTION_MS)
                };
                if r == Ok(true) && *units > 0 {
                    *self.reference.refills.entry((c, item.to_owned(), grant_id.clone())).or_default() += 1;
                }
                if r == Err(PoolError::Missing) && *must_exist {
                    self.stats.refills_of_missing_pools += 1;
                }
                r.map(|_| Reply::Done)
            }
            Effect::Take { take_id, max, epoch } => {
                pool.take_for_return(take_id, *max, *epoch, now, RECORD_RETENTION_MS).map(Reply::Units)
            }
            Effect::Untake { take_id, epoch } => pool.untake(take_id, *epoch).map(Reply::Units),
            Effect::RaiseFence { epoch } => {
                if fence != 0 && fence < *epoch {
                    self.stats.fences_raised += 1;
                }
                Ok(Reply::Fence { found: pool.raise_fence(*epoch) })
            }
            Effect::Borrow { .. } | Effect::Return { .. } | Effect::Describe => unreachable!("not a store effect"),
        };
        let reply = match result {
            Ok(reply) => reply,
            Err(PoolError::Fenced { .. }) => {
                self.stats.store_calls_fenced += 1;
                Reply::Store(StoreFault::Fenced)
            }
            Err(PoolError::Missing) => Reply::Store(StoreFault::PoolMissing),
            Err(e) => return Err(broken(e)),
        };
        let reply = self.answer_write(c, item, effect, reply);
        self.saw_pool(c, item);
        self.log(format!("{} store {item}: {effect:?} -> {reply:?}", self.name(c)));
        Ok(reply)
    }

    /// `PoolStore::refill_read`: a refill done is answered with the pool as it left it, in
    /// the same atomic step (the Redis store's `lua/refill.lua`). Every third step's store
    /// answers without it, as a segmented item's pools do, so the rules' path for a write
    /// with a read after it keeps running too (decided without a draw, so the seeds' other
    /// faults stay what they were).
    fn answer_write(&mut self, c: usize, item: &str, effect: &Effect, reply: Reply) -> Reply {
        let refill = matches!(effect, Effect::OpenPool { .. } | Effect::Refill { .. });
        if reply != Reply::Done || !refill || self.step.is_multiple_of(3) {
            return reply;
        }
        let Some(s) = self.agents[c].pools.get(item).map(|p| p.snapshot(self.now_ms)) else { return reply };
        self.agents[c]
            .stamps_read
            .insert(item.to_owned(), PoolStamp { generation: s.generation, write_seq: s.write_seq });
        self.stats.write_answers += 1;
        Reply::Wrote { view: PoolView::from(&s), write_seq: s.write_seq }
    }

    /// Whether a store at its memory limit refuses `effect`: every write but a replay that
    /// finds its grant already applied (the scripts check before their first write).
    fn refused_when_full(&self, c: usize, item: &str, effect: &Effect) -> bool {
        let pool = self.agents[c].pools.get(item);
        match effect {
            Effect::ReadPool => false,
            Effect::OpenPool { .. } => pool.is_none_or(|p| !p.exists()),
            Effect::Refill { grant_id, .. } => {
                !self.reference.refills.contains_key(&(c, item.to_owned(), grant_id.clone()))
            }
            Effect::RaiseFence { epoch } => pool.is_some_and(|p| p.fence() < *epoch),
            Effect::Take { .. } | Effect::Untake { .. } => true,
            Effect::Borrow { .. } | Effect::Return { .. } | Effect::Describe => false,
        }
    }

    /// What the driver does next once nothing else is in the way: a registration whose
    /// resyncs all ended grants the lease; a stopping agent whose workers are done gives
    /// back item after item, waits until every operation ended, reports and exits.
    pub fn settle(&mut self, c: usize) -> Res {
        loop {
            let Some(mem) = self.agents[c].mem.as_ref() else { return Ok(()) };
            if mem.registering.as_ref().is_some_and(|r| r.pending.is_empty()) {
                self.registered(c)?;
                continue;
            }
            let Some(st) = mem.stopping.as_ref() else { return Ok(()) };
            if mem.registering.is_some() || mem.watcher_awaits.is_some() || st.awaits.is_some() {
                return Ok(());
            }
            if !st.reported {
                // `Agent::drain`: the changed pools are reported before the first take, so
                // the center's floors cover every sale made (a store that then goes back is
                // caught by whichever process comes next). Lost: the Returns still carry
                // their own write sequences.
                self.mem(c).stopping.as_mut().expect("stopping").reported = true;
                self.send_reports(c, crate::lifecycle::Reads::Changed, false, true);
                continue;
            }
            if let Some(item) = st.left.front().cloned() {
                self.mem(c).stopping.as_mut().expect("stopping").left.pop_front();
                self.submit(c, &item, OpKind::Return { max: u64::MAX }, Awaiter::Stopping)?;
                continue;
            }
            if mem.items.values().any(|s| s.core.busy()) || !mem.wakeups.is_empty() {
                return Ok(());
            }
            return self.exit(c);
        }
    }

    pub fn settle_all(&mut self) -> Res {
        for c in 0..self.agents.len() {
            self.settle(c)?;
        }
        self.follow_rollbacks();
        Ok(())
    }
}
