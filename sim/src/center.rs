//! The center: ledger rows and the request table, each call one "transaction" over the
//! real `inventory_core::ledger` arithmetic, as `center/src/store/sql.rs` and the Center
//! service run it (request lookup before the epoch check, refusals not recorded, events
//! published for `WatchChannel`).

use std::collections::BTreeMap;
use std::fmt;

use inventory_core::ledger::{
    self, Allocation, ChannelSession, ItemState, LedgerError, Mutation, PoolCounts, RateShare,
};
use inventory_core::pool::remember_write_seq;
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_core::{Channel, ItemId, Quantity};

use crate::config::{Breakage, LEASE_TTL_MS, RECLAIM_GRACE_MS};

pub fn qty(n: u64) -> Quantity {
    Quantity::parse("quantity", n).expect("simulated quantities are positive and small")
}

#[derive(Debug, Clone)]
pub struct CenterItem {
    pub id: ItemId,
    pub state: ItemState,
    pub watermarks: Watermarks,
    pub rate_batching: Option<RateBatching>,
}

/// The first answer to a request id, as the `requests` table keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Borrow { granted: u64, center_available: u64 },
    Return { center_available: u64 },
    AddStock,
}

#[derive(Debug, Clone)]
pub struct StoredRequest {
    pub fingerprint: String,
    pub answer: Answer,
}

/// Why the center refused a call (nothing was applied or recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// FAILED_PRECONDITION: stale epoch, unregistered channel, return above held.
    Precondition(String),
    /// ALREADY_EXISTS: the request id was used with another payload.
    Conflict(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Precondition(m) => write!(f, "failed precondition: {m}"),
            Refusal::Conflict(m) => write!(f, "already exists: {m}"),
        }
    }
}

impl From<LedgerError> for Refusal {
    fn from(e: LedgerError) -> Self {
        Refusal::Precondition(e.to_string())
    }
}

/// What the center says a channel holds of one item, at registration (`Holding`) or in
/// DescribeItem's `held`/`generation`/`in_doubt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub item: String,
    pub held: u64,
    /// The pool generation the channel last reported (0: never).
    pub generation: u64,
    pub in_doubt: u64,
    /// The highest write sequence the channel reported for the pool: the floor its agent
    /// sets before touching the pool (`pool_write_seqs`).
    pub write_seq_floor: u64,
    /// Reference model: [`Center::changes`] when the center answered, so the checker knows
    /// which reclaims a resync with this view takes into account.
    pub as_of: u64,
}

/// The Center service's HeartbeatResponse, as far as the agent acts on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    /// `in_doubt_items`: items whose units the center holds in doubt for the channel.
    pub in_doubt_items: Vec<String>,
    /// Items marked lost because the report came with another pool generation (for stats).
    pub generation_changed: Vec<String>,
    /// Items marked lost with nothing in doubt: the channel held none of them (for stats).
    pub lost_without_units: Vec<String>,
}

/// One pool in a heartbeat (`PoolReport`): a frozen pool is reported lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub item: String,
    pub counts: PoolCounts,
    pub generation: u64,
    pub lost: bool,
    pub sell_rate_milli: u64,
    /// The pool's write sequence as the agent's store layer knows it (its floor).
    pub write_seq: u64,
}

/// What the center publishes on `WatchChannel` (`center/src/events.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CenterEvent {
    Restocked {
        item: String,
        center_available: u64,
        from_channel: Option<String>,
    },
    ReturnRequested {
        item: String,
        starving: String,
    },
    /// An operator settled the channel's in-doubt units of the item.
    InDoubtResolved {
        item: String,
        channel: String,
    },
    /// The item's schedule was set, moved or reached its end (`ScheduleChanged`).
    ScheduleChanged {
        item: String,
        schedule: inventory_core::schedule::Schedule,
    },
}

impl CenterEvent {
    /// `LedgerEvent::concerns`.
    pub fn concerns(&self, channel: &str) -> bool {
        match self {
            CenterEvent::Restocked { from_channel, .. } => from_channel.as_deref() != Some(channel),
            CenterEvent::ReturnRequested { starving, .. } => starving != channel,
            CenterEvent::InDoubtResolved { channel: target, .. } => target == channel,
            CenterEvent::ScheduleChanged { .. } => true,
        }
    }
}

