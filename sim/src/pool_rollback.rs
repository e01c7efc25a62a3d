//! A pool store that goes back in time (a Redis restarted from an older snapshot, a
//! lagging replica promoted): the fault saves a copy of a pool, later puts it back with
//! the same generation and older contents; and the agent's store layer that tells such a
//! pool from a live one, as `agent/src/store/redis` does with `lua/intact.lua`: the
//! highest write sequence the agent's own calls saw is its floor, and a pool below it
//! is lost (`core::pool::went_back`), read as one that does not exist before anything of
//! it is read or written.

use std::borrow::Cow;

use inventory_core::pool::{Pool, went_back};

use crate::world::World;

/// Whether the agent's store layer compares a pool's write sequence with its floor (off
/// only to show what a rolled-back pool does without it).
pub const CHECK_FLOOR: bool = true;

impl World {
    /// Before every call of the agent's process on the pool: a pool below the floor is
    /// dropped as lost (what it had sold stays sold, as for a pool whose data is lost).
    pub(crate) fn guard_pool(&mut self, c: usize, item: &str) {
        let floor = self.floor(c, item);
        let Some(pool) = self.agents[c].pools.get_mut(item) else { return };
        let (sold, existed) = (pool.sold(), pool.exists());
        if !pool.drop_if_behind(floor) {
            return;
        }
        if !existed {
            return; // a pool the store lost outright: only its sequence continues
        }
        *self.reference.lost_sold.entry((c, item.to_owned())).or_default() += sold;
        self.reference.rollback_unseen.remove(&(c, item.to_owned()));
        self.stats.rollbacks_caught += 1;
        self.log(format!("{} store {item}: behind its floor {floor}: lost", self.name(c)));
    }

    /// `PoolStore::raise_floor` with the floor the center remembers (registration,
    /// DescribeItem): the running process's floor rises to it, so its next call on a pool
    /// that went back finds it lost.
    pub(crate) fn adopt_floor(&mut self, c: usize, item: &str, floor: u64) {
        if floor == 0 {
            return;
        }
        if let Some(mem) = self.agents[c].mem.as_mut() {
            let f = mem.floors.entry(item.to_owned()).or_default();
            *f = (*f).max(floor);
        }
    }

    /// The store layer's floor of the pool (0 while the agent is down, or when the check
    /// is off).
    pub(crate) fn floor(&self, c: usize, item: &str) -> u64 {
        let agent = &self.agents[c];
        let floor = agent.mem.as_ref().and_then(|m| m.floors.get(item).copied()).unwrap_or(0);
        let floor = floor.max(agent.rival_floors.get(item).copied().unwrap_or(0));
        if CHECK_FLOOR { floor } else { 0 }
    }

    /// The floor the pool is read with: the running process's, or while none runs, the
    /// one the center remembers, which the next process adopts before touching the pool.
    fn seen_floor(&self, c: usize, item: &str) -> u64 {
        if self.agents[c].mem.is_some() || !CHECK_FLOOR {
            return self.floor(c, item);
        }
        self.floor(c, item).max(self.center.write_seq_floor(item, self.agents[c].name()))
    }

