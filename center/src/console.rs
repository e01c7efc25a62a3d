//! The console: the page (`console.html`, served as is at `/`) and its JSON feeds,
//! `/api/items` (the ledger as [`api_page`] shapes it, a page of `?offset=&limit=` items at
//! a time, read as a page by the store) and `/api/history` (the samples of [`crate::history`]). Routed by [`crate::http`], behind [`crate::http_auth`].

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{Html, IntoResponse};
use inventory_core::watermarks::Watermarks;
use serde::Serialize;

use crate::history::History;
use crate::http::{HttpState, LedgerView, read_page};

/// The console page, served as is.
pub const CONSOLE_HTML: &str = include_str!("console.html");

/// Only inline script and style, and requests back to this server: the page can reach
/// nothing else even if an id were crafted to look like markup.
const CONSOLE_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                           connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'";

pub(crate) async fn page() -> axum::response::Response {
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

/// Items in one answer of `/api/items` unless the caller asks for fewer (`limit`); the
/// console pages through the rest, so a catalogue of 100,000 items costs each poll one page.
pub const DEFAULT_PAGE: usize = 1_000;

/// The console's feed: one page of the ledger's items, in item order.
#[derive(Debug, Serialize)]
pub struct ApiItems {
    pub now_ms: i64,
    /// Every item the ledger holds, and the first one of this page (`items` starts there).
    pub total_items: usize,
    pub offset: usize,
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

/// Which items `/api/items` answers with: `offset` items skipped, `limit` at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub offset: usize,
    pub limit: usize,
}

impl Default for Page {
    fn default() -> Self {
        Self { offset: 0, limit: DEFAULT_PAGE }
    }
}

impl Page {
    /// `offset=N&limit=M` of a query string; a missing or malformed one keeps its default,
    /// and the limit stays at most [`DEFAULT_PAGE`].
    pub fn parse(query: Option<&str>) -> Self {
        let mut page = Self::default();
        for (key, value) in query.unwrap_or_default().split('&').filter_map(|p| p.split_once('=')) {
            match (key, value.parse::<usize>()) {
                ("offset", Ok(n)) => page.offset = n,
                ("limit", Ok(n)) => page.limit = n.min(DEFAULT_PAGE),
                _ => {}
            }
        }
        page
    }
}

/// One page of the feed: the items of `view` (a page read by the store, [`read_page`]), so
/// its cost follows the page.
pub fn api_page(view: &LedgerView, history: &History, now_ms: i64) -> ApiItems {
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
        .sessions
        .iter()
        .map(|(channel, session)| ApiSession {
            channel: channel.clone(),
            agent_id: session.agent_id.clone(),
            epoch: session.epoch,
            lease_remaining_ms: session.lease_expires_at_ms - now_ms,
            heartbeat_age_ms: now_ms - session.last_heartbeat_ms,
        })
        .collect();
    ApiItems { now_ms, total_items: view.total_items, offset: view.offset, items, channels }
}

pub(crate) async fn api_items(State(state): State<HttpState>, uri: Uri) -> axum::response::Response {
    let page = Page::parse(uri.query());
    let (status, body) = match read_page(state.store.as_ref(), page.offset, page.limit).await {
        Ok(view) => match serde_json::to_string(&api_page(&view, &state.history, crate::clock::now_ms())) {
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
pub(crate) async fn api_history(State(state): State<HttpState>) -> axum::response::Response {
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
    fn a_page_is_read_from_the_query_and_never_larger_than_the_default() {
        assert_eq!(Page::parse(None), Page::default());
        assert_eq!(Page::parse(Some("offset=200&limit=100")), Page { offset: 200, limit: 100 });
        assert_eq!(Page::parse(Some("limit=5000000")), Page { offset: 0, limit: DEFAULT_PAGE });
        assert_eq!(Page::parse(Some("offset=x&limit=&other=1")), Page::default());
    }
}
