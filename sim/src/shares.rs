//! Channel shares, caps and floors in the simulation (`CreateItem.channel_shares`, the
//! rules of `inventory_core::ledger::caps`), and the center's rule before an opening.
//!
//! With [`crate::Faults::schedules`], half the items get shares: each channel, two times
//! in three, a weight of 1–10, a cap one time in two (a tenth of the stock to all of it)
//! and a floor one time in three (within the cap, the floors together within the total
//! less the reserve; one channel stays uncapped, as the run's liveness check sells every
//! unit), checked by `ChannelShares::parse` as CreateItem checks them. The
//! center keeps them in every Borrow as `store/batch.rs` does ([`Center::borrow_plan`]):
//! the room under the cap, the floors kept for the other selling channels, and before
//! the opening only the opening's stocking (`schedule::room_before_opening`); the
//! opening's stocking asks for the allocation by weight (`ChannelShares::
//! opening_allocation`). Checked after every step: no channel's `held` above its cap.

use std::collections::BTreeMap;

use inventory_core::ledger::{self, ChannelShare, ChannelShares, Limits, Peer};
use inventory_core::schedule;

use crate::center::Center;
use crate::config::Violation;
use crate::schedules::Plan;
use crate::world::World;

/// The shares of the run's items, by item (the item's definition at the center).
pub type Shares = BTreeMap<String, ChannelShares>;

/// What the plan lets one Borrow take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BorrowPlan {
    /// The cap's room and the floors kept for the others (`ledger::limits`).
    pub limits: Limits,
    /// Before the opening: the most the opening's stocking still lets out; `None` once
    /// opened.
    pub before_opening: Option<u64>,
}

impl BorrowPlan {
    /// The limits the grant keeps now: the cap's room, at most the opening's.
    pub fn now(&self) -> Limits {
        Limits { room: self.limits.room.min(self.before_opening.unwrap_or(u64::MAX)), ..self.limits }
    }
}

impl Center {
    /// The channels whose lease is live at `now_ms`.
    pub fn live_channels(&self, now_ms: i64) -> Vec<&str> {
        self.sessions.iter().filter(|(_, s)| s.lease_expires_at_ms > now_ms).map(|(c, _)| c.as_str()).collect()
    }

    /// A channel's opening allocation by the item's shares, or an even split without.
    pub fn opening_allocation(&self, item: &str, reserve: u64, channel: &str, now_ms: i64) -> u64 {
        let live = self.live_channels(now_ms);
        let total = self.item(item).state.total;
        match self.shares.get(item) {
            Some(shares) if !shares.is_empty() => shares.opening_allocation(total, reserve, &live, channel),
            _ => schedule::opening_allocation(total, reserve, &live, channel),
        }
    }

    /// `store::batch`'s limits of a Borrow of `channel` at `now_ms`, with the item's
    /// `plan` (schedule and reserve) if it has one.
    pub fn borrow_plan(&self, item: &str, channel: &str, plan: Option<&Plan>, now_ms: i64) -> BorrowPlan {
        let held = self.held(item, channel);
        let opens_at_ms = plan.map_or(0, |p| p.schedule.opens_at_ms);
        let limits = match self.shares.get(item) {
            Some(shares) => {
                let peers =
                    self.allocations.iter().filter(|((i, c), _)| i == item && c != channel).map(|((_, c), a)| {
                        let lease_live = self.sessions.get(c).is_some_and(|s| s.lease_expires_at_ms > now_ms);
                        (c.as_str(), Peer { held: a.held(), lease_live, reported_at_ms: a.reported_at_ms })
                    });
                ledger::limits(shares, channel, held, peers, now_ms, opens_at_ms)
            }
            None => Limits::NONE,
        };
        let before_opening = plan.and_then(|p| {
            let allocation = self.opening_allocation(item, p.reserve, channel, now_ms);
            schedule::room_before_opening(&p.schedule, now_ms, allocation, held)
        });
        BorrowPlan { limits, before_opening }
    }

    /// Whether `channel` is at its cap of `item` (its rate then claims no share).
    pub fn at_cap(&self, item: &str, channel: &str) -> bool {
        self.shares.get(item).is_some_and(|s| ledger::at_cap(s, channel, self.held(item, channel)))
    }
}

impl World {
    /// Draws the items' shares (see the module) from a stream of their own, derived from
    /// the run's without advancing it: a seed's world, schedules and events stay what they
    /// were, and only Borrows the plan holds back take another course.
    pub(crate) fn plan_shares(&mut self) {
        if !self.config.faults.schedules {
            return;
        }
        let mut rng = crate::rng::Rng::new(self.rng.clone().next_u64() ^ 0x5ca1_ab1e_c0ff_ee00);
        let channels: Vec<String> = self.agents.iter().map(|a| a.name().to_owned()).collect();
        for name in self.item_names() {
            if !rng.percent(50) {
                continue;
            }
            let total = self.center.item(&name).state.total;
            let reserve = self.sched.plan(&name).map_or(0, |p| p.reserve);
            let mut floors_left = total.saturating_sub(reserve);
            let mut raw = Vec::new();
            for channel in &channels {
                if !rng.percent(67) {
                    continue;
                }
                let weight = rng.range(1, 10);
                let cap_units = if rng.percent(50) { rng.range(total / 10 + 1, total.max(1)) } else { 0 };
                let most = if cap_units > 0 { cap_units.min(floors_left) } else { floors_left.min(total / 3) };
                let floor_units = if rng.percent(33) { rng.range(0, most) } else { 0 };
                floors_left -= floor_units;
                raw.push(ChannelShare { channel: channel.clone(), weight, cap_units, floor_units });
            }
            // Caps on every channel may leave units no channel may ever sell (the
            // operator's choice, also once stock is added); the run's liveness check
            // wants every unit sellable, so one channel stays uncapped.
            if raw.len() == channels.len() && raw.iter().all(|s| s.cap_units > 0) {
                raw.last_mut().expect("every channel").cap_units = 0;
            }
            match ChannelShares::parse(&raw, total, reserve) {
                Ok(shares) if !shares.is_empty() => {
                    self.stats.items_with_shares += 1;
                    self.log(format!("{name} shares: {raw:?}"));
                    self.center.shares.insert(name, shares);
                }
                Ok(_) => {}
                Err(e) => panic!("drawn shares refused: {e} ({raw:?})"),
            }
        }
    }
}

/// The caps of every step: no channel holds more of an item than its cap (numbered C in
/// reports).
pub fn check_caps(w: &World) -> Result<(), Violation> {
    for (item, shares) in &w.center.shares {
        for share in shares.iter() {
            let Some(cap) = share.cap() else { continue };
            let held = w.center.held(item, &share.channel);
            // A rolled-back ledger lends up to the cap again what it forgot a channel
            // held; relearned, those units count with the channel beyond it.
            let c = w.agents.iter().position(|a| a.name() == share.channel.as_str());
            let taken = c.map_or(0, |c| w.taken_by_rollbacks(c, item));
            if held > cap.saturating_add(taken) {
                return Err(Violation::new("C", format!("{}/{item} holds {held}, above its cap {cap}", share.channel)));
            }
        }
    }
    Ok(())
}
