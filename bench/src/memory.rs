//! Redis bytes per live reservation (`figures.redis_bytes_per_reservation`): one pool on a
//! private `redis-server` (nothing else writes to it, so its `used_memory` moves with this
//! pool only), stocked, then filled with live reservations through
//! `RedisPoolStore::acquire` (the agent's store: group commit on, its default
//! connections), each a fresh idempotency key of a user of the suite's population. The
//! figure is `INFO memory`'s `used_memory` after the reservations minus before, over the
//! reservations made; beside it, `MEMORY USAGE` of each of the pool's structures (all
//! elements sampled), so the bytes are told apart by structure. The server is killed and
//! its directory removed at the end, also after Ctrl-C.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{PoolKey, PoolStore};
use inventory_test_support::RedisServer;
use serde::Serialize;

use crate::acquire::{self, AcquireCaller, Target, Workload};
use crate::load::{self, LoadSpec};
use crate::skew::{Skew, UserSampler};
use crate::stats::render_table;

/// Live reservations of a full run and of `--quick`.
pub const RECORDS: u64 = 1_000_000;
pub const QUICK_RECORDS: u64 = 50_000;
const PREFIX: &str = "bench-bytes:";
/// Long enough that nothing expires while the figure is taken (no sweeper runs anyway).
const RESERVATION_TTL_MS: u64 = 3_600_000;
const PER_USER_LIMIT: u64 = 1_000_000;

#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    /// 50,000 live reservations instead of 1,000,000.
    #[arg(long)]
    pub quick: bool,
    /// Live reservations to make (overrides --quick).
    #[arg(long)]
    pub records: Option<u64>,
    /// Concurrent callers of the store.
    #[arg(long, short = 'c', default_value_t = 50)]
    pub concurrency: usize,
    /// Size of the user population (each user's holding is one entry of the pool's `held`).
    #[arg(long, default_value_t = 1_000_000)]
    pub users: u64,
    /// How the reservations spread over users: uniform, zipf, zipf:S, hot:FRACTION:SHARE.
    #[arg(long, default_value = "zipf:1")]
    pub skew: Skew,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where the JSON goes (printed to stdout only when absent).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// One of the pool's structures.
#[derive(Debug, Clone, Serialize)]
pub struct Structure {
    pub name: &'static str,
    pub kind: &'static str,
    /// Elements (fields, members, entries), the marker included.
    pub elements: u64,
    /// `MEMORY USAGE <key> SAMPLES 0`.
    pub bytes: u64,
    pub bytes_per_reservation: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// `used_memory` after minus before, over the live reservations.
    pub redis_bytes_per_reservation: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    pub figures: Figures,
    pub reservations: u64,
    pub distinct_users: u64,
    pub used_memory_before: u64,
    pub used_memory_after: u64,
    pub structures: Vec<Structure>,
    /// Seconds the reservations took to make.
    pub fill_s: f64,
    pub redis_version: Option<String>,
}

/// `inventory-bench memory`: returns whether every call reserved.
pub async fn run(args: MemoryArgs) -> anyhow::Result<bool> {
    let records = args.records.unwrap_or(if args.quick { QUICK_RECORDS } else { RECORDS });
    anyhow::ensure!((1..=10_000_000).contains(&records), "--records must be 1..=10000000");
    anyhow::ensure!((1..=10_000).contains(&args.concurrency), "--concurrency must be 1..=10000");
    let users = Arc::new(UserSampler::new(args.users, args.skew).map_err(anyhow::Error::msg)?);
    eprintln!("memory: starting a private redis-server ...");
    let server = RedisServer::start().await;
    let report = tokio::select! {
        r = measure(&server.url, records, &args, users) => r?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
    };
    drop(server);
    println!("{}", render(&report));
    let json = serde_json::to_string_pretty(&report)?;
    match &args.output {
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            }
            std::fs::write(path, &json).with_context(|| format!("write {}", path.display()))?;
            println!("JSON written to {}", path.display());
        }
        None => println!("{json}"),
    }
    Ok(report.reservations == records)
}

