//! Integration tests of the center over real gRPC, against PostgreSQL and SQLite.

mod center_crash;
mod concurrency;
mod console;
mod contract;
mod hostile;
mod lost_reply;
mod model;
mod replicas;
mod security;
mod startup_errors;
mod support;
