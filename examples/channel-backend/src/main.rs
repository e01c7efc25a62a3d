//! `channel-backend --listen 127.0.0.1:8080 --agent http://127.0.0.1:50052 [--agent ...]`

use std::net::SocketAddr;
use std::path::PathBuf;

use channel_backend::{Backend, router};
use clap::Parser;
use inventory_client::{AgentClient, Options};

/// The reference channel backend: an HTTP order API over a channel's agents.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address of the HTTP API.
    #[arg(long, env = "INVENTORY_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// An agent replica of the channel (repeat once per replica).
    #[arg(long = "agent", env = "INVENTORY_AGENT", value_delimiter = ',', required = true)]
    agents: Vec<String>,
    /// The backend token the agents accept.
    #[arg(long, env = "INVENTORY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the backend token.
    #[arg(long, env = "INVENTORY_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// CA (PEM) to verify https:// agents.
    #[arg(long, env = "INVENTORY_CA")]
    ca: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let mut options = Options::default();
    if let Some(t) = args.token {
        options = options.token(t);
    }
    if let Some(f) = &args.token_file {
        options = options.token_file(f)?;
    }
    if let Some(ca) = &args.ca {
        options = options.ca_file(ca)?;
    }
    let client = AgentClient::connect(args.agents.clone(), options).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on --listen {}: {e}", args.listen))?;
    tracing::info!(listen = %listener.local_addr()?, agents = ?args.agents, "channel backend ready");
    axum::serve(listener, router(Backend::new(client))).with_graceful_shutdown(stop_signal()).await?;
    Ok(())
}

/// Ctrl-C or SIGTERM (what `docker stop` and Kubernetes send).
async fn stop_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
