//! How a client reaches a channel's agents and how patient it is.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::{Backoff, Error, MemoryOrderStore, Metrics, NoMetrics, OrderStore};

/// Settings of an [`AgentClient`](crate::AgentClient). `Options::default()` suits a
/// backend on the agent's network: no token (an agent run with `--insecure`), plaintext
/// `http://` URLs, a 10 s deadline per call, 3 s per attempt.
///
/// ```
/// use std::time::Duration;
/// use inventory_client::Options;
///
/// let options = Options::default()
///     .token("backend-secret")
///     .deadline(Duration::from_secs(3))
///     .attempt_timeout(Duration::from_millis(500));
/// # let _ = options;
/// ```
#[derive(Clone)]
pub struct Options {
    pub(crate) token: Option<String>,
    pub(crate) ca_pem: Option<String>,
    pub(crate) identity_pem: Option<(String, String)>,
    pub(crate) connect_timeout: Duration,
    pub(crate) attempt_timeout: Duration,
    pub(crate) deadline: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) max_attempts: u32,
    pub(crate) health_interval: Duration,
    pub(crate) metrics: Arc<dyn Metrics>,
    pub(crate) orders: Arc<dyn OrderStore>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            ca_pem: None,
            identity_pem: None,
            connect_timeout: Duration::from_secs(2),
            // Above the 2 s an agent may hold an Acquire that found its pool empty while it
            // borrows (`--miss-wait-ms`), so a slow answer is not taken for a lost one.
            attempt_timeout: Duration::from_secs(3),
            deadline: Duration::from_secs(10),
            backoff: Backoff::default(),
            max_attempts: 50,
            health_interval: Duration::from_secs(1),
            metrics: Arc::new(NoMetrics),
            orders: Arc::new(MemoryOrderStore::new()),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("token", &self.token.as_ref().map(|_| "<secret>"))
            .field("tls_ca", &self.ca_pem.is_some())
            .field("attempt_timeout", &self.attempt_timeout)
            .field("deadline", &self.deadline)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

fn read(flag: &str, path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|e| Error::Config(format!("cannot read {flag} {}: {e}", path.display())))
}

impl Options {
    /// The backend token, sent as `authorization: Bearer <token>` (the agent's
    /// `--backend-tokens`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into().trim().to_owned());
        self
    }

    /// The backend token read from a file (surrounding whitespace dropped), as
    /// `invctl --token-file` reads it.
    pub fn token_file(self, path: impl AsRef<Path>) -> Result<Self, Error> {
        let token = read("token file", path.as_ref())?;
        Ok(self.token(token))
    }

    /// The CA (PEM) that signed the agents' certificates, for `https://` URLs.
    pub fn ca_pem(mut self, pem: impl Into<String>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// The CA read from a PEM file, as `invctl --ca` reads it.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, Error> {
        let pem = read("CA file", path.as_ref())?;
        Ok(self.ca_pem(pem))
    }

    /// A client certificate and key (PEM), for agents that require one
    /// (`--tls-client-ca`).
    pub fn identity_pem(mut self, cert: impl Into<String>, key: impl Into<String>) -> Self {
        self.identity_pem = Some((cert.into(), key.into()));
        self
    }

    /// How long a connection attempt to one replica may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one attempt waits for its answer before it counts as lost
    /// (DEADLINE_EXCEEDED, retried on another replica).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The overall bound on a call, retries and waits included.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The backoff between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// At most this many attempts per call (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// How often every replica's `grpc.health.v1.Health` is asked.
    pub fn health_interval(mut self, interval: Duration) -> Self {
        self.health_interval = interval;
        self
    }

    /// The metrics hooks.
    pub fn metrics(mut self, metrics: Arc<dyn Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Where the generation of each reserved key is kept (default: in memory).
    pub fn order_store(mut self, orders: Arc<dyn OrderStore>) -> Self {
        self.orders = orders;
        self
    }
}
