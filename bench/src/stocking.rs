//! Figure (iii) of the suite: stocking many items through one agent. The center holds
//! `items` fresh items; an agent on the Redis store that has never seen them loads each (as
//! a buyer's first Acquire would, 32 at a time) and its rebalancer stocks every pool to its
//! low watermark. The figure is how long that takes and how many center calls it makes:
//! loads made while one is in flight go together as one DescribeItems, and the Borrows of
//! pools that need stock at once as one BorrowMany.
//!
//! Once every pool is stocked, what a catalogue that large costs elsewhere: a full
//! heartbeat of every pool (the agent's read of its pools, the calls to the center),
//! `/metrics` of the agent and of the center (bounded by `--metrics-per-item-limit`), and
//! the center's console: the page, `/api/history`, and `/api/items` (a default page, and the
//! console's page of 100 items at the end of the catalogue).

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
pub const ITEMS: usize = 100_000;
pub const QUICK_ITEMS: usize = 1_000;
/// Each item's stock and watermarks: small, so stocking is one Borrow's worth per pool.
const UNITS: u64 = 20;
const WATERMARKS: pb::Watermarks = pb::Watermarks { low: 2, high: 8, batch: 4 };
/// Items created at the center at a time, and loaded in the agent at a time.
const CREATES_AT_ONCE: usize = 16;
const LOADS_AT_ONCE: usize = 32;
/// The longest stocking may take before the figure is a failure.
const STOCK_LIMIT: Duration = Duration::from_secs(300);
/// How long the stocked catalogue is left alone while its standing cost is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(6);
/// The longest the agent's stop may take: its drain reports every pool (a full heartbeat).
const STOP_LIMIT: Duration = Duration::from_secs(120);

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
    /// After stocking: a full heartbeat, scrapes and the console's reads.
    pub after: Option<AfterStocking>,
    /// The agent's stop: its drain gives every pool's units back and sends the last report.
    pub stop_s: f64,
}

/// What the stocked catalogue costs while nothing sells: the rebalancer's idle looks and
/// the periodic (quiet) heartbeats, CPU seconds per second of [`IDLE_WINDOW`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IdleCost {
    pub window_s: f64,
    pub redis_cpu_per_s: Option<f64>,
    pub servers_cpu_per_s: f64,
    pub postgres_cpu_per_s: f64,
    /// Script calls (EVALSHA) Redis ran a second, and the µs each took on average
    /// (`INFO commandstats`; the commands a script runs are counted within it).
    pub script_calls_per_s: Option<f64>,
    pub script_us_per_call: Option<f64>,
}

/// `cmdstat_evalsha`'s calls and µs in all, from `INFO commandstats`.
async fn script_stats(conn: &mut redis::aio::MultiplexedConnection) -> Option<(f64, f64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.ok()?;
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"))?;
    let get = |name: &str| {
        line.split([':', ',']).find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse::<f64>().ok())
    };
    Some((get("calls")?, get("usec")?))
}

/// What a catalogue of this size costs once stocked (seconds, bytes).
#[derive(Debug, Clone, Serialize)]
pub struct AfterStocking {
    /// The agent's read of every pool for a full report (what a registration sends).
    pub report_read_s: f64,
    pub heartbeat_pools: usize,
    pub heartbeat_bytes: usize,
    /// Heartbeat calls the report went in.
    pub heartbeat_calls: usize,
    /// The Heartbeat calls carrying every pool, one after another, until the center
    /// answered the last (or one failed).
    pub heartbeat_call_s: f64,
    /// The same full report as a registration or a drain sends it
    /// (`Reporting::send_all`): each call's part read while the part before it is sent.
    pub heartbeat_overlapped_s: f64,
    /// CPU the overlapped full report took, by process (background looks included).
    pub heartbeat_cpu: crate::sysinfo::CpuUse,
    pub heartbeat_error: Option<String>,
    /// The periodic heartbeat that follows (`Reporting::quiet`): each pool's stamp, whole
    /// reads of a share in turn and of what moved; the reports that changed, sent.
    pub quiet_read_s: f64,
    pub quiet_whole_reads: usize,
    pub quiet_pools: usize,
    pub quiet_call_s: f64,
    pub agent_scrape: Fetch,
    pub center_scrape: Fetch,
    pub console_page: Fetch,
    pub api_history: Fetch,
    /// `/api/items` as it is (its default page).
    pub api_items: Fetch,
    /// `/api/items?offset=…&limit=100`: the console's last page.
    pub api_items_page: Fetch,
    pub idle: IdleCost,
}

