//! The HTTP side port: `/healthz` and Prometheus text on `/metrics`.
//!
//! One registry, built with the router: the build information and per-RPC metrics of
//! [`inventory_net::metrics`], then under the channel's label the agent's counters and
//! histograms ([`crate::metrics::Metrics`]) and [`AgentState`], a collector that reads
//! the agent's state at scrape time. The pool gauges come from the last snapshot of each
//! pool the agent read (rebalancer, heartbeat), so a scrape never calls the pool store,
//! however many items there are.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::agent::Agent;
use crate::items::Item;
use inventory_core::channel::Mode;

#[derive(Clone)]
struct HttpState {
    agent: Arc<Agent>,
    registry: Arc<Registry>,
}

pub fn router(agent: Arc<Agent>) -> Router {
    let mut registry = Registry::default();
    inventory_net::metrics::register_build_info(&mut registry);
    agent.metrics.rpc.register(&mut registry);
    // Channel ids are validated to [A-Za-z0-9._:-]; the encoder escapes label values anyway.
    let channel = registry.sub_registry_with_label(("channel".into(), agent.link.channel.to_string().into()));
    agent.metrics.register(channel);
    channel.register_collector(Box::new(AgentState(Arc::clone(&agent))));
    channel.register_collector(Box::new(crate::relay::RelayCollector(Arc::clone(&agent.relay))));
    let state = HttpState { agent, registry: Arc::new(registry) };
    Router::new().route("/healthz", get(healthz)).route("/metrics", get(metrics)).with_state(state)
}

/// Not ready while the center refuses the agent's credentials (it cannot sell, and no
/// amount of waiting fixes that), while a Redis node may evict pool keys, and while the
/// pool store refuses writes (its memory limit).
async fn healthz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.agent.link.credentials_refused() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the center refuses this agent's credentials\n".to_owned(),
        );
    }
    if let Some(why) = state.agent.selling.store_health.not_serving() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n"));
    }
    (StatusCode::OK, "ok\n".to_owned())
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let mut out = String::new();
    if let Err(e) = prometheus_text::encode(&mut out, &state.registry) {
        // Writing to a String fails only if a metric's own encoding does.
        tracing::error!(error = %e, "metrics: cannot encode");
        return (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], String::new());
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)], out)
}

/// The families read from the agent at scrape time: the pool gauges (from snapshots) and
/// the counters and states kept by the parts that own them (selling, link, items, role).
struct AgentState(Arc<Agent>);

impl std::fmt::Debug for AgentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentState").finish_non_exhaustive()
    }
}

/// The folded items' samples carry no label of their own (the channel's comes with the registry).
const NO_LABELS: [(&str, &str); 0] = [];

