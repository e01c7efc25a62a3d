//! Integration tests of the center over real gRPC, against PostgreSQL and SQLite.

mod batching;
mod center_crash;
mod concurrency;
mod console;
mod console_schedule;
mod console_segments;
mod contract;
mod edges;
mod health;
mod hostile;
mod limit_scope;
mod lost_reply;
mod model;
mod rates;
mod reclaim;
mod remove_channel;
mod replicas;
mod reports;
mod requests;
mod schedule;
mod security;
mod shares;
mod shutdown;
mod startup_errors;
mod support;
mod token_files;
