//! The agent's integration tests: one binary (`cargo test -p inventory-agent --test it`).

mod baskets;
mod borrow_many;
mod buyer_registry;
mod claim_lapse;
mod cluster;
mod crash;
mod event_stream;
mod faults;
mod global_limit;
mod harness;
mod many_items;
mod metrics;
mod partial;
mod paths;
mod rate;
mod relay;
mod replicas;
mod sale;
mod schedule;
mod security;
mod segment_loss;
mod segments;
mod segments_cluster;
#[macro_use]
mod store_contract;
mod store_baskets;
mod store_durable;
mod store_events;
mod store_partial;
