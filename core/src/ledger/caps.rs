//! The operator's plan per channel: weights, caps and floors (`CreateItem.channel_shares`).
//!
//! - **Weight**: the channel's part of the opening allocation (the total less the center's
//!   reserve), against the other channels with a share that are selling when it asks.
//! - **Cap** (`cap_units`, 0: none): the channel never holds more than this (held counts
//!   what it sold too, so a cap bounds its part of the sale). A Borrow is trimmed to the
//!   room under the cap; at the cap it gets 0.
//! - **Floor** (`floor_units`): the center keeps `floor − held` for the channel out of what
//!   any other channel's Borrow can take, so a fast channel cannot starve it. The floor is
//!   kept while the channel is selling: its lease is live, it has taken stock of the item
//!   (an allocation exists), and its pool moved within [`FLOOR_IDLE_MS`] (its last report,
//!   sent whenever its pool changes, or the opening, whichever is later). A channel whose
//!   lease lapsed, that never came, or that sold nothing for that long releases its floor
//!   to the others; a closed item keeps nothing (nothing is lent).
//!
//! Rate-following shares ([`super::share_of`]) apply within these: a short supply is the
//! center's available less the floors kept, and a Borrow never asks more than its room.

use serde::{Deserialize, Serialize};

use super::{Allocation, ItemState, RateShare, borrow, share_of};
use crate::ValidationError;
use crate::ids::{Channel, MAX_QUANTITY, Quantity};

/// The most shares one item may name.
pub const MAX_SHARES: usize = 256;
/// The largest weight (weights are relative: 50/30/20 or 5/3/2 are the same plan).
pub const MAX_WEIGHT: u64 = 1_000_000;
/// A floor channel whose pool has not moved for this long (nothing sold, borrowed or
/// given back; measured from its last report, or from the opening) releases its floor.
pub const FLOOR_IDLE_MS: i64 = 30_000;

/// One channel's part of the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelShare {
    pub channel: String,
    pub weight: u64,
    /// 0: no cap.
    pub cap_units: u64,
    pub floor_units: u64,
}

impl ChannelShare {
    /// The cap, `None` without one.
    pub fn cap(&self) -> Option<u64> {
        (self.cap_units > 0).then_some(self.cap_units)
    }
}

/// An item's shares, one per channel, by channel name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChannelShares(Vec<ChannelShare>);

impl ChannelShares {
    /// Checks CreateItem's shares against the item's `total` and `reserve`: valid, distinct
    /// channel names; a weight up to [`MAX_WEIGHT`]; a cap up to the total and not below
    /// the floor; the floors together within `total − reserve`; at most [`MAX_SHARES`].
    pub fn parse(raw: &[ChannelShare], total: u64, reserve: u64) -> Result<Self, ValidationError> {
        if raw.len() > MAX_SHARES {
            let reason = format!("must name at most {MAX_SHARES} channels");
            return Err(ValidationError::new("channel_shares", raw.len() as u64, reason));
        }
        let mut shares: Vec<ChannelShare> = Vec::with_capacity(raw.len());
        let mut floors = 0u64;
        for (i, s) in raw.iter().enumerate() {
            let field = |name: &str| format!("channel_shares[{i}].{name}");
            let channel = Channel::parse(&field("channel"), &s.channel)?;
            if shares.iter().any(|o| o.channel == channel.as_str()) {
                return Err(ValidationError::new(
                    field("channel"),
                    s.channel.as_str(),
                    "names a channel already given a share",
                ));
            }
            if s.weight > MAX_WEIGHT {
                return Err(ValidationError::new(field("weight"), s.weight, format!("must be at most {MAX_WEIGHT}")));
            }
            if s.cap_units > total.min(MAX_QUANTITY) {
                let reason = format!("must be 0 (no cap) or at most the total {total}");
                return Err(ValidationError::new(field("cap_units"), s.cap_units, reason));
            }
            if s.floor_units > MAX_QUANTITY {
                let reason = format!("must be at most {MAX_QUANTITY}");
                return Err(ValidationError::new(field("floor_units"), s.floor_units, reason));
            }
            if s.cap().is_some_and(|cap| s.floor_units > cap) {
                let reason = format!("must be at most cap_units {}", s.cap_units);
                return Err(ValidationError::new(field("floor_units"), s.floor_units, reason));
            }
            floors = floors.saturating_add(s.floor_units);
            let shared = total.saturating_sub(reserve);
            if floors > shared {
                let reason = format!(
                    "brings the floors to {floors}, more than the total less the reserve ({total} - {reserve})"
                );
                return Err(ValidationError::new(field("floor_units"), s.floor_units, reason));
            }
            shares.push(ChannelShare { channel: channel.to_string(), ..s.clone() });
        }
        shares.sort_by(|a, b| a.channel.cmp(&b.channel));
        Ok(Self(shares))
    }

