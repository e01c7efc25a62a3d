//! Stocking: the driver of each item's Borrows, Returns and resyncs. The rules decide
//! ([`inventory_core::channel`]); this carries out each effect against the pool store and
//! the center and feeds the result back. An item's operations run one at a time, in the
//! order they were queued, in a task of their own: a caller that stops waiting never
//! cancels an operation half-way.

use std::sync::Arc;
use std::time::Duration;

use inventory_core::channel::{
    CallFault, Ctx, Effect, Holding, Note, OpKind, OpResult, PoolView, ReadToken, Reply, Step, StoreFault, Work,
};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tonic::{Code, Status};
use tracing::Instrument;

use crate::items::{Item, view};
use crate::link::CenterLink;
use crate::metrics::Metrics;
use crate::segmented;
use crate::store::{PoolStore, StoreError};

pub struct Stocking {
    store: Arc<dyn PoolStore>,
    link: Arc<CenterLink>,
    metrics: Arc<Metrics>,
    /// Every operation's task: shutdown waits for them.
    tasks: TaskTracker,
}

impl Stocking {
    pub fn new(store: Arc<dyn PoolStore>, link: Arc<CenterLink>, metrics: Arc<Metrics>) -> Self {
        Self { store, link, metrics, tasks: TaskTracker::new() }
    }

    /// The inputs of a transition now: the clock and the channel's epoch.
    pub fn ctx(&self) -> Ctx {
        Ctx { now_ms: crate::clock::now_ms(), epoch: self.link.epoch() }
    }

    /// Queues an operation of the item; the receiver gets its result (dropping it is fine:
    /// the operation runs on).
    pub fn submit(self: &Arc<Self>, item: &Arc<Item>, kind: OpKind) -> oneshot::Receiver<OpResult> {
        // Version 7: the id tells when it was made, so a center refuses a replay older than
        // it keeps request records (`inventory_core::records`) instead of applying it again.
        let fresh = uuid::Uuid::now_v7().simple().to_string();
        let (tx, rx) = oneshot::channel();
        let step = {
            let mut st = item.lock();
            let (id, step) = st.core.submit(kind, fresh, self.ctx());
            st.waiters.insert(id, tx);
            st.finished(&step.finished);
            step
        };
        self.carry_on(item, step);
        rx
    }

    /// Queues an operation and waits for its result (None: the operation was dropped).
    pub async fn run(self: &Arc<Self>, item: &Arc<Item>, kind: OpKind) -> Option<OpResult> {
        self.submit(item, kind).await.ok()
    }

    /// Records a transition's notes, then starts a task for its next effect, if any.
    fn carry_on(self: &Arc<Self>, item: &Arc<Item>, step: Step) {
        self.notes(item, &step.notes);
        if let Some(work) = step.next {
            let (this, item) = (Arc::clone(self), Arc::clone(item));
            self.tasks.spawn(async move { this.drive(item, work).await });
        }
    }

    /// Carries out the item's effects until its queue is empty.
    async fn drive(self: Arc<Self>, item: Arc<Item>, mut work: Work) {
        loop {
            let reply = self.perform(&item, &work.effect).await;
            let step = {
                let mut st = item.lock();
                let step = st.core.feed(work.op, reply, self.ctx());
                st.finished(&step.finished);
                step
            };
            self.notes(&item, &step.notes);
            match step.next {
                Some(next) => work = next,
                None => return,
            }
        }
    }

