//! The inventory agent of one sales channel.
//!
//! - [`store`]: local pools (Redis Lua or in-memory), one trait, one contract suite;
//! - [`agent`]: the hot path, borrowing/returning, resync with the center;
//! - [`items`]: per-item flags behind the sold-out fast path and end of sale;
//! - [`link`]: the center client (request ids, retries, epoch);
//! - [`replicas`]: one leader per channel among replicas sharing a pool store;
//! - [`workers`]: rebalancer, heartbeat, event watcher and leadership loops;
//! - [`service`], [`http`], [`startup`]: the gRPC edge, metrics, and wiring.

pub mod agent;
pub mod clock;
pub mod config;
pub mod error;
pub mod http;
pub mod items;
pub mod link;
pub mod metrics;
pub mod replicas;
pub mod security;
pub mod service;
pub mod startup;
pub mod store;
pub mod workers;

pub use config::AgentConfig;
pub use startup::Application;
