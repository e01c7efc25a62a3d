//! The Agent gRPC service: parses requests at the edge and calls [`Agent`]. Each call is
//! also counted here (Acquire latency, rejected calls, pool store errors): the one place
//! every answer passes through.

use std::sync::Arc;
use std::time::Instant;

use inventory_core::{ItemId, RequestId, UserId};
use inventory_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::agent::Agent;
use crate::error::AgentError;
use crate::metrics::Method;
use crate::selling::{AcquireRequest, reservation_state_pb};

pub struct AgentService {
    agent: Arc<Agent>,
}

impl AgentService {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self { agent }
    }

    /// Counts an error answer (and whether the pool store caused it), then maps it.
    fn answer<T>(&self, method: Method, result: Result<T, AgentError>) -> Res<T> {
        match result {
            Ok(v) => Ok(Response::new(v)),
            Err(e) => {
                if e.is_pool_store_error() {
                    self.agent.metrics.pool_store_error();
                }
                let status = Status::from(e);
                self.agent.metrics.rejected(method, status.code());
                Err(status)
            }
        }
    }

    async fn confirm_inner(&self, r: &pb::ConfirmRequest) -> Result<pb::ConfirmResponse, AgentError> {
        let item = ItemId::parse("item_id", &r.item_id)?;
        let id = RequestId::parse("reservation_id", &r.reservation_id)?;
        let state = self.agent.selling.confirm(&item, id.as_str()).await?;
        Ok(pb::ConfirmResponse { state: reservation_state_pb(state) })
    }

    async fn cancel_inner(&self, r: &pb::CancelRequest) -> Result<pb::CancelResponse, AgentError> {
        let item = ItemId::parse("item_id", &r.item_id)?;
        let id = RequestId::parse("reservation_id", &r.reservation_id)?;
        let state = self.agent.selling.cancel(&item, id.as_str()).await?;
        Ok(pb::CancelResponse { state: reservation_state_pb(state) })
    }
}

/// Parses an Acquire. Quantity 0 means 1; the per-user limit is checked against the item.
pub fn parse_acquire(r: &pb::AcquireRequest) -> Result<AcquireRequest, AgentError> {
    let item = ItemId::parse("item_id", &r.item_id)?;
    let user = UserId::parse("user_id", &r.user_id)?;
    let key = RequestId::parse("idempotency_key", &r.idempotency_key)?;
    let quantity = match r.quantity {
        0 => 1,
        q => inventory_core::Quantity::parse("quantity", q)?.get(),
    };
    // 0 is proto3's "not set"; no pool that answered a reservation has generation 0.
    let expect_pool_generation = (r.expect_pool_generation != 0).then_some(r.expect_pool_generation);
    Ok(AcquireRequest { item, user, quantity, idempotency_key: key.to_string(), expect_pool_generation })
}

type Res<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::agent_server::Agent for AgentService {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Res<pb::AcquireResponse> {
        let started = Instant::now();
        let result = match parse_acquire(request.get_ref()) {
            Ok(req) => self.agent.selling.acquire(req).await,
            Err(e) => Err(e),
        };
        self.agent.metrics.observe_acquire(started.elapsed());
        self.answer(Method::Acquire, result)
    }

    async fn confirm(&self, request: Request<pb::ConfirmRequest>) -> Res<pb::ConfirmResponse> {
        let result = self.confirm_inner(request.get_ref()).await;
        self.answer(Method::Confirm, result)
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> Res<pb::CancelResponse> {
        let result = self.cancel_inner(request.get_ref()).await;
        self.answer(Method::Cancel, result)
    }

    async fn get_stock(&self, request: Request<pb::GetStockRequest>) -> Res<pb::GetStockResponse> {
        let result = match ItemId::parse("item_id", &request.get_ref().item_id) {
            Ok(item) => self.agent.selling.get_stock(&item).await.map(|mut stock| {
                let pool = crate::store::PoolKey::new(self.agent.link.channel.as_str(), item.as_str());
                stock.published_event_sequence = self.agent.relay.published_sequence(&pool, stock.pool_generation);
                stock
            }),
            Err(e) => Err(e.into()),
        };
        self.answer(Method::GetStock, result)
    }
}
