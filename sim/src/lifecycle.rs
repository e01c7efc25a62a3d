//! The agent's sequences that span items, as `agent/src` runs them over the rules: start
//! and registration (`Agent::register`), heartbeats and reports (`Reporting`,
//! `workers::heartbeat`), the rebalancer's look (`Stocking::look`), the event watcher
//! (`events::apply`), the drain at shutdown (`Agent::drain`), a crash, and a second process
//! of the channel registering.

use std::collections::{BTreeMap, VecDeque};

use inventory_core::channel::lease;
use inventory_core::channel::{Ctx, ItemCore, OpKind, OpResult, Policy, PoolView, Report as CoreReport, ResyncWhy};
use inventory_core::ledger::PoolCounts;

use crate::agent::{Awaiter, Res, core_holding};
use crate::center::{CenterEvent, HeartbeatAnswer, Refusal, Report};
use crate::config::{IDLE_LOOK_EVERY_MS, LEASE_MARGIN_MS, LEASE_TTL_MS, Rivals, settings};
use crate::world::{AgentMem, RECORD_RETENTION_MS, Registration, Slot, Stopping, World, broken};

impl World {
    /// The item's policy and the center's stock, as DescribeItem gives them to a new process.
    fn load_item(&self, item: &str) -> ItemCore {
        let it = self.center.item(item);
        let policy = Policy {
            per_user_limit: it.state.per_user_limit,
            reservation_ttl_ms: it.state.reservation_ttl_ms,
            watermarks: it.watermarks,
            rate_batching: it.rate_batching,
            closed: false,
        };
        let mut core = ItemCore::new(policy, it.state.available, settings());
        core.set_schedule(self.loaded_schedule(item));
        core
    }

    /// A new process: every item loaded fresh, then the start-up registration.
    pub fn restart(&mut self, c: usize) -> Res {
        let items = self
            .item_names()
            .into_iter()
            .map(|name| {
                let slot = Slot {
                    core: self.load_item(&name),
                    work: None,
                    call: None,
                    kinds: BTreeMap::new(),
                    described: None,
                    granted: None,
                    misses: Vec::new(),
                };
                (name, slot)
            })
            .collect();
        let agent = &mut self.agents[c];
        agent.incarnations += 1;
        agent.stopped_gracefully = false;
        agent.mem = Some(AgentMem {
            incarnation: agent.incarnations,
            epoch: 0,
            lease_until_ms: 0,
            unanswered: 0,
            last_heartbeat_ms: self.now_ms,
            items,
            events: VecDeque::new(),
            watcher_awaits: None,
            registering: None,
            started: false,
            stopping: None,
            wakeups: Vec::new(),
            floors: BTreeMap::new(),
        });
        self.log(format!("{} starts (incarnation {})", self.name(c), self.agents[c].incarnations));
        self.register(c, true, 0)?;
        self.settle(c)
    }

    /// A running agent registers again (as its heartbeat worker does when fenced).
    pub fn register_and_resync(&mut self, c: usize) -> Res {
        self.register(c, false, 0)?;
        self.settle(c)
    }

    /// `Agent::register`: a new epoch (the lease dropped), then a resync of every item the
    /// center says the channel holds, queued behind whatever the item is doing; the lease
    /// follows once all have ended ([`World::registered`]). `fenced_at`: the highest pool
    /// fence a resync found at or above the last epoch (0: none).
    fn register(&mut self, c: usize, startup: bool, fenced_at: u64) -> Res {
        let name = self.name(c);
        let sent_at_ms = self.now_ms;
        let (epoch, held) = self.center.register(&name, &format!("{name}-1"), self.now_ms, fenced_at);
        let mem = self.mem(c);
        mem.lease_until_ms = 0;
        mem.epoch = epoch;
        mem.registering = Some(Registration {
            sent_at_ms,
            epoch,
            held: held.iter().map(|h| (h.item.clone(), h.clone())).collect(),
            pending: Vec::new(),
            failed: false,
            fenced_at: 0,
            startup,
        });
        self.measure_clock(c);
        self.note_epoch_reuse(c, epoch);
        self.log(format!("{name} registers: epoch {epoch}, holds {held:?}"));
        for h in held {
            self.adopt_floor(c, &h.item, h.write_seq_floor);
            self.submit(c, &h.item, OpKind::Resync(ResyncWhy::Registration { epoch }), Awaiter::Registration)?;
        }
        Ok(())
    }

