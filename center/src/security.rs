//! Who may call what: operators' tokens for Admin, agents' tokens (each bound to one
//! channel) for Center, and the TLS settings of the gRPC listener.

use std::sync::Arc;

use inventory_core::auth::{TokenSet, bearer};
use tonic::service::Interceptor;
use tonic::transport::ServerTlsConfig;
use tonic::{Request, Status};

use crate::config::CenterConfig;

/// The channel an authenticated agent acts for (set by [`AgentAuth`]).
#[derive(Debug, Clone)]
pub struct AuthChannel(pub String);

#[derive(Debug)]
pub struct Security {
    pub operators: TokenSet,
    pub agents: TokenSet,
}

impl Security {
    /// Tokens from flags, files or environment. Without any, the center starts only with
    /// `--insecure`, and says so.
    pub fn from_config(c: &CenterConfig) -> anyhow::Result<Self> {
        let operators = match (&c.operator_token, &c.operator_token_file) {
            (Some(t), _) => TokenSet::single("operator", t),
            (None, Some(f)) => TokenSet::parse_list("operator", &inventory_net::read_text(f)?),
            (None, None) => Ok(TokenSet::default()),
        }
        .map_err(|e| anyhow::anyhow!("operator token: {e}"))?;
        let agents = match (&c.agent_tokens, &c.agent_tokens_file) {
            (Some(t), _) => TokenSet::parse_pairs(t),
            (None, Some(f)) => TokenSet::parse_pairs(&inventory_net::read_text(f)?),
            (None, None) => Ok(TokenSet::default()),
        }
        .map_err(|e| anyhow::anyhow!("agent tokens: {e}"))?;
        if (operators.is_empty() || agents.is_empty()) && !c.insecure {
            anyhow::bail!(
                "refusing to start without tokens: set --operator-token-file and --agent-tokens-file \
                 (or INVENTORY_OPERATOR_TOKEN / INVENTORY_AGENT_TOKENS), or pass --insecure"
            );
        }
        Ok(Self { operators, agents })
    }

    /// Says so once the center serves without tokens (after it bound its ports: a center
    /// that fails to start prints only why).
    pub fn warn_if_insecure(&self) {
        if self.operators.is_empty() || self.agents.is_empty() {
            tracing::warn!(
                operators = !self.operators.is_empty(),
                agents = !self.agents.is_empty(),
                "INSECURE: services without tokens accept any caller"
            );
        }
    }

    /// Whether a caller presenting `presented` (the bearer token of its `authorization`
    /// header, if any) may see what operators see; always without operator tokens. The
    /// refusal is the message for the caller. Compared in constant time (`TokenSet::find`).
    pub fn check_operator(&self, presented: Option<&str>) -> Result<(), &'static str> {
        if self.operators.is_empty() {
            return Ok(());
        }
        match presented {
            None => Err("missing operator token (authorization: Bearer ...)"),
            Some(t) if self.operators.find(t).is_some() => Ok(()),
            Some(_) => Err("invalid operator token"),
        }
    }

    pub fn tls(c: &CenterConfig) -> anyhow::Result<Option<ServerTlsConfig>> {
        inventory_net::grpc_server_tls(c.tls_cert.as_deref(), c.tls_key.as_deref(), c.tls_client_ca.as_deref())
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
        if self.0.operators.is_empty() {
            return Ok(req);
        }
        match token(&req) {
            None => Err(Status::unauthenticated("missing operator token (authorization: Bearer ...)")),
            Some(t) if self.0.operators.find(t).is_some() => Ok(req),
            Some(_) => Err(Status::unauthenticated("invalid operator token")),
        }
    }
}

/// Center: an agent's token; the channel it is bound to travels with the request.
#[derive(Clone)]
pub struct AgentAuth(pub Arc<Security>);

impl Interceptor for AgentAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if self.0.agents.is_empty() {
            return Ok(req);
        }
        let channel = match token(&req) {
            None => return Err(Status::unauthenticated("missing agent token (authorization: Bearer ...)")),
            Some(t) => self.0.agents.find(t).map(str::to_owned),
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
