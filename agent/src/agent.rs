//! The agent of one channel, put together: selling, stocking, reporting and replica
//! coordination over one pool store and one center link. Each part has one job; this
//! only wires them and runs the sequences that span several (registration, drain).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use inventory_core::ItemId;
use inventory_core::channel::{OpKind, OpResult, ResyncWhy, Settings};

use crate::error::{AgentError, from_center};
use crate::items::{Item, Items};
use crate::link::CenterLink;
use crate::metrics::Metrics;
use crate::outbox::EventFeed;
use crate::replicas::Replicas;
use crate::reporting::Reporting;
use crate::role::Role;
use crate::security::UserLimits;
use crate::selling::Selling;
use crate::stocking::Stocking;
use crate::store::PoolStore;

/// Registrations in a row that may find the pools fenced at or above their epoch (the
/// second one is above the fence it was shown, unless another incarnation registered in
/// between) or their first report refused as stale.
const REGISTRATIONS_ABOVE_A_FENCE: usize = 3;

/// Pools giving their units back at once while the agent drains. Their Returns go to the
/// center together (a ReturnMany per few dozen pools, `link::returns`), so more in flight
/// costs the center fewer calls, not more.
const GIVE_BACKS_IN_FLIGHT: usize = 128;

/// How one registration ended.
enum Registered {
    /// Resynced under this epoch.
    Epoch(u64),
    /// A pool was already fenced at `fence`, at or above `epoch`: nothing written.
    Fenced { epoch: u64, fence: u64 },
    /// Resynced, but the first report under `epoch` was refused as stale: the channel was
    /// fenced since, or the ledger went back below this epoch (a standby promoted without
    /// its last commits) and may hold what the resync never saw.
    ReportRefused { epoch: u64, why: String },
}

/// Tunables of the agent's behaviour.
#[derive(Debug, Clone, Copy)]
pub struct AgentSettings {
    /// How long an Acquire that found the pool empty waits for the shared Borrow.
    pub miss_wait: Duration,
    /// How long the pool must stay above the high watermark before surplus goes back.
    pub return_sustain_ms: u64,
    /// How long a replica's claim to lead the channel lasts unless renewed.
    pub leader_ttl_ms: u64,
    /// Lookups (DescribeItem) of items not loaded yet, per second, at most.
    pub item_lookups_per_sec: u32,
    /// The pool store's outbox bound per pool (for the metrics; the store applies it).
    pub outbox_max_events: u64,
    /// Items shown on `/metrics` with series of their own at most (`http.rs`).
    pub metrics_per_item_limit: usize,
}

/// Items shown on `/metrics` with series of their own unless an operator sets another limit.
pub const DEFAULT_METRICS_PER_ITEM_LIMIT: usize = 1_000;

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            miss_wait: Duration::from_secs(2),
            return_sustain_ms: 2_000,
            leader_ttl_ms: 3_000,
            item_lookups_per_sec: crate::items::DEFAULT_LOOKUPS_PER_SEC,
            outbox_max_events: crate::store::DEFAULT_OUTBOX_MAX,
            metrics_per_item_limit: DEFAULT_METRICS_PER_ITEM_LIMIT,
        }
    }
}

pub struct Agent {
    pub link: Arc<CenterLink>,
    pub store: Arc<dyn PoolStore>,
    pub items: Arc<Items>,
    pub metrics: Arc<Metrics>,
    pub role: Arc<Role>,
    pub selling: Selling,
    /// Baskets, driven over `selling`.
    pub baskets: crate::baskets::Baskets,
    pub stocking: Arc<Stocking>,
    pub reporting: Reporting,
    pub replicas: Arc<Replicas>,
    /// The pools' reservation events, streamed to clients.
    pub events: Arc<EventFeed>,
    pub settings: AgentSettings,
    /// The broker relay's progress (empty without `--nats-url`).
    pub relay: Arc<crate::relay::RelayStatus>,
    /// Items to resync at the next registration even if the center does not list them
    /// (pools a store kept from an earlier run).
    also_resync: std::sync::Mutex<Vec<String>>,
}

