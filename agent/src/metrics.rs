//! Counters of the agent, rendered as Prometheus text on `/metrics`. Lock-free atomics so
//! the hot path pays a few relaxed increments per call (no locks, no allocation).
//!
//! Names follow Prometheus conventions: base units (`_seconds`, `_units`), `_total` on
//! counters, labels only of bounded sets (channel, outcome, method, status code; items in
//! the pool gauges rendered by `http.rs`), never per user.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tonic::Code;

/// What an Acquire answered (for the counters).
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Reserved,
    SoldOut,
    SoldOutFast,
    LimitExceeded,
}

/// Upper bounds (seconds) of the Acquire latency histogram's buckets, besides `+Inf`.
pub const ACQUIRE_BUCKETS_SECONDS: [f64; 12] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// The same bounds in nanoseconds, compared on the hot path (no float math there).
const ACQUIRE_BUCKETS_NANOS: [u64; 12] = [
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// The agent's gRPC methods, for the rejected-calls counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Acquire,
    Confirm,
    Cancel,
    GetStock,
}

impl Method {
    const ALL: [Method; 4] = [Method::Acquire, Method::Confirm, Method::Cancel, Method::GetStock];

    fn as_str(self) -> &'static str {
        match self {
            Method::Acquire => "acquire",
            Method::Confirm => "confirm",
            Method::Cancel => "cancel",
            Method::GetStock => "get_stock",
        }
    }
}

/// gRPC status codes 0..=16, as label values.
const CODE_NAMES: [&str; 17] = [
    "ok",
    "cancelled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

/// A fixed-bucket histogram of durations. Buckets are stored per bucket (not cumulative)
/// and summed at render time, so an observation is one search and two increments.
#[derive(Debug, Default)]
struct Histogram {
    /// One slot per bound plus the `+Inf` slot.
    buckets: [AtomicU64; ACQUIRE_BUCKETS_NANOS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let slot = ACQUIRE_BUCKETS_NANOS.partition_point(|&bound| bound < nanos);
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0u64;
        for (i, slot) in self.buckets.iter().enumerate() {
            cumulative += slot.load(Ordering::Relaxed);
            match ACQUIRE_BUCKETS_SECONDS.get(i) {
                Some(le) => {
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        // The count is the +Inf bucket, so the two always agree within one scrape.
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

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
    pool_store_errors: AtomicU64,
    acquire_latency: Histogram,
    /// `[method][grpc code]`: calls answered with an error status.
    rejected: [[AtomicU64; CODE_NAMES.len()]; Method::ALL.len()],
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

    /// How long one Acquire call took, whatever it answered.
    pub fn observe_acquire(&self, elapsed: Duration) {
        self.acquire_latency.observe(elapsed);
    }

    /// A call answered with an error status instead of a business outcome.
    pub fn rejected(&self, method: Method, code: Code) {
        let code = usize::try_from(code as i32).unwrap_or(2).min(CODE_NAMES.len() - 1);
        self.rejected[method as usize][code].fetch_add(1, Ordering::Relaxed);
    }

    /// A call to the pool store (Redis) failed.
    pub fn pool_store_error(&self) {
        self.pool_store_errors.fetch_add(1, Ordering::Relaxed);
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
        let name = "inventory_agent_acquire_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Time to answer an Acquire call, any answer.");
        let _ = writeln!(out, "# TYPE {name} histogram");
        self.acquire_latency.render(out, name, &format!("channel=\"{channel}\""));
        for (name, help, v) in [
            ("inventory_agent_borrows_total", "Borrow calls to the center.", get(&self.borrows)),
            ("inventory_agent_borrowed_units_total", "Units granted by the center.", get(&self.borrowed_units)),
            ("inventory_agent_returns_total", "Return calls to the center.", get(&self.returns)),
            ("inventory_agent_returned_units_total", "Units given back to the center.", get(&self.returned_units)),
            ("inventory_agent_center_errors_total", "Failed calls to the center.", get(&self.center_errors)),
            (
                "inventory_agent_pool_store_errors_total",
                "Failed calls to the pool store (Redis).",
                get(&self.pool_store_errors),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{channel=\"{channel}\"}} {v}");
        }
        let name = "inventory_agent_rejected_calls_total";
        let _ = writeln!(out, "# HELP {name} Calls answered with a gRPC error status, by method and code.");
        let _ = writeln!(out, "# TYPE {name} counter");
        for method in Method::ALL {
            for (code, counter) in CODE_NAMES.iter().zip(&self.rejected[method as usize]) {
                let v = get(counter);
                // The usual rejections always appear (so rate() sees them start at 0);
                // the rest once they happened.
                let usual = method == Method::Acquire
                    && matches!(*code, "invalid_argument" | "resource_exhausted" | "unavailable");
                if v > 0 || usual {
                    let m = method.as_str();
                    let _ = writeln!(out, "{name}{{channel=\"{channel}\",method=\"{m}\",code=\"{code}\"}} {v}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_count_matches_inf() {
        let m = Metrics::default();
        for micros in [100, 600, 600, 3_000, 2_000_000, 9_000_000] {
            m.observe_acquire(Duration::from_micros(micros));
        }
        let mut out = String::new();
        m.render(&mut out, "app");
        let b = |le: &str| {
            sample(&out, &format!("inventory_agent_acquire_duration_seconds_bucket{{channel=\"app\",le=\"{le}\"}}"))
        };
        assert_eq!(b("0.0005"), Some(1.0));
        assert_eq!(b("0.001"), Some(3.0));
        assert_eq!(b("0.005"), Some(4.0));
        assert_eq!(b("1"), Some(4.0));
        assert_eq!(b("2.5"), Some(5.0));
        assert_eq!(b("+Inf"), Some(6.0));
        assert_eq!(sample(&out, "inventory_agent_acquire_duration_seconds_count{channel=\"app\"}"), Some(6.0));
        let sum = sample(&out, "inventory_agent_acquire_duration_seconds_sum{channel=\"app\"}").unwrap();
        assert!((sum - 11.0043).abs() < 1e-9, "sum {sum}");
    }

    #[test]
    fn a_bound_is_inclusive() {
        let m = Metrics::default();
        m.observe_acquire(Duration::from_millis(1));
        let mut out = String::new();
        m.render(&mut out, "app");
        let series = "inventory_agent_acquire_duration_seconds_bucket{channel=\"app\",le=\"0.001\"}";
        assert_eq!(sample(&out, series), Some(1.0));
    }

    #[test]
    fn rejected_calls_are_labelled_by_method_and_code() {
        let m = Metrics::default();
        m.rejected(Method::Confirm, Code::FailedPrecondition);
        m.rejected(Method::Confirm, Code::FailedPrecondition);
        let mut out = String::new();
        m.render(&mut out, "web");
        let confirm =
            r#"inventory_agent_rejected_calls_total{channel="web",method="confirm",code="failed_precondition"}"#;
        assert_eq!(sample(&out, confirm), Some(2.0));
        let acquire = r#"inventory_agent_rejected_calls_total{channel="web",method="acquire",code="unavailable"}"#;
        assert_eq!(sample(&out, acquire), Some(0.0), "always rendered");
        assert!(!out.contains(r#"method="cancel""#), "zero series of rare methods stay out");
    }
}
