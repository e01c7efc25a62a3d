//! The agent's watermark decision for one pool: borrow, give back, or hold.
//!
//! Pure: the worker loop gathers a snapshot and the settings, calls [`decide`], and
//! carries out the returned [`Action`].

use crate::watermarks::Watermarks;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Hold,
    /// Ask the center for this many units.
    Borrow(u64),
    /// Give this many available units back to the center.
    Return(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs {
    /// Units the pool can sell right now.
    pub available: u64,
    pub watermarks: Watermarks,
    /// False once the center has said it has none left, or asked holders to return
    /// (end of sale): the pool then only borrows on a real miss, never ahead of demand.
    pub prefetch: bool,
    /// Since when `available` has been above the high watermark, if it is.
    pub above_high_since_ms: Option<i64>,
    pub now_ms: i64,
    /// How long the pool must stay above high before the surplus goes back.
    pub sustain_ms: u64,
}

/// Below low: borrow enough to get back to `low + batch`... but at least one batch.
/// Above high for `sustain_ms`: give back down to the middle of the band, so a pool
/// near the top does not flap between returning and borrowing.
pub fn decide(i: &Inputs) -> Action {
    let w = i.watermarks;
    if i.available < w.low {
        if !i.prefetch {
            return Action::Hold;
        }
        return Action::Borrow(w.batch.max(w.low - i.available));
    }
    if i.available > w.high
        && let Some(since) = i.above_high_since_ms
        && i.now_ms.saturating_sub(since) >= i64::try_from(i.sustain_ms).unwrap_or(i64::MAX)
    {
        let target = w.low + (w.high - w.low) / 2;
        return Action::Return(i.available - target);
    }
    Action::Hold
}

/// Tracks when the pool went above the high watermark.
pub fn above_high_since(available: u64, high: u64, previous: Option<i64>, now_ms: i64) -> Option<i64> {
    if available > high { Some(previous.unwrap_or(now_ms)) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(available: u64) -> Inputs {
        Inputs {
            available,
            watermarks: Watermarks { low: 20, high: 80, batch: 50 },
            prefetch: true,
            above_high_since_ms: None,
            now_ms: 10_000,
            sustain_ms: 1_000,
        }
    }

    #[test]
    fn borrows_a_batch_below_low() {
        assert_eq!(decide(&inputs(19)), Action::Borrow(50));
        assert_eq!(decide(&inputs(0)), Action::Borrow(50));
        assert_eq!(decide(&inputs(20)), Action::Hold);
    }

    #[test]
    fn borrows_at_least_up_to_low_when_batch_is_small() {
        let mut i = inputs(0);
        i.watermarks = Watermarks { low: 100, high: 200, batch: 10 };
        assert_eq!(decide(&i), Action::Borrow(100));
    }

    #[test]
    fn no_prefetch_when_the_center_is_dry() {
        let mut i = inputs(0);
        i.prefetch = false;
        assert_eq!(decide(&i), Action::Hold);
    }

    #[test]
    fn returns_surplus_only_after_sustained_excess() {
        let mut i = inputs(120);
        assert_eq!(decide(&i), Action::Hold, "not yet known how long");
        i.above_high_since_ms = Some(9_500);
        assert_eq!(decide(&i), Action::Hold, "only 500 ms");
        i.above_high_since_ms = Some(9_000);
        assert_eq!(decide(&i), Action::Return(70), "down to the middle of 20..80");
    }

    #[test]
    fn above_high_tracking() {
        assert_eq!(above_high_since(81, 80, None, 5), Some(5));
        assert_eq!(above_high_since(90, 80, Some(3), 5), Some(3));
        assert_eq!(above_high_since(80, 80, Some(3), 5), None);
    }
}
