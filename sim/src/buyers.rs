//! Buyers and the agent's selling path, as `agent/src/selling/acquire.rs` runs it over the rules:
//! admission, one pool call, and on a miss the rules' plan (answer, signal in the
//! background, or wait up to the miss wait for the item's Borrow and try once more).

use std::collections::BTreeSet;

use inventory_core::channel::{Admission, Gate, MissPlan, OpKind, Refusal};

use crate::agent::{Awaiter, Res};
use crate::config::{MISS_WAIT_MS, Violation};
use crate::world::{
    AcquireArgs, AcquireResult, KeyUse, Miss, RECORD_RETENTION_MS, ReservationState, Transition, World, broken,
};

/// Users per run: few, so per-user limits bite.
const USERS: u64 = 6;

impl World {
    pub(crate) fn random_acquire(&mut self) -> Res {
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

    /// `Selling::acquire`: admission by the rules, one pool call; on a miss, the rules'
    /// plan. An Acquire that waits for a Borrow goes on in [`World::wake`].
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
        if !mem.lease_valid(self.now_ms) {
            self.log(format!("{what} -> unavailable (the agent's lease expired)"));
            return Ok(());
        }
        let center_now = self.center_now(c);
        let admission = match self.slot(c, item).core.gate(key, quantity, center_now) {
            Gate::NotStarted { opens_at_ms } => {
                self.stats.not_started_answers += 1;
                self.log(format!("{what} -> not started (opens at {opens_at_ms}, from memory)"));
                return Ok(());
            }
            Gate::Admit(admission) => admission,
        };
        let shelf = match admission {
            Admission::Refuse(r @ (Refusal::Lost | Refusal::InDoubt)) => {
                self.log(format!("{what} -> unavailable ({r:?})"));
                return Ok(());
            }
            Admission::Refuse(Refusal::OverLimit { limit }) => {
                self.log(format!("{what} -> invalid (above limit {limit})"));
                return Ok(());
            }
            Admission::SoldOut => {
                self.log(format!("{what} -> sold out (from memory)"));
                let ctx = self.ctx(c);
                if let Some(want) = self.slot(c, item).core.on_fast_sold_out(quantity, ctx) {
                    self.submit(c, item, OpKind::Borrow { want }, Awaiter::Nobody)?;
                }
                return self.settle(c);
            }
            Admission::Store { shelf } => shelf,
        };
        let Some(available) = self.reserve(c, item, user, quantity, key, replay_of, &what)? else {
            self.slot(c, item).core.touch();
            return Ok(());
        };
        let key_use = match replay_of {
            Some(k) => k,
            None => {
                self.remember_key(c, item, user, quantity, key);
                self.keys.len() - 1
            }
        };
        let ctx = self.ctx(c);
        match self.slot(c, item).core.on_miss(quantity, ctx) {
            MissPlan::Answer => self.answered_sold_out(c, item, shelf, available, &what, false),
            MissPlan::Signal { want } => {
                self.submit(c, item, OpKind::Borrow { want }, Awaiter::Nobody)?;
                self.answered_sold_out(c, item, shelf, available, &what, false)?;
                self.settle(c)
            }
            MissPlan::Borrow { want } => {
                self.log(format!("{what} -> pool empty; waits for a borrow"));
                let miss = Miss {
                    user: user.to_owned(),
                    quantity,
                    key: key.to_owned(),
                    key_use,
                    at_ms: self.now_ms,
                    shelf,
                    available,
                };
                self.submit(c, item, OpKind::Borrow { want }, Awaiter::Miss(miss))?;
                self.settle(c)
            }
        }
    }

    /// The Acquire whose Borrow ended tries the pool once more, if the Borrow ended within
    /// the miss wait (else it has answered with the first sold-out).
    pub(crate) fn wake(&mut self, c: usize, i: usize) -> Res {
        let w = self.mem(c).wakeups.remove(i);
        let (item, miss) = (w.item, w.miss);
        let what = format!("acquire {}/{item} {} x{} key {} (retry)", self.name(c), miss.user, miss.quantity, miss.key);
        let center_now = self.center_now(c);
        let available = if w.finished_at_ms - miss.at_ms > MISS_WAIT_MS {
            self.log(format!("{what}: the caller stopped waiting"));
            miss.available
        } else if !self.slot(c, &item).core.may_retry(center_now) {
            self.stats.retries_past_the_schedule += 1;
            self.log(format!("{what}: the sale is not open any more; answers the miss"));
            miss.available
        } else {
            let r = self.reserve(c, &item, &miss.user, miss.quantity, &miss.key, Some(miss.key_use), &what)?;
            let Some(available) = r else { return Ok(()) };
            available
        };
        self.answered_sold_out(c, &item, miss.shelf, available, &what, true)?;
        self.settle(c)
    }