/// The center: ledger rows plus the request table, each call one "transaction".
#[derive(Debug, Clone, Default)]
pub struct Center {
    pub items: BTreeMap<String, CenterItem>,
    /// (item, channel) -> allocation.
    pub allocations: BTreeMap<(String, String), Allocation>,
    pub sessions: BTreeMap<String, ChannelSession>,
    /// Short Borrows shared by the channels' rates (the statistics show the rule ran).
    pub shared_borrows: u64,
    /// Items' channel shares (caps, floors, weights), part of their definition.
    pub shares: crate::shares::Shares,
    /// (scope, request id) -> first answer.
    pub requests: BTreeMap<(String, String), StoredRequest>,
    /// Reference model, invariant 4: how many times each (scope, request id) changed the
    /// ledger.
    pub applied: BTreeMap<(String, String), u32>,
    /// Reference model, invariant 6: mutations applied with an epoch other than the
    /// channel's current one.
    pub stale_applied: Vec<String>,
    /// Published and not yet fanned out to agents.
    pub outbox: Vec<CenterEvent>,
    /// Channel -> whether its last heartbeat was its last word (`last_report`, sent by a
    /// drain's final report); reset to false by a registration (`channels.last_report`).
    pub last_report: BTreeMap<String, bool>,
    /// Reference model: reclaims and in-doubt resolutions so far (they take units from a
    /// channel behind its agent's back).
    pub changes: u64,
    /// (item, channel) -> the highest write sequence reported (`pool_write_seqs`, kept by
    /// `core::pool::remember_write_seq`).
    pub write_seqs: BTreeMap<(String, String), u64>,
}

impl Center {
    pub fn item(&self, item: &str) -> &CenterItem {
        &self.items[item]
    }

    /// The allocations of one item, as `check_item` takes them.
    pub fn allocations_of(&self, item: &str) -> Vec<(String, Allocation)> {
        self.allocations.iter().filter(|((i, _), _)| i == item).map(|((_, c), a)| (c.clone(), *a)).collect()
    }

    pub fn held(&self, item: &str, channel: &str) -> u64 {
        self.allocations.get(&(item.to_owned(), channel.to_owned())).map_or(0, Allocation::held)
    }

    /// The request-table lookup that precedes every mutation (`find_request`).
    fn find_request(&self, m: &Mutation, request_id: &str, breakage: &Breakage) -> Result<Option<Answer>, Refusal> {
        if breakage.apply_replays {
            return Ok(None);
        }
        let Some(stored) = self.requests.get(&(m.scope(), request_id.to_owned())) else { return Ok(None) };
        if stored.fingerprint != m.fingerprint() {
            return Err(Refusal::Conflict(format!(
                "request_id {request_id:?} was already used for another request ({})",
                stored.fingerprint
            )));
        }
        Ok(Some(stored.answer))
    }

    /// `put_request` plus the reference model's count of applications.
    fn put_request(&mut self, m: &Mutation, request_id: &str, answer: Answer) {
        let key = (m.scope(), request_id.to_owned());
        *self.applied.entry(key.clone()).or_default() += 1;
        self.requests.insert(key, StoredRequest { fingerprint: m.fingerprint(), answer });
    }

    /// `stale_or_unknown`, unless the epoch check is deliberately broken. Records an
    /// application with a stale epoch for the checker.
    fn check_epoch(&mut self, channel: &Channel, epoch: u64, what: &str, breakage: &Breakage) -> Result<(), Refusal> {
        let Some(session) = self.sessions.get(channel.as_str()) else {
            return Err(Refusal::Precondition(format!(
                "stale epoch {epoch} for channel {channel}: channel is not registered"
            )));
        };
        if breakage.skip_epoch_check {
            if session.epoch != epoch {
                self.stale_applied.push(format!("{what} with epoch {epoch}, current {}", session.epoch));
            }
            return Ok(());
        }
        Ok(session.check_epoch(channel, epoch)?)
    }

