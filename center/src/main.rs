use clap::Parser;
use inventory_center::{Application, CenterConfig, config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = CenterConfig::parse();
    config::init_tracing(cfg.log_format);
    let app = Application::build(cfg).await?;
    app.run_until(async {
        inventory_net::shutdown_signal().await;
        // The first signal drains (bounded); an operator who signals again means now.
        tokio::spawn(async {
            inventory_net::shutdown_signal().await;
            tracing::warn!("second signal: exiting without draining");
            std::process::exit(1);
        });
    })
    .await
}
