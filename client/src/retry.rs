//! When a failed call is tried again, where, and after how long: pure decisions over the
//! call's gRPC code, the attempt number, the server's pushback and the time left. No
//! clock, no randomness, no I/O: the caller passes the jitter sample and the time left.
//!
//! **Architecture Invariant:** nothing here ever changes the request. A retry is the same
//! request with the same idempotency key (and the same `expect_pool_generation`); the
//! only choices are whether, when and on which replica.

use std::time::Duration;

use tonic::Code;

/// The backoff between attempts: `initial × 2^(attempt − 1)`, capped at `max`, of which
/// a random half is kept ("equal jitter"), so that callers who failed together do not
/// come back together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The base delay after the first failed attempt.
    pub initial: Duration,
    /// The cap on the base delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(20), max: Duration::from_secs(1) }
    }
}

impl Backoff {
    /// The delay after failed attempt number `attempt` (1-based), with `jitter` in
    /// `[0, 1]`: between half the capped base and the whole of it.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(30);
        let base = self.initial.saturating_mul(1 << doublings).min(self.max);
        let jitter = jitter.clamp(0.0, 1.0);
        base / 2 + base.mul_f64(jitter / 2.0)
    }
}

/// Codes after which the same request may be sent again and cannot do anything twice.
///
/// UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are the agent's "retry with the
/// same key"; UNKNOWN and CANCELLED are what a client sees when the connection dies
/// mid-call (the outcome is unknown, and every Agent call is idempotent on its key or id).
pub fn retry_safe(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Unknown | Code::Cancelled
    )
}

/// What the server asked about retrying, read from the `grpc-retry-pushback-ms` trailer
/// (the gRPC retry design's name): a delay, or "do not retry" (a negative or unreadable
/// value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushback {
    /// Wait this long before the next attempt.
    After(Duration),
    /// The server asked not to be retried.
    Stop,
}

/// Parses a `grpc-retry-pushback-ms` value.
pub fn parse_pushback(value: &str) -> Pushback {
    match value.trim().parse::<i64>() {
        Ok(ms) if ms >= 0 => Pushback::After(Duration::from_millis(ms.unsigned_abs())),
        _ => Pushback::Stop,
    }
}

/// The failure of one attempt, as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    /// The attempt's code (a local timeout is DEADLINE_EXCEEDED).
    pub code: Code,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// What the server asked, if it did.
    pub pushback: Option<Pushback>,
}

/// The caller's bounds on one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The backoff between attempts.
    pub backoff: Backoff,
    /// At most this many attempts.
    pub max_attempts: u32,
}

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Send the same request again after `after`; on another replica when `switch`.
    Retry {
        /// The wait before the next attempt.
        after: Duration,
        /// Try another replica: this one is down, unreachable, or did not answer in time.
        switch: bool,
    },
    /// Return the failure to the caller.
    GiveUp(GiveUp),
}

/// Why a failed call is not tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// The code says the request was answered for good (or is wrong): retrying repeats it.
    Final,
    /// The server asked not to be retried.
    ServerSaidStop,
    /// The attempts ran out.
    Attempts,
    /// The next attempt could not start before the caller's deadline.
    Deadline,
}