/// One GET: its time and body size.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fetch {
    pub s: f64,
    pub bytes: usize,
    pub status: u16,
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
    let after = match &figure {
        Ok(_) => {
            // A mark on stderr for whoever profiles the full heartbeat that follows.
            eprintln!("(iii) every pool stocked; the full heartbeat follows");
            Some(after_stocking(center, &agent, store, items).await)
        }
        Err(_) => None,
    };
    let started = Instant::now();
    agent.stop_within("stocking agent", STOP_LIMIT).await;
    let stop_s = started.elapsed().as_secs_f64();
    let after = after.transpose().context("after stocking")?;
    figure.map(|(load_s, stocked_s, calls)| StockingFigure {
        items,
        create_s,
        load_s,
        stocked_s,
        describe_items_calls: calls.0,
        borrow_many_calls: calls.1,
        borrow_calls: calls.2,
        after,
        stop_s,
    })
}

/// A connection to the store's Redis, for its CPU figures (none with the memory store).
async fn redis_conn(store: &Store) -> Option<redis::aio::MultiplexedConnection> {
    match store {
        Store::Redis { url, .. } => match redis::Client::open(url.as_str()) {
            Ok(c) => c.get_multiplexed_async_connection().await.ok(),
            Err(_) => None,
        },
        Store::Memory => None,
    }
}

/// The catalogue's standing cost: CPU over a window in which nothing sells.
async fn idle_cost(store: &Store) -> IdleCost {
    let mut conn = redis_conn(store).await;
    let scripts_before = match conn.as_mut() {
        Some(c) => script_stats(c).await,
        None => None,
    };
    let before = crate::sysinfo::CpuSnapshot::take(conn.as_mut()).await;
    tokio::time::sleep(IDLE_WINDOW).await;
    let used = crate::sysinfo::CpuSnapshot::take(conn.as_mut()).await.since(&before);
    let scripts_after = match conn.as_mut() {
        Some(c) => script_stats(c).await,
        None => None,
    };
    let scripts = scripts_before.zip(scripts_after).map(|((c0, u0), (c1, u1))| (c1 - c0, u1 - u0));
    let per_s = |cpu: f64| cpu / used.wall_s.max(1e-9);
    IdleCost {
        window_s: used.wall_s,
        redis_cpu_per_s: used.redis_s.map(per_s),
        servers_cpu_per_s: per_s(used.servers_s),
        postgres_cpu_per_s: per_s(used.postgres_s),
        script_calls_per_s: scripts.map(|(calls, _)| per_s(calls)),
        script_us_per_call: scripts.and_then(|(calls, us)| (calls > 0.0).then(|| us / calls)),
    }
}

