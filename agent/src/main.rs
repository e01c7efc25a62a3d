use clap::Parser;
use inventory_agent::{AgentConfig, Application, config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = AgentConfig::parse();
    config::init_tracing(cfg.log_format);
    let app = Application::build(cfg).await?;
    app.run_until(shutdown_signal()).await
}

/// SIGTERM (orchestrators) or Ctrl-C (a terminal).
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
