//! Figure (i) of segmented stock: the Redis limit of one hot item with its pool in one
//! segment (one hash tag, so one master) against eight segments (eight hash tags spread
//! over the masters), on a private 3-master Redis Cluster of local processes. Each call is
//! one `acquire.lua` (`RedisPoolStore::acquire` with group commit off), the user id
//! picking the segment as the agent routes; the Redis CPU per call is the masters'
//! `used_cpu_sys + used_cpu_user` over the measured window divided by the calls answered.

use std::sync::Arc;
use std::time::Duration;

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{PoolKey, PoolStore};
use inventory_test_support::cluster::RedisCluster;
use serde::Serialize;

use crate::acquire::{self, AcquireCaller, Target, Workload};
use crate::cli::LoadArgs;
use crate::load::{self, LoadSpec};
use crate::skew::UserSampler;

const MASTERS: usize = 3;
/// Per segment: never sells out within a bounded run.
const STOCK_PER_SEGMENT: u64 = 100_000_000;
const PER_USER_LIMIT: u64 = 1_000_000;
const RESERVATION_TTL_MS: u64 = 300_000;

#[derive(Debug, clap::Args)]
pub struct SegmentsArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Segment counts to measure, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub segments: Vec<u32>,
    /// Where the JSON goes (printed to stdout only when absent).
    #[arg(long)]
    pub output: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct Figure {
    segments: u32,
    /// Distinct masters the segments' hash tags land on.
    masters_used: usize,
    calls_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    redis_cpu_s: f64,
    redis_cpu_us_per_call: f64,
    errors: u64,
    outcome_ok: bool,
}

pub async fn run(args: SegmentsArgs) -> anyhow::Result<bool> {
    crate::cli::check_load(&args.load)?;
    for &n in &args.segments {
        inventory_core::segments::parse("--segments", n).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let l = &args.load;
    eprintln!("segments: starting a {MASTERS}-master Redis Cluster ...");
    let cluster = RedisCluster::start(MASTERS, 0).await;
    let masters: Vec<u16> = cluster.nodes_info().await.iter().filter(|n| n.master).map(|n| n.port).collect();
    let mut figures = Vec::new();
    let mut all_ok = true;
    for (run, &segments) in args.segments.iter().enumerate() {
        let prefix = format!("bench-seg-{run}:");
        let mut stores = Vec::new();
        for _ in 0..l.connections {
            let store = RedisPoolStore::new_cluster(&cluster.seeds(), &prefix).await?.with_acquire_batch_max(1);
            stores.push(Arc::new(store));
        }
        let item = format!("hot-{segments}");
        let mut used = std::collections::BTreeSet::new();
        for s in 0..segments {
            let pool = PoolKey::segment("seg", item.as_str(), s);
            stores[0].refill(&pool, "bench-refill", STOCK_PER_SEGMENT, 0).await?;
            used.insert(cluster.master_of(&format!("{prefix}{}:pool", pool.hash_tag())).await);
        }
        let workload = Arc::new(Workload {
            item: item.clone(),
            quantity: 1,
            users: Arc::new(UserSampler::new(l.users, l.skew).map_err(anyhow::Error::msg)?),
            replay_share: l.replay,
            run_id: format!("s{segments}"),
            seed: l.seed,
            authorization: None,
        });
        let callers: Vec<_> = (0..l.concurrency)
            .map(|i| {
                let target = Target::Store {
                    store: Arc::clone(&stores[i % stores.len()]),
                    pool: PoolKey::segment("seg", item.as_str(), 0),
                    segments,
                    per_user_limit: PER_USER_LIMIT,
                    reservation_ttl_ms: RESERVATION_TTL_MS,
                };
                AcquireCaller::new(i, target, Arc::clone(&workload))
            })
            .collect();
        let warmup = l.warmup.unwrap_or(Duration::from_secs(1));
        let spec = LoadSpec {
            warmup: Duration::ZERO,
            duration: l.duration.unwrap_or(Duration::from_secs(5)),
            max_requests: u64::MAX,
            rate: None,
            stop: None,
        };
        // Warm-up as its own short run, so the CPU window covers the measured calls only.
        let (_, callers) =
            load::run(&LoadSpec { duration: warmup, max_requests: u64::MAX, ..spec.clone() }, callers).await?;
        let before = masters_cpu(&masters).await;
        let (report, callers) = load::run(&spec, callers).await?;
        let after = masters_cpu(&masters).await;
        let ledgers: Vec<_> = callers.into_iter().map(AcquireCaller::into_ledger).collect();
        let outcome = acquire::check(&ledgers, 1, Some(STOCK_PER_SEGMENT * u64::from(segments)));
        let answered = report.measured.answered();
        let redis_cpu_s = after - before;
        let s = report.summary();
        let figure = Figure {
            segments,
            masters_used: used.len(),
            calls_per_s: report.throughput(),
            p50_us: s.p50_us,
            p99_us: s.p99_us,
            redis_cpu_s,
            redis_cpu_us_per_call: if answered == 0 { 0.0 } else { redis_cpu_s * 1e6 / answered as f64 },
            errors: report.measured.errors,
            outcome_ok: outcome.ok,
        };
        eprintln!("segments: {figure:?}");
        all_ok &= outcome.ok && figure.errors == 0;
        figures.push(figure);
    }
    println!("| segments | masters used | acquire.lua calls/s | p50 µs | p99 µs | Redis CPU µs/call |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for f in &figures {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} |",
            f.segments, f.masters_used, f.calls_per_s, f.p50_us, f.p99_us, f.redis_cpu_us_per_call
        );
    }
    let json = serde_json::to_string_pretty(&figures)?;
    match &args.output {
        Some(path) => std::fs::write(path, json)?,
        None => println!("{json}"),
    }
    Ok(all_ok)
}

/// CPU seconds (system + user) the masters spent so far, summed.
async fn masters_cpu(ports: &[u16]) -> f64 {
    let mut total = 0.0;
    for port in ports {
        let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else { continue };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else { continue };
        let Ok(info): Result<String, _> = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await else { continue };
        let get =
            |name: &str| info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<f64>().ok());
        total += get("used_cpu_sys").unwrap_or(0.0) + get("used_cpu_user").unwrap_or(0.0);
    }
    total
}
