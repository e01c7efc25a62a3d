//! The rule of a batch of Borrows and Returns that one transaction applies (group commit
//! of one item's concurrent calls, and the lines of a BorrowMany). No I/O: the store reads
//! the rows, these functions decide, the store writes what they say.
//!
//! - A request id recorded before the batch answers from its record (ALREADY_EXISTS for
//!   another payload), before any lock and whatever the epoch, as a single call would.
//! - The other lines apply in order, each to the item and allocation as the lines before
//!   it left them, so the batch answers exactly what the same calls one after another
//!   would have got.
//! - A line that breaks a rule (stale epoch, unknown item, returning more than held) fails
//!   alone and changes nothing; the others still apply.
//! - A request id used twice in one batch: the second line answers from the first's
//!   answer (replayed), or ALREADY_EXISTS for another payload.

use std::collections::{BTreeMap, HashMap};

use inventory_core::ledger::{self, Allocation, ChannelSession, ChannelShares, ItemState, Mutation, Peer, RateShare};
use inventory_core::schedule::{self, Schedule};
use inventory_core::{Channel, ItemId, Quantity, RequestId};

use super::{BorrowOutcome, BorrowRate, Result, ReturnOutcome};
use crate::error::CenterError;

/// One Borrow or Return of a batch.
#[derive(Debug, Clone)]
pub struct Op {
    pub item: ItemId,
    pub channel: Channel,
    pub epoch: u64,
    pub quantity: Quantity,
    pub request_id: RequestId,
    pub kind: OpKind,
}

#[derive(Debug, Clone, Copy)]
pub enum OpKind {
    Borrow(BorrowRate),
    Return,
}

impl Op {
    pub fn mutation(&self) -> Mutation {
        let (item, channel, quantity) = (self.item.clone(), self.channel.clone(), self.quantity);
        match self.kind {
            OpKind::Borrow(_) => Mutation::Borrow { item, channel, quantity },
            OpKind::Return => Mutation::Return { item, channel, quantity },
        }
    }
}

/// A line's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Borrow(BorrowOutcome),
    Return(ReturnOutcome),
}

impl Answer {
    fn replayed(self) -> Self {
        match self {
            Answer::Borrow(b) => Answer::Borrow(BorrowOutcome { replayed: true, ..b }),
            Answer::Return(r) => Answer::Return(ReturnOutcome { replayed: true, ..r }),
        }
    }

    /// The answer of a Borrow (a Return's answer here is a bug of the batch's bookkeeping).
    pub fn into_borrow(self) -> Result<BorrowOutcome> {
        match self {
            Answer::Borrow(out) => Ok(out),
            Answer::Return(_) => Err(CenterError::Internal("a borrow answered as a return".into())),
        }
    }

    /// The answer of a Return.
    pub fn into_return(self) -> Result<ReturnOutcome> {
        match self {
            Answer::Return(out) => Ok(out),
            Answer::Borrow(_) => Err(CenterError::Internal("a return answered as a borrow".into())),
        }
    }

    /// The record kept under the request id (the same JSON as a single call's).
    pub fn to_record(self) -> Result<String> {
        match self {
            Answer::Borrow(b) => serde_json::to_string(&b),
            Answer::Return(r) => serde_json::to_string(&r),
        }
        .map_err(|e| CenterError::Internal(e.to_string()))
    }

    fn from_record(kind: OpKind, request_id: &RequestId, record: &str) -> Result<Self> {
        let unreadable =
            |e: serde_json::Error| CenterError::Internal(format!("stored response of {request_id} unreadable: {e}"));
        Ok(match kind {
            OpKind::Borrow(_) => Answer::Borrow(serde_json::from_str(record).map_err(unreadable)?),
            OpKind::Return => Answer::Return(serde_json::from_str(record).map_err(unreadable)?),
        })
    }
}

/// A request's record: its fingerprint and stored answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub fingerprint: String,
    pub response: String,
}

/// `(scope, request_id)`: what request ids are unique within.
pub type RequestKey = (String, String);

pub fn request_key(m: &Mutation, request_id: &RequestId) -> RequestKey {
    (m.scope(), request_id.as_str().to_owned())
}

/// The answers of the lines whose request id is recorded; `None` for the others.
pub fn answer_replays(ops: &[Op], recorded: &HashMap<RequestKey, Recorded>) -> Vec<Option<Result<Answer>>> {
    ops.iter()
        .map(|op| {
            let m = op.mutation();
            let r = recorded.get(&request_key(&m, &op.request_id))?;
            Some(if r.fingerprint != m.fingerprint() {
                Err(reused(&op.request_id, &r.fingerprint))
            } else {
                Answer::from_record(op.kind, &op.request_id, &r.response).map(Answer::replayed)
            })
        })
        .collect()
}

