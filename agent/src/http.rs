//! The HTTP side port: `/healthz` and Prometheus text on `/metrics`.

use std::fmt::Write;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::agent::Agent;

pub fn router(agent: Arc<Agent>) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route("/metrics", get(metrics)).with_state(agent)
}

async fn metrics(State(agent): State<Arc<Agent>>) -> impl IntoResponse {
    let channel = agent.link.channel.to_string();
    let mut out = String::new();
    agent.metrics.render(&mut out, &channel);
    let _ = writeln!(out, "# HELP inventory_agent_pool_units Units in the channel's pool, by state.");
    let _ = writeln!(out, "# TYPE inventory_agent_pool_units gauge");
    for item in agent.items() {
        if let Ok(s) = agent.store.snapshot(&item.pool).await {
            for (state, v) in [("available", s.available), ("reserved", s.reserved), ("sold", s.sold)] {
                let _ = writeln!(
                    out,
                    "inventory_agent_pool_units{{channel=\"{channel}\",item=\"{}\",state=\"{state}\"}} {v}",
                    item.item_id
                );
            }
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
