//! Watermark settings of a pool: an item default plus per-channel overrides.

use serde::{Deserialize, Serialize};

use crate::ids::{MAX_QUANTITY, ValidationError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermarks {
    pub low: u64,
    pub high: u64,
    pub batch: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatermarkError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// Its own variant because the brief maps it to FAILED_PRECONDITION.
    #[error("low watermark {low} must be below high watermark {high}")]
    LowNotBelowHigh { low: u64, high: u64 },
}

impl Watermarks {
    /// Validates operator input.
    pub fn new(low: u64, high: u64, batch: u64) -> Result<Self, WatermarkError> {
        if batch == 0 {
            return Err(ValidationError::new("batch", batch, "must be at least 1").into());
        }
        for (field, value) in [("low", low), ("high", high), ("batch", batch)] {
            if value > MAX_QUANTITY {
                return Err(ValidationError::new(field, value, format!("must be at most {MAX_QUANTITY}")).into());
            }
        }
        if low >= high {
            return Err(WatermarkError::LowNotBelowHigh { low, high });
        }
        Ok(Self { low, high, batch })
    }

    /// Defaults for an item of `total` units: batches of about 5% of the stock (1..=500),
    /// borrow below half a batch, give back above two batches.
    pub fn default_for_total(total: u64) -> Self {
        let batch = (total / 20).clamp(1, 500);
        Self { low: batch / 2, high: batch * 2, batch }
    }
}

/// Rate-following batches of an item: the batch is about `target_ms` of the pool's recent
/// sales, within `min_batch..=max_batch`; the watermarks follow the batch. While the pool
/// has not sold yet (rate 0), its fixed watermarks apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateBatching {
    pub min_batch: u64,
    pub max_batch: u64,
    pub target_ms: u64,
}

/// The horizon of sales a pool keeps at hand unless the operator says otherwise.
pub const DEFAULT_TARGET_MS: u64 = 1_000;
/// The longest horizon an operator may set (a pool holding more is parked stock).
pub const MAX_TARGET_MS: u64 = 600_000;

impl RateBatching {
    /// Validates operator input; 0 means the default (`min_batch` 1, `max_batch` the
    /// item's [`RateBatching::default_for_total`], `target_ms` 1000).
    pub fn new(min_batch: u64, max_batch: u64, target_ms: u64, total: u64) -> Result<Self, WatermarkError> {
        let d = Self::default_for_total(total);
        let min_batch = if min_batch == 0 { d.min_batch } else { min_batch };
        let max_batch = if max_batch == 0 { d.max_batch.max(min_batch) } else { max_batch };
        let target_ms = if target_ms == 0 { d.target_ms } else { target_ms };
        // A third of the bound: high is three batches.
        let max = MAX_QUANTITY / 3;
        for (field, value) in [("min_batch", min_batch), ("max_batch", max_batch)] {
            if value > max {
                return Err(ValidationError::new(field, value, format!("must be at most {max}")).into());
            }
        }
        if max_batch < min_batch {
            return Err(ValidationError::new(
                "max_batch",
                max_batch,
                format!("must be at least min_batch {min_batch}"),
            )
            .into());
        }
        if target_ms > MAX_TARGET_MS {
            return Err(ValidationError::new("target_ms", target_ms, format!("must be at most {MAX_TARGET_MS}")).into());
        }
        Ok(Self { min_batch, max_batch, target_ms })
    }

    /// Bounds for an item of `total` units: batches of 1 up to a tenth of the stock (at
    /// least the fixed default batch), one second of sales.
    pub fn default_for_total(total: u64) -> Self {
        let fixed = Watermarks::default_for_total(total).batch;
        Self { min_batch: 1, max_batch: (total / 10).clamp(fixed, MAX_QUANTITY / 3), target_ms: DEFAULT_TARGET_MS }
    }