fn reused(request_id: &RequestId, fingerprint: &str) -> CenterError {
    CenterError::AlreadyExists(format!(
        "request_id {:?} was already used for another request ({fingerprint})",
        request_id.as_str()
    ))
}

/// An allocation as read: the row (default when there is none), whether a row exists,
/// and its channel's lease (for the sell-rate shares).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocRow {
    pub alloc: Allocation,
    pub stored: bool,
    pub lease_expires_at_ms: i64,
}

/// The part of an item's plan every Borrow keeps: its channel shares, its schedule and
/// reserve, and before its opening the channels whose lease is live (the opening
/// allocation's split).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ItemPlan {
    pub shares: ChannelShares,
    pub schedule: Schedule,
    pub center_reserve: u64,
    /// Read only for an item that has not opened; empty otherwise.
    pub live: Vec<String>,
}

impl ItemPlan {
    /// The room the plan leaves a Borrow of `channel` holding `held` of an item of `total`
    /// units before its opening (`schedule::room_before_opening`); `None` once it opened.
    pub fn room_before_opening(&self, total: u64, channel: &str, held: u64, now_ms: i64) -> Option<u64> {
        if self.schedule.opens_at_ms == 0 || self.schedule.opened(now_ms) {
            return None;
        }
        let live: Vec<&str> = self.live.iter().map(String::as_str).collect();
        let allocation = if self.shares.is_empty() {
            schedule::opening_allocation(total, self.center_reserve, &live, channel)
        } else {
            self.shares.opening_allocation(total, self.center_reserve, &live, channel)
        };
        schedule::room_before_opening(&self.schedule, now_ms, allocation, held)
    }
}

/// What the transaction read under the items' locks: the items (and their plans), the
/// sessions of the batch's channels, and every allocation of the items.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub items: HashMap<String, ItemState>,
    /// By item; an item without an entry has no plan.
    pub plans: HashMap<String, ItemPlan>,
    pub sessions: HashMap<String, ChannelSession>,
    /// By `(item, channel)`.
    pub allocs: BTreeMap<(String, String), AllocRow>,
}

/// An allocation to write: the movement counters, and the sell rate when a Borrow gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocWrite {
    pub item: String,
    pub channel: String,
    pub alloc: Allocation,
    pub sell_rate: Option<u64>,
}

/// What the transaction must write and answer.
#[derive(Debug, Default)]
pub struct Applied {
    /// One per line, in order.
    pub answers: Vec<Result<Answer>>,
    /// The first line that failed the epoch check.
    pub stale: Option<usize>,
    /// `(item, before, after)` for each item that changed.
    pub items: Vec<(String, ItemState, ItemState)>,
    pub allocs: Vec<AllocWrite>,
    /// The lines whose answer is recorded under their request id.
    pub record: Vec<usize>,
}