    /// Shares read back from storage (already checked when created), sorted by channel.
    pub fn from_stored(mut shares: Vec<ChannelShare>) -> Self {
        shares.sort_by(|a, b| a.channel.cmp(&b.channel));
        Self(shares)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ChannelShare> {
        self.0.iter()
    }

    pub fn get(&self, channel: &str) -> Option<&ChannelShare> {
        self.0.binary_search_by(|s| s.channel.as_str().cmp(channel)).ok().map(|i| &self.0[i])
    }

    /// The channel's cap, `None` without one.
    pub fn cap(&self, channel: &str) -> Option<u64> {
        self.get(channel).and_then(ChannelShare::cap)
    }

    /// A channel's opening allocation by the plan: the total less the reserve, less the
    /// floors of the `live` channels with a share, split by weight over those channels
    /// (the first by name taking one more unit each of the remainder), each plus its own
    /// floor and at most its cap (what a cap trims stays at the center). 0 for a channel
    /// without a share or not live: it starts from what the center kept. Without any live
    /// channel with a share, 0 for all.
    pub fn opening_allocation(&self, total: u64, reserve: u64, live: &[&str], channel: &str) -> u64 {
        let selling: Vec<&ChannelShare> = self.0.iter().filter(|s| live.contains(&s.channel.as_str())).collect();
        let Some(index) = selling.iter().position(|s| s.channel == channel) else { return 0 };
        let own = selling[index];
        let floors = selling.iter().fold(0u64, |sum, s| sum.saturating_add(s.floor_units));
        let spread = u128::from(total.saturating_sub(reserve).saturating_sub(floors));
        let weights: u128 = selling.iter().map(|s| u128::from(s.weight)).sum();
        let by_weight = if weights == 0 {
            0
        } else {
            let parts: Vec<u128> = selling.iter().map(|s| spread * u128::from(s.weight) / weights).collect();
            let left = spread - parts.iter().sum::<u128>();
            let extra = selling
                .iter()
                .enumerate()
                .filter(|(_, s)| s.weight > 0)
                .position(|(i, _)| i == index)
                .is_some_and(|rank| (rank as u128) < left);
            parts[index] + u128::from(extra)
        };
        let n = u64::try_from(by_weight).unwrap_or(u64::MAX).saturating_add(own.floor_units);
        own.cap().map_or(n, |cap| n.min(cap))
    }
}

/// Another channel of the item as a Borrow sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    pub held: u64,
    pub lease_live: bool,
    /// When its pool last changed (its last report), 0: never reported.
    pub reported_at_ms: i64,
}

/// Units the center keeps for `share`'s channel, seen as `peer`, at `now_ms`, for an item
/// opening at `opens_at_ms` (0: open from creation): `floor − held` while the channel is
/// selling (see the module's rule), else 0.
pub fn floor_kept(share: &ChannelShare, peer: &Peer, now_ms: i64, opens_at_ms: i64) -> u64 {
    let active_since = peer.reported_at_ms.max(opens_at_ms);
    let idle = now_ms.saturating_sub(active_since) >= FLOOR_IDLE_MS;
    if !peer.lease_live || idle {
        return 0;
    }
    share.floor_units.saturating_sub(peer.held)
}

/// How far the plan lets one Borrow go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Units the asking channel may still take before its cap (`u64::MAX`: no cap).
    pub room: u64,
    /// Units of the center's available kept for the other channels' floors.
    pub kept: u64,
    /// What the asking channel's own floor still lacks (`floor − held`).
    pub own_floor: u64,
}

impl Limits {
    pub const NONE: Limits = Limits { room: u64::MAX, kept: 0, own_floor: 0 };

    /// Units of the center's `available` this Borrow may take: what the floors kept for
    /// the others leave. When lost units left the center less than the floors together
    /// lack, the floor channels share what is left by what each lacks (rounded up), so
    /// two floor channels never each wait on units kept for the other.
    pub fn usable(&self, available: u64) -> u64 {
        let free = available.saturating_sub(self.kept);
        let lacking = self.kept.saturating_add(self.own_floor);
        if self.own_floor == 0 || lacking <= available {
            return free;
        }
        let fair = (u128::from(available) * u128::from(self.own_floor)).div_ceil(u128::from(lacking));
        free.max(u64::try_from(fair).unwrap_or(available).min(available))
    }
}

/// The limits of a Borrow by `channel` holding `held`, with the item's other channels
/// `peers` (`(channel, peer)`; the asking one is skipped if present).
pub fn limits<'a>(
    shares: &ChannelShares,
    channel: &str,
    held: u64,
    peers: impl IntoIterator<Item = (&'a str, Peer)>,
    now_ms: i64,
    opens_at_ms: i64,
) -> Limits {
    if shares.is_empty() {
        return Limits::NONE;
    }
    let room = shares.cap(channel).map_or(u64::MAX, |cap| cap.saturating_sub(held));
    let own_floor = shares.get(channel).map_or(0, |s| s.floor_units.saturating_sub(held));
    let kept = peers
        .into_iter()
        .filter(|(c, _)| *c != channel)
        .filter_map(|(c, p)| shares.get(c).map(|s| floor_kept(s, &p, now_ms, opens_at_ms)))
        .fold(0u64, u64::saturating_add);
    Limits { room, kept, own_floor }
}

/// Whether a channel holding `held` is at its cap (its rate then claims no share).
pub fn at_cap(shares: &ChannelShares, channel: &str, held: u64) -> bool {
    shares.cap(channel).is_some_and(|cap| held >= cap)
}

/// [`super::borrow_shared`] within the plan: asks at most the room under the cap, and a
/// short supply is what the center has less the floors kept for the others (shared by
/// rate as without a plan). 0 when the channel is at its cap or everything is kept.
pub fn borrow_planned(
    item: &mut ItemState,
    alloc: &mut Allocation,
    quantity: Quantity,
    rates: RateShare,
    limits: Limits,
) -> u64 {
    let asked = quantity.get().min(limits.room);
    let usable = limits.usable(item.available);
    if asked == 0 || usable == 0 {
        return 0;
    }
    let n = share_of(asked, usable, rates);
    match Quantity::parse("quantity", n) {
        Ok(q) => borrow(item, alloc, q),
        Err(_) => 0,
    }
}

#[cfg(test)]
#[path = "caps_tests.rs"]
mod tests;
