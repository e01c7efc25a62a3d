//! The inventory center: the authoritative ledger of every item, served over gRPC.
//!
//! - [`store`]: the ledger in PostgreSQL or SQLite (one trait, one SQL body, two dialects);
//! - [`service`]: the Center (agents) and Admin (operators) gRPC services;
//! - [`startup`]: binds listeners and wires services, health, reflection and HTTP;
//! - the ledger rules themselves live in `inventory_core::ledger` (pure, no I/O).

pub mod clock;
pub mod closer;
pub mod config;
pub mod console;
pub mod error;
pub mod events;
pub mod fold;
pub mod health;
pub mod history;
pub mod http;
pub mod http_auth;
pub mod limits;
pub mod pruner;
pub mod readiness;
pub mod reclaimer;
pub mod replication;
pub mod security;
pub mod service;
pub mod startup;
pub mod store;

pub use config::CenterConfig;
pub use startup::Application;
