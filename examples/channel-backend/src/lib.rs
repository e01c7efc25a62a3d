//! The reference channel backend: the HTTP order API a shop's front end calls, over
//! [`inventory_client`]. The order id is the idempotency key; the HTTP codes are the
//! ones a front end expects (see [`router`]). What a team copies to start its own.
//!
//! Orders are kept in memory here (a backend keeps them in its database, and implements
//! [`inventory_client::OrderStore`] over that table so the generation rule survives its
//! restarts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use inventory_client::{Acquired, AgentClient, Error, Lookup, unix_ms};
use serde_json::{Value, json};

/// One order as the backend keeps it.
#[derive(Clone, Debug)]
struct Order {
    item: String,
    user: String,
    qty: u64,
    reservation_id: String,
    state: &'static str,
    expires_at: SystemTime,
}

/// A `POST /orders` body, checked field by field.
#[derive(Debug, PartialEq, Eq)]
pub struct NewOrder {
    /// The order id: the Acquire's idempotency key.
    pub order_id: String,
    /// The item.
    pub item_id: String,
    /// The buyer.
    pub user_id: String,
    /// Units (at least 1).
    pub quantity: u64,
}

impl NewOrder {
    /// Parses a body; the error names the field that is missing or of the wrong type.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let value: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
        let Value::Object(fields) = value else {
            return Err("body must be a JSON object with order_id, item_id, user_id, quantity".into());
        };
        let text = |name: &str| match fields.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(other) => Err(format!("{name} must be a non-empty string, got {other}")),
            None => Err(format!("{name} is missing")),
        };
        let quantity = match fields.get("quantity") {
            Some(Value::Number(n)) => match n.as_u64() {
                Some(q) if q >= 1 => q,
                _ => return Err(format!("quantity must be a whole number of at least 1, got {n}")),
            },
            Some(other) => return Err(format!("quantity must be a whole number of at least 1, got {other}")),
            None => return Err("quantity is missing".into()),
        };
        Ok(NewOrder { order_id: text("order_id")?, item_id: text("item_id")?, user_id: text("user_id")?, quantity })
    }
}

/// The backend's state: the agent client and the orders it took.
#[derive(Clone)]
pub struct Backend {
    client: AgentClient,
    orders: Arc<Mutex<HashMap<String, Order>>>,
}

impl Backend {
    /// A backend calling the agents through `client`.
    pub fn new(client: AgentClient) -> Self {
        Backend { client, orders: Arc::default() }
    }

    fn order(&self, id: &str) -> Option<Order> {
        self.orders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(id).cloned()
    }

    fn keep(&self, id: &str, order: Order) {
        self.orders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id.to_owned(), order);
    }
}