impl Agent {
    pub fn new(store: Arc<dyn PoolStore>, link: CenterLink, settings: AgentSettings, limits: UserLimits) -> Self {
        let link = Arc::new(link);
        let rules = Settings { return_sustain_ms: settings.return_sustain_ms, ..Settings::default() };
        let items =
            Arc::new(Items::new(link.channel.clone(), rules, settings.item_lookups_per_sec, Arc::clone(&store)));
        let metrics = Arc::new(Metrics::default());
        let role = Arc::new(Role::default());
        let stocking = Arc::new(Stocking::new(Arc::clone(&store), Arc::clone(&link), Arc::clone(&metrics)));
        let replicas = Arc::new(Replicas::new(
            Arc::clone(&store),
            Arc::clone(&link),
            Arc::clone(&role),
            settings.leader_ttl_ms,
            settings.miss_wait,
        ));
        let events = Arc::new(EventFeed::new(Arc::clone(&store), Arc::clone(&items)));
        let selling = Selling {
            events: Arc::clone(&events),
            store: Arc::clone(&store),
            link: Arc::clone(&link),
            items: Arc::clone(&items),
            stocking: Arc::clone(&stocking),
            replicas: Arc::clone(&replicas),
            role: Arc::clone(&role),
            metrics: Arc::clone(&metrics),
            limits,
            rate_limited: Default::default(),
            miss_wait: settings.miss_wait,
            global: crate::buyers::limit::GlobalLimits::new(None, Arc::clone(&metrics)),
            store_health: Default::default(),
            abort_after_move_take: None,
        };
        let reporting = Reporting::new(Arc::clone(&store), Arc::clone(&link), Arc::clone(&items));
        Self {
            link,
            store,
            items,
            metrics,
            role,
            selling,
            baskets: Default::default(),
            stocking,
            reporting,
            replicas,
            events,
            settings,
            relay: Default::default(),
            also_resync: Default::default(),
        }
    }

    /// Resync these items at the next registration too (the center's view wins for each,
    /// even where it says the channel holds nothing of it).
    pub fn resync_at_next_registration(&self, items: Vec<String>) {
        self.also_resync.lock().unwrap_or_else(|e| e.into_inner()).extend(items);
    }

    pub fn is_leading(&self) -> bool {
        self.role.is_leading()
    }

    pub fn is_draining(&self) -> bool {
        self.role.is_draining()
    }

    pub fn items(&self) -> Vec<Arc<Item>> {
        self.items.all()
    }

    /// The item, loading it from the center on first use.
    pub async fn item(&self, item: &ItemId) -> Result<Arc<Item>, AgentError> {
        self.selling.item(item).await
    }

    /// Every pool's report, as a heartbeat would carry it.
    pub async fn reports(&self) -> Vec<inventory_proto::v1::PoolReport> {
        self.reporting.all().await.to_pb()
    }

    /// The pools whose report changed since the center acknowledged one.
    pub async fn changed_reports(&self) -> Vec<inventory_proto::v1::PoolReport> {
        self.reporting.changed().await.to_pb()
    }

    /// Registers (a new epoch) and brings every pool in line with what the center says
    /// the channel holds: each pool is fenced with the new epoch, then resynced (units
    /// granted but never added are added; units the center no longer counts as ours are
    /// removed; a pool the store lost is frozen). Selling resumes only when this is done:
    /// the lease is granted at the end, published to the followers, and a report goes out
    /// at once (a reclaim must never judge this incarnation by the last one's report).
    ///
    /// A resync that finds a pool already fenced at or above the new epoch writes nothing:
    /// the center's ledger went back in time and handed the epoch out again. The agent then
    /// registers again at once, showing the fence, and gets an epoch above it.
    pub async fn register(&self) -> Result<u64, AgentError> {
        let mut fenced_at = 0;
        for _ in 0..REGISTRATIONS_ABOVE_A_FENCE {
            match self.register_once(fenced_at).await? {
                Registered::Epoch(epoch) => return Ok(epoch),
                Registered::Fenced { epoch, fence } => {
                    tracing::error!(channel = %self.link.channel, epoch, fence,
                        "the center answered an epoch this channel's pools were fenced with; registering above the fence");
                    fenced_at = fence;
                }
                Registered::ReportRefused { epoch, why } => {
                    tracing::warn!(channel = %self.link.channel, epoch, why,
                        "the first report after registering was refused; registering again");
                }
            }
        }
        Err(AgentError::Unavailable(format!(
            "the center keeps answering epochs at or below the pools' fence {fenced_at}, or refusing the first report; \
             registering again"
        )))
    }

