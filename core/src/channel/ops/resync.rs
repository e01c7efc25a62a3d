//! The resync's own steps: the calls of unknown outcome replayed before the center's
//! holding is read, the pool aligned to the plan, and what the resync concludes.

use super::{Effect, Op, OpResult, Progress, Stage};
use crate::channel::item::ItemCore;
use crate::channel::plan::ResyncPlan;
use crate::channel::{Mode, Note, PoolView};

impl ItemCore {
    /// Replays the `index`th call of unknown outcome (and those after it, one at a time),
    /// then asks the center for the channel's holding: once every call was answered for,
    /// that holding is final with respect to them.
    pub(super) fn settle_or_describe(&mut self, mut op: Op, from: usize, now_ms: i64) -> Progress {
        let next = self.unsettled.iter().enumerate().skip(from).find(|(_, u)| !u.answered).map(|(i, _)| i);
        let Some((index, u)) = next.map(|i| (i, &self.unsettled[i])) else {
            op.stage = Stage::Describe;
            return Progress::Next(op, Effect::Describe);
        };
        let effect = if u.borrow {
            Effect::Borrow {
                request_id: u.request_id.clone(),
                quantity: u.quantity,
                epoch: u.epoch,
                sell_rate_milli: self.sell_rate_milli(now_ms),
            }
        } else {
            Effect::Return { request_id: u.request_id.clone(), quantity: u.quantity, epoch: u.epoch }
        };
        op.stage = Stage::Settle { index };
        Progress::Next(op, effect)
    }

    /// Carries out a resync plan: one refill or take to bring the pool to its target, or
    /// none.
    pub(super) fn align(
        &mut self,
        mut op: Op,
        plan: ResyncPlan,
        view: PoolView,
        now_ms: i64,
        notes: &mut Vec<Note>,
    ) -> Progress {
        let target = match plan {
            ResyncPlan::Align { target } | ResyncPlan::Unfreeze { target } | ResyncPlan::Resume { target } => target,
            ResyncPlan::Lost | ResyncPlan::InDoubt => {
                self.resync_finished(&op, plan, view.generation, now_ms, notes);
                return Progress::Finished(op.id, OpResult::Resynced);
            }
        };
        let pool = view.total();
        let id = format!("resync-{}", op.fresh);
        let epoch = op.epoch;
        let (effect, added, removed) = if target > pool {
            let units = target - pool;
            (Effect::Refill { grant_id: id, units, epoch, must_exist: false, after_ms: 0 }, units, 0)
        } else if pool > target {
            (Effect::Take { take_id: id, max: pool - target, epoch }, 0, pool - target)
        } else {
            self.resync_finished(&op, plan, view.generation, now_ms, notes);
            return Progress::Finished(op.id, OpResult::Resynced);
        };
        op.stage = Stage::Align { added, removed, plan, generation: view.generation };
        Progress::Next(op, effect)
    }

    /// What a resync concludes once the pool is aligned.
    pub(super) fn resync_finished(
        &mut self,
        op: &Op,
        plan: ResyncPlan,
        generation: u64,
        now_ms: i64,
        notes: &mut Vec<Note>,
    ) {
        match plan {
            ResyncPlan::Unfreeze { .. } => {
                // The channel holds nothing of the item: a lost pool cost nothing. Sell
                // again from whatever the store has now (aligned to nothing).
                if self.mode != Mode::Selling {
                    notes.push(Note::Unfrozen);
                }
                self.mode = Mode::Selling;
                self.set_generation(generation);
            }
            ResyncPlan::Lost => {
                // Never resell: the units may have been sold before the store lost them.
                if self.mode != Mode::Lost {
                    notes.push(Note::PoolLost { known: self.generation, now: generation });
                    self.mode = Mode::Lost;
                }
            }
            ResyncPlan::InDoubt => {
                if self.mode == Mode::Selling {
                    notes.push(Note::InDoubt);
                    self.mode = Mode::InDoubt;
                }
            }
            ResyncPlan::Align { .. } => {
                if generation != 0 {
                    self.set_generation(generation);
                }
            }
            ResyncPlan::Resume { .. } => {
                if self.mode != Mode::Selling {
                    notes.push(Note::Unfrozen);
                }
                self.mode = Mode::Selling;
                self.set_generation(generation);
                self.stock_returned();
            }
        }
        if op.served.is_some() && self.resync_at == op.served {
            self.resync_at = None;
        }
        // The pool is aligned with a holding that counts every call answered for.
        self.unsettled.retain(|u| !u.answered);
        if !self.unsettled.is_empty() && self.resync_at.is_none() {
            // A call the center did not answer for: settle it at the next resync.
            self.resync_at = Some(now_ms + self.settings.resync_after_unknown_ms);
        }
    }
}
