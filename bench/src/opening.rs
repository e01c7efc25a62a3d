//! Figure (iv) of the suite: the opening second. One item over three channels' agents on
//! the Redis store, bought by the suite's steady callers and a burst of a thousand callers
//! at once, each asking for one unit with a fresh key until the item is sold out. Two runs
//! in the same suite:
//!
//! - *scheduled*: the item is created with an opening a few seconds ahead and a prestock
//!   lead; the agents learn of it from the center, stock their pools during the lead, and
//!   the callers start before the opening (NOT_STARTED until then);
//! - *unscheduled*: the same item created at the moment the callers start (the behaviour
//!   without a plan: the agents load the item at the first Acquire and stock it by Borrows
//!   made under the burst).
//!
//! Each run measures, from the opening: the time until the last unit is reserved, the
//! answers' p50/p99 in the first second, the agents' center calls (Borrow, Return and item
//! loads) in the first second and before 90 % of the units were sold, the units on the
//! shelves at the opening, units sold (all of them) and oversold (none). A fresh database
//! and center of its own, so no other figure's channels share the item's allocation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use hdrhistogram::Histogram;
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient;
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::Mutex;
use tonic::transport::Channel;

use crate::env::{AgentHandle, BenchDatabase, CenterHandle, Store, channels};
use crate::stats::{Summary, new_histogram};