    async fn perform(&self, item: &Item, effect: &Effect) -> Reply {
        if item.is_segmented()
            && let Some(reply) = self.perform_segmented(item, effect).await
        {
            return reply;
        }
        let pool = &item.pool;
        match effect {
            Effect::ReadPool => store_reply(self.store.snapshot(pool).await.map(|s| Reply::Pool(view(&s)))),
            // A refill is answered with the pool as it left it: the rules take it for the
            // whole read that would follow (`core::channel::quiet`).
            Effect::OpenPool { grant_id, epoch } => {
                store_reply(self.store.refill_read(pool, grant_id, 0, false, *epoch).await.map(wrote))
            }
            Effect::Refill { grant_id, units, epoch, must_exist, after_ms } => {
                if *after_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(*after_ms)).await;
                }
                store_reply(self.store.refill_read(pool, grant_id, *units, *must_exist, *epoch).await.map(wrote))
            }
            Effect::Take { take_id, max, epoch } => {
                store_reply(self.store.take_for_return(pool, take_id, *max, *epoch).await.map(Reply::Units))
            }
            Effect::Untake { take_id, epoch } => {
                store_reply(self.store.untake(pool, take_id, *epoch).await.map(Reply::Units))
            }
            Effect::RaiseFence { epoch } => {
                store_reply(self.store.raise_fence(pool, *epoch).await.map(|found| Reply::Fence { found }))
            }
            Effect::Borrow { request_id, quantity, epoch, sell_rate_milli } => {
                let span = tracing::info_span!("borrow", item = %item.item_id, want = quantity, trace_id = %request_id);
                let call =
                    self.link.borrow(&item.item_id, *quantity, request_id, *epoch, *sell_rate_milli).instrument(span);
                match self.metrics.time_borrow(call).await {
                    Ok(a) => {
                        self.metrics.borrowed(a.granted);
                        Reply::Granted { granted: a.granted, center_available: a.center_available }
                    }
                    Err(s) => center_fault(&item.item_id, "borrow", &s),
                }
            }
            Effect::Return { request_id, quantity, epoch } => {
                let span = tracing::info_span!("return", item = %item.item_id, quantity, trace_id = %request_id);
                // The take and every sale before it are acknowledged: the center keeps how far
                // the pool got, so a store that goes back before them is caught by whichever
                // process of the channel comes next, even if no report follows.
                let floors: Vec<u64> = item.pools.iter().map(|p| self.store.floor(p)).collect();
                let call = self.link.give_back(&item.item_id, *quantity, request_id, *epoch, &floors);
                match call.instrument(span).await {
                    Ok(_) => {
                        self.metrics.returned(*quantity);
                        Reply::Done
                    }
                    Err(s) => center_fault(&item.item_id, "return", &s),
                }
            }
            Effect::Describe => match self.link.describe(&item.item_id).await {
                Ok(d) => {
                    // A resync reads the pool next: with the floors the center remembers.
                    if let Err(e) =
                        crate::store::raise_floors(self.store.as_ref(), &item.pools, &d.write_seq_floors).await
                    {
                        return store_reply(Err(e));
                    }
                    Reply::Holding(Holding { held: d.held, generation: d.generation, in_doubt: d.in_doubt })
                }
                Err(s) => center_fault(&item.item_id, "describe", &s),
            },
        }
    }

    /// A pool effect on a segmented item: carried out on every segment
    /// ([`crate::segmented`]). `None`: not a pool effect.
    ///
    /// Lost segments are left out of every write but the ones that may create a pool
    /// (opening it, a resync's refill): those create them again, empty.
    async fn perform_segmented(&self, item: &Item, effect: &Effect) -> Option<Reply> {
        let store = self.store.as_ref();
        Some(match effect {
            Effect::ReadPool => {
                let epoch = self.link.epoch();
                store_reply(segmented::snapshot(store, item, epoch).await.map(|s| Reply::Pool(view(&s))))
            }
            Effect::OpenPool { grant_id, epoch } => self.refill_segments(item, grant_id, 0, *epoch, false).await,
            Effect::Refill { grant_id, units, epoch, must_exist, after_ms } => {
                if *after_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(*after_ms)).await;
                }
                self.refill_segments(item, grant_id, *units, *epoch, *must_exist).await
            }
            Effect::Take { take_id, max, epoch } => {
                let r = segmented::take(store, &item.intact_pools(), take_id, *max, *epoch).await;
                store_reply(r.map(Reply::Units))
            }
            Effect::Untake { take_id, epoch } => {
                store_reply(segmented::untake(store, &item.intact_pools(), take_id, *epoch).await.map(Reply::Units))
            }
            Effect::RaiseFence { epoch } => {
                let r = segmented::raise_fence(store, &item.intact_pools(), *epoch).await;
                store_reply(r.map(|found| Reply::Fence { found }))
            }
            Effect::Borrow { .. } | Effect::Return { .. } | Effect::Describe => return None,
        })
    }

    /// A refill of a segmented item. One that may create the pool (`must_exist` false:
    /// opening it, a resync's refill) goes to every segment and creates the lost ones
    /// again, empty; a grant's goes to the intact ones only.
    async fn refill_segments(&self, item: &Item, grant_id: &str, units: u64, epoch: u64, must_exist: bool) -> Reply {
        let store = self.store.as_ref();
        if must_exist {
            let r = segmented::refill(store, &item.intact_pools(), grant_id, units, epoch, true).await;
            return store_reply(r.map(|()| Reply::Done));
        }
        let r = segmented::refill(store, &item.pools, grant_id, units, epoch, false).await;
        if r.is_ok() {
            item.segments_reopened();
        }
        store_reply(r.map(|()| Reply::Done))
    }

    fn notes(&self, item: &Item, notes: &[Note]) {
        let id = &item.item_id;
        for note in notes {
            match note {
                // Logged by the read that found it (`segmented::snapshot`), with the segments.
                Note::SegmentsLost => {}
                Note::PoolLost { known, now } => {
                    tracing::error!(item = %id, known, now, "pool lost its data in the store; frozen, its units in doubt");
                }
                // At the end of a sale every miss meets a dry center: only a partial grant
                // is news; empty ones are in the metrics.
                Note::BorrowShort { want, granted: 0 } => tracing::debug!(item = %id, want, "borrow: none granted"),
                Note::BorrowShort { want, granted } => tracing::info!(item = %id, want, granted, "borrow short"),
                // Counted; the link logs when the center is lost and regained.
                Note::CenterFailed { call, unknown } => {
                    self.metrics.center_error();
                    tracing::debug!(item = %id, call, outcome_unknown = unknown, "call to the center failed");
                }
                Note::StoreFailed { what } => {
                    self.metrics.pool_store_error();
                    tracing::debug!(item = %id, what, "pool store operation failed");
                }
                Note::GrantFenced { granted } => {
                    tracing::warn!(item = %id, granted, "pool fenced by a newer incarnation of the channel; its resync counts this grant")
                }
                Note::EpochReused { epoch, fence } => {
                    tracing::error!(item = %id, epoch, fence,
                        "the center handed out an epoch the pool was already fenced with (its ledger went back in time); registering above the fence");
                }
                Note::GrantNotRefilled { granted } => {
                    tracing::error!(item = %id, granted, "borrowed units could not be added to the pool");
                }
                Note::GrantGivenBack { granted } => {
                    tracing::warn!(item = %id, granted, "the pool store refused the borrowed units; they went back to the center");
                }
                Note::Settled { borrow } => {
                    let call = if *borrow { "borrow" } else { "return" };
                    tracing::info!(item = %id, call, "a call of unknown outcome was answered for by its replay");
                }
                Note::ReturnRefused => tracing::warn!(item = %id, "return refused by the center; units put back"),
                Note::Aligned { added, removed } => {
                    tracing::warn!(item = %id, added, removed, "resync: pool brought in line with the center");
                }
                Note::BeyondGrant { units } => {
                    tracing::error!(item = %id, units, "resync: reserved/sold units beyond what the center granted");
                }
                Note::InDoubt => tracing::error!(item = %id, "center holds units of the item in doubt; not selling it"),
                Note::Unfrozen => tracing::warn!(item = %id, "selling the item again"),
            }
        }
    }

    /// Waits until every operation's task has finished (at shutdown, once nothing queues
    /// new ones).
    pub async fn wait_idle(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }
}

