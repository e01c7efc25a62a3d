//! The suite's callers of each phase, built once per run (connections, workloads, the
//! items they need), and the sell-out that phase h measures after.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use inventory_agent::store::redis::{DEFAULT_ACQUIRE_BATCH_MAX, DEFAULT_CONNECTIONS, RedisPoolStore};
use inventory_agent::store::{PoolKey, PoolStore};
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_proto::v1::center_client::CenterClient;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;

use super::{
    BIG_STOCK, BORROW_ITEMS, DRAIN_LIMIT, NAIVE_STOCK, PER_USER_LIMIT, RESERVATION_TTL_MS, Runner, SOLD_OUT_STOCK,
    borrow_item, naive_connections,
};
use crate::acquire::{AcquireCaller, Target, Workload};
use crate::callers::{BareScriptCaller, BorrowCaller, HealthCaller, NaiveCaller};
use crate::env::{AgentHandle, channels};
use crate::load::{self, LoadSpec};
use crate::report::ClientKind;
use crate::skew::UserSampler;

impl Runner<'_> {
    /// `concurrency` callers over `connections` gRPC connections to `url`.
    async fn connect<C>(&self, url: &str, make: impl FnMut(Channel) -> C) -> anyhow::Result<Vec<C>> {
        let conns = channels(url, self.opts.connections).await?;
        Ok(conns.into_iter().cycle().take(self.opts.concurrency).map(make).collect())
    }

    fn workload(&self, item: &str, tag: &str) -> anyhow::Result<Arc<Workload>> {
        Ok(Arc::new(Workload {
            item: item.to_owned(),
            quantity: 1,
            users: Arc::new(UserSampler::new(self.opts.users, self.opts.skew).map_err(anyhow::Error::msg)?),
            replay_share: self.opts.replay_share,
            run_id: format!("{tag}{:x}", rand::random::<u32>()),
            seed: self.opts.seed,
            authorization: None,
        }))
    }

    pub(super) async fn health_callers(&self, url: &str) -> anyhow::Result<Vec<HealthCaller>> {
        match self.opts.client {
            ClientKind::Tonic => self.connect(url, |c| HealthCaller::Tonic(HealthClient::new(c))).await,
            ClientKind::Light => {
                let conns = crate::light::connect(url, self.opts.connections).await?;
                conns.into_iter().cycle().take(self.opts.concurrency).map(HealthCaller::light).collect()
            }
        }
    }

    pub(super) async fn agent_callers(
        &self,
        agent: &AgentHandle,
        item: &str,
        tag: &str,
    ) -> anyhow::Result<Vec<AcquireCaller>> {
        let workload = self.workload(item, tag)?;
        if self.opts.client == ClientKind::Light {
            let conns = crate::light::connect(&agent.url, self.opts.connections).await?;
            return (0..self.opts.concurrency)
                .map(|i| AcquireCaller::light(i + 1, conns[i % conns.len()].clone(), Arc::clone(&workload)))
                .collect();
        }
        let mut index = 0;
        self.connect(&agent.url, |c| {
            index += 1;
            AcquireCaller::new(index, Target::Agent(AgentClient::new(c)), Arc::clone(&workload))
        })
        .await
    }

    /// Callers of `RedisPoolStore::acquire`, one store (one multiplexed Redis connection)
    /// per gRPC connection the other phases use.
    pub(super) async fn lua_callers(&self) -> anyhow::Result<Vec<AcquireCaller>> {
        let pool = PoolKey::new("lua-direct", "bench-lua");
        let mut stores = Vec::new();
        for _ in 0..self.opts.connections {
            let store = RedisPoolStore::with_connections(&self.redis.url, &self.redis.prefix, 1).await?;
            let batch_max = self.opts.redis.batch_max.unwrap_or(DEFAULT_ACQUIRE_BATCH_MAX);
            stores.push(Arc::new(store.with_acquire_batch_max(batch_max)));
        }
        stores[0].refill(&pool, "bench-refill", BIG_STOCK, 0).await?;
        let workload = self.workload("bench-lua", "d")?;
        Ok((0..self.opts.concurrency)
            .map(|i| {
                let target = Target::Store {
                    store: Arc::clone(&stores[i % stores.len()]),
                    pool: pool.clone(),
                    segments: 1,
                    per_user_limit: PER_USER_LIMIT,
                    reservation_ttl_ms: RESERVATION_TTL_MS,
                };
                AcquireCaller::new(i, target, Arc::clone(&workload))
            })
            .collect())
    }

    /// Callers of a bare script call (d0) on one store built as the Redis agent builds
    /// its own (the same number of multiplexed connections, used in turn), one call per
    /// request: group commit never joins these.
    pub(super) async fn bare_callers(&self) -> anyhow::Result<Vec<BareScriptCaller>> {
        let connections = self.opts.redis.connections.unwrap_or(DEFAULT_CONNECTIONS);
        let store = Arc::new(RedisPoolStore::with_connections(&self.redis.url, &self.redis.prefix, connections).await?);
        let pool = PoolKey::new("bare-script", "bench-bare");
        Ok((0..self.opts.concurrency)
            .map(|_| BareScriptCaller { store: Arc::clone(&store), pool: pool.clone() })
            .collect())
    }

    pub(super) async fn naive_callers(&mut self) -> anyhow::Result<Vec<NaiveCaller>> {
        let size = naive_connections(self.opts.concurrency);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .min_connections(size)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&self.db.url)
            .await
            .context("connect the naive baseline's pool")?;
        sqlx::query("CREATE TABLE bench_naive_stock (id INT PRIMARY KEY, count BIGINT NOT NULL)")
            .execute(&pool)
            .await?;
        sqlx::query("INSERT INTO bench_naive_stock (id, count) VALUES (1, $1)")
            .bind(NAIVE_STOCK)
            .execute(&pool)
            .await?;
        self.fx.naive_pool = Some(pool.clone());
        Ok((0..self.opts.concurrency).map(|_| NaiveCaller { pool: pool.clone() }).collect())
    }

    /// `spread`: over [`BORROW_ITEMS`] items (phase j), each caller starting at another;
    /// else all on one item (phase f).
    pub(super) async fn borrow_callers(&self, spread: bool) -> anyhow::Result<Vec<BorrowCaller>> {
        // A channel per phase: registering one must not make the other's epoch stale.
        let channel = if spread { "bench-center-spread" } else { "bench-center" };
        let conns = channels(&self.world.center.url, 1).await?;
        let reg = CenterClient::new(conns[0].clone())
            .register_agent(pb::RegisterAgentRequest {
                channel: channel.into(),
                agent_id: format!("{channel}-1"),
                fenced_at: 0,
            })
            .await?
            .into_inner();
        let items: Vec<String> =
            if spread { (0..BORROW_ITEMS).map(borrow_item).collect() } else { vec!["bench-borrow".into()] };
        let mut index = 0;
        self.connect(&self.world.center.url, |c| {
            index += 1;
            BorrowCaller {
                client: CenterClient::new(c),
                items: items.clone(),
                // Callers start apart, so the items are borrowed evenly from the start.
                next: index * 7,
                channel: channel.into(),
                epoch: reg.epoch,
            }
        })
        .await
    }

    /// Sells the small item out (closed loop until the agent says sold out everywhere) and
    /// returns the callers, whose ledgers keep what they reserved.
    pub(super) async fn sell_out(&self) -> anyhow::Result<Vec<AcquireCaller>> {
        let item = "bench-soldout";
        let agent = &self.world.redis_agent;
        let callers = self.agent_callers(agent, item, "h").await?;
        let probe = AgentClient::new(channels(&agent.url, 1).await?.remove(0));
        eprintln!("bench: selling out {SOLD_OUT_STOCK} units of {item} ...");
        let stop = Arc::new(AtomicBool::new(false));
        let monitor = tokio::spawn(watch_sold_out(probe, item.to_owned(), Arc::clone(&stop)));
        let drain =
            LoadSpec { warmup: Duration::ZERO, duration: DRAIN_LIMIT, stop: Some(Arc::clone(&stop)), ..self.spec() };
        let (report, callers) = load::run(&drain, callers).await?;
        stop.store(true, Ordering::Relaxed);
        let (sold_out, last) = monitor.await.unwrap_or((false, None));
        anyhow::ensure!(
            sold_out,
            "item {item} did not sell out within {DRAIN_LIMIT:?}: answers {:?}, last stock {last:?}",
            report.warmup
        );
        Ok(callers)
    }
}

/// Polls GetStock until the agent reports the item sold out everywhere (its pool empty and
/// the center dry), then sets `stop`. Returns whether it saw that, and the last answer.
async fn watch_sold_out(
    mut client: AgentClient<Channel>,
    item: String,
    stop: Arc<AtomicBool>,
) -> (bool, Option<pb::GetStockResponse>) {
    let mut last = None;
    while !stop.load(Ordering::Relaxed) {
        if let Ok(answer) = client.get_stock(pb::GetStockRequest { item_id: item.clone() }).await {
            let answer = answer.into_inner();
            if answer.sold_out {
                stop.store(true, Ordering::Relaxed);
                return (true, Some(answer));
            }
            last = Some(answer);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (false, last)
}
