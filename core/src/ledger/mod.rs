//! The center's ledger arithmetic: items, per-channel allocations, leases and the
//! invariant check. Storage loads rows into these structs, calls one function and writes
//! the result back inside one transaction.
//!
//! Invariant 1 (conservation at the center), per item, after every function here:
//! `total = available + Σ held(channel)` where `held = granted - returned - reclaimed`.

pub mod behind;
mod caps;
pub mod fence;
mod relearn;
mod share;

use serde::{Deserialize, Serialize};

pub use behind::{DriftTrack, beyond_ledger, hold_back};
pub use caps::{
    ChannelShare, ChannelShares, FLOOR_IDLE_MS, Limits, MAX_SHARES, MAX_WEIGHT, Peer, at_cap, borrow_planned,
    floor_kept, limits,
};
pub use relearn::{Relearned, relearn};
pub use share::{RateShare, borrow_shared, share_of};

use crate::ids::{Channel, ItemId, MAX_QUANTITY, Quantity};

/// An item as the center sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemState {
    pub total: u64,
    /// Units at the center, not held by any channel.
    pub available: u64,
    pub per_user_limit: u64,
    pub reservation_ttl_ms: u64,
    pub closed: bool,
    /// Units written off as sold outside the pools (in-doubt units resolved as sold);
    /// they left `total`.
    pub written_off: u64,
}

impl ItemState {
    pub fn new(total: Quantity, per_user_limit: u64, reservation_ttl_ms: u64) -> Self {
        Self {
            total: total.get(),
            available: total.get(),
            per_user_limit,
            reservation_ttl_ms,
            closed: false,
            written_off: 0,
        }
    }
}

/// A channel's pool counters, as reported by its agent (totals, not deltas).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCounts {
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
}

impl PoolCounts {
    /// The sum, saturating: a report that large is refused at the edge.
    pub fn sum(&self) -> u64 {
        self.checked_sum().unwrap_or(u64::MAX)
    }

    /// The sum, or `None` when it does not fit a `u64`.
    pub fn checked_sum(&self) -> Option<u64> {
        self.available.checked_add(self.reserved)?.checked_add(self.sold)
    }
}

/// What one channel has taken from and given back to the center for one item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocation {
    pub granted: u64,
    pub returned: u64,
    pub reclaimed: u64,
    pub reported: PoolCounts,
    pub reported_at_ms: i64,
    /// The pool generation the channel last reported (0: never).
    pub generation: u64,
    /// Units in doubt because the channel's pool was lost; 0 normally.
    pub in_doubt: u64,
    /// The channel's sell rate of the item as last reported (units/s × 1000).
    pub sell_rate_milli: u64,
}

impl Allocation {
    /// What the center regards as out with the channel. Saturates so a corrupted row
    /// shows up in [`check_item`] rather than as a panic.
    pub fn held(&self) -> u64 {
        self.granted.saturating_sub(self.returned).saturating_sub(self.reclaimed)
    }

    /// held - (reported available + reserved + sold): 0 at quiescence. Computed without
    /// overflow and clamped to the `i64` range.
    pub fn drift(&self) -> i64 {
        let reported =
            i128::from(self.reported.available) + i128::from(self.reported.reserved) + i128::from(self.reported.sold);
        let drift = i128::from(self.held()) - reported;
        i64::try_from(drift).unwrap_or(if drift < 0 { i64::MIN } else { i64::MAX })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("cannot return {quantity} units: channel {channel} holds {held}")]
    ReturnExceedsHeld { channel: String, held: u64, quantity: u64 },
    #[error("adding {quantity} units would make total {total} exceed {max}", max = MAX_QUANTITY)]
    TotalTooLarge { total: u64, quantity: u64 },
    #[error("stale epoch {presented} for channel {channel}: current epoch is {current}")]
    StaleEpoch { channel: String, presented: u64, current: u64 },
    #[error("channel {channel} is not registered")]
    UnknownChannel { channel: String },
    #[error("lease of channel {channel} is still live for {remaining_ms} ms")]
    LeaseLive { channel: String, remaining_ms: i64 },
    #[error("channel {channel} has nothing in doubt")]
    NothingInDoubt { channel: String },
    #[error("cannot write off {sold} units as sold: channel {channel} has {held} in doubt")]
    SoldExceedsHeld { channel: String, held: u64, sold: u64 },
    #[error("channel {channel:?} still holds {units}: give them back first (drain its agent, reclaim, resolve)")]
    ChannelHoldsStock { channel: String, units: String },
    #[error(
        "lease of channel {channel:?} is live for {remaining_ms} ms more, so an agent is attached: stop the agent or \
         wait for the lease to end"
    )]
    AgentAttached { channel: String, remaining_ms: i64 },
    /// A counter would leave its range: the rows hold values no call could have produced.
    #[error("{counter} would overflow")]
    Overflow { counter: &'static str },
}

