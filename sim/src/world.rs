//! The simulated world: the center, the agents with their durable pools and volatile
//! memory, the network between them, the buyers, and the reference model the checker
//! compares against.
//!
//! The center's ledger arithmetic, epochs, leases and request fingerprints are the real
//! ones from `inventory_core::ledger`; the watermark decision is the real
//! `inventory_core::rebalance::decide`. What `center/src/store/sql.rs` does around them in
//! one transaction (request table lookup before the epoch check, refused calls not
//! recorded) is mirrored by [`Center`]. The pool ([`Pool`]) is the real model
//! `inventory_core::pool`, which the in-memory store `agent/src/store/memory.rs` wraps
//! (itself the twin of the Lua scripts), on the logical clock instead of the system clock. The agent's behaviour (`agent.rs`,
//! `link.rs`, `items.rs`, `workers.rs`, `startup.rs`) is mirrored step by step in
//! `step.rs`, including each item's `borrow_lock` ([`ItemFlags::waiters`]) and the epoch
//! each Borrow/Return carries ([`Op::store_epoch`], read before its pool writes).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use inventory_core::ledger::{self, Allocation, ChannelSession, ItemState, LedgerError, Mutation, PoolCounts};
pub use inventory_core::pool::{AcquireArgs, AcquireResult, Pool, PoolError, ReservationState, Transition};
use inventory_core::watermarks::Watermarks;
use inventory_core::{Channel, ItemId, Quantity};

use crate::rng::Rng;

/// Channel names, in order; a world uses the first `n`.
pub const CHANNELS: [&str; 4] = ["app", "web", "eu-west", "partner"];
/// Item names, in order; a world uses the first `n`.
pub const ITEMS: [&str; 2] = ["skin", "bundle"];

/// Lease of an agent's registration, and the grace before a reclaim is allowed.
pub const LEASE_TTL_MS: u64 = 3_000;
pub const RECLAIM_GRACE_MS: u64 = 1_000;
/// The agent stops selling this long before its lease runs out (`--lease-margin-ms`).
pub const LEASE_MARGIN_MS: i64 = 1_000;
/// The agent heartbeats every third of its lease (`workers::heartbeat`).
pub const HEARTBEAT_EVERY_MS: i64 = (LEASE_TTL_MS / 3) as i64;
/// How long an Acquire that found the pool empty waits for the shared Borrow before it
/// answers without retrying (`--miss-wait-ms`).
pub const MISS_WAIT_MS: i64 = 2_000;
/// How long a pool stays above high before surplus goes back (`AgentSettings`).
pub const RETURN_SUSTAIN_MS: u64 = 500;
/// `agent.rs`: at most one starvation Borrow per item per this many ms.
pub const STARVING_SIGNAL_EVERY_MS: i64 = 200;
/// `link.rs`: attempts of one Borrow/Return, all with the same request id and epoch.
pub const LINK_ATTEMPTS: u32 = 5;
/// `agent.rs` `RESYNC_AFTER_UNKNOWN_MS`: a Borrow or Return whose outcome is unknown is
/// settled by a per-item resync this much later.
pub const RESYNC_AFTER_UNKNOWN_MS: i64 = 5_000;
/// `Agent::pool_lost` (since 37a6364): an item frozen for a lost pool is resynced this
/// much later (if the channel held none of it, nothing was lost and it sells again).
pub const LOST_POOL_RESYNC_AFTER_MS: i64 = 1_000;
/// With [`Faults::bounded_delays`], a call or reply lands (or is gone) at most this long
/// after it was sent: the link's deadline per attempt (`--center-timeout-ms`). Shorter
/// than [`RESYNC_AFTER_UNKNOWN_MS`], the assumption that resync relies on.
pub const MAX_DELAY_MS: i64 = 2_000;

/// Which faults a run injects. Percentages are per opportunity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// A Borrow/Return request (or a DescribeItem) vanishes before the center sees it.
    pub lose_request_pct: u32,
    /// The center applied the call but the reply never arrives.
    pub lose_reply_pct: u32,
    /// A heartbeat is lost (the lease is not renewed): with enough of them a live agent's
    /// lease expires and it can be reclaimed while it still sells (a partition).
    pub lose_heartbeat_pct: u32,
    /// Agents crash (volatile memory lost, pool kept) and restart.
    pub crashes: bool,
    /// Agents stop gracefully (SIGTERM: give back what is unreserved, final report).
    pub stops: bool,
    /// When the operator reclaims a channel whose lease expired (plus grace).
    pub reclaims: Reclaims,
    /// A pool's store loses its data (Redis restarted without persistence).
    pub pool_data_loss: bool,
    /// Second processes of a running agent's channel registering, fencing it.
    pub rivals: Rivals,
    /// Calls and replies land or are gone within [`MAX_DELAY_MS`] of being sent (off: a
    /// call may reach the center any time later, e.g. after the agent's resync).
    pub bounded_delays: bool,
    /// A pool store may lose a pool in the last window of a Borrow: after `borrow_now`'s
    /// second generation check (the snapshot once the grant is in) and before its refill
    /// script (which, since 4473fcb, finds the pool missing and refuses; before, it
    /// recreated the pool under a new generation: [`OldAgent::refill_creates`]). Off,
    /// stores lose pools at any other moment, including while the Borrow's call is out or
    /// its answer not yet checked (the check then catches the loss).
    pub loss_before_refill: bool,
    /// An attempt may still be on its way when the link gives up on its call, and land
    /// afterwards (within [`MAX_DELAY_MS`] with bounded delays). Off, the attempts of a
    /// call given up are lost: an unknown outcome comes only from lost replies.
    pub late_attempts: bool,
}

