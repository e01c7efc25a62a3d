//! Whether the center serves. A center whose database does not answer can grant, return
//! and record nothing, so it must not look healthy to a load balancer, an orchestrator or
//! an operator: a worker pings the ledger's database every [`PING_PERIOD`], each ping
//! bounded by [`PING_TIMEOUT`], and publishes the verdict to `/healthz` (503 with a short
//! reason while the database does not answer) and to `grpc.health.v1.Health` (the Center
//! and Admin services and the server as a whole NOT_SERVING meanwhile). The first ping
//! that succeeds turns both back to serving. One task, stopped by the shutdown signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::error::CenterError;
use crate::store::LedgerStore;

/// How often the database is pinged.
pub const PING_PERIOD: Duration = Duration::from_secs(1);
/// How long a ping may take before the database counts as not answering.
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// The verdict of the last ping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serving {
    Yes,
    /// Why not, in a few words for `/healthz`: never the driver's own words (the port
    /// needs no token), which go to the log.
    No(String),
}

/// The verdicts as `/healthz` reads them.
#[derive(Debug, Clone)]
pub struct Health(watch::Receiver<Serving>);

impl Health {
    /// A sender for the worker and the [`Health`] it feeds; serving until told otherwise.
    pub fn channel() -> (watch::Sender<Serving>, Health) {
        let (tx, rx) = watch::channel(Serving::Yes);
        (tx, Health(rx))
    }

    /// Always serving: for a router that runs without the worker.
    pub fn always() -> Health {
        Self::channel().1
    }

    pub fn current(&self) -> Serving {
        self.0.borrow().clone()
    }
}

/// The verdict on one ping: `None` when it did not answer within `timeout`.
pub fn verdict(ping: Option<&Result<(), CenterError>>, timeout: Duration) -> Serving {
    match ping {
        Some(Ok(())) => Serving::Yes,
        Some(Err(_)) => Serving::No("the database answered the ping with an error".to_owned()),
        None => Serving::No(format!("the database did not answer within {} ms", timeout.as_millis())),
    }
}

/// Pings until `stop`, publishing each verdict to `verdicts` and, when it changes, to the
/// gRPC health of `services` (the empty name is the server as a whole).
pub async fn run(
    store: Arc<dyn LedgerStore>,
    reporter: HealthReporter,
    services: Vec<&'static str>,
    verdicts: watch::Sender<Serving>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let ping = tokio::time::timeout(PING_TIMEOUT, store.ping()).await.ok();
        let now = verdict(ping.as_ref(), PING_TIMEOUT);
        let was = verdicts.send_replace(now.clone());
        if now != was {
            let status = match &now {
                Serving::Yes => {
                    tracing::info!("the database answers again: serving");
                    ServingStatus::Serving
                }
                Serving::No(reason) => {
                    match &ping {
                        Some(Err(e)) => tracing::warn!(%reason, error = %e, "not serving"),
                        _ => tracing::warn!(%reason, "not serving"),
                    }
                    ServingStatus::NotServing
                }
            };
            for service in &services {
                reporter.set_service_status(*service, status).await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(PING_PERIOD) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_serves_an_error_or_silence_does_not() {
        let timeout = Duration::from_millis(1_000);
        assert_eq!(verdict(Some(&Ok(())), timeout), Serving::Yes);
        let refused = verdict(Some(&Err(CenterError::Database { detail: "password=hunter2".into() })), timeout);
        assert_eq!(refused, Serving::No("the database answered the ping with an error".into()));
        assert_eq!(verdict(None, timeout), Serving::No("the database did not answer within 1000 ms".into()));
    }
}
