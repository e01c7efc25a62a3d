//! [`AgentClient`]: the typed calls, each through the one retry loop.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inventory_proto::v1 as pb;
use tonic::Code;
use tracing::Instrument;

use crate::replicas::{self, Agent, Replicas};
use crate::retry::{self, Bounds, Failed, Next, Pushback};
use crate::types::{Acquired, BasketAcquired, Lookup, Reservation, State, Stock};
use crate::{Error, Options};

/// A client of one channel's agent, spread over its replicas. Cheap to clone (clones
/// share connections and health); the health checker stops when the last clone is
/// dropped. See the [crate docs](crate) for the protocol rules it keeps.
#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
    deadline: Duration,
}

struct Inner {
    replicas: Arc<Replicas>,
    options: Options,
    health: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.health.abort();
    }
}

/// A request with the attempt's timeout, so the agent knows when the client stops waiting.
fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.set_timeout(timeout);
    req
}

impl AgentClient {
    /// A client of the agent replicas at `endpoints` (`http://` or `https://` URLs of one
    /// channel's agents). Fails only on a bad URL or option; replicas that are down now
    /// are skipped until their health check passes. Waits for one round of health checks
    /// (at most the connect timeout), then checks every `health_interval`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), inventory_client::Error> {
    /// use inventory_client::{AgentClient, Options};
    ///
    /// let agents = ["http://10.0.0.5:50052", "http://10.0.0.6:50052"];
    /// let client = AgentClient::connect(agents, Options::default().token("backend-secret")).await?;
    /// # let _ = client;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect<I, S>(endpoints: I, options: Options) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let replicas = Arc::new(Replicas::new(endpoints.into_iter().map(Into::into).collect(), &options)?);
        replicas.check(options.connect_timeout).await;
        let health =
            tokio::spawn(replicas::watch(Arc::downgrade(&replicas), options.health_interval, options.connect_timeout));
        let deadline = options.deadline;
        Ok(AgentClient { inner: Arc::new(Inner { replicas, options, health }), deadline })
    }

    /// The same client with another overall deadline for each call.
    pub fn with_deadline(&self, deadline: Duration) -> Self {
        AgentClient { inner: Arc::clone(&self.inner), deadline }
    }

    /// The URLs of the replicas whose last health check passed.
    pub fn healthy_replicas(&self) -> Vec<String> {
        self.inner.replicas.healthy()
    }

    /// Reserves `qty` units of `item` for `user` under the idempotency `key` (the
    /// backend's order id). Retried with the same key until an answer or the deadline;
    /// when the [`OrderStore`](crate::OrderStore) knows the key's generation, it is sent
    /// as `expect_pool_generation`, and a reserved answer's generation is recorded there.
    ///
    /// ```no_run
    /// # async fn run(client: inventory_client::AgentClient) -> Result<(), inventory_client::Error> {
    /// use inventory_client::Acquired;
    ///
    /// match client.acquire("skin-42", "user-7", 1, "order-1001").await? {
    ///     Acquired::Reserved { id, expires_at, .. } => println!("pay {id} before {expires_at:?}"),
    ///     Acquired::SoldOut => println!("sold out"),
    ///     Acquired::LimitExceeded { remaining } => println!("{remaining} more allowed"),
    ///     Acquired::NotStarted { opens_at } => println!("opens at {opens_at:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, item: &str, user: &str, qty: u64, key: &str) -> Result<Acquired, Error> {
        let orders = &self.inner.options.orders;
        let expected = orders.generation(item, key).await.map_err(|e| Error::OrderStore(e.to_string()))?;
        let message = pb::AcquireRequest {
            item_id: item.into(),
            user_id: user.into(),
            quantity: qty,
            idempotency_key: key.into(),
            expect_pool_generation: expected.unwrap_or(0),
            allow_partial: false,
        };
        let span = tracing::info_span!(
            "agent.acquire",
            item,
            key,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let answer = self
            .call("acquire", span, crate::types::acquire_kind, |mut agent, t| {
                let message = message.clone();
                async move { agent.acquire(request(message, t)).await }
            })
            .await;
        let acquired = match answer {
            Ok(r) => Acquired::from_pb(r)?,
            Err(Error::FailedPrecondition(message)) if expected.is_some() => {
                return Err(Error::PoolGenerationChanged { expected: expected.unwrap_or(0), message });
            }
            Err(e) => return Err(e),
        };
        if let Acquired::Reserved { generation, .. } = &acquired {
            orders.remember(item, key, *generation).await.map_err(|e| Error::OrderStore(e.to_string()))?;
        }
        Ok(acquired)
    }

    /// Confirms (pays) a reservation; confirming a confirmed one answers
    /// [`State::Confirmed`] again.
    pub async fn confirm(&self, item: &str, id: &str) -> Result<State, Error> {
        let message = pb::ConfirmRequest { item_id: item.into(), reservation_id: id.into() };
        let span = tracing::info_span!(
            "agent.confirm",
            item,
            id,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("confirm", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.confirm(request(message, t)).await }
            })
            .await?;
        State::from_pb(r.state())
    }

    /// Cancels a reservation: its units go back on sale.
    pub async fn cancel(&self, item: &str, id: &str) -> Result<State, Error> {
        let message = pb::CancelRequest { item_id: item.into(), reservation_id: id.into() };
        let span = tracing::info_span!(
            "agent.cancel",
            item,
            id,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("cancel", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.cancel(request(message, t)).await }
            })
            .await?;
        State::from_pb(r.state())
    }

    /// Refunds a confirmed reservation: its units go back on sale.
    pub async fn refund(&self, item: &str, id: &str) -> Result<State, Error> {
        let message = pb::RefundRequest { item_id: item.into(), reservation_id: id.into() };
        let span = tracing::info_span!(
            "agent.refund",
            item,
            id,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("refund", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.refund(request(message, t)).await }
            })
            .await?;
        State::from_pb(r.state())
    }

    /// Pushes a reserved reservation's expiry out to now + `by` (at most the item's
    /// reservation TTL); answers the state and the new expiry.
    pub async fn extend(&self, item: &str, id: &str, by: Duration) -> Result<(State, std::time::SystemTime), Error> {
        let extend_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let message = pb::ExtendRequest { item_id: item.into(), reservation_id: id.into(), extend_ms };
        let span = tracing::info_span!(
            "agent.extend",
            item,
            id,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("extend", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.extend(request(message, t)).await }
            })
            .await?;
        Ok((State::from_pb(r.state())?, crate::types::time(r.expires_at_unix_ms)))
    }

    /// One reservation, by id or by the Acquire's key, while the pool remembers it.
    pub async fn reservation(&self, item: &str, by: Lookup<'_>) -> Result<Reservation, Error> {
        let (reservation_id, idempotency_key) = match by {
            Lookup::Id(id) => (id.to_owned(), String::new()),
            Lookup::Key(key) => (String::new(), key.to_owned()),
        };
        let message = pb::GetReservationRequest { item_id: item.into(), reservation_id, idempotency_key };
        let span = tracing::info_span!(
            "agent.reservation",
            item,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("reservation", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.get_reservation(request(message, t)).await }
            })
            .await?;
        Reservation::from_pb(r.reservation.ok_or_else(|| Error::Protocol("no reservation in the answer".into()))?)
    }

    /// The channel's pool of `item`.
    pub async fn stock(&self, item: &str) -> Result<Stock, Error> {
        let message = pb::GetStockRequest { item_id: item.into() };
        let span =
            tracing::info_span!("agent.stock", item, attempts = tracing::field::Empty, outcome = tracing::field::Empty);
        let r = self
            .call("stock", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.get_stock(request(message, t)).await }
            })
            .await?;
        Ok(Stock::from(r))
    }

    /// Reserves every line (`(item, qty)`) of a basket for `user`, or none, under `key`.
    pub async fn acquire_basket(&self, user: &str, key: &str, lines: &[(&str, u64)]) -> Result<BasketAcquired, Error> {
        let message = pb::AcquireBasketRequest {
            user_id: user.into(),
            idempotency_key: key.into(),
            lines: lines
                .iter()
                .map(|(item, quantity)| pb::BasketLine { item_id: (*item).into(), quantity: *quantity })
                .collect(),
        };
        let span = tracing::info_span!(
            "agent.acquire_basket",
            key,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("acquire_basket", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.acquire_basket(request(message, t)).await }
            })
            .await?;
        BasketAcquired::from_pb(r)
    }

    /// Confirms every reservation of a reserved basket.
    pub async fn confirm_basket(&self, basket_id: &str) -> Result<State, Error> {
        let message = pb::ConfirmBasketRequest { basket_id: basket_id.into() };
        let span = tracing::info_span!(
            "agent.confirm_basket",
            basket_id,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("confirm_basket", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.confirm_basket(request(message, t)).await }
            })
            .await?;
        State::from_pb(r.state())
    }

    /// Cancels every reservation of a reserved basket.
    pub async fn cancel_basket(&self, basket_id: &str) -> Result<State, Error> {
        let message = pb::CancelBasketRequest { basket_id: basket_id.into() };
        let span = tracing::info_span!(
            "agent.cancel_basket",
            basket_id,
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let r = self
            .call("cancel_basket", span, ok, |mut agent, t| {
                let message = message.clone();
                async move { agent.cancel_basket(request(message, t)).await }
            })
            .await?;
        State::from_pb(r.state())
    }

    /// The retry loop every call goes through: attempts on the replicas as
    /// [`retry::next`] decides, the same request each time, within the deadline.
    async fn call<T, F, Fut>(
        &self,
        method: &'static str,
        span: tracing::Span,
        kind: fn(&T) -> &'static str,
        mut attempt: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Agent, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let deadline = started + self.deadline;
        let options = &self.inner.options;
        let replicas = &self.inner.replicas;
        let bounds = Bounds { backoff: options.backoff, max_attempts: options.max_attempts };
        let mut replica = replicas.first();
        let mut attempts = 0;
        let result = async {
            loop {
                attempts += 1;
                let remaining = deadline.saturating_duration_since(Instant::now());
                let timeout = remaining.min(options.attempt_timeout);
                let r = &replicas.list[replica];
                let status = match tokio::time::timeout(timeout, attempt(r.agent.clone(), timeout)).await {
                    Ok(Ok(answer)) => {
                        options.metrics.attempt(method, &r.url, Code::Ok);
                        return Ok(answer.into_inner());
                    }
                    Ok(Err(status)) => status,
                    Err(_) => tonic::Status::deadline_exceeded(format!("no answer from {} within {timeout:?}", r.url)),
                };
                options.metrics.attempt(method, &r.url, status.code());
                let pushback = status
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .map(|v| v.to_str().map_or(Pushback::Stop, retry::parse_pushback));
                let failed = Failed { code: status.code(), attempt: attempts, pushback };
                let remaining = deadline.saturating_duration_since(Instant::now());
                match retry::next(&bounds, failed, remaining, rand::random::<f64>()) {
                    Next::Retry { after, switch } => {
                        tracing::debug!(replica = %r.url, code = ?status.code(), message = status.message(), ?after, "retrying");
                        if switch {
                            if is_transport(&status) {
                                replicas.mark_down(replica);
                            }
                            replica = replicas.after(replica);
                        }
                        tokio::time::sleep(after).await;
                    }
                    Next::GiveUp(why) => {
                        let retry_after = match pushback {
                            Some(Pushback::After(d)) => Some(d),
                            _ => None,
                        };
                        tracing::debug!(replica = %r.url, code = ?status.code(), ?why, "giving up");
                        return Err(Error::from_status(&status, attempts, retry_after));
                    }
                }
            }
        }
        .instrument(span.clone())
        .await;
        let outcome = match &result {
            Ok(answer) => kind(answer),
            Err(e) => e.kind(),
        };
        span.record("attempts", attempts);
        span.record("outcome", outcome);
        options.metrics.call(method, outcome, attempts, started.elapsed());
        result
    }
}

fn ok<T>(_: &T) -> &'static str {
    "ok"
}

/// A failure of the connection rather than an answer of the agent: the replica is down
/// or unreachable (the agent's own UNAVAILABLE answers come with its message).
fn is_transport(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    status.source().is_some() || matches!(status.code(), Code::Unknown | Code::Cancelled | Code::DeadlineExceeded)
}