/// The routes: `POST /orders`, `POST /orders/{id}/pay|cancel|refund`, `GET /orders/{id}`,
/// `GET /items/{id}`, `GET /healthz`.
pub fn router(backend: Backend) -> Router {
    Router::new()
        .route("/orders", post(create))
        .route("/orders/{id}", get(show))
        .route("/orders/{id}/pay", post(pay))
        .route("/orders/{id}/cancel", post(cancel))
        .route("/orders/{id}/refund", post(refund))
        .route("/items/{id}", get(item))
        .route("/healthz", get(healthz))
        .with_state(backend)
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn refused(status: StatusCode, error: &str, message: impl std::fmt::Display) -> Response {
    reply(status, json!({ "error": error, "message": message.to_string() }))
}

fn retry_later(status: StatusCode, error: &str, message: impl std::fmt::Display, after: Duration) -> Response {
    let mut response = refused(status, error, message);
    let secs = after.as_secs_f64().ceil().max(1.0).to_string();
    if let Ok(v) = HeaderValue::from_str(&secs) {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
}

/// The one mapping from the client's errors to HTTP.
fn failed(e: &Error) -> Response {
    match e {
        Error::InvalidArgument(m) => refused(StatusCode::BAD_REQUEST, "invalid_argument", m),
        Error::NotFound(m) => refused(StatusCode::NOT_FOUND, "not_found", m),
        Error::KeyReused(m) => refused(StatusCode::CONFLICT, "order_id_reused", m),
        Error::PoolGenerationChanged { .. } => refused(StatusCode::CONFLICT, "reservation_lost", e),
        Error::FailedPrecondition(m) => refused(StatusCode::CONFLICT, "wrong_state", m),
        Error::RateLimited { retry_after, message } => retry_later(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            message,
            retry_after.unwrap_or(Duration::from_secs(1)),
        ),
        Error::Unavailable { .. } | Error::DeadlineExceeded { .. } => {
            retry_later(StatusCode::SERVICE_UNAVAILABLE, "retry_later", e, Duration::from_secs(1))
        }
        other => {
            tracing::warn!(error = %other, "agent call failed");
            refused(StatusCode::BAD_GATEWAY, "agent_error", other)
        }
    }
}

fn order_body(id: &str, o: &Order) -> Value {
    json!({
        "order_id": id,
        "item_id": o.item,
        "user_id": o.user,
        "quantity": o.qty,
        "reservation_id": o.reservation_id,
        "state": o.state,
        "expires_at_unix_ms": unix_ms(o.expires_at),
    })
}

async fn create(State(b): State<Backend>, body: Bytes) -> Response {
    let new = match NewOrder::parse(&body) {
        Ok(n) => n,
        Err(why) => return refused(StatusCode::BAD_REQUEST, "bad_request", why),
    };
    let known = b.order(&new.order_id);
    if let Some(o) = &known
        && (o.item.as_str(), o.user.as_str(), o.qty) != (new.item_id.as_str(), new.user_id.as_str(), new.quantity)
    {
        return refused(
            StatusCode::CONFLICT,
            "order_id_reused",
            format!("order_id {:?} was used for another item, user or quantity", new.order_id),
        );
    }
    match b.client.acquire(&new.item_id, &new.user_id, new.quantity, &new.order_id).await {
        Ok(Acquired::Reserved { id, qty, expires_at, replayed, .. }) => {
            let order = Order {
                item: new.item_id,
                user: new.user_id,
                qty,
                reservation_id: id,
                state: known.as_ref().map_or("reserved", |o| o.state),
                expires_at,
            };
            b.keep(&new.order_id, order.clone());
            let status = if replayed || known.is_some() { StatusCode::OK } else { StatusCode::CREATED };
            reply(status, order_body(&new.order_id, &order))
        }
        Ok(Acquired::SoldOut) => refused(StatusCode::GONE, "sold_out", format!("{} is sold out", new.item_id)),
        Ok(Acquired::LimitExceeded { remaining }) => reply(
            StatusCode::FORBIDDEN,
            json!({ "error": "limit_exceeded", "remaining": remaining,
                    "message": format!("user {} may take {remaining} more of {}", new.user_id, new.item_id) }),
        ),
        Ok(Acquired::NotStarted { opens_at }) => {
            let wait = opens_at.duration_since(SystemTime::now()).unwrap_or_default();
            let mut r = retry_later(StatusCode::FORBIDDEN, "not_started", "the sale has not opened yet", wait);
            *r.body_mut() = json!({ "error": "not_started", "opens_at_unix_ms": unix_ms(opens_at) }).to_string().into();
            r
        }
        Err(e) => failed(&e),
    }
}

async fn show(State(b): State<Backend>, Path(id): Path<String>) -> Response {
    let Some(mut order) = b.order(&id) else {
        return refused(StatusCode::NOT_FOUND, "not_found", format!("no order {id:?}"));
    };
    match b.client.reservation(&order.item, Lookup::Id(&order.reservation_id)).await {
        Ok(r) => {
            order.state = r.state.as_str();
            order.expires_at = r.expires_at;
            b.keep(&id, order.clone());
            reply(StatusCode::OK, order_body(&id, &order))
        }
        Err(e) => failed(&e),
    }
}

#[derive(Clone, Copy)]
enum Step {
    Pay,
    Cancel,
    Refund,
}

async fn step(b: Backend, id: String, step: Step) -> Response {
    let Some(mut order) = b.order(&id) else {
        return refused(StatusCode::NOT_FOUND, "not_found", format!("no order {id:?}"));
    };
    let (item, rid) = (order.item.clone(), order.reservation_id.clone());
    let answer = match step {
        Step::Pay => b.client.confirm(&item, &rid).await,
        Step::Cancel => b.client.cancel(&item, &rid).await,
        Step::Refund => b.client.refund(&item, &rid).await,
    };
    match answer {
        Ok(state) => {
            order.state = state.as_str();
            b.keep(&id, order.clone());
            reply(StatusCode::OK, order_body(&id, &order))
        }
        Err(e) => failed(&e),
    }
}

async fn pay(State(b): State<Backend>, Path(id): Path<String>) -> Response {
    step(b, id, Step::Pay).await
}

async fn cancel(State(b): State<Backend>, Path(id): Path<String>) -> Response {
    step(b, id, Step::Cancel).await
}

async fn refund(State(b): State<Backend>, Path(id): Path<String>) -> Response {
    step(b, id, Step::Refund).await
}

async fn item(State(b): State<Backend>, Path(id): Path<String>) -> Response {
    match b.client.stock(&id).await {
        Ok(s) => {
            let opens_in_ms = s.opens_at.map(|t| {
                u64::try_from(t.duration_since(SystemTime::now()).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
            });
            reply(
                StatusCode::OK,
                json!({
                    "item_id": id,
                    "available": s.available,
                    "reserved": s.reserved,
                    "sold": s.sold,
                    "sold_out": s.sold_out,
                    "opens_at_unix_ms": s.opens_at.map(unix_ms),
                    "opens_in_ms": opens_in_ms,
                }),
            )
        }
        Err(e) => failed(&e),
    }
}

async fn healthz(State(b): State<Backend>) -> Response {
    let healthy = b.client.healthy_replicas();
    let status = if healthy.is_empty() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    reply(status, json!({ "healthy_agents": healthy }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_body_is_refused_naming_the_field() {
        let ok = br#"{"order_id":"o-1","item_id":"skin","user_id":"u1","quantity":2}"#;
        assert_eq!(NewOrder::parse(ok).unwrap().quantity, 2);
        let err = |b: &[u8]| NewOrder::parse(b).unwrap_err();
        assert!(err(b"{not json").starts_with("body is not JSON"));
        assert!(err(b"[1]").contains("JSON object"));
        assert!(err(br#"{"order_id":"o","item_id":5,"user_id":"u","quantity":1}"#).starts_with("item_id must be"));
        assert!(err(br#"{"order_id":"o","item_id":"i","quantity":1}"#).starts_with("user_id is missing"));
        assert!(err(br#"{"order_id":"o","item_id":"i","user_id":"u","quantity":-1}"#).starts_with("quantity must"));
        assert!(err(br#"{"order_id":"o","item_id":"i","user_id":"u","quantity":"2"}"#).starts_with("quantity must"));
        assert!(err(br#"{"order_id":"","item_id":"i","user_id":"u","quantity":1}"#).starts_with("order_id must"));
    }
}