    /// `SqlLedger::borrow` + the ReturnRequested publication of the Center service.
    /// Returns the answer and whether it was a replay.
    #[allow(clippy::too_many_arguments)]
    pub fn borrow(
        &mut self,
        item: &str,
        channel: &Channel,
        epoch: u64,
        quantity: u64,
        request_id: &str,
        (sell_rate_milli, now_ms): (u64, i64),
        plan: crate::shares::BorrowPlan,
        breakage: &Breakage,
    ) -> Result<(Answer, bool), Refusal> {
        let item_id = self.item(item).id.clone();
        let m = Mutation::Borrow { item: item_id, channel: channel.clone(), quantity: qty(quantity) };
        if let Some(first) = self.find_request(&m, request_id, breakage)? {
            return Ok((first, true));
        }
        self.check_epoch(channel, epoch, &format!("borrow {request_id}"), breakage)?;
        let key = (item.to_owned(), channel.to_string());
        let mut alloc = self.allocations.get(&key).copied().unwrap_or_default();
        // Like the SQL store (`store/batch.rs`): within the plan (cap, floors, the opening),
        // a short Borrow is shared by the rates of the channels whose lease is live and
        // that are below their cap, and the Borrow's rate becomes the channel's latest.
        let now = plan.now();
        let mut share = RateShare::default();
        let usable = now.usable(self.item(item).state.available);
        if quantity.min(now.room) > usable && sell_rate_milli > 0 {
            let others = self
                .allocations
                .iter()
                .filter(|((i, c), a)| {
                    i == item
                        && c != channel.as_str()
                        && a.sell_rate_milli > 0
                        && self.sessions.get(c).is_some_and(|s| s.lease_expires_at_ms > now_ms)
                        && !self.at_cap(item, c)
                })
                .fold(0u64, |sum, (_, a)| sum.saturating_add(a.sell_rate_milli));
            share = RateShare { own_milli: sell_rate_milli, others_milli: others };
        }
        let entry = self.items.get_mut(item).expect("known item");
        let granted = ledger::borrow_planned(&mut entry.state, &mut alloc, qty(quantity), share, now);
        if share.others_milli > 0 {
            self.shared_borrows += 1;
        }
        alloc.sell_rate_milli = sell_rate_milli;
        if granted > 0 || self.allocations.contains_key(&key) {
            // Like `write_movements`: a zero grant writes no allocation row.
            self.allocations.insert(key, alloc);
        }
        // `store/batch.rs`: held back by the plan (a cap, the opening, floors kept for
        // others while units are left), so no end-of-sale return is asked.
        let capped = quantity > now.room || (now.kept > 0 && entry.state.available > 0);
        // What the channel could still get once open: the floors kept, the cap's room.
        let center_available = plan.limits.usable(entry.state.available).min(plan.limits.room.saturating_sub(granted));
        let answer = Answer::Borrow { granted, center_available };
        self.put_request(&m, request_id, answer);
        if !capped && granted < quantity && center_available == 0 {
            self.outbox.push(CenterEvent::ReturnRequested { item: item.to_owned(), starving: channel.to_string() });
        }
        Ok((answer, false))
    }

    /// `SqlLedger::give_back` + the Restocked publication (`ledger::give_back` refuses a
    /// Return of units in doubt).
    pub fn give_back(
        &mut self,
        item: &str,
        channel: &Channel,
        epoch: u64,
        quantity: u64,
        request_id: &str,
        breakage: &Breakage,
    ) -> Result<(Answer, bool), Refusal> {
        let item_id = self.item(item).id.clone();
        let m = Mutation::Return { item: item_id, channel: channel.clone(), quantity: qty(quantity) };
        if let Some(first) = self.find_request(&m, request_id, breakage)? {
            return Ok((first, true));
        }
        self.check_epoch(channel, epoch, &format!("return {request_id}"), breakage)?;
        let entry = self.items.get_mut(item).expect("known item");
        let mut alloc = self.allocations.get(&(item.to_owned(), channel.to_string())).copied().unwrap_or_default();
        let mut after = entry.state.clone();
        ledger::give_back(&mut after, &mut alloc, channel, qty(quantity))?;
        entry.state = after;
        self.allocations.insert((item.to_owned(), channel.to_string()), alloc);
        let center_available = entry.state.available;
        let answer = Answer::Return { center_available };
        self.put_request(&m, request_id, answer);
        self.outbox.push(CenterEvent::Restocked {
            item: item.to_owned(),
            center_available,
            from_channel: Some(channel.to_string()),
        });
        Ok((answer, false))
    }

