//! Figure (ii) of the suite: center Borrow calls per 1,000 acquires with fixed batches and
//! with batches that follow the sell rate, at a slow and a fast sell rate, and the units
//! the pool holds unsold at the end (stock parked in the channel).
//!
//! Each cell is a fresh item sold on the memory-store agent at a steady open-loop rate for
//! the run's measuring time; the Borrow calls are the agent's own count over the cell (the
//! other items are idle meanwhile).

use std::time::{Duration, Instant};

use anyhow::Context;
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient;
use serde::Serialize;
use tonic::transport::Channel;

use crate::env::{AgentHandle, CenterHandle};

/// Stock of each cell's item: plenty, so the batch is the only limit. Its default fixed
/// batch is the capped 5% (500).
const STOCK: u64 = 1_000_000;
/// The two sell rates, acquires per second.
pub const RATES: [u64; 2] = [50, 2_000];
/// Calls are fired in slices of this period (open loop).
const SLICE: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Serialize)]
pub struct BatchingFigure {
    /// "fixed" or "rate".
    pub batches: &'static str,
    /// Acquires asked per second.
    pub sell_rate: u64,
    pub acquires: u64,
    pub borrows: u64,
    pub borrows_per_1000: f64,
    /// Units available in the pool when the cell ended: parked in the channel.
    pub pool_available_at_end: u64,
}

/// Measures every cell, each for `duration`.
pub async fn measure(
    center: &CenterHandle,
    agent: &AgentHandle,
    duration: Duration,
) -> anyhow::Result<Vec<BatchingFigure>> {
    let mut admin = AdminClient::connect(center.url.clone()).await.context("connect admin")?;
    let client = AgentClient::connect(agent.url.clone()).await.context("connect agent")?;
    let mut figures = Vec::new();
    for rate in RATES {
        for following in [false, true] {
            let batches = if following { "rate" } else { "fixed" };
            let item = format!("bench-batching-{batches}-{rate}");
            admin
                .create_item(pb::CreateItemRequest {
                    item_id: item.clone(),
                    total: STOCK,
                    per_user_limit: 1,
                    reservation_ttl_ms: 300_000,
                    watermarks: None,
                    rate_batching: Some(pb::RateBatching { enabled: following, ..Default::default() }),
                    segments: 1,
                    ..Default::default()
                })
                .await
                .with_context(|| format!("create {item}"))?;
            let before = agent.agent.metrics.borrow_calls();
            let acquires = sell(&client, &item, rate, duration).await?;
            let borrows = agent.agent.metrics.borrow_calls() - before;
            let stock = client
                .clone()
                .get_stock(pb::GetStockRequest { item_id: item.clone() })
                .await
                .with_context(|| format!("get stock of {item}"))?
                .into_inner();
            figures.push(BatchingFigure {
                batches,
                sell_rate: rate,
                acquires,
                borrows,
                borrows_per_1000: borrows as f64 * 1_000.0 / acquires.max(1) as f64,
                pool_available_at_end: stock.available,
            });
        }
    }
    Ok(figures)
}

/// Acquires `rate` a second for `duration`, open loop; returns how many reserved.
async fn sell(client: &AgentClient<Channel>, item: &str, rate: u64, duration: Duration) -> anyhow::Result<u64> {
    let began = Instant::now();
    let mut tick = tokio::time::interval(SLICE);
    let (mut sent, mut reserved) = (0u64, 0u64);
    while began.elapsed() < duration {
        tick.tick().await;
        // Calls due by now at `rate`, fired together.
        let due = u64::try_from(began.elapsed().as_millis() * u128::from(rate) / 1_000).unwrap_or(u64::MAX);
        let mut calls = tokio::task::JoinSet::new();
        for n in sent..due.max(sent) {
            let mut c = client.clone();
            let key = format!("{item}-{n}");
            let req = pb::AcquireRequest {
                item_id: item.to_owned(),
                user_id: key.clone(),
                quantity: 1,
                idempotency_key: key,
                ..Default::default()
            };
            calls.spawn(async move {
                c.acquire(req).await.map(|r| r.into_inner().outcome == pb::AcquireOutcome::Reserved as i32)
            });
        }
        while let Some(r) = calls.join_next().await {
            reserved += u64::from(r.context("acquire task")?.context("acquire")?);
        }
        sent = due.max(sent);
    }
    Ok(reserved)
}

pub fn render(figures: &[BatchingFigure]) -> String {
    if figures.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "(ii) center Borrow calls per 1,000 acquires, fixed vs rate-following batches (memory-store agent)\n",
    );
    out.push_str(&format!(
        "{:<8} {:>10} {:>9} {:>8} {:>16} {:>22}\n",
        "batches", "sells/s", "acquires", "borrows", "per 1,000", "pool available at end"
    ));
    for f in figures {
        out.push_str(&format!(
            "{:<8} {:>10} {:>9} {:>8} {:>16.1} {:>22}\n",
            f.batches, f.sell_rate, f.acquires, f.borrows, f.borrows_per_1000, f.pool_available_at_end
        ));
    }
    out
}