fn store_reply(r: Result<Reply, StoreError>) -> Reply {
    match r {
        Ok(reply) => reply,
        Err(StoreError::Fenced(_)) => Reply::Store(StoreFault::Fenced),
        Err(StoreError::PoolMissing(_)) => Reply::Store(StoreFault::PoolMissing),
        // Refused before it wrote anything (at its memory limit): a refill so refused never lands.
        Err(StoreError::Refused(_)) => Reply::Store(StoreFault::Refused),
        Err(e) => {
            tracing::debug!(error = %e, "pool store call failed");
            Reply::Store(StoreFault::Failed)
        }
    }
}

/// A failed center call as the rules see it: refused and not-found calls were not applied;
/// anything else may have been.
fn center_fault(item: &str, call: &str, s: &Status) -> Reply {
    tracing::debug!(item, call, code = ?s.code(), message = s.message(), "center call failed");
    Reply::Center(match s.code() {
        Code::FailedPrecondition => CallFault::Refused,
        Code::NotFound => CallFault::NotFound,
        // Including RESOURCE_EXHAUSTED after the link's retries (the center's rate limit):
        // kept as unsettled, the call is replayed by a later resync, so no unit is
        // stranded whichever attempt the center applied.
        _ => CallFault::Unknown,
    })
}

/// A refill's answer: the pool as the write left it.
fn wrote((_, snapshot): (bool, crate::store::PoolSnapshot)) -> Reply {
    Reply::Wrote { view: view(&snapshot), write_seq: snapshot.write_seq }
}

/// What a look decides from: a whole read of the item's one pool with its write sequence
/// (remembered for quiet looks), or a read that may not be remembered (a segmented item's,
/// or the one a quiet look decides from).
enum Read {
    Whole(PoolView, u64),
    Partial(PoolView),
}

/// Reservations one look's sweep expires at most, per pool.
const SWEEP_MAX: u64 = 1_000;

