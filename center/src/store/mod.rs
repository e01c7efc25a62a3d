//! Ledger storage: one trait, implemented for PostgreSQL and SQLite.
//!
//! Every mutation is one short transaction: look up the request id, lock the item row,
//! load the rows, apply a pure function from `inventory_core::ledger`, write back with a
//! conditional update, record the answer under the request id, commit. A replay (even
//! after a reply was lost post-commit) finds the stored answer. Borrows and Returns run
//! in batches ([`batch`]): concurrent calls of one item share one transaction (group
//! commit), and a BorrowMany's or a ReturnMany's lines are one transaction.

pub mod batch;
mod sql;

use async_trait::async_trait;
use inventory_core::buyers::{LimitScope, RegistryFallback};
use inventory_core::ledger::{Allocation, ChannelSession, ChannelShares, Check, ItemState};
use inventory_core::loss::PoolReport;
use inventory_core::schedule::Schedule;
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_core::{AgentId, Channel, ItemId, Quantity, RequestId};
use serde::{Deserialize, Serialize};

pub use sql::{Dialect, SqlLedger, connect};

use crate::error::CenterError;

pub type Result<T> = std::result::Result<T, CenterError>;

/// An item with its default watermarks and the units out with channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRecord {
    pub item_id: String,
    pub state: ItemState,
    pub watermarks: Watermarks,
    /// Whether the pools' batches follow their sell rates (`None`: fixed watermarks).
    pub rate_batching: Option<RateBatching>,
    /// Pool segments per channel (1: one pool).
    pub segments: u32,
    pub limit: LimitSettings,
    pub plan: SalePlan,
    /// The operator's plan per channel (weights, caps, floors); empty without one.
    pub shares: ChannelShares,
    pub held: u64,
}

impl ItemRecord {
    /// The opening allocation of `channel` among the `live` channels: by the item's
    /// shares (weights, caps, floors), or an even split without any.
    pub fn opening_allocation(&self, live: &[&str], channel: &str) -> u64 {
        let (total, reserve) = (self.state.total, self.plan.center_reserve);
        if self.shares.is_empty() {
            inventory_core::schedule::opening_allocation(total, reserve, live, channel)
        } else {
            self.shares.opening_allocation(total, reserve, live, channel)
        }
    }
}

/// The plan of an item's sale: its schedule (the center's clock) and the units the center
/// keeps back from the opening stock. Settings, not the definition: the schedule moves
/// with SetSchedule, and a repeated CreateItem does not compare them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SalePlan {
    pub schedule: Schedule,
    pub center_reserve: u64,
}

/// Where the item's per-user limit applies, and what agents do without the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitSettings {
    pub scope: LimitScope,
    pub fallback: RegistryFallback,
}

/// One channel's line in an item's ledger view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelRecord {
    pub channel: String,
    pub allocation: Allocation,
    /// A segmented pool's segments as last reported (read by the console's view only;
    /// empty elsewhere).
    pub segments: Vec<inventory_core::segments::SegmentCounts>,
    pub session: Option<ChannelSession>,
    pub watermarks: Watermarks,
    pub watermarks_overridden: bool,
}

/// A channel as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelView {
    pub channel: String,
    pub session: ChannelSession,
    /// `(item_id, allocation)`, by item.
    pub allocations: Vec<(String, Allocation)>,
    /// `(item_id, segments as last reported)` of its segmented pools, by item.
    pub segments: Vec<(String, Vec<inventory_core::segments::SegmentCounts>)>,
}

/// One page of the ledger (the console's feed): its items' ledgers with their channels'
/// own watermarks, in item order, and how many items the ledger holds in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerPage {
    pub total_items: usize,
    pub items: Vec<(ItemLedger, Vec<(String, Watermarks)>)>,
}

/// What the console's sampler reads ([`crate::history`]): only the columns drift needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerSample {
    /// `(item_id, units at the center)`, by item.
    pub items: Vec<(String, u64)>,
    /// `(item_id, channel, allocation)`, by item then channel.
    pub lines: Vec<(String, String, Allocation)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemLedger {
    pub item: ItemRecord,
    pub channels: Vec<ChannelRecord>,
}

