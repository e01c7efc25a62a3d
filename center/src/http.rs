//! The HTTP side port: `/healthz`, Prometheus text on `/metrics`, the live console page on
//! `/` and its JSON feed on `/api/items`.
//!
//! Every view is read from the ledger at request time (`list_items`, one `item_ledger`
//! and one `watermarks` per item, `channels`); nothing here writes. The console is one
//! self-contained HTML file with inline script and SVG charts (no build step, nothing
//! fetched from elsewhere): it loads the last minutes from `/api/history` (sampled by
//! [`crate::history`], which also tells drift in flight from stuck drift), then polls
//! `/api/items`.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use inventory_core::ItemId;
use inventory_core::watermarks::Watermarks;
use serde::Serialize;

use crate::error::CenterError;
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
    let history = Arc::new(History::new(history));
    History::spawn_sampler(&history, Arc::clone(&store));
    let state = HttpState { store, database_errors, history };
    Router::new()
        .route("/", get(console))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/api/items", get(api_items))
        .route("/api/history", get(api_history))
        .with_state(state)
}

/// What the HTTP port shows: every item with its per-channel ledger lines, in item
/// order, and every registered channel with its session.
pub struct LedgerView {
    pub items: Vec<ItemLedger>,
    pub channels: Vec<ChannelView>,
    /// Per item, the channels' own watermarks (the others follow the item's default).
    pub overrides: HashMap<String, Vec<(String, Watermarks)>>,
}

