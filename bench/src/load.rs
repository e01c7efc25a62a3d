//! The load driver: N concurrent callers, a warm-up, then a measured window bounded in
//! time and in count; closed loop (each caller sends as soon as its last call returned)
//! or open loop (calls scheduled at a fixed rate; latency counts from the scheduled
//! start, so a slow server cannot hide its queue: no coordinated omission).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;

use crate::stats::{self, Summary};

/// Hard caps: no run goes beyond these, whatever the flags say.
pub const MAX_DURATION: Duration = Duration::from_secs(600);
pub const MAX_REQUESTS: u64 = 100_000_000;

/// How one call ended, as the load driver counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Served as asked (reserved, healthy, granted, row updated).
    Ok,
    SoldOut,
    LimitExceeded,
    Error,
}

/// One caller: owns its connection handle and its own bookkeeping.
pub trait Caller: Send + 'static {
    fn call(&mut self) -> impl Future<Output = Class> + Send;
}

#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub warmup: Duration,
    pub duration: Duration,
    /// Measured calls at most (warm-up calls do not count).
    pub max_requests: u64,
    /// Open loop at this many calls per second over all callers; `None` is closed loop.
    pub rate: Option<f64>,
    /// Ends the run early when set (checked before each call).
    pub stop: Option<Arc<AtomicBool>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub ok: u64,
    pub sold_out: u64,
    pub limit_exceeded: u64,
    pub errors: u64,
}

impl Counts {
    fn add(&mut self, class: Class) {
        match class {
            Class::Ok => self.ok += 1,
            Class::SoldOut => self.sold_out += 1,
            Class::LimitExceeded => self.limit_exceeded += 1,
            Class::Error => self.errors += 1,
        }
    }

    fn merge(&mut self, o: &Counts) {
        self.ok += o.ok;
        self.sold_out += o.sold_out;
        self.limit_exceeded += o.limit_exceeded;
        self.errors += o.errors;
    }

    pub fn answered(&self) -> u64 {
        self.ok + self.sold_out + self.limit_exceeded
    }

    pub fn total(&self) -> u64 {
        self.answered() + self.errors
    }
}

/// What a run measured. Latencies of answered calls only; errors are counted apart.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Latency: from the scheduled start in open loop, from the send in closed loop.
    pub histogram: Histogram<u64>,
    /// From the actual send (open loop: without the wait for a free caller or the timer).
    pub service: Histogram<u64>,
    pub measured: Counts,
    pub warmup: Counts,
    /// From the end of the warm-up to the last measured call's return.
    pub elapsed: Duration,
    pub rate: Option<f64>,
}

impl LoadReport {
    /// Answered calls per second in the measured window.
    pub fn throughput(&self) -> f64 {
        stats::per_second(self.measured.answered(), self.elapsed.as_secs_f64())
    }

    pub fn summary(&self) -> Summary {
        Summary::of(&self.histogram)
    }

    pub fn service_summary(&self) -> Summary {
        Summary::of(&self.service)
    }
}

struct Shared {
    start: Instant,
    measure_start: Instant,
    end: Instant,
    rate: Option<f64>,
    max_requests: u64,
    issued: AtomicU64,
    slot: AtomicU64,
    stop: Option<Arc<AtomicBool>>,
}

struct TaskResult<C> {
    caller: C,
    histogram: Histogram<u64>,
    service: Histogram<u64>,
    measured: Counts,
    warmup: Counts,
    last_done: Option<Instant>,
}

