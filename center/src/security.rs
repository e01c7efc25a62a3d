//! Who may call what: operators' tokens for Admin, agents' tokens (each bound to one
//! channel) for Center, and the TLS settings of the gRPC listener. The token files are
//! checked as a whole ([`inventory_core::tokens`]) at start and re-read on SIGHUP.

use std::sync::{Arc, RwLock};

use inventory_core::auth::{TokenSet, bearer};
use inventory_core::tokens::Format;
use inventory_net::tokens::{Origin, Spec, load};
use tonic::service::Interceptor;
use tonic::transport::ServerTlsConfig;
use tonic::{Request, Status};

use crate::config::CenterConfig;

/// The channel an authenticated agent acts for (set by [`AgentAuth`]).
#[derive(Debug, Clone)]
pub struct AuthChannel(pub String);

/// The tokens in force.
#[derive(Debug, Default)]
pub struct Tokens {
    pub operators: TokenSet,
    pub agents: TokenSet,
}

#[derive(Debug)]
pub struct Security {
    tokens: RwLock<Arc<Tokens>>,
    specs: Vec<Spec>,
    allow_readable: bool,
}

impl Security {
    /// Tokens from flags, files or environment. Without any, the center starts only with
    /// `--insecure`, and says so.
    pub fn from_config(c: &CenterConfig) -> anyhow::Result<Self> {
        let specs = vec![
            Spec {
                origin: Origin::pick("operator-token", &c.operator_token, &c.operator_token_file),
                principal: "operator",
                format: Format::List,
            },
            Spec {
                origin: Origin::pick("agent-tokens", &c.agent_tokens, &c.agent_tokens_file),
                principal: "agent",
                format: Format::Pairs,
            },
        ];
        let tokens = Self::read(&specs, c.allow_readable_token_files)?;
        if (tokens.operators.is_empty() || tokens.agents.is_empty()) && !c.insecure {
            anyhow::bail!(
                "refusing to start without tokens: set --operator-token-file and --agent-tokens-file \
                 (or INVENTORY_OPERATOR_TOKEN / INVENTORY_AGENT_TOKENS), or pass --insecure"
            );
        }
        Ok(Self { tokens: RwLock::new(Arc::new(tokens)), specs, allow_readable: c.allow_readable_token_files })
    }

    fn read(specs: &[Spec], allow_readable: bool) -> anyhow::Result<Tokens> {
        let mut sets = load(specs, allow_readable)?.into_iter();
        Ok(Tokens { operators: sets.next().unwrap_or_default(), agents: sets.next().unwrap_or_default() })
    }

    /// The tokens in force now.
    pub fn tokens(&self) -> Arc<Tokens> {
        Arc::clone(&self.tokens.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Reads the token files again (SIGHUP): the new set replaces the old only if it
    /// passes every check; else the old stays in force and the error says why.
    pub fn reload(&self) -> anyhow::Result<()> {
        let tokens = Self::read(&self.specs, self.allow_readable)?;
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
        Ok(())
    }

    pub fn insecure(&self) -> bool {
        let t = self.tokens();
        t.operators.is_empty() || t.agents.is_empty()
    }

    /// Says so once the center serves without tokens (after it bound its ports: a center
    /// that fails to start prints only why).
    pub fn warn_if_insecure(&self) {
        let t = self.tokens();
        if t.operators.is_empty() || t.agents.is_empty() {
            tracing::warn!(
                operators = !t.operators.is_empty(),
                agents = !t.agents.is_empty(),
                "INSECURE: services without tokens accept any caller"
            );
        }
    }

    /// Whether a caller presenting `presented` (the bearer token of its `authorization`
    /// header, if any) may see what operators see; always without operator tokens. The
    /// refusal is the message for the caller. Compared in constant time (`TokenSet::find`).
    pub fn check_operator(&self, presented: Option<&str>) -> Result<(), &'static str> {
        let tokens = self.tokens();
        if tokens.operators.is_empty() {
            return Ok(());
        }
        match presented {
            None => Err("missing operator token (authorization: Bearer ...)"),
            Some(t) if tokens.operators.find(t).is_some() => Ok(()),
            Some(_) => Err("invalid operator token"),
        }
    }

    pub fn tls(c: &CenterConfig) -> anyhow::Result<Option<ServerTlsConfig>> {
        inventory_net::grpc_server_tls(c.tls_cert.as_deref(), c.tls_key.as_deref(), c.tls_client_ca.as_deref())
    }
}

/// Re-reads the token files on every SIGHUP until `stop`; a refused reload keeps the
/// tokens in force and logs why.
pub async fn reload_on_sighup(security: Arc<Security>, mut stop: tokio::sync::watch::Receiver<bool>) {
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
        match security.reload() {
            Ok(()) => tracing::info!("token files re-read"),
            Err(e) => tracing::warn!(error = %e, "token files not re-read; the tokens in force stay"),
        }
    }
}

fn token<T>(req: &Request<T>) -> Option<&str> {
    req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(bearer)
}

/// Admin: an operator's token (unless running without operator tokens).
#[derive(Clone)]
pub struct OperatorAuth(pub Arc<Security>);

impl Interceptor for OperatorAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let tokens = self.0.tokens();
        if tokens.operators.is_empty() {
            return Ok(req);
        }
        match token(&req) {
            None => Err(Status::unauthenticated("missing operator token (authorization: Bearer ...)")),
            Some(t) if tokens.operators.find(t).is_some() => Ok(req),
            Some(_) => Err(Status::unauthenticated("invalid operator token")),
        }
    }
}

/// Center: an agent's token; the channel it is bound to travels with the request.
#[derive(Clone)]
pub struct AgentAuth(pub Arc<Security>);

impl Interceptor for AgentAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let tokens = self.0.tokens();
        if tokens.agents.is_empty() {
            return Ok(req);
        }
        let channel = match token(&req) {
            None => return Err(Status::unauthenticated("missing agent token (authorization: Bearer ...)")),
            Some(t) => tokens.agents.find(t).map(str::to_owned),
        };
        let Some(channel) = channel else { return Err(Status::unauthenticated("invalid agent token")) };
        req.extensions_mut().insert(AuthChannel(channel));
        Ok(req)
    }
}

/// The channel the caller's token is bound to (None without agent tokens).
pub fn own_channel<T>(req: &Request<T>) -> Option<String> {
    req.extensions().get::<AuthChannel>().map(|a| a.0.clone())
}

/// An agent may act only for its own channel.
pub fn authorize(own: &Option<String>, channel: &str) -> Result<(), crate::error::CenterError> {
    match own {
        Some(own) if own != channel => Err(crate::error::CenterError::PermissionDenied(format!(
            "agent token of channel {own} may not act for channel {channel:?}"
        ))),
        _ => Ok(()),
    }
}