    /// `SqlLedger::add_stock` + the Restocked publication.
    pub fn add_stock(&mut self, item: &str, quantity: u64, request_id: &str) -> Result<bool, Refusal> {
        let item_id = self.item(item).id.clone();
        let m = Mutation::AddStock { item: item_id, quantity: qty(quantity) };
        if self.find_request(&m, request_id, &Breakage::default())?.is_some() {
            return Ok(true);
        }
        let entry = self.items.get_mut(item).expect("known item");
        let mut after = entry.state.clone();
        ledger::add_stock(&mut after, qty(quantity))?;
        entry.state = after;
        let center_available = entry.state.available;
        self.put_request(&m, request_id, Answer::AddStock);
        self.outbox.push(CenterEvent::Restocked { item: item.to_owned(), center_available, from_channel: None });
        Ok(false)
    }

    /// `SqlLedger::register`: a new epoch (above `fenced_at`, the highest pool fence the
    /// agent found), and what the channel holds of each item it has an allocation row for,
    /// by item id.
    pub fn register(&mut self, channel: &str, agent_id: &str, now_ms: i64, fenced_at: u64) -> (u64, Vec<Holding>) {
        let session = ChannelSession::register(self.sessions.get(channel), agent_id, now_ms, LEASE_TTL_MS, fenced_at);
        let epoch = session.epoch;
        self.sessions.insert(channel.to_owned(), session);
        self.last_report.insert(channel.to_owned(), false);
        let held = self
            .allocations
            .iter()
            .filter(|((_, c), _)| c == channel)
            .map(|((i, _), a)| Holding {
                item: i.clone(),
                held: a.held(),
                generation: a.generation,
                in_doubt: a.in_doubt,
                write_seq_floor: self.write_seq_floor(i, channel),
                as_of: self.changes,
            })
            .collect();
        (epoch, held)
    }

    /// DescribeItem's `held`, `generation` and `in_doubt` for the asking channel (an
    /// allocation row that does not exist reads as zeros).
    pub fn describe(&self, item: &str, channel: &str) -> Holding {
        let a = self.allocations.get(&(item.to_owned(), channel.to_owned())).copied().unwrap_or_default();
        Holding {
            item: item.to_owned(),
            held: a.held(),
            generation: a.generation,
            in_doubt: a.in_doubt,
            write_seq_floor: self.write_seq_floor(item, channel),
            as_of: self.changes,
        }
    }

    /// A Return's write sequence: the floor rises to it, never falls
    /// (`core::pool::remember_write_seq`).
    pub fn raise_write_seq(&mut self, item: &str, channel: &str, write_seq: u64) {
        if write_seq == 0 {
            return;
        }
        let seq = self.write_seqs.entry((item.to_owned(), channel.to_owned())).or_default();
        *seq = remember_write_seq(*seq, write_seq);
    }

    /// The highest write sequence the channel reported for the item's pool (0: none).
    pub fn write_seq_floor(&self, item: &str, channel: &str) -> u64 {
        self.write_seqs.get(&(item.to_owned(), channel.to_owned())).copied().unwrap_or(0)
    }