    /// Every resync of the registration ended: the lease from the send time and a report
    /// at once, or, if one failed, no lease (the start-up registration is tried again; the
    /// heartbeat worker's next heartbeat renews the lease under the new epoch).
    pub(crate) fn registered(&mut self, c: usize) -> Res {
        let reg = self.mem(c).registering.take().expect("registering");
        if reg.fenced_at > 0 {
            // `Agent::register`: the epoch was handed out before; register again above
            // the fence, whichever registration this was.
            self.stats.registrations_above_fence += 1;
            self.log(format!(
                "{} registration (epoch {}) found its pools fenced at {}: registering above it",
                self.name(c),
                reg.epoch,
                reg.fenced_at
            ));
            return self.register(c, reg.startup, reg.fenced_at);
        }
        if reg.failed {
            self.stats.registrations_failed += 1;
            self.log(format!("{} registration (epoch {}) failed: a resync did not finish", self.name(c), reg.epoch));
            if reg.startup {
                return self.register(c, true, 0);
            }
            return Ok(());
        }
        let until = lease::lease_until(reg.sent_at_ms, LEASE_TTL_MS, LEASE_MARGIN_MS);
        let mem = self.mem(c);
        mem.lease_until_ms = mem.lease_until_ms.max(until);
        mem.started = true;
        self.log(format!("{} registered and resynced (epoch {})", self.name(c), reg.epoch));
        if let Some(Err(refused)) = self.send_reports(c, Reads::All, false, true) {
            // `Agent::register`: the first report under the new epoch was refused (the
            // channel was fenced since, or the ledger went back below this epoch): what
            // the center holds for the channel may have moved after the resync read it,
            // so register again.
            self.stats.registrations_report_refused += 1;
            self.log(format!("{} first report refused ({refused}): registering again", self.name(c)));
            return self.register(c, reg.startup, 0);
        }
        Ok(())
    }

    /// `Reporting::send` of every pool ([`Reads::All`]) or of those whose report changed:
    /// renews the lease and stops selling what the center holds in doubt. `None`: the
    /// heartbeat was lost.
    pub(crate) fn send_reports(
        &mut self,
        c: usize,
        reads: Reads,
        last_report: bool,
        may_lose: bool,
    ) -> Option<Result<HeartbeatAnswer, Refusal>> {
        let sent_at = self.now_ms;
        let ctx = self.ctx(c);
        let mut reports = Vec::new();
        for item in self.item_names() {
            let mut notes = Vec::new();
            let token = self.slot(c, &item).core.begin_read();
            let needs_read = self.slot(c, &item).core.report_needs_read();
            // `Reporting::quiet`: the stamp first; the pool is read whole only if it moved.
            let quiet = if reads == Reads::Quiet && needs_read {
                let stamp = self.stamp(c, &item);
                self.slot(c, &item).core.report_unchanged(stamp, token, ctx)
            } else {
                None
            };
            let report = match quiet {
                Some(report) => {
                    self.stats.quiet_reports += 1;
                    let lost = self.agents[c].pools.get(&item).is_some_and(|p| !p.exists());
                    self.stats.quiet_reports_of_lost_pools += u64::from(lost);
                    report
                }
                None => {
                    let read = if needs_read { Some(self.read_whole(c, &item)) } else { None };
                    let Some(report) = self.slot(c, &item).core.report_read(read, token, ctx, &mut notes) else {
                        continue;
                    };
                    report
                }
            };
            let slot = self.slot(c, &item);
            let rate = if report == CoreReport::Lost { 0 } else { slot.core.sell_rate_milli(ctx.now_ms) };
            if reads == Reads::All || slot.core.report_changed(&report, rate) {
                reports.push((item.clone(), report, rate));
            }
            for note in notes {
                self.log(format!("{}/{item}: {note:?}", self.name(c)));
            }
        }
        self.check_reports_true(c, &reports);
        if self.center_down() {
            self.mem(c).unanswered += 1;
            self.log(format!("heartbeat {}: the center's database does not answer", self.name(c)));
            return None;
        }
        if may_lose && !self.calm() && self.rng.percent(self.config.faults.lose_heartbeat_pct) {
            self.mem(c).unanswered += 1;
            self.log(format!("heartbeat {} lost", self.name(c)));
            return None;
        }
        let wire: Vec<Report> =
            reports.iter().map(|(item, r, rate)| to_wire(item, r, *rate, self.floor(c, item))).collect();
        let (epoch, channel) = (ctx.epoch, self.agents[c].channel.clone());
        let result = self.center.heartbeat(&channel, epoch, &wire, last_report, self.now_ms);
        self.mem(c).unanswered = 0;
        match &result {
            Ok(answer) => {
                self.stats.generation_changes += count(answer.generation_changed.len());
                self.stats.lost_pools_without_units += count(answer.lost_without_units.len());
                let until = lease::lease_until(sent_at, LEASE_TTL_MS, LEASE_MARGIN_MS);
                self.measure_clock(c);
                let mem = self.mem(c);
                mem.lease_until_ms = mem.lease_until_ms.max(until);
                for (item, r, rate) in reports {
                    self.slot(c, &item).core.reported(r, rate);
                }
                for item in &answer.in_doubt_items {
                    if self.slot(c, item).core.on_in_doubt() {
                        self.stats.frozen_by_center += 1;
                    }
                }
                for item in self.item_names().into_iter().filter(|i| !answer.in_doubt_items.contains(i)) {
                    self.slot(c, &item).core.on_not_in_doubt();
                }
                self.log(format!("heartbeat {channel} epoch {epoch} last {last_report}: {wire:?} -> {answer:?}"));
            }
            Err(r) => self.log(format!("heartbeat {channel} epoch {epoch}: {wire:?} -> {r}")),
        }
        Some(result)
    }