impl Faults {
    /// Everything that the fixed logic survives: lost, late (within the deadline),
    /// reordered and replayed calls and their unknown outcomes, attempts landing after the
    /// link gave up on their call, crashes, graceful stops and restarts, stale calls of
    /// dead incarnations, fencing of running agents with calls in flight (a second process
    /// registering) while their other tasks keep starting calls under the new epoch, pool
    /// stores losing their data (also while the agent is down, has no generation of it
    /// recorded, has not noticed the loss before reporting, or has a Borrow of it in
    /// flight), reclaims of agents that stopped gracefully (drained: their last report is
    /// their last word). Left out, each in a scenario of its own (all of which keep every
    /// invariant over their tested seeds since 37a6364, 4473fcb, 9ffeaf6 and 6b4c4d3):
    /// reclaims of crashed or partitioned agents, the schedule
    /// [`loss_before_refill`](Self::loss_before_refill) and [`Rivals::SharedStore`].
    pub const DEFAULT: Faults = Faults {
        lose_request_pct: 5,
        lose_reply_pct: 10,
        lose_heartbeat_pct: 0,
        crashes: true,
        stops: true,
        reclaims: Reclaims::StoppedAgents,
        pool_data_loss: true,
        rivals: Rivals::Fence,
        bounded_delays: true,
        loss_before_refill: false,
        late_attempts: true,
    };
}

/// Second processes of a channel (a deploy overlapping the running agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rivals {
    Never,
    /// It registers (a new epoch) and dies before its resync: the running agent is fenced
    /// with its calls in flight and registers again at its next heartbeat.
    Fence,
    /// It registers, fences and resyncs the pools of the store it shares with the running
    /// agent, reports and stops: two processes align one pool, each under its own locks
    /// (a deploy overlap: both believe they lead the channel).
    SharedStore,
}

/// The operator's use of `invctl reclaim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaims {
    Never,
    /// Only channels whose agent stopped gracefully: its final report is exact.
    StoppedAgents,
    /// Whenever the lease has expired for the grace period.
    LeaseExpired,
}

/// Deliberate breakage, to show the checker catches real mistakes (the simulator is not
/// vacuous). All off in real runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakage {
    /// The center applies Borrow/Return whatever epoch they carry.
    pub skip_epoch_check: bool,
    /// The center ignores its request table: a replayed Borrow/Return applies again.
    pub apply_replays: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Random steps before the run drains to quiescence and sells out.
    pub steps: usize,
    pub faults: Faults,
    pub breakage: Breakage,
    /// At quiescence, every agent registers again and resyncs before invariant 2 is
    /// checked (the brief's procedure). Without it, a running agent keeps whatever drift
    /// the faults left, as it does in production until it restarts or is fenced.
    pub resync_at_quiescence: bool,
    /// Units in doubt while no pool store lost data are a violation (invariant 7: they
    /// stay stranded until an operator resolves them). Off: the operator resolves them at
    /// quiescence like real losses.
    pub doubt_requires_data_loss: bool,
    /// The agent (or center, or pool store) behaves as before one of the fixes in these
    /// respects (to show the checker still sees those bugs). All off in real runs.
    pub old_agent: OldAgent,
}

/// Behaviours of the agent (and center) before the fixes of commits 35edb44, 9634405,
/// 47263b0, 4473fcb, 195d94b, 37a6364, 9ffeaf6 and 6b4c4d3, each of which the simulator
/// found (or shows) to break an invariant. All off in real runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OldAgent {
    /// 35edb44: the link reads the epoch again on every attempt (a call begun before a
    /// re-registration is replayed under the new epoch). Overrides
    /// [`call_epoch_at_send`](Self::call_epoch_at_send).
    pub epoch_per_attempt: bool,
    /// 35edb44: the registration's resync does not wait for the item's Borrow/Return in
    /// flight.
    pub resync_ignores_lock: bool,
    /// Bug A (9634405): the registration's resync uses the `held` the registration
    /// answered, not a DescribeItem read under the item's lock.
    pub registration_held: bool,
    /// Bug B (9634405): `reports` does not run the generation check (a vanished pool goes
    /// out as generation 0, counts 0/0/0), and the center skips generation-0 reports in its
    /// generation check.
    pub unchecked_reports: bool,
    /// Bug C (9634405): `borrow_now` refills without checking the generation again once
    /// the grant is in (with the refill script of the time, which creates a missing pool).
    pub refill_unchecked: bool,
    /// Bug D (9634405): `resync_item` resyncs whether or not a resync is still due once
    /// it holds the lock, and then clears whatever schedule is set.
    pub resync_item_unconditional: bool,
    /// Bug E (47263b0): the registration's resync adds units even while a Borrow/Return
    /// of the item has an unknown outcome (a resync scheduled), so a late attempt of a
    /// Return that gave up takes back units the resync just refilled.
    pub registration_adds_while_unknown: bool,
    /// Bug F (47263b0): the center lists every item it marks lost in `in_doubt_items`,
    /// even when `mark_lost` put nothing in doubt (the channel held none of it): the agent
    /// freezes the item for good.
    pub lost_listed_without_units: bool,
    /// The known gap closed by 195d94b: the center's reclaim ignores whether the channel's
    /// last report was its last word (`last_report`, sent only by a drain) and always puts
    /// `held - reported(reserved+sold)` back on sale, also for a crashed or partitioned
    /// agent that sold after its last report.
    pub reclaim_without_last_word: bool,
    /// Bug C's remaining window (closed by 4473fcb): a grant's refill script creates a pool
    /// that does not exist, so a pool lost between `borrow_now`'s second generation check
    /// and the refill is recreated by it (`refill_existing` refuses a missing pool inside
    /// the script). Also the refill of [`refill_unchecked`](Self::refill_unchecked).
    pub refill_creates: bool,
    /// Bug G (closed by 37a6364): `ledger::give_back` checks only `held`, units in doubt
    /// included, and the agent gives back units of a frozen or `held_in_doubt` item, so a
    /// Return of units in doubt is accepted and the operator's resolution (which settles
    /// `in_doubt`) hands the same units out again.
    pub returns_of_units_in_doubt: bool,
    /// Before 37a6364: a pool lost while its channel held none of it stays frozen while the
    /// agent runs (`pool_lost` schedules no resync, and a resync of a pool at `held 0`,
    /// nothing in doubt, does not clear `frozen`).
    pub held_zero_stays_frozen: bool,
    /// Before 9ffeaf6: the pool store has no fences (`raise_fence` does nothing; `refill`,
    /// `take_for_return` and `untake` ignore the caller's epoch), so a process of the
    /// channel whose registration was superseded still moves units in and out of a pool
    /// the new incarnation has resynced.
    pub unfenced_store: bool,
    /// Before 6b4c4d3: a Borrow/Return goes out under the epoch the link holds when the
    /// call begins (`CenterLink::retry` read it, then kept it for every attempt), not the
    /// one its task read before its pool writes. A Return taken under epoch E and sent
    /// after a re-registration carries the later epoch, so the center accepts it even
    /// after another process's registration (E+1) fenced the pool and its resync counted
    /// the taken units back in. (A Borrow is sent in the step that reads the epoch, so
    /// only Returns differ.)
    pub call_epoch_at_send: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            steps: 300,
            faults: Faults::DEFAULT,
            breakage: Breakage::default(),
            resync_at_quiescence: true,
            doubt_requires_data_loss: true,
            old_agent: OldAgent::default(),
        }
    }
}

