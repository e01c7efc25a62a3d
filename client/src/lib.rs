//! A channel backend's client of its agent: the `inventory.v1.Agent` API as typed calls,
//! with the protocol's rules built in, so a backend cannot get them wrong.
//!
//! ```no_run
//! use inventory_client::{Acquired, AgentClient, Options};
//!
//! # async fn run() -> Result<(), inventory_client::Error> {
//! let client = AgentClient::connect(
//!     ["http://127.0.0.1:50052", "http://127.0.0.1:50062"],
//!     Options::default().token("backend-secret"),
//! )
//! .await?;
//! // The order id is the idempotency key: the same order never reserves twice.
//! if let Acquired::Reserved { id, .. } = client.acquire("skin-42", "user-7", 1, "order-1001").await? {
//!     client.confirm("skin-42", &id).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # The protocol rules
//!
//! This section is where the project states the rules a caller of an agent keeps; the
//! README and the `.proto` comments link here.
//!
//! **Keys.** Every Acquire (and AcquireBasket) carries an idempotency key chosen by the
//! caller: 1–64 bytes of `[A-Za-z0-9._:-]`, one per order (the order id is a good key).
//! A key that reserved returns that same reservation on every replay and never reserves
//! twice; the same key with another user, item or quantity is ALREADY_EXISTS
//! ([`Error::KeyReused`]). An answer that reserved nothing (sold out, limit reached, not
//! started) is not remembered: its replay is evaluated again. **A retry uses the same
//! key, never a new one**: a new key for the same order is a second order. Confirm,
//! Cancel, Refund and Extend name the reservation and are idempotent too.
//!
//! **Generations.** A reserved answer carries the pool's generation. The pool store
//! remembers keys only while the pool's data survives; when it loses them (a Redis
//! restart without persistence, FLUSHALL, a failover that lost writes), the agent freezes
//! the item until an operator resolves it, and the new pool has a new generation and
//! does not know the old keys. So a replay of a key that reserved sends the generation of
//! the first answer as `expect_pool_generation`; the agent refuses it
//! (FAILED_PRECONDITION, [`Error::PoolGenerationChanged`]) unless the pool still has that
//! generation, and reserves nothing. That order's reservation was lost with the pool:
//! settle it from the backend's own records instead of retrying. [`AgentClient::acquire`]
//! does this through an [`OrderStore`] (key → generation; in memory by default, the
//! backend's order table in production so the rule survives the backend's restarts).
//!
//! **Retry-safe codes.** UNAVAILABLE (a replica down or draining, its pool store down,
//! its lease expired, the item frozen after a loss), DEADLINE_EXCEEDED (no answer in
//! time: the call may or may not have happened) and RESOURCE_EXHAUSTED (the user sends
//! too fast, or the agent is overloaded) mean "send the same request again later"; so do
//! a connection that died mid-call (UNKNOWN, CANCELLED). The client retries them with the
//! same request, on another replica when one is down or silent (not when it throttles),
//! after a capped exponential backoff with jitter (or the server's
//! `grpc-retry-pushback-ms`), until the call's deadline ([`Options::deadline`]). Every
//! other code is final for that request: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
//! FAILED_PRECONDITION, UNAUTHENTICATED, PERMISSION_DENIED. [`Error::is_retry_safe`] says
//! which errors the backend may send again itself later (with the same key).
//!
//! **Outcomes for the shopper.** [`Acquired::SoldOut`]: nothing left in this channel
//! (for now: cancelled and expired reservations come back). [`Acquired::LimitExceeded`]:
//! the user reached the item's per-user limit (`remaining` says how many more they may
//! take). [`Acquired::NotStarted`]: the sale opens at `opens_at` by the center's clock.
//! None of them reserved anything.
//!
//! # Observing
//!
//! Each call runs in a `tracing` span (`agent.acquire`, `agent.confirm`, ...) that records
//! its attempts and outcome; the [`Metrics`] trait receives every attempt and call. The
//! client keeps no global state.

#![warn(missing_docs)]

mod client;
mod error;
mod observe;
mod options;
mod orders;
mod replicas;
pub mod retry;
mod types;

pub use client::AgentClient;
pub use error::Error;
pub use observe::{Metrics, NoMetrics};
pub use options::Options;
pub use orders::{MemoryOrderStore, OrderStore, StoreError};
pub use retry::Backoff;
pub use types::{Acquired, BasketAcquired, BasketLine, Lookup, Reservation, State, Stock, time, unix_ms};
