//! The HTTP side port: `/healthz` (503 while the database does not answer, see
//! [`crate::health`]), Prometheus text on `/metrics`, the live console page on `/` and its
//! JSON feed on `/api/items`. The console and its feeds need the operator token where the
//! center has one ([`crate::http_auth`]); the probes may move to a listener of their own
//! (`--metrics-listen`), see [`HttpRoutes`].
//!
//! Every view is read from the ledger at request time (`ledgers` and `channels`: a fixed
//! number of queries whatever the number of items); nothing here writes. The console is one
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
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use inventory_core::watermarks::Watermarks;
use inventory_net::metrics::RpcMetrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::error::CenterError;
use crate::health::{Health, Serving};
use crate::history::{History, HistoryConfig};
use crate::store::{ChannelView, ItemLedger, LedgerStore};

/// The console page, served as is.
pub const CONSOLE_HTML: &str = include_str!("console.html");

/// Only inline script and style, and requests back to this server: the page can reach
/// nothing else even if an id were crafted to look like markup.
const CONSOLE_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                           connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'";

#[derive(Clone)]
struct HttpState {
    store: Arc<dyn LedgerStore>,
    /// Failed ledger reads: this port's, and those of whoever shares the counter.
    database_errors: Arc<AtomicU64>,
    history: Arc<History>,
    /// Build information and the per-RPC metrics: the part of `/metrics` kept between scrapes.
    registry: Arc<Registry>,
    /// Whether the database answers, for `/healthz`.
    health: Health,
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
    let routes = routes_with_history(store, database_errors, history, rpc, health);
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

/// The routes of [`router_with_history`], apart.
pub fn routes_with_history(
    store: Arc<dyn LedgerStore>,
    database_errors: Arc<AtomicU64>,
    history: Arc<History>,
    rpc: RpcMetrics,
    health: Health,
) -> HttpRoutes {
    let mut registry = Registry::default();
    inventory_net::metrics::register_build_info(&mut registry);
    rpc.register(&mut registry);
    let state = HttpState { store, database_errors, history, registry: Arc::new(registry), health };
    HttpRoutes {
        console: Router::new()
            .route("/", get(console))
            .route("/api/items", get(api_items))
            .route("/api/history", get(api_history))
            .with_state(state.clone()),
        probes: Router::new().route("/healthz", get(healthz)).route("/metrics", get(metrics)).with_state(state),
    }
}

/// What the HTTP port shows: every item with its per-channel ledger lines, in item
/// order, and every registered channel with its session.
pub struct LedgerView {
    pub items: Vec<ItemLedger>,
    pub channels: Vec<ChannelView>,
    /// Per item, the channels' own watermarks (the others follow the item's default).
    pub overrides: HashMap<String, Vec<(String, Watermarks)>>,
}

/// Reads the view: two reads of the ledger whatever the number of items and channels.
async fn read_ledger(store: &dyn LedgerStore) -> Result<LedgerView, CenterError> {
    let mut items = Vec::new();
    let mut overrides = HashMap::new();
    for (ledger, own) in store.ledgers().await? {
        overrides.insert(ledger.item.item_id.clone(), own);
        items.push(ledger);
    }
    let mut channels = store.channels().await?;
    channels.sort_by(|a, b| a.channel.cmp(&b.channel));
    Ok(LedgerView { items, channels, overrides })
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
    let mut body = render(ledger.ok(), errors, state.store.group_commits(), crate::clock::now_ms());
    if let Err(e) = prometheus_text::encode(&mut body, &state.registry) {
        tracing::error!(error = %e, "metrics: cannot encode");
    }
    ([(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)], body)
}

/// Prometheus text for the ledger (`None`: unreadable, only the error counters).
/// `group_commits`: the store's Borrow/Return transactions and the calls they answered.
pub fn render(view: Option<LedgerView>, database_errors: u64, group_commits: (u64, u64), now_ms: i64) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(LedgerMetrics { view, database_errors, group_commits, now_ms }));
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
    group_commits: (u64, u64),
    now_ms: i64,
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
        let (ledgers, channels) = self.view.as_ref().map_or((&[][..], &[][..]), |v| (&v.items[..], &v.channels[..]));

        let item = |l: &'_ ItemLedger| [("item", l.item.item_id.clone())];
        family(
            e,
            "inventory_center_item_total_units",
            "Units of the item in existence.",
            gauge,
            ledgers.iter().map(|l| (item(l), ConstGauge::new(l.item.state.total))),
        )?;
        family(
            e,
            "inventory_center_available_units",
            "Units at the center, not held by any channel.",
            gauge,
            ledgers.iter().map(|l| (item(l), ConstGauge::new(l.item.state.available))),
        )?;
        // Per item and channel, in item order.
        let lines = || {
            ledgers.iter().flat_map(|l| {
                l.channels
                    .iter()
                    .map(move |c| ([("item", l.item.item_id.clone()), ("channel", c.channel.clone())], &c.allocation))
            })
        };
        family(
            e,
            "inventory_center_held_units",
            "Units the center regards as out with a channel (granted - returned - reclaimed).",
            gauge,
            lines().map(|(labels, a)| (labels, ConstGauge::new(a.held()))),
        )?;
        family(
            e,
            "inventory_center_channel_drift_units",
            "Held minus the channel's last reported pool; 0 at quiescence.",
            gauge,
            lines().map(|(labels, a)| (labels, ConstGauge::new(a.drift()))),
        )?;
        family(
            e,
            "inventory_center_in_doubt_units",
            "Units in doubt because the channel's pool store lost the pool; an operator resolves them.",
            gauge,
            lines().map(|(labels, a)| (labels, ConstGauge::new(a.in_doubt))),
        )?;
        family(
            e,
            "inventory_center_written_off_units",
            "Units written off as sold outside the pools when in-doubt units were resolved.",
            counter,
            ledgers.iter().map(|l| (item(l), ConstCounter::new(l.item.state.written_off))),
        )?;
        family(
            e,
            "inventory_center_reported_pool_units",
            "The channel's pool as its agent last reported it, by state.",
            gauge,
            lines().flat_map(|(labels, a)| {
                let r = &a.reported;
                [("available", r.available), ("reserved", r.reserved), ("sold", r.sold)]
                    .map(|(state, v)| ((labels.clone(), [("state", state)]), ConstGauge::new(v)))
            }),
        )?;
        family(
            e,
            "inventory_center_granted_units",
            "Units granted to the channel.",
            counter,
            lines().map(|(labels, a)| (labels, ConstCounter::new(a.granted))),
        )?;
        family(
            e,
            "inventory_center_returned_units",
            "Units the channel gave back.",
            counter,
            lines().map(|(labels, a)| (labels, ConstCounter::new(a.returned))),
        )?;
        family(
            e,
            "inventory_center_reclaimed_units",
            "Units taken back from the channel after its lease expired.",
            counter,
            lines().map(|(labels, a)| (labels, ConstCounter::new(a.reclaimed))),
        )?;

        family(
            e,
            "inventory_center_channel_sell_rate",
            "The channel's recent sell rate of the item as last reported, units per second.",
            gauge,
            lines().map(|(labels, a)| (labels, ConstGauge::new(a.sell_rate_milli as f64 / 1000.0))),
        )?;
        family(
            e,
            "inventory_center_channel_batch_units",
            "The batch the channel's pool borrows now: by its reported rate when the item's batches follow it.",
            gauge,
            ledgers.iter().flat_map(|l| {
                l.channels.iter().map(move |c| {
                    let own = c.watermarks_overridden.then_some(c.watermarks);
                    let batch = crate::service::current_batch(&l.item, own, c.allocation.sell_rate_milli);
                    ([("item", l.item.item_id.clone()), ("channel", c.channel.clone())], ConstGauge::new(batch))
                })
            }),
        )?;

        crate::readiness::encode_schedule(e, self.view.as_ref(), self.now_ms)?;

        let secs = |ms: i64| ms as f64 / 1000.0;
        let channel = |c: &ChannelView| [("channel", c.channel.clone())];
        family(
            e,
            "inventory_center_lease_remaining_seconds",
            "Seconds until the channel's lease expires; negative once expired.",
            gauge,
            channels.iter().map(|c| (channel(c), ConstGauge::new(secs(c.session.lease_expires_at_ms - self.now_ms)))),
        )?;
        family(
            e,
            "inventory_center_heartbeat_age_seconds",
            "Seconds since the channel's last heartbeat (or registration).",
            gauge,
            channels.iter().map(|c| (channel(c), ConstGauge::new(secs(self.now_ms - c.session.last_heartbeat_ms)))),
        )?;
        family(
            e,
            "inventory_center_channel_epoch",
            "The channel's current epoch.",
            gauge,
            channels.iter().map(|c| (channel(c), ConstGauge::new(c.session.epoch))),
        )
    }
}

