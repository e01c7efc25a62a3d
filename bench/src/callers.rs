//! The other callers of the suite: the floor (gRPC health check), the bare script call on
//! the Redis store's connections, the naive baseline (one PostgreSQL row per purchase) and
//! center Borrow.

use std::sync::Arc;

use inventory_agent::store::PoolKey;
use inventory_agent::store::redis::RedisPoolStore;

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use sqlx::PgPool;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::acquire::CALL_TIMEOUT;
use crate::light;
use crate::load::{Caller, Class};

/// The statement of the naive baseline: the seeds' anti-pattern.
pub const NAIVE_UPDATE: &str = "UPDATE bench_naive_stock SET count = count - 1 WHERE id = $1 AND count > 0";

/// `grpc.health.v1.Health/Check`: the same server stack as Acquire, no work behind it.
pub enum HealthCaller {
    Tonic(HealthClient<Channel>),
    /// The light client: a pre-encoded request, the answer checked for SERVING.
    Light {
        conn: light::Conn,
        uri: http::Uri,
    },
}

impl HealthCaller {
    pub fn light(conn: light::Conn) -> anyhow::Result<Self> {
        Ok(Self::Light { uri: conn.uri(light::HEALTH_PATH)?, conn })
    }
}

impl Caller for HealthCaller {
    async fn call(&mut self) -> Class {
        match self {
            Self::Tonic(client) => {
                let mut request = tonic::Request::new(HealthCheckRequest { service: String::new() });
                request.set_timeout(CALL_TIMEOUT);
                match tokio::time::timeout(CALL_TIMEOUT, client.check(request)).await {
                    Ok(Ok(_)) => Class::Ok,
                    _ => Class::Error,
                }
            }
            Self::Light { conn, uri } => {
                match tokio::time::timeout(CALL_TIMEOUT, conn.unary(uri, light::health_frame(), None)).await {
                    Ok(Ok(message)) if light::serving(&message) => Class::Ok,
                    _ => Class::Error,
                }
            }
        }
    }
}

/// One script call that does nothing (`return 1` on the pool's key) through the Redis
/// store's own connections: what any script call costs Redis before it touches data.
pub struct BareScriptCaller {
    pub store: Arc<RedisPoolStore>,
    pub pool: PoolKey,
}

impl Caller for BareScriptCaller {
    async fn call(&mut self) -> Class {
        match tokio::time::timeout(CALL_TIMEOUT, self.store.bare_call(&self.pool)).await {
            Ok(Ok(())) => Class::Ok,
            _ => Class::Error,
        }
    }
}

/// One purchase = one committed `UPDATE` of one row, over a connection pool.
pub struct NaiveCaller {
    pub pool: PgPool,
}

impl Caller for NaiveCaller {
    async fn call(&mut self) -> Class {
        let update = sqlx::query(NAIVE_UPDATE).bind(1i32).execute(&self.pool);
        match tokio::time::timeout(CALL_TIMEOUT, update).await {
            Ok(Ok(r)) if r.rows_affected() == 1 => Class::Ok,
            Ok(Ok(_)) => Class::SoldOut,
            _ => Class::Error,
        }
    }
}

/// Center Borrow of one unit with a fresh request id per call, of its items in turn.
pub struct BorrowCaller {
    pub client: CenterClient<Channel>,
    pub items: Vec<String>,
    pub next: usize,
    pub channel: String,
    pub epoch: u64,
}

impl Caller for BorrowCaller {
    async fn call(&mut self) -> Class {
        let item = &self.items[self.next % self.items.len()];
        self.next = self.next.wrapping_add(1);
        let mut request = tonic::Request::new(pb::BorrowRequest {
            item_id: item.clone(),
            channel: self.channel.clone(),
            epoch: self.epoch,
            quantity: 1,
            request_id: uuid::Uuid::new_v4().simple().to_string(),
            sell_rate_milli: 0,
        });
        request.set_timeout(CALL_TIMEOUT);
        match tokio::time::timeout(CALL_TIMEOUT, self.client.borrow(request)).await {
            Ok(Ok(r)) if r.get_ref().granted > 0 => Class::Ok,
            Ok(Ok(_)) => Class::SoldOut,
            _ => Class::Error,
        }
    }
}
