//! The inventory agent of one sales channel: a driver of the channel rules in
//! [`inventory_core::channel`].
//!
//! - [`store`]: local pools (Redis Lua or in-memory), one trait, one contract suite;
//! - [`items`]: the items sold, each one's rules behind a short lock, loaded on first use;
//! - [`selling`]: the hot path (Acquire) and the reservation calls;
//! - [`stocking`]: carries out each item's Borrows, Returns and resyncs, one at a time;
//! - [`segmented`]: an item's segment pools as one pool for the rules, and moves between them;
//! - [`segment_health`]: which segments the store lost, and one generation for many;
//! - [`reporting`]: the pools as heartbeats report them;
//! - [`events`]: the center's channel events;
//! - [`outbox`]: the pools' reservation events on the wire, and `StreamEvents`;
//! - [`wire`]: the store's reservation types as the wire's messages;
//! - [`replicas`]: one leader per channel among replicas sharing a pool store;
//! - [`link`]: the center client (request ids, retries, epoch, lease);
//! - [`agent`]: the parts put together, registration and drain;
//! - [`workers`]: rebalancer, heartbeat, event watcher and leadership loops;
//! - [`service`], [`http`], [`startup`]: the gRPC edge, metrics, and wiring.

pub mod agent;
pub mod baskets;
pub mod buyers;
pub mod clock;
pub mod config;
pub mod error;
pub mod events;
pub mod http;
pub mod items;
pub mod link;
pub mod metrics;
pub mod outbox;
pub mod relay;
pub mod replicas;
pub mod reporting;
pub mod role;
pub mod security;
pub mod segment_health;
pub mod segmented;
pub mod selling;
pub mod service;
pub mod startup;
pub mod stocking;
pub mod store;
pub mod wire;
pub mod workers;

pub use config::AgentConfig;
pub use startup::Application;
