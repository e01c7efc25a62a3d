use clap::Parser;
use inventory_center::{Application, CenterConfig, config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = CenterConfig::parse();
    config::init_tracing(cfg.log_format);
    let app = Application::build(cfg).await?;
    app.run_until(inventory_net::shutdown_signal()).await
}
