//! A ledger rolled back to an earlier state ([`crate::Faults::ledger_rollback`]): an
//! asynchronous standby promoted with its last commits missing, or a backup restored. The
//! center's whole database (items, allocations, sessions and their epochs, the request
//! table) goes back to a copy taken some steps earlier, and the center restarts on it
//! (its sampler's memory starts empty); pools, agents and calls on the wire are untouched.
//!
//! The center's answer is the product's (`center/src/history.rs` over
//! `inventory_core::ledger::behind`): every [`SAMPLE_EVERY_MS`] it samples the
//! allocations; a drift that persists (`DriftTrack::persists`) and is negative means pools
//! hold units the ledger does not count: no Borrow of that item is served (UNAVAILABLE,
//! retried by the link) while any persists, and each is re-learned from the report
//! (`ledger::relearn`), short when the center has lent those units again meanwhile.
//!
//! What the checker allows, and counts apart: per channel, the pool may hold what the
//! rollback took from the channel's `held` and the relearn has not given back
//! ([`World::rollback_allowance`]); over all pools, buyers may hold more than the total by
//! at most what the rollbacks took (units lent again before the loss was seen and sold
//! from both shelves: `stats.oversold_after_rollback`, the most seen in a run). Anything
//! beyond either is a violation. Units the ledger counts with a channel that no pool holds
//! are stranded: a lost Return's commit (`stats.units_left_stranded_by_rollbacks`); the
//! sale ends without them. An epoch handed out again at or below the pools' fence is
//! counted (`stats.epochs_reused_by_rollbacks`) and never used: the registration's resync
//! finds the fence (`ledger::fence::reused`) and the agent registers again above it
//! (`stats.registrations_above_fence`); grants the pools refused as fenced meanwhile are
//! counted by that registration's resync.
//!
//! Known gaps, shown with pool rollbacks beside (`ledger-pool-rollback`): a ledger that
//! goes back past the commit of a lost pool's report no longer holds its units in doubt,
//! and the agent, whose report was acknowledged, sends it only when it changes: the units
//! stay with the channel and the sale ends without them (invariant 7, seed 432), or the
//! operator's resolution no longer matches what was sold (invariant 8, seed 2180); and a
//! pool that went back while its agent ran, then crashed or restarted before touching it,
//! is not caught (the floor is the process's memory; invariant 8, seeds 514, 1320, 1360,
//! 1896).

use std::collections::{BTreeMap, VecDeque};

use inventory_core::ledger::{self, DriftTrack, Relearned};

use crate::center::Center;
use crate::config::{HEARTBEAT_EVERY_MS, Violation};
use crate::phases::Checker;
use crate::world::World;

/// How many copies of the ledger are kept (one before each random step): a rollback loses
/// the commits of up to this many steps.
pub const SNAPSHOTS: usize = 40;
/// The center's sampler (`HistoryConfig::period` and `stuck_after`, the defaults).
pub const SAMPLE_EVERY_MS: i64 = 2_000;
pub const STUCK_AFTER_MS: i64 = 7_000;

/// The ledger's copies, the sampler's memory and what the checker knows of rollbacks.
#[derive(Debug, Clone, Default)]
pub struct LedgerHistory {
    /// Copies of the center before each random step, the newest last.
    pub snapshots: VecDeque<Center>,
    /// The sampler's memory (the center process's: lost with a rollback's restart).
    pub tracks: BTreeMap<(String, String), DriftTrack>,
    /// Persisting drifts at the last sample: (item, channel) -> drift.
    pub stuck: BTreeMap<(String, String), i64>,
    pub last_sample_ms: Option<i64>,
    pub next_sample_ms: i64,
    /// Reference model: (channel index, item) -> units a rollback took from the channel's
    /// `held` that no relearn has given back.
    pub allowance: BTreeMap<(usize, String), u64>,
    /// Reference model: item -> units rollbacks took from the channels' `held`, in all.
    pub lost: BTreeMap<String, u64>,
    /// Reference model: (channel index, item) -> the same, by channel: a channel may hold
    /// that much beyond its cap once relearned (the ledger forgot it held them and lent
    /// it up to the cap again).
    pub taken: BTreeMap<(usize, String), u64>,
    /// The most units buyers held over the total at any step.
    pub oversold: u64,
    /// Reference model: (channel index, item) -> units a rollback put back with the channel
    /// (its Returns' commits lost) that its pool does not hold and nothing has settled.
    pub stranded: BTreeMap<(usize, String), u64>,
    /// Channels a rolled-back ledger handed an epoch their pools were fenced above.
    pub epoch_reused: Vec<usize>,
}