/// Reads the view. An item that vanished between the listing and its read is skipped.
async fn read_ledger(store: &dyn LedgerStore) -> Result<LedgerView, CenterError> {
    let mut items = Vec::new();
    let mut overrides = HashMap::new();
    for record in store.list_items().await? {
        // Ids come from the ledger, so they parse; skip rather than fail if one does not.
        let Ok(id) = ItemId::parse("item_id", &record.item_id) else { continue };
        match store.item_ledger(&id).await {
            Ok(ledger) => items.push(ledger),
            Err(CenterError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        }
        match store.watermarks(&id).await {
            Ok((_, own)) => {
                overrides.insert(record.item_id.clone(), own);
            }
            Err(CenterError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    items.sort_by(|a, b| a.item.item_id.cmp(&b.item.item_id));
    let mut channels = store.channels().await?;
    channels.sort_by(|a, b| a.channel.cmp(&b.channel));
    Ok(LedgerView { items, channels, overrides })
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let ledger = read_ledger(state.store.as_ref()).await;
    if let Err(e) = &ledger {
        state.database_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, "metrics: ledger unreadable");
    }
    // Always 200: a scrape that fails would hide the error counter with everything else.
    let body = render(ledger.as_ref().ok(), state.database_errors.load(Ordering::Relaxed), crate::clock::now_ms());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    out.push_str(samples);
}

/// Prometheus text for the ledger (`None`: unreadable, only the error counters).
pub fn render(view: Option<&LedgerView>, database_errors: u64, now_ms: i64) -> String {
    let mut out = String::new();
    let up = u8::from(view.is_some());
    family(
        &mut out,
        "inventory_center_database_up",
        "gauge",
        "1 when the last read of the ledger succeeded.",
        &format!("inventory_center_database_up {up}\n"),
    );
    family(
        &mut out,
        "inventory_center_database_errors_total",
        "counter",
        "Failed database calls counted by the center (at least the HTTP port's ledger reads).",
        &format!("inventory_center_database_errors_total {database_errors}\n"),
    );
    let (ledgers, channels) = view.map_or((&[][..], &[][..]), |v| (&v.items[..], &v.channels[..]));

    // Item and channel ids are validated to [A-Za-z0-9._:-]: safe inside label quotes.
    let (mut total, mut available) = (String::new(), String::new());
    let (mut held, mut drift, mut pool, mut in_doubt) = (String::new(), String::new(), String::new(), String::new());
    let mut written_off = String::new();
    let (mut granted, mut returned, mut reclaimed) = (String::new(), String::new(), String::new());
    for l in ledgers {
        let (item, state) = (&l.item.item_id, &l.item.state);
        let _ = writeln!(total, "inventory_center_item_total_units{{item=\"{item}\"}} {}", state.total);
        let _ = writeln!(available, "inventory_center_available_units{{item=\"{item}\"}} {}", state.available);
        let _ =
            writeln!(written_off, "inventory_center_written_off_units_total{{item=\"{item}\"}} {}", state.written_off);
        for c in &l.channels {
            let labels = format!("item=\"{item}\",channel=\"{}\"", c.channel);
            let a = &c.allocation;
            let _ = writeln!(held, "inventory_center_held_units{{{labels}}} {}", a.held());
            let _ = writeln!(drift, "inventory_center_channel_drift_units{{{labels}}} {}", a.drift());
            let _ = writeln!(in_doubt, "inventory_center_in_doubt_units{{{labels}}} {}", a.in_doubt);
            for (s, v) in
                [("available", a.reported.available), ("reserved", a.reported.reserved), ("sold", a.reported.sold)]
            {
                let _ = writeln!(pool, "inventory_center_reported_pool_units{{{labels},state=\"{s}\"}} {v}");
            }
            let _ = writeln!(granted, "inventory_center_granted_units_total{{{labels}}} {}", a.granted);
            let _ = writeln!(returned, "inventory_center_returned_units_total{{{labels}}} {}", a.returned);
            let _ = writeln!(reclaimed, "inventory_center_reclaimed_units_total{{{labels}}} {}", a.reclaimed);
        }
    }
    family(&mut out, "inventory_center_item_total_units", "gauge", "Units of the item in existence.", &total);
    family(
        &mut out,
        "inventory_center_available_units",
        "gauge",
        "Units at the center, not held by any channel.",
        &available,
    );
    family(
        &mut out,
        "inventory_center_held_units",
        "gauge",
        "Units the center regards as out with a channel (granted - returned - reclaimed).",
        &held,
    );
    family(
        &mut out,
        "inventory_center_channel_drift_units",
        "gauge",
        "Held minus the channel's last reported pool; 0 at quiescence.",
        &drift,
    );
    family(
        &mut out,
        "inventory_center_in_doubt_units",
        "gauge",
        "Units in doubt because the channel's pool store lost the pool; an operator resolves them.",
        &in_doubt,
    );
    family(
        &mut out,
        "inventory_center_written_off_units_total",
        "counter",
        "Units written off as sold outside the pools when in-doubt units were resolved.",
        &written_off,
    );
    family(
        &mut out,
        "inventory_center_reported_pool_units",
        "gauge",
        "The channel's pool as its agent last reported it, by state.",
        &pool,
    );
    family(&mut out, "inventory_center_granted_units_total", "counter", "Units granted to the channel.", &granted);
    family(&mut out, "inventory_center_returned_units_total", "counter", "Units the channel gave back.", &returned);
    family(
        &mut out,
        "inventory_center_reclaimed_units_total",
        "counter",
        "Units taken back from the channel after its lease expired.",
        &reclaimed,
    );

    let (mut remaining, mut age, mut epoch) = (String::new(), String::new(), String::new());
    for ChannelView { channel, session: s, .. } in channels {
        let secs = |ms: i64| ms as f64 / 1000.0;
        let _ = writeln!(
            remaining,
            "inventory_center_lease_remaining_seconds{{channel=\"{channel}\"}} {}",
            secs(s.lease_expires_at_ms - now_ms)
        );
        let _ = writeln!(
            age,
            "inventory_center_heartbeat_age_seconds{{channel=\"{channel}\"}} {}",
            secs(now_ms - s.last_heartbeat_ms)
        );
        let _ = writeln!(epoch, "inventory_center_channel_epoch{{channel=\"{channel}\"}} {}", s.epoch);
    }
    family(
        &mut out,
        "inventory_center_lease_remaining_seconds",
        "gauge",
        "Seconds until the channel's lease expires; negative once expired.",
        &remaining,
    );
    family(
        &mut out,
        "inventory_center_heartbeat_age_seconds",
        "gauge",
        "Seconds since the channel's last heartbeat (or registration).",
        &age,
    );
    family(&mut out, "inventory_center_channel_epoch", "gauge", "The channel's current epoch.", &epoch);
    out
}

async fn console() -> impl IntoResponse {
    (
        [
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONSOLE_CSP)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        Html(CONSOLE_HTML),
    )
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
    pub reported_at_ms: i64,
    pub epoch: Option<u64>,
    pub agent_id: Option<String>,
    /// Negative once expired; `None` when the channel never registered.
    pub lease_remaining_ms: Option<i64>,
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
                    let watermarks = own
                        .and_then(|o| o.iter().find(|(ch, _)| ch == &c.channel))
                        .map_or(api_wm(&l.item.watermarks), |(_, w)| api_wm(w));
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
                        reported_at_ms: a.reported_at_ms,
                        epoch: c.session.as_ref().map(|s| s.epoch),
                        agent_id: c.session.as_ref().map(|s| s.agent_id.clone()),
                        lease_remaining_ms: c.session.as_ref().map(|s| s.lease_expires_at_ms - now_ms),
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
        let text = render(None, 3, 0);
        assert!(text.lines().any(|l| l == "inventory_center_database_up 0"), "{text}");
        assert!(text.lines().any(|l| l == "inventory_center_database_errors_total 3"), "{text}");
        let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(families, 15, "every family is announced even without samples:\n{text}");
        let empty = LedgerView { items: Vec::new(), channels: Vec::new(), overrides: HashMap::new() };
        assert_eq!(render(Some(&empty), 0, 0).lines().filter(|l| l.starts_with("# TYPE ")).count(), families);
    }
}
