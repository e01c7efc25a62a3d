//! The Agent gRPC service: parses requests at the edge and calls [`Agent`].

use std::sync::Arc;

use inventory_core::{ItemId, RequestId, UserId};
use inventory_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::agent::{AcquireRequest, Agent, reservation_state_pb};
use crate::error::AgentError;

pub struct AgentService {
    agent: Arc<Agent>,
}

impl AgentService {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self { agent }
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
    Ok(AcquireRequest { item, user, quantity, idempotency_key: key.to_string() })
}

type Res<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::agent_server::Agent for AgentService {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Res<pb::AcquireResponse> {
        let req = parse_acquire(request.get_ref())?;
        Ok(Response::new(self.agent.acquire(req).await?))
    }

    async fn confirm(&self, request: Request<pb::ConfirmRequest>) -> Res<pb::ConfirmResponse> {
        let r = request.get_ref();
        let item = ItemId::parse("item_id", &r.item_id).map_err(AgentError::from)?;
        let id = RequestId::parse("reservation_id", &r.reservation_id).map_err(AgentError::from)?;
        let state = self.agent.confirm(&item, id.as_str()).await?;
        Ok(Response::new(pb::ConfirmResponse { state: reservation_state_pb(state) }))
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> Res<pb::CancelResponse> {
        let r = request.get_ref();
        let item = ItemId::parse("item_id", &r.item_id).map_err(AgentError::from)?;
        let id = RequestId::parse("reservation_id", &r.reservation_id).map_err(AgentError::from)?;
        let state = self.agent.cancel(&item, id.as_str()).await?;
        Ok(Response::new(pb::CancelResponse { state: reservation_state_pb(state) }))
    }

    async fn get_stock(&self, request: Request<pb::GetStockRequest>) -> Res<pb::GetStockResponse> {
        let item = ItemId::parse("item_id", &request.get_ref().item_id).map_err(AgentError::from)?;
        Ok(Response::new(self.agent.get_stock(&item).await?))
    }
}
