//! The HTTP side port: `/healthz` and Prometheus text on `/metrics`.

use std::fmt::Write;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use inventory_core::ItemId;

use crate::store::LedgerStore;

pub fn router(store: Arc<dyn LedgerStore>) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route("/metrics", get(metrics)).with_state(store)
}

async fn metrics(State(store): State<Arc<dyn LedgerStore>>) -> impl IntoResponse {
    match render(store.as_ref()).await {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "metrics: ledger unreadable");
            (StatusCode::SERVICE_UNAVAILABLE, "ledger unavailable\n").into_response()
        }
    }
}

async fn render(store: &dyn LedgerStore) -> Result<String, crate::error::CenterError> {
    let mut out = String::new();
    let items = store.list_items().await?;
    let _ = writeln!(out, "# HELP inventory_center_item_total_units Units of the item in existence.");
    let _ = writeln!(out, "# TYPE inventory_center_item_total_units gauge");
    for i in &items {
        let _ = writeln!(out, "inventory_center_item_total_units{{item=\"{}\"}} {}", i.item_id, i.state.total);
    }
    let _ = writeln!(out, "# HELP inventory_center_available_units Units at the center, not held by any channel.");
    let _ = writeln!(out, "# TYPE inventory_center_available_units gauge");
    for i in &items {
        let _ = writeln!(out, "inventory_center_available_units{{item=\"{}\"}} {}", i.item_id, i.state.available);
    }
    let mut held = String::new();
    let mut drift = String::new();
    for i in &items {
        // Item ids are validated to [A-Za-z0-9._:-], safe inside label quotes.
        let Ok(id) = ItemId::parse("item_id", &i.item_id) else { continue };
        for c in store.item_ledger(&id).await?.channels {
            let labels = format!("item=\"{}\",channel=\"{}\"", i.item_id, c.channel);
            let _ = writeln!(held, "inventory_center_held_units{{{labels}}} {}", c.allocation.held());
            let _ = writeln!(drift, "inventory_center_channel_drift_units{{{labels}}} {}", c.allocation.drift());
        }
    }
    let _ = writeln!(out, "# HELP inventory_center_held_units Units the center regards as out with a channel.");
    let _ = writeln!(out, "# TYPE inventory_center_held_units gauge");
    out.push_str(&held);
    let _ = writeln!(out, "# HELP inventory_center_channel_drift_units Held minus the channel's reported pool.");
    let _ = writeln!(out, "# TYPE inventory_center_channel_drift_units gauge");
    out.push_str(&drift);
    Ok(out)
}
