//! The operators and the environment: reclaims, stock added, units in doubt resolved,
//! pool stores losing their data.

use inventory_core::channel::{Effect, PoolStamp};

use crate::agent::Res;
use crate::center::Refusal;
use crate::config::Violation;
use crate::world::{Pool, World};

impl World {
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
            // The channel keeps what was not in doubt (`held - in_doubt`): of
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
    pub(crate) fn reclaim(&mut self, c: usize) -> Res {
        let channel = self.agents[c].channel.clone();
        let alive = if self.agents[c].mem.is_some() { "running" } else { "down" };
        match self.center.reclaim(&channel, self.now_ms) {
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
    pub(crate) fn random_add_stock(&mut self) -> Res {
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
    /// included: invariant 8. Between a Borrow's check of the pool after its grant and its
    /// refill only with [`Faults::loss_before_refill`](crate::Faults).
    pub(crate) fn lose_pool(&mut self, c: usize, item: &str) {
        let slot = self.agents[c].mem.as_ref().map(|m| &m.items[item]);
        let borrowing = slot.is_some_and(|s| s.call.as_ref().is_some_and(|k| k.borrow) || s.granted.is_some());
        let refilling = slot.is_some_and(|s| {
            matches!(s.work.as_ref().map(|w| &w.effect), Some(Effect::Refill { must_exist: true, .. }))
        });
        if refilling && !self.config.faults.loss_before_refill {
            return;
        }
        let Some(pool) = self.agents[c].pools.get(item) else { return };
        if !pool.exists() {
            return; // nothing stored yet
        }
        let sold = pool.sold();
        let stamp = PoolStamp { generation: pool.generation(), write_seq: pool.write_seq() };
        // Every other loss evicts one structure and leaves the pool hash: a whole read finds
        // the pool lost, its stamp still shows the hash (decided without a draw, so the
        // seeds' other faults stay what they were).
        let hash_left = self.step.is_multiple_of(2);
        let agent = &mut self.agents[c];
        if hash_left {
            agent.stamps_left.insert(item.to_owned(), stamp);
            self.stats.pool_losses_hash_left += 1;
        }
        agent.pools.insert(item.to_owned(), Pool::default());
        *self.reference.lost_sold.entry((c, item.to_owned())).or_default() += sold;
        *self.reference.pool_losses.entry((c, item.to_owned())).or_default() += 1;
        self.stats.pool_losses += 1;
        self.stats.pool_losses_during_borrow += u64::from(borrowing);
        let recorded = self.agents[c].mem.as_ref().is_some_and(|m| m.items[item].core.generation() != 0);
        self.stats.pool_losses_unrecorded += u64::from(!recorded);
        self.log(format!(
            "pool {}/{item} loses its data ({sold} sold units forgotten{}){}",
            self.name(c),
            if hash_left { "; its hash is left" } else { "" },
            if recorded { "" } else { "; its agent has no generation of it recorded" }
        ));
    }

    /// Whether faults are off (draining to quiescence and selling out).
    pub fn calm(&self) -> bool {
        self.step > self.config.steps
    }
}
