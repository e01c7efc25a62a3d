use clap::Parser;
use inventory_center::{Application, CenterConfig, config};
use inventory_net::OtlpExport;

// glibc's allocator took about a tenth of the machine while 100,000 pools were stocked
// (its free lists: `malloc_consolidate`, `unlink_chunk`); see BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cfg = CenterConfig::parse();
    inventory_net::exit_with("inventory-center", run(cfg))
}

#[tokio::main]
async fn run(cfg: CenterConfig) -> anyhow::Result<()> {
    // Inside the runtime: the trace exporter's gRPC channel runs on it.
    let otlp = cfg.otlp_endpoint.as_deref().map(|e| OtlpExport::new(e, "inventory-center"));
    let telemetry = config::init_tracing(cfg.log_format, otlp)?;
    let result = async {
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
    .await;
    telemetry.shutdown().await;
    result
}