    /// SOLD_OUT answered (after a Borrow: UNAVAILABLE if the center counts as
    /// unreachable); an empty pool may turn the fast path on.
    fn answered_sold_out(
        &mut self,
        c: usize,
        item: &str,
        shelf: u64,
        available: u64,
        what: &str,
        borrowed: bool,
    ) -> Res {
        if borrowed && !inventory_core::channel::lease::reachable(self.mem(c).unanswered) {
            self.log(format!("{what} -> unavailable (pool empty, center unreachable)"));
            return Ok(());
        }
        self.log(format!("{what} -> sold out (pool available {available})"));
        if self.slot(c, item).core.on_sold_out(shelf, available, true) {
            let keys: BTreeSet<String> = self.agents[c]
                .pools
                .get(item)
                .map(|p| p.idempotency_keys().map(str::to_owned).collect())
                .unwrap_or_default();
            let slot = self.slot(c, item);
            let version = slot.core.shelf_version();
            slot.core.fast_path_on(keys, version);
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
        self.guard_pool(c, item);
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let args = AcquireArgs {
            user_id: user.to_owned(),
            quantity,
            idempotency_key: key.to_owned(),
            new_reservation_id: new_id,
            per_user_limit: state.per_user_limit,
            reservation_ttl_ms: state.reservation_ttl_ms,
            // Buyers here never pass the generation they saw (the product checks it in
            // the same atomic call; its contract suite covers it).
            expect_generation: None,
            allow_partial: false,
        };
        let result = pool.acquire(&args, now).map_err(broken)?;
        self.saw_pool(c, item);
        let losses = self.reference.pool_losses.get(&(c, item.to_owned())).copied().unwrap_or(0);
        match &result {
            AcquireResult::Reserved { reservation_id, replayed, quantity: got, .. } => {
                self.log(format!("{what} -> reserved {reservation_id}{}", if *replayed { " (replayed)" } else { "" }));
                if !*replayed {
                    let ctx = self.ctx(c);
                    self.slot(c, item).core.on_reserved(*got, ctx);
                }
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
                    self.judge_reservation(c, item);
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

    pub(crate) fn random_finish(&mut self, confirm: bool) -> Res {
        let i = self.rng.index(self.reservations.len());
        let (c, item, id) = self.reservations[i].clone();
        self.finish(c, &item, &id, confirm)
    }

    /// `Selling::confirm` / `Selling::cancel`.
    pub(crate) fn finish(&mut self, c: usize, item: &str, id: &str, confirm: bool) -> Res {
        let verb = if confirm { "confirm" } else { "cancel" };
        let what = format!("{verb} {}/{item} {id}", self.name(c));
        let Some(mem) = self.agents[c].mem.as_ref() else {
            self.log(format!("{what} -> agent down"));
            return Ok(());
        };
        if !mem.started || mem.stopping.is_some() {
            self.log(format!("{what} -> unavailable (the agent is starting or shutting down)"));
            return Ok(());
        }
        let now = self.now_ms;
        self.guard_pool(c, item);
        let pool = self.agents[c].pools.entry(item.to_owned()).or_default();
        let t = if confirm {
            pool.confirm(id, now, RECORD_RETENTION_MS)
        } else {
            pool.cancel(id, now, RECORD_RETENTION_MS)
        };
        let t = t.map_err(broken)?;
        // Acknowledged like every pool write: the store layer's floor rises to it.
        self.saw_pool(c, item);
        self.log(format!("{what} -> {t:?}"));
        let returned = match t {
            Transition::Refused(ReservationState::Expired) => confirm,
            Transition::Done(_) => !confirm,
            _ => false,
        };
        let core = &mut self.slot(c, item).core;
        if returned {
            core.stock_returned()
        } else {
            core.touch()
        }
        Ok(())
    }
}
