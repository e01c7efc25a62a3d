use clap::Parser;
use inventory_agent::{AgentConfig, Application, config};
use inventory_net::OtlpExport;

// glibc's allocator took about a tenth of the machine while 100,000 pools were stocked
// (its free lists: `malloc_consolidate`, `unlink_chunk`); see BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cfg = AgentConfig::parse();
    inventory_net::exit_with("inventory-agent", run(cfg))
}

#[tokio::main]
async fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    // Inside the runtime: the trace exporter's gRPC channel runs on it.
    let otlp = cfg
        .otlp_endpoint
        .as_deref()
        .map(|e| OtlpExport::new(e, "inventory-agent").with_attribute("inventory.channel", cfg.channel.clone()));
    let telemetry = config::init_tracing(cfg.log_format, otlp)?;
    let result = async {
        let app = Application::build(cfg).await?;
        app.run_until(inventory_net::shutdown_signal()).await
    }
    .await;
    telemetry.shutdown().await;
    result
}
