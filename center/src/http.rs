//! The HTTP side port: `/healthz` (503 while the database does not answer, see
//! [`crate::health`]), Prometheus text on `/metrics`, and the routes of the live console
//! page on `/` and its JSON feeds on `/api/items` and `/api/history` ([`crate::console`]).
//! The console and its feeds need the operator token where the center has one
//! ([`crate::http_auth`]); the probes may move to a listener of their own
//! (`--metrics-listen`), see [`HttpRoutes`].
//!
//! Every view is read from the ledger at request time (`ledgers`, or `ledger_page` for the
//! console's feed, and `sessions`: a fixed number of queries whatever the number of items);
//! nothing here writes. The console is one
//! self-contained HTML file with inline script and SVG charts (no build step, nothing
//! fetched from elsewhere): it loads the last minutes from `/api/history` (sampled by
//! [`crate::history`], which also tells drift in flight from stuck drift), then polls
//! `/api/items`.
//!
//! `/metrics` is Prometheus text from two registries: one built with the router (build
//! information, and the per-RPC metrics the gRPC server's layer records), and one per
//! scrape holding [`LedgerMetrics`], the ledger read for that scrape.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use inventory_core::ledger::{Allocation, ChannelSession};
use inventory_core::watermarks::Watermarks;
use inventory_net::metrics::RpcMetrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::error::CenterError;
use crate::health::{Health, Serving};
use crate::history::{History, HistoryConfig};
use crate::store::{ChannelRecord, ItemLedger, LedgerStore};

#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) store: Arc<dyn LedgerStore>,
    /// Failed ledger reads: this port's, and those of whoever shares the counter.
    pub(crate) database_errors: Arc<AtomicU64>,
    pub(crate) history: Arc<History>,
    /// Build information and the per-RPC metrics: the part of `/metrics` kept between scrapes.
    registry: Arc<Registry>,
    /// Whether the database answers, for `/healthz`.
    health: Health,
    /// Items with `/metrics` series of their own at most ([`crate::fold`]).
    per_item_limit: usize,
}

/// Per-RPC metrics for the center's gRPC server: its methods are those of the API, health
/// and reflection.
pub fn rpc_metrics() -> RpcMetrics {
    RpcMetrics::new(&[
        inventory_proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
    ])
}

pub fn router(store: Arc<dyn LedgerStore>) -> Router {
    router_with_error_counter(store, Arc::new(AtomicU64::new(0)))
}

/// Like [`router`], counting ledger read failures in `database_errors`: pass the same
/// counter to whatever else talks to the database and `/metrics` reports them all as
/// `inventory_center_database_errors_total`.
pub fn router_with_error_counter(store: Arc<dyn LedgerStore>, database_errors: Arc<AtomicU64>) -> Router {
    router_with(store, database_errors, HistoryConfig::default())
}

/// Like [`router_with_error_counter`], with the console's sampling set by `history`. The
/// sampler runs (in the current runtime) as long as the router does.
pub fn router_with(store: Arc<dyn LedgerStore>, database_errors: Arc<AtomicU64>, history: HistoryConfig) -> Router {
    router_with_metrics(store, database_errors, history, rpc_metrics(), Health::always())
}

/// Like [`router_with`], showing `rpc` (the metrics of the gRPC server's layer) on `/metrics`
/// and `health` (the database pings' verdict) on `/healthz`.
pub fn router_with_metrics(
    store: Arc<dyn LedgerStore>,
    database_errors: Arc<AtomicU64>,
    history: HistoryConfig,
    rpc: RpcMetrics,
    health: Health,
) -> Router {
    let history = Arc::new(History::new(history));
    History::spawn_sampler(&history, Arc::clone(&store));
    router_with_history(store, database_errors, history, rpc, health)
}

/// Like [`router_with_metrics`], with a sampler the caller started (the gRPC services read
/// the same history). Both halves of [`HttpRoutes`] in one router, without a token check.
pub fn router_with_history(
    store: Arc<dyn LedgerStore>,
    database_errors: Arc<AtomicU64>,
    history: Arc<History>,
    rpc: RpcMetrics,
    health: Health,
) -> Router {
    let routes = routes_with_history(store, database_errors, history, rpc, health, crate::fold::DEFAULT_PER_ITEM_LIMIT);
    routes.console.merge(routes.probes)
}

