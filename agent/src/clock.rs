//! Wall-clock milliseconds for the rebalancer's "above high for a while" timing. Expiry of
//! reservations never uses this clock: the pool store's clock decides.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