/// What an agent needs to sell an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemPolicy {
    pub item: ItemRecord,
    /// Effective for the channel asked about.
    pub watermarks: Watermarks,
    /// The item's rate-following batches, unless the channel has fixed watermarks.
    pub rate_batching: Option<RateBatching>,
    /// The asking channel's allocation, when a channel was named.
    pub allocation: Option<Allocation>,
    /// The asking channel's pool floors by segment (see [`Holding::write_seq_floors`]);
    /// empty when no channel was named or none is known.
    pub write_seq_floors: Vec<u64>,
}

/// One line of a BorrowMany.
#[derive(Debug, Clone)]
pub struct BorrowLine {
    pub item: ItemId,
    pub quantity: Quantity,
    pub request_id: RequestId,
    pub rate: BorrowRate,
}

/// One line of a ReturnMany.
#[derive(Debug, Clone)]
pub struct ReturnLine {
    pub item: ItemId,
    pub quantity: Quantity,
    pub request_id: RequestId,
}

/// What a Borrow says of its channel's selling: its sell rate, for the share of a short
/// supply among the channels whose lease is live at `now_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BorrowRate {
    pub sell_rate_milli: u64,
    pub now_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BorrowOutcome {
    pub granted: u64,
    /// What the center could still grant this channel: its available, less the floors it
    /// keeps for other channels, at most the room under the channel's cap (0 at the cap:
    /// the agent then treats the center as dry for it).
    pub center_available: u64,
    #[serde(skip)]
    pub replayed: bool,
    /// The grant was held back by the plan (the channel's cap, the opening, or units kept
    /// for other channels' floors): the center is not dry for the others, so no
    /// ReturnRequested.
    #[serde(skip)]
    pub capped: bool,
    /// The item had not opened: the grant was held to what the plan lets out before the
    /// opening (nothing before the prestock lead, during it the channel's opening
    /// allocation less what it holds). The item's `opens_at`; 0 once it opened.
    #[serde(default)]
    pub opens_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReturnOutcome {
    pub center_available: u64,
    #[serde(skip)]
    pub replayed: bool,
}

/// What the center says a channel holds of one item, at registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub item_id: String,
    pub held: u64,
    pub generation: u64,
    pub in_doubt: u64,
    /// The pool's floors by segment (`core::pool::floors_by_segment`): the highest write
    /// sequences the channel reported.
    pub write_seq_floors: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub session: ChannelSession,
    pub held: Vec<Holding>,
}

/// One pool as a heartbeat reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReportIn {
    pub item: ItemId,
    pub report: PoolReport,
    /// A segmented pool's segments, for display (stored as reported).
    pub segments: Vec<inventory_core::segments::SegmentCounts>,
    /// `(segment, write_seq)` as reported (`core::pool::reported_write_seqs`).
    pub write_seqs: Vec<(u32, u64)>,
}

/// What a heartbeat did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    pub session: ChannelSession,
    /// Pools the loss rule found lost, with the units each put in doubt, by item.
    pub lost: Vec<(String, u64)>,
    /// Every item the channel has units in doubt of, afterwards.
    pub in_doubt_items: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimOutcome {
    /// `(item_id, units back at the center, center available afterwards, units put in doubt)`.
    pub items: Vec<(String, u64, u64, u64)>,
    pub new_epoch: u64,
}

/// A removed channel: the epoch it had, and the items whose settled allocations went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedChannel {
    pub last_epoch: u64,
    pub item_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciliation {
    pub check: Check,
    pub items_checked: u64,
}

/// A new item, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewItem {
    pub item_id: ItemId,
    pub total: Quantity,
    pub per_user_limit: u64,
    pub reservation_ttl_ms: u64,
    pub watermarks: Watermarks,
    pub rate_batching: Option<RateBatching>,
    /// Pool segments per channel, 1..=[`inventory_core::segments::MAX_SEGMENTS`].
    pub segments: u32,
    pub limit: LimitSettings,
    pub plan: SalePlan,
    pub shares: ChannelShares,
}