/// The decision after a failed attempt, given the time left before the caller's deadline
/// and a jitter sample in `[0, 1]`.
pub fn next(bounds: &Bounds, failed: Failed, remaining: Duration, jitter: f64) -> Next {
    if !retry_safe(failed.code) {
        return Next::GiveUp(GiveUp::Final);
    }
    if failed.attempt >= bounds.max_attempts {
        return Next::GiveUp(GiveUp::Attempts);
    }
    let after = match failed.pushback {
        Some(Pushback::Stop) => return Next::GiveUp(GiveUp::ServerSaidStop),
        Some(Pushback::After(d)) => d,
        None => bounds.backoff.delay(failed.attempt, jitter),
    };
    if after >= remaining {
        return Next::GiveUp(GiveUp::Deadline);
    }
    // A replica that throttles this caller throttles it wherever it goes (the limits are
    // per user and per agent): moving on would only dodge the pushback.
    let switch = failed.code != Code::ResourceExhausted;
    Next::Retry { after, switch }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            backoff: Backoff { initial: Duration::from_millis(10), max: Duration::from_millis(100) },
            max_attempts: 5,
        }
    }

    fn failed(code: Code, attempt: u32) -> Failed {
        Failed { code, attempt, pushback: None }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_keeps_at_least_half() {
        let b = bounds().backoff;
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(10));
        assert_eq!(b.delay(2, 1.0), Duration::from_millis(20));
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(20));
        assert_eq!(b.delay(5, 1.0), Duration::from_millis(100));
        assert_eq!(b.delay(50, 1.0), Duration::from_millis(100), "no overflow far out");
        assert_eq!(b.delay(50, 0.0), Duration::from_millis(50));
        assert_eq!(b.delay(1, 7.0), Duration::from_millis(10), "jitter is clamped");
    }

    #[test]
    fn only_the_retry_safe_codes_are_retried() {
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::ResourceExhausted, Code::Unknown, Code::Cancelled]
        {
            assert!(matches!(next(&bounds(), failed(code, 1), Duration::from_secs(1), 0.5), Next::Retry { .. }));
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Internal,
            Code::Unimplemented,
        ] {
            assert_eq!(next(&bounds(), failed(code, 1), Duration::from_secs(1), 0.5), Next::GiveUp(GiveUp::Final));
        }
    }

    #[test]
    fn a_down_replica_is_left_but_a_throttling_one_is_not() {
        let retry = |code| next(&bounds(), failed(code, 1), Duration::from_secs(1), 1.0);
        assert_eq!(retry(Code::Unavailable), Next::Retry { after: Duration::from_millis(10), switch: true });
        assert_eq!(retry(Code::DeadlineExceeded), Next::Retry { after: Duration::from_millis(10), switch: true });
        assert_eq!(retry(Code::ResourceExhausted), Next::Retry { after: Duration::from_millis(10), switch: false });
    }

    #[test]
    fn the_servers_pushback_replaces_the_backoff() {
        let mut f = failed(Code::ResourceExhausted, 1);
        f.pushback = Some(Pushback::After(Duration::from_millis(250)));
        assert_eq!(
            next(&bounds(), f, Duration::from_secs(1), 0.0),
            Next::Retry { after: Duration::from_millis(250), switch: false }
        );
        f.pushback = Some(Pushback::Stop);
        assert_eq!(next(&bounds(), f, Duration::from_secs(1), 0.0), Next::GiveUp(GiveUp::ServerSaidStop));
        f.pushback = Some(Pushback::After(Duration::from_secs(2)));
        assert_eq!(next(&bounds(), f, Duration::from_secs(1), 0.0), Next::GiveUp(GiveUp::Deadline));
    }

    #[test]
    fn attempts_and_the_deadline_bound_every_call() {
        assert_eq!(
            next(&bounds(), failed(Code::Unavailable, 5), Duration::from_secs(9), 0.0),
            Next::GiveUp(GiveUp::Attempts)
        );
        assert_eq!(
            next(&bounds(), failed(Code::Unavailable, 3), Duration::from_millis(15), 1.0),
            Next::GiveUp(GiveUp::Deadline),
            "a 40 ms wait does not fit in 15 ms"
        );
    }

    #[test]
    fn pushback_values_parse_as_the_grpc_retry_design_says() {
        assert_eq!(parse_pushback("120"), Pushback::After(Duration::from_millis(120)));
        assert_eq!(parse_pushback(" 0 "), Pushback::After(Duration::ZERO));
        assert_eq!(parse_pushback("-1"), Pushback::Stop);
        assert_eq!(parse_pushback("soon"), Pushback::Stop);
    }
}