/// The HTTP side in its two halves, which the center may serve on two listeners.
pub struct HttpRoutes {
    /// The console page and its feeds (`/`, `/api/*`): the ledger as operators see it, so
    /// behind the operator token where there is one ([`crate::http_auth`]).
    pub console: Router,
    /// `/metrics` and `/healthz`: open, as Prometheus and probes expect.
    pub probes: Router,
}

/// The routes of [`router_with_history`], apart, with at most `per_item_limit` items shown
/// with series of their own on `/metrics` ([`crate::fold`]).
pub fn routes_with_history(
    store: Arc<dyn LedgerStore>,
    database_errors: Arc<AtomicU64>,
    history: Arc<History>,
    rpc: RpcMetrics,
    health: Health,
    per_item_limit: usize,
) -> HttpRoutes {
    let mut registry = Registry::default();
    inventory_net::metrics::register_build_info(&mut registry);
    rpc.register(&mut registry);
    let state = HttpState { store, database_errors, history, registry: Arc::new(registry), health, per_item_limit };
    HttpRoutes {
        console: Router::new()
            .route("/", get(crate::console::page))
            .route("/api/items", get(crate::console::api_items))
            .route("/api/history", get(crate::console::api_history))
            .with_state(state.clone()),
        probes: Router::new().route("/healthz", get(healthz)).route("/metrics", get(metrics)).with_state(state),
    }
}

/// What the HTTP port shows: every item (or one page of them) with its per-channel ledger
/// lines, in item order, and every registered channel with its session.
pub struct LedgerView {
    pub items: Vec<ItemLedger>,
    /// Every registered channel's session, by channel name.
    pub sessions: Vec<(String, ChannelSession)>,
    /// Per item, the channels' own watermarks (the others follow the item's default).
    pub overrides: HashMap<String, Vec<(String, Watermarks)>>,
    /// Items in the ledger, and how many come before `items` (a page).
    pub total_items: usize,
    pub offset: usize,
}

impl LedgerView {
    fn new(ledgers: Vec<(ItemLedger, Vec<(String, Watermarks)>)>, sessions: Vec<(String, ChannelSession)>) -> Self {
        let mut items = Vec::with_capacity(ledgers.len());
        let mut overrides = HashMap::new();
        for (ledger, own) in ledgers {
            overrides.insert(ledger.item.item_id.clone(), own);
            items.push(ledger);
        }
        Self { total_items: items.len(), offset: 0, items, sessions, overrides }
    }
}

/// Reads the whole view: a fixed number of reads whatever the number of items and channels.
pub(crate) async fn read_ledger(store: &dyn LedgerStore) -> Result<LedgerView, CenterError> {
    Ok(LedgerView::new(store.ledgers().await?, store.sessions().await?))
}

/// Reads one page of the view: the database reads only the page's items.
pub(crate) async fn read_page(store: &dyn LedgerStore, offset: usize, limit: usize) -> Result<LedgerView, CenterError> {
    let page = store.ledger_page(offset, limit).await?;
    let view = LedgerView::new(page.items, store.sessions().await?);
    Ok(LedgerView { total_items: page.total_items, offset, ..view })
}

/// 200 while the database answers; 503 with the reason while it does not.
async fn healthz(State(state): State<HttpState>) -> (StatusCode, String) {
    match state.health.current() {
        Serving::Yes => (StatusCode::OK, "ok\n".to_owned()),
        Serving::No(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not serving: {reason}\n")),
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let ledger = read_ledger(state.store.as_ref()).await;
    if let Err(e) = &ledger {
        state.database_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, "metrics: ledger unreadable");
    }
    // Always 200: a scrape that fails would hide the error counter with everything else.
    let errors = state.database_errors.load(Ordering::Relaxed);
    let counters = StoreCounters {
        database_errors: errors,
        database_changes: state.store.database_changes(),
        group_commits: state.store.group_commits(),
    };
    let mut body = render(ledger.ok(), counters, crate::clock::now_ms(), state.per_item_limit);
    if let Err(e) = prometheus_text::encode(&mut body, &state.registry) {
        tracing::error!(error = %e, "metrics: cannot encode");
    }
    ([(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)], body)
}

/// What the center counts of its store, beside the ledger itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreCounters {
    pub database_errors: u64,
    /// Times the store's connections reached another database server (`LedgerStore::database_changes`).
    pub database_changes: u64,
    /// The store's Borrow/Return transactions and the calls they answered.
    pub group_commits: (u64, u64),
}

