//! The agent's integration tests: one binary (`cargo test -p inventory-agent --test it`).

mod baskets;
mod borrow_many;
mod buyer_registry;
mod claim_lapse;
mod cluster;
mod crash;
mod edges;
mod event_stream;
mod faults;
mod global_limit;
mod harness;
mod late_grant;
mod ledger_behind;
mod lost_structures;
mod many_items;
mod metrics;
mod partial;
mod paths;
mod rate;
mod redis_policy;
mod relay;
mod replicas;
mod sale;
mod schedule;
mod security;
mod segment_loss;
mod segments;
mod segments_cluster;
mod shares;
#[macro_use]
mod store_contract;
mod store_baskets;
mod store_durable;
mod store_events;
mod store_full;
mod store_partial;
