//! Counters and histograms of the agent, rendered as Prometheus text on `/metrics` by
//! `http.rs` (with the per-RPC metrics of [`inventory_net::metrics`] and the gauges read
//! from the agent's state at scrape time).
//!
//! Counters are `prometheus-client` counters, one relaxed atomic each: the business
//! outcomes hold their labelled counter directly, so the hot path pays an increment (no
//! lookup, no lock, no allocation). An Acquire's latency goes to a histogram, which
//! takes the crate's short mutex per observation.
//!
//! Names follow Prometheus conventions: base units (`_seconds`, `_units`), `_total` on
//! counters, labels only of bounded sets (channel, outcome, method, status code; items in
//! the pool gauges rendered by `http.rs`), never per user.

use std::future::Future;
use std::time::{Duration, Instant};

use inventory_net::metrics::code_name;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tonic::Code;

/// What an Acquire answered (for the counters).
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Reserved,
    SoldOut,
    SoldOutFast,
    LimitExceeded,
    /// Before the item's opening (answered from memory).
    NotStarted,
}

/// Upper bounds (seconds) of the Acquire latency histogram's buckets, besides `+Inf`.
pub const ACQUIRE_BUCKETS_SECONDS: [f64; 12] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// Upper bounds (seconds) of the Borrow latency buckets: one round trip to the center (a
/// WAN one included) up to a Borrow that spent its retries.
pub const BORROW_BUCKETS_SECONDS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// The agent's gRPC methods, for the rejected-calls counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Acquire,
    Confirm,
    Cancel,
    GetStock,
    Refund,
    GetReservation,
    Extend,
    StreamEvents,
    AcquireBasket,
    ConfirmBasket,
    CancelBasket,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Acquire => "acquire",
            Method::Confirm => "confirm",
            Method::Cancel => "cancel",
            Method::GetStock => "get_stock",
            Method::Refund => "refund",
            Method::GetReservation => "get_reservation",
            Method::Extend => "extend",
            Method::StreamEvents => "stream_events",
            Method::AcquireBasket => "acquire_basket",
            Method::ConfirmBasket => "confirm_basket",
            Method::CancelBasket => "cancel_basket",
        }
    }
}

type Labels<const N: usize> = [(&'static str, &'static str); N];

#[derive(Debug)]
pub struct Metrics {
    acquires: Family<Labels<1>, Counter>,
    /// The `acquires` series of each outcome (fast sold-out answers count as sold out).
    reserved: Counter,
    sold_out: Counter,
    limit_exceeded: Counter,
    not_started: Counter,
    sold_out_fast: Counter,
    /// Acquires with allow_partial that reserved fewer units than asked.
    partial_acquires: Counter,
    acquire_latency: Histogram,
    borrow_latency: Histogram,
    borrows: Counter,
    borrowed_units: Counter,
    returns: Counter,
    returned_units: Counter,
    center_errors: Counter,
    pool_store_errors: Counter,
    /// Moves between the segments of a segmented item's pool.
    segment_moves: Counter,
    /// The buyer registry (global per-user limits): claims made, released, settled by the
    /// sweeper, lapsed under a pool call that outlived the pending bound (claimed
    /// again before the answer), and calls that failed.
    pub buyer_claims: Counter,
    pub buyer_releases: Counter,
    pub buyer_swept: Counter,
    pub buyer_lapsed_claims: Counter,
    pub buyer_registry_errors: Counter,
    /// Baskets: reserved (every line), failed (a line short or in error, undone),
    /// compensated (undone by recovery: the driver crashed or was too slow), and the open
    /// intents the sweeper last saw (pending or releasing; at most one page).
    pub baskets_reserved: Counter,
    pub baskets_failed: Counter,
    pub baskets_compensated: Counter,
    pub baskets_open: prometheus_client::metrics::gauge::Gauge,
    /// By method and gRPC code: calls answered with an error status.
    rejected: Family<Labels<2>, Counter>,
    /// Every call of the agent's gRPC server, measured by the layer in `startup.rs`.
    pub rpc: inventory_net::metrics::RpcMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let acquires = Family::<Labels<1>, Counter>::default();
        let outcome = |o: &'static str| acquires.get_or_create_owned(&[("outcome", o)]);
        let (reserved, sold_out, limit_exceeded, not_started) =
            (outcome("reserved"), outcome("sold_out"), outcome("limit_exceeded"), outcome("not_started"));
        let rejected = Family::<Labels<2>, Counter>::default();
        // The usual rejections always appear (so rate() sees them start at 0); the rest
        // once they happened.
        for code in [Code::InvalidArgument, Code::ResourceExhausted, Code::Unavailable] {
            let _ = rejected.get_or_create(&[("method", Method::Acquire.as_str()), ("code", code_name(code))]);
        }
        Self {
            acquires,
            reserved,
            sold_out,
            limit_exceeded,
            not_started,
            sold_out_fast: Counter::default(),
            partial_acquires: Counter::default(),
            acquire_latency: Histogram::new(ACQUIRE_BUCKETS_SECONDS),
            borrow_latency: Histogram::new(BORROW_BUCKETS_SECONDS),
            borrows: Counter::default(),
            borrowed_units: Counter::default(),
            returns: Counter::default(),
            returned_units: Counter::default(),
            center_errors: Counter::default(),
            pool_store_errors: Counter::default(),
            segment_moves: Counter::default(),
            buyer_claims: Counter::default(),
            buyer_releases: Counter::default(),
            buyer_swept: Counter::default(),
            buyer_lapsed_claims: Counter::default(),
            buyer_registry_errors: Counter::default(),
            baskets_reserved: Counter::default(),
            baskets_failed: Counter::default(),
            baskets_compensated: Counter::default(),
            baskets_open: Default::default(),
            rejected,
            rpc: inventory_net::metrics::RpcMetrics::new(&[
                inventory_proto::FILE_DESCRIPTOR_SET,
                tonic_health::pb::FILE_DESCRIPTOR_SET,
                tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            ]),
        }
    }
}

