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

#[cfg(test)]
mod tests {
    use super::*;

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
