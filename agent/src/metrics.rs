//! Counters of the agent, rendered as Prometheus text on `/metrics`. Lock-free atomics so
//! the hot path pays one relaxed increment per call.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::agent::Outcome;

#[derive(Debug, Default)]
pub struct Metrics {
    reserved: AtomicU64,
    sold_out: AtomicU64,
    sold_out_fast: AtomicU64,
    limit_exceeded: AtomicU64,
    borrows: AtomicU64,
    borrowed_units: AtomicU64,
    returns: AtomicU64,
    returned_units: AtomicU64,
    center_errors: AtomicU64,
}

impl Metrics {
    pub fn acquire(&self, o: Outcome) {
        let c = match o {
            Outcome::Reserved => &self.reserved,
            Outcome::SoldOut => &self.sold_out,
            Outcome::SoldOutFast => &self.sold_out_fast,
            Outcome::LimitExceeded => &self.limit_exceeded,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn borrowed(&self, units: u64) {
        self.borrows.fetch_add(1, Ordering::Relaxed);
        self.borrowed_units.fetch_add(units, Ordering::Relaxed);
    }

    pub fn returned(&self, units: u64) {
        self.returns.fetch_add(1, Ordering::Relaxed);
        self.returned_units.fetch_add(units, Ordering::Relaxed);
    }

    pub fn center_error(&self) {
        self.center_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Borrow calls made so far (for "center calls per 1,000 acquires").
    pub fn borrow_calls(&self) -> u64 {
        self.borrows.load(Ordering::Relaxed)
    }

    pub fn return_calls(&self) -> u64 {
        self.returns.load(Ordering::Relaxed)
    }

    pub fn render(&self, out: &mut String, channel: &str) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP inventory_agent_acquires_total Acquire calls answered, by outcome.");
        let _ = writeln!(out, "# TYPE inventory_agent_acquires_total counter");
        for (outcome, v) in [
            ("reserved", get(&self.reserved)),
            ("sold_out", get(&self.sold_out) + get(&self.sold_out_fast)),
            ("limit_exceeded", get(&self.limit_exceeded)),
        ] {
            let _ = writeln!(out, "inventory_agent_acquires_total{{channel=\"{channel}\",outcome=\"{outcome}\"}} {v}");
        }
        let _ = writeln!(out, "# HELP inventory_agent_sold_out_fast_path_total SOLD_OUT answers given from memory.");
        let _ = writeln!(out, "# TYPE inventory_agent_sold_out_fast_path_total counter");
        let _ = writeln!(
            out,
            "inventory_agent_sold_out_fast_path_total{{channel=\"{channel}\"}} {}",
            get(&self.sold_out_fast)
        );
        for (name, help, v) in [
            ("inventory_agent_borrows_total", "Borrow calls to the center.", get(&self.borrows)),
            ("inventory_agent_borrowed_units_total", "Units granted by the center.", get(&self.borrowed_units)),
            ("inventory_agent_returns_total", "Return calls to the center.", get(&self.returns)),
            ("inventory_agent_returned_units_total", "Units given back to the center.", get(&self.returned_units)),
            ("inventory_agent_center_errors_total", "Failed calls to the center.", get(&self.center_errors)),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{channel=\"{channel}\"}} {v}");
        }
    }
}
