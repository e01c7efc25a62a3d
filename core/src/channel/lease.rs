//! The channel's lease and the center's reachability, as plain arithmetic: the agent keeps
//! the numbers in atomics, the simulator in its world; both compute them here.

/// Until when (in the caller's monotonic ms) an agent may sell after a registration or
/// heartbeat sent at `sent_at_ms` was answered with a lease of `ttl_ms`. Counted from the
/// send time (the center starts later, when it receives it), minus a safety margin capped
/// at half the lease (a margin as long as the lease would never let the agent sell), so
/// the agent stops selling before the center can consider the lease gone.
pub fn lease_until(sent_at_ms: i64, ttl_ms: u64, margin_ms: u64) -> i64 {
    let ttl = i64::try_from(ttl_ms).unwrap_or(i64::MAX);
    let margin = i64::try_from(margin_ms).unwrap_or(i64::MAX).min(ttl / 2);
    sent_at_ms.saturating_add(ttl).saturating_sub(margin)
}

/// A follower replica sells under the lease its leader published: `left_ms` from when it
/// asked (so the answer's travel time only shortens it); 0 means no lease.
pub fn followed_lease_until(asked_at_ms: i64, left_ms: u64) -> i64 {
    if left_ms == 0 { 0 } else { asked_at_ms.saturating_add(i64::try_from(left_ms).unwrap_or(i64::MAX)) }
}

/// Calls in a row without an answer before the center counts as unreachable: one slow call
/// under load must not make every empty pool answer UNAVAILABLE.
pub const UNREACHABLE_AFTER: u32 = 3;

/// Whether the center counts as reachable after `unanswered` calls in a row got no answer.
pub fn reachable(unanswered: u32) -> bool {
    unanswered < UNREACHABLE_AFTER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_counts_from_the_send_time_minus_a_capped_margin() {
        assert_eq!(lease_until(1_000, 10_000, 1_000), 10_000);
        assert_eq!(lease_until(0, 1_000, 5_000), 500, "margin capped at half the lease");
        assert_eq!(lease_until(i64::MAX - 1, u64::MAX, 0), i64::MAX);
    }

    #[test]
    fn a_followed_lease_of_zero_is_no_lease() {
        assert_eq!(followed_lease_until(100, 0), 0);
        assert_eq!(followed_lease_until(100, 50), 150);
    }

    #[test]
    fn unreachable_only_after_several_unanswered_calls() {
        assert!(reachable(0) && reachable(UNREACHABLE_AFTER - 1));
        assert!(!reachable(UNREACHABLE_AFTER));
    }
}