/// Prometheus text for the ledger (`None`: unreadable, only the counters).
/// `per_item_limit`: items with series of their own at most ([`crate::fold`]).
pub fn render(view: Option<LedgerView>, counters: StoreCounters, now_ms: i64, per_item_limit: usize) -> String {
    let mut registry = Registry::default();
    let StoreCounters { database_errors, database_changes, group_commits } = counters;
    registry.register_collector(Box::new(LedgerMetrics {
        view,
        database_errors,
        database_changes,
        group_commits,
        now_ms,
        per_item_limit,
    }));
    let mut out = String::new();
    if let Err(e) = prometheus_text::encode(&mut out, &registry) {
        tracing::error!(error = %e, "metrics: cannot encode the ledger");
    }
    out
}

/// The ledger as one scrape read it. Every family is announced even without samples, so
/// a dashboard tells "no item yet" from "not exported".
pub struct LedgerMetrics {
    view: Option<LedgerView>,
    database_errors: u64,
    database_changes: u64,
    group_commits: (u64, u64),
    now_ms: i64,
    per_item_limit: usize,
}

impl std::fmt::Debug for LedgerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerMetrics").field("readable", &self.view.is_some()).finish_non_exhaustive()
    }
}

/// One family: its descriptor, then a sample per label set.
pub(crate) fn family<L, M>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (L, M)>,
) -> std::fmt::Result
where
    L: prometheus_client::encoding::EncodeLabelSet,
    M: EncodeMetric,
{
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

type Labels = Vec<(&'static str, String)>;

/// One state of a reported pool, read from its allocation.
type StateOf = fn(&Allocation) -> u64;

/// The samples of the per-item families: one per shown item (or item and channel), then
/// the folded items' sums, without the item label ([`crate::fold`]).
struct Folding<'a> {
    split: &'a crate::fold::Split<'a>,
}

impl Folding<'_> {
    fn per_item<T: Copy + Default + std::ops::Add<Output = T>>(
        &self,
        v: impl Fn(&ItemLedger) -> T,
    ) -> Vec<(Labels, T)> {
        let mut out: Vec<(Labels, T)> =
            self.split.shown.iter().map(|l| (vec![("item", l.item.item_id.clone())], v(l))).collect();
        if !self.split.folded.is_empty() {
            out.push((Vec::new(), self.split.folded.iter().fold(T::default(), |sum, l| sum + v(l))));
        }
        out
    }

    /// The shown items' ledger lines, labelled with item and channel, in item order.
    fn lines(&self) -> Vec<(Labels, &Allocation)> {
        self.split
            .shown
            .iter()
            .flat_map(|l| {
                l.channels
                    .iter()
                    .map(|c| (vec![("item", l.item.item_id.clone()), ("channel", c.channel.clone())], &c.allocation))
            })
            .collect()
    }

    /// The folded items' lines summed per channel, in channel order.
    fn folded_by_channel<T: Copy + Default + std::ops::Add<Output = T>>(
        &self,
        v: impl Fn(&ItemLedger, &ChannelRecord) -> T,
    ) -> Vec<(String, T)> {
        let mut sums = std::collections::BTreeMap::<&str, T>::new();
        for l in &self.split.folded {
            for c in &l.channels {
                let sum = sums.entry(c.channel.as_str()).or_default();
                *sum = *sum + v(l, c);
            }
        }
        sums.into_iter().map(|(c, v)| (c.to_owned(), v)).collect()
    }

    fn per_line_record<T: Copy + Default + std::ops::Add<Output = T>>(
        &self,
        v: impl Fn(&ItemLedger, &ChannelRecord) -> T,
    ) -> Vec<(Labels, T)> {
        let mut out: Vec<(Labels, T)> = self
            .split
            .shown
            .iter()
            .flat_map(|l| {
                l.channels
                    .iter()
                    .map(|c| (vec![("item", l.item.item_id.clone()), ("channel", c.channel.clone())], v(l, c)))
                    .collect::<Vec<_>>()
            })
            .collect();
        out.extend(self.folded_by_channel(&v).into_iter().map(|(c, v)| (vec![("channel", c)], v)));
        out
    }

    fn per_line<T: Copy + Default + std::ops::Add<Output = T>>(
        &self,
        v: impl Fn(&ItemLedger, &Allocation) -> T,
    ) -> Vec<(Labels, T)> {
        self.per_line_record(|l, c| v(l, &c.allocation))
    }
}

