use clap::Parser;
use inventory_agent::{AgentConfig, Application, config};

fn main() -> std::process::ExitCode {
    let cfg = AgentConfig::parse();
    config::init_tracing(cfg.log_format);
    inventory_net::exit_with("inventory-agent", run(cfg))
}

#[tokio::main]
async fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    let app = Application::build(cfg).await?;
    app.run_until(inventory_net::shutdown_signal()).await
}
