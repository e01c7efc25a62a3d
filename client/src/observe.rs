//! Metrics hooks: the caller's own counters, no global registry.

use std::time::Duration;

/// Called by the client as calls and attempts finish. Every method has an empty default;
/// implement the ones the backend exports. Implementations must be cheap: they run on the
/// call's path.
pub trait Metrics: Send + Sync {
    /// One attempt of `method` on replica `replica` (its URL) ended with `code`
    /// (`tonic::Code::Ok` for an answer).
    fn attempt(&self, method: &'static str, replica: &str, code: tonic::Code) {
        let _ = (method, replica, code);
    }

    /// A call of `method` ended with `outcome` (an [`Acquired::kind`](crate::Acquired::kind),
    /// `"ok"`, or an [`Error::kind`](crate::Error::kind)) after `attempts` attempts.
    fn call(&self, method: &'static str, outcome: &'static str, attempts: u32, elapsed: Duration) {
        let _ = (method, outcome, attempts, elapsed);
    }
}

/// Metrics that go nowhere (the default).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoMetrics;

impl Metrics for NoMetrics {}