    /// The Center service's Heartbeat: a pool reported lost, or reported with another
    /// generation (0 included) than the last non-zero one the channel reported, is marked
    /// lost (`mark_lost`: everything the channel holds of it is in doubt); then the lease is
    /// renewed and the reported totals, generations and `last_report` stored. The answer
    /// lists every item the channel has units in doubt of (a pool lost while the channel
    /// held none of it is not listed). The center does this in separate transactions; here
    /// it is one step.
    pub fn heartbeat(
        &mut self,
        channel: &Channel,
        epoch: u64,
        reports: &[Report],
        last_report: bool,
        now_ms: i64,
    ) -> Result<HeartbeatAnswer, Refusal> {
        let Some(session) = self.sessions.get(channel.as_str()) else {
            return Err(Refusal::Precondition(format!("channel {channel} is not registered")));
        };
        // Every write below checks the epoch first (mark_lost, then heartbeat).
        session.check_epoch(channel, epoch)?;
        let known = |item: &str| self.allocations.get(&(item.to_owned(), channel.to_string())).copied();
        let mut answer = HeartbeatAnswer {
            in_doubt_items: self
                .allocations
                .iter()
                .filter(|((_, c), a)| c == channel.as_str() && a.in_doubt > 0)
                .map(|((i, _), _)| i.clone())
                .collect(),
            generation_changed: Vec::new(),
            lost_without_units: Vec::new(),
        };
        let mut lost: Vec<String> = reports.iter().filter(|r| r.lost).map(|r| r.item.clone()).collect();
        for r in reports {
            let before = known(&r.item).map_or(0, |a| a.generation);
            // A pool reported with generation 0 after a real one vanished too.
            if before != 0 && r.generation != before && !lost.contains(&r.item) {
                lost.push(r.item.clone());
                answer.generation_changed.push(r.item.clone());
            }
        }
        for item in &lost {
            // An UPDATE: no allocation row, nothing to mark (and nothing in doubt).
            let units = self.allocations.get_mut(&(item.clone(), channel.to_string())).map_or(0, |a| {
                ledger::mark_lost(a);
                a.in_doubt
            });
            if units == 0 {
                answer.lost_without_units.push(item.clone());
            }
            // Only units really in doubt freeze the item.
            if units > 0 && !answer.in_doubt_items.contains(item) {
                answer.in_doubt_items.push(item.clone());
            }
        }
        let session = self.sessions.get_mut(channel.as_str()).expect("checked above");
        session.renew(now_ms, LEASE_TTL_MS);
        self.last_report.insert(channel.to_string(), last_report);
        for r in reports {
            let a = self.allocations.entry((r.item.clone(), channel.to_string())).or_default();
            a.reported = r.counts;
            a.reported_at_ms = now_ms;
            a.generation = r.generation;
            a.sell_rate_milli = if r.lost { 0 } else { r.sell_rate_milli };
            let seq = self.write_seqs.entry((r.item.clone(), channel.to_string())).or_default();
            *seq = remember_write_seq(*seq, r.write_seq);
        }
        Ok(answer)
    }

    /// `Admin/ResolveInDoubt` (`SqlLedger::resolve_in_doubt` + its publications): `sold`
    /// of the units in doubt are written off, the rest of them go back to the center; the
    /// channel keeps what was not in doubt . Returns the units returned.
    pub fn resolve_in_doubt(&mut self, item: &str, channel: &Channel, sold: u64) -> Result<u64, Refusal> {
        let entry = self.items.get_mut(item).expect("known item");
        let key = (item.to_owned(), channel.to_string());
        let mut alloc = self.allocations.get(&key).copied().unwrap_or_default();
        let mut after = entry.state.clone();
        let returned = ledger::resolve_in_doubt(&mut after, &mut alloc, channel, sold)?;
        self.changes += 1;
        entry.state = after;
        let center_available = entry.state.available;
        self.allocations.insert(key, alloc);
        self.outbox.push(CenterEvent::InDoubtResolved { item: item.to_owned(), channel: channel.to_string() });
        if returned > 0 {
            self.outbox.push(CenterEvent::Restocked {
                item: item.to_owned(),
                center_available,
                from_channel: Some(channel.to_string()),
            });
        }
        Ok(returned)
    }

    /// `SqlLedger::reclaim` + the Restocked publications: per item, the units reclaimed
    /// (back on sale) and the units put in doubt. Only a channel whose last report was its
    /// last word (a drain) is reclaimed with `ledger::reclaim`; any other's unreported
    /// units go in doubt (`ledger::reclaim_into_doubt`).
    pub fn reclaim(&mut self, channel: &Channel, now_ms: i64) -> Result<Vec<(String, u64, u64)>, Refusal> {
        let Some(session) = self.sessions.get_mut(channel.as_str()) else {
            return Err(Refusal::Precondition(format!("channel {channel} is not registered")));
        };
        session.begin_reclaim(channel, now_ms, RECLAIM_GRACE_MS)?;
        self.changes += 1;
        let last_word = self.last_report.get(channel.as_str()).copied().unwrap_or(false);
        let mut out = Vec::new();
        for ((item, c), alloc) in self.allocations.iter_mut() {
            if c != channel.as_str() {
                continue;
            }
            if !last_word {
                let doubt = ledger::reclaim_into_doubt(alloc);
                out.push((item.clone(), 0, doubt));
                continue;
            }
            let entry = self.items.get_mut(item).expect("known item");
            let units = ledger::reclaim(&mut entry.state, alloc);
            if units > 0 {
                self.outbox.push(CenterEvent::Restocked {
                    item: item.clone(),
                    center_available: entry.state.available,
                    from_channel: Some(channel.to_string()),
                });
            }
            out.push((item.clone(), units, 0));
        }
        Ok(out)
    }
}
