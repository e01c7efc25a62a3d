//! The command line: `inventory-bench acquire ...` (load on running agents) and
//! `inventory-bench suite ...` (the one-command benchmark).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inventory_proto::v1::agent_client::AgentClient;
use serde::Serialize;

use crate::acquire::{self, AcquireCaller, Outcome, Target, Workload};
use crate::args::{ensure_loopback, parse_duration, parse_share, parse_watermarks};
use crate::auth::AuthArgs;
use crate::env::{RedisTuning, tls_channels};
use crate::load::{self, Counts, LoadSpec};
use crate::report::ClientKind;
use crate::report::Phase;
use crate::skew::{Skew, UserSampler};
use crate::stats::{Summary, fmt_latency, fmt_rate, ladder, render_table};
use crate::suite::SuiteOptions;

#[derive(Debug, clap::Parser)]
#[command(
    name = "inventory-bench",
    version,
    about = "Load generator and benchmark suite for the inventory agents and center"
)]
pub struct Cli {
    /// Worker threads of the load generator's runtime.
    #[arg(long, global = true, default_value_t = 2)]
    pub client_threads: usize,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Drive Agent/Acquire against running agents and print throughput and latency.
    Acquire(AcquireArgs),
    /// Run every measurement in one go (starts its own center and agents in-process).
    Suite(SuiteArgs),
    /// The Redis limit of one hot item, one segment against several, on a private
    /// 3-master Redis Cluster it starts (acquire.lua straight from Rust, no agent).
    Segments(crate::segments::SegmentsArgs),
    /// Figure (iv) of the suite alone: the opening second of a scheduled sale beside an
    /// unscheduled one (starts its own center and agents; local PostgreSQL and Redis).
    Opening(crate::opening::OpeningArgs),
    /// Redis bytes per live reservation: one pool of a million live reservations (50,000
    /// with --quick) on a private redis-server, `used_memory` before and after, and
    /// `MEMORY USAGE` of each of the pool's structures.
    Memory(crate::memory::MemoryArgs),
    /// Figure (iii) of the suite alone: stocking many items through one agent, then a full
    /// heartbeat, the scrapes and the console's reads at that size (own center and agent;
    /// local PostgreSQL and Redis).
    Stocking(crate::stocking::StockingArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Concurrent callers.
    #[arg(long, short = 'c', default_value_t = 50)]
    pub concurrency: usize,
    /// gRPC connections (HTTP/2) the callers share, round-robin.
    #[arg(long, short = 'k', default_value_t = 4)]
    pub connections: usize,
    /// Warm-up before measuring (not counted), e.g. 2s or 500ms.
    #[arg(long, value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// Measured time per run (at most 10 minutes).
    #[arg(long, short = 'd', value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Size of the user population.
    #[arg(long, default_value_t = 1_000_000)]
    pub users: u64,
    /// How requests spread over users: uniform, zipf, zipf:S, hot:FRACTION:SHARE.
    #[arg(long, default_value = "zipf:1")]
    pub skew: Skew,
    /// Share of calls that replay an idempotency key the caller used before.
    #[arg(long, value_parser = parse_share, default_value = "0.05")]
    pub replay: f64,
    /// Seed of the random choices (users, replays).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// How `inventory-bench acquire` calls the agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// tonic's generated client, one call per Acquire.
    Raw,
    /// The client crate's `AgentClient::acquire`.
    Client,
}

#[derive(Debug, clap::Args)]
pub struct AcquireArgs {
    /// Agent gRPC address (repeat for several agents; loopback only).
    #[arg(long = "agent", default_value = "http://127.0.0.1:50052")]
    pub agents: Vec<String>,
    #[arg(long)]
    pub item: String,
    /// Units of the item there are (in all the agents' channels together); the outcome
    /// check fails if more are reserved.
    #[arg(long)]
    pub stock: Option<u64>,
    /// Units per Acquire.
    #[arg(long, default_value_t = 1)]
    pub quantity: u64,
    /// Measured calls at most.
    #[arg(long, short = 'n', default_value_t = 10_000_000)]
    pub requests: u64,
    /// Open loop at this many calls per second (default: closed loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Also write the JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// How calls are made: raw tonic calls, or through the client crate
    /// (`inventory-client`: retries, replica choice, the generation rule), to measure its
    /// overhead. With `client`, the agents are taken as replicas of one channel.
    #[arg(long, value_enum, default_value = "raw")]
    pub via: Via,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub load: LoadArgs,
}

#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// About a second per measurement (for CI; works with a debug build).
    #[arg(long)]
    pub quick: bool,
    /// Open-loop rate of phase g as a share of c's peak.
    #[arg(long, value_parser = parse_share, default_value = "0.7")]
    pub steady_share: f64,
    /// Watermarks LOW/HIGH/BATCH of phase g's item (default: derived from its total, as
    /// for any item created without watermarks).
    #[arg(long, value_parser = parse_watermarks)]
    pub steady_watermarks: Option<(u64, u64, u64)>,
    /// Rounds of all phases; each figure is its median round (default 3, 1 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results/latest.json")]
    pub output: PathBuf,
    /// Run only these phases, comma-separated (g runs c too).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub only: Vec<Phase>,
    /// The Redis agent's connections to Redis (default: the agent's default).
    #[arg(long)]
    pub redis_connections: Option<usize>,
    /// At most this many Acquires per Redis script call, in the Redis agent and in d
    /// (default: the store's default; 1 turns group commit off).
    #[arg(long)]
    pub redis_acquire_batch_max: Option<usize>,
    /// The client of the gRPC figures: tonic (as a channel backend calls), or light (raw
    /// HTTP/2 with pre-encoded requests: little client CPU, so the agent's own cost shows).
    #[arg(long, value_enum, default_value = "tonic")]
    pub client: ClientKind,
    #[command(flatten)]
    pub load: LoadArgs,
}