/// One broken rule: which invariant (as numbered in the brief) and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: &'static str, detail: impl Into<String>) -> Self {
        Self { invariant, detail: detail.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {}: {}", self.invariant, self.detail)
    }
}

/// `x -= by`, where going below zero is a broken invariant 3 rather than a panic.
pub fn dec(x: &mut u64, by: u64, what: &str) -> Result<(), Violation> {
    *x = x.checked_sub(by).ok_or_else(|| Violation::new("3", format!("{what} would go negative: {x} - {by}")))?;
    Ok(())
}

/// `x += by`, overflow being a broken invariant too.
pub fn inc(x: &mut u64, by: u64, what: &str) -> Result<(), Violation> {
    *x = x.checked_add(by).ok_or_else(|| Violation::new("3", format!("{what} overflows: {x} + {by}")))?;
    Ok(())
}

pub fn qty(n: u64) -> Quantity {
    Quantity::parse("quantity", n).expect("simulated quantities are positive and small")
}

// ---------------------------------------------------------------------------------------
// The center
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct CenterItem {
    pub id: ItemId,
    pub state: ItemState,
    pub watermarks: Watermarks,
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
    /// Items marked lost with nothing in doubt: the channel held none of them (for stats;
    /// bug F's case).
    pub lost_without_units: Vec<String>,
}

/// One pool in a heartbeat (`PoolReport`): a frozen pool is reported lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub item: String,
    pub counts: PoolCounts,
    pub generation: u64,
    pub lost: bool,
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
}

