//! A pool's recent sell rate: an exponentially weighted moving average of the units
//! reserved per second, with a configurable half-life. Pure: the caller passes the time.
//!
//! The estimate is `Σ units·λ·e^(-λ·age)` (λ = ln 2 / half-life), which converges to the
//! true rate of a steady stream and decays by half every half-life when nothing sells. It
//! is divided by the weight the window since the first sale has had (`1 - e^(-λ·elapsed)`),
//! so the first seconds of a sale already show its rate instead of a small fraction of it
//! (the bias correction of Adam's moments). `elapsed` is at least [`MIN_WINDOW_MS`]: a
//! single first sale reads as a modest rate, not an infinite one.

/// The half-life of the average unless configured otherwise.
pub const DEFAULT_HALF_LIFE_MS: u64 = 5_000;

/// The shortest window the first sales are spread over.
pub const MIN_WINDOW_MS: i64 = 500;

/// Below this (units per second × 1000) the rate reads as 0: a pool quiet for many
/// half-lives is quiet, not selling one unit a century.
const ZERO_BELOW_MILLI: f64 = 1.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SellRate {
    /// λ, per millisecond.
    lambda_per_ms: f64,
    /// `Σ units·λ·e^(-λ·age)` at `last_ms`, in units per millisecond.
    sum: f64,
    /// When the last sale was recorded.
    last_ms: i64,
    /// When the first sale was recorded (`None`: never).
    first_ms: Option<i64>,
}

impl SellRate {
    /// A rate with this half-life (0 is taken as 1 ms).
    pub fn new(half_life_ms: u64) -> Self {
        #[allow(clippy::cast_precision_loss)] // a half-life is far below 2^52 ms
        let half_life = half_life_ms.max(1) as f64;
        Self { lambda_per_ms: std::f64::consts::LN_2 / half_life, sum: 0.0, last_ms: 0, first_ms: None }
    }

    /// `units` were reserved at `now_ms`. A clock that stepped back counts as no time passed.
    pub fn record(&mut self, units: u64, now_ms: i64) {
        if units == 0 {
            return;
        }
        let first = *self.first_ms.get_or_insert(now_ms);
        let now = now_ms.max(self.last_ms).max(first);
        self.sum = self.decayed(now) + to_f64(units) * self.lambda_per_ms;
        self.last_ms = now;
    }

    fn decayed(&self, now_ms: i64) -> f64 {
        if self.first_ms.is_none() {
            return 0.0;
        }
        let age = to_f64_ms(now_ms.saturating_sub(self.last_ms).max(0));
        self.sum * (-self.lambda_per_ms * age).exp()
    }

    /// Units per second at `now_ms` (0 before the first sale).
    pub fn per_sec(&self, now_ms: i64) -> f64 {
        let Some(first) = self.first_ms else { return 0.0 };
        let elapsed = to_f64_ms(now_ms.saturating_sub(first).max(MIN_WINDOW_MS));
        let weight = 1.0 - (-self.lambda_per_ms * elapsed).exp();
        let rate = self.decayed(now_ms.max(self.last_ms)) / weight * 1_000.0;
        if rate * 1_000.0 < ZERO_BELOW_MILLI { 0.0 } else { rate }
    }

    /// Units per second × 1000, rounded down (what heartbeats and Borrows carry).
    // In range: checked against 0 and the largest f64 below 2^64 first.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub fn milli(&self, now_ms: i64) -> u64 {
        let milli = (self.per_sec(now_ms) * 1_000.0).floor();
        if milli >= 18_446_744_073_709_549_568.0 {
            u64::MAX
        } else if milli > 0.0 {
            milli as u64
        } else {
            0
        }
    }
}

impl Default for SellRate {
    fn default() -> Self {
        Self::new(DEFAULT_HALF_LIFE_MS)
    }
}

/// Whether a reported rate moved enough to be worth another report: to or from 0, or by
/// more than a fifth. Keeps heartbeats of a slowly decaying rate sparse.
pub fn rate_report_changed(last_milli: u64, now_milli: u64) -> bool {
    if (last_milli == 0) != (now_milli == 0) {
        return true;
    }
    last_milli.abs_diff(now_milli) > last_milli / 5
}

fn to_f64(units: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)] // quantities are at most 10^9
    let v = units as f64;
    v
}

fn to_f64_ms(ms: i64) -> f64 {
    #[allow(clippy::cast_precision_loss)] // durations far below 2^52 ms
    let v = ms as f64;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= b.abs() * rel
    }

    #[test]
    fn zero_before_any_sale() {
        let r = SellRate::default();
        assert_eq!(r.per_sec(10_000), 0.0);
        assert_eq!(r.milli(10_000), 0);
    }

    #[test]
    fn a_steady_stream_reads_its_rate_from_the_first_second() {
        // 100 units/s: one unit every 10 ms.
        let mut r = SellRate::default();
        for i in 0..100 {
            r.record(1, i * 10);
        }
        let rate = r.per_sec(1_000);
        assert!(close(rate, 100.0, 0.05), "after 1 s: {rate}");
        for i in 100..3_000 {
            r.record(1, i * 10);
        }
        let rate = r.per_sec(30_000);
        assert!(close(rate, 100.0, 0.02), "after 30 s: {rate}");
    }

    #[test]
    fn rates_ten_to_one_read_ten_to_one() {
        let (mut fast, mut slow) = (SellRate::default(), SellRate::default());
        for i in 0..2_000 {
            fast.record(1, i * 5);
            if i % 10 == 0 {
                slow.record(1, i * 5);
            }
        }
        let ratio = fast.per_sec(10_000) / slow.per_sec(10_000);
        assert!(close(ratio, 10.0, 0.05), "{ratio}");
    }

    #[test]
    fn halves_every_half_life_when_nothing_sells_then_reads_zero() {
        let mut r = SellRate::new(1_000);
        for i in 0..1_000 {
            r.record(10, i * 10);
        }
        let at_end = r.per_sec(10_000);
        let later = r.per_sec(11_000);
        assert!(close(later, at_end / 2.0, 0.01), "{at_end} -> {later}");
        assert_eq!(r.milli(10_000 + 40_000), 0, "40 half-lives later it is quiet");
    }

    #[test]
    fn batches_of_units_count_as_their_units_and_a_clock_step_back_is_harmless() {
        let (mut ones, mut tens) = (SellRate::default(), SellRate::default());
        for i in 0..100 {
            for _ in 0..10 {
                ones.record(1, i * 100);
            }
            tens.record(10, i * 100);
        }
        assert!(close(ones.per_sec(10_000), tens.per_sec(10_000), 1e-9));
        let before = tens.per_sec(10_000);
        tens.record(1, 5_000);
        assert!(tens.per_sec(10_000) > before, "a sale stamped in the past still counts");
    }

    #[test]
    fn report_changes_only_on_a_real_move() {
        assert!(!rate_report_changed(0, 0));
        assert!(rate_report_changed(0, 1));
        assert!(rate_report_changed(1_000, 0));
        assert!(!rate_report_changed(1_000, 1_150));
        assert!(!rate_report_changed(1_000, 800));
        assert!(rate_report_changed(1_000, 799));
        assert!(rate_report_changed(1_000, 1_201));
    }
}