    /// The watermarks for a pool selling `rate_milli` units per second × 1000:
    /// batch = clamp(rate × target, min_batch, max_batch) (rounded up), borrow below one
    /// batch (about `target_ms` of sales left), give back above three.
    pub fn derive(&self, rate_milli: u64) -> Watermarks {
        let wanted = u128::from(rate_milli) * u128::from(self.target_ms);
        let wanted = u64::try_from(wanted.div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let batch = wanted.clamp(self.min_batch.max(1), self.max_batch.max(self.min_batch).max(1));
        Watermarks { low: batch, high: batch.saturating_mul(3), batch }
    }
}

/// The watermarks a pool follows: derived from its sell rate when its batches follow the
/// rate and it sells (`rate_milli > 0`), else the fixed ones (a pool that has not sold
/// yet, or has been quiet for many half-lives, is a cold start).
pub fn effective(fixed: Watermarks, rate_batching: Option<RateBatching>, rate_milli: u64) -> Watermarks {
    match rate_batching {
        Some(r) if rate_milli > 0 => r.derive(rate_milli),
        _ => fixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_batches_follow_the_rate_within_bounds() {
        let r = RateBatching::new(5, 1_000, 1_000, 100_000).unwrap();
        assert_eq!(r.derive(200_000), Watermarks { low: 200, high: 600, batch: 200 }, "200/s: one second");
        assert_eq!(r.derive(1), Watermarks { low: 5, high: 15, batch: 5 }, "quiet: the floor");
        assert_eq!(r.derive(30_000_000), Watermarks { low: 1_000, high: 3_000, batch: 1_000 }, "30k/s: the cap");
        assert_eq!(r.derive(1_500), Watermarks { low: 5, high: 15, batch: 5 });
        let half = RateBatching::new(1, 1_000, 500, 100_000).unwrap();
        assert_eq!(half.derive(10_001).batch, 6, "5.0005 units in 500 ms round up");
        for rate in [0, 1, 999, 1_000_000, u64::MAX] {
            let w = r.derive(rate);
            assert!(Watermarks::new(w.low, w.high, w.batch).is_ok(), "{rate}: {w:?}");
        }
    }

    #[test]
    fn rate_batching_defaults_and_validation() {
        let d = RateBatching::new(0, 0, 0, 1_000).unwrap();
        assert_eq!(d, RateBatching { min_batch: 1, max_batch: 100, target_ms: 1_000 });
        assert_eq!(RateBatching::default_for_total(10).max_batch, 1, "never below the fixed batch");
        assert_eq!(RateBatching::new(200, 0, 0, 1_000).unwrap().max_batch, 200, "the default cap yields to the floor");
        assert_eq!(
            RateBatching::new(10, 5, 0, 1_000).unwrap_err().to_string(),
            "invalid max_batch 5: must be at least min_batch 10"
        );
        assert!(RateBatching::new(1, 5, MAX_TARGET_MS + 1, 1_000).unwrap_err().to_string().contains("target_ms"));
        assert!(RateBatching::new(MAX_QUANTITY, 0, 0, 1_000).unwrap_err().to_string().contains("min_batch"));
    }

    #[test]
    fn rejects_low_not_below_high_and_zero_batch() {
        assert_eq!(Watermarks::new(5, 5, 1), Err(WatermarkError::LowNotBelowHigh { low: 5, high: 5 }));
        let err = Watermarks::new(1, 5, 0).unwrap_err();
        assert_eq!(err.to_string(), "invalid batch 0: must be at least 1");
        assert!(Watermarks::new(0, 1, 1).is_ok());
    }

    #[test]
    fn defaults_are_valid_for_any_total() {
        for total in [1, 2, 19, 20, 1000, 1_000_000, MAX_QUANTITY] {
            let w = Watermarks::default_for_total(total);
            assert!(Watermarks::new(w.low, w.high, w.batch).is_ok(), "{total}: {w:?}");
        }
    }
}