    /// Invariant R: each report of counts is what the pool holds as it is sent (reads and
    /// sends are one instant here), but for a pool lost with its hash left, whose stamp
    /// still vouches for its last whole read.
    fn check_reports_true(&mut self, c: usize, reports: &[(String, CoreReport, u64)]) {
        for (item, report) in reports.iter().map(|(i, r, _)| (i, r)) {
            let CoreReport::Counts(told) = report else { continue };
            let agent = &self.agents[c];
            let pool = agent.pools.get(item);
            if pool.is_some_and(|p| !p.exists()) && agent.stamps_left.contains_key(item) {
                continue;
            }
            let held = pool.map(|p| PoolView::from(&p.snapshot(self.now_ms))).unwrap_or_default();
            if held != *told {
                let line = format!("{} reported {item} as {told:?} while its pool holds {held:?}", agent.name());
                self.reference.untrue_reports.push(line);
            }
        }
    }

    /// `workers::heartbeat`: the changed pools; fenced (a stale epoch): register again.
    pub(crate) fn heartbeat(&mut self, c: usize) -> Res {
        self.mem(c).last_heartbeat_ms = self.now_ms;
        if let Some(Err(_)) = self.send_reports(c, Reads::Quiet, false, true) {
            self.log(format!("{} is fenced; registering again", self.name(c)));
            self.stats.fenced_reregistrations += 1;
            let calls = self.mem(c).items.values().any(|s| s.call.is_some());
            self.stats.fenced_with_calls_in_flight += u64::from(calls);
            self.register(c, false, 0)?;
        }
        Ok(())
    }

    /// `Stocking::look` (the rebalancer's pass over one item): a due resync, the expiry
    /// sweep, then the rules' watermark decision.
    pub fn rebalance(&mut self, c: usize, item: &str) -> Res {
        if self.agents[c].mem.as_ref().is_none_or(|m| !m.started || m.stopping.is_some()) {
            return Ok(());
        }
        let now = self.now_ms;
        if !self.slot(c, item).core.needs_look(now, IDLE_LOOK_EVERY_MS) {
            return Ok(());
        }
        for kind in self.slot(c, item).core.due_resyncs(now) {
            self.submit(c, item, kind, Awaiter::Nobody)?;
        }
        let ctx = self.ctx(c);
        let center_now = self.center_now(c);
        let token = self.slot(c, item).core.begin_read();
        // A quiet look (`core::channel::quiet`): the stamp first, for a pool whose last
        // whole look may still answer; else the sweep and a whole read.
        let unchanged = if self.slot(c, item).core.may_look_unchanged(now) {
            let stamp = self.stamp(c, item);
            self.slot(c, item).core.look_unchanged(stamp, token, ctx)
        } else {
            None
        };
        let mut notes = Vec::new();
        let quiet = unchanged.is_some();
        let (kind, freed) = if let Some(view) = unchanged {
            self.stats.quiet_looks += 1;
            let lost = self.agents[c].pools.get(item).is_some_and(|p| !p.exists());
            self.stats.quiet_looks_of_lost_pools += u64::from(lost);
            (self.slot(c, item).core.on_look_at(view, token, 0, ctx, center_now, &mut notes), 0)
        } else {
            self.guard_pool(c, item);
            let freed = match self.agents[c].pools.get_mut(item) {
                Some(pool) => pool.expire_due(1_000, now, RECORD_RETENTION_MS).map_err(broken)?,
                None => 0,
            };
            let (view, write_seq) = self.read_whole(c, item);
            (self.slot(c, item).core.on_whole_look(view, write_seq, token, freed, ctx, center_now, &mut notes), freed)
        };
        let view = self.slot(c, item).core.last_view();
        let prestock = self.slot(c, item).core.prestock_due(center_now);
        for note in notes {
            self.log(format!("{}/{item}: {note:?}", self.name(c)));
        }
        let how = if quiet { "quiet" } else { "whole" };
        self.log(format!("rebalance {}/{item} ({how}): {view:?}, freed {freed} -> {kind:?}", self.name(c)));
        if prestock {
            self.prestock(c, item)?;
        }
        if let Some(kind) = kind {
            self.submit(c, item, kind, Awaiter::Nobody)?;
        }
        self.settle(c)
    }