async fn measure(url: &str, records: u64, args: &MemoryArgs, users: Arc<UserSampler>) -> anyhow::Result<MemoryReport> {
    // MEMORY USAGE of a million elements takes longer than the client's default wait.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    let mut conn = redis::Client::open(url)?.get_multiplexed_async_connection_with_config(&config).await?;
    let store = Arc::new(RedisPoolStore::new(url, PREFIX).await?);
    let pool = PoolKey::new("bench", "bytes");
    store.refill(&pool, "bench-bytes-refill", records, 0).await?;
    // One call first, so the scripts are cached and the connections' buffers grown before
    // the first reading.
    store.bare_call(&pool).await?;
    let before = used_memory(&mut conn).await?;
    let workload = Arc::new(Workload {
        item: pool.item_id.clone(),
        quantity: 1,
        users,
        replay_share: 0.0,
        run_id: format!("m{:x}", rand::random::<u32>()),
        seed: args.seed,
        authorization: None,
    });
    let callers: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let target = Target::Store {
                store: Arc::clone(&store),
                pool: pool.clone(),
                segments: 1,
                per_user_limit: PER_USER_LIMIT,
                reservation_ttl_ms: RESERVATION_TTL_MS,
            };
            AcquireCaller::new(i, target, Arc::clone(&workload))
        })
        .collect();
    let spec = LoadSpec {
        warmup: Duration::ZERO,
        duration: load::MAX_DURATION,
        max_requests: records,
        rate: None,
        stop: None,
    };
    eprintln!("memory: making {records} reservations in one pool ...");
    let started = Instant::now();
    let (report, callers) = load::run(&spec, callers).await?;
    let fill_s = started.elapsed().as_secs_f64();
    let ledgers: Vec<_> = callers.into_iter().map(AcquireCaller::into_ledger).collect();
    let outcome = acquire::check(&ledgers, 1, Some(records));
    anyhow::ensure!(outcome.ok, "outcome check failed: {outcome:?}");
    if !outcome.errors.is_empty() {
        eprintln!("memory: errors {:?}", outcome.errors);
    }
    let reservations = outcome.distinct_reservations;
    anyhow::ensure!(reservations > 0, "no reservation was made: {:?}", report.measured);
    let after = used_memory(&mut conn).await?;

    let base = format!("{PREFIX}{}", pool.hash_tag());
    let mut structures = Vec::new();
    let mut distinct_users = 0;
    // `gc` holds the expiries out of the due list's order (lua/due.lua); the kind is read,
    // so a pool of the layout before the due list (a sorted set) is measured too.
    for name in ["pool", "res", "idem", "due", "gc", "held", "outbox"] {
        let key = format!("{base}:{name}");
        let bytes: Option<u64> =
            redis::cmd("MEMORY").arg("USAGE").arg(&key).arg("SAMPLES").arg(0).query_async(&mut conn).await?;
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await?;
        let (kind, len) = match kind.as_str() {
            "hash" => ("hash", "HLEN"),
            "zset" => ("zset", "ZCARD"),
            "list" => ("list", "LLEN"),
            "stream" => ("stream", "XLEN"),
            other => anyhow::bail!("{key}: unexpected type {other}"),
        };
        let elements: u64 = redis::cmd(len).arg(&key).query_async(&mut conn).await?;
        if name == "held" {
            // Less its marker (lua/intact.lua).
            distinct_users = elements.saturating_sub(1);
        }
        let bytes = bytes.unwrap_or(0);
        structures.push(Structure {
            name,
            kind,
            elements,
            bytes,
            bytes_per_reservation: bytes as f64 / reservations as f64,
        });
    }
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
    let redis_version = info.lines().find_map(|l| l.strip_prefix("redis_version:")).map(|v| v.trim().to_owned());
    Ok(MemoryReport {
        figures: Figures { redis_bytes_per_reservation: after.saturating_sub(before) as f64 / reservations as f64 },
        reservations,
        distinct_users,
        used_memory_before: before,
        used_memory_after: after,
        structures,
        fill_s,
        redis_version,
    })
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

pub fn render(r: &MemoryReport) -> String {
    let mut rows = vec![["structure", "kind", "elements", "bytes", "bytes per reservation"].map(String::from).to_vec()];
    for s in &r.structures {
        rows.push(vec![
            s.name.to_owned(),
            s.kind.to_owned(),
            s.elements.to_string(),
            s.bytes.to_string(),
            format!("{:.1}", s.bytes_per_reservation),
        ]);
    }
    format!(
        "Redis bytes per live reservation: {:.1} (used_memory {} -> {} over {} reservations of {} users, made in \
         {:.1} s; Redis {})\n{}",
        r.figures.redis_bytes_per_reservation,
        r.used_memory_before,
        r.used_memory_after,
        r.reservations,
        r.distinct_users,
        r.fill_s,
        r.redis_version.as_deref().unwrap_or("?"),
        render_table(&rows)
    )
}
