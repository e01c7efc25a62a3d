//! Figure (iii) of the suite: stocking many items through one agent. The center holds
//! `items` fresh items; an agent on the Redis store that has never seen them loads each (as
//! a buyer's first Acquire would, 32 at a time) and its rebalancer stocks every pool to its
//! low watermark. The figure is how long that takes and how many center calls it makes:
//! loads made while one is in flight go together as one DescribeItems, and the Borrows of
//! pools that need stock at once as one BorrowMany.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use inventory_core::ItemId;
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use serde::Serialize;
use tokio::runtime::Handle;

use crate::env::{AgentHandle, CenterHandle, Store};

/// Items of a full run and of `--quick`.
pub const ITEMS: usize = 10_000;
pub const QUICK_ITEMS: usize = 1_000;
/// Each item's stock and watermarks: small, so stocking is one Borrow's worth per pool.
const UNITS: u64 = 20;
const WATERMARKS: pb::Watermarks = pb::Watermarks { low: 2, high: 8, batch: 4 };
/// Items created at the center at a time, and loaded in the agent at a time.
const CREATES_AT_ONCE: usize = 16;
const LOADS_AT_ONCE: usize = 32;
/// The longest stocking may take before the figure is a failure.
const STOCK_LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Serialize)]
pub struct StockingFigure {
    pub items: usize,
    pub create_s: f64,
    /// From the first load to the last item known to the agent.
    pub load_s: f64,
    /// From the first load to every pool at or above its low watermark.
    pub stocked_s: f64,
    pub describe_items_calls: u64,
    pub borrow_many_calls: u64,
    pub borrow_calls: u64,
}

impl StockingFigure {
    pub fn center_calls(&self) -> u64 {
        self.describe_items_calls + self.borrow_many_calls + self.borrow_calls
    }
}

/// Creates `items` items at `center`, then measures a fresh Redis-store agent stocking them.
pub async fn measure(
    rt: &Handle,
    center: &CenterHandle,
    store: &Store,
    items: usize,
) -> anyhow::Result<StockingFigure> {
    let admin = AdminClient::connect(center.url.clone()).await.context("connect admin")?;
    let id = |i: usize| format!("bench-stock-{i:05}");
    let started = Instant::now();
    let created: Vec<anyhow::Result<()>> = futures::stream::iter(0..items)
        .map(|i| {
            let mut admin = admin.clone();
            async move {
                admin
                    .create_item(pb::CreateItemRequest {
                        item_id: id(i),
                        total: UNITS,
                        per_user_limit: 1,
                        reservation_ttl_ms: 300_000,
                        watermarks: Some(WATERMARKS),
                        rate_batching: Some(pb::RateBatching { enabled: false, ..Default::default() }),
                        segments: 1,
                        ..Default::default()
                    })
                    .await
                    .with_context(|| format!("create {}", id(i)))
                    .map(drop)
            }
        })
        .buffer_unordered(CREATES_AT_ONCE)
        .collect()
        .await;
    created.into_iter().collect::<anyhow::Result<()>>()?;
    let create_s = started.elapsed().as_secs_f64();

    let agent = AgentHandle::start_stocking(rt, &center.url, "stocking", store).await?;
    let figure = stock(&agent, items, &id).await;
    agent.stop("stocking agent").await;
    figure.map(|(load_s, stocked_s, calls)| StockingFigure {
        items,
        create_s,
        load_s,
        stocked_s,
        describe_items_calls: calls.0,
        borrow_many_calls: calls.1,
        borrow_calls: calls.2,
    })
}

type Calls = (u64, u64, u64);

async fn stock(agent: &AgentHandle, items: usize, id: &dyn Fn(usize) -> String) -> anyhow::Result<(f64, f64, Calls)> {
    let started = Instant::now();
    let loaded: Vec<anyhow::Result<()>> = futures::stream::iter(0..items)
        .map(|i| {
            let a = &agent.agent;
            let item = id(i);
            async move {
                let item = ItemId::parse("item_id", &item)?;
                // As a buyer would: try again while the agent answers UNAVAILABLE (the
                // center is busy granting the first pools' stock).
                let mut attempt = 0;
                loop {
                    match a.item(&item).await {
                        Ok(_) => return Ok(()),
                        Err(_) if attempt < 20 => attempt += 1,
                        Err(e) => return Err(anyhow::anyhow!("load {item}: {e}")),
                    }
                }
            }
        })
        .buffer_unordered(LOADS_AT_ONCE)
        .collect()
        .await;
    loaded.into_iter().collect::<anyhow::Result<()>>()?;
    let load_s = started.elapsed().as_secs_f64();
    let stocked = inventory_test_support::wait_until(STOCK_LIMIT, || async {
        agent.agent.items().iter().all(|i| i.last_snapshot().is_some_and(|s| s.available >= WATERMARKS.low))
    })
    .await;
    anyhow::ensure!(stocked, "not every pool was stocked within {STOCK_LIMIT:?}");
    let stocked_s = started.elapsed().as_secs_f64();
    let link = &agent.agent.link;
    Ok((load_s, stocked_s, (link.describe_many_calls(), link.borrow_many_calls(), link.borrow_calls())))
}

pub fn render(figure: Option<&StockingFigure>) -> String {
    let Some(f) = figure else { return String::new() };
    format!(
        "(iii) stocking {} items through one agent (Redis store; each item loaded as a buyer's first Acquire would, {} at a time)\n\
         create at the center {:.2} s; load in the agent {:.2} s; all pools stocked {:.2} s\n\
         center calls: {} DescribeItems + {} BorrowMany + {} Borrow = {} ({:.1} per 1,000 items)\n",
        crate::stats::fmt_rate(f.items as f64),
        LOADS_AT_ONCE,
        f.create_s,
        f.load_s,
        f.stocked_s,
        f.describe_items_calls,
        f.borrow_many_calls,
        f.borrow_calls,
        f.center_calls(),
        f.center_calls() as f64 * 1_000.0 / f.items.max(1) as f64
    )
}