    /// Resyncs scheduled in running agents: (channel, item, when due).
    pub fn scheduled_resyncs(&self) -> Vec<(usize, String, i64)> {
        let mut scheduled = Vec::new();
        for (c, agent) in self.agents.iter().enumerate() {
            let Some(mem) = agent.mem.as_ref() else { continue };
            for (item, slot) in &mem.items {
                if let Some(at) = slot.core.resync_at() {
                    scheduled.push((c, item.clone(), at));
                }
            }
        }
        scheduled
    }

    /// `events::apply` for the next event of the channel's stream.
    pub(crate) fn hear(&mut self, c: usize) -> Res {
        let event = self.mem(c).events.pop_front().expect("caller checked");
        self.log(format!("{} hears {event:?}", self.name(c)));
        match event {
            CenterEvent::Restocked { item, center_available, .. } => {
                self.slot(c, &item).core.on_restocked(center_available);
            }
            CenterEvent::ReturnRequested { item, .. } => {
                let kind = self.slot(c, &item).core.on_return_requested();
                self.submit(c, &item, kind, Awaiter::Watcher)?;
            }
            CenterEvent::InDoubtResolved { item, .. } => {
                self.submit(c, &item, OpKind::Resync(ResyncWhy::Resolved), Awaiter::Watcher)?;
            }
            CenterEvent::ScheduleChanged { item, schedule } => self.slot(c, &item).core.set_schedule(schedule),
        }
        self.settle(c)
    }

    /// The agent's WatchChannel stream fell further behind than the center keeps events:
    /// the events it had not heard are gone. The center ends the stream
    /// (`center/src/service/center/stream.rs`) and the agent watches again, re-reading
    /// every item as the center has it now (`events::refresh_all`): the center's stock and
    /// the item's schedule. What else the lost events asked (a Return, a resync after units
    /// in doubt were resolved) is not asked again.
    pub(crate) fn watch_lag(&mut self, c: usize) -> Res {
        let missed = std::mem::take(&mut self.mem(c).events);
        self.stats.watch_lags += 1;
        self.stats.events_missed += u64::try_from(missed.len()).expect("small");
        self.log(format!(
            "{} watch fell behind, {} events unheard: {missed:?}; it watches again",
            self.name(c),
            missed.len()
        ));
        for item in self.item_names() {
            let available = self.center.item(&item).state.available;
            let schedule = self.loaded_schedule(&item);
            let core = &mut self.slot(c, &item).core;
            core.set_center_available(available);
            core.set_schedule(schedule);
        }
        self.settle(c)
    }

    /// The process dies: memory, operations, waiting Acquires and the event stream are
    /// gone; the pool store and the calls already on the wire are not.
    pub fn crash(&mut self, c: usize) {
        let calls = self.agents[c].mem.take().map_or(0, |m| m.items.values().filter(|s| s.call.is_some()).count());
        self.stats.crashes += 1;
        self.witnesses_gone(c);
        self.forget_prestocks(c);
        self.log(format!("{} crashes ({calls} calls in flight abandoned)", self.name(c)));
    }

    /// SIGTERM: no new Acquire, Confirm or Cancel; the workers finish what they await;
    /// then the drain ([`World::settle`] moves it on).
    pub fn stop(&mut self, c: usize) -> Res {
        self.log(format!("{} stops gracefully", self.name(c)));
        let left = self.item_names().into();
        self.mem(c).stopping = Some(Stopping { left, awaits: None, reported: false });
        self.settle(c)
    }

    /// The end of a drain: the final report, the agent's last word (a reclaim may put its
    /// unsold units back on sale), then the process exits.
    pub(crate) fn exit(&mut self, c: usize) -> Res {
        let answer = self.send_reports(c, Reads::All, true, false);
        self.agents[c].stopped_gracefully = matches!(answer, Some(Ok(_)));
        self.agents[c].mem = None;
        self.witnesses_gone(c);
        self.forget_prestocks(c);
        self.log(format!("{} exits", self.name(c)));
        Ok(())
    }