impl CenterEvent {
    /// `LedgerEvent::concerns`.
    pub fn concerns(&self, channel: &str) -> bool {
        match self {
            CenterEvent::Restocked { from_channel, .. } => from_channel.as_deref() != Some(channel),
            CenterEvent::ReturnRequested { starving, .. } => starving != channel,
            CenterEvent::InDoubtResolved { channel: target, .. } => target == channel,
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
    pub fn borrow(
        &mut self,
        item: &str,
        channel: &Channel,
        epoch: u64,
        quantity: u64,
        request_id: &str,
        breakage: &Breakage,
    ) -> Result<(Answer, bool), Refusal> {
        let item_id = self.item(item).id.clone();
        let m = Mutation::Borrow { item: item_id, channel: channel.clone(), quantity: qty(quantity) };
        if let Some(first) = self.find_request(&m, request_id, breakage)? {
            return Ok((first, true));
        }
        self.check_epoch(channel, epoch, &format!("borrow {request_id}"), breakage)?;
        let entry = self.items.get_mut(item).expect("known item");
        let key = (item.to_owned(), channel.to_string());
        let mut alloc = self.allocations.get(&key).copied().unwrap_or_default();
        let granted = ledger::borrow(&mut entry.state, &mut alloc, qty(quantity));
        if granted > 0 {
            // Like `write_movements`: a zero grant writes no allocation row.
            self.allocations.insert(key, alloc);
        }
        let center_available = entry.state.available;
        let answer = Answer::Borrow { granted, center_available };
        self.put_request(&m, request_id, answer);
        if granted < quantity && center_available == 0 {
            self.outbox.push(CenterEvent::ReturnRequested { item: item.to_owned(), starving: channel.to_string() });
        }
        Ok((answer, false))
    }

    /// `SqlLedger::give_back` + the Restocked publication. Since 37a6364
    /// `ledger::give_back` refuses a Return of units in doubt (`quantity > held -
    /// in_doubt`: FailedPrecondition, so the agent puts the units back).
    /// `old.returns_of_units_in_doubt`: the ledger before it, which checked only `held`.
    #[allow(clippy::too_many_arguments)]
    pub fn give_back(
        &mut self,
        item: &str,
        channel: &Channel,
        epoch: u64,
        quantity: u64,
        request_id: &str,
        breakage: &Breakage,
        old: OldAgent,
    ) -> Result<(Answer, bool), Refusal> {
        let item_id = self.item(item).id.clone();
        let m = Mutation::Return { item: item_id, channel: channel.clone(), quantity: qty(quantity) };
        if let Some(first) = self.find_request(&m, request_id, breakage)? {
            return Ok((first, true));
        }
        self.check_epoch(channel, epoch, &format!("return {request_id}"), breakage)?;
        let entry = self.items.get_mut(item).expect("known item");
        let mut alloc = self.allocations.get(&(item.to_owned(), channel.to_string())).copied().unwrap_or_default();
        // The ledger before 37a6364 checked only `held`: the same call with nothing in doubt.
        let in_doubt = alloc.in_doubt;
        if old.returns_of_units_in_doubt {
            alloc.in_doubt = 0;
        }
        let mut after = entry.state.clone();
        ledger::give_back(&mut after, &mut alloc, channel, qty(quantity))?;
        alloc.in_doubt = in_doubt;
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

    /// `SqlLedger::register`: a new epoch, and what the channel holds of each item it has
    /// an allocation row for, by item id.
    pub fn register(&mut self, channel: &str, agent_id: &str, now_ms: i64) -> (u64, Vec<Holding>) {
        let session = ChannelSession::register(self.sessions.get(channel), agent_id, now_ms, LEASE_TTL_MS);
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
            as_of: self.changes,
        }
    }

    /// The Center service's Heartbeat (`center/src/service/center.rs`): a pool reported
    /// lost, or reported with another generation (0 included) than the last non-zero one
    /// the channel reported, is marked lost (`SqlLedger::mark_lost`: everything the channel holds of it
    /// is in doubt); then `SqlLedger::heartbeat` renews the lease and stores the reported
    /// totals and generations. The answer lists every item the channel has units in doubt
    /// of: since 47263b0 a lost pool is listed only if `mark_lost` put units in doubt (a
    /// pool lost while the channel held none of it freezes nothing). (The center reads the
    /// allocations, marks and stores in separate transactions; here they are one step.)
    /// Since 195d94b it also stores `last_report` (the drain's final report says true).
    /// `old`: the center before 9634405 (`unchecked_reports`) or 47263b0
    /// (`lost_listed_without_units`).
    pub fn heartbeat(
        &mut self,
        channel: &Channel,
        epoch: u64,
        reports: &[Report],
        last_report: bool,
        now_ms: i64,
        old: OldAgent,
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
            // A pool reported with generation 0 after a real one vanished too (the center
            // before 9634405 skipped such reports: `skip_generation_0`).
            let skipped = old.unchecked_reports && r.generation == 0;
            if before != 0 && !skipped && r.generation != before && !lost.contains(&r.item) {
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
            let listed = units > 0 || old.lost_listed_without_units;
            if listed && !answer.in_doubt_items.contains(item) {
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
        }
        Ok(answer)
    }

    /// `Admin/ResolveInDoubt` (`SqlLedger::resolve_in_doubt` + its publications): `sold`
    /// of the units in doubt are written off, the rest of them go back to the center; the
    /// channel keeps what was not in doubt (since 195d94b). Returns the units returned.
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
    /// (back on sale) and the units put in doubt. Since 195d94b only a channel whose last
    /// report was its last word (a drain) is reclaimed with `ledger::reclaim`; any other's
    /// unreported units go in doubt (`ledger::reclaim_into_doubt`), nothing back on sale.
    /// `old.reclaim_without_last_word`: the center before 195d94b.
    pub fn reclaim(
        &mut self,
        channel: &Channel,
        now_ms: i64,
        old: OldAgent,
    ) -> Result<Vec<(String, u64, u64)>, Refusal> {
        let Some(session) = self.sessions.get_mut(channel.as_str()) else {
            return Err(Refusal::Precondition(format!("channel {channel} is not registered")));
        };
        session.begin_reclaim(channel, now_ms, RECLAIM_GRACE_MS)?;
        self.changes += 1;
        let last_word =
            old.reclaim_without_last_word || self.last_report.get(channel.as_str()).copied().unwrap_or(false);
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

// ---------------------------------------------------------------------------------------
// The pool (durable: Redis, or the in-memory store)
// ---------------------------------------------------------------------------------------

// The pool is `inventory_core::pool::Pool`, the model the in-memory store wraps, on the
// logical clock.

/// Records are never forgotten in a run (the real retention is 24 h, far beyond one).
pub const RECORD_RETENTION_MS: i64 = i64::MAX;

/// What a refill script answered (`lua/refill.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refill {
    /// Applied now (1).
    Applied,
    /// The grant id was applied before (0).
    Replayed,
    /// `must_exist` and the pool does not exist (-1, `StoreError::PoolMissing`): nothing
    /// recorded.
    Missing,
    /// The pool was fenced with a later epoch than the caller's (-2,
    /// `StoreError::Fenced`): nothing recorded.
    Fenced,
}

/// A store call refused because the pool was fenced with a later epoch
/// (`StoreError::Fenced`): nothing moved, nothing recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced;

/// A refusal of the pool model the simulator never provokes (a counter out of range, a
/// reused reservation id): a broken invariant 3.
pub fn broken(e: PoolError) -> Violation {
    Violation::new("3", format!("pool model: {e}"))
}

/// A fenced call as [`Fenced`]; any other refusal is [`broken`].
pub fn unless_fenced<T>(r: Result<T, PoolError>) -> Result<Result<T, Fenced>, Violation> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(PoolError::Fenced { .. }) => Ok(Err(Fenced)),
        Err(e) => Err(broken(e)),
    }
}

/// `PoolStore::refill` (or, with `must_exist`, `refill_existing`) as the script's answer.
#[allow(clippy::too_many_arguments)]
pub fn refill(
    pool: &mut Pool,
    grant_id: &str,
    units: u64,
    new_generation: u64,
    epoch: u64,
    must_exist: bool,
    now_ms: i64,
) -> Result<Refill, Violation> {
    let r = if must_exist {
        pool.refill_existing(grant_id, units, epoch, now_ms, RECORD_RETENTION_MS)
    } else {
        pool.refill(grant_id, units, epoch, new_generation, now_ms, RECORD_RETENTION_MS)
    };
    match r {
        Ok(true) => Ok(Refill::Applied),
        Ok(false) => Ok(Refill::Replayed),
        Err(PoolError::Missing) => Ok(Refill::Missing),
        Err(PoolError::Fenced { .. }) => Ok(Refill::Fenced),
        Err(e) => Err(broken(e)),
    }
}

// ---------------------------------------------------------------------------------------
// Agents
// ---------------------------------------------------------------------------------------

/// Per-item flags of a running agent (`items.rs`' `ItemRuntime`), lost on a crash.
#[derive(Debug, Clone, Default)]
pub struct ItemFlags {
    pub center_dry: bool,
    pub end_of_sale: bool,
    pub local_empty: bool,
    pub fast_path_keys: Option<BTreeSet<String>>,
    pub above_high_since: Option<i64>,
    pub last_starving_signal_ms: i64,
    pub generation: u64,
    pub frozen: bool,
    /// `held_in_doubt` (195d94b): the center holds some of the channel's units of the item
    /// in doubt (a reclaim without the agent's last word) while the pool is intact: no
    /// selling, but the pool is reported as it is.
    pub held_in_doubt: bool,
    /// `resync_at_ms`: when to resync the pool with the center (0: none pending).
    pub resync_at_ms: i64,
    /// Who waits for the item's `borrow_lock`, in arrival order (tokio's mutex is fair).
    /// The lock itself is held by the item's [`Op`], if any.
    pub waiters: VecDeque<Waiter>,
    /// `borrows_done`: Borrow tasks finished (a queued task that sees it move skips).
    pub borrows_done: u64,
    /// Acquires whose Borrow task just finished: they try the pool once more, racing the
    /// next task the lock passes to.
    pub retries: Vec<Miss>,
}

/// An Acquire that found the pool empty and waits for its `borrow_shared` task (at most
/// [`MISS_WAIT_MS`]) to try once more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Miss {
    pub user: String,
    pub quantity: u64,
    pub key: String,
    /// The buyer's key use (see [`KeyUse`]), updated if the retry reserves.
    pub key_use: usize,
    pub at_ms: i64,
}

impl ItemFlags {
    /// `ItemRuntime::set_center_available`.
    pub fn set_center_available(&mut self, available: u64) {
        self.center_dry = available == 0;
        if !self.center_dry {
            self.fast_path_keys = None;
        }
    }

