use clap::Parser;
use inventory_agent::{AgentConfig, Application, config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = AgentConfig::parse();
    config::init_tracing(cfg.log_format);
    let app = Application::build(cfg).await?;
    app.run_until(inventory_net::shutdown_signal()).await
}