    /// Another process of the channel registers, fencing the running agent, which
    /// registers again at its next heartbeat. With [`Rivals::SharedStore`] it runs the
    /// rules too, on the same pool store: it resyncs every pool the center says the
    /// channel holds (its effects carried out at once), reports and stops.
    pub(crate) fn rival(&mut self, c: usize) -> Res {
        let name = self.name(c);
        let mut fenced_at = 0;
        // Registrations past a fence the ledger handed out again: one more each, at most.
        for _ in 0..3 {
            fenced_at = self.rival_registers(c, fenced_at)?;
            if fenced_at == 0 {
                break;
            }
            self.stats.registrations_above_fence += 1;
            self.log(format!("the second {name} process found its pools fenced at {fenced_at}: registering above it"));
        }
        self.log(format!("the second {name} process stops"));
        Ok(())
    }

    /// One registration of the second process (and its resyncs, on a shared store):
    /// the highest fence a resync found at or above its epoch (0: none).
    fn rival_registers(&mut self, c: usize, fenced_at: u64) -> Res<u64> {
        let name = self.name(c);
        let (epoch, held) = self.center.register(&name, &format!("{name}-2"), self.now_ms, fenced_at);
        self.log(format!("a second {name} process registers: epoch {epoch}, holds {held:?}"));
        let mut found = 0;
        if self.config.faults.rivals == Rivals::SharedStore {
            let ctx = Ctx { now_ms: self.now_ms, epoch };
            let mut reports = Vec::new();
            self.agents[c].rival_floors = held.iter().map(|h| (h.item.clone(), h.write_seq_floor)).collect();
            for h in held {
                let item = h.item.clone();
                let mut core = self.load_item(&item);
                let fresh = self.fresh_id("g");
                let (_, mut step) = core.submit(OpKind::Resync(ResyncWhy::Registration { epoch }), fresh, ctx);
                while let Some(work) = step.next.take() {
                    let reply = match &work.effect {
                        inventory_core::channel::Effect::Describe => {
                            inventory_core::channel::Reply::Holding(core_holding(&self.center.describe(&item, &name)))
                        }
                        effect => self.store(c, &item, effect)?,
                    };
                    step = core.feed(work.op, reply, ctx);
                    for (_, result) in &step.finished {
                        if let OpResult::EpochReused { fence } = result {
                            found = found.max(*fence);
                        }
                    }
                }
                if found > 0 {
                    continue;
                }
                if self.agents[c].pools.get(&item).map_or(0, |p| p.counts().sum()) <= h.held {
                    self.reference.synced(c, &item, h.as_of);
                }
                let view = self.view(c, &item);
                let mut notes = Vec::new();
                let token = core.begin_read();
                if let Some(r) = core.report(core.report_needs_read().then_some(view), token, ctx, &mut notes) {
                    let rate = if r == CoreReport::Lost { 0 } else { core.sell_rate_milli(ctx.now_ms) };
                    reports.push(to_wire(&item, &r, rate, self.floor(c, &item)));
                }
            }
            if found > 0 {
                return Ok(found);
            }
            let channel = self.agents[c].channel.clone();
            let answer = self.center.heartbeat(&channel, epoch, &reports, false, self.now_ms);
            self.log(format!("the second {name} process reports {reports:?} -> {answer:?}"));
            self.agents[c].rival_floors.clear();
        }
        Ok(found)
    }
}

/// A report as the heartbeat carries it (`PoolReport`).
/// Which pools a report reads, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Every pool read whole and reported (registration, the last report).
    All,
    /// Every pool read whole; those whose report changed are reported (the drain's first).
    Changed,
    /// Each pool's stamp, and a whole read of those whose stamp moved; those whose report
    /// changed are reported (the periodic heartbeat).
    Quiet,
}

/// `write_seq`: the pool's floor in the store layer (what the agent saw acknowledged).
fn to_wire(item: &str, r: &CoreReport, sell_rate_milli: u64, write_seq: u64) -> Report {
    match r {
        CoreReport::Lost => Report {
            item: item.to_owned(),
            counts: PoolCounts::default(),
            generation: 0,
            lost: true,
            sell_rate_milli: 0,
            write_seq,
        },
        CoreReport::Counts(v) => Report {
            item: item.to_owned(),
            counts: PoolCounts { available: v.available, reserved: v.reserved, sold: v.sold },
            generation: v.generation,
            lost: false,
            sell_rate_milli,
            write_seq,
        },
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