impl World {
    /// Before a random step: a copy of the ledger as it is committed now.
    pub(crate) fn keep_ledger_copy(&mut self) {
        if !self.config.faults.ledger_rollback {
            return;
        }
        let copy = self.center.clone();
        let copies = &mut self.ledger.snapshots;
        copies.push_back(copy);
        if copies.len() > SNAPSHOTS {
            copies.pop_front();
        }
    }

    /// The center's database goes back to a copy taken 1–[`SNAPSHOTS`] steps ago, and the
    /// center restarts on it. What the checker's reference model counts (applications of
    /// a request id that a lost commit undid are undone with it) follows the copy; events
    /// already published stay published.
    pub(crate) fn roll_ledger_back(&mut self) {
        let n = self.ledger.snapshots.len();
        if n == 0 {
            return;
        }
        let back = self.rng.index(n) + 1;
        let mut copy = self.ledger.snapshots[n - back].clone();
        self.ledger.snapshots.truncate(n - back);
        let (mut lost_units, mut stranded_units) = (0, 0);
        for (c, agent) in self.agents.iter().enumerate() {
            for item in self.center.items.keys() {
                let (now, then) = (self.center.held(item, agent.name()), copy.held(item, agent.name()));
                if now > then {
                    *self.ledger.allowance.entry((c, item.clone())).or_default() += now - then;
                    *self.ledger.lost.entry(item.clone()).or_default() += now - then;
                    *self.ledger.taken.entry((c, item.clone())).or_default() += now - then;
                    lost_units += now - then;
                }
                if then > now {
                    *self.ledger.stranded.entry((c, item.clone())).or_default() += then - now;
                    stranded_units += then - now;
                }
            }
        }
        copy.stale_applied = std::mem::take(&mut self.center.stale_applied);
        copy.changes = self.center.changes;
        copy.outbox = std::mem::take(&mut self.center.outbox);
        copy.shared_borrows = self.center.shared_borrows;
        self.center = copy;
        self.ledger.tracks.clear();
        self.ledger.stuck.clear();
        self.ledger.last_sample_ms = None;
        self.stats.ledger_rollbacks += 1;
        self.stats.units_lost_by_rollbacks += lost_units;
        self.stats.units_returned_again_by_rollbacks += stranded_units;
        self.log(format!(
            "center: the ledger goes back {back} steps (a standby promoted without its last commits); \
             channels lose {lost_units} units of held and hold {stranded_units} again that they had given back"
        ));
    }

    /// The center's sampler, when due: the drift rule over every allocation, then the
    /// relearn of each persisting negative drift. Nothing while the database does not
    /// answer.
    pub(crate) fn sample_ledger(&mut self) {
        if !self.config.faults.ledger_rollback || self.now_ms < self.ledger.next_sample_ms || self.center_down() {
            return;
        }
        let now = self.now_ms;
        self.ledger.next_sample_ms = now + SAMPLE_EVERY_MS;
        let previous = self.ledger.last_sample_ms;
        let mut stuck = BTreeMap::new();
        for (key, a) in &self.center.allocations {
            let track = DriftTrack::observe(self.ledger.tracks.get(key).copied(), a, previous, now);
            self.ledger.tracks.insert(key.clone(), track);
            if track.persists(a, now, STUCK_AFTER_MS) || track.ledger_behind(a, now, STUCK_AFTER_MS) {
                stuck.insert(key.clone(), a.drift());
            }
        }
        self.ledger.stuck = stuck;
        self.ledger.last_sample_ms = Some(now);
        let behind: Vec<((String, String), i64)> =
            self.ledger.stuck.iter().filter(|(_, d)| **d < 0).map(|(k, d)| (k.clone(), *d)).collect();
        for ((item, channel), drift) in behind {
            let Some(entry) = self.center.items.get_mut(&item) else { continue };
            let Some(alloc) = self.center.allocations.get_mut(&(item.clone(), channel.clone())) else { continue };
            let learned = ledger::relearn(&mut entry.state, alloc, drift.unsigned_abs());
            let units = match learned {
                Relearned::Units(units) => units,
                Relearned::Short { units, short } => {
                    self.stats.relearns_short += 1;
                    self.stats.units_lent_twice += short;
                    units
                }
                Relearned::Nothing => 0,
            };
            if units > 0 {
                self.stats.relearns += 1;
                self.stats.units_relearned += units;
                if let Some(c) = self.agents.iter().position(|a| a.name() == channel) {
                    let left = self.ledger.allowance.entry((c, item.clone())).or_default();
                    *left = left.saturating_sub(units);
                }
            }
            self.log(format!("center: {channel}/{item} drift {drift} persists: relearn -> {learned:?}"));
        }
    }

