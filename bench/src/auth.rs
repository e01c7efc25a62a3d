//! How `inventory-bench acquire` reaches a secured agent: the backend token and TLS, with
//! the same flags and `INVENTORY_*` variables as invctl, so it can drive the agents of a
//! deployed stack (for example `deploy/local/run.sh`).

use std::path::PathBuf;

use anyhow::Context;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct AuthArgs {
    /// Backend token the agents require (prefer --token-file).
    #[arg(long, env = "INVENTORY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the backend token.
    #[arg(long, env = "INVENTORY_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// CA (PEM) to verify https:// agents.
    #[arg(long, env = "INVENTORY_CA")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for agents that require mutual TLS; with --client-key.
    #[arg(long, env = "INVENTORY_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    #[arg(long, env = "INVENTORY_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl AuthArgs {
    /// The `authorization` header every Acquire carries, if a token was given.
    pub fn authorization(&self) -> anyhow::Result<Option<AsciiMetadataValue>> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.trim().to_owned(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("cannot read --token-file {}", f.display()))?
                .trim()
                .to_owned(),
            (None, None) => return Ok(None),
        };
        anyhow::ensure!(!token.is_empty(), "the token is empty");
        let value = format!("Bearer {token}").parse().map_err(|_| anyhow::anyhow!("the token is not ascii"))?;
        Ok(Some(value))
    }

    /// TLS for `https://` agents: the CA to trust and the client identity, if given.
    pub fn tls(&self) -> anyhow::Result<ClientTlsConfig> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {flag} {}", path.display()))
        };
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read("--ca", ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            tls = tls.identity(Identity::from_pem(read("--client-cert", cert)?, read("--client-key", key)?));
        }
        Ok(tls)
    }
}

impl AuthArgs {
    /// The same token and TLS for the client crate (`--via client`).
    pub fn client_options(&self) -> anyhow::Result<inventory_client::Options> {
        let mut options = inventory_client::Options::default();
        if let Some(Ok(token)) = self.authorization()?.as_ref().map(|v| v.to_str().map(str::to_owned)) {
            options = options.token(token.trim_start_matches("Bearer "));
        }
        if let Some(ca) = &self.ca {
            options = options.ca_file(ca)?;
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            let read = |flag: &str, path: &PathBuf| {
                std::fs::read_to_string(path).with_context(|| format!("cannot read {flag} {}", path.display()))
            };
            options = options.identity_pem(read("--client-cert", cert)?, read("--client-key", key)?);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_flag_or_the_file_trimmed() {
        let none = AuthArgs::default();
        assert_eq!(none.authorization().unwrap(), None);
        let flag = AuthArgs { token: Some(" t0k ".into()), ..Default::default() };
        assert_eq!(flag.authorization().unwrap().unwrap(), "Bearer t0k");
        let path = std::env::temp_dir().join(format!("bench-token-{}", std::process::id()));
        std::fs::write(&path, "from-file\n").unwrap();
        let file = AuthArgs { token_file: Some(path.clone()), ..Default::default() };
        assert_eq!(file.authorization().unwrap().unwrap(), "Bearer from-file");
        std::fs::remove_file(&path).unwrap();
        let missing = file.authorization().unwrap_err().to_string();
        assert!(missing.starts_with("cannot read --token-file"), "{missing}");
        let blank = AuthArgs { token: Some("  ".into()), ..Default::default() };
        assert!(blank.authorization().is_err());
    }
}
