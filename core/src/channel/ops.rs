//! The stocking operations of one item — Borrow, Return, resync — each a small state
//! machine, run one at a time from the item's queue. An operation asks for one effect at a
//! time ([`Work`]); the driver carries it out and feeds the result back
//! ([`ItemCore::feed`]). Every store write carries the epoch the operation read before its
//! first write, and so does its call to the center: a call of an earlier incarnation of
//! the channel is refused as stale, and its pool writes are refused below the pool's fence.

mod resync;

use super::item::ItemCore;
use super::plan::{ResyncPlan, resync_plan};
use super::{Ctx, Holding, Mode, Note, Step};

pub use super::effects::{CallFault, Effect, OpId, OpKind, OpResult, Reply, ResyncWhy, StoreFault, Work};

/// A Borrow or Return whose outcome is unknown, kept until the center answers a replay of
/// it (same request id, quantity and epoch) and the resync that replayed it has aligned
/// the pool with the holding that counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unsettled {
    pub request_id: String,
    pub quantity: u64,
    pub epoch: u64,
    pub borrow: bool,
    /// The center answered for it; the pool is aligned when the resync ends.
    pub answered: bool,
}

impl Unsettled {
    pub(super) fn new(request_id: String, quantity: u64, epoch: u64, borrow: bool) -> Self {
        Self { request_id, quantity, epoch, borrow, answered: false }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Queued {
    pub id: OpId,
    pub kind: OpKind,
    /// Fresh id from the driver: request, grant and take ids derive from it.
    pub fresh: String,
    /// `borrows_done` when a Borrow was queued.
    pub seen: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Op {
    pub id: OpId,
    pub kind: OpKind,
    pub fresh: String,
    /// The epoch read before the first pool write; every write and call carries it.
    pub epoch: u64,
    pub stage: Stage,
    /// A scheduled resync: the schedule it serves (cleared at the end unless replaced).
    pub served: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    // Borrow
    BorrowRead {
        want: u64,
    },
    BorrowOpen {
        want: u64,
    },
    BorrowReadOpened {
        want: u64,
    },
    BorrowCall {
        want: u64,
    },
    BorrowReadGranted {
        granted: u64,
    },
    BorrowRefill {
        granted: u64,
        attempt: u32,
    },
    /// The grant could not be shelved (the store refused every refill): it goes back to
    /// the center as a Return of its own.
    BorrowGiveBack {
        granted: u64,
    },
    // Return
    ReturnTake,
    ReturnCall {
        units: u64,
    },
    ReturnUntake,
    // Resync
    Fence,
    /// A call of unknown outcome (the `index`th still unsettled) is being replayed.
    Settle {
        index: usize,
    },
    Describe,
    ResyncRead {
        holding: Holding,
    },
    /// The lost part of the pool is being created afresh (empty); the pool is read again.
    Reopen {
        holding: Holding,
    },
    ReopenRead {
        holding: Holding,
    },
    /// A resync's one write (refill or take) is out; `generation` is the pool's as read.
    Align {
        added: u64,
        removed: u64,
        plan: ResyncPlan,
        generation: u64,
    },
}

impl ItemCore {
    /// Queues an operation; `fresh` is a new unique id (request/grant/take ids derive from
    /// it). Starts it at once if the item is idle.
    pub fn submit(&mut self, kind: OpKind, fresh: String, ctx: Ctx) -> (OpId, Step) {
        let id = OpId(self.next_op);
        self.next_op += 1;
        self.queue.push_back(Queued { id, kind, fresh, seen: self.borrows_done });
        let mut step = Step::default();
        if self.running.is_none() {
            self.start_next(ctx, &mut step);
        }
        (id, step)
    }

    /// Whether an operation runs or waits.
    pub fn busy(&self) -> bool {
        self.running.is_some() || !self.queue.is_empty()
    }

    /// The result of the running operation's effect.
    ///
    /// # Panics
    /// If `op` is not the running operation (a driver bug).
    pub fn feed(&mut self, op: OpId, reply: Reply, ctx: Ctx) -> Step {
        let mut step = Step::default();
        let running =
            self.running.take().filter(|r| r.id == op).expect("feed: a reply for an operation that is not running");
        // A write's answer is read only where a read follows the write (a Borrow's open
        // and refill); everywhere else it is the write done.
        let reply = match (running.stage, reply) {
            (Stage::BorrowOpen { .. } | Stage::BorrowRefill { .. }, reply) => reply,
            (_, Reply::Wrote { .. }) => Reply::Done,
            (_, reply) => reply,
        };
        match self.advance(running, reply, ctx, &mut step.notes) {
            Progress::Next(op, effect) => {
                step.next = Some(Work { op: op.id, effect });
                self.running = Some(op);
            }
            Progress::Finished(id, result) => {
                self.ops_finished += 1;
                step.finished.push((id, result));
                self.start_next(ctx, &mut step);
            }
        }
        step
    }

    /// The driver lost the operation's effect (its task died): the item must not stay
    /// busy. The operation ends as [`OpResult::Failed`] and a resync settles what it did.
    pub fn abandon(&mut self, op: OpId, ctx: Ctx) -> Step {
        let mut step = Step::default();
        if self.running.as_ref().is_some_and(|r| r.id == op) {
            self.running = None;
            self.ops_finished += 1;
            self.schedule_resync(ctx.now_ms + self.settings.resync_after_unknown_ms);
            step.finished.push((op, OpResult::Failed));
            self.start_next(ctx, &mut step);
        }
        step
    }

    fn start_next(&mut self, ctx: Ctx, step: &mut Step) {
        while self.running.is_none() {
            let Some(q) = self.queue.pop_front() else { return };
            match self.begin(q, ctx) {
                Progress::Next(op, effect) => {
                    step.next = Some(Work { op: op.id, effect });
                    self.running = Some(op);
                }
                Progress::Finished(id, result) => {
                    self.ops_finished += 1;
                    step.finished.push((id, result));
                }
            }
        }
    }

    fn begin(&mut self, q: Queued, ctx: Ctx) -> Progress {
        let op = |stage, epoch| Op { id: q.id, kind: q.kind, fresh: q.fresh.clone(), epoch, stage, served: None };
        match q.kind {
            OpKind::Borrow { want } => {
                if self.segments_lost {
                    // Part of the pool is lost: nothing comes in until it is reopened.
                    return Progress::Finished(q.id, OpResult::Borrowed { granted: 0 });
                }
                if self.borrows_done != q.seen {
                    return Progress::Finished(q.id, OpResult::Skipped);
                }
                if self.store_refusing(ctx.now_ms) {
                    return Progress::Finished(q.id, OpResult::Borrowed { granted: 0 });
                }
                Progress::Next(op(Stage::BorrowRead { want }, ctx.epoch), Effect::ReadPool)
            }
            OpKind::Return { max } => {
                // A lost or in-doubt pool gives nothing back: only an operator's
                // resolution moves those units.
                if self.mode != Mode::Selling || self.segments_lost {
                    return Progress::Finished(q.id, OpResult::Returned { units: 0 });
                }
                let effect = Effect::Take { take_id: q.fresh.clone(), max, epoch: ctx.epoch };
                Progress::Next(op(Stage::ReturnTake, ctx.epoch), effect)
            }
            OpKind::Resync(ResyncWhy::Registration { epoch }) => {
                Progress::Next(op(Stage::Fence, epoch), Effect::RaiseFence { epoch })
            }
            OpKind::Resync(ResyncWhy::Scheduled) => {
                // Another operation may have pushed the resync later (its own outcome is
                // unknown): then it is not due yet.
                if !self.resync_due(ctx.now_ms) {
                    return Progress::Finished(q.id, OpResult::Resynced);
                }
                let mut op = op(Stage::Describe, ctx.epoch);
                op.served = self.resync_at;
                self.settle_or_describe(op, 0, ctx.now_ms)
            }
            OpKind::Resync(ResyncWhy::Resolved) => {
                self.resolution_pending = false;
                self.settle_or_describe(op(Stage::Describe, ctx.epoch), 0, ctx.now_ms)
            }
        }
    }

    fn advance(&mut self, mut op: Op, reply: Reply, ctx: Ctx, notes: &mut Vec<Note>) -> Progress {
        let id = op.id;
        let epoch = op.epoch;
        let next = |mut op: Op, stage, effect| {
            op.stage = stage;
            Progress::Next(op, effect)
        };
        match (op.stage, reply) {
            // ---- Borrow ----
            (Stage::BorrowRead { want }, Reply::Pool(view)) => {
                // Never borrow into a pool the store lost (a refill would quietly recreate it).
                if self.check_pool(&view, ctx, notes) {
                    return self.borrow_ended(id, 0);
                }
                if view.generation == 0 {
                    // Create the pool before its first Borrow: later, a pool missing while
                    // the center counts units with the channel can only mean data loss.
                    let effect = Effect::OpenPool { grant_id: format!("open-{}", op.fresh), epoch };
                    return next(op, Stage::BorrowOpen { want }, effect);
                }
                self.borrow_call(op, want, ctx.now_ms)
            }
            (Stage::BorrowOpen { want }, Reply::Done) => next(op, Stage::BorrowReadOpened { want }, Effect::ReadPool),
            (Stage::BorrowOpen { want }, Reply::Wrote { view, .. }) => {
                // The open's answer is the read that would follow it.
                op.stage = Stage::BorrowReadOpened { want };
                self.advance(op, Reply::Pool(view), ctx, notes)
            }
            (Stage::BorrowReadOpened { want }, Reply::Pool(view)) if view.generation != 0 => {
                if self.generation == 0 {
                    self.set_generation(view.generation);
                }
                self.borrow_call(op, want, ctx.now_ms)
            }
            (Stage::BorrowOpen { .. } | Stage::BorrowReadOpened { .. }, _) => {
                notes.push(Note::StoreFailed { what: "open pool" });
                self.borrow_ended(id, 0)
            }
            (Stage::BorrowRead { .. }, _) => {
                notes.push(Note::StoreFailed { what: "read pool" });
                self.borrow_ended(id, 0)
            }
            (Stage::BorrowCall { want }, Reply::Granted { granted, center_available }) => {
                self.set_center_available(center_available);
                self.on_center_answered(ctx.now_ms);
                if granted == want && center_available >= self.watermarks_at(ctx.now_ms).high {
                    // The center has plenty again: prefetch resumes.
                    self.supply.end_of_sale = false;
                }
                if granted < want {
                    notes.push(Note::BorrowShort { want, granted });
                }
                if granted == 0 {
                    return self.borrow_ended(id, 0);
                }
                // The pool may have been lost while the Borrow was out: look again.
                next(op, Stage::BorrowReadGranted { granted }, Effect::ReadPool)
            }
            (Stage::BorrowCall { want }, reply) => {
                let unknown = reply == Reply::Center(CallFault::Unknown) || !matches!(reply, Reply::Center(_));
                notes.push(Note::CenterFailed { call: "borrow", unknown });
                if unknown {
                    // It may have been applied, or be applied whenever an attempt lands:
                    // settled by a replay, then the center's view, later.
                    self.schedule_resync(ctx.now_ms + self.settings.resync_after_unknown_ms);
                    self.unsettled.push(Unsettled::new(op.fresh.clone(), want, epoch, true));
                }
                self.borrow_ended(id, 0)
            }
            (Stage::BorrowReadGranted { granted }, Reply::Pool(view)) => {
                if self.check_pool(&view, ctx, notes) {
                    // The units count as the channel's and fall in doubt, once the center
                    // hears the pool is lost: it may have heard so before this grant.
                    self.last_reported = None;
                    return self.borrow_ended(id, 0);
                }
                let effect = self.refill_effect(&op, granted, 0);
                next(op, Stage::BorrowRefill { granted, attempt: 0 }, effect)
            }
            (Stage::BorrowReadGranted { granted }, _) => {
                // Not read: refill anyway (the refill itself refuses a missing pool).
                let effect = self.refill_effect(&op, granted, 0);
                next(op, Stage::BorrowRefill { granted, attempt: 0 }, effect)
            }
            (Stage::BorrowRefill { granted, .. }, Reply::Done) => {
                self.stock_returned();
                self.borrow_ended(id, granted)
            }
            (Stage::BorrowRefill { granted, .. }, Reply::Wrote { view, write_seq }) => {
                self.on_write_answer(view, write_seq, ctx.now_ms);
                self.stock_returned();
                self.borrow_ended(id, granted)
            }
            (Stage::BorrowRefill { granted, .. }, Reply::Store(StoreFault::Fenced)) => {
                notes.push(Note::GrantFenced { granted });
                self.borrow_ended(id, 0)
            }
            (Stage::BorrowRefill { .. }, Reply::Store(StoreFault::PoolMissing)) => {
                // Lost after the check above: freeze; the units fall in doubt (reported
                // lost again, in case the center heard of the loss before this grant).
                self.last_reported = None;
                if self.mode != Mode::Lost {
                    notes.push(Note::PoolLost { known: self.generation, now: 0 });
                    self.mode = Mode::Lost;
                    self.schedule_resync(ctx.now_ms + self.settings.lost_resync_after_ms);
                }
                self.borrow_ended(id, 0)
            }
            (Stage::BorrowRefill { granted, attempt }, reply) => {
                notes.push(Note::StoreFailed { what: "refill" });
                let refused = reply == Reply::Store(StoreFault::Refused);
                if refused {
                    // No Borrow while the store refuses writes: every unit borrowed now
                    // would wait at the center, held by a channel that cannot shelve it.
                    self.store_refused_until = Some(ctx.now_ms + self.settings.store_refused_pause_ms);
                }
                let attempt = attempt + 1;
                if attempt >= self.settings.refill_attempts && refused {
                    // The last attempt was refused before it wrote, and an earlier one that
                    // had landed would have been answered as done: the grant is not in the
                    // pool and never will be. It goes back, exactly once, under its own id.
                    notes.push(Note::GrantNotRefilled { granted });
                    let effect = Effect::Return { request_id: format!("back-{}", op.fresh), quantity: granted, epoch };
                    return next(op, Stage::BorrowGiveBack { granted }, effect);
                }
                if attempt >= self.settings.refill_attempts {
                    // Granted at the center but not in the pool: drift until a resync.
                    notes.push(Note::GrantNotRefilled { granted });
                    self.schedule_resync(ctx.now_ms + self.settings.resync_after_unknown_ms);
                    return self.borrow_ended(id, 0);
                }
                let effect = self.refill_effect(&op, granted, attempt);
                next(op, Stage::BorrowRefill { granted, attempt }, effect)
            }

            (Stage::BorrowGiveBack { granted }, Reply::Done) => {
                notes.push(Note::GrantGivenBack { granted });
                self.borrow_ended(id, 0)
            }
            (Stage::BorrowGiveBack { granted }, Reply::Center(CallFault::Refused | CallFault::NotFound)) => {
                // Still the channel's and not in the pool: drift until a resync shelves it.
                notes.push(Note::CenterFailed { call: "give back", unknown: false });
                notes.push(Note::GrantNotRefilled { granted });
                self.schedule_resync(ctx.now_ms + self.settings.resync_after_unknown_ms);
                self.borrow_ended(id, 0)
            }
            (Stage::BorrowGiveBack { granted }, _) => {
                notes.push(Note::CenterFailed { call: "give back", unknown: true });
                let request_id = format!("back-{}", op.fresh);
                self.unsettled.push(Unsettled::new(request_id, granted, epoch, false));
                self.schedule_resync(ctx.now_ms + self.settings.resync_after_unknown_ms);
                self.borrow_ended(id, 0)
            }

            // ---- Return ----
            (Stage::ReturnTake, Reply::Units(0)) => Progress::Finished(id, OpResult::Returned { units: 0 }),
            (Stage::ReturnTake, Reply::Units(units)) => {
                let effect = Effect::Return { request_id: op.fresh.clone(), quantity: units, epoch };
                next(op, Stage::ReturnCall { units }, effect)
            }
            (Stage::ReturnTake, reply) => {
                notes.push(Note::StoreFailed { what: "take for return" });
                if reply == Reply::Store(StoreFault::Failed) {
                    // The take may have landed with its answer lost: units out of the pool
                    // that the center still counts with the channel. A resync puts them back.
                    self.resync_by(ctx.now_ms + self.settings.resync_after_unknown_ms);
                }
                Progress::Finished(id, OpResult::Returned { units: 0 })
            }
            (Stage::ReturnCall { units }, Reply::Done) => Progress::Finished(id, OpResult::Returned { units }),
            (Stage::ReturnCall { .. }, Reply::Center(CallFault::Refused | CallFault::NotFound)) => {
                // Not applied: the units stay the channel's and go back into the pool
                // (refused as fenced if a newer incarnation took over: its resync counts them).
                notes.push(Note::ReturnRefused);
                let effect = Effect::Untake { take_id: op.fresh.clone(), epoch };
                next(op, Stage::ReturnUntake, effect)
            }
            (Stage::ReturnCall { units }, _) => {
                // Unknown whether it applied. The units stay out of the pool (never sold
                // twice); a replay, then a resync with the center's view, settles it.
                notes.push(Note::CenterFailed { call: "return", unknown: true });
                self.schedule_resync(ctx.now_ms + self.settings.resync_after_unknown_ms);
                self.unsettled.push(Unsettled::new(op.fresh.clone(), units, epoch, false));
                Progress::Finished(id, OpResult::Returned { units: 0 })
            }
            (Stage::ReturnUntake, reply) => {
                match reply {
                    Reply::Units(n) if n > 0 => self.stock_returned(),
                    Reply::Units(_) | Reply::Store(StoreFault::Fenced) => {}
                    _ => {
                        // Neither given back nor put back (the store refused or failed the
                        // undo): the center counts the taken units with the channel and no
                        // shelf holds them until a resync puts them back.
                        notes.push(Note::StoreFailed { what: "untake" });
                        self.resync_by(ctx.now_ms + self.settings.resync_after_unknown_ms);
                    }
                }
                Progress::Finished(id, OpResult::Returned { units: 0 })
            }

            // ---- Resync ----
            (Stage::Fence, Reply::Fence { found }) if crate::ledger::fence::reused(found, op.epoch) => {
                notes.push(Note::EpochReused { epoch: op.epoch, fence: found });
                Progress::Finished(id, OpResult::EpochReused { fence: found })
            }
            (Stage::Fence, Reply::Fence { .. }) => self.settle_or_describe(op, 0, ctx.now_ms),
            (Stage::Settle { index }, reply) => {
                let answered = match reply {
                    Reply::Granted { .. } | Reply::Done => true,
                    // Refused (a stale epoch, more than held) or unknown item: it never
                    // applied, and no attempt of it can apply later.
                    Reply::Center(CallFault::Refused | CallFault::NotFound) => true,
                    _ => false,
                };
                if !answered {
                    // The center still does not answer: the rest waits too.
                    notes.push(Note::CenterFailed { call: "settle", unknown: true });
                    let op = Op { stage: Stage::Describe, ..op };
                    return Progress::Next(op, Effect::Describe);
                }
                // Still unsettled for the selling side until this resync has aligned the
                // pool: an empty pool is no proof of being sold out before the refill.
                let settled = &mut self.unsettled[index];
                settled.answered = true;
                notes.push(Note::Settled { borrow: settled.borrow });
                self.settle_or_describe(op, index + 1, ctx.now_ms)
            }
            (Stage::Describe, Reply::Holding(holding)) => next(op, Stage::ResyncRead { holding }, Effect::ReadPool),
            (Stage::ResyncRead { holding }, Reply::Pool(view)) if self.segments_lost && self.mode == Mode::Selling => {
                // Part of the pool is lost. Reopen it (empty) once the operator settled the
                // center's doubt, or when the center counts nothing in doubt and the intact
                // part accounts for everything held (the lost part held nothing). Else wait:
                // for the operator, or for the center to hear of the loss (ask again soon).
                let resolved = op.kind == OpKind::Resync(ResyncWhy::Resolved);
                // (A center generation of 0 says it heard of the loss: it then takes the
                // reopened pool's new generation without calling it a loss.)
                let nothing_lost = holding.in_doubt == 0 && holding.generation == 0 && view.total() == holding.held;
                if resolved || nothing_lost {
                    // Reads begun before this may show the new generation: stale from now.
                    self.reopening = true;
                    self.generation_changes += 1;
                    let effect = Effect::OpenPool { grant_id: format!("reopen-{}", op.fresh), epoch: ctx.epoch };
                    return next(op, Stage::Reopen { holding }, effect);
                }
                if op.served.is_some() && self.resync_at == op.served {
                    self.resync_at = None;
                }
                if !resolved && holding.in_doubt == 0 {
                    self.schedule_resync(ctx.now_ms + self.settings.lost_resync_after_ms);
                }
                Progress::Finished(id, OpResult::Resynced)
            }
            (Stage::Reopen { holding }, Reply::Done) => next(op, Stage::ReopenRead { holding }, Effect::ReadPool),
            (Stage::ReopenRead { holding }, Reply::Pool(view)) => {
                // The pool is whole again, under a new generation the rules adopt; reads
                // begun meanwhile are stale. (Should this resync fail before here, the
                // part stays lost and reopening: the next resync reopens again.)
                self.segments_lost = false;
                self.reopening = false;
                self.set_generation(view.generation);
                self.generation_changes += 1;
                notes.push(Note::Unfrozen);
                let plan = if op.kind == OpKind::Resync(ResyncWhy::Resolved) {
                    ResyncPlan::Resume { target: holding.held }
                } else {
                    ResyncPlan::Align { target: holding.held }
                };
                op.epoch = ctx.epoch;
                self.align(op, plan, view, ctx.now_ms, notes)
            }
            (Stage::ResyncRead { holding }, Reply::Pool(view)) => {
                let resolved = op.kind == OpKind::Resync(ResyncWhy::Resolved);
                // A Return still unsettled may land and take its units from the channel's
                // holding: adding them back now would sell them twice.
                let only_remove = self.unsettled.iter().any(|u| !u.borrow && !u.answered);
                let plan = if resolved {
                    ResyncPlan::Resume { target: holding.held }
                } else {
                    resync_plan(&holding, &view, only_remove)
                };
                if plan == ResyncPlan::Lost && holding.in_doubt < holding.held {
                    // Units the center granted after it heard the pool was lost are not in
                    // doubt yet: report the pool lost again, or they stay stranded here.
                    self.last_reported = None;
                }
                // Pool writes of a resync carry the channel's epoch now (the registration's).
                op.epoch = ctx.epoch;
                self.align(op, plan, view, ctx.now_ms, notes)
            }
            (Stage::Align { added, removed, plan, generation }, Reply::Done | Reply::Units(_)) => {
                let removed = match reply {
                    Reply::Units(taken) => {
                        if taken < removed {
                            notes.push(Note::BeyondGrant { units: removed - taken });
                        }
                        taken
                    }
                    _ => removed,
                };
                if added > 0 {
                    self.stock_returned();
                }
                if added > 0 || removed > 0 {
                    notes.push(Note::Aligned { added, removed });
                }
                self.resync_finished(&op, plan, generation, ctx.now_ms, notes);
                Progress::Finished(id, OpResult::Resynced)
            }
            (
                Stage::Fence
                | Stage::Describe
                | Stage::ResyncRead { .. }
                | Stage::Reopen { .. }
                | Stage::ReopenRead { .. }
                | Stage::Align { .. },
                reply,
            ) => {
                match reply {
                    Reply::Center(_) => notes.push(Note::CenterFailed { call: "describe", unknown: false }),
                    _ => notes.push(Note::StoreFailed { what: "resync" }),
                }
                if op.kind == OpKind::Resync(ResyncWhy::Resolved) {
                    // The resolution is not forgotten: the next look queues it again.
                    self.resolution_pending = true;
                }
                if matches!(op.kind, OpKind::Resync(ResyncWhy::Registration { .. })) {
                    // The channel may go on under the new epoch (its next heartbeat renews
                    // the lease) with this pool never aligned: a scheduled resync aligns it.
                    // Not a registration's again: its fence, if raised, would read as an
                    // epoch handed out twice.
                    self.resync_by(ctx.now_ms + self.settings.resync_after_unknown_ms);
                }
                Progress::Finished(id, OpResult::Failed)
            }
        }
    }

    fn borrow_call(&mut self, op: Op, want: u64, now_ms: i64) -> Progress {
        let effect = Effect::Borrow {
            request_id: op.fresh.clone(),
            quantity: want,
            epoch: op.epoch,
            sell_rate_milli: self.sell_rate_milli(now_ms),
        };
        let mut op = op;
        op.stage = Stage::BorrowCall { want };
        Progress::Next(op, effect)
    }

    fn refill_effect(&self, op: &Op, granted: u64, attempt: u32) -> Effect {
        // The grant id is the Borrow's request id, so a replay of either counts once.
        Effect::Refill {
            grant_id: op.fresh.clone(),
            units: granted,
            epoch: op.epoch,
            must_exist: true,
            after_ms: if attempt == 0 { 0 } else { 50u64 << attempt.min(10) },
        }
    }

    fn borrow_ended(&mut self, id: OpId, granted: u64) -> Progress {
        self.borrows_done += 1;
        Progress::Finished(id, OpResult::Borrowed { granted })
    }
}

enum Progress {
    Next(Op, Effect),
    Finished(OpId, OpResult),
}