    /// After every step: a channel's allowance shrinks with its pool's excess over what the
    /// center counts (a resync that dropped units, a grant that counted them again), so it
    /// never covers units shelved later; and the most buyers held over the total is noted.
    pub(crate) fn follow_rollbacks(&mut self) {
        if self.ledger.allowance.is_empty() {
            return;
        }
        let busy: Vec<(usize, String)> =
            self.ledger.allowance.keys().filter(|(c, item)| self.grant_may_land(*c, item)).cloned().collect();
        for ((c, item), left) in self.ledger.allowance.iter_mut() {
            if busy.contains(&(*c, item.clone())) {
                // A grant the lost commits answered may still be shelved.
                continue;
            }
            let agent = &self.agents[*c];
            let in_pool = agent.pools.get(item).map_or(0, |p| p.counts().sum());
            let lost_sold = self.reference.lost_sold.get(&(*c, item.clone())).copied().unwrap_or(0);
            let counted = self.center.held(item, agent.name())
                + self.reference.written_off.get(&(*c, item.clone())).copied().unwrap_or(0)
                + self.reference.reclaimed(*c, item);
            *left = (*left).min((in_pool + lost_sold).saturating_sub(counted));
        }
        self.ledger.allowance.retain(|_, left| *left > 0);
        for ((c, item), left) in self.ledger.stranded.iter_mut() {
            let agent = &self.agents[*c];
            let in_pool = agent.pools.get(item).map_or(0, |p| p.counts().sum());
            let lost_sold = self.reference.lost_sold.get(&(*c, item.clone())).copied().unwrap_or(0);
            let counted = self.center.held(item, agent.name())
                + self.reference.written_off.get(&(*c, item.clone())).copied().unwrap_or(0);
            *left = (*left).min(counted.saturating_sub(in_pool + lost_sold));
        }
        self.ledger.stranded.retain(|_, left| *left > 0);
        let mut over = 0;
        for (name, item) in &self.center.items {
            let committed: u64 = (0..self.agents.len())
                .map(|c| {
                    let pool = self.agents[c].pools.get(name);
                    pool.map_or(0, |p| p.reserved() + p.sold())
                        + self.reference.lost_sold.get(&(c, name.clone())).copied().unwrap_or(0)
                })
                .sum();
            over += committed.saturating_sub(item.state.total + item.state.written_off);
        }
        self.ledger.oversold = self.ledger.oversold.max(over);
    }

    /// Whether a grant may still reach channel `c`'s pool of `item`: its operation is under
    /// way (a call out, a reply on the wire, a grant not yet shelved). A resync never
    /// shelves more than the center counts, so only these can add units beyond it.
    fn grant_may_land(&self, c: usize, item: &str) -> bool {
        let Some(slot) = self.agents[c].mem.as_ref().and_then(|m| m.items.get(item)) else { return false };
        let reply = self
            .network
            .iter()
            .any(|m| matches!(m, crate::world::Message::Reply { channel, item: i, .. } if *channel == c && i == item));
        slot.call.is_some() || slot.work.is_some() || slot.granted.is_some() || reply
    }

