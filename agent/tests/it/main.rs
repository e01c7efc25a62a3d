//! The agent's integration tests: one binary (`cargo test -p inventory-agent --test it`).

mod store_contract;
