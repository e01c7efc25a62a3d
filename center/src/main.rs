use clap::Parser;
use inventory_center::{Application, CenterConfig, config};

fn main() -> std::process::ExitCode {
    let cfg = CenterConfig::parse();
    config::init_tracing(cfg.log_format);
    inventory_net::exit_with("inventory-center", run(cfg))
}

#[tokio::main]
async fn run(cfg: CenterConfig) -> anyhow::Result<()> {
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