impl Metrics {
    /// An allow_partial Acquire reserved what was left (also counted as reserved).
    pub fn partial_acquire(&self) {
        self.partial_acquires.inc();
    }

    pub fn acquire(&self, o: Outcome) {
        match o {
            Outcome::Reserved => self.reserved.inc(),
            Outcome::SoldOut => self.sold_out.inc(),
            Outcome::SoldOutFast => {
                self.sold_out_fast.inc();
                self.sold_out.inc()
            }
            Outcome::LimitExceeded => self.limit_exceeded.inc(),
            Outcome::NotStarted => self.not_started.inc(),
        };
    }

    /// How long one Acquire call took, whatever it answered.
    pub fn observe_acquire(&self, elapsed: Duration) {
        self.acquire_latency.observe(elapsed.as_secs_f64());
    }

    /// Runs one Borrow call to the center and records how long it took, whatever it
    /// answered (retries included: that is what the waiting buyers see).
    pub async fn time_borrow<T>(&self, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let answer = call.await;
        self.borrow_latency.observe(started.elapsed().as_secs_f64());
        answer
    }

    /// A call answered with an error status instead of a business outcome.
    pub fn rejected(&self, method: Method, code: Code) {
        self.rejected.get_or_create(&[("method", method.as_str()), ("code", code_name(code))]).inc();
    }

    /// A call to the pool store (Redis) failed.
    pub fn pool_store_error(&self) {
        self.pool_store_errors.inc();
    }

    pub fn segment_move(&self) {
        self.segment_moves.inc();
    }

    pub fn borrowed(&self, units: u64) {
        self.borrows.inc();
        self.borrowed_units.inc_by(units);
    }

    pub fn returned(&self, units: u64) {
        self.returns.inc();
        self.returned_units.inc_by(units);
    }

    pub fn center_error(&self) {
        self.center_errors.inc();
    }

    /// Borrow calls made so far (for "center calls per 1,000 acquires").
    pub fn borrow_calls(&self) -> u64 {
        self.borrows.get()
    }

    pub fn return_calls(&self) -> u64 {
        self.returns.get()
    }

    /// Prometheus text of the agent's own families, labelled with `channel` (what
    /// `/metrics` shows of them; the benchmark reads its counters from it).
    pub fn render(&self, out: &mut String, channel: &str) {
        let mut registry = Registry::default();
        self.register(registry.sub_registry_with_label(("channel".into(), channel.to_owned().into())));
        // Writing to a String cannot fail, nor can these metrics' encoding.
        let _ = prometheus_client::encoding::prometheus_text::encode(out, &registry);
    }

