//! The ledger over sqlx, for PostgreSQL and SQLite.
//!
//! One body of SQL serves both engines; [`Dialect`] holds the differences:
//! - PostgreSQL: each mutation locks the item row with `SELECT ... FOR NO KEY UPDATE` (and
//!   the channel row `FOR KEY SHARE`), so concurrent center replicas serialise per item,
//!   while the foreign key checks of allocation inserts (key share) never wait on it;
//! - SQLite: a single connection is the single writer; row locks do not exist and are not
//!   needed.
//!
//! In both, the write is a conditional `UPDATE ... WHERE available = <value read>` so a
//! missing lock would show up as an error rather than as a lost update.
//!
//! SQL text never contains request data: every value is a bind parameter.
//!
//! One module per concern: `dialect` (connection and engine differences), `rows` (row
//! mapping and single-row access), `movement` (the transactions that move units),
//! `requests` (first answers by request id), `reports` (registration and heartbeats),
//! `views` (read views), `pages` (views of the whole catalogue or of a page of it) and
//! `reclaim` (reclaim, units in doubt, removing a channel). The [`LedgerStore`] impl below
//! only routes.

mod batch;
mod dialect;
mod group;
mod movement;
mod pages;
mod reclaim;
mod reports;
mod requests;
mod rows;
mod server;
mod views;

use std::sync::Arc;

use async_trait::async_trait;
use inventory_core::ledger::ChannelSession;
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_core::{AgentId, Channel, ItemId, Quantity, RequestId};
use sqlx::{Any, AnyPool, Executor, Transaction};

pub use dialect::{Dialect, connect};

use super::batch::{Answer, Op, OpKind};
use super::{
    BorrowLine, BorrowOutcome, BorrowRate, ChannelView, HeartbeatOutcome, ItemLedger, ItemPolicy, ItemRecord,
    LedgerPage, LedgerSample, LedgerStore, NewItem, PoolReportIn, ReclaimOutcome, Reconciliation, Registration,
    RemovedChannel, Result, ReturnLine, ReturnOutcome,
};
use crate::error::CenterError;
use dialect::Queries;

#[derive(Clone)]
pub struct SqlLedger {
    pool: AnyPool,
    /// Where read views run: the same pool on PostgreSQL; on SQLite, reader connections
    /// beside the one writer (WAL mode).
    read_pool: AnyPool,
    dialect: Dialect,
    /// The PostgreSQL server the connections reach (never changes on SQLite).
    server: Arc<server::ServerIdentity>,
    q: Arc<Queries>,
    groups: Arc<group::Groups>,
}

type Tx = Transaction<'static, Any>;

impl SqlLedger {
    /// The lines of a BorrowMany or ReturnMany as one batch. One channel, one epoch: a
    /// stale epoch is the whole call's error.
    async fn run_many<'a>(
        &self,
        channel: &Channel,
        epoch: u64,
        lines: impl Iterator<Item = (&'a ItemId, Quantity, &'a RequestId, OpKind)> + Send,
    ) -> Result<Vec<Result<Answer>>> {
        let ops: Vec<Op> = lines
            .map(|(item, quantity, request_id, kind)| Op {
                item: item.clone(),
                channel: channel.clone(),
                epoch,
                quantity,
                request_id: request_id.clone(),
                kind,
            })
            .collect();
        let (mut answers, stale) = self.run_batch(&ops).await?;
        if let Some(line) = stale {
            return Err(answers
                .swap_remove(line)
                .err()
                .unwrap_or_else(|| CenterError::Precondition(format!("stale epoch {epoch} for channel {channel}"))));
        }
        Ok(answers)
    }
}