/// The item's stock in a full run and with `--quick`.
pub const UNITS: u64 = 5_000;
pub const QUICK_UNITS: u64 = 1_000;
/// Concurrent callers: the suite's usual closed loop, and the burst.
const STEADY_CALLERS: usize = 50;
const BURST_CALLERS: usize = 1_000;
/// The scheduled item opens this long after it is created; its agents stock during the lead.
const OPENS_AFTER: Duration = Duration::from_secs(4);
const PRESTOCK_LEAD_MS: u64 = 3_000;
/// The callers start this long before the opening.
const CALLERS_EARLY: Duration = Duration::from_millis(500);
/// A retry-later answer is asked again after this pause.
const RETRY_PAUSE: Duration = Duration::from_millis(5);
/// A NOT_STARTED answer is asked again at the opening it names, or after this long if
/// that is later (a refreshing crowd: about 10,000 calls a second from 1,050 callers),
/// each caller a few ms apart.
const REFRESH_PAUSE: Duration = Duration::from_millis(100);
/// A caller that heard SOLD_OUT asks again after this pause while units may still be
/// moving between the channels and the center.
const SOLD_OUT_PAUSE: Duration = Duration::from_millis(20);
/// The longest a run may take before it is a failure.
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// gRPC connections per agent.
const CONNECTIONS: usize = 4;
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize)]
pub struct OpeningRun {
    pub scheduled: bool,
    pub units: u64,
    /// Units on the three pools' shelves at the opening (as the agents last read them).
    pub stocked_at_opening: u64,
    /// From the opening to the answer that reserved the last unit.
    pub sold_out_s: Option<f64>,
    /// Answers received in the first second after the opening, and their latency.
    pub first_second: Summary,
    /// Center calls by the agents (Borrow + Return + item loads) in the first second.
    pub center_calls_first_second: u64,
    /// Center calls from the opening until 90 % of the units were reserved.
    pub center_calls_before_90pct: Option<u64>,
    /// From the opening to the end of the run, by kind: Borrow (and BorrowMany), Return,
    /// item loads (DescribeItems).
    pub borrows_after_opening: u64,
    pub returns_after_opening: u64,
    pub describes_after_opening: u64,
    pub not_started_answers: u64,
    pub sold: u64,
    pub oversold: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OpeningFigure {
    pub scheduled: OpeningRun,
    pub unscheduled: OpeningRun,
}

#[derive(Debug, Clone, clap::Args)]
pub struct OpeningArgs {
    /// 1,000 units instead of 5,000.
    #[arg(long)]
    pub quick: bool,
}

/// The figure alone, under a fresh Redis key prefix removed afterwards. False when a run
/// sold more than the stock or not all of it.
pub async fn run_alone(args: OpeningArgs, rt: Handle) -> anyhow::Result<bool> {
    let (redis, mut conn) = crate::env::BenchRedis::connect().await?;
    let figure = measure(&rt, &redis.url, &redis.prefix, args.quick).await;
    redis.delete_keys(&mut conn).await;
    let figure = figure?;
    println!("{}", render(Some(&figure)));
    Ok([&figure.scheduled, &figure.unscheduled].iter().all(|r| r.oversold == 0 && r.sold == r.units))
}

/// Both runs against a center on a fresh database and agents on `redis` (URL, key prefix).
pub async fn measure(rt: &Handle, redis_url: &str, redis_prefix: &str, quick: bool) -> anyhow::Result<OpeningFigure> {
    let db = BenchDatabase::create().await?;
    let result = async {
        let center = CenterHandle::start(rt, &db.url).await?;
        let units = if quick { QUICK_UNITS } else { UNITS };
        let store =
            Store::Redis { url: redis_url.to_owned(), prefix: redis_prefix.to_owned(), tuning: Default::default() };
        // The scheduled run first: its channels' leases are the only live ones when its
        // allocation is split.
        let scheduled = run(rt, &center, &store, units, true).await.context("scheduled opening");
        let unscheduled = match &scheduled {
            Ok(_) => run(rt, &center, &store, units, false).await.context("unscheduled opening"),
            Err(_) => Err(anyhow::anyhow!("not run")),
        };
        center.stop().await;
        Ok(OpeningFigure { scheduled: scheduled?, unscheduled: unscheduled? })
    }
    .await;
    db.drop_database().await;
    result
}

fn unix_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What every caller of one run shares.
struct Shared {
    item: String,
    units: u64,
    opened: Instant,
    sold: AtomicU64,
    not_started: AtomicU64,
    done: AtomicBool,
    /// Time of the answer that reserved the last unit (µs after the opening).
    sold_out_us: AtomicU64,
    /// Center calls when 90 % were sold (+1; 0: not yet).
    calls_at_90: AtomicU64,
    agents: Vec<Arc<inventory_agent::agent::Agent>>,
    first_second: Mutex<Histogram<u64>>,
}

/// (Borrow + BorrowMany, Return, DescribeItems) calls the agents made so far.
fn calls_by_kind(agents: &[Arc<inventory_agent::agent::Agent>]) -> (u64, u64, u64) {
    agents.iter().fold((0, 0, 0), |(b, r, d), a| {
        (
            b + a.link.borrow_calls() + a.link.borrow_many_calls(),
            r + a.metrics.return_calls(),
            d + a.link.describe_many_calls(),
        )
    })
}

fn center_calls(agents: &[Arc<inventory_agent::agent::Agent>]) -> u64 {
    agents
        .iter()
        .map(|a| {
            a.link.borrow_calls() + a.link.borrow_many_calls() + a.metrics.return_calls() + a.link.describe_many_calls()
        })
        .sum()
}

async fn run(
    rt: &Handle,
    center: &CenterHandle,
    store: &Store,
    units: u64,
    scheduled: bool,
) -> anyhow::Result<OpeningRun> {
    let tag = if scheduled { "sched" } else { "now" };
    let item = format!("bench-opening-{tag}");
    let mut agents = Vec::new();
    for c in ["a", "b", "c"] {
        agents.push(AgentHandle::start(rt, &center.url, &format!("open-{tag}-{c}"), store).await?);
    }
    let mut clients = Vec::new();
    for a in &agents {
        for ch in channels(&a.url, CONNECTIONS).await? {
            clients.push(AgentClient::new(ch));
        }
    }
    let mut admin = AdminClient::connect(center.url.clone()).await.context("connect admin")?;
    let create = |opens_at_unix_ms: i64| pb::CreateItemRequest {
        item_id: item.clone(),
        total: units,
        per_user_limit: 1,
        reservation_ttl_ms: 300_000,
        segments: 1,
        opens_at_unix_ms,
        prestock_lead_ms: if opens_at_unix_ms > 0 { PRESTOCK_LEAD_MS } else { 0 },
        ..Default::default()
    };
    let opens_at = Instant::now() + OPENS_AFTER;
    let opened = if scheduled {
        admin
            .create_item(create(unix_ms() + i64::try_from(OPENS_AFTER.as_millis()).unwrap_or(0)))
            .await
            .context("create the item")?;
        tokio::time::sleep_until((opens_at - CALLERS_EARLY).into()).await;
        opens_at
    } else {
        admin.create_item(create(0)).await.context("create the item")?;
        Instant::now()
    };
    let handles: Vec<Arc<inventory_agent::agent::Agent>> = agents.iter().map(|a| a.agent.clone()).collect();
    let shared = Arc::new(Shared {
        item: item.clone(),
        units,
        opened,
        sold: AtomicU64::new(0),
        not_started: AtomicU64::new(0),
        done: AtomicBool::new(false),
        sold_out_us: AtomicU64::new(0),
        calls_at_90: AtomicU64::new(0),
        agents: handles.clone(),
        first_second: Mutex::new(new_histogram()),
    });
    let mut tasks = Vec::new();
    for i in 0..STEADY_CALLERS + BURST_CALLERS {
        let client = clients[i % clients.len()].clone();
        let shared = Arc::clone(&shared);
        tasks.push(tokio::spawn(caller(shared, client, i, i < STEADY_CALLERS)));
    }
    // The shelves and the center calls at the opening.
    tokio::time::sleep_until(opened.into()).await;
    let stocked_at_opening: u64 = handles
        .iter()
        .filter_map(|a| a.items().into_iter().find(|i| i.item_id == item))
        .filter_map(|i| i.last_snapshot().map(|s| s.available))
        .sum();
    let calls_at_open = center_calls(&handles);
    let kinds_at_open = calls_by_kind(&handles);
    tokio::time::sleep_until((opened + Duration::from_secs(1)).into()).await;
    let calls_after_1s = center_calls(&handles);
    let finished =
        inventory_test_support::wait_until(RUN_LIMIT, || async { shared.done.load(Ordering::Relaxed) }).await;
    shared.done.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let kinds_at_end = calls_by_kind(&handles);
    for a in agents {
        a.stop("opening agent").await;
    }
    let sold = shared.sold.load(Ordering::Relaxed);
    anyhow::ensure!(finished, "{sold} of {units} units sold within {RUN_LIMIT:?}");
    let at_90 = shared.calls_at_90.load(Ordering::Relaxed);
    let first_second = Summary::of(&*shared.first_second.lock().await);
    Ok(OpeningRun {
        scheduled,
        units,
        stocked_at_opening,
        sold_out_s: Some(shared.sold_out_us.load(Ordering::Relaxed) as f64 / 1e6),
        first_second,
        center_calls_first_second: calls_after_1s.saturating_sub(calls_at_open),
        center_calls_before_90pct: (at_90 > 0).then(|| (at_90 - 1).saturating_sub(calls_at_open)),
        borrows_after_opening: kinds_at_end.0.saturating_sub(kinds_at_open.0),
        returns_after_opening: kinds_at_end.1.saturating_sub(kinds_at_open.1),
        describes_after_opening: kinds_at_end.2.saturating_sub(kinds_at_open.2),
        not_started_answers: shared.not_started.load(Ordering::Relaxed),
        sold: sold.min(units),
        oversold: sold.saturating_sub(units),
    })
}

/// One caller: a fresh key per attempt, one unit each; the burst's callers stop at their
/// first reservation or once the item is sold out, the steady ones keep buying.
async fn caller(shared: Arc<Shared>, mut client: AgentClient<Channel>, n: usize, steady: bool) {
    let mut attempt = 0u64;
    while !shared.done.load(Ordering::Relaxed) {
        attempt += 1;
        let mut request = tonic::Request::new(pb::AcquireRequest {
            item_id: shared.item.clone(),
            user_id: format!("u{n}-{attempt}"),
            quantity: 1,
            idempotency_key: format!("open-{n}-{attempt}"),
            ..Default::default()
        });
        request.set_timeout(CALL_TIMEOUT);
        let sent = Instant::now();
        let answer = client.acquire(request).await;
        let received = Instant::now();
        if received.checked_duration_since(shared.opened).is_some_and(|a| a <= Duration::from_secs(1)) {
            let ns = u64::try_from(received.duration_since(sent).as_nanos()).unwrap_or(u64::MAX);
            let _ = shared.first_second.lock().await.record(ns.max(1));
        }
        let answer = answer.map(tonic::Response::into_inner);
        let opens_at = answer.as_ref().map_or(0, |a| a.opens_at_unix_ms);
        match answer.map(|a| a.outcome()) {
            Ok(pb::AcquireOutcome::Reserved) => {
                let sold = shared.sold.fetch_add(1, Ordering::Relaxed) + 1;
                if sold * 10 >= shared.units * 9 && shared.calls_at_90.load(Ordering::Relaxed) == 0 {
                    let _ = shared.calls_at_90.compare_exchange(
                        0,
                        center_calls(&shared.agents) + 1,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                if sold == shared.units {
                    let us = u64::try_from(received.saturating_duration_since(shared.opened).as_micros())
                        .unwrap_or(u64::MAX);
                    shared.sold_out_us.store(us, Ordering::Relaxed);
                    shared.done.store(true, Ordering::Relaxed);
                }
                if !steady {
                    return;
                }
            }
            Ok(pb::AcquireOutcome::NotStarted) => {
                shared.not_started.fetch_add(1, Ordering::Relaxed);
                let until_open = Duration::from_millis(u64::try_from(opens_at - unix_ms()).unwrap_or(0));
                let spread = Duration::from_millis((n % 10) as u64);
                tokio::time::sleep(until_open.min(REFRESH_PAUSE) + spread).await;
            }
            Ok(pb::AcquireOutcome::SoldOut) => tokio::time::sleep(SOLD_OUT_PAUSE).await,
            // LIMIT_EXCEEDED cannot happen (a fresh user per attempt); errors are retried
            // with a fresh key like a new shopper (the old one reserved nothing or is
            // counted when its answer came).
            _ => tokio::time::sleep(RETRY_PAUSE).await,
        }
    }
}

pub fn render(figure: Option<&OpeningFigure>) -> String {
    let Some(f) = figure else { return String::new() };
    let row = |r: &OpeningRun| {
        format!(
            "{:<12} {:>6} {:>9} {:>10} {:>9} {:>9} {:>9} {:>11} {:>10} {:>6} {:>8}\n",
            if r.scheduled { "scheduled" } else { "unscheduled" },
            r.units,
            r.stocked_at_opening,
            r.sold_out_s.map_or_else(|| "-".to_owned(), |s| format!("{:.3} s", s)),
            crate::stats::fmt_latency(r.first_second.p50_us),
            crate::stats::fmt_latency(r.first_second.p99_us),
            r.first_second.count,
            r.center_calls_first_second,
            r.center_calls_before_90pct.map_or_else(|| "-".to_owned(), |c| c.to_string()),
            r.sold,
            r.oversold,
        )
    };
    format!(
        "(iv) the opening: one item over 3 channels on Redis, {STEADY_CALLERS} steady callers and a burst of {BURST_CALLERS}, one unit per call\n\
         {:<12} {:>6} {:>9} {:>10} {:>9} {:>9} {:>9} {:>11} {:>10} {:>6} {:>8}\n{}{}",
        "run",
        "units",
        "shelved",
        "sold out",
        "p50 1st s",
        "p99 1st s",
        "answers",
        "calls 1st s",
        "calls <90%",
        "sold",
        "oversold",
        row(&f.scheduled),
        row(&f.unscheduled),
    ) + &[&f.scheduled, &f.unscheduled]
        .iter()
        .map(|r| {
            format!(
                "{}: center calls from the opening to the end: {} Borrow, {} Return, {} DescribeItems\n",
                if r.scheduled { "scheduled" } else { "unscheduled" },
                r.borrows_after_opening,
                r.returns_after_opening,
                r.describes_after_opening
            )
        })
        .collect::<String>()
}
