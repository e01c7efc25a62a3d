//! What one channel may ask of the center: a call rate (GCRA, per channel) and a number of
//! open `WatchChannel` streams. A channel whose token leaked, or whose agent misbehaves,
//! can then fill neither the request records nor the center's memory faster than these
//! allow, and the other channels are served meanwhile. Refusals are RESOURCE_EXHAUSTED
//! naming the rule; the agent backs off and retries (nothing was applied).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::{DefaultKeyedRateLimiter, Quota};
use tonic::Status;

/// Default call rate per channel: far above what an agent needs (its rebalancer calls a
/// few times per second per item; stocking 10,000 items at start is one BorrowMany line
/// each) and above the center's own Borrow throughput, so only a flood meets it.
pub const DEFAULT_RATE_PER_SEC: u32 = 20_000;
/// Default burst: a second's worth.
pub const DEFAULT_BURST: u32 = 20_000;
/// Default bound on a channel's open `WatchChannel` streams (an agent opens one; its
/// replicas one each).
pub const DEFAULT_MAX_WATCHES: usize = 16;

pub struct ChannelLimits {
    rate: DefaultKeyedRateLimiter<String>,
    per_sec: u32,
    burst: u32,
    max_watches: usize,
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

impl ChannelLimits {
    pub fn new(per_sec: u32, burst: u32, max_watches: usize) -> Self {
        let (per_sec, burst) = (per_sec.max(1), burst.max(1));
        let quota = Quota::per_second(NonZeroU32::new(per_sec).expect("max(1)"))
            .allow_burst(NonZeroU32::new(burst).expect("max(1)"));
        Self { rate: governor::RateLimiter::keyed(quota), per_sec, burst, max_watches, watches: Arc::default() }
    }

    /// Charges `cost` calls (a BorrowMany's lines) to `channel`'s allowance.
    pub fn call(&self, channel: &str, cost: usize) -> Result<(), Status> {
        let n = u32::try_from(cost).ok().and_then(NonZeroU32::new).unwrap_or(NonZeroU32::MIN);
        match self.rate.check_key_n(&channel.to_owned(), n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) | Err(_) => Err(Status::resource_exhausted(format!(
                "channel {channel} exceeds its call rate at the center ({} per second, bursts of {}: \
                 --channel-rate-per-sec, --channel-burst); retry later",
                self.per_sec, self.burst
            ))),
        }
    }

    /// Counts an open `WatchChannel` stream of `channel` until the guard is dropped.
    pub fn watch(&self, channel: &str) -> Result<WatchGuard, Status> {
        let mut open = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(channel.to_owned()).or_default();
        if *n >= self.max_watches {
            return Err(Status::resource_exhausted(format!(
                "channel {channel} has {n} WatchChannel streams open, the most allowed \
                 (--max-watch-streams-per-channel {})",
                self.max_watches
            )));
        }
        *n += 1;
        Ok(WatchGuard { watches: Arc::clone(&self.watches), channel: channel.to_owned() })
    }
}

/// One open stream; dropping it (the stream ended or its caller left) frees its place.
pub struct WatchGuard {
    watches: Arc<Mutex<HashMap<String, usize>>>,
    channel: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut open = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.channel) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.channel);
            }
        }
    }
}