/// One family of a single unlabelled (but for the channel) sample.
fn single(encoder: &mut DescriptorEncoder, name: &str, help: &str, metric: &impl EncodeMetric) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for AgentState {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let agent = &self.0;
        let mut items = agent.items();
        items.sort_by(|a, b| a.item_id.cmp(&b.item_id));
        // The pools are the channel's, shared by its replicas: the leading replica reports
        // them, from the snapshots its rebalancer and heartbeats read (no store call here).
        let leading = agent.is_leading();
        let max_events = agent.settings.outbox_max_events;
        let (shown, folded) = split(&items, agent.settings.metrics_per_item_limit, max_events);
        single(
            &mut encoder,
            "inventory_agent_metrics_folded_items",
            "Items whose series are summed into the series without the item label (more items than --metrics-per-item-limit).",
            &ConstGauge::new(folded.len() as u64),
        )?;
        {
            let mut family = encoder.encode_descriptor(
                "inventory_agent_pool_units",
                "Units in the channel's pool, by state (without the item label: the folded items' sum).",
                None,
                MetricType::Gauge,
            )?;
            let mut sums = [0u64; 3];
            for (item, show) in shown.iter().map(|i| (i, true)).chain(folded.iter().map(|i| (i, false))) {
                let Some(s) = item.last_snapshot().filter(|_| leading) else { continue };
                for (n, (state, v)) in
                    [("available", s.available), ("reserved", s.reserved), ("sold", s.sold)].into_iter().enumerate()
                {
                    if show {
                        let labels = [("item", item.item_id.as_str()), ("state", state)];
                        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
                    } else {
                        sums[n] += v;
                    }
                }
            }
            if leading && !folded.is_empty() {
                for (state, v) in ["available", "reserved", "sold"].into_iter().zip(sums) {
                    ConstGauge::new(v).encode(family.encode_family(&[("state", state)])?)?;
                }
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "inventory_agent_segment_available_units",
                "Available units in each segment of a segmented item's pool (as last read; shown items only).",
                None,
                MetricType::Gauge,
            )?;
            for item in shown.iter().filter(|i| leading && i.is_segmented()) {
                for (segment, v) in item.segment_available().into_iter().enumerate() {
                    let segment = segment.to_string();
                    let labels = [("item", item.item_id.as_str()), ("segment", segment.as_str())];
                    ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        {
            // Only lost segments have samples, so this family stays small whatever the items.
            let mut family = encoder.encode_descriptor(
                "inventory_agent_segment_lost",
                "1 for each segment of a segmented item's pool the store lost (its buyers wait, its units in doubt until resolved).",
                None,
                MetricType::Gauge,
            )?;
            for item in items.iter().filter(|i| leading && i.is_segmented()) {
                for segment in item.lost_segments() {
                    let segment = segment.to_string();
                    let labels = [("item", item.item_id.as_str()), ("segment", segment.as_str())];
                    ConstGauge::new(1u64).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        {
            let now = crate::clock::now_ms();
            let rate_of = |i: &Arc<Item>| i.rate_and_batch(now);
            let per_sec = |rate: u64| {
                #[allow(clippy::cast_precision_loss)] // a rate far below 2^52
                let r = rate as f64 / 1000.0;
                r
            };
            let rates: Vec<_> = shown.iter().filter(|_| leading).map(|i| (i, rate_of(i))).collect();
            {
                let mut family = encoder.encode_descriptor(
                    "inventory_agent_pool_sell_rate",
                    "The pool's recent sell rate (units reserved per second, an average with a half-life; without the item label: the folded items' sum).",
                    None,
                    MetricType::Gauge,
                )?;
                for (item, (rate, _)) in &rates {
                    let labels = [("item", item.item_id.as_str())];
                    ConstGauge::new(per_sec(*rate)).encode(family.encode_family(&labels)?)?;
                }
                if leading && !folded.is_empty() {
                    let sum: u64 = folded.iter().map(|i| rate_of(i).0).sum();
                    ConstGauge::new(per_sec(sum)).encode(family.encode_family(&NO_LABELS)?)?;
                }
            }
            let mut family = encoder.encode_descriptor(
                "inventory_agent_pool_batch_units",
                "The batch the pool borrows now: about target_ms of its sales when the item's batches follow the rate (shown items only).",
                None,
                MetricType::Gauge,
            )?;
            for (item, (_, batch)) in &rates {
                ConstGauge::new(*batch).encode(family.encode_family(&[("item", item.item_id.as_str())])?)?;
            }
        }
        let folded_outbox: Vec<_> = folded.iter().filter(|_| leading).filter_map(|i| i.outbox_stats()).collect();
        {
            let mut family = encoder.encode_descriptor(
                "inventory_agent_outbox_events",
                "Reservation events kept in the pool's outbox (at most inventory_agent_outbox_max_events; a segmented pool's fullest segment; without the item label: the fullest folded pool).",
                None,
                MetricType::Gauge,
            )?;
            for item in shown.iter().filter(|_| leading) {
                let Some(s) = item.outbox_stats() else { continue };
                ConstGauge::new(s.kept).encode(family.encode_family(&[("item", item.item_id.as_str())])?)?;
            }
            if let Some(kept) = folded_outbox.iter().map(|s| s.kept).max() {
                ConstGauge::new(kept).encode(family.encode_family(&NO_LABELS)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "inventory_agent_outbox_events_dropped",
                "Reservation events the outbox bound dropped before anyone read them, since the pool was created.",
                None,
                MetricType::Counter,
            )?;
            for item in shown.iter().filter(|_| leading) {
                let Some(s) = item.outbox_stats() else { continue };
                ConstCounter::new(s.dropped).encode(family.encode_family(&[("item", item.item_id.as_str())])?)?;
            }
            if !folded_outbox.is_empty() {
                let dropped: u64 = folded_outbox.iter().map(|s| s.dropped).sum();
                ConstCounter::new(dropped).encode(family.encode_family(&NO_LABELS)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "inventory_agent_pool_frozen",
                "1 while selling is frozen because the pool store lost the pool (without the item label: how many folded pools are).",
                None,
                MetricType::Gauge,
            )?;
            for item in &shown {
                let frozen = u64::from(item.mode() == Mode::Lost);
                ConstGauge::new(frozen).encode(family.encode_family(&[("item", item.item_id.as_str())])?)?;
            }
            if !folded.is_empty() {
                let frozen = folded.iter().filter(|i| i.mode() == Mode::Lost).count() as u64;
                ConstGauge::new(frozen).encode(family.encode_family(&NO_LABELS)?)?;
            }
        }
        for (name, help, v) in [
            (
                "inventory_agent_rate_limited",
                "Acquire calls refused by the per-user rate limit.",
                agent.selling.rate_limited.load(Ordering::Relaxed),
            ),
            (
                "inventory_agent_center_unanswered_calls",
                "Calls (attempts) to the center that got no answer.",
                agent.link.unanswered(),
            ),
            ("inventory_agent_item_lookups", "DescribeItem calls made to load items.", agent.items.lookups_made()),
            (
                "inventory_agent_item_lookups_refused",
                "Item loads refused by the bound on lookups per second.",
                agent.items.lookups_refused(),
            ),
            (
                "inventory_agent_center_credential_refusals",
                "Calls the center refused for this agent's credentials.",
                agent.link.credential_refusals(),
            ),
        ] {
            single(&mut encoder, name, help, &ConstCounter::new(v))?;
        }
        for (name, help, v) in [
            ("inventory_agent_epoch", "The channel epoch this agent registered with.", agent.link.epoch()),
            (
                "inventory_agent_outbox_max_events",
                "The outbox bound per pool: past it the oldest events are dropped.",
                agent.settings.outbox_max_events,
            ),
            ("inventory_agent_leading", "1 while this replica leads its channel.", u64::from(leading)),
            ("inventory_agent_draining", "1 while the agent drains (no new acquires).", u64::from(agent.is_draining())),
            (
                "inventory_agent_lease_valid",
                "1 while the agent's lease with the center is valid (it sells only then).",
                u64::from(agent.link.lease_valid()),
            ),
            (
                "inventory_agent_center_credentials_refused",
                "1 while the center refuses this agent's credentials (a configuration error).",
                u64::from(agent.link.credentials_refused()),
            ),
            (
                "inventory_agent_center_reachable",
                "1 unless the last calls to the center (3 in a row) got no answer.",
                u64::from(agent.link.reachable()),
            ),
        ] {
            single(&mut encoder, name, help, &ConstGauge::new(v))?;
        }
        Ok(())
    }
}

/// With more items than `limit`, at most `limit` keep series labelled with their id: those
/// an alert looks at first (a frozen pool, a lost segment, an empty shelf, an outbox past
/// 80 % of its bound or that dropped events), in item order; the rest are folded into
/// series without the item label, as Prometheus users expect of a high-cardinality label.
fn split(items: &[Arc<Item>], limit: usize, max_events: u64) -> (Vec<&Arc<Item>>, Vec<&Arc<Item>>) {
    if items.len() <= limit {
        return (items.iter().collect(), Vec::new());
    }
    let needs_attention = |i: &Arc<Item>| {
        i.mode() == Mode::Lost
            || (i.is_segmented() && !i.lost_segments().is_empty())
            || i.last_snapshot().is_some_and(|s| s.available == 0)
            || i.outbox_stats()
                .is_some_and(|s| s.dropped > 0 || s.kept.saturating_mul(5) > max_events.saturating_mul(4))
    };
    let (mut shown, mut folded) = (Vec::with_capacity(limit), Vec::with_capacity(items.len()));
    for item in items {
        if shown.len() < limit && needs_attention(item) {
            shown.push(item);
        } else {
            folded.push(item);
        }
    }
    (shown, folded)
}
