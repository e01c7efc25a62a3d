//! The one-command benchmark: every yardstick of the brief, side by side, in one run, on
//! one machine, with the same load generator and concurrency:
//!
//! - a: the floor, `grpc.health.v1.Health/Check` on an agent;
//! - b: Acquire on an agent with the memory store;
//! - c: Acquire on an agent with the Redis store;
//! - d: `RedisPoolStore::acquire` straight from Rust (acquire.lua, or acquire_batch.lua for
//!   the calls of a pool that arrive while one is in flight), no gRPC;
//! - d0: a script that does nothing (`return 1` on a pool's key), one call per request,
//!   over a store's connections built as the Redis agent builds its own: what a script
//!   call costs Redis before it touches data (c's Redis CPU per call over d0's:
//!   `ratios.redis_cpu_c_over_d0`);
//! - e: the naive baseline, one PostgreSQL row updated per purchase;
//! - f: center Borrow on PostgreSQL, every caller on one item (group commit joins them);
//! - g: Acquire (Redis store) open loop at 70% of c, with default watermarks: its p99 and
//!   the center calls (Borrow + Return) per 1,000 acquires of a steady sale;
//! - h: Acquire (Redis store) once the item is sold out everywhere;
//! - (ii), after the rounds: center Borrow calls per 1,000 acquires with fixed and with
//!   rate-following batches at two sell rates ([`crate::batching`]).
//! - (iii), last: stocking 10,000 items (1,000 with `--quick`) through one fresh agent on
//!   the Redis store: seconds to load and to stock every pool, and the center calls
//!   ([`crate::stocking`]).
//! - (iv), after (iii): the opening second ([`crate::opening`]): a scheduled item of 5,000
//!   units over 3 channels on Redis, stocked during its lead and bought by 50 steady callers
//!   and a burst of 1,000 already calling at the opening, beside the same item unscheduled
//!   and first used at the burst; on a database and center of its own.
//! - j: center Borrow on PostgreSQL, the callers over 100 items;
//! - i: c with the JetStream relay on (`--nats-url`; the NATS server at
//!   `INVENTORY_TEST_NATS_URL`, default 127.0.0.1:4222, in a stream of its own that is
//!   deleted afterwards): the cost of publishing each reservation's events. Skipped, and
//!   said so, when no NATS server answers.
//!
//! The phases run in rounds (a..h, a..h, ...) and each figure is its median round, so a
//! burst of other work on a shared machine skews one round, not the result.

mod fixtures;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use sqlx::PgPool;
use tokio::runtime::Handle;

use crate::acquire::{self, AcquireCaller};
use crate::callers::{BareScriptCaller, BorrowCaller, HealthCaller, NaiveCaller};
use crate::env::{AgentHandle, BenchDatabase, BenchRedis, CenterHandle, RedisTuning, Store, channels};
use crate::load::{self, Caller, LoadReport, LoadSpec};
use crate::report::{ClientKind, Phase, PhaseResult, Report, Settings, render};
use crate::skew::Skew;
use crate::stats::{fmt_latency, fmt_rate};
use crate::sysinfo::{CpuSnapshot, Machine};

/// Stock of the in-stock items: far more than any run sells.
const BIG_STOCK: u64 = 100_000_000;
/// Stock of the item that is sold out before phase h measures.
const SOLD_OUT_STOCK: u64 = 1_000;
/// Per-user limit of every item: high, so every fresh key of a skewed population reserves
/// (the most work per call, and the most units taken from the pool).
const PER_USER_LIMIT: u64 = 1_000_000;
const RESERVATION_TTL_MS: u64 = 300_000;
/// The naive baseline's row starts with this many units.
const NAIVE_STOCK: i64 = 1_000_000_000_000;
/// Connections of the naive baseline's pool at most (PostgreSQL allows 100 in all).
const NAIVE_MAX_CONNECTIONS: usize = 50;
/// The shortest measuring time of each cell of figure (ii) in a full run (the cold start is
/// one fixed batch); `--quick` keeps its own.
const BATCHING_AT_LEAST: Duration = Duration::from_secs(2);