/// Grants `min(quantity, available)` units to the channel; 0 when none are left or the
/// item is closed.
pub fn borrow(item: &mut ItemState, alloc: &mut Allocation, quantity: Quantity) -> u64 {
    if item.closed {
        return 0;
    }
    let granted = quantity.get().min(item.available);
    // A grant the allocation cannot count is not made (granting nothing never oversells).
    let Some(total_granted) = alloc.granted.checked_add(granted) else {
        return 0;
    };
    item.available -= granted;
    alloc.granted = total_granted;
    granted
}

/// Takes `quantity` units back from the channel; never more than it holds.
pub fn give_back(
    item: &mut ItemState,
    alloc: &mut Allocation,
    channel: &Channel,
    quantity: Quantity,
) -> Result<(), LedgerError> {
    // Units in doubt are not the channel's to give back: only an operator's resolution
    // moves them (else they would come back twice).
    let held = alloc.held().saturating_sub(alloc.in_doubt);
    if quantity.get() > held {
        return Err(LedgerError::ReturnExceedsHeld { channel: channel.to_string(), held, quantity: quantity.get() });
    }
    let returned = alloc.returned.checked_add(quantity.get()).ok_or(LedgerError::Overflow { counter: "returned" })?;
    let available =
        item.available.checked_add(quantity.get()).ok_or(LedgerError::Overflow { counter: "center available" })?;
    alloc.returned = returned;
    item.available = available;
    Ok(())
}

/// Raises total and available together.
pub fn add_stock(item: &mut ItemState, quantity: Quantity) -> Result<(), LedgerError> {
    let total = item.total.checked_add(quantity.get()).filter(|t| *t <= MAX_QUANTITY);
    let Some(total) = total else {
        return Err(LedgerError::TotalTooLarge { total: item.total, quantity: quantity.get() });
    };
    let available =
        item.available.checked_add(quantity.get()).ok_or(LedgerError::Overflow { counter: "center available" })?;
    item.total = total;
    item.available = available;
    Ok(())
}

/// Units the center may take back from a dead channel: what it holds minus what it last
/// reported reserved or sold (those belong to buyers). Nothing while units are in doubt:
/// a lost pool's sales are unknown, so only an operator's resolution may move them.
pub fn reclaimable(alloc: &Allocation) -> u64 {
    if alloc.in_doubt > 0 {
        return 0;
    }
    alloc.held().saturating_sub(alloc.reported.reserved.saturating_add(alloc.reported.sold))
}

/// Whether a channel may be removed (its row and allocations deleted): only when it holds
/// nothing of any item (held includes units in doubt), so conservation holds without it,
/// and when no agent is attached: the lease has run out, or the agent's last report was
/// its last word (it drained and left, though its lease runs on). `allocations` are
/// `(item_id, allocation)`.
pub fn check_removal(
    channel: &Channel,
    session: &ChannelSession,
    last_word: bool,
    now_ms: i64,
    allocations: &[(String, Allocation)],
) -> Result<(), LedgerError> {
    let holding: Vec<String> = allocations
        .iter()
        .filter(|(_, a)| a.held() > 0 || a.in_doubt > 0)
        .map(|(item, a)| match a.in_doubt {
            0 => format!("{} units of item {item:?}", a.held()),
            doubt => format!("{} units of item {item:?} ({doubt} in doubt)", a.held()),
        })
        .collect();
    if !holding.is_empty() {
        return Err(LedgerError::ChannelHoldsStock { channel: channel.to_string(), units: holding.join(", ") });
    }
    if session.lease_live(now_ms) && !last_word {
        let remaining_ms = session.lease_expires_at_ms.saturating_sub(now_ms);
        return Err(LedgerError::AgentAttached { channel: channel.to_string(), remaining_ms });
    }
    Ok(())
}