/// Runs `callers` (one task each) under `spec` and gives them back with the report.
pub async fn run<C: Caller>(spec: &LoadSpec, callers: Vec<C>) -> anyhow::Result<(LoadReport, Vec<C>)> {
    anyhow::ensure!(!callers.is_empty(), "a load run needs at least one caller");
    anyhow::ensure!(spec.rate.is_none_or(|r| r > 0.0 && r.is_finite()), "rate must be a positive number");
    let duration = spec.duration.min(MAX_DURATION);
    let warmup = spec.warmup.min(MAX_DURATION);
    let start = Instant::now();
    let shared = Arc::new(Shared {
        start,
        measure_start: start + warmup,
        end: start + warmup + duration,
        rate: spec.rate,
        max_requests: spec.max_requests.min(MAX_REQUESTS),
        issued: AtomicU64::new(0),
        slot: AtomicU64::new(0),
        stop: spec.stop.clone(),
    });
    let tasks: Vec<_> = callers.into_iter().map(|c| tokio::spawn(drive(c, Arc::clone(&shared)))).collect();
    let (mut histogram, mut service) = (stats::new_histogram(), stats::new_histogram());
    let (mut measured, mut warm) = (Counts::default(), Counts::default());
    let mut last_done: Option<Instant> = None;
    let mut callers = Vec::with_capacity(tasks.len());
    for t in tasks {
        let r = t.await.map_err(|e| anyhow::anyhow!("a load caller failed: {e}"))?;
        histogram.add(&r.histogram).map_err(|e| anyhow::anyhow!("merging histograms: {e}"))?;
        service.add(&r.service).map_err(|e| anyhow::anyhow!("merging histograms: {e}"))?;
        measured.merge(&r.measured);
        warm.merge(&r.warmup);
        last_done = last_done.max(r.last_done);
        callers.push(r.caller);
    }
    let elapsed = last_done.map_or(Duration::ZERO, |t| t.saturating_duration_since(shared.measure_start));
    Ok((LoadReport { histogram, service, measured, warmup: warm, elapsed, rate: spec.rate }, callers))
}

async fn drive<C: Caller>(mut caller: C, s: Arc<Shared>) -> TaskResult<C> {
    let (mut histogram, mut service) = (stats::new_histogram(), stats::new_histogram());
    let (mut measured, mut warmup) = (Counts::default(), Counts::default());
    let mut last_done = None;
    loop {
        if s.stop.as_ref().is_some_and(|f| f.load(Ordering::Relaxed)) {
            break;
        }
        let scheduled = match s.rate {
            Some(rate) => {
                let slot = s.slot.fetch_add(1, Ordering::Relaxed);
                s.start + Duration::from_secs_f64(slot as f64 / rate)
            }
            None => Instant::now(),
        };
        if scheduled >= s.end {
            break;
        }
        if s.rate.is_some() {
            tokio::time::sleep_until(scheduled).await;
        }
        let measuring = scheduled >= s.measure_start;
        if measuring && s.issued.fetch_add(1, Ordering::Relaxed) >= s.max_requests {
            break;
        }
        let sent = Instant::now();
        let class = caller.call().await;
        let done = Instant::now();
        if measuring {
            measured.add(class);
            if class != Class::Error {
                let ns =
                    |from: Instant| u64::try_from(done.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX);
                histogram.saturating_record(ns(scheduled).max(1));
                service.saturating_record(ns(sent).max(1));
            }
            last_done = Some(done);
        } else {
            warmup.add(class);
        }
    }
    TaskResult { caller, histogram, service, measured, warmup, last_done }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sleeper {
        calls: u64,
    }

    impl Caller for Sleeper {
        async fn call(&mut self) -> Class {
            self.calls += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
            if self.calls.is_multiple_of(2) { Class::SoldOut } else { Class::Ok }
        }
    }

    fn spec(rate: Option<f64>, max_requests: u64) -> LoadSpec {
        LoadSpec {
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(200),
            max_requests,
            rate,
            stop: None,
        }
    }

    #[tokio::test]
    async fn bounded_by_count_and_time() {
        let (r, callers) = run(&spec(None, 50), vec![Sleeper { calls: 0 }, Sleeper { calls: 0 }]).await.unwrap();
        assert_eq!(r.measured.total(), 50, "{:?}", r.measured);
        assert_eq!(r.histogram.len(), 50);
        assert!(r.measured.sold_out > 0 && r.measured.ok > 0);
        assert_eq!(callers.iter().map(|c| c.calls).sum::<u64>(), 50 + r.warmup.total());
        assert!(r.throughput() > 0.0);
    }

    #[tokio::test]
    async fn open_loop_keeps_the_rate() {
        let (r, _) = run(&spec(Some(200.0), u64::MAX), vec![Sleeper { calls: 0 }, Sleeper { calls: 0 }]).await.unwrap();
        // 200/s for 200 ms: about 40 measured calls (timer granularity aside).
        assert!((30..=50).contains(&r.measured.total()), "{:?}", r.measured);
    }
}