impl Collector for LedgerMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut encoder;
        let none: [(&str, &str); 0] = [];
        let up = u8::from(self.view.is_some());
        let gauge = MetricType::Gauge;
        let counter = MetricType::Counter;
        family(
            e,
            "inventory_center_database_up",
            "1 when the last read of the ledger succeeded.",
            gauge,
            [(none, ConstGauge::new(u32::from(up)))],
        )?;
        family(
            e,
            "inventory_center_database_errors",
            "Failed database calls counted by the center (at least the HTTP port's ledger reads).",
            counter,
            [(none, ConstCounter::new(self.database_errors))],
        )?;
        family(
            e,
            "inventory_center_database_server_changes",
            "Times the ledger's connections reached another database server than before (a failover, a restart, a restore): each may have lost commits.",
            counter,
            [(none, ConstCounter::new(self.database_changes))],
        )?;
        family(
            e,
            "inventory_center_movement_transactions",
            "Transactions of Borrows and Returns (group commit: concurrent calls of one item share one).",
            counter,
            [(none, ConstCounter::new(self.group_commits.0))],
        )?;
        family(
            e,
            "inventory_center_movement_calls",
            "Borrow and Return calls answered by those transactions.",
            counter,
            [(none, ConstCounter::new(self.group_commits.1))],
        )?;
        let (ledgers, sessions) = self.view.as_ref().map_or((&[][..], &[][..]), |v| (&v.items[..], &v.sessions[..]));
        let split = crate::fold::split(ledgers, self.per_item_limit);
        family(
            e,
            "inventory_center_metrics_folded_items",
            "Items whose series are summed into the series without the item label (more items than --metrics-per-item-limit).",
            gauge,
            [(none, ConstGauge::new(split.folded.len() as u64))],
        )?;
        let items = Folding { split: &split };

        family(
            e,
            "inventory_center_item_total_units",
            "Units of the item in existence (without the item label: the folded items' sum).",
            gauge,
            items.per_item(|l| l.item.state.total).into_iter().map(|(l, v)| (l, ConstGauge::new(v))),
        )?;
        family(
            e,
            "inventory_center_available_units",
            "Units at the center, not held by any channel.",
            gauge,
            items.per_item(|l| l.item.state.available).into_iter().map(|(l, v)| (l, ConstGauge::new(v))),
        )?;
        family(
            e,
            "inventory_center_held_units",
            "Units the center regards as out with a channel (granted - returned - reclaimed).",
            gauge,
            items.per_line(|_, a| a.held()).into_iter().map(|(l, v)| (l, ConstGauge::new(v))),
        )?;
        family(
            e,
            "inventory_center_channel_drift_units",
            "Held minus the channel's last reported pool; 0 at quiescence.",
            gauge,
            items.per_line(|_, a| a.drift()).into_iter().map(|(l, v)| (l, ConstGauge::new(v))),
        )?;
        family(
            e,
            "inventory_center_in_doubt_units",
            "Units in doubt because the channel's pool store lost the pool; an operator resolves them.",
            gauge,
            items.per_line(|_, a| a.in_doubt).into_iter().map(|(l, v)| (l, ConstGauge::new(v))),
        )?;
        family(
            e,
            "inventory_center_written_off_units",
            "Units written off as sold outside the pools when in-doubt units were resolved.",
            counter,
            items.per_item(|l| l.item.state.written_off).into_iter().map(|(l, v)| (l, ConstCounter::new(v))),
        )?;
        {
            let mut family = e.encode_descriptor(
                "inventory_center_reported_pool_units",
                "The channel's pool as its agent last reported it, by state.",
                None,
                gauge,
            )?;
            let states: [(&str, StateOf); 3] = [
                ("available", |a| a.reported.available),
                ("reserved", |a| a.reported.reserved),
                ("sold", |a| a.reported.sold),
            ];
            for (labels, a) in items.lines() {
                for (state, v) in &states {
                    let mut labels = labels.clone();
                    labels.push(("state", (*state).to_owned()));
                    ConstGauge::new(v(a)).encode(family.encode_family(&labels)?)?;
                }
            }
            for (state, v) in &states {
                for (channel, sum) in items.folded_by_channel(|_, c| v(&c.allocation)) {
                    let labels = [("channel", channel), ("state", (*state).to_owned())];
                    ConstGauge::new(sum).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        family(
            e,
            "inventory_center_granted_units",
            "Units granted to the channel.",
            counter,
            items.per_line(|_, a| a.granted).into_iter().map(|(l, v)| (l, ConstCounter::new(v))),
        )?;
        family(
            e,
            "inventory_center_returned_units",
            "Units the channel gave back.",
            counter,
            items.per_line(|_, a| a.returned).into_iter().map(|(l, v)| (l, ConstCounter::new(v))),
        )?;
        family(
            e,
            "inventory_center_reclaimed_units",
            "Units taken back from the channel after its lease expired.",
            counter,
            items.per_line(|_, a| a.reclaimed).into_iter().map(|(l, v)| (l, ConstCounter::new(v))),
        )?;

        family(
            e,
            "inventory_center_channel_sell_rate",
            "The channel's recent sell rate of the item as last reported, units per second.",
            gauge,
            items.per_line(|_, a| a.sell_rate_milli as f64 / 1000.0).into_iter().map(|(l, v)| (l, ConstGauge::new(v))),
        )?;
        family(
            e,
            "inventory_center_channel_batch_units",
            "The batch the channel's pool borrows now: by its reported rate when the item's batches follow it.",
            gauge,
            items
                .per_line_record(|l, c| {
                    let own = c.watermarks_overridden.then_some(c.watermarks);
                    crate::service::current_batch(&l.item, own, c.allocation.sell_rate_milli)
                })
                .into_iter()
                .map(|(l, v)| (l, ConstGauge::new(v))),
        )?;

        crate::readiness::encode_schedule(e, self.view.as_ref(), self.now_ms)?;

        let secs = |ms: i64| ms as f64 / 1000.0;
        let channel = |c: &(String, ChannelSession)| [("channel", c.0.clone())];
        family(
            e,
            "inventory_center_lease_remaining_seconds",
            "Seconds until the channel's lease expires; negative once expired.",
            gauge,
            sessions.iter().map(|c| (channel(c), ConstGauge::new(secs(c.1.lease_expires_at_ms - self.now_ms)))),
        )?;
        family(
            e,
            "inventory_center_heartbeat_age_seconds",
            "Seconds since the channel's last heartbeat (or registration).",
            gauge,
            sessions.iter().map(|c| (channel(c), ConstGauge::new(secs(self.now_ms - c.1.last_heartbeat_ms)))),
        )?;
        family(
            e,
            "inventory_center_channel_epoch",
            "The channel's current epoch.",
            gauge,
            sessions.iter().map(|c| (channel(c), ConstGauge::new(c.1.epoch))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_ledger_still_renders_every_family_and_the_error_counters() {
        let counters = StoreCounters { database_errors: 3, database_changes: 2, group_commits: (0, 0) };
        let text = render(None, counters, 0, 10);
        assert!(text.lines().any(|l| l == "inventory_center_database_up 0"), "{text}");
        assert!(text.lines().any(|l| l == "inventory_center_database_errors_total 3"), "{text}");
        assert!(text.lines().any(|l| l == "inventory_center_database_server_changes_total 2"), "{text}");
        let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(families, 25, "every family is announced even without samples:\n{text}");
        let empty = LedgerView::new(Vec::new(), Vec::new());
        assert_eq!(
            render(Some(empty), StoreCounters::default(), 0, 10).lines().filter(|l| l.starts_with("# TYPE ")).count(),
            families
        );
    }
}