/// The channel reported its pool lost: everything it holds is in doubt.
pub fn mark_lost(alloc: &mut Allocation) {
    alloc.in_doubt = alloc.held();
    alloc.reported = PoolCounts::default();
}

/// Reclaim of a channel whose agent stopped without a last report: it may have sold some
/// of its unreported units after its last report, so they go in doubt (not back on sale)
/// until an operator settles them. Returns how many.
pub fn reclaim_into_doubt(alloc: &mut Allocation) -> u64 {
    let units = reclaimable(alloc);
    // in_doubt is 0 whenever units > 0 (see `reclaimable`).
    alloc.in_doubt = alloc.in_doubt.saturating_add(units);
    units
}

/// Settles in-doubt units: `sold` of them leave the system as sold (total goes down), the
/// rest return to the center; the channel keeps what was not in doubt. Returns the units
/// returned to center available.
pub fn resolve_in_doubt(
    item: &mut ItemState,
    alloc: &mut Allocation,
    channel: &Channel,
    sold: u64,
) -> Result<u64, LedgerError> {
    if alloc.in_doubt == 0 {
        return Err(LedgerError::NothingInDoubt { channel: channel.to_string() });
    }
    let doubt = alloc.in_doubt;
    if sold > doubt {
        return Err(LedgerError::SoldExceedsHeld { channel: channel.to_string(), held: doubt, sold });
    }
    let back = doubt - sold;
    let overflow = |counter| LedgerError::Overflow { counter };
    let reclaimed = alloc.reclaimed.checked_add(doubt).ok_or(overflow("reclaimed"))?;
    let total = item.total.checked_sub(sold).ok_or(overflow("total"))?;
    let written_off = item.written_off.checked_add(sold).ok_or(overflow("written off"))?;
    let available = item.available.checked_add(back).ok_or(overflow("center available"))?;
    alloc.reclaimed = reclaimed;
    alloc.in_doubt = 0;
    if alloc.held() == 0 {
        alloc.reported = PoolCounts::default();
        alloc.generation = 0;
    } else {
        alloc.reported.available = alloc.reported.available.saturating_sub(doubt);
    }
    item.total = total;
    item.written_off = written_off;
    item.available = available;
    Ok(back)
}

/// Takes back [`reclaimable`] units; returns how many.
pub fn reclaim(item: &mut ItemState, alloc: &mut Allocation) -> u64 {
    let units = reclaimable(alloc);
    // Units the counters cannot take are left with the channel.
    let (Some(reclaimed), Some(available)) = (alloc.reclaimed.checked_add(units), item.available.checked_add(units))
    else {
        return 0;
    };
    alloc.reclaimed = reclaimed;
    item.available = available;
    // What the center took is no longer in the channel's pool, as far as the ledger
    // knows; keep the report consistent so drift stays meaningful.
    alloc.reported.available = alloc.reported.available.saturating_sub(units);
    units
}

/// A channel's registration: the fencing epoch and the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSession {
    pub epoch: u64,
    pub agent_id: String,
    pub lease_expires_at_ms: i64,
    pub last_heartbeat_ms: i64,
}

impl ChannelSession {
    /// The next incarnation of a channel's agent: a strictly larger epoch, above
    /// `fenced_at` too (the highest pool fence the agent found: [`fence`]).
    pub fn register(
        previous: Option<&ChannelSession>,
        agent_id: &str,
        now_ms: i64,
        lease_ttl_ms: u64,
        fenced_at: u64,
    ) -> Self {
        let epoch = fence::epoch_above(previous.map(|p| p.epoch), fenced_at);
        Self {
            epoch,
            agent_id: agent_id.to_owned(),
            lease_expires_at_ms: later(now_ms, lease_ttl_ms),
            last_heartbeat_ms: now_ms,
        }
    }

    pub fn check_epoch(&self, channel: &Channel, presented: u64) -> Result<(), LedgerError> {
        if presented != self.epoch {
            return Err(LedgerError::StaleEpoch { channel: channel.to_string(), presented, current: self.epoch });
        }
        Ok(())
    }

