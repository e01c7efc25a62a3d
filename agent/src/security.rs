//! The agent's gates: backend tokens on the Agent service, the token and TLS settings it
//! uses towards the center, and per-user rate limits (GCRA) with bounded memory.

use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};

use governor::{DefaultKeyedRateLimiter, Quota};
use inventory_core::auth::{TokenSet, bearer};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

use inventory_core::tokens::Format;
use inventory_net::tokens::{Origin, Spec, load};

use crate::config::AgentConfig;

use inventory_net::read_text as read;

/// The tokens in force.
#[derive(Debug, Default)]
pub struct Tokens {
    pub backends: TokenSet,
    /// Sent to the center as `authorization: Bearer ...`; never logged.
    pub center_token: Option<String>,
}

#[derive(Debug, Default)]
pub struct Security {
    tokens: RwLock<Arc<Tokens>>,
    specs: Vec<Spec>,
    allow_readable: bool,
}

impl Security {
    /// The backends' tokens and the agent's own token towards the center, checked together
    /// (a backend's token may not be the agent's). Without them, the agent starts only
    /// with `--insecure`.
    pub fn from_config(c: &AgentConfig) -> anyhow::Result<Self> {
        let specs = vec![
            Spec {
                origin: Origin::pick("backend-tokens", &c.backend_tokens, &c.backend_tokens_file),
                principal: "backend",
                format: Format::List,
            },
            Spec {
                origin: Origin::pick("center-token", &c.center_token, &c.center_token_file),
                principal: "center",
                format: Format::Single,
            },
        ];
        let tokens = Self::read(&specs, c.allow_readable_token_files)?;
        if (tokens.backends.is_empty() || tokens.center_token.is_none()) && !c.insecure {
            anyhow::bail!(
                "refusing to start without tokens: set --backend-tokens-file and --center-token-file \
                 (or INVENTORY_BACKEND_TOKENS / INVENTORY_CENTER_TOKEN), or pass --insecure"
            );
        }
        Ok(Self { tokens: RwLock::new(Arc::new(tokens)), specs, allow_readable: c.allow_readable_token_files })
    }

    fn read(specs: &[Spec], allow_readable: bool) -> anyhow::Result<Tokens> {
        let mut sets = load(specs, allow_readable)?.into_iter();
        let backends = sets.next().unwrap_or_default();
        let center_token = sets.next().and_then(|s| s.sole().map(str::to_owned));
        Ok(Tokens { backends, center_token })
    }

    /// The tokens in force now.
    pub fn tokens(&self) -> Arc<Tokens> {
        Arc::clone(&self.tokens.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Reads the token files again (SIGHUP): the new tokens replace the old only if they
    /// pass every check; else the old stay in force and the error says why.
    pub fn reload(&self) -> anyhow::Result<Arc<Tokens>> {
        let tokens = Arc::new(Self::read(&self.specs, self.allow_readable)?);
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&tokens);
        Ok(tokens)
    }

    /// How callers and the center are authenticated, for the start-up line.
    pub fn mode(&self) -> &'static str {
        let t = self.tokens();
        match (t.backends.is_empty(), t.center_token.is_none()) {
            (false, false) => "tokens",
            (true, true) => "insecure (no tokens)",
            (true, false) => "insecure (no backend tokens)",
            (false, true) => "insecure (no center token)",
        }
    }

    /// Says so once the agent serves without tokens (after it bound its ports: an agent
    /// that fails to start prints only why).
    pub fn warn_if_insecure(&self) {
        let t = self.tokens();
        if t.backends.is_empty() || t.center_token.is_none() {
            tracing::warn!(
                backends = !t.backends.is_empty(),
                center = t.center_token.is_some(),
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

/// Re-reads the token files on every SIGHUP until `stop`: the backends' tokens, and the
/// token the link presents to the center. A refused reload keeps the tokens in force and
/// logs why.
pub async fn reload_on_sighup(
    security: Arc<Security>,
    link: Arc<crate::link::CenterLink>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP handler: token files are read at start only");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = hup.recv() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let reloaded = security.reload().and_then(|t| link.set_token(t.center_token.as_deref()));
        match reloaded {
            Ok(()) => tracing::info!("token files re-read"),
            Err(e) => tracing::warn!(error = %e, "token files not re-read; the tokens in force stay"),
        }
    }
}

/// Agent service: a backend's token (unless running without backend tokens).
#[derive(Clone)]
pub struct BackendAuth(pub Arc<Security>);

impl Interceptor for BackendAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let tokens = self.0.tokens();
        if tokens.backends.is_empty() {
            return Ok(req);
        }
        let token = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(bearer);
        match token {
            None => Err(Status::unauthenticated("missing backend token (authorization: Bearer ...)")),
            Some(t) if tokens.backends.find(t).is_some() => Ok(req),
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
