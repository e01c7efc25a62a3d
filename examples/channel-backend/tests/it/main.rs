//! The client crate and the reference backend against real agents (one binary:
//! `cargo test -p channel-backend --test it`).

mod calls;
mod failover;
mod generation;
mod harness;
mod http;
mod lost_reply;
mod secured;