    async fn register_once(&self, fenced_at: u64) -> Result<Registered, AgentError> {
        let sent_at = self.link.now_ms();
        let reg = self.link.register(fenced_at).await.map_err(from_center)?;
        let mut ids: Vec<String> = reg.held.iter().map(|h| h.item_id.clone()).collect();
        let also = self.also_resync.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let extra: Vec<String> = also.iter().filter(|id| !ids.contains(id)).cloned().collect();
        ids.extend(extra);
        let mut pending = Vec::with_capacity(ids.len());
        for id in &ids {
            let id = ItemId::parse("item_id", id)?;
            let item = self.selling.item(&id).await?;
            // The floors the center remembers, before the resync touches the pools (an item
            // loaded earlier by this process, or by another replica's reports).
            if let Some(h) = reg.held.iter().find(|h| h.item_id == item.item_id) {
                crate::store::raise_floors(self.selling.store.as_ref(), &item.pools, &h.write_seq_floors).await?;
            }
            let kind = OpKind::Resync(ResyncWhy::Registration { epoch: reg.epoch });
            pending.push((Arc::clone(&item), self.stocking.submit(&item, kind)));
        }
        let (mut fence, mut failed) = (0, None);
        for (item, done) in pending {
            match done.await {
                Ok(OpResult::Resynced) => {}
                Ok(OpResult::EpochReused { fence: found }) => fence = fence.max(found),
                _ => failed = failed.or(Some(item.item_id.clone())),
            }
        }
        if fence > 0 {
            return Ok(Registered::Fenced { epoch: reg.epoch, fence });
        }
        if let Some(item_id) = failed {
            return Err(AgentError::Unavailable(format!(
                "resync of item {item_id} after registering failed; registering again"
            )));
        }
        self.also_resync.lock().unwrap_or_else(|e| e.into_inner()).retain(|id| !also.contains(id));
        self.load_scheduled(&reg.scheduled).await;
        self.link.renew_lease(sent_at);
        self.replicas.publish_lease().await;
        // A report that failed otherwise is the heartbeat worker's to send again.
        if let Err(s) = self.reporting.send_all(false).await
            && s.code() == tonic::Code::FailedPrecondition
        {
            return Ok(Registered::ReportRefused { epoch: reg.epoch, why: s.message().to_owned() });
        }
        tracing::info!(channel = %self.link.channel, epoch = reg.epoch, items = reg.held.len(), "registered and resynced");
        Ok(Registered::Epoch(reg.epoch))
    }

    /// Loads the scheduled items the center listed (their schedules with them), so their
    /// buyers are answered from memory before the opening; the loads go together (one
    /// DescribeItems per few hundred). An item that fails to load loads on first use.
    async fn load_scheduled(&self, scheduled: &[inventory_proto::v1::ItemSchedule]) {
        let loads =
            scheduled.iter().filter(|s| !s.closed && self.items.get(&s.item_id).is_none()).map(|s| async move {
                let id = ItemId::parse("item_id", &s.item_id)?;
                self.selling.item(&id).await.map(|_| ())
            });
        for (s, r) in scheduled.iter().zip(futures::future::join_all(loads).await) {
            if let Err(e) = r {
                tracing::warn!(item = %s.item_id, error = %e, "scheduled item not loaded; it loads on first use");
            }
        }
    }

    /// On shutdown: give every pool's available units back to the center, wait for every
    /// operation to finish, and send the last report (the agent's last word).
    pub async fn drain(&self) {
        // The changed pools first, before any take: the center's floors then cover every
        // sale made, so a pool store that goes back before them is caught by the next
        // process even if this one dies mid-drain (the Returns carry their own floors).
        if let Err(s) = self.reporting.send(self.reporting.changed().await, false).await {
            tracing::warn!(code = ?s.code(), "report before the drain failed");
        }
        // Many pools at a time: one Return after another would keep a catalogue of
        // thousands of items draining for minutes, past any orchestrator's grace period;
        // the Returns in flight together go as ReturnMany calls.
        futures::stream::iter(self.items())
            .for_each_concurrent(GIVE_BACKS_IN_FLIGHT, |item| async move {
                let given = self.stocking.give_back(&item, u64::MAX).await;
                if given > 0 {
                    tracing::info!(item = %item.item_id, given, "returned unreserved units at shutdown");
                }
            })
            .await;
        self.stocking.wait_idle().await;
        if let Err(s) = self.reporting.send_all(true).await {
            tracing::warn!(code = ?s.code(), "final report failed");
        }
    }
}
