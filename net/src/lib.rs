//! Edges shared by the center and the agent: TLS for the gRPC listener and the HTTP side
//! port, logging set-up and trace export ([`trace`]), the shutdown signal, and the metrics
//! both export alike ([`metrics`]: per-RPC calls and latency, build information).
//!
//! The HTTP side port (metrics, health, console) over TLS: `axum::serve` takes any
//! [`axum::serve::Listener`]; [`TlsListener`] accepts TCP connections and completes each
//! TLS handshake in its own task (a slow or hostile client cannot hold up the others),
//! handing finished streams to the server.

pub mod edge;
pub mod metrics;
pub mod tokens;
pub mod trace;

pub use trace::{OtlpExport, TracingGuard};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
pub use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;

/// A handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

/// A rustls server configuration from PEM files (HTTP/1.1 only, no client certificates).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<ServerConfig> {
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| anyhow::anyhow!("cannot read certificate {}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("bad certificate {}: {e}", cert.display()))?;
    let key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| anyhow::anyhow!("cannot read key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: ServerConfig) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let (acceptor, ready) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = ready.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "tls handshake failed"),
                        Err(_) => tracing::debug!(%peer, "tls handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept task is gone (it ends only when the server is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Serves `router` on `listener`, over TLS when `tls` is given, until `stop` resolves; then
/// lets open requests finish. The task ends with the server's result.
pub fn serve_http(
    listener: TcpListener,
    tls: Option<ServerConfig>,
    router: axum::Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    Ok(match tls {
        Some(tls) => {
            let listener = TlsListener::new(listener, tls)?;
            tokio::spawn(async move { axum::serve(listener, router).with_graceful_shutdown(stop).await })
        }
        None => tokio::spawn(async move { axum::serve(listener, router).with_graceful_shutdown(stop).await }),
    })
}

/// Reads a text file (PEM, token list), naming it in the error.
pub fn read_text(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
}

/// TLS for a gRPC listener from `--tls-cert`/`--tls-key`, with `--tls-client-ca`
/// requiring client certificates (mutual TLS). None when no certificate is given.
pub fn grpc_server_tls(
    cert: Option<&Path>,
    key: Option<&Path>,
    client_ca: Option<&Path>,
) -> anyhow::Result<Option<tonic::transport::ServerTlsConfig>> {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let (Some(cert), Some(key)) = (cert, key) else {
        if cert.is_some() || key.is_some() {
            anyhow::bail!("--tls-cert and --tls-key go together");
        }
        return Ok(None);
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read_text(cert)?, read_text(key)?));
    if let Some(ca) = client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read_text(ca)?));
    }
    Ok(Some(tls))
}

/// How logs are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global tracing subscriber (RUST_LOG filters, default `info`), and with
/// `otlp` an OpenTelemetry layer whose spans a batch exporter sends to the collector.
/// Called from inside the Tokio runtime (the exporter's channel runs on it); the guard's
/// `shutdown` flushes at exit. A second call leaves the first subscriber in place and
/// builds no exporter.
pub fn init_tracing(format: LogFormat, otlp: Option<OtlpExport>) -> anyhow::Result<TracingGuard> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colours only for a person at a terminal, never in files or a log collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    let provider = otlp.as_ref().map(trace::provider).transpose()?;
    let otel = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer().with_tracer(p.tracer("inventory"))
    });
    let exporting = otel.is_some();
    let installed = tracing_subscriber::registry().with(fmt).with(otel).with(filter).try_init().is_ok();
    if !installed {
        if let Some(p) = provider {
            let _ = p.shutdown();
        }
        return Ok(TracingGuard { provider: None });
    }
    if exporting {
        trace::set_exporting();
    }
    Ok(TracingGuard { provider })
}

/// Binds a server's listener; the error names the address and the flag that set it.
pub async fn bind(addr: SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr} ({flag}): {e}"))
}

/// A URL without its user and password, for logs (database and Redis URLs may carry them).
pub fn without_credentials(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, rest))) => format!("{scheme}://{rest}"),
        _ => url.to_owned(),
    }
}

/// Resolves on SIGTERM (orchestrators) or Ctrl-C (a terminal).
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "no SIGTERM handler; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// The exit of a server's `main`: a failure (bad flag value, port in use, database
/// unreachable) is one line on stderr, `PROGRAM: cause: cause`, and exit code 1. Returning
/// `anyhow::Result` from `main` would print the Debug form instead, with a backtrace under
/// it whenever `RUST_BACKTRACE` is set.
pub fn exit_with(program: &str, result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line (`{:#}` joins them with ": "); line breaks inside
/// a message become spaces.
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod exit_tests {
    use super::*;

    #[test]
    fn urls_in_logs_carry_no_credentials() {
        assert_eq!(without_credentials("postgres://u:secret@db:5432/inv"), "postgres://db:5432/inv");
        assert_eq!(without_credentials("redis://:pw@127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(without_credentials("sqlite://inventory.db"), "sqlite://inventory.db");
    }

    #[test]
    fn an_error_chain_is_one_line() {
        let e = anyhow::anyhow!("address in use\n(os error 98)").context("cannot bind 127.0.0.1:50051");
        assert_eq!(one_line(&e), "cannot bind 127.0.0.1:50051: address in use (os error 98)");
    }
}