impl SqlLedger {
    /// The connection pool (for NOTIFY of events on PostgreSQL).
    pub fn pool(&self) -> AnyPool {
        self.pool.clone()
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    async fn begin(&self) -> Result<Tx> {
        Ok(self.pool.begin().await?)
    }

    /// A read-only transaction that sees one snapshot for all its statements, so a
    /// view never mixes an item row from before a Borrow with allocations from after.
    async fn begin_read(&self) -> Result<Tx> {
        let mut tx = self.read_pool.begin().await?;
        if self.dialect == Dialect::Postgres {
            tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").await?;
        }
        Ok(tx)
    }
}

// Inherent methods of the same names (in the submodules) take precedence over the
// trait's, so each line calls the implementation, not itself.
#[async_trait]
impl LedgerStore for SqlLedger {
    async fn create_item(&self, item: &NewItem, now_ms: i64) -> Result<(ItemRecord, bool)> {
        SqlLedger::create_item(self, item, now_ms).await
    }

    async fn add_stock(&self, item: &ItemId, quantity: Quantity, request_id: &RequestId) -> Result<(ItemRecord, bool)> {
        SqlLedger::add_stock(self, item, quantity, request_id).await
    }

    async fn register(
        &self,
        channel: &Channel,
        agent: &AgentId,
        now_ms: i64,
        lease_ttl_ms: u64,
        fenced_at: u64,
    ) -> Result<Registration> {
        SqlLedger::register(self, channel, agent, now_ms, lease_ttl_ms, fenced_at).await
    }

    async fn borrow(
        &self,
        item: &ItemId,
        channel: &Channel,
        epoch: u64,
        quantity: Quantity,
        request_id: &RequestId,
        rate: BorrowRate,
    ) -> Result<BorrowOutcome> {
        let op = Op {
            item: item.clone(),
            channel: channel.clone(),
            epoch,
            quantity,
            request_id: request_id.clone(),
            kind: OpKind::Borrow(rate),
        };
        self.submit(op).await?.into_borrow()
    }

    async fn borrow_many(
        &self,
        channel: &Channel,
        epoch: u64,
        lines: &[BorrowLine],
    ) -> Result<Vec<Result<BorrowOutcome>>> {
        let lines = lines.iter().map(|l| (&l.item, l.quantity, &l.request_id, OpKind::Borrow(l.rate)));
        let answers = self.run_many(channel, epoch, lines).await?;
        Ok(answers.into_iter().map(|a| a?.into_borrow()).collect())
    }

    async fn give_back(
        &self,
        item: &ItemId,
        channel: &Channel,
        epoch: u64,
        quantity: Quantity,
        request_id: &RequestId,
    ) -> Result<ReturnOutcome> {
        let op = Op {
            item: item.clone(),
            channel: channel.clone(),
            epoch,
            quantity,
            request_id: request_id.clone(),
            kind: OpKind::Return,
        };
        self.submit(op).await?.into_return()
    }

    async fn give_back_many(
        &self,
        channel: &Channel,
        epoch: u64,
        lines: &[ReturnLine],
    ) -> Result<Vec<Result<ReturnOutcome>>> {
        let lines = lines.iter().map(|l| (&l.item, l.quantity, &l.request_id, OpKind::Return));
        let answers = self.run_many(channel, epoch, lines).await?;
        Ok(answers.into_iter().map(|a| a?.into_return()).collect())
    }

    async fn raise_write_seqs(&self, channel: &Channel, seqs: &[(&ItemId, u32, u64)]) -> Result<()> {
        SqlLedger::raise_write_seqs(self, channel, seqs).await
    }

    async fn heartbeat(
        &self,
        channel: &Channel,
        epoch: u64,
        reports: &[PoolReportIn],
        last_report: bool,
        now_ms: i64,
        lease_ttl_ms: u64,
    ) -> Result<HeartbeatOutcome> {
        SqlLedger::heartbeat(self, channel, epoch, reports, last_report, now_ms, lease_ttl_ms).await
    }

    async fn resolve_in_doubt(&self, item: &ItemId, channel: &Channel, sold: u64) -> Result<(ItemRecord, u64)> {
        SqlLedger::resolve_in_doubt(self, item, channel, sold).await
    }

    async fn relearn(
        &self,
        item: &ItemId,
        channel: &Channel,
        expected: u64,
    ) -> Result<inventory_core::ledger::Relearned> {
        SqlLedger::relearn(self, item, channel, expected).await
    }