impl SuiteArgs {
    pub fn options(&self) -> anyhow::Result<SuiteOptions> {
        let l = &self.load;
        check_load(l)?;
        let (rounds, warmup, duration, users) = if self.quick {
            (1, Duration::from_millis(300), Duration::from_secs(1), l.users.min(10_000))
        } else {
            (3, Duration::from_secs(1), Duration::from_secs(4), l.users)
        };
        let rounds = self.rounds.unwrap_or(rounds);
        anyhow::ensure!((1..=20).contains(&rounds), "--rounds must be 1..=20");
        Ok(SuiteOptions {
            quick: self.quick,
            rounds,
            concurrency: l.concurrency,
            connections: l.connections,
            warmup: l.warmup.unwrap_or(warmup),
            duration: l.duration.unwrap_or(duration),
            users,
            skew: l.skew,
            replay_share: l.replay,
            steady_share: self.steady_share,
            steady_watermarks: self.steady_watermarks,
            seed: l.seed,
            output: self.output.clone(),
            only: self.only.clone(),
            redis: RedisTuning { connections: self.redis_connections, batch_max: self.redis_acquire_batch_max },
            client: self.client,
        })
    }
}

pub fn check_load(l: &LoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=10_000).contains(&l.concurrency), "--concurrency must be 1..=10000");
    anyhow::ensure!((1..=256).contains(&l.connections), "--connections must be 1..=256");
    UserSampler::new(l.users, l.skew).map_err(anyhow::Error::msg)?;
    Ok(())
}

#[derive(Debug, Serialize)]
struct AcquireReport {
    agents: Vec<String>,
    via: Via,
    item: String,
    concurrency: usize,
    connections: usize,
    rate: Option<f64>,
    elapsed_s: f64,
    throughput: f64,
    latency_us: Summary,
    measured: Counts,
    warmup: Counts,
    outcome: Outcome,
}