    /// The pool as the agent's store layer reads it: one below its floor is lost (read as
    /// not existing), whether or not a call has found it so yet. The checker looks at
    /// pools through this, as the agent sells from them.
    pub fn pool_seen(&self, c: usize, item: &str) -> Option<Cow<'_, Pool>> {
        let pool = self.agents[c].pools.get(item)?;
        let floor = self.seen_floor(c, item);
        if !went_back(floor, pool.write_seq()) {
            return Some(Cow::Borrowed(pool));
        }
        let mut dropped = pool.clone();
        dropped.drop_if_behind(floor);
        Some(Cow::Owned(dropped))
    }

    /// Sold units of the channel's pool that rollbacks without a surviving witness forgot
    /// ([`World::witnesses_gone`]): the most that may exist twice on their account.
    pub fn unwitnessed(&self, c: usize, item: &str) -> u64 {
        self.reference.unwitnessed.get(&(c, item.to_owned())).copied().unwrap_or(0)
    }

    /// Units sold from pool data since lost, with those of a pool below its floor.
    pub fn lost_sold(&self, c: usize, item: &str) -> u64 {
        let lost = self.reference.lost_sold.get(&(c, item.to_owned())).copied().unwrap_or(0);
        let behind = self.agents[c].pools.get(item).filter(|p| went_back(self.seen_floor(c, item), p.write_seq()));
        lost + behind.map_or(0, Pool::sold)
    }

    /// After every call of the agent's process on the pool: its floor rises to the
    /// pool's write sequence (every call here is answered at once).
    pub(crate) fn saw_pool(&mut self, c: usize, item: &str) {
        let Some(seq) = self.agents[c].pools.get(item).map(inventory_core::pool::Pool::write_seq) else { return };
        if let Some(mem) = self.agents[c].mem.as_mut() {
            let floor = mem.floors.entry(item.to_owned()).or_default();
            *floor = (*floor).max(seq);
        }
        if let Some(floor) = self.agents[c].rival_floors.get_mut(item) {
            *floor = (*floor).max(seq);
        }
    }

    /// When the channel's process is gone (crashed, or exited): a rollback it had not
    /// caught yet is caught by the next one only if the center's floor or another process
    /// of the channel (a rival on the same store) saw the pool further than it now is.
    /// Otherwise nobody can know what it forgot: its sold units may be sold again, and
    /// are counted as such (`units_forgotten_unwitnessed`), never more.
    pub(crate) fn witnesses_gone(&mut self, c: usize) {
        let name = self.agents[c].name().to_owned();
        let unseen: Vec<(String, u64)> = self
            .reference
            .rollback_unseen
            .iter()
            .filter(|((ch, _), _)| *ch == c)
            .map(|((_, item), n)| (item.clone(), *n))
            .collect();
        for (item, forgotten) in unseen {
            let Some(seq) = self.agents[c].pools.get(&item).map(Pool::write_seq) else { continue };
            let remembered = self.center.write_seq_floor(&item, &name);
            let rival = self.agents[c].rival_floors.get(&item).copied().unwrap_or(0);
            if went_back(remembered.max(rival), seq) {
                continue; // the next process adopts the floor and finds the pool lost
            }
            self.reference.rollback_unseen.remove(&(c, item.clone()));
            *self.reference.unwitnessed.entry((c, item.clone())).or_default() += forgotten;
            self.stats.rollbacks_unwitnessed += 1;
            self.stats.units_forgotten_unwitnessed += forgotten;
            self.log(format!(
                "{name}/{item}: the pool went back and every process that saw its later writes is gone ({forgotten} \
                 sold units forgotten for good)"
            ));
        }
    }

    /// The fault: the first time, the store saves a copy of the pool (a snapshot); the
    /// next, it puts the copy back if the pool still has its generation and was written
    /// since (same generation, older contents). While the agent that saw those writes
    /// runs; or, whatever runs (a restarted agent, none), if the copy is older than the
    /// floor the center remembers from the channel's reports ([`World::adopt_floor`]).
    /// Not made: a copy newer than every report, put back after every process that saw
    /// the writes since is gone (only that process knew them: a known gap).
    pub(crate) fn roll_back_pool(&mut self, c: usize, item: &str) {
        let incarnation = self.agents[c].incarnations;
        let Some(pool) = self.agents[c].pools.get(item).cloned() else { return };
        let live = self.agents[c].mem.is_some();
        match self.agents[c].saved.remove(item) {
            None => {
                if pool.exists() && live {
                    self.agents[c].saved.insert(item.to_owned(), (incarnation, pool));
                    self.log(format!("{} store saves a snapshot of {item}", self.name(c)));
                }
            }
            Some((saved_in, copy)) => {
                let same = copy.generation() == pool.generation() && copy.write_seq() < pool.write_seq();
                let remembered = self.center.write_seq_floor(item, self.agents[c].name());
                let witnessed = (live && saved_in == incarnation) || copy.write_seq() < remembered;
                if !(same && witnessed) {
                    return;
                }
                // What buyers hold as sold is the live pool's sold; the copy's are counted
                // as they are found lost (or still sold from the copy, without the check).
                let lost = self.reference.lost_sold.entry((c, item.to_owned())).or_default();
                *lost = (*lost + pool.sold()).saturating_sub(copy.sold());
                let forgotten = pool.sold().saturating_sub(copy.sold());
                *self.reference.rollback_unseen.entry((c, item.to_owned())).or_default() += forgotten;
                *self.reference.pool_losses.entry((c, item.to_owned())).or_default() += 1;
                self.stats.pool_rollbacks += 1;
                self.log(format!(
                    "pool {}/{item} goes back to its snapshot (write {} -> {}, {forgotten} sold units forgotten)",
                    self.name(c),
                    pool.write_seq(),
                    copy.write_seq()
                ));
                self.agents[c].pools.insert(item.to_owned(), copy);
            }
        }
    }
}