fn batching_time(opts: &SuiteOptions) -> Duration {
    if opts.quick { opts.duration } else { opts.duration.max(BATCHING_AT_LEAST) }
}
/// Items of phase j.
const BORROW_ITEMS: usize = 100;

fn borrow_item(n: usize) -> String {
    format!("bench-borrow-{n:03}")
}

/// The longest the sold-out phase waits for the item to sell out.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct SuiteOptions {
    pub quick: bool,
    pub rounds: usize,
    pub concurrency: usize,
    pub connections: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub users: u64,
    pub skew: Skew,
    pub replay_share: f64,
    /// Open-loop rate of phase g as a share of c's peak.
    pub steady_share: f64,
    /// Watermarks (low, high, batch) of phase g's item; `None`: the defaults for its total.
    pub steady_watermarks: Option<(u64, u64, u64)>,
    pub seed: u64,
    pub output: PathBuf,
    /// Run only these phases (g needs c and runs it too); empty means all.
    pub only: Vec<Phase>,
    /// The Redis store's settings where they differ from the defaults.
    pub redis: RedisTuning,
    /// The client of the gRPC figures (a, b, c, g, h, i).
    pub client: ClientKind,
}

impl SuiteOptions {
    fn wanted(&self, p: Phase) -> bool {
        self.only.is_empty() || self.only.contains(&p) || (p == Phase::C && self.only.contains(&Phase::G))
    }
}