async fn console() -> axum::response::Response {
    console_page(StatusCode::OK)
}

/// The console page with `status`: 200, or 401 when the operator token is missing (the page
/// then shows its sign-in form).
pub(crate) fn console_page(status: StatusCode) -> axum::response::Response {
    (
        status,
        [
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONSOLE_CSP)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        Html(CONSOLE_HTML),
    )
        .into_response()
}

/// The console's feed: the ledger of every item.
#[derive(Debug, Serialize)]
pub struct ApiItems {
    pub now_ms: i64,
    pub items: Vec<ApiItem>,
    /// Every registered channel, with or without items.
    pub channels: Vec<ApiSession>,
}

#[derive(Debug, Serialize)]
pub struct ApiSession {
    pub channel: String,
    pub agent_id: String,
    pub epoch: u64,
    /// Negative once expired.
    pub lease_remaining_ms: i64,
    pub heartbeat_age_ms: i64,
}

#[derive(Debug, Serialize)]
pub struct ApiItem {
    pub item_id: String,
    pub total: u64,
    pub available: u64,
    pub held: u64,
    pub closed: bool,
    /// Units written off as sold outside the pools (in-doubt units resolved).
    pub written_off: u64,
    pub per_user_limit: u64,
    pub reservation_ttl_ms: u64,
    pub watermarks: ApiWatermarks,
    /// Nothing left to sell anywhere: the center and every channel's pool are empty
    /// (reserved units may still come back if their reservations expire).
    pub sold_out_everywhere: bool,
    pub channels: Vec<ApiChannel>,
    /// A scheduled item's plan, countdown and channels' readiness (absent unscheduled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<crate::readiness::ApiSchedule>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct ApiWatermarks {
    pub low: u64,
    pub high: u64,
    pub batch: u64,
}