/// Applies the lines that [`answer_replays`] left unanswered, in order.
pub fn apply(ops: &[Op], replays: Vec<Option<Result<Answer>>>, snap: &Snapshot) -> Applied {
    let mut items = snap.items.clone();
    let mut allocs = snap.allocs.clone();
    let mut rates_given: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut moved: BTreeMap<(String, String), ()> = BTreeMap::new();
    let mut firsts: HashMap<RequestKey, usize> = HashMap::new();
    let mut out = Applied::default();
    for (i, (op, replay)) in ops.iter().zip(replays).enumerate() {
        if let Some(answer) = replay {
            out.answers.push(answer);
            continue;
        }
        let m = op.mutation();
        let key = request_key(&m, &op.request_id);
        if let Some(&first) = firsts.get(&key) {
            let answer = if ops[first].mutation().fingerprint() == m.fingerprint() {
                match &out.answers[first] {
                    Ok(a) => Ok(a.replayed()),
                    Err(_) => Err(CenterError::Internal("a recorded line has no answer".into())),
                }
            } else {
                Err(reused(&op.request_id, &ops[first].mutation().fingerprint()))
            };
            out.answers.push(answer);
            continue;
        }
        if let Err(e) = stale_or_unknown(&op.channel, snap.sessions.get(op.channel.as_str()), op.epoch) {
            out.stale.get_or_insert(i);
            out.answers.push(Err(e));
            continue;
        }
        let Some(item) = items.get(op.item.as_str()) else {
            out.answers.push(Err(CenterError::item_not_found(op.item.as_str())));
            continue;
        };
        let akey = (op.item.as_str().to_owned(), op.channel.as_str().to_owned());
        let row = allocs.get(&akey).copied().unwrap_or_default();
        let (mut after, mut alloc) = (item.clone(), row.alloc);
        let answer = match op.kind {
            OpKind::Borrow(rate) => {
                let plan = snap.plans.get(op.item.as_str()).cloned().unwrap_or_default();
                let limits = plan_limits(&plan, &allocs, &akey, alloc.held(), rate.now_ms);
                // Before the opening only the opening's stocking leaves the center. The
                // answer's `center_available` stays what the channel could get once the
                // item opens, so the prestock's answer does not make the center look dry.
                let before_opening = plan.room_before_opening(after.total, &akey.1, alloc.held(), rate.now_ms);
                let now = ledger::Limits { room: limits.room.min(before_opening.unwrap_or(u64::MAX)), ..limits };
                let mut share = RateShare::default();
                let usable = now.usable(after.available);
                if op.quantity.get().min(now.room) > usable && rate.sell_rate_milli > 0 {
                    share = RateShare {
                        own_milli: rate.sell_rate_milli,
                        others_milli: others_rates(&allocs, &akey, &plan.shares, rate.now_ms),
                    };
                }
                let granted = ledger::borrow_planned(&mut after, &mut alloc, op.quantity, share, now);
                alloc.sell_rate_milli = rate.sell_rate_milli;
                rates_given.insert(akey.clone(), rate.sell_rate_milli);
                let room = limits.room.saturating_sub(granted);
                Ok(Answer::Borrow(BorrowOutcome {
                    granted,
                    center_available: limits.usable(after.available).min(room),
                    replayed: false,
                    // Units left but kept for other channels' floors: this channel is
                    // short, not the center dry, and an end-of-sale return would only
                    // bring back units kept for the channels giving them.
                    capped: op.quantity.get() > now.room || (now.kept > 0 && after.available > 0),
                    opens_at_ms: if before_opening.is_some() { plan.schedule.opens_at_ms } else { 0 },
                }))
            }
            OpKind::Return => ledger::give_back(&mut after, &mut alloc, &op.channel, op.quantity)
                .map(|()| Answer::Return(ReturnOutcome { center_available: after.available, replayed: false }))
                .map_err(CenterError::from),
        };
        if answer.is_ok() {
            if after != *item {
                moved.insert(akey.clone(), ());
            }
            items.insert(akey.0.clone(), after);
            allocs.insert(akey, AllocRow { alloc, ..row });
            firsts.insert(key, i);
            out.record.push(i);
        }
        out.answers.push(answer);
    }
    for (id, after) in &items {
        let before = &snap.items[id];
        if after != before {
            out.items.push((id.clone(), before.clone(), after.clone()));
        }
    }
    for (key, row) in &allocs {
        let rate = rates_given.get(key).copied();
        // A row is written when units moved; a rate alone only updates a row that exists.
        let rate_changed = rate
            .is_some_and(|r| row.stored && snap.allocs.get(key).is_some_and(|read| read.alloc.sell_rate_milli != r));
        if moved.contains_key(key) || rate_changed {
            out.allocs.push(AllocWrite {
                item: key.0.clone(),
                channel: key.1.clone(),
                alloc: row.alloc,
                sell_rate: rate,
            });
        }
    }
    out
}

/// FAILED_PRECONDITION unless `epoch` is the registered channel's current one.
pub fn stale_or_unknown(channel: &Channel, session: Option<&ChannelSession>, epoch: u64) -> Result<()> {
    match session {
        None => Err(CenterError::Precondition(format!(
            "stale epoch {epoch} for channel {channel}: channel is not registered"
        ))),
        Some(s) => Ok(s.check_epoch(channel, epoch)?),
    }
}

/// The item's allocations, other than `own`'s.
fn others<'a>(
    allocs: &'a BTreeMap<(String, String), AllocRow>,
    own: &'a (String, String),
) -> impl Iterator<Item = (&'a str, &'a AllocRow)> {
    allocs
        .range((own.0.clone(), String::new())..)
        .take_while(|((item, _), _)| *item == own.0)
        .filter(|((_, channel), _)| *channel != own.1)
        .map(|((_, channel), row)| (channel.as_str(), row))
}

/// The sell rates of the item's other channels whose lease is live and that are below
/// their cap (a channel at its cap takes no more, so claims no share).
fn others_rates(
    allocs: &BTreeMap<(String, String), AllocRow>,
    own: &(String, String),
    shares: &ChannelShares,
    now_ms: i64,
) -> u64 {
    others(allocs, own)
        .filter(|(channel, row)| row.lease_expires_at_ms > now_ms && !ledger::at_cap(shares, channel, row.alloc.held()))
        .fold(0u64, |sum, (_, row)| sum.saturating_add(row.alloc.sell_rate_milli))
}

