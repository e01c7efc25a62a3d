//! The Agent gRPC service: parses requests at the edge and calls [`Agent`]. Each call is
//! also counted here (Acquire latency, rejected calls, pool store errors): the one place
//! every answer passes through.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use inventory_core::{ItemId, RequestId, UserId, ValidationError};
use inventory_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::agent::Agent;
use crate::error::AgentError;
use crate::metrics::Method;
use crate::selling::AcquireRequest;
use crate::store::ReservationRef;
use crate::wire::reservation_state_pb;

/// The longest Extend asks for: 1e9 ms (about 11.6 days), far beyond any reservation TTL.
const MAX_EXTEND_MS: u64 = 1_000_000_000;

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

    async fn refund_inner(&self, r: &pb::RefundRequest) -> Result<pb::RefundResponse, AgentError> {
        let item = ItemId::parse("item_id", &r.item_id)?;
        let id = RequestId::parse("reservation_id", &r.reservation_id)?;
        let state = self.agent.selling.refund(&item, id.as_str()).await?;
        Ok(pb::RefundResponse { state: reservation_state_pb(state) })
    }

    async fn get_reservation_inner(
        &self,
        r: &pb::GetReservationRequest,
    ) -> Result<pb::GetReservationResponse, AgentError> {
        let item = ItemId::parse("item_id", &r.item_id)?;
        let by = parse_reservation_ref(&r.reservation_id, &r.idempotency_key)?;
        let reservation = self.agent.selling.reservation(&item, &by).await?;
        Ok(pb::GetReservationResponse { reservation: Some(reservation) })
    }

    async fn extend_inner(&self, r: &pb::ExtendRequest) -> Result<pb::ExtendResponse, AgentError> {
        let item = ItemId::parse("item_id", &r.item_id)?;
        let id = RequestId::parse("reservation_id", &r.reservation_id)?;
        if r.extend_ms == 0 || r.extend_ms > MAX_EXTEND_MS {
            return Err(ValidationError::new("extend_ms", r.extend_ms, format!("must be 1..={MAX_EXTEND_MS}")).into());
        }
        self.agent.selling.extend(&item, id.as_str(), r.extend_ms).await
    }

    async fn stream_events_inner(&self, r: &pb::StreamEventsRequest) -> Result<EventStream, AgentError> {
        let item = match r.item_id.as_str() {
            "" => None,
            id => Some(self.agent.item(&ItemId::parse("item_id", id)?).await?),
        };
        if self.agent.is_draining() {
            return Err(AgentError::Unavailable("agent is shutting down; stream from another agent".into()));
        }
        let rx = self.agent.events.stream(item, r.from_sequence);
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok)))
    }
}

/// Exactly one of `reservation_id` and `idempotency_key`, each validated like everywhere else.
pub fn parse_reservation_ref(reservation_id: &str, idempotency_key: &str) -> Result<ReservationRef, AgentError> {
    match (reservation_id.is_empty(), idempotency_key.is_empty()) {
        (false, true) => Ok(ReservationRef::Id(RequestId::parse("reservation_id", reservation_id)?.to_string())),
        (true, false) => {
            Ok(ReservationRef::IdempotencyKey(RequestId::parse("idempotency_key", idempotency_key)?.to_string()))
        }
        (true, true) => Err(ValidationError::new(
            "reservation_id",
            reservation_id,
            "give exactly one of reservation_id and idempotency_key (both are empty)",
        )
        .into()),
        (false, false) => Err(ValidationError::new(
            "idempotency_key",
            idempotency_key,
            format!(
                "give exactly one of reservation_id and idempotency_key (reservation_id is {reservation_id:?} too)"
            ),
        )
        .into()),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ReservationEvent, Status>> + Send + 'static>>;

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
    Ok(AcquireRequest {
        item,
        user,
        quantity,
        idempotency_key: key.to_string(),
        expect_pool_generation,
        allow_partial: r.allow_partial,
    })
}

/// Parses an AcquireBasket: user, key, 1..=32 lines, each item's lines summed
/// (`inventory_core::basket::Basket::parse`).
pub fn parse_basket(r: &pb::AcquireBasketRequest) -> Result<inventory_core::basket::Basket, AgentError> {
    let lines: Vec<(&str, u64)> = r.lines.iter().map(|l| (l.item_id.as_str(), l.quantity)).collect();
    Ok(inventory_core::basket::Basket::parse(&r.user_id, &r.idempotency_key, &lines)?)
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
                let channel = self.agent.link.channel.as_str();
                let pool = crate::store::PoolKey::new(channel, item.as_str());
                stock.published_event_sequence = self.agent.relay.published_sequence(&pool, stock.pool_generation);
                for seg in &mut stock.segments {
                    let pool = crate::store::PoolKey::segment(channel, item.as_str(), seg.segment);
                    seg.published_event_sequence = self.agent.relay.published_sequence(&pool, seg.pool_generation);
                }
                stock
            }),
            Err(e) => Err(e.into()),
        };
        self.answer(Method::GetStock, result)
    }

    async fn refund(&self, request: Request<pb::RefundRequest>) -> Res<pb::RefundResponse> {
        let result = self.refund_inner(request.get_ref()).await;
        self.answer(Method::Refund, result)
    }

    async fn get_reservation(&self, request: Request<pb::GetReservationRequest>) -> Res<pb::GetReservationResponse> {
        let result = self.get_reservation_inner(request.get_ref()).await;
        self.answer(Method::GetReservation, result)
    }

    async fn extend(&self, request: Request<pb::ExtendRequest>) -> Res<pb::ExtendResponse> {
        let result = self.extend_inner(request.get_ref()).await;
        self.answer(Method::Extend, result)
    }

    type StreamEventsStream = EventStream;

    async fn stream_events(&self, request: Request<pb::StreamEventsRequest>) -> Res<EventStream> {
        let result = self.stream_events_inner(request.get_ref()).await;
        self.answer(Method::StreamEvents, result)
    }

    async fn acquire_basket(&self, request: Request<pb::AcquireBasketRequest>) -> Res<pb::AcquireBasketResponse> {
        let result = match parse_basket(request.get_ref()) {
            Ok(basket) => self.agent.baskets.acquire(&self.agent.selling, basket).await,
            Err(e) => Err(e),
        };
        self.answer(Method::AcquireBasket, result)
    }

    async fn confirm_basket(&self, request: Request<pb::ConfirmBasketRequest>) -> Res<pb::ConfirmBasketResponse> {
        let result = match RequestId::parse("basket_id", &request.get_ref().basket_id) {
            Ok(id) => self
                .agent
                .baskets
                .confirm(&self.agent.selling, id.as_str())
                .await
                .map(|s| pb::ConfirmBasketResponse { state: reservation_state_pb(s) }),
            Err(e) => Err(e.into()),
        };
        self.answer(Method::ConfirmBasket, result)
    }

    async fn cancel_basket(&self, request: Request<pb::CancelBasketRequest>) -> Res<pb::CancelBasketResponse> {
        let result = match RequestId::parse("basket_id", &request.get_ref().basket_id) {
            Ok(id) => self
                .agent
                .baskets
                .cancel(&self.agent.selling, id.as_str())
                .await
                .map(|s| pb::CancelBasketResponse { state: reservation_state_pb(s) }),
            Err(e) => Err(e.into()),
        };
        self.answer(Method::CancelBasket, result)
    }
}