async fn after_stocking(
    center: &CenterHandle,
    agent: &AgentHandle,
    store: &Store,
    items: usize,
) -> anyhow::Result<AfterStocking> {
    use inventory_agent::reporting::{MAX_POOLS_PER_CALL, parts};
    use prost::Message;
    let reporting = &agent.agent.reporting;
    let started = Instant::now();
    let full = reporting.all().await;
    let report_read_s = started.elapsed().as_secs_f64();
    let heartbeat_pools = full.len();
    let heartbeat_bytes =
        pb::HeartbeatRequest { channel: "stocking".into(), epoch: 1, pools: full.to_pb(), last_report: false }
            .encoded_len();
    let heartbeat_calls = parts(heartbeat_pools, MAX_POOLS_PER_CALL, false).len();
    // As a registration sends it: in parts of at most MAX_POOLS_PER_CALL pools.
    let started = Instant::now();
    let heartbeat_error = reporting.send(full, false).await.err().map(|e| e.to_string());
    let heartbeat_call_s = started.elapsed().as_secs_f64();
    let mut conn = redis_conn(store).await;
    let before = crate::sysinfo::CpuSnapshot::take(conn.as_mut()).await;
    let started = Instant::now();
    let overlapped_error = reporting.send_all(false).await.err().map(|e| e.to_string());
    let heartbeat_overlapped_s = started.elapsed().as_secs_f64();
    let heartbeat_cpu = crate::sysinfo::CpuSnapshot::take(conn.as_mut()).await.since(&before);
    // The next periodic heartbeat, as the agent's heartbeat task runs it.
    let period = Duration::from_millis((agent.agent.link.lease_ttl_ms() / 3).max(100));
    let period_ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
    let quiet_whole_reads = inventory_core::channel::full_reads_per_heartbeat(
        items,
        period_ms,
        agent.agent.items.settings().full_read_every_ms,
    );
    let started = Instant::now();
    let quiet = reporting.quiet(period).await;
    let quiet_read_s = started.elapsed().as_secs_f64();
    let quiet_pools = quiet.len();
    let started = Instant::now();
    let quiet_error = reporting.send(quiet, false).await.err().map(|e| e.to_string());
    let quiet_call_s = started.elapsed().as_secs_f64();
    let last_page = format!("/api/items?offset={}&limit=100", items.saturating_sub(100));
    Ok(AfterStocking {
        report_read_s,
        heartbeat_pools,
        heartbeat_bytes,
        heartbeat_calls,
        heartbeat_call_s,
        heartbeat_overlapped_s,
        heartbeat_cpu,
        heartbeat_error: heartbeat_error.or(overlapped_error).or(quiet_error),
        quiet_read_s,
        quiet_whole_reads,
        quiet_pools,
        quiet_call_s,
        agent_scrape: get(agent.http, "/metrics").await?,
        center_scrape: get(center.http, "/metrics").await?,
        console_page: get(center.http, "/").await?,
        api_history: get(center.http, "/api/history").await?,
        api_items: get(center.http, "/api/items").await?,
        api_items_page: get(center.http, &last_page).await?,
        idle: idle_cost(store).await,
    })
}

/// A plain HTTP/1.1 GET on loopback, timed from the connect to the last byte.
async fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<Fetch> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connect {addr}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let s = started.elapsed().as_secs_f64();
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").context("an HTTP response")?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("a status code")?;
    // Chunked bodies count their chunk headers too: a few bytes per chunk.
    Ok(Fetch { s, bytes: raw.len() - head_end - 4, status })
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
    // Only the pools not yet stocked are looked at again: a check of every pool every few
    // milliseconds would take a good share of the CPU the figure measures.
    let pending = std::sync::Mutex::new(agent.agent.items());
    let stocked = inventory_test_support::wait_until(STOCK_LIMIT, || async {
        let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|i| i.last_snapshot().is_none_or(|s| s.available < WATERMARKS.low));
        pending.is_empty()
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
    ) + &f.after.as_ref().map(render_after).unwrap_or_default()
        + &if f.stop_s < STOP_LIMIT.as_secs_f64() {
            format!("the agent's stop (every pool given back, the last report sent) {:.2} s\n", f.stop_s)
        } else {
            format!("the agent's stop (every pool given back, the last report sent) not done within {STOP_LIMIT:?}\n")
        }
}