    /// `ItemRuntime::stock_returned_locally`.
    pub fn stock_returned_locally(&mut self) {
        self.local_empty = false;
        self.fast_path_keys = None;
    }

    /// `ItemRuntime::fast_sold_out`.
    pub fn fast_sold_out(&self, key: &str) -> Option<bool> {
        if !self.center_dry || !self.local_empty {
            return None;
        }
        self.fast_path_keys.as_ref().map(|k| !k.contains(key))
    }

    pub fn may_prefetch(&self) -> bool {
        !self.center_dry && !self.end_of_sale
    }

    /// `ItemRuntime::resync_due` (`resync_scheduled(now).is_some()`).
    pub fn resync_due(&self, now_ms: i64) -> bool {
        self.resync_at_ms != 0 && now_ms >= self.resync_at_ms
    }
}

/// The agent's tasks that wait for an item's lock or a call: while one waits, it does
/// nothing else (the rebalancer passes over no other item, the watcher reads no further
/// event, the heartbeat worker sends no heartbeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// `workers::rebalancer` (a Return it decided, or `resync_item`).
    Rebalancer,
    /// `workers::watcher` (`on_event`: ReturnRequested, InDoubtResolved).
    Watcher,
    /// `workers::heartbeat` inside `register_and_resync` after being fenced.
    Registration,
    /// `return_all` at shutdown.
    Shutdown,
    /// A task of its own: `borrow_shared`'s spawned Borrow.
    Spawned,
}

/// A task waiting for an item's `borrow_lock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiter {
    /// `borrow_shared`'s task: `borrow_now(want)` once it holds the lock, unless a Borrow
    /// finished since the task was spawned (`seen`). `miss`: the Acquire awaiting it.
    Borrow { want: u64, seen: u64, miss: Option<Miss> },
    /// `give_back(max)`: take, then Return, all under the lock.
    Return { max: u64, task: Task },
    /// `register_and_resync`: the resync of the registration's next holding.
    Resync,
    /// `Agent::resync_item` (the rebalancer, after an unknown outcome).
    ResyncItem,
    /// `on_event(InDoubtResolved)`: empty the pool, sell again.
    InDoubtResolved,
}