/// `inventory-bench acquire`: returns whether the outcome check passed.
pub async fn acquire(args: AcquireArgs) -> anyhow::Result<bool> {
    check_load(&args.load)?;
    anyhow::ensure!(!args.agents.is_empty(), "give at least one --agent");
    anyhow::ensure!(args.quantity >= 1, "--quantity must be at least 1");
    for a in &args.agents {
        ensure_loopback("--agent", a).map_err(anyhow::Error::msg)?;
    }
    let l = &args.load;
    let per_agent = l.connections.div_ceil(args.agents.len());
    let authorization = args.auth.authorization()?;
    let tls = args.auth.tls()?;
    let mut targets = Vec::new();
    match args.via {
        Via::Raw => {
            for a in &args.agents {
                let conns = tls_channels(a, per_agent, Some(tls.clone())).await?;
                targets.extend(conns.into_iter().map(|c| Target::Agent(AgentClient::new(c))));
            }
        }
        // As many clients as connections per agent: each holds one connection per agent,
        // so both ways use the same connections.
        Via::Client => {
            let options = args.auth.client_options()?.deadline(acquire::CALL_TIMEOUT);
            for _ in 0..per_agent {
                let client = inventory_client::AgentClient::connect(args.agents.clone(), options.clone()).await?;
                targets.push(Target::Client(client));
            }
        }
    }
    let workload = Arc::new(Workload {
        item: args.item.clone(),
        quantity: args.quantity,
        users: Arc::new(UserSampler::new(l.users, l.skew).map_err(anyhow::Error::msg)?),
        replay_share: l.replay,
        run_id: format!("ab{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        seed: l.seed,
        authorization,
    });
    let callers: Vec<_> = (0..l.concurrency)
        .map(|i| AcquireCaller::new(i, targets[i % targets.len()].clone(), Arc::clone(&workload)))
        .collect();
    let spec = LoadSpec {
        warmup: l.warmup.unwrap_or(Duration::from_secs(2)),
        duration: l.duration.unwrap_or(Duration::from_secs(10)),
        max_requests: args.requests,
        rate: args.rate,
        stop: None,
    };
    eprintln!(
        "acquire: {} callers over {} connections to {}, {} for {:?} after {:?} warm-up",
        l.concurrency,
        per_agent * args.agents.len(),
        args.agents.join(", "),
        args.rate.map_or("closed loop".to_owned(), |r| format!("{r}/s open loop")),
        spec.duration,
        spec.warmup
    );
    let (report, callers) = load::run(&spec, callers).await?;
    let ledgers: Vec<_> = callers.into_iter().map(AcquireCaller::into_ledger).collect();
    let outcome = acquire::check(&ledgers, args.quantity, args.stock);

    let s = report.summary();
    let mut rows = vec![
        ["calls/s", "p50", "p90", "p99", "p99.9", "max", "reserved", "sold out", "limit", "errors"]
            .map(String::from)
            .to_vec(),
    ];
    rows.push(vec![
        fmt_rate(report.throughput()),
        fmt_latency(s.p50_us),
        fmt_latency(s.p90_us),
        fmt_latency(s.p99_us),
        fmt_latency(s.p999_us),
        fmt_latency(s.max_us),
        report.measured.ok.to_string(),
        report.measured.sold_out.to_string(),
        report.measured.limit_exceeded.to_string(),
        report.measured.errors.to_string(),
    ]);
    println!("{}", render_table(&rows));
    let mut hist = vec![["percentile", "latency", "calls at or below"].map(String::from).to_vec()];
    for (p, us, n) in ladder(&report.histogram) {
        hist.push(vec![format!("{p}"), fmt_latency(us), n.to_string()]);
    }
    println!("{}", render_table(&hist));
    println!(
        "outcome: {} units reserved{} in {} distinct reservations; {} sold-out answers; {} replays ({} mismatched): {}",
        outcome.units_reserved,
        outcome.stock.map_or(String::new(), |s| format!(" of {s}")),
        outcome.distinct_reservations,
        outcome.sold_out_answers,
        outcome.replayed_answers,
        outcome.replay_mismatches,
        if outcome.ok { "ok" } else { "FAILED" }
    );
    if !outcome.errors.is_empty() {
        println!("errors: {:?}", outcome.errors);
    }
    let ok = outcome.ok;
    let connections = per_agent * args.agents.len();
    let json = serde_json::to_string_pretty(&AcquireReport {
        agents: args.agents,
        via: args.via,
        item: args.item,
        concurrency: l.concurrency,
        connections,
        rate: args.rate,
        elapsed_s: report.elapsed.as_secs_f64(),
        throughput: report.throughput(),
        latency_us: s,
        measured: report.measured,
        warmup: report.warmup,
        outcome,
    })?;
    println!("{json}");
    if let Some(path) = args.json {
        std::fs::write(&path, &json)?;
    }
    Ok(ok)
}