#[derive(Debug, Serialize)]
pub struct ApiChannel {
    pub channel: String,
    pub held: u64,
    pub granted: u64,
    pub returned: u64,
    pub reclaimed: u64,
    /// The pool as last reported.
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    pub drift: i64,
    /// The part of `drift` that calls and reports in flight explain (normal in a sale).
    pub drift_in_flight: i64,
    /// The part that persisted past a report period ([`crate::history`]): worth a look.
    pub drift_stuck: i64,
    /// Units in doubt after the channel's pool was lost (0 normally).
    pub in_doubt: u64,
    /// The watermarks this channel's pool follows (its own, else the item's).
    pub watermarks: ApiWatermarks,
    /// The channel's recent sell rate as last reported, units per second.
    pub sell_rate: f64,
    /// The batch its pool borrows now (by that rate when the item's batches follow it).
    pub batch: u64,
    pub reported_at_ms: i64,
    pub epoch: Option<u64>,
    pub agent_id: Option<String>,
    /// Negative once expired; `None` when the channel never registered.
    pub lease_remaining_ms: Option<i64>,
    /// A segmented pool's segments as last reported (absent for one pool).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<ApiSegment>,
}

#[derive(Debug, Serialize)]
pub struct ApiSegment {
    pub segment: u32,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    /// The store lost it: its units are in doubt until an operator resolves them.
    pub lost: bool,
}