    pub fn renew(&mut self, now_ms: i64, lease_ttl_ms: u64) {
        self.lease_expires_at_ms = later(now_ms, lease_ttl_ms);
        self.last_heartbeat_ms = now_ms;
    }

    pub fn lease_live(&self, now_ms: i64) -> bool {
        now_ms < self.lease_expires_at_ms
    }

    /// Reclaim is allowed once the lease has been expired for `grace_ms`. The epoch is
    /// bumped so the old agent is fenced off even if it wakes up.
    pub fn begin_reclaim(&mut self, channel: &Channel, now_ms: i64, grace_ms: u64) -> Result<(), LedgerError> {
        let allowed_at = later(self.lease_expires_at_ms, grace_ms);
        if now_ms < allowed_at {
            let remaining_ms = allowed_at.saturating_sub(now_ms);
            return Err(LedgerError::LeaseLive { channel: channel.to_string(), remaining_ms });
        }
        self.epoch = self.epoch.checked_add(1).ok_or(LedgerError::Overflow { counter: "epoch" })?;
        Ok(())
    }
}

/// `at_ms + delay_ms`, saturating: a time too far ahead is the end of time, not the past.
fn later(at_ms: i64, delay_ms: u64) -> i64 {
    at_ms.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX))
}

/// Lines of one BorrowMany call, at most.
pub const MAX_BORROW_LINES: usize = 500;

/// Lines of one ReturnMany call, at most (as a BorrowMany's: one transaction's worth).
pub const MAX_RETURN_LINES: usize = MAX_BORROW_LINES;

/// A request that changes the ledger, identified by a client-chosen id. Its fingerprint
/// decides whether a reused id is a replay (same payload) or a conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    Borrow { item: ItemId, channel: Channel, quantity: Quantity },
    Return { item: ItemId, channel: Channel, quantity: Quantity },
    AddStock { item: ItemId, quantity: Quantity },
}

impl Mutation {
    /// Request ids are unique per caller: per channel for agents, one scope for operators.
    pub fn scope(&self) -> String {
        match self {
            Mutation::Borrow { channel, .. } | Mutation::Return { channel, .. } => format!("channel:{channel}"),
            Mutation::AddStock { .. } => "admin".to_owned(),
        }
    }

    /// The payload, canonically. The epoch is left out: a retry carries the epoch it was
    /// first sent under and is answered from the record, whatever the channel's epoch is
    /// now, for as long as the record is kept.
    pub fn fingerprint(&self) -> String {
        match self {
            Mutation::Borrow { item, channel, quantity } => format!("borrow/{item}/{channel}/{quantity}"),
            Mutation::Return { item, channel, quantity } => format!("return/{item}/{channel}/{quantity}"),
            Mutation::AddStock { item, quantity } => format!("add-stock/{item}/{quantity}"),
        }
    }
}

/// One broken rule found by [`check_item`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub item_id: String,
    pub channel: String,
    pub invariant: String,
    pub detail: String,
}

/// Result of checking one item.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Check {
    /// Broken invariants: conservation, negative counters, oversell.
    pub violations: Vec<Finding>,
    /// Channels whose reported pool differs from what they hold. Normal while sales are
    /// in flight; a problem when it persists.
    pub drifts: Vec<Finding>,
    /// Units in doubt after a channel lost its pool; an operator must resolve them.
    pub in_doubt: Vec<Finding>,
}