/// Runs the suite, prints the tables, writes the JSON. Returns whether every outcome
/// check passed.
pub async fn run(opts: SuiteOptions, servers_rt: Handle) -> anyhow::Result<bool> {
    let started_at_unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let db = BenchDatabase::create().await?;
    let (redis, mut redis_conn) = match BenchRedis::connect().await {
        Ok(r) => r,
        Err(e) => {
            db.drop_database().await;
            return Err(e);
        }
    };
    let versions = (BenchRedis::version(&mut redis_conn).await, db.server_version().await);
    eprintln!("bench: database {} and Redis prefix {}", db.url, redis.prefix);
    let result = async {
        let world = World::start(&servers_rt, &db, &redis, opts.steady_watermarks, opts.redis).await?;
        let mut runner = Runner::new(&opts, &world, &db, &redis, &mut redis_conn);
        let outcome = tokio::select! {
            r = runner.run_rounds() => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        let results = runner.finish().await;
        // (ii) after the rounds, on an idle agent: its Borrow count is the cells' own.
        let batching = match &outcome {
            Ok(()) if opts.only.is_empty() => {
                crate::batching::measure(&world.center, &world.memory_agent, batching_time(&opts))
                    .await
                    .map_err(|e| format!("(ii) batching: {e:#}"))
            }
            _ => Ok(Vec::new()),
        };
        // (iii) last: its thousands of items would otherwise sit in every other figure's
        // center.
        let stocking = match &outcome {
            Ok(()) if opts.only.is_empty() => {
                let store = Store::Redis { url: redis.url.clone(), prefix: redis.prefix.clone(), tuning: opts.redis };
                let items = if opts.quick { crate::stocking::QUICK_ITEMS } else { crate::stocking::ITEMS };
                crate::stocking::measure(&servers_rt, &world.center, &store, items)
                    .await
                    .map(Some)
                    .map_err(|e| format!("(iii) stocking: {e:#}"))
            }
            _ => Ok(None),
        };
        world.stop().await;
        // (iv) on a center of its own, once the others' agents are gone.
        let opening = match &outcome {
            Ok(()) if opts.only.is_empty() => {
                crate::opening::measure(&servers_rt, &redis.url, &redis.prefix, opts.quick)
                    .await
                    .map(Some)
                    .map_err(|e| format!("(iv) opening: {e:#}"))
            }
            _ => Ok(None),
        };
        outcome.map(|()| (results, batching, stocking, opening))
    }
    .await;
    redis.delete_keys(&mut redis_conn).await;
    db.drop_database().await;
    let ((results, mut failures), batching, stocking, opening) = result?;
    let batching = batching.unwrap_or_else(|e| {
        failures.push(e);
        Vec::new()
    });
    let stocking = stocking.unwrap_or_else(|e| {
        failures.push(e);
        None
    });

    let settings = Settings {
        quick: opts.quick,
        rounds: opts.rounds,
        concurrency: opts.concurrency,
        connections: opts.connections,
        warmup_s: opts.warmup.as_secs_f64(),
        duration_s: opts.duration.as_secs_f64(),
        users: opts.users,
        skew: opts.skew.to_string(),
        replay_share: opts.replay_share,
        steady_share: opts.steady_share,
        steady_watermarks: opts.steady_watermarks.map(|(l, h, b)| format!("{l}/{h}/{b}")),
        seed: opts.seed,
        naive_pool_connections: naive_connections(opts.concurrency),
        redis_version: versions.0,
        postgres_version: versions.1,
        client: opts.client,
    };
    let opening = opening.unwrap_or_else(|e| {
        failures.push(e);
        None
    });
    let mut report = Report::new(started_at_unix_ms, Machine::detect(), settings, results, failures);
    report.batching = batching;
    report.stocking = stocking;
    if let Some(o) = &opening {
        for run in [&o.scheduled, &o.unscheduled] {
            if run.oversold > 0 || run.sold < run.units {
                report.checks_ok = false;
            }
        }
    }
    report.opening = opening;
    println!("{}", render(&report));
    println!("{}", crate::batching::render(&report.batching));
    println!("{}", crate::stocking::render(report.stocking.as_ref()));
    println!("{}", crate::opening::render(report.opening.as_ref()));
    if let Some(dir) = opts.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::write(&opts.output, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("write {}", opts.output.display()))?;
    println!("JSON written to {}", opts.output.display());
    Ok(report.checks_ok && report.failures.is_empty())
}

fn naive_connections(concurrency: usize) -> u32 {
    u32::try_from(concurrency.clamp(1, NAIVE_MAX_CONNECTIONS)).unwrap_or(1)
}

/// The center and the agents, on the servers' runtime.
struct World {
    center: CenterHandle,
    memory_agent: AgentHandle,
    redis_agent: AgentHandle,
    /// The Redis agent of phase i, relaying to JetStream (None: no NATS server).
    relay_agent: Option<AgentHandle>,
    /// Its NATS server and stream.
    nats: Option<(String, String)>,
}

/// The NATS server for phase i, if one answers.
async fn nats_server() -> Option<String> {
    let url = std::env::var("INVENTORY_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let addr = url.trim_start_matches("nats://").to_owned();
    match tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Some(url),
        _ => {
            eprintln!("bench: no NATS server at {url}: phase i (relay on) is skipped");
            None
        }
    }
}

impl World {
    async fn start(
        rt: &Handle,
        db: &BenchDatabase,
        redis: &BenchRedis,
        steady_watermarks: Option<(u64, u64, u64)>,
        tuning: RedisTuning,
    ) -> anyhow::Result<Self> {
        let center = CenterHandle::start(rt, &db.url).await?;
        let items = async {
            let mut admin = AdminClient::new(channels(&center.url, 1).await?.remove(0));
            // In-stock items for b and c: watermarks wide enough that the pool never runs
            // dry at peak, so these phases measure the hot path and not the center.
            let wide = Some(pb::Watermarks { low: 20_000, high: 200_000, batch: 100_000 });
            let steady = steady_watermarks.map(|(low, high, batch)| pb::Watermarks { low, high, batch });
            for (item, total, watermarks) in [
                ("bench-mem", BIG_STOCK, wide),
                ("bench-redis", BIG_STOCK, wide),
                ("bench-relay", BIG_STOCK, wide),
                // g: a steady sale with the default watermarks (derived from the total),
                // unless --steady-watermarks says otherwise.
                ("bench-steady", BIG_STOCK, steady),
                ("bench-soldout", SOLD_OUT_STOCK, None),
                ("bench-borrow", 1_000_000_000, None),
            ] {
                admin
                    .create_item(pb::CreateItemRequest {
                        item_id: item.to_owned(),
                        total,
                        per_user_limit: PER_USER_LIMIT,
                        reservation_ttl_ms: RESERVATION_TTL_MS,
                        watermarks,
                        // Fixed batches: these figures measure the paths, not the batching.
                        rate_batching: Some(pb::RateBatching { enabled: false, ..Default::default() }),
                        segments: 1,
                        ..Default::default()
                    })
                    .await
                    .with_context(|| format!("create item {item}"))?;
            }
            // j: Borrows spread over many items (each caller takes its items in turn).
            for n in 0..BORROW_ITEMS {
                let item = borrow_item(n);
                admin
                    .create_item(pb::CreateItemRequest {
                        item_id: item.clone(),
                        total: 1_000_000_000,
                        per_user_limit: PER_USER_LIMIT,
                        reservation_ttl_ms: RESERVATION_TTL_MS,
                        rate_batching: Some(pb::RateBatching { enabled: false, ..Default::default() }),
                        segments: 1,
                        ..Default::default()
                    })
                    .await
                    .with_context(|| format!("create item {item}"))?;
            }
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = items {
            center.stop().await;
            return Err(e);
        }
        let memory_agent = match AgentHandle::start(rt, &center.url, "mem", &Store::Memory).await {
            Ok(a) => a,
            Err(e) => {
                center.stop().await;
                return Err(e);
            }
        };
        let store = Store::Redis { url: redis.url.clone(), prefix: redis.prefix.clone(), tuning };
        let redis_agent = match AgentHandle::start(rt, &center.url, "redis", &store).await {
            Ok(a) => a,
            Err(e) => {
                memory_agent.stop("memory agent").await;
                center.stop().await;
                return Err(e);
            }
        };
        let nats = nats_server().await.map(|url| (url, format!("BENCH_{:x}", rand::random::<u32>())));
        let relay_agent = match &nats {
            Some((url, stream)) => {
                match AgentHandle::start_relaying(rt, &center.url, "relay", &store, Some((url, stream))).await {
                    Ok(a) => Some(a),
                    Err(e) => {
                        memory_agent.stop("memory agent").await;
                        redis_agent.stop("redis agent").await;
                        center.stop().await;
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        Ok(Self { center, memory_agent, redis_agent, relay_agent, nats })
    }

    async fn stop(self) {
        self.memory_agent.stop("memory agent").await;
        self.redis_agent.stop("redis agent").await;
        if let Some(a) = self.relay_agent {
            a.stop("relay agent").await;
        }
        self.center.stop().await;
        if let Some((url, stream)) = self.nats {
            // The run's events are of no use after it.
            if let Ok(client) = async_nats::connect(url.as_str()).await {
                let _ = async_nats::jetstream::new(client).delete_stream(&stream).await;
            }
        }
    }
}

/// The callers of each phase live across rounds, so keys stay unique and the outcome
/// checks cover every round.
#[derive(Default)]
struct Fixtures {
    health: Option<Vec<HealthCaller>>,
    memory: Option<Vec<AcquireCaller>>,
    redis: Option<Vec<AcquireCaller>>,
    lua: Option<Vec<AcquireCaller>>,
    bare: Option<Vec<BareScriptCaller>>,
    naive_pool: Option<PgPool>,
    naive: Option<Vec<NaiveCaller>>,
    borrow: Option<Vec<BorrowCaller>>,
    borrow_spread: Option<Vec<BorrowCaller>>,
    steady: Option<Vec<AcquireCaller>>,
    sold_out: Option<Vec<AcquireCaller>>,
    relay: Option<Vec<AcquireCaller>>,
}

struct Runner<'a> {
    opts: &'a SuiteOptions,
    world: &'a World,
    db: &'a BenchDatabase,
    redis: &'a BenchRedis,
    redis_conn: &'a mut redis::aio::MultiplexedConnection,
    fx: Fixtures,
    results: Vec<PhaseResult>,
    failures: Vec<String>,
}

impl<'a> Runner<'a> {
    fn new(
        opts: &'a SuiteOptions,
        world: &'a World,
        db: &'a BenchDatabase,
        redis: &'a BenchRedis,
        redis_conn: &'a mut redis::aio::MultiplexedConnection,
    ) -> Self {
        Self { opts, world, db, redis, redis_conn, fx: Fixtures::default(), results: Vec::new(), failures: Vec::new() }
    }

    fn spec(&self) -> LoadSpec {
        LoadSpec {
            warmup: self.opts.warmup,
            duration: self.opts.duration,
            max_requests: load::MAX_REQUESTS,
            rate: None,
            stop: None,
        }
    }

    async fn run_rounds(&mut self) -> anyhow::Result<()> {
        for round in 0..self.opts.rounds.max(1) {
            for phase in Phase::ALL.into_iter().filter(|p| self.opts.wanted(*p)) {
                if self.failures.iter().any(|f| f.starts_with(phase.id())) {
                    continue;
                }
                // A broken phase is reported and skipped; the others still run.
                if let Err(e) = self.run_phase(phase, round).await {
                    eprintln!("bench: round {} {} FAILED: {e:#}", round + 1, phase.id());
                    self.failures.push(format!("{}: round {}: {e:#}", phase.id(), round + 1));
                }
            }
        }
        Ok(())
    }

    async fn run_phase(&mut self, phase: Phase, round: usize) -> anyhow::Result<()> {
        let (world, spec) = (self.world, self.spec());
        match phase {
            Phase::A => {
                let callers = match self.fx.health.take() {
                    Some(c) => c,
                    None => self.health_callers(&world.memory_agent.url).await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, None).await?;
                self.fx.health = Some(callers);
            }
            Phase::B => {
                let callers = match self.fx.memory.take() {
                    Some(c) => c,
                    None => self.agent_callers(&world.memory_agent, "bench-mem", "b").await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, Some(&world.memory_agent)).await?;
                self.fx.memory = Some(callers);
            }
            Phase::C => {
                let callers = match self.fx.redis.take() {
                    Some(c) => c,
                    None => self.agent_callers(&world.redis_agent, "bench-redis", "c").await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, Some(&world.redis_agent)).await?;
                self.fx.redis = Some(callers);
            }
            Phase::D => {
                let callers = match self.fx.lua.take() {
                    Some(c) => c,
                    None => self.lua_callers().await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, None).await?;
                self.fx.lua = Some(callers);
            }
            Phase::D0 => {
                let callers = match self.fx.bare.take() {
                    Some(c) => c,
                    None => self.bare_callers().await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, None).await?;
                self.fx.bare = Some(callers);
            }
            Phase::E => {
                let callers = match self.fx.naive.take() {
                    Some(c) => c,
                    None => self.naive_callers().await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, None).await?;
                self.fx.naive = Some(callers);
            }
            Phase::F => {
                let callers = match self.fx.borrow.take() {
                    Some(c) => c,
                    None => self.borrow_callers(false).await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, None).await?;
                self.fx.borrow = Some(callers);
            }
            Phase::J => {
                let callers = match self.fx.borrow_spread.take() {
                    Some(c) => c,
                    None => self.borrow_callers(true).await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, None).await?;
                self.fx.borrow_spread = Some(callers);
            }
            Phase::G => {
                let peak = self.median_rate(Phase::C).context("phase g needs c's peak rate, and c measured none")?;
                let spec = LoadSpec { rate: Some(peak * self.opts.steady_share), ..spec };
                let callers = match self.fx.steady.take() {
                    Some(c) => c,
                    None => self.agent_callers(&world.redis_agent, "bench-steady", "g").await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, Some(&world.redis_agent)).await?;
                self.fx.steady = Some(callers);
            }
            Phase::H => {
                let callers = match self.fx.sold_out.take() {
                    Some(c) => c,
                    None => self.sell_out().await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, Some(&world.redis_agent)).await?;
                self.fx.sold_out = Some(callers);
            }
            Phase::I => {
                let Some(agent) = &world.relay_agent else { return Ok(()) };
                let callers = match self.fx.relay.take() {
                    Some(c) => c,
                    None => self.agent_callers(agent, "bench-relay", "i").await?,
                };
                let (_, callers) = self.measure(phase, round, &spec, callers, Some(agent)).await?;
                self.fx.relay = Some(callers);
            }
        }
        Ok(())
    }

    /// The median rate a phase reached in the rounds so far.
    fn median_rate(&self, phase: Phase) -> Option<f64> {
        let mut rates: Vec<f64> =
            self.results.iter().filter(|r| r.phase == phase && r.throughput > 0.0).map(|r| r.throughput).collect();
        rates.sort_by(f64::total_cmp);
        rates.get(rates.len().checked_sub(1)? / 2).copied()
    }

    /// Runs one measurement and records CPU use and the agent's center calls around it.
    async fn measure<C: Caller>(
        &mut self,
        phase: Phase,
        round: usize,
        spec: &LoadSpec,
        callers: Vec<C>,
        agent: Option<&AgentHandle>,
    ) -> anyhow::Result<(LoadReport, Vec<C>)> {
        eprintln!("bench: round {} {} {} ({} callers) ...", round + 1, phase.id(), phase.title(), callers.len());
        let calls_before = agent.map(AgentHandle::center_calls);
        let fast_before = agent.map(AgentHandle::fast_path_answers);
        let before = CpuSnapshot::take(Some(self.redis_conn)).await;
        let (report, callers) = load::run(spec, callers).await?;
        let cpu = CpuSnapshot::take(Some(self.redis_conn)).await.since(&before);
        let mut result = PhaseResult::new(phase, round, &report, cpu);
        result.center_calls = agent.zip(calls_before).map(|(a, b)| a.center_calls().saturating_sub(b));
        result.fast_path_answers = agent.zip(fast_before).map(|(a, b)| a.fast_path_answers().saturating_sub(b));
        eprintln!(
            "bench: round {} {} {:>10}/s  p50 {}  p99 {}  errors {}",
            round + 1,
            phase.id(),
            fmt_rate(result.throughput),
            fmt_latency(result.latency_us.p50_us),
            fmt_latency(result.latency_us.p99_us),
            result.measured.errors
        );
        self.results.push(result);
        Ok((report, callers))
    }

    /// The outcome checks over every round, attached to the phases' results; closes the
    /// naive baseline's pool and every connection of the callers.
    async fn finish(&mut self) -> (Vec<PhaseResult>, Vec<String>) {
        let checks = [
            (Phase::B, self.fx.memory.take(), BIG_STOCK),
            (Phase::C, self.fx.redis.take(), BIG_STOCK),
            (Phase::D, self.fx.lua.take(), BIG_STOCK),
            (Phase::G, self.fx.steady.take(), BIG_STOCK),
            (Phase::H, self.fx.sold_out.take(), SOLD_OUT_STOCK),
            (Phase::I, self.fx.relay.take(), BIG_STOCK),
        ];
        for (phase, callers, stock) in checks {
            let Some(callers) = callers else { continue };
            let outcome = acquire::check(callers.iter().map(|c| &c.ledger), 1, Some(stock));
            if !outcome.ok {
                eprintln!("bench: {} OUTCOME CHECK FAILED: {outcome:?}", phase.id());
            }
            for r in self.results.iter_mut().filter(|r| r.phase == phase) {
                r.outcome = Some(outcome.clone());
            }
        }
        if let Some(pool) = self.fx.naive_pool.take() {
            pool.close().await;
        }
        // Close every connection, so the servers' graceful shutdown has nothing to wait for.
        self.fx = Fixtures::default();
        (std::mem::take(&mut self.results), std::mem::take(&mut self.failures))
    }
}