/// The cap and the floors kept for a Borrow of `own` holding `held` (`ledger::limits`),
/// the other channels as the batch left them.
fn plan_limits(
    plan: &ItemPlan,
    allocs: &BTreeMap<(String, String), AllocRow>,
    own: &(String, String),
    held: u64,
    now_ms: i64,
) -> ledger::Limits {
    let peers = others(allocs, own).map(|(channel, row)| {
        let peer = Peer {
            held: row.alloc.held(),
            lease_live: row.lease_expires_at_ms > now_ms,
            reported_at_ms: row.alloc.reported_at_ms,
        };
        (channel, peer)
    });
    ledger::limits(&plan.shares, &own.1, held, peers, now_ms, plan.schedule.opens_at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(item: &str, channel: &str, quantity: u64, rid: &str, borrow: bool) -> Op {
        Op {
            item: ItemId::parse("item_id", item).unwrap(),
            channel: Channel::parse("channel", channel).unwrap(),
            epoch: 1,
            quantity: Quantity::parse("quantity", quantity).unwrap(),
            request_id: RequestId::parse("request_id", rid).unwrap(),
            kind: if borrow { OpKind::Borrow(BorrowRate::default()) } else { OpKind::Return },
        }
    }

    fn snapshot(available: u64) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut item = ItemState::new(Quantity::parse("total", 100).unwrap(), 1, 1000);
        item.available = available;
        snap.items.insert("i".into(), item);
        let session = ChannelSession { epoch: 1, agent_id: "a".into(), lease_expires_at_ms: 0, last_heartbeat_ms: 0 };
        snap.sessions.insert("app".into(), session);
        snap
    }

    fn granted(a: &Result<Answer>) -> (u64, u64, bool) {
        match a {
            Ok(Answer::Borrow(b)) => (b.granted, b.center_available, b.replayed),
            Ok(Answer::Return(r)) => (0, r.center_available, r.replayed),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn lines_apply_in_order_as_one_call_after_another() {
        let ops = [op("i", "app", 60, "a", true), op("i", "app", 60, "b", true), op("i", "app", 10, "c", false)];
        let out = apply(&ops, vec![None, None, None], &snapshot(100));
        assert_eq!(granted(&out.answers[0]), (60, 40, false));
        assert_eq!(granted(&out.answers[1]), (40, 0, false));
        assert_eq!(granted(&out.answers[2]), (0, 10, false));
        assert_eq!(out.items.len(), 1);
        assert_eq!(out.items[0].2.available, 10);
        assert_eq!(out.allocs.len(), 1);
        assert_eq!((out.allocs[0].alloc.granted, out.allocs[0].alloc.returned), (100, 10));
        assert_eq!(out.record, vec![0, 1, 2]);
    }

    #[test]
    fn before_the_opening_a_borrow_gets_only_the_opening_stock() {
        let mut snap = snapshot(100);
        let session = ChannelSession { epoch: 1, agent_id: "b".into(), lease_expires_at_ms: 0, last_heartbeat_ms: 0 };
        snap.sessions.insert("web".into(), session);
        let schedule = Schedule { opens_at_ms: 10_000, closes_at_ms: 0, prestock_lead_ms: 2_000 };
        let live = vec!["app".to_owned(), "web".to_owned()];
        snap.plans.insert("i".into(), ItemPlan { schedule, center_reserve: 10, live, ..Default::default() });
        let at = |mut op: Op, now_ms: i64| {
            op.kind = OpKind::Borrow(BorrowRate { sell_rate_milli: 0, now_ms });
            op
        };
        let borrow = |out: &Result<Answer>| out.as_ref().unwrap().into_borrow().unwrap();
        let ops = [
            at(op("i", "app", 80, "early", true), 7_999),
            at(op("i", "app", 80, "lead", true), 8_000),
            at(op("i", "app", 5, "again", true), 9_999),
            at(op("i", "web", 80, "web", true), 9_000),
            at(op("i", "app", 5, "open", true), 10_000),
        ];
        let out = apply(&ops, vec![None, None, None, None, None], &snap);
        let early = borrow(&out.answers[0]);
        assert_eq!((early.granted, early.opens_at_ms), (0, 10_000), "before the lead nothing leaves");
        assert_eq!(early.center_available, 100, "the center is not dry for after the opening");
        assert!(early.capped, "a held grant asks no one to give back");
        let lead = borrow(&out.answers[1]);
        assert_eq!((lead.granted, lead.center_available, lead.opens_at_ms), (45, 55, 10_000), "(100 - 10) / 2");
        assert_eq!(borrow(&out.answers[2]).granted, 0, "its allocation is on its shelf");
        assert_eq!(borrow(&out.answers[3]).granted, 45);
        let open = borrow(&out.answers[4]);
        assert_eq!((open.granted, open.opens_at_ms, open.capped), (5, 0, false), "opened: the reserve lends");
        assert_eq!(out.items[0].2.available, 5);
    }

    #[test]
    fn a_borrow_short_only_of_units_kept_for_floors_is_held_back_not_dry() {
        let mut snap = snapshot(10);
        let web = ledger::ChannelShare { channel: "web".into(), weight: 1, cap_units: 0, floor_units: 8 };
        let shares = ChannelShares::from_stored(vec![web]);
        snap.plans.insert("i".into(), ItemPlan { shares, ..Default::default() });
        let alloc = Allocation { granted: 2, reported_at_ms: 1_000, ..Default::default() };
        snap.allocs.insert(("i".into(), "web".into()), AllocRow { alloc, stored: true, lease_expires_at_ms: 60_000 });
        let mut ask = op("i", "app", 9, "a", true);
        ask.kind = OpKind::Borrow(BorrowRate { sell_rate_milli: 0, now_ms: 2_000 });
        let out = apply(&[ask], vec![None], &snap);
        let b = out.answers[0].as_ref().unwrap().into_borrow().unwrap();
        // 6 of the 10 are kept for web's floor (8 − 2 held): app gets 4, and the 6 left
        // are no reason to ask every channel to give back.
        assert_eq!((b.granted, b.center_available, b.capped), (4, 0, true));
    }

    #[test]
    fn a_request_id_twice_in_a_batch_is_a_replay_or_already_exists() {
        let ops = [op("i", "app", 5, "a", true), op("i", "app", 5, "a", true), op("i", "app", 6, "a", true)];
        let out = apply(&ops, vec![None, None, None], &snapshot(100));
        assert_eq!(granted(&out.answers[1]), (5, 95, true));
        assert!(matches!(out.answers[2], Err(CenterError::AlreadyExists(_))));
        assert_eq!(out.record, vec![0]);
        assert_eq!(out.items[0].2.available, 95);
    }

    #[test]
    fn a_failing_line_changes_nothing_and_the_others_apply() {
        let mut stale = op("i", "app", 5, "s", true);
        stale.epoch = 7;
        let ops = [
            op("i", "app", 5, "r", false),
            stale,
            op("gone", "app", 5, "g", true),
            op("i", "web", 5, "w", true),
            op("i", "app", 5, "ok", true),
        ];
        let out = apply(&ops, vec![None, None, None, None, None], &snapshot(100));
        assert!(matches!(out.answers[0], Err(CenterError::Precondition(_))), "return more than held");
        assert!(matches!(out.answers[1], Err(CenterError::Precondition(_))));
        assert!(matches!(out.answers[2], Err(CenterError::NotFound { .. })));
        assert!(matches!(out.answers[3], Err(CenterError::Precondition(_))), "unregistered channel");
        assert_eq!(granted(&out.answers[4]), (5, 95, false));
        assert_eq!(out.stale, Some(1));
        assert_eq!(out.record, vec![4]);
    }

    #[test]
    fn recorded_requests_answer_from_their_record() {
        let ops = [op("i", "app", 5, "a", true), op("i", "app", 9, "b", true)];
        let mut recorded = HashMap::new();
        let first = Answer::Borrow(BorrowOutcome {
            granted: 5,
            center_available: 42,
            replayed: false,
            capped: false,
            opens_at_ms: 0,
        });
        let m = ops[0].mutation();
        recorded.insert(
            request_key(&m, &ops[0].request_id),
            Recorded { fingerprint: m.fingerprint(), response: first.to_record().unwrap() },
        );
        let m = ops[1].mutation();
        recorded.insert(
            request_key(&m, &ops[1].request_id),
            Recorded { fingerprint: "borrow/other/app/1".into(), response: "{}".into() },
        );
        let replays = answer_replays(&ops, &recorded);
        let out = apply(&ops, replays, &snapshot(100));
        assert_eq!(granted(&out.answers[0]), (5, 42, true));
        assert!(matches!(out.answers[1], Err(CenterError::AlreadyExists(_))));
        assert!(out.items.is_empty() && out.allocs.is_empty() && out.record.is_empty());
    }
}