impl Waiter {
    pub fn task(&self) -> Task {
        match self {
            Waiter::Borrow { .. } => Task::Spawned,
            Waiter::Return { task, .. } => *task,
            Waiter::Resync => Task::Registration,
            Waiter::ResyncItem => Task::Rebalancer,
            Waiter::InDoubtResolved => Task::Watcher,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Borrow,
    Return,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Borrow => "borrow",
            OpKind::Return => "return",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A Return whose units were taken from the pool, not yet sent.
    Taken,
    /// Attempt `attempt` is out; waiting for its reply or its deadline.
    Waiting,
    /// A Borrow answered with a grant; the pool's generation not yet checked again.
    Granted(u64),
    /// A granted Borrow whose pool passed the second generation check: the refill script
    /// (`refill_existing`) runs next (the window of [`Faults::loss_before_refill`]).
    Refilling(u64),
}

/// One Borrow/Return call of a running agent (a `borrow_now` / `give_back` task with the
/// link's retry loop), holding the item's `borrow_lock` until it is done; lost on a crash.
#[derive(Debug, Clone)]
pub struct Op {
    pub kind: OpKind,
    pub item: String,
    /// The request id; for a Return also the take id.
    pub request_id: String,
    pub quantity: u64,
    pub attempt: u32,
    pub phase: Phase,
    /// The epoch the last attempt carried; `None` until the first attempt is sent. Since
    /// 6b4c4d3 always `store_epoch`; with [`OldAgent::call_epoch_at_send`] the link's epoch
    /// when the first attempt went out, with [`OldAgent::epoch_per_attempt`] the link's at
    /// each attempt.
    pub epoch: Option<u64>,
    /// The epoch the task read before its store calls (`link.epoch()` in `borrow_now`
    /// before the `open-` refill, in `give_back` before the take): a Borrow's refill and a
    /// refused Return's untake carry it, and are refused once a later incarnation of the
    /// channel fenced the pool; since 6b4c4d3 every attempt of the call carries it too
    /// (`CenterLink::borrow`/`give_back`'s `epoch`).
    pub store_epoch: u64,
    /// The task that awaits the call.
    pub task: Task,
    /// A Borrow's: the Acquire awaiting it.
    pub miss: Option<Miss>,
}

/// A `register_and_resync` under way: the holdings the center answered, resynced one
/// after the other, each under its item's lock with the center's view read again there
/// (DescribeItem); the lease is granted at the end.
#[derive(Debug, Clone)]
pub struct Registration {
    pub sent_at_ms: i64,
    pub epoch: u64,
    pub pending: VecDeque<Holding>,
    /// A [`Waiter::Resync`] for the first pending holding is queued.
    pub waiting: bool,
    /// The start-up registration (retried if it fails), not the heartbeat worker's.
    pub startup: bool,
}

/// A running agent's volatile memory.
#[derive(Debug, Clone)]
pub struct AgentMem {
    pub incarnation: u64,
    pub epoch: u64,
    pub items: BTreeMap<String, ItemFlags>,
    pub ops: Vec<Op>,
    /// The WatchChannel stream: one TCP stream, so in order.
    pub events: VecDeque<CenterEvent>,
    pub last_heartbeat_ms: i64,
    /// `CenterLink::lease_until_ms`: the agent sells only before this (0: no lease).
    pub lease_until_ms: i64,
    /// `CenterLink::reachable`: whether the last call to the center got an answer.
    pub reachable: bool,
    pub registering: Option<Registration>,
    /// SIGTERM received: items whose unreserved units `return_all` has still to give
    /// back (after the workers have finished what they were doing).
    pub stopping: Option<VecDeque<String>>,
}

impl AgentMem {
    /// Whether the task is waiting for a lock or awaiting a call.
    pub fn busy(&self, task: Task) -> bool {
        self.ops.iter().any(|o| o.task == task)
            || self.items.values().any(|f| f.waiters.iter().any(|w| w.task() == task))
    }

    /// Whether the item's `borrow_lock` is held (by a Borrow or Return in flight).
    pub fn locked(&self, item: &str) -> bool {
        self.ops.iter().any(|o| o.item == item)
    }

    /// `CenterLink::renew_lease`: from the send time, minus the margin (at most half the
    /// lease), never shortened.
    pub fn renew_lease(&mut self, sent_at_ms: i64) {
        let ttl = LEASE_TTL_MS as i64;
        let until = sent_at_ms + ttl - LEASE_MARGIN_MS.min(ttl / 2);
        self.lease_until_ms = self.lease_until_ms.max(until);
    }

    pub fn lease_valid(&self, now_ms: i64) -> bool {
        now_ms < self.lease_until_ms
    }
}

#[derive(Debug, Clone)]
pub struct Agent {
    pub channel: Channel,
    /// Durable: survives crashes (Redis with persistence).
    pub pools: BTreeMap<String, Pool>,
    /// `None` while down.
    pub mem: Option<AgentMem>,
    /// Down after a graceful stop (not a crash).
    pub stopped_gracefully: bool,
    pub incarnations: u64,
}

impl Agent {
    pub fn name(&self) -> &str {
        self.channel.as_str()
    }
}

// ---------------------------------------------------------------------------------------
// The network
// ---------------------------------------------------------------------------------------

/// A Borrow/Return call or its reply in flight. Separate calls are separate HTTP/2
/// streams, so they may arrive in any order; a message is never duplicated by the
/// network (duplicates come from retries).
#[derive(Debug, Clone)]
pub enum Message {
    Request {
        sent_at_ms: i64,
        channel: usize,
        incarnation: u64,
        epoch: u64,
        kind: OpKind,
        item: String,
        quantity: u64,
        request_id: String,
        attempt: u32,
    },
    Reply {
        sent_at_ms: i64,
        channel: usize,
        incarnation: u64,
        request_id: String,
        attempt: u32,
        result: Result<Answer, Refusal>,
    },
}

impl Message {
    pub fn sent_at_ms(&self) -> i64 {
        match self {
            Message::Request { sent_at_ms, .. } | Message::Reply { sent_at_ms, .. } => *sent_at_ms,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Buyers and the reference model
// ---------------------------------------------------------------------------------------

/// An idempotency key a buyer used, for replays.
#[derive(Debug, Clone)]
pub struct KeyUse {
    pub channel: usize,
    pub item: String,
    pub key: String,
    pub user: String,
    pub quantity: u64,
    /// The reservation this key made, if it reserved, and the pool's data-loss count then.
    pub reservation: Option<(String, u32)>,
}

/// What the checker knows beyond the system's own state.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    /// (channel, item) -> units reclaimed by the center (or returned to it by an in-doubt
    /// resolution) that the agent has not yet removed from its pool, each with the
    /// [`Center::changes`] count that took them. Until a resync with a view of the center
    /// at least that recent, the pool legitimately holds more than the channel's.
    pub reclaimed_unsynced: BTreeMap<(usize, String), Vec<(u64, u64)>>,
    /// (channel, item, grant id) -> refills that added units.
    pub refills: BTreeMap<(usize, String, String), u32>,
    /// (channel, item) -> how often the pool's store lost its data.
    pub pool_losses: BTreeMap<(usize, String), u32>,
    /// (channel, item) -> units sold in pool data that was lost (they stay sold).
    pub lost_sold: BTreeMap<(usize, String), u64>,
    /// (channel, item) -> units an operator wrote off as sold when resolving in-doubt
    /// units: they left the ledger's total but may still show as sold in the pool.
    pub written_off: BTreeMap<(usize, String), u64>,
    /// (channel, item) -> units a reclaim without the agent's last word put in doubt (a
    /// legitimate doubt without any data loss).
    pub reclaimed_into_doubt: BTreeMap<(usize, String), u64>,
    /// Broken rules noticed while stepping (e.g. a resync that could not remove units).
    pub noticed: Vec<Violation>,
}

impl Reference {
    /// Units taken from the channel's pool behind its agent's back (reclaim, in-doubt
    /// resolution) at center change `as_of`.
    pub fn unsynced(&mut self, c: usize, item: &str, as_of: u64, units: u64) {
        if units > 0 {
            self.reclaimed_unsynced.entry((c, item.to_owned())).or_default().push((as_of, units));
        }
    }

    /// A resync (or an in-doubt resolution heard) with the center's view as of `as_of`
    /// has removed what was taken until then.
    pub fn synced(&mut self, c: usize, item: &str, as_of: u64) {
        let key = (c, item.to_owned());
        if let Some(list) = self.reclaimed_unsynced.get_mut(&key) {
            list.retain(|(at, _)| *at > as_of);
            if list.is_empty() {
                self.reclaimed_unsynced.remove(&key);
            }
        }
    }

    /// Units taken from the channel's pool that its agent has not removed yet.
    pub fn reclaimed(&self, c: usize, item: &str) -> u64 {
        self.reclaimed_unsynced.get(&(c, item.to_owned())).map_or(0, |l| l.iter().map(|(_, u)| u).sum())
    }
}

/// What a run exercised, to show the faults really happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub crashes: u64,
    pub lost_messages: u64,
    pub retries: u64,
    pub give_ups: u64,
    pub replays_answered: u64,
    pub stale_refused: u64,
    /// ... of which calls of the running incarnation begun before its re-registration
    /// (refused, not replayed under the new epoch).
    pub stale_refused_own: u64,
    pub reclaims: u64,
    /// Items an operator had to resolve at quiescence (units in doubt).
    pub resolutions: u64,
    /// ... of which neither a pool store had lost data nor a reclaim without the agent's
    /// last word had put units in doubt: a false alarm.
    pub resolutions_without_data_loss: u64,
    /// ... of units a reclaim without the agent's last word put in doubt (195d94b).
    pub resolutions_after_reclaim: u64,
    /// Reclaims of a channel whose last report was not its last word (a crashed, fenced
    /// or partitioned agent) that put units in doubt...
    pub reclaims_into_doubt: u64,
    /// ... and reclaims of a drained channel that put units back on sale.
    pub reclaims_on_sale: u64,
    /// Items an agent stopped selling (`held_in_doubt`) while reporting the pool as it is.
    pub held_in_doubt: u64,
    /// A running agent heard it was fenced and registered again.
    pub fenced_reregistrations: u64,
    /// ... while Borrow/Return calls of its were in flight.
    pub fenced_with_calls_in_flight: u64,
    /// A registration's resync waited for the item's Borrow/Return in flight (the lock).
    pub resyncs_waiting_for_a_call: u64,
    /// Borrows/Returns whose outcome stayed unknown (a resync was scheduled).
    pub unknown_outcomes: u64,
    /// Per-item resyncs (`resync_item`) that ran.
    pub item_resyncs: u64,
    /// Calls delivered because their deadline was about to pass.
    pub late_landings: u64,
    /// Pools created (an `open-` refill of 0) before their first Borrow.
    pub pools_opened: u64,
    /// Pool stores that lost a pool's data...
    pub pool_losses: u64,
    /// ... while its agent was down or had no generation of it recorded.
    pub pool_losses_unrecorded: u64,
    /// Items an agent froze because the heartbeat answer listed them in doubt.
    pub frozen_by_center: u64,
    /// Pools the center marked lost because a report came with another generation.
    pub generation_changes: u64,
    pub resync_moves: u64,
    /// Registration resyncs whose DescribeItem under the lock saw another `held` than the
    /// registration answered (calls under the new epoch landed in between: bug A's case).
    pub registration_held_moved: u64,
    /// Registrations that failed half-way (a DescribeItem lost).
    pub registrations_failed: u64,
    /// `resync_item` found, once it held the lock, that the resync was pushed later by a
    /// call that gave up meanwhile (bug D's case).
    pub item_resyncs_postponed: u64,
    /// Pool losses while a Borrow of the pool was in flight...
    pub pool_losses_during_borrow: u64,
    /// ... and grants not refilled because the pool was found lost (bug C's case).
    pub refills_withheld: u64,
    /// Grants whose refill script found the pool missing (`refill_existing`: lost after
    /// the second generation check; bug C's remaining window).
    pub refills_of_missing_pools: u64,
    /// Pools fenced by a registration (the fence raised above an epoch in use)...
    pub fences_raised: u64,
    /// ... and store calls (refill, take, untake) of an older incarnation refused.
    pub store_calls_fenced: u64,
    /// Calls whose first attempt went out under the epoch their task read before its pool
    /// writes while the link already held a later one (a Return taken before a
    /// re-registration and sent after it: since 6b4c4d3 it carries the take's epoch).
    pub calls_sent_under_their_pool_epoch: u64,
    /// Items frozen for a lost pool that a resync at `held 0` (nothing in doubt) put back
    /// on sale while the agent kept running.
    pub unfrozen_at_held_zero: u64,
    /// Registration resyncs that, an outcome of the item being unknown, left out units
    /// the center counts as the channel's (only removing; bug E's case).
    pub registration_adds_withheld: u64,
    /// Pools the center marked lost while the channel held none of them, not listed in
    /// doubt (bug F's case).
    pub lost_pools_without_units: u64,
    /// Units granted or returned at the center but not reflected in a running agent's
    /// pool once everything in flight has landed: they wait for that agent's next
    /// resync (registration, or 5 s after an unknown outcome).
    pub drift_waiting_for_resync: u64,
    pub sold: u64,
}

impl Stats {
    /// Adds another run's counts.
    pub fn add(&mut self, o: &Stats) {
        self.crashes += o.crashes;
        self.lost_messages += o.lost_messages;
        self.retries += o.retries;
        self.give_ups += o.give_ups;
        self.replays_answered += o.replays_answered;
        self.stale_refused += o.stale_refused;
        self.stale_refused_own += o.stale_refused_own;
        self.reclaims += o.reclaims;
        self.resolutions += o.resolutions;
        self.resolutions_without_data_loss += o.resolutions_without_data_loss;
        self.resolutions_after_reclaim += o.resolutions_after_reclaim;
        self.reclaims_into_doubt += o.reclaims_into_doubt;
        self.reclaims_on_sale += o.reclaims_on_sale;
        self.held_in_doubt += o.held_in_doubt;
        self.fenced_reregistrations += o.fenced_reregistrations;
        self.fenced_with_calls_in_flight += o.fenced_with_calls_in_flight;
        self.resyncs_waiting_for_a_call += o.resyncs_waiting_for_a_call;
        self.unknown_outcomes += o.unknown_outcomes;
        self.item_resyncs += o.item_resyncs;
        self.late_landings += o.late_landings;
        self.pools_opened += o.pools_opened;
        self.pool_losses += o.pool_losses;
        self.pool_losses_unrecorded += o.pool_losses_unrecorded;
        self.frozen_by_center += o.frozen_by_center;
        self.generation_changes += o.generation_changes;
        self.registration_adds_withheld += o.registration_adds_withheld;
        self.lost_pools_without_units += o.lost_pools_without_units;
        self.resync_moves += o.resync_moves;
        self.registration_held_moved += o.registration_held_moved;
        self.registrations_failed += o.registrations_failed;
        self.item_resyncs_postponed += o.item_resyncs_postponed;
        self.pool_losses_during_borrow += o.pool_losses_during_borrow;
        self.refills_withheld += o.refills_withheld;
        self.refills_of_missing_pools += o.refills_of_missing_pools;
        self.fences_raised += o.fences_raised;
        self.store_calls_fenced += o.store_calls_fenced;
        self.calls_sent_under_their_pool_epoch += o.calls_sent_under_their_pool_epoch;
        self.unfrozen_at_held_zero += o.unfrozen_at_held_zero;
        self.drift_waiting_for_resync += o.drift_waiting_for_resync;
        self.sold += o.sold;
    }
}

/// Everything in one simulated run.
#[derive(Debug, Clone)]
pub struct World {
    pub config: Config,
    pub rng: Rng,
    pub now_ms: i64,
    pub center: Center,
    pub agents: Vec<Agent>,
    pub network: Vec<Message>,
    pub keys: Vec<KeyUse>,
    /// Reservations buyers know of: (channel, item, reservation id).
    pub reservations: Vec<(usize, String, String)>,
    pub reference: Reference,
    pub stats: Stats,
    pub trace: Vec<String>,
    pub step: usize,
    next_id: u64,
    next_generation: u64,
}

impl World {
    /// A world of 1–2 items and 2–4 channels with stock and settings drawn from the seed.
    pub fn new(seed: u64, config: Config) -> Self {
        let mut rng = Rng::new(seed);
        let n_items = rng.range(1, ITEMS.len() as u64) as usize;
        let n_channels = rng.range(2, CHANNELS.len() as u64) as usize;
        let mut center = Center::default();
        for name in &ITEMS[..n_items] {
            let total = rng.range(10, 60);
            let per_user_limit = rng.range(1, 3);
            let ttl = rng.range(300, 3_000);
            let batch = rng.range(1, 10);
            let low = rng.range(0, batch);
            let high = low + rng.range(1, 2 * batch);
            let watermarks = Watermarks::new(low, high, batch).expect("low < high, batch >= 1");
            center.items.insert(
                (*name).to_owned(),
                CenterItem {
                    id: ItemId::parse("item_id", name).expect("valid"),
                    state: ItemState::new(qty(total), per_user_limit, ttl),
                    watermarks,
                },
            );
        }
        let agents = CHANNELS[..n_channels]
            .iter()
            .map(|c| Agent {
                channel: Channel::parse("channel", c).expect("valid"),
                pools: BTreeMap::new(),
                mem: None,
                stopped_gracefully: false,
                incarnations: 0,
            })
            .collect();
        let mut world = Self {
            config,
            rng,
            now_ms: 1_000,
            center,
            agents,
            network: Vec::new(),
            keys: Vec::new(),
            reservations: Vec::new(),
            reference: Reference::default(),
            stats: Stats::default(),
            trace: Vec::new(),
            step: 0,
            next_id: 0,
            next_generation: 0,
        };
        let summary: Vec<String> = world
            .center
            .items
            .iter()
            .map(|(n, i)| {
                format!(
                    "{n}: total {} limit {} ttl {} wm {}/{}/{}",
                    i.state.total,
                    i.state.per_user_limit,
                    i.state.reservation_ttl_ms,
                    i.watermarks.low,
                    i.watermarks.high,
                    i.watermarks.batch
                )
            })
            .collect();
        world.log(format!("world: channels {:?}; {}", &CHANNELS[..n_channels], summary.join("; ")));
        world
    }

    pub fn item_names(&self) -> Vec<String> {
        self.center.items.keys().cloned().collect()
    }

    /// A fresh id, unique in the run (request ids, take ids, reservation ids, keys).
    pub fn fresh_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{}", self.next_id)
    }

    pub fn fresh_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    pub fn log(&mut self, line: String) {
        self.trace.push(format!("#{:<4} t={:<6} {line}", self.step, self.now_ms));
    }
}