    /// A registration answered `epoch`: after a rollback the ledger may hand out an epoch
    /// the channel's pools were already fenced with (or above). Counted: the registration's
    /// resync finds the fence and the agent registers again above it.
    pub(crate) fn note_epoch_reuse(&mut self, c: usize, epoch: u64) {
        if self.ledger.lost.is_empty() && self.stats.ledger_rollbacks == 0 {
            return;
        }
        let fence = self.agents[c].pools.values().map(inventory_core::pool::Pool::fence).max().unwrap_or(0);
        if fence >= epoch && !self.ledger.epoch_reused.contains(&c) {
            self.ledger.epoch_reused.push(c);
            self.stats.epochs_reused_by_rollbacks += 1;
            self.log(format!(
                "{}: the rolled-back ledger hands out epoch {epoch}; its pools are fenced at {fence}",
                self.name(c)
            ));
        }
    }

    /// A grant the pool refused as fenced after an epoch reused by a rolled-back ledger,
    /// counted apart: the registration above the fence counts it with the pool.
    pub(crate) fn grant_fenced(&mut self, c: usize, _item: &str, granted: u64) {
        if self.ledger.epoch_reused.contains(&c) {
            self.stats.units_granted_to_fenced_pools += granted;
        }
    }

    /// The run's figures of rollbacks: the most units sold over the total, and units still
    /// on shelves beyond what the ledger counts.
    pub(crate) fn end_of_run_rollback_stats(&mut self) {
        if self.ledger.oversold > 0 {
            self.stats.runs_oversold_after_rollback += 1;
            self.stats.oversold_after_rollback += self.ledger.oversold;
        }
        self.stats.units_left_beyond_ledger += self.ledger.allowance.values().sum::<u64>();
        self.stats.units_left_stranded_by_rollbacks += self.ledger.stranded.values().sum::<u64>();
    }

    /// Units of `item` a rollback left with channels whose pools no longer hold them (lost
    /// Returns): nothing in the product puts them back on sale (reconcile names them
    /// `stranded`), so the sale ends without them.
    pub fn stranded_by_rollbacks(&self, item: &str) -> u64 {
        self.ledger.stranded.iter().filter(|((_, i), _)| i == item).map(|(_, u)| u).sum()
    }

    /// Channel `c`'s units of `item` stranded by rollbacks.
    pub fn stranded_by_rollback(&self, c: usize, item: &str) -> u64 {
        self.ledger.stranded.get(&(c, item.to_owned())).copied().unwrap_or(0)
    }

    /// `refuse_if_beyond_ledger`: while a pool holds units of the item the ledger does not
    /// count, no Borrow of it is served.
    pub(crate) fn lending_stopped(&self, item: &str) -> bool {
        ledger::beyond_ledger(self.ledger.stuck.iter().filter(|((i, _), _)| i == item).map(|(_, d)| *d)) > 0
    }

    /// Units channel `c`'s pool of `item` may hold beyond what the center counts with it:
    /// what rollbacks took from its `held` and no relearn gave back.
    pub fn rollback_allowance(&self, c: usize, item: &str) -> u64 {
        self.ledger.allowance.get(&(c, item.to_owned())).copied().unwrap_or(0)
    }

    /// Units of `item` rollbacks took from channel `c`'s `held`, in all.
    pub fn taken_by_rollbacks(&self, c: usize, item: &str) -> u64 {
        self.ledger.taken.get(&(c, item.to_owned())).copied().unwrap_or(0)
    }

    /// Units of `item` rollbacks took from the channels, in all: the most buyers may hold
    /// beyond the total (units lent again before the loss was seen).
    pub fn lost_to_rollbacks(&self, item: &str) -> u64 {
        self.ledger.lost.get(item).copied().unwrap_or(0)
    }
}

/// At quiescence after rollbacks, the product's timers run on for a while (heartbeats,
/// the center's sampler), long enough for a drift to persist and be re-learned: what the
/// center does by itself once the storm is over.
pub(crate) fn let_the_center_sample(w: &mut World, ck: Checker) -> Result<(), Violation> {
    if w.stats.ledger_rollbacks == 0 {
        return Ok(());
    }
    w.log("--- the center samples its ledger while agents heartbeat ---".to_owned());
    for _ in 0..(2 * STUCK_AFTER_MS / HEARTBEAT_EVERY_MS) {
        w.step += 1;
        w.advance(HEARTBEAT_EVERY_MS)?;
        ck(w)?;
        w.drain(&mut |w| ck(w))?;
    }
    Ok(())
}