    async fn channels(&self) -> Result<Vec<ChannelView>> {
        SqlLedger::channels(self).await
    }

    async fn sessions(&self) -> Result<Vec<(String, ChannelSession)>> {
        SqlLedger::sessions(self).await
    }

    async fn set_closed(&self, item: &ItemId, closed: bool) -> Result<ItemRecord> {
        SqlLedger::set_closed(self, item, closed).await
    }

    async fn set_schedule(
        &self,
        item: &ItemId,
        opens_at_ms: i64,
        closes_at_ms: i64,
        now_ms: i64,
    ) -> Result<ItemRecord> {
        SqlLedger::set_schedule(self, item, opens_at_ms, closes_at_ms, now_ms).await
    }

    async fn close_due(&self, now_ms: i64) -> Result<Vec<ItemRecord>> {
        SqlLedger::close_due(self, now_ms).await
    }

    async fn schedules(&self) -> Result<Vec<(String, inventory_core::schedule::Schedule, bool)>> {
        SqlLedger::schedules(self).await
    }

    async fn session(&self, channel: &Channel) -> Result<Option<ChannelSession>> {
        SqlLedger::session(self, channel).await
    }

    async fn policy(&self, item: &ItemId, channel: Option<&Channel>) -> Result<ItemPolicy> {
        SqlLedger::policy(self, item, channel).await
    }

    async fn policies(&self, items: &[ItemId], channel: &Channel) -> Result<Vec<Option<ItemPolicy>>> {
        SqlLedger::policies(self, items, channel).await
    }

    async fn item_ledger(&self, item: &ItemId) -> Result<ItemLedger> {
        SqlLedger::item_ledger(self, item).await
    }

    async fn ledgers(&self) -> Result<Vec<(ItemLedger, Vec<(String, Watermarks)>)>> {
        SqlLedger::ledgers(self).await
    }

    async fn ledger_page(&self, offset: usize, limit: usize) -> Result<LedgerPage> {
        SqlLedger::ledger_page(self, offset, limit).await
    }

    async fn sample(&self) -> Result<LedgerSample> {
        SqlLedger::sample(self).await
    }

    fn database_changes(&self) -> u64 {
        self.server.changes()
    }

    async fn list_items(&self) -> Result<Vec<ItemRecord>> {
        SqlLedger::list_items(self).await
    }

    async fn set_watermarks(&self, item: &ItemId, channel: Option<&Channel>, watermarks: Watermarks) -> Result<()> {
        SqlLedger::set_watermarks(self, item, channel, watermarks).await
    }

    async fn set_rate_batching(
        &self,
        item: &ItemId,
        rate_batching: Option<RateBatching>,
        watermarks: Option<Watermarks>,
    ) -> Result<()> {
        SqlLedger::set_rate_batching(self, item, rate_batching, watermarks).await
    }

    async fn watermarks(&self, item: &ItemId) -> Result<(Watermarks, Vec<(String, Watermarks)>)> {
        SqlLedger::watermarks(self, item).await
    }

    async fn reconcile(&self, item: Option<&ItemId>) -> Result<Reconciliation> {
        SqlLedger::reconcile(self, item).await
    }

    async fn reclaim(&self, channel: &Channel, now_ms: i64, grace_ms: u64) -> Result<ReclaimOutcome> {
        SqlLedger::reclaim(self, channel, now_ms, grace_ms).await
    }

    async fn remove_channel(&self, channel: &Channel, now_ms: i64) -> Result<RemovedChannel> {
        SqlLedger::remove_channel(self, channel, now_ms).await
    }

    async fn prune_requests(&self, limit: u32, before_ms: i64) -> Result<u64> {
        SqlLedger::prune_requests(self, limit, before_ms).await
    }

    fn group_commits(&self) -> (u64, u64) {
        SqlLedger::group_commits(self)
    }

    async fn ping(&self) -> Result<()> {
        // The read pool: on SQLite it does not queue behind the one writer, so a long
        // write is not taken for a database that does not answer.
        self.read_pool.execute("SELECT 1").await?;
        Ok(())
    }
}
