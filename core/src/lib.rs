//! Pure rules of the inventory system.
//!
//! Everything here is plain data and plain functions: parsing identifiers at the edge,
//! the center's ledger arithmetic, the agent's pool model and watermark decisions. No I/O, no clocks
//! (callers pass `now`), no async. The services gather inputs, call these functions and
//! carry out what they return.

pub mod auth;
pub mod basket;
pub mod buyers;
pub mod channel;
pub mod ids;
pub mod ledger;
pub mod loss;
pub mod pool;
pub mod rate;
pub mod rebalance;
pub mod records;
pub mod schedule;
pub mod segments;
pub mod tokens;
pub mod watermarks;

pub use ids::{AgentId, Channel, ItemId, Quantity, RequestId, UserId, ValidationError};