impl Stocking {
    /// The rebalancer's whole look at one item: queue a due resync, sweep expired
    /// reservations, read the pool and let the rules decide whether to borrow or give back.
    pub async fn look(self: &Arc<Self>, item: &Arc<Item>) -> Result<Option<OpKind>, StoreError> {
        self.queue_due_resyncs(item);
        // Taken before the sweep: a read whose pool changed meanwhile decides nothing, and
        // the earlier the token, the more such changes it sees.
        let token = item.with(|c| c.begin_read());
        if item.is_segmented() {
            let freed = segmented::expire_due(self.store.as_ref(), &item.intact_pools(), SWEEP_MAX).await?;
            let snap = segmented::snapshot(self.store.as_ref(), item, self.link.epoch()).await?;
            return Ok(self.decide(item, Read::Partial(view(&snap)), token, freed));
        }
        // The sweep and the read in one store call (one script on Redis), with the outbox's
        // size for the metrics, so no other call need read it.
        let looked = self.store.look(&item.pool, SWEEP_MAX).await?;
        if let Some(outbox) = looked.outbox {
            item.set_outbox_stats(outbox);
        }
        let read = Read::Whole(view(&looked.snapshot), looked.snapshot.write_seq);
        Ok(self.decide(item, read, token, looked.freed))
    }

    /// A quiet look (`core::channel::quiet`): the item's pool, whose stamp read after
    /// `token` was taken is the one its last whole look saw, decided from that look's
    /// `read`; nothing swept.
    pub fn look_unchanged(self: &Arc<Self>, item: &Arc<Item>, read: PoolView, token: ReadToken) -> Option<OpKind> {
        self.queue_due_resyncs(item);
        self.decide(item, Read::Partial(read), token, 0)
    }

    fn queue_due_resyncs(self: &Arc<Self>, item: &Arc<Item>) {
        for kind in item.with(|c| c.due_resyncs(crate::clock::now_ms())) {
            self.submit(item, kind);
        }
    }

    /// The rules' decision on a look's read, and what follows from it.
    fn decide(self: &Arc<Self>, item: &Arc<Item>, read: Read, token: ReadToken, freed: u64) -> Option<OpKind> {
        let mut notes = Vec::new();
        // Before a scheduled opening a look decides nothing: the opening's stocking fills
        // the pool, once, from the start of the lead (`prestock`).
        let center_now = self.link.center_now();
        let ctx = self.ctx();
        let (kind, prestock) = item.with(|c| {
            let kind = match read {
                Read::Whole(v, write_seq) => c.on_whole_look(v, write_seq, token, freed, ctx, center_now, &mut notes),
                Read::Partial(v) => c.on_look_at(v, token, freed, ctx, center_now, &mut notes),
            };
            (kind, c.prestock_due(center_now))
        });
        self.notes(item, &notes);
        if prestock {
            let (me, it) = (Arc::clone(self), Arc::clone(item));
            self.tasks.spawn(async move { me.prestock(&it).await });
        }
        // While the center gets no answer, only heartbeats probe it (back-off): a Borrow
        // or Return per look would add calls that cannot land.
        if let Some(kind) = kind.filter(|_| self.link.reachable()) {
            self.submit(item, kind);
        }
        kind
    }

    /// Stocks the pool for the opening: asks the center for this channel's opening
    /// allocation and borrows what the channel does not hold yet, in one Borrow. Due
    /// again at the next look when the center could not be asked.
    async fn prestock(self: &Arc<Self>, item: &Arc<Item>) {
        // Sent with the other loads and opening stocks waiting (one DescribeItems call).
        let want = match self.link.describe_to_load(&item.item_id).await {
            Ok(d) => d.opening_allocation.saturating_sub(d.held),
            Err(s) => {
                tracing::warn!(item = %item.item_id, code = ?s.code(), "opening stock: the center did not answer; trying again");
                item.with(|c| c.prestock_failed());
                return;
            }
        };
        if want == 0 {
            return;
        }
        match self.run(item, OpKind::Borrow { want }).await {
            Some(OpResult::Borrowed { granted }) => {
                tracing::info!(item = %item.item_id, want, granted, "stocked for the opening");
            }
            other => {
                tracing::warn!(item = %item.item_id, want, result = ?other, "opening stock not borrowed; trying again");
                item.with(|c| c.prestock_failed());
            }
        }
    }

    /// Gives up to `max` idle units of the item back to the center; the units returned.
    pub async fn give_back(self: &Arc<Self>, item: &Arc<Item>, max: u64) -> u64 {
        match self.run(item, OpKind::Return { max }).await {
            Some(OpResult::Returned { units }) => units,
            _ => 0,
        }
    }
}
