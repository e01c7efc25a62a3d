//! Pure arithmetic over results: latency summaries from HDR histograms, ratios, targets,
//! and a plain-text table. No I/O.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Histograms hold nanoseconds from 1 ns to this (a minute), 3 significant digits.
pub const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, 3).expect("valid histogram bounds")
}

/// Latency percentiles of one run, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Summary {
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let us = |ns: u64| ns as f64 / 1_000.0;
        Self {
            count: h.len(),
            mean_us: h.mean() / 1_000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// The HDR percentile ladder (percentile, value in µs, count at or below), for printing
/// the shape of a distribution.
pub fn ladder(h: &Histogram<u64>) -> Vec<(f64, f64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    [0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0]
        .iter()
        .map(|&q| {
            let v = h.value_at_quantile(q);
            (q * 100.0, v as f64 / 1_000.0, h.count_between(0, v))
        })
        .collect()
}

/// `num / den`, or `None` when the denominator is not a positive number.
pub fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0 && num.is_finite() && den.is_finite()).then(|| num / den)
}

/// Calls per second over a window.
pub fn per_second(calls: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { calls as f64 / seconds } else { 0.0 }
}

/// Center calls (Borrow + Return) per 1,000 acquires.
pub fn per_thousand(calls: u64, acquires: u64) -> Option<f64> {
    ratio(calls as f64 * 1_000.0, acquires as f64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    AtLeast,
    AtMost,
}

/// One target of the performance issue and whether a run met it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    pub name: String,
    pub value: Option<f64>,
    pub bound: Bound,
    pub threshold: f64,
    pub met: bool,
}

impl Target {
    pub fn check(name: &str, value: Option<f64>, bound: Bound, threshold: f64) -> Self {
        let met = match (value, bound) {
            (Some(v), Bound::AtLeast) => v >= threshold,
            (Some(v), Bound::AtMost) => v <= threshold,
            (None, _) => false,
        };
        Self { name: name.to_owned(), value, bound, threshold, met }
    }

    pub fn describe_bound(&self) -> String {
        match self.bound {
            Bound::AtLeast => format!(">= {}", trim_number(self.threshold)),
            Bound::AtMost => format!("<= {}", trim_number(self.threshold)),
        }
    }
}

fn trim_number(v: f64) -> String {
    if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v}") }
}

/// Formats a latency in µs with a unit that keeps 3 significant digits readable.
pub fn fmt_latency(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1_000_000.0)
    } else if us >= 1_000.0 {
        format!("{:.2} ms", us / 1_000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// Rounds to the nearest integer: negative values and NaN give 0, values past `u64::MAX`
/// give `u64::MAX` (what a float-to-integer `as` does, said in one place).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn round_to_u64(v: f64) -> u64 {
    v.round() as u64
}

/// Formats a rate with thousands separators and no decimals.
pub fn fmt_rate(v: f64) -> String {
    let n = round_to_u64(v);
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Renders rows as a left-aligned table; the first row is the header, underlined.
pub fn render_table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell}{}", " ".repeat(widths[c] - cell.chars().count())))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&rule.join("  "));
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reads_percentiles_in_microseconds() {
        let mut h = new_histogram();
        for us in 1..=1_000u64 {
            h.record(us * 1_000).unwrap();
        }
        let s = Summary::of(&h);
        assert_eq!(s.count, 1_000);
        let close = |a: f64, b: f64| (a - b).abs() <= b * 0.002;
        assert!(close(s.p50_us, 500.0), "{s:?}");
        assert!(close(s.p90_us, 900.0), "{s:?}");
        assert!(close(s.p99_us, 990.0), "{s:?}");
        assert!(close(s.p999_us, 999.0), "{s:?}");
        assert!(close(s.max_us, 1_000.0), "{s:?}");
        assert!(close(s.mean_us, 500.5), "{s:?}");
        assert_eq!(Summary::of(&new_histogram()), Summary::default());
        let l = ladder(&h);
        assert_eq!(l.last().map(|r| r.2), Some(1_000));
    }

    #[test]
    fn ratios_and_targets() {
        assert_eq!(ratio(30.0, 10.0), Some(3.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(per_second(500, 0.5), 1_000.0);
        assert_eq!(per_second(5, 0.0), 0.0);
        assert_eq!(per_thousand(4, 2_000), Some(2.0));
        assert_eq!(per_thousand(4, 0), None);

        let met = Target::check("c/a", Some(0.61), Bound::AtLeast, 0.6);
        assert!(met.met);
        assert_eq!(met.describe_bound(), ">= 0.6");
        assert!(!Target::check("c/a", Some(0.59), Bound::AtLeast, 0.6).met);
        assert!(Target::check("p99", Some(10.0), Bound::AtMost, 10.0).met);
        assert!(!Target::check("p99", None, Bound::AtMost, 10.0).met);
        assert_eq!(Target::check("x", None, Bound::AtMost, 20.0).describe_bound(), "<= 20");
    }

    #[test]
    fn formats_numbers_and_tables() {
        assert_eq!(fmt_rate(1_234_567.4), "1,234,567");
        assert_eq!(fmt_rate(999.0), "999");
        assert_eq!(fmt_latency(250.0), "250 µs");
        assert_eq!(fmt_latency(2_500.0), "2.50 ms");
        assert_eq!(fmt_latency(3_000_000.0), "3.00 s");
        let t = render_table(&[vec!["a".into(), "bb".into()], vec!["ccc".into(), "d".into()]]);
        assert_eq!(t, "a    bb\n---  --\nccc  d\n");
    }
}