pub fn api_view(view: &LedgerView, history: &History, now_ms: i64) -> ApiItems {
    let api_wm = |w: &Watermarks| ApiWatermarks { low: w.low, high: w.high, batch: w.batch };
    let items = view
        .items
        .iter()
        .map(|l| {
            let own = view.overrides.get(&l.item.item_id);
            let channels: Vec<ApiChannel> = l
                .channels
                .iter()
                .map(|c| {
                    let a = &c.allocation;
                    let split = history.split(&l.item.item_id, &c.channel, a, now_ms);
                    let own_wm = own.and_then(|o| o.iter().find(|(ch, _)| ch == &c.channel)).map(|(_, w)| *w);
                    let watermarks = api_wm(&own_wm.unwrap_or(l.item.watermarks));
                    ApiChannel {
                        channel: c.channel.clone(),
                        held: a.held(),
                        granted: a.granted,
                        returned: a.returned,
                        reclaimed: a.reclaimed,
                        available: a.reported.available,
                        reserved: a.reported.reserved,
                        sold: a.reported.sold,
                        drift: a.drift(),
                        drift_in_flight: split.in_flight,
                        drift_stuck: split.stuck,
                        in_doubt: a.in_doubt,
                        watermarks,
                        sell_rate: a.sell_rate_milli as f64 / 1000.0,
                        batch: crate::service::current_batch(&l.item, own_wm, a.sell_rate_milli),
                        reported_at_ms: a.reported_at_ms,
                        epoch: c.session.as_ref().map(|s| s.epoch),
                        agent_id: c.session.as_ref().map(|s| s.agent_id.clone()),
                        lease_remaining_ms: c.session.as_ref().map(|s| s.lease_expires_at_ms - now_ms),
                        segments: c
                            .segments
                            .iter()
                            .map(|g| ApiSegment {
                                segment: g.segment,
                                available: g.counts.available,
                                reserved: g.counts.reserved,
                                sold: g.counts.sold,
                                lost: g.lost,
                            })
                            .collect(),
                    }
                })
                .collect();
            // Held units the pools do not show (in flight, in doubt) may still be sold.
            let sold_out_everywhere = l.item.state.total > 0
                && l.item.state.available == 0
                && channels.iter().all(|c| c.available == 0 && c.drift == 0 && c.in_doubt == 0);
            ApiItem {
                item_id: l.item.item_id.clone(),
                total: l.item.state.total,
                available: l.item.state.available,
                held: l.item.held,
                closed: l.item.state.closed,
                written_off: l.item.state.written_off,
                per_user_limit: l.item.state.per_user_limit,
                reservation_ttl_ms: l.item.state.reservation_ttl_ms,
                watermarks: api_wm(&l.item.watermarks),
                sold_out_everywhere,
                channels,
                schedule: crate::readiness::api_schedule(view, l, now_ms),
            }
        })
        .collect();
    let channels = view
        .channels
        .iter()
        .map(|c| ApiSession {
            channel: c.channel.clone(),
            agent_id: c.session.agent_id.clone(),
            epoch: c.session.epoch,
            lease_remaining_ms: c.session.lease_expires_at_ms - now_ms,
            heartbeat_age_ms: now_ms - c.session.last_heartbeat_ms,
        })
        .collect();
    ApiItems { now_ms, items, channels }
}

async fn api_items(State(state): State<HttpState>) -> axum::response::Response {
    let (status, body) = match read_ledger(state.store.as_ref()).await {
        Ok(view) => match serde_json::to_string(&api_view(&view, &state.history, crate::clock::now_ms())) {
            Ok(json) => (StatusCode::OK, json),
            Err(e) => {
                tracing::error!(error = %e, "console: cannot encode the ledger view");
                (StatusCode::INTERNAL_SERVER_ERROR, r#"{"error":"internal error"}"#.to_owned())
            }
        },
        Err(e) => {
            state.database_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "console: ledger unreadable");
            (StatusCode::SERVICE_UNAVAILABLE, r#"{"error":"ledger unavailable"}"#.to_owned())
        }
    };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ];
    (status, headers, body).into_response()
}

/// The console's memory: the samples of the last minutes, per item.
async fn api_history(State(state): State<HttpState>) -> axum::response::Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ];
    match serde_json::to_string(&state.history.view()) {
        Ok(json) => (StatusCode::OK, headers, json).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "console: cannot encode the history");
            (StatusCode::INTERNAL_SERVER_ERROR, headers, r#"{"error":"internal error"}"#.to_owned()).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_ledger_still_renders_every_family_and_the_error_counters() {
        let text = render(None, 3, (0, 0), 0);
        assert!(text.lines().any(|l| l == "inventory_center_database_up 0"), "{text}");
        assert!(text.lines().any(|l| l == "inventory_center_database_errors_total 3"), "{text}");
        let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(families, 23, "every family is announced even without samples:\n{text}");
        let empty = LedgerView { items: Vec::new(), channels: Vec::new(), overrides: HashMap::new() };
        assert_eq!(render(Some(empty), 0, (0, 0), 0).lines().filter(|l| l.starts_with("# TYPE ")).count(), families);
    }
}