    /// Adds the agent's own families to `registry` (which labels them with the channel).
    /// Help texts get their full stop from the registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("inventory_agent_acquires", "Acquire calls answered, by outcome", self.acquires.clone());
        registry.register(
            "inventory_agent_sold_out_fast_path",
            "SOLD_OUT answers given from memory",
            self.sold_out_fast.clone(),
        );
        registry.register(
            "inventory_agent_partial_acquires",
            "Acquires with allow_partial that reserved fewer units than asked",
            self.partial_acquires.clone(),
        );
        registry.register(
            "inventory_agent_acquire_duration_seconds",
            "Time to answer an Acquire call, any answer",
            self.acquire_latency.clone(),
        );
        registry.register(
            "inventory_agent_borrow_duration_seconds",
            "Time a Borrow call to the center took, retries included, any answer",
            self.borrow_latency.clone(),
        );
        for (name, help, counter) in [
            ("inventory_agent_borrows", "Borrow calls to the center", &self.borrows),
            ("inventory_agent_borrowed_units", "Units granted by the center", &self.borrowed_units),
            ("inventory_agent_returns", "Return calls to the center", &self.returns),
            ("inventory_agent_returned_units", "Units given back to the center", &self.returned_units),
            ("inventory_agent_center_errors", "Failed calls to the center", &self.center_errors),
            ("inventory_agent_pool_store_errors", "Failed calls to the pool store (Redis)", &self.pool_store_errors),
            ("inventory_agent_segment_moves", "Moves of units between segments of an item's pool", &self.segment_moves),
            ("inventory_agent_buyer_claims", "Claims made on users' global allowances", &self.buyer_claims),
            (
                "inventory_agent_buyer_releases",
                "Claims released by cancel, refund or a failed Acquire",
                &self.buyer_releases,
            ),
            ("inventory_agent_buyer_swept", "Claims the buyer registry's sweeper released", &self.buyer_swept),
            (
                "inventory_agent_buyer_lapsed_claims",
                "Claims found released when their pool call ended (claimed again before answering)",
                &self.buyer_lapsed_claims,
            ),
            (
                "inventory_agent_buyer_registry_errors",
                "Failed calls to the buyer registry",
                &self.buyer_registry_errors,
            ),
            ("inventory_agent_baskets_reserved", "Baskets that reserved every line", &self.baskets_reserved),
            (
                "inventory_agent_baskets_failed",
                "Baskets that reserved nothing: a line sold out, over the limit or in error (lines undone)",
                &self.baskets_failed,
            ),
            (
                "inventory_agent_baskets_compensated",
                "Basket intents undone by recovery (the driver crashed or took longer than the bound)",
                &self.baskets_compensated,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "inventory_agent_basket_intents_open",
            "Basket intents pending or being undone, as the sweeper last saw them (at most one page)",
            self.baskets_open.clone(),
        );
        registry.register(
            "inventory_agent_rejected_calls",
            "Calls answered with a gRPC error status, by method and code",
            self.rejected.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
    }

    fn render(m: &Metrics, channel: &str) -> String {
        let mut out = String::new();
        m.render(&mut out, channel);
        out
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_count_matches_inf() {
        let m = Metrics::default();
        for micros in [100, 600, 600, 3_000, 2_000_000, 9_000_000] {
            m.observe_acquire(Duration::from_micros(micros));
        }
        let out = render(&m, "app");
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
        let out = render(&m, "app");
        let series = "inventory_agent_acquire_duration_seconds_bucket{channel=\"app\",le=\"0.001\"}";
        assert_eq!(sample(&out, series), Some(1.0));
    }

    #[tokio::test]
    async fn a_borrow_is_timed_whatever_it_answers() {
        let m = Metrics::default();
        let answer: Result<u64, &str> = m.time_borrow(async { Err("center unavailable") }).await;
        assert!(answer.is_err());
        assert_eq!(m.time_borrow(async { 7 }).await, 7);
        let out = render(&m, "app");
        assert_eq!(sample(&out, "inventory_agent_borrow_duration_seconds_count{channel=\"app\"}"), Some(2.0), "{out}");
        let inf = "inventory_agent_borrow_duration_seconds_bucket{channel=\"app\",le=\"+Inf\"}";
        assert_eq!(sample(&out, inf), Some(2.0), "{out}");
    }

    #[test]
    fn fast_sold_out_answers_count_as_sold_out_too() {
        let m = Metrics::default();
        m.acquire(Outcome::SoldOut);
        m.acquire(Outcome::SoldOutFast);
        m.acquire(Outcome::Reserved);
        let out = render(&m, "app");
        let outcome =
            |o: &str| sample(&out, &format!(r#"inventory_agent_acquires_total{{channel="app",outcome="{o}"}}"#));
        assert_eq!(
            (outcome("sold_out"), outcome("reserved"), outcome("limit_exceeded")),
            (Some(2.0), Some(1.0), Some(0.0))
        );
        assert_eq!(sample(&out, r#"inventory_agent_sold_out_fast_path_total{channel="app"}"#), Some(1.0));
        assert!(out.contains("# TYPE inventory_agent_acquires_total counter"), "{out}");
    }

    #[test]
    fn rejected_calls_are_labelled_by_method_and_code() {
        let m = Metrics::default();
        m.rejected(Method::Confirm, Code::FailedPrecondition);
        m.rejected(Method::Confirm, Code::FailedPrecondition);
        let out = render(&m, "web");
        let confirm =
            r#"inventory_agent_rejected_calls_total{channel="web",method="confirm",code="failed_precondition"}"#;
        assert_eq!(sample(&out, confirm), Some(2.0));
        let acquire = r#"inventory_agent_rejected_calls_total{channel="web",method="acquire",code="unavailable"}"#;
        assert_eq!(sample(&out, acquire), Some(0.0), "always rendered");
        assert!(!out.contains(r#"method="cancel""#), "zero series of rare methods stay out");
    }
}