#[async_trait]
pub trait LedgerStore: Send + Sync + 'static {
    /// Idempotent on the definition: returns `(item, created)`; ALREADY_EXISTS when the
    /// item exists with another definition.
    async fn create_item(&self, item: &NewItem, now_ms: i64) -> Result<(ItemRecord, bool)>;
    async fn add_stock(&self, item: &ItemId, quantity: Quantity, request_id: &RequestId) -> Result<(ItemRecord, bool)>;
    /// A new epoch for the channel, above its last one and above `fenced_at` (the
    /// highest pool fence its agent found: `ledger::fence`).
    async fn register(
        &self,
        channel: &Channel,
        agent: &AgentId,
        now_ms: i64,
        lease_ttl_ms: u64,
        fenced_at: u64,
    ) -> Result<Registration>;
    async fn borrow(
        &self,
        item: &ItemId,
        channel: &Channel,
        epoch: u64,
        quantity: Quantity,
        request_id: &RequestId,
        rate: BorrowRate,
    ) -> Result<BorrowOutcome>;
    /// Several Borrows of one channel in one transaction: one answer per line, in order
    /// (a line's own error among them). A stale epoch fails the whole call.
    async fn borrow_many(
        &self,
        channel: &Channel,
        epoch: u64,
        lines: &[BorrowLine],
    ) -> Result<Vec<Result<BorrowOutcome>>>;
    async fn give_back(
        &self,
        item: &ItemId,
        channel: &Channel,
        epoch: u64,
        quantity: Quantity,
        request_id: &RequestId,
    ) -> Result<ReturnOutcome>;
    /// Several Returns of one channel in one transaction, as [`LedgerStore::borrow_many`]:
    /// one answer per line, in order; a stale epoch fails the whole call.
    async fn give_back_many(
        &self,
        channel: &Channel,
        epoch: u64,
        lines: &[ReturnLine],
    ) -> Result<Vec<Result<ReturnOutcome>>>;
    /// Raises the channel's remembered write sequences of its pools (`(item, segment,
    /// write_seq)`, one item's or several), never lowering one: a Return's, before it
    /// applies; a ReturnMany's lines' in one transaction.
    async fn raise_write_seqs(&self, channel: &Channel, seqs: &[(&ItemId, u32, u64)]) -> Result<()>;
    /// Records the reports, each chunk in one transaction that also applies the loss rule
    /// (`loss::apply_report`: a lost pool puts what the channel holds of the item in
    /// doubt), then renews the lease.
    async fn heartbeat(
        &self,
        channel: &Channel,
        epoch: u64,
        reports: &[PoolReportIn],
        last_report: bool,
        now_ms: i64,
        lease_ttl_ms: u64,
    ) -> Result<HeartbeatOutcome>;
    /// Settles in-doubt units: `sold` written off, the rest back to the center. Returns
    /// the item afterwards and the units returned.
    async fn resolve_in_doubt(&self, item: &ItemId, channel: &Channel, sold: u64) -> Result<(ItemRecord, u64)>;
    /// A channel's pool holds `expected` units beyond what the ledger counts with it (the
    /// ledger lost commits): move them from the center's available to its grants, if its
    /// report still says so.
    async fn relearn(
        &self,
        item: &ItemId,
        channel: &Channel,
        expected: u64,
    ) -> Result<inventory_core::ledger::Relearned>;
    /// Every registered channel with its session and allocations, by channel name.
    async fn channels(&self) -> Result<Vec<ChannelView>>;
    /// Every registered channel's session, by channel name (no ledger lines).
    async fn sessions(&self) -> Result<Vec<(String, ChannelSession)>>;
    /// Closes (no more grants) or reopens an item.
    async fn set_closed(&self, item: &ItemId, closed: bool) -> Result<ItemRecord>;
    /// Moves the item's schedule by `inventory_core::schedule::reschedule` at `now_ms`,
    /// under the item's row lock. INVALID_ARGUMENT or FAILED_PRECONDITION as it says.
    async fn set_schedule(&self, item: &ItemId, opens_at_ms: i64, closes_at_ms: i64, now_ms: i64)
    -> Result<ItemRecord>;
    /// Closes every open item whose `closes_at` is at or before `now_ms`; the items this
    /// call closed (another center replica's call closes each only once).
    async fn close_due(&self, now_ms: i64) -> Result<Vec<ItemRecord>>;
    /// `(item_id, schedule, closed)` of every item with a schedule, by item.
    async fn schedules(&self) -> Result<Vec<(String, Schedule, bool)>>;
    /// The channel's current session, if it ever registered.
    async fn session(&self, channel: &Channel) -> Result<Option<ChannelSession>>;
    async fn policy(&self, item: &ItemId, channel: Option<&Channel>) -> Result<ItemPolicy>;
    /// [`LedgerStore::policy`] of several items for one channel, in one statement; `None`
    /// for an item the center does not know. In the order asked.
    async fn policies(&self, items: &[ItemId], channel: &Channel) -> Result<Vec<Option<ItemPolicy>>>;
    async fn item_ledger(&self, item: &ItemId) -> Result<ItemLedger>;
    /// Every item's ledger with its channels' own watermarks, by item, from one snapshot in
    /// a fixed number of queries (the console and `/metrics`).
    async fn ledgers(&self) -> Result<Vec<(ItemLedger, Vec<(String, Watermarks)>)>>;
    /// [`LedgerStore::ledgers`] of `limit` items at most after the first `offset`, in item
    /// order: the database reads only the page.
    async fn ledger_page(&self, offset: usize, limit: usize) -> Result<LedgerPage>;
    /// Every item's units at the center and every ledger line, from one snapshot.
    async fn sample(&self) -> Result<LedgerSample>;
    /// How many times the store's connections reached another database server than the
    /// one before (a failover behind a stable address): each may have lost commits.
    fn database_changes(&self) -> u64 {
        0
    }
    async fn list_items(&self) -> Result<Vec<ItemRecord>>;
    /// `channel = None` sets the item's default (and turns rate-following off).
    async fn set_watermarks(&self, item: &ItemId, channel: Option<&Channel>, watermarks: Watermarks) -> Result<()>;
    /// Sets the item's rate-following batches (`None`: off), and its fixed watermarks
    /// when given.
    async fn set_rate_batching(
        &self,
        item: &ItemId,
        rate_batching: Option<RateBatching>,
        watermarks: Option<Watermarks>,
    ) -> Result<()>;
    async fn watermarks(&self, item: &ItemId) -> Result<(Watermarks, Vec<(String, Watermarks)>)>;
    async fn reconcile(&self, item: Option<&ItemId>) -> Result<Reconciliation>;
    async fn reclaim(&self, channel: &Channel, now_ms: i64, grace_ms: u64) -> Result<ReclaimOutcome>;
    /// Deletes the channel's row and allocations when it holds nothing and no agent is
    /// attached (`ledger::check_removal`), remembering its last epoch so a later
    /// registration starts above it. NOT_FOUND for a channel without a row.
    async fn remove_channel(&self, channel: &Channel, now_ms: i64) -> Result<RemovedChannel>;
    /// Deletes up to `limit` request records no retry can use any more (an agent's request
    /// of an epoch its channel has left, or created before `before_ms`); returns how many.
    async fn prune_requests(&self, limit: u32, before_ms: i64) -> Result<u64>;
    /// `(batches, calls)`: the group-commit transactions of Borrows and Returns run since
    /// start, and the calls they answered.
    fn group_commits(&self) -> (u64, u64);
    /// One trivial statement through the connections the views use: does the database
    /// answer at all (the health worker bounds it with its own timeout).
    async fn ping(&self) -> Result<()>;
}
