//! Reaching the center or an agent: address, TLS trust, bearer token, and the one-line
//! failure every call turns into.

use std::path::PathBuf;
use std::time::Duration;

use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

#[derive(clap::Args)]
pub struct ConnArgs {
    /// Bearer token: the operator's for the center, a backend's for `invctl agent`.
    #[arg(long, env = "INVENTORY_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// File holding the token.
    #[arg(long, env = "INVENTORY_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// CA (PEM) to verify an https:// center or agent.
    #[arg(long, env = "INVENTORY_CA", global = true)]
    ca: Option<PathBuf>,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A call (connection included) that has no answer by then fails; a server that accepts
/// connections but never answers (not gRPC, or plaintext gRPC behind an https:// URL)
/// ends here.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A failed call: printed as one line, exit code 2.
pub struct Failure(pub String);

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Failure(format!("{}: {}", code_name(s.code()), s.message()))
    }
}

/// Why a connection failed, in the operator's words: refused, timed out, or a TLS
/// mismatch (an `https://` URL against a plaintext server, an untrusted certificate).
fn connect_failure(flag: &str, url: &str, e: &tonic::transport::Error) -> Failure {
    let mut chain = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        chain.push(s.to_string());
        source = s.source();
    }
    let all = chain.join(": ").to_lowercase();
    let https = url.starts_with("https://");
    let why = if all.contains("refused") {
        "connection refused (nothing listens there)".to_owned()
    } else if all.contains("timed out") || all.contains("elapsed") {
        format!("timed out after {} s", CONNECT_TIMEOUT.as_secs())
    } else if https && (all.contains("corrupt message") || all.contains("invalidcontenttype")) {
        "TLS handshake failed: the server does not speak TLS (use http://)".to_owned()
    } else if https && all.contains("certificate") {
        format!("TLS handshake failed: the server's certificate is not trusted (pass --ca): {}", chain.join(": "))
    } else {
        chain.join(": ")
    };
    Failure(format!("cannot connect to --{flag} {url:?}: {why}"))
}

/// "FailedPrecondition" -> "failed precondition".
fn code_name(code: tonic::Code) -> String {
    let debug = format!("{code:?}");
    let mut out = String::new();
    for (i, ch) in debug.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.extend(ch.to_lowercase());
    }
    out
}

/// How invctl reaches a server: TLS trust and token.
pub struct Conn {
    token: Option<MetadataValue<Ascii>>,
    ca: Option<PathBuf>,
}

pub type Authed = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

impl Conn {
    pub fn new(args: &ConnArgs) -> Result<Self, Failure> {
        let token = match (&args.token, &args.token_file) {
            (Some(t), _) => Some(t.trim().to_owned()),
            (None, Some(f)) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| Failure(format!("cannot read --token-file {}: {e}", f.display())))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        let token = match token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| Failure("token is not ascii".into()))?),
            None => None,
        };
        Ok(Self { token, ca: args.ca.clone() })
    }

    async fn channel(&self, flag: &str, url: &str) -> Result<Authed, Failure> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|e| Failure(format!("invalid --{flag} {url:?}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT);
        if url.starts_with("https://") {
            let mut tls = tonic::transport::ClientTlsConfig::new();
            if let Some(ca) = &self.ca {
                let pem = std::fs::read_to_string(ca)
                    .map_err(|e| Failure(format!("cannot read --ca {}: {e}", ca.display())))?;
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| Failure(format!("tls: {e}")))?;
        }
        let channel = endpoint.connect().await.map_err(|e| connect_failure(flag, url, &e))?;
        Ok(InterceptedService::new(channel, Bearer(self.token.clone())))
    }

    pub async fn admin(&self, url: &str) -> Result<AdminClient<Authed>, Failure> {
        Ok(AdminClient::new(self.channel("center", url).await?))
    }

    pub async fn agent(&self, url: &str) -> Result<AgentClient<Authed>, Failure> {
        Ok(AgentClient::new(self.channel("agent", url).await?))
    }
}