/// Checks invariants 1 and 3 (and non-negative counters) for one item, and lists drift.
pub fn check_item(item_id: &str, item: &ItemState, allocations: &[(String, Allocation)]) -> Check {
    let mut check = Check::default();
    let finding = |channel: &str, invariant: &str, detail: String| Finding {
        item_id: item_id.to_owned(),
        channel: channel.to_owned(),
        invariant: invariant.to_owned(),
        detail,
    };
    let mut held_sum: u128 = 0;
    let mut committed: u128 = 0;
    for (channel, a) in allocations {
        let out = u128::from(a.returned) + u128::from(a.reclaimed);
        if out > u128::from(a.granted) {
            check.violations.push(finding(
                channel,
                "negative",
                format!("returned {} + reclaimed {} exceeds granted {}", a.returned, a.reclaimed, a.granted),
            ));
        }
        held_sum += u128::from(a.held());
        committed += u128::from(a.reported.reserved) + u128::from(a.reported.sold);
        if a.in_doubt > 0 {
            check.in_doubt.push(finding(
                channel,
                "in_doubt",
                format!(
                    "{} units in doubt: the pool was lost; resolve with `invctl resolve --item {item_id} --channel {channel} --sold N` (N = units the channel's orders show sold)",
                    a.in_doubt
                ),
            ));
        } else if a.drift() != 0 {
            check.drifts.push(finding(
                channel,
                "drift",
                format!(
                    "held {} but reported available {} + reserved {} + sold {} (drift {})",
                    a.held(),
                    a.reported.available,
                    a.reported.reserved,
                    a.reported.sold,
                    a.drift()
                ),
            ));
        }
    }
    if u128::from(item.total) != u128::from(item.available) + held_sum {
        check.violations.push(finding(
            "",
            "conservation",
            format!("total {} != center available {} + held {}", item.total, item.available, held_sum),
        ));
    }
    // Units written off after a lost pool left `total` but may still show as sold in a
    // pool's later reports; they are not an oversell.
    if committed > u128::from(item.total) + u128::from(item.written_off) {
        check.violations.push(finding(
            "",
            "oversell",
            format!(
                "reported reserved + sold {committed} exceeds total {} (+ {} written off)",
                item.total, item.written_off
            ),
        ));
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(n: u64) -> Quantity {
        Quantity::parse("quantity", n).unwrap()
    }

    fn ch(name: &str) -> Channel {
        Channel::parse("channel", name).unwrap()
    }

    #[test]
    fn borrow_grants_at_most_what_is_available() {
        let mut item = ItemState::new(q(10), 1, 1000);
        let mut a = Allocation::default();
        assert_eq!(borrow(&mut item, &mut a, q(4)), 4);
        assert_eq!(borrow(&mut item, &mut a, q(100)), 6);
        assert_eq!(borrow(&mut item, &mut a, q(1)), 0);
        assert_eq!((item.available, a.granted, a.held()), (0, 10, 10));
    }

    #[test]
    fn closed_item_grants_nothing() {
        let mut item = ItemState::new(q(10), 1, 1000);
        item.closed = true;
        assert_eq!(borrow(&mut item, &mut Allocation::default(), q(4)), 0);
        assert_eq!(item.available, 10);
    }

    #[test]
    fn return_may_not_exceed_held() {
        let mut item = ItemState::new(q(10), 1, 1000);
        let mut a = Allocation::default();
        borrow(&mut item, &mut a, q(3));
        let err = give_back(&mut item, &mut a, &ch("app"), q(4)).unwrap_err();
        assert_eq!(err.to_string(), "cannot return 4 units: channel app holds 3");
        give_back(&mut item, &mut a, &ch("app"), q(3)).unwrap();
        assert_eq!((item.available, a.held()), (10, 0));
    }

    #[test]
    fn add_stock_raises_total_and_available_within_bound() {
        let mut item = ItemState::new(q(10), 1, 1000);
        add_stock(&mut item, q(5)).unwrap();
        assert_eq!((item.total, item.available), (15, 15));
        assert!(add_stock(&mut item, q(MAX_QUANTITY)).is_err());
        assert_eq!(item.total, 15);
    }

    #[test]
    fn reclaim_keeps_reported_reserved_and_sold() {
        let mut item = ItemState::new(q(100), 1, 1000);
        let mut a = Allocation::default();
        borrow(&mut item, &mut a, q(50));
        a.reported = PoolCounts { available: 30, reserved: 5, sold: 15 };
        assert_eq!(reclaim(&mut item, &mut a), 30);
        assert_eq!((item.available, a.held()), (80, 20));
        assert!(check_item("i", &item, &[("app".into(), a)]).violations.is_empty());
    }

    #[test]
    fn lost_pool_is_in_doubt_until_resolved() {
        let mut item = ItemState::new(q(100), 1, 1000);
        let mut a = Allocation::default();
        borrow(&mut item, &mut a, q(40));
        a.reported = PoolCounts { available: 10, reserved: 10, sold: 20 };
        mark_lost(&mut a);
        assert_eq!((a.in_doubt, reclaimable(&a)), (40, 0), "never reclaimed automatically");
        let c = check_item("i", &item, &[("app".into(), a)]);
        assert!(c.violations.is_empty() && c.in_doubt.len() == 1 && c.drifts.is_empty());
        assert!(resolve_in_doubt(&mut item, &mut a, &ch("app"), 41).is_err());
        assert_eq!(resolve_in_doubt(&mut item, &mut a, &ch("app"), 25).unwrap(), 15);
        assert_eq!((item.total, item.available, item.written_off, a.held(), a.in_doubt), (75, 75, 25, 0, 0));
        assert!(check_item("i", &item, &[("app".into(), a)]).violations.is_empty());
        assert!(resolve_in_doubt(&mut item, &mut a, &ch("app"), 0).is_err(), "nothing left in doubt");
    }

    #[test]
    fn units_in_doubt_cannot_be_returned() {
        let mut item = ItemState::new(q(100), 1, 1000);
        let mut a = Allocation::default();
        borrow(&mut item, &mut a, q(10));
        a.reported = PoolCounts { available: 10, reserved: 0, sold: 0 };
        reclaim_into_doubt(&mut a);
        assert!(give_back(&mut item, &mut a, &ch("app"), q(1)).is_err());
        assert_eq!(resolve_in_doubt(&mut item, &mut a, &ch("app"), 0).unwrap(), 10);
        assert!(check_item("i", &item, &[("app".into(), a)]).violations.is_empty());
    }

    #[test]
    fn reclaim_without_a_last_report_puts_unreported_units_in_doubt() {
        let mut item = ItemState::new(q(100), 1, 1000);
        let mut a = Allocation::default();
        borrow(&mut item, &mut a, q(50));
        a.reported = PoolCounts { available: 30, reserved: 5, sold: 15 };
        assert_eq!(reclaim_into_doubt(&mut a), 30);
        assert_eq!((item.available, a.held(), a.in_doubt), (50, 50, 30), "nothing back on sale yet");
        assert_eq!(reclaimable(&a), 0, "no second reclaim of the same units");
        // The channel's orders show 2 of them sold after its last report.
        assert_eq!(resolve_in_doubt(&mut item, &mut a, &ch("app"), 2).unwrap(), 28);
        assert_eq!((item.total, item.available, a.held(), a.in_doubt), (98, 78, 20, 0));
        assert!(check_item("i", &item, &[("app".into(), a)]).violations.is_empty());
    }

    #[test]
    fn epochs_only_grow_and_fence_older_ones() {
        let s1 = ChannelSession::register(None, "a", 0, 1000, 0);
        let s2 = ChannelSession::register(Some(&s1), "b", 10, 1000, 0);
        assert_eq!((s1.epoch, s2.epoch), (1, 2));
        assert!(s2.check_epoch(&ch("app"), 1).is_err());
        assert!(s2.check_epoch(&ch("app"), 3).is_err());
        assert!(s2.check_epoch(&ch("app"), 2).is_ok());
    }

    #[test]
    fn removal_needs_an_empty_channel_and_no_attached_agent() {
        let s = ChannelSession::register(None, "a", 0, 1000, 0);
        let settled = Allocation { granted: 5, returned: 3, reclaimed: 2, ..Default::default() };
        let holding = Allocation { granted: 5, returned: 1, ..Default::default() };
        let doubt = Allocation { granted: 4, reclaimed: 0, in_doubt: 4, ..Default::default() };
        let all = [("a".to_owned(), holding), ("b".to_owned(), settled), ("c".to_owned(), doubt)];
        let err = check_removal(&ch("app"), &s, true, 5000, &all).unwrap_err();
        assert_eq!(
            err.to_string(),
            "channel \"app\" still holds 4 units of item \"a\", 4 units of item \"c\" (4 in doubt): give them back \
             first (drain its agent, reclaim, resolve)"
        );
        let empty = [("b".to_owned(), settled)];
        assert!(matches!(
            check_removal(&ch("app"), &s, false, 400, &empty),
            Err(LedgerError::AgentAttached { remaining_ms: 600, .. })
        ));
        // The agent's last word: it left though its lease runs on.
        check_removal(&ch("app"), &s, true, 400, &empty).unwrap();
        check_removal(&ch("app"), &s, false, 1000, &empty).unwrap();
        check_removal(&ch("app"), &s, false, 1000, &[]).unwrap();
    }

    #[test]
    fn reclaim_waits_for_lease_expiry_plus_grace() {
        let mut s = ChannelSession::register(None, "a", 0, 1000, 0);
        assert!(matches!(
            s.begin_reclaim(&ch("app"), 1500, 1000),
            Err(LedgerError::LeaseLive { remaining_ms: 500, .. })
        ));
        s.begin_reclaim(&ch("app"), 2000, 1000).unwrap();
        assert_eq!(s.epoch, 2);
    }

    #[test]
    fn check_finds_broken_conservation_and_oversell() {
        let mut item = ItemState::new(q(10), 1, 1000);
        let a = Allocation {
            granted: 5,
            reported: PoolCounts { available: 0, reserved: 0, sold: 11 },
            ..Default::default()
        };
        item.available = 4;
        let c = check_item("i", &item, &[("app".into(), a)]);
        let kinds: Vec<_> = c.violations.iter().map(|v| v.invariant.as_str()).collect();
        assert_eq!(kinds, ["conservation", "oversell"]);
        assert_eq!(c.drifts.len(), 1);
    }

    #[test]
    fn fingerprint_ignores_nothing_but_the_epoch() {
        let item = ItemId::parse("item_id", "i").unwrap();
        let a = Mutation::Borrow { item: item.clone(), channel: ch("app"), quantity: q(3) };
        let b = Mutation::Borrow { item: item.clone(), channel: ch("app"), quantity: q(4) };
        let r = Mutation::Return { item, channel: ch("app"), quantity: q(3) };
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), r.fingerprint());
        assert_eq!(a.scope(), r.scope());
    }

    #[test]
    fn pool_sums_and_drift_never_overflow() {
        let p = PoolCounts { available: u64::MAX, reserved: 1, sold: 0 };
        assert_eq!((p.sum(), p.checked_sum()), (u64::MAX, None));
        let huge = Allocation { granted: u64::MAX, ..Default::default() };
        assert_eq!(huge.drift(), i64::MAX, "held beyond i64 clamps, it does not wrap negative");
        let over = Allocation { reported: p, ..Default::default() };
        assert_eq!(over.drift(), i64::MIN);
        let committed = PoolCounts { available: 0, reserved: u64::MAX, sold: 1 };
        assert_eq!(reclaimable(&Allocation { granted: 5, reported: committed, ..Default::default() }), 0);
    }

    #[test]
    fn counters_at_their_limit_refuse_instead_of_wrapping() {
        let mut item = ItemState::new(q(10), 1, 1000);
        let mut a = Allocation { granted: u64::MAX, ..Default::default() };
        assert_eq!(borrow(&mut item, &mut a, q(4)), 0, "a grant that cannot be counted is not made");
        assert_eq!((item.available, a.granted), (10, u64::MAX));

        let mut item = ItemState::new(q(10), 1, 1000);
        item.available = u64::MAX - 1;
        let mut a = Allocation { granted: 5, ..Default::default() };
        assert!(matches!(give_back(&mut item, &mut a, &ch("app"), q(3)), Err(LedgerError::Overflow { .. })));
        assert_eq!((item.available, a.returned), (u64::MAX - 1, 0), "nothing changed");

        // A corrupted row: fewer units in total than the ones to write off.
        let mut item = ItemState::new(q(10), 1, 1000);
        let mut a = Allocation { granted: 50, in_doubt: 50, ..Default::default() };
        assert!(matches!(resolve_in_doubt(&mut item, &mut a, &ch("app"), 20), Err(LedgerError::Overflow { .. })));
        assert_eq!((item.total, a.in_doubt), (10, 50), "nothing changed");
    }

    #[test]
    fn lease_times_saturate() {
        let s = ChannelSession::register(None, "a", 1_000, u64::MAX, 0);
        assert_eq!(s.lease_expires_at_ms, i64::MAX, "a huge lease is long, not in the past");
        let mut s = ChannelSession::register(None, "a", i64::MAX - 5, 1_000, 0);
        assert_eq!(s.lease_expires_at_ms, i64::MAX);
        assert!(s.begin_reclaim(&ch("app"), i64::MAX - 1, u64::MAX).is_err(), "not reclaimable before its lease ends");
        s.renew(0, u64::MAX);
        assert_eq!(s.lease_expires_at_ms, i64::MAX);
    }
}