/// CPU by process over a report of `pools` pools, and per pool.
fn cpu_per_pool(cpu: &crate::sysinfo::CpuUse, pools: usize) -> String {
    let us = |s: f64| s * 1e6 / pools.max(1) as f64;
    let redis =
        cpu.redis_s.map(|r| format!("Redis {r:.2} s, {:.1} µs", us(r))).unwrap_or_else(|| "Redis unread".into());
    format!(
        "CPU: {redis}; servers {:.2} s, {:.1} µs; PostgreSQL {:.2} s, {:.1} µs a pool",
        cpu.servers_s,
        us(cpu.servers_s),
        cpu.postgres_s,
        us(cpu.postgres_s)
    )
}

fn render_after(a: &AfterStocking) -> String {
    let kb = |b: usize| b as f64 / 1024.0;
    let fetch =
        |what: &str, f: &Fetch| format!("{what} {:.1} ms, {:.1} KiB (HTTP {})", f.s * 1e3, kb(f.bytes), f.status);
    format!(
        "full heartbeat of {} pools: read {:.2} s, {:.1} KiB, {} call(s) {:.2} s; \
         read and sent together {:.2} s ({}){}\n\
         quiet heartbeat after it: read {:.2} s (every stamp, {} pools whole in turn), {} changed, sent in {:.2} s\n\
         {}; {}\n\
         console: {}; {}; {}; {}\n\
         idle for {:.1} s (looks and quiet heartbeats, nothing sold): Redis {}, servers {:.0} ms, PostgreSQL {:.0} ms of CPU a second; {}\n",
        a.heartbeat_pools,
        a.report_read_s,
        kb(a.heartbeat_bytes),
        a.heartbeat_calls,
        a.heartbeat_call_s,
        a.heartbeat_overlapped_s,
        cpu_per_pool(&a.heartbeat_cpu, a.heartbeat_pools),
        a.heartbeat_error.as_ref().map(|e| format!(" (failed: {e})")).unwrap_or_default(),
        a.quiet_read_s,
        a.quiet_whole_reads,
        a.quiet_pools,
        a.quiet_call_s,
        fetch("agent /metrics", &a.agent_scrape),
        fetch("center /metrics", &a.center_scrape),
        fetch("page", &a.console_page),
        fetch("/api/history", &a.api_history),
        fetch("/api/items", &a.api_items),
        fetch("its last page of 100", &a.api_items_page),
        a.idle.window_s,
        a.idle.redis_cpu_per_s.map(|r| format!("{:.0} ms", r * 1e3)).unwrap_or_else(|| "unread".into()),
        a.idle.servers_cpu_per_s * 1e3,
        a.idle.postgres_cpu_per_s * 1e3,
        match (a.idle.script_calls_per_s, a.idle.script_us_per_call) {
            (Some(calls), Some(us)) => format!("{calls:.0} script calls a second, {us:.0} µs each in Redis"),
            _ => "script calls unread".to_owned(),
        },
    )
}

#[derive(Debug, Clone, clap::Args)]
pub struct StockingArgs {
    /// Items to create and stock (default 100,000; 1,000 with --quick).
    #[arg(long)]
    pub items: Option<usize>,
    #[arg(long)]
    pub quick: bool,
}

/// The figure alone: a center on a fresh PostgreSQL database, an agent on Redis under a
/// fresh key prefix (removed afterwards).
pub async fn run_alone(args: StockingArgs, rt: Handle) -> anyhow::Result<bool> {
    let items = args.items.unwrap_or(if args.quick { QUICK_ITEMS } else { ITEMS });
    let (redis, mut conn) = crate::env::BenchRedis::connect().await?;
    let db = crate::env::BenchDatabase::create().await?;
    let result = async {
        let center = CenterHandle::start(&rt, &db.url).await?;
        let store = Store::Redis { url: redis.url.clone(), prefix: redis.prefix.clone(), tuning: Default::default() };
        let figure = measure(&rt, &center, &store, items).await;
        center.stop().await;
        figure
    }
    .await;
    db.drop_database().await;
    redis.delete_keys(&mut conn).await;
    println!("{}", render(Some(&result?)));
    Ok(true)
}
