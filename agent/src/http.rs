//! The HTTP side port: `/healthz` and Prometheus text on `/metrics`.
//!
//! Counters come from [`crate::metrics::Metrics`] (atomics bumped on the hot path); the
//! pool gauges from the last snapshot of each pool the agent read (rebalancer, heartbeat),
//! so a scrape never calls the pool store, however many items there are.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::agent::Agent;
use inventory_core::channel::Mode;

pub fn router(agent: Arc<Agent>) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/metrics", get(metrics)).with_state(agent)
}

/// Not ready while the center refuses the agent's credentials: it cannot sell, and no
/// amount of waiting fixes that.
async fn healthz(State(agent): State<Arc<Agent>>) -> impl IntoResponse {
    if agent.link.credentials_refused() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: the center refuses this agent's credentials\n");
    }
    (StatusCode::OK, "ok\n")
}

async fn metrics(State(agent): State<Arc<Agent>>) -> impl IntoResponse {
    // Channel and item ids are validated to [A-Za-z0-9._:-]: safe inside label quotes.
    let channel = agent.link.channel.to_string();
    let mut out = String::new();
    agent.metrics.render(&mut out, &channel);

    let mut items = agent.items();
    items.sort_by(|a, b| a.item_id.cmp(&b.item_id));
    let mut pools = String::new();
    let mut frozen = String::new();
    // The pools are the channel's, shared by its replicas: the leading replica reports
    // them, from the snapshots its rebalancer and heartbeats read (no store call here).
    let leading = agent.is_leading();
    for item in &items {
        let id = &item.item_id;
        if let Some(s) = item.last_snapshot().filter(|_| leading) {
            for (state, v) in [("available", s.available), ("reserved", s.reserved), ("sold", s.sold)] {
                let _ = writeln!(
                    pools,
                    "inventory_agent_pool_units{{channel=\"{channel}\",item=\"{id}\",state=\"{state}\"}} {v}"
                );
            }
        }
        let f = u8::from(item.mode() == Mode::Lost);
        let _ = writeln!(frozen, "inventory_agent_pool_frozen{{channel=\"{channel}\",item=\"{id}\"}} {f}");
    }
    let _ = writeln!(out, "# HELP inventory_agent_pool_units Units in the channel's pool, by state.");
    let _ = writeln!(out, "# TYPE inventory_agent_pool_units gauge");
    out.push_str(&pools);
    let _ = writeln!(
        out,
        "# HELP inventory_agent_pool_frozen 1 while selling is frozen because the pool store lost the pool."
    );
    let _ = writeln!(out, "# TYPE inventory_agent_pool_frozen gauge");
    out.push_str(&frozen);
    let name = "inventory_agent_rate_limited_total";
    let _ = writeln!(out, "# HELP {name} Acquire calls refused by the per-user rate limit.");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name}{{channel=\"{channel}\"}} {}", agent.selling.rate_limited.load(Ordering::Relaxed));
    for (name, help, v) in [
        (
            "inventory_agent_center_unanswered_calls_total",
            "Calls (attempts) to the center that got no answer.",
            agent.link.unanswered(),
        ),
        ("inventory_agent_item_lookups_total", "DescribeItem calls made to load items.", agent.items.lookups_made()),
        (
            "inventory_agent_item_lookups_refused_total",
            "Item loads refused by the bound on lookups per second.",
            agent.items.lookups_refused(),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(out, "{name}{{channel=\"{channel}\"}} {v}");
    }
    let name = "inventory_agent_center_credential_refusals_total";
    let _ = writeln!(out, "# HELP {name} Calls the center refused for this agent's credentials.");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name}{{channel=\"{channel}\"}} {}", agent.link.credential_refusals());
    for (name, help, v) in [
        ("inventory_agent_epoch", "The channel epoch this agent registered with.", agent.link.epoch()),
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
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{channel=\"{channel}\"}} {v}");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
