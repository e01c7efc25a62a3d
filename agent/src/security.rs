//! The agent's gates: backend tokens on the Agent service, the token and TLS settings it
//! uses towards the center, and per-user rate limits (GCRA) with bounded memory.

use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultKeyedRateLimiter, Quota};
use inventory_core::auth::{TokenSet, bearer};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

use crate::config::AgentConfig;

use inventory_net::read_text as read;

#[derive(Debug, Default)]
pub struct Security {
    pub backends: TokenSet,
    /// Sent to the center as `authorization: Bearer ...`; never logged.
    pub center_token: Option<String>,
}

impl Security {
    pub fn from_config(c: &AgentConfig) -> anyhow::Result<Self> {
        let backends = match (&c.backend_tokens, &c.backend_tokens_file) {
            (Some(t), _) => TokenSet::parse_list("backend", t),
            (None, Some(f)) => TokenSet::parse_list("backend", &read(f)?),
            (None, None) => Ok(TokenSet::default()),
        }
        .map_err(|e| anyhow::anyhow!("backend tokens: {e}"))?;
        let center_token = match (&c.center_token, &c.center_token_file) {
            (Some(t), _) => Some(t.trim().to_owned()),
            (None, Some(f)) => Some(read(f)?.trim().to_owned()),
            (None, None) => None,
        };
        if (backends.is_empty() || center_token.is_none()) && !c.insecure {
            anyhow::bail!(
                "refusing to start without tokens: set --backend-tokens-file and --center-token-file \
                 (or INVENTORY_BACKEND_TOKENS / INVENTORY_CENTER_TOKEN), or pass --insecure"
            );
        }
        Ok(Self { backends, center_token })
    }

    /// How callers and the center are authenticated, for the start-up line.
    pub fn mode(&self) -> &'static str {
        match (self.backends.is_empty(), self.center_token.is_none()) {
            (false, false) => "tokens",
            (true, true) => "insecure (no tokens)",
            (true, false) => "insecure (no backend tokens)",
            (false, true) => "insecure (no center token)",
        }
    }

    /// Says so once the agent serves without tokens (after it bound its ports: an agent
    /// that fails to start prints only why).
    pub fn warn_if_insecure(&self) {
        if self.backends.is_empty() || self.center_token.is_none() {
            tracing::warn!(
                backends = !self.backends.is_empty(),
                center = self.center_token.is_some(),
                "INSECURE: running without tokens"
            );
        }
    }

    pub fn server_tls(c: &AgentConfig) -> anyhow::Result<Option<ServerTlsConfig>> {
        inventory_net::grpc_server_tls(c.tls_cert.as_deref(), c.tls_key.as_deref(), c.tls_client_ca.as_deref())
    }

    /// TLS towards the center: verify it against --center-ca; present a client
    /// certificate for mutual TLS when given.
    pub fn center_tls(c: &AgentConfig) -> anyhow::Result<Option<ClientTlsConfig>> {
        if !c.center.starts_with("https://") {
            return Ok(None);
        }
        let mut tls = ClientTlsConfig::new();
        match &c.center_ca {
            Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(read(ca)?)),
            None => anyhow::bail!("--center {} is https: give --center-ca to verify it", c.center),
        }
        if let (Some(cert), Some(key)) = (&c.center_client_cert, &c.center_client_key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(Some(tls))
    }
}

/// Agent service: a backend's token (unless running without backend tokens).
#[derive(Clone)]
pub struct BackendAuth(pub Arc<Security>);

impl Interceptor for BackendAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        if self.0.backends.is_empty() {
            return Ok(req);
        }
        let token = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(bearer);
        match token {
            None => Err(Status::unauthenticated("missing backend token (authorization: Bearer ...)")),
            Some(t) if self.0.backends.find(t).is_some() => Ok(req),
            Some(_) => Err(Status::unauthenticated("invalid backend token")),
        }
    }
}

/// Per-user request rate (GCRA). State is a small record per recently active user; a
/// worker drops users back at full allowance, so memory follows the active set.
///
/// Users are keyed by a 64-bit hash of their id under a per-process random key, so a
/// check allocates nothing; two users sharing a limit needs a hash collision nobody can
/// aim for (the key is secret and differs per process).
pub struct UserLimits {
    limiter: DefaultKeyedRateLimiter<u64>,
    hasher: RandomState,
}

impl UserLimits {
    pub fn new(per_sec: u32, burst: u32) -> Self {
        let per_sec = NonZeroU32::new(per_sec.max(1)).expect("max(1)");
        let burst = NonZeroU32::new(burst.max(1)).expect("max(1)");
        Self {
            limiter: governor::RateLimiter::keyed(Quota::per_second(per_sec).allow_burst(burst)),
            hasher: RandomState::new(),
        }
    }

    /// Whether `user` may make another request now.
    pub fn allow(&self, user: &str) -> bool {
        self.limiter.check_key(&self.hasher.hash_one(user)).is_ok()
    }

    /// Forgets users whose allowance is full again; returns how many are still tracked.
    pub fn forget_idle(&self) -> usize {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
        self.limiter.len()
    }

    pub fn tracked(&self) -> usize {
        self.limiter.len()
    }
}
